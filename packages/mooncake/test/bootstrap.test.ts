/**
 * The bootstrap server and its client: register / query over HTTP, completeness, re-registration
 * with another layout, strict validation of bodies and answers (4xx, never a crash), deadlines
 * and retries.
 */
import * as http from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { ClusterSecretError } from '@kvconnect/transfer';
import {
  BOOTSTRAP_AUTH_HEADER,
  BOOTSTRAP_LIMITS,
  BOOTSTRAP_MAX_BODY,
  BOOTSTRAP_MAX_ENGINES,
  BootstrapAuthError,
  BootstrapError,
  BootstrapLimitError,
  BootstrapServer,
  parseEngineWorkers,
  parseRegistration,
  queryEngine,
  registerWorker,
  responseProof,
  signRequest,
} from '../src/bootstrap.js';

const servers: Array<{ close(): unknown }> = [];
afterEach(async () => {
  for (const s of servers.splice(0)) await s.close();
});

const SECRET = Buffer.from('bootstrap-test-cluster-secret');
const OTHER = Buffer.from('another-cluster-secret-0000');

async function start(secret: Buffer | null = null): Promise<BootstrapServer> {
  const s = await BootstrapServer.start({ port: 0, secret });
  servers.push(s);
  return s;
}

const reg = (tpRank: number, ppRank = 0, o: Partial<{ tpSize: number; ppSize: number; engineId: string }> = {}) => ({
  engineId: o.engineId ?? 'prefill-0',
  tpRank,
  ppRank,
  tpSize: o.tpSize ?? 2,
  ppSize: o.ppSize ?? 1,
  addr: `tcp://127.0.0.1:${5000 + tpRank * 10 + ppRank}`,
});

async function post(addr: string, path: string, body: string): Promise<{ status: number; json: unknown }> {
  const res = await fetch(`http://${addr}${path}`, { method: 'POST', body, headers: { 'content-type': 'application/json' } });
  return { status: res.status, json: await res.json() };
}

describe('BootstrapServer', () => {
  it('maps engine id and TP/PP rank to side-channel addresses; complete once every worker registered', async () => {
    const s = await start();
    await registerWorker(s.address, reg(1));
    const partial = await (await fetch(`http://${s.address}/query?engine_id=prefill-0`)).json();
    expect(partial).toEqual({ engine_id: 'prefill-0', tp_size: 2, pp_size: 1, complete: false, workers: { 1: { 0: 'tcp://127.0.0.1:5010' } } });
    await registerWorker(s.address, reg(0));
    const e = await queryEngine(s.address, 'prefill-0');
    expect(e).toEqual({ engineId: 'prefill-0', tpSize: 2, ppSize: 1, complete: true, workers: [['tcp://127.0.0.1:5000'], ['tcp://127.0.0.1:5010']] });
    // Without an engine id: every engine.
    await registerWorker(s.address, reg(0, 0, { engineId: 'other', tpSize: 1 }));
    const all = (await (await fetch(`http://${s.address}/query`)).json()) as Record<string, unknown>;
    expect(Object.keys(all).sort()).toEqual(['other', 'prefill-0']);
  });

  it('a registration with other TP/PP sizes starts the engine afresh', async () => {
    const s = await start();
    s.register(reg(0));
    s.register(reg(1));
    expect(s.lookup('prefill-0')!.complete).toBe(true);
    s.register(reg(0, 0, { tpSize: 4 }));
    expect(s.lookup('prefill-0')).toMatchObject({ tpSize: 4, complete: false });
    expect(s.lookup('prefill-0')!.workers.flat().filter(Boolean)).toHaveLength(1);
  });

  it('unknown engine -> 404; unknown path -> 404', async () => {
    const s = await start();
    expect((await fetch(`http://${s.address}/query?engine_id=nope`)).status).toBe(404);
    expect((await fetch(`http://${s.address}/nothing`)).status).toBe(404);
  });

  const bad: Array<[string, string]> = [
    ['not JSON', '{'],
    ['an array', '[]'],
    ['no engine id', JSON.stringify({ tp_rank: 0, pp_rank: 0, tp_size: 1, pp_size: 1, addr: 'tcp://h:1' })],
    ['tp_rank >= tp_size', JSON.stringify({ engine_id: 'e', tp_rank: 1, pp_rank: 0, tp_size: 1, pp_size: 1, addr: 'tcp://h:1' })],
    ['a float size', JSON.stringify({ engine_id: 'e', tp_rank: 0, pp_rank: 0, tp_size: 1.5, pp_size: 1, addr: 'tcp://h:1' })],
    ['a non-tcp address', JSON.stringify({ engine_id: 'e', tp_rank: 0, pp_rank: 0, tp_size: 1, pp_size: 1, addr: 'http://h:1' })],
    ['an address with spaces', JSON.stringify({ engine_id: 'e', tp_rank: 0, pp_rank: 0, tp_size: 1, pp_size: 1, addr: 'tcp://h h:1' })],
  ];
  for (const [what, body] of bad) {
    it(`rejects a registration with ${what} (400) and keeps serving`, async () => {
      const s = await start();
      const r = await post(s.address, '/register', body);
      expect(r.status).toBe(400);
      expect(typeof (r.json as { error: string }).error).toBe('string');
      expect(s.rejected).toBe(1);
      await registerWorker(s.address, reg(0, 0, { tpSize: 1 }));
      expect(s.lookup('prefill-0')?.complete).toBe(true);
    });
  }

  it('rejects a body over the limit (413)', async () => {
    const s = await start();
    const r = await fetch(`http://${s.address}/register`, { method: 'POST', body: 'x'.repeat(BOOTSTRAP_MAX_BODY + 10) }).catch((e: Error) => e);
    if (!(r instanceof Error)) expect(r.status).toBe(413);
    expect(s.rejected).toBe(1);
    expect(s.lookup('prefill-0')).toBeUndefined();
  });

  it('registration fields are validated by parseRegistration', () => {
    expect(parseRegistration({ engine_id: 'e', tp_rank: 0, pp_rank: 1, tp_size: 1, pp_size: 2, addr: 'tcp://[::1]:9', dp_rank: 0 })).toEqual({ engineId: 'e', tpRank: 0, ppRank: 1, tpSize: 1, ppSize: 2, addr: 'tcp://[::1]:9' });
    expect(() => parseRegistration(null)).toThrow(BootstrapError);
  });
});

