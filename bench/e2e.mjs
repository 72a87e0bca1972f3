#!/usr/bin/env node
// End-to-end benchmark (issue 7): time to first token (TTFT) and throughput of the demo topology,
// KV checksums off vs on. Not a test: nothing is asserted. Run after `npm ci` and `npm run build`:
//   node bench/e2e.mjs                 (KVC_BENCH_QUICK=1 for a short run)
//
// Topology, as in production: a producer engine process, a consumer engine process and a P/D
// proxy process (bin/kvconnect-engine.js, bin/kvconnect-proxy.js, started with the engine's
// launcher from dist/) on 127.0.0.1. The connector is NixlConnector (@kvconnect/nixl-pull) over the
// embedded transfer agent (TCP): the consumer READs the producer's KV blocks. Two such topologies
// run side by side, one with checksums off and one with checksums on (both sides, consumer
// fail-closed, policy recompute); they are measured in interleaved runs (off, on, off, on, ...) so
// both see the same machine state. Only the topology being measured is busy.
//
// Model: the engine's `dense-gqa` preset (hidden 64, 4 GQA layers, float32 compute in JS, bf16 KV),
// prefix caching off (every prompt is prefilled), prompts of 1024 tokens (1023 bytes + BOS).
// A run at concurrency c sends one-token and 16-token requests (ignore_eos), interleaved, with c in
// flight (each client sends its next request when one finishes): at c = 1, 2 + 1 requests; at
// c = 32, one wave of 16 + 16. Figures per run:
//  - TTFT: median latency of the run's one-token requests through the proxy (prefill on P, KV
//    READ, checksum verification and the first token on D; the proxy does not stream, so a
//    one-token request's latency IS the time to first token);
//  - throughput: generated tokens per second of the whole run (all requests).
// Overheads: TTFT(on)/TTFT(off) - 1 and throughput(off)/throughput(on) - 1, from the medians over
// runs. Targets: <= 2% at concurrency 1, <= 1% at concurrency 32.
// Cost: the JS transformer prefills well under 1K tokens/s per core, so a run at c = 32 (32 prompts
// of 1K tokens) takes ~40-60 s per mode on 2 cores; defaults: 4 runs per mode at c = 1 (~1 min
// for both modes), 2 at c = 32 (~3-4 min); KVC_BENCH_QUICK=1: 2 and 1.
// Knobs: KVC_BENCH_RUNS (runs per mode, both concurrencies), KVC_BENCH_CONCURRENCY=1,32, KVC_BENCH_PROMPT_TOKENS=1024.
import { fileURLToPath } from 'node:url';
import { result } from './lib/results.mjs';

// The built packages (dist/), resolved like any dependency: from the monorepo's node_modules, or
// from a folder where the packed packages are installed (copy this file next to its node_modules).
let engine;
let PULL;
try {
  engine = await import('@kvconnect/engine');
  PULL = fileURLToPath(import.meta.resolve('@kvconnect/nixl-pull'));
} catch (e) {
  console.error(`cannot load @kvconnect/engine / @kvconnect/nixl-pull (build first: npm run build): ${e.message}`);
  process.exit(2);
}
const { launchEngineProcess, launchProxyProcess } = engine;

const QUICK = process.env.KVC_BENCH_QUICK === '1';
const CONCURRENCY = (process.env.KVC_BENCH_CONCURRENCY ?? '1,32').split(',').map(Number);
const PROMPT_TOKENS = Number(process.env.KVC_BENCH_PROMPT_TOKENS ?? 1024);
const GEN_TOKENS = 16;
/**
 * The requests of one run at concurrency c, as their max_tokens: one-token requests (TTFT samples)
 * and GEN_TOKENS-token requests, interleaved. At concurrency 32 a run is one wave of 32 requests
 * (16 + 16); the engine's JS transformer prefills ~0.5-1 K tokens/s per core, so a wave of 32
 * 1K-token prompts alone is ~40-60 s of producer time on 2 cores.
 */
const runRequests = (c) => {
  const [n1, n16] = c === 1 ? [2, 1] : [Math.ceil(c / 2), Math.floor(c / 2)];
  const out = [];
  for (let i = 0; i < Math.max(n1, n16); i++) {
    if (i < n1) out.push(1);
    if (i < n16) out.push(GEN_TOKENS);
  }
  return out;
};
/** Runs per mode: more at concurrency 1 (a run is 3 requests) than at 32 (a run is a 32-request wave). */
const runsFor = (c) => Number(process.env.KVC_BENCH_RUNS ?? (c === 1 ? (QUICK ? 2 : 4) : QUICK ? 1 : 2));
const TARGET = (c) => (c === 1 ? 0.02 : 0.01);

