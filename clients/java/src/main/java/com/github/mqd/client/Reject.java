package com.github.mqd.client;

/** Thrown by a handler: nack the message as not retryable, so it goes to the dead-letter store at once. */
public class Reject extends Exception {
    private static final long serialVersionUID = 1L;

    public Reject(String message) { super(message); }

    public Reject(String message, Throwable cause) { super(message, cause); }
}
