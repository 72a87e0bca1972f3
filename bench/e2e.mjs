#!/usr/bin/env node
// End-to-end benchmark (issue 7, issue 16 section 3): time to first token (TTFT) and throughput of
// the demo topology, KV checksums off vs on. Not a test: nothing is asserted. Run after `npm ci`
// and `npm run build`:
//   node bench/e2e.mjs                 (KVC_BENCH_QUICK=1 for a short run)
//
// Topology, as in production: a producer engine process, a consumer engine process and a P/D
// proxy process (bin/kvconnect-engine.js, bin/kvconnect-proxy.js, started with the engine's
// launcher from dist/) on 127.0.0.1. The connector is NixlConnector (@kvconnect/nixl-pull) over the
// embedded transfer agent (TCP): the consumer READs the producer's KV blocks. Two such topologies
// run side by side, configured alike except for the checksum keys: one with checksums off, one
// with checksums on (both sides, consumer fail-closed, policy recompute). They are measured in
// interleaved runs in ABBA order (off on, on off, off on, ...), so both see the same machine state
// and neither always runs second. Only the topology being measured is busy. Both are relaunched per
// block (see Blocks below).
//
// Pinning (Linux, `taskset -a`): the two producers share one set of CPUs, the two consumers another
// and the two proxies a third (first hardware threads of distinct physical cores, from sysfs; two
// cores per role with at least 8, else one), so a mode never gets other cores than the other mode,
// processes do not migrate, and the bench's own process keeps the first core. KVC_BENCH_PIN=off
// disables it; KVC_BENCH_PIN=P/D/X names the three taskset CPU lists (e.g. 2,3/4,5/6). Default: on
// with at least 4 physical cores.
//
// Model: the engine's `dense-gqa` preset (hidden 64, 4 GQA layers, bf16 KV), prefix caching off
// (every prompt is prefilled), prompts of 1024 tokens (1023 bytes + BOS). A run at concurrency c
// sends one-token and 16-token requests (ignore_eos), interleaved, with c in flight (each client
// sends its next request when one finishes): at c = 1, 4 + 1 requests; at c = 32, one wave of
// 16 + 16. Figures per run:
//  - TTFT: median latency of the run's one-token requests through the proxy (prefill on P, KV
//    READ, checksum verification and the first token on D; the proxy does not stream, so a
//    one-token request's latency IS the time to first token);
//  - throughput: generated tokens per second of the whole run (all requests);
//  - CPU: the producer's and the consumer's CPU time (user + system, /proc/PID/stat) per request
//    over all runs of a mode: what checksums cost the engines, far less noisy than wall time.
// Overheads (bench/lib/stats.mjs): each ABBA pair (the off run and the on run next to it in time)
// gives a ratio, TTFT(on)/TTFT(off) and throughput(off)/throughput(on); the overhead is the
// Hodges-Lehmann estimate of the pairs' log ratios (median of the Walsh averages),
// back-transformed (exp - 1), with a 95% percentile moving-block bootstrap interval (blocks of
// KVC_BENCH_BOOT_BLOCK=3 consecutive pairs, KVC_BENCH_RESAMPLES=4000, KVC_BENCH_SEED=16, printed).
// Verdict: met only if the whole interval <= target, MISSED if the whole interval > target, else
// MISSED (undecided). Also printed: every run's figure per mode, the overhead of each pair and of
// each block, and the medians per mode. Targets: <= 2% at concurrency 1, <= 1% at concurrency 32.
// CPU per request per run (10 ms ticks) is paired the same way.
// Blocks: the runs are spread over blocks, each with both topologies launched afresh (in
// alternating order) and warmed up: a topology keeps its own speed for its processes' lifetime
// (2-core VM: one pair of topologies ran 20-30% apart for a whole session, the faster being "off"
// in one session and "on" in the next), so one pair of topologies measures that, not checksums.
// Defaults: 24 pairs of runs at c = 1 and 12 at c = 32, in 4 blocks (KVC_BENCH_QUICK=1: 4 and 2, 1 block):
// about 80 s on the GPU machine's 16-core host, estimated from its run of 2026-12-02 (8 + 8 pairs in
// 4 blocks: 52 s; split by the 16-run log of that day: a c = 1 pair ~0.7 s, a c = 32 pair ~3.5 s,
// a block's launch and warm-up ~4.7 s: 4 x 4.7 + 24 x 0.7 + 12 x 3.5 = 78 s).
// Knobs: KVC_BENCH_RUNS (runs per mode, both concurrencies), KVC_BENCH_BLOCKS, KVC_BENCH_CONCURRENCY=1,32,
// KVC_BENCH_PROMPT_TOKENS=1024, KVC_BENCH_PIN=auto|off|P/D/X, KVC_BENCH_WARMUP=16 (requests per topology and block),
// KVC_BENCH_ENGINE_ARGS (Node flags for the engine processes, space-separated, e.g.
// `--cpu-prof --cpu-prof-dir=/tmp/prof`: Node 20 refuses --cpu-prof in NODE_OPTIONS).
import { spawnSync } from 'node:child_process';
import { readFileSync, readdirSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { fileURLToPath } from 'node:url';
import { result } from './lib/results.mjs';
import { pairedOverhead, verdict } from './lib/stats.mjs';

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
const WARMUP = Number(process.env.KVC_BENCH_WARMUP ?? 16);
/** Node flags of the engine processes (KVC_BENCH_ENGINE_ARGS, space-separated), e.g. for `--cpu-prof`. */
const ENGINE_ARGS = (process.env.KVC_BENCH_ENGINE_ARGS ?? '').split(' ').filter((a) => a !== '');
/** Blocks of fresh topologies (both modes relaunched per block); the runs per mode are spread over them. */
const BLOCKS = Math.max(1, Number(process.env.KVC_BENCH_BLOCKS ?? (QUICK ? 1 : 4)));
/** Runs of block `b` when `total` runs per mode are spread over {@link BLOCKS} blocks (at least one each). */
const runsIn = (total, b) => Math.max(1, Math.floor(total / BLOCKS) + (b < total % BLOCKS ? 1 : 0));
const GEN_TOKENS = 16;
/**
 * The requests of one run at concurrency c, as their max_tokens: one-token requests (TTFT samples)
 * and GEN_TOKENS-token requests, interleaved. At c = 1: 4 + 1 (1, 1, 16, 1, 1); at c = 32 one wave
 * of 32 requests (16 + 16).
 */
const runRequests = (c) => {
  if (c === 1) return [1, 1, GEN_TOKENS, 1, 1];
  const [n1, n16] = [Math.ceil(c / 2), Math.floor(c / 2)];
  const out = [];
  for (let i = 0; i < Math.max(n1, n16); i++) {
    if (i < n1) out.push(1);
    if (i < n16) out.push(GEN_TOKENS);
  }
  return out;
};
/** Runs per mode: more at concurrency 1 (a run is 5 requests) than at 32 (a run is a 32-request wave). */
const runsFor = (c) => Number(process.env.KVC_BENCH_RUNS ?? (c === 1 ? (QUICK ? 4 : 24) : QUICK ? 2 : 12));
/** The overheads' interval (bench/lib/stats.mjs): moving-block bootstrap of the pairs, seeded. */
const BOOT = {
  level: 0.95,
  blockLength: Number(process.env.KVC_BENCH_BOOT_BLOCK ?? 3),
  resamples: Number(process.env.KVC_BENCH_RESAMPLES ?? 4000),
  seed: Number(process.env.KVC_BENCH_SEED ?? 16),
};
const TARGET = (c) => (c === 1 ? 0.02 : 0.01);

const median = (t) => {
  const s = [...t].sort((x, y) => x - y);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};

// ---- CPU pinning (Linux taskset) --------------------------------------------------------------

/** CPUs of distinct physical cores (first hardware thread of each), from sysfs; else 0..n-1. */
function coreCpus() {
  try {
    const seen = new Set();
    const out = [];
    const cpus = readdirSync('/sys/devices/system/cpu').filter((d) => /^cpu\d+$/.test(d)).map((d) => Number(d.slice(3))).sort((a, b) => a - b);
    for (const c of cpus) {
      const t = `/sys/devices/system/cpu/cpu${c}/topology`;
      const key = `${readFileSync(`${t}/physical_package_id`, 'utf8').trim()}:${readFileSync(`${t}/core_id`, 'utf8').trim()}`;
      if (seen.has(key)) continue;
      seen.add(key);
      out.push(c);
    }
    return out;
  } catch {
    return Array.from({ length: availableParallelism() }, (_, i) => i);
  }
}

/** [P, D, proxy] taskset CPU lists, or null (no pinning). The bench process itself keeps the first core. */
function pinPlan() {
  const v = process.env.KVC_BENCH_PIN ?? 'auto';
  if (v === 'off' || process.platform !== 'linux') return null;
  if (spawnSync('taskset', ['-V']).status !== 0) return null;
  if (v !== 'auto') {
    const lists = v.split('/');
    if (lists.length !== 3 || lists.some((l) => !/^\d+([,-]\d+)*$/.test(l))) throw new Error(`KVC_BENCH_PIN: expected auto, off or three taskset CPU lists P/D/X (e.g. 2/3/4 or 2,3/4,5/6); got ${v}`);
    return lists;
  }
  const cores = coreCpus();
  const per = cores.length >= 8 ? 2 : 1;
  if (cores.length < 4) return null;
  return [0, 1, 2].map((r) => cores.slice(1 + r * per, 1 + (r + 1) * per).join(','));
}

/** Pins every thread of `pid` to the CPU list `cpus` (new threads inherit it). */
function pin(pid, cpus) {
  const r = spawnSync('taskset', ['-a', '-p', '-c', cpus, String(pid)], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`taskset -a -p -c ${cpus} ${pid}: ${r.stderr || r.error?.message}`);
}

/** CPU time (user + system, all threads) of `pid` in ms, from /proc/PID/stat (clock ticks of 10 ms). */
function cpuMs(pid) {
  try {
    const s = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const f = s.slice(s.lastIndexOf(')') + 2).split(' ');
    return (Number(f[11]) + Number(f[12])) * 10; // utime, stime (fields 14, 15) at USER_HZ 100
  } catch {
    return NaN;
  }
}

/** The load average (1, 5, 15 min) as text, for the printout. */
function loadAvg() {
  try {
    return readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ');
  } catch {
    return 'unknown';
  }
}

// ---- requests -----------------------------------------------------------------------------------

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

// ---- topologies ---------------------------------------------------------------------------------

const PIN = pinPlan();
const children = [];
/** One topology. Both are configured alike but for the checksum keys (printed at start). */
async function topology(name, checksums) {
  const base = { preset: 'dense-gqa', numBlocks: 8192, maxNumBatchedTokens: 2048, enablePrefixCaching: false, imports: [PULL], requestTimeoutMs: 0 };
  const kv = (role) => ({
    kv_connector: 'NixlConnector',
    kv_role: role,
    enable_kv_checksum: checksums,
    ...(role === 'kv_consumer' && checksums ? { kv_checksum_fail_closed: true, kv_load_failure_policy: 'recompute' } : {}),
  });
  const cfg = { p: { ...base, engineId: `bench-${name}-p`, kvTransferConfig: kv('kv_producer') }, d: { ...base, engineId: `bench-${name}-d`, kvTransferConfig: kv('kv_consumer') } };
  const [p, d] = await Promise.all([launchEngineProcess({ config: cfg.p, execArgv: ENGINE_ARGS }), launchEngineProcess({ config: cfg.d, execArgv: ENGINE_ARGS })]);
  children.push(p, d);
  const proxy = await launchProxyProcess({ config: { prefill: [p.url], decode: [d.url], mode: 'sequential', timeoutMs: 1_800_000 } });
  children.push(proxy);
  if (PIN) [p, d, proxy].forEach((x, i) => pin(x.pid, PIN[i]));
  if (ENGINE_ARGS.length) console.log(`topology ${name}: producer pid ${p.pid}, consumer pid ${d.pid}, proxy pid ${proxy.pid} (for the engine flags' output, e.g. --cpu-prof files named by pid)`);
  return { name, checksums, p, d, proxy, cfg };
}

const t0 = performance.now();
// The engine processes inherit this environment: KVC_FORWARD=js runs their forward pass in JS, else
// they use the native kernels where the addon has them (packages/engine/src/model/native-forward.ts).
const fp = engine.forwardPath?.() ?? { path: 'js', reason: 'this engine build has no native forward path' };
console.log(`forward pass: ${fp.path}${fp.reason ? ` (${fp.reason})` : ''}`);
console.log(`e2e benchmark: producer + consumer + proxy processes on 127.0.0.1, NixlConnector (pull, embedded agent), dense-gqa, ${PROMPT_TOKENS}-token prompts, TTFT from one-token requests, throughput from all generated tokens; ${BLOCKS} blocks of fresh topologies, runs interleaved per mode in ABBA order`);
console.log(`pinning: ${PIN ? `producers on CPU ${PIN[0]}, consumers on CPU ${PIN[1]}, proxies on CPU ${PIN[2]} (taskset)` : 'none'}; ${availableParallelism()} CPUs, load average ${loadAvg()}`);

/** Both topologies of one block, launched in `order`, checked alike but for the checksum keys, warmed up. */
async function launchBlock(order) {
  const topo = {};
  for (const mode of order) topo[mode] = await topology(mode, mode === 'on');
  for (const side of ['p', 'd']) {
    const strip = (c) => JSON.stringify({ ...c, engineId: undefined, kvTransferConfig: { ...c.kvTransferConfig, enable_kv_checksum: undefined, kv_checksum_fail_closed: undefined, kv_load_failure_policy: undefined } });
    if (strip(topo.off.cfg[side]) !== strip(topo.on.cfg[side])) throw new Error(`the ${side} configs differ beyond checksums`);
  }
  // Warm up both (JIT of the per-request paths, connections, the side-channel handshake):
  // sequential full-size requests, then one small concurrent batch.
  for (const t of Object.values(topo)) {
    await load(t.proxy.url, 1, Array.from({ length: WARMUP }, (_, i) => (i % 4 === 3 ? GEN_TOKENS : 1)));
    await load(t.proxy.url, 8, Array.from({ length: 8 }, (_, i) => (i % 2 ? GEN_TOKENS : 1)));
  }
  return topo;
}

const rows = [];
const line = (cols) => console.log(`${cols[0].padEnd(34)} ${cols[1].padStart(12)} ${cols[2].padStart(12)} ${cols[3].padStart(9)} ${cols[4].padStart(17)} ${cols[5].padStart(5)}  ${cols[6].padEnd(8)} ${cols[7]}`);
const newRuns = () => ({ ttft: [], tput: [], cpuP: 0, cpuD: 0, cpuPRun: [], cpuDRun: [], requests: 0 });
/** Per concurrency: runs per mode (over all blocks), each block's run indices, and seconds measured. */
const byC = new Map(CONCURRENCY.map((c) => [c, { runs: { off: newRuns(), on: newRuns() }, blocks: [], secs: 0 }]));
// Verdict counts and consumer metrics of every "on" / "off" topology (they are stopped block by block).
const verdictUrls = { off: [], on: [] };
const onMetrics = [];
const onProducerMetrics = [];
// The "on" consumers' metrics right after the warm-up, to tell the measured loads from the warm-up loads.
const warmupMetrics = [];
for (let b = 0; b < BLOCKS; b++) {
  // Fresh processes per block, launched in alternating order: a topology's own luck (memory
  // placement, page backing, which process started first) lasts as long as its processes, so
  // it is spread over both modes instead of biasing one.
  const topo = await launchBlock(b % 2 === 0 ? ['off', 'on'] : ['on', 'off']);
  for (const mode of ['off', 'on']) verdictUrls[mode].push(topo[mode].proxy.url);
  warmupMetrics.push(await (await fetch(`${topo.on.d.url}/metrics`)).text());
  if (b === 0) console.log(`checksums on: ${JSON.stringify(topo.on.cfg.d.kvTransferConfig)} (consumer), the producer with enable_kv_checksum only`);
  for (const c of CONCURRENCY) {
    const reqs = runRequests(c);
    const e = byC.get(c);
    const n = runsIn(runsFor(c), b);
    const first = e.runs.off.ttft.length;
    const tc = performance.now();
    for (let r = 0; r < n; r++) {
      for (const mode of (first + r) % 2 === 0 ? ['off', 'on'] : ['on', 'off']) {
        const t = topo[mode];
        const cp = cpuMs(t.p.pid);
        const cd = cpuMs(t.d.pid);
        const a = await load(t.proxy.url, c, reqs);
        const m = e.runs[mode];
        m.ttft.push(median(a.lat.get(1)));
        m.tput.push((a.tokens / a.wall) * 1000);
        const [dp, dd] = [cpuMs(t.p.pid) - cp, cpuMs(t.d.pid) - cd];
        m.cpuP += dp;
        m.cpuD += dd;
        m.cpuPRun.push(dp / reqs.length);
        m.cpuDRun.push(dd / reqs.length);
        m.requests += reqs.length;
      }
    }
    e.secs += (performance.now() - tc) / 1000;
    e.blocks.push([first, first + n]);
  }
  onMetrics.push(await (await fetch(`${topo.on.d.url}/metrics`)).text());
  onProducerMetrics.push(await (await fetch(`${topo.on.p.url}/metrics`)).text());
  await Promise.all([topo.off, topo.on].flatMap((t) => [t.p, t.d, t.proxy]).map((x) => x.stop()));
}

const results = [];
/** An overhead as a signed percentage, and an interval of pairedOverhead's result. */
const ov = (x, d = 2) => `${x >= 0 ? '+' : ''}${(x * 100).toFixed(d)}%`;
const ci = (o) => `${Math.round(o.level * 100)}% CI ${ov(o.lo)}..${ov(o.hi)}`;
console.log(`\noverheads: Hodges-Lehmann estimate of the within-pair ratios (each pair: the off and the on run next to each other in time), ${Math.round(BOOT.level * 100)}% interval from a percentile moving-block bootstrap (blocks of ${BOOT.blockLength} consecutive pairs, ${BOOT.resamples} resamples, seed ${BOOT.seed}: KVC_BENCH_BOOT_BLOCK, KVC_BENCH_RESAMPLES, KVC_BENCH_SEED); verdict met only if the whole interval <= target, MISSED if wholly above, else MISSED (undecided)`);
for (const c of CONCURRENCY) {
  const { runs, blocks, secs } = byC.get(c);
  const reqs = runRequests(c);
  const RUNS = runs.off.ttft.length;
  const pairs = (key, f) => runs.off[key].map((off, i) => f(off, runs.on[key][i]));
  const ofBlock = (key, f) => blocks.map(([a, z]) => f(median(runs.off[key].slice(a, z)), median(runs.on[key].slice(a, z))));
  const fig = {
    c,
    secs,
    RUNS,
    nBlocks: blocks.length,
    ttftOff: median(runs.off.ttft),
    ttftOn: median(runs.on.ttft),
    tputOff: median(runs.off.tput),
    tputOn: median(runs.on.tput),
    // Overhead of each ABBA pair of runs (the same machine state) and of each block (the same processes), for the spread.
    ttftPairs: pairs('ttft', (off, on) => on / off - 1),
    tputPairs: pairs('tput', (off, on) => off / on - 1),
    ttftBlocks: ofBlock('ttft', (off, on) => on / off - 1),
    tputBlocks: ofBlock('tput', (off, on) => off / on - 1),
    runs,
  };
  // The overheads (bench/lib/stats.mjs): Hodges-Lehmann of the within-pair log ratios, percentile
  // moving-block bootstrap interval; TTFT on / off, throughput off / on (both: above 0 is a cost).
  fig.ttft = pairedOverhead(runs.on.ttft, runs.off.ttft, BOOT);
  fig.tput = pairedOverhead(runs.off.tput, runs.on.tput, BOOT);
  // CPU per request of each run (10 ms ticks over the run's requests), paired the same way; none when a run got no tick.
  const cpuPair = (k) => (runs.on[k].every((x) => x > 0) && runs.off[k].every((x) => x > 0) ? pairedOverhead(runs.on[k], runs.off[k], BOOT) : null);
  fig.cpuP = cpuPair('cpuPRun');
  fig.cpuD = cpuPair('cpuDRun');
  results.push(fig);
  const cpu = (m, k) => (runs[m][k] / runs[m].requests).toFixed(2);
  const pc = (xs) => xs.map((x) => `${(x * 100).toFixed(1)}%`).join(' ');
  const est = (o) => `${ov(o.estimate)} (${ci(o)}, ${o.n} pairs)`;
  console.log(
    `\nconcurrency ${c}: ${RUNS} runs per mode in ${blocks.length} blocks, each ${reqs.filter((m) => m === 1).length} one-token + ${reqs.filter((m) => m !== 1).length} ${GEN_TOKENS}-token requests with ${c} in flight; ${secs.toFixed(1)} s for both modes\n` +
      `  per run TTFT ms    off ${runs.off.ttft.map((x) => x.toFixed(1)).join(' ')} | on ${runs.on.ttft.map((x) => x.toFixed(1)).join(' ')}\n` +
      `  per run tok/s      off ${runs.off.tput.map((x) => x.toFixed(1)).join(' ')} | on ${runs.on.tput.map((x) => x.toFixed(1)).join(' ')}\n` +
      `  overhead per pair  TTFT ${pc(fig.ttftPairs)} | throughput ${pc(fig.tputPairs)}\n` +
      `  overhead per block TTFT ${pc(fig.ttftBlocks)} | throughput ${pc(fig.tputBlocks)}\n` +
      `  overhead (Hodges-Lehmann of the pairs) TTFT ${est(fig.ttft)} | throughput ${est(fig.tput)}\n` +
      (fig.cpuP && fig.cpuD ? `  CPU per request on/off (pairs, same statistics) producer ${est(fig.cpuP)} | consumer ${est(fig.cpuD)}\n` : '') +
      `  CPU ms per request producer off ${cpu('off', 'cpuP')} on ${cpu('on', 'cpuP')}, consumer off ${cpu('off', 'cpuD')} on ${cpu('on', 'cpuD')} (/proc, 10 ms ticks over ${runs.off.requests} requests per mode)`,
  );
}

// Checksums really ran on the "on" topology (every load verified), and not on the "off" one.
for (const mode of ['off', 'on']) {
  const counts = {};
  const odd = [];
  for (const url of verdictUrls[mode]) {
    const v = verdicts.get(url);
    for (const [k, n] of Object.entries(v?.counts ?? {})) counts[k] = (counts[k] ?? 0) + n;
    odd.push(...(v?.odd ?? []));
  }
  console.log(`\nchecksums ${mode}: consumer verdicts on the loads (verdict/action requests): ${Object.entries(counts).map(([k, n]) => `${k} ${n}`).join(', ')}`);
  for (const o of odd.slice(0, 3)) console.log(`  not verified: ${JSON.stringify(o)}`);
}
for (const [b, text] of onMetrics.entries()) {
  const m = text.split('\n').filter((l) => /^kvconnect_kv_checksum_(loads|unverified|recomputed|failed)_total/.test(l));
  console.log(`  consumer metrics (checksums on, block ${b + 1}): ${m.join('; ')}`);
}
// What the checksums cost, read from the engines rather than from the noisy A/B above: the
// workers' checksum computation (kvconnect_kv_checksum_seconds{side}, docs/metrics.md: producer
// "send", consumer "recv"), summed over every "on" topology, per verified load (warm-up loads
// included on both counts), against the median TTFT of the "off" runs at concurrency 1.
const metricSum = (texts, re) => texts.reduce((a, t) => a + t.split('\n').filter((l) => re.test(l)).reduce((b, l) => b + Number(l.split(' ').at(-1)), 0), 0);
const sendS = metricSum(onProducerMetrics, /^kvconnect_kv_checksum_seconds_sum\{[^}]*side="send"/);
const recvS = metricSum(onMetrics, /^kvconnect_kv_checksum_seconds_sum\{[^}]*side="recv"/);
const loadsOn = metricSum(onMetrics, /^kvconnect_kv_checksum_loads_total\{/);
const loadsWarmup = metricSum(warmupMetrics, /^kvconnect_kv_checksum_loads_total\{/);
const loadsText = `${loadsOn} loads: ${loadsOn - loadsWarmup} measured + ${loadsWarmup} warm-up`;
const c1 = results.find((f) => f.c === 1);
if (loadsOn > 0) {
  const perLoadMs = ((sendS + recvS) / loadsOn) * 1000;
  const share = c1 ? ` = ${((perLoadMs / c1.ttftOff) * 100).toFixed(2)}% of the TTFT median with checksums off at concurrency 1 (${c1.ttftOff.toFixed(1)} ms)` : '';
  console.log(`\nchecksum computation in the workers per verified load: producer ${((sendS / loadsOn) * 1000).toFixed(3)} ms + consumer ${((recvS / loadsOn) * 1000).toFixed(3)} ms${share} (${loadsText}; payload encoding and the verdict comparison are not in this metric)`);
  result('e2e', { name: `checksum computation in the workers per verified load (kvconnect_kv_checksum_seconds, producer + consumer, ${loadsText})`, figure: `${perLoadMs.toFixed(3)} ms`, baseline: c1 ? `${c1.ttftOff.toFixed(1)} ms TTFT off (c=1)` : '-', ratio: c1 ? `${((perLoadMs / c1.ttftOff) * 100).toFixed(2)}%` : '-' });
}
console.log('');
line(['benchmark', 'off', 'on', 'overhead', 'interval', 'pairs', 'target', 'verdict']);
const pct = (x) => `${(x * 100).toFixed(1)}%`;
const spread = (xs, d = 1) => `${Math.min(...xs).toFixed(d)}..${Math.max(...xs).toFixed(d)}`;
for (const f of results) {
  const t = TARGET(f.c);
  for (const [name, off, on, o, unit, key, pairsOv] of [
    [`TTFT, concurrency ${f.c}`, f.ttftOff, f.ttftOn, f.ttft, 'ms', 'ttft', f.ttftPairs],
    [`throughput, concurrency ${f.c}`, f.tputOff, f.tputOn, f.tput, 'tok/s', 'tput', f.tputPairs],
  ]) {
    const v = verdict(o, t);
    rows.push({ name, met: v === 'met', v });
    const blocksOv = key === 'ttft' ? f.ttftBlocks : f.tputBlocks;
    const pairText = `pairs ${pct(Math.min(...pairsOv))}..${pct(Math.max(...pairsOv))}; blocks ${blocksOv.map(pct).join(' ')}`;
    result('e2e', {
      name: `${name} overhead, Hodges-Lehmann of ${o.n} within-pair ratios in ${f.nBlocks} blocks, ${ci(o).replace('CI', 'block-bootstrap interval')} (blocks of ${o.blockLength} pairs, ${o.resamples} resamples, seed ${o.seed}); medians off/on in figure/baseline (runs: off ${spread(f.runs.off[key])}, on ${spread(f.runs.on[key])} ${unit}; ${pairText})`,
      figure: `${on.toFixed(1)} ${unit} on`,
      baseline: `${off.toFixed(1)} ${unit} off`,
      ratio: `${ov(o.estimate)} overhead (${ci(o)}${v === 'MISSED (undecided)' ? ', undecided' : ''})`,
      target: `<= ${t * 100}%`,
      met: v === 'met',
    });
    line([name, `${off.toFixed(1)} ${unit}`, `${on.toFixed(1)} ${unit}`, ov(o.estimate), `${ov(o.lo)}..${ov(o.hi)}`, String(o.n), `<= ${t * 100}%`, v]);
  }
  for (const [side, k, o] of [['producer', 'cpuP', f.cpuP], ['consumer', 'cpuD', f.cpuD]]) {
    const off = f.runs.off[k] / f.runs.off.requests;
    const on = f.runs.on[k] / f.runs.on.requests;
    result('e2e', { name: `${side} CPU per request, concurrency ${f.c} (/proc utime+stime over ${f.runs.on.requests} requests per mode; ratio: Hodges-Lehmann of the runs' on/off ratios${o ? `, ${ci(o)}` : ''})`, figure: `${on.toFixed(2)} ms on`, baseline: `${off.toFixed(2)} ms off`, ratio: o ? ov(o.estimate) : `${((on / off - 1) * 100).toFixed(2)}%` });
    line([`${side} CPU/request, c=${f.c}`, `${off.toFixed(2)} ms`, `${on.toFixed(2)} ms`, o ? ov(o.estimate) : ov(on / off - 1), o ? `${ov(o.lo)}..${ov(o.hi)}` : '-', o ? String(o.n) : '-', '-', 'figure']);
  }
}
console.log(
  `\n${rows.filter((r) => r.met).length} of ${rows.length} targets met, ${rows.filter((r) => r.v === 'MISSED (undecided)').length} undecided, in ${((performance.now() - t0) / 1000).toFixed(0)} s (overheads: Hodges-Lehmann of the within-pair ratios with a ${Math.round(BOOT.level * 100)}% block-bootstrap interval; the off/on columns are medians of all runs)`,
);
await Promise.all(children.map((c) => c.stop())); // all stopped already; idempotent
