/**
 * The side channel with a cluster secret (protocol 16, `docs/security.md`): peers without it or
 * with a wrong one learn nothing and change nothing, replayed frames are refused, a server that
 * cannot prove the secret is not believed; without a secret only loopback binds are allowed. And
 * the bounds under floods: announced frame sizes, partial frames that trickle, buffered bytes in
 * total, pending requests, waiters; a genuine request still completes.
 */
import * as net from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { ClusterSecretError, makeNonce } from '@kvconnect/transfer';
import {
  FrameAssembler,
  LIMITS,
  NIXL_PROTOCOL_VERSION,
  SideChannelClient,
  SideChannelServer,
  NixlProducerChannel,
  nixlMetrics,
  decodeEmptyBody,
  decodeLeaseBody,
  encodeAuthRequest,
  encodeRequest,
  packr,
  parseNixlConfig,
  type SideChannelServerOptions,
  type SideRequest,
} from '../src/index.js';

const SECRET = Buffer.from('the-cluster-secret-of-this-test-0123');
const OTHER = Buffer.from('another-cluster-secret-entirely-4567');
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
async function until(pred: () => boolean, ms = 3000): Promise<void> {
  const end = Date.now() + ms;
  while (!pred()) {
    if (Date.now() > end) throw new Error('condition not reached in time');
    await sleep(5);
  }
}
const lease = (ids: string[]): SideRequest => ({ type: 'lease', requestIds: ids, pinMs: 0 });

const closers: Array<() => unknown> = [];
afterEach(async () => {
  for (const c of closers.splice(0).reverse()) await c();
});

/** A server whose handler records every request it was asked to serve. */
async function serve(o: SideChannelServerOptions = {}, handlerDelayMs = 0) {
  const seen: SideRequest[] = [];
  const errors: string[] = [];
  const server = new SideChannelServer(
    async (req) => {
      seen.push(req);
      if (handlerDelayMs > 0) await sleep(handlerDelayMs);
      if (req.type === 'lease') return { ok: req.requestIds.map((id) => [id, 42]) };
      if (req.type === 'info') return { ok: ['the producer agent secret would be here'] };
      return { ok: [] };
    },
    { onProtocolError: (_p, m) => errors.push(m), ...o },
  );
  const addr = await server.listen('127.0.0.1', 0);
  closers.push(() => server.close());
  return { server, addr, seen, errors };
}

function client(port: number, secret: Buffer | null, timeoutMs = 2000) {
  const c = new SideChannelClient('127.0.0.1', port, { clusterSecret: secret, timeoutMs });
  closers.push(() => c.close());
  return c;
}

/** A raw TCP connection collecting what the server sends. */
async function raw(port: number) {
  const s = net.createConnection(port, '127.0.0.1');
  s.on('error', () => {});
  await new Promise<void>((r) => s.once('connect', () => r()));
  const got: Buffer[] = [];
  s.on('data', (c: Buffer) => got.push(c));
  const closed = new Promise<void>((r) => s.once('close', () => r()));
  closers.push(() => s.destroy());
  return { s, got, closed };
}

const frameOf = (body: Uint8Array) => {
  const out = Buffer.alloc(4 + body.byteLength);
  out.writeUInt32LE(body.byteLength, 0);
  out.set(body, 4);
  return out;
};

/**
 * A TCP relay in front of `port` that records every client-to-server chunk, and can inject bytes
 * into the client-to-server direction of its current connection.
 */
async function relay(port: number) {
  const up: Buffer[][] = [];
  let inject: ((b: Buffer) => void) | null = null;
  const srv = net.createServer((c) => {
    const rec: Buffer[] = [];
    up.push(rec);
    const u = net.createConnection(port, '127.0.0.1');
    inject = (b) => u.write(b);
    c.on('data', (d: Buffer) => {
      rec.push(Buffer.from(d));
      u.write(d);
    });
    u.on('data', (d: Buffer) => c.write(d));
    c.on('error', () => u.destroy());
    u.on('error', () => c.destroy());
    c.on('close', () => u.destroy());
    u.on('close', () => c.destroy());
  });
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', () => r()));
  closers.push(() => new Promise((r) => srv.close(r)));
  return { port: (srv.address() as net.AddressInfo).port, up, inject: (b: Buffer) => inject!(b) };
}

