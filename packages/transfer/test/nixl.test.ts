/**
 * The NIXL agent: the conformance suite over the fake C API library (always; it is built with
 * the addon as native/build/test/libfake_nixl_capi.so), over real NIXL when NIXL_PREFIX is set,
 * and the loading and marshalling details.
 */
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';
import { afterEach, describe, expect, it } from 'vitest';
import { isTransferError, loadNixlLibrary, NixlAgent, nixlLibraryCandidates, type TransferAgent } from '../src/index.js';
import { collectNotifs, defineConformance } from './conformance.js';
import { pattern } from './patterns.js';

const FAKE = fileURLToPath(new URL('../../../native/build/test/libfake_nixl_capi.so', import.meta.url));
const native = createRequire(import.meta.url)('@kvconnect/native') as { addon: { transfer?: unknown } | null; loadError: Error | null };
const fakeMissing = !native.addon?.transfer
  ? `the native addon with transfer bindings is not built (${native.loadError?.message ?? 'no transfer bindings'}): cd native && node scripts/install.cjs`
  : !existsSync(FAKE)
    ? `${FAKE} is not built: cd native && node scripts/install.cjs`
    : null;
/** Appended to the title of a test that is skipped for want of the fake library. */
const skipNote = fakeMissing ? ` (skipped: ${fakeMissing})` : '';

let seq = 0;
const uniq = (p: string) => `${p}-${process.pid}-${++seq}`;

async function nixlPair(library: string | undefined, stalled: boolean, params: Record<string, string> = {}) {
  const a = await NixlAgent.create({ name: uniq('na'), library, backendParams: stalled ? { ...params, fake_xfer_delay_us: '60000000' } : params });
  const b = await NixlAgent.create({ name: uniq('nb'), library, backendParams: params });
  await a.loadRemoteMetadata(await b.getLocalMetadata());
  await b.loadRemoteMetadata(await a.getLocalMetadata());
  return { a, b };
}

if (!fakeMissing) {
  defineConformance({
    label: 'nixl over the fake libnixl_capi',
    canStall: true,
    pair: ({ stalled }) => nixlPair(FAKE, stalled),
  });
} else {
  describe(`TransferAgent conformance: nixl over the fake libnixl_capi`, () => {
    it.skip(`runs over the fake library${skipNote}`, () => {});
  });
}

const realPrefix = process.env.NIXL_PREFIX;
if (realPrefix) {
  // Real NIXL, UCX over TCP / shared memory on this host (set UCX_TLS as needed).
  const params = process.env.KVC_NIXL_BACKEND_PARAMS ? (JSON.parse(process.env.KVC_NIXL_BACKEND_PARAMS) as Record<string, string>) : {};
  defineConformance({ label: `nixl (real, NIXL_PREFIX=${realPrefix})`, canStall: false, refusesAfterDeregistration: false, pair: () => nixlPair(undefined, false, params) });
} else {
  describe('TransferAgent conformance: nixl (real): skipped because NIXL_PREFIX is not set', () => {
    it.skip('runs when NIXL_PREFIX points at a NIXL install (skipped: NIXL_PREFIX is not set)', () => {});
  });
}

