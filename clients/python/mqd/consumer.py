"""The consumer loop: long-poll, a handler per message with its lease kept
alive, ack on success, nack with the error on failure."""
import signal
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterable, List, Optional

from .errors import MqdError, Reject

if TYPE_CHECKING:
    from .client import Client, Message, Output

Handler = Callable[["Message"], Any]
ProcessHandler = Callable[["Message"], Optional[Iterable["Output"]]]


class Consumer:
    """Runs a handler on every message of topic for group until stopped.

        with client.consumer("orders", "billing", lease_ms=30000) as consumer:
            consumer.run(handle)

    run() fetches only as many messages as it has free handlers (concurrency
    threads), extends each lease every third of lease_ms while its handler
    runs, acks when the handler returns, and nacks with the exception's text as
    the reason when it raises (mqd.Reject: not retryable, dead-lettered at
    once). A lease found lost (extend answered stale) sets message.lease_lost
    and the message is not settled. run() returns after stop() (from any
    thread, a handler included, or SIGINT/SIGTERM when stop_on_signals and it
    runs in the main thread), once the running handlers are settled; a stop
    waits for a fetch in progress, at most wait_ms. It raises the MqdError of
    a fetch that retrying cannot fix (topic_not_found, forbidden...). on_error
    hears of what it carries on after: failed fetches it retries, failed
    settles and extends, receipts answered stale or invalid.

    run_process(handler) is the same loop with a handler that returns the
    messages derived from its message (a list of mqd.Output, or None): they
    are published with the message's ack in one ``process`` call (SPEC
    section 10), so each message yields its outputs exactly once whatever
    crashes or retries happen. A call refused as stale (the lease was lost;
    the next delivery decides) or still failing after its retries publishes
    nothing and is reported to on_error; one refused otherwise (unknown
    output topic, too large...) nacks the message with the error's text.
    """

    def __init__(self, client: "Client", topic: str, group: str, *, lease_ms: int = 30000, wait_ms: int = 10000,
                 concurrency: int = 1, max: Optional[int] = None,
                 on_error: Optional[Callable[[Exception], None]] = None) -> None:
        self._c, self.topic, self.group = client, topic, group
        self.lease_ms = lease_ms if lease_ms > 0 else 30000
        self.wait_ms = wait_ms if wait_ms > 0 else 10000
        self.concurrency = concurrency if concurrency > 0 else 1
        self.max = max if max and max > 0 else self.concurrency
        self._on_error = on_error
        self._stop = threading.Event()
        self._threads: List[threading.Thread] = []
        self._process = False

    def __enter__(self) -> "Consumer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
        self._join()

    def stop(self) -> None:
        """Asks run() to return once the running handlers are settled."""
        self._stop.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def _report(self, err: Exception) -> None:
        if self._on_error is not None:
            self._on_error(err)

    def run(self, handler: Handler, *, stop_on_signals: bool = True) -> None:
        self._run(handler, False, stop_on_signals)

    def run_process(self, handler: ProcessHandler, *, stop_on_signals: bool = True) -> None:
        """run() with a handler whose outputs are published with its
        message's ack in one process call (see the class's doc)."""
        self._run(handler, True, stop_on_signals)

    def _run(self, handler: Callable[["Message"], Any], process: bool, stop_on_signals: bool) -> None:
        restore = self._install_signals() if stop_on_signals else []
        self._process = process
        try:
            self._loop(handler)
        finally:
            self._join()
            for sig, old in restore:
                signal.signal(sig, old)

    def _install_signals(self) -> list:
        if threading.current_thread() is not threading.main_thread():
            return []
        old = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            old.append((sig, signal.signal(sig, lambda *_: self.stop())))
        return old

    def _loop(self, handler: Handler) -> None:
        slots = threading.Semaphore(self.concurrency)
        backoff = self._c._backoff
        while not self._stop.is_set():
            if not slots.acquire(timeout=0.2):
                continue
            if self._stop.is_set():  # stopped while waiting for a free handler
                slots.release()
                break
            free = 1
            while free < self.max and slots.acquire(blocking=False):
                free += 1
            try:
                msgs = self._c.fetch(self.topic, self.group, max=free, wait_ms=self.wait_ms, lease_ms=self.lease_ms)
            except MqdError as e:
                for _ in range(free):
                    slots.release()
                if not e.retryable:
                    raise
                self._report(MqdError(e.status, e.code, f"fetch (retrying): {e}"))
                self._stop.wait(backoff)
                backoff = min(2 * backoff, 2.0)
                continue
            backoff = self._c._backoff
            for _ in range(free - len(msgs)):
                slots.release()
            for m in msgs:  # leased to us: handled even when a stop came meanwhile
                t = threading.Thread(target=self._handle, args=(m, handler, slots), daemon=True)
                self._threads.append(t)
                t.start()
            self._threads = [t for t in self._threads if t.is_alive()]

    def _join(self) -> None:
        for t in list(self._threads):
            t.join()
        self._threads = []

    def _handle(self, m: "Message", handler: Handler, slots: threading.Semaphore) -> None:
        done = threading.Event()
        keeper = threading.Thread(target=self._keep_lease, args=(m, done), daemon=True)
        keeper.start()
        err: Optional[BaseException] = None
        outs: Any = None
        try:
            outs = handler(m)
        except Exception as e:  # the handler failed: nack with its text
            err = e
        finally:
            done.set()
            keeper.join()
        try:
            if self._process and err is None:
                self._settle_process(m, list(outs or []))
            else:
                self._settle(m, err)
        finally:
            slots.release()

    def _settle_process(self, m: "Message", outs: List["Output"]) -> None:
        if m.lease_lost:
            return  # already reported; the next delivery decides
        from .client import _BREAKS
        where = f"process {m.topic}/{m.partition}@{m.offset}"
        if "publish_then_ack" in _BREAKS:  # the gap process closes: two calls
            try:
                for o in outs:
                    self._c.publish(o.topic, o.value, key=o.key, partition_key=o.partition_key,
                                    delay_ms=o.delay_ms, max_retry=o.max_retry, attrs=o.attrs)
            except MqdError as e:
                self._settle(m, e)
                return
            self._settle(m, None)
            return
        try:
            self._c.process(self.topic, self.group, [m.receipt], outs)
        except MqdError as e:
            if e.code == "stale_receipt" or e.retryable:
                self._report(MqdError(e.status, e.code, f"{where}: {e}"))
                return  # the lease ends by itself; the next delivery decides
            self._settle(m, e)  # refused as a whole (unknown output topic, too large...): nack

    def _settle(self, m: "Message", err: Optional[BaseException]) -> None:
        if m.lease_lost:
            return  # already reported; the message is someone else's now
        where = f"settling {m.topic}/{m.partition}@{m.offset}"
        try:
            if err is None:
                res = self._c.ack(self.topic, self.group, m.receipt)
            else:
                from .client import _BREAKS
                reason = "" if "nack_no_reason" in _BREAKS else (str(err) or type(err).__name__)
                res = self._c.nack(self.topic, self.group, m.receipt, reason=reason,
                                   retryable=not isinstance(err, Reject))
        except MqdError as e:
            self._report(MqdError(e.status, e.code, f"{where}: {e}"))
            return
        if len(res) == 1 and res[0].status != "ok":
            self._report(MqdError(0, "", f"{where}: receipt {res[0].status}"))

    def _keep_lease(self, m: "Message", done: threading.Event) -> None:
        from .client import _BREAKS
        if "no_extend" in _BREAKS:
            return
        while not done.wait(self.lease_ms / 3000.0):
            try:
                res = self._c.extend(self.topic, self.group, self.lease_ms, m.receipt)
            except MqdError as e:
                if not done.is_set():
                    self._report(MqdError(e.status, e.code, f"extending lease: {e}"))
                continue
            if len(res) == 1 and res[0].status != "ok":
                m.lease_lost = True
                self._report(MqdError(0, "", f"extending lease: receipt {res[0].status}: lease lost"))
                return
