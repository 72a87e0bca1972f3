/**
 * The P/D proxy as an HTTP server (vLLM's disaggregation proxy): clients send completions to it;
 * it routes each through a producer (prefill) and a consumer (decode) engine server with a
 * {@link PDProxy} over {@link EngineClient}s, round robin over several of each.
 *
 * - `POST /v1/completions` and `POST /v1/chat/completions`: the body of the engine API without
 *   `kv_transfer_params` (the proxy sets them); `request_id` (at most 126 characters) or else
 *   `X-Request-Id` names the request, `<id>-p` / `<id>-d` on the engines, and is echoed (default
 *   `pd-<n>-<random>`). Chat prompts are rendered here
 *   (`applyChatTemplate`) and sent to the engines as completions. `stream: true`: the consumer's
 *   chunks are streamed on to the client as they come (the SSE response starts with the first
 *   one, so failures before it keep their HTTP status; later ones are a `data: { error }` event).
 *   `model` must be one the consumers serve (404). Answers the consumer's completion with a `kvconnect` field
 *   `{ mode, prefill: {...}, decode: {...} }`: each side's URL, engine id, request id and the
 *   engine's own `kvconnect` information (checksum verdict on the consumer, payload on the
 *   producer); `prefill.kv_transfer_params` and `decode.kv_transfer_params` are the params each
 *   engine returned (the consumer's carry e.g. the harness fault connector's ground truth), the
 *   producer's without `lease_capability` (for the consumer only). Status codes: 200;
 *   400/413/415 bad input (400 too when an engine
 *   rejects the request, e.g. longer than its max model length); 500 the request ended with `error` (on either side; `error.message`
 *   says which); 502 an engine answered unexpectedly or could not be reached; 503 the consumer is
 *   unreachable (the prefill is not sent: see below) or the proxy is shutting down; 504 an engine
 *   timed out.
 * - A client that disconnects aborts its request on both engines (their servers abort it in their
 *   engines on the closed connection; the producer frees its KV, `requestFinished` with `abort`).
 * - Consumer reachability: a consumer that could not be reached (connection refused or reset, or
 *   `/health` failing) is marked down; while it is, requests for it fail fast with 503 and are not
 *   prefilled on the producer (whose KV would otherwise fill with blocks nobody reads). A request
 *   for a consumer not heard from in `consumerCheckIntervalMs` asks its `/health` first; a down
 *   consumer is asked again at most once per interval and used again once it answers. Round robin
 *   skips down consumers while another is up.
 * - `GET /v1/models`: the consumers' served model names; `GET /version`: `{ version }`;
 * - `GET /health`: asks every engine's `/health` (200 when all answer, else 503).
 * - `GET /metrics`: the proxy's own Prometheus metrics ({@link PROXY_METRIC_NAMES}: requests by
 *   route and status, their latency, requests in flight, requests each engine failed).
 * - `POST /shutdown`: closes the proxy gracefully (the engines keep running).
 * - Access log: one `info` line per HTTP request on `logger` (`requestId`, `method`, `path`,
 *   `status`, `latencyMs`; `component: 'proxy'`).
 * @module
 */
import { randomUUID } from 'node:crypto';
import type { IncomingMessage, Server, ServerResponse } from 'node:http';
import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import { KV_TRANSFER_PARAMS_ERROR, LEASE_CAPABILITY_PARAM } from '@kvconnect/core';
import { PDProxy } from '../proxy.js';
import { EngineClient, EngineClientError, type RemoteGenerateResult } from './engine-client.js';
import {
  DEFAULT_MAX_BODY_BYTES,
  HttpError,
  RouteTable,
  closeGracefully,
  servingRoutes,
  parseCompletionRequest,
  readJson,
  sendJson,
  urlOf,
  type CompletionKind,
  type ResponseExtras,
  ResponseFormat,
  requestIdHeader,
  sseDone,
  sseSend,
  sseStart,
  createJsonHttpServer,
  listenOn,
  replyAndShutdown,
} from './protocol.js';

