/**
 * The small HTTP server layer of kvconnect's servers (the engine and proxy servers of
 * `@kvconnect/engine`, the Mooncake bootstrap server of `@kvconnect/mooncake`), over `node:http`:
 *
 * - a route table ({@link RouteTable}): method + path -> handler; an unknown path is a 404, a known
 *   path with another method a 405 with an `allow` header (`HEAD` is served by a `GET` route);
 * - body reading bounded while it is read ({@link readBody}, {@link readJson}): a body over the cap
 *   is a 413 ({@link HttpError}, `connection: close`) as soon as its declared length or its bytes
 *   read pass the cap, without reading the rest;
 * - JSON answers ({@link sendJson}) and the error shape `{ error: { message, type, code } }`
 *   ({@link sendError}, {@link ErrorBody}; OpenAI's error body);
 * - the request id of the `X-Request-Id` header ({@link requestIdHeader});
 * - keep-alive (5 s idle, {@link createJsonHttpServer}), `connection: close` on errors that leave a
 *   body unread, and graceful close ({@link closeGracefully}: stop accepting, drop idle
 *   connections, wait for running requests up to a grace period, then drop every connection).
 *
 * Everything a client sends is answered or dropped; nothing it sends can throw out of the server.
 * @module
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

/** An error with the HTTP status it answers with (`type` names its class in the JSON body; `headers` go on the answer). */
export class HttpError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly type: string = status >= 500 ? 'server_error' : 'invalid_request_error',
    readonly headers: Record<string, string> = {},
  ) {
    super(message);
    this.name = 'HttpError';
  }
}

/** The body of an error response (OpenAI's shape; `code` is the HTTP status). */
export interface ErrorBody {
  error: { message: string; type: string; code: number };
}

/** Default largest request body (1 MiB). */
export const DEFAULT_MAX_BODY_BYTES = 1 << 20;

/** A request id: 1 to 128 characters of `[A-Za-z0-9._:-]` (the `X-Request-Id` header, the engine API's `request_id`). */
export const REQUEST_ID_PATTERN = /^[A-Za-z0-9._:-]{1,128}$/;

/** The id a request asked for in its `X-Request-Id` header, checked. @throws HttpError 400 when malformed. */
export function requestIdHeader(req: IncomingMessage): string | undefined {
  const h = req.headers['x-request-id'];
  if (h === undefined) return undefined;
  const v = Array.isArray(h) ? h[0] : h;
  if (!REQUEST_ID_PATTERN.test(v)) throw new HttpError(400, 'X-Request-Id: expected 1 to 128 characters of [A-Za-z0-9._:-]');
  return v;
}

/** The 413 of a body over `limit` bytes (closes the connection: the rest of the body is not read). */
function tooLarge(limit: number): HttpError {
  return new HttpError(413, `request body larger than ${limit} bytes`, 'invalid_request_error', { connection: 'close' });
}

/**
 * Reads a request body of at most `limit` bytes.
 * @throws HttpError 413 when it is larger (checked on `content-length` first, then on every chunk
 *   while reading: the rest is discarded unread), 400 when the client goes away mid-body.
 */
export function readBody(req: IncomingMessage, limit: number): Promise<Buffer> {
  const declared = req.headers['content-length'];
  if (declared !== undefined && Number(declared) > limit) {
    req.resume();
    return Promise.reject(tooLarge(limit));
  }
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    let done = false;
    const fail = (e: HttpError) => {
      if (done) return;
      done = true;
      reject(e);
    };
    req.on('data', (c: Buffer) => {
      if (done) return;
      size += c.length;
      if (size > limit) {
        fail(tooLarge(limit));
        req.resume();
        return;
      }
      chunks.push(c);
    });
    req.on('end', () => {
      if (done) return;
      done = true;
      resolve(Buffer.concat(chunks, size));
    });
    req.on('error', (e) => fail(new HttpError(400, `reading the request body failed: ${e.message}`)));
    req.on('aborted', () => fail(new HttpError(400, 'the client aborted the request body')));
  });
}

/**
 * Reads and parses a JSON request body.
 * @throws HttpError 415 for a non-JSON content type, 413 for a large body, 400 for an empty body or bad JSON.
 */
