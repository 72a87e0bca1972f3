/**
 * The ts backend's number-only path (backend-ts.ts `sumAttnWhole`: 32-bit halves, exact double
 * chunks of up to 2048 piece numbers, one slice factor per head) at its edges, against the SPEC 2
 * definition computed here in BigInt from the logical bytes (and against the native backend where
 * the addon is built): chunk boundaries inside a block, a cell of exactly 2048 pieces and longer
 * cells split into runs, an odd number of pieces per part, all-0xff bytes (the largest sums),
 * token positions near 2^32 and layer numbers whose slice factor passes 2^32, kernel blocks,
 * NHD / HND / split K-V layouts, and the BigInt fallback (unaligned memory, parts that cut pieces).
 */
import { describe, expect, it } from 'vitest';
import { tsBackend } from '../src/backend-ts.js';
import { loadNativeBackend } from '../src/backend-native.js';
import type { ChecksumBackend } from '../src/backend.js';
import { BlockChecksummer } from '../src/compute.js';
import { DTYPE_BYTES, type Dtype } from '../src/types.js';
import { pagedAttentionBytes, pagedAttentionCache, vectorCache, type AttentionCacheView } from '../src/views.js';
import { testSeed } from './seed.js';
import { layTokens, Rng, type LogicalLayer } from './layouts.js';

const SEED = testSeed('ts-backend');
const native = loadNativeBackend();
const backends: ChecksumBackend[] = native ? [tsBackend, native] : [tsBackend];

interface Case {
  title: string;
  dtype: Dtype;
  /** One-vector (MLA-like) cache of `width` elements, else paged K/V heads. */
  width?: number;
  heads?: number;
  headSize?: number;
  vHeadSize?: number;
  layout?: 'NHD' | 'HND';
  kvLayout?: 'kv-first' | 'block-kv' | 'separate';
  kernelBlockSize?: number;
  blockSize: number;
  /** Blocks of the request (block ids are laid out reversed). */
  blocks: number;
  /** Valid tokens past the first request position. */
  valid: number;
  /** Block position of the first block (request positions start * blockSize ...). */
  start?: number;
  layer?: number;
  /** Bytes before the tensor (a non-multiple of 4 leaves the region unaligned for the fast path). */
  pad?: number;
  fill: 'random' | 'ff';
}

/** SPEC 2 block values of one cache from its logical cells (token k at request position first + k). */
function definition(l: LogicalLayer, layer: number, first: number, valid: number, B: number, blocks: number): bigint[] {
  const P = l.cellBytes / 8;
  const dv = new DataView(l.data.buffer, l.data.byteOffset, l.data.byteLength);
  const out: bigint[] = new Array(blocks).fill(0n);
  for (let k = 0; k < valid; k++) {
    const tau = BigInt(first + k);
    for (let h = 0; h < l.heads; h++) {
      const m = 2n * (BigInt(layer) * 65536n + BigInt(h)) + 1n;
      for (let p = 0; p < P; p++) {
        const x = dv.getBigUint64((k * l.heads + h) * l.cellBytes + 8 * p, true);
        const i = Math.floor(k / B);
        out[i] = BigInt.asUintN(64, out[i] + x * m * (2n * (tau * BigInt(P) + BigInt(p)) + 1n));
      }
    }
  }
  return out;
}

function runCase(c: Case, rng: Rng): void {
  const B = c.blockSize;
  const eb = DTYPE_BYTES[c.dtype];
  const layer = c.layer ?? 5;
  const name = `model.layers.${layer}.self_attn.attn`;
  const pad = c.pad ?? 0;
  const numBlocks = c.blocks + 1;
  const blockIds = Array.from({ length: c.blocks }, (_, i) => c.blocks - i); // block 0 unused
  const regions: Uint8Array[] = [];
  let view: AttentionCacheView;
  let heads: number;
  let cellBytes: number;
  if (c.width !== undefined) {
    heads = 1;
    cellBytes = c.width * eb;
    regions.push(new Uint8Array(pad + numBlocks * B * cellBytes));
    view = vectorCache({ name, dtype: c.dtype, numBlocks, blockSize: B, width: c.width, at: { region: 0, offset: pad } });
  } else {
    heads = c.heads!;
    cellBytes = (c.headSize! + (c.vHeadSize ?? c.headSize!)) * eb;
    const o = { dtype: c.dtype, numBlocks, blockSize: B, numHeads: heads, headSize: c.headSize!, vHeadSize: c.vHeadSize, kvLayout: c.kvLayout ?? 'kv-first' };
    regions.push(new Uint8Array(pad + pagedAttentionBytes(o)));
    if (o.kvLayout === 'separate') regions.push(new Uint8Array(pad + pagedAttentionBytes(o)));
    view = pagedAttentionCache({
      name,
      ...o,
      layout: c.layout ?? 'NHD',
      kernelBlockSize: c.kernelBlockSize,
      at: { region: 0, offset: pad },
      v: o.kvLayout === 'separate' ? { region: 1, offset: pad } : undefined,
    });
  }
  const tokens = c.blocks * B;
  const data = new Uint8Array(tokens * heads * cellBytes);
  if (c.fill === 'ff') data.fill(0xff);
  else rng.fill(data);
  const logical: LogicalLayer = { name, heads, cellBytes, tokens, data };
  for (const r of regions) rng.fill(r); // bytes outside the cells (and past the valid tokens) must not count
  layTokens(logical, view, regions, blockIds, 0);
  const start = c.start ?? 0;
  const first = start * B;
  const want = definition(logical, layer, first, c.valid, B, c.blocks);
  for (const backend of backends) {
    const ck = new BlockChecksummer([{ groupId: 0, caches: [view] }], { tpRank: 0, tpSize: 1, role: 'producer' }, regions, backend);
    expect(ck.plans[0].skipReason, c.title).toBeNull();
    const [rec] = ck.compute([{ group: 0, blockIds, start, numTokens: first + c.valid }]);
    expect(Array.from(rec.partials.get('1:0')!), `${c.title} [${backend.name}]`).toEqual(want);
  }
}

