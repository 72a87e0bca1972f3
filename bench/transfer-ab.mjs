#!/usr/bin/env node
// Interleaved A/B of builds of the embedded agent's TCP path (issue #16 section 2), for a noisy
// machine: each build gets its own initiator process with its target in a child process (both
// 127.0.0.1, heap memory), and the builds take turns, one transfer each, in alternating order, so
// that load changes hit every build alike. Prints per build and op the best and median GB/s
// (1e9 B/s) and the CPU time per transfer of the initiator (process.cpuUsage) and of the target
// (/proc/<pid>/stat, 10 ms ticks). Not a test and not part of bench/all.mjs.
//   cp -r packages/transfer/dist .ab/before      # a build to compare, kept inside the repository
//   taskset -c 1 node bench/transfer-ab.mjs .ab/before packages/transfer/dist 'packages/transfer/dist@{"chunkBytes":4194304}'
// Each argument is the dist folder of a build (inside the repository, so that its imports
// resolve), optionally with `:reuse` (every descriptor on one buffer of its size at each end, as
// ucx_perftest moves its messages) and `@{...}` (JSON options of the initiator's agent).
// Environment: SIZE (descriptor bytes, default 1 MiB), TOTAL_MB (per transfer, default 256),
// REPS (rounds, default 5; odd for a true median: with an even count the median is the slower middle round), OP (default READ,WRITE). Each initiator prints `PIDS initiator,target`
// on stderr once warm, for `perf record -p`, and, with the agent option `lanes` (striping over n TCP
// connections per peer, e.g. 'packages/transfer/dist@{"lanes":2}'), once its lanes are ready and at
// the end the frames each lane sent (so that a build that ignores the option shows).
import { fork } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const TOTAL = Number(process.env.TOTAL_MB ?? 256) << 20;
const SIZE = Number(process.env.SIZE ?? 1 << 20);
const REPS = Number(process.env.REPS ?? 5);
const OPS = (process.env.OP ?? 'READ,WRITE').split(',');
const me = fileURLToPath(import.meta.url);
/** Splits `dist[:reuse][@{json}]`. */
const parse = (arg) => {
  const at = arg.indexOf('@');
  const head = at < 0 ? arg : arg.slice(0, at);
  return { dist: head.replace(/:reuse$/, ''), reuse: head.endsWith(':reuse'), opts: at < 0 ? {} : JSON.parse(arg.slice(at + 1)) };
};
/** CPU ms (user + system) of a process so far, from /proc (10 ms ticks). */
const cpuOf = (pid) => {
  const f = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
  return (Number(f[11]) + Number(f[12])) * 10;
};
const load = async (dist) => (await import(pathToFileURL(resolve(dist, 'index.js')).href)).EmbeddedAgent;

if (process.argv[2] === 'target') {
  const EmbeddedAgent = await load(process.argv[3]);
  const agent = await EmbeddedAgent.create({ name: 'ab-target' });
  const heap = new Uint8Array(TOTAL);
  for (let i = 0; i < heap.length; i += 4096) heap[i] = i & 0xff;
  const reg = await agent.registerMemory([{ bytes: heap }]);
  process.send({ md: [...(await agent.getLocalMetadata())], addr: reg.regions[0].addr });
  process.on('message', async (m) => {
    if (m === 'exit') {
      await agent.close();
      process.exit(0);
    }
  });
} else if (process.argv[2] === 'init') {
  const { dist, reuse, opts } = parse(process.argv[3]);
  const EmbeddedAgent = await load(dist);
  const child = fork(me, ['target', dist], { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
  const ready = await new Promise((r) => child.once('message', r));
  const a = await EmbeddedAgent.create({ name: 'ab-initiator', ...opts });
  const local = new Uint8Array(TOTAL).fill(7);
  const reg = await a.registerMemory([{ bytes: local }]);
  const peer = await a.loadRemoteMetadata(Uint8Array.from(ready.md));
  const descs = (base) => Array.from({ length: TOTAL / SIZE }, (_, i) => ({ addr: base + (reuse ? 0 : i * SIZE), length: SIZE }));
  const l = await a.prepDescList(null, 'DRAM', descs(reg.regions[0].addr));
  const r = await a.prepDescList(peer, 'DRAM', descs(ready.addr));
  const reqs = {};
  for (const op of OPS) reqs[op] = await a.makeTransfer({ op, local: l, remote: r });
  const once = async (op) => {
    const t0 = process.hrtime.bigint();
    const c0 = process.cpuUsage();
    const tc0 = cpuOf(child.pid);
    await a.post(reqs[op]);
    const st = await a.wait(reqs[op]);
    if (st !== 'done') throw new Error(`${op}: ${st}`);
    const cu = process.cpuUsage(c0);
    return { ms: Number(process.hrtime.bigint() - t0) / 1e6, cpu: (cu.user + cu.system) / 1e3, tcpu: cpuOf(child.pid) - tc0 };
  };
  for (const op of OPS) await once(op); // warm-up: connection, handshake, JIT
  // Extra lanes are used once their handshakes are done: wait for them (builds without laneStats: none).
  const lanes = () => (typeof a.laneStats === 'function' ? a.laneStats(peer) : []);
  for (const end = Date.now() + 5000; Date.now() < end && lanes().some((l) => !l.ready); ) await new Promise((r) => setTimeout(r, 5));
  console.error(`PIDS ${process.pid},${child.pid}${opts.lanes === undefined ? '' : `; ${process.argv[3]}: ${lanes().filter((l) => l.ready).length} of ${opts.lanes} lanes ready`}`);
  process.send('ready');
  process.on('message', async (m) => {
    if (m === 'exit') {
      if (opts.lanes !== undefined) console.error(`${process.argv[3]}: frames sent per lane ${JSON.stringify(lanes().map((l) => l.framesSent))}`);
      child.send('exit');
      await a.close();
      process.exit(0);
    }
    process.send(await once(m));
  });
} else {
  const args = process.argv.slice(2);
  if (args.length === 0) throw new Error('usage: node bench/transfer-ab.mjs <dist>[:reuse][@{json}] ...');
  const procs = [];
  for (const arg of args) {
    const p = fork(me, ['init', arg], { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
    await new Promise((r) => p.once('message', r));
    procs.push(p);
  }
  const res = args.map(() => Object.fromEntries(OPS.map((o) => [o, []])));
  for (let rep = 0; rep < REPS; rep++) {
    for (const op of OPS) {
      const order = procs.map((_, i) => (rep % 2 === 0 ? i : procs.length - 1 - i));
      for (const i of order) {
        procs[i].send(op);
        res[i][op].push(await new Promise((r) => procs[i].once('message', r)));
      }
    }
  }
  const gb = (ms) => (TOTAL / (ms * 1e6)).toFixed(2);
  const med = (xs) => [...xs].sort((x, y) => x - y)[Math.floor(xs.length / 2)];
  console.log(`${TOTAL >> 20} MiB per transfer in descriptors of ${SIZE >> 10} KiB, ${REPS} interleaved rounds; CPU ms per transfer (medians)`);
  for (const [i, arg] of args.entries()) {
    for (const op of OPS) {
      const xs = res[i][op];
      const t = xs.map((x) => x.ms);
      console.log(`${arg} ${op}: best ${gb(Math.min(...t))} GB/s, median ${gb(med(t))} GB/s; CPU initiator ${med(xs.map((x) => x.cpu)).toFixed(0)}, target ${med(xs.map((x) => x.tcpu)).toFixed(0)}`);
    }
  }
  for (const p of procs) p.send('exit');
}
