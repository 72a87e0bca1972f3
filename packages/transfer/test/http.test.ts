import * as http from 'node:http';
import { afterEach, describe, expect, it } from 'vitest';
import { HttpError, RouteTable, closeGracefully, createJsonHttpServer, listenOn, readJson, requestIdHeader, sendJson, type Routes } from '../src/http.js';

const servers: http.Server[] = [];
afterEach(async () => {
  for (const s of servers.splice(0)) {
    s.closeAllConnections();
    await new Promise<void>((r) => s.close(() => r()));
  }
});

/** A server on the layer with `routes`; the port it listens on. */
async function serve(routes: Routes): Promise<{ server: http.Server; port: number }> {
  const table = new RouteTable(routes);
  const server = createJsonHttpServer((req, res) => table.handle(req, res));
  servers.push(server);
  return { server, port: await listenOn(server, 0, '127.0.0.1') };
}

interface Answer {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: string;
}

/** One request on a fresh connection. */
function request(port: number, method: string, path: string, body?: string, headers: http.OutgoingHttpHeaders = {}): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, method, path, headers, agent: false }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode!, headers: res.headers, body: Buffer.concat(chunks).toString('utf8') }));
    });
    req.on('error', reject);
    req.end(body);
  });
}

const echo = { POST: async (req: http.IncomingMessage, res: http.ServerResponse) => sendJson(res, 200, { got: await readJson(req, 1024) }) };

describe('route table', () => {
  it('an unknown path is a 404 in the error shape', async () => {
    const { port } = await serve({ '/a': { GET: (_q, res) => sendJson(res, 200, { a: 1 }) } });
    const r = await request(port, 'GET', '/b?x=1');
    expect(r.status).toBe(404);
    expect(JSON.parse(r.body)).toEqual({ error: { message: 'no route GET /b', type: 'not_found_error', code: 404 } });
    expect(r.headers['content-type']).toBe('application/json; charset=utf-8');
  });

  it('a known path with another method is a 405 whose allow header lists the route\'s methods; HEAD is served by GET', async () => {
    const { port } = await serve({ '/a': { GET: (_q, res) => sendJson(res, 200, { a: 1 }) }, '/b': { GET: (_q, res) => sendJson(res, 200, {}), POST: (_q, res) => sendJson(res, 201, {}) } });
    const r = await request(port, 'DELETE', '/a');
    expect(r.status).toBe(405);
    expect(r.headers.allow).toBe('GET');
    expect(JSON.parse(r.body).error).toEqual({ message: 'method not allowed (allow: GET)', type: 'invalid_request_error', code: 405 });
    expect((await request(port, 'PUT', '/b')).headers.allow).toBe('GET, POST');
    expect((await request(port, 'HEAD', '/a')).status).toBe(200);
    expect((await request(port, 'POST', '/b')).status).toBe(201);
  });

  it('the handler gets the query in its URL; a thrown HttpError is answered with its status and headers, anything else 500', async () => {
    const { port } = await serve({
      '/q': { GET: (_q, res, url) => sendJson(res, 200, { id: url.searchParams.get('id') }) },
      '/teapot': { GET: () => Promise.reject(new HttpError(418, 'short and stout', 'teapot_error', { 'x-tea': 'yes' })) },
      '/boom': { GET: () => Promise.reject(new Error('boom')) },
    });
    expect(JSON.parse((await request(port, 'GET', '/q?id=7')).body)).toEqual({ id: '7' });
    const t = await request(port, 'GET', '/teapot');
    expect([t.status, t.headers['x-tea'], JSON.parse(t.body)]).toEqual([418, 'yes', { error: { message: 'short and stout', type: 'teapot_error', code: 418 } }]);
    const b = await request(port, 'GET', '/boom');
    expect([b.status, JSON.parse(b.body)]).toEqual([500, { error: { message: 'boom', type: 'server_error', code: 500 } }]);
  });
});

