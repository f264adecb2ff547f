// The Node.js client of mqd: a list of servers with failover and the retry
// rules of docs/clients.md, publish, topics, fetch/ack/nack/extend, dead
// letters, and a consumer loop (consume, or the async iterator messages()).
// Built-in modules only (node:http, node:https: unlike fetch they take a CA).

import http from 'node:http';
import https from 'node:https';
import { readFileSync } from 'node:fs';

export const DEFAULT_SERVER = 'http://127.0.0.1:7070';
export const DEFAULT_TIMEOUT_MS = 15000; // above the broker's 10 s commit deadline
export const DEFAULT_MAX_ATTEMPTS = 10;
export const DEFAULT_RETRY_BACKOFF_MS = 100; // doubled after each failed attempt up to 2 s
const MAX_RETRY_BACKOFF_MS = 2000;

// For the conformance suite's self-test only (see client/selftest.go): rules switched off.
const BREAKS = new Set((process.env.MQD_CLIENT_BREAK || '').split(',').map((s) => s.trim()).filter(Boolean));

const SAFE = 'safe'; // retry any failure: reads, acks, keyed publishes
const UNSENT = 'unsent'; // retry only a request that never reached a node

/** The one error type: status 0 means no answer (refused, reset, timed out). */
export class MqdError extends Error {
  constructor(status, code, message, { method = '', path = '', retryAfterMs = null, sent = true, node = '' } = {}) {
    super(message);
    this.name = 'MqdError';
    this.status = status;
    this.code = code;
    this.method = method;
    this.path = path;
    this.retryAfterMs = retryAfterMs;
    this.sent = sent;
    this.node = node;
  }

  /** Whether the same request may succeed later: no answer, 503 or 429. */
  get retryable() {
    return this.status === 0 || this.status === 429 || this.status === 503;
  }
}

/** Thrown by a handler: nack the message as not retryable (dead-lettered at once). */
export class Reject extends Error {
  constructor(message) {
    super(message);
    this.name = 'Reject';
  }
}

const esc = encodeURIComponent;
const groupPath = (topic, group) => `/v1/topics/${esc(topic)}/groups/${esc(group)}`;
const sleep = (ms, signal) =>
  new Promise((resolve) => {
    if (signal?.aborted) return resolve(false);
    const t = setTimeout(() => { signal?.removeEventListener('abort', onAbort); resolve(true); }, ms);
    const onAbort = () => { clearTimeout(t); resolve(false); };
    signal?.addEventListener('abort', onAbort, { once: true });
  });

function parseNode(s) {
  const u = new URL(s.includes('://') ? s : `http://${s}`);
  if ((u.protocol !== 'http:' && u.protocol !== 'https:') || !u.host) {
    throw new Error(`mqd: server ${s}: want http://host:port or https://host:port`);
  }
  return { url: `${u.protocol}//${u.host}${u.pathname.replace(/\/+$/, '')}`, u };
}

function toMessage(d) {
  return {
    topic: d.topic, partition: d.partition, offset: d.offset, receipt: d.receipt,
    value: Buffer.from(d.value_b64 || '', 'base64'), idempotencyKey: d.idempotency_key || '',
    retryCount: d.retry_count || 0, maxRetry: d.max_retry, rejectReason: d.reject_reason || '',
    publishedAt: d.published_at || '', attrs: d.attrs || {}, raw: d, leaseLost: false,
  };
}

