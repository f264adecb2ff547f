#!/usr/bin/env node
// Publish COUNT messages to TOPIC, each with its own idempotency key.
//
// Usage: node producer.mjs TOPIC COUNT [KEY_PREFIX]
//
// Message i has the key KEY_PREFIX-i and the value "order KEY_PREFIX-i";
// running the producer twice with the same prefix stores nothing new (the
// broker answers duplicate=true). A publish that fails on the way
// (connection error, 503 while a leader is elected, 429) is retried with the
// same key, so a retry can never store the message twice. Node.js 18+,
// built-in fetch, no packages.
//
// Environment: MQD_SERVER (default http://127.0.0.1:7070), MQD_TOKEN.

const SERVER = (process.env.MQD_SERVER || "http://127.0.0.1:7070").replace(/\/$/, "");
const TOKEN = process.env.MQD_TOKEN || "";
const RETRYABLE = new Set([429, 502, 503, 504]);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function publish(topic, key, value, attempts = 8) {
  const headers = { "Idempotency-Key": key, "Content-Type": "application/octet-stream" };
  if (TOKEN) headers.Authorization = `Bearer ${TOKEN}`;
  for (let attempt = 0; ; attempt++) {
    let failure;
    try {
      const resp = await fetch(`${SERVER}/v1/topics/${encodeURIComponent(topic)}/messages`, {
        method: "POST", headers, body: value, signal: AbortSignal.timeout(15000),
      });
      const body = await resp.text();
      if (resp.ok) return JSON.parse(body);
      failure = `${resp.status} ${body}`;
      if (!RETRYABLE.has(resp.status)) throw new Error(`publish ${key}: ${failure}`);
    } catch (e) {
      if (e.message.startsWith("publish ")) throw e;
      failure = e.message; // connection refused, reset, timeout
    }
    if (attempt === attempts - 1) throw new Error(`publish ${key}: ${failure}`);
    await sleep(Math.min(100 * 2 ** attempt, 2000)); // same key on every try
  }
}

const [topic, count, prefix = "node"] = process.argv.slice(2);
if (!topic || !count) {
  console.error("usage: node producer.mjs TOPIC COUNT [KEY_PREFIX]");
  process.exit(2);
}
for (let i = 0; i < Number(count); i++) {
  const key = `${prefix}-${i}`;
  const r = await publish(topic, key, `order ${key}`);
  console.log(`published ${key} partition=${r.partition} offset=${r.offset} duplicate=${r.duplicate}`);
}
