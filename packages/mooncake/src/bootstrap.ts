/**
 * The bootstrap server (vLLM `MooncakeBootstrapServer`): an HTTP server on the producer that maps
 * an engine id and a worker's TP / PP rank to the worker's side-channel address
 * (`tcp://host:port` of its ZeroMQ ROUTER). Producer workers register; consumer workers query.
 *
 * - `POST /register` with JSON `{engine_id, tp_rank, pp_rank, tp_size, pp_size, addr}` (and an
 *   optional `dp_rank`, ignored, and `owner`, a producer worker's random token): 200
 *   `{"ok":true}`, 400 with `{"error"}` for a bad body. A registration with other TP/PP sizes
 *   than the engine's earlier ones starts the engine's table afresh (the producer restarted with
 *   another layout).
 * - `GET /query?engine_id=ID`: 200 `{engine_id, tp_size, pp_size, complete, workers: {tp: {pp:
 *   addr}}}` (`complete` once every TP x PP worker registered), 404 for an unknown engine.
 *   `GET /query` without an engine id: every engine, `{ID: {...}}`.
 *
 * Authentication (`docs/security.md (Mooncake)`). With a cluster secret (`@kvconnect/transfer`'s
 * `auth.ts`), every request carries the header {@link BOOTSTRAP_AUTH_HEADER}
 * `<ts>.<nonce>.<proof>`: `ts` milliseconds since the epoch (decimal), `nonce` 16 random bytes
 * and `proof` the HMAC of {@link requestProof} (both hex). The server checks the header's form,
 * the freshness of `ts` ({@link BOOTSTRAP_LIMITS}.authWindowMs either way) and that the nonce
 * was not seen in that window before it reads the body, and the proof (which covers a SHA-256 of
 * the body) before it parses the body; a failure is 401. Every answer carries the same header
 * with the proof of {@link responseProof} (bound to the request's nonce), so a client knows it
 * talks to the genuine server. Without a secret the server only listens on loopback
 * (`checkBindHost`), and a registration that would take a slot registered by another `owner` is
 * refused (409): without a secret nobody can prove they are the same producer.
 *
 * Bounds: bodies are limited to {@link BOOTSTRAP_MAX_BODY} bytes while they are read (and
 * answers read by the client to {@link BOOTSTRAP_LIMITS}.answerBytes, also while reading),
 * `tp_size x pp_size` to {@link BOOTSTRAP_LIMITS}.worldSize, engines to
 * {@link BOOTSTRAP_MAX_ENGINES}, registered workers to {@link BOOTSTRAP_LIMITS}.workers; each field
 * is checked; a bad request gets a 4xx (a {@link BootstrapError}), never a crash.
 * @module
 */
import { createHash } from 'node:crypto';
import * as http from 'node:http';
import { HttpError, RouteTable, checkBindHost, checkProof, listenOn, makeNonce, makeProof, readBody } from '@kvconnect/transfer';

/** Limits of the bootstrap server and client. */
export const BOOTSTRAP_LIMITS = Object.freeze({
  /** Largest request body, bytes. */
  bodyBytes: 64 * 1024,
  /** Largest answer the client reads, bytes. */
  answerBytes: 1024 * 1024,
  /** Most engines one server keeps. */
  engines: 256,
  /** Largest `tp_size x pp_size` of one engine. */
  worldSize: 4096,
  /** Most registered workers over all engines. */
  workers: 16_384,
  /** How far a request's timestamp may be from the server's clock, ms. */
  authWindowMs: 30_000,
  /** Most nonces remembered (those of the last `authWindowMs`); more fresh requests get a 503. */
  replayEntries: 65_536,
  /** Longest `owner` token, characters. */
  ownerLength: 128,
});
/** Largest request body, bytes. */
export const BOOTSTRAP_MAX_BODY = BOOTSTRAP_LIMITS.bodyBytes;
/** Most engines one server keeps. */
export const BOOTSTRAP_MAX_ENGINES = BOOTSTRAP_LIMITS.engines;
/** The header of a request's and an answer's proof. */
export const BOOTSTRAP_AUTH_HEADER = 'x-kvconnect-auth';
const MAX_RANKS = BOOTSTRAP_LIMITS.worldSize;
const ADDR_RE = /^tcp:\/\/[A-Za-z0-9.\-_:[\]]{1,250}:\d{1,5}$/;

