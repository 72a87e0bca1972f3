/**
 * The OpenAI-compatible API (issue 12, part 1), driven by the real `openai` npm client (a dev
 * dependency) through the proxy server in front of a producer and a consumer engine server
 * (`InProcessConnector`, loopback only): completions and chat, with and without streaming,
 * `stream_options.include_usage`, `/v1/models`, `/version`, `X-Request-Id`, the `model` check,
 * the fields clients send by default, and a client that goes away mid-stream. Expected outputs
 * come from a single engine instance (`Engine.generate`), the chat prompt is written out literally.
 */
import OpenAI from 'openai';
import { afterEach, describe, expect, it } from 'vitest';
import type { Engine } from '../src/engine.js';
import { startEngineServer, type EngineServer, type EngineServerOptions } from '../src/server/engine-server.js';
import { startProxyServer, type ProxyServer } from '../src/server/proxy-server.js';
import { makePD, single, until } from './utils/pd.js';

const cleanups: Array<() => Promise<unknown>> = [];
afterEach(async () => {
  while (cleanups.length) await cleanups.pop()!().catch(() => {});
});

async function serve(engine: Engine, o: EngineServerOptions = {}): Promise<EngineServer> {
  const s = await startEngineServer(engine, o);
  cleanups.push(() => s.close());
  return s;
}

/** A producer and a consumer behind their servers and the proxy server, and an `openai` client of the proxy. */
async function stack(o: { consumerMaxTokens?: number } = {}) {
  const pd = makePD({ model: 'dense-gqa' });
  cleanups.push(() => pd.shutdown());
  const p = await serve(pd.producer);
  const d = await serve(pd.consumer);
  const proxy: ProxyServer = await startProxyServer({ prefill: [p.url], decode: [d.url], maxTokens: o.consumerMaxTokens });
  cleanups.push(() => proxy.close());
  const client = new OpenAI({ baseURL: `${proxy.url}/v1`, apiKey: 'unused', maxRetries: 0 });
  return { pd, proxy, client };
}

const PROMPT = 'The OpenAI client talks to the P/D proxy.';
/** The chat messages of the tests and the prompt the documented template renders them to (written out). */
const MESSAGES = [
  { role: 'system' as const, content: 'You are terse.' },
  { role: 'user' as const, content: 'Say something.' },
];
const CHAT_PROMPT = '<|system|>\nYou are terse.\n<|user|>\nSay something.\n<|assistant|>\n';
/** vLLM's `ignore_eos`: not in the client's types, sent as an extra field. */
const EXTRA = { ignore_eos: true } as Record<string, unknown>;

