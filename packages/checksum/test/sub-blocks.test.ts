/**
 * Sub-block values (sub-blocks.ts, docs/checksum-extensions.md section 1) against an independent
 * path: the plain view's block values with `numTokens` cut at sub-block boundaries (SPEC 2: tokens
 * at or past numTokens count 0), whose differences are the sub-block values. Every paged layout,
 * with and without kernel blocks.
 */
import { describe, expect, it } from 'vitest';
import { BlockChecksummer } from '../src/compute.js';
import { subBlockGroupSpecs, subBlockView, sumSubBlocks } from '../src/sub-blocks.js';
import { pagedAttentionBytes, pagedAttentionCache, type PagedAttentionOptions } from '../src/views.js';

const BP = 64;
const NB = 6;
const layouts: Array<[string, Partial<PagedAttentionOptions>]> = [
  ['NHD kv-first', { layout: 'NHD', kvLayout: 'kv-first' }],
  ['HND block-kv', { layout: 'HND', kvLayout: 'block-kv' }],
  ['HND kv-first, kernel blocks of 16', { layout: 'HND', kvLayout: 'kv-first', kernelBlockSize: 16 }],
  ['NHD block-kv, kernel blocks of 32', { layout: 'NHD', kvLayout: 'block-kv', kernelBlockSize: 32 }],
];

describe.each(layouts)('%s', (_name, lay) => {
  const shape = { dtype: 'float16' as const, numBlocks: NB, blockSize: BP, numHeads: 3, headSize: 8 };
  const mem = new Uint8Array(pagedAttentionBytes({ ...shape, kvLayout: lay.kvLayout! }));
  for (let i = 0; i < mem.length; i++) mem[i] = (i * 2654435761) >>> 24;
  const view = pagedAttentionCache({ name: 'model.layers.4.attn', ...shape, ...(lay as object), layout: lay.layout!, kvLayout: lay.kvLayout!, at: { region: 0 } });
  const plain = new BlockChecksummer([{ groupId: 3, caches: [view] }], { tpRank: 0, tpSize: 1, role: 'consumer' }, [mem], 'ts');
  const blockIds = [4, 1, 5, 0];
  const numTokens = 3 * BP + 40; // the last block partly valid

  /** Block `i`'s value over its first `m` tokens, by the plain view (numTokens cut). */
  const prefix = (i: number, m: number): bigint => plain.compute([{ group: 0, blockIds: [blockIds[i]], start: i, numTokens: Math.min(numTokens, i * BP + m) }])[0].partials.get('1:0')![0];

  for (const S of [8, 16, 32]) {
    it(`sub-blocks of ${S} tokens equal the differences of cut block values`, () => {
      const specs = subBlockGroupSpecs({ groupId: 3, caches: [view] }, S);
      expect(specs).not.toBeNull();
      const k = BP / S;
      const summer = new BlockChecksummer(specs!, { tpRank: 0, tpSize: 1, role: 'consumer' }, [mem], 'ts');
      expect(summer.plans.every((p) => p.fingerprint === plain.plans[0].fingerprint)).toBe(true);
      const run = { blockIds, start: 0, numTokens };
      const rec = sumSubBlocks(summer, run, k);
      expect(rec).toMatchObject({ start: 0, nBlocks: blockIds.length * k, skipped: false });
      const got = rec.partials.get('1:0')!;
      for (let i = 0; i < blockIds.length; i++) {
        for (let s = 0; s < k; s++) expect(got[i * k + s]).toBe(BigInt.asUintN(64, prefix(i, (s + 1) * S) - prefix(i, s * S)));
      }
    });
  }

  it('a mask leaves masked blocks at 0 and sums the others', () => {
    const specs = subBlockGroupSpecs({ groupId: 3, caches: [view] }, 16)!;
    const summer = new BlockChecksummer(specs, { tpRank: 0, tpSize: 1, role: 'consumer' }, [mem], 'ts');
    const run = { blockIds, start: 0, numTokens, mask: [1, 0, 1, 0] };
    const got = sumSubBlocks(summer, run, 4).partials.get('1:0')!;
    expect(Array.from(got.subarray(4, 8))).toEqual([0n, 0n, 0n, 0n]);
    expect(got[0]).toBe(prefix(0, 16));
  });
});

it('sizes that do not split a block give no sub-block views', () => {
  const view = pagedAttentionCache({ name: 'model.layers.0.attn', dtype: 'float16', numBlocks: 2, blockSize: 48, numHeads: 1, headSize: 4, layout: 'NHD', kvLayout: 'kv-first', kernelBlockSize: 16, at: { region: 0 } });
  expect(subBlockView(view, 32, 0)).toBeNull(); // 32 does not divide 48
  expect(subBlockView(view, 24, 0)).toBeNull(); // kernel blocks of 16 neither divide nor are divided by 24
  expect(subBlockGroupSpecs({ groupId: 0, caches: [view] }, 48)).toBeNull(); // not smaller
  expect(subBlockGroupSpecs({ groupId: 0, caches: [view] }, 16)).toHaveLength(3);
});