describe('side channel with a cluster secret', () => {
  it('serves a client holding the secret (INFO, LEASE, RELEASE)', async () => {
    const { addr, seen } = await serve({ clusterSecret: SECRET });
    const c = client(addr.port, SECRET);
    expect(await c.request({ type: 'info', version: NIXL_PROTOCOL_VERSION, mode: 'pull', compatHash: 'h' }, (b) => b)).toEqual(['the producer agent secret would be here']);
    expect(await c.request(lease(['a']), decodeLeaseBody)).toEqual(new Map([['a', 42]]));
    await c.request({ type: 'release', requestIds: ['a'] }, decodeEmptyBody);
    expect(seen.map((r) => r.type)).toEqual(['info', 'lease', 'release']);
  });

  it('a client without the secret, or with a wrong one, gets no INFO and cannot LEASE or RELEASE', async () => {
    const { addr, seen, server } = await serve({ clusterSecret: SECRET });
    for (const secret of [null, OTHER]) {
      const c = client(addr.port, secret);
      for (const req of [{ type: 'info', version: NIXL_PROTOCOL_VERSION, mode: 'pull', compatHash: 'h' } as const, lease(['a']), { type: 'release', requestIds: ['a'] } as const]) {
        await expect(c.request(req, (b) => b)).rejects.toMatchObject({ code: 'unauthenticated' });
      }
    }
    expect(seen).toEqual([]);
    // Each refused request was a connection the server closed (without a secret) or the client
    // closed after the server's proof failed (wrong secret).
    expect(server.stats().droppedPeers).toBeGreaterThanOrEqual(3);
  });

  it('a raw peer that completes AUTH but cannot seal is refused before anything is decoded', async () => {
    const { addr, seen, errors } = await serve({ clusterSecret: SECRET });
    const p = await raw(addr.port);
    p.s.write(frameOf(encodeAuthRequest(makeNonce())));
    await sleep(50);
    expect(p.got.length).toBeGreaterThan(0); // the AUTH answer: a nonce and the server's proof
    const body = encodeRequest(1, { type: 'release', requestIds: ['a'] });
    p.s.write(frameOf(Buffer.concat([body, Buffer.alloc(32)])));
    await p.closed;
    expect(seen).toEqual([]);
    expect(errors.some((m) => /failed its proof/.test(m))).toBe(true);
  });

  it('refuses replayed frames: on the same connection and on a new one', async () => {
    const { addr, seen } = await serve({ clusterSecret: SECRET });
    const r = await relay(addr.port);
    const c = client(r.port, SECRET);
    await c.request({ type: 'release', requestIds: ['victim'] }, decodeEmptyBody);
    expect(seen).toHaveLength(1);
    const recorded = Buffer.concat(r.up[0]!);
    // The recording is the AUTH frame and the sealed RELEASE; replay the RELEASE on the same
    // connection (its seq is not new) ...
    const authLen = 4 + recorded.readUInt32LE(0);
    r.inject(recorded.subarray(authLen));
    await sleep(100);
    expect(seen).toHaveLength(1);
    // ... and the whole recording on a fresh connection (the server's nonce differs).
    const p = await raw(addr.port);
    p.s.write(recorded);
    await p.closed;
    expect(seen).toHaveLength(1);
  });

  it('a server that cannot prove the secret is not believed (no INFO accepted from it)', async () => {
    // An impostor: answers AUTH with a made-up nonce and proof, then anything.
    const impostor = net.createServer((s) => {
      s.on('error', () => {});
      s.once('data', () => s.write(frameOf(packr.pack([0, 0, [makeNonce(), Buffer.alloc(32)]]))));
    });
    await new Promise<void>((r) => impostor.listen(0, '127.0.0.1', () => r()));
    closers.push(() => new Promise((r) => impostor.close(r)));
    const c = client((impostor.address() as net.AddressInfo).port, SECRET);
    await expect(c.request(lease(['a']), decodeLeaseBody)).rejects.toMatchObject({ code: 'unauthenticated' });
    // A genuine server with another secret fails the same way.
    const { addr } = await serve({ clusterSecret: OTHER });
    await expect(client(addr.port, SECRET).request(lease(['a']), decodeLeaseBody)).rejects.toMatchObject({ code: 'unauthenticated' });
  });

  it('a client with a secret refuses a server without one (and the server says why)', async () => {
    const { addr, seen } = await serve();
    await expect(client(addr.port, SECRET).request(lease(['a']), decodeLeaseBody)).rejects.toMatchObject({ code: 'unauthenticated', message: expect.stringMatching(/no cluster secret/) });
    expect(seen).toEqual([]);
    // Without secrets on either side: as before.
    expect(await client(addr.port, null).request(lease(['b']), decodeLeaseBody)).toEqual(new Map([['b', 42]]));
  });

  it('a connection that never authenticates is closed after the auth timeout', async () => {
    const { addr, server } = await serve({ clusterSecret: SECRET, authTimeoutMs: 100 });
    const p = await raw(addr.port);
    p.s.write(frameOf(encodeAuthRequest(makeNonce())));
    await p.closed;
    await until(() => server.stats().connections === 0);
  });
});

