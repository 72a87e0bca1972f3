/**
 * The Mooncake agent: the conformance suite over the fake Transfer Engine library (always; it is
 * built with the addon as native/build/test/libfake_transfer_engine.so), over the real
 * libtransfer_engine.so when MOONCAKE_PREFIX is set, and the loading, metadata and bounds details.
 */
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';
import { afterEach, describe, expect, it } from 'vitest';
import {
  decodeMooncakeMetadata,
  encodeMooncakeMetadata,
  isTransferError,
  loadMooncakeLibrary,
  MooncakeAgent,
  mooncakeLibraryCandidates,
  type TransferAgent,
} from '../src/index.js';
import { collectNotifs, defineConformance } from './conformance.js';
import { pattern } from './patterns.js';

const FAKE = fileURLToPath(new URL('../../../native/build/test/libfake_transfer_engine.so', import.meta.url));
const native = createRequire(import.meta.url)('@kvconnect/native') as { addon: { mooncake?: unknown } | null; loadError: Error | null };
const fakeMissing = !native.addon?.mooncake
  ? `the native addon with Mooncake bindings is not built (${native.loadError?.message ?? 'no mooncake bindings'}): cd native && node scripts/install.cjs`
  : !existsSync(FAKE)
    ? `${FAKE} is not built: cd native && node scripts/install.cjs`
    : null;
/** Appended to the title of a test that is skipped for want of the fake library. */
const skipNote = fakeMissing ? ` (skipped: ${fakeMissing})` : '';

let seq = 0;
const uniq = (p: string) => `${p}-${process.pid}-${++seq}`;

async function mcPair(library: string | undefined, stalled: boolean) {
  const a = await MooncakeAgent.create({ name: uniq('ma'), library, metadata: stalled ? 'P2PHANDSHAKE;fake_delay_us=60000000' : undefined });
  const b = await MooncakeAgent.create({ name: uniq('mb'), library });
  await a.loadRemoteMetadata(await b.getLocalMetadata());
  await b.loadRemoteMetadata(await a.getLocalMetadata());
  return { a, b };
}

if (!fakeMissing) {
  defineConformance({
    label: 'mooncake over the fake libtransfer_engine',
    canStall: true,
    pair: ({ stalled }) => mcPair(FAKE, stalled),
  });
} else {
  describe(`TransferAgent conformance: mooncake over the fake libtransfer_engine`, () => {
    it.skip(`runs over the fake library${skipNote}`, () => {});
  });
}

const realPrefix = process.env.MOONCAKE_PREFIX;
if (realPrefix) {
  // The real Transfer Engine, P2PHANDSHAKE on 127.0.0.1 (TCP without RDMA hardware; MC_FORCE_TCP=1 forces it).
  defineConformance({ label: `mooncake (real, MOONCAKE_PREFIX=${realPrefix})`, canStall: false, pair: () => mcPair(undefined, false) });
} else {
  describe('TransferAgent conformance: mooncake (real): skipped because MOONCAKE_PREFIX is not set', () => {
    it.skip('runs when MOONCAKE_PREFIX points at a Mooncake Transfer Engine install (skipped: MOONCAKE_PREFIX is not set)', () => {});
  });
}

