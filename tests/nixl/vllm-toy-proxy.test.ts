/**
 * vLLM's P/D flow against kvconnect (issue 12, part 2): the request sequence of vLLM's toy proxy
 * (`tests/v1/kv_connector/nixl_integration/toy_proxy_server.py` in vLLM), re-implemented here with
 * fetch, against two engine servers over NixlConnector (real EmbeddedAgents, 127.0.0.1):
 * 1. the producer gets the client's body with `kv_transfer_params: { do_remote_decode: true,
 *    do_remote_prefill: false, remote_engine_id: null, remote_block_ids: null, remote_host: null,
 *    remote_port: null }`, `stream: false`, `max_tokens: 1`, no `stream_options`, and an
 *    `X-Request-Id` (a uuid4, the same for both sides);
 * 2. the consumer gets the client's body with the producer's `kv_transfer_params` verbatim.
 * The consumer must load and verify (not prefill locally); the output equals a single instance.
 * Params the consumer cannot use (the old shape without `do_remote_prefill`) are said: a response
 * field, a warning, a counter.
 */
import { randomUUID } from 'node:crypto';
import { afterEach, describe, expect, it } from 'vitest';
import type { Engine } from '@kvconnect/engine';
import { startEngineServer, type EngineServer, type EngineServerOptions } from '../../packages/engine/src/server/engine-server.js';
import { checksumCounter, makeNixlPD, metricValue, single, type NixlPD } from './utils.js';

const cleanups: Array<() => Promise<unknown>> = [];
afterEach(async () => {
  while (cleanups.length) await cleanups.pop()!().catch(() => {});
});

async function serve(engine: Engine, o: EngineServerOptions = {}): Promise<EngineServer> {
  const s = await startEngineServer(engine, o);
  cleanups.push(() => s.close());
  return s;
}

interface Flow {
  pd: NixlPD;
  prefillUrl: string;
  decodeUrl: string;
  warnings: Array<{ fields: Record<string, unknown>; msg: string }>;
}

async function flow(): Promise<Flow> {
  const pd = await makeNixlPD({ mode: 'pull', model: 'dense-gqa', policy: 'fail' });
  cleanups.push(() => pd.shutdown());
  const warnings: Flow['warnings'] = [];
  const p = await serve(pd.producer);
  const d = await serve(pd.consumer, { logger: { warn: (fields, msg) => warnings.push({ fields: fields as Record<string, unknown>, msg }) } });
  return { pd, prefillUrl: `${p.url}/v1`, decodeUrl: `${d.url}/v1`, warnings };
}

const post = (url: string, body: unknown, requestId: string) =>
  fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', authorization: 'Bearer None', 'x-request-id': requestId }, body: JSON.stringify(body) });

/** Step 1 of the toy proxy: the prefill request. @returns the producer's response body. */
async function prefill(f: Flow, api: string, reqData: Record<string, unknown>, requestId: string): Promise<Record<string, unknown>> {
  const p: Record<string, unknown> = { ...reqData };
  p.kv_transfer_params = { do_remote_decode: true, do_remote_prefill: false, remote_engine_id: null, remote_block_ids: null, remote_host: null, remote_port: null };
  p.stream = false;
  p.max_tokens = 1;
  if ('max_completion_tokens' in p) p.max_completion_tokens = 1;
  delete p.stream_options;
  delete p.min_tokens;
  delete p.min_completion_tokens;
  const res = await post(f.prefillUrl + api, p, requestId);
  expect(res.status).toBe(200);
  return (await res.json()) as Record<string, unknown>;
}

/** Parses an SSE body into its `data` JSON events (up to `[DONE]`). */
function sseEvents(text: string): Array<Record<string, any>> {
  const out: Array<Record<string, any>> = [];
  for (const block of text.split('\n\n')) {
    const line = block.trim();
    if (!line.startsWith('data: ')) continue;
    const data = line.slice(6);
    if (data === '[DONE]') break;
    out.push(JSON.parse(data));
  }
  return out;
}

const PROMPT = 'vLLM toy proxy: prefill on one engine, decode on the other, over NIXL.';
const N = 12;

