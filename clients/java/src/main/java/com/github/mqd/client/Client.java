package com.github.mqd.client;

import com.github.mqd.client.Types.BatchMessage;
import com.github.mqd.client.Types.DLQPage;
import com.github.mqd.client.Types.DeadLetter;
import com.github.mqd.client.Types.Output;
import com.github.mqd.client.Types.ProcessResult;
import com.github.mqd.client.Types.PublishOptions;
import com.github.mqd.client.Types.PublishResult;
import com.github.mqd.client.Types.ReceiptResult;
import com.github.mqd.client.Types.ReplayResult;
import java.io.IOException;
import java.io.InputStream;
import java.net.ConnectException;
import java.net.URI;
import java.net.URLEncoder;
import java.net.http.HttpClient;
import java.net.http.HttpConnectTimeoutException;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.KeyStore;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Base64;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.stream.Collectors;
import javax.net.ssl.SSLContext;
import javax.net.ssl.TrustManagerFactory;

/**
 * A client of one mqd cluster through any of its nodes; thread-safe. It moves
 * to the next node when one does not answer, and retries only what is safe
 * (see docs/clients.md): no answer, 503 and 429 (after Retry-After), with the
 * same Idempotency-Key or receipts; a publish without a key only when it
 * cannot have reached a node; never another 4xx.
 */
public final class Client implements AutoCloseable {
    public static final String DEFAULT_SERVER = "http://127.0.0.1:7070";
    static final long MAX_RETRY_BACKOFF_MS = 2000;
    /** For the conformance suite's self-test only (see client/selftest.go): rules switched off. */
    static final Set<String> BREAKS = Arrays.stream(System.getenv().getOrDefault("MQD_CLIENT_BREAK", "").split(","))
            .map(String::trim).filter(s -> !s.isEmpty()).collect(Collectors.toUnmodifiableSet());

    private enum Policy { SAFE, UNSENT }

    private final List<String> nodes;
    private final String token;
    private final HttpClient http;
    final Duration timeout;
    private final int maxAttempts;
    final long backoffMs;
    private final Duration deadline;
    private final AtomicInteger cur = new AtomicInteger();

    /** Options of a Client; the defaults are those of every mqd client. */
    public static final class Options {
        List<String> servers = List.of(DEFAULT_SERVER);
        String token = "";
        Path caFile;
        SSLContext ssl;
        Duration timeout = Duration.ofSeconds(15);
        int maxAttempts = 10;
        long retryBackoffMs = 100;
        Duration deadline;

        /** The nodes' base URLs; a bare host:port means http. */
        public Options servers(List<String> s) { servers = List.copyOf(s); return this; }
        public Options servers(String... s) { servers = List.of(s); return this; }
        /** Sent as a bearer token. */
        public Options token(String t) { token = t == null ? "" : t; return this; }
        /** PEM CA certificates trusted for https servers. */
        public Options caFile(Path p) { caFile = p; return this; }
        public Options sslContext(SSLContext c) { ssl = c; return this; }
        /** One attempt's bound (default 15 s, above the broker's 10 s commit deadline); a fetch adds its wait. */
        public Options timeout(Duration d) { timeout = d; return this; }
        /** Tries of one request across nodes (default 10). */
        public Options maxAttempts(int n) { maxAttempts = n; return this; }
        /** First pause between attempts (default 100 ms), doubled up to 2 s; Retry-After lengthens it. */
        public Options retryBackoffMs(long ms) { retryBackoffMs = ms; return this; }
        /** Bound of one operation with all its retries (default none: maxAttempts bounds it). */
        public Options deadline(Duration d) { deadline = d; return this; }
    }

