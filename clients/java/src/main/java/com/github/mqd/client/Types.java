package com.github.mqd.client;

import java.util.List;
import java.util.Map;

/** The values the client's calls take and return. */
public final class Types {
    private Types() {}

    /** Where a message was stored; duplicate when an earlier publish stored it. */
    public record PublishResult(String topic, long partition, long offset, boolean duplicate, Map<String, Object> raw) {}

    /** One receipt's outcome: ok, stale (no lease any more, or already acked: a retried ack) or invalid. */
    public record ReceiptResult(String receipt, String status) {
        public boolean ok() { return "ok".equals(status); }
    }

    /** One message of publishBatch. */
    public record BatchMessage(byte[] value, String key, String partitionKey, long delayMs, Integer maxRetry,
            Map<String, String> attrs) {
        public static BatchMessage of(byte[] value, String key) { return new BatchMessage(value, key, null, 0, null, null); }
    }

    /**
     * One message a process call publishes, to any topic; key is its own
     * Idempotency-Key (dedups it in its topic's window). maxRetry null: the topic's.
     */
    public record Output(String topic, byte[] value, String key, String partitionKey, long delayMs, Integer maxRetry,
            Map<String, String> attrs) {
        public static Output of(String topic, byte[] value, String key) { return new Output(topic, value, key, null, 0, null, null); }
    }

    /**
     * The answer of process: the receipts acked and where each output went, in
     * order; duplicate when it is the kept answer of an earlier call with the
     * same receipts (a retry after a lost answer).
     */
    public record ProcessResult(long acked, boolean duplicate, List<PublishResult> results, Map<String, Object> raw) {}

    /** A page of dead letters; nextAfter is null on the last page. */
    public record DLQPage(List<DeadLetter> deadLetters, Long nextAfter) {}

    public record DeadLetter(long id, long partition, long offset, byte[] value, String idempotencyKey,
            String rejectReason, long retryCount, String deadAt, Map<String, String> attrs,
            List<Object> history, Map<String, Object> raw) {}

    public record ReplayResult(long accepted, long ratePerSec) {}

    /** Optional fields of a publish. Build with {@code new PublishOptions().key("order-1")...}. */
    public static final class PublishOptions {
        String key;
        String partitionKey;
        long delayMs;
        Integer maxRetry;
        Map<String, String> attrs;
        String producerId;
        Long producerSeq;

        /** The Idempotency-Key: with it a publish is retried after a lost answer or a 503, with the same key. */
        public PublishOptions key(String k) { key = k; return this; }
        public PublishOptions partitionKey(String k) { partitionKey = k; return this; }
        public PublishOptions delayMs(long ms) { delayMs = ms; return this; }
        public PublishOptions maxRetry(int n) { maxRetry = n; return this; }
        public PublishOptions attrs(Map<String, String> a) { attrs = a; return this; }
        public PublishOptions producer(String id, long seq) { producerId = id; producerSeq = seq; return this; }
    }
}
