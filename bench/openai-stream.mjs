#!/usr/bin/env node
// The OpenAI-compatible API through the P/D proxy (issue 12): figures, not a test (nothing is
// asserted). Run after `npm ci` and `npm run build`:
//   node bench/openai-stream.mjs          (KVC_BENCH_QUICK=1 for a short run)
//
// A producer and a consumer engine (model `dense-gqa`, in-process connector, checksums on)
// behind their servers and the proxy server, in this process; the `openai` npm client (a dev
// dependency) on loopback. For a 32-byte prompt and N generated tokens (default 200; quick 60):
// median over R runs (default 7; quick 3) of the whole latency without streaming, and with
// streaming the time to the first content chunk, the whole latency and the number of chunks.
import { performance } from 'node:perf_hooks';
import { result } from './lib/results.mjs';

let engine;
let testing;
let OpenAI;
try {
  engine = await import('@kvconnect/engine');
  testing = await import('@kvconnect/engine/testing');
  OpenAI = (await import('openai')).default;
} catch (e) {
  console.error(`cannot load @kvconnect/engine or openai (npm ci, npm run build first): ${e.message}`);
  process.exit(2);
}
const { Engine, startEngineServer, startProxyServer } = engine;
const { IN_PROCESS_CONNECTOR, inProcessRegistry } = testing;
const QUICK = process.env.KVC_BENCH_QUICK === '1';
const N = QUICK ? 60 : 200;
const R = QUICK ? 3 : 7;
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const fmt = (ms) => `${ms.toFixed(1)} ms`;

// Both engines meet on one in-process bus through their own registry (no process-wide state).
const { registry } = inProcessRegistry();
const side = (role, id) =>
  new Engine({ registry, model: 'dense-gqa', numBlocks: 1024, maxNumBatchedTokens: 256, engineId: `${id}-${process.pid}`, kvTransferConfig: { kv_connector: IN_PROCESS_CONNECTOR, kv_role: role, enable_kv_checksum: true } });
const producer = side('kv_producer', 'bench-p');
const consumer = side('kv_consumer', 'bench-d');
const ps = await startEngineServer(producer);
const ds = await startEngineServer(consumer);
const proxy = await startProxyServer({ prefill: [ps.url], decode: [ds.url] });
const client = new OpenAI({ baseURL: `${proxy.url}/v1`, apiKey: 'unused', maxRetries: 0 });
const body = (i) => ({ model: 'dense-gqa', prompt: `bench prompt number ${String(i).padStart(6, '0')} ......`, max_tokens: N, ignore_eos: true });

console.log(`# OpenAI API through the proxy (node ${process.version}${QUICK ? ', quick' : ''}): ${N} tokens, median of ${R}`);
const whole = [];
const ttft = [];
const streamed = [];
const chunks = [];
for (let i = -1; i < R; i++) {
  let t0 = performance.now();
  await client.completions.create(body(2 * i + 100));
  if (i >= 0) whole.push(performance.now() - t0);
  t0 = performance.now();
  let first = 0;
  let n = 0;
  const s = await client.completions.create({ ...body(2 * i + 101), stream: true, stream_options: { include_usage: true } });
  for await (const c of s) {
    if (c.choices[0]?.text && first === 0) first = performance.now() - t0;
    if (c.choices.length > 0) n++;
  }
  if (i >= 0) {
    ttft.push(first);
    streamed.push(performance.now() - t0);
    chunks.push(n);
  }
}
console.log(`not streamed: whole ${fmt(median(whole))}`);
result('openai-stream', { name: `${N} tokens streamed with the openai client: first content chunk`, figure: fmt(median(ttft)), baseline: `${fmt(median(whole))} whole, not streamed` });
console.log(`streamed: first content chunk ${fmt(median(ttft))}, whole ${fmt(median(streamed))}, ${median(chunks)} chunks`);
await proxy.close();
await ps.close();
await ds.close();
await producer.shutdown();
await consumer.shutdown();