    public Client(Options o) {
        nodes = new ArrayList<>();
        for (String s : o.servers) nodes.add(normalize(s));
        if (nodes.isEmpty()) throw new IllegalArgumentException("mqd: no server given");
        token = o.token;
        timeout = o.timeout;
        maxAttempts = Math.max(1, o.maxAttempts);
        backoffMs = Math.max(1, o.retryBackoffMs);
        deadline = o.deadline;
        HttpClient.Builder b = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1) // no h2c upgrade
                .connectTimeout(Duration.ofSeconds(3));
        SSLContext ssl = o.ssl != null ? o.ssl : (o.caFile != null ? sslFrom(o.caFile) : null);
        if (ssl != null) b.sslContext(ssl);
        http = b.build();
    }

    public Client(String... servers) { this(new Options().servers(servers)); }

    private static String normalize(String s) {
        s = s.trim();
        URI u = URI.create(s.contains("://") ? s : "http://" + s);
        if (!("http".equals(u.getScheme()) || "https".equals(u.getScheme())) || u.getHost() == null) {
            throw new IllegalArgumentException("mqd: server " + s + ": want http://host:port or https://host:port");
        }
        return (u.getScheme() + "://" + u.getRawAuthority() + (u.getRawPath() == null ? "" : u.getRawPath())).replaceAll("/+$", "");
    }

    private static SSLContext sslFrom(Path ca) {
        try (InputStream in = Files.newInputStream(ca)) {
            KeyStore ks = KeyStore.getInstance(KeyStore.getDefaultType());
            ks.load(null, null);
            int n = 0;
            for (Certificate c : CertificateFactory.getInstance("X.509").generateCertificates(in)) ks.setCertificateEntry("ca" + n++, c);
            TrustManagerFactory tmf = TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
            tmf.init(ks);
            SSLContext ctx = SSLContext.getInstance("TLS");
            ctx.init(null, tmf.getTrustManagers(), null);
            return ctx;
        } catch (Exception e) {
            throw new IllegalArgumentException("mqd: CA file " + ca + ": " + e.getMessage(), e);
        }
    }

    public List<String> nodes() { return List.copyOf(nodes); }

    /** Nothing to release but the HTTP client's connections, which close with it. */
    @Override
    public void close() {}

    // ---- transport

    private record Answer(int status, Object body) {}

    private Answer once(String node, String method, String path, byte[] body, Map<String, String> headers, Duration t) {
        HttpRequest.Builder b = HttpRequest.newBuilder(URI.create(node + path)).timeout(t)
                .method(method, body == null ? HttpRequest.BodyPublishers.noBody() : HttpRequest.BodyPublishers.ofByteArray(body));
        headers.forEach(b::header);
        HttpResponse<byte[]> r;
        try {
            r = http.send(b.build(), HttpResponse.BodyHandlers.ofByteArray());
        } catch (ConnectException | HttpConnectTimeoutException e) {
            throw new MqdException(0, "", node + ": " + e, method, path, -1, false, e);
        } catch (IOException e) {
            throw new MqdException(0, "", node + ": " + e, method, path, -1, true, e);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new MqdException(0, "", "interrupted", method, path, -1, true, e);
        }
        String text = new String(r.body(), StandardCharsets.UTF_8);
        if (r.statusCode() >= 200 && r.statusCode() < 300) return new Answer(r.statusCode(), text.isEmpty() ? Map.of() : Json.parse(text));
        String code = "";
        String msg = text.trim();
        try {
            Map<String, Object> e = Json.obj(Json.obj(Json.parse(text)).get("error"));
            code = Json.str(e, "code");
            msg = Json.str(e, "message");
        } catch (RuntimeException ignored) { // not our JSON: keep the text
        }
        long ra = -1;
        String h = r.headers().firstValue("Retry-After").orElse("");
        if (h.matches("\\d+")) ra = Long.parseLong(h) * 1000;
        String m = code.isEmpty() ? method + " " + path + ": HTTP " + r.statusCode() + ": " + msg : msg + " (" + code + ", HTTP " + r.statusCode() + ")";
        throw new MqdException(r.statusCode(), code, m, method, path, ra, true, null);
    }

    /** Sends a request with failover, retrying as the policy allows. */
    private Answer send(String method, String path, byte[] body, Map<String, String> headers, Policy p, long extraMs) {
        Map<String, String> h = new LinkedHashMap<>(headers);
        if (!token.isEmpty()) h.put("Authorization", "Bearer " + token);
        if (body != null) h.putIfAbsent("Content-Type", "application/json");
        if (BREAKS.contains("timeout_ignores_wait")) extraMs = 0;
        long end = deadline == null ? Long.MAX_VALUE : System.nanoTime() / 1_000_000 + deadline.toMillis();
        long backoff = backoffMs;
        for (int attempt = 1; ; attempt++) {
            int idx = cur.get();
            Duration t = timeout.plusMillis(extraMs);
            long left = end - System.nanoTime() / 1_000_000;
            if (t.toMillis() > left) t = Duration.ofMillis(Math.max(1, left));
            MqdException err;
            try {
                return once(nodes.get(idx % nodes.size()), method, path, body, h, t);
            } catch (MqdException e) {
                err = e;
            }
            long wait = retryWait(err, p);
            if (wait < 0 || attempt >= maxAttempts || Thread.currentThread().isInterrupted()) throw err;
            if (!BREAKS.contains("no_failover")) cur.compareAndSet(idx, (idx + 1) % nodes.size());
            if (BREAKS.contains("new_key_on_retry") && h.containsKey("Idempotency-Key")) {
                h.put("Idempotency-Key", h.get("Idempotency-Key") + "-retry" + attempt);
            }
            wait = Math.max(wait, backoff);
            backoff = Math.min(2 * backoff, MAX_RETRY_BACKOFF_MS);
            if (System.nanoTime() / 1_000_000 + wait >= end) throw err;
            try {
                Thread.sleep(wait);
            } catch (InterruptedException ie) {
                Thread.currentThread().interrupt();
                throw err;
            }
        }
    }

    /** -1 when err must not be retried under p, else the broker's Retry-After (at most 2 s) or 0. */
    private static long retryWait(MqdException err, Policy p) {
        if (BREAKS.contains("no_retry")) return -1;
        if (err.status() == 0) return p == Policy.SAFE || !err.sent() ? 0 : -1;
        if ((err.status() == 429 || err.status() == 503) && p == Policy.SAFE) {
            long ra = BREAKS.contains("ignore_retry_after") ? 0 : Math.max(0, err.retryAfterMs());
            return Math.min(ra, MAX_RETRY_BACKOFF_MS);
        }
        if (BREAKS.contains("retry_4xx") && err.status() < 500) return 0;
        return -1;
    }

    private Answer json(String method, String path, Object payload, Policy p, long extraMs) {
        byte[] body = payload == null ? null : Json.write(payload).getBytes(StandardCharsets.UTF_8);
        return send(method, path, body, Map.of(), p, extraMs);
    }

    private Map<String, Object> json(String method, String path, Object payload) {
        return Json.obj(json(method, path, payload, Policy.SAFE, 0).body());
    }

    /** Any API request; GETs are retried, other methods only when never sent. */
    public Object request(String method, String path, Object payload) {
        return json(method, path, payload, "GET".equals(method) ? Policy.SAFE : Policy.UNSENT, 0).body();
    }

    static String esc(String s) { return URLEncoder.encode(s, StandardCharsets.UTF_8).replace("+", "%20"); }

    static String groupPath(String topic, String group) { return "/v1/topics/" + esc(topic) + "/groups/" + esc(group); }

    // ---- publish

    public PublishResult publish(String topic, byte[] value) { return publish(topic, value, new PublishOptions()); }

    public PublishResult publish(String topic, String value, PublishOptions o) {
        return publish(topic, value.getBytes(StandardCharsets.UTF_8), o);
    }

    /**
     * Stores value in topic. With a key (or producer sequence) it is retried
     * after a lost answer or a 503 with the same key; without, only when it
     * cannot have reached a node (the exception is then retryable: the caller decides).
     */
    public PublishResult publish(String topic, byte[] value, PublishOptions o) {
        Map<String, String> h = new LinkedHashMap<>();
        h.put("Content-Type", "application/octet-stream");
        Policy p = Policy.UNSENT;
        if (o.key != null && !o.key.isEmpty()) { h.put("Idempotency-Key", o.key); p = Policy.SAFE; }
        if (o.producerId != null && o.producerSeq != null) {
            h.put("Mq-Producer-Id", o.producerId);
            h.put("Mq-Producer-Seq", Long.toString(o.producerSeq));
            p = Policy.SAFE;
        }
        if (p == Policy.UNSENT && BREAKS.contains("retry_unkeyed")) p = Policy.SAFE;
        if (o.partitionKey != null && !o.partitionKey.isEmpty()) h.put("Mq-Partition-Key", o.partitionKey);
        if (o.delayMs > 0) h.put("Mq-Delay-Ms", Long.toString(o.delayMs));
        if (o.maxRetry != null && o.maxRetry >= 0) h.put("Mq-Max-Retry", Integer.toString(o.maxRetry));
        if (o.attrs != null) o.attrs.forEach((k, v) -> h.put("Mq-Attr-" + k, v));
        Map<String, Object> r = Json.obj(send("POST", "/v1/topics/" + esc(topic) + "/messages", value == null ? new byte[0] : value, h, p, 0).body());
        return result(topic, r);
    }

    private static PublishResult result(String topic, Map<String, Object> r) {
        String t = Json.str(r, "topic");
        return new PublishResult(t.isEmpty() ? topic : t, Json.num(r, "partition"), Json.num(r, "offset"),
                Boolean.TRUE.equals(r.get("duplicate")), r);
    }

    /** Stores messages as one all-or-nothing write; retried only when every message has a key. */
    public List<PublishResult> publishBatch(String topic, List<BatchMessage> messages) {
        Policy p = Policy.SAFE;
        List<Object> items = new ArrayList<>();
        for (BatchMessage m : messages) {
            Map<String, Object> it = new LinkedHashMap<>();
            it.put("value_b64", Base64.getEncoder().encodeToString(m.value() == null ? new byte[0] : m.value()));
            if (m.key() != null && !m.key().isEmpty()) it.put("idempotency_key", m.key());
            else p = Policy.UNSENT;
            if (m.partitionKey() != null && !m.partitionKey().isEmpty()) it.put("partition_key", m.partitionKey());
            if (m.delayMs() > 0) it.put("delay_ms", m.delayMs());
            if (m.maxRetry() != null && m.maxRetry() >= 0) it.put("max_retry", m.maxRetry());
            if (m.attrs() != null && !m.attrs().isEmpty()) it.put("attrs", m.attrs());
            items.add(it);
        }
        Map<String, Object> r = Json.obj(json("POST", "/v1/topics/" + esc(topic) + "/messages:batch", Map.of("messages", items), p, 0).body());
        List<PublishResult> out = new ArrayList<>();
        for (Object x : Json.list(r.get("results"))) out.add(result(topic, Json.obj(x)));
        return out;
    }

    // ---- topics and groups

    /** Creates or updates a topic; returns its stats, with "created" true when it was new. */
    public Map<String, Object> putTopic(String name, Map<String, Object> config) {
        Answer a = json("PUT", "/v1/topics/" + esc(name), config == null ? Map.of() : config, Policy.SAFE, 0);
        Map<String, Object> out = new LinkedHashMap<>(Json.obj(a.body()));
        out.put("created", a.status() == 201);
        return out;
    }

    public Map<String, Object> topic(String name) { return json("GET", "/v1/topics/" + esc(name), null); }

    /** Every topic with its stats, following the pages. */
    public List<Object> topics() {
        List<Object> out = new ArrayList<>();
        String after = "";
        for (;;) {
            Map<String, Object> page = json("GET", "/v1/topics" + (after.isEmpty() ? "" : "?after=" + esc(after)), null);
            List<Object> ts = Json.list(page.get("topics"));
            out.addAll(ts);
            after = Json.str(page, "next");
            if (after.isEmpty() || ts.isEmpty()) return out;
        }
    }

    public void deleteTopic(String name) { json("DELETE", "/v1/topics/" + esc(name), null); }

    public void putGroup(String topic, String group) { json("PUT", groupPath(topic, group), null); }

    public void deleteGroup(String topic, String group) { json("DELETE", groupPath(topic, group), null); }

    public Map<String, Object> cluster() { return json("GET", "/v1/cluster", null); }

    // ---- consume

    /**
     * Leases up to max messages, waiting up to waitMs for the first; the
     * attempt's HTTP timeout is the client's timeout plus waitMs. A fetch whose
     * answer was lost is retried; what it leased comes back when the lease runs out.
     * leaseMs 0: the topic's ack_timeout_ms.
     */
    public List<Message> fetch(String topic, String group, int max, long waitMs, long leaseMs) {
        Map<String, Object> body = new LinkedHashMap<>();
        body.put("max", max);
        if (waitMs > 0) body.put("wait_ms", waitMs);
        if (leaseMs > 0) body.put("lease_ms", leaseMs);
        Map<String, Object> r = Json.obj(json("POST", groupPath(topic, group) + "/fetch", body, Policy.SAFE, waitMs).body());
        List<Message> out = new ArrayList<>();
        for (Object m : Json.list(r.get("messages"))) out.add(new Message(Json.obj(m)));
        return out;
    }

    /** Acknowledges receipts; a retried ack whose first attempt committed answers stale: nothing to do. */
    public List<ReceiptResult> ack(String topic, String group, List<String> receipts) {
        return receipts(topic, group, "ack", Map.of("receipts", receipts));
    }

    /** Reports receipts as failed with a reason; retryable false dead-letters them at once. delayMs &lt; 0: the backoff. */
    public List<ReceiptResult> nack(String topic, String group, List<String> receipts, String reason, boolean retryable, long delayMs) {
        Map<String, Object> body = new LinkedHashMap<>();
        body.put("receipts", receipts);
        body.put("retryable", retryable);
        if (reason != null && !reason.isEmpty()) body.put("reason", reason);
        if (delayMs >= 0) body.put("delay_ms", delayMs);
        return receipts(topic, group, "nack", body);
    }

    /** Makes the leases end leaseMs from now. */
    public List<ReceiptResult> extend(String topic, String group, List<String> receipts, long leaseMs) {
        return receipts(topic, group, "extend", Map.of("receipts", receipts, "lease_ms", Math.max(1, leaseMs)));
    }

    private List<ReceiptResult> receipts(String topic, String group, String op, Map<String, Object> body) {
        Map<String, Object> r = json("POST", groupPath(topic, group) + "/" + op, body);
        List<ReceiptResult> out = new ArrayList<>();
        for (Object x : Json.list(r.get("results"))) {
            Map<String, Object> m = Json.obj(x);
            String st = Json.str(m, "status");
            if (BREAKS.contains("hide_stale") && "stale".equals(st)) st = "ok";
            out.add(new ReceiptResult(Json.str(m, "receipt"), st));
        }
        return out;
    }

    /**
     * Acks receipts of topic's group and publishes outputs as one atomic step
     * (SPEC section 10): all or nothing. Retried like an ack, with the same
     * receipts and outputs: a repeat answers the first call's outcome with
     * duplicate set. A stale or invalid receipt refuses the whole call
     * (MqdException 409, code stale_receipt; nothing was published).
     */
    public ProcessResult process(String topic, String group, List<String> receipts, List<Output> outputs) {
        List<Object> pub = new ArrayList<>();
        for (Output o : outputs == null ? List.<Output>of() : outputs) {
            Map<String, Object> it = new LinkedHashMap<>();
            it.put("topic", o.topic());
            it.put("value_b64", Base64.getEncoder().encodeToString(o.value() == null ? new byte[0] : o.value()));
            if (o.key() != null && !o.key().isEmpty()) it.put("idempotency_key", o.key());
            if (o.partitionKey() != null && !o.partitionKey().isEmpty()) it.put("partition_key", o.partitionKey());
            if (o.delayMs() > 0) it.put("delay_ms", o.delayMs());
            if (o.maxRetry() != null && o.maxRetry() >= 0) it.put("max_retry", o.maxRetry());
            if (o.attrs() != null && !o.attrs().isEmpty()) it.put("attrs", o.attrs());
            pub.add(it);
        }
        Map<String, Object> body = new LinkedHashMap<>();
        body.put("ack", receipts);
        body.put("publish", pub);
        Map<String, Object> r = json("POST", groupPath(topic, group) + "/process", body);
        List<PublishResult> res = new ArrayList<>();
        for (Object x : Json.list(r.get("results"))) res.add(result("", Json.obj(x)));
        return new ProcessResult(Json.num(r, "acked"), Boolean.TRUE.equals(r.get("duplicate")), res, r);
    }

    /** A consumer loop for topic and group (see {@link Consumer}). */
    public Consumer consumer(String topic, String group, Consumer.Options o) { return new Consumer(this, topic, group, o); }

    // ---- dead letters

    /** One page of the group's dead letters, oldest first (limit 0: the broker's; after 0: from the start). */
    public DLQPage deadLetters(String topic, String group, int limit, long after, String key) {
        List<String> q = new ArrayList<>();
        if (limit > 0) q.add("limit=" + limit);
        if (after > 0) q.add("after=" + after);
        if (key != null && !key.isEmpty()) q.add("idempotency_key=" + esc(key));
        Map<String, Object> r = json("GET", groupPath(topic, group) + "/dlq" + (q.isEmpty() ? "" : "?" + String.join("&", q)), null);
        List<DeadLetter> out = new ArrayList<>();
        for (Object x : Json.list(r.get("dead_letters"))) {
            Map<String, Object> d = Json.obj(x);
            out.add(new DeadLetter(Json.num(d, "id"), Json.num(d, "partition"), Json.num(d, "offset"),
                    Base64.getDecoder().decode(Json.str(d, "value_b64")), Json.str(d, "idempotency_key"),
                    Json.str(d, "reject_reason"), Json.num(d, "retry_count"), Json.str(d, "dead_at"),
                    Json.strings(d.get("attrs")), Json.list(d.get("history")), d));
        }
        Object next = r.get("next_after");
        return new DLQPage(out, next instanceof Number ? ((Number) next).longValue() : null);
    }

    /** Puts dead letters back into delivery: ids, or all when empty. Not retried once sent. */
    public ReplayResult replay(String topic, String group, List<Long> ids, int ratePerSec) {
        Map<String, Object> body = new LinkedHashMap<>();
        if (ids == null || ids.isEmpty()) body.put("all", true);
        else body.put("ids", ids);
        if (ratePerSec > 0) body.put("rate_per_sec", ratePerSec);
        Map<String, Object> r = Json.obj(json("POST", groupPath(topic, group) + "/dlq/replay", body, Policy.UNSENT, 0).body());
        return new ReplayResult(Json.num(r, "accepted"), Json.num(r, "rate_per_sec"));
    }

    public void deleteDeadLetter(String topic, String group, long id) { json("DELETE", groupPath(topic, group) + "/dlq/" + id, null); }
}
