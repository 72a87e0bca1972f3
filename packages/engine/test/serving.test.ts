/**
 * Serving under misuse (issue 11, part 5): a client that disconnects aborts its request on the
 * producer and the consumer (KV freed); a consumer that is down gets no prefills (503, nothing
 * prefilled on the producer) and is used again once back; `EngineClient` resends, once, a request
 * whose reused keep-alive connection the server reset before answering. Engines in this process
 * over `InProcessConnector`, behind their HTTP servers and the proxy server. Assertions are on
 * engine state and counts (steps, requests, blocks), never on wall time.
 */
import { createServer, type Socket } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import type { Engine } from '../src/engine.js';
import { EngineClient, EngineClientError } from '../src/server/engine-client.js';
import { startEngineServer, type EngineServer } from '../src/server/engine-server.js';
import { startProxyServer, type ProxyServer } from '../src/server/proxy-server.js';
import { makePD, single, until } from './utils/pd.js';

const cleanups: Array<() => Promise<unknown>> = [];
afterEach(async () => {
  while (cleanups.length) await cleanups.pop()!().catch(() => {});
});

async function serve(engine: Engine, o: Parameters<typeof startEngineServer>[1] = {}): Promise<EngineServer> {
  const s = await startEngineServer(engine, o);
  cleanups.push(() => s.close());
  return s;
}

async function proxyOver(o: Parameters<typeof startProxyServer>[0]): Promise<ProxyServer> {
  const s = await startProxyServer(o);
  cleanups.push(() => s.close());
  return s;
}