/** A worker's registration. */
export interface WorkerRegistration {
  engineId: string;
  tpRank: number;
  ppRank: number;
  tpSize: number;
  ppSize: number;
  /** `tcp://host:port` of the worker's ROUTER. */
  addr: string;
  /** A random token of the registering producer worker: without a cluster secret, only it may change its slot. */
  owner?: string;
}

/** What a query says about one engine. */
export interface EngineWorkers {
  engineId: string;
  tpSize: number;
  ppSize: number;
  /** Every TP x PP worker registered. */
  complete: boolean;
  /** `workers[tp][pp]` = addr (missing entries: not registered yet). */
  workers: Array<Array<string | undefined>>;
}

/** A malformed, refused or unauthenticated bootstrap request or answer. */
export class BootstrapError extends Error {
  constructor(
    message: string,
    /** HTTP status (server side: 400 bad body, 401 unauthenticated, 409 conflict, 413 too large, 503 busy), or 0 for a client-side failure. */
    readonly status = 0,
  ) {
    super(message);
    this.name = 'BootstrapError';
  }
}

/** A request or an answer whose proof is missing, stale, replayed or wrong (server: 401). */
export class BootstrapAuthError extends BootstrapError {
  constructor(message: string, status = 0) {
    super(message, status);
    this.name = 'BootstrapAuthError';
  }
}

/** A request over one of {@link BOOTSTRAP_LIMITS} (a size, a count). */
export class BootstrapLimitError extends BootstrapError {
  constructor(message: string, status: number) {
    super(message, status);
    this.name = 'BootstrapLimitError';
  }
}

const sha256 = (b: Uint8Array | string) => createHash('sha256').update(b).digest();

/**
 * The proof of a request: `makeProof(secret, "mooncake-bootstrap/request", method, target, ts,
 * nonce, SHA-256(body))` with `target` the path and query as sent and `ts` in decimal.
 */
export function requestProof(secret: Uint8Array, method: string, target: string, ts: string, nonce: Uint8Array, body: Uint8Array): Buffer {
  return makeProof(secret, 'mooncake-bootstrap/request', method, target, ts, nonce, sha256(body));
}

/** The proof of an answer: `makeProof(secret, "mooncake-bootstrap/response", request nonce, status, SHA-256(body))`. */
export function responseProof(secret: Uint8Array, nonce: Uint8Array, status: number, body: Uint8Array): Buffer {
  return makeProof(secret, 'mooncake-bootstrap/response', nonce, String(status), sha256(body));
}

/** The value of {@link BOOTSTRAP_AUTH_HEADER} for a request. */
export function signRequest(secret: Uint8Array, method: string, target: string, body: Uint8Array, now = Date.now()): { header: string; nonce: Buffer } {
  const nonce = makeNonce();
  const ts = String(now);
  return { header: `${ts}.${nonce.toString('hex')}.${requestProof(secret, method, target, ts, nonce, body).toString('hex')}`, nonce };
}

const AUTH_RE = /^(\d{1,16})\.([0-9a-f]{32})\.([0-9a-f]{64})$/;

const isId = (v: unknown): v is string => typeof v === 'string' && v.length > 0 && v.length <= 1024;
const isRank = (v: unknown, max: number): v is number => typeof v === 'number' && Number.isSafeInteger(v) && v >= 0 && v < max;

/**
 * Validates a registration body (JSON already parsed).
 * @throws BootstrapError (status 400) naming the bad field; BootstrapLimitError (400) for
 *   `tp_size x pp_size` over {@link BOOTSTRAP_LIMITS}.worldSize.
 */
