/// <reference types="node" />
// Type declarations of the mqd Node.js client (index.js).

export const DEFAULT_SERVER: string;
export const DEFAULT_TIMEOUT_MS: number;
export const DEFAULT_MAX_ATTEMPTS: number;
export const DEFAULT_RETRY_BACKOFF_MS: number;

/** The one error type: `status` 0 means no answer (refused, reset, timed out). */
export class MqdError extends Error {
  readonly status: number;
  /** The API's stable error code (`topic_not_found`, `no_quorum`...); "" without an answer. */
  readonly code: string;
  readonly method: string;
  readonly path: string;
  readonly retryAfterMs: number | null;
  /** For status 0: whether the request may have reached the node. */
  readonly sent: boolean;
  readonly node: string;
  /** No answer, 503 or 429: the same request may succeed later. */
  readonly retryable: boolean;
}

/** Thrown by a handler: nack as not retryable, dead-lettered at once. */
export class Reject extends Error {
  constructor(message?: string);
}

export interface ClientOptions {
  /** Base URLs of the nodes, or one comma-separated string (default http://127.0.0.1:7070). */
  servers?: string[] | string;
  /** Sent as a bearer token. */
  token?: string;
  /** PEM CA certificates trusted for https servers (or caFile, a path). */
  ca?: string | Buffer;
  caFile?: string;
  /** One attempt's bound (default 15000); a fetch adds its waitMs. */
  timeoutMs?: number;
  /** Tries of one request across nodes (default 10). */
  maxAttempts?: number;
  /** First pause between attempts (default 100), doubled up to 2000; Retry-After lengthens it. */
  retryBackoffMs?: number;
  /** Default bound of one operation with its retries (default none: maxAttempts bounds it). */
  deadlineMs?: number | null;
}

export interface CallOptions {
  signal?: AbortSignal;
  deadlineMs?: number;
}

export interface PublishOptions extends CallOptions {
  key?: string;
  partitionKey?: string;
  delayMs?: number;
  maxRetry?: number;
  attrs?: Record<string, string>;
  producerId?: string;
  producerSeq?: number;
}

export interface BatchMessage {
  value: string | Uint8Array;
  key?: string;
  partitionKey?: string;
  delayMs?: number;
  maxRetry?: number;
  attrs?: Record<string, string>;
}

export interface PublishResult {
  topic: string;
  partition: number;
  offset: number;
  duplicate: boolean;
  raw: Record<string, unknown>;
}

export interface Message {
  topic: string;
  partition: number;
  offset: number;
  receipt: string;
  value: Buffer;
  idempotencyKey: string;
  retryCount: number;
  maxRetry: number;
  rejectReason: string;
  publishedAt: string;
  attrs: Record<string, string>;
  raw: Record<string, unknown>;
  /** Set by a consumer when extending the lease answered stale or invalid. */
  leaseLost: boolean;
}

/** A message yielded by messages(): its lease is kept until ack() or nack(). */
export interface Delivery extends Message {
  ack(): Promise<ReceiptResult | null>;
  nack(err?: unknown): Promise<ReceiptResult | null>;
}

export interface ReceiptResult {
  receipt: string;
  /** ok; stale: no lease any more, or already acked (a retried ack); invalid. */
  status: 'ok' | 'stale' | 'invalid' | string;
}

/** One message a process() call publishes, to any topic; key is its own Idempotency-Key. */
export interface Output {
  topic: string;
  value: string | Uint8Array;
  key?: string;
  partitionKey?: string;
  delayMs?: number;
  maxRetry?: number;
  attrs?: Record<string, string>;
}

/** The answer of process(); duplicate: the kept answer of an earlier call with the same receipts. */
export interface ProcessResult {
  acked: number;
  duplicate: boolean;
  results: PublishResult[];
  raw: Record<string, unknown>;
}

export interface FetchOptions extends CallOptions {
  max?: number;
  waitMs?: number;
  leaseMs?: number;
}

export interface NackOptions extends CallOptions {
  reason?: string;
  retryable?: boolean;
  delayMs?: number;
}

export interface ConsumeOptions {
  leaseMs?: number;
  waitMs?: number;
  concurrency?: number;
  max?: number;
  signal?: AbortSignal;
  /** Stop on SIGINT or SIGTERM (consume only). */
  stopOnSignals?: boolean;
  /** Hears of what the loop carries on after: retried fetches, failed settles, stale receipts. */
  onError?: (err: MqdError) => void;
}

export interface DeadLetter {
  id: number;
  partition: number;
  offset: number;
  value: Buffer;
  idempotencyKey: string;
  rejectReason: string;
  retryCount: number;
  deadAt: string;
  attrs: Record<string, string>;
  history: Array<{ at: string; kind: string; reason: string; node: string }>;
  raw: Record<string, unknown>;
}

export class Client {
  constructor(opts?: ClientOptions);
  readonly timeoutMs: number;
  close(): void;
  request(method: string, path: string, payload?: unknown, opts?: CallOptions): Promise<any>;
  publish(topic: string, value: string | Uint8Array, opts?: PublishOptions): Promise<PublishResult>;
  publishBatch(topic: string, messages: BatchMessage[], opts?: CallOptions): Promise<PublishResult[]>;
  putTopic(name: string, config?: Record<string, unknown>, opts?: CallOptions): Promise<{ topic: any; created: boolean }>;
  topic(name: string, opts?: CallOptions): Promise<any>;
  topics(opts?: CallOptions): Promise<any[]>;
  deleteTopic(name: string, opts?: CallOptions): Promise<void>;
  putGroup(topic: string, group: string, opts?: CallOptions): Promise<void>;
  deleteGroup(topic: string, group: string, opts?: CallOptions): Promise<void>;
  cluster(opts?: CallOptions): Promise<any>;
  fetch(topic: string, group: string, opts?: FetchOptions): Promise<Message[]>;
  ack(topic: string, group: string, receipts: string[], opts?: CallOptions): Promise<ReceiptResult[]>;
  nack(topic: string, group: string, receipts: string[], opts?: NackOptions): Promise<ReceiptResult[]>;
  extend(topic: string, group: string, receipts: string[], leaseMs: number, opts?: CallOptions): Promise<ReceiptResult[]>;
  process(topic: string, group: string, receipts: string[], outputs?: Output[], opts?: CallOptions): Promise<ProcessResult>;
  consumeProcess(topic: string, group: string,
    handler: (m: Message) => Output[] | void | Promise<Output[] | void>, opts?: ConsumeOptions): Promise<void>;
  consume(topic: string, group: string, handler: (m: Message) => unknown | Promise<unknown>, opts?: ConsumeOptions): Promise<void>;
  messages(topic: string, group: string, opts?: ConsumeOptions): AsyncGenerator<Delivery, void, undefined>;
  deadLetters(topic: string, group: string, opts?: CallOptions & { limit?: number; after?: number; key?: string }):
    Promise<{ deadLetters: DeadLetter[]; nextAfter: number | null }>;
  replay(topic: string, group: string, ids?: number[], opts?: CallOptions & { ratePerSec?: number }):
    Promise<{ accepted: number; ratePerSec: number }>;
  deleteDeadLetter(topic: string, group: string, id: number, opts?: CallOptions): Promise<void>;
}
