/**
 * Device memory (`device.ts`) and the embedded agent's device regions: the emulated layer's
 * contract (what CI tests every JS path with), the CUDA layer's typed error without CUDA (or a
 * round trip on a GPU), and the agent moving device regions by IPC on one host and over its TCP
 * path with staging otherwise (in this process with IPC off, and against another process).
 */
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterEach, describe, expect, it } from 'vitest';
import { Packr, Unpackr } from 'msgpackr';
import {
  cudaDeviceMemory,
  decodeEmbeddedMetadata,
  DeviceMemoryError,
  EmbeddedAgent,
  EmulatedDeviceMemory,
  emulatedDeviceMemory,
  IPC_HANDLE_BYTES,
  isTransferError,
  MooncakeAgent,
  NixlAgent,
  NO_CUDA_MESSAGE,
  toMemoryRegion,
  type DeviceMemory,
  type EmbeddedAgentOptions,
} from '../src/index.js';
import { collectNotifs } from './conformance.js';
import { pattern } from './patterns.js';
import { forkFixture } from './fixtures/fork-fixture.js';

let seq = 0;
const uniq = (p: string) => `${p}-${process.pid}-${++seq}-dev`;
const agents: EmbeddedAgent[] = [];
afterEach(async () => {
  await Promise.all(agents.splice(0).map((a) => a.close()));
});
async function agent(o: Partial<EmbeddedAgentOptions> = {}): Promise<EmbeddedAgent> {
  const a = await EmbeddedAgent.create({ name: uniq('agent'), ...o });
  agents.push(a);
  return a;
}

/** Bytes of emulated device memory as they are now. */
function deviceBytes(dm: EmulatedDeviceMemory, address: bigint, n: number): Uint8Array {
  return dm.hostView(address, n).slice();
}

describe('emulated device memory', () => {
  it('copies host <-> device <-> device; an async copy lands on a later turn, and its completion says so', async () => {
    const dm = new EmulatedDeviceMemory();
    const a = dm.alloc(0, 1000);
    const b = dm.alloc(0, 1000);
    expect(a.ipcHandle?.byteLength).toBe(IPC_HANDLE_BYTES);
    const stage = dm.allocHost(1000);
    stage.set(pattern(1000, 1));
    const c1 = dm.copyAsync(0, 'h2d', a.address, stage, 1000);
    expect(c1.done()).toBe(false);
    expect(deviceBytes(dm, a.address, 1000)).toEqual(new Uint8Array(1000)); // not yet: as on a GPU
    const c2 = dm.copyAsync(0, 'd2d', b.address + 10n, a.address, 990);
    await c2.settled();
    expect(c1.done()).toBe(true); // one stream: in order
    expect(deviceBytes(dm, b.address + 10n, 990)).toEqual(pattern(1000, 1).subarray(0, 990));
    const back = new Uint8Array(990);
    dm.copy(0, 'd2h', back, b.address + 10n, 990);
    expect(back).toEqual(pattern(1000, 1).subarray(0, 990));
  });

  it('refuses ranges outside its memory, pageable host sides of async copies, other devices and freed memory', () => {
    const dm = new EmulatedDeviceMemory();
    const a = dm.alloc(0, 100);
    const stage = dm.allocHost(100);
    const range = (f: () => unknown) => expect(f).toThrow(expect.objectContaining({ name: 'DeviceMemoryError', code: 'range' }));
    range(() => dm.copyAsync(0, 'h2d', a.address + 90n, stage, 20));
    range(() => dm.copyAsync(0, 'h2d', a.address, new Uint8Array(100), 10)); // not staging (pinned) memory
    range(() => dm.copyAsync(1, 'h2d', a.address, stage, 10)); // a is on device 0
    range(() => dm.copy(0, 'd2h', new Uint8Array(5), a.address, 10)); // host buffer too small
    range(() => dm.copy(0, 'd2d', a.address, a.address + 4096n * 1024n, 1)); // the guard gap after a
    range(() => dm.copy(0, 'h2d', a.address, stage, 0));
    dm.free(a);
    range(() => dm.copy(0, 'h2d', a.address, stage, 1));
    range(() => dm.free(a));
  });

  it('opens an IPC handle of this process as a second mapping of the same bytes; refuses other processes\' and forged handles', () => {
    const dm = new EmulatedDeviceMemory();
    const a = dm.alloc(0, 4096);
    const m = dm.openIpc(0, a.ipcHandle!, 4096);
    expect(m).not.toBe(a.address);
    expect(dm.openIpc(0, a.ipcHandle!, 4096)).toBe(m); // cached, one more reference
    dm.copy(0, 'h2d', m + 100n, pattern(50, 3), 50);
    expect(deviceBytes(dm, a.address + 100n, 50)).toEqual(pattern(50, 3));
    expect(() => dm.openIpc(0, a.ipcHandle!, 8192)).toThrow(expect.objectContaining({ code: 'range' }));
    const other = new EmulatedDeviceMemory(); // stands for another process: another token
    expect(() => other.openIpc(0, a.ipcHandle!, 4096)).toThrow(expect.objectContaining({ code: 'ipc', message: expect.stringMatching(/another process/) }));
    const forged = a.ipcHandle!.slice();
    forged[40]! ^= 1;
    const b = dm.alloc(0, 10); // not open yet: its handle with a wrong nonce does not open
    const forgedB = b.ipcHandle!.slice();
    forgedB[40]! ^= 1;
    expect(() => dm.openIpc(0, forgedB, 10)).toThrow(expect.objectContaining({ code: 'ipc' }));
    dm.closeIpc(m);
    dm.closeIpc(m);
    expect(() => dm.closeIpc(m)).toThrow(expect.objectContaining({ code: 'range' }));
    expect(dm.hostId).not.toBe(other.hostId);
  });
});