/** A client of one mqd cluster; safe to share. */
export class Client {
  constructor(opts = {}) {
    let servers = opts.servers ?? [DEFAULT_SERVER];
    if (typeof servers === 'string') servers = servers.split(',').filter((s) => s.trim());
    if (servers.length === 0) throw new Error('mqd: no server given');
    this.nodes = servers.map((s) => parseNode(s.trim()));
    this.token = opts.token || '';
    this.timeoutMs = opts.timeoutMs > 0 ? opts.timeoutMs : DEFAULT_TIMEOUT_MS;
    this.maxAttempts = opts.maxAttempts > 0 ? opts.maxAttempts : DEFAULT_MAX_ATTEMPTS;
    this.retryBackoffMs = opts.retryBackoffMs > 0 ? opts.retryBackoffMs : DEFAULT_RETRY_BACKOFF_MS;
    this.deadlineMs = opts.deadlineMs ?? null;
    const ca = opts.ca ?? (opts.caFile ? readFileSync(opts.caFile) : undefined);
    this.agents = {
      'http:': new http.Agent({ keepAlive: true, keepAliveMsecs: 10000 }),
      'https:': new https.Agent({ keepAlive: true, ca }),
    };
    this.cur = 0;
  }

  /** Closes the kept-alive connections. */
  close() {
    for (const a of Object.values(this.agents)) a.destroy();
  }

  // ---- transport