describe('the openai client through the proxy', () => {
  it('completions, not streamed: the text equals a single instance; usage; X-Request-Id used and echoed', async () => {
    const { client } = await stack();
    const ref = await single('dense-gqa').generate(PROMPT, { maxTokens: 8, ignoreEos: true });
    const { data, response } = await client.completions
      .create({ model: 'dense-gqa', prompt: PROMPT, max_tokens: 8, temperature: 0, top_p: 1, frequency_penalty: 0, presence_penalty: 0, user: 'someone', ...EXTRA }, { headers: { 'X-Request-Id': 'client-id-1' } })
      .withResponse();
    expect(response.headers.get('x-request-id')).toBe('client-id-1');
    expect(data.id).toBe('cmpl-client-id-1');
    expect(data.object).toBe('text_completion');
    expect(data.model).toBe('dense-gqa');
    expect(data.choices).toHaveLength(1);
    expect(data.choices[0].text).toBe(ref.text);
    expect(data.choices[0].finish_reason).toBe('length');
    expect(data.usage).toEqual({ prompt_tokens: PROMPT.length + 1, completion_tokens: 8, total_tokens: PROMPT.length + 9 });
    const kv = (data as unknown as { kvconnect: { decode: { request_id: string; load: { verdict: string } } } }).kvconnect;
    expect(kv.decode.request_id).toBe('client-id-1-d');
    expect(kv.decode.load.verdict).toBe('verified');
  });

  it('completions, streamed with include_usage: several chunks whose text is the whole output, then a usage chunk', async () => {
    const { client, pd } = await stack();
    const N = 120;
    const ref = await single('dense-gqa').generate(PROMPT, { maxTokens: N, ignoreEos: true });
    const stream = await client.completions.create({ model: 'dense-gqa', prompt: PROMPT, max_tokens: N, stream: true, stream_options: { include_usage: true }, ...EXTRA });
    const texts: string[] = [];
    const finishes: Array<string | null> = [];
    let usage: unknown = null;
    let runningAtFirstText: boolean | null = null;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      // Streamed as generated: the first text arrives while the consumer still decodes.
      if (runningAtFirstText === null && chunk.choices.some((ch) => ch.text.length > 0)) runningAtFirstText = pd.consumer.scheduler.numUnfinished === 1;
      for (const ch of chunk.choices) {
        texts.push(ch.text);
        finishes.push(ch.finish_reason);
      }
    }
    expect(texts.join('')).toBe(ref.text);
    expect(texts.filter((t) => t.length > 0).length).toBeGreaterThan(1);
    expect(runningAtFirstText).toBe(true);
    expect(finishes.at(-1)).toBe('length');
    expect(finishes.slice(0, -1).every((f) => f === null)).toBe(true);
    expect(usage).toEqual({ prompt_tokens: PROMPT.length + 1, completion_tokens: N, total_tokens: PROMPT.length + 1 + N });
  });

  it('chat, not streamed: the documented template; the answer equals a single instance on the rendered prompt', async () => {
    const { client } = await stack();
    const ref = await single('dense-gqa').generate(CHAT_PROMPT, { maxTokens: 10, ignoreEos: true });
    const r = await client.chat.completions.create({ model: 'dense-gqa', messages: MESSAGES, max_completion_tokens: 10, ...EXTRA });
    expect(r.object).toBe('chat.completion');
    expect(r.choices[0].message).toMatchObject({ role: 'assistant', content: ref.text });
    expect(r.choices[0].finish_reason).toBe('length');
    expect(r.usage).toMatchObject({ prompt_tokens: CHAT_PROMPT.length + 1, completion_tokens: 10 });
  });

  it('chat, streamed: a role delta first, content deltas that make the answer, finish_reason, usage', async () => {
    const { client } = await stack();
    const ref = await single('dense-gqa').generate(CHAT_PROMPT, { maxTokens: 40, ignoreEos: true });
    const stream = await client.chat.completions.create({ model: 'dense-gqa', messages: MESSAGES, max_tokens: 40, stream: true, stream_options: { include_usage: true }, ...EXTRA });
    const chunks = [];
    for await (const c of stream) chunks.push(c);
    expect(chunks[0].object).toBe('chat.completion.chunk');
    expect(chunks[0].choices[0].delta.role).toBe('assistant');
    const withChoices = chunks.filter((c) => c.choices.length > 0);
    expect(withChoices.map((c) => c.choices[0].delta.content ?? '').join('')).toBe(ref.text);
    expect(withChoices.at(-1)!.choices[0].finish_reason).toBe('length');
    expect(chunks.at(-1)!.choices).toEqual([]);
    expect(chunks.at(-1)!.usage).toMatchObject({ completion_tokens: 40 });
  });

  it('/v1/models lists the served model, /version answers; a model not served is a 404, what would change the answer a 400', async () => {
    const { client, proxy } = await stack();
    const models = [];
    for await (const m of client.models.list()) models.push(m.id);
    expect(models).toEqual(['dense-gqa']);
    const v = (await (await fetch(`${proxy.url}/version`)).json()) as { version: string };
    expect(v.version).toMatch(/^\d+\.\d+\.\d+/);
    await expect(client.completions.create({ model: 'gpt-4o', prompt: 'x', max_tokens: 2 })).rejects.toBeInstanceOf(OpenAI.NotFoundError);
    await expect(client.completions.create({ model: 'dense-gqa', prompt: 'x', max_tokens: 2, n: 2 })).rejects.toThrow(/n: 2 is not supported/);
    await expect(client.completions.create({ model: 'dense-gqa', prompt: 'x', max_tokens: 2, frequency_penalty: 0.5 })).rejects.toThrow(/frequency_penalty/);
    await expect(client.completions.create({ model: 'dense-gqa', prompt: 'x', max_tokens: 2, temperature: 0.7, top_p: 0.5 })).rejects.toThrow(/top_p/);
    await expect(client.completions.create({ model: 'dense-gqa', prompt: 'x', max_tokens: 2, logprobs: 2 })).rejects.toBeInstanceOf(OpenAI.BadRequestError);
    await expect(client.completions.create({ model: 'dense-gqa', prompt: ['a', 'b'], max_tokens: 2 })).rejects.toThrow(/batched prompts/);
    await expect(client.completions.create({ model: 'dense-gqa', prompt: 'x', max_tokens: 2, echo: true })).rejects.toThrow(/echo/);
    // Greedy sampling: top_p / top_k do not change the answer and are accepted.
    const ok = await client.completions.create({ model: 'dense-gqa', prompt: 'x', max_tokens: 2, temperature: 0, top_p: 0.5, ...EXTRA, ...({ top_k: 5 } as Record<string, unknown>) });
    expect(ok.choices[0].finish_reason).toBe('length');
  });

  it('a client that goes away mid-stream aborts the request on the consumer (KV freed)', async () => {
    const { client, pd } = await stack();
    const ac = new AbortController();
    const stream = await client.completions.create({ model: 'dense-gqa', prompt: PROMPT, max_tokens: 900, stream: true, ...EXTRA }, { signal: ac.signal });
    let got = 0;
    try {
      for await (const c of stream) {
        got += (c.choices[0] as { token_ids?: number[] } | undefined)?.token_ids?.length ?? 0;
        if (got > 0) ac.abort();
      }
    } catch {
      // the client's abort error, when it throws one
    }
    expect(got).toBeGreaterThan(0);
    expect(got).toBeLessThan(900);
    const steps = pd.consumer.stats.steps;
    await until(() => pd.consumer.scheduler.numUnfinished === 0, 20_000);
    // Without the abort the request would decode to 900 tokens.
    expect(pd.consumer.stats.steps - steps).toBeLessThan(50);
    expect(pd.consumer.scheduler.kv.pool.numFree).toBe(pd.consumer.scheduler.kv.pool.numBlocks);
  });
});

