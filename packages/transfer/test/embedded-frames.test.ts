/**
 * The embedded agent's TCP frames (`embedded.ts` postTcp, `embedded-conn.ts`): host frames of up
 * to 16 MiB (`MAX_PAYLOAD_BYTES`), frames with device segments cut at `STAGING_CHUNK_BYTES`,
 * in-place reads spanning segments contiguous in memory (`contiguousSpan`) that stop at every
 * gap, and a WRITE whose source is deregistered while it is being sent.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { EmbeddedAgent, emulatedDeviceMemory, toMemoryRegion, type EmbeddedAgentOptions } from '../src/index.js';
import { STAGING_CHUNK_BYTES } from '../src/embedded.js';
import { advanceSegs, contiguousSpan } from '../src/embedded-conn.js';
import { encodeFrame, F, MAX_PAYLOAD_BYTES } from '../src/wire.js';
import { pattern } from './patterns.js';
import { RawPeer } from './raw-peer.js';

let seq = 0;
const uniq = (p: string) => `${p}-${process.pid}-${++seq}-frames`;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const MiB = 1 << 20;
const KiB = 1024;
const agents: EmbeddedAgent[] = [];
afterEach(async () => {
  await Promise.all(agents.splice(0).map((a) => a.close()));
});
async function agent(o: Partial<EmbeddedAgentOptions> = {}): Promise<EmbeddedAgent> {
  const a = await EmbeddedAgent.create({ name: uniq('agent'), sharedMemory: false, ...o });
  agents.push(a);
  return a;
}
type Internals = {
  conns: Map<string, { inflight: Map<number, { bytes: number }>; reads: { directReads: number } }>;
  inConns: Set<{ reads: { directReads: number; armed: Uint8Array | null } }>;
};
const internals = (a: EmbeddedAgent) => a as unknown as Internals;

describe('contiguousSpan / advanceSegs', () => {
  const buf = new ArrayBuffer(100);
  const v = (o: number, n: number, b: ArrayBuffer = buf) => new Uint8Array(b, o, n);
  it('spans following segments only while each starts where the last ended, in the same buffer, and is allowed', () => {
    const segs = [v(0, 10), v(10, 10), v(20, 5), v(26, 4), v(30, 10), v(0, 10, new ArrayBuffer(10)), v(50, 10)];
    const all = () => true;
    const s0 = contiguousSpan(segs, 0, 3, all);
    expect([s0.seg.byteOffset, s0.seg.byteLength, s0.off]).toEqual([3, 22, 0]); // 3..25: stops at the 1-byte gap at 25
    const s3 = contiguousSpan(segs, 3, 1, all);
    expect([s3.seg.byteOffset, s3.seg.byteLength, s3.off]).toEqual([27, 13, 0]); // 26..40, then another buffer
    const s5 = contiguousSpan(segs, 5, 2, all);
    expect(s5.seg).toBe(segs[5]); // alone: the segment itself and the offset in it
    expect(s5.off).toBe(2);
    const s1 = contiguousSpan(segs, 0, 0, (k) => k !== 2); // a segment no longer allowed ends the span
    expect([s1.seg.byteOffset, s1.seg.byteLength]).toEqual([0, 20]);
  });
  it('advances across as many segment ends as the bytes cover', () => {
    const segs = [v(0, 10), v(10, 10), v(20, 5), v(26, 4)];
    expect(advanceSegs(segs, 0, 3, 7)).toEqual([1, 0]);
    expect(advanceSegs(segs, 0, 3, 22)).toEqual([3, 0]);
    expect(advanceSegs(segs, 0, 3, 23)).toEqual([3, 1]);
    expect(advanceSegs(segs, 2, 4, 5)).toEqual([4, 0]);
  });
});

describe('embedded agent: frames', () => {
  it('sends host transfers in frames of 16 MiB (MAX_PAYLOAD_BYTES) and lands them byte-exact, READ and WRITE', async () => {
    const a = await agent();
    const b = await agent();
    const n = 36 * MiB;
    const srcA = pattern(n, 61);
    const srcB = pattern(n, 62);
    const memA = new Uint8Array(n);
    const memB = new Uint8Array(n);
    const ra = await a.registerMemory([{ bytes: srcA }, { bytes: memA }]);
    const rb = await b.registerMemory([{ bytes: srcB }, { bytes: memB }]);
    const peer = await a.loadRemoteMetadata(await b.getLocalMetadata());
    await a.sendNotif(peer, new Uint8Array([1])); // the connection is up: post() hands frames to the socket at once
    const one = async (i: number) => a.prepDescList(null, 'DRAM', [{ addr: ra.regions[i]!.addr, length: n }]);
    const rone = async (i: number) => a.prepDescList(peer, 'DRAM', [{ addr: rb.regions[i]!.addr, length: n }]);
    // Every frame handed to the socket, by its payload bytes.
    const inflight = internals(a).conns.get(peer)!.inflight;
    const sent: number[] = [];
    const set = inflight.set.bind(inflight);
    inflight.set = (id, f) => (sent.push(f.bytes), set(id, f));
    for (const [op, local, remote] of [['WRITE', 0, 1], ['READ', 1, 0]] as const) {
      const req = await a.makeTransfer({ op, local: await one(local), remote: await rone(remote) });
      sent.length = 0;
      await a.post(req);
      expect(await a.wait(req)).toBe('done');
      expect(sent).toEqual([MAX_PAYLOAD_BYTES, MAX_PAYLOAD_BYTES, 4 * MiB]);
    }
    expect(Buffer.compare(memB, srcA)).toBe(0);
    expect(Buffer.compare(memA, srcB)).toBe(0);
  });

  it('cuts frames with device segments, here or at the peer, at STAGING_CHUNK_BYTES (the staging buffers)', async () => {
    const dm = emulatedDeviceMemory();
    const a = await agent({ deviceIpc: false });
    const b = await agent({ deviceIpc: false });
    const n = 10 * MiB;
    const host = pattern(n, 63);
    const dev = dm.alloc(0, n);
    const ra = await a.registerMemory([{ bytes: host }]);
    const rb = await b.registerMemory([toMemoryRegion(dev)]);
    const peer = await a.loadRemoteMetadata(await b.getLocalMetadata());
    await b.loadRemoteMetadata(await a.getLocalMetadata());
    const frames = Math.ceil(n / STAGING_CHUNK_BYTES);
    expect(frames).toBe(3);
    // Host memory here, device memory at the peer: the peer stages each frame.
    const w = await a.makeTransfer({ op: 'WRITE', local: await a.prepDescList(null, 'DRAM', [{ addr: ra.regions[0]!.addr, length: n }]), remote: await a.prepDescList(peer, 'VRAM', [{ addr: rb.regions[0]!.addr, length: n }]) });
    await a.post(w);
    expect(await a.wait(w)).toBe('done');
    expect(b.deviceStats.stagedFrames).toBe(frames);
    expect(Buffer.compare(dm.hostView(dev.address, n), host)).toBe(0);
    // Device memory here (b's), host memory at the peer (a's): this side stages each frame.
    host.fill(0);
    const w2 = await b.makeTransfer({ op: 'WRITE', local: await b.prepDescList(null, 'VRAM', [{ addr: rb.regions[0]!.addr, length: n }]), remote: await b.prepDescList(a.name, 'DRAM', [{ addr: ra.regions[0]!.addr, length: n }]) });
    await b.post(w2);
    expect(await b.wait(w2)).toBe('done');
    expect(b.deviceStats.stagedFrames).toBe(2 * frames);
    expect(Buffer.compare(host, pattern(n, 63))).toBe(0);
  });

  it('reads contiguous small segments in place as one span, stops at every gap, split at every segment boundary: lands exactly, gaps and guards untouched', async () => {
    const t = await agent();
    // The region is the middle of a larger buffer: a byte past a segment lands in a gap or a guard.
    const whole = pattern(4 * MiB, 64);
    const before = whole.slice();
    const reg = await t.registerMemory([{ bytes: whole.subarray(MiB, 3 * MiB) }]);
    const base = reg.regions[0]!.addr;
    const p = await RawPeer.connect(t);
    await p.hello(t);
    const conn = [...internals(t).inConns][0]!;
    /** A WRITE of `segs` ([offset in the region, length] pairs), the payload sent in pieces cut at every segment end +-1 byte after the socket was armed. */
    const send = async (id: number, segs: Array<[number, number]>, seed: number) => {
      const bytes = segs.reduce((s, [, l]) => s + l, 0);
      const payload = Buffer.from(pattern(bytes, seed));
      p.socket.write(encodeFrame([F.WRITE, id, segs.flatMap(([o, l]) => [base + o, l])], bytes));
      p.socket.write(payload.subarray(0, 1000));
      const t0 = Date.now();
      while (conn.reads.armed === null && Date.now() - t0 < 3000) await sleep(2);
      expect(conn.reads.armed).not.toBeNull(); // the next read goes straight into the region
      let at = 1000;
      let end = 0;
      for (const [i, [, l]] of segs.entries()) {
        end += l;
        const cut = Math.min(bytes, end + (i % 2 === 0 ? 1 : -1));
        if (cut <= at) continue;
        await p.write(payload.subarray(at, cut));
        at = cut;
        await sleep(1);
      }
      if (at < bytes) await p.write(payload.subarray(at));
      await p.until((f) => f.h.t === (F.WACK as number) && (f.h as { id: number }).id === id);
      let off = 0;
      for (const [o, l] of segs) {
        expect(Buffer.compare(whole.subarray(MiB + o, MiB + o + l), payload.subarray(off, off + l))).toBe(0);
        off += l;
      }
      return payload;
    };
    // 1. 64 segments of 16 KiB, contiguous: below DIRECT_READ_MIN_BYTES each, read in place as one span.
    const reads0 = conn.reads.directReads;
    await send(1, Array.from({ length: 64 }, (_, i): [number, number] => [i * 16 * KiB, 16 * KiB]), 65);
    expect(conn.reads.directReads).toBeGreaterThan(reads0);
    expect(Buffer.compare(whole.subarray(0, MiB), before.subarray(0, MiB))).toBe(0);
    // 2. Runs of 5 contiguous 64 KiB segments, each run 1 byte after the last: spans stop at every gap.
    const segs: Array<[number, number]> = [];
    for (let run = 0, o = MiB; run < 3; run++, o += 1) for (let k = 0; k < 5; k++, o += 64 * KiB) segs.push([o, 64 * KiB]);
    const reads1 = conn.reads.directReads;
    await send(2, segs, 66);
    expect(conn.reads.directReads).toBeGreaterThan(reads1);
    const last = segs[segs.length - 1]!;
    for (const gap of [MiB + 5 * 64 * KiB, MiB + 10 * 64 * KiB + 1, last[0] + last[1]]) expect(whole[MiB + gap]).toBe(before[MiB + gap]);
    expect(Buffer.compare(whole.subarray(3 * MiB), before.subarray(3 * MiB))).toBe(0);
    expect(p.closed).toBe(false);
    p.socket.destroy();
  });

  it('a WRITE whose source is deregistered while it is being sent fails invalid at once, sends none of its frames not yet handed to the socket, and the connection serves on', async () => {
    const a = await agent({ chunkBytes: MiB, maxInflightBytes: 2 * MiB });
    const b = await agent();
    const n = 16 * MiB;
    const src = pattern(n, 67);
    const dst = new Uint8Array(n);
    const other = pattern(MiB, 68);
    const regSrc = await a.registerMemory([{ bytes: src }]);
    const regOther = await a.registerMemory([{ bytes: other }]);
    const rb = await b.registerMemory([{ bytes: dst }]);
    const peer = await a.loadRemoteMetadata(await b.getLocalMetadata());
    await a.sendNotif(peer, new Uint8Array([1])); // the connection is up
    const remote = await a.prepDescList(peer, 'DRAM', [{ addr: rb.regions[0]!.addr, length: n }]);
    const w = await a.makeTransfer({ op: 'WRITE', local: await a.prepDescList(null, 'DRAM', [{ addr: regSrc.regions[0]!.addr, length: n }]), remote });
    await a.post(w);
    // No I/O callback ran since post: at most the window (2 frames) is with the socket, the rest queued.
    const conn = internals(a).conns.get(peer)!;
    expect(conn.inflight.size).toBeGreaterThan(0);
    expect([...conn.inflight.values()].reduce((s, f) => s + f.bytes, 0)).toBeLessThanOrEqual(2 * MiB);
    await a.deregisterMemory(regSrc);
    expect(a.status(w)).toBe('invalid');
    expect(await a.wait(w)).toBe('invalid');
    // Bytes the kernel had not taken yet are still sent from the views the socket holds (kept alive
    // by it); no further frame is: the window's acknowledgements release nothing of this WRITE.
    await sleep(300);
    expect(Buffer.compare(dst.subarray(2 * MiB), new Uint8Array(n - 2 * MiB))).toBe(0);
    const w2 = await a.makeTransfer({ op: 'WRITE', local: await a.prepDescList(null, 'DRAM', [{ addr: regOther.regions[0]!.addr, length: MiB }]), remote: await a.prepDescList(peer, 'DRAM', [{ addr: rb.regions[0]!.addr + 4 * MiB, length: MiB }]) });
    await a.post(w2);
    expect(await a.wait(w2)).toBe('done');
    expect(Buffer.compare(dst.subarray(4 * MiB, 5 * MiB), other)).toBe(0);
    expect(Buffer.compare(dst.subarray(5 * MiB), new Uint8Array(n - 5 * MiB))).toBe(0);
  });
});
