/**
 * The embedded agent's authentication and bounds (`docs/security.md`): the handshake proves the
 * cluster secret before the agent secret matters and neither crosses the wire, a replayed HELLO is
 * refused, non-loopback binds need a secret; no byte of a late answer lands in a READ's memory
 * after the READ returned; floods of announced-and-trickled frames are dropped with bounded memory.
 */
import * as net from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { Packr } from 'msgpackr';
import { ClusterSecretError, EmbeddedAgent, makeNonce, makeProof, ProtocolError, type TransferAgent } from '../src/index.js';
import { encodeFrame, F, FrameReader, HANDSHAKE_CONTEXT, WIRE_VERSION, type Header } from '../src/wire.js';
import { pattern } from './patterns.js';

const SECRET = Buffer.from('cluster-secret-of-the-embedded-test');
const OTHER = Buffer.from('some-other-cluster-secret-0123456789');
const packr = new Packr({ useRecords: false, variableMapSize: true });
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
let seq = 0;
const uniq = (p: string) => `${p}-${process.pid}-${++seq}`;

const open: TransferAgent[] = [];
const closers: Array<() => unknown> = [];
afterEach(async () => {
  for (const c of closers.splice(0).reverse()) await c();
  await Promise.all(open.splice(0).map((a) => a.close()));
});
const agent = async (o: Partial<Parameters<typeof EmbeddedAgent.create>[0]> = {}) => {
  const a = await EmbeddedAgent.create({ name: uniq('s'), ...o });
  open.push(a);
  return a;
};

/** READs `n` bytes of `target` into a fresh buffer of `c`; @returns the status and the buffers. */
async function read(c: EmbeddedAgent, target: EmbeddedAgent, n: number, o: { md?: () => Promise<Uint8Array>; timeoutMs?: number } = {}) {
  const src = pattern(n, 31);
  const dst = new Uint8Array(n);
  const rt = await target.registerMemory([{ bytes: src }]);
  const rc = await c.registerMemory([{ bytes: dst }]);
  const name = await c.loadRemoteMetadata(o.md ? await o.md() : await target.getLocalMetadata());
  const req = await c.makeTransfer({
    op: 'READ',
    local: await c.prepDescList(null, 'DRAM', [{ addr: rc.regions[0]!.addr, length: n }]),
    remote: await c.prepDescList(name, 'DRAM', [{ addr: rt.regions[0]!.addr, length: n }]),
  });
  await c.post(req, { timeoutMs: o.timeoutMs ?? 5000 });
  return { status: await c.wait(req), req, src, dst };
}

/** Metadata of `a` pointing at another port (a relay in front of it). */
async function metadataVia(a: EmbeddedAgent, port: number): Promise<Uint8Array> {
  const v = packr.unpack(await a.getLocalMetadata()) as unknown[];
  v[4] = port;
  return packr.pack(v);
}

/**
 * A TCP relay in front of `port`: records client-to-target bytes; target-to-client bytes pass at
 * once up to `fastBytes`, then `trickle` bytes every 20 ms.
 */
async function relay(port: number, o: { fastBytes?: number; trickle?: number } = {}) {
  const up: Buffer[][] = [];
  let pendingDown = 0;
  const socks = new Set<net.Socket>();
  const srv = net.createServer((c) => {
    socks.add(c);
    const rec: Buffer[] = [];
    up.push(rec);
    const u = net.createConnection(port, '127.0.0.1');
    socks.add(u);
    let passed = 0;
    const q: Buffer[] = [];
    const timer = setInterval(() => {
      let budget = o.trickle ?? Infinity;
      while (q.length > 0 && budget > 0) {
        const b = q[0]!;
        const k = Math.min(b.length, budget);
        c.write(b.subarray(0, k));
        budget -= k;
        pendingDown -= k;
        if (k === b.length) q.shift();
        else q[0] = b.subarray(k);
      }
    }, 20);
    c.on('data', (d: Buffer) => {
      rec.push(Buffer.from(d));
      u.write(d);
    });
    u.on('data', (d: Buffer) => {
      const fast = Math.max(0, Math.min(d.length, (o.fastBytes ?? Infinity) - passed));
      if (fast > 0) c.write(d.subarray(0, fast));
      passed += fast;
      if (fast < d.length) {
        q.push(Buffer.from(d.subarray(fast)));
        pendingDown += d.length - fast;
      }
    });
    const end = () => {
      clearInterval(timer);
      c.destroy();
      u.destroy();
    };
    c.on('error', end);
    u.on('error', end);
    c.on('close', end);
    u.on('close', end);
  });
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', () => r()));
  closers.push(() => {
    for (const x of socks) x.destroy();
    return new Promise((r) => srv.close(r));
  });
  return { port: (srv.address() as net.AddressInfo).port, up, pendingDown: () => pendingDown };
}

