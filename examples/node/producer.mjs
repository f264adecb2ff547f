#!/usr/bin/env node
// Publish COUNT messages to TOPIC with the mqd client, each with its own key.
//
// Usage: node producer.mjs TOPIC COUNT [KEY_PREFIX]
//
// Message i has the idempotency key KEY_PREFIX-i and the value "order
// KEY_PREFIX-i"; running it twice with the same prefix stores nothing new
// (duplicate=true). The client moves to another node when one does not
// answer and retries a lost answer, a 503 or a 429 with the same key.
// (raw/producer.mjs does the same with fetch alone.)
//
// Environment: MQD_SERVERS (comma-separated) or MQD_SERVER, MQD_TOKEN, MQD_CA_FILE.
import { Client } from '../../clients/node/index.js';

const [topic, count, prefix = 'node'] = process.argv.slice(2);
if (!topic || !count) {
  console.error('usage: node producer.mjs TOPIC COUNT [KEY_PREFIX]');
  process.exit(2);
}
const c = new Client({
  servers: process.env.MQD_SERVERS || process.env.MQD_SERVER || 'http://127.0.0.1:7070',
  token: process.env.MQD_TOKEN, caFile: process.env.MQD_CA_FILE, deadlineMs: 60000,
});
for (let i = 0; i < Number(count); i++) {
  const key = `${prefix}-${i}`;
  const r = await c.publish(topic, `order ${key}`, { key });
  console.log(`published ${key} partition=${r.partition} offset=${r.offset} duplicate=${r.duplicate}`);
}
c.close();