const median = (t) => {
  const s = [...t].sort((x, y) => x - y);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};

let promptSeq = 0;
/** A distinct printable prompt of PROMPT_TOKENS tokens (BOS + bytes); distinct from its first block on. */
function prompt() {
  const head = `request ${promptSeq++} ${Math.random().toString(36).slice(2)}: `;
  const filler = 'The KV cache of this prompt is prefilled on the producer and read by the consumer. ';
  let s = head;
  while (s.length < PROMPT_TOKENS - 1) s += filler;
  return s.slice(0, PROMPT_TOKENS - 1);
}

/** Per topology URL: the consumer's verdicts on the loads (from the proxy's responses), and the first odd ones. */
const verdicts = new Map();
async function complete(url, maxTokens) {
  const res = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: prompt(), max_tokens: maxTokens, ignore_eos: true }),
  });
  const body = await res.json();
  if (res.status !== 200) throw new Error(`HTTP ${res.status}: ${JSON.stringify(body).slice(0, 500)}`);
  const load = body.kvconnect?.decode?.load;
  const v = verdicts.get(url) ?? { counts: {}, odd: [] };
  verdicts.set(url, v);
  const key = load ? `${load.verdict}/${load.action}` : 'none';
  v.counts[key] = (v.counts[key] ?? 0) + 1;
  if (load && load.verdict !== 'verified' && v.odd.length < 3) v.odd.push(load);
  const n = body.choices[0].token_ids.length;
  if (n !== maxTokens) throw new Error(`expected ${maxTokens} tokens, got ${n} (${body.choices[0].finish_reason})`);
  return n;
}

/** Sends the requests of `maxTokens` (one per entry) with `c` in flight; returns latencies (ms) by max_tokens, wall time (ms) and tokens. */
async function load(url, c, maxTokens) {
  const lat = new Map();
  let next = 0;
  let tokens = 0;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: Math.min(c, maxTokens.length) }, async () => {
      while (next < maxTokens.length) {
        const m = maxTokens[next++];
        const a = performance.now();
        const n = await complete(url, m);
        tokens += n;
        if (!lat.has(m)) lat.set(m, []);
        lat.get(m).push(performance.now() - a);
      }
    }),
  );
  return { lat, wall: performance.now() - t0, tokens };
}

async function metric(url, line) {
  const text = await (await fetch(`${url}/metrics`)).text();
  const m = text.split('\n').find((l) => l.startsWith(line));
  return m ? Number(m.slice(line.length).trim()) : 0;
}

const children = [];
async function topology(name, checksums) {
  const base = { preset: 'dense-gqa', numBlocks: 8192, maxNumBatchedTokens: 2048, enablePrefixCaching: false, imports: [PULL], requestTimeoutMs: 0 };
  const kv = (role) => ({
    kv_connector: 'NixlConnector',
    kv_role: role,
    enable_kv_checksum: checksums,
    ...(role === 'kv_consumer' && checksums ? { kv_checksum_fail_closed: true, kv_load_failure_policy: 'recompute' } : {}),
  });
  const [p, d] = await Promise.all([
    launchEngineProcess({ config: { ...base, engineId: `bench-${name}-p`, kvTransferConfig: kv('kv_producer') } }),
    launchEngineProcess({ config: { ...base, engineId: `bench-${name}-d`, kvTransferConfig: kv('kv_consumer') } }),
  ]);
  children.push(p, d);
  const proxy = await launchProxyProcess({ config: { prefill: [p.url], decode: [d.url], mode: 'sequential', timeoutMs: 1_800_000 } });
  children.push(proxy);
  return { name, checksums, p, d, proxy };
}

const t0 = performance.now();
// The engine processes inherit this environment: KVC_FORWARD=js runs their forward pass in JS, else
// they use the native kernels where the addon has them (packages/engine/src/model/native-forward.ts).
const fp = engine.forwardPath?.() ?? { path: 'js', reason: 'this engine build has no native forward path' };
console.log(`forward pass: ${fp.path}${fp.reason ? ` (${fp.reason})` : ''}`);
console.log(`e2e benchmark: producer + consumer + proxy processes on 127.0.0.1, NixlConnector (pull, embedded agent), dense-gqa, ${PROMPT_TOKENS}-token prompts, TTFT from one-token requests, throughput from all generated tokens; runs interleaved per mode (off, on, off, on, ...)`);
const topo = { off: await topology('off', false), on: await topology('on', true) };
// Warm up both (JIT, connections, the side-channel handshake).
for (const t of Object.values(topo)) await load(t.proxy.url, 2, [2, 2, 2, 2]);

