#!/usr/bin/env python3
"""Consume TOPIC as consumer group GROUP with the mqd client's consumer loop.

Usage: consumer.py TOPIC GROUP [IDLE_SECONDS]

The loop long-polls, runs handle() on each message with its lease extended
while it runs, acks when it returns and nacks (with the exception's text as
the reason) when it raises: the broker redelivers after the topic's backoff,
or dead-letters after max_retry failures. It moves to another node when one
dies. Prints "ok GROUP KEY VALUE" or "nack GROUP KEY REASON" per outcome.
Stops after IDLE_SECONDS without a message, or on Ctrl-C / SIGTERM.
(raw/consumer.py does the same over plain HTTP, against one node.)

The example handler fails the first delivery of every message whose value
contains "flaky", to show a nack and its redelivery.

Environment: MQD_SERVERS (comma-separated) or MQD_SERVER, MQD_TOKEN, MQD_CA_FILE.
"""
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python"))
from mqd import Client, Message  # noqa: E402  (or: pip install clients/python)


def handle(m: Message) -> None:
    """The application's work. Raise to have the message redelivered."""
    if "flaky" in m.text() and m.retry_count == 0:
        raise RuntimeError("simulated failure on first delivery")


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    topic, group = sys.argv[1], sys.argv[2]
    idle = float(sys.argv[3]) if len(sys.argv) > 3 else None
    servers = os.environ.get("MQD_SERVERS") or os.environ.get("MQD_SERVER", "http://127.0.0.1:7070")
    last = [time.monotonic()]

    def handler(m: Message) -> None:
        key = m.idempotency_key or f"{m.partition}:{m.offset}"
        try:
            handle(m)
        except Exception as e:
            print(f"nack {group} {key} {e}", flush=True)
            raise
        finally:
            last[0] = time.monotonic()
        print(f"ok {group} {key} {m.text()}", flush=True)

    with Client(servers, token=os.environ.get("MQD_TOKEN"), ca_file=os.environ.get("MQD_CA_FILE")) as c:
        with c.consumer(topic, group, wait_ms=1000, lease_ms=10000,
                        on_error=lambda e: print(f"consumer: {e}", file=sys.stderr, flush=True)) as consumer:
            if idle is not None:
                def watch() -> None:
                    while not consumer.stopped:
                        if time.monotonic() - last[0] > idle:
                            consumer.stop()
                        time.sleep(0.2)
                threading.Thread(target=watch, daemon=True).start()
            consumer.run(handler)


if __name__ == "__main__":
    main()