function post(url: string, body: object, signal?: AbortSignal): Promise<{ status: number; body: any }> {
  return fetch(`${url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body), signal }).then(async (res) => ({ status: res.status, body: await res.json() }));
}

/** Counts `generate` calls of an engine (its server calls it once per completion). */
function countGenerates(e: Engine): { n: number } {
  const c = { n: 0 };
  const orig = e.generate.bind(e);
  e.generate = (...args: Parameters<Engine['generate']>) => {
    c.n++;
    return orig(...args);
  };
  return c;
}

const idle = (e: Engine) => e.scheduler.numUnfinished === 0 && e.scheduler.delayedFree.size === 0;
const allFree = (e: Engine) => e.scheduler.kv.pool.numFree === e.scheduler.kv.pool.numBlocks;

describe('client disconnect aborts the request on both engines', () => {
  it('long decodes: the consumer aborts them within a few steps and frees their KV; the next request is served normally', async () => {
    const pd = makePD({ model: 'dense-gqa' });
    cleanups.push(() => pd.shutdown());
    const p = await serve(pd.producer);
    const d = await serve(pd.consumer);
    const proxy = await proxyOver({ prefill: [p.url], decode: [d.url] });
    const MAX = 900;
    const clients = Array.from({ length: 4 }, () => new AbortController());
    const gone = clients.map((ac, i) => post(proxy.url, { prompt: `long decode number ${i}`, max_tokens: MAX, ignore_eos: true }, ac.signal).catch((e: unknown) => e));
    await until(() => pd.consumer.scheduler.running.length === 4 && pd.consumer.scheduler.running.every((r) => r.outputTokenIds.length > 0), 20_000);
    const stepsAtAbort = pd.consumer.stats.steps;
    for (const ac of clients) ac.abort();
    for (const g of await Promise.all(gone)) expect(g).toBeInstanceOf(Error);
    await until(() => idle(pd.consumer) && idle(pd.producer), 20_000);
    // Without the abort the four requests would decode to MAX tokens: hundreds more steps.
    expect(pd.consumer.stats.steps - stepsAtAbort).toBeLessThan(50);
    expect(allFree(pd.consumer)).toBe(true);
    expect(allFree(pd.producer)).toBe(true);

    const ref = await single('dense-gqa').generate('a normal request', { maxTokens: 6, ignoreEos: true });
    const r = await post(proxy.url, { prompt: 'a normal request', max_tokens: 6, ignore_eos: true });
    expect(r.status).toBe(200);
    expect(r.body.choices[0].token_ids).toEqual(ref.tokenIds);
  });

  it('long prefills: the producer aborts them (requestFinished with abort: KV freed, nothing sent) and the consumer is never asked', async () => {
    // A small step budget: a 2000-token prompt takes over a hundred producer steps.
    const pd = makePD({ model: 'dense-gqa', producer: { maxNumBatchedTokens: 16 } });
    cleanups.push(() => pd.shutdown());
    const p = await serve(pd.producer);
    const d = await serve(pd.consumer);
    const proxy = await proxyOver({ prefill: [p.url], decode: [d.url] });
    const consumerCalls = countGenerates(pd.consumer);
    const finished: string[] = [];
    const onFinish = pd.producer.scheduler.finish.bind(pd.producer.scheduler);
    pd.producer.scheduler.finish = (r, reason, error) => {
      finished.push(reason);
      onFinish(r, reason, error);
    };
    const ids = Array.from({ length: 2000 }, (_, i) => 1 + (i % 200));
    const clients = [new AbortController(), new AbortController()];
    const gone = clients.map((ac) => post(proxy.url, { prompt: ids, max_tokens: 4 }, ac.signal).catch((e: unknown) => e));
    await until(() => pd.producer.scheduler.running.length === 2 && pd.producer.scheduler.running.every((r) => r.numComputedTokens > 0), 20_000);
    const stepsAtAbort = pd.producer.stats.steps;
    for (const ac of clients) ac.abort();
    await Promise.all(gone);
    await until(() => idle(pd.producer), 20_000);
    expect(pd.producer.stats.steps - stepsAtAbort).toBeLessThan(20);
    expect(finished).toEqual(['abort', 'abort']);
    expect(allFree(pd.producer)).toBe(true);
    expect(consumerCalls.n).toBe(0);
  });
});

describe('a consumer that is down gets no prefills', () => {
  it('after the first failed connect, requests fail fast with 503 and are not prefilled; /health brings it back', async () => {
    const pd = makePD({ model: 'dense-gqa' });
    cleanups.push(() => pd.shutdown());
    const p = await serve(pd.producer);
    let d = await serve(pd.consumer);
    // Interval long: only a failed request or /health changes what the proxy knows.
    const proxy = await proxyOver({ prefill: [p.url], decode: [d.url], consumerCheckIntervalMs: 600_000 });
    expect((await post(proxy.url, { prompt: 'warm', max_tokens: 2 })).status).toBe(200);
    const prefills = countGenerates(pd.producer);
    const port = d.port;
    await d.close();
    const first = await post(proxy.url, { prompt: 'first after the consumer stopped', max_tokens: 2 });
    expect(first.status).toBe(502);
    const rs = await Promise.all(Array.from({ length: 20 }, (_, i) => post(proxy.url, { prompt: `while down ${i}`, max_tokens: 2 })));
    expect(rs.map((r) => r.status)).toEqual(Array(20).fill(503));
    expect(rs[0].body.error.message).toMatch(/^consumer http:\/\/127\.0\.0\.1:\d+ is unreachable \(.*\); the request was not sent to the producer$/);
    // Only the first request was prefilled; its blocks wait for their lease, nothing else is held.
    expect(prefills.n).toBe(1);
    expect(pd.producer.scheduler.requests.size).toBeLessThanOrEqual(1);
    expect(pd.producer.scheduler.kv.usage).toBeLessThan(0.05);

    d = await serve(pd.consumer, { port });
    expect((await fetch(`${proxy.url}/health`)).status).toBe(200);
    const back = await post(proxy.url, { prompt: 'back again', max_tokens: 2 });
    expect(back.status).toBe(200);
    expect(prefills.n).toBe(2);
  });

  it('a consumer not heard from within the interval is checked before the prefill: a stopped one gets none, and is used again once back', async () => {
    const pd = makePD({ model: 'dense-gqa' });
    cleanups.push(() => pd.shutdown());
    const p = await serve(pd.producer);
    let d = await serve(pd.consumer);
    const proxy = await proxyOver({ prefill: [p.url], decode: [d.url], consumerCheckIntervalMs: 0 });
    const prefills = countGenerates(pd.producer);
    const port = d.port;
    await d.close();
    const rs = await Promise.all(Array.from({ length: 10 }, (_, i) => post(proxy.url, { prompt: `while down ${i}`, max_tokens: 2 })));
    expect(rs.map((r) => r.status)).toEqual(Array(10).fill(503));
    expect(prefills.n).toBe(0);
    expect(pd.producer.scheduler.kv.usage).toBe(0);
    d = await serve(pd.consumer, { port });
    const back = await post(proxy.url, { prompt: 'back again', max_tokens: 2 });
    expect(back.status).toBe(200);
    expect(prefills.n).toBe(1);
  });

  it('round robin skips a consumer that is down while another is up', async () => {
    const pd = makePD({ model: 'dense-gqa' });
    cleanups.push(() => pd.shutdown());
    const p = await serve(pd.producer);
    const d = await serve(pd.consumer);
    const spare = await serve(single('dense-gqa'));
    const proxy = await proxyOver({ prefill: [p.url], decode: [spare.url, d.url], consumerCheckIntervalMs: 600_000 });
    await spare.close();
    expect((await post(proxy.url, { prompt: 'to the stopped one', max_tokens: 2 })).status).toBe(502);
    for (let i = 0; i < 4; i++) {
      const r = await post(proxy.url, { prompt: `spread ${i}`, max_tokens: 2 });
      expect(r.status).toBe(200);
      expect(r.body.kvconnect.decode.engine_id).toBe(pd.consumer.engineId);
    }
  });
});

/**
 * A minimal HTTP/1.1 server: answers the first request of each connection (keep-alive) and resets
 * (RST, nothing read) any connection on which a later request arrives, as a server does when it
 * drops an idle keep-alive connection just as a request goes out on it. `resetFirst`: reset the
 * first request too.
 */
async function resettingServer(resetFirst = false): Promise<{ url: string; connections: () => number; resets: () => number; answered: () => number; close: () => Promise<void> }> {
  let connections = 0;
  let resets = 0;
  let answered = 0;
  const sockets = new Set<Socket>();
  const server = createServer((s) => {
    connections++;
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
    s.on('error', () => {});
    let served = 0;
    let buf = Buffer.alloc(0);
    s.on('data', (c: Buffer) => {
      if (served > 0 || resetFirst) {
        resets++;
        s.resetAndDestroy();
        return;
      }
      buf = Buffer.concat([buf, c]);
      const end = buf.indexOf('\r\n\r\n');
      if (end < 0) return;
      const len = Number(/content-length: *(\d+)/i.exec(buf.subarray(0, end).toString('latin1'))?.[1] ?? 0);
      if (buf.length < end + 4 + len) return;
      served++;
      answered++;
      const body = JSON.stringify({ ok: true, n: answered });
      s.write(`HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\nconnection: keep-alive\r\nkeep-alive: timeout=60\r\n\r\n${body}`);
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as { port: number }).port;
  return {
    url: `http://127.0.0.1:${port}`,
    connections: () => connections,
    resets: () => resets,
    answered: () => answered,
    close: async () => {
      for (const s of sockets) s.destroy();
      await new Promise<void>((r) => server.close(() => r()));
    },
  };
}

