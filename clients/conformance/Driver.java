// The Java client's driver of the conformance suite (clients/conformance):
// reads one case's servers, client options and steps as JSON on stdin, runs
// the steps with clients/java, prints one JSON line per step.

import com.github.mqd.client.Client;
import com.github.mqd.client.Consumer;
import com.github.mqd.client.Json;
import com.github.mqd.client.Message;
import com.github.mqd.client.MqdException;
import com.github.mqd.client.Types;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

public final class Driver {
    private List<String> receipts = new ArrayList<>();
    private List<Long> dlq = new ArrayList<>();

    public static void main(String[] args) throws IOException {
        Map<String, Object> spec = Json.obj(Json.parse(new String(System.in.readAllBytes(), StandardCharsets.UTF_8)));
        Map<String, Object> co = Json.obj(spec.get("client"));
        Client.Options o = new Client.Options();
        List<String> servers = new ArrayList<>();
        for (Object s : Json.list(spec.get("servers"))) servers.add((String) s);
        o.servers(servers);
        if (Json.num(co, "timeout_ms") > 0) o.timeout(Duration.ofMillis(Json.num(co, "timeout_ms")));
        if (Json.num(co, "max_attempts") > 0) o.maxAttempts((int) Json.num(co, "max_attempts"));
        if (Json.num(co, "deadline_ms") > 0) o.deadline(Duration.ofMillis(Json.num(co, "deadline_ms")));
        o.token(Json.str(co, "token"));
        if (!Json.str(co, "ca_file").isEmpty()) o.caFile(java.nio.file.Path.of(Json.str(co, "ca_file")));
        Driver d = new Driver();
        try (Client c = new Client(o)) {
            for (Object x : Json.list(spec.get("steps"))) {
                Map<String, Object> line = new LinkedHashMap<>();
                try {
                    Map<String, Object> v = d.run(c, Json.obj(x));
                    line.put("ok", true);
                    line.put("value", v);
                } catch (MqdException e) {
                    line.put("ok", false);
                    line.put("error", Map.of("status", e.status(), "code", e.code(), "message", String.valueOf(e.getMessage())));
                }
                System.out.println(Json.write(line));
                System.out.flush();
            }
        }
    }