const CASES: Case[] = [
  { title: 'bench geometry, NHD (one chunk per head)', dtype: 'bfloat16', heads: 8, headSize: 128, layout: 'NHD', blockSize: 16, blocks: 3, valid: 45, fill: 'random' },
  { title: 'bench geometry, HND', dtype: 'bfloat16', heads: 8, headSize: 128, layout: 'HND', blockSize: 16, blocks: 3, valid: 48, fill: 'random' },
  // P = 64: 32 tokens per chunk, so a 64-token block is two chunks (and a partial third run)
  { title: 'two chunks per head, all 0xff', dtype: 'bfloat16', heads: 3, headSize: 128, layout: 'NHD', blockSize: 64, blocks: 2, valid: 64 + 40, fill: 'ff' },
  { title: 'two chunks per head, HND kernel blocks', dtype: 'bfloat16', heads: 2, headSize: 128, layout: 'HND', kernelBlockSize: 16, blockSize: 64, blocks: 2, valid: 127, fill: 'random' },
  // 3 pieces per cell (odd), 682 tokens per chunk: chunk boundaries at 682 inside 1024-token blocks
  { title: 'odd pieces, 682-token chunks, all 0xff', dtype: 'bfloat16', width: 12, blockSize: 1024, blocks: 2, valid: 1024 + 700, fill: 'ff' },
  { title: 'odd pieces per part (3), NHD', dtype: 'bfloat16', heads: 3, headSize: 12, layout: 'NHD', blockSize: 16, blocks: 3, valid: 40, fill: 'random' },
  { title: 'one piece per part, HND block-kv, all 0xff', dtype: 'bfloat16', heads: 2, headSize: 4, layout: 'HND', kvLayout: 'block-kv', blockSize: 16, blocks: 2, valid: 32, fill: 'ff' },
  { title: 'odd pieces per part, separate K and V, kernel blocks', dtype: 'float32', heads: 5, headSize: 6, vHeadSize: 2, layout: 'HND', kvLayout: 'separate', kernelBlockSize: 4, blockSize: 16, blocks: 2, valid: 29, fill: 'random' },
  // cells of exactly one chunk (2048 pieces) and longer: runs of 2048 pieces inside one token
  { title: 'a cell of exactly 2048 pieces, all 0xff', dtype: 'bfloat16', width: 8192, blockSize: 2, blocks: 2, valid: 3, fill: 'ff' },
  { title: 'a cell of 2049 pieces (2048 + 1), all 0xff', dtype: 'bfloat16', width: 8196, blockSize: 2, blocks: 2, valid: 4, fill: 'ff' },
  { title: 'K and V parts of 2050 pieces each (cell 4100), block-kv', dtype: 'float32', heads: 2, headSize: 4100, layout: 'NHD', kvLayout: 'block-kv', blockSize: 2, blocks: 2, valid: 3, fill: 'random' },
  // weights past 2^32 and 2^53: token positions near 2^32 and a layer whose slice factor is > 2^32
  { title: 'token positions near 2^32', dtype: 'bfloat16', heads: 2, headSize: 128, layout: 'NHD', blockSize: 16, blocks: 2, valid: 30, start: Math.floor(0xffffffff / 16) - 2, fill: 'ff' },
  { title: 'slice factor past 2^32 (layer 123456)', dtype: 'bfloat16', heads: 4, headSize: 64, layout: 'HND', blockSize: 16, blocks: 2, valid: 32, layer: 123456, fill: 'random' },
  { title: 'layer 2^40 and positions near 2^32, all 0xff', dtype: 'float16', heads: 2, headSize: 8, layout: 'NHD', blockSize: 8, blocks: 2, valid: 16, layer: 2 ** 40, start: Math.floor(0xffffffff / 8) - 2, fill: 'ff' },
  // the BigInt fallback: unaligned memory, and parts that start or end inside a piece
  { title: 'unaligned region (fallback)', dtype: 'bfloat16', heads: 2, headSize: 128, layout: 'NHD', blockSize: 16, blocks: 2, valid: 20, pad: 3, fill: 'random' },
  { title: 'K part of 12 bytes (fallback)', dtype: 'bfloat16', heads: 3, headSize: 6, layout: 'HND', blockSize: 8, blocks: 2, valid: 13, fill: 'ff' },
];

describe(`ts backend number-only path at its edges (${backends.map((b) => b.name).join(', ')})`, () => {
  CASES.forEach((c, i) =>
    it(c.title, () => {
      runCase(c, new Rng(SEED + i));
    }),
  );
});