describe('bind rule of the producer side channel', () => {
  const cfg = (extra: Record<string, unknown>) =>
    parseNixlConfig({ kv_connector: 'NixlConnector', kv_role: 'kv_producer', enable_kv_checksum: false, kv_checksum_fail_closed: false, kv_load_failure_policy: 'recompute', kv_connector_extra_config: extra });
  it('refuses a non-loopback side channel without a cluster secret; loopback is the default', async () => {
    const bad = new NixlProducerChannel({ engineId: 'bind-bad', mode: 'pull', workers: 1, config: cfg({ side_channel_host: '0.0.0.0' }), metrics: nixlMetrics() });
    await expect(bad.listen()).rejects.toBeInstanceOf(ClusterSecretError);
    await bad.close();
    const ok = new NixlProducerChannel({ engineId: 'bind-ok', mode: 'pull', workers: 1, config: cfg({}), metrics: nixlMetrics() });
    expect((await ok.listen()).host).toBe('127.0.0.1');
    await ok.close();
  });
  it('takes cluster_secret from the config and checks its length', () => {
    expect(cfg({ cluster_secret: SECRET.toString() }).clusterSecret?.equals(SECRET)).toBe(true);
    expect(() => cfg({ cluster_secret: 'short' })).toThrow(/cluster_secret/);
  });
});