  once(node, method, path, body, headers, timeoutMs, signal) {
    const mod = node.u.protocol === 'https:' ? https : http;
    return new Promise((resolve, reject) => {
      let sent = false;
      const fail = (e) => reject(new MqdError(0, '', e.message || String(e), { method, path, sent, node: node.url }));
      const req = mod.request({
        protocol: node.u.protocol, hostname: node.u.hostname, port: node.u.port || undefined,
        path: node.u.pathname.replace(/\/+$/, '') + path, method, headers, agent: this.agents[node.u.protocol],
        signal,
      }, (res) => {
        const chunks = [];
        res.on('data', (c) => chunks.push(c));
        res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(chunks) }));
        res.on('error', fail);
      });
      req.setTimeout(timeoutMs, () => req.destroy(new Error(`no answer within ${timeoutMs} ms`)));
      req.on('socket', (sock) => {
        if (!sock.connecting) { sent = true; return; } // a reused connection: the node may read the request
        // Listeners only on a new socket: a kept-alive one would gather one per request.
        sock.once('connect', () => { sent = true; });
        sock.once('secureConnect', () => { sent = true; });
      });
      req.on('error', fail);
      req.end(body);
    });
  }

  /** Sends a request with failover and the retry rules; returns {status, data}. */
  async do(method, path, { body = null, headers = {}, policy = SAFE, extraMs = 0, signal, deadlineMs } = {}) {
    const hdrs = { ...headers };
    if (this.token) hdrs.Authorization = `Bearer ${this.token}`;
    if (body !== null && !hdrs['Content-Type']) hdrs['Content-Type'] = 'application/json';
    if (BREAKS.has('timeout_ignores_wait')) extraMs = 0;
    const dl = deadlineMs ?? this.deadlineMs;
    const end = dl == null ? null : Date.now() + dl;
    let backoff = this.retryBackoffMs;
    for (let attempt = 1; ; attempt++) {
      const idx = this.cur;
      const node = this.nodes[idx % this.nodes.length];
      let timeout = this.timeoutMs + extraMs;
      if (end !== null) timeout = Math.max(1, Math.min(timeout, end - Date.now()));
      let err;
      try {
        const r = await this.once(node, method, path, body, hdrs, timeout, signal);
        if (r.status >= 200 && r.status < 300) {
          return { status: r.status, data: r.body.length ? JSON.parse(r.body.toString('utf8')) : {} };
        }
        err = apiError(method, path, r);
      } catch (e) {
        if (signal?.aborted) throw e;
        err = e instanceof MqdError ? e : new MqdError(0, '', String(e), { method, path, node: node.url });
      }
      let wait = retryWait(err, policy);
      if (wait === null || attempt >= this.maxAttempts) throw err;
      if (!BREAKS.has('no_failover') && this.cur === idx) this.cur = (idx + 1) % this.nodes.length;
      if (BREAKS.has('new_key_on_retry') && hdrs['Idempotency-Key']) {
        hdrs['Idempotency-Key'] = `${hdrs['Idempotency-Key']}-retry${attempt}`;
      }
      wait = Math.max(wait, backoff);
      backoff = Math.min(2 * backoff, MAX_RETRY_BACKOFF_MS);
      if (end !== null && Date.now() + wait >= end) throw err;
      if (!(await sleep(wait, signal))) throw err;
    }
  }

  async json(method, path, payload, opts = {}) {
    const body = payload === undefined ? null : Buffer.from(JSON.stringify(payload));
    return this.do(method, path, { ...opts, body });
  }

  /** Any API request; GETs are retried, other methods only when never sent. */
  async request(method, path, payload, { signal, deadlineMs } = {}) {
    return (await this.json(method, path, payload, { policy: method === 'GET' ? SAFE : UNSENT, signal, deadlineMs })).data;
  }

  // ---- publish

  /**
   * Stores value in topic. With a key (or producer sequence) it is retried
   * after a lost answer or a 503 with the same key; without, only when it
   * cannot have reached a node (the error is then retryable: the caller decides).
   */
  async publish(topic, value, o = {}) {
    const h = { 'Content-Type': 'application/octet-stream' };
    let policy = UNSENT;
    if (o.key) { h['Idempotency-Key'] = o.key; policy = SAFE; }
    if (o.producerId && o.producerSeq != null) {
      h['Mq-Producer-Id'] = o.producerId; h['Mq-Producer-Seq'] = String(o.producerSeq); policy = SAFE;
    }
    if (policy === UNSENT && BREAKS.has('retry_unkeyed')) policy = SAFE;
    if (o.partitionKey) h['Mq-Partition-Key'] = o.partitionKey;
    if (o.delayMs > 0) h['Mq-Delay-Ms'] = String(Math.trunc(o.delayMs));
    if (o.maxRetry != null && o.maxRetry >= 0) h['Mq-Max-Retry'] = String(o.maxRetry);
    for (const [k, v] of Object.entries(o.attrs || {})) h[`Mq-Attr-${k}`] = v;
    const body = typeof value === 'string' ? Buffer.from(value) : Buffer.from(value ?? []);
    const { data } = await this.do('POST', `/v1/topics/${esc(topic)}/messages`,
      { body, headers: h, policy, signal: o.signal, deadlineMs: o.deadlineMs });
    return { topic: data.topic ?? topic, partition: data.partition, offset: data.offset, duplicate: !!data.duplicate, raw: data };
  }

  /** Stores messages as one all-or-nothing write; retried only when every message has a key. */
  async publishBatch(topic, messages, o = {}) {
    let policy = SAFE;
    const items = messages.map((m) => {
      const v = typeof m.value === 'string' ? Buffer.from(m.value) : Buffer.from(m.value ?? []);
      const it = { value_b64: v.toString('base64') };
      if (m.key) it.idempotency_key = m.key; else policy = UNSENT;
      if (m.partitionKey) it.partition_key = m.partitionKey;
      if (m.delayMs > 0) it.delay_ms = Math.trunc(m.delayMs);
      if (m.maxRetry != null && m.maxRetry >= 0) it.max_retry = m.maxRetry;
      if (m.attrs && Object.keys(m.attrs).length) it.attrs = m.attrs;
      return it;
    });
    const { data } = await this.json('POST', `/v1/topics/${esc(topic)}/messages:batch`, { messages: items },
      { policy, signal: o.signal, deadlineMs: o.deadlineMs });
    return data.results.map((r) => ({ topic: r.topic ?? topic, partition: r.partition, offset: r.offset, duplicate: !!r.duplicate, raw: r }));
  }

  // ---- topics and groups

  /** Creates or updates a topic: {topic: stats, created}. */
  async putTopic(name, config = {}, o = {}) {
    const { status, data } = await this.json('PUT', `/v1/topics/${esc(name)}`, config, o);
    return { topic: data, created: status === 201 };
  }

  async topic(name, o = {}) { return (await this.json('GET', `/v1/topics/${esc(name)}`, undefined, o)).data; }

  /** Every topic with its stats, following the pages. */
  async topics(o = {}) {
    const out = [];
    for (let after = ''; ;) {
      const { data } = await this.json('GET', `/v1/topics${after ? `?after=${esc(after)}` : ''}`, undefined, o);
      out.push(...(data.topics || []));
      if (!data.next || !(data.topics || []).length) return out;
      after = data.next;
    }
  }

  async deleteTopic(name, o = {}) { await this.json('DELETE', `/v1/topics/${esc(name)}`, undefined, o); }
  async putGroup(topic, group, o = {}) { await this.json('PUT', groupPath(topic, group), undefined, o); }
  async deleteGroup(topic, group, o = {}) { await this.json('DELETE', groupPath(topic, group), undefined, o); }
  async cluster(o = {}) { return (await this.json('GET', '/v1/cluster', undefined, o)).data; }

  // ---- consume

  /**
   * Leases up to max messages, waiting up to waitMs for the first. The HTTP
   * timeout of the attempt is timeoutMs + waitMs. A fetch whose answer was
   * lost is retried; what it leased comes back when the lease runs out.
   */
  async fetch(topic, group, o = {}) {
    const body = { max: o.max ?? 10 };
    if (o.waitMs) body.wait_ms = Math.trunc(o.waitMs);
    if (o.leaseMs) body.lease_ms = Math.max(1, Math.trunc(o.leaseMs));
    const { data } = await this.json('POST', `${groupPath(topic, group)}/fetch`, body,
      { extraMs: o.waitMs || 0, signal: o.signal, deadlineMs: o.deadlineMs });
    return (data.messages || []).map(toMessage);
  }

  /** Acknowledges receipts; a retried ack whose first attempt committed answers stale. */
  ack(topic, group, receipts, o = {}) { return this.receipts(topic, group, 'ack', { receipts }, o); }

  /** Reports receipts as failed; retryable false dead-letters at once. */
  nack(topic, group, receipts, o = {}) {
    const body = { receipts, retryable: o.retryable ?? true };
    if (o.reason) body.reason = o.reason;
    if (o.delayMs != null) body.delay_ms = Math.max(0, Math.trunc(o.delayMs));
    return this.receipts(topic, group, 'nack', body, o);
  }

  /** Makes the leases end leaseMs from now. */
  extend(topic, group, receipts, leaseMs, o = {}) {
    return this.receipts(topic, group, 'extend', { receipts, lease_ms: Math.max(1, Math.trunc(leaseMs)) }, o);
  }

  async receipts(topic, group, op, body, o) {
    const { data } = await this.json('POST', `${groupPath(topic, group)}/${op}`, body, { signal: o.signal, deadlineMs: o.deadlineMs });
    let out = (data.results || []).map((r) => ({ receipt: r.receipt, status: r.status }));
    if (BREAKS.has('hide_stale')) out = out.map((r) => ({ ...r, status: r.status === 'stale' ? 'ok' : r.status }));
    return out;
  }

  /**
   * Acks receipts of topic's group and publishes outputs ([{topic, value,
   * key, partitionKey, delayMs, maxRetry, attrs}]) as one atomic step (SPEC
   * section 10): all or nothing. Retried like an ack, with the same receipts
   * and outputs: a repeat answers the first call's outcome with duplicate
   * true. A stale or invalid receipt refuses the whole call (MqdError 409,
   * code stale_receipt; nothing was published).
   */
  async process(topic, group, receipts, outputs = [], o = {}) {
    const publish = outputs.map((m) => {
      const v = typeof m.value === 'string' ? Buffer.from(m.value) : Buffer.from(m.value ?? []);
      const it = { topic: m.topic, value_b64: v.toString('base64') };
      if (m.key) it.idempotency_key = m.key;
      if (m.partitionKey) it.partition_key = m.partitionKey;
      if (m.delayMs > 0) it.delay_ms = Math.trunc(m.delayMs);
      if (m.maxRetry != null && m.maxRetry >= 0) it.max_retry = m.maxRetry;
      if (m.attrs && Object.keys(m.attrs).length) it.attrs = m.attrs;
      return it;
    });
    const { data } = await this.json('POST', `${groupPath(topic, group)}/process`, { ack: receipts, publish },
      { signal: o.signal, deadlineMs: o.deadlineMs });
    const results = (data.results || []).map((r) => ({ topic: r.topic, partition: r.partition, offset: r.offset, duplicate: !!r.duplicate, raw: r }));
    return { acked: data.acked || 0, duplicate: !!data.duplicate, results, raw: data };
  }

  /**
   * Runs handler on every message until opts.signal aborts (or SIGINT/SIGTERM
   * with stopOnSignals), then resolves once running handlers are settled.
   * Fetches only as many as there are free handlers (concurrency), extends
   * each lease every third of leaseMs while its handler runs, acks when the
   * handler resolves, nacks with the error's message when it throws (Reject:
   * not retryable). Rejects with the MqdError of a fetch retrying cannot fix.
   */
  async consume(topic, group, handler, opts = {}) {
    const c = new Consumer(this, topic, group, opts);
    return c.run(handler);
  }

  /**
   * consume() with a handler that resolves to the messages derived from its
   * message (outputs as for process(), or nothing): they are published with
   * the message's ack in one process call, so each message yields its
   * outputs exactly once whatever crashes or retries happen. A call refused
   * as stale (the lease was lost; the next delivery decides) or still
   * failing after its retries publishes nothing and is reported to onError;
   * one refused otherwise (unknown output topic, too large...) nacks the
   * message with the error's message. A handler that throws is nacked.
   */
  async consumeProcess(topic, group, handler, opts = {}) {
    const c = new Consumer(this, topic, group, opts);
    c.process = true;
    return c.run(handler);
  }

  /**
   * An async iterator of deliveries: each yielded message has its lease
   * extended until you call its ack() or nack(err); the next one is fetched
   * when you ask for it. Breaking out of the loop or aborting opts.signal
   * stops it; a message left unsettled comes back after its lease.
   */
  async *messages(topic, group, opts = {}) {
    const c = new Consumer(this, topic, group, { ...opts, concurrency: 1 });
    try {
      for (;;) {
        const msgs = await c.fetchSome(1);
        if (msgs === null) return;
        for (const m of msgs) {
          const stop = c.keepLease(m);
          let settled = false;
          m.ack = async () => { settled = true; stop(); return c.settle(m, null); };
          m.nack = async (err) => { settled = true; stop(); return c.settle(m, err ?? new Error('nacked')); };
          try {
            yield m;
          } finally {
            if (!settled) stop();
          }
        }
      }
    } finally {
      c.stop();
    }
  }

  // ---- dead letters

  /** One page of the group's dead letters, oldest first: {deadLetters, nextAfter}. */
  async deadLetters(topic, group, o = {}) {
    const q = new URLSearchParams();
    if (o.limit) q.set('limit', String(o.limit));
    if (o.after) q.set('after', String(o.after));
    if (o.key) q.set('idempotency_key', o.key);
    const qs = q.toString();
    const { data } = await this.json('GET', `${groupPath(topic, group)}/dlq${qs ? `?${qs}` : ''}`, undefined, o);
    const deadLetters = (data.dead_letters || []).map((d) => ({
      id: d.id, partition: d.partition, offset: d.offset, value: Buffer.from(d.value_b64 || '', 'base64'),
      idempotencyKey: d.idempotency_key || '', rejectReason: d.reject_reason || '', retryCount: d.retry_count || 0,
      deadAt: d.dead_at || '', attrs: d.attrs || {}, history: d.history || [], raw: d,
    }));
    return { deadLetters, nextAfter: data.next_after ?? null };
  }

  /** Puts dead letters back (ids, or all when empty); not retried once sent. */
  async replay(topic, group, ids = [], o = {}) {
    const body = ids.length ? { ids } : { all: true };
    if (o.ratePerSec) body.rate_per_sec = o.ratePerSec;
    const { data } = await this.json('POST', `${groupPath(topic, group)}/dlq/replay`, body,
      { policy: UNSENT, signal: o.signal, deadlineMs: o.deadlineMs });
    return { accepted: data.accepted || 0, ratePerSec: data.rate_per_sec || 0 };
  }

  async deleteDeadLetter(topic, group, id, o = {}) {
    await this.json('DELETE', `${groupPath(topic, group)}/dlq/${Number(id)}`, undefined, o);
  }
}

