/**
 * The engine and proxy HTTP servers in this process: completions through `EngineClient` equal
 * `Engine.generate`; strict validation (bad bodies answer 4xx, the server keeps serving); stop
 * sequences; `/metrics`; timeouts, duplicate ids and client disconnects; P/D through
 * `startProxyServer` over two engine servers joined by `InProcessConnector` (sequential and
 * concurrent; checksum verdicts in the `kvconnect` field; a failed load answers 500); CLI parsing.
 */
import { request as httpRequest } from 'node:http';
import { afterEach, describe, expect, it } from 'vitest';
import { Engine } from '../src/engine.js';
import { EngineClient, EngineClientError } from '../src/server/engine-client.js';
import { startEngineServer, type EngineServer } from '../src/server/engine-server.js';
import { ENGINE_FLAGS, ENGINE_USAGE, engineOptionsOf, parseEngineArgs, parseProxyArgs } from '../src/server/main.js';
import { findStop, parseCompletionRequest } from '../src/server/protocol.js';
import { startProxyServer, type ProxyServer } from '../src/server/proxy-server.js';
import { makePD, single, until } from './utils/pd.js';

const PROMPT = 'Hello P/D world, how are you?';
const S = { maxTokens: 6, ignoreEos: true };

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

async function post(url: string, body: string | object, headers: Record<string, string> = { 'content-type': 'application/json' }): Promise<{ status: number; body: any }> {
  const res = await fetch(url, { method: 'POST', headers, body: typeof body === 'string' ? body : JSON.stringify(body) });
  const text = await res.text();
  return { status: res.status, body: text ? JSON.parse(text) : undefined };
}

