/**
 * A client of an engine server ({@link startEngineServer}): {@link EngineClient} implements the
 * proxy's {@link PDEndpoint} over HTTP, so a {@link PDProxy} drives engines in other processes
 * exactly as it drives in-process ones.
 * @module
 */
import { Agent as HttpAgent, request as httpRequest, type IncomingMessage } from 'node:http';
import { Agent as HttpsAgent, request as httpsRequest } from 'node:https';
import type { KVTransferParams, FinishReason } from '../contracts.js';
import type { GenerateResult } from '../engine.js';
import type { PDEndpoint } from '../proxy.js';
import type { SamplingParams } from '../request.js';
import { isPlainObject, type CompletionResponse } from './protocol.js';
import { parseHealthKVCacheGroups } from './kv-cache-groups.js';
import type { BlockSizeGroup } from '@kvconnect/core';

/** Options of an {@link EngineClient}. */
export interface EngineClientOptions {
  /** The engine id, when known without asking (`connect` asks `/health`). */
  engineId?: string;
  /** Deadline of one completion request, in ms (default 120 000). */
  timeoutMs?: number;
  /** Deadline of `/health`, `/metrics` and `/shutdown` requests, in ms (default 5000). */
  controlTimeoutMs?: number;
  /** Largest response body accepted, in bytes (default 16 MiB). */
  maxResponseBytes?: number;
}

/** Per-call options of {@link EngineClient.generate} and {@link EngineClient.completion}. */
export interface EngineCallOptions {
  /**
   * Aborts the call: the connection is closed, which the engine server takes as the client going
   * away (it aborts the request in its engine). The call rejects with an
   * {@link EngineClientError} whose `aborted` is true.
   */
  signal?: AbortSignal;
  /**
   * Stream the completion: the request is sent with `stream: true` and each SSE chunk's new text
   * and token ids go to `onDelta` as they arrive; the call still resolves with the whole result
   * (the last chunk carries `kvconnect` and `kv_transfer_params`).
   */
  onDelta?: (delta: StreamDelta) => void;
}

/** New output of a streamed completion. */
export interface StreamDelta {
  text: string;
  tokenIds: number[];
}

/** Sampling parameters plus the stop sequences the HTTP API adds. */
export interface RemoteSamplingParams extends SamplingParams {
  /** Stop sequences (the OpenAI `stop` field). */
  stop?: readonly string[];
}

/** A {@link GenerateResult} from an engine server, with the server's extra information. */
export interface RemoteGenerateResult extends GenerateResult {
  /** The engine's `kvconnect` field (checksum verdict of a load, payload sent, ...). */
  kvconnect?: Record<string, unknown>;
  usage?: { prompt_tokens: number; completion_tokens: number; total_tokens: number };
  /** The engine's model name. */
  model?: string;
}

/**
 * An engine server answered with an error, or could not be reached. `status` is the HTTP status
 * (0: no answer: connection refused, reset, or `timedOut`).
 */
export class EngineClientError extends Error {
  constructor(
    readonly url: string,
    readonly status: number,
    message: string,
    readonly timedOut = false,
    options?: { cause?: unknown },
    /** The caller's signal aborted the call. */
    readonly aborted = false,
  ) {
    super(message, options);
    this.name = 'EngineClientError';
  }

  /** No answer because the server could not be reached or the connection failed (not a timeout, not an abort). */
  get unreachable(): boolean {
    return this.status === 0 && !this.timedOut && !this.aborted;
  }
}

const FINISH: readonly FinishReason[] = ['stop', 'length', 'abort', 'error'];

/**
 * An engine in another process, reached over HTTP. Build it with {@link EngineClient.connect}
 * (learns the engine id from `/health`, which a concurrent-mode proxy needs), or with the
 * constructor when the id is known.
 */
export class EngineClient implements PDEndpoint {
  /** The server's base URL (no trailing slash). */
  readonly url: string;
  private _engineId: string;
  private _models: string[] = [];
  private _groupConfigs: BlockSizeGroup[] | undefined;
  private readonly o: EngineClientOptions;
  /** Keep-alive connections of this client (idle sockets are unref'd by Node's agent). */
  private readonly agent: HttpAgent;
  private readonly send: typeof httpRequest;