export async function readJson(req: IncomingMessage, limit: number): Promise<unknown> {
  const ct = req.headers['content-type'];
  if (ct !== undefined && !/^application\/([\w.+-]*\+)?json\b/i.test(ct.trim())) {
    throw new HttpError(415, `content-type must be application/json, got ${JSON.stringify(ct)}`);
  }
  const buf = await readBody(req, limit);
  if (buf.length === 0) throw new HttpError(400, 'request body is empty (expected a JSON object)');
  try {
    return JSON.parse(buf.toString('utf8')) as unknown;
  } catch (e) {
    throw new HttpError(400, `request body is not valid JSON: ${e instanceof Error ? e.message : String(e)}`);
  }
}

/** Sends `body` as JSON with `status` (no-op when the response was already sent or the socket closed). */
export function sendJson(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  if (res.headersSent || res.destroyed) return;
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json; charset=utf-8', 'content-length': Buffer.byteLength(text), ...headers });
  res.end(text);
}

/** Sends an error as {@link ErrorBody} (an {@link HttpError} with its status and headers, anything else 500). */
export function sendError(res: ServerResponse, e: unknown): void {
  const he = e instanceof HttpError ? e : new HttpError(500, e instanceof Error ? e.message : String(e));
  const body: ErrorBody = { error: { message: he.message, type: he.type, code: he.status } };
  sendJson(res, he.status, body, he.headers);
}

/** Sends a plain-text body. */
export function sendText(res: ServerResponse, status: number, text: string, contentType: string): void {
  if (res.headersSent || res.destroyed) return;
  res.writeHead(status, { 'content-type': contentType, 'content-length': Buffer.byteLength(text) });
  res.end(text);
}

/** 405 with an `allow` header. */
export function methodNotAllowed(allow: string): HttpError {
  return new HttpError(405, `method not allowed (allow: ${allow})`, 'invalid_request_error', { allow });
}

/** Serves one request of a route; `url` is the request's target (path as sent, and query) on `http://localhost`. */
export type RouteHandler = (req: IncomingMessage, res: ServerResponse, url: URL) => void | Promise<void>;

/** Routes by path, then by method (`GET`, `POST`, ...; a `GET` route serves `HEAD` too). */
export type Routes<H = RouteHandler> = Record<string, Partial<Record<string, H>>>;

/** `target` (a request's path and query, as sent) as a URL on `http://localhost`; never throws (an unparsable target is `/`). */
function targetUrl(target: string): URL {
  try {
    return new URL(`http://localhost${target.startsWith('/') ? '' : '/'}${target}`);
  } catch {
    return new URL('http://localhost/');
  }
}

/** What {@link RouteTable.match} found: the handler, or the 404 / 405 the request gets. */
export type RouteMatch<H = RouteHandler> = { handler: H; url: URL } | { error: HttpError; url: URL };

/**
 * A route table: method + path -> handler. The path (the target before any `?`, as sent: not
 * normalised) is matched exactly. An unknown path is a 404 (`not_found_error`, message `no route METHOD PATH`); a known path
 * with another method a 405 whose `allow` header lists the route's methods. `H` is what a route
 * holds: a {@link RouteHandler} for {@link handle}, or anything a server that only
 * {@link match}es wants (the Mooncake bootstrap server reads and proves a body before it routes).
 */
export class RouteTable<H = RouteHandler> {
  private readonly routes: Map<string, Map<string, H>>;

  constructor(routes: Routes<H>) {
    this.routes = new Map();
    for (const [path, methods] of Object.entries(routes)) {
      const m = new Map<string, H>();
      for (const [method, h] of Object.entries(methods)) if (h) m.set(method.toUpperCase(), h);
      this.routes.set(path, m);
    }
  }

  /** Whether `path` is a route (any method): e.g. a metrics label that must not grow with what clients send. */
  has(path: string): boolean {
    return this.routes.has(path);
  }

  /** The handler of `req`, or the 404 / 405 it gets (nothing is sent). */
  match(req: IncomingMessage): RouteMatch<H> {
    const target = req.url ?? '/';
    const method = req.method ?? 'GET';
    const path = target.split('?')[0];
    const url = targetUrl(target);
    const methods = this.routes.get(path);
    if (!methods) return { error: new HttpError(404, `no route ${method} ${path}`, 'not_found_error'), url };
    const handler = methods.get(method) ?? (method === 'HEAD' ? methods.get('GET') : undefined);
    if (!handler) return { error: methodNotAllowed([...methods.keys()].join(', ')), url };
    return { handler, url };
  }

  /** Serves `req` with its route's handler. @throws HttpError 404 / 405 (see {@link match}), and what the handler throws. */
  async handle(this: RouteTable<RouteHandler>, req: IncomingMessage, res: ServerResponse): Promise<void> {
    const m = this.match(req);
    if ('error' in m) throw m.error;
    await m.handler(req, res, m.url);
  }
}