export function parseRegistration(body: unknown): WorkerRegistration {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) throw new BootstrapError('the body must be a JSON object', 400);
  const b = body as Record<string, unknown>;
  if (!isId(b.engine_id)) throw new BootstrapError('engine_id must be a string of 1..1024 characters', 400);
  if (!isRank(b.tp_size, MAX_RANKS + 1) || b.tp_size < 1) throw new BootstrapLimitError(`tp_size must be an integer in 1..${MAX_RANKS}`, 400);
  if (!isRank(b.pp_size, MAX_RANKS + 1) || b.pp_size < 1) throw new BootstrapLimitError(`pp_size must be an integer in 1..${MAX_RANKS}`, 400);
  if (b.tp_size * b.pp_size > MAX_RANKS) throw new BootstrapLimitError(`tp_size x pp_size must be at most ${MAX_RANKS}, got ${b.tp_size * b.pp_size}`, 400);
  if (!isRank(b.tp_rank, b.tp_size)) throw new BootstrapError('tp_rank must be an integer in [0, tp_size)', 400);
  if (!isRank(b.pp_rank, b.pp_size)) throw new BootstrapError('pp_rank must be an integer in [0, pp_size)', 400);
  if (typeof b.addr !== 'string' || !ADDR_RE.test(b.addr)) throw new BootstrapError('addr must look like tcp://host:port', 400);
  const r: WorkerRegistration = { engineId: b.engine_id, tpRank: b.tp_rank, ppRank: b.pp_rank, tpSize: b.tp_size, ppSize: b.pp_size, addr: b.addr };
  if (b.owner !== undefined) {
    if (typeof b.owner !== 'string' || b.owner.length === 0 || b.owner.length > BOOTSTRAP_LIMITS.ownerLength) throw new BootstrapError(`owner must be a string of 1..${BOOTSTRAP_LIMITS.ownerLength} characters`, 400);
    r.owner = b.owner;
  }
  return r;
}

/** An engine's registrations, sparse: slot `tp * ppSize + pp` -> addr and owner (memory follows registrations, not `tp_size x pp_size`). */
interface EngineTable {
  engineId: string;
  tpSize: number;
  ppSize: number;
  slots: Map<number, { addr: string; owner: string | undefined }>;
}

function toJson(e: EngineTable): Record<string, unknown> {
  const workers: Record<string, Record<string, string>> = {};
  for (const [k, v] of e.slots) (workers[Math.floor(k / e.ppSize)] ??= {})[k % e.ppSize] = v.addr;
  return { engine_id: e.engineId, tp_size: e.tpSize, pp_size: e.ppSize, complete: e.slots.size === e.tpSize * e.ppSize, workers };
}

/**
 * Validates a query answer for one engine (untrusted JSON).
 * @throws BootstrapError naming the bad field.
 */
export function parseEngineWorkers(body: unknown, engineId: string): EngineWorkers {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) throw new BootstrapError('the answer must be a JSON object');
  const b = body as Record<string, unknown>;
  if (b.engine_id !== engineId) throw new BootstrapError(`the answer is for engine ${JSON.stringify(b.engine_id)}, not ${JSON.stringify(engineId)}`);
  if (!isRank(b.tp_size, MAX_RANKS + 1) || b.tp_size < 1 || !isRank(b.pp_size, MAX_RANKS + 1) || b.pp_size < 1 || b.tp_size * b.pp_size > MAX_RANKS) throw new BootstrapError('bad tp_size / pp_size');
  const tpSize = b.tp_size;
  const ppSize = b.pp_size;
  const workers: Array<Array<string | undefined>> = Array.from({ length: tpSize }, () => new Array<string | undefined>(ppSize).fill(undefined));
  if (typeof b.workers !== 'object' || b.workers === null || Array.isArray(b.workers)) throw new BootstrapError('workers must be an object');
  let n = 0;
  for (const [tpKey, row] of Object.entries(b.workers as Record<string, unknown>)) {
    const tp = Number(tpKey);
    if (!isRank(tp, tpSize) || String(tp) !== tpKey) throw new BootstrapError(`bad tp rank ${JSON.stringify(tpKey)}`);
    if (typeof row !== 'object' || row === null || Array.isArray(row)) throw new BootstrapError(`workers[${tpKey}] must be an object`);
    for (const [ppKey, addr] of Object.entries(row as Record<string, unknown>)) {
      const pp = Number(ppKey);
      if (!isRank(pp, ppSize) || String(pp) !== ppKey) throw new BootstrapError(`bad pp rank ${JSON.stringify(ppKey)}`);
      if (typeof addr !== 'string' || !ADDR_RE.test(addr)) throw new BootstrapError(`workers[${tpKey}][${ppKey}] must look like tcp://host:port`);
      workers[tp][pp] = addr;
      n++;
    }
  }
  return { engineId, tpSize, ppSize, complete: n === tpSize * ppSize, workers };
}