  constructor(url: string, options: EngineClientOptions = {}) {
    const u = new URL(url);
    if (u.protocol !== 'http:' && u.protocol !== 'https:') throw new TypeError(`engine URL must be http(s): ${url}`);
    this.url = u.origin;
    this._engineId = options.engineId ?? '';
    this.o = options;
    const https = u.protocol === 'https:';
    this.agent = https ? new HttpsAgent({ keepAlive: true }) : new HttpAgent({ keepAlive: true });
    this.send = https ? (httpsRequest as typeof httpRequest) : httpRequest;
  }

  /** Closes this client's idle keep-alive connections (requests still work afterwards, on new ones). */
  close(): void {
    this.agent.destroy();
  }

  /** Connects to the engine server at `url`: asks `/health` for the engine id. */
  static async connect(url: string, options: EngineClientOptions = {}): Promise<EngineClient> {
    const c = new EngineClient(url, options);
    const h = await c.health();
    if (typeof h.engine_id !== 'string' || h.engine_id.length === 0) throw new EngineClientError(c.url, 200, `${c.url}/health did not name the engine`);
    c._engineId = h.engine_id;
    const served = Array.isArray(h.served_models) ? h.served_models.filter((x): x is string => typeof x === 'string') : [];
    c._models = served.length > 0 ? served : typeof h.model === 'string' ? [h.model] : [];
    c._groupConfigs = parseHealthKVCacheGroups(h);
    return c;
  }

  /**
   * The engine's KV cache groups, as learned by {@link connect} from `/health`'s `kv_cache_groups`
   * (undefined otherwise); `PDProxy` derives `kv_checksum_block_sizes` from them.
   */
  get groupConfigs(): readonly BlockSizeGroup[] | undefined {
    return this._groupConfigs;
  }

  /** The model names the engine serves, as learned by {@link connect} (empty otherwise). */
  get models(): readonly string[] {
    return this._models;
  }

  /** The engine's id ('' when neither given nor learned by {@link connect}). */
  get engineId(): string {
    return this._engineId;
  }

  /** `GET /health` (throws {@link EngineClientError} unless 200). */
  async health(): Promise<Record<string, unknown>> {
    const { status, body } = await this.request('GET', '/health', undefined, this.o.controlTimeoutMs ?? 5000);
    if (status !== 200 || !isPlainObject(body)) throw this.errorOf(status, body, '/health');
    return body;
  }

  /** `GET /metrics`: the engine's Prometheus text. */
  async metrics(): Promise<string> {
    const { status, text } = await this.request('GET', '/metrics', undefined, this.o.controlTimeoutMs ?? 5000, false);
    if (status !== 200) throw new EngineClientError(this.url, status, `${this.url}/metrics answered ${status}`);
    return text;
  }

  /** `POST /shutdown`: asks the server to close (its process exits when it was started by `kvconnect-engine`). */
  async shutdown(): Promise<void> {
    const { status, body } = await this.request('POST', '/shutdown', undefined, this.o.controlTimeoutMs ?? 5000);
    if (status !== 200) throw this.errorOf(status, body, '/shutdown');
  }

  /**
   * `POST /v1/completions` with a raw body.
   * @returns the status and the parsed body (an error body for non-200 statuses).
   */
  async completion(body: Record<string, unknown>, call: EngineCallOptions = {}): Promise<{ status: number; body: unknown }> {
    const { status, body: b } = await this.request('POST', '/v1/completions', body, this.o.timeoutMs ?? 120_000, true, call.signal);
    return { status, body: b };
  }

