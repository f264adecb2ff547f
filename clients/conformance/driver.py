"""The Python client's driver of the conformance suite (clients/conformance):
reads one case's servers, client options and steps as JSON on stdin, runs
the steps with the mqd package, prints one JSON line per step."""
import json
import sys
import threading
import time

from mqd import BatchMessage, Client, MqdError, Output


def run(c, st, state):
    op = st["op"]
    if op == "publish":
        r = c.publish(st["topic"], st.get("value", ""), key=st.get("key"), partition_key=st.get("partition_key"),
                      delay_ms=st.get("delay_ms"), max_retry=st.get("max_retry"), attrs=st.get("attrs"))
        return {"partition": r.partition, "offset": r.offset, "duplicate": r.duplicate}
    if op == "publish_batch":
        rs = c.publish_batch(st["topic"], [BatchMessage(m.get("value", ""), key=m.get("key"),
                                                        partition_key=m.get("partition_key"), attrs=m.get("attrs"))
                                           for m in st["messages"]])
        return {"duplicates": [r.duplicate for r in rs], "offsets": [r.offset for r in rs]}
    if op == "fetch":
        msgs = c.fetch(st["topic"], st["group"], max=st.get("max", 10), wait_ms=st.get("wait_ms", 0),
                       lease_ms=st.get("lease_ms"))
        state["receipts"] = [m.receipt for m in msgs]
        return {"keys": [m.idempotency_key for m in msgs], "retry_counts": [m.retry_count for m in msgs]}
    if op in ("ack", "nack", "extend"):
        rs = state.get("receipts", [])
        if op == "ack":
            res = c.ack(st["topic"], st["group"], *rs)
        elif op == "nack":
            res = c.nack(st["topic"], st["group"], *rs, reason=st.get("message", ""))
        else:
            res = c.extend(st["topic"], st["group"], st["lease_ms"], *rs)
        return {"statuses": [r.status for r in res]}
    if op == "process":
        r = c.process(st["topic"], st["group"], state.get("receipts", []),
                      [Output(o["topic"], o.get("value", ""), key=o.get("key")) for o in st.get("outputs", [])])
        return {"acked": r.acked, "duplicate": r.duplicate, "duplicates": [x.duplicate for x in r.results],
                "offsets": [x.offset for x in r.results]}
    if op == "sleep":
        time.sleep(st["ms"] / 1000.0)
        return {}
    if op in ("consume", "consume_process"):
        return consume(c, st)
    if op == "dlq_list":
        page = c.dead_letters(st["topic"], st["group"])
        state["dlq"] = [d.id for d in page.dead_letters]
        return {"keys": [d.idempotency_key for d in page.dead_letters],
                "reasons": [d.reject_reason for d in page.dead_letters]}
    if op == "dlq_replay":
        return {"accepted": c.replay(st["topic"], st["group"], state.get("dlq", [])).accepted}
    raise ValueError("unknown op " + op)


def consume(c, st):
    handled, errors, lock = [], [], threading.Lock()
    consumer = c.consumer(st["topic"], st["group"], lease_ms=st.get("lease_ms", 30000),
                          wait_ms=st.get("wait_ms", 1000), on_error=lambda e: errors.append(str(e)))

    def handler(m):
        try:
            if st.get("handler") == "throw":
                raise RuntimeError(st.get("message", ""))
            if st.get("handler") == "sleep":
                time.sleep(st["sleep_ms"] / 1000.0)
            if st["op"] == "consume_process":  # one output derived from the message
                return [Output(st["output_topic"], b"out-" + m.value, key="out-" + m.idempotency_key)]
            return None
        finally:
            with lock:
                handled.append(m.idempotency_key)
                if len(handled) >= st.get("count", 1):
                    consumer.stop()

    with consumer:
        if st["op"] == "consume_process":
            consumer.run_process(handler, stop_on_signals=False)
        else:
            consumer.run(handler, stop_on_signals=False)
    return {"handled": handled, "errors": errors}


def main():
    spec = json.load(sys.stdin)
    opts = spec.get("client") or {}
    kw = {}
    if opts.get("timeout_ms"):
        kw["timeout"] = opts["timeout_ms"] / 1000.0
    if opts.get("max_attempts"):
        kw["max_attempts"] = opts["max_attempts"]
    if opts.get("deadline_ms"):
        kw["deadline"] = opts["deadline_ms"] / 1000.0
    kw["token"], kw["ca_file"] = opts.get("token"), opts.get("ca_file")
    state = {}
    with Client(spec["servers"], **kw) as c:
        for st in spec["steps"]:
            try:
                line = {"ok": True, "value": run(c, st, state)}
            except MqdError as e:
                line = {"ok": False, "error": {"status": e.status, "code": e.code, "message": str(e)}}
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
