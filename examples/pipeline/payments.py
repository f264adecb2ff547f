#!/usr/bin/env python3
"""Stage 1 of the pipeline: consume ORDERS as group "payments" and, for each
order, publish one payment into PAYMENTS, exactly once.

Usage: payments.py [--separate] [ORDERS [PAYMENTS]]   (default: orders payments)

The handler returns the payment (keyed "pay-" + the order's key) and the
client's consumer loop publishes it and acks the order in one process call
(SPEC section 10): killed at any moment, restarted, the stage still yields
exactly one payment per order. --separate instead publishes the payment and
then acks the order, two calls, as a consumer without process must: a crash
between the two publishes the payment again on redelivery (the broker
answers that publish as a duplicate of the key). It is here to show the
difference; the pipeline's test fails with it.

Prints "handling KEY" when a handler starts (the test picks its kill moments
from these lines) and "paid KEY PAYMENT" when it returns. Stops on SIGINT or
SIGTERM. Environment: MQD_SERVERS (comma-separated) or MQD_SERVER, MQD_TOKEN,
MQD_CA_FILE.
"""
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python"))
from mqd import Client, Message, Output  # noqa: E402  (or: pip install clients/python)


def charge(order: dict) -> dict:
    """The stage's work: a payment for the order (a real one would call a
    payment provider, idempotently on the order's key; see docs/clients.md)."""
    time.sleep(random.uniform(0.02, 0.06))
    return {"payment": "pay-" + order["order"], "order": order["order"], "amount_cents": order["amount_cents"]}


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--separate"]
    separate = "--separate" in sys.argv[1:]
    orders = args[0] if args else "orders"
    payments = args[1] if len(args) > 1 else "payments"
    servers = os.environ.get("MQD_SERVERS") or os.environ.get("MQD_SERVER", "http://127.0.0.1:7070")

    with Client(servers, token=os.environ.get("MQD_TOKEN"), ca_file=os.environ.get("MQD_CA_FILE")) as c:
        def payment(m: Message) -> Output:
            print(f"handling {m.idempotency_key}", flush=True)
            p = charge(json.loads(m.value))
            print(f"paid {m.idempotency_key} {p['payment']}", flush=True)
            return Output(payments, json.dumps(p), key=p["payment"])

        def process(m: Message):
            return [payment(m)]  # published with the order's ack, in one call

        def publish_then_ack(m: Message) -> None:
            o = payment(m)
            c.publish(o.topic, o.value, key=o.key)  # the loop acks when this returns

        with c.consumer(orders, "payments", lease_ms=2000, wait_ms=1000, concurrency=2,
                        on_error=lambda e: print(f"payments: {e}", file=sys.stderr, flush=True)) as consumer:
            if separate:
                consumer.run(publish_then_ack)
            else:
                consumer.run_process(process)


if __name__ == "__main__":
    main()