  /**
   * Generates through the remote engine ({@link PDEndpoint}). A request that ended with `error`
   * (HTTP 500 with a completion body) resolves with `finishReason: 'error'` and `error`, as
   * `Engine.generate` does.
   * @throws EngineClientError for other failures (bad request, unreachable, timeout, malformed answer).
   */
  async generate(prompt: string | readonly number[], sampling: RemoteSamplingParams = {}, kvTransferParams?: KVTransferParams, requestId?: string, call: EngineCallOptions = {}): Promise<RemoteGenerateResult> {
    const body: Record<string, unknown> = { prompt: typeof prompt === 'string' ? prompt : [...prompt] };
    if (sampling.maxTokens !== undefined) body.max_tokens = sampling.maxTokens;
    if (sampling.temperature !== undefined) body.temperature = sampling.temperature;
    if (sampling.seed !== undefined) body.seed = sampling.seed;
    if (sampling.ignoreEos !== undefined) body.ignore_eos = sampling.ignoreEos;
    if (sampling.stopTokenIds !== undefined && sampling.stopTokenIds.length > 0) body.stop_token_ids = [...sampling.stopTokenIds];
    if (sampling.stop !== undefined && sampling.stop.length > 0) body.stop = [...sampling.stop];
    if (kvTransferParams !== undefined) body.kv_transfer_params = kvTransferParams;
    if (requestId !== undefined) body.request_id = requestId;
    if (call.onDelta) return this.generateStreamed(body, call);
    const { status, body: b } = await this.completion(body, call);
    if (status === 200 || (status === 500 && isPlainObject(b) && Array.isArray(b.choices))) return this.resultOf(b, status);
    throw this.errorOf(status, b, '/v1/completions');
  }

  /** `generate` over SSE: chunks are checked and folded into the whole response's shape, then read by `resultOf`. */
  private async generateStreamed(body: Record<string, unknown>, call: EngineCallOptions): Promise<RemoteGenerateResult> {
    const onDelta = call.onDelta!;
    const acc = { text: '', ids: [] as number[], finish: null as unknown, last: {} as Record<string, unknown>, usage: undefined as unknown, error: undefined as unknown };
    const bad = (why: string) => new EngineClientError(this.url, 200, `${this.url}/v1/completions: malformed stream chunk (${why})`);
    const onEvent = (data: string) => {
      if (data === '[DONE]') return;
      let ev: unknown;
      try {
        ev = JSON.parse(data);
      } catch {
        throw bad('not JSON');
      }
      if (!isPlainObject(ev)) throw bad('not an object');
      if (isPlainObject(ev.error)) acc.error = ev.error;
      if (isPlainObject(ev.usage)) acc.usage = ev.usage;
      if (!Array.isArray(ev.choices) || ev.choices.length === 0) return;
      const ch = ev.choices[0] as unknown;
      if (!isPlainObject(ch) || typeof ch.text !== 'string' || !Array.isArray(ch.token_ids) || !ch.token_ids.every((x) => Number.isInteger(x))) throw bad('choice');
      acc.text += ch.text;
      acc.ids.push(...(ch.token_ids as number[]));
      if (ch.text.length > 0 || ch.token_ids.length > 0) onDelta({ text: ch.text, tokenIds: ch.token_ids.slice() as number[] });
      if (ch.finish_reason !== null && ch.finish_reason !== undefined) {
        acc.finish = ch.finish_reason;
        acc.last = ev;
      }
    };
    const streamBody = { ...body, stream: true, stream_options: { include_usage: true } };
    const { status, body: b } = await this.request('POST', '/v1/completions', streamBody, this.o.timeoutMs ?? 120_000, true, call.signal, onEvent);
    if (status !== 200 || b !== STREAMED) throw this.errorOf(status, b, '/v1/completions');
    if (acc.finish === null) {
      const why = isPlainObject(acc.error) && typeof acc.error.message === 'string' ? acc.error.message : 'the stream ended without a finish_reason';
      throw new EngineClientError(this.url, isPlainObject(acc.error) && typeof acc.error.code === 'number' ? acc.error.code : 502, `${this.url}/v1/completions: ${why}`);
    }
    const whole = { ...acc.last, choices: [{ index: 0, text: acc.text, token_ids: acc.ids, finish_reason: acc.finish }], usage: acc.usage, error: acc.last.error ?? acc.error };
    return this.resultOf(whole, acc.finish === 'error' ? 500 : 200);
  }

