/**
 * The target's TCP receive path (WRITE segments read in place into the granted region,
 * embedded-conn.ts SocketReads, wire.ts FrameReader directTarget/pushDirect) against an
 * authenticated peer speaking the wire directly: guard bytes around every granted region, typed
 * refusals, no uncaught exception, honest peers served afterwards.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { EmbeddedAgent, ProtocolError, type TransferAgent } from '../src/index.js';
import { encodeFrame, F } from '../src/wire.js';
import { RawPeer } from './raw-peer.js';

let seq = 0;
const uniq = (p: string) => `${p}-${process.pid}-${++seq}`;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const GUARD = 8192;
const MiB = 1 << 20;

/** A region of `n` bytes inside guard bytes (0xAA): the view to register, the whole, a checker. */
function guarded(n: number, fill = 0) {
  const whole = Buffer.alloc(n + 2 * GUARD, 0xaa);
  const inner = whole.subarray(GUARD, GUARD + n);
  inner.fill(fill);
  return {
    inner,
    guardsIntact: () => whole.subarray(0, GUARD).every((x) => x === 0xaa) && whole.subarray(GUARD + n).every((x) => x === 0xaa),
  };
}

function pat(n: number, seed: number): Buffer {
  const b = Buffer.allocUnsafe(n);
  let s = seed >>> 0;
  for (let i = 0; i < n; i++) {
    s = (s * 1664525 + 1013904223) >>> 0;
    b[i] = s >>> 24;
  }
  return b;
}

