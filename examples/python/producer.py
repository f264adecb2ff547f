#!/usr/bin/env python3
"""Publish COUNT messages to TOPIC with the mqd client, each with its own key.

Usage: producer.py TOPIC COUNT [KEY_PREFIX]

Message i has the idempotency key KEY_PREFIX-i and the value "order
KEY_PREFIX-i"; running it twice with the same prefix stores nothing new
(duplicate=true). The client moves to another node when one does not answer
and retries a lost answer, a 503 or a 429 with the same key, so nothing is
stored twice. (raw/producer.py does the same over plain HTTP.)

Environment: MQD_SERVERS (comma-separated) or MQD_SERVER (default
http://127.0.0.1:7070), MQD_TOKEN, MQD_CA_FILE.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python"))
from mqd import Client  # noqa: E402  (or: pip install clients/python)


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    topic, count = sys.argv[1], int(sys.argv[2])
    prefix = sys.argv[3] if len(sys.argv) > 3 else "py"
    servers = os.environ.get("MQD_SERVERS") or os.environ.get("MQD_SERVER", "http://127.0.0.1:7070")
    with Client(servers, token=os.environ.get("MQD_TOKEN"), ca_file=os.environ.get("MQD_CA_FILE"), deadline=60) as c:
        for i in range(count):
            key = f"{prefix}-{i}"
            r = c.publish(topic, f"order {key}", key=key)
            print(f"published {key} partition={r.partition} offset={r.offset} duplicate={str(r.duplicate).lower()}",
                  flush=True)


if __name__ == "__main__":
    main()
