#!/usr/bin/env python3
"""Consume TOPIC as consumer group GROUP: ack on success, nack on failure.

Usage: consumer.py TOPIC GROUP [IDLE_SECONDS]

Long-polls for messages, hands each to handle(), acks it when handle()
returns, nacks it (retryable, with the error as the reason) when it raises:
the broker then redelivers it after the topic's backoff, or moves it to the
group's dead-letter queue after max_retry failures. Prints one line per
outcome: "ok GROUP KEY VALUE" or "nack GROUP KEY REASON". Stops after
IDLE_SECONDS without a message (default: runs until interrupted).

The example handler fails the first delivery of every message whose value
contains "flaky", to show a nack and its redelivery.

Environment: MQD_SERVER (default http://127.0.0.1:7070), MQD_TOKEN.
"""
import base64
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

SERVER = os.environ.get("MQD_SERVER", "http://127.0.0.1:7070").rstrip("/")
TOKEN = os.environ.get("MQD_TOKEN", "")
WAIT_MS = 1000  # long-poll; the HTTP timeout must be longer


def call(path, body):
    headers = {"Content-Type": "application/json"}
    if TOKEN:
        headers["Authorization"] = "Bearer " + TOKEN
    req = urllib.request.Request(SERVER + path, data=json.dumps(body).encode(), headers=headers, method="POST")
    with urllib.request.urlopen(req, timeout=WAIT_MS / 1000 + 15) as resp:
        return json.load(resp)


def handle(msg, value):
    """The application's work. Raise to have the message redelivered."""
    if "flaky" in value and msg["retry_count"] == 0:
        raise RuntimeError("simulated failure on first delivery")


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    topic, group = sys.argv[1], sys.argv[2]
    idle = float(sys.argv[3]) if len(sys.argv) > 3 else None
    base = f"/v1/topics/{urllib.parse.quote(topic, safe='')}/groups/{urllib.parse.quote(group, safe='')}"
    last = time.monotonic()
    while idle is None or time.monotonic() - last < idle:
        try:
            msgs = call(base + "/fetch", {"max": 10, "wait_ms": WAIT_MS})["messages"]
        except (urllib.error.URLError, OSError) as e:  # includes 503 during an election
            print(f"fetch failed, retrying: {e}", file=sys.stderr)
            time.sleep(0.5)
            continue
        for m in msgs:
            value = base64.b64decode(m["value_b64"]).decode("utf-8", "replace")
            key = m.get("idempotency_key") or f"{m['partition']}:{m['offset']}"
            try:
                handle(m, value)
            except Exception as e:  # the handler failed: nack, retryable
                call(base + "/nack", {"receipts": [m["receipt"]], "reason": str(e), "retryable": True})
                print(f"nack {group} {key} {e}", flush=True)
                continue
            status = call(base + "/ack", {"receipts": [m["receipt"]]})["results"][0]["status"]
            if status == "ok":
                print(f"ok {group} {key} {value}", flush=True)
            else:  # stale: the lease ran out first; the message will come again
                print(f"ack {status} {group} {key}", file=sys.stderr, flush=True)
        if msgs:  # idle counts from the end of the last work
            last = time.monotonic()


if __name__ == "__main__":
    main()