describe('client', () => {
  it('queryEngine waits for late workers, then answers', async () => {
    const s = await start();
    s.register(reg(0));
    const q = queryEngine(s.address, 'prefill-0', { deadlineMs: 3000, pollMs: 5 });
    setTimeout(() => s.register(reg(1)), 50);
    expect((await q).complete).toBe(true);
  });

  it('queryEngine fails at its deadline, saying why', async () => {
    const s = await start();
    s.register(reg(0));
    await expect(queryEngine(s.address, 'prefill-0', { deadlineMs: 100, pollMs: 10 })).rejects.toThrow(/1 of 2 workers registered/);
    await expect(queryEngine(s.address, 'missing', { deadlineMs: 1000, pollMs: 10 })).rejects.toThrow(/HTTP 404/);
  });

  it('registerWorker gives up after its attempts against a dead server', async () => {
    const s = await start();
    const addr = s.address;
    await s.close();
    servers.length = 0;
    await expect(registerWorker(addr, reg(0), { attempts: 2, timeoutMs: 200 })).rejects.toThrow(BootstrapError);
  });

  it('a malformed answer is a BootstrapError, not a crash', async () => {
    const answers = ['not json', JSON.stringify({ engine_id: 'e', tp_size: 1, pp_size: 1, workers: { 0: { 0: 5 } } }), JSON.stringify({ engine_id: 'other', tp_size: 1, pp_size: 1, workers: {} })];
    for (const a of answers) {
      const srv = http.createServer((_q, res) => res.end(a));
      await new Promise<void>((r) => srv.listen(0, '127.0.0.1', () => r()));
      servers.push({ close: () => new Promise<void>((r) => srv.close(() => r())) });
      const addr = `127.0.0.1:${(srv.address() as AddressInfo).port}`;
      await expect(queryEngine(addr, 'e', { deadlineMs: 200 })).rejects.toThrow(BootstrapError);
    }
  });

  it('parseEngineWorkers rejects ranks out of range and non-canonical keys', () => {
    expect(() => parseEngineWorkers({ engine_id: 'e', tp_size: 1, pp_size: 1, workers: { 1: { 0: 'tcp://h:1' } } }, 'e')).toThrow(/bad tp rank/);
    expect(() => parseEngineWorkers({ engine_id: 'e', tp_size: 1, pp_size: 1, workers: { '00': { 0: 'tcp://h:1' } } }, 'e')).toThrow(/bad tp rank/);
    expect(() => parseEngineWorkers({ engine_id: 'e', tp_size: 1, pp_size: 1, workers: { 0: { 1: 'tcp://h:1' } } }, 'e')).toThrow(/bad pp rank/);
    expect(parseEngineWorkers({ engine_id: 'e', tp_size: 1, pp_size: 1, workers: { 0: { 0: 'tcp://h:1' } } }, 'e').complete).toBe(true);
  });
});