const rows = [];
const line = (cols) => console.log(`${cols[0].padEnd(34)} ${cols[1].padStart(12)} ${cols[2].padStart(12)} ${cols[3].padStart(9)}  ${cols[4].padEnd(8)} ${cols[5]}`);
const results = [];
for (const c of CONCURRENCY) {
  const reqs = runRequests(c);
  const RUNS = runsFor(c);
  const runs = { off: { ttft: [], tput: [] }, on: { ttft: [], tput: [] } };
  const tc = performance.now();
  for (let r = 0; r < RUNS; r++) {
    for (const mode of ['off', 'on']) {
      const a = await load(topo[mode].proxy.url, c, reqs);
      runs[mode].ttft.push(median(a.lat.get(1)));
      runs[mode].tput.push((a.tokens / a.wall) * 1000);
    }
  }
  const secs = (performance.now() - tc) / 1000;
  const fig = {
    c,
    secs,
    RUNS,
    ttftOff: median(runs.off.ttft),
    ttftOn: median(runs.on.ttft),
    tputOff: median(runs.off.tput),
    tputOn: median(runs.on.tput),
    runs,
  };
  fig.ttftOverhead = fig.ttftOn / fig.ttftOff - 1;
  fig.tputOverhead = fig.tputOff / fig.tputOn - 1;
  results.push(fig);
  console.log(
    `\nconcurrency ${c}: ${RUNS} runs per mode, each ${reqs.filter((m) => m === 1).length} one-token + ${reqs.filter((m) => m !== 1).length} ${GEN_TOKENS}-token requests with ${c} in flight; ${secs.toFixed(1)} s for both modes\n` +
      `  per run TTFT ms   off ${runs.off.ttft.map((x) => x.toFixed(1)).join(' ')} | on ${runs.on.ttft.map((x) => x.toFixed(1)).join(' ')}\n` +
      `  per run tok/s     off ${runs.off.tput.map((x) => x.toFixed(1)).join(' ')} | on ${runs.on.tput.map((x) => x.toFixed(1)).join(' ')}`,
  );
}

// Checksums really ran on the "on" topology (every load verified), and not on the "off" one.
for (const mode of ['off', 'on']) {
  const v = verdicts.get(topo[mode].proxy.url);
  const counts = Object.entries(v?.counts ?? {}).map(([k, n]) => `${k} ${n}`).join(', ');
  console.log(`\nchecksums ${mode}: consumer verdicts on the loads (verdict/action requests): ${counts}`);
  for (const o of v?.odd ?? []) console.log(`  not verified: ${JSON.stringify(o)}`);
}
const m = (await (await fetch(`${topo.on.d.url}/metrics`)).text()).split('\n').filter((l) => /^kvconnect_kv_checksum_(loads|unverified|recomputed|failed)_total/.test(l));
console.log(`  consumer metrics (checksums on): ${m.join('; ')}`);
console.log('');
line(['benchmark', 'off', 'on', 'overhead', 'target', 'verdict']);
for (const f of results) {
  const t = TARGET(f.c);
  for (const [name, off, on, ov, unit] of [
    [`TTFT median, concurrency ${f.c}`, f.ttftOff, f.ttftOn, f.ttftOverhead, 'ms'],
    [`throughput median, concurrency ${f.c}`, f.tputOff, f.tputOn, f.tputOverhead, 'tok/s'],
  ]) {
    const met = ov <= t;
    rows.push({ name, met });
    const spread = (xs) => `${Math.min(...xs).toFixed(1)}..${Math.max(...xs).toFixed(1)}`;
    const key = unit === 'ms' ? 'ttft' : 'tput';
    result('e2e', { name: `${name} (runs: off ${spread(f.runs.off[key])}, on ${spread(f.runs.on[key])} ${unit})`, figure: `${on.toFixed(1)} ${unit} on`, baseline: `${off.toFixed(1)} ${unit} off`, ratio: `${(ov * 100).toFixed(2)}% overhead`, target: `<= ${t * 100}%`, met });
    line([name, `${off.toFixed(unit === 'ms' ? 1 : 1)} ${unit}`, `${on.toFixed(1)} ${unit}`, `${(ov * 100).toFixed(2)}%`, `<= ${t * 100}%`, met ? 'met' : 'MISSED']);
  }
}
console.log(
  `\n${rows.filter((r) => r.met).length} of ${rows.length} targets met in ${((performance.now() - t0) / 1000).toFixed(0)} s (overheads compare medians of interleaved runs; a negative overhead is noise: on a shared machine, compare it with the run-to-run spread above)`,
);
await Promise.all(children.map((c) => c.stop()));