/** Options of {@link startProxyServer}. */
export interface ProxyServerOptions {
  /** Producer (prefill) engine server URLs (at least one). */
  prefill: readonly string[];
  /** Consumer (decode) engine server URLs (at least one). */
  decode: readonly string[];
  /** `sequential` (NIXL style, default) or `concurrent` (Mooncake style); see {@link PDProxy}. */
  mode?: 'sequential' | 'concurrent';
  /** Interface to listen on (default `127.0.0.1`). */
  host?: string;
  /** Port (default 0: any free port). */
  port?: number;
  /** Deadline of one engine request, in ms (default 120 000). */
  timeoutMs?: number;
  /** How long to wait at start for every engine's `/health` (default 10 000 ms). */
  connectTimeoutMs?: number;
  /** Largest request body in bytes (default 1 MiB). */
  maxBodyBytes?: number;
  /** Largest `max_tokens` (default 4096). */
  maxTokens?: number;
  /** How long {@link ProxyServer.close} waits for running requests (default 5000 ms). */
  gracefulTimeoutMs?: number;
  /**
   * How long an answer from a consumer counts as proof that it is up, and how often a consumer
   * marked down is asked `/health` again, in ms (default 1000; 0 = ask before every request).
   */
  consumerCheckIntervalMs?: number;
  /** Deadline of a consumer `/health` check, in ms (default 2000). */
  consumerCheckTimeoutMs?: number;
  /** Serve `POST /shutdown` (default true). */
  allowShutdown?: boolean;
  /** Called once after `POST /shutdown` closed the server. */
  onShutdown?: () => void | Promise<void>;
  /** Where the access log and warnings go (a pino logger fits; default none). */
  logger?: ProxyLogger;
  /** The registry of the proxy's metrics (default a new one: never prom-client's global registry). */
  metricsRegistry?: Registry;
}

/** What the proxy logs to (a pino logger fits). */
export interface ProxyLogger {
  info(fields: object, msg: string): void;
  warn(fields: object, msg: string): void;
}

/** The proxy's metric names (`GET /metrics`). */
export const PROXY_METRIC_NAMES = Object.freeze({
  requests: 'kvconnect_proxy_requests_total',
  requestSeconds: 'kvconnect_proxy_request_duration_seconds',
  inFlight: 'kvconnect_proxy_requests_in_flight',
  engineFailures: 'kvconnect_proxy_engine_failures_total',
});

/** The proxy's metrics on `registry`. */
function proxyMetrics(registry: Registry) {
  const registers = [registry];
  const N = PROXY_METRIC_NAMES;
  return {
    requests: new Counter({ name: N.requests, help: 'HTTP requests the proxy answered, by route and status code', labelNames: ['route', 'status'], registers }),
    requestSeconds: new Histogram({
      name: N.requestSeconds,
      help: 'Time from a request reaching the proxy to its response ending, seconds',
      labelNames: ['route'],
      buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120],
      registers,
    }),
    inFlight: new Gauge({ name: N.inFlight, help: 'Completions the proxy is routing now', registers }),
    engineFailures: new Counter({ name: N.engineFailures, help: 'Completions an engine failed (unreachable, timed out, error answer), by side and HTTP status answered', labelNames: ['side', 'status'], registers }),
  };
}

/** The `route` label values of the request metrics (every route, `/shutdown` even when it is off; anything else is `other`). */
const ROUTE_LABELS = new Set(['/v1/completions', '/v1/chat/completions', '/v1/models', '/version', '/health', '/metrics', '/shutdown']);

