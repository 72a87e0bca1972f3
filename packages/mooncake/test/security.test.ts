/**
 * MooncakeConnector workers under the authentication model and under floods (issue 11, parts 2
 * and 3): a consumer sends its transfer metadata only to a producer that proved the cluster
 * secret; a producer with a secret serves nobody without it; the ROUTER binds to the configured
 * host (loopback by default; another host needs a secret); and the flood of the issue (messages
 * full of made-up transfer ids) parks no more waiters and holds no more bytes than the caps,
 * answers what is over them at once, and lets the waiters expire.
 */
import { afterEach, describe, expect, it } from 'vitest';
import * as zmq from 'zeromq';
import { ClusterSecretError, EmbeddedAgent } from '@kvconnect/transfer';
import { BootstrapServer } from '../src/bootstrap.js';
import { ConsumerSession, welcomeProof } from '../src/channel.js';
import { parseMooncakeOptions } from '../src/config.js';
import {
  MOONCAKE_PROTOCOL_VERSION,
  XferStatusCode,
  decodeEnvelope,
  decodeTransferMetadata,
  decodeTransferResponse,
  encodeEnvelope,
  encodeTransferMetadata,
  encodeTransferResponse,
  type TransferMetadata,
  type WireLoad,
} from '../src/protocol.js';
import { MooncakeWorker } from '../src/worker.js';
import { caches } from './fixtures.js';

const SECRET = 'security-test-cluster-secret';
const OTHER = 'some-other-cluster-secret-00';
const cleanup: Array<() => unknown> = [];
afterEach(async () => {
  for (const f of cleanup.splice(0).reverse()) await f();
});


async function until(cond: () => boolean, ms = 5000): Promise<void> {
  const t0 = Date.now();
  while (!cond()) {
    if (Date.now() - t0 > ms) throw new Error('timed out');
    await new Promise((r) => setTimeout(r, 5));
  }
}

/** A ROUTER that plays producer with `secret` (a rogue one: another secret, or none): records what reaches it. */
async function rogueProducer(secret: string | null) {
  const sock = new zmq.Router({ linger: 0 });
  await sock.bind('tcp://127.0.0.1:*');
  cleanup.push(() => sock.close());
  const got = { hellos: 0, messages: 0 };
  void (async () => {
    try {
      for await (const [identity, msg] of sock) {
        const e = decodeEnvelope(msg);
        if (e.kind === 'hello') {
          got.hellos++;
          // A rogue that cannot check the hello welcomes it anyway, proving what it can.
          const sn = new Uint8Array(16).fill(7);
          await sock.send([identity, encodeEnvelope({ kind: 'welcome', cn: e.cn, sn, proof: secret ? welcomeProof(Buffer.from(secret), e.cn!, sn) : undefined })]);
        } else got.messages++;
      }
    } catch {
      /* closed */
    }
  })();
  return { addr: sock.lastEndpoint!, got };
}

async function consumer(extra: Record<string, unknown>): Promise<MooncakeWorker> {
  const w = new MooncakeWorker('kv_consumer', { engineId: 'cons', tpRank: 0, tpSize: 1, ppRank: 0, ppSize: 1 }, parseMooncakeOptions({ transfer_timeout_ms: 5000, ...extra }, {}));
  cleanup.push(() => w.shutdown());
  await w.registerKvCaches(caches());
  return w;
}

function load(w: MooncakeWorker, bootstrapAddr: string): void {
  w.bindConnectorMetadata({ sends: [], loads: [{ requestId: 'r1', transferId: 'x1', remoteEngineId: 'prod', bootstrapAddr, blocks: [[3, 5, 6, 7]], firstToken: 4, numTokens: 14 }], aborts: [] });
  w.startLoadKv({} as never);
  w.clearConnectorMetadata();
}