/** A raw TCP peer collecting the target's frames. */
async function raw(target: EmbeddedAgent) {
  const s = net.connect(target.address.port, target.address.host);
  s.on('error', () => {});
  await new Promise<void>((r) => s.once('connect', () => r()));
  const frames: Header[] = [];
  const reader = new FrameReader({ onHeader: (h) => (frames.push(h), null), onProtocolError: () => s.destroy() });
  s.on('data', (c: Buffer) => reader.push(c));
  const closed = new Promise<void>((r) => s.once('close', () => r()));
  closers.push(() => s.destroy());
  const until = async (pred: (h: Header) => boolean) => {
    for (let i = 0; i < 1500; i++) {
      const h = frames.find(pred);
      if (h) return h;
      await sleep(2);
    }
    throw new Error('frame did not arrive');
  };
  /** HELLO with proofs made from `agentSecret` (default: the target's own) and `cluster` (default none). */
  const hello = async (o: { agentSecret?: Uint8Array; cluster?: Uint8Array } = {}) => {
    const sn = ((await until((h) => h.t === F.CHAL)) as { nonce: Uint8Array }).nonce;
    const cn = makeNonce();
    const secret = o.agentSecret ?? ((packr.unpack(await target.getLocalMetadata()) as unknown[])[5] as Uint8Array);
    s.write(encodeFrame([F.HELLO, WIRE_VERSION, 'raw', cn, makeProof(secret, HANDSHAKE_CONTEXT.hello, sn, cn, 'raw'), o.cluster ? makeProof(o.cluster, HANDSHAKE_CONTEXT.helloCluster, sn, cn, 'raw', target.name) : null]));
  };
  return { s, frames, closed, until, hello };
}

describe('embedded agent with a cluster secret', () => {
  it('members transfer; an agent without the secret or with another is refused, both ways', async () => {
    const b = await agent({ clusterSecret: SECRET });
    const errors: ProtocolError[] = [];
    b.on('protocol-error', (e) => errors.push(e));
    expect((await read(await agent({ clusterSecret: SECRET }), b, 100_000)).status).toBe('done');
    for (const [secret, why] of [
      [null, /did not prove the cluster secret/],
      [OTHER, /did not prove the cluster secret/],
    ] as const) {
      const r = await read(await agent({ clusterSecret: secret }), b, 1000);
      expect(r.status).toBe('invalid');
      expect(r.dst.every((x) => x === 0)).toBe(true);
      expect(errors.pop()?.message).toMatch(why);
    }
    // A member does not talk to a target outside the cluster.
    const outside = await agent();
    const e2: ProtocolError[] = [];
    outside.on('protocol-error', (e) => e2.push(e));
    expect((await read(await agent({ clusterSecret: SECRET }), outside, 1000)).status).toBe('invalid');
    expect(e2[0]?.message).toMatch(/has none/);
  });

  it('checks the cluster proof before the agent secret: knowing the metadata is not enough', async () => {
    const b = await agent({ clusterSecret: SECRET });
    const p = await raw(b);
    await p.hello(); // the right agent secret, no cluster proof
    const f = (await p.until((h) => h.t === F.FATAL)) as { message: string };
    expect(f.message).toMatch(/did not prove the cluster secret/);
    const q = await raw(b);
    await q.hello({ agentSecret: new Uint8Array(32), cluster: SECRET }); // a member with a wrong agent secret
    expect(((await q.until((h) => h.t === F.FATAL)) as { message: string }).message).toMatch(/wrong secret/);
    const ok = await raw(b);
    await ok.hello({ cluster: SECRET });
    const h = (await ok.until((x) => x.t === F.OK)) as { name: string; clusterProof: Uint8Array | null };
    expect(h.name).toBe(b.name);
    expect(h.clusterProof).toBeInstanceOf(Uint8Array);
  });

  it('never sends a secret, and a replayed HELLO is refused', async () => {
    const b = await agent({ clusterSecret: SECRET });
    const r = await relay(b.address.port);
    const a = await agent({ clusterSecret: SECRET });
    expect((await read(a, b, 1000, { md: () => metadataVia(b, r.port) })).status).toBe('done');
    const sent = Buffer.concat(r.up[0]!);
    const agentSecret = (packr.unpack(await b.getLocalMetadata()) as unknown[])[5] as Uint8Array;
    expect(sent.includes(Buffer.from(agentSecret))).toBe(false);
    expect(sent.includes(SECRET)).toBe(false);
    // Replay the recorded bytes (HELLO first) on a new connection: the challenge differs.
    const errors: ProtocolError[] = [];
    b.on('protocol-error', (e) => errors.push(e));
    const p = await raw(b);
    p.s.write(sent);
    await p.closed;
    expect(errors[0]?.message).toMatch(/did not prove the cluster secret/);
  });

  it('listens on loopback by default and refuses another host without a cluster secret', async () => {
    expect((await agent()).address.host).toBe('127.0.0.1');
    await expect(EmbeddedAgent.create({ name: uniq('wild'), host: '0.0.0.0' })).rejects.toBeInstanceOf(ClusterSecretError);
    await expect(EmbeddedAgent.create({ name: uniq('short'), clusterSecret: Buffer.from('short') })).rejects.toThrow(/at least 16 bytes/);
  });
});