/** A running proxy server. */
export interface ProxyServer {
  readonly url: string;
  readonly port: number;
  readonly host: string;
  readonly mode: 'sequential' | 'concurrent';
  /** The engines, as connected at start (engine ids learned from `/health`). */
  readonly prefill: readonly EngineClient[];
  readonly decode: readonly EngineClient[];
  /** Stops accepting requests, waits for running ones (up to the grace period), closes connections (its engine clients' idle ones too). Idempotent. */
  close(): Promise<void>;
  /** Resolves when the server closed. */
  readonly closed: Promise<void>;
}

async function connectWithRetry(url: string, deadline: number, timeoutMs: number): Promise<EngineClient> {
  for (;;) {
    try {
      return await EngineClient.connect(url, { timeoutMs, controlTimeoutMs: Math.max(100, Math.min(5000, deadline - Date.now())) });
    } catch (e) {
      if (Date.now() >= deadline) throw new Error(`engine ${url} is not reachable: ${e instanceof Error ? e.message : String(e)}`, { cause: e });
      await new Promise((r) => setTimeout(r, 100));
    }
  }
}

/**
 * Whether a consumer is reachable: an answer within `intervalMs` proves it up; otherwise (and at
 * most once per interval while it is down) its `/health` is asked. Requests for a down consumer
 * fail fast (HttpError 503 with `retry-after`).
 */
class Reachability {
  private lastOkAt: number;
  private lastCheckAt = 0;
  /** Why it is down (null: up). */
  private why: string | null = null;
  private checking: Promise<void> | null = null;
  /** Asks `/health` with the check's deadline. */
  private readonly checker: EngineClient;

  constructor(
    readonly client: EngineClient,
    private readonly intervalMs: number,
    checkTimeoutMs: number,
  ) {
    this.lastOkAt = Date.now(); // it answered /health at connect
    this.checker = new EngineClient(client.url, { controlTimeoutMs: checkTimeoutMs });
  }

  get down(): boolean {
    return this.why !== null;
  }

  /** The consumer answered. */
  ok(): void {
    this.lastOkAt = Date.now();
    this.why = null;
  }

  /** The consumer could not be reached. */
  failed(why: string): void {
    this.why = why;
    this.lastCheckAt = Date.now();
  }

  /** Resolves when the consumer is known up. @throws HttpError 503 when it is down. */
  async ensureUp(): Promise<void> {
    const now = Date.now();
    if (this.why === null && now - this.lastOkAt < this.intervalMs) return;
    if (this.why !== null && !this.checking && now - this.lastCheckAt < this.intervalMs) throw this.unreachable();
    this.checking ??= this.check().finally(() => (this.checking = null));
    await this.checking;
    if (this.why !== null) throw this.unreachable();
  }

  /** Drops the checker's idle connection. */
  close(): void {
    this.checker.close();
  }

  private async check(): Promise<void> {
    this.lastCheckAt = Date.now();
    try {
      await this.checker.health();
      this.ok();
    } catch (e) {
      this.failed(e instanceof Error ? e.message : String(e));
    }
  }

  private unreachable(): HttpError {
    const retry = Math.max(1, Math.ceil(this.intervalMs / 1000));
    return new HttpError(503, `consumer ${this.client.url} is unreachable (${this.why}); the request was not sent to the producer`, 'service_unavailable', { 'retry-after': String(retry) });
  }
}

function sideInfo(c: EngineClient, r: RemoteGenerateResult): Record<string, unknown> {
  const info: Record<string, unknown> = { url: c.url, engine_id: c.engineId, ...(r.kvconnect ?? {}) };
  info.request_id = r.requestId;
  info.finish_reason = r.finishReason;
  return info;
}

/**
 * Connects to every engine (waiting up to `connectTimeoutMs` for each `/health`), then starts the
 * proxy's HTTP server (see the module documentation for the API).
 * @throws when an engine is not reachable in time, or the lists are empty.
 */
