"""The mqd client: a list of servers, failover, and the retry rules of
docs/clients.md."""
import base64
import http.client
import json
import os
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from .errors import MqdError, TransportError

if TYPE_CHECKING:
    from .consumer import Consumer

DEFAULT_SERVER = "http://127.0.0.1:7070"
DEFAULT_TIMEOUT = 15.0  # seconds; above the broker's 10 s commit deadline
DEFAULT_MAX_ATTEMPTS = 10
DEFAULT_RETRY_BACKOFF = 0.1  # seconds, doubled after each failed attempt up to MAX_RETRY_BACKOFF
MAX_RETRY_BACKOFF = 2.0
_IDLE_REUSE = 10.0  # a kept-alive connection idle longer is not reused (the broker closes at 30 s)

# For the conformance suite's self-test only (see client/selftest.go): rules switched off.
_BREAKS = frozenset(r.strip() for r in os.environ.get("MQD_CLIENT_BREAK", "").split(",") if r.strip())

_SAFE, _UNSENT = "safe", "unsent"  # retry policies: any failure, or only a request never sent


@dataclass
class PublishResult:
    """Where a message was stored; ``duplicate`` when an earlier publish stored it."""
    topic: str
    partition: int
    offset: int
    duplicate: bool
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class BatchMessage:
    """One message of ``publish_batch``."""
    value: Union[bytes, str]
    key: Optional[str] = None
    partition_key: Optional[str] = None
    delay_ms: Optional[int] = None
    max_retry: Optional[int] = None
    attrs: Optional[Mapping[str, str]] = None


@dataclass
class Output:
    """One message a ``process`` call publishes, to any topic. ``key`` is its
    own Idempotency-Key (dedups it in its topic's window)."""
    topic: str
    value: Union[bytes, str]
    key: Optional[str] = None
    partition_key: Optional[str] = None
    delay_ms: Optional[int] = None
    max_retry: Optional[int] = None
    attrs: Optional[Mapping[str, str]] = None


@dataclass
class ProcessResult:
    """The answer of ``process``: the receipts acked and where each output
    went, in order; ``duplicate`` when it is the kept answer of an earlier
    call with the same receipts (a retry after a lost answer)."""
    acked: int
    duplicate: bool
    results: List[PublishResult]
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class Message:
    """A fetched (leased) message. ``value`` is the payload's bytes."""
    topic: str
    partition: int
    offset: int
    receipt: str
    value: bytes
    idempotency_key: str
    retry_count: int
    max_retry: int
    reject_reason: str
    published_at: str
    attrs: Dict[str, str]
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)
    lease_lost: bool = False  # set by a consumer when extending the lease answered stale/invalid

    def text(self) -> str:
        return self.value.decode("utf-8", "replace")

    @classmethod
    def _from(cls, d: Dict[str, Any]) -> "Message":
        return cls(d.get("topic", ""), d.get("partition", 0), d.get("offset", 0), d.get("receipt", ""),
                   base64.b64decode(d.get("value_b64", "")), d.get("idempotency_key", ""), d.get("retry_count", 0),
                   d.get("max_retry", 0), d.get("reject_reason", ""), d.get("published_at", ""),
                   d.get("attrs") or {}, d)


@dataclass
class ReceiptResult:
    """One receipt's outcome: ``ok``, ``stale`` (no lease any more, or already
    acked: see docs/clients.md) or ``invalid``."""
    receipt: str
    status: str


@dataclass
class DeadLetter:
    id: int
    partition: int
    offset: int
    value: bytes
    idempotency_key: str
    reject_reason: str
    retry_count: int
    dead_at: str
    attrs: Dict[str, str]
    history: List[Dict[str, Any]]
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class DLQPage:
    dead_letters: List[DeadLetter]
    next_after: Optional[int]


@dataclass
class ReplayResult:
    accepted: int
    rate_per_sec: int


