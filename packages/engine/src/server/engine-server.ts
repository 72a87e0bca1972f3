/**
 * An HTTP server in front of one {@link Engine}: the OpenAI-style API a P/D proxy (or any client)
 * talks to, as vLLM's `vllm serve` offers it.
 *
 * - `POST /v1/completions` and `POST /v1/chat/completions`: see {@link parseCompletionRequest}
 *   for the body; answers the OpenAI response ({@link ResponseFormat}) with `kv_transfer_params`
 *   (producer side; consumer side `{ kv_transfer_params_error }` when the connector could not use
 *   the request's params, also copied to a top-level `kv_transfer_params_error` and logged as a
 *   warning) and a `kvconnect` field ({@link KVConnectInfo}: engine and request ids, preemptions,
 *   the checksum verdict of a KV load, the checksum payload a producer sent). With `stream: true`:
 *   Server-Sent Events, the extra fields in the last choice chunk, errors after the first byte as
 *   a `data: { error }` event. The request id is `request_id`, else `X-Request-Id`, else a fresh
 *   one; it is echoed in `x-request-id`. Status codes: 200; 400 bad input (the message lists
 *   every problem); 404 a `model` not served; 409 a request id in use; 413 body too large; 415
 *   not JSON; 500 the request ended with `error` (the body holds the partial completion and
 *   `error.message`) or the engine failed; 503 shutting down or engine setup failed; 504 the
 *   request ran past its timeout (it is aborted in the engine). A client that disconnects aborts
 *   its request.
 * - `GET /v1/models`: the served model names; `GET /version`: `{ version }`;
 * - `GET /health`: `{ status: 'ok', engine_id, model, ... }` (503 while setup failed, after a worker process died, or closing);
 * - `GET /metrics`: the engine's Prometheus registry (KV checksum metrics) in text format;
 * - `POST /shutdown`: answers `{ status: 'shutting-down' }`, then closes gracefully (see
 *   {@link EngineServerOptions.onShutdown}).
 * @module
 */
import type { IncomingMessage, Server, ServerResponse } from 'node:http';
import type { LoadEvent, NotSentReason, PayloadSentEvent } from '@kvconnect/core';
import { KV_TRANSFER_PARAMS_ERROR } from '@kvconnect/core';
import type { FinishReason } from '../contracts.js';
import type { Engine, GenerateResult } from '../engine.js';
import type { Request } from '../request.js';
import { healthKVCacheGroups } from './kv-cache-groups.js';
import {
  DEFAULT_MAX_BODY_BYTES,
  HttpError,
  RouteTable,
  closeGracefully,
  servingRoutes,
  findStop,
  parseCompletionRequest,
  readJson,
  sendError,
  sendJson,
  sendText,
  singleByteStops,
  urlOf,
  type CompletionKind,
  type CompletionRequest,
  type KVConnectInfo,
  type ResponseExtras,
  IncrementalDecoder,
  ResponseFormat,
  requestIdHeader,
  sseDone,
  sseSend,
  sseStart,
  createJsonHttpServer,
  listenOn,
  replyAndShutdown,
} from './protocol.js';

/** Options of {@link startEngineServer}. */
export interface EngineServerOptions {
  /** Interface to listen on (default `127.0.0.1`). */
  host?: string;
  /** Port (default 0: any free port). */
  port?: number;
  /** Largest request body in bytes (default 1 MiB). */
  maxBodyBytes?: number;
  /** A request running longer is aborted and answered 504 (default 120 000 ms; 0 = none). */
  requestTimeoutMs?: number;
  /** Largest `max_tokens` (default 4096). */
  maxTokens?: number;
  /**
   * Longest request, prompt plus `max_tokens` (default: what the KV block pool can hold for one
   * request, `floor(numBlocks / groups) * blockSize`). Longer requests are answered 400 (the
   * engine could never schedule them).
   */
  maxModelLen?: number;
  /** How long {@link EngineServer.close} waits for running requests before aborting them (default 5000 ms). */
  gracefulTimeoutMs?: number;
  /** The model names requests may ask for in `model` (default: the engine's model name); the first one is answered in `model`. */
  servedModelNames?: readonly string[];
  /** Where warnings go (ignored request fields, unusable `kv_transfer_params`); default the engine's checksum logger, if any. */
  logger?: ServerLogger;
  /** Serve `POST /shutdown` (default true). */
  allowShutdown?: boolean;
  /**
   * Called once after `POST /shutdown` closed the server (e.g. to shut the engine down and exit the
   * process). Errors are ignored.
   */
  onShutdown?: () => void | Promise<void>;
}

