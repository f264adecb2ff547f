package com.github.mqd.client;

import com.github.mqd.client.Types.Output;
import com.github.mqd.client.Types.ReceiptResult;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.Semaphore;
import java.util.concurrent.ThreadFactory;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;

/**
 * A consumer loop: {@link #run} fetches only as many messages as it has free
 * handlers, extends each lease every third of it while its handler runs,
 * acks when the handler returns, and nacks with the exception's message as
 * the reason when it throws ({@link Reject}: not retryable, dead-lettered at
 * once). A lease found lost (extend answered stale) marks the message
 * {@link Message#leaseLost()} and it is not settled. {@link #stop} (from any
 * thread, a handler included), {@link #close}, or the JVM's shutdown after
 * {@link #stopOnShutdown} (SIGINT, SIGTERM) end it once the running handlers
 * are settled; a stop waits for a fetch in progress, at most waitMs.
 *
 * <pre>{@code
 * try (Consumer c = client.consumer("orders", "billing", new Consumer.Options().leaseMs(30000))) {
 *     c.stopOnShutdown();
 *     c.run(m -> bill(m.value));
 * }
 * }</pre>
 */
public final class Consumer implements AutoCloseable {
    /** The application's work on one message; throwing nacks it. */
    @FunctionalInterface
    public interface Handler {
        void handle(Message m) throws Exception;
    }

    /**
     * The application's work on one message, answering the messages derived
     * from it (null: none): {@link #runProcess} publishes them with the
     * message's ack in one process call. Throwing nacks the message.
     */
    @FunctionalInterface
    public interface ProcessHandler {
        List<Output> handle(Message m) throws Exception;
    }

    /** Options of a consumer loop. */
    public static final class Options {
        long leaseMs = 30000;
        long waitMs = 10000;
        int concurrency = 1;
        int max;
        java.util.function.Consumer<MqdException> onError = e -> {};

        /** Lease per message, extended every third of it while the handler runs (default 30 s). */
        public Options leaseMs(long ms) { leaseMs = ms; return this; }
        /** Long poll per fetch (default 10 s). */
        public Options waitMs(long ms) { waitMs = ms; return this; }
        /** Handlers running at once (default 1). */
        public Options concurrency(int n) { concurrency = n; return this; }
        /** Messages per fetch (default concurrency). */
        public Options max(int n) { max = n; return this; }
        /** Hears of what the loop carries on after: retried fetches, failed settles and extends, stale receipts. */
        public Options onError(java.util.function.Consumer<MqdException> f) { onError = f; return this; }
    }

    private final Client c;
    private final String topic;
    private final String group;
    private final Options o;
    private final AtomicBoolean stopped = new AtomicBoolean();
    private final CountDownLatch done = new CountDownLatch(1);
    private volatile boolean running;

    Consumer(Client c, String topic, String group, Options o) {
        this.c = c;
        this.topic = topic;
        this.group = group;
        this.o = o == null ? new Options() : o;
        if (this.o.leaseMs <= 0) this.o.leaseMs = 30000;
        if (this.o.waitMs <= 0) this.o.waitMs = 10000;
        if (this.o.concurrency <= 0) this.o.concurrency = 1;
        if (this.o.max <= 0) this.o.max = this.o.concurrency;
    }

    /** Asks run() to return once the running handlers are settled. */
    public void stop() { stopped.set(true); }

    public boolean stopped() { return stopped.get(); }