describe('NIXL library loading', () => {
  it('lists the candidate paths in order', () => {
    const arch = process.arch === 'arm64' ? 'aarch64' : 'x86_64';
    expect(nixlLibraryCandidates({ NIXL_LIBRARY: '/x/libfake.so', NIXL_PREFIX: '/opt/n/' })).toEqual([
      '/x/libfake.so',
      '/opt/n/lib/libnixl_capi.so',
      `/opt/n/lib/${arch}-linux-gnu/libnixl_capi.so`,
      '/opt/n/lib64/libnixl_capi.so',
      'libnixl_capi.so',
    ]);
    expect(nixlLibraryCandidates({})).toEqual([
      'libnixl_capi.so',
      '/opt/nvidia/nvda_nixl/lib/libnixl_capi.so',
      `/opt/nvidia/nvda_nixl/lib/${arch}-linux-gnu/libnixl_capi.so`,
      '/opt/nvidia/nvda_nixl/lib64/libnixl_capi.so',
    ]);
  });

  it.skipIf(!!fakeMissing || !!realPrefix)(`fails with "NIXL not available:" listing every path tried${realPrefix ? ` (skipped: NIXL_PREFIX points at a real library)` : skipNote}`, async () => {
    let err: unknown;
    try {
      loadNixlLibrary({ env: { NIXL_PREFIX: '/nonexistent/nixl' } });
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(Error);
    const m = (err as Error).message;
    expect(m.startsWith('NIXL not available:')).toBe(true);
    for (const p of nixlLibraryCandidates({ NIXL_PREFIX: '/nonexistent/nixl' })) expect(m).toContain(p);
    await expect(NixlAgent.create({ name: 'x', library: '/nonexistent/libnixl_capi.so' })).rejects.toThrow(/^NIXL not available: .*\/nonexistent\/libnixl_capi\.so/);
  });

  it.skipIf(!!fakeMissing)(`refuses a library that lacks the C API, naming the missing symbols${skipNote}`, () => {
    const libm = ['/lib/x86_64-linux-gnu/libm.so.6', '/lib/aarch64-linux-gnu/libm.so.6', '/usr/lib64/libm.so.6'].find((p) => existsSync(p)) ?? 'libm.so.6';
    expect(() => loadNixlLibrary({ library: libm })).toThrow(/NIXL not available: .*missing symbols: nixl_capi_create_agent/);
  });

  it.skipIf(!!fakeMissing)(`loads through NIXL_LIBRARY${skipNote}`, () => {
    expect(loadNixlLibrary({ env: { NIXL_LIBRARY: FAKE } })).toBe(FAKE);
  });
});

describe.skipIf(!!fakeMissing)(`NIXL agent marshalling (fake library)${skipNote}`, () => {
  const open: TransferAgent[] = [];
  afterEach(async () => {
    await Promise.all(open.splice(0).map((a) => a.close()));
  });

  it('passes memory kinds, device ids and raw addresses through, and names its library', async () => {
    const { a, b } = await nixlPair(FAKE, false);
    open.push(a, b);
    expect(a.library).toBe(FAKE);
    expect(a.capabilities.memoryKinds).toEqual(['DRAM', 'VRAM']);
    const host = new Uint8Array(4096);
    // A "VRAM" range: registered and advertised, never touched by this test.
    const reg = await b.registerMemory([{ bytes: host }, { addr: 0x7f0000000000, length: 1 << 20, kind: 'VRAM', deviceId: 3 }]);
    expect(reg.regions[1]).toEqual({ addr: 0x7f0000000000, length: 1 << 20, kind: 'VRAM', deviceId: 3 });
    await a.loadRemoteMetadata(await b.getLocalMetadata());
    // The fake checks kind and device id: a VRAM list on device 3 is fine, device 2 or DRAM kind is not.
    await a.prepDescList(b.name, 'VRAM', [{ addr: 0x7f0000000000 + 4096, length: 4096, deviceId: 3 }]);
    await expect(a.prepDescList(b.name, 'VRAM', [{ addr: 0x7f0000000000, length: 4096, deviceId: 2 }])).rejects.toSatisfy((e) => isTransferError(e, 'invalid'));
    await expect(a.prepDescList(b.name, 'DRAM', [{ addr: 0x7f0000000000, length: 4096 }])).rejects.toSatisfy((e) => isTransferError(e, 'invalid'));
    await expect(a.prepDescList(b.name, 'VRAM', [{ addr: reg.regions[0]!.addr, length: 16 }])).rejects.toSatisfy((e) => isTransferError(e, 'invalid'));
    await b.deregisterMemory(reg);
    await expect(b.deregisterMemory(reg)).rejects.toSatisfy((e) => isTransferError(e, 'not-found'));
  });

  it('registers the address of the view (byte offsets of Buffers and subarrays are kept)', async () => {
    const { a, b } = await nixlPair(FAKE, false);
    open.push(a, b);
    const big = pattern(10_000, 31);
    const view = big.subarray(1234, 1234 + 100);
    const dst = new Uint8Array(100);
    const ra = await a.registerMemory([{ bytes: dst }]);
    const rb = await b.registerMemory([{ bytes: view }]);
    await a.loadRemoteMetadata(await b.getLocalMetadata());
    const req = await a.makeTransfer({
      op: 'READ',
      local: await a.prepDescList(null, 'DRAM', [{ addr: ra.regions[0]!.addr, length: 100 }]),
      remote: await a.prepDescList(b.name, 'DRAM', [{ addr: rb.regions[0]!.addr, length: 100 }]),
    });
    await a.post(req);
    expect(await a.wait(req)).toBe('done');
    expect([...dst]).toEqual([...view]);
  });

  it('takes each notif once even though the C API appends to its map', async () => {
    const { a, b } = await nixlPair(FAKE, false);
    open.push(a, b);
    for (let i = 0; i < 5; i++) await a.sendNotif(b.name, new Uint8Array([i]));
    const got = await collectNotifs(b, a.name, 5);
    await new Promise((r) => setTimeout(r, 30)); // many poll rounds of the agent thread
    const more = await b.pollNotifs();
    expect(got.map((g) => g[0])).toEqual([0, 1, 2, 3, 4]);
    expect(more.size).toBe(0);
  });

  it('rejects calls after close and closes idempotently', async () => {
    const { a, b } = await nixlPair(FAKE, false);
    await a.close();
    await a.close();
    await b.close();
    await expect(a.getLocalMetadata()).rejects.toSatisfy((e) => isTransferError(e, 'canceled'));
  });
});