describe('EngineClient over keep-alive connections', () => {
  it('a request the server reset on a reused connection before answering is sent again once: 50 sequential requests, 0 failures', async () => {
    const srv = await resettingServer();
    cleanups.push(() => srv.close());
    const c = new EngineClient(srv.url);
    const statuses: number[] = [];
    for (let i = 0; i < 50; i++) statuses.push((await c.completion({ prompt: `r${i}` })).status);
    expect(statuses).toEqual(Array(50).fill(200));
    // Every request after the first went out on the kept connection first, which the server reset.
    expect(srv.resets()).toBe(49);
    expect(srv.answered()).toBe(50);
    c.close();
  });

  it('a reset on a fresh connection is not retried (the request may have been taken)', async () => {
    const srv = await resettingServer(true);
    cleanups.push(() => srv.close());
    const e = await new EngineClient(srv.url).completion({ prompt: 'x' }).catch((x: unknown) => x);
    expect(e).toBeInstanceOf(EngineClientError);
    expect((e as EngineClientError).status).toBe(0);
    expect((e as EngineClientError).unreachable).toBe(true);
    expect(srv.connections()).toBe(1);
  });

  it('an aborted call rejects as aborted, not as a timeout or an unreachable server', async () => {
    const pd = makePD({ model: 'dense-gqa' });
    cleanups.push(() => pd.shutdown());
    const d = await serve(pd.consumer);
    const pr = await pd.producer.generate('held load', { maxTokens: 1 }, { do_remote_decode: true });
    pd.bus.pause();
    const ac = new AbortController();
    const call = new EngineClient(d.url).generate('held load', { maxTokens: 2 }, { ...pr.kvTransferParams, do_remote_prefill: true }, 'held', { signal: ac.signal }).catch((x: unknown) => x);
    await until(() => pd.consumer.scheduler.requests.get('held')?.status === 'WAITING_FOR_REMOTE_KVS');
    ac.abort();
    const e = (await call) as EngineClientError;
    expect(e).toBeInstanceOf(EngineClientError);
    expect([e.aborted, e.timedOut, e.unreachable]).toEqual([true, false, false]);
    await until(() => pd.consumer.scheduler.requests.get('held')?.abortPending === true);
    pd.bus.resume();
    await until(() => idle(pd.consumer));
  });
});
