// Stage 2 of the pipeline: consume PAYMENTS as group "notifications" and,
// for each payment, publish one notification into NOTIFICATIONS, exactly once.
//
//   node pipeline/notifications.mjs [PAYMENTS [NOTIFICATIONS]]   (default: payments notifications)
//
// The handler returns the notification (keyed "note-" + the order's key, from
// the payment's key "pay-ORDER") and the client's consumer loop publishes it
// and acks the payment in one process call (SPEC section 10). Prints
// "notified KEY NOTIFICATION" per payment handled. Stops on SIGINT or SIGTERM.
// Environment: MQD_SERVERS (comma-separated) or MQD_SERVER, MQD_TOKEN, MQD_CA_FILE.
import { Client } from '../../clients/node/index.js'; // or 'mqd-client'

const [payments = 'payments', notifications = 'notifications'] = process.argv.slice(2);
const servers = process.env.MQD_SERVERS || process.env.MQD_SERVER || 'http://127.0.0.1:7070';
const c = new Client({ servers, token: process.env.MQD_TOKEN, caFile: process.env.MQD_CA_FILE });

await c.consumeProcess(payments, 'notifications', async (m) => {
  const p = JSON.parse(m.value.toString('utf8'));
  const key = m.idempotencyKey.replace(/^pay-/, 'note-');
  const note = { notification: key, order: p.order, text: `order ${p.order} paid: ${p.amount_cents} cents` };
  console.log(`notified ${m.idempotencyKey} ${key}`);
  return [{ topic: notifications, value: JSON.stringify(note), key }]; // published with the payment's ack
}, { leaseMs: 5000, waitMs: 1000, concurrency: 2, stopOnSignals: true, onError: (e) => console.error(`notifications: ${e.message}`) });
c.close();