describe('Mooncake library loading', () => {
  it('lists the candidate paths in order', () => {
    const arch = process.arch === 'arm64' ? 'aarch64' : 'x86_64';
    expect(mooncakeLibraryCandidates({ MOONCAKE_LIBRARY: '/x/libfake.so', MOONCAKE_PREFIX: '/opt/mc/' })).toEqual([
      '/x/libfake.so',
      '/opt/mc/lib/libtransfer_engine.so',
      `/opt/mc/lib/${arch}-linux-gnu/libtransfer_engine.so`,
      '/opt/mc/lib64/libtransfer_engine.so',
      'libtransfer_engine.so',
    ]);
    expect(mooncakeLibraryCandidates({})).toEqual(['libtransfer_engine.so']);
  });

  it.skipIf(!!fakeMissing || !!realPrefix)(`fails with "Mooncake Transfer Engine not available:" listing every path tried${realPrefix ? ` (skipped: MOONCAKE_PREFIX points at a real library)` : skipNote}`, async () => {
    let err: unknown;
    try {
      loadMooncakeLibrary({ env: { MOONCAKE_PREFIX: '/nonexistent/mooncake' } });
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(Error);
    const m = (err as Error).message;
    expect(m.startsWith('Mooncake Transfer Engine not available:')).toBe(true);
    for (const p of mooncakeLibraryCandidates({ MOONCAKE_PREFIX: '/nonexistent/mooncake' })) expect(m).toContain(p);
    await expect(MooncakeAgent.create({ name: 'x', library: '/nonexistent/libtransfer_engine.so' })).rejects.toThrow(
      /^Mooncake Transfer Engine not available: .*\/nonexistent\/libtransfer_engine\.so/,
    );
  });

  it.skipIf(!!fakeMissing)(`refuses a library that lacks the C API, naming the missing symbols${skipNote}`, () => {
    const libm = ['/lib/x86_64-linux-gnu/libm.so.6', '/lib/aarch64-linux-gnu/libm.so.6', '/usr/lib64/libm.so.6'].find((p) => existsSync(p)) ?? 'libm.so.6';
    expect(() => loadMooncakeLibrary({ library: libm })).toThrow(/Mooncake Transfer Engine not available: .*missing symbols: createTransferEngine/);
  });

  it.skipIf(!!fakeMissing)(`loads through MOONCAKE_LIBRARY${skipNote}`, () => {
    expect(loadMooncakeLibrary({ env: { MOONCAKE_LIBRARY: FAKE } })).toBe(FAKE);
  });

  it.skipIf(!!fakeMissing)(`reports an engine that does not start as a backend error${skipNote}`, async () => {
    await expect(MooncakeAgent.create({ name: 'x', library: FAKE, metadata: 'etcd://nowhere:2379' })).rejects.toSatisfy(
      (e) => isTransferError(e, 'backend') && /createTransferEngine/.test((e as Error).message),
    );
  });
});

describe('Mooncake metadata', () => {
  it('round-trips and refuses malformed blobs', () => {
    const md = { name: 'p0', segment: '10.0.0.1:16202', regions: [{ addr: 0x7f0000001000, length: 4096, kind: 'DRAM' as const, deviceId: 0 }, { addr: 0x7e0000000000, length: 1 << 20, kind: 'VRAM' as const, deviceId: 2 }] };
    expect(decodeMooncakeMetadata(encodeMooncakeMetadata(md))).toEqual(md);
    const bad = [new Uint8Array(0), new TextEncoder().encode('{"v":1}'), new TextEncoder().encode('KVCMOONCAKE1\n{"v":1,"name":"a","segment":"s","regions":[[1,-5,"DRAM",0]]}'), new Uint8Array([0xff, 0xfe])];
    for (const b of bad) expect(() => decodeMooncakeMetadata(b)).toThrow(expect.objectContaining({ kind: 'invalid' }));
  });
});

describe.skipIf(!!fakeMissing)(`Mooncake agent details (fake library)${skipNote}`, () => {
  const open: TransferAgent[] = [];
  afterEach(async () => {
    await Promise.all(open.splice(0).map((a) => a.close()));
  });

  it('advertises its segment name and regions, and names its library', async () => {
    const { a, b } = await mcPair(FAKE, false);
    open.push(a, b);
    expect(a.library).toBe(FAKE);
    expect(a.backend).toBe('mooncake');
    expect(a.segment).toMatch(/^127\.0\.0\.1:\d+$/);
    const buf = new Uint8Array(4096);
    const reg = await a.registerMemory([{ bytes: buf }]);
    const md = decodeMooncakeMetadata(await a.getLocalMetadata());
    expect(md).toEqual({ name: a.name, segment: a.segment, regions: [reg.regions[0]] });
    await a.deregisterMemory(reg);
    expect(decodeMooncakeMetadata(await a.getLocalMetadata()).regions).toEqual([]);
    await expect(a.deregisterMemory(reg)).rejects.toSatisfy((e) => isTransferError(e, 'not-found'));
  });

  it('refuses, before submitting, a request whose memory was deregistered locally or is no longer advertised', async () => {
    const { a, b } = await mcPair(FAKE, false);
    open.push(a, b);
    const la = pattern(4096, 1);
    const lb = new Uint8Array(4096);
    const ra = await a.registerMemory([{ bytes: la }]);
    const rb = await b.registerMemory([{ bytes: lb }]);
    await a.loadRemoteMetadata(await b.getLocalMetadata());
    const local = await a.prepDescList(null, 'DRAM', [{ addr: ra.regions[0]!.addr, length: 4096 }]);
    const remote = await a.prepDescList(b.name, 'DRAM', [{ addr: rb.regions[0]!.addr, length: 4096 }]);
    const req = await a.makeTransfer({ op: 'WRITE', local, remote });
    // The peer re-advertises without that region: refused at post with `invalid`.
    await b.deregisterMemory(rb);
    await a.loadRemoteMetadata(await b.getLocalMetadata());
    expect(await a.post(req)).toBe('invalid');
    expect(req.error).toSatisfy((e) => isTransferError(e, 'invalid'));
    expect(lb.every((x) => x === 0)).toBe(true);
    // Memory registered after the first load is usable once the metadata is reloaded (segment cache refreshed).
    const lb2 = new Uint8Array(4096);
    const rb2 = await b.registerMemory([{ bytes: lb2 }]);
    await a.loadRemoteMetadata(await b.getLocalMetadata());
    const req2 = await a.makeTransfer({ op: 'WRITE', local, remote: await a.prepDescList(b.name, 'DRAM', [{ addr: rb2.regions[0]!.addr, length: 4096 }]) });
    await a.post(req2);
    expect(await a.wait(req2)).toBe('done');
    expect(Buffer.compare(lb2, la)).toBe(0);
    // Local memory deregistered after the request was made.
    await a.deregisterMemory(ra);
    expect(await a.post(req2)).toBe('invalid');
    // An invalidated peer.
    await a.invalidateRemoteMetadata(b.name);
    expect(await a.post(req2)).toBe('not-found');
    await expect(a.prepDescList(b.name, 'DRAM', [{ addr: rb2.regions[0]!.addr, length: 1 }])).rejects.toSatisfy((e) => isTransferError(e, 'not-found'));
  });

  it('advertises VRAM regions with their device and checks kind and device', async () => {
    const { a, b } = await mcPair(FAKE, false);
    open.push(a, b);
    // VRAM: advertised with its device; a VRAM list must match kind and device.
    const reg = await b.registerMemory([{ addr: 0x7f0000000000, length: 1 << 20, kind: 'VRAM', deviceId: 3 }]);
    expect(reg.regions[0]).toEqual({ addr: 0x7f0000000000, length: 1 << 20, kind: 'VRAM', deviceId: 3 });
    await a.loadRemoteMetadata(await b.getLocalMetadata());
    await a.prepDescList(b.name, 'VRAM', [{ addr: 0x7f0000000000 + 4096, length: 4096, deviceId: 3 }]);
    await expect(a.prepDescList(b.name, 'VRAM', [{ addr: 0x7f0000000000, length: 4096, deviceId: 2 }])).rejects.toSatisfy((e) => isTransferError(e, 'invalid'));
    await expect(a.prepDescList(b.name, 'DRAM', [{ addr: 0x7f0000000000, length: 4096 }])).rejects.toSatisfy((e) => isTransferError(e, 'invalid'));
    await b.deregisterMemory(reg);
  });

  it('times out without blocking and keeps polling the batch so a late notif still goes out', async () => {
    const a = await MooncakeAgent.create({ name: uniq('slow'), library: FAKE, metadata: 'P2PHANDSHAKE;fake_delay_us=300000' });
    const b = await MooncakeAgent.create({ name: uniq('b'), library: FAKE });
    open.push(a, b);
    const la = pattern(1024, 2);
    const lb = new Uint8Array(1024);
    const ra = await a.registerMemory([{ bytes: la }]);
    const rb = await b.registerMemory([{ bytes: lb }]);
    await a.loadRemoteMetadata(await b.getLocalMetadata());
    const req = await a.makeTransfer({
      op: 'WRITE',
      local: await a.prepDescList(null, 'DRAM', [{ addr: ra.regions[0]!.addr, length: 1024 }]),
      remote: await a.prepDescList(b.name, 'DRAM', [{ addr: rb.regions[0]!.addr, length: 1024 }]),
      notif: new TextEncoder().encode('late'),
    });
    expect(await a.post(req, { timeoutMs: 50 })).toBe('in-progress');
    expect(await a.wait(req)).toBe('timeout');
    const got = await collectNotifs(b, a.name, 1, 5000);
    expect(new TextDecoder().decode(got[0])).toBe('late');
    expect(Buffer.compare(lb, la)).toBe(0);
    // A repost runs as a fresh batch.
    lb.fill(0);
    await a.post(req);
    expect(await a.wait(req)).toBe('done');
    expect(Buffer.compare(lb, la)).toBe(0);
  });

  it('fails loadRemoteMetadata for a segment nobody serves', async () => {
    const a = await MooncakeAgent.create({ name: uniq('a'), library: FAKE });
    open.push(a);
    const blob = encodeMooncakeMetadata({ name: 'ghost', segment: '127.0.0.1:1', regions: [] });
    await expect(a.loadRemoteMetadata(blob)).rejects.toSatisfy((e) => isTransferError(e, 'remote-disconnect'));
    await expect(a.prepDescList('ghost', 'DRAM', [{ addr: 4096, length: 1 }])).rejects.toSatisfy((e) => isTransferError(e, 'not-found'));
  });

  it('rejects calls after close and closes idempotently', async () => {
    const { a, b } = await mcPair(FAKE, false);
    await a.close();
    await a.close();
    await b.close();
    await expect(a.getLocalMetadata()).rejects.toSatisfy((e) => isTransferError(e, 'canceled'));
    expect((await a.pollNotifs()).size).toBe(0);
  });
});
