#!/usr/bin/env node
// NIXL side channel under a frame flood (issue 11, part 3): a genuine client's LEASE round trip
// (p50 / p99), the server's buffered bytes and the process's CPU and RSS, first alone, then while
// flooders announce large frames and trickle them. Not a test: nothing is asserted.
//   npm run build && node bench/side-channel-flood.mjs
// KVC_NIXL_COMMON=<path of a nixl-common dist/index.js> measures another build (e.g. before the
// bounds: its server has no stats(), buffered bytes then show as n/a).
// Target: latency and memory with flooders within a small factor of the quiet run.
import * as net from 'node:net';
import { pathToFileURL } from 'node:url';
import { result } from './lib/results.mjs';

const mod = process.env.KVC_NIXL_COMMON ? await import(pathToFileURL(process.env.KVC_NIXL_COMMON).href) : await import('@kvconnect/nixl-common');
const { SideChannelServer, SideChannelClient, decodeLeaseBody } = mod;
const FLOODERS = Number(process.env.KVC_FLOODERS ?? 3);
const N = Number(process.env.KVC_BENCH_N ?? 200);

const server = new SideChannelServer((req) => ({ ok: req.type === 'lease' ? req.requestIds.map((id) => [id, 1]) : [] }), { onProtocolError: () => {} });
const { port } = await server.listen('127.0.0.1', 0);
const client = new SideChannelClient('127.0.0.1', port, { timeoutMs: 10_000 });
const stats = () => (typeof server.stats === 'function' ? server.stats() : null);

async function measure(label) {
  const t = [];
  let maxBuffered = 0;
  const cpu0 = process.cpuUsage();
  const rss0 = process.memoryUsage().rss;
  const w0 = performance.now();
  for (let i = 0; i < N; i++) {
    const s = performance.now();
    await client.request({ type: 'lease', requestIds: [`r${i}`], pinMs: 0 }, decodeLeaseBody);
    t.push(performance.now() - s);
    maxBuffered = Math.max(maxBuffered, stats()?.bufferedBytes ?? 0);
    await new Promise((r) => setTimeout(r, 5));
  }
  const wall = (performance.now() - w0) / 1000;
  const cpu = process.cpuUsage(cpu0);
  t.sort((a, b) => a - b);
  const st = stats();
  result('side-channel-flood', { name: `LEASE latency p50, ${label}`, figure: `${t[N >> 1].toFixed(2)} ms` });
  console.log(
    `${label.padEnd(34)} p50 ${t[N >> 1].toFixed(2)} ms  p99 ${t[Math.floor(N * 0.99)].toFixed(2)} ms  cpu ${((cpu.user + cpu.system) / 1e6 / wall).toFixed(2)} core  rss +${((process.memoryUsage().rss - rss0) / 2 ** 20).toFixed(0)} MiB  buffered max ${st ? `${(maxBuffered / 2 ** 20).toFixed(1)} MiB` : 'n/a'}  dropped ${st ? st.droppedPeers : 'n/a'}`,
  );
}

/** A peer announcing a frame of `bytes` and sending 64 KiB every 5 ms until it is dropped. */
function flooder(bytes) {
  const s = net.createConnection(port, '127.0.0.1');
  s.on('error', () => {});
  const pre = Buffer.alloc(4);
  pre.writeUInt32LE(bytes, 0);
  const chunk = Buffer.alloc(64 * 1024, 1);
  s.write(pre); // queued before any trickled bytes
  const timer = setInterval(() => s.writable && s.write(chunk), 5);
  s.on('close', () => clearInterval(timer));
  return () => {
    clearInterval(timer);
    s.destroy();
  };
}

await measure('quiet');
for (const [label, bytes] of [
  ['64 MiB frames announced', 64 * 2 ** 20],
  ['16 MiB frames announced', 16 * 2 ** 20 - 1],
]) {
  const stops = Array.from({ length: FLOODERS }, () => flooder(bytes));
  await measure(`${FLOODERS} flooders, ${label}`);
  stops.forEach((f) => f());
}
client.close();
await server.close();