/** A raw request with an explicit auth header (or none). */
async function raw(addr: string, method: string, target: string, body: string | null, header?: string): Promise<{ status: number; json: unknown; proof: string | null }> {
  const headers: Record<string, string> = {};
  if (header !== undefined) headers[BOOTSTRAP_AUTH_HEADER] = header;
  const res = await fetch(`http://${addr}${target}`, { method, headers, body: body ?? undefined });
  return { status: res.status, json: await res.json(), proof: res.headers.get(BOOTSTRAP_AUTH_HEADER) };
}

describe('authentication (cluster secret)', () => {
  const body = JSON.stringify({ engine_id: 'prefill-0', tp_rank: 0, pp_rank: 0, tp_size: 1, pp_size: 1, addr: 'tcp://127.0.0.1:6000' });

  it('proven clients register and query; the answers carry the server\'s proof', async () => {
    const s = await start(SECRET);
    await registerWorker(s.address, reg(0), { secret: SECRET });
    await registerWorker(s.address, reg(1), { secret: SECRET });
    expect((await queryEngine(s.address, 'prefill-0', { secret: SECRET })).complete).toBe(true);
    const { header, nonce } = signRequest(SECRET, 'GET', '/query?engine_id=prefill-0', new Uint8Array());
    const r = await raw(s.address, 'GET', '/query?engine_id=prefill-0', null, header);
    expect(r.status).toBe(200);
    expect(r.proof).toBe(responseProof(SECRET, nonce, 200, Buffer.from(JSON.stringify(r.json))).toString('hex'));
  });

  it('a request without a proof, with another secret\'s, stale or replayed: 401, nothing registered', async () => {
    const s = await start(SECRET);
    expect((await raw(s.address, 'POST', '/register', body)).status).toBe(401);
    expect((await raw(s.address, 'GET', '/query?engine_id=prefill-0', null)).status).toBe(401);
    expect((await raw(s.address, 'POST', '/register', body, signRequest(OTHER, 'POST', '/register', Buffer.from(body)).header)).status).toBe(401);
    const stale = signRequest(SECRET, 'POST', '/register', Buffer.from(body), Date.now() - BOOTSTRAP_LIMITS.authWindowMs - 5000).header;
    expect(await raw(s.address, 'POST', '/register', body, stale)).toMatchObject({ status: 401, json: { error: expect.stringMatching(/stale/) } });
    // The proof covers the method, the path and the body.
    const signed = signRequest(SECRET, 'POST', '/register', Buffer.from(body)).header;
    expect((await raw(s.address, 'POST', '/register', body.replace('6000', '6001'), signed)).status).toBe(401);
    expect(s.lookup('prefill-0')).toBeUndefined();
    const good = signRequest(SECRET, 'POST', '/register', Buffer.from(body)).header;
    expect((await raw(s.address, 'POST', '/register', body, good)).status).toBe(200);
    expect(await raw(s.address, 'POST', '/register', body, good)).toMatchObject({ status: 401, json: { error: expect.stringMatching(/replayed/) } });
    expect(s.replayCacheSize).toBe(1);
  });

  it('the same signed request on two connections at once, bodies still arriving: one 200, one replay 401', async () => {
    const s = await start(SECRET);
    const header = signRequest(SECRET, 'POST', '/register', Buffer.from(body)).header;
    const [host, port] = s.address.split(':');
    // Headers of both requests first, their bodies 100 ms later (the race a replayer would use).
    const send = () =>
      new Promise<number>((resolve, reject) => {
        const req = http.request({ host, port: Number(port), method: 'POST', path: '/register', headers: { [BOOTSTRAP_AUTH_HEADER]: header, 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) } }, (res) => {
          res.resume();
          res.on('end', () => resolve(res.statusCode ?? 0));
        });
        req.on('error', reject);
        req.flushHeaders();
        setTimeout(() => req.end(body), 100);
      });
    const statuses = (await Promise.all([send(), send()])).sort();
    expect(statuses).toEqual([200, 401]);
  });

  it('the proof is checked before the body is parsed (a bad body with a bad proof is a 401, not a 400)', async () => {
    const s = await start(SECRET);
    const h = signRequest(OTHER, 'POST', '/register', Buffer.from('{')).header;
    expect((await raw(s.address, 'POST', '/register', '{', h)).status).toBe(401);
    const ok = signRequest(SECRET, 'POST', '/register', Buffer.from('{')).header;
    expect((await raw(s.address, 'POST', '/register', '{', ok)).status).toBe(400);
  });

  it('a client with a secret refuses answers without the genuine server\'s proof', async () => {
    const answer = JSON.stringify({ engine_id: 'e', tp_size: 1, pp_size: 1, complete: true, workers: { 0: { 0: 'tcp://10.9.9.9:1' } } });
    for (const proof of [undefined, 'ab'.repeat(32)]) {
      const srv = http.createServer((_q, res) => {
        if (proof) res.setHeader(BOOTSTRAP_AUTH_HEADER, proof);
        res.end(answer);
      });
      await new Promise<void>((r) => srv.listen(0, '127.0.0.1', () => r()));
      servers.push({ close: () => new Promise<void>((r) => srv.close(() => r())) });
      const addr = `127.0.0.1:${(srv.address() as AddressInfo).port}`;
      await expect(queryEngine(addr, 'e', { deadlineMs: 500, secret: SECRET })).rejects.toThrow(BootstrapAuthError);
      await expect(registerWorker(addr, reg(0), { secret: SECRET, attempts: 1 })).rejects.toThrow(BootstrapAuthError);
    }
    // A genuine server with another secret: refused the same way.
    const s = await start(OTHER);
    await expect(queryEngine(s.address, 'prefill-0', { deadlineMs: 500, secret: SECRET })).rejects.toThrow(/no valid proof/);
  });

  it('without a secret the server listens on loopback only', async () => {
    await expect(BootstrapServer.start({ host: '0.0.0.0', port: 0 })).rejects.toThrow(ClusterSecretError);
    await expect(BootstrapServer.start({ host: '192.0.2.1', port: 0 })).rejects.toThrow(/refusing to listen on non-loopback host 192.0.2.1/);
  });
});

