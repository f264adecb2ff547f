#!/usr/bin/env node
// Consume TOPIC as consumer group GROUP: ack on success, nack on failure.
//
// Usage: node consumer.mjs TOPIC GROUP [IDLE_SECONDS]
//
// Long-polls for messages, hands each to handle(), acks it when handle()
// resolves, nacks it (retryable, with the error as the reason) when it
// throws: the broker redelivers it after the topic's backoff, or moves it to
// the group's dead-letter queue after max_retry failures. Prints one line
// per outcome: "ok GROUP KEY VALUE" or "nack GROUP KEY REASON". Stops after
// IDLE_SECONDS without a message (default: runs until interrupted).
//
// The example handler fails the first delivery of every message whose value
// contains "flaky", to show a nack and its redelivery.
//
// Environment: MQD_SERVER (default http://127.0.0.1:7070), MQD_TOKEN.

const SERVER = (process.env.MQD_SERVER || "http://127.0.0.1:7070").replace(/\/$/, "");
const TOKEN = process.env.MQD_TOKEN || "";
const WAIT_MS = 1000; // long-poll; the HTTP timeout must be longer
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function call(path, body) {
  const headers = { "Content-Type": "application/json" };
  if (TOKEN) headers.Authorization = `Bearer ${TOKEN}`;
  const resp = await fetch(SERVER + path, {
    method: "POST", headers, body: JSON.stringify(body), signal: AbortSignal.timeout(WAIT_MS + 15000),
  });
  const text = await resp.text();
  if (!resp.ok) throw new Error(`${path}: ${resp.status} ${text}`);
  return JSON.parse(text);
}

// The application's work. Throw to have the message redelivered.
async function handle(msg, value) {
  if (value.includes("flaky") && msg.retry_count === 0) {
    throw new Error("simulated failure on first delivery");
  }
}

const [topic, group, idleArg] = process.argv.slice(2);
if (!topic || !group) {
  console.error("usage: node consumer.mjs TOPIC GROUP [IDLE_SECONDS]");
  process.exit(2);
}
const idleMs = idleArg === undefined ? Infinity : Number(idleArg) * 1000;
const base = `/v1/topics/${encodeURIComponent(topic)}/groups/${encodeURIComponent(group)}`;
let last = Date.now();
while (Date.now() - last < idleMs) {
  let msgs;
  try {
    ({ messages: msgs } = await call(`${base}/fetch`, { max: 10, wait_ms: WAIT_MS }));
  } catch (e) { // connection trouble, 503 during an election
    console.error(`fetch failed, retrying: ${e.message}`);
    await sleep(500);
    continue;
  }
  for (const m of msgs) {
    const value = Buffer.from(m.value_b64, "base64").toString("utf8");
    const key = m.idempotency_key || `${m.partition}:${m.offset}`;
    try {
      await handle(m, value);
    } catch (e) {
      await call(`${base}/nack`, { receipts: [m.receipt], reason: e.message, retryable: true });
      console.log(`nack ${group} ${key} ${e.message}`);
      continue;
    }
    const { results: [{ status }] } = await call(`${base}/ack`, { receipts: [m.receipt] });
    if (status === "ok") console.log(`ok ${group} ${key} ${value}`);
    else console.error(`ack ${status} ${group} ${key}`); // stale: it will come again
  }
  if (msgs.length > 0) last = Date.now(); // idle counts from the end of the last work
}