/** Options of {@link BootstrapServer.start}. */
export interface BootstrapServerOptions {
  /** Default `127.0.0.1` (vLLM listens on every interface); a non-loopback host needs `secret`. */
  host?: string;
  /** Default 8998 (vLLM's `VLLM_MOONCAKE_BOOTSTRAP_PORT`); 0 = any free port. */
  port?: number;
  /** The cluster secret (`resolveClusterSecret`): every request and answer is then proven. */
  secret?: Uint8Array | null;
}

/** The bootstrap HTTP server. Start with {@link BootstrapServer.start}. */
export class BootstrapServer {
  private readonly engines = new Map<string, EngineTable>();
  /** Registered workers over all engines. */
  private workerCount = 0;
  /** Nonces of proven requests -> when they leave the freshness window (ms). Insertion order = time order. */
  private readonly seen = new Map<string, number>();
  /** Requests answered with a 4xx or 5xx. */
  rejected = 0;

  private constructor(
    private readonly server: http.Server,
    /** `host:port` consumers query. */
    readonly address: string,
    private readonly secret: Uint8Array | null,
  ) {}

  /**
   * Listens on `host:port`.
   * @throws ClusterSecretError for a non-loopback host without a secret; the listen error (e.g. the port is taken).
   */
  static async start(o: BootstrapServerOptions = {}): Promise<BootstrapServer> {
    const secret = o.secret ?? null;
    const host = checkBindHost(o.host, secret, 'Mooncake bootstrap server');
    let self: BootstrapServer | null = null;
    const server = http.createServer({ maxHeaderSize: 8192 }, (req, res) => self!.handle(req, res));
    server.headersTimeout = 10_000;
    server.requestTimeout = 10_000;
    server.keepAliveTimeout = 5_000;
    server.maxConnections = 1024;
    const port = await listenOn(server, o.port ?? 8998, host);
    const shown = host === '0.0.0.0' || host === '::' ? '127.0.0.1' : host;
    self = new BootstrapServer(server, `${shown.includes(':') ? `[${shown}]` : shown}:${port}`, secret);
    return self;
  }

  /**
   * Registers a worker. Called directly (the server's own process), the registration is trusted;
   * over HTTP it is `proven` when the server has a cluster secret (the request's proof was checked).
   * @throws BootstrapError 409 when an unproven registration would take or reset a slot of
   *   another owner; BootstrapLimitError 409 / 503 over the engine / worker limits.
   */
  register(r: WorkerRegistration, proven = true): void {
    let e = this.engines.get(r.engineId);
    const relayout = e !== undefined && (e.tpSize !== r.tpSize || e.ppSize !== r.ppSize);
    const slot = r.tpRank * r.ppSize + r.ppRank;
    if (e && !proven) {
      const other = relayout ? [...e.slots.values()].some((v) => v.owner !== r.owner) : e.slots.has(slot) && e.slots.get(slot)!.owner !== r.owner;
      if (other) throw new BootstrapError(`engine ${JSON.stringify(r.engineId)} (TP ${r.tpRank}, PP ${r.ppRank}) is registered by another producer; without a cluster secret it cannot be taken over (set cluster_secret or KVCONNECT_CLUSTER_SECRET)`, 409);
    }
    if (e && relayout) {
      this.workerCount -= e.slots.size;
      this.engines.delete(r.engineId);
      e = undefined;
    }
    if (!e) {
      if (this.engines.size >= BOOTSTRAP_MAX_ENGINES) throw new BootstrapLimitError(`more than ${BOOTSTRAP_MAX_ENGINES} engines`, 409);
      e = { engineId: r.engineId, tpSize: r.tpSize, ppSize: r.ppSize, slots: new Map() };
      this.engines.set(r.engineId, e);
    }
    if (!e.slots.has(slot)) {
      if (this.workerCount >= BOOTSTRAP_LIMITS.workers) throw new BootstrapLimitError(`more than ${BOOTSTRAP_LIMITS.workers} registered workers`, 503);
      this.workerCount++;
    }
    e.slots.set(slot, { addr: r.addr, owner: r.owner });
  }