  private resultOf(b: unknown, status: number): RemoteGenerateResult {
    const bad = (why: string) => new EngineClientError(this.url, status, `${this.url}/v1/completions: malformed response (${why})`);
    if (!isPlainObject(b) || !Array.isArray(b.choices) || b.choices.length !== 1) throw bad('choices');
    const ch = b.choices[0] as unknown;
    if (!isPlainObject(ch)) throw bad('choice');
    const { text, token_ids: ids, finish_reason: fr } = ch;
    if (typeof text !== 'string') throw bad('text');
    if (!Array.isArray(ids) || !ids.every((x) => Number.isInteger(x))) throw bad('token_ids');
    if (typeof fr !== 'string' || !(FINISH as readonly string[]).includes(fr)) throw bad('finish_reason');
    const kv = b.kvconnect;
    if (kv !== undefined && !isPlainObject(kv)) throw bad('kvconnect');
    const params = b.kv_transfer_params;
    if (params !== undefined && params !== null && !isPlainObject(params)) throw bad('kv_transfer_params');
    const requestId = typeof kv?.request_id === 'string' ? kv.request_id : typeof b.id === 'string' ? b.id : '';
    const r: RemoteGenerateResult = {
      requestId,
      tokenIds: ids as number[],
      text,
      finishReason: fr as FinishReason,
      numPreemptions: typeof kv?.num_preemptions === 'number' ? kv.num_preemptions : 0,
    };
    if (isPlainObject(params)) r.kvTransferParams = params;
    if (fr === 'error') {
      const err = isPlainObject(b.error) && typeof b.error.message === 'string' ? b.error.message : typeof kv?.error === 'string' ? kv.error : 'the request ended with an error';
      r.error = err;
    }
    if (kv) r.kvconnect = kv;
    const usage = (b as Partial<CompletionResponse>).usage;
    if (isPlainObject(usage)) r.usage = usage as RemoteGenerateResult['usage'];
    if (typeof b.model === 'string') r.model = b.model;
    return r;
  }

  private errorOf(status: number, body: unknown, path: string): EngineClientError {
    const msg = isPlainObject(body) && isPlainObject(body.error) && typeof body.error.message === 'string' ? body.error.message : `answered ${status}`;
    return new EngineClientError(this.url, status, `${this.url}${path}: ${msg}`);
  }

  /**
   * One HTTP request over this client's keep-alive agent, parsed as JSON unless `parse` is false.
   * A request that fails on a reused keep-alive connection before any byte of an answer came
   * (the server closed the idle connection as the request went out: ECONNRESET, EPIPE) is sent
   * again once, on a fresh connection, as Node's `http` documentation advises
   * (`request.reusedSocket`); any other failure is an {@link EngineClientError} with status 0.
   * (A server that reset the connection after reading the request, e.g. a crash, may see it twice:
   * a completion's `request_id` then answers 409 while the first one runs.)
   */
  private async request(method: string, path: string, json: unknown, timeoutMs: number, parse = true, external?: AbortSignal, onEvent?: (data: string) => void): Promise<{ status: number; body: unknown; text: string }> {
    const timeout = AbortSignal.timeout(timeoutMs);
    const signal = external ? AbortSignal.any([timeout, external]) : timeout;
    const payload = json === undefined ? undefined : Buffer.from(JSON.stringify(json));
    let res: { status: number; text: string; streamed?: boolean };
    for (let attempt = 0; ; attempt++) {
      try {
        res = await this.exchange(method, path, payload, signal, onEvent);
        break;
      } catch (e) {
        if (e instanceof EngineClientError) throw e;
        const retry = attempt === 0 && !signal.aborted && e instanceof ExchangeError && e.reused && !e.answered && RETRYABLE.has(e.code ?? '');
        if (!retry) throw this.networkError(path, e instanceof ExchangeError ? e.cause : e, timeout, external);
      }
    }
    if (res.streamed) return { status: res.status, body: STREAMED, text: '' };
    if (!parse) return { status: res.status, body: undefined, text: res.text };
    let body: unknown;
    try {
      body = res.text.length > 0 ? JSON.parse(res.text) : undefined;
    } catch {
      throw new EngineClientError(this.url, res.status, `${this.url}${path}: answered ${res.status} with a body that is not JSON`);
    }
    return { status: res.status, body, text: res.text };
  }