describe("vLLM's toy proxy sequence against kvconnect engine servers (NixlConnector)", () => {
  it('completions, streamed: the producer returns params in vLLM NixlConnector shape; forwarded verbatim they load and verify', async () => {
    const f = await flow();
    const ref = await single('dense-gqa').generate(PROMPT, { maxTokens: N, ignoreEos: true });
    const requestId = randomUUID();
    const reqData = { model: 'dense-gqa', prompt: PROMPT, max_tokens: N, ignore_eos: true, stream: true, stream_options: { include_usage: true } };
    const pr = await prefill(f, '/completions', reqData, requestId);
    const kv = pr.kv_transfer_params as Record<string, unknown>;
    // vLLM's NixlConnector keys (request_finished), and kvconnect's.
    expect(kv).toMatchObject({ do_remote_prefill: true, do_remote_decode: false, remote_engine_id: f.pd.producer.engineId, remote_request_id: requestId, remote_host: '127.0.0.1', tp_size: 1 });
    expect(typeof kv.remote_port).toBe('number');
    expect(Array.isArray(kv.remote_block_ids)).toBe(true);
    expect(typeof kv.kv_checksums).toBe('string');

    const decodeBody = { ...reqData, kv_transfer_params: kv };
    const res = await post(f.decodeUrl + '/completions', decodeBody, requestId);
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toMatch(/^text\/event-stream/);
    expect(res.headers.get('x-request-id')).toBe(requestId);
    const events = sseEvents(await res.text());
    const choices = events.filter((e) => e.choices.length > 0).map((e) => e.choices[0]);
    expect(choices.map((c) => c.text).join('')).toBe(ref.text);
    const last = events.filter((e) => e.choices.length > 0).at(-1)!;
    expect(last.choices[0].finish_reason).toBe('length');
    expect(last.kvconnect.request_id).toBe(requestId);
    expect(last.kvconnect.load).toMatchObject({ verdict: 'verified', action: 'use' });
    expect(last.kv_transfer_params_error).toBeUndefined();
    expect(events.at(-1)!.usage).toMatchObject({ completion_tokens: N });
    // Loaded, not prefilled locally: one load used, and only the N decode tokens scheduled.
    expect(f.pd.consumer.stats.loadsUsed).toBe(1);
    expect(f.pd.consumer.stats.scheduledTokens).toBe(N);
    expect(await checksumCounter(f.pd.obs, 'loads', { verdict: 'verified' })).toBe(1);
    expect(f.warnings).toEqual([]);
  });

  it('chat completions, not streamed (max_completion_tokens): loads and verifies', async () => {
    const f = await flow();
    const messages = [{ role: 'user', content: 'hello over NIXL' }];
    const ref = await single('dense-gqa').generate('<|user|>\nhello over NIXL\n<|assistant|>\n', { maxTokens: N, ignoreEos: true });
    const requestId = randomUUID();
    const reqData = { model: 'dense-gqa', messages, max_completion_tokens: N, ignore_eos: true };
    const pr = await prefill(f, '/chat/completions', reqData, requestId);
    const res = await post(f.decodeUrl + '/chat/completions', { ...reqData, kv_transfer_params: pr.kv_transfer_params }, requestId);
    expect(res.status).toBe(200);
    const body = (await res.json()) as Record<string, any>;
    expect(body.choices[0].message.content).toBe(ref.text);
    expect(body.kvconnect.load.verdict).toBe('verified');
    expect(f.pd.consumer.stats.loadsUsed).toBe(1);
  });

  it("kvconnect's older key remote_tp_size (instead of tp_size) is still read", async () => {
    const f = await flow();
    const requestId = randomUUID();
    const reqData = { model: 'dense-gqa', prompt: PROMPT, max_tokens: 4, ignore_eos: true };
    const kv = { ...((await prefill(f, '/completions', reqData, requestId)).kv_transfer_params as Record<string, unknown>) };
    delete kv.tp_size;
    expect(kv.remote_tp_size).toBe(1);
    const body = (await (await post(f.decodeUrl + '/completions', { ...reqData, kv_transfer_params: kv }, requestId)).json()) as Record<string, any>;
    expect(body.kvconnect.load.verdict).toBe('verified');
    expect(f.pd.consumer.stats.loadsUsed).toBe(1);
  });

  it('params the consumer cannot use are said: kv_transfer_params_error in the response, a warning, a counter', async () => {
    const f = await flow();
    const reg = f.pd.consumer.observability!.registry;
    const cases: Array<[string, (kv: Record<string, unknown>) => void, RegExp]> = [
      // The shape kvconnect's producer returned before: no do_remote_prefill.
      ['without do_remote_prefill', (kv) => delete kv.do_remote_prefill, /lack do_remote_prefill: true/],
      ['remote_port malformed', (kv) => (kv.remote_port = 'x'), /remote_port: missing or malformed/],
    ];
    let n = 0;
    for (const [, mangle, why] of cases) {
      const requestId = randomUUID();
      const reqData = { model: 'dense-gqa', prompt: `${PROMPT} ${n}`, max_tokens: 3, ignore_eos: true, stream: true };
      const kv = { ...((await prefill(f, '/completions', reqData, requestId)).kv_transfer_params as Record<string, unknown>) };
      mangle(kv);
      const events = sseEvents(await (await post(f.decodeUrl + '/completions', { ...reqData, kv_transfer_params: kv }, requestId)).text());
      const last = events.filter((e) => e.choices.length > 0).at(-1)!;
      expect(last.kv_transfer_params_error).toMatch(why);
      expect(last.kv_transfer_params.kv_transfer_params_error).toMatch(why);
      n++;
      expect(await metricValue(reg, 'kvconnect_kv_transfer_params_unusable_total', { connector: 'NixlConnector' })).toBe(n);
      expect(f.warnings).toHaveLength(n);
      expect(f.warnings[n - 1].msg).toMatch(/kv_transfer_params unusable/);
      expect(f.warnings[n - 1].fields).toMatchObject({ requestId, connector: 'NixlConnector' });
    }
    expect(f.pd.consumer.stats.loadsUsed).toBe(0);
  });
});
