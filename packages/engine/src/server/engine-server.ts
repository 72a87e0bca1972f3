/**
 * An HTTP server in front of one {@link Engine}: the OpenAI-style API a P/D proxy (or any client)
 * talks to, as vLLM's `vllm serve` offers it.
 *
 * - `POST /v1/completions`: see {@link parseCompletionRequest} for the body; answers a
 *   {@link CompletionResponse} with `kv_transfer_params` (producer side) and a `kvconnect` field
 *   ({@link KVConnectInfo}: engine and request ids, preemptions, the checksum verdict of a KV load,
 *   the checksum payload a producer sent). Status codes: 200; 400 bad input (the message lists
 *   every problem); 409 a `request_id` in use; 413 body too large; 415 not JSON; 500 the request
 *   ended with `error` (the body holds the partial completion and `error.message`) or the engine
 *   failed; 503 shutting down or engine setup failed; 504 the request ran past its timeout (it is
 *   aborted in the engine). A client that disconnects aborts its request.
 * - `GET /health`: `{ status: 'ok', engine_id, model, ... }` (503 while setup failed, after a worker process died, or closing);
 * - `GET /metrics`: the engine's Prometheus registry (KV checksum metrics) in text format;
 * - `POST /shutdown`: answers `{ status: 'shutting-down' }`, then closes gracefully (see
 *   {@link EngineServerOptions.onShutdown}).
 * @module
 */