describe('READ completion', () => {
  it('no byte of a slow answer lands in the local memory after the READ returned timeout', async () => {
    const b = await agent();
    const n = 512 * 1024;
    // The handshake passes at once; RDATA then trickles in at 32 KiB per 20 ms (about 320 ms).
    const r = await relay(b.address.port, { fastBytes: 1024, trickle: 32 * 1024 });
    const a = await agent();
    const res = await read(a, b, n, { md: () => metadataVia(b, r.port), timeoutMs: 100 });
    expect(res.status).toBe('timeout');
    const atTimeout = res.dst.slice();
    expect(r.pendingDown()).toBeGreaterThan(0); // the rest is still on its way
    const t0 = Date.now();
    while (r.pendingDown() > 0 && Date.now() - t0 < 5000) await sleep(10);
    expect(r.pendingDown()).toBe(0);
    await sleep(100);
    expect(Buffer.compare(res.dst, atTimeout)).toBe(0);
    // Released too: the memory is the caller's.
    await a.release(res.req);
    expect(Buffer.compare(res.dst, atTimeout)).toBe(0);
  });
});

describe('floods', () => {
  it('drops peers that announce large headers before the handshake, at once', async () => {
    const b = await agent();
    const peers = await Promise.all([0, 1, 2].map(() => raw(b)));
    for (const p of peers) {
      const pre = Buffer.alloc(8);
      pre.writeUInt32LE(256 * 1024, 0);
      p.s.write(Buffer.concat([pre, Buffer.alloc(100)]));
    }
    const errors: string[] = [];
    b.on('protocol-error', (e) => errors.push(e.message));
    const t0 = Date.now();
    await Promise.all(peers.map((p) => p.closed));
    expect(Date.now() - t0).toBeLessThan(1000); // not the 5 s HELLO deadline
    expect(errors.filter((m) => /header of 262144 bytes/.test(m))).toHaveLength(3);
    expect(b.bufferedBytes).toBe(0);
  });

  it('authenticated peers that announce 1 MiB notifs and trickle are dropped; buffered bytes stay bounded; a genuine READ completes', async () => {
    const cap = 256 * 1024;
    const b = await agent({ maxBufferedBytes: cap, frameTimeoutMs: 400 });
    const peers = await Promise.all(Array.from({ length: 5 }, () => raw(b)));
    for (const p of peers) {
      await p.hello();
      await p.until((h) => h.t === F.OK);
    }
    const timers = peers.map((p) => {
      p.s.write(encodeFrame([F.NOTIF], 1024 * 1024));
      return setInterval(() => p.s.writable && p.s.write(Buffer.alloc(16 * 1024)), 10);
    });
    closers.push(() => timers.forEach(clearInterval));
    let maxSeen = 0;
    const poll = setInterval(() => (maxSeen = Math.max(maxSeen, b.bufferedBytes)), 2);
    closers.push(() => clearInterval(poll));
    expect((await read(await agent(), b, 200_000)).status).toBe('done');
    await Promise.all(peers.map((p) => p.closed));
    clearInterval(poll);
    expect(maxSeen).toBeGreaterThan(0);
    expect(maxSeen).toBeLessThanOrEqual(cap + 64 * 1024); // partial notifs under the cap, plus unparsed input
    expect(b.bufferedBytes).toBe(0);
    expect(b.partialNotifBytes).toBe(0);
  });

  it('closes incoming connections beyond maxIncomingConnections at once', async () => {
    const b = await agent({ maxIncomingConnections: 2 });
    const peers = await Promise.all([0, 1, 2, 3].map(() => raw(b)));
    await sleep(100);
    expect(b.incomingConnections).toBe(2);
    await Promise.race([Promise.all([peers[2]!.closed, peers[3]!.closed]), sleep(2000)]);
    expect(peers.filter((p) => p.s.destroyed || p.s.readableEnded).length).toBeGreaterThanOrEqual(2);
  });
});