describe('the engine server directly', () => {
  it('ignored fields are logged as a warning; stop sequences cut a stream before them (held back, never sent)', async () => {
    const warnings: Array<{ fields: object; msg: string }> = [];
    const engine = single('dense-gqa');
    const server = await serve(engine, { logger: { warn: (fields, msg) => warnings.push({ fields, msg }) } });
    const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'unused', maxRetries: 0 });
    const ref = await single('dense-gqa').generate(PROMPT, { maxTokens: 60, ignoreEos: true });
    // A two-character printable stop sequence from the reference output, first occurring at i >= 2.
    const printable = (t: number) => t >= 0x20 && t < 0x7f;
    const ids = ref.tokenIds;
    let at = -1;
    for (let i = 2; i + 1 < ids.length && at < 0; i++) {
      if (!printable(ids[i]) || !printable(ids[i + 1])) continue;
      const earlier = ids.slice(0, i + 1).some((t, j) => j < i && t === ids[i] && ids[j + 1] === ids[i + 1]);
      if (!earlier) at = i;
    }
    expect(at).toBeGreaterThan(1);
    const stop = String.fromCharCode(ids[at], ids[at + 1]);
    const stream = await client.completions.create({ model: 'dense-gqa', prompt: PROMPT, max_tokens: 60, stop, stream: true, ...EXTRA, ...({ metadata: { a: 1 } } as Record<string, unknown>) });
    const texts: string[] = [];
    let finish: string | null = null;
    for await (const c of stream) {
      for (const ch of c.choices) {
        texts.push(ch.text);
        finish = ch.finish_reason ?? finish;
      }
    }
    const expected = new TextDecoder().decode(Uint8Array.from(ids.slice(0, at).filter((t) => t < 256)));
    expect(texts.join('')).toBe(expected);
    expect(finish).toBe('stop');
    expect(warnings.some((w) => /ignored/.test(w.msg) && JSON.stringify(w.fields).includes('metadata'))).toBe(true);
    // The stop ended the request in the engine (aborted there), it did not run to max_tokens.
    await until(() => engine.scheduler.numUnfinished === 0);
  });
});