  /** The workers of `engineId`, or undefined. */
  lookup(engineId: string): EngineWorkers | undefined {
    const e = this.engines.get(engineId);
    return e && parseEngineWorkers(toJson(e), engineId);
  }

  /** Engines and registered workers kept (tests, diagnostics). */
  get counts(): { engines: number; workers: number } {
    return { engines: this.engines.size, workers: this.workerCount };
  }

  /** Nonces remembered for replay detection (tests, diagnostics). */
  get replayCacheSize(): number {
    return this.seen.size;
  }

  private reply(res: http.ServerResponse, status: number, body: unknown, nonce: Buffer | null): void {
    if (status >= 400) this.rejected++;
    const text = Buffer.from(JSON.stringify(body), 'utf8');
    const headers: http.OutgoingHttpHeaders = { 'content-type': 'application/json', 'content-length': text.byteLength };
    if (this.secret && nonce) headers[BOOTSTRAP_AUTH_HEADER] = responseProof(this.secret, nonce, status, text).toString('hex');
    if (status === 413 || status === 401) headers.connection = 'close';
    res.writeHead(status, headers);
    res.end(text);
  }

  /** Forgets nonces that left the freshness window (they are in time order). */
  private pruneSeen(now: number): void {
    for (const [k, until] of this.seen) {
      if (until > now) break;
      this.seen.delete(k);
    }
  }

  /** The routes, each answering a request {@link handle} read and proved: `(res, url, body, nonce)`. */
  private readonly routes = new RouteTable<(res: http.ServerResponse, url: URL, body: Buffer, nonce: Buffer | null) => void>({
    '/query': { GET: (res, url, _body, nonce) => this.answerQuery(res, url, nonce) },
    '/register': { POST: (res, _url, body, nonce) => this.answerRegister(res, body, nonce) },
  });

  private handle(req: http.IncomingMessage, res: http.ServerResponse): void {
    req.on('error', () => {});
    const target = req.url ?? '/';
    const route = this.routes.match(req);
    const isRegister = 'handler' in route && req.method === 'POST';
    // 1. The proof's header, before anything is read.
    let nonce: Buffer | null = null;
    let ts = '';
    let proof: Buffer | null = null;
    if (this.secret) {
      const h = req.headers[BOOTSTRAP_AUTH_HEADER];
      const m = typeof h === 'string' ? AUTH_RE.exec(h) : null;
      if (!m) return this.refuse(req, res, 401, `missing or malformed ${BOOTSTRAP_AUTH_HEADER} header (this bootstrap server requires the cluster secret)`, null);
      ts = m[1];
      nonce = Buffer.from(m[2], 'hex');
      proof = Buffer.from(m[3], 'hex');
      const now = Date.now();
      if (Math.abs(now - Number(ts)) > BOOTSTRAP_LIMITS.authWindowMs) return this.refuse(req, res, 401, `stale request (timestamp ${ts}, server clock ${now}, window ${BOOTSTRAP_LIMITS.authWindowMs} ms)`, nonce);
      this.pruneSeen(now);
      if (this.seen.has(m[2])) return this.refuse(req, res, 401, 'replayed request (nonce already seen)', nonce);
      if (this.seen.size >= BOOTSTRAP_LIMITS.replayEntries) return this.refuse(req, res, 503, 'too many requests in the freshness window', nonce);
      // Remembered now, before the body is read: the same signed request on a second connection
      // while the first one's body is still arriving is a replay too.
      this.seen.set(m[2], Number(ts) + BOOTSTRAP_LIMITS.authWindowMs);
    }
    if ('error' in route && !this.secret) return this.refuse(req, res, 404, 'not found (POST /register, GET /query)', nonce);
    // 2. The body, bounded while it is read (a 413 as soon as it passes the limit).
    const limit = isRegister ? BOOTSTRAP_MAX_BODY : 0;
    readBody(req, limit).then(
      (raw) => {
        // 3. The proof, before the body is parsed.
        if (this.secret) {
          if (!checkProof(proof, this.secret, 'mooncake-bootstrap/request', req.method ?? '', target, ts, nonce!, sha256(raw))) {
            this.seen.delete(nonce!.toString('hex')); // unproven requests hold no replay-cache entry past their body
            return this.reply(res, 401, { error: 'wrong proof (another cluster secret?)' }, nonce);
          }
        }
        if ('error' in route) return this.reply(res, 404, { error: 'not found (POST /register, GET /query)' }, nonce);
        route.handler(res, route.url, raw, nonce);
      },
      (e: unknown) => {
        if (!(e instanceof HttpError) || e.status !== 413) return; // the client went away mid-body: nobody to answer
        if (nonce) this.seen.delete(nonce.toString('hex'));
        this.refuse(req, res, 413, `body over ${limit} bytes`, nonce);
      },
    );
  }