describe('engine ownership', () => {
  const mine = (tpRank: number, owner: string, o: Partial<{ tpSize: number; port: number }> = {}) => ({ ...reg(tpRank, 0, { tpSize: o.tpSize }), owner, addr: `tcp://127.0.0.1:${o.port ?? 7000 + tpRank}` });

  it('without a secret, another owner can neither take a slot nor reset the engine; the owner can re-register', async () => {
    const s = await start();
    await registerWorker(s.address, mine(0, 'producer-a'));
    await registerWorker(s.address, mine(1, 'producer-a2'));
    const e1 = registerWorker(s.address, mine(0, 'intruder', { port: 9999 }), { attempts: 1 });
    await expect(e1).rejects.toThrow(/registered by another producer/);
    await expect(e1).rejects.toMatchObject({ status: 409 });
    await expect(registerWorker(s.address, mine(0, 'intruder', { tpSize: 1, port: 9999 }), { attempts: 1 })).rejects.toThrow(/another producer/);
    await expect(registerWorker(s.address, { ...reg(0), addr: 'tcp://127.0.0.1:9999' }, { attempts: 1 })).rejects.toThrow(/another producer/); // no owner at all
    expect(s.lookup('prefill-0')!.workers).toEqual([['tcp://127.0.0.1:7000'], ['tcp://127.0.0.1:7001']]);
    await registerWorker(s.address, mine(0, 'producer-a', { port: 7100 })); // its ROUTER moved
    expect(s.lookup('prefill-0')!.workers[0]).toEqual(['tcp://127.0.0.1:7100']);
  });

  it('with a secret, a proven registration replaces the slot (a producer restarted with a new owner token)', async () => {
    const s = await start(SECRET);
    await registerWorker(s.address, mine(0, 'before-restart'), { secret: SECRET });
    await registerWorker(s.address, mine(0, 'after-restart', { port: 7200 }), { secret: SECRET });
    expect(s.lookup('prefill-0')!.workers[0]).toEqual(['tcp://127.0.0.1:7200']);
  });
});

