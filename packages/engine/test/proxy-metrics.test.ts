/**
 * The proxy's own `GET /metrics` and its access log: one line per request with the request id,
 * status and latency; metrics by route and status, promtool-clean.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { startEngineServer } from '../src/server/engine-server.js';
import { PROXY_METRIC_NAMES, startProxyServer } from '../src/server/proxy-server.js';
import { makePD } from './utils/pd.js';
import { PROMTOOL, promtoolCheck, sampleValue } from './utils/prom.js';

const cleanups: Array<() => Promise<unknown>> = [];
afterEach(async () => {
  while (cleanups.length) await cleanups.pop()!().catch(() => {});
});

describe('proxy /metrics and access log', () => {
  it('counts requests by route and status, times them, and logs request id, status and latency', async () => {
    const pd = makePD({ model: 'dense-gqa' });
    cleanups.push(() => pd.shutdown());
    const p = await startEngineServer(pd.producer);
    const d = await startEngineServer(pd.consumer);
    cleanups.push(() => p.close(), () => d.close());
    const lines: Array<Record<string, unknown>> = [];
    const logger = { info: (f: object, msg: string) => lines.push({ ...f, msg }), warn: (f: object, msg: string) => lines.push({ ...f, msg, level: 'warn' }) };
    const proxy = await startProxyServer({ prefill: [p.url], decode: [d.url], logger });
    cleanups.push(() => proxy.close());
    const ok = await fetch(`${proxy.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-request-id': 'acc-1' }, body: JSON.stringify({ prompt: 'Hello P/D', max_tokens: 2 }) });
    expect(ok.status).toBe(200);
    await ok.text();
    const bad = await fetch(`${proxy.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"prompt":' });
    expect(bad.status).toBe(400);
    await bad.text();
    expect((await fetch(`${proxy.url}/nope`)).status).toBe(404);
    const res = await fetch(`${proxy.url}/metrics`);
    expect(res.headers.get('content-type')).toMatch(/^text\/plain; version=0\.0\.4/);
    const text = await res.text();
    const N = PROXY_METRIC_NAMES;
    expect(sampleValue(text, N.requests, { route: '/v1/completions', status: '200' })).toBe(1);
    expect(sampleValue(text, N.requests, { route: '/v1/completions', status: '400' })).toBe(1);
    expect(sampleValue(text, N.requests, { route: 'other', status: '404' })).toBe(1);
    expect(sampleValue(text, `${N.requestSeconds}_count`, { route: '/v1/completions' })).toBe(2);
    expect(sampleValue(text, N.inFlight)).toBe(0);
    // sampleValue read the text strictly (utils/prom.ts); promtool lints it too where installed
    if (PROMTOOL) expect(promtoolCheck(text)).toEqual({ code: 0, output: '' });
    const access = lines.filter((l) => l.msg === 'request');
    expect(access.map((l) => [l.requestId, l.method, l.path, l.status])).toEqual([
      ['acc-1', 'POST', '/v1/completions', 200],
      [null, 'POST', '/v1/completions', 400],
      [null, 'GET', '/nope', 404],
      [null, 'GET', '/metrics', 200],
    ]);
    for (const l of access) expect(typeof l.latencyMs === 'number' && l.latencyMs >= 0).toBe(true);
  });
});