  private answerRegister(res: http.ServerResponse, raw: Buffer, nonce: Buffer | null): void {
    try {
      const r = parseRegistration(JSON.parse(raw.toString('utf8')));
      this.register(r, this.secret !== null);
      this.reply(res, 200, { ok: true }, nonce);
    } catch (e) {
      this.reply(res, e instanceof BootstrapError && e.status ? e.status : 400, { error: e instanceof Error ? e.message : String(e) }, nonce);
    }
  }

  private answerQuery(res: http.ServerResponse, url: URL, nonce: Buffer | null): void {
    const id = url.searchParams.get('engine_id');
    if (id === null) {
      const all: Record<string, unknown> = {};
      for (const [k, e] of this.engines) all[k] = toJson(e);
      return this.reply(res, 200, all, nonce);
    }
    const e = this.engines.get(id);
    if (!e) this.reply(res, 404, { error: `unknown engine ${JSON.stringify(id)}` }, nonce);
    else this.reply(res, 200, toJson(e), nonce);
  }

  /** Answers without reading the body, and drops the connection (the body is not wanted). */
  private refuse(req: http.IncomingMessage, res: http.ServerResponse, status: number, error: string, nonce: Buffer | null): void {
    this.reply(res, status, { error }, nonce);
    req.resume();
    res.on('finish', () => req.destroy());
  }

  /** Stops listening and closes open connections. */
  async close(): Promise<void> {
    this.server.closeAllConnections?.();
    await new Promise<void>((r) => this.server.close(() => r()));
  }
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

function baseUrl(addr: string): string {
  return addr.startsWith('http://') || addr.startsWith('https://') ? addr.replace(/\/+$/, '') : `http://${addr}`;
}

/**
 * Reads an answer's body, refusing it as soon as it passes `limit` bytes (the declared length is
 * checked first; the stream is cancelled on overflow).
 * @throws BootstrapLimitError over the limit.
 */
async function readLimited(res: Response, limit: number = BOOTSTRAP_LIMITS.answerBytes): Promise<Buffer> {
  const declared = Number(res.headers.get('content-length') ?? 0);
  if (declared > limit) {
    await res.body?.cancel().catch(() => {});
    throw new BootstrapLimitError(`answer of ${declared} bytes over ${limit}`, 0);
  }
  const chunks: Uint8Array[] = [];
  let size = 0;
  if (!res.body) return Buffer.alloc(0);
  const reader = res.body.getReader();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    size += value.byteLength;
    if (size > limit) {
      await reader.cancel().catch(() => {});
      throw new BootstrapLimitError(`answer over ${limit} bytes`, 0);
    }
    chunks.push(value);
  }
  return Buffer.concat(chunks);
}

/**
 * One request to the bootstrap server at `addr`, proven with `secret` when given; the answer's
 * proof is checked then.
 * @throws BootstrapAuthError for an answer without a valid proof; BootstrapLimitError for an
 *   answer over the limit; the fetch error.
 */
async function call(addr: string, method: 'GET' | 'POST', target: string, body: string | null, secret: Uint8Array | null, timeoutMs: number): Promise<{ status: number; text: string }> {
  const bytes = Buffer.from(body ?? '', 'utf8');
  const headers: Record<string, string> = {};
  if (body !== null) headers['content-type'] = 'application/json';
  let nonce: Buffer | null = null;
  if (secret) {
    const s = signRequest(secret, method, target, bytes);
    headers[BOOTSTRAP_AUTH_HEADER] = s.header;
    nonce = s.nonce;
  }
  const res = await fetch(`${baseUrl(addr)}${target}`, { method, headers, body: body === null ? undefined : bytes, signal: AbortSignal.timeout(timeoutMs) });
  const raw = await readLimited(res);
  if (secret && nonce) {
    const h = res.headers.get(BOOTSTRAP_AUTH_HEADER);
    const proof = h && /^[0-9a-f]{64}$/.test(h) ? Buffer.from(h, 'hex') : null;
    if (!proof || !checkProof(proof, secret, 'mooncake-bootstrap/response', nonce, String(res.status), sha256(raw))) {
      throw new BootstrapAuthError(`bootstrap ${addr}: the answer (HTTP ${res.status}) carries no valid proof: not the genuine bootstrap server, or another cluster secret`);
    }
  }
  return { status: res.status, text: raw.toString('utf8') };
}

