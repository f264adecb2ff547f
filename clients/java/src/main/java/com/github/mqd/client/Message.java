package com.github.mqd.client;

import java.nio.charset.StandardCharsets;
import java.util.Base64;
import java.util.Map;

/** A fetched (leased) message. */
public final class Message {
    public final String topic;
    public final long partition;
    public final long offset;
    public final String receipt;
    public final byte[] value;
    public final String idempotencyKey;
    public final long retryCount;
    public final long maxRetry;
    public final String rejectReason;
    public final String publishedAt;
    public final Map<String, String> attrs;
    public final Map<String, Object> raw;
    volatile boolean leaseLost;

    Message(Map<String, Object> d) {
        topic = Json.str(d, "topic");
        partition = Json.num(d, "partition");
        offset = Json.num(d, "offset");
        receipt = Json.str(d, "receipt");
        value = Base64.getDecoder().decode(Json.str(d, "value_b64"));
        idempotencyKey = Json.str(d, "idempotency_key");
        retryCount = Json.num(d, "retry_count");
        maxRetry = Json.num(d, "max_retry");
        rejectReason = Json.str(d, "reject_reason");
        publishedAt = Json.str(d, "published_at");
        attrs = Json.strings(d.get("attrs"));
        raw = d;
    }

    /** The value as UTF-8 text. */
    public String text() { return new String(value, StandardCharsets.UTF_8); }

    /** Set by a consumer when extending the lease answered stale or invalid: the outcome will not count. */
    public boolean leaseLost() { return leaseLost; }

    @Override
    public String toString() { return topic + "/" + partition + "@" + offset + " key=" + idempotencyKey; }
}
