// mqd producer and consumer in one file, standard library only (java.net.http).
//
//   java MqdExample.java produce TOPIC COUNT [KEY_PREFIX]
//   java MqdExample.java consume TOPIC GROUP [IDLE_SECONDS]
//
// produce: message i has the idempotency key KEY_PREFIX-i and the value
// "order KEY_PREFIX-i". A publish that fails on the way (connection error,
// 503 while a leader is elected, 429) is retried with the same key, so a
// retry never stores the message twice; running it again stores nothing new.
//
// consume: long-polls, hands each message to handle(), acks it when handle()
// returns and nacks it (retryable, the exception as the reason) when it
// throws; the broker redelivers after the topic's backoff, or dead-letters
// after max_retry failures. Prints "ok GROUP KEY VALUE" / "nack GROUP KEY
// REASON". The example handler fails the first delivery of every message
// whose value contains "flaky". Stops after IDLE_SECONDS without a message.
//
// Environment: MQD_SERVER (default http://127.0.0.1:7070), MQD_TOKEN.
// Java 11+ (single-file source launch).

import java.net.URI;
import java.net.URLEncoder;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Base64;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;

public class MqdExample {
    static final String SERVER = System.getenv().getOrDefault("MQD_SERVER", "http://127.0.0.1:7070").replaceAll("/$", "");
    static final String TOKEN = System.getenv().getOrDefault("MQD_TOKEN", "");
    static final int WAIT_MS = 1000; // long-poll; the HTTP timeout must be longer
    static final Set<Integer> RETRYABLE = Set.of(429, 502, 503, 504);
    static final HttpClient HTTP = HttpClient.newBuilder()
            .version(HttpClient.Version.HTTP_1_1) // mqd speaks HTTP/1.1; skip the h2c upgrade attempt
            .connectTimeout(Duration.ofSeconds(5)).build();

    public static void main(String[] args) throws Exception {
        if (args.length >= 3 && args[0].equals("produce")) {
            produce(args[1], Integer.parseInt(args[2]), args.length > 3 ? args[3] : "java");
        } else if (args.length >= 3 && args[0].equals("consume")) {
            consume(args[1], args[2], args.length > 3 ? Double.parseDouble(args[3]) : Double.POSITIVE_INFINITY);
        } else {
            System.err.println("usage: java MqdExample.java produce TOPIC COUNT [KEY_PREFIX] | consume TOPIC GROUP [IDLE_SECONDS]");
            System.exit(2);
        }
    }

    static String enc(String s) {
        return URLEncoder.encode(s, StandardCharsets.UTF_8).replace("+", "%20");
    }

    static HttpRequest.Builder request(String path, Duration timeout) {
        HttpRequest.Builder b = HttpRequest.newBuilder(URI.create(SERVER + path)).timeout(timeout);
        if (!TOKEN.isEmpty()) b.header("Authorization", "Bearer " + TOKEN);
        return b;
    }

    // ---- producer

    static void produce(String topic, int count, String prefix) throws Exception {
        for (int i = 0; i < count; i++) {
            String key = prefix + "-" + i;
            Map<String, Object> r = publish(topic, key, ("order " + key).getBytes(StandardCharsets.UTF_8));
            System.out.printf("published %s partition=%s offset=%s duplicate=%s%n", key,
                    num(r.get("partition")), num(r.get("offset")), r.get("duplicate"));
        }
    }

    @SuppressWarnings("unchecked")
    static Map<String, Object> publish(String topic, String key, byte[] value) throws Exception {
        String failure = "";
        for (int attempt = 0; attempt < 8; attempt++) {
            HttpRequest req = request("/v1/topics/" + enc(topic) + "/messages", Duration.ofSeconds(15))
                    .header("Idempotency-Key", key)
                    .header("Content-Type", "application/octet-stream")
                    .POST(HttpRequest.BodyPublishers.ofByteArray(value)).build();
            try {
                HttpResponse<String> resp = HTTP.send(req, HttpResponse.BodyHandlers.ofString());
                if (resp.statusCode() / 100 == 2) return (Map<String, Object>) Json.parse(resp.body());
                failure = resp.statusCode() + " " + resp.body();
                if (!RETRYABLE.contains(resp.statusCode())) break;
            } catch (java.io.IOException e) { // connection refused, reset, timeout
                failure = e.toString();
            }
            Thread.sleep(Math.min(100L << attempt, 2000L)); // same key on every try
        }
        throw new RuntimeException("publish " + key + ": " + failure);
    }

    // ---- consumer

    /** The application's work. Throw to have the message redelivered. */
    static void handle(Map<String, Object> msg, String value) {
        if (value.contains("flaky") && ((Number) msg.get("retry_count")).intValue() == 0) {
            throw new IllegalStateException("simulated failure on first delivery");
        }
    }

    @SuppressWarnings("unchecked")
    static Map<String, Object> call(String path, Map<String, Object> body) throws Exception {
        HttpRequest req = request(path, Duration.ofMillis(WAIT_MS + 15000))
                .header("Content-Type", "application/json")
                .POST(HttpRequest.BodyPublishers.ofString(Json.write(body))).build();
        HttpResponse<String> resp = HTTP.send(req, HttpResponse.BodyHandlers.ofString());
        if (resp.statusCode() != 200) throw new java.io.IOException(path + ": " + resp.statusCode() + " " + resp.body());
        return (Map<String, Object>) Json.parse(resp.body());
    }