/** A running engine server. */
export interface EngineServer {
  /** `http://host:port`. */
  readonly url: string;
  readonly port: number;
  readonly host: string;
  /**
   * Stops accepting requests, waits for running ones (up to `gracefulTimeoutMs`, then aborts them
   * in the engine), and closes every connection. Does not shut the engine down. Idempotent.
   */
  close(): Promise<void>;
  /** Resolves when the server closed (by {@link close} or `POST /shutdown`). */
  readonly closed: Promise<void>;
}

/** What the server logs to (a pino logger fits). */
export interface ServerLogger {
  warn(fields: object, msg: string): void;
}

/** How often a streamed request's new tokens are looked for, in ms. */
const STREAM_POLL_MS = 2;

/**
 * Streams one request's tokens as SSE chunks while it runs: every {@link STREAM_POLL_MS} it reads
 * the new output tokens of the engine's request (the engine has no per-token callback; its
 * scheduler's request object only grows). With stop sequences, the last `longest - 1` tokens are
 * held back (they may begin a stop sequence), and a stop sequence found ends the request (aborted
 * in the engine, answered as `stop`).
 */
class TokenStreamer {
  /** Where a stop sequence cut the output (-1: none yet). */
  stoppedAt = -1;
  private sent = 0;
  private first = true;
  private req: Request | undefined;
  private readonly dec = new IncrementalDecoder();
  private readonly holdback: number;
  private readonly timer: NodeJS.Timeout;

  constructor(
    private readonly engine: Engine,
    private readonly requestId: string,
    private readonly stops: readonly string[],
    private readonly fmt: ResponseFormat,
    private readonly res: ServerResponse,
  ) {
    this.holdback = stops.length > 0 ? Math.max(...stops.map((x) => Buffer.byteLength(x))) - 1 : 0;
    if (fmt.kind === 'chat') {
      sseSend(res, fmt.chunk('', [], null, {}, true));
      this.first = false;
    }
    this.timer = setInterval(() => this.poll(), STREAM_POLL_MS);
  }

  private poll(): void {
    if (this.stoppedAt >= 0) return;
    this.req ??= this.engine.scheduler.requests.get(this.requestId);
    if (!this.req) return;
    const ids = this.req.outputTokenIds;
    if (this.stops.length > 0) {
      const cut = findStop(ids, this.stops);
      if (cut >= 0) {
        this.stoppedAt = cut;
        this.emit(ids, cut);
        this.engine.abort(this.requestId);
        return;
      }
    }
    this.emit(ids, ids.length - this.holdback);
  }

  private emit(ids: readonly number[], upto: number): void {
    if (upto <= this.sent) return;
    const slice = ids.slice(this.sent, upto);
    this.sent = upto;
    const text = this.dec.push(slice);
    sseSend(this.res, this.fmt.chunk(text, slice, null, {}, this.first));
    this.first = false;
  }

  stop(): void {
    clearInterval(this.timer);
  }

  /** Sends what is left of `tokenIds` (the final output) and the chunk with `finish` and `extras`. */
  finish(tokenIds: readonly number[], finish: FinishReason, extras: ResponseExtras): void {
    this.emit(tokenIds, tokenIds.length);
    sseSend(this.res, this.fmt.chunk(this.dec.flush(), [], finish, extras, this.first));
  }
}