  /**
   * Sends one request and reads its answer (at most `maxResponseBytes`). With `onEvent`, a 200
   * `text/event-stream` answer is read as Server-Sent Events: each event's `data` goes to
   * `onEvent` (an event larger than `maxResponseBytes`, or `onEvent` throwing, fails the exchange).
   */
  private exchange(method: string, path: string, payload: Buffer | undefined, signal: AbortSignal, onEvent?: (data: string) => void): Promise<{ status: number; text: string; streamed?: boolean }> {
    const limit = this.o.maxResponseBytes ?? 16 << 20;
    return new Promise((resolve, reject) => {
      let answered = false;
      const headers: Record<string, string | number> = payload === undefined ? {} : { 'content-type': 'application/json', 'content-length': payload.length };
      const req = this.send(this.url + path, { method, headers, agent: this.agent, signal }, (res: IncomingMessage) => {
        answered = true;
        const status = res.statusCode ?? 0;
        if (onEvent && status === 200 && /^text\/event-stream/i.test(res.headers['content-type'] ?? '')) {
          const sse = new SseParser(onEvent, limit);
          res.setEncoding('utf8');
          res.on('data', (c: string) => {
            try {
              sse.push(c);
            } catch (e) {
              res.destroy();
              reject(e instanceof EngineClientError ? e : new EngineClientError(this.url, status, `${this.url}${path}: ${e instanceof Error ? e.message : String(e)}`));
            }
          });
          res.on('end', () => resolve({ status, text: '', streamed: true }));
          res.on('error', (e) => reject(new ExchangeError(e, req.reusedSocket, true)));
          res.on('aborted', () => reject(new ExchangeError(new Error('the connection closed mid-answer'), req.reusedSocket, true)));
          return;
        }
        const declared = Number(res.headers['content-length'] ?? NaN);
        if (declared > limit) {
          res.destroy();
          reject(new EngineClientError(this.url, status, `${this.url}${path}: response body larger than ${limit} bytes`));
          return;
        }
        const chunks: Buffer[] = [];
        let size = 0;
        res.on('data', (c: Buffer) => {
          size += c.length;
          if (size > limit) {
            res.destroy();
            reject(new EngineClientError(this.url, status, `${this.url}${path}: response body larger than ${limit} bytes`));
            return;
          }
          chunks.push(c);
        });
        res.on('end', () => resolve({ status, text: Buffer.concat(chunks, size).toString('utf8') }));
        res.on('error', (e) => reject(new ExchangeError(e, req.reusedSocket, true)));
        res.on('aborted', () => reject(new ExchangeError(new Error('the connection closed mid-answer'), req.reusedSocket, true)));
      });
      req.on('error', (e) => reject(new ExchangeError(e, req.reusedSocket, answered)));
      req.end(payload);
    });
  }

  private networkError(path: string, e: unknown, timeout: AbortSignal, external: AbortSignal | undefined): EngineClientError {
    const aborted = external?.aborted === true;
    const timedOut = !aborted && timeout.aborted;
    const cause = e instanceof Error && e.cause instanceof Error ? `: ${e.cause.message}` : '';
    const what = aborted ? 'aborted by the caller' : timedOut ? 'timed out' : `failed: ${e instanceof Error ? e.message : String(e)}${cause}`;
    return new EngineClientError(this.url, 0, `${this.url}${path} ${what}`, timedOut, { cause: e }, aborted);
  }
}

/** `body` of a streamed answer (its events went to the caller). */
const STREAMED = Symbol('streamed');

/** Splits Server-Sent Events text into events and hands each event's `data` on (comments and other fields skipped). */
class SseParser {
  private buf = '';

  constructor(
    private readonly onData: (data: string) => void,
    private readonly limit: number,
  ) {}

  push(chunk: string): void {
    this.buf += chunk;
    for (;;) {
      const m = /\r?\n\r?\n/.exec(this.buf);
      if (!m) break;
      const event = this.buf.slice(0, m.index);
      this.buf = this.buf.slice(m.index + m[0].length);
      const data = event
        .split(/\r?\n/)
        .filter((l) => l.startsWith('data:'))
        .map((l) => l.slice(5).replace(/^ /, ''))
        .join('\n');
      if (data.length > 0) this.onData(data);
    }
    if (this.buf.length > this.limit) throw new Error(`an SSE event larger than ${this.limit} bytes`);
  }
}

/** Error codes of a connection the server closed as the request went out. */
const RETRYABLE = new Set(['ECONNRESET', 'EPIPE']);

/** A failed exchange: whether it ran on a reused keep-alive connection and whether an answer had started. */
class ExchangeError extends Error {
  readonly code: string | undefined;
  constructor(
    override readonly cause: Error,
    readonly reused: boolean,
    readonly answered: boolean,
  ) {
    super(cause.message);
    this.code = (cause as NodeJS.ErrnoException).code;
  }
}
