/**
 * The embedded agent's TCP frames (`embedded.ts` postTcp): host frames of `chunkBytes` (4 MiB by
 * default, up to 16 MiB, `MAX_PAYLOAD_BYTES`), frames with device segments cut at
 * `STAGING_CHUNK_BYTES`, and a WRITE whose source is deregistered while it is being sent.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { EmbeddedAgent, emulatedDeviceMemory, toMemoryRegion, type EmbeddedAgentOptions } from '../src/index.js';
import { STAGING_CHUNK_BYTES } from '../src/embedded.js';
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
  conns: Map<string, { primary: { inflight: Map<number, { bytes: number }>; reads: { directReads: number } } }>;
  inConns: Set<{ reads: { directReads: number; armed: Uint8Array | null } }>;
};
const internals = (a: EmbeddedAgent) => a as unknown as Internals;

describe('embedded agent: frames', () => {
  for (const [chunkBytes, frames] of [[undefined, Array<number>(9).fill(4 * MiB)], [MAX_PAYLOAD_BYTES, [MAX_PAYLOAD_BYTES, MAX_PAYLOAD_BYTES, 4 * MiB]]] as const)
  it(`sends host transfers in frames of ${chunkBytes ?? 'the default 4 MiB'} and lands them byte-exact, READ and WRITE`, async () => {
    const a = await agent({ chunkBytes });
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
    const inflight = internals(a).conns.get(peer)!.primary.inflight;
    const sent: number[] = [];
    const set = inflight.set.bind(inflight);
    inflight.set = (id, f) => (sent.push(f.bytes), set(id, f));
    for (const [op, local, remote] of [['WRITE', 0, 1], ['READ', 1, 0]] as const) {
      const req = await a.makeTransfer({ op, local: await one(local), remote: await rone(remote) });
      sent.length = 0;
      await a.post(req);
      expect(await a.wait(req)).toBe('done');
      expect(sent).toEqual(frames);
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
    const conn = internals(a).conns.get(peer)!.primary;
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