describe('engine server', () => {
  it('a completion through EngineClient equals Engine.generate (text and token ids)', async () => {
    const ref = await single('dense-gqa').generate(PROMPT, S);
    const server = await serve(single('dense-gqa'));
    const client = await EngineClient.connect(server.url);
    expect(client.engineId).toMatch(/^single-/);
    const r = await client.generate(PROMPT, S);
    expect(r.tokenIds).toEqual(ref.tokenIds);
    expect(r.text).toBe(ref.text);
    expect(r.finishReason).toBe('length');
    expect(r.usage).toEqual({ prompt_tokens: PROMPT.length + 1, completion_tokens: 6, total_tokens: PROMPT.length + 7 });
    // Token id prompts, temperature sampling with a seed (deterministic), raw response shape.
    const ids = [256, ...Buffer.from(PROMPT)];
    const sampled = await single('dense-gqa').generate(ids, { maxTokens: 5, temperature: 0.8, seed: 7, ignoreEos: true });
    const { status, body } = await post(`${server.url}/v1/completions`, { prompt: ids, max_tokens: 5, temperature: 0.8, seed: 7, ignore_eos: true, request_id: 'mine-1', model: 'dense-gqa' });
    expect(status).toBe(200);
    expect(body).toMatchObject({ id: 'cmpl-mine-1', object: 'text_completion', model: 'dense-gqa', kvconnect: { engine_id: client.engineId, request_id: 'mine-1', num_preemptions: 0 } });
    expect(body.choices).toEqual([{ index: 0, text: sampled.text, token_ids: sampled.tokenIds, finish_reason: 'length', logprobs: null }]);
    expect(body.kv_transfer_params).toBeUndefined();
  });

  it('answers concurrent requests (continuous batching) like sequential ones', async () => {
    const engine = single('dense-gqa');
    const server = await serve(engine);
    const client = new EngineClient(server.url);
    const prompts = ['one', 'two two', 'three three three', 'four'];
    const rs = await Promise.all(prompts.map((p) => client.generate(p, S)));
    const ref = single('dense-gqa');
    for (let i = 0; i < prompts.length; i++) expect(rs[i].tokenIds).toEqual((await ref.generate(prompts[i], S)).tokenIds);
  });

  it('bad requests answer 4xx with a clear message, and the server keeps serving', async () => {
    const server = await serve(single('dense-gqa'), { maxBodyBytes: 4096 });
    const u = `${server.url}/v1/completions`;
    const cases: Array<[string | object, number, RegExp, Record<string, string>?]> = [
      ['{bad json', 400, /not valid JSON/],
      ['', 400, /empty/],
      ['[1,2]', 400, /must be a JSON object, got array/],
      ['null', 400, /must be a JSON object, got null/],
      [{}, 400, /prompt: required/],
      [{ prompt: '' }, 400, /prompt: must not be empty/],
      [{ prompt: [] }, 400, /prompt: must not be empty/],
      [{ prompt: ['a', 'b'] }, 400, /batched prompts/],
      [{ prompt: [1, 2, 999] }, 400, /token ids must be integers in \[0, 259\)/],
      [{ prompt: [1.5] }, 400, /token ids/],
      [{ prompt: 42 }, 400, /expected a string or an array/],
      [{ prompt: 'x', max_tokens: 0 }, 400, /max_tokens: must be in \[1, 4096\]/],
      [{ prompt: 'x', max_tokens: 2.5 }, 400, /max_tokens: expected an integer/],
      [{ prompt: 'x', max_tokens: '3' }, 400, /max_tokens: expected an integer, got string/],
      [{ prompt: 'x', temperature: -1 }, 400, /temperature/],
      [{ prompt: 'x', temperature: 'hot' }, 400, /temperature: expected a number/],
      [{ prompt: 'x', seed: 1e300 }, 400, /seed/],
      [{ prompt: 'x', stop: 5 }, 400, /stop: expected a string or an array/],
      [{ prompt: 'x', stop: ['a', 'b', 'c', 'd', 'e'] }, 400, /at most 4/],
      [{ prompt: 'x', stop: [''] }, 400, /stop: sequences/],
      [{ prompt: 'x', stop_token_ids: [-1] }, 400, /stop_token_ids/],
      [{ prompt: 'x', ignore_eos: 'yes' }, 400, /ignore_eos/],
      [{ prompt: 'x', kv_transfer_params: [1] }, 400, /kv_transfer_params: expected an object/],
      [{ prompt: 'x', request_id: 'a b' }, 400, /request_id/],
      [{ prompt: 'x', stream: 'yes' }, 400, /stream: expected a boolean/],
      [{ prompt: 'x', n: 2 }, 400, /n: 2 is not supported/],
      [{ prompt: 'x', temperature: 0.5, top_k: 3, __proto__x: 1 }, 400, /top_k: 3 is not supported/],
      [{ prompt: 'x', model: 'gpt-4' }, 404, /The model `gpt-4` does not exist/],
      // 256 blocks of 16 tokens, one KV cache group: 4096 tokens per request at most.
      [{ prompt: 'x'.repeat(10), max_tokens: 4090 }, 400, /prompt \(11 tokens\) plus max_tokens \(4090\) exceeds the engine's max model length 4096/],
      ['{"prompt":"x"}', 415, /content-type must be application\/json/, { 'content-type': 'text/plain' }],
      [JSON.stringify({ prompt: 'x'.repeat(5000) }), 413, /larger than 4096 bytes/],
    ];
    for (const [body, status, msg, headers] of cases) {
      const r = await post(u, body, headers);
      expect({ body, status: r.status }).toEqual({ body, status });
      if (status !== 200) {
        expect(r.body.error.code).toBe(status);
        expect(r.body.error.message).toMatch(msg);
      }
    }
    // A body larger than the limit without content-length (chunked).
    const chunked = await new Promise<number>((resolve, reject) => {
      const req = httpRequest(u, { method: 'POST', headers: { 'content-type': 'application/json', 'transfer-encoding': 'chunked' } }, (res) => {
        res.resume();
        resolve(res.statusCode!);
      });
      req.on('error', reject);
      req.write('{"prompt":"');
      req.end(`${'y'.repeat(8000)}"}`);
    });
    expect(chunked).toBe(413);
    // Routes and methods.
    expect((await fetch(u)).status).toBe(405);
    expect((await fetch(`${server.url}/nope`)).status).toBe(404);
    expect((await post(`${server.url}/health`, {})).status).toBe(405);
    // Still serving.
    const ok = await post(u, { prompt: 'still alive', max_tokens: 2 });
    expect(ok.status).toBe(200);
    expect(ok.body.choices[0].token_ids).toHaveLength(ok.body.usage.completion_tokens);
  });

  it('stop sequences cut the output before the first match (bytes), finish_reason stop', async () => {
    const ref = await single('dense-gqa').generate(PROMPT, { maxTokens: 24, ignoreEos: true });
    const server = await serve(single('dense-gqa'));
    // A printable ASCII byte the reference output contains (the engine stops on it early).
    const k = ref.tokenIds.findIndex((t) => t >= 0x21 && t < 0x7f);
    expect(k).toBeGreaterThanOrEqual(0);
    const stop = String.fromCharCode(ref.tokenIds[k]);
    const r = await post(`${server.url}/v1/completions`, { prompt: PROMPT, max_tokens: 24, ignore_eos: true, stop: ['never-there', stop] });
    expect(r.status).toBe(200);
    expect(r.body.choices[0].token_ids).toEqual(ref.tokenIds.slice(0, k));
    expect(r.body.choices[0].finish_reason).toBe('stop');
    expect(r.body.usage.completion_tokens).toBe(k);
    // Multi-byte sequences match on bytes, earliest match wins.
    expect(findStop([104, 105, 0xc3, 0xa9, 33], ['\u00e9'])).toBe(2);
    expect(findStop([104, 105, 0xc3, 0xa9, 33], ['!', 'i'])).toBe(1);
    expect(findStop([104, 105], ['hix'])).toBe(-1);
  });

  it('/health, and /metrics serves the engine registry as Prometheus text', async () => {
    const pd = makePD({ model: 'dense-gqa' });
    cleanups.push(() => pd.shutdown());
    const p = await serve(pd.producer);
    const d = await serve(pd.consumer);
    const plain = await serve(single('dense-gqa'));
    const h = await (await fetch(`${d.url}/health`)).json();
    expect(h).toMatchObject({ status: 'ok', engine_id: pd.consumer.engineId, kv_connector: 'InProcessConnector', kv_role: 'kv_consumer', enable_kv_checksum: true, in_flight: 0 });
    const proxy = await proxyOver({ prefill: [p.url], decode: [d.url] });
    expect((await post(`${proxy.url}/v1/completions`, { prompt: PROMPT, max_tokens: 3 })).status).toBe(200);
    const res = await fetch(`${d.url}/metrics`);
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toMatch(/^text\/plain; version=0\.0\.4/);
    const text = await res.text();
    expect(text).toContain('# TYPE kvconnect_kv_checksum_loads_total counter');
    expect(text).toContain('kvconnect_kv_checksum_loads_total{verdict="verified"} 1');
    expect(await new EngineClient(p.url).metrics()).toContain('kvconnect_kv_checksum_payloads_sent_total{carrier="kv_transfer_params"} 1');
    // the engine metrics (vLLM's names with kvconnect_) are there too; an engine without a transfer config has only them
    expect(text).toMatch(new RegExp(`^kvconnect_generation_tokens_total\\{model_name="${pd.consumer.model.name}",engine="${pd.consumer.engineId}"\\} 3$`, 'm'));
    const plainText = await (await fetch(`${plain.url}/metrics`)).text();
    expect(plainText).toContain('# TYPE kvconnect_num_requests_running gauge');
    expect(plainText).not.toContain('kvconnect_kv_checksum');
  });

  it('timeouts answer 504 and abort; an in-use request_id answers 409; a disconnected client aborts', async () => {
    const pd = makePD({ model: 'dense-gqa' });
    cleanups.push(() => pd.shutdown());
    const d = await serve(pd.consumer, { requestTimeoutMs: 300 });
    const p = await pd.producer.generate(PROMPT, { maxTokens: 1 }, { do_remote_decode: true });
    const params = { ...p.kvTransferParams, do_remote_prefill: true };
    pd.bus.pause();
    const u = `${d.url}/v1/completions`;
    const slow = post(u, { prompt: PROMPT, max_tokens: 4, kv_transfer_params: params, request_id: 'held' });
    await until(() => pd.consumer.scheduler.requests.get('held')?.status === 'WAITING_FOR_REMOTE_KVS');
    const dup = await post(u, { prompt: PROMPT, request_id: 'held' });
    expect(dup.status).toBe(409);
    expect(dup.body.error.message).toMatch(/in use/);
    const r = await slow;
    expect(r.status).toBe(504);
    expect(r.body.error.message).toMatch(/ran past 300 ms and was aborted/);
    expect(pd.consumer.scheduler.requests.get('held')?.abortPending).toBe(true);
    pd.bus.resume();
    await until(() => !pd.consumer.scheduler.requests.has('held'));

    // Client disconnect: abort the fetch while the load is held.
    pd.bus.pause();
    const ac = new AbortController();
    const gone = fetch(u, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ prompt: PROMPT, max_tokens: 4, kv_transfer_params: params, request_id: 'gone' }), signal: ac.signal });
    await until(() => pd.consumer.scheduler.requests.get('gone')?.status === 'WAITING_FOR_REMOTE_KVS');
    ac.abort();
    await expect(gone).rejects.toThrow();
    await until(() => pd.consumer.scheduler.requests.get('gone')?.abortPending === true);
    pd.bus.resume();
    await until(() => !pd.consumer.scheduler.requests.has('gone'));
    expect(pd.consumer.scheduler.kv.pool.numFree).toBe(pd.consumer.scheduler.kv.pool.numBlocks);
  });

  it('close() waits for running requests; POST /shutdown closes and calls onShutdown', async () => {
    let shutdowns = 0;
    // A request held in its KV load stays running while close() waits.
    const pd = makePD({ model: 'dense-gqa' });
    cleanups.push(() => pd.shutdown());
    const server = await serve(pd.consumer, { onShutdown: () => void shutdowns++ });
    const p = await pd.producer.generate(PROMPT, { maxTokens: 1 }, { do_remote_decode: true });
    pd.bus.pause();
    const running = post(`${server.url}/v1/completions`, { prompt: PROMPT, max_tokens: 5, ignore_eos: true, request_id: 'running', kv_transfer_params: { ...p.kvTransferParams, do_remote_prefill: true } });
    await until(() => pd.consumer.scheduler.requests.get('running')?.status === 'WAITING_FOR_REMOTE_KVS');
    let closed = false;
    const closing = server.close().then(() => (closed = true));
    await new Promise((r) => setTimeout(r, 50));
    expect(closed).toBe(false);
    pd.bus.resume();
    const r = await running;
    expect(r.status).toBe(200);
    expect(r.body.choices[0].token_ids).toHaveLength(5);
    await closing;
    await expect(fetch(`${server.url}/health`)).rejects.toThrow();

    const s2 = await serve(single('dense-gqa'));
    const c = new EngineClient(s2.url);
    await c.shutdown();
    await s2.closed;
    await expect(c.health()).rejects.toBeInstanceOf(EngineClientError);
    const s3 = await serve(single('dense-gqa'), { onShutdown: () => void shutdowns++ });
    await new EngineClient(s3.url).shutdown();
    await s3.closed;
    await until(() => shutdowns === 1);
  });

  it('EngineClient reports unreachable servers and timeouts as EngineClientError', async () => {
    const server = await serve(single('dense-gqa'));
    const url = server.url;
    await server.close();
    const e = await new EngineClient(url).generate('x').catch((x: unknown) => x);
    expect(e).toBeInstanceOf(EngineClientError);
    expect((e as EngineClientError).status).toBe(0);
    expect(() => new EngineClient('ftp://x')).toThrow(/http/);

    const pd = makePD({ model: 'dense-gqa' });
    cleanups.push(() => pd.shutdown());
    const d = await serve(pd.consumer);
    const p = await pd.producer.generate(PROMPT, { maxTokens: 1 }, { do_remote_decode: true });
    pd.bus.pause();
    const t = await new EngineClient(d.url, { timeoutMs: 200 }).generate(PROMPT, S, { ...p.kvTransferParams, do_remote_prefill: true }).catch((x: unknown) => x);
    expect(t).toBeInstanceOf(EngineClientError);
    expect((t as EngineClientError).timedOut).toBe(true);
    pd.bus.resume();
  });
});

