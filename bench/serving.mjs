#!/usr/bin/env node
// Serving under misuse (issue 11, part 5): figures, not a test (nothing is asserted). Run after
// `npm ci` and `npm run build`:
//   node bench/serving.mjs            (KVC_BENCH_QUICK=1 for a short run)
//
// Everything runs in this process, engines behind their HTTP servers and the P/D proxy server,
// joined by the in-process connector (`@kvconnect/engine/testing`); model `dense-gqa`.
// 1. Long prefill: one long prompt (KVC_BENCH_LONG_TOKENS, default 4000; quick 1500) on an
//    engine with a 256-token step budget, and 4 short requests (32 tokens, 4 generated) sent once
//    the long one is running. Latency of the short requests and of the long one, with the long
//    prefill threshold off (0) and at its default (a quarter of the budget: 64).
// 2. Abandoned requests: 20 requests of 600 generated tokens through the proxy. Latency of a
//    normal request (8 tokens): alone, beside the 20 while they decode (what abandoned requests
//    that run on cost), and right after their clients went away (aborted on both engines). In
//    rounds (7; quick 3), each alone -> beside -> right after, so the baseline and the loaded
//    figures alternate and see the same machine state; a first round warms every path up (JIT)
//    and is left out. Medians over the rounds.
// 3. Consumer down: the consumer's server stopped; 4 clients send 100 requests one after another,
//    then 50 at once: statuses, the producer's steps, held requests and KV usage. Then the
//    consumer is started again on its port: the next request after the check interval.
import { performance } from 'node:perf_hooks';
import { result } from './lib/results.mjs';

let engine;
let testing;
try {
  engine = await import('@kvconnect/engine');
  testing = await import('@kvconnect/engine/testing');
} catch (e) {
  console.error(`cannot load @kvconnect/engine (build first: npm run build): ${e.message}`);
  process.exit(2);
}
const { Engine, startEngineServer, startProxyServer } = engine;
const { IN_PROCESS_CONNECTOR, inProcessRegistry } = testing;
const QUICK = process.env.KVC_BENCH_QUICK === '1';
const LONG = Number(process.env.KVC_BENCH_LONG_TOKENS ?? (QUICK ? 1500 : 4000));

const until = async (cond, ms = 120_000) => {
  const t0 = Date.now();
  while (!cond()) {
    if (Date.now() - t0 > ms) throw new Error('timed out');
    await new Promise((r) => setTimeout(r, 2));
  }
};
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const ids = (n, seed) => Array.from({ length: n }, (_, i) => 1 + ((i * 7 + seed) % 250));
const fmt = (ms) => `${ms.toFixed(0)} ms`;

async function longPrefill(threshold, tokens = LONG) {
  const e = new Engine({ model: 'dense-gqa', numBlocks: Math.ceil(tokens / 16) + 64, maxNumBatchedTokens: 256, enablePrefixCaching: false, longPrefillTokenThreshold: threshold });
  await e.ready;
  const t0 = performance.now();
  let longMs = 0;
  const long = e.generate(ids(tokens, 1), { maxTokens: 1, ignoreEos: true }).then(() => (longMs = performance.now() - t0));
  await until(() => e.scheduler.stats.steps >= 1); // the long prompt got its first chunk
  const shorts = await Promise.all(
    [0, 1, 2, 3].map(async (k) => {
      const s0 = performance.now();
      await e.generate(ids(32, 10 + k), { maxTokens: 4, ignoreEos: true });
      return performance.now() - s0;
    }),
  );
  await long;
  return { shortMedian: median(shorts), shortMax: Math.max(...shorts), longMs };
}

function pd() {
  // One in-process bus for the pair (the connector's halves meet only through it: no globals).
  const { registry } = inProcessRegistry();
  const side = (role, id) =>
    new Engine({ model: 'dense-gqa', numBlocks: 1024, maxNumBatchedTokens: 256, engineId: `${id}-${process.pid}`, registry, kvTransferConfig: { kv_connector: IN_PROCESS_CONNECTOR, kv_role: role, enable_kv_checksum: true } });
  return { producer: side('kv_producer', 'bench-p'), consumer: side('kv_consumer', 'bench-d') };
}