describe('CUDA device memory', () => {
  let gpu: DeviceMemory | null = null;
  let why = '';
  try {
    const dm = cudaDeviceMemory();
    dm.free(dm.alloc(0, 1));
    gpu = dm;
  } catch (e) {
    why = e instanceof Error ? e.message : String(e);
  }
  if (!gpu) console.log(`CUDA device memory tests: no GPU here (${why})`);

  it.skipIf(gpu !== null)('without CUDA (or without a GPU), says so with a typed error', () => {
    let err: unknown;
    try {
      cudaDeviceMemory().alloc(0, 1024);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(DeviceMemoryError);
    expect((err as DeviceMemoryError).code).toBe('no-cuda');
    expect((err as DeviceMemoryError).message.startsWith(NO_CUDA_MESSAGE)).toBe(true);
  });

  it.skipIf(gpu === null)('on a GPU: staging -> device -> device -> staging round trip with polled completion', async () => {
    const dm = gpu!;
    const a = dm.alloc(0, 1 << 20);
    const b = dm.alloc(0, 1 << 20);
    const s = dm.allocHost(1 << 20);
    s.set(pattern(1 << 20, 5));
    await dm.copyAsync(0, 'h2d', a.address, s, 1 << 20).settled();
    await dm.copyAsync(0, 'd2d', b.address, a.address, 1 << 20).settled();
    const back = dm.allocHost(1 << 20);
    await dm.copyAsync(0, 'd2h', back, b.address, 1 << 20).settled();
    expect(Buffer.compare(back, pattern(1 << 20, 5))).toBe(0);
    expect(() => dm.copyAsync(0, 'h2d', a.address, new Uint8Array(16), 16)).toThrow(expect.objectContaining({ code: 'range' }));
    dm.free(a);
    dm.free(b);
  });
});

describe('embedded agent: device regions', () => {
  const dm = emulatedDeviceMemory();

  /** Two agents with one device region each (sizes n), the remote's filled with seed 11. */
  async function pair(o: Partial<EmbeddedAgentOptions> = {}, n = 300_000) {
    const a = await agent(o);
    const b = await agent(o);
    const la = dm.alloc(0, n);
    const rb = dm.alloc(0, n);
    dm.copy(0, 'h2d', rb.address, pattern(n, 11), n);
    const ra = await a.registerMemory([toMemoryRegion(la)]);
    const regB = await b.registerMemory([toMemoryRegion(rb)]);
    expect(ra.regions[0]!.kind).toBe('VRAM');
    const peer = await a.loadRemoteMetadata(await b.getLocalMetadata());
    await b.loadRemoteMetadata(await a.getLocalMetadata());
    return { a, b, la, rb, peer, addrA: ra.regions[0]!.addr, addrB: regB.regions[0]!.addr, n };
  }

  it('on one host: READ and WRITE by IPC (no TCP data frame), complete only after the copies, notif after the data', async () => {
    const { a, b, la, rb, peer, addrA, addrB, n } = await pair();
    const local = await a.prepDescList(null, 'VRAM', [{ addr: addrA, length: 1000 }, { addr: addrA + 1000, length: n - 1000 }]);
    const remote = await a.prepDescList(peer, 'VRAM', [{ addr: addrB, length: 1000 }, { addr: addrB + 1000, length: n - 1000 }]);
    const r = await a.makeTransfer({ op: 'READ', local, remote });
    expect(await a.post(r)).toBe('in-progress');
    expect(await a.wait(r)).toBe('done');
    expect(Buffer.compare(deviceBytes(dm, la.address, n), pattern(n, 11))).toBe(0); // in place when done
    dm.copy(0, 'h2d', la.address, pattern(n, 12), n);
    const w = await a.makeTransfer({ op: 'WRITE', local, remote, localIndices: [1], remoteIndices: [1], notif: new TextEncoder().encode('w') });
    await a.post(w);
    expect(await a.wait(w)).toBe('done');
    const notifs = await collectNotifs(b, a.name, 1);
    expect(new TextDecoder().decode(notifs[0])).toBe('w');
    const got = deviceBytes(dm, rb.address, n);
    expect(Buffer.compare(got.subarray(1000), pattern(n, 12).subarray(1000))).toBe(0);
    expect(Buffer.compare(got.subarray(0, 1000), pattern(n, 11).subarray(0, 1000))).toBe(0); // index 0 not written
    expect(a.deviceStats).toMatchObject({ ipcTransfers: 2, ipcBytes: n + (n - 1000), stagedFrames: 0 });
    expect(b.deviceStats.stagedFrames).toBe(0);
  });

  it('without IPC: READ and WRITE over TCP through staging on both sides, many frames, bytes in device memory', async () => {
    const { a, b, la, rb, peer, addrA, addrB, n } = await pair({ deviceIpc: false, chunkBytes: 64 * 1024 });
    const local = await a.prepDescList(null, 'VRAM', [{ addr: addrA + 7, length: n - 7 }]);
    const remote = await a.prepDescList(peer, 'VRAM', [{ addr: addrB + 7, length: n - 7 }]);
    const r = await a.makeTransfer({ op: 'READ', local, remote });
    await a.post(r);
    expect(await a.wait(r)).toBe('done');
    expect(Buffer.compare(deviceBytes(dm, la.address + 7n, n - 7), pattern(n, 11).subarray(7))).toBe(0);
    dm.copy(0, 'h2d', la.address, pattern(n, 13), n);
    const w = await a.makeTransfer({ op: 'WRITE', local, remote, notif: new TextEncoder().encode('done') });
    await a.post(w);
    expect(await a.wait(w)).toBe('done');
    await collectNotifs(b, a.name, 1);
    expect(Buffer.compare(deviceBytes(dm, rb.address + 7n, n - 7), pattern(n, 13).subarray(7))).toBe(0);
    expect(a.deviceStats.ipcTransfers).toBe(0);
    const frames = Math.ceil((n - 7) / (64 * 1024));
    expect(a.deviceStats.stagedFrames).toBe(2 * frames); // READ: staging -> device; WRITE: device -> staging
    expect(b.deviceStats.stagedFrames).toBe(2 * frames);
  });

  it('moves between host and device regions (TCP path, staging on the device side only)', async () => {
    const a = await agent();
    const b = await agent();
    const n = 50_000;
    const dev = dm.alloc(0, n);
    const host = pattern(n, 21);
    const ra = await a.registerMemory([toMemoryRegion(dev)]);
    const rb = await b.registerMemory([{ bytes: host }]);
    const peer = await a.loadRemoteMetadata(await b.getLocalMetadata());
    await b.loadRemoteMetadata(await a.getLocalMetadata());
    const local = await a.prepDescList(null, 'VRAM', [{ addr: ra.regions[0]!.addr, length: n }]);
    const remote = await a.prepDescList(peer, 'DRAM', [{ addr: rb.regions[0]!.addr, length: n }]);
    const r = await a.makeTransfer({ op: 'READ', local, remote });
    await a.post(r);
    expect(await a.wait(r)).toBe('done');
    expect(Buffer.compare(deviceBytes(dm, dev.address, n), host)).toBe(0);
    expect(a.deviceStats.ipcTransfers).toBe(0);
    expect(b.deviceStats.stagedFrames).toBe(0);
    // and the other way: b's host memory READs a's device memory
    const lb = await b.prepDescList(null, 'DRAM', [{ addr: rb.regions[0]!.addr, length: n }]);
    const rdev = await b.prepDescList(a.name, 'VRAM', [{ addr: ra.regions[0]!.addr, length: n }]);
    dm.copy(0, 'h2d', dev.address, pattern(n, 22), n);
    const r2 = await b.makeTransfer({ op: 'READ', local: lb, remote: rdev });
    await b.post(r2);
    expect(await b.wait(r2)).toBe('done');
    expect(Buffer.compare(host, pattern(n, 22))).toBe(0);
    expect(a.deviceStats.stagedFrames).toBeGreaterThan(1); // the target's device -> staging
  });

  it('keeps the bounds: descriptor lists of the wrong kind or outside a region, VRAM not allocated through the device memory', async () => {
    const { a, peer, addrA, addrB, n } = await pair();
    const invalid = (p: Promise<unknown>) => expect(p).rejects.toSatisfy((e) => isTransferError(e, 'invalid'));
    await invalid(a.prepDescList(null, 'DRAM', [{ addr: addrA, length: 10 }])); // a device region as DRAM
    await invalid(a.prepDescList(peer, 'DRAM', [{ addr: addrB, length: 10 }]));
    await invalid(a.prepDescList(peer, 'VRAM', [{ addr: addrB + n - 5, length: 10 }]));
    await invalid(a.prepDescList(null, 'VRAM', [{ addr: addrA - 1, length: 10 }]));
    await invalid(a.registerMemory([{ addr: 0x1234_0000, length: 4096, kind: 'VRAM', deviceId: 0 }]));
    const x = dm.alloc(0, 100);
    await invalid(a.registerMemory([{ addr: Number(x.address), length: 200, kind: 'VRAM', deviceId: 0 }])); // longer than the allocation
    await invalid(a.registerMemory([{ addr: Number(x.address), length: 100, kind: 'VRAM', ipcHandle: new Uint8Array(3) }]));
  });

  it('decodes the device field of the metadata strictly', async () => {
    const { b } = await pair();
    const md = await b.getLocalMetadata();
    const info = decodeEmbeddedMetadata(md);
    expect(info.hostId).toBe(dm.hostId);
    expect(info.devices).toHaveLength(1);
    expect(info.devices[0]!.ipcHandle?.byteLength).toBe(IPC_HANDLE_BYTES);
    const v = new Unpackr({ useRecords: false, int64AsType: 'number' }).unpack(md) as unknown[];
    const packr = new Packr({ useRecords: false, variableMapSize: true });
    const bad = (f: unknown) => {
      const w = v.slice();
      w[7] = f;
      expect(() => decodeEmbeddedMetadata(packr.pack(w))).toThrow(expect.objectContaining({ kind: 'invalid' }));
    };
    const [hostId, regs] = v[7] as [string, unknown[][]];
    const r0 = regs[0]!;
    bad('x');
    bad([hostId, [[r0[0], (r0[1] as number) + 1, r0[2], r0[3]]]]); // longer than the registered region
    bad([hostId, [[r0[0], r0[1], -1, r0[3]]]]);
    bad([hostId, [[r0[0], r0[1], r0[2], new Uint8Array(63)]]]);
    bad(['', regs]);
  });

  /** The device peer fixture, bundled (Node 20 cannot run TypeScript), in a child process. */
  async function devicePeer() {
    return (await forkFixture('device-peer-process')).child;
  }

  let gpu: DeviceMemory | null = null;
  try {
    const c = cudaDeviceMemory();
    c.free(c.alloc(0, 1));
    gpu = c;
  } catch (e) {
    console.log(`embedded agent CUDA IPC test across processes: no GPU here (${e instanceof Error ? e.message : String(e)})`);
  }

  it.skipIf(gpu === null)('on a GPU: READ of another process\'s CUDA memory by CUDA IPC, bytes intact', async () => {
    const child = await devicePeer();
    try {
      const ask = (msg: object) =>
        new Promise<Record<string, unknown>>((resolve, reject) => {
          child.once('message', (m) => resolve(m as Record<string, unknown>));
          child.once('exit', (c) => reject(new Error(`child exited ${c}`)));
          child.send(msg);
        });
      const ready = (await ask({ cmd: 'start', name: uniq('gpu-child'), backend: 'cuda' })) as { md: number[]; addr: number; size: number };
      const a = await agent();
      const n = ready.size;
      const mine = gpu!.alloc(0, n);
      const ra = await a.registerMemory([toMemoryRegion(mine)]);
      const peer = await a.loadRemoteMetadata(Uint8Array.from(ready.md));
      await ask({ cmd: 'load', md: [...(await a.getLocalMetadata())] });
      const r = await a.makeTransfer({
        op: 'READ',
        local: await a.prepDescList(null, 'VRAM', [{ addr: ra.regions[0]!.addr, length: n }]),
        remote: await a.prepDescList(peer, 'VRAM', [{ addr: ready.addr, length: n }]),
      });
      await a.post(r);
      expect(await a.wait(r)).toBe('done');
      expect(a.deviceStats.ipcTransfers).toBe(1);
      const back = new Uint8Array(n);
      gpu!.copy(0, 'd2h', back, mine.address, n);
      expect(Buffer.compare(back, pattern(n, 7))).toBe(0);
    } finally {
      child.kill();
    }
  });

  it('moves device regions over TCP with staging against an agent in another process (another host id)', async () => {
    const child = await devicePeer();
    try {
      const ask = (msg: object) =>
        new Promise<Record<string, unknown>>((resolve, reject) => {
          child.once('message', (m) => resolve(m as Record<string, unknown>));
          child.once('exit', (c) => reject(new Error(`child exited ${c}`)));
          child.send(msg);
        });
      const ready = (await ask({ cmd: 'start', name: uniq('child') })) as { md: number[]; addr: number; kind: string; size: number; device: string };
      expect(ready.kind).toBe('VRAM');
      const a = await agent({ chunkBytes: 128 * 1024 });
      const n = ready.size;
      const mine = dm.alloc(0, n);
      const ra = await a.registerMemory([toMemoryRegion(mine)]);
      const peer = await a.loadRemoteMetadata(Uint8Array.from(ready.md));
      expect(decodeEmbeddedMetadata(Uint8Array.from(ready.md)).hostId).not.toBe(dm.hostId);
      await ask({ cmd: 'load', md: [...(await a.getLocalMetadata())] });
      const local = await a.prepDescList(null, 'VRAM', [{ addr: ra.regions[0]!.addr, length: n }]);
      const remote = await a.prepDescList(peer, 'VRAM', [{ addr: ready.addr, length: n }]);
      const r = await a.makeTransfer({ op: 'READ', local, remote });
      await a.post(r);
      expect(await a.wait(r)).toBe('done');
      expect(Buffer.compare(deviceBytes(dm, mine.address, n), pattern(n, 7))).toBe(0);
      dm.copy(0, 'h2d', mine.address, pattern(n, 8), n);
      const w = await a.makeTransfer({ op: 'WRITE', local, remote, notif: new TextEncoder().encode('written') });
      await a.post(w);
      expect(await a.wait(w)).toBe('done');
      const check = (await ask({ cmd: 'check', seed: 8, notif: 'written', device: ready.device })) as { notif: boolean; same: boolean; stats: { ipcTransfers: number; stagedFrames: number } };
      expect(check).toMatchObject({ notif: true, same: true });
      expect(check.stats.stagedFrames).toBeGreaterThan(0);
      expect(a.deviceStats.ipcTransfers).toBe(0);
    } finally {
      child.kill();
    }
  });
});

describe('NIXL and Mooncake agents: device regions (fake libraries)', () => {
  const native = createRequire(import.meta.url)('@kvconnect/native') as { addon: { transfer?: unknown; mooncake?: unknown } | null };
  const FAKE_NIXL = fileURLToPath(new URL('../../../native/build/test/libfake_nixl_capi.so', import.meta.url));
  const FAKE_MC = fileURLToPath(new URL('../../../native/build/test/libfake_transfer_engine.so', import.meta.url));
  const noNixl = !native.addon?.transfer || !existsSync(FAKE_NIXL) ? 'the addon or libfake_nixl_capi.so is not built' : null;
  const noMc = !native.addon?.mooncake || !existsSync(FAKE_MC) ? 'the addon or libfake_transfer_engine.so is not built' : null;
  if (noNixl) console.log(`NIXL device-region test skipped: ${noNixl}`);
  if (noMc) console.log(`Mooncake device-region test skipped: ${noMc}`);
  const dm = emulatedDeviceMemory();

  it.skipIf(!!noNixl)('NIXL: a device region registers as VRAM_SEG with its device id (the fake checks segment type and device)', async () => {
    const a = await NixlAgent.create({ name: uniq('na'), library: FAKE_NIXL });
    const b = await NixlAgent.create({ name: uniq('nb'), library: FAKE_NIXL });
    try {
      const region = { ...dm.alloc(2, 1 << 16) }; // only registered and advertised: the fake never copies it
      const reg = await b.registerMemory([toMemoryRegion(region)]);
      expect(reg.regions[0]).toEqual({ addr: Number(region.address), length: 1 << 16, kind: 'VRAM', deviceId: 2 });
      await a.loadRemoteMetadata(await b.getLocalMetadata());
      await a.prepDescList(b.name, 'VRAM', [{ addr: Number(region.address) + 4096, length: 4096, deviceId: 2 }]);
      await expect(a.prepDescList(b.name, 'VRAM', [{ addr: Number(region.address), length: 4096, deviceId: 0 }])).rejects.toSatisfy((e) => isTransferError(e, 'invalid'));
      await expect(a.prepDescList(b.name, 'DRAM', [{ addr: Number(region.address), length: 4096, deviceId: 2 }])).rejects.toSatisfy((e) => isTransferError(e, 'invalid'));
    } finally {
      await a.close();
      await b.close();
    }
  });

  it.skipIf(!!noMc)('Mooncake: a device region registers with location cuda:N (recorded by the fake), host memory with *', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'kvc-mc-'));
    const log = join(dir, 'register.log');
    const before = process.env.FAKE_MOONCAKE_REGISTER_LOG;
    process.env.FAKE_MOONCAKE_REGISTER_LOG = log;
    const a = await MooncakeAgent.create({ name: uniq('ma'), library: FAKE_MC });
    try {
      const region = dm.alloc(3, 1 << 16);
      const host = new Uint8Array(4096);
      const reg = await a.registerMemory([toMemoryRegion(region), { bytes: host }]);
      expect(reg.regions[0]).toMatchObject({ kind: 'VRAM', deviceId: 3, addr: Number(region.address) });
      const lines = readFileSync(log, 'utf8').trim().split('\n').map((l) => l.split(' '));
      expect(lines).toContainEqual([region.address.toString(16), String(1 << 16), 'cuda:3']);
      expect(lines).toContainEqual([reg.regions[1]!.addr.toString(16), '4096', '*']);
    } finally {
      if (before === undefined) delete process.env.FAKE_MOONCAKE_REGISTER_LOG;
      else process.env.FAKE_MOONCAKE_REGISTER_LOG = before;
      await a.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('waiting for many async copies', () => {
  it('one poller per stream: N copies settle with about N completion queries, not N per tick', async () => {
    const dm = new EmulatedDeviceMemory();
    const r = dm.alloc(0, 64 * 1024);
    const host = dm.allocHost(64 * 1024);
    const copies = Array.from({ length: 500 }, (_, i) => dm.copyAsync(0, 'h2d', r.address + BigInt(i * 32), host.subarray(i * 32), 32));
    const before = dm.settlePolls;
    await Promise.all(copies.map((c) => c.settled()));
    // Each copy queried once when done, plus the queries of ticks that found the oldest still
    // running (the emulated queue drains one event-loop turn after the enqueue). A poller per copy
    // queried every copy at least twice (once at once, once after the drain).
    expect(dm.settlePolls - before).toBeLessThanOrEqual(500 + 4);
    expect(copies.every((c) => c.done())).toBe(true);
  });
});