class _Node:
    def __init__(self, url: str) -> None:
        u = urllib.parse.urlsplit(url if "://" in url else "http://" + url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"mqd: server {url!r}: want http://host:port or https://host:port")
        self.scheme, self.host = u.scheme, u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.prefix = u.path.rstrip("/")
        self.url = f"{u.scheme}://{u.netloc}{self.prefix}"


class Client:
    """Talks to one mqd cluster through any of its nodes. Thread-safe.

    servers: the nodes' base URLs (a bare host:port means http). token: sent
    as a bearer token. ca_file: PEM CA certificates trusted for https (or
    ssl_context). timeout: one attempt's bound in seconds (a fetch adds its
    wait_ms). max_attempts: tries of one request, across nodes. deadline:
    default bound in seconds of one operation with all its retries (None:
    only max_attempts bounds it); every method takes deadline= too.
    """

    def __init__(self, servers: Union[str, Sequence[str], None] = None, *, token: Optional[str] = None,
                 ca_file: Optional[str] = None, ssl_context: Optional[ssl.SSLContext] = None,
                 timeout: float = DEFAULT_TIMEOUT, max_attempts: int = DEFAULT_MAX_ATTEMPTS,
                 retry_backoff: float = DEFAULT_RETRY_BACKOFF, deadline: Optional[float] = None) -> None:
        if servers is None:
            servers = [DEFAULT_SERVER]
        elif isinstance(servers, str):
            servers = [s for s in servers.split(",") if s.strip()]
        if not servers:
            raise ValueError("mqd: no server given")
        self._nodes = [_Node(s.strip()) for s in servers]
        self._token = token or ""
        self._timeout = timeout if timeout > 0 else DEFAULT_TIMEOUT
        self._max_attempts = max_attempts if max_attempts > 0 else DEFAULT_MAX_ATTEMPTS
        self._backoff = retry_backoff if retry_backoff > 0 else DEFAULT_RETRY_BACKOFF
        self._deadline = deadline
        self._ssl = ssl_context
        if self._ssl is None and ca_file:
            self._ssl = ssl.create_default_context(cafile=ca_file)
        self._cur = 0
        self._lock = threading.Lock()
        self._local = threading.local()
        self._all_conns: List[http.client.HTTPConnection] = []

    @property
    def nodes(self) -> List[str]:
        return [n.url for n in self._nodes]

    @property
    def timeout(self) -> float:
        return self._timeout

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Closes the kept-alive connections."""
        with self._lock:
            conns, self._all_conns = self._all_conns, []
        for c in conns:
            c.close()

    # ---- transport

    def _conn(self, node: _Node, timeout: float) -> Tuple[http.client.HTTPConnection, bool]:
        pool = getattr(self._local, "conns", None)
        if pool is None:
            pool = self._local.conns = {}
        entry = pool.pop(node.url, None)
        if entry is not None and time.monotonic() - entry[1] < _IDLE_REUSE:
            entry[0].timeout = timeout
            if entry[0].sock is not None:
                entry[0].sock.settimeout(timeout)
            return entry[0], True
        if entry is not None:
            entry[0].close()
        if node.scheme == "https":
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                node.host, node.port, timeout=timeout, context=self._ssl or ssl.create_default_context())
        else:
            conn = http.client.HTTPConnection(node.host, node.port, timeout=timeout)
        with self._lock:
            self._all_conns.append(conn)
        return conn, False

    def _keep(self, node: _Node, conn: http.client.HTTPConnection) -> None:
        self._local.conns[node.url] = (conn, time.monotonic())

    def _drop(self, conn: http.client.HTTPConnection) -> None:
        conn.close()
        with self._lock:
            if conn in self._all_conns:
                self._all_conns.remove(conn)

    def _once(self, node: _Node, method: str, path: str, body: Optional[bytes], headers: Dict[str, str],
              timeout: float) -> Tuple[int, Dict[str, str], bytes]:
        conn, reused = self._conn(node, timeout)
        sent = reused  # a reused connection may fail after the node read the request
        try:
            if conn.sock is None:
                conn.connect()
            sent = True
            conn.request(method, node.prefix + path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException) as e:
            self._drop(conn)
            raise TransportError(str(e) or type(e).__name__, method=method, path=path, node=node.url, sent=sent) from e
        if resp.will_close:
            self._drop(conn)
        else:
            self._keep(node, conn)
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data

    def _do(self, method: str, path: str, *, body: Optional[bytes] = None, headers: Optional[Dict[str, str]] = None,
            policy: str = _SAFE, extra: float = 0.0, deadline: Optional[float] = None) -> Tuple[int, Any]:
        """Sends a request, moving to the next node and retrying as the policy
        allows; returns (status, decoded JSON answer)."""
        hdrs = dict(headers or {})
        if self._token:
            hdrs["Authorization"] = "Bearer " + self._token
        if body is not None and "Content-Type" not in hdrs:
            hdrs["Content-Type"] = "application/json"
        if "timeout_ignores_wait" in _BREAKS:
            extra = 0.0
        deadline = self._deadline if deadline is None else deadline
        end = None if deadline is None else time.monotonic() + deadline
        backoff = self._backoff
        attempt = 0
        while True:
            attempt += 1
            with self._lock:
                idx = self._cur
            node = self._nodes[idx % len(self._nodes)]
            timeout = self._timeout + extra
            if end is not None:
                timeout = max(0.001, min(timeout, end - time.monotonic()))
            try:
                status, rh, data = self._once(node, method, path, body, hdrs, timeout)
                if 200 <= status < 300:
                    return status, (json.loads(data) if data else {})
                err: MqdError = _api_error(method, path, status, rh, data)
            except TransportError as e:
                err = e
            wait = self._retry_wait(err, policy)
            if wait is None or attempt >= self._max_attempts:
                raise err
            if "no_failover" not in _BREAKS:
                with self._lock:
                    if self._cur == idx:  # unless another request moved on already
                        self._cur = (idx + 1) % len(self._nodes)
            if "new_key_on_retry" in _BREAKS and "Idempotency-Key" in hdrs:
                hdrs["Idempotency-Key"] = f"{hdrs['Idempotency-Key']}-retry{attempt}"
            wait = max(wait, backoff)
            backoff = min(2 * backoff, MAX_RETRY_BACKOFF)
            if end is not None and time.monotonic() + wait >= end:
                raise err
            time.sleep(wait)

    @staticmethod
    def _retry_wait(err: MqdError, policy: str) -> Optional[float]:
        """None when err must not be retried under policy, else the broker's
        Retry-After (capped at MAX_RETRY_BACKOFF) or 0."""
        if "no_retry" in _BREAKS:
            return None
        if err.status == 0:
            return 0.0 if policy == _SAFE or not err.sent else None
        if err.status in (429, 503) and policy == _SAFE:
            ra = 0.0 if "ignore_retry_after" in _BREAKS else (err.retry_after or 0.0)
            return min(ra, MAX_RETRY_BACKOFF)
        if "retry_4xx" in _BREAKS and err.status < 500:
            return 0.0
        return None

    def _json(self, method: str, path: str, payload: Any = None, *, policy: str = _SAFE, extra: float = 0.0,
              deadline: Optional[float] = None) -> Tuple[int, Any]:
        body = None if payload is None else json.dumps(payload).encode()
        return self._do(method, path, body=body, policy=policy, extra=extra, deadline=deadline)

    def request(self, method: str, path: str, payload: Any = None, *, deadline: Optional[float] = None) -> Any:
        """Sends any API request (path such as "/v1/cluster") and returns its
        decoded answer. GETs are retried; other methods only when never sent."""
        return self._json(method, path, payload, policy=_SAFE if method == "GET" else _UNSENT, deadline=deadline)[1]

    # ---- publish

    def publish(self, topic: str, value: Union[bytes, str], *, key: Optional[str] = None,
                partition_key: Optional[str] = None, delay_ms: Optional[int] = None,
                max_retry: Optional[int] = None, attrs: Optional[Mapping[str, str]] = None,
                producer_id: Optional[str] = None, producer_seq: Optional[int] = None,
                deadline: Optional[float] = None) -> PublishResult:
        """Stores value in topic. With a key (Idempotency-Key) or a producer
        sequence it is retried after a lost answer or a 503, with the same key;
        without, only when it cannot have reached a node (the error then has
        ``retryable`` set and the caller decides)."""
        h = {"Content-Type": "application/octet-stream"}
        policy = _UNSENT
        if key:
            h["Idempotency-Key"], policy = key, _SAFE
        if producer_id and producer_seq is not None:
            h["Mq-Producer-Id"], h["Mq-Producer-Seq"], policy = producer_id, str(producer_seq), _SAFE
        if policy == _UNSENT and "retry_unkeyed" in _BREAKS:
            policy = _SAFE
        if partition_key:
            h["Mq-Partition-Key"] = partition_key
        if delay_ms:
            h["Mq-Delay-Ms"] = str(int(delay_ms))
        if max_retry is not None and max_retry >= 0:
            h["Mq-Max-Retry"] = str(max_retry)
        for k, v in (attrs or {}).items():
            h["Mq-Attr-" + k] = v
        data = value.encode() if isinstance(value, str) else bytes(value)
        _, r = self._do("POST", f"/v1/topics/{_esc(topic)}/messages", body=data, headers=h, policy=policy,
                        deadline=deadline)
        return PublishResult(r.get("topic", topic), r["partition"], r["offset"], r.get("duplicate", False), r)

    def publish_batch(self, topic: str, messages: Iterable[BatchMessage], *,
                      deadline: Optional[float] = None) -> List[PublishResult]:
        """Stores messages as one all-or-nothing write; retried like publish
        only when every message has a key."""
        items, policy = [], _SAFE
        for m in messages:
            v = m.value.encode() if isinstance(m.value, str) else bytes(m.value)
            it: Dict[str, Any] = {"value_b64": base64.b64encode(v).decode()}
            if m.key:
                it["idempotency_key"] = m.key
            else:
                policy = _UNSENT
            if m.partition_key:
                it["partition_key"] = m.partition_key
            if m.delay_ms:
                it["delay_ms"] = int(m.delay_ms)
            if m.max_retry is not None and m.max_retry >= 0:
                it["max_retry"] = m.max_retry
            if m.attrs:
                it["attrs"] = dict(m.attrs)
            items.append(it)
        _, r = self._json("POST", f"/v1/topics/{_esc(topic)}/messages:batch", {"messages": items}, policy=policy,
                          deadline=deadline)
        return [PublishResult(x.get("topic", topic), x["partition"], x["offset"], x.get("duplicate", False), x)
                for x in r["results"]]

    # ---- topics and groups

    def put_topic(self, name: str, config: Optional[Mapping[str, Any]] = None, *,
                  deadline: Optional[float] = None) -> Tuple[Dict[str, Any], bool]:
        """Creates or updates a topic; returns its stats and whether it was created."""
        status, r = self._json("PUT", f"/v1/topics/{_esc(name)}", dict(config or {}), deadline=deadline)
        return r, status == 201

    def topic(self, name: str, *, deadline: Optional[float] = None) -> Dict[str, Any]:
        return self._json("GET", f"/v1/topics/{_esc(name)}", deadline=deadline)[1]

    def topics(self, *, deadline: Optional[float] = None) -> List[Dict[str, Any]]:
        """Every topic with its stats, following the pages."""
        out: List[Dict[str, Any]] = []
        after = ""
        while True:
            q = "?after=" + urllib.parse.quote(after, safe="") if after else ""
            page = self._json("GET", "/v1/topics" + q, deadline=deadline)[1]
            out.extend(page.get("topics", []))
            after = page.get("next", "")
            if not after or not page.get("topics"):
                return out

    def delete_topic(self, name: str, *, deadline: Optional[float] = None) -> None:
        self._json("DELETE", f"/v1/topics/{_esc(name)}", deadline=deadline)

    def put_group(self, topic: str, group: str, *, deadline: Optional[float] = None) -> None:
        self._json("PUT", _group(topic, group), deadline=deadline)

    def delete_group(self, topic: str, group: str, *, deadline: Optional[float] = None) -> None:
        self._json("DELETE", _group(topic, group), deadline=deadline)

    def cluster(self, *, deadline: Optional[float] = None) -> Dict[str, Any]:
        return self._json("GET", "/v1/cluster", deadline=deadline)[1]

    # ---- consume

    def fetch(self, topic: str, group: str, *, max: int = 10, wait_ms: int = 0, lease_ms: Optional[int] = None,
              deadline: Optional[float] = None) -> List[Message]:
        """Leases up to max messages, waiting up to wait_ms for the first. The
        attempt's HTTP timeout is the client's timeout plus wait_ms. A fetch
        whose answer was lost is retried; what it leased comes back when the
        lease runs out."""
        body: Dict[str, int] = {"max": max}
        if wait_ms:
            body["wait_ms"] = int(wait_ms)
        if lease_ms:
            body["lease_ms"] = int(lease_ms)
        _, r = self._json("POST", _group(topic, group) + "/fetch", body, extra=wait_ms / 1000.0, deadline=deadline)
        return [Message._from(m) for m in r.get("messages", [])]

    def ack(self, topic: str, group: str, *receipts: str, deadline: Optional[float] = None) -> List[ReceiptResult]:
        """Acknowledges receipts. Retried after a lost answer, so a receipt the
        first attempt acked answers ``stale``: nothing to do."""
        return self._receipts(topic, group, "ack", {"receipts": list(receipts)}, deadline)

    def nack(self, topic: str, group: str, *receipts: str, reason: str = "", retryable: bool = True,
             delay_ms: Optional[int] = None, deadline: Optional[float] = None) -> List[ReceiptResult]:
        """Reports receipts as failed; retryable=False dead-letters at once."""
        body: Dict[str, Any] = {"receipts": list(receipts), "retryable": retryable}
        if reason:
            body["reason"] = reason
        if delay_ms is not None:
            body["delay_ms"] = max(0, int(delay_ms))
        return self._receipts(topic, group, "nack", body, deadline)

    def extend(self, topic: str, group: str, lease_ms: int, *receipts: str,
               deadline: Optional[float] = None) -> List[ReceiptResult]:
        """Makes the leases end lease_ms from now."""
        return self._receipts(topic, group, "extend", {"receipts": list(receipts), "lease_ms": max(1, int(lease_ms))},
                              deadline)

    def _receipts(self, topic: str, group: str, op: str, body: Dict[str, Any],
                  deadline: Optional[float]) -> List[ReceiptResult]:
        _, r = self._json("POST", _group(topic, group) + "/" + op, body, deadline=deadline)
        out = [ReceiptResult(x.get("receipt", ""), x.get("status", "")) for x in r.get("results", [])]
        if "hide_stale" in _BREAKS:
            out = [ReceiptResult(x.receipt, "ok" if x.status == "stale" else x.status) for x in out]
        return out

    def process(self, topic: str, group: str, receipts: Sequence[str], outputs: Iterable[Output] = (), *,
                deadline: Optional[float] = None) -> ProcessResult:
        """Acks receipts of topic's group and publishes outputs as one atomic
        step (SPEC section 10): all or nothing. Retried like an ack, with the
        same receipts and outputs: a repeat answers the first call's outcome
        with ``duplicate`` set. A stale or invalid receipt refuses the whole
        call (MqdError 409, code ``stale_receipt``; nothing was published)."""
        pub = []
        for o in outputs:
            v = o.value.encode() if isinstance(o.value, str) else bytes(o.value)
            it: Dict[str, Any] = {"topic": o.topic, "value_b64": base64.b64encode(v).decode()}
            if o.key:
                it["idempotency_key"] = o.key
            if o.partition_key:
                it["partition_key"] = o.partition_key
            if o.delay_ms:
                it["delay_ms"] = int(o.delay_ms)
            if o.max_retry is not None and o.max_retry >= 0:
                it["max_retry"] = o.max_retry
            if o.attrs:
                it["attrs"] = dict(o.attrs)
            pub.append(it)
        _, r = self._json("POST", _group(topic, group) + "/process", {"ack": list(receipts), "publish": pub},
                          deadline=deadline)
        res = [PublishResult(x.get("topic", ""), x["partition"], x["offset"], x.get("duplicate", False), x)
               for x in r.get("results") or []]
        return ProcessResult(r.get("acked", 0), r.get("duplicate", False), res, r)

    def consumer(self, topic: str, group: str, **options: Any) -> "Consumer":
        """A consumer loop for topic and group; see mqd.Consumer."""
        from .consumer import Consumer
        return Consumer(self, topic, group, **options)

    # ---- dead letters

    def dead_letters(self, topic: str, group: str, *, limit: Optional[int] = None, after: Optional[int] = None,
                     key: Optional[str] = None, deadline: Optional[float] = None) -> DLQPage:
        """One page of the group's dead letters, oldest first."""
        q = {k: str(v) for k, v in (("limit", limit), ("after", after), ("idempotency_key", key)) if v}
        path = _group(topic, group) + "/dlq" + ("?" + urllib.parse.urlencode(q) if q else "")
        r = self._json("GET", path, deadline=deadline)[1]
        letters = [DeadLetter(d["id"], d.get("partition", 0), d.get("offset", 0), base64.b64decode(d.get("value_b64", "")),
                              d.get("idempotency_key", ""), d.get("reject_reason", ""), d.get("retry_count", 0),
                              d.get("dead_at", ""), d.get("attrs") or {}, d.get("history") or [], d)
                   for d in r.get("dead_letters", [])]
        return DLQPage(letters, r.get("next_after"))

    def replay(self, topic: str, group: str, ids: Optional[Sequence[int]] = None, *,
               rate_per_sec: Optional[int] = None, deadline: Optional[float] = None) -> ReplayResult:
        """Puts dead letters back into delivery: ids, or all when ids is empty.
        Not retried once sent (a second replay of all could replay more)."""
        body: Dict[str, Any] = {"ids": list(ids)} if ids else {"all": True}
        if rate_per_sec:
            body["rate_per_sec"] = rate_per_sec
        _, r = self._json("POST", _group(topic, group) + "/dlq/replay", body, policy=_UNSENT, deadline=deadline)
        return ReplayResult(r.get("accepted", 0), r.get("rate_per_sec", 0))

    def delete_dead_letter(self, topic: str, group: str, id: int, *, deadline: Optional[float] = None) -> None:
        self._json("DELETE", f"{_group(topic, group)}/dlq/{int(id)}", deadline=deadline)


def _esc(s: str) -> str:
    return urllib.parse.quote(s, safe="")


def _group(topic: str, group: str) -> str:
    return f"/v1/topics/{_esc(topic)}/groups/{_esc(group)}"


def _api_error(method: str, path: str, status: int, headers: Mapping[str, str], data: bytes) -> MqdError:
    code, message = "", ""
    try:
        e = json.loads(data).get("error") or {}
        code, message = e.get("code", ""), e.get("message", "")
    except (ValueError, AttributeError):
        message = data[:2000].decode("utf-8", "replace").strip()
    retry_after = None
    try:
        retry_after = float(int(headers.get("retry-after", "")))
    except ValueError:
        pass
    return MqdError(status, code, message or http.client.responses.get(status, ""), method=method, path=path,
                    retry_after=retry_after)