const post = (url, body, signal) =>
  fetch(`${url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body), signal }).then(async (r) => ({ status: r.status, body: await r.json() }));

async function normalLatencies(url, n, tag) {
  const out = [];
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    const r = await post(url, { prompt: `a normal request (${tag}) number ${i}`, max_tokens: 8, ignore_eos: true });
    if (r.status !== 200) throw new Error(`normal request answered ${r.status}`);
    out.push(performance.now() - t0);
  }
  return out;
}

console.log(`# serving under misuse (node ${process.version}${QUICK ? ', quick' : ''})`);
console.log(`\n## 1. long prefill: one ${LONG}-token prompt, 4 short requests sent while it runs (budget 256)`);
await longPrefill(0, 400); // warm-up (JIT)
for (const threshold of [0, 64]) {
  const r = await longPrefill(threshold);
  console.log(`threshold ${threshold === 0 ? '0 (off)' : `${threshold} (default)`}: short requests median ${fmt(r.shortMedian)}, max ${fmt(r.shortMax)}; the long prompt ${fmt(r.longMs)}`);
  result('serving', { name: `short requests beside a ${LONG}-token prefill, long-prefill threshold ${threshold === 0 ? 'off' : threshold}`, figure: `median ${fmt(r.shortMedian)}` });
}

{
  const { producer, consumer } = pd();
  const p = await startEngineServer(producer);
  let d = await startEngineServer(consumer);
  const proxy = await startProxyServer({ prefill: [p.url], decode: [d.url] });
  console.log('\n## 2. 20 abandoned requests of 600 tokens');
  const ROUNDS = QUICK ? 3 : 7;
  const base = [];
  const during = [];
  const after = [];
  const drain = [];
  // Round 0 warms up (JIT) every path the measured rounds take; prompts differ per round (no prefix hits) and are of one length.
  for (let round = 0; round <= ROUNDS; round++) {
    const alone = await normalLatencies(proxy.url, 1, `${round}.0`);
    const acs = Array.from({ length: 20 }, () => new AbortController());
    const gone = acs.map((ac, i) => post(proxy.url, { prompt: `abandoned ${round}.${String(i).padStart(2, '0')}`, max_tokens: 600, ignore_eos: true }, ac.signal).catch(() => null));
    await until(() => consumer.scheduler.running.length === 20 && consumer.scheduler.running.every((r) => r.outputTokenIds.length > 0));
    // What abandoned requests cost when they run on (no abort): the same 20, still connected.
    const beside = await normalLatencies(proxy.url, 1, `${round}.1`);
    const steps0 = consumer.stats.steps;
    for (const ac of acs) ac.abort();
    await Promise.all(gone);
    const right = await normalLatencies(proxy.url, 1, `${round}.2`);
    await until(() => consumer.scheduler.numUnfinished === 0);
    if (round === 0) continue;
    base.push(...alone);
    during.push(...beside);
    after.push(...right);
    drain.push(consumer.stats.steps - steps0);
  }
  const spread = (xs) => `${fmt(Math.min(...xs))}..${fmt(Math.max(...xs))}`;
  result('serving', { name: `normal request right after 20 abandoned ones (median of ${ROUNDS} rounds, baseline interleaved)`, figure: fmt(median(after)), baseline: `${fmt(median(base))} alone`, ratio: (median(after) / median(base)).toFixed(2) });
  console.log(`normal request latency (median of ${ROUNDS} rounds, each alone -> beside -> right after, after a warm-up round): alone ${fmt(median(base))} (${spread(base)}); beside the 20 still running ${fmt(median(during))} (${spread(during)}); right after their clients went away ${fmt(median(after))} (${spread(after)})`);
  console.log(`consumer steps from the abort until its abandoned requests were gone (with the normal one), median of the rounds: ${median(drain)}; unfinished now ${consumer.scheduler.numUnfinished}`);

  console.log('\n## 3. consumer down: 4 clients send 100 requests one after another, then a burst of 50 at once');
  const port = d.port;
  await d.close();
  const gen0 = producer.stats.steps;
  const counts = {};
  let sent = 0;
  await Promise.all(
    [0, 1, 2, 3].map(async () => {
      while (sent < 100) {
        const r = await post(proxy.url, { prompt: `while down ${sent++}`, max_tokens: 4 });
        counts[r.status] = (counts[r.status] ?? 0) + 1;
      }
    }),
  );
  console.log(`4 clients: statuses ${JSON.stringify(counts)}; producer steps ${producer.stats.steps - gen0}, requests held ${producer.scheduler.requests.size}, KV usage ${producer.scheduler.kv.usage.toFixed(3)}`);
  const rs = await Promise.all(Array.from({ length: 50 }, (_, i) => post(proxy.url, { prompt: `burst ${i}`, max_tokens: 4 })));
  const burst = {};
  for (const r of rs) burst[r.status] = (burst[r.status] ?? 0) + 1;
  console.log(`burst: statuses ${JSON.stringify(burst)}; producer requests held ${producer.scheduler.requests.size}, KV usage ${producer.scheduler.kv.usage.toFixed(3)}`);
  d = await startEngineServer(consumer, { port });
  await new Promise((r) => setTimeout(r, 1100));
  const back = await post(proxy.url, { prompt: 'back', max_tokens: 4 });
  console.log(`consumer back on the same port: next request ${back.status}`);
  await proxy.close();
  await p.close();
  await d.close();
  await producer.shutdown();
  await consumer.shutdown();
}