describe('hostile: embedded TCP receive path', () => {
  const open: TransferAgent[] = [];
  const errors: ProtocolError[] = [];
  let uncaught: unknown[] = [];
  const onUncaught = (e: unknown) => uncaught.push(e);
  process.on('uncaughtException', onUncaught);
  const agent = async () => {
    const a = await EmbeddedAgent.create({ name: uniq('h'), frameTimeoutMs: 3000 });
    a.on('protocol-error', (e) => errors.push(e));
    open.push(a);
    return a;
  };
  /** A fresh target agent with `n` guarded bytes registered (region at `base`) and a raw peer past its handshake. */
  const grantedPeer = async (n: number): Promise<{ t: EmbeddedAgent; g: ReturnType<typeof guarded>; base: number; p: RawPeer }> => {
    const t = await agent();
    const g = guarded(n);
    const reg = await t.registerMemory([{ bytes: g.inner }]);
    const base = reg.regions[0]!.addr;
    const p = await RawPeer.connect(t);
    await p.hello(t);
    return { t, g, base, p };
  };
  afterEach(async () => {
    await Promise.all(open.splice(0).map((a) => a.close()));
    expect(uncaught).toEqual([]);
    uncaught = [];
  });

  async function honestWrite(t: EmbeddedAgent, addr: number, n: number, seed: number, view: Uint8Array, off: number) {
    const p = await RawPeer.connect(t);
    await p.hello(t);
    const data = pat(n, seed);
    p.socket.write(encodeFrame([F.WRITE, 7, [addr + off, n]], n));
    p.socket.write(data);
    const a = await p.until((f) => f.h.t === F.WACK || f.h.t === F.ERR);
    expect(a.h.t).toBe(F.WACK);
    expect(Buffer.compare(view.subarray(off, off + n), data)).toBe(0);
    p.socket.destroy();
  }

  it('WRITE past the grant (large), payload/segs mismatch, overflowing addresses: ERR or FATAL, guards intact, still serves', async () => {
    const { t, g, base, p } = await grantedPeer(2 * MiB);
    // 1. one byte past the grant, large segment: refused, payload dropped unread
    const n = 2 * MiB + 1;
    p.socket.write(encodeFrame([F.WRITE, 1, [base, n]], n));
    p.socket.write(Buffer.alloc(n, 0x55));
    expect((await p.until((f) => (f.h as { id?: number }).id === 1 && f.h.t === F.ERR)).h.t).toBe(F.ERR);
    // 2. two segments, second past the end
    p.socket.write(encodeFrame([F.WRITE, 2, [base, MiB, base + 2 * MiB - 10, 300 * 1024]], MiB + 300 * 1024));
    p.socket.write(Buffer.alloc(MiB + 300 * 1024, 0x56));
    expect((await p.until((f) => (f.h as { id?: number }).id === 2)).h.t).toBe(F.ERR);
    // 3. address below the region, address huge, addr+len past 2^53
    p.socket.write(encodeFrame([F.WRITE, 3, [base - 1, 512 * 1024]], 512 * 1024));
    p.socket.write(Buffer.alloc(512 * 1024, 0x57));
    expect((await p.until((f) => (f.h as { id?: number }).id === 3)).h.t).toBe(F.ERR);
    p.socket.write(encodeFrame([F.WRITE, 4, [Number.MAX_SAFE_INTEGER - 10, 512 * 1024]], 512 * 1024));
    p.socket.write(Buffer.alloc(512 * 1024, 0x58));
    expect((await p.until((f) => (f.h as { id?: number }).id === 4)).h.t).toBe(F.ERR);
    expect(g.inner.every((x) => x === 0)).toBe(true);
    expect(g.guardsIntact()).toBe(true);
    // 4. payload declared larger than the segments: protocol error
    p.socket.write(encodeFrame([F.WRITE, 5, [base, MiB]], MiB + 4096));
    p.socket.write(Buffer.alloc(MiB + 4096, 0x59));
    await p.until((f) => f.h.t === F.FATAL);
    expect(g.inner.every((x) => x === 0)).toBe(true);
    expect(g.guardsIntact()).toBe(true);
    await honestWrite(t, base, MiB, 9, g.inner, MiB);
    expect(g.guardsIntact()).toBe(true);
  });

  it('payload shorter than the segment, then a new frame prefix inside the "payload" (lengths that change mid-frame): lands only in the grant', async () => {
    const { t, g, base, p } = await grantedPeer(MiB);
    // WRITE of 1 MiB at the end of the grant, then the peer sends a second header "in the middle":
    // the agent must treat those bytes as payload (in the grant), never as a new frame.
    p.socket.write(encodeFrame([F.WRITE, 1, [base, MiB]], MiB));
    await p.write(Buffer.alloc(300 * 1024, 0x11));
    await sleep(30);
    const fake = encodeFrame([F.WRITE, 2, [base + MiB - 16, 4 * MiB]], 4 * MiB);
    await p.write(fake);
    await p.write(Buffer.alloc(MiB - 300 * 1024 - fake.length, 0x22));
    expect((await p.until((f) => (f.h as { id?: number }).id === 1)).h.t).toBe(F.WACK);
    expect(g.guardsIntact()).toBe(true);
    expect(Buffer.compare(g.inner.subarray(300 * 1024, 300 * 1024 + fake.length), fake)).toBe(0);
    // more bytes than the frame: they are the next prefix -> garbage prefix -> FATAL
    await p.write(Buffer.alloc(64 * 1024, 0x33));
    await p.until((f) => f.h.t === F.FATAL);
    expect(g.guardsIntact()).toBe(true);
    await honestWrite(t, base, 512 * 1024, 3, g.inner, 0);
  });

  it('header split across reads at every offset (large WRITE following a large one)', async () => {
    const { t, g, base, p } = await grantedPeer(MiB);
    const n = 512 * 1024;
    for (let k = 0; k < 40; k++) {
      const data = pat(n, k + 100);
      const hdr = encodeFrame([F.WRITE, 100 + k, [base + (k % 2) * n, n]], n);
      const frame = Buffer.concat([hdr, data]);
      const cut = k % (hdr.length + 2);
      // pieces: [0,cut) of header, rest of header + part of data, rest
      await p.write(frame.subarray(0, cut));
      await sleep(3);
      const mid = Math.min(frame.length, hdr.length + ((k * 7919) % n));
      await p.write(frame.subarray(cut, mid));
      await sleep(3);
      await p.write(frame.subarray(mid));
      const a = await p.until((f) => (f.h as { id?: number }).id === 100 + k);
      expect(a.h.t).toBe(F.WACK);
      expect(Buffer.compare(g.inner.subarray((k % 2) * n, (k % 2) * n + n), data)).toBe(0);
    }
    expect(g.guardsIntact()).toBe(true);
    // byte-by-byte header
    const data = pat(n, 5);
    const hdr = encodeFrame([F.WRITE, 999, [base, n]], n);
    for (let i = 0; i < hdr.length; i++) {
      await p.write(hdr.subarray(i, i + 1));
      await sleep(1);
    }
    await p.write(data);
    expect((await p.until((f) => (f.h as { id?: number }).id === 999)).h.t).toBe(F.WACK);
    expect(Buffer.compare(g.inner.subarray(0, n), data)).toBe(0);
    const inConns = (t as unknown as { inConns: Set<{ reads: { directReads: number } }> }).inConns;
    expect([...inConns][0]!.reads.directReads).toBeGreaterThan(0);
  });

  it('connection dropped mid in-place segment, then reconnect: guards intact, honest peer served', async () => {
    const t = await agent();
    const g = guarded(4 * MiB);
    const reg = await t.registerMemory([{ bytes: g.inner }]);
    const base = reg.regions[0]!.addr;
    for (let round = 0; round < 5; round++) {
      const p = await RawPeer.connect(t);
      await p.hello(t);
      p.socket.write(encodeFrame([F.WRITE, 1, [base, 4 * MiB]], 4 * MiB));
      await p.write(Buffer.alloc(MiB + round * 77777, 0x40 + round));
      await sleep(20);
      if (round % 2) p.socket.resetAndDestroy();
      else p.socket.destroy();
      await sleep(20);
    }
    expect(g.guardsIntact()).toBe(true);
    await honestWrite(t, base, 2 * MiB, 77, g.inner, 2 * MiB);
    expect(g.guardsIntact()).toBe(true);
  });

  it('deregisterMemory while a segment is being written in place: no further byte, no byte outside; another region of the same WRITE also not written', async () => {
    const t = await agent();
    const g1 = guarded(2 * MiB, 0);
    const g2 = guarded(2 * MiB, 0);
    const r1 = await t.registerMemory([{ bytes: g1.inner }]);
    const r2 = await t.registerMemory([{ bytes: g2.inner }]);
    const b1 = r1.regions[0]!.addr;
    const b2 = r2.regions[0]!.addr;
    const p = await RawPeer.connect(t);
    await p.hello(t);
    p.socket.write(encodeFrame([F.WRITE, 1, [b1, 2 * MiB, b2, 2 * MiB]], 4 * MiB));
    await p.write(Buffer.alloc(MiB, 0x61));
    await sleep(50);
    await t.deregisterMemory(r1);
    const snap1 = Buffer.from(g1.inner);
    await p.write(Buffer.alloc(3 * MiB, 0x62));
    const a = await p.until((f) => (f.h as { id?: number }).id === 1);
    expect(a.h.t).toBe(F.ERR);
    expect(Buffer.compare(snap1, g1.inner)).toBe(0);
    expect(g1.guardsIntact() && g2.guardsIntact()).toBe(true);
    // second region: still registered; bytes may land there (in grant) - report what happened
    // reconnect and write the deregistered region: refused
    p.socket.write(encodeFrame([F.WRITE, 2, [b1, 512 * 1024]], 512 * 1024));
    p.socket.write(Buffer.alloc(512 * 1024, 0x63));
    expect((await p.until((f) => (f.h as { id?: number }).id === 2)).h.t).toBe(F.ERR);
    expect(Buffer.compare(snap1, g1.inner)).toBe(0);
    await honestWrite(t, b2, MiB, 8, g2.inner, 0);
  });

  it('deregister during an in-place read, re-register a new region: the stale WRITE writes into neither', async () => {
    const t = await agent();
    const g1 = guarded(2 * MiB, 0);
    const r1 = await t.registerMemory([{ bytes: g1.inner }]);
    const b1 = r1.regions[0]!.addr;
    const p = await RawPeer.connect(t);
    await p.hello(t);
    p.socket.write(encodeFrame([F.WRITE, 1, [b1, 2 * MiB]], 2 * MiB));
    await p.write(Buffer.alloc(600 * 1024, 0x61));
    await sleep(50);
    await t.deregisterMemory(r1);
    const g2 = guarded(2 * MiB, 0);
    await t.registerMemory([{ bytes: g2.inner }]);
    const snap1 = Buffer.from(g1.inner);
    await p.write(Buffer.alloc(2 * MiB - 600 * 1024, 0x62));
    expect((await p.until((f) => (f.h as { id?: number }).id === 1)).h.t).toBe(F.ERR);
    expect(Buffer.compare(snap1, g1.inner)).toBe(0);
    expect(g2.inner.every((x) => x === 0)).toBe(true);
    expect(g1.guardsIntact() && g2.guardsIntact()).toBe(true);
  });

  it('many parallel connections each with a large in-flight WRITE, completed in shuffled order', async () => {
    const t = await agent();
    const N = 12;
    const seg = MiB;
    const g = guarded(N * seg);
    const reg = await t.registerMemory([{ bytes: g.inner }]);
    const base = reg.regions[0]!.addr;
    const peers = await Promise.all(Array.from({ length: N }, () => RawPeer.connect(t)));
    await Promise.all(peers.map((p) => p.hello(t)));
    const datas = peers.map((_, i) => pat(seg, 1000 + i));
    for (let i = 0; i < N; i++) {
      peers[i]!.socket.write(encodeFrame([F.WRITE, i + 1, [base + i * seg, seg]], seg));
      peers[i]!.socket.write(datas[i]!.subarray(0, 300 * 1024 + i * 1000));
    }
    await sleep(100);
    const order = [...Array(N).keys()].sort((a, b) => ((a * 7) % N) - ((b * 7) % N));
    for (const i of order) {
      peers[i]!.socket.write(datas[i]!.subarray(300 * 1024 + i * 1000, 600 * 1024));
    }
    await sleep(30);
    for (const i of order.reverse()) peers[i]!.socket.write(datas[i]!.subarray(600 * 1024));
    for (let i = 0; i < N; i++) expect((await peers[i]!.until((f) => (f.h as { id?: number }).id === i + 1)).h.t).toBe(F.WACK);
    for (let i = 0; i < N; i++) expect(Buffer.compare(g.inner.subarray(i * seg, (i + 1) * seg), datas[i]!)).toBe(0);
    expect(g.guardsIntact()).toBe(true);
    for (const p of peers) p.socket.destroy();
  });
});