    /** Stops and waits for run() to return. */
    @Override
    public void close() {
        stop();
        if (!running) return;
        try {
            done.await();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    /** Stops the loop when the JVM shuts down (SIGINT, SIGTERM), settling the running handlers first. */
    public Consumer stopOnShutdown() {
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            stop();
            try {
                done.await(o.waitMs + c.timeout.toMillis(), TimeUnit.MILLISECONDS);
            } catch (InterruptedException ignored) {
                Thread.currentThread().interrupt();
            }
        }, "mqd-consumer-shutdown"));
        return this;
    }

    private void report(String msg, MqdException cause) {
        try {
            o.onError.accept(new MqdException(msg, cause));
        } catch (RuntimeException ignored) { // a reporter must not stop the loop
        }
    }

    private static ThreadFactory daemons(String name) {
        return r -> {
            Thread t = new Thread(r, name);
            t.setDaemon(true);
            return t;
        };
    }

    /** Runs h on every message until stopped; throws the MqdException of a fetch that retrying cannot fix. */
    public void run(Handler h) {
        loop(m -> {
            h.handle(m);
            return null;
        }, false);
    }

    /**
     * {@link #run} with a handler whose outputs are published with its
     * message's ack in one process call (SPEC section 10), so each message
     * yields its outputs exactly once whatever crashes or retries happen. A
     * call refused as stale (the lease was lost; the next delivery decides)
     * or still failing after its retries publishes nothing and is reported to
     * onError; one refused otherwise (unknown output topic, too large...)
     * nacks the message with the error's message.
     */
    public void runProcess(ProcessHandler h) { loop(h, true); }

    private void loop(ProcessHandler h, boolean process) {
        running = true;
        ExecutorService workers = Executors.newFixedThreadPool(o.concurrency, daemons("mqd-handler"));
        ScheduledExecutorService ticker = Executors.newScheduledThreadPool(Math.min(o.concurrency, 4), daemons("mqd-lease"));
        Semaphore slots = new Semaphore(o.concurrency);
        long backoff = c.backoffMs;
        try {
            while (!stopped.get() && !Thread.currentThread().isInterrupted()) {
                if (!slots.tryAcquire(200, TimeUnit.MILLISECONDS)) continue;
                if (stopped.get()) { // stopped while waiting for a free handler
                    slots.release();
                    break;
                }
                int free = 1;
                while (free < o.max && slots.tryAcquire()) free++;
                List<Message> msgs;
                try {
                    msgs = c.fetch(topic, group, free, o.waitMs, o.leaseMs);
                } catch (MqdException e) {
                    slots.release(free);
                    if (!e.retryable()) throw e;
                    report("fetch (retrying)", e);
                    Thread.sleep(backoff);
                    backoff = Math.min(2 * backoff, Client.MAX_RETRY_BACKOFF_MS);
                    continue;
                }
                backoff = c.backoffMs;
                slots.release(free - msgs.size());
                for (Message m : msgs) { // leased to us: handled even when a stop came meanwhile
                    workers.execute(() -> {
                        try {
                            handle(m, h, process, ticker);
                        } finally {
                            slots.release();
                        }
                    });
                }
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        } finally {
            workers.shutdown();
            try {
                workers.awaitTermination(Long.MAX_VALUE, TimeUnit.MILLISECONDS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
            ticker.shutdownNow();
            running = false;
            done.countDown();
        }
    }

    private void handle(Message m, ProcessHandler h, boolean process, ScheduledExecutorService ticker) {
        ScheduledFuture<?> keeper = null;
        AtomicBoolean finished = new AtomicBoolean();
        if (!Client.BREAKS.contains("no_extend")) {
            long every = Math.max(1, o.leaseMs / 3);
            keeper = ticker.scheduleAtFixedRate(() -> extend(m, finished), every, every, TimeUnit.MILLISECONDS);
        }
        Exception err = null;
        List<Output> outs = null;
        try {
            outs = h.handle(m);
        } catch (Exception e) {
            err = e;
        } finally {
            finished.set(true);
            if (keeper != null) keeper.cancel(false);
        }
        if (process && err == null) settleProcess(m, outs == null ? List.of() : outs);
        else settle(m, err);
    }

    private void settleProcess(Message m, List<Output> outs) {
        if (m.leaseLost) return; // already reported; the next delivery decides
        if (Client.BREAKS.contains("publish_then_ack")) { // the gap process closes: two calls
            try {
                for (Output o : outs) {
                    Types.PublishOptions po = new Types.PublishOptions().key(o.key()).partitionKey(o.partitionKey())
                            .delayMs(o.delayMs()).attrs(o.attrs());
                    if (o.maxRetry() != null) po.maxRetry(o.maxRetry());
                    c.publish(o.topic(), o.value(), po);
                }
            } catch (MqdException e) {
                settle(m, e);
                return;
            }
            settle(m, null);
            return;
        }
        try {
            c.process(topic, group, List.of(m.receipt), outs);
        } catch (MqdException e) {
            if ("stale_receipt".equals(e.code()) || e.retryable()) {
                report("process " + m.topic + "/" + m.partition + "@" + m.offset, e); // the lease ends by itself
                return;
            }
            settle(m, e); // refused as a whole (unknown output topic, too large...): nack
        }
    }

    private void extend(Message m, AtomicBoolean finished) {
        if (finished.get() || m.leaseLost) return;
        try {
            List<ReceiptResult> r = c.extend(topic, group, List.of(m.receipt), o.leaseMs);
            if (r.size() == 1 && !r.get(0).ok() && !finished.get()) {
                m.leaseLost = true;
                report("extending lease: receipt " + r.get(0).status() + ": lease lost", null);
            }
        } catch (MqdException e) {
            if (!finished.get()) report("extending lease", e);
        }
    }

    private void settle(Message m, Exception err) {
        if (m.leaseLost) return; // already reported; the message is someone else's now
        String where = "settling " + m.topic + "/" + m.partition + "@" + m.offset;
        try {
            List<ReceiptResult> r;
            if (err == null) {
                r = c.ack(topic, group, List.of(m.receipt));
            } else {
                String reason = err.getMessage() == null || err.getMessage().isEmpty() ? err.getClass().getName() : err.getMessage();
                if (Client.BREAKS.contains("nack_no_reason")) reason = "";
                r = c.nack(topic, group, List.of(m.receipt), reason, !(err instanceof Reject), -1);
            }
            if (r.size() == 1 && !r.get(0).ok()) report(where + ": receipt " + r.get(0).status(), null);
        } catch (MqdException e) {
            report(where, e);
        }
    }
}