describe('request validation of the OpenAI fields', () => {
  const postRaw = (url: string, body: unknown, headers: Record<string, string> = {}) =>
    fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body) }).then(async (r) => ({ status: r.status, headers: r.headers, body: (await r.json()) as any }));

  it('chat messages, X-Request-Id, max_completion_tokens over max_tokens, request_id over X-Request-Id', async () => {
    const server = await serve(single('dense-gqa'));
    const chat = `${server.url}/v1/chat/completions`;
    const cases: Array<[unknown, number, RegExp]> = [
      [{ messages: [] }, 400, /messages: expected a non-empty array/],
      [{ messages: [{ role: 'wizard', content: 'x' }] }, 400, /messages\[0\]\.role/],
      [{ messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'x' } }] }] }, 400, /only text parts/],
      [{ messages: [{ role: 'user', content: 5 }] }, 400, /messages\[0\]\.content/],
      [{ messages: [{ role: 'user', content: 'x' }], tools: [{ type: 'function' }] }, 400, /tools: not supported/],
      [{ messages: [{ role: 'user', content: 'x' }], logprobs: true }, 400, /logprobs/],
    ];
    for (const [body, status, msg] of cases) {
      const r = await postRaw(chat, body);
      expect({ body, status: r.status }).toEqual({ body, status });
      expect(r.body.error.message).toMatch(msg);
    }
    expect((await postRaw(chat, { messages: [{ role: 'user', content: 'x' }] }, { 'x-request-id': 'bad id!' })).status).toBe(400);
    // Text parts are concatenated; max_completion_tokens wins over max_tokens.
    const ref = await single('dense-gqa').generate('<|user|>\nab\n<|assistant|>\n', { maxTokens: 3, ignoreEos: true });
    const ok = await postRaw(chat, { messages: [{ role: 'user', content: [{ type: 'text', text: 'a' }, { type: 'text', text: 'b' }] }], max_tokens: 9, max_completion_tokens: 3, ignore_eos: true }, { 'x-request-id': 'hdr-1' });
    expect(ok.status).toBe(200);
    expect(ok.headers.get('x-request-id')).toBe('hdr-1');
    expect(ok.body.id).toBe('chatcmpl-hdr-1');
    expect(ok.body.choices[0].message.content).toBe(ref.text);
    const named = await serve(single('dense-gqa'), { servedModelNames: ['my-model', 'alias'] });
    const listed = (await (await fetch(`${named.url}/v1/models`)).json()) as { data: Array<{ id: string }> };
    expect(listed.data.map((m) => m.id)).toEqual(['my-model', 'alias']);
    expect((await postRaw(`${named.url}/v1/completions`, { prompt: 'x', max_tokens: 1, model: 'alias' })).body.model).toBe('alias');
    expect((await postRaw(`${named.url}/v1/completions`, { prompt: 'x', max_tokens: 1, model: 'dense-gqa' })).status).toBe(404);
    const both = await postRaw(`${server.url}/v1/completions`, { prompt: 'x', max_tokens: 1, request_id: 'body-1' }, { 'x-request-id': 'hdr-2' });
    expect(both.body.kvconnect.request_id).toBe('body-1');
    expect(both.headers.get('x-request-id')).toBe('body-1');
  });
});