    @SuppressWarnings("unchecked")
    static void consume(String topic, String group, double idleSeconds) throws Exception {
        String base = "/v1/topics/" + enc(topic) + "/groups/" + enc(group);
        long last = System.nanoTime();
        while ((System.nanoTime() - last) / 1e9 < idleSeconds) {
            List<Object> msgs;
            try {
                msgs = (List<Object>) call(base + "/fetch", Map.of("max", 10, "wait_ms", WAIT_MS)).get("messages");
            } catch (java.io.IOException e) { // connection trouble, 503 during an election
                System.err.println("fetch failed, retrying: " + e.getMessage());
                Thread.sleep(500);
                continue;
            }
            for (Object o : msgs) {
                Map<String, Object> m = (Map<String, Object>) o;
                String value = new String(Base64.getDecoder().decode((String) m.get("value_b64")), StandardCharsets.UTF_8);
                String key = (String) m.get("idempotency_key");
                if (key == null || key.isEmpty()) key = num(m.get("partition")) + ":" + num(m.get("offset"));
                List<Object> receipts = List.of(m.get("receipt"));
                try {
                    handle(m, value);
                } catch (RuntimeException e) {
                    call(base + "/nack", Map.of("receipts", receipts, "reason", String.valueOf(e.getMessage()), "retryable", true));
                    System.out.println("nack " + group + " " + key + " " + e.getMessage());
                    continue;
                }
                Map<String, Object> r = call(base + "/ack", Map.of("receipts", receipts));
                String status = (String) ((Map<String, Object>) ((List<Object>) r.get("results")).get(0)).get("status");
                if (status.equals("ok")) System.out.println("ok " + group + " " + key + " " + value);
                else System.err.println("ack " + status + " " + group + " " + key); // stale: it will come again
            }
            if (!msgs.isEmpty()) last = System.nanoTime(); // idle counts from the end of the last work
        }
    }

    static String num(Object n) {
        return String.valueOf(((Number) n).longValue());
    }

    /** Just enough JSON for this API: objects, arrays, strings, numbers, booleans, null. */
    static final class Json {
        private final String s;
        private int i;

        private Json(String s) { this.s = s; }

        static Object parse(String s) {
            Json j = new Json(s);
            Object v = j.value();
            j.ws();
            if (j.i != s.length()) throw new IllegalArgumentException("trailing data in JSON");
            return v;
        }

        private void ws() { while (i < s.length() && Character.isWhitespace(s.charAt(i))) i++; }

        private Object value() {
            ws();
            char c = s.charAt(i);
            switch (c) {
                case '{': {
                    Map<String, Object> m = new LinkedHashMap<>();
                    i++;
                    ws();
                    if (s.charAt(i) == '}') { i++; return m; }
                    while (true) {
                        ws();
                        String k = string();
                        ws();
                        expect(':');
                        m.put(k, value());
                        ws();
                        if (s.charAt(i++) == '}') return m;
                    }
                }
                case '[': {
                    List<Object> l = new ArrayList<>();
                    i++;
                    ws();
                    if (s.charAt(i) == ']') { i++; return l; }
                    while (true) {
                        l.add(value());
                        ws();
                        if (s.charAt(i++) == ']') return l;
                    }
                }
                case '"': return string();
                case 't': i += 4; return Boolean.TRUE;
                case 'f': i += 5; return Boolean.FALSE;
                case 'n': i += 4; return null;
                default: {
                    int start = i;
                    while (i < s.length() && "+-0123456789.eE".indexOf(s.charAt(i)) >= 0) i++;
                    String n = s.substring(start, i);
                    return n.matches("-?\\d+") ? (Object) Long.parseLong(n) : (Object) Double.parseDouble(n);
                }
            }
        }

        private void expect(char c) {
            if (s.charAt(i++) != c) throw new IllegalArgumentException("expected " + c + " at " + (i - 1));
        }

        private String string() {
            expect('"');
            StringBuilder b = new StringBuilder();
            while (true) {
                char c = s.charAt(i++);
                if (c == '"') return b.toString();
                if (c != '\\') { b.append(c); continue; }
                char e = s.charAt(i++);
                switch (e) {
                    case 'n': b.append('\n'); break;
                    case 't': b.append('\t'); break;
                    case 'r': b.append('\r'); break;
                    case 'b': b.append('\b'); break;
                    case 'f': b.append('\f'); break;
                    case 'u': b.append((char) Integer.parseInt(s.substring(i, i + 4), 16)); i += 4; break;
                    default: b.append(e); // \" \\ \/
                }
            }
        }

        static String write(Object v) {
            if (v == null) return "null";
            if (v instanceof String) {
                StringBuilder b = new StringBuilder("\"");
                for (char c : ((String) v).toCharArray()) {
                    if (c == '"' || c == '\\') b.append('\\').append(c);
                    else if (c < 0x20) b.append(String.format("\\u%04x", (int) c));
                    else b.append(c);
                }
                return b.append('"').toString();
            }
            if (v instanceof Map) {
                StringBuilder b = new StringBuilder("{");
                for (Map.Entry<?, ?> e : ((Map<?, ?>) v).entrySet()) {
                    if (b.length() > 1) b.append(',');
                    b.append(write(String.valueOf(e.getKey()))).append(':').append(write(e.getValue()));
                }
                return b.append('}').toString();
            }
            if (v instanceof List) {
                StringBuilder b = new StringBuilder("[");
                for (Object o : (List<?>) v) {
                    if (b.length() > 1) b.append(',');
                    b.append(write(o));
                }
                return b.append(']').toString();
            }
            return String.valueOf(v); // numbers, booleans
        }
    }
}
