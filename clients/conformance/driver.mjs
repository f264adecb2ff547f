// The Node.js client's driver of the conformance suite (clients/conformance):
// reads one case's servers, client options and steps as JSON on stdin, runs
// the steps with clients/node, prints one JSON line per step.
import { Client, MqdError } from '../node/index.js';

async function readStdin() {
  const chunks = [];
  for await (const c of process.stdin) chunks.push(c);
  return JSON.parse(Buffer.concat(chunks).toString('utf8'));
}

async function run(c, st, state) {
  switch (st.op) {
    case 'publish': {
      const r = await c.publish(st.topic, st.value ?? '', {
        key: st.key, partitionKey: st.partition_key, delayMs: st.delay_ms, maxRetry: st.max_retry, attrs: st.attrs,
      });
      return { partition: r.partition, offset: r.offset, duplicate: r.duplicate };
    }
    case 'publish_batch': {
      const rs = await c.publishBatch(st.topic, st.messages.map((m) => ({
        value: m.value ?? '', key: m.key, partitionKey: m.partition_key, attrs: m.attrs,
      })));
      return { duplicates: rs.map((r) => r.duplicate), offsets: rs.map((r) => r.offset) };
    }
    case 'fetch': {
      const msgs = await c.fetch(st.topic, st.group, { max: st.max, waitMs: st.wait_ms, leaseMs: st.lease_ms });
      state.receipts = msgs.map((m) => m.receipt);
      return { keys: msgs.map((m) => m.idempotencyKey), retry_counts: msgs.map((m) => m.retryCount) };
    }
    case 'ack':
    case 'nack':
    case 'extend': {
      const rs = state.receipts || [];
      let res;
      if (st.op === 'ack') res = await c.ack(st.topic, st.group, rs);
      else if (st.op === 'nack') res = await c.nack(st.topic, st.group, rs, { reason: st.message });
      else res = await c.extend(st.topic, st.group, rs, st.lease_ms);
      return { statuses: res.map((r) => r.status) };
    }
    case 'process': {
      const r = await c.process(st.topic, st.group, state.receipts || [],
        (st.outputs || []).map((o) => ({ topic: o.topic, value: o.value ?? '', key: o.key })));
      return { acked: r.acked, duplicate: r.duplicate, duplicates: r.results.map((x) => x.duplicate), offsets: r.results.map((x) => x.offset) };
    }
    case 'sleep':
      await new Promise((r) => setTimeout(r, st.ms));
      return {};
    case 'consume':
    case 'consume_process':
      return consume(c, st);
    case 'dlq_list': {
      const p = await c.deadLetters(st.topic, st.group);
      state.dlq = p.deadLetters.map((d) => d.id);
      return { keys: p.deadLetters.map((d) => d.idempotencyKey), reasons: p.deadLetters.map((d) => d.rejectReason) };
    }
    case 'dlq_replay':
      return { accepted: (await c.replay(st.topic, st.group, state.dlq || [])).accepted };
    default:
      throw new Error(`unknown op ${st.op}`);
  }
}

async function consume(c, st) {
  const handled = [];
  const errors = [];
  const stop = new AbortController();
  const run = st.op === 'consume_process' ? c.consumeProcess.bind(c) : c.consume.bind(c);
  await run(st.topic, st.group, async (m) => {
    try {
      if (st.handler === 'throw') throw new Error(st.message);
      if (st.handler === 'sleep') await new Promise((r) => setTimeout(r, st.sleep_ms));
      if (st.op === 'consume_process') { // one output derived from the message
        return [{ topic: st.output_topic, value: Buffer.concat([Buffer.from('out-'), m.value]), key: `out-${m.idempotencyKey}` }];
      }
      return undefined;
    } finally {
      handled.push(m.idempotencyKey);
      if (handled.length >= (st.count ?? 1)) stop.abort();
    }
  }, { leaseMs: st.lease_ms, waitMs: st.wait_ms, signal: stop.signal, onError: (e) => errors.push(e.message) });
  return { handled, errors };
}

const spec = await readStdin();
const o = spec.client || {};
const c = new Client({
  servers: spec.servers, timeoutMs: o.timeout_ms, maxAttempts: o.max_attempts, deadlineMs: o.deadline_ms,
  token: o.token, caFile: o.ca_file,
});
const state = {};
for (const st of spec.steps) {
  let line;
  try {
    line = { ok: true, value: await run(c, st, state) };
  } catch (e) {
    if (!(e instanceof MqdError)) throw e;
    line = { ok: false, error: { status: e.status, code: e.code, message: e.message } };
  }
  process.stdout.write(`${JSON.stringify(line)}\n`);
}
c.close();
