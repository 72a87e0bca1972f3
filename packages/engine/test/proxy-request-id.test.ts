/**
 * The proxy server passes a client's `request_id` on to both sides (`<id>-p`, `<id>-d`), so a
 * client can carry a request's identity (e.g. the harness's `r<index>.…`, by which faults pick
 * their requests) whatever the order requests arrive in; without one it names them `pd-<n>-…`.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { startEngineServer } from '../src/server/engine-server.js';
import { startProxyServer } from '../src/server/proxy-server.js';
import { makePD } from './utils/pd.js';

const cleanups: Array<() => Promise<unknown>> = [];
afterEach(async () => {
  while (cleanups.length) await cleanups.pop()!().catch(() => {});
});

async function post(url: string, body: object): Promise<{ status: number; body: any }> {
  const res = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  return { status: res.status, body: await res.json() };
}

describe('proxy server request_id', () => {
  it('names the two sides <request_id>-p and <request_id>-d; too long is a 400; none gives pd-<n>-...', async () => {
    const pd = makePD({ model: 'dense-gqa' });
    cleanups.push(() => pd.shutdown());
    const p = await startEngineServer(pd.producer);
    cleanups.push(() => p.close());
    const d = await startEngineServer(pd.consumer);
    cleanups.push(() => d.close());
    const proxy = await startProxyServer({ prefill: [p.url], decode: [d.url] });
    cleanups.push(() => proxy.close());
    const u = `${proxy.url}/v1/completions`;
    const r = await post(u, { prompt: 'Hello P/D world', max_tokens: 2, request_id: 'r7.mine' });
    expect(r.status).toBe(200);
    expect(r.body.kvconnect.prefill.request_id).toBe('r7.mine-p');
    expect(r.body.kvconnect.decode.request_id).toBe('r7.mine-d');
    const long = await post(u, { prompt: 'Hello', max_tokens: 2, request_id: 'x'.repeat(127) });
    expect(long.status).toBe(400);
    expect(long.body.error.message).toMatch(/request_id: at most 126 characters/);
    const plain = await post(u, { prompt: 'Hello P/D world', max_tokens: 2 });
    expect(plain.status).toBe(200);
    expect(plain.body.kvconnect.decode.request_id).toMatch(/^pd-\d+-[0-9a-f]{8}-d$/);
  });
});
