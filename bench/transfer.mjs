#!/usr/bin/env node
// Transfer benchmarks (issues "@kvconnect/transfer" and #16 section 2): the embedded agent between
// two processes for descriptors of 16 KiB to 16 MiB, READ and WRITE, over its same-host data plane
// (the target's memory in a shared mapping, SharedHostArena) and over TCP loopback (heap memory),
// as GB/s (1e9 B/s) and as a ratio to a memcpy (Buffer.copy of the same descriptors) measured in
// the same run, with verdicts: shared memory >= 0.7 of memcpy at 256 KiB and more, TCP >= 0.5 of
// memcpy at 1 MiB (KVC_BENCH_PATHS=shm,tcp picks the paths); then, where `ucx_perftest` is
// found (KVC_UCX_PERFTEST, else .carry/ucx/bin of scripts/device-carry.sh, else PATH: Debian
// ucx-utils), UCX over TCP loopback (`UCX_TLS=tcp,self`) for the same sizes, and the ratio of
// the embedded agent's TCP path to UCX's best test at each size, with verdicts (>= 1).
// Not a test: nothing is asserted. Run after `npm run build` (it imports the built package):
//   node bench/transfer.mjs          (KVC_BENCH_QUICK=1 for a short run)
// The target agent runs in a child process (as P and D do), both on 127.0.0.1.
// Targets (issue #16 section 2): the TCP path at or above UCX's best TCP test at every size.
// ucx_perftest moves every message from one reused buffer (cache-resident on both sides), while
// the rows above stream TOTAL bytes of distinct descriptors (memory-bound): so the TCP path is also
// measured with every descriptor on one buffer of its size at each end, and compared to UCX as a
// second row per size beside the streaming one, labelled "one reused buffer"
// (KVC_BENCH_REUSED=0 leaves it out).
// UCX with UCX_TLS=tcp opens one TCP connection per interface it finds (lo and eth0 on a host with
// one NIC: both reach 127.0.0.1) and stripes its messages over them; the column "ucp_am_bw 1 conn"
// is ucp_am_bw held to one connection (UCX_NET_DEVICES=lo), beside it the embedded agent's ratio
// to it: per-connection parity, context only (the verdicts stay against UCX's best test).
// KVC_BENCH_LANES=n runs the initiator with the agent option `lanes` (n TCP connections per peer,
// the transfers striped over them; default 1).
import { fork, spawn, spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { EmbeddedAgent, SharedHostArena } from '@kvconnect/transfer';

const QUICK = process.env.KVC_BENCH_QUICK === '1';
const TOTAL = (QUICK ? 64 : 256) << 20; // bytes per timed transfer
const REPS = QUICK ? 3 : 5;
const SIZES = (process.env.KVC_BENCH_SIZES ?? "16384,65536,262144,1048576,4194304,16777216").split(",").map(Number);
const fmtSize = (n) => (n >= 1 << 20 ? `${n >> 20} MiB` : `${n >> 10} KiB`);
const median = (t) => [...t].sort((x, y) => x - y)[Math.floor(t.length / 2)];
// KVC_BENCH_STAT=min: the best of the timings (transfer and memcpy alike), for a shared, loaded
// machine where the median mostly measures the other tenants; default median.
const STAT = process.env.KVC_BENCH_STAT === 'min' ? (t) => Math.min(...t) : median;
const gbs = (bytes, ms) => bytes / (ms * 1e6);
const PATHS = (process.env.KVC_BENCH_PATHS ?? 'shm,tcp').split(',');
/** UCX tests compared (UCP level: two-sided tag, stream and active messages; one-sided put and get, which UCX emulates over TCP). */
const UCX_TESTS = ['tag_bw', 'stream_bw', 'ucp_am_bw', 'ucp_put_bw', 'ucp_get'];
// KVC_BENCH_REUSED=0 leaves out the TCP rows on one reused buffer (the like-for-like UCX comparison).
const REUSED = process.env.KVC_BENCH_REUSED !== '0';
// KVC_BENCH_LANES: the initiator's `lanes` option (TCP connections per peer); unset: the agent's default.
const LANES = process.env.KVC_BENCH_LANES === undefined ? undefined : Number(process.env.KVC_BENCH_LANES);
/** The UCX test held to one TCP connection (UCX_NET_DEVICES=lo), a context column. */
const UCX_ONE_CONN = 'ucp_am_bw';
// One row per verdict for bench/all.mjs's table (bench/lib/results.mjs), where that module exists.
const { result } = await import('./lib/results.mjs').catch(() => ({ result: () => {} }));

if (process.argv[2] === 'target') {
  // Child: one agent with a region of TOTAL bytes per path: heap memory (TCP) and a shared mapping.
  const agent = await EmbeddedAgent.create({ name: 'bench-target', ...JSON.parse(process.env.KVC_BENCH_TARGET_OPTS ?? '{}') });
  const arena = new SharedHostArena();
  const heap = new Uint8Array(TOTAL);
  const shared = arena.alloc(TOTAL);
  for (const mem of [heap, shared]) for (let i = 0; i < mem.length; i += 4096) mem[i] = i & 0xff;
  const reg = await agent.registerMemory([{ bytes: heap }, { bytes: shared }]);
  process.send({ md: [...(await agent.getLocalMetadata())], addr: { tcp: reg.regions[0].addr, shm: reg.regions[1].addr }, shared: arena.shared, reason: arena.reason });
  process.on('message', async (m) => {
    if (m === 'exit') {
      await agent.close();
      process.exit(0);
    }
  });
} else {
  await main();
}

async function main() {
  console.log(`kvconnect transfer bench: ${QUICK ? 'quick' : 'full'}; ${TOTAL >> 20} MiB per transfer, ${STAT === median ? 'median' : 'best'} of ${REPS}; node ${process.version}; lanes ${LANES ?? 'default (1)'}`);
  const child = fork(fileURLToPath(import.meta.url), ['target'], { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
  const ready = await new Promise((r) => child.once('message', r));
  const a = await EmbeddedAgent.create({ name: 'bench-initiator', ...JSON.parse(process.env.KVC_BENCH_INITIATOR_OPTS ?? '{}'), ...(LANES === undefined ? {} : { lanes: LANES }) });
  const local = new Uint8Array(TOTAL);
  const other = new Uint8Array(TOTAL);
  local.fill(7);
  const reg = await a.registerMemory([{ bytes: local }]);
  const peer = await a.loadRemoteMetadata(Uint8Array.from(ready.md));
  if (!ready.shared && PATHS.includes('shm')) console.log(`same-host data plane skipped: ${ready.reason}`);
  const results = {};
  for (const path of PATHS) {
    if (path === 'shm' && !ready.shared) continue;
    results[path] = await measure(a, reg, peer, ready.addr[path], local, other, path, false);
  }
  // The TCP path again with every descriptor on one buffer of the descriptor's size at each end,
  // as ucx_perftest moves its messages (one buffer, reused): a second row beside the streaming one.
  const reused = results.tcp && REUSED ? await measure(a, reg, peer, ready.addr.tcp, local, other, 'tcp', true) : null;
  child.send('exit');
  await a.close();

  const verdicts = [];
  for (const [path, rows] of Object.entries(results)) {
    const what = path === 'shm' ? "same-host data plane (target memory in a shared mapping, copied by the initiator after the handshake)" : 'TCP loopback (heap memory)';
    console.log(`\nembedded agent, ${what}, two processes (GB/s = 1e9 B/s; ratio to Buffer.copy of the same descriptors in this run)`);
    console.log('| descriptor | READ GB/s | READ / memcpy | WRITE GB/s | WRITE / memcpy | memcpy GB/s |');
    console.log('| --- | --- | --- | --- | --- | --- |');
    for (const r of rows) {
      const mc = (r.READ_memcpy + r.WRITE_memcpy) / 2;
      console.log(`| ${fmtSize(r.size)} | ${r.READ.toFixed(2)} | ${(r.READ / r.READ_memcpy).toFixed(3)} | ${r.WRITE.toFixed(2)} | ${(r.WRITE / r.WRITE_memcpy).toFixed(3)} | ${mc.toFixed(2)} |`);
      for (const op of ['READ', 'WRITE']) {
        const ratio = r[op] / r[`${op}_memcpy`];
        const target = path === 'shm' && r.size >= 256 << 10 ? 0.7 : path === 'tcp' && r.size === 1 << 20 ? 0.5 : null;
        if (target === null) continue;
        verdicts.push(`${ratio >= target ? 'PASS' : 'FAIL'} ${path} ${op} ${fmtSize(r.size)}: ${ratio.toFixed(3)} of memcpy (target >= ${target})`);
        result('transfer', { name: `embedded ${path} ${op} ${fmtSize(r.size)}`, figure: `${r[op].toFixed(2)} GB/s`, baseline: `memcpy ${r[`${op}_memcpy`].toFixed(2)} GB/s`, ratio: ratio.toFixed(3), target: `>= ${target}`, met: ratio >= target });
      }
    }
  }
  if (reused) {
    console.log('\nembedded agent, TCP loopback, every descriptor on ONE reused buffer of its size at each end (as ucx_perftest reuses one message buffer); memcpy: the same one buffer copied as often');
    console.log('| descriptor | READ GB/s | WRITE GB/s | memcpy GB/s (one buffer) |');
    console.log('| --- | --- | --- | --- |');
    for (const r of reused) console.log(`| ${fmtSize(r.size)} | ${r.READ.toFixed(2)} | ${r.WRITE.toFixed(2)} | ${((r.READ_memcpy + r.WRITE_memcpy) / 2).toFixed(2)} |`);
  }
  console.log('\nverdicts');
  for (const v of verdicts) console.log(`  ${v}`);
  const rows = results.tcp;
  if (!rows) return;
  const ucx = findUcx();
  if (!ucx) {
    console.log('\nUCX comparison skipped: ucx_perftest not found (KVC_UCX_PERFTEST, .carry/ucx/bin of scripts/device-carry.sh, or PATH; Debian: apt-get install -y ucx-utils)');
    return;
  }
  const lanes = a.lanes ?? 1;
  console.log(`\nUCX (${ucx.bin}), UCX_TLS=tcp,self, server and client on 127.0.0.1, ${UCX_TESTS.join(', ')} (GB/s = 1e9 B/s; UCX prints MB/s of 2^20 B); UCX stripes over one TCP connection per interface (lo, eth0, ...); "${UCX_ONE_CONN} 1 conn": with UCX_NET_DEVICES=lo (one connection), beside it the embedded agent (${lanes} lane${lanes === 1 ? '' : 's'}) per connection of UCX's: READ / 1 conn, WRITE / 1 conn`);
  console.log(`| descriptor | ${UCX_TESTS.join(' | ')} | best UCX | embedded READ / best | embedded WRITE / best | ${UCX_ONE_CONN} 1 conn | READ / 1 conn | WRITE / 1 conn |`);
  console.log(`| --- | ${UCX_TESTS.map(() => '---').join(' | ')} | --- | --- | --- | --- | --- | --- |`);
  const ucxVerdicts = [];
  let port = 13500 + (process.pid % 200);
  for (const r of rows) {
    const iters = Math.max(QUICK ? 50 : 100, Math.min(20000, Math.floor(TOTAL / r.size)));
    const res = {};
    for (const t of UCX_TESTS) res[t] = await ucxPerf(ucx, t, r.size, iters, port++);
    const one = await ucxPerf(ucx, UCX_ONE_CONN, r.size, iters, port++, { UCX_NET_DEVICES: 'lo' });
    const ok = Object.entries(res).filter(([, x]) => x > 0);
    const f = (x) => (x > 0 ? x.toFixed(2) : 'failed');
    const perConn = one > 0 ? `${f(one)} | ${(r.READ / one).toFixed(2)} | ${(r.WRITE / one).toFixed(2)}` : 'failed | - | -';
    if (one > 0) result('transfer', { name: `embedded tcp ${fmtSize(r.size)} (${lanes} lane${lanes === 1 ? '' : 's'}) vs UCX ${UCX_ONE_CONN} on one connection (context)`, figure: `READ ${r.READ.toFixed(2)}, WRITE ${r.WRITE.toFixed(2)} GB/s`, baseline: `UCX ${UCX_ONE_CONN} UCX_NET_DEVICES=lo ${one.toFixed(2)} GB/s`, ratio: `${(r.READ / one).toFixed(2)} / ${(r.WRITE / one).toFixed(2)}`, target: 'context', met: true });
    if (ok.length === 0) {
      console.log(`| ${fmtSize(r.size)} | ${UCX_TESTS.map(() => 'failed').join(' | ')} | - | - | - | ${perConn} |`);
      ucxVerdicts.push(`SKIP tcp vs UCX ${fmtSize(r.size)}: every UCX test failed`);
      continue;
    }
    const [bestTest, best] = ok.reduce((m, e) => (e[1] > m[1] ? e : m));
    console.log(`| ${fmtSize(r.size)} | ${UCX_TESTS.map((t) => f(res[t])).join(' | ')} | ${f(best)} (${bestTest}) | ${(r.READ / best).toFixed(2)} | ${(r.WRITE / best).toFixed(2)} | ${perConn} |`);
    for (const op of ['READ', 'WRITE']) {
      const ratio = r[op] / best;
      ucxVerdicts.push(`${ratio >= 1 ? 'PASS' : 'FAIL'} tcp ${op} ${fmtSize(r.size)}: ${ratio.toFixed(2)}x UCX's best (${bestTest} ${best.toFixed(2)} GB/s; target >= 1)`);
      result('transfer', { name: `embedded tcp ${op} ${fmtSize(r.size)} vs UCX tcp`, figure: `${r[op].toFixed(2)} GB/s`, baseline: `UCX ${bestTest} ${best.toFixed(2)} GB/s`, ratio: ratio.toFixed(2), target: '>= 1', met: ratio >= 1 });
    }
    // The like-for-like row: our path on one reused buffer, as UCX's tests (a second row, same target).
    const ru = reused?.find((x) => x.size === r.size);
    if (ru) {
      const ruOne = one > 0 ? `${f(one)} | ${(ru.READ / one).toFixed(2)} | ${(ru.WRITE / one).toFixed(2)}` : 'failed | - | -';
      console.log(`| ${fmtSize(r.size)}, one reused buffer | | | | | | ${f(best)} (${bestTest}) | ${(ru.READ / best).toFixed(2)} | ${(ru.WRITE / best).toFixed(2)} | ${ruOne} |`);
      for (const op of ['READ', 'WRITE']) {
        const ratio = ru[op] / best;
        ucxVerdicts.push(`${ratio >= 1 ? 'PASS' : 'FAIL'} tcp ${op} ${fmtSize(r.size)}, one reused buffer as ucx_perftest: ${ratio.toFixed(2)}x UCX's best (${bestTest} ${best.toFixed(2)} GB/s; target >= 1)`);
        result('transfer', { name: `embedded tcp ${op} ${fmtSize(r.size)}, one reused buffer (as ucx_perftest) vs UCX tcp`, figure: `${ru[op].toFixed(2)} GB/s`, baseline: `UCX ${bestTest} ${best.toFixed(2)} GB/s`, ratio: ratio.toFixed(2), target: '>= 1', met: ratio >= 1 });
      }
    }
  }
  console.log('\nverdicts against UCX');
  for (const v of ucxVerdicts) console.log(`  ${v}`);
}

/**
 * Where `ucx_perftest` is, and the environment it needs: KVC_UCX_PERFTEST (a path), else the copy
 * of scripts/device-carry.sh in .carry/ucx (its libraries in .carry/ucx/lib, transport modules
 * in .carry/ucx/lib/ucx), else PATH. Null when none is found.
 */
function findUcx() {
  const root = join(dirname(fileURLToPath(import.meta.url)), '..');
  const carried = join(root, '.carry/ucx/bin/ucx_perftest');
  const bin = process.env.KVC_UCX_PERFTEST || (existsSync(carried) ? carried : null);
  if (bin) {
    const lib = join(dirname(bin), '../lib');
    if (!existsSync(lib)) return { bin, env: {} };
    const ld = [lib, process.env.LD_LIBRARY_PATH].filter(Boolean).join(':');
    return { bin, env: { LD_LIBRARY_PATH: ld, UCX_MODULE_DIR: join(lib, 'ucx') } };
  }
  const which = spawnSync('sh', ['-c', 'command -v ucx_perftest'], { encoding: 'utf8' });
  return which.status === 0 && which.stdout.trim() ? { bin: which.stdout.trim(), env: {} } : null;
}


/** Waits (up to 5 s) until every lane of `a` to `peer` finished its handshake (agents without `laneStats`: at once). */
async function lanesReady(a, peer) {
  if (typeof a.laneStats !== 'function') return;
  const end = Date.now() + 5000;
  while (Date.now() < end && !(a.laneStats(peer).length === a.lanes && a.laneStats(peer).every((l) => l.ready))) await new Promise((r) => setTimeout(r, 5));
}

/**
 * READ and WRITE of TOTAL bytes in descriptors of each size against the target region at
 * `remoteAddr`: distinct descriptors over TOTAL bytes at each end, or with `reused`, every
 * descriptor on the first `size` bytes at each end (one buffer, as ucx_perftest), and the memcpy
 * baseline then copies that one buffer as often.
 */
async function measure(a, reg, peer, remoteAddr, local, other, path, reused) {
  const rows = [];
  for (const size of SIZES) {
    const n = TOTAL / size;
    const descs = (base) => Array.from({ length: n }, (_, i) => ({ addr: base + (reused ? 0 : i * size), length: size }));
    const l = await a.prepDescList(null, 'DRAM', descs(reg.regions[0].addr));
    const r = await a.prepDescList(peer, 'DRAM', descs(remoteAddr));
    const row = { size };
    for (const op of ['READ', 'WRITE']) {
      const req = await a.makeTransfer({ op, local: l, remote: r });
      const once = async () => {
        const t0 = process.hrtime.bigint();
        await a.post(req);
        const st = await a.wait(req);
        if (st !== 'done') throw new Error(`${op} ${size}: ${st}`);
        return Number(process.hrtime.bigint() - t0) / 1e6;
      };
      const copy = () => {
        const t0 = process.hrtime.bigint();
        for (let off = 0; off < TOTAL; off += size) Buffer.prototype.copy.call(local, other, reused ? 0 : off, reused ? 0 : off, (reused ? 0 : off) + size);
        return Number(process.hrtime.bigint() - t0) / 1e6;
      };
      await once(); // warm-up (connection and handshake, mappings, JIT)
      await lanesReady(a, peer);
      copy();
      const tx = [];
      const tc = [];
      for (let i = 0; i < REPS; i++) {
        tx.push(await once());
        tc.push(copy());
      }
      row[op] = gbs(TOTAL, STAT(tx));
      row[`${op}_memcpy`] = gbs(TOTAL, STAT(tc));
      if (path === 'shm' && a.shmStats.transfers === 0) throw new Error('the shm path moved nothing: the transfers went over TCP');
      await a.release(req);
    }
    rows.push(row);
  }
  return rows;
}

/**
 * Runs one ucx_perftest server + client pair ({@link findUcx}), with `extraEnv` on both (e.g.
 * UCX_NET_DEVICES=lo: one TCP connection); returns GB/s (overall bandwidth) or -1.
 */
async function ucxPerf(ucx, test, size, iters, port, extraEnv = {}) {
  const env = { ...process.env, ...ucx.env, UCX_TLS: 'tcp,self', ...extraEnv };
  const args = ['-t', test, '-s', String(size), '-n', String(iters), '-w', String(Math.max(10, iters >> 4)), '-p', String(port)];
  const server = spawn(ucx.bin, args, { env, stdio: 'ignore' });
  await new Promise((r) => setTimeout(r, 400));
  const client = spawnSync(ucx.bin, ['127.0.0.1', ...args], { env, encoding: 'utf8', timeout: 120_000 });
  server.kill();
  const line = (client.stdout || '').split('\n').find((l) => l.startsWith('Final:'));
  if (!line) return -1;
  const cols = line.trim().split(/\s+/); // Final: iters p50 avg-lat overall-lat avg-bw overall-bw avg-rate overall-rate
  const mbps = Number(cols[6]);
  return Number.isFinite(mbps) ? (mbps * 1048576) / 1e9 : -1;
}