export async function startProxyServer(options: ProxyServerOptions): Promise<ProxyServer> {
  if (options.prefill.length === 0 || options.decode.length === 0) throw new RangeError('startProxyServer needs at least one prefill and one decode URL');
  const mode = options.mode ?? 'sequential';
  if (mode !== 'sequential' && mode !== 'concurrent') throw new RangeError(`mode must be sequential or concurrent, got ${JSON.stringify(mode)}`);
  const host = options.host ?? '127.0.0.1';
  const timeoutMs = options.timeoutMs ?? 120_000;
  const maxBody = options.maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES;
  const graceMs = options.gracefulTimeoutMs ?? 5000;
  const deadline = Date.now() + (options.connectTimeoutMs ?? 10_000);
  const prefill = await Promise.all(options.prefill.map((u) => connectWithRetry(u, deadline, timeoutMs)));
  const decode = await Promise.all(options.decode.map((u) => connectWithRetry(u, deadline, timeoutMs)));
  const intervalMs = options.consumerCheckIntervalMs ?? 1000;
  const reach = decode.map((c) => new Reachability(c, intervalMs, options.consumerCheckTimeoutMs ?? 2000));
  const proxies = new Map<string, PDProxy>();
  let nextP = 0;
  let nextD = 0;
  const running = new Set<Promise<unknown>>();
  const startedAt = Date.now();
  let seq = 0;
  let closing = false;
  const registry = options.metricsRegistry ?? new Registry();
  const metrics = proxyMetrics(registry);
  const log = options.logger;

  function pick(): { p: EngineClient; d: EngineClient; proxy: PDProxy; reach: Reachability } {
    const pi = nextP++ % prefill.length;
    // Round robin over the consumers not known down (all down: the next one, which fails fast).
    let di = nextD++ % decode.length;
    for (let k = 0; k < decode.length && reach[di].down; k++) di = (di + 1) % decode.length;
    if (reach[di].down) di = (nextD - 1) % decode.length;
    const key = `${pi}:${di}`;
    let proxy = proxies.get(key);
    if (!proxy) {
      proxy = new PDProxy({ prefill: prefill[pi], decode: decode[di], mode });
      proxies.set(key, proxy);
    }
    return { p: prefill[pi], d: decode[di], proxy, reach: reach[di] };
  }

  const servedModels = (): string[] => [...new Set(decode.flatMap((c) => c.models))];

  async function completions(req: IncomingMessage, res: ServerResponse, kind: CompletionKind): Promise<void> {
    if (closing) throw new HttpError(503, 'the proxy is shutting down');
    const headerId = requestIdHeader(req);
    const body = await readJson(req, maxBody);
    const served = servedModels();
    const c = parseCompletionRequest(body, { maxTokens: options.maxTokens, allowKvTransferParams: false, servedModels: served.length > 0 ? served : undefined }, kind);
    if (c.requestId !== undefined && c.requestId.length > 126) throw new HttpError(400, 'request_id: at most 126 characters through the proxy (it appends -p and -d)');
    const { p, d, proxy, reach: dReach } = pick();
    await dReach.ensureUp();
    const sampling = { maxTokens: c.maxTokens, temperature: c.temperature, seed: c.seed, ignoreEos: c.ignoreEos, stopTokenIds: c.stopTokenIds, stop: c.stop };
    const requestId = c.requestId ?? headerId ?? `pd-${seq++}-${randomUUID().slice(0, 8)}`;
    const idHeader = { 'x-request-id': requestId };
    const fmt = new ResponseFormat(kind, requestId, c.model ?? served[0] ?? 'kvconnect-pd');
    // The client going away aborts the request on both engines.
    const gone = new AbortController();
    const onClose = () => {
      if (!res.writableFinished) gone.abort();
    };
    res.on('close', onClose);
    if (req.socket.destroyed) gone.abort();
    // Streaming: the consumer's chunks go on to the client as they come (the SSE response starts
    // with the first one, so an error before it is still an HTTP status).
    let first = true;
    const onDelta = c.stream
      ? (delta: { text: string; tokenIds: number[] }) => {
          if (first) sseStart(res, idHeader);
          sseSend(res, fmt.chunk(delta.text, delta.tokenIds, null, {}, first && kind === 'chat'));
          first = false;
        }
      : undefined;
    res.setHeader('x-request-id', requestId);
    const work = proxy.generate(c.prompt, sampling, { signal: gone.signal, onDelta, requestId });
    const tracked = work.catch(() => {});
    running.add(tracked);
    metrics.inFlight.inc();
    let r;
    try {
      r = await work;
    } catch (e) {
      if (gone.signal.aborted) return; // nobody to answer
      const he = httpErrorOf(e, d, dReach);
      const side = e instanceof EngineClientError ? (e.url === d.url ? 'decode' : 'prefill') : 'proxy';
      metrics.engineFailures.inc({ side, status: String(he.status) });
      log?.warn({ requestId, side, url: e instanceof EngineClientError ? e.url : undefined, status: he.status, err: he.message }, 'engine request failed');
      if (res.headersSent) {
        // Mid-stream: the status is sent; the error goes as an event.
        sseSend(res, { error: { message: he.message, type: he.type, code: he.status } });
        sseDone(res);
        return;
      }
      throw he;
    } finally {
      running.delete(tracked);
      metrics.inFlight.dec();
      res.off('close', onClose);
    }
    if (gone.signal.aborted) return;
    const pr = r.prefill as RemoteGenerateResult;
    const dr = r as unknown as RemoteGenerateResult;
    const prefillInfo = sideInfo(p, pr);
    // The producer's params without their lease capability: it is for the consumer only (`@kvconnect/core` lease-capability.ts).
    if (pr.kvTransferParams !== undefined) {
      const { [LEASE_CAPABILITY_PARAM]: _capability, ...shown } = pr.kvTransferParams;
      prefillInfo.kv_transfer_params = shown;
    }
    const prefillFailed = pr.finishReason === 'error' || pr.finishReason === 'abort';
    const kvconnect: Record<string, unknown> = { mode, prefill: prefillInfo };
    // In sequential mode a failed producer means the consumer was not asked.
    if (!(prefillFailed && mode === 'sequential')) {
      kvconnect.decode = sideInfo(d, dr);
      if (dr.kvTransferParams !== undefined) (kvconnect.decode as Record<string, unknown>).kv_transfer_params = dr.kvTransferParams;
      dReach.ok();
    }
    const promptTokens = dr.usage?.prompt_tokens ?? pr.usage?.prompt_tokens ?? 0;
    const usage = { prompt_tokens: promptTokens, completion_tokens: r.tokenIds.length, total_tokens: promptTokens + r.tokenIds.length };
    const extras: ResponseExtras = { kvconnect };
    let finish = r.finishReason;
    let status = 200;
    const paramsError = dr.kvTransferParams?.[KV_TRANSFER_PARAMS_ERROR];
    if (typeof paramsError === 'string') extras.kv_transfer_params_error = paramsError;
    if (pr.finishReason === 'error' || dr.finishReason === 'error') {
      const side = pr.finishReason === 'error' ? 'prefill' : 'decode';
      const msg = (side === 'prefill' ? pr.error : dr.error) ?? 'the request ended with an error';
      finish = 'error';
      status = 500;
      extras.error = { message: `${side} (${side === 'prefill' ? p.url : d.url}): ${msg}`, type: 'request_error', code: 500 };
    }
    if (c.stream) {
      if (first) sseStart(res, idHeader);
      sseSend(res, fmt.chunk('', [], finish, extras, first && kind === 'chat'));
      if (c.includeUsage) sseSend(res, fmt.usageChunk(usage));
      if (extras.error) sseSend(res, { error: extras.error });
      sseDone(res);
      return;
    }
    sendJson(res, status, fmt.full(r.text, r.tokenIds, finish, usage, extras), idHeader);
  }

  /** The HTTP error a failed engine call answers with (marks the consumer down when it could not be reached). */
  function httpErrorOf(e: unknown, d: EngineClient, dReach: Reachability): HttpError {
    if (e instanceof EngineClientError) {
      if (e.url === d.url && (e.unreachable || e.status === 503)) dReach.failed(e.message);
      if (e.timedOut || e.status === 504) return new HttpError(504, `engine timed out: ${e.message}`, 'timeout_error');
      if (e.status === 400) return new HttpError(400, `engine rejected the request: ${e.message}`);
      if (e.status === 409) return new HttpError(409, `engine refused the request id: ${e.message}`);
      return new HttpError(502, `engine error: ${e.message}`, 'upstream_error');
    }
    return e instanceof HttpError ? e : new HttpError(500, e instanceof Error ? e.message : String(e));
  }

  function models(res: ServerResponse): void {
    const created = Math.floor(startedAt / 1000);
    sendJson(res, 200, { object: 'list', data: servedModels().map((id) => ({ id, object: 'model', created, owned_by: 'kvconnect', root: id, parent: null })) });
  }

  async function health(res: ServerResponse): Promise<void> {
    const check = async (c: EngineClient, r?: Reachability) => {
      try {
        const h = await c.health();
        r?.ok();
        return { url: c.url, engine_id: c.engineId, ok: true, status: h.status };
      } catch (e) {
        const error = e instanceof Error ? e.message : String(e);
        r?.failed(error);
        return { url: c.url, engine_id: c.engineId, ok: false, error };
      }
    };
    const [ps, ds] = await Promise.all([Promise.all(prefill.map((c) => check(c))), Promise.all(decode.map((c, i) => check(c, reach[i])))]);
    const ok = !closing && [...ps, ...ds].every((x) => x.ok);
    sendJson(res, ok ? 200 : 503, { status: closing ? 'shutting-down' : ok ? 'ok' : 'degraded', mode, prefill: ps, decode: ds });
  }

  const routes = new RouteTable(
    servingRoutes({
      completions,
      models,
      health,
      metrics: async (res) => {
        res.writeHead(200, { 'content-type': registry.contentType });
        res.end(await registry.metrics());
      },
      shutdown: options.allowShutdown === false ? undefined : (res) => replyAndShutdown(res, { status: 'shutting-down' }, close, options.onShutdown),
    }),
  );

  /** The route table's `handle` with the access log line and the request metrics, once the response ended (or the client left). */
  async function handleLogged(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const t0 = performance.now();
    const path = (req.url ?? '/').split('?')[0];
    const route = ROUTE_LABELS.has(path) ? path : 'other';
    res.once('close', () => {
      const seconds = (performance.now() - t0) / 1000;
      const status = res.headersSent ? res.statusCode : 499; // 499: the client left before an answer
      metrics.requests.inc({ route, status: String(status) });
      metrics.requestSeconds.observe({ route }, seconds);
      const header = res.getHeader('x-request-id') ?? req.headers['x-request-id'];
      log?.info({ requestId: typeof header === 'string' ? header : null, method: req.method, path, status, latencyMs: Math.round(seconds * 1e4) / 10 }, 'request');
    });
    return routes.handle(req, res);
  }

  const server: Server = createJsonHttpServer(handleLogged);

  let closedResolve!: () => void;
  const closed = new Promise<void>((r) => (closedResolve = r));
  let closeP: Promise<void> | null = null;
  function close(): Promise<void> {
    closeP ??= (async () => {
      closing = true;
      await closeGracefully(server, { running, graceMs });
      for (const c of [...prefill, ...decode]) c.close();
      for (const r of reach) r.close();
      closedResolve();
    })();
    return closeP;
  }

  const port = await listenOn(server, options.port ?? 0, host);
  return { url: urlOf(host, port), port, host, mode, prefill, decode, close, closed };
}