/** Options of the bootstrap client calls. */
export interface BootstrapClientOptions {
  /** The cluster secret: requests are proven and answers checked. */
  secret?: Uint8Array | null;
}

/** The wire body of a registration (`POST /register`, and a worker's handshake metadata), as {@link parseRegistration} reads it. */
export function registrationBody(r: WorkerRegistration): Record<string, string | number> {
  return { engine_id: r.engineId, tp_rank: r.tpRank, pp_rank: r.ppRank, tp_size: r.tpSize, pp_size: r.ppSize, addr: r.addr, ...(r.owner !== undefined ? { owner: r.owner } : {}) };
}

/**
 * Registers a worker at the bootstrap server `addr` (`host:port`), retrying with backoff (3
 * attempts, vLLM's behaviour).
 * @throws BootstrapError after the last attempt (a 4xx or an answer without a valid proof ends the attempts).
 */
export async function registerWorker(addr: string, r: WorkerRegistration, o: BootstrapClientOptions & { timeoutMs?: number; attempts?: number } = {}): Promise<void> {
  const attempts = o.attempts ?? 3;
  let last: unknown;
  const body = JSON.stringify(registrationBody(r));
  for (let i = 0; i < attempts; i++) {
    try {
      const res = await call(addr, 'POST', '/register', body, o.secret ?? null, o.timeoutMs ?? 5000);
      if (res.status >= 200 && res.status < 300) return;
      last = new BootstrapError(`register at ${addr}: HTTP ${res.status} ${res.text.slice(0, 200)}`, res.status);
      if (res.status >= 400 && res.status < 500) break;
    } catch (e) {
      last = e;
      if (e instanceof BootstrapError) break;
    }
    await sleep(Math.min(10_000, 100 * 2 ** i));
  }
  throw last instanceof BootstrapError ? last : new BootstrapError(`register at ${addr} failed: ${last instanceof Error ? last.message : String(last)}`);
}

/**
 * Queries the bootstrap server `addr` for `engineId`'s workers, polling until every worker
 * registered or `deadlineMs` passed.
 * @throws BootstrapError at the deadline (with the last problem) or for a malformed answer;
 *   BootstrapAuthError for an answer without a valid proof.
 */
export async function queryEngine(addr: string, engineId: string, o: BootstrapClientOptions & { deadlineMs?: number; pollMs?: number } = {}): Promise<EngineWorkers> {
  const end = Date.now() + (o.deadlineMs ?? 30_000);
  let last = 'no answer';
  for (;;) {
    const left = end - Date.now();
    try {
      const res = await call(addr, 'GET', `/query?engine_id=${encodeURIComponent(engineId)}`, null, o.secret ?? null, Math.max(100, Math.min(5000, left)));
      if (res.status === 200) {
        let body: unknown;
        try {
          body = JSON.parse(res.text);
        } catch {
          throw new BootstrapError(`query at ${addr}: the answer is not JSON`);
        }
        const e = parseEngineWorkers(body, engineId);
        if (e.complete) return e;
        last = `engine ${engineId}: ${e.workers.flat().filter((a) => a !== undefined).length} of ${e.tpSize * e.ppSize} workers registered`;
      } else {
        last = `HTTP ${res.status} ${res.text.slice(0, 200)}`;
      }
    } catch (e) {
      if (e instanceof BootstrapError) throw e;
      last = e instanceof Error ? e.message : String(e);
    }
    if (Date.now() >= end) throw new BootstrapError(`bootstrap ${addr}: engine ${engineId} not available: ${last}`);
    await sleep(Math.min(o.pollMs ?? 50, Math.max(1, end - Date.now())));
  }
}
