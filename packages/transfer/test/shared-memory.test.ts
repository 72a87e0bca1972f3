/**
 * The embedded agent's same-host data plane (shared-memory.ts, embedded.ts "Same-host host
 * memory"): host memory of a SharedHostArena is advertised in the metadata and a peer on the same
 * host copies it directly after the handshake; bounds and grants hold; everything else falls back
 * to the TCP path. Skipped (with the reason) where the addon has no shm bindings.
 */
import { closeSync, fstatSync, ftruncateSync, openSync } from 'node:fs';
import { Packr, Unpackr } from 'msgpackr';
import { afterEach, describe, expect, it } from 'vitest';
import { decodeEmbeddedMetadata, EmbeddedAgent, isTransferError, lookupShared, SharedHostArena, type TransferAgent } from '../src/index.js';
import { collectNotifs } from './conformance.js';
import { pattern } from './patterns.js';
import { forkFixture } from './fixtures/fork-fixture.js';

const probe = new SharedHostArena();
const skip = probe.shared ? null : `no shared mappings here: ${probe.reason}`;
const note = skip ? ` (skipped: ${skip})` : '';

const packr = new Packr({ useRecords: false, variableMapSize: true });
const unpackr = new Unpackr({ useRecords: false, int64AsType: 'number' });
/** Rewrites the shared-memory field (index 8) of an embedded agent's metadata. */
function tamper(md: Uint8Array, edit: (f: [string, number, unknown[][]]) => void): Uint8Array {
  const v = unpackr.unpack(md) as unknown[];
  edit(v[8] as [string, number, unknown[][]]);
  return new Uint8Array(packr.pack(v));
}

let seq = 0;
const uniq = (p: string) => `${p}-${process.pid}-${++seq}`;
const open: TransferAgent[] = [];
afterEach(async () => {
  await Promise.all(open.splice(0).map((a) => a.close().catch(() => {})));
});

async function agents(opts: { aShared?: boolean } = {}) {
  const a = await EmbeddedAgent.create({ name: uniq('sa'), sharedMemory: opts.aShared });
  const b = await EmbeddedAgent.create({ name: uniq('sb') });
  open.push(a, b);
  return { a, b };
}

/** b's memory from an arena (2 MiB, pattern 31); a's from the heap (pattern 32). */
async function setup(opts: { aShared?: boolean; bMd?: (md: Uint8Array) => Uint8Array } = {}) {
  const { a, b } = await agents(opts);
  const arena = new SharedHostArena({ chunkBytes: 4 << 20 });
  const mb = arena.alloc(2 << 20);
  mb.set(pattern(2 << 20, 31));
  const ma = pattern(2 << 20, 32);
  const rb = await b.registerMemory([{ bytes: mb }]);
  const ra = await a.registerMemory([{ bytes: ma }]);
  const md = await b.getLocalMetadata();
  await a.loadRemoteMetadata(opts.bMd ? opts.bMd(md) : md);
  await b.loadRemoteMetadata(await a.getLocalMetadata());
  const la = ra.regions[0]!.addr;
  const lb = rb.regions[0]!.addr;
  // Descriptors of 256 KiB and of odd sizes, at odd offsets.
  const sizes = [256 << 10, 1 << 20, 4093, 1, 65537];
  let off = 0;
  const descs = sizes.map((len) => {
    const d = { off, len };
    off += len + 7;
    return d;
  });
  const local = await a.prepDescList(null, 'DRAM', descs.map((d) => ({ addr: la + d.off, length: d.len })));
  const remote = await a.prepDescList(b.name, 'DRAM', descs.map((d) => ({ addr: lb + d.off, length: d.len })));
  return { a, b, ma, mb, rb, local, remote, descs };
}

