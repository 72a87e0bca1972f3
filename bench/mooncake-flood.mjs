#!/usr/bin/env node
// MooncakeConnector under the floods of issue 11 part 3, at full size, with the default caps:
//  1. the bootstrap server: 29 POST /register with tp_size 4096 x pp_size 4096 (refused), then
//     300 with tp_size 4096 (the engine cap), and the latency of a query afterwards;
//  2. a producer worker's side channel: (A) 30 messages of 65 536 made-up transfer ids on one
//     connection (the issue: 1.97 million parked waiters before the caps), (B) the same 1.97
//     million ids spread over 30 connections in messages of 4096; waiters parked, heap and RSS
//     growth, time to answer everything that is over the caps, and a new connection's hello
//     round trip during the flood.
// Each side-channel flood's row carries a verdict: met when the waiters parked stay within the
// producer's caps (`max_waiters` in total, `max_waiters_per_peer` per connection; packages/mooncake
// config.ts defaults), MISSED otherwise. Not a test: nothing is asserted. Run after `npm run build` (it imports the built packages),
// with --expose-gc for steadier heap figures:
//   node --expose-gc bench/mooncake-flood.mjs
import * as zmq from 'zeromq';
import { pagedAttentionBytes, pagedAttentionCache } from '@kvconnect/checksum';
import { EmbeddedAgent } from '@kvconnect/transfer';
import { BootstrapServer, ConsumerSession, MooncakeWorker, decodeEnvelope, decodeTransferResponse, encodeEnvelope, encodeTransferMetadata, parseMooncakeOptions } from '@kvconnect/mooncake';
import { result } from './lib/results.mjs';

const MB = (n) => `${(n / 2 ** 20).toFixed(1)} MiB`;
const gc = () => globalThis.gc?.();
const mem = () => (gc(), process.memoryUsage());

async function bootstrapFlood() {
  const s = await BootstrapServer.start({ port: 0 });
  const m0 = mem();
  const post = async (b) => (await fetch(`http://${s.address}/register`, { method: 'POST', body: JSON.stringify(b) })).status;
  const st = {};
  for (let i = 0; i < 29; i++) {
    const c = await post({ engine_id: `huge-${i}`, tp_rank: 0, pp_rank: 0, tp_size: 4096, pp_size: 4096, addr: 'tcp://127.0.0.1:1' });
    st[c] = (st[c] ?? 0) + 1;
  }
  for (let i = 0; i < 300; i++) {
    const c = await post({ engine_id: `wide-${i}`, tp_rank: i, pp_rank: 0, tp_size: 4096, pp_size: 1, addr: 'tcp://127.0.0.1:1' });
    st[c] = (st[c] ?? 0) + 1;
  }
  const m1 = mem();
  const t0 = performance.now();
  await (await fetch(`http://${s.address}/query?engine_id=wide-1`)).text();
  const q = performance.now() - t0;
  result('mooncake-flood', { name: 'bootstrap: 329 registrations of tp_size 4096, heap growth', figure: MB(m1.heapUsed - m0.heapUsed) });
  console.log(`bootstrap: 329 registrations -> HTTP ${JSON.stringify(st)}; kept ${JSON.stringify(s.counts)}; heap +${MB(m1.heapUsed - m0.heapUsed)}, rss +${MB(m1.rss - m0.rss)}; query after: ${q.toFixed(1)} ms`);
  await s.close();
}

function caches() {
  const o = { dtype: 'bfloat16', numBlocks: 8, blockSize: 4, numHeads: 2, headSize: 4, layout: 'NHD', kvLayout: 'kv-first' };
  const attn = pagedAttentionCache({ ...o, name: 'model.layers.0.self_attn.attn', at: { region: 0 } });
  return { rank: { tpRank: 0, tpSize: 1 }, ppRank: 0, ppSize: 1, regions: [new Uint8Array(pagedAttentionBytes(o))], groups: [{ groupId: 0, caches: [attn] }], groupConfigs: [{ groupId: 0, kind: 'full-attention', blockSize: 4, layerNames: [attn.name] }] };
}

