/**
 * The bootstrap server (vLLM `MooncakeBootstrapServer`): an HTTP server on the producer that maps
 * an engine id and a worker's TP / PP rank to the worker's side-channel address
 * (`tcp://host:port` of its ZeroMQ ROUTER). Producer workers register; consumer workers query.
 *
 * - `POST /register` with JSON `{engine_id, tp_rank, pp_rank, tp_size, pp_size, addr}` (and an
 *   optional `dp_rank`, ignored): 200 `{"ok":true}`, 400 with `{"error"}` for a bad body. A
 *   registration with other TP/PP sizes than the engine's earlier ones starts the engine's table
 *   afresh (the producer restarted with another layout).
 * - `GET /query?engine_id=ID`: 200 `{engine_id, tp_size, pp_size, complete, workers: {tp: {pp:
 *   addr}}}` (`complete` once every TP x PP worker registered), 404 for an unknown engine.
 *   `GET /query` without an engine id: every engine, `{ID: {...}}`.
 *
 * Bodies are limited to {@link BOOTSTRAP_MAX_BODY} bytes and checked field by field; a bad request
 * gets a 4xx, never a crash.
 * @module
 */
import * as http from 'node:http';
import type { AddressInfo } from 'node:net';

/** Largest request or response body, bytes. */
export const BOOTSTRAP_MAX_BODY = 64 * 1024;
/** Most engines one server keeps. */
export const BOOTSTRAP_MAX_ENGINES = 1024;
const MAX_RANKS = 4096;
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

/** A malformed bootstrap request or answer. */
export class BootstrapError extends Error {
  constructor(
    message: string,
    /** HTTP status (server side), or 0 for a client-side failure. */
    readonly status = 0,
  ) {
    super(message);
    this.name = 'BootstrapError';
  }
}

const isId = (v: unknown): v is string => typeof v === 'string' && v.length > 0 && v.length <= 1024;
const isRank = (v: unknown, max: number): v is number => typeof v === 'number' && Number.isSafeInteger(v) && v >= 0 && v < max;

/**
 * Validates a registration body (JSON already parsed).
 * @throws BootstrapError (status 400) naming the bad field.
 */
export function parseRegistration(body: unknown): WorkerRegistration {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) throw new BootstrapError('the body must be a JSON object', 400);
  const b = body as Record<string, unknown>;
  if (!isId(b.engine_id)) throw new BootstrapError('engine_id must be a string of 1..1024 characters', 400);
  if (!isRank(b.tp_size, MAX_RANKS + 1) || b.tp_size < 1) throw new BootstrapError(`tp_size must be an integer in 1..${MAX_RANKS}`, 400);
  if (!isRank(b.pp_size, MAX_RANKS + 1) || b.pp_size < 1) throw new BootstrapError(`pp_size must be an integer in 1..${MAX_RANKS}`, 400);
  if (!isRank(b.tp_rank, b.tp_size)) throw new BootstrapError('tp_rank must be an integer in [0, tp_size)', 400);
  if (!isRank(b.pp_rank, b.pp_size)) throw new BootstrapError('pp_rank must be an integer in [0, pp_size)', 400);
  if (typeof b.addr !== 'string' || !ADDR_RE.test(b.addr)) throw new BootstrapError('addr must look like tcp://host:port', 400);
  return { engineId: b.engine_id, tpRank: b.tp_rank, ppRank: b.pp_rank, tpSize: b.tp_size, ppSize: b.pp_size, addr: b.addr };
}

function toJson(e: EngineWorkers): Record<string, unknown> {
  const workers: Record<string, Record<string, string>> = {};
  e.workers.forEach((row, tp) =>
    row.forEach((a, pp) => {
      if (a !== undefined) (workers[tp] ??= {})[pp] = a;
    }),
  );
  return { engine_id: e.engineId, tp_size: e.tpSize, pp_size: e.ppSize, complete: e.complete, workers };
}

/**
 * Validates a query answer for one engine (untrusted JSON).
 * @throws BootstrapError naming the bad field.
 */
