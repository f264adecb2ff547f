package com.github.mqd.client;

/**
 * The one error type of the client: the broker's error answer, or no answer.
 * {@link #status()} is the HTTP status, 0 when no answer came (refused,
 * reset, timed out); {@link #code()} the API's stable error code
 * ({@code topic_not_found}, {@code no_quorum}...), "" without an answer.
 */
public class MqdException extends RuntimeException {
    private static final long serialVersionUID = 1L;
    private final int status;
    private final String code;
    private final String method;
    private final String path;
    private final long retryAfterMs;
    private final boolean sent;

    public MqdException(int status, String code, String message, String method, String path, long retryAfterMs,
            boolean sent, Throwable cause) {
        super(message, cause);
        this.status = status;
        this.code = code == null ? "" : code;
        this.method = method;
        this.path = path;
        this.retryAfterMs = retryAfterMs;
        this.sent = sent;
    }

    MqdException(String message, MqdException cause) {
        this(cause == null ? 0 : cause.status, cause == null ? "" : cause.code,
                cause == null ? message : message + ": " + cause.getMessage(), "", "", -1, true, cause);
    }

    public int status() { return status; }

    public String code() { return code; }

    public String method() { return method; }

    public String path() { return path; }

    /** The answer's Retry-After in milliseconds, or -1. */
    public long retryAfterMs() { return retryAfterMs; }

    /** For status 0: whether the request may have reached the node (and so may have taken effect). */
    public boolean sent() { return sent; }

    /** No answer, 503 or 429: the same request may succeed later. */
    public boolean retryable() { return status == 0 || status == 429 || status == 503; }
}
