/**
 * The native kernel's row walk (checksum_kernel.inc row_sum_v: parts of whole pieces summed as one
 * row per token, the e2e benchmark's small-head shapes) against the TypeScript backend, the
 * independent reference: random small-head NHD and HND caches (kv-first, block-kv, separate; 1-8
 * heads of 4-64 elements, bf16 and float32, blocks of 1-32 tokens, kernel blocks), random block ids,
 * numTokens not a multiple of the block size, every instruction set this CPU runs, producer and
 * consumer. Any bit of difference fails.
 */
import { createRequire } from 'node:module';
import { afterAll, describe, expect, it } from 'vitest';
import type { KvconnectNativeAddon } from '@kvconnect/native';
import { BlockChecksummer } from '../src/compute.js';
import { loadNativeBackend, nativeUnavailableReason } from '../src/backend-native.js';
import { tsBackend } from '../src/backend-ts.js';
import { pagedAttentionBytes, pagedAttentionCache } from '../src/views.js';

const { addon } = createRequire(import.meta.url)('@kvconnect/native') as { addon: KvconnectNativeAddon | null };
const why = addon ? null : `the native addon did not load (${nativeUnavailableReason()})`;
const A = (): KvconnectNativeAddon => addon as KvconnectNativeAddon;

/** A small deterministic generator (xorshift32), so a failure names its seed. */
function rng(seed: number): (n: number) => number {
  let x = seed >>> 0 || 1;
  return (n: number) => {
    x ^= x << 13;
    x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5;
    x >>>= 0;
    return x % n;
  };
}

describe.skipIf(why !== null)(`native row walk vs the ts backend${why ? ` (skipped: ${why})` : ''}`, () => {
  afterAll(() => {
    A().setCpuIsa('auto');
  });
  const isas = (['generic', 'avx2', 'avx512'] as const).filter((i) => A().setCpuIsa(i));
  A().setCpuIsa('auto');
  const native = loadNativeBackend()!;

  for (const layout of ['NHD', 'HND'] as const) {
    it(`${layout}: random small-head geometries, every ISA (${isas.join(', ')}), bit-identical`, () => {
      let cases = 0;
      for (let seed = 1; seed <= 40; seed++) {
        const r = rng(seed * 7919 + (layout === 'NHD' ? 0 : 104729));
        const dtype = r(3) === 0 ? 'float32' : 'bfloat16';
        const blockSize = [1, 2, 3, 5, 8, 16, 32][r(7)];
        const kbChoices = [1, 2, 4, 8, 16, 32].filter((k) => k <= blockSize && blockSize % k === 0);
        const kernelBlockSize = r(3) === 0 ? kbChoices[r(kbChoices.length)] : blockSize;
        const numHeads = 1 + r(8);
        const headSize = [4, 8, 12, 16, 24, 32, 64][r(7)];
        const kvLayout = (['kv-first', 'block-kv', 'separate'] as const)[r(3)];
        const numBlocks = 40 + r(40);
        const layers = 1 + r(3);
        const sizes = { dtype, numBlocks, blockSize, numHeads, headSize, kvLayout } as const;
        const bytes = pagedAttentionBytes(sizes);
        const regions: Uint8Array[] = [];
        const caches = [];
        for (let l = 0; l < layers; l++) {
          const at = { region: regions.length };
          const k = new Uint8Array(bytes);
          crypto.getRandomValues(k.subarray(0, Math.min(k.length, 65536)));
          for (let o = 65536; o < k.length; o += 65536) crypto.getRandomValues(k.subarray(o, Math.min(k.length, o + 65536)));
          regions.push(k);
          let v;
          if (kvLayout === 'separate') {
            v = { region: regions.length };
            const vb = new Uint8Array(bytes);
            for (let o = 0; o < vb.length; o += 65536) crypto.getRandomValues(vb.subarray(o, Math.min(vb.length, o + 65536)));
            regions.push(vb);
          }
          caches.push(pagedAttentionCache({ name: `model.layers.${l}.self_attn.attn`, ...sizes, kernelBlockSize, layout, at, v }));
        }
        const nb = 1 + r(24);
        const ids = Array.from({ length: nb }, () => r(numBlocks));
        const numTokens = Math.max(1, nb * blockSize - (blockSize > 1 ? 1 + r(blockSize - 1) : 0));
        const start = r(3);
        const run = [{ group: 0, blockIds: ids, start, numTokens: numTokens + start * blockSize }];
        for (const role of ['producer', 'consumer'] as const) {
          const rank = { tpRank: 0, tpSize: 1, role };
          const want = new BlockChecksummer([{ groupId: 0, caches }], rank, regions, tsBackend).compute(run);
          for (const isa of isas) {
            A().setCpuIsa(isa);
            const got = new BlockChecksummer([{ groupId: 0, caches }], rank, regions, native).compute(run);
            const what = `seed ${seed} ${isa} ${role} ${dtype} B${blockSize}/${kernelBlockSize} ${numHeads}x${headSize} ${kvLayout}`;
            expect(got.length, what).toBe(want.length);
            for (let i = 0; i < want.length; i++) {
              expect([...got[i].partials.keys()], what).toEqual([...want[i].partials.keys()]);
              for (const [key, v] of want[i].partials) expect(got[i].partials.get(key), `${what} ${key}`).toEqual(v);
            }
            cases++;
          }
        }
      }
      expect(cases).toBe(40 * 2 * isas.length);
    });
  }
});
