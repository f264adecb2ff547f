// mqd producer and consumer with the Java client (clients/java).
//
//   javac -d /tmp/mqd ../clients/java/src/main/java/com/github/mqd/client/*.java
//   java -cp /tmp/mqd java/ClientExample.java produce TOPIC COUNT [KEY_PREFIX]
//   java -cp /tmp/mqd java/ClientExample.java consume TOPIC GROUP [IDLE_SECONDS]
//
// produce: message i has the idempotency key KEY_PREFIX-i and the value
// "order KEY_PREFIX-i"; the client retries a lost answer, a 503 or a 429
// with the same key on another node, so nothing is stored twice.
//
// consume: the client's consumer loop runs handle() on each message with its
// lease extended, acks when it returns, nacks with the exception's message
// when it throws, and moves to another node when one dies. Prints "ok GROUP
// KEY VALUE" / "nack GROUP KEY REASON". The example handler fails the first
// delivery of every message whose value contains "flaky". Stops after
// IDLE_SECONDS without a message, or on SIGINT/SIGTERM.
// (raw/MqdExample.java does the same over java.net.http alone.)
//
// Environment: MQD_SERVERS (comma-separated) or MQD_SERVER, MQD_TOKEN, MQD_CA_FILE.

import com.github.mqd.client.Client;
import com.github.mqd.client.Consumer;
import com.github.mqd.client.Message;
import com.github.mqd.client.Types;
import java.nio.file.Path;
import java.time.Duration;
import java.util.Arrays;
import java.util.concurrent.atomic.AtomicLong;

public class ClientExample {
    static void handle(Message m) {
        if (m.text().contains("flaky") && m.retryCount == 0) throw new IllegalStateException("simulated failure on first delivery");
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 3) {
            System.err.println("usage: ClientExample produce TOPIC COUNT [KEY_PREFIX] | consume TOPIC GROUP [IDLE_SECONDS]");
            System.exit(2);
        }
        String servers = System.getenv().getOrDefault("MQD_SERVERS", System.getenv().getOrDefault("MQD_SERVER", "http://127.0.0.1:7070"));
        Client.Options o = new Client.Options().servers(Arrays.asList(servers.split(","))).token(System.getenv("MQD_TOKEN"));
        if (System.getenv("MQD_CA_FILE") != null) o.caFile(Path.of(System.getenv("MQD_CA_FILE")));
        try (Client c = new Client(o.deadline(Duration.ofSeconds(60)))) {
            if (args[0].equals("produce")) produce(c, args[1], Integer.parseInt(args[2]), args.length > 3 ? args[3] : "java");
            else consume(c, args[1], args[2], args.length > 3 ? Double.parseDouble(args[3]) : Double.POSITIVE_INFINITY);
        }
    }

    static void produce(Client c, String topic, int count, String prefix) {
        for (int i = 0; i < count; i++) {
            String key = prefix + "-" + i;
            Types.PublishResult r = c.publish(topic, "order " + key, new Types.PublishOptions().key(key));
            System.out.printf("published %s partition=%d offset=%d duplicate=%s%n", key, r.partition(), r.offset(), r.duplicate());
        }
    }

    static void consume(Client c, String topic, String group, double idleSeconds) throws InterruptedException {
        AtomicLong last = new AtomicLong(System.nanoTime());
        Consumer.Options co = new Consumer.Options().waitMs(1000).leaseMs(10000)
                .onError(e -> System.err.println("consumer: " + e.getMessage()));
        try (Consumer consumer = c.consumer(topic, group, co).stopOnShutdown()) {
            Thread watch = new Thread(() -> {
                while (!consumer.stopped()) {
                    if ((System.nanoTime() - last.get()) / 1e9 > idleSeconds) consumer.stop();
                    try { Thread.sleep(200); } catch (InterruptedException e) { return; }
                }
            });
            watch.setDaemon(true);
            watch.start();
            consumer.run(m -> {
                String key = m.idempotencyKey.isEmpty() ? m.partition + ":" + m.offset : m.idempotencyKey;
                try {
                    handle(m);
                    System.out.printf("ok %s %s %s%n", group, key, m.text());
                } catch (RuntimeException e) {
                    System.out.printf("nack %s %s %s%n", group, key, e.getMessage());
                    throw e;
                } finally {
                    last.set(System.nanoTime());
                    System.out.flush();
                }
            });
        }
    }
}
