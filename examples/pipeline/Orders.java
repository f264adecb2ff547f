// The pipeline's producer: publishes COUNT orders into ORDERS, order i with
// the idempotency key "order-i" (a lost answer, a 503 or a 429 is retried
// with the same key on another node, so each order is stored once).
//
//   javac -d /tmp/mqd ../clients/java/src/main/java/com/github/mqd/client/*.java
//   java -cp /tmp/mqd pipeline/Orders.java COUNT [ORDERS]   (default topic: orders)
//
// Prints "published KEY partition=P offset=O duplicate=D" per order.
// Environment: MQD_SERVERS (comma-separated) or MQD_SERVER, MQD_TOKEN, MQD_CA_FILE.

import com.github.mqd.client.Client;
import com.github.mqd.client.Types;
import java.nio.file.Path;
import java.time.Duration;
import java.util.Arrays;

public class Orders {
    public static void main(String[] args) {
        if (args.length < 1) {
            System.err.println("usage: Orders COUNT [ORDERS]");
            System.exit(2);
        }
        int count = Integer.parseInt(args[0]);
        String topic = args.length > 1 ? args[1] : "orders";
        String servers = System.getenv().getOrDefault("MQD_SERVERS", System.getenv().getOrDefault("MQD_SERVER", "http://127.0.0.1:7070"));
        Client.Options o = new Client.Options().servers(Arrays.asList(servers.split(","))).token(System.getenv("MQD_TOKEN"))
                .deadline(Duration.ofSeconds(60));
        if (System.getenv("MQD_CA_FILE") != null) o.caFile(Path.of(System.getenv("MQD_CA_FILE")));
        try (Client c = new Client(o)) {
            for (int i = 0; i < count; i++) {
                String key = "order-" + i;
                String value = "{\"order\":\"" + key + "\",\"amount_cents\":" + (1000 + i) + "}";
                Types.PublishResult r = c.publish(topic, value, new Types.PublishOptions().key(key));
                System.out.printf("published %s partition=%d offset=%d duplicate=%s%n", key, r.partition(), r.offset(), r.duplicate());
            }
        }
    }
}