describe('consumer: metadata only to a producer that proved itself', () => {
  for (const rogue of [null, OTHER]) {
    it(`a producer with ${rogue ? 'another secret' : 'no secret'} gets the hello, never the metadata; the load fails`, async () => {
      const boot = await BootstrapServer.start({ port: 0, secret: Buffer.from(SECRET) });
      cleanup.push(() => boot.close());
      const p = await rogueProducer(rogue);
      boot.register({ engineId: 'prod', tpRank: 0, ppRank: 0, tpSize: 1, ppSize: 1, addr: p.addr });
      const w = await consumer({ cluster_secret: SECRET });
      load(w, boot.address);
      let res = w.getTransferResults();
      await until(() => (res.finishedRecving.size > 0 ? true : ((res = w.getTransferResults()), res.finishedRecving.size > 0)));
      expect(p.got.hellos).toBe(1);
      expect(p.got.messages).toBe(0);
      expect(res.invalidBlockIds.size).toBe(3);
      expect(w.lastError).toMatch(/did not prove the cluster secret/);
      expect(w.stats.authRejected).toBeGreaterThan(0);
    });
  }

  it('a version-1 producer (bare responses, no envelope): the load fails with the versions named', async () => {
    const boot = await BootstrapServer.start({ port: 0 });
    cleanup.push(() => boot.close());
    const sock = new zmq.Router({ linger: 0 });
    await sock.bind('tcp://127.0.0.1:*');
    cleanup.push(() => sock.close());
    void (async () => {
      try {
        for await (const [identity] of sock) await sock.send([identity, encodeTransferResponse({ status: XferStatusCode.ERROR, okReqs: [], errReqs: [], errMsg: 'what is this', kvChecksums: new Map() })]);
      } catch {
        /* closed */
      }
    })();
    boot.register({ engineId: 'prod', tpRank: 0, ppRank: 0, tpSize: 1, ppSize: 1, addr: sock.lastEndpoint! });
    const w = await consumer({});
    load(w, boot.address);
    await until(() => w.stats.loadsFailed === 1);
    expect(w.lastError).toMatch(new RegExp(`protocol version 1 .*this side speaks version ${MOONCAKE_PROTOCOL_VERSION}`));
  });

  it('a consumer with another secret: the bootstrap answer is refused before any side-channel traffic', async () => {
    const boot = await BootstrapServer.start({ port: 0, secret: Buffer.from(SECRET) });
    cleanup.push(() => boot.close());
    const p = await rogueProducer(SECRET);
    boot.register({ engineId: 'prod', tpRank: 0, ppRank: 0, tpSize: 1, ppSize: 1, addr: p.addr });
    const w = await consumer({ cluster_secret: OTHER, bootstrap_timeout_ms: 500 });
    load(w, boot.address);
    await until(() => w.stats.loadsFailed === 1);
    expect(w.lastError).toMatch(/no valid proof/);
    expect(p.got.hellos).toBe(0);
  });
});

/** A producer worker registered at its own bootstrap server. */
async function producer(extra: Record<string, unknown>) {
  const secret = typeof extra.cluster_secret === 'string' ? Buffer.from(extra.cluster_secret) : null;
  const boot = await BootstrapServer.start({ port: 0, secret });
  cleanup.push(() => boot.close());
  const w = new MooncakeWorker('kv_producer', { engineId: 'prod', tpRank: 0, tpSize: 1, ppRank: 0, ppSize: 1 }, parseMooncakeOptions({ bootstrap_addr: boot.address, ...extra }, {}));
  cleanup.push(() => w.shutdown());
  await w.registerKvCaches(caches());
  return { w, boot };
}