describe('proxy server (P/D over HTTP, engines in this process)', () => {
  for (const mode of ['sequential', 'concurrent'] as const) {
    it(`${mode}: equals a single instance; kvconnect carries the producer's info and the verdict`, async () => {
      const ref = await single('dense-gqa').generate(PROMPT, S);
      const pd = makePD({ model: 'dense-gqa', mode });
      cleanups.push(() => pd.shutdown());
      const p = await serve(pd.producer);
      const d = await serve(pd.consumer);
      const proxy = await proxyOver({ prefill: [p.url], decode: [d.url], mode });
      const h = await (await fetch(`${proxy.url}/health`)).json();
      expect(h).toMatchObject({ status: 'ok', mode, prefill: [{ url: p.url, engine_id: pd.producer.engineId, ok: true }], decode: [{ ok: true }] });
      const r = await post(`${proxy.url}/v1/completions`, { prompt: PROMPT, max_tokens: 6, ignore_eos: true });
      expect(r.status).toBe(200);
      expect(r.body.choices[0].token_ids).toEqual(ref.tokenIds);
      expect(r.body.choices[0].text).toBe(ref.text);
      const kv = r.body.kvconnect;
      expect(kv.mode).toBe(mode);
      expect(kv.prefill).toMatchObject({ url: p.url, engine_id: pd.producer.engineId, finish_reason: 'length', checksum_payload: { sent: true } });
      expect(kv.decode).toMatchObject({ url: d.url, engine_id: pd.consumer.engineId, load: { verdict: 'verified', action: 'use', mismatches: [], unverified: [] } });
      if (mode === 'sequential') {
        expect(kv.prefill.kv_transfer_params).toMatchObject({ remote_engine_id: pd.producer.engineId });
        expect(typeof kv.prefill.kv_transfer_params.kv_checksums).toBe('string');
      }
      await until(() => pd.producer.scheduler.delayedFree.size === 0);
    });
  }

  it('a corrupted load under fail-closed + fail answers 500 with the reason; the proxy rejects kv_transfer_params', async () => {
    const pd = makePD({ model: 'dense-gqa', failClosed: true, policy: 'fail' });
    cleanups.push(() => pd.shutdown());
    const p = await serve(pd.producer);
    const d = await serve(pd.consumer);
    const proxy = await proxyOver({ prefill: [p.url], decode: [d.url] });
    pd.bus.faultHook = (ctx, bytes) => {
      if (ctx.groupId === 0 && ctx.token === 3 && ctx.head === 0 && ctx.part === 0) bytes[0] ^= 1;
    };
    const r = await post(`${proxy.url}/v1/completions`, { prompt: PROMPT, max_tokens: 4 });
    expect(r.status).toBe(500);
    expect(r.body.error.message).toMatch(/^decode \(http:\/\/127\.0\.0\.1:\d+\): /);
    expect(r.body.choices[0].finish_reason).toBe('error');
    expect(r.body.kvconnect.decode.load).toMatchObject({ verdict: 'mismatch', action: 'fail', mismatches: [{ groupId: 0, positions: [0] }] });
    const bad = await post(`${proxy.url}/v1/completions`, { prompt: PROMPT, kv_transfer_params: {} });
    expect(bad.status).toBe(400);
    expect(bad.body.error.message).toMatch(/kv_transfer_params: not accepted here/);
  });

  it('round robin over several engines; an unreachable engine answers 502; startup needs reachable engines', async () => {
    const engines = [single('dense-gqa'), single('dense-gqa')];
    const servers = await Promise.all(engines.map((e) => serve(e)));
    const proxy = await proxyOver({ prefill: servers.map((s) => s.url), decode: [servers[1].url, servers[0].url] });
    const seen: Array<[string, string]> = [];
    for (let i = 0; i < 4; i++) {
      const r = await post(`${proxy.url}/v1/completions`, { prompt: `round ${i}`, max_tokens: 2 });
      expect(r.status).toBe(200);
      seen.push([r.body.kvconnect.prefill.engine_id, r.body.kvconnect.decode.engine_id]);
    }
    const [a, b] = engines.map((e) => e.engineId);
    expect(seen).toEqual([
      [a, b],
      [b, a],
      [a, b],
      [b, a],
    ]);
    await servers[1].close();
    const r = await post(`${proxy.url}/v1/completions`, { prompt: 'x', max_tokens: 2 });
    expect([502]).toContain(r.status);
    expect(r.body.error.message).toMatch(/engine error/);
    expect((await fetch(`${proxy.url}/health`)).status).toBe(503);
    await expect(startProxyServer({ prefill: [servers[1].url], decode: [servers[0].url], connectTimeoutMs: 300 })).rejects.toThrow(/not reachable/);
  });
});