describe('shared host memory', () => {
  it.skipIf(!!skip)(`SharedHostArena hands out page-aligned slices of shared mappings; the heap arena does not${note}`, () => {
    const arena = new SharedHostArena({ chunkBytes: 1 << 20 });
    const x = arena.alloc(1000);
    const y = arena.alloc(5000);
    const big = arena.alloc(2 << 20);
    const ix = lookupShared(x)!;
    const iy = lookupShared(y)!;
    expect(ix.name).toMatch(/^kvc-[0-9a-f]{32}$/);
    expect(iy.name).toBe(ix.name); // same mapping
    expect(iy.offset - ix.offset).toBe(4096); // page-aligned
    expect(lookupShared(big)!.name).not.toBe(ix.name); // its own mapping
    expect(x.every((b) => b === 0) && y.every((b) => b === 0)).toBe(true);
    expect(lookupShared(new Uint8Array(100))).toBeNull();
    expect(lookupShared(new SharedHostArena({ shared: false }).alloc(100))).toBeNull();
  });

  it.skipIf(!!skip)(`seals each mapping at its size: nobody can truncate it under a peer's mapping${note}`, () => {
    const x = new SharedHostArena().alloc(8192);
    const info = lookupShared(x)!;
    const fd = openSync(`/proc/${process.pid}/fd/${info.fd}`, 'r+');
    try {
      expect(() => ftruncateSync(fd, 0)).toThrow(/EPERM/);
      expect(fstatSync(fd).size).toBe(info.size);
    } finally {
      closeSync(fd);
    }
  });

  for (const op of ['READ', 'WRITE'] as const) {
    it.skipIf(!!skip)(`${op}s through the peer's shared mapping (no TCP data frame), the bytes match and the notif follows${note}`, async () => {
      const { a, b, ma, mb, local, remote, descs } = await setup();
      const req = await a.makeTransfer({ op, local, remote, notif: new TextEncoder().encode(`shm-${op}`) });
      const st = await a.post(req);
      expect(['in-progress', 'done']).toContain(st); // the first post waits for the handshake
      expect(await a.wait(req)).toBe('done');
      for (const d of descs) {
        const [dst, src] = op === 'READ' ? [ma, mb] : [mb, ma];
        expect(Buffer.compare(dst.subarray(d.off, d.off + d.len), src.subarray(d.off, d.off + d.len))).toBe(0);
      }
      // Bytes outside the descriptors are untouched.
      const target = op === 'READ' ? ma : mb;
      const orig = pattern(2 << 20, op === 'READ' ? 32 : 31);
      const gap = descs[0]!.off + descs[0]!.len;
      expect(Buffer.compare(target.subarray(gap, gap + 7), orig.subarray(gap, gap + 7))).toBe(0);
      expect(a.shmStats.transfers).toBe(1);
      expect(a.shmStats.bytes).toBe(req.bytes);
      const got = await collectNotifs(b, a.name, 1);
      expect(new TextDecoder().decode(got[0])).toBe(`shm-${op}`);
      // A second post goes straight through (the handshake is done): done at once.
      expect(await a.post(req)).toBe('done');
      expect(a.shmStats.transfers).toBe(2);
    });
  }

  it.skipIf(!!skip)(`never copies outside the granted region: descriptors are checked, a lying mapping is refused${note}`, async () => {
    const { a, b, rb } = await setup();
    const lb = rb.regions[0]!.addr;
    await expect(a.prepDescList(b.name, 'DRAM', [{ addr: lb + (2 << 20) - 10, length: 20 }])).rejects.toSatisfy((e) => isTransferError(e, 'invalid'));
    // Metadata whose region runs past its mapping does not decode.
    const md = await b.getLocalMetadata();
    const past = tamper(md, (f) => {
      f[2][0]![1] = Number(f[2][0]![4]); // length = the whole mapping: offset + length > size
    });
    expect(() => decodeEmbeddedMetadata(past)).toThrow(/not inside its mapping|not a registered region/);
    const badName = tamper(md, (f) => {
      f[2][0]![2] = '../etc/passwd';
    });
    expect(() => decodeEmbeddedMetadata(badName)).toThrow(/bad mapping name/);
  });

  it.skipIf(!!skip)(`falls back to TCP when the advertised descriptor is not that memfd, and stays correct${note}`, async () => {
    // The metadata names fd 0 (not the memfd): the addon refuses to map it, the transfer uses TCP.
    const { a, ma, mb, local, remote, descs } = await setup({ bMd: (md) => tamper(md, (f) => void (f[2][0]![3] = 0)) });
    const req = await a.makeTransfer({ op: 'READ', local, remote });
    await a.post(req);
    expect(await a.wait(req)).toBe('done');
    expect(a.shmStats.transfers).toBe(0);
    for (const d of descs) expect(Buffer.compare(ma.subarray(d.off, d.off + d.len), mb.subarray(d.off, d.off + d.len))).toBe(0);
  });

  it.skipIf(!!skip)(`uses TCP for a peer on another host (host key), and with sharedMemory: false${note}`, async () => {
    const other = await setup({ bMd: (md) => tamper(md, (f) => void (f[0] = 'another-host')) });
    const r1 = await other.a.makeTransfer({ op: 'WRITE', local: other.local, remote: other.remote });
    await other.a.post(r1);
    expect(await other.a.wait(r1)).toBe('done');
    expect(other.a.shmStats.transfers).toBe(0);
    const off = await setup({ aShared: false });
    const r2 = await off.a.makeTransfer({ op: 'WRITE', local: off.local, remote: off.remote });
    await off.a.post(r2);
    expect(await off.a.wait(r2)).toBe('done');
    expect(off.a.shmStats.transfers).toBe(0);
    for (const d of off.descs) expect(Buffer.compare(off.mb.subarray(d.off, d.off + d.len), off.ma.subarray(d.off, d.off + d.len))).toBe(0);
  });

  it.skipIf(!!skip)(`refuses a transfer into memory the target deregistered (the grant word), target unchanged${note}`, async () => {
    const { a, b, mb, rb, local, remote } = await setup();
    const warm = await a.makeTransfer({ op: 'READ', local, remote });
    await a.post(warm);
    expect(await a.wait(warm)).toBe('done');
    const before = mb.slice();
    await b.deregisterMemory(rb);
    const req = await a.makeTransfer({ op: 'WRITE', local, remote });
    await a.post(req);
    expect(await a.wait(req)).toBe('invalid');
    expect(req.error?.message).toMatch(/no longer grants/);
    expect(Buffer.compare(mb, before)).toBe(0);
  });

  it.skipIf(!!skip)(`moves READ and WRITE through the shared mapping of an agent in another process${note}`, async () => {
    const { child, ask } = await forkFixture('shm-peer-process');
    try {
      const info = await ask({ cmd: 'start', name: uniq('child') });
      expect(info.shared).toBe(true);
      const size = info.size as number;
      const a = await EmbeddedAgent.create({ name: uniq('parent') });
      open.push(a);
      const mine = new Uint8Array(size);
      const ra = await a.registerMemory([{ bytes: mine }]);
      const peer = await a.loadRemoteMetadata(Uint8Array.from(info.md as number[]));
      expect(await ask({ cmd: 'load', md: [...(await a.getLocalMetadata())] })).toEqual({ ok: true });
      const local = await a.prepDescList(null, 'DRAM', [{ addr: ra.regions[0]!.addr, length: size }]);
      const remote = await a.prepDescList(peer, 'DRAM', [{ addr: info.addr as number, length: size }]);
      const r = await a.makeTransfer({ op: 'READ', local, remote });
      await a.post(r);
      expect(await a.wait(r)).toBe('done');
      expect(Buffer.compare(mine, pattern(size, 77))).toBe(0);
      mine.set(pattern(size, 78));
      const w = await a.makeTransfer({ op: 'WRITE', local, remote });
      await a.post(w);
      expect(await a.wait(w)).toBe('done');
      expect(a.shmStats.transfers).toBe(2);
      expect(await ask({ cmd: 'check', seed: 78 })).toEqual({ same: true });
      expect(await ask({ cmd: 'deregister' })).toEqual({ ok: true });
      mine.set(pattern(size, 79));
      await a.post(w);
      expect(await a.wait(w)).toBe('invalid');
      expect(await ask({ cmd: 'check', seed: 78 })).toEqual({ same: true });
    } finally {
      child.kill();
    }
  });
});