describe('floods', () => {
  it('peers announcing 64 MiB frames are dropped before anything is buffered', async () => {
    for (const secret of [null, SECRET]) {
      const { addr, server, errors } = await serve({ clusterSecret: secret });
      const peers = await Promise.all([0, 1, 2].map(() => raw(addr.port)));
      for (const p of peers) {
        const pre = Buffer.alloc(4);
        pre.writeUInt32LE(LIMITS.frameBytes, 0);
        p.s.write(Buffer.concat([pre, Buffer.alloc(1000)]));
      }
      await Promise.all(peers.map((p) => p.closed));
      expect(errors.filter((m) => /frame of 67108864 bytes/.test(m))).toHaveLength(3);
      expect(server.stats().bufferedBytes).toBe(0);
      expect(await client(addr.port, secret).request(lease(['g']), decodeLeaseBody)).toEqual(new Map([['g', 42]]));
    }
  });

  it('trickling peers are dropped (deadline, buffer budget); buffered bytes stay under the cap; a genuine request completes', async () => {
    const cap = 1 << 20;
    const { addr, server, errors } = await serve({ maxBufferedBytes: cap, partialFrameTimeoutMs: 300 });
    const N = 6;
    const peers = await Promise.all(Array.from({ length: N }, () => raw(addr.port)));
    let maxSeen = 0;
    const timers: NodeJS.Timeout[] = [];
    peers.forEach((p) => {
      const pre = Buffer.alloc(4);
      pre.writeUInt32LE(8 << 20, 0); // within the request limit: buffered until the deadline
      p.s.write(pre);
      timers.push(setInterval(() => p.s.writable && p.s.write(Buffer.alloc(64 * 1024)), 10));
    });
    closers.push(() => timers.forEach(clearInterval));
    const genuine = client(addr.port, null);
    const t0 = Date.now();
    for (let i = 0; i < 20; i++) {
      maxSeen = Math.max(maxSeen, server.stats().bufferedBytes);
      expect((await genuine.request(lease([`r${i}`]), decodeLeaseBody)).get(`r${i}`)).toBe(42);
      await sleep(25);
    }
    await Promise.all(peers.map((p) => p.closed));
    timers.forEach(clearInterval);
    expect(maxSeen).toBeLessThanOrEqual(cap);
    expect(server.stats().bufferedBytes).toBe(0);
    expect(errors.filter((m) => /evicted|not completed within/.test(m)).length).toBe(N);
    // The genuine client's requests each came back promptly (not after a peer's deadline).
    expect(Date.now() - t0).toBeLessThan(20 * 25 + 2000);
  });

  it('a partial frame that does not complete within the deadline drops its peer', async () => {
    const { addr, server, errors } = await serve({ partialFrameTimeoutMs: 200 });
    const p = await raw(addr.port);
    const pre = Buffer.alloc(4);
    pre.writeUInt32LE(1000, 0);
    p.s.write(Buffer.concat([pre, Buffer.alloc(10)]));
    await until(() => server.stats().bufferedBytes === 14);
    const t0 = Date.now();
    await Promise.race([p.closed, sleep(3000)]);
    expect(Date.now() - t0).toBeLessThan(2000);
    expect(errors).toEqual(['partial frame not completed within 200 ms']);
    expect(server.stats().bufferedBytes).toBe(0);
  });

  it('bounds pending requests per peer and in total, and waiters per client', async () => {
    const { addr, server } = await serve({ maxPendingPerPeer: 4, maxPendingTotal: 6 }, 100);
    const c1 = client(addr.port, null);
    const c2 = client(addr.port, null);
    let maxPending = 0;
    const poll = setInterval(() => (maxPending = Math.max(maxPending, server.stats().pending)), 5);
    const all = [...Array.from({ length: 12 }, (_, i) => c1.request(lease([`a${i}`]), decodeLeaseBody, 5000)), ...Array.from({ length: 12 }, (_, i) => c2.request(lease([`b${i}`]), decodeLeaseBody, 5000))];
    const res = await Promise.allSettled(all);
    clearInterval(poll);
    expect(maxPending).toBeLessThanOrEqual(6);
    // Per peer, requests beyond 4 wait (answered later, in order); beyond 6 in total are refused busy.
    const busy = res.filter((r) => r.status === 'rejected' && (r.reason as { code: string }).code === 'busy').length;
    const ok = res.filter((r) => r.status === 'fulfilled').length;
    expect(ok + busy).toBe(24);
    expect(ok).toBeGreaterThanOrEqual(12);
    expect(busy).toBeGreaterThanOrEqual(1);
    const small = new SideChannelClient('127.0.0.1', addr.port, { maxWaiters: 2 });
    closers.push(() => small.close());
    const first = [small.request(lease(['w1']), decodeLeaseBody), small.request(lease(['w2']), decodeLeaseBody)];
    await sleep(20);
    await expect(small.request(lease(['w3']), decodeLeaseBody)).rejects.toMatchObject({ code: 'busy' });
    await Promise.all(first);
    // A budget shared by two clients caps their waiters in total.
    const shared = { used: 0, max: 2 };
    const x = new SideChannelClient('127.0.0.1', addr.port, { waiterBudget: shared });
    const y = new SideChannelClient('127.0.0.1', addr.port, { waiterBudget: shared });
    closers.push(() => x.close(), () => y.close());
    const two = [x.request(lease(['x1']), decodeLeaseBody), y.request(lease(['y1']), decodeLeaseBody)];
    await expect(y.request(lease(['y2']), decodeLeaseBody)).rejects.toMatchObject({ code: 'busy' });
    await Promise.all(two);
    expect(shared.used).toBe(0);
    expect((await x.request(lease(['x2']), decodeLeaseBody)).get('x2')).toBe(42);
  });

  it('at the connection cap the longest idle connection makes room; busy ones are kept and a newcomer refused', async () => {
    const { addr, server } = await serve({ maxConnections: 4 });
    const idle = [];
    for (let i = 0; i < 6; i++) {
      idle.push(await raw(addr.port));
      await sleep(10);
    }
    await until(() => server.stats().connections === 4);
    // The two oldest went first.
    await Promise.race([Promise.all([idle[0]!.closed, idle[1]!.closed]), sleep(2000)]);
    expect(idle.slice(0, 2).every((p) => p.s.destroyed || p.s.readableEnded)).toBe(true);
    const genuine = client(addr.port, null);
    expect(await genuine.request(lease(['c']), decodeLeaseBody)).toEqual(new Map([['c', 42]]));
    expect(server.stats().connections).toBe(4);
    // Four connections each holding a partial frame: none is idle, a fifth is refused.
    for (const p of idle.slice(2)) p.s.destroy();
    genuine.close();
    await until(() => server.stats().connections === 0);
    const busy = [];
    for (let i = 0; i < 4; i++) {
      const p = await raw(addr.port);
      p.s.write(Buffer.from([100, 0, 0, 0, 1]));
      busy.push(p);
    }
    await until(() => server.stats().bufferedBytes === 4 * 5 && server.stats().connections === 4);
    const before = server.stats().droppedPeers;
    const late = await raw(addr.port);
    await Promise.race([late.closed, sleep(2000)]);
    expect(server.stats().droppedPeers).toBe(before + 1);
    expect(busy.every((p) => !p.s.destroyed)).toBe(true);
  });

  it('FrameAssembler concatenates a frame once, however many chunks it came in', () => {
    const frames: Buffer[] = [];
    const a = new FrameAssembler(1 << 20, (f) => frames.push(f), () => {});
    const body = Buffer.alloc(300_000, 7);
    const all = frameOf(body);
    const concat = Buffer.concat;
    let copies = 0;
    Buffer.concat = ((...args: Parameters<typeof Buffer.concat>) => {
      copies++;
      return concat(...args);
    }) as typeof Buffer.concat;
    try {
      for (let off = 0; off < all.length; off += 1000) a.push(all.subarray(off, off + 1000));
    } finally {
      Buffer.concat = concat;
    }
    expect(copies).toBe(0); // one allocation and copy in take(), never a re-concat per chunk
    expect(frames).toHaveLength(1);
    expect(frames[0]!.equals(body)).toBe(true);
    expect(a.buffered).toBe(0);
  });
});