function retryWait(err, policy) {
  if (BREAKS.has('no_retry')) return null;
  if (err.status === 0) return policy === SAFE || !err.sent ? 0 : null;
  if ((err.status === 429 || err.status === 503) && policy === SAFE) {
    const ra = BREAKS.has('ignore_retry_after') ? 0 : err.retryAfterMs || 0;
    return Math.min(ra, MAX_RETRY_BACKOFF_MS);
  }
  if (BREAKS.has('retry_4xx') && err.status < 500) return 0;
  return null;
}

function apiError(method, path, r) {
  let code = '';
  let message = '';
  try {
    const e = JSON.parse(r.body.toString('utf8')).error || {};
    code = e.code || '';
    message = e.message || '';
  } catch {
    message = r.body.toString('utf8', 0, 2000).trim();
  }
  const ra = /^\d+$/.test(r.headers['retry-after'] || '') ? Number(r.headers['retry-after']) * 1000 : null;
  const text = code ? `${message} (${code}, HTTP ${r.status})` : `${method} ${path}: HTTP ${r.status}: ${message || http.STATUS_CODES[r.status]}`;
  return new MqdError(r.status, code, text, { method, path, retryAfterMs: ra });
}

/** The consumer loop behind consume() and messages(). */
class Consumer {
  constructor(client, topic, group, o) {
    this.c = client;
    this.topic = topic;
    this.group = group;
    this.leaseMs = o.leaseMs > 0 ? o.leaseMs : 30000;
    this.waitMs = o.waitMs > 0 ? o.waitMs : 10000;
    this.concurrency = o.concurrency > 0 ? o.concurrency : 1;
    this.max = o.max > 0 ? o.max : this.concurrency;
    this.onError = o.onError || (() => {});
    this.abort = new AbortController();
    this.stopOnSignals = o.stopOnSignals ?? false;
    if (o.signal) {
      if (o.signal.aborted) this.abort.abort();
      else o.signal.addEventListener('abort', () => this.abort.abort(), { once: true });
    }
    this.backoff = client.retryBackoffMs;
    this.process = false; // consumeProcess: settle with a process call
  }

