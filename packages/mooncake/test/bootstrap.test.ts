/**
 * The bootstrap server and its client: register / query over HTTP, completeness, re-registration
 * with another layout, strict validation of bodies and answers (4xx, never a crash), deadlines
 * and retries.
 */
import * as http from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { BOOTSTRAP_MAX_BODY, BootstrapError, BootstrapServer, parseEngineWorkers, parseRegistration, queryEngine, registerWorker } from '../src/bootstrap.js';

const servers: Array<{ close(): unknown }> = [];
afterEach(async () => {
  for (const s of servers.splice(0)) await s.close();
});

async function start(): Promise<BootstrapServer> {
  const s = await BootstrapServer.start({ port: 0 });
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
    await expect(queryEngine(s.address, 'missing', { deadlineMs: 60, pollMs: 10 })).rejects.toThrow(/HTTP 404/);
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