export function parseEngineWorkers(body: unknown, engineId: string): EngineWorkers {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) throw new BootstrapError('the answer must be a JSON object');
  const b = body as Record<string, unknown>;
  if (b.engine_id !== engineId) throw new BootstrapError(`the answer is for engine ${JSON.stringify(b.engine_id)}, not ${JSON.stringify(engineId)}`);
  if (!isRank(b.tp_size, MAX_RANKS + 1) || b.tp_size < 1 || !isRank(b.pp_size, MAX_RANKS + 1) || b.pp_size < 1) throw new BootstrapError('bad tp_size / pp_size');
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
  /** Default `127.0.0.1` (vLLM listens on every interface; say `0.0.0.0` for that). */
  host?: string;
  /** Default 8998 (vLLM's `VLLM_MOONCAKE_BOOTSTRAP_PORT`); 0 = any free port. */
  port?: number;
}

/** The bootstrap HTTP server. Start with {@link BootstrapServer.start}. */
export class BootstrapServer {
  private readonly engines = new Map<string, EngineWorkers>();
  /** Requests answered with a 4xx. */
  rejected = 0;

  private constructor(
    private readonly server: http.Server,
    /** `host:port` consumers query. */
    readonly address: string,
  ) {}

  /**
   * Listens on `host:port`.
   * @throws the listen error (e.g. the port is taken).
   */
  static async start(o: BootstrapServerOptions = {}): Promise<BootstrapServer> {
    const host = o.host ?? '127.0.0.1';
    let self: BootstrapServer | null = null;
    const server = http.createServer((req, res) => self!.handle(req, res));
    server.headersTimeout = 10_000;
    server.requestTimeout = 10_000;
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen({ host, port: o.port ?? 8998 }, () => resolve());
    });
    const a = server.address() as AddressInfo;
    const shown = host === '0.0.0.0' || host === '::' ? '127.0.0.1' : host;
    self = new BootstrapServer(server, `${shown.includes(':') ? `[${shown}]` : shown}:${a.port}`);
    return self;
  }

  /** Registers a worker directly (the server's own process). */
  register(r: WorkerRegistration): void {
    let e = this.engines.get(r.engineId);
    if (e && (e.tpSize !== r.tpSize || e.ppSize !== r.ppSize)) e = undefined;
    if (!e) {
      if (!this.engines.has(r.engineId) && this.engines.size >= BOOTSTRAP_MAX_ENGINES) throw new BootstrapError(`more than ${BOOTSTRAP_MAX_ENGINES} engines`, 409);
      e = { engineId: r.engineId, tpSize: r.tpSize, ppSize: r.ppSize, complete: false, workers: Array.from({ length: r.tpSize }, () => new Array<string | undefined>(r.ppSize).fill(undefined)) };
      this.engines.set(r.engineId, e);
    }
    e.workers[r.tpRank][r.ppRank] = r.addr;
    e.complete = e.workers.every((row) => row.every((a) => a !== undefined));
  }

  /** The workers of `engineId`, or undefined. */
  lookup(engineId: string): EngineWorkers | undefined {
    return this.engines.get(engineId);
  }

  private reply(res: http.ServerResponse, status: number, body: unknown): void {
    if (status >= 400) this.rejected++;
    const text = JSON.stringify(body);
    res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
    res.end(text);
  }

  private handle(req: http.IncomingMessage, res: http.ServerResponse): void {
    const url = new URL(req.url ?? '/', 'http://bootstrap');
    if (req.method === 'GET' && url.pathname === '/query') {
      const id = url.searchParams.get('engine_id');
      if (id === null) {
        const all: Record<string, unknown> = {};
        for (const [k, e] of this.engines) all[k] = toJson(e);
        this.reply(res, 200, all);
        return;
      }
      const e = this.engines.get(id);
      if (!e) this.reply(res, 404, { error: `unknown engine ${JSON.stringify(id)}` });
      else this.reply(res, 200, toJson(e));
      return;
    }
    if (req.method === 'POST' && url.pathname === '/register') {
      const chunks: Buffer[] = [];
      let size = 0;
      let over = false;
      req.on('data', (c: Buffer) => {
        size += c.length;
        if (size > BOOTSTRAP_MAX_BODY) {
          if (!over) {
            over = true;
            this.reply(res, 413, { error: `body over ${BOOTSTRAP_MAX_BODY} bytes` });
            req.destroy();
          }
          return;
        }
        chunks.push(c);
      });
      req.on('error', () => {});
      req.on('end', () => {
        if (over) return;
        try {
          const r = parseRegistration(JSON.parse(Buffer.concat(chunks).toString('utf8')));
          this.register(r);
          this.reply(res, 200, { ok: true });
        } catch (e) {
          this.reply(res, e instanceof BootstrapError && e.status ? e.status : 400, { error: e instanceof Error ? e.message : String(e) });
        }
      });
      return;
    }
    this.reply(res, 404, { error: 'not found (POST /register, GET /query)' });
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

async function readLimited(res: Response): Promise<string> {
  const text = await res.text();
  if (text.length > BOOTSTRAP_MAX_BODY * 16) throw new BootstrapError('answer too large');
  return text;
}

/** The wire body of a registration (`POST /register`, and a worker's handshake metadata), as {@link parseRegistration} reads it. */
export function registrationBody(r: WorkerRegistration): Record<string, string | number> {
  return { engine_id: r.engineId, tp_rank: r.tpRank, pp_rank: r.ppRank, tp_size: r.tpSize, pp_size: r.ppSize, addr: r.addr };
}

/**
 * Registers a worker at the bootstrap server `addr` (`host:port`), retrying with backoff (3
 * attempts, vLLM's behaviour).
 * @throws BootstrapError after the last attempt.
 */
export async function registerWorker(addr: string, r: WorkerRegistration, o: { timeoutMs?: number; attempts?: number } = {}): Promise<void> {
  const attempts = o.attempts ?? 3;
  let last: unknown;
  for (let i = 0; i < attempts; i++) {
    try {
      const res = await fetch(`${baseUrl(addr)}/register`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(registrationBody(r)),
        signal: AbortSignal.timeout(o.timeoutMs ?? 5000),
      });
      const text = await readLimited(res);
      if (res.ok) return;
      last = new BootstrapError(`register at ${addr}: HTTP ${res.status} ${text.slice(0, 200)}`);
      if (res.status >= 400 && res.status < 500) break;
    } catch (e) {
      last = e;
    }
    await sleep(Math.min(10_000, 100 * 2 ** i));
  }
  throw last instanceof BootstrapError ? last : new BootstrapError(`register at ${addr} failed: ${last instanceof Error ? last.message : String(last)}`);
}