describe('bodies', () => {
  it('malformed JSON is a 400; an empty body a 400; another content type a 415; good JSON reaches the handler', async () => {
    const { port } = await serve({ '/echo': echo });
    const bad = await request(port, 'POST', '/echo', '{"a":', { 'content-type': 'application/json' });
    expect(bad.status).toBe(400);
    expect(JSON.parse(bad.body).error.message).toMatch(/^request body is not valid JSON/);
    expect((await request(port, 'POST', '/echo', '')).status).toBe(400);
    expect((await request(port, 'POST', '/echo', '{}', { 'content-type': 'text/plain' })).status).toBe(415);
    expect(JSON.parse((await request(port, 'POST', '/echo', '{"a":[1]}', { 'content-type': 'application/json' })).body)).toEqual({ got: { a: [1] } });
  });

  it('a declared length over the cap is a 413 (connection: close) before any of the body is sent', async () => {
    const { port } = await serve({ '/echo': echo });
    const status = await new Promise<{ status: number; connection: string | undefined }>((resolve, reject) => {
      const req = http.request({ host: '127.0.0.1', port, method: 'POST', path: '/echo', headers: { 'content-length': '5000' }, agent: false }, (res) => resolve({ status: res.statusCode!, connection: res.headers.connection }));
      req.on('error', reject);
      req.flushHeaders(); // headers only; the body never comes
    });
    expect(status).toEqual({ status: 413, connection: 'close' });
  });

  it('a body over the cap is a 413 while it is read: the request is not complete when it is refused', async () => {
    let completeWhenRefused: boolean | undefined;
    const { port } = await serve({
      '/echo': {
        POST: async (req, res) => {
          try {
            sendJson(res, 200, { got: await readJson(req, 1024) });
          } catch (e) {
            completeWhenRefused = req.complete;
            throw e;
          }
        },
      },
    });
    const r = await new Promise<Answer>((resolve, reject) => {
      const req = http.request({ host: '127.0.0.1', port, method: 'POST', path: '/echo', agent: false }, (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => resolve({ status: res.statusCode!, headers: res.headers, body: Buffer.concat(chunks).toString('utf8') }));
      });
      req.on('error', reject);
      req.write('x'.repeat(4096)); // chunked, no content-length, never ended
      // No answer while the body is still open means the cap was not checked while reading.
      setTimeout(() => (req.destroy(), resolve({ status: -1, headers: {}, body: '{}' })), 3000).unref();
    });
    expect(r.status).toBe(413);
    expect(r.headers.connection).toBe('close');
    expect(JSON.parse(r.body).error).toEqual({ message: 'request body larger than 1024 bytes', type: 'invalid_request_error', code: 413 });
    expect(completeWhenRefused).toBe(false);
  });
});

describe('request id', () => {
  it('X-Request-Id is taken when well formed, a 400 when not', async () => {
    const { port } = await serve({ '/id': { GET: (req, res) => sendJson(res, 200, { id: requestIdHeader(req) ?? null }) } });
    expect(JSON.parse((await request(port, 'GET', '/id', undefined, { 'x-request-id': 'abc-1.2:3' })).body)).toEqual({ id: 'abc-1.2:3' });
    expect(JSON.parse((await request(port, 'GET', '/id')).body)).toEqual({ id: null });
    expect((await request(port, 'GET', '/id', undefined, { 'x-request-id': 'a b' })).status).toBe(400);
    expect((await request(port, 'GET', '/id', undefined, { 'x-request-id': 'x'.repeat(129) })).status).toBe(400);
  });
});

describe('graceful close', () => {
  it('waits for a running request, answers it, then closes; a request past the grace period gets onGraceExpired', async () => {
    let finish!: () => void;
    const running = new Promise<void>((r) => (finish = r));
    const { server, port } = await serve({ '/slow': { GET: async (_q, res) => (await running, sendJson(res, 200, { done: true })) } });
    const answer = request(port, 'GET', '/slow');
    await new Promise((r) => setTimeout(r, 50)); // the request is running
    let closed = false;
    let expired = 0;
    const closing = closeGracefully(server, { running: [running], graceMs: 5000, onGraceExpired: () => void expired++ }).then(() => (closed = true));
    await new Promise((r) => setTimeout(r, 50));
    expect(closed).toBe(false);
    finish();
    expect(await answer).toMatchObject({ status: 200, body: '{"done":true}' });
    await closing;
    expect(expired).toBe(0);
    await expect(request(port, 'GET', '/slow')).rejects.toThrow(/ECONNREFUSED/);

    const two = await serve({ '/x': { GET: (_q, res) => sendJson(res, 200, {}) } });
    await closeGracefully(two.server, { running: [new Promise(() => {})], graceMs: 20, onGraceExpired: () => void expired++ });
    expect(expired).toBe(1);
  });
});

describe('slow clients', () => {
  it('a body trickled past requestTimeoutMs gets 408 and the connection closes (no connection held for minutes)', async () => {
    const table = new RouteTable({ '/echo': echo });
    const server = createJsonHttpServer((req, res) => table.handle(req, res), { requestTimeoutMs: 400, headersTimeoutMs: 400 });
    servers.push(server);
    const port = await listenOn(server, 0, '127.0.0.1');
    const t0 = Date.now();
    const got = await new Promise<{ status: number; closedAfterMs: number }>((resolve, reject) => {
      const req = http.request({ host: '127.0.0.1', port, method: 'POST', path: '/echo', headers: { 'content-type': 'application/json', 'content-length': '1000' }, agent: false }, (res) => {
        res.resume();
        res.on('end', () => resolve({ status: res.statusCode!, closedAfterMs: Date.now() - t0 }));
      });
      req.on('error', reject);
      req.write('{');
      const trickle = setInterval(() => req.write(' '), 50);
      req.on('close', () => clearInterval(trickle));
      setTimeout(() => clearInterval(trickle), 5000).unref();
    });
    expect(got.status).toBe(408);
    expect(got.closedAfterMs).toBeLessThan(3000);
  });

  it('a handler that throws synchronously is answered 500; the server stays up', async () => {
    const server = createJsonHttpServer((() => {
      throw new Error('sync throw');
    }) as unknown as (req: http.IncomingMessage, res: http.ServerResponse) => Promise<void>);
    servers.push(server);
    const port = await listenOn(server, 0, '127.0.0.1');
    expect((await request(port, 'GET', '/x')).status).toBe(500);
    expect((await request(port, 'GET', '/x')).status).toBe(500);
  });
});