async function connect(addr) {
  const sock = new zmq.Dealer({ linger: 0, maxMessageSize: -1 });
  sock.connect(addr);
  const session = new ConsumerSession(null);
  const t0 = performance.now();
  await sock.send(encodeEnvelope(session.hello()));
  session.welcome(decodeEnvelope((await sock.receive())[0]));
  const helloMs = performance.now() - t0;
  const got = { errReqs: 0 };
  void (async () => {
    try {
      for await (const [m] of sock) got.errReqs += decodeTransferResponse(session.open(decodeEnvelope(m))).errReqs.length;
    } catch {
      /* closed */
    }
  })();
  return { sock, session, got, helloMs };
}

async function sideChannelFlood(label, peersN, messagesPerPeer, idsPerMessage) {
  const boot = await BootstrapServer.start({ port: 0 });
  const opts = parseMooncakeOptions({ bootstrap_addr: boot.address }, {});
  const w = new MooncakeWorker('kv_producer', { engineId: 'prod', tpRank: 0, tpSize: 1, ppRank: 0, ppSize: 1 }, opts);
  await w.registerKvCaches(caches());
  const a = await EmbeddedAgent.create({ name: 'flood', host: '127.0.0.1' });
  const agentMetadata = await a.getLocalMetadata();
  await a.close();
  const m0 = mem();
  const peers = await Promise.all(Array.from({ length: peersN }, () => connect(w.sideChannelAddr)));
  const t0 = performance.now();
  let sent = 0;
  for (let m = 0; m < messagesPerPeer; m++) {
    for (const [i, p] of peers.entries()) {
      const requests = new Map();
      for (let k = 0; k < idsPerMessage; k++) requests.set(`p${i}m${m}r${k}`, { transferId: `fake-${i}-${m}-${k}`, blocks: [[1]], firstToken: 0, numTokens: 4 });
      await p.sock.send(encodeEnvelope(p.session.seal(encodeTransferMetadata({ agentMetadata, backend: 'embedded', engineId: 'attacker', tpSize: 1, tpRank: 0, ppSize: 1, ppRank: 0, regions: [[4096, 1 << 20]], caches: [], requests }))));
      sent += idsPerMessage;
    }
  }
  let helloDuring = null;
  for (;;) {
    if (helloDuring === null && w.stats.metadataReceived > 0) helloDuring = (await connect(w.sideChannelAddr)).helloMs;
    const answered = peers.reduce((n, p) => n + p.got.errReqs, 0);
    if (w.stats.waitedForPrefill + w.stats.waitersRefused >= sent && answered >= w.stats.waitersRefused) break;
    await new Promise((r) => setTimeout(r, 20));
  }
  const dt = performance.now() - t0;
  const m1 = mem();
  const r = w.resourceCounts();
  // The caps the worker enforces: at most maxWaiters parked in total and maxWaitersPerPeer on one connection.
  const target = `<= ${opts.maxWaiters} total, <= ${opts.maxWaitersPerPeer} per connection (the caps)`;
  const met = r.waiters <= opts.maxWaiters && r.maxPeerWaiters <= opts.maxWaitersPerPeer;
  result('mooncake-flood', { name: `side channel ${label}: waiters parked (most of one connection)`, figure: `${r.waiters} (${r.maxPeerWaiters})`, target, met });
  console.log(
    `side channel ${label}: ${sent} made-up ids in ${peersN * messagesPerPeer} messages over ${peersN} connections -> ${r.waiters} waiters parked (most of one connection ${r.maxPeerWaiters}; target ${target}: ${met ? 'met' : 'MISSED'}), ${w.stats.waitersRefused} refused and answered; all handled in ${dt.toFixed(0)} ms; heap +${MB(m1.heapUsed - m0.heapUsed)}, rss +${MB(m1.rss - m0.rss)}; a new connection's hello during the flood: ${helloDuring?.toFixed(1) ?? 'n/a'} ms`,
  );
  for (const p of peers) p.sock.close();
  await w.shutdown();
  await boot.close();
}

await bootstrapFlood();
await sideChannelFlood('(A) the issue: 30 x 65536 on one connection', 1, 30, 65_536);
await sideChannelFlood('(B) 30 connections x 16 messages x 4096', 30, 16, 4096);
process.exit(0);