/** A raw consumer connection: hello, then metadata messages; counts what comes back. */
async function attacker(addr: string, secret: string | null = null) {
  const sock = new zmq.Dealer({ linger: 0 });
  sock.connect(addr);
  cleanup.push(() => sock.close());
  const session = new ConsumerSession(secret ? Buffer.from(secret) : null);
  await sock.send(encodeEnvelope(session.hello()));
  const first = decodeEnvelope((await sock.receive())[0]);
  const got = { refused: 0, errors: 0, errReqs: 0, last: first };
  if (first.kind === 'welcome') session.welcome(first);
  void (async () => {
    try {
      for await (const [m] of sock) {
        const e = decodeEnvelope(m);
        got.last = e;
        if (e.kind === 'refuse') got.refused++;
        else if (e.kind === 'resp') {
          const r = decodeTransferResponse(session.open(e));
          got.errors++;
          got.errReqs += r.errReqs.length;
        }
      }
    } catch {
      /* closed */
    }
  })();
  return { sock, session, got, first };
}

const agentMetadata = (async () => {
  const a = await EmbeddedAgent.create({ name: 'flood-agent', host: '127.0.0.1' });
  const md = await a.getLocalMetadata();
  await a.close();
  return md;
})();

async function floodMessage(prefix: string, n: number): Promise<Uint8Array> {
  const requests = new Map<string, WireLoad>();
  for (let i = 0; i < n; i++) requests.set(`${prefix}-${i}`, { transferId: `fake-${prefix}-${i}`, blocks: [[1]], firstToken: 0, numTokens: 4 });
  const md: TransferMetadata = { agentMetadata: await agentMetadata, backend: 'embedded', engineId: 'attacker', tpSize: 1, tpRank: 0, ppSize: 1, ppRank: 0, regions: [[4096, 1 << 20]], caches: [], requests };
  return encodeTransferMetadata(md);
}

describe('producer: authentication', () => {
  it('with a secret, a connection without it is refused at the hello and never decoded further', async () => {
    const { w } = await producer({ cluster_secret: SECRET });
    const a = await attacker(w.sideChannelAddr!, null);
    expect(a.first).toMatchObject({ kind: 'refuse', code: 'unauthenticated' });
    // Metadata without a session (and without proofs): refused, nothing parked.
    await a.sock.send(encodeEnvelope({ kind: 'md', seq: 1, body: await floodMessage('x', 10) }));
    await until(() => a.got.refused === 1);
    expect(a.got.last).toMatchObject({ kind: 'refuse', code: 'no-session' });
    expect(w.stats.metadataReceived).toBe(0);
    expect(w.pendingCounts().waiters).toBe(0);
    // With the secret: served (the made-up transfer waits for its prefill).
    const b = await attacker(w.sideChannelAddr!, SECRET);
    expect(b.first.kind).toBe('welcome');
    await b.sock.send(encodeEnvelope(b.session.seal(await floodMessage('y', 1))));
    await until(() => w.pendingCounts().waiters === 1);
  });

  it('the ROUTER binds to side_channel_host (loopback by default); another host needs a secret', async () => {
    const { w } = await producer({ side_channel_host: '127.0.0.2' });
    expect(w.sideChannelAddr).toMatch(/^tcp:\/\/127\.0\.0\.2:\d+$/);
    const d = await producer({});
    expect(d.w.sideChannelAddr).toMatch(/^tcp:\/\/127\.0\.0\.1:\d+$/);
    const bad = new MooncakeWorker('kv_producer', { engineId: 'p2', tpRank: 0, tpSize: 1, ppRank: 0, ppSize: 1 }, parseMooncakeOptions({ side_channel_host: '0.0.0.0', bootstrap_addr: '127.0.0.1:1' }, {}));
    cleanup.push(() => bad.shutdown());
    await expect(bad.registerKvCaches(caches())).rejects.toThrow(ClusterSecretError);
  });
});