import type { IncomingMessage, Server, ServerResponse } from 'node:http';
import type { LoadEvent, NotSentReason, PayloadSentEvent } from '@kvconnect/core';
import type { Engine, GenerateResult } from '../engine.js';
import {
  DEFAULT_MAX_BODY_BYTES,
  HttpError,
  findStop,
  methodNotAllowed,
  parseCompletionRequest,
  readJson,
  sendError,
  sendJson,
  sendText,
  singleByteStops,
  urlOf,
  type CompletionRequest,
  type CompletionResponse,
  type KVConnectInfo,
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

  async function completions(req: IncomingMessage, res: ServerResponse): Promise<void> {
    if (closing) throw new HttpError(503, 'the engine server is shutting down');
    const body = await readJson(req, maxBody);
    const c: CompletionRequest = parseCompletionRequest(body, { vocabSize: engine.model.vocabSize, maxTokens: options.maxTokens });
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
    const requestId = c.requestId ?? `${engine.engineId}-cmpl-${seq++}-${Date.now().toString(36)}`;
    if (inflight.has(requestId) || engine.scheduler.requests.has(requestId)) throw new HttpError(409, `request_id ${JSON.stringify(requestId)} is in use`);
    const stopIds = [...c.stopTokenIds];
    for (const id of singleByteStops(c.stop)) if (!stopIds.includes(id)) stopIds.push(id);
    const sampling = { maxTokens: c.maxTokens, temperature: c.temperature, seed: c.seed, ignoreEos: c.ignoreEos, stopTokenIds: stopIds };

    const info: KVConnectInfo = { engine_id: engine.engineId, request_id: requestId, num_preemptions: 0 };
    const gen = engine.generate(promptIds, sampling, c.kvTransferParams, requestId);
    const entry: InFlight = { info, done: gen.catch(() => {}) };
    inflight.set(requestId, entry);
    let timedOut = false;
    const timer =
      timeoutMs > 0
        ? setTimeout(() => {
            timedOut = true;
            engine.abort(requestId);
            sendError(res, new HttpError(504, `request ${requestId} ran past ${timeoutMs} ms and was aborted`, 'timeout_error'));
          }, timeoutMs)
        : null;
    // A client that goes away aborts its request.
    const onClose = () => {
      if (!res.writableFinished) engine.abort(requestId);
    };
    res.on('close', onClose);
    if (req.socket.destroyed) onClose(); // it went away before the request was queued
    let r: GenerateResult;
    try {
      r = await gen;
    } catch (e) {
      throw new HttpError(500, `engine failed: ${e instanceof Error ? e.message : String(e)}`);
    } finally {
      if (timer) clearTimeout(timer);
      res.off('close', onClose);
      inflight.delete(requestId);
    }
    if (timedOut) return;

    let tokenIds = r.tokenIds;
    let text = r.text;
    let finish = r.finishReason;
    if (c.stop.length > 0 && (finish === 'stop' || finish === 'length')) {
      const cut = findStop(tokenIds, c.stop);
      if (cut >= 0) {
        tokenIds = tokenIds.slice(0, cut);
        text = engine.tokenizer.decode(tokenIds);
        finish = 'stop';
      }
    }
    info.num_preemptions = r.numPreemptions;
    if (r.error !== undefined) info.error = r.error;
    const out: CompletionResponse = {
      id: `cmpl-${requestId}`,
      object: 'text_completion',
      created: Math.floor(Date.now() / 1000),
      model: engine.model.name,
      choices: [{ index: 0, text, token_ids: tokenIds, finish_reason: finish, logprobs: null }],
      usage: { prompt_tokens: promptIds.length, completion_tokens: tokenIds.length, total_tokens: promptIds.length + tokenIds.length },
    };
    if (r.kvTransferParams !== undefined) out.kv_transfer_params = r.kvTransferParams;
    out.kvconnect = { ...info };
    if (finish === 'error') {
      out.error = { message: r.error ?? 'the request ended with an error', type: 'request_error', code: 500 };
      sendJson(res, 500, out);
      return;
    }
    sendJson(res, 200, out);
  }

  function health(res: ServerResponse): void {
    const base = { engine_id: engine.engineId, model: engine.model.name, tp_size: engine.tpSize, pp_size: engine.ppSize, block_size: engine.blockSize };
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
    const reg = engine.observability?.registry;
    const text = await engine.metricsText();
    sendText(res, 200, text, reg?.contentType ?? 'text/plain; version=0.0.4; charset=utf-8');
  }

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const path = (req.url ?? '/').split('?')[0];
    const method = req.method ?? 'GET';
    switch (path) {
      case '/v1/completions':
        if (method !== 'POST') throw methodNotAllowed('POST');
        return completions(req, res);
      case '/health':
        if (method !== 'GET' && method !== 'HEAD') throw methodNotAllowed('GET');
        return health(res);
      case '/metrics':
        if (method !== 'GET' && method !== 'HEAD') throw methodNotAllowed('GET');
        return metrics(res);
      case '/shutdown':
        if (options.allowShutdown === false) throw new HttpError(404, `no route ${path}`, 'not_found_error');
        if (method !== 'POST') throw methodNotAllowed('POST');
        replyAndShutdown(res, { status: 'shutting-down', engine_id: engine.engineId }, close, options.onShutdown);
        return;
      default:
        throw new HttpError(404, `no route ${method} ${path}`, 'not_found_error');
    }
  }

  const server: Server = createJsonHttpServer(handle);

  let closedResolve!: () => void;
  const closed = new Promise<void>((r) => (closedResolve = r));
  let closeP: Promise<void> | null = null;
  function close(): Promise<void> {
    closeP ??= (async () => {
      closing = true;
      const serverClosed = new Promise<void>((r) => server.close(() => r()));
      server.closeIdleConnections();
      const running = [...inflight.values()].map((f) => f.done);
      if (running.length > 0) {
        let t: NodeJS.Timeout | undefined;
        const grace = new Promise<'timeout'>((r) => (t = setTimeout(() => r('timeout'), graceMs)));
        const which = await Promise.race([Promise.all(running).then(() => 'done' as const), grace]);
        clearTimeout(t);
        if (which === 'timeout') {
          for (const id of inflight.keys()) engine.abort(id);
          await Promise.race([Promise.all(running), new Promise((r) => setTimeout(r, 1000))]);
        }
      }
      // Let the last responses flush, then drop whatever connection is left.
      await new Promise((r) => setImmediate(r));
      server.closeAllConnections();
      await serverClosed;
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