/**
 * Queries the bootstrap server `addr` for `engineId`'s workers, polling until every worker
 * registered or `deadlineMs` passed.
 * @throws BootstrapError at the deadline (with the last problem) or for a malformed answer.
 */
export async function queryEngine(addr: string, engineId: string, o: { deadlineMs?: number; pollMs?: number } = {}): Promise<EngineWorkers> {
  const end = Date.now() + (o.deadlineMs ?? 30_000);
  let last = 'no answer';
  for (;;) {
    const left = end - Date.now();
    try {
      const res = await fetch(`${baseUrl(addr)}/query?engine_id=${encodeURIComponent(engineId)}`, { signal: AbortSignal.timeout(Math.max(100, Math.min(5000, left))) });
      const text = await readLimited(res);
      if (res.ok) {
        let body: unknown;
        try {
          body = JSON.parse(text);
        } catch {
          throw new BootstrapError(`query at ${addr}: the answer is not JSON`);
        }
        const e = parseEngineWorkers(body, engineId);
        if (e.complete) return e;
        last = `engine ${engineId}: ${e.workers.flat().filter((a) => a !== undefined).length} of ${e.tpSize * e.ppSize} workers registered`;
      } else {
        last = `HTTP ${res.status} ${text.slice(0, 200)}`;
      }
    } catch (e) {
      if (e instanceof BootstrapError) throw e;
      last = e instanceof Error ? e.message : String(e);
    }
    if (Date.now() >= end) throw new BootstrapError(`bootstrap ${addr}: engine ${engineId} not available: ${last}`);
    await sleep(Math.min(o.pollMs ?? 50, Math.max(1, end - Date.now())));
  }
}