interface InFlight {
  info: KVConnectInfo;
  done: Promise<unknown>;
}

/**
 * Starts an HTTP server for `engine` (see the module documentation for the API). Resolves once it
 * listens; the engine's setup may still be running (requests wait for it, `/health` says 503 until
 * it finished).
 */
export async function startEngineServer(engine: Engine, options: EngineServerOptions = {}): Promise<EngineServer> {
  const host = options.host ?? '127.0.0.1';
  const maxBody = options.maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES;
  const timeoutMs = options.requestTimeoutMs ?? 120_000;
  const graceMs = options.gracefulTimeoutMs ?? 5000;
  const inflight = new Map<string, InFlight>();
  const startedAt = Date.now();
  let closing = false;
  let seq = 0;
  let setupError: string | null = null;
  engine.ready.catch((e: unknown) => {
    setupError = e instanceof Error ? e.message : String(e);
  });

  // Checksum verdicts and payloads of in-flight requests, from the engine's events.
  const events = engine.observability?.events;
  const onLoad = (ev: LoadEvent) => {
    const f = inflight.get(ev.requestId);
    if (!f) return;
    f.info.load = {
      verdict: ev.verdict.verdict,
      action: ev.action,
      num_tokens: ev.numTokens,
      mismatches: ev.verdict.mismatches.map((m) => ({ groupId: m.groupId, positions: m.positions.slice() })),
      unverified: ev.verdict.unverified.map((u) => ({ groupId: u.groupId, reason: u.reason })),
      wrong_request: ev.verdict.wrongRequest,
      identity: ev.verdict.identity,
      ...(ev.verdict.sampled ? { sampled: { ...ev.verdict.sampled } } : {}),
      ...(ev.verdict.subBlockGroups ? { sub_block_groups: ev.verdict.subBlockGroups.slice() } : {}),
    };
  };
  const onSent = (ev: PayloadSentEvent) => {
    const f = inflight.get(ev.requestId);
    if (f) f.info.checksum_payload = { sent: true, carrier: ev.carrier, bytes: ev.bytes, groups: ev.groups.slice() };
  };
  const onNotSent = (ev: { requestId: string; reason: NotSentReason; detail: string }) => {
    const f = inflight.get(ev.requestId);
    if (f) f.info.checksum_payload = { sent: false, reason: ev.reason, detail: ev.detail };
  };
  const loadEvents = ['load-verified', 'load-mismatch', 'load-unverified'] as const;
  for (const e of loadEvents) events?.on(e, onLoad);
  events?.on('checksum-payload-sent', onSent);
  events?.on('checksum-payload-not-sent', onNotSent);

  function maxModelLen(): number {
    if (options.maxModelLen !== undefined) return options.maxModelLen;
    const groups = Math.max(1, engine.groupConfigs.length);
    return Math.floor(engine.scheduler.kv.pool.numBlocks / groups) * engine.blockSize;
  }

  const served = (): readonly string[] => options.servedModelNames ?? [engine.model.name];
  const logger = (): ServerLogger | undefined => options.logger ?? engine.observability?.logger;

  async function completions(req: IncomingMessage, res: ServerResponse, kind: CompletionKind): Promise<void> {
    if (closing) throw new HttpError(503, 'the engine server is shutting down');
    const headerId = requestIdHeader(req);
    const body = await readJson(req, maxBody);
    const c: CompletionRequest = parseCompletionRequest(body, { vocabSize: engine.model.vocabSize, maxTokens: options.maxTokens, servedModels: served() }, kind);
    try {
      await engine.ready;
    } catch (e) {
      throw new HttpError(503, `engine setup failed: ${e instanceof Error ? e.message : String(e)}`);
    }
    const promptIds = typeof c.prompt === 'string' ? engine.tokenizer.encode(c.prompt) : c.prompt;
    const limit = maxModelLen();
    if (promptIds.length + c.maxTokens > limit) {
      throw new HttpError(400, `prompt (${promptIds.length} tokens) plus max_tokens (${c.maxTokens}) exceeds the engine's max model length ${limit}`);
    }
    const requestId = c.requestId ?? headerId ?? `${engine.engineId}-cmpl-${seq++}-${Date.now().toString(36)}`;
    if (inflight.has(requestId) || engine.scheduler.requests.has(requestId)) throw new HttpError(409, `request_id ${JSON.stringify(requestId)} is in use`);
    if (c.ignored.length > 0) logger()?.warn({ requestId, fields: c.ignored }, 'the following fields were present in the request but ignored');
    const stopIds = [...c.stopTokenIds];
    for (const id of singleByteStops(c.stop)) if (!stopIds.includes(id)) stopIds.push(id);
    const sampling = { maxTokens: c.maxTokens, temperature: c.temperature, seed: c.seed, ignoreEos: c.ignoreEos, stopTokenIds: stopIds };
    const fmt = new ResponseFormat(kind, requestId, c.model ?? served()[0]);
    const idHeader = { 'x-request-id': requestId };

    const info: KVConnectInfo = { engine_id: engine.engineId, request_id: requestId, num_preemptions: 0 };
    const gen = engine.generate(promptIds, sampling, c.kvTransferParams, requestId);
    const entry: InFlight = { info, done: gen.catch(() => {}) };
    inflight.set(requestId, entry);
    if (c.stream) sseStart(res, idHeader);
    let timedOut = false;
    const timer =
      timeoutMs > 0
        ? setTimeout(() => {
            timedOut = true;
            engine.abort(requestId);
            const e = new HttpError(504, `request ${requestId} ran past ${timeoutMs} ms and was aborted`, 'timeout_error');
            if (c.stream) {
              sseSend(res, { error: { message: e.message, type: e.type, code: e.status } });
              sseDone(res);
            } else sendError(res, e);
          }, timeoutMs)
        : null;
    // A client that goes away aborts its request.
    const onClose = () => {
      if (!res.writableFinished) engine.abort(requestId);
    };
    res.on('close', onClose);
    if (req.socket.destroyed) onClose(); // it went away before the request was queued
    const streamer = c.stream ? new TokenStreamer(engine, requestId, c.stop, fmt, res) : null;
    let r: GenerateResult;
    try {
      r = await gen;
    } catch (e) {
      const he = new HttpError(500, `engine failed: ${e instanceof Error ? e.message : String(e)}`);
      if (!c.stream) throw he;
      streamer?.stop();
      sseSend(res, { error: { message: he.message, type: he.type, code: he.status } });
      sseDone(res);
      return;
    } finally {
      if (timer) clearTimeout(timer);
      res.off('close', onClose);
      inflight.delete(requestId);
    }
    streamer?.stop();
    if (timedOut) return;

    let tokenIds = r.tokenIds;
    let finish = r.finishReason;
    const cut = streamer?.stoppedAt ?? (c.stop.length > 0 && (finish === 'stop' || finish === 'length') ? findStop(tokenIds, c.stop) : -1);
    if (cut >= 0) {
      tokenIds = tokenIds.slice(0, cut);
      finish = 'stop';
    }
    info.num_preemptions = r.numPreemptions;
    if (r.error !== undefined) info.error = r.error;
    const usage = { prompt_tokens: promptIds.length, completion_tokens: tokenIds.length, total_tokens: promptIds.length + tokenIds.length };
    const extras: ResponseExtras = {};
    if (r.kvTransferParams !== undefined) extras.kv_transfer_params = r.kvTransferParams;
    const paramsError = r.kvTransferParams?.[KV_TRANSFER_PARAMS_ERROR];
    if (typeof paramsError === 'string') {
      extras.kv_transfer_params_error = paramsError;
      logger()?.warn({ requestId, connector: engine.transferConfig?.kv_connector, reason: paramsError }, 'kv_transfer_params unusable: the request prefilled locally');
    }
    extras.kvconnect = { ...info };
    if (finish === 'error') extras.error = { message: r.error ?? 'the request ended with an error', type: 'request_error', code: 500 };
    if (streamer) {
      streamer.finish(tokenIds, finish, extras);
      if (c.includeUsage) sseSend(res, fmt.usageChunk(usage));
      if (extras.error) sseSend(res, { error: extras.error });
      sseDone(res);
      return;
    }
    const out = fmt.full(engine.tokenizer.decode(tokenIds), tokenIds, finish, usage, extras);
    sendJson(res, finish === 'error' ? 500 : 200, out, idHeader);
  }

  function models(res: ServerResponse): void {
    const created = Math.floor(startedAt / 1000);
    sendJson(res, 200, { object: 'list', data: served().map((id) => ({ id, object: 'model', created, owned_by: 'kvconnect', root: engine.model.name, parent: null, max_model_len: maxModelLen() })) });
  }

  function health(res: ServerResponse): void {
    const base = { engine_id: engine.engineId, model: engine.model.name, served_models: served(), tp_size: engine.tpSize, pp_size: engine.ppSize, block_size: engine.blockSize, kv_cache_groups: healthKVCacheGroups(engine.groupConfigs) };
    if (setupError !== null) return sendJson(res, 503, { status: 'error', error: `engine setup failed: ${setupError}`, ...base });
    if (engine.failure) return sendJson(res, 503, { status: 'error', error: engine.failure.message, ...base });
    if (closing) return sendJson(res, 503, { status: 'shutting-down', ...base });
    const cfg = engine.transferConfig;
    let stats: unknown = null;
    try {
      stats = engine.stats;
    } catch {
      // setup still running
    }
    sendJson(res, 200, {
      status: stats === null ? 'starting' : 'ok',
      ...base,
      kv_connector: cfg?.kv_connector ?? null,
      kv_role: cfg?.kv_role ?? null,
      enable_kv_checksum: cfg?.enable_kv_checksum ?? false,
      executor: engine.executorKind,
      worker_pids: engine.workerPids,
      in_flight: inflight.size,
      stats,
    });
  }

  async function metrics(res: ServerResponse): Promise<void> {
    const text = await engine.metricsText();
    sendText(res, 200, text, engine.metricsRegistry.contentType);
  }

  const routes = new RouteTable(
    servingRoutes({
      completions,
      models,
      health,
      metrics,
      shutdown: options.allowShutdown === false ? undefined : (res) => replyAndShutdown(res, { status: 'shutting-down', engine_id: engine.engineId }, close, options.onShutdown),
    }),
  );

  const server: Server = createJsonHttpServer((req, res) => routes.handle(req, res));

  let closedResolve!: () => void;
  const closed = new Promise<void>((r) => (closedResolve = r));
  let closeP: Promise<void> | null = null;
  function close(): Promise<void> {
    closeP ??= (async () => {
      closing = true;
      await closeGracefully(server, {
        running: [...inflight.values()].map((f) => f.done),
        graceMs,
        onGraceExpired: async () => {
          const running = [...inflight.values()].map((f) => f.done);
          for (const id of inflight.keys()) engine.abort(id);
          await Promise.race([Promise.all(running), new Promise((r) => setTimeout(r, 1000))]);
        },
      });
      for (const e of loadEvents) events?.off(e, onLoad);
      events?.off('checksum-payload-sent', onSent);
      events?.off('checksum-payload-not-sent', onNotSent);
      closedResolve();
    })();
    return closeP;
  }

  const port = await listenOn(server, options.port ?? 0, host);
  return { url: urlOf(host, port), port, host, close, closed };
}