  stop() { this.abort.abort(); }

  report(msg, cause) {
    const e = new MqdError(cause?.status ?? 0, cause?.code ?? '', cause ? `${msg}: ${cause.message}` : msg);
    try { this.onError(e); } catch { /* a reporter must not stop the loop */ }
  }

  /** Fetches up to n messages; null once stopped. Retries what is retryable. */
  async fetchSome(n) {
    const signal = this.abort.signal;
    while (!signal.aborted) {
      try {
        const msgs = await this.c.fetch(this.topic, this.group, { max: n, waitMs: this.waitMs, leaseMs: this.leaseMs, signal });
        this.backoff = this.c.retryBackoffMs;
        return msgs;
      } catch (e) {
        if (signal.aborted) return null;
        if (!(e instanceof MqdError) || !e.retryable) throw e;
        this.report('fetch (retrying)', e);
        await sleep(this.backoff, signal);
        this.backoff = Math.min(2 * this.backoff, MAX_RETRY_BACKOFF_MS);
      }
    }
    return null;
  }

  /** Extends m's lease every third of it until the returned function is called. */
  keepLease(m) {
    if (BREAKS.has('no_extend')) return () => {};
    let done = false;
    const t = setInterval(async () => {
      try {
        const [r] = await this.c.extend(this.topic, this.group, [m.receipt], this.leaseMs);
        if (!done && r && r.status !== 'ok') {
          m.leaseLost = true;
          done = true;
          clearInterval(t);
          this.report(`extending lease: receipt ${r.status}: lease lost`);
        }
      } catch (e) {
        if (!done) this.report('extending lease', e);
      }
    }, Math.max(1, Math.floor(this.leaseMs / 3)));
    return () => { done = true; clearInterval(t); };
  }