describe('CLI parsing', () => {
  it('engine: config file < --config-json < flags; imports accumulate; bad input is a UsageError', () => {
    const r = parseEngineArgs([
      '--config-json',
      JSON.stringify({ preset: 'mla', tpSize: 2, imports: ['a'], kvTransferConfig: { kv_connector: 'X', kv_role: 'kv_producer' } }),
      '--tp-size',
      '1',
      '--import',
      'b',
      '--kv-connector-module-path',
      './m.js',
      '--cache-layout',
      'HND',
      '--port',
      '0',
      '--disable-prefix-caching',
    ]);
    expect(r).toEqual({
      help: false,
      exitWithParent: false,
      config: {
        preset: 'mla',
        tpSize: 1,
        imports: ['a', 'b'],
        kvTransferConfig: { kv_connector: 'X', kv_role: 'kv_producer', kv_connector_module_path: './m.js' },
        cacheLayout: { layout: 'HND', kvLayout: 'kv-first' },
        port: 0,
        enablePrefixCaching: false,
      },
    });
    expect(parseEngineArgs(['--help'])).toEqual({ help: true });
    const lp = parseEngineArgs(['--preset', 'mla', '--long-prefill-token-threshold', '48']);
    expect(lp.help === false && engineOptionsOf(lp.config).longPrefillTokenThreshold).toBe(48);
    expect(() => parseEngineArgs(['--config-json', '{"preset":"mla","longPrefillTokenThreshold":-1}'])).toThrow(/longPrefillTokenThreshold/);
    const named = parseEngineArgs(['--preset', 'mla', '--served-model-name', 'my-model', '--served-model-name', 'alias']);
    expect(named.help === false && named.config.servedModelName).toEqual(['my-model', 'alias']);
    expect(() => parseEngineArgs([])).toThrow(/give a model/);
    expect(() => parseEngineArgs(['--preset', 'nope'])).toThrow(/preset: expected one of/);
    expect(() => parseEngineArgs(['--preset', 'mla', '--tp-size', 'x'])).toThrow(/--tp-size/);
    expect(() => parseEngineArgs(['--preset', 'mla', '--bogus'])).toThrow(/bogus/);
    expect(() => parseEngineArgs(['--config-json', '{"preset":"mla","tpsize":2}'])).toThrow(/tpsize: unknown key/);
    expect(() => parseEngineArgs(['--config-json', '{nope'])).toThrow(/not valid JSON/);
    expect(() => parseEngineArgs(['--config', '/nonexistent/x.json'])).toThrow(/--config/);
  });

  it("engine: vLLM's flag names, one table behind the parser and the help; the older spellings still work", () => {
    const cfg = (args: string[]) => {
      const p = parseEngineArgs(['--preset', 'dense-gqa', ...args]);
      if (p.help) throw new Error('help');
      return p.config;
    };
    const kvt = { kv_connector: 'NixlConnector', kv_role: 'kv_consumer', engine_id: 'd0' };
    expect(
      cfg([
        '--tensor-parallel-size', '2',
        '--pipeline-parallel-size', '2',
        '--block-size', '32',
        '--max-num-batched-tokens', '64',
        '--host', '0.0.0.0',
        '--port', '8000',
        '--served-model-name', 'a', 'b',
        '--no-enable-prefix-caching',
        '--kv-transfer-config', JSON.stringify(kvt),
      ]),
    ).toEqual({ preset: 'dense-gqa', tpSize: 2, ppSize: 2, blockSize: 32, maxNumBatchedTokens: 64, host: '0.0.0.0', port: 8000, servedModelName: ['a', 'b'], enablePrefixCaching: false, kvTransferConfig: kvt });
    expect(cfg(['--tp-size', '2', '--pp-size', '3', '--num-gpu-blocks-override', '64', '--disable-prefix-caching'])).toEqual({ preset: 'dense-gqa', tpSize: 2, ppSize: 3, numBlocks: 64, enablePrefixCaching: false });
    expect(cfg(['--enable-prefix-caching']).enablePrefixCaching).toBe(true);
    expect(cfg([]).enablePrefixCaching).toBeUndefined();
    expect(() => cfg(['--tensor-parallel-size', '0'])).toThrow(/tpSize: expected a positive integer, got 0/);
    expect(() => cfg(['--pipeline-parallel-size', 'two'])).toThrow(/--pipeline-parallel-size <n>' argument 'two' is invalid/);
    for (const f of ENGINE_FLAGS) expect(ENGINE_USAGE).toContain(f.flags);
    expect(ENGINE_USAGE).toContain('Older spellings that still work: --tp-size = --tensor-parallel-size; --pp-size = --pipeline-parallel-size');
    expect(ENGINE_USAGE).not.toMatch(/^\s+--tp-size/m);
    expect(parseProxyArgs(['--prefill', 'http://x:1', '--decode', 'http://x:2', '--log-level', 'warn'])).toMatchObject({ config: { logLevel: 'warn' } });
    expect(() => parseProxyArgs(['--prefill', 'http://x:1', '--decode', 'http://x:2', '--log-level', 'loud'])).toThrow(/logLevel: expected one of fatal, error/);
  });

  it('proxy: URLs are required and checked', () => {
    expect(parseProxyArgs(['--prefill', 'http://127.0.0.1:1', '--decode', 'http://127.0.0.1:2', '--decode', 'http://127.0.0.1:3', '--mode', 'concurrent'])).toEqual({
      help: false,
      exitWithParent: false,
      config: { prefill: ['http://127.0.0.1:1'], decode: ['http://127.0.0.1:2', 'http://127.0.0.1:3'], mode: 'concurrent' },
    });
    expect(() => parseProxyArgs(['--prefill', 'http://x:1'])).toThrow(/--decode/);
    expect(() => parseProxyArgs(['--prefill', 'nope', '--decode', 'http://x:1'])).toThrow(/not an http URL/);
    expect(() => parseProxyArgs(['--prefill', 'http://x:1', '--decode', 'http://x:1', '--mode', 'both'])).toThrow(/mode/);
  });

  it('parseCompletionRequest treats null optional fields as absent', () => {
    expect(parseCompletionRequest({ prompt: 'x', max_tokens: null, stop: null, temperature: null })).toEqual({ kind: 'completion', prompt: 'x', maxTokens: 16, temperature: 0, seed: 0, stop: [], stopTokenIds: [], ignoreEos: false, stream: false, includeUsage: false, ignored: [] });
  });
});
