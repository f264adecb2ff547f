#!/usr/bin/env node
// Consume TOPIC as consumer group GROUP with the mqd client's async iterator.
//
// Usage: node consumer.mjs TOPIC GROUP [IDLE_SECONDS]
//
// Each message yielded by client.messages() has its lease extended until it
// is acked or nacked; handle() succeeding acks it, throwing nacks it with the
// error's message as the reason (redelivered after the topic's backoff). The
// client moves to another node when one dies. Prints "ok GROUP KEY VALUE" or
// "nack GROUP KEY REASON". Stops after IDLE_SECONDS without a message, or on
// Ctrl-C / SIGTERM. (raw/consumer.mjs does the same with fetch alone.)
//
// Environment: MQD_SERVERS (comma-separated) or MQD_SERVER, MQD_TOKEN, MQD_CA_FILE.
import { Client } from '../../clients/node/index.js';

function handle(m) { // the application's work: throw to have the message redelivered
  if (m.value.toString().includes('flaky') && m.retryCount === 0) throw new Error('simulated failure on first delivery');
}

const [topic, group, idleArg] = process.argv.slice(2);
if (!topic || !group) {
  console.error('usage: node consumer.mjs TOPIC GROUP [IDLE_SECONDS]');
  process.exit(2);
}
const c = new Client({
  servers: process.env.MQD_SERVERS || process.env.MQD_SERVER || 'http://127.0.0.1:7070',
  token: process.env.MQD_TOKEN, caFile: process.env.MQD_CA_FILE,
});
const stop = new AbortController();
process.once('SIGINT', () => stop.abort());
process.once('SIGTERM', () => stop.abort());
let last = Date.now();
const idle = idleArg ? setInterval(() => { if (Date.now() - last > Number(idleArg) * 1000) stop.abort(); }, 200) : null;

for await (const m of c.messages(topic, group, {
  waitMs: 1000, leaseMs: 10000, signal: stop.signal, onError: (e) => console.error(`consumer: ${e.message}`),
})) {
  const key = m.idempotencyKey || `${m.partition}:${m.offset}`;
  try {
    handle(m);
    console.log(`ok ${group} ${key} ${m.value.toString()}`);
    await m.ack();
  } catch (e) {
    console.log(`nack ${group} ${key} ${e.message}`);
    await m.nack(e);
  }
  last = Date.now();
}
if (idle) clearInterval(idle);
c.close();