  /** Acks m (err null) or nacks it with err's message; reports what went wrong. */
  async settle(m, err) {
    if (m.leaseLost) return null;
    const where = `settling ${m.topic}/${m.partition}@${m.offset}`;
    try {
      let res;
      if (err == null) {
        res = await this.c.ack(this.topic, this.group, [m.receipt]);
      } else {
        const reason = BREAKS.has('nack_no_reason') ? '' : (err?.message || String(err) || 'error');
        res = await this.c.nack(this.topic, this.group, [m.receipt], { reason, retryable: !(err instanceof Reject) });
      }
      if (res.length === 1 && res[0].status !== 'ok') this.report(`${where}: receipt ${res[0].status}`);
      return res[0] ?? null;
    } catch (e) {
      this.report(where, e);
      return null;
    }
  }

  async handle(m, handler) {
    const stop = this.keepLease(m);
    let err = null;
    let outs;
    try {
      outs = await handler(m);
    } catch (e) {
      err = e ?? new Error('handler failed');
    } finally {
      stop();
    }
    if (this.process && err === null) await this.settleProcess(m, outs || []);
    else await this.settle(m, err);
  }

  /** Publishes outs and acks m in one process call; nacks m when the call is refused as a whole. */
  async settleProcess(m, outs) {
    if (m.leaseLost) return; // already reported; the next delivery decides
    if (BREAKS.has('publish_then_ack')) { // the gap process closes: two calls
      try {
        for (const o of outs) await this.c.publish(o.topic, o.value, o);
      } catch (e) {
        await this.settle(m, e);
        return;
      }
      await this.settle(m, null);
      return;
    }
    try {
      await this.c.process(this.topic, this.group, [m.receipt], outs);
    } catch (e) {
      if (e instanceof MqdError && (e.code === 'stale_receipt' || e.retryable)) {
        this.report(`process ${m.topic}/${m.partition}@${m.offset}`, e); // the lease ends by itself
        return;
      }
      await this.settle(m, e); // refused as a whole (unknown output topic, too large...): nack
    }
  }

  async run(handler) {
    const onSig = () => this.stop();
    if (this.stopOnSignals) { process.once('SIGINT', onSig); process.once('SIGTERM', onSig); }
    const running = new Set();
    let wake = null;
    try {
      while (!this.abort.signal.aborted) {
        const free = Math.min(this.max, this.concurrency - running.size);
        if (free <= 0) {
          await new Promise((r) => { wake = r; });
          continue;
        }
        const msgs = await this.fetchSome(free);
        if (msgs === null) break;
        for (const m of msgs) { // leased to us: handled even when a stop came meanwhile
          const p = this.handle(m, handler).finally(() => { running.delete(p); if (wake) { const w = wake; wake = null; w(); } });
          running.add(p);
        }
      }
    } finally {
      await Promise.all([...running]);
      if (this.stopOnSignals) { process.off('SIGINT', onSig); process.off('SIGTERM', onSig); }
    }
  }
}
