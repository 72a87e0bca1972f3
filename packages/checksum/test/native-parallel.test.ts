/**
 * The native kernel's instruction-set variants (generic / AVX2 / AVX-512, chosen at run time) and
 * its multi-threaded mode (`threads`, `sumRowsAsync`): every variant and thread count gives the
 * vectors' expected values (../shared/vectors, computed outside this repository), and the async
 * call checks its arguments like the sync one.
 */
import { createRequire } from 'node:module';
import { afterAll, describe, expect, it } from 'vitest';
import type { KvconnectNativeAddon } from '@kvconnect/native';
import { loadNativeBackend, nativeCpuIsa, nativeUnavailableReason } from '../src/backend-native.js';
import { runVectors } from '../src/conformance.js';
import { loadVectors } from './vectors.js';

const { addon } = createRequire(import.meta.url)('@kvconnect/native') as { addon: KvconnectNativeAddon | null };
const why = addon ? null : `the native addon did not load (${nativeUnavailableReason()})`;
const A = (): KvconnectNativeAddon => addon as KvconnectNativeAddon;
const ISAS = ['generic', 'avx2', 'avx512'] as const;

describe.skipIf(why !== null)(`native kernel variants and threads${why ? ` (skipped: ${why})` : ''}`, () => {
  afterAll(() => {
    A().setCpuIsa('auto');
  });
  const vectors = loadVectors();
  const sections = { attention: vectors.attention, state: vectors.state, stateLocal: vectors.stateLocal };

  for (const isa of ISAS) {
    for (const threads of [1, 2, 3, 4, 8]) {
      it(`${isa}, ${threads} thread(s): every checksum vector`, (ctx) => {
        if (!A().setCpuIsa(isa)) ctx.skip(`this CPU does not run ${isa}`);
        expect(nativeCpuIsa()).toBe(isa);
        const backend = loadNativeBackend({ threads })!;
        const results = runVectors(sections, [backend]);
        expect(results.length).toBe(2 * (sections.attention.length + sections.state.length + sections.stateLocal.length));
        expect(results.filter((r) => !r.ok).map((r) => `${r.title}: ${r.detail}`)).toEqual([]);
      });
    }
  }

  it('refuses unknown instruction sets and bad thread counts', () => {
    expect(A().setCpuIsa('sse9' as never)).toBe(false);
    expect(A().setCpuIsa('auto')).toBe(true);
    expect(['generic', 'avx2', 'avx512']).toContain(A().cpuIsa());
    for (const t of [0, 65, 1.5, Number.NaN]) expect(() => loadNativeBackend({ threads: t })).toThrow(RangeError);
    const e = new Uint8Array(0);
    const gs = new Uint32Array([0]);
    expect(() => A().sumRows(e, gs, [], new Uint32Array(0), new BigUint64Array(0), 0)).toThrow(/threads must be an integer in \[1, 64\]/);
    expect(() => A().sumRowsAsync(e, gs, [], new Uint32Array(0), new BigUint64Array(0), 99)).toThrow(RangeError);
    expect(() => A().sumRowsAsync(new Uint16Array(1) as never, gs, [], new Uint32Array(0), new BigUint64Array(0))).toThrow(TypeError);
  });

  it('sumRowsAsync gives the sync sums, and rejects a bad row without writing', async () => {
    // A STREAM entry (kvc_checksum.h): 64 bytes per block at offset 0, 16 blocks of a 1 KiB region.
    const entries = new Uint8Array(128);
    const dv = new DataView(entries.buffer);
    dv.setBigInt64(16, 64n, true); // block_stride
    dv.setUint32(84, 3, true); // kind STREAM
    dv.setUint32(96, 1, true); // outer_count
    dv.setUint32(108, 64, true); // byte_count
    dv.setUint32(120, 16, true); // num_blocks
    const region = new Uint8Array(1024);
    for (let i = 0; i < region.length; i++) region[i] = (i * 37 + 11) & 0xff;
    const rows = new Uint32Array(16 * 6);
    for (let b = 0; b < 16; b++) rows.set([0, b, 0, 0, b, 0], b * 6);
    const gs = new Uint32Array([0, 1]);
    const sync = new BigUint64Array(16);
    A().sumRows(entries, gs, [region], rows, sync);
    expect(sync.some((x) => x !== 0n)).toBe(true);
    for (const threads of [1, 4]) {
      const out = new BigUint64Array(16);
      await A().sumRowsAsync(entries, gs, [region], rows, out, threads);
      expect([...out]).toEqual([...sync]);
    }
    const bad = rows.slice();
    bad[15 * 6 + 1] = 16; // block id past num_blocks
    const out = new BigUint64Array(16).fill(7n);
    await expect(A().sumRowsAsync(entries, gs, [region], bad, out, 4)).rejects.toThrow(/rows\[15\].*block_id.*KVC_ERANGE/);
    expect([...out]).toEqual(new Array(16).fill(7n));
  });
});