    private Map<String, Object> run(Client c, Map<String, Object> st) {
        String op = Json.str(st, "op");
        String topic = Json.str(st, "topic");
        String group = Json.str(st, "group");
        Map<String, Object> out = new LinkedHashMap<>();
        switch (op) {
            case "publish": {
                Types.PublishOptions po = new Types.PublishOptions().key(Json.str(st, "key")).partitionKey(Json.str(st, "partition_key"))
                        .delayMs(Json.num(st, "delay_ms"));
                if (st.get("max_retry") != null) po.maxRetry((int) Json.num(st, "max_retry"));
                Map<String, String> attrs = new LinkedHashMap<>();
                Json.obj(st.get("attrs")).forEach((k, v) -> attrs.put(k, String.valueOf(v)));
                po.attrs(attrs);
                Types.PublishResult r = c.publish(topic, Json.str(st, "value"), po);
                out.put("partition", r.partition());
                out.put("offset", r.offset());
                out.put("duplicate", r.duplicate());
                return out;
            }
            case "publish_batch": {
                List<Types.BatchMessage> batch = new ArrayList<>();
                for (Object x : Json.list(st.get("messages"))) {
                    Map<String, Object> m = Json.obj(x);
                    batch.add(new Types.BatchMessage(Json.str(m, "value").getBytes(StandardCharsets.UTF_8), Json.str(m, "key"),
                            Json.str(m, "partition_key"), 0, null, Json.strings(m.get("attrs"))));
                }
                List<Object> dups = new ArrayList<>();
                List<Object> offs = new ArrayList<>();
                for (Types.PublishResult r : c.publishBatch(topic, batch)) {
                    dups.add(r.duplicate());
                    offs.add(r.offset());
                }
                out.put("duplicates", dups);
                out.put("offsets", offs);
                return out;
            }
            case "fetch": {
                int max = st.get("max") == null ? 10 : (int) Json.num(st, "max");
                List<Message> msgs = c.fetch(topic, group, max, Json.num(st, "wait_ms"), Json.num(st, "lease_ms"));
                receipts = new ArrayList<>();
                List<Object> keys = new ArrayList<>();
                List<Object> counts = new ArrayList<>();
                for (Message m : msgs) {
                    receipts.add(m.receipt);
                    keys.add(m.idempotencyKey);
                    counts.add(m.retryCount);
                }
                out.put("keys", keys);
                out.put("retry_counts", counts);
                return out;
            }
            case "ack":
            case "nack":
            case "extend": {
                List<Types.ReceiptResult> res;
                if (op.equals("ack")) res = c.ack(topic, group, receipts);
                else if (op.equals("nack")) res = c.nack(topic, group, receipts, Json.str(st, "message"), true, -1);
                else res = c.extend(topic, group, receipts, Json.num(st, "lease_ms"));
                List<Object> sts = new ArrayList<>();
                for (Types.ReceiptResult r : res) sts.add(r.status());
                out.put("statuses", sts);
                return out;
            }
            case "process": {
                List<Types.Output> outs = new ArrayList<>();
                for (Object x : Json.list(st.get("outputs"))) {
                    Map<String, Object> m = Json.obj(x);
                    outs.add(Types.Output.of(Json.str(m, "topic"), Json.str(m, "value").getBytes(StandardCharsets.UTF_8), Json.str(m, "key")));
                }
                Types.ProcessResult r = c.process(topic, group, receipts, outs);
                List<Object> dups = new ArrayList<>();
                List<Object> offs = new ArrayList<>();
                for (Types.PublishResult p : r.results()) {
                    dups.add(p.duplicate());
                    offs.add(p.offset());
                }
                out.put("acked", r.acked());
                out.put("duplicate", r.duplicate());
                out.put("duplicates", dups);
                out.put("offsets", offs);
                return out;
            }
            case "sleep":
                sleep(Json.num(st, "ms"));
                return out;
            case "consume":
            case "consume_process":
                return consume(c, st, topic, group);
            case "dlq_list": {
                Types.DLQPage p = c.deadLetters(topic, group, 0, 0, null);
                dlq = new ArrayList<>();
                List<Object> keys = new ArrayList<>();
                List<Object> reasons = new ArrayList<>();
                for (Types.DeadLetter l : p.deadLetters()) {
                    dlq.add(l.id());
                    keys.add(l.idempotencyKey());
                    reasons.add(l.rejectReason());
                }
                out.put("keys", keys);
                out.put("reasons", reasons);
                return out;
            }
            case "dlq_replay":
                out.put("accepted", c.replay(topic, group, dlq, 0).accepted());
                return out;
            default:
                throw new IllegalArgumentException("unknown op " + op);
        }
    }

    private Map<String, Object> consume(Client c, Map<String, Object> st, String topic, String group) {
        List<Object> handled = Collections.synchronizedList(new ArrayList<>());
        List<Object> errors = Collections.synchronizedList(new ArrayList<>());
        long count = st.get("count") == null ? 1 : Json.num(st, "count");
        Consumer.Options co = new Consumer.Options().leaseMs(Json.num(st, "lease_ms")).waitMs(Json.num(st, "wait_ms"))
                .onError(e -> errors.add(e.getMessage()));
        Consumer[] self = new Consumer[1];
        try (Consumer consumer = c.consumer(topic, group, co)) {
            self[0] = consumer;
            Consumer.ProcessHandler h = m -> {
                try {
                    if ("throw".equals(Json.str(st, "handler"))) throw new RuntimeException(Json.str(st, "message"));
                    if ("sleep".equals(Json.str(st, "handler"))) sleep(Json.num(st, "sleep_ms"));
                    if (!"consume_process".equals(Json.str(st, "op"))) return null;
                    byte[] v = ("out-" + m.text()).getBytes(StandardCharsets.UTF_8); // one output derived from the message
                    return List.of(Types.Output.of(Json.str(st, "output_topic"), v, "out-" + m.idempotencyKey));
                } finally {
                    handled.add(m.idempotencyKey);
                    if (handled.size() >= count) self[0].stop();
                }
            };
            if ("consume_process".equals(Json.str(st, "op"))) consumer.runProcess(h);
            else consumer.run(m -> h.handle(m));
        }
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("handled", new ArrayList<>(handled));
        out.put("errors", new ArrayList<>(errors));
        return out;
    }

    private static void sleep(long ms) {
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }
}