describe('producer: bounded under floods', () => {
  it('30 messages of made-up transfer ids from 3 connections: waiters capped per peer and in total, the rest refused at once, all expire', async () => {
    const caps = { max_waiters: 1500, max_waiters_per_peer: 600, abort_timeout_ms: 1500 };
    const { w } = await producer(caps);
    global.gc?.();
    const heap0 = process.memoryUsage().heapUsed;
    const peers = await Promise.all([0, 1, 2].map(() => attacker(w.sideChannelAddr!)));
    const perMessage = 200;
    let sent = 0;
    for (let m = 0; m < 10; m++) {
      for (const [i, p] of peers.entries()) {
        await p.sock.send(encodeEnvelope(p.session.seal(await floodMessage(`p${i}m${m}`, perMessage))));
        sent += perMessage;
      }
    }
    // Every request is either parked (within the caps) or refused.
    await until(() => w.stats.waitedForPrefill + w.stats.waitersRefused === sent, 20_000);
    const r = w.resourceCounts();
    expect(r.waiters).toBeLessThanOrEqual(caps.max_waiters);
    expect(r.maxPeerWaiters).toBeLessThanOrEqual(caps.max_waiters_per_peer);
    expect(r.waiters).toBeGreaterThan(caps.max_waiters_per_peer); // several peers parked some
    expect(w.stats.waitedForPrefill).toBe(r.waiters);
    expect(w.stats.waitersRefused).toBeGreaterThan(sent / 2);
    // What was refused was answered, not parked: one error answer per refused message.
    await until(() => peers.reduce((n, p) => n + p.got.errReqs, 0) === w.stats.waitersRefused, 10_000);
    expect(process.memoryUsage().heapUsed - heap0).toBeLessThan(256 * 1024 * 1024);
    // A new connection is still answered promptly during the flood.
    const t0 = Date.now();
    const fresh = await attacker(w.sideChannelAddr!);
    expect(fresh.first.kind).toBe('welcome');
    expect(Date.now() - t0).toBeLessThan(2000);
    // The waiters expire at abort_timeout_ms and release their caps.
    await until(() => w.resourceCounts().waiters === 0, 10_000);
    expect(w.resourceCounts()).toMatchObject({ waiters: 0, maxPeerWaiters: 0, pendingBytes: 0 });
  }, 60_000);

  it('a session dropped (max_sessions) while its request waits: the answer still reaches the consumer', async () => {
    const { w } = await producer({ max_sessions: 1, abort_timeout_ms: 300 });
    const a = await attacker(w.sideChannelAddr!);
    await a.sock.send(encodeEnvelope(a.session.seal(await floodMessage('k', 1))));
    await until(() => w.pendingCounts().waiters === 1);
    const b = await attacker(w.sideChannelAddr!); // pushes a's session out
    expect(b.first.kind).toBe('welcome');
    expect(w.resourceCounts().sessions).toBe(1);
    await until(() => a.got.errReqs === 1); // the wait timed out; answered in a's session
    expect(a.got.last.kind).toBe('resp');
    // New messages on a's connection: no session.
    await a.sock.send(encodeEnvelope(a.session.seal(await floodMessage('k2', 1))));
    await until(() => a.got.refused === 1);
    expect(a.got.last).toMatchObject({ kind: 'refuse', code: 'no-session' });
  });

  it('metadata bytes not yet answered are capped per peer before the message is decoded', async () => {
    const { w } = await producer({ max_pending_bytes_per_peer: 4096, abort_timeout_ms: 5000 });
    const a = await attacker(w.sideChannelAddr!);
    const small = await floodMessage('s', 1);
    const big = await floodMessage('b', 400);
    expect(small.byteLength).toBeLessThan(4096);
    expect(big.byteLength).toBeGreaterThan(4096);
    await a.sock.send(encodeEnvelope(a.session.seal(small)));
    await until(() => w.pendingCounts().waiters === 1);
    expect(w.resourceCounts().pendingBytes).toBe(small.byteLength);
    await a.sock.send(encodeEnvelope(a.session.seal(big)));
    await until(() => w.stats.messagesRefusedBusy === 1);
    await until(() => a.got.errReqs === 400);
    expect(w.lastError).toMatch(/metadata message of \d+ bytes refused/);
    expect(w.pendingCounts().waiters).toBe(1);
    expect(decodeTransferMetadata(big).requests.size).toBe(400);
  });
});