/** The URL of a listening server address (IPv6 hosts bracketed). */
export function urlOf(host: string, port: number): string {
  return `http://${host.includes(':') ? `[${host}]` : host}:${port}`;
}

/**
 * An HTTP server for a JSON API: `handle` serves each request (a {@link RouteTable}'s `handle`
 * fits), and anything it throws is answered by {@link sendError} (an {@link HttpError} with its
 * status, anything else 500; a handler that throws synchronously too). Idle keep-alive connections
 * close after 5 s; a request must arrive whole within `requestTimeoutMs` (default 30 s; headers
 * within `headersTimeoutMs`, default 10 s), else 408. Malformed HTTP gets a
 * bare 400 and the connection closes; nothing a client sends can throw out of the server.
 */
export function createJsonHttpServer(
  handle: (req: IncomingMessage, res: ServerResponse) => Promise<void>,
  o: { requestTimeoutMs?: number; headersTimeoutMs?: number } = {},
): Server {
  const requestTimeout = o.requestTimeoutMs ?? 30_000;
  const headersTimeout = Math.min(o.headersTimeoutMs ?? 10_000, requestTimeout);
  // Node checks the two deadlines every connectionsCheckingInterval (default 30 s).
  const server = createServer({ requestTimeout, headersTimeout, connectionsCheckingInterval: Math.max(100, Math.min(5000, Math.floor(requestTimeout / 4))) }, (req, res) => {
    Promise.resolve()
      .then(() => handle(req, res))
      .catch((e: unknown) => sendError(res, e));
  });
  server.keepAliveTimeout = 5000;
  // A client trickling its headers or body cannot hold a connection for Node's defaults (60 s /
  // 300 s): the whole request must arrive within requestTimeoutMs (Node answers 408 and closes).
  server.on('clientError', (err: NodeJS.ErrnoException, socket) => {
    const timedOut = err.code === 'ERR_HTTP_REQUEST_TIMEOUT';
    if (socket.writable) socket.end(`HTTP/1.1 ${timedOut ? '408 Request Timeout' : '400 Bad Request'}\r\nconnection: close\r\ncontent-length: 0\r\n\r\n`);
    else socket.destroy();
  });
  return server;
}

/**
 * Listens on `host:port` (0: any free port). @returns the bound port.
 * @throws the listen error (address in use, permission); later server errors are ignored.
 */
export async function listenOn(server: Server, port: number, host: string): Promise<number> {
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  server.on('error', () => {});
  return (server.address() as AddressInfo).port;
}

/** Options of {@link closeGracefully}. */
export interface GracefulCloseOptions {
  /** The requests running now (each settles when its request ended). */
  running: Iterable<Promise<unknown>>;
  /** How long to wait for them, ms. */
  graceMs: number;
  /** Called when the grace period ran out with requests still running (e.g. to abort them); awaited. */
  onGraceExpired?: () => Promise<unknown> | void;
}

/**
 * Closes `server` gracefully: stops accepting connections, closes idle keep-alive ones, waits for
 * the running requests (up to `graceMs`, then {@link GracefulCloseOptions.onGraceExpired}), lets
 * the last answers flush, then drops every connection left. Resolves when the server closed.
 */
export async function closeGracefully(server: Server, o: GracefulCloseOptions): Promise<void> {
  const serverClosed = new Promise<void>((r) => server.close(() => r()));
  server.closeIdleConnections();
  const running = [...o.running];
  if (running.length > 0) {
    let t: NodeJS.Timeout | undefined;
    const grace = new Promise<'timeout'>((r) => (t = setTimeout(() => r('timeout'), o.graceMs)));
    const which = await Promise.race([Promise.all(running).then(() => 'done' as const), grace]);
    clearTimeout(t);
    if (which === 'timeout') await o.onGraceExpired?.();
  }
  // Let the last responses flush, then drop whatever connection is left.
  await new Promise((r) => setImmediate(r));
  server.closeAllConnections();
  await serverClosed;
}

/**
 * Answers `POST /shutdown` with `body`, then (after the reply is sent) runs `close` and
 * `onShutdown`. Errors of either are ignored: the process is going away.
 */
export function replyAndShutdown(res: ServerResponse, body: unknown, close: () => Promise<void>, onShutdown?: () => void | Promise<void>): void {
  sendJson(res, 200, body);
  setImmediate(() => {
    void close()
      .then(() => onShutdown?.())
      .catch(() => {});
  });
}
