#!/usr/bin/env python3
"""Publish COUNT messages to TOPIC, each with its own idempotency key.

Usage: producer.py TOPIC COUNT [KEY_PREFIX]

Message i has the key KEY_PREFIX-i and the value "order KEY_PREFIX-i"; running
the producer twice with the same prefix stores nothing new (the broker answers
duplicate=true). A publish that fails on the way (connection error, 503 while a
leader is elected, 429) is retried with the same key, so a retry can never
store the message twice. Standard library only.

Environment: MQD_SERVER (default http://127.0.0.1:7070), MQD_TOKEN (bearer token,
when the server runs with --auth-file).
"""
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

SERVER = os.environ.get("MQD_SERVER", "http://127.0.0.1:7070").rstrip("/")
TOKEN = os.environ.get("MQD_TOKEN", "")
RETRYABLE = {429, 502, 503, 504}


def publish(topic, key, value, attempts=8):
    url = f"{SERVER}/v1/topics/{urllib.parse.quote(topic, safe='')}/messages"
    headers = {"Idempotency-Key": key, "Content-Type": "application/octet-stream"}
    if TOKEN:
        headers["Authorization"] = "Bearer " + TOKEN
    for attempt in range(attempts):
        req = urllib.request.Request(url, data=value, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=15) as resp:
                return json.load(resp)
        except urllib.error.HTTPError as e:
            body = e.read().decode("utf-8", "replace")
            if e.code not in RETRYABLE or attempt == attempts - 1:
                raise RuntimeError(f"publish {key}: {e.code} {body}") from None
        except (urllib.error.URLError, OSError) as e:
            if attempt == attempts - 1:
                raise RuntimeError(f"publish {key}: {e}") from None
        time.sleep(min(0.1 * 2 ** attempt, 2.0))  # same key on every try


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    topic, count = sys.argv[1], int(sys.argv[2])
    prefix = sys.argv[3] if len(sys.argv) > 3 else "py"
    for i in range(count):
        key = f"{prefix}-{i}"
        r = publish(topic, key, f"order {key}".encode())
        print(f"published {key} partition={r['partition']} offset={r['offset']} duplicate={str(r['duplicate']).lower()}", flush=True)


if __name__ == "__main__":
    main()