describe('bounds under floods', () => {
  it('tp_size x pp_size over the limit is a BootstrapLimitError (400)', async () => {
    const s = await start();
    expect(() => parseRegistration({ engine_id: 'e', tp_rank: 0, pp_rank: 0, tp_size: 4096, pp_size: 4096, addr: 'tcp://h:1' })).toThrow(BootstrapLimitError);
    const r = await post(s.address, '/register', JSON.stringify({ engine_id: 'e', tp_rank: 0, pp_rank: 0, tp_size: 4096, pp_size: 2, addr: 'tcp://h:1' }));
    expect(r).toMatchObject({ status: 400, json: { error: expect.stringMatching(/tp_size x pp_size must be at most 4096/) } });
  });

  it('300 registrations with tp_size 4096 (the issue: 29 killed the producer): engines capped, memory and answers bounded', async () => {
    const s = await start();
    global.gc?.();
    const heap0 = process.memoryUsage().heapUsed;
    const statuses: number[] = [];
    for (let i = 0; i < 300; i++) {
      const b = JSON.stringify({ engine_id: `flood-${i}`, tp_rank: i % 4096, pp_rank: 0, tp_size: 4096, pp_size: 1, addr: 'tcp://127.0.0.1:1' });
      statuses.push((await post(s.address, '/register', b)).status);
    }
    expect(statuses.filter((x) => x === 200)).toHaveLength(BOOTSTRAP_MAX_ENGINES);
    expect(statuses.filter((x) => x === 409)).toHaveLength(300 - BOOTSTRAP_MAX_ENGINES);
    expect(s.counts).toEqual({ engines: BOOTSTRAP_MAX_ENGINES, workers: BOOTSTRAP_MAX_ENGINES });
    // Sparse tables: memory follows registrations (a dense 4096-slot table per engine would not).
    expect(process.memoryUsage().heapUsed - heap0).toBeLessThan(64 * 1024 * 1024);
    const t0 = Date.now();
    expect((await fetch(`http://${s.address}/query?engine_id=flood-1`)).status).toBe(200);
    expect(Date.now() - t0).toBeLessThan(2000);
  });

  it('a body over the limit is refused while it is read, not after (413 before the client ends it)', async () => {
    const s = await start();
    const status = await new Promise<number>((resolve, reject) => {
      const req = http.request({ host: '127.0.0.1', port: Number(s.address.split(':')[1]), method: 'POST', path: '/register' }, (res) => resolve(res.statusCode!));
      req.on('error', reject);
      req.write('x'.repeat(BOOTSTRAP_MAX_BODY + 1000)); // chunked, no content-length, never ended
    });
    expect(status).toBe(413);
  });

  it('the client refuses an answer over its limit while reading it (the server never ends it)', async () => {
    const srv = http.createServer((_q, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      const chunk = 'x'.repeat(64 * 1024);
      for (let i = 0; i < BOOTSTRAP_LIMITS.answerBytes / chunk.length + 2; i++) res.write(chunk);
      // never ended
    });
    await new Promise<void>((r) => srv.listen(0, '127.0.0.1', () => r()));
    servers.push({ close: () => new Promise<void>((r) => (srv.closeAllConnections(), srv.close(() => r()))) });
    const addr = `127.0.0.1:${(srv.address() as AddressInfo).port}`;
    await expect(queryEngine(addr, 'e', { deadlineMs: 10_000 })).rejects.toThrow(BootstrapLimitError);
  });

  it('the client refuses an answer whose declared length is over its limit before reading it (register and query)', async () => {
    const srv = http.createServer((_q, res) => {
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': String(BOOTSTRAP_LIMITS.answerBytes + 1) });
      res.write('{"engine_id":'); // a few bytes, then nothing: only the declared length can refuse it in time
    });
    await new Promise<void>((r) => srv.listen(0, '127.0.0.1', () => r()));
    servers.push({ close: () => new Promise<void>((r) => (srv.closeAllConnections(), srv.close(() => r()))) });
    const addr = `127.0.0.1:${(srv.address() as AddressInfo).port}`;
    const t0 = Date.now();
    await expect(queryEngine(addr, 'e', { deadlineMs: 3_000 })).rejects.toThrow(BootstrapLimitError);
    await expect(registerWorker(addr, { engineId: 'e', tpRank: 0, ppRank: 0, tpSize: 1, ppSize: 1, addr: 'tcp://127.0.0.1:1' }, { timeoutMs: 3_000, attempts: 1 })).rejects.toThrow(/over 1048576/);
    expect(Date.now() - t0).toBeLessThan(2_500);
  });
});
