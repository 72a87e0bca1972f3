/**
 * Properties of the checksum definition on random seeded geometries (SPEC 2), on every backend:
 * TP shards sum to the TP1 value; PP stages sum; block size B adds up to 2B and 4B; every physical
 * layout of the same logical data gives the same values; a bit flip in a valid token always
 * changes the value and past numTokens never; swapped tokens, heads, layers or blocks change it;
 * native equals ts bit for bit. The seed (default fixed) is printed; set KVC_TEST_SEED to replay or vary it.
 */
import { describe, expect, it } from 'vitest';
import { tsBackend } from '../src/backend-ts.js';
import { loadNativeBackend, nativeUnavailableReason } from '../src/backend-native.js';
import type { ChecksumBackend } from '../src/backend.js';
import { BlockChecksummer } from '../src/compute.js';
import { DTYPE_BYTES, type Dtype } from '../src/types.js';
import { pagedAttentionBytes, pagedAttentionCache, vectorCache, type AttentionCacheView, type CacheView } from '../src/views.js';
import { testSeed } from './seed.js';
import { layTokens, randomLayer, Rng, type LogicalLayer } from './layouts.js';

const SEED = testSeed('properties');
const CASES = 25;

const native = loadNativeBackend();
const backends: ChecksumBackend[] = native ? [tsBackend, native] : [tsBackend];

/** A physical layout choice. */
interface Layout {
  layout: 'NHD' | 'HND';
  kvLayout: 'kv-first' | 'block-kv' | 'separate';
  kernelBlockSize?: number;
  /** Extra bytes before the tensor, to test unaligned memory. */
  pad: number;
}

/** A model: attention layers (K and V heads) or one-vector (MLA) layers, all in one group. */
interface Model {
  dtype: Dtype;
  headSize: number; // elements (K and V each)
  mla: boolean;
  layers: LogicalLayer[];
}

function randomModel(rng: Rng, tokens: number): Model {
  const dtype = rng.pick<Dtype>(['bfloat16', 'float16', 'float32']);
  const eb = DTYPE_BYTES[dtype];
  const mla = rng.int(0, 4) === 0;
  // head sizes whose K half is not 8-byte aligned are included (bf16 x 6 = 12 bytes).
  const headSize = rng.pick(eb === 4 ? [2, 4, 6] : [4, 6, 8, 12]);
  const heads = mla ? 1 : rng.pick([1, 2, 4, 8]);
  const cellBytes = mla ? headSize * eb * 2 : 2 * headSize * eb;
  const nLayers = rng.int(1, 3);
  const first = rng.int(0, 40);
  const layers = Array.from({ length: nLayers }, (_, i) => randomLayer(rng, `model.layers.${first + i}.self_attn.attn`, heads, cellBytes, tokens));
  return { dtype, headSize, mla, layers };
}

function randomLayout(rng: Rng, blockSize: number): Layout {
  const kbs = [blockSize, blockSize / 2, blockSize / 4].filter((k) => Number.isInteger(k) && k >= 1);
  return { layout: rng.pick(['NHD', 'HND'] as const), kvLayout: rng.pick(['kv-first', 'block-kv', 'separate'] as const), kernelBlockSize: rng.pick(kbs), pad: rng.int(0, 9) };
}

/** One rank's view of a layer, its memory, and the block ids of the request's positions. */
function rankCaches(m: Model, layers: LogicalLayer[], tp: number, rank: number, B: number, lay: Layout, blockIds: number[], numBlocks: number) {
  const regions: Uint8Array[] = [];
  const caches: CacheView[] = [];
  for (const l of layers) {
    let view: AttentionCacheView;
    let headStart: number;
    if (m.mla) {
      const bytes = numBlocks * B * l.cellBytes;
      regions.push(new Uint8Array(bytes + lay.pad));
      view = vectorCache({ name: l.name, dtype: m.dtype, numBlocks, blockSize: B, width: l.cellBytes / DTYPE_BYTES[m.dtype], at: { region: regions.length - 1, offset: lay.pad } });
      headStart = 0;
    } else {
      const R = l.heads >= tp ? 1 : tp / l.heads;
      const localHeads = l.heads >= tp ? l.heads / tp : 1;
      headStart = Math.floor(rank / R) * localHeads;
      const o = { dtype: m.dtype, numBlocks, blockSize: B, numHeads: localHeads, headSize: m.headSize, kvLayout: lay.kvLayout };
      const bytes = pagedAttentionBytes(o);
      regions.push(new Uint8Array(bytes + lay.pad));
      let v: { region: number; offset: number } | undefined;
      if (lay.kvLayout === 'separate') {
        regions.push(new Uint8Array(bytes + 3));
        v = { region: regions.length - 1, offset: 3 };
      }
      view = pagedAttentionCache({
        name: l.name,
        ...o,
        layout: lay.layout,
        kernelBlockSize: lay.kernelBlockSize,
        at: { region: lay.kvLayout === 'separate' ? regions.length - 2 : regions.length - 1, offset: lay.pad },
        v,
        replication: { totalKvHeads: l.heads },
      });
    }
    layTokens(l, view, regions, blockIds, headStart);
    caches.push(view);
  }
  return { regions, caches };
}

/** The producer's block values (replica 0 summed over every rank) for the given split. */
function producerValues(m: Model, o: { tp: number; B: number; lay: Layout; numTokens: number; backend: ChecksumBackend; stages?: LogicalLayer[][]; rng: Rng }): BigUint64Array {
  const nPos = Math.ceil(m.layers[0].tokens / o.B);
  const numBlocks = nPos + o.rng.int(0, 3);
  const ids = Array.from({ length: numBlocks }, (_, i) => i).sort(() => (o.rng.u32() & 1 ? 1 : -1));
  const blockIds = ids.slice(0, nPos);
  const total = new BigUint64Array(nPos);
  for (const stage of o.stages ?? [m.layers]) {
    for (let rank = 0; rank < o.tp; rank++) {
      const { regions, caches } = rankCaches(m, stage, o.tp, rank, o.B, o.lay, blockIds, numBlocks);
      const ck = new BlockChecksummer([{ groupId: 0, caches }], { tpRank: rank, tpSize: o.tp, role: 'producer' }, regions, o.backend);
      expect(ck.plans[0].skipReason).toBeNull();
      const [rec] = ck.compute([{ group: 0, blockIds, start: 0, numTokens: o.numTokens }]);
      for (const p of rec.partials.values()) p.forEach((x, i) => (total[i] = BigInt.asUintN(64, total[i] + x)));
    }
  }
  return total;
}

/** Sums consecutive groups of `k` block values (regrouping to a k-times larger block). */
function fold(v: BigUint64Array, k: number): bigint[] {
  const out: bigint[] = [];
  for (let i = 0; i < v.length; i += k) {
    let s = 0n;
    for (let j = i; j < Math.min(v.length, i + k); j++) s += v[j];
    out.push(BigInt.asUintN(64, s));
  }
  return out;
}

const TP_SIZES = [1, 2, 4, 8];

for (const backend of backends) {
  describe(`checksum properties [${backend.name}]`, () => {
    it('is the same for every TP split, physical layout and PP split of the same logical KV', () => {
      for (let c = 0; c < CASES; c++) {
        const rng = new Rng(SEED + c);
        const tokens = rng.int(1, 70);
        const m = randomModel(rng, tokens);
        const B = rng.pick([4, 8, 16]);
        const numTokens = rng.int(Math.max(0, tokens - B), tokens);
        const ref = producerValues(m, { tp: 1, B, lay: { layout: 'NHD', kvLayout: 'kv-first', pad: 0 }, numTokens, backend: tsBackend, rng });
        const tp = m.mla ? rng.pick(TP_SIZES) : rng.pick(TP_SIZES.filter((t) => t <= m.layers[0].heads || t % m.layers[0].heads === 0));
        const lay = randomLayout(rng, B);
        const cut = rng.int(0, m.layers.length);
        const stages = [m.layers.slice(0, cut), m.layers.slice(cut)].filter((s) => s.length > 0);
        const got = producerValues(m, { tp, B, lay, numTokens, backend, stages, rng });
        expect(Array.from(got), `case ${c} (seed ${SEED + c}) tp ${tp} ${JSON.stringify(lay)} stages ${stages.length}`).toEqual(Array.from(ref));
      }
    });

    it('adds up: values of block size B regroup into 2B and 4B', () => {
      for (let c = 0; c < CASES; c++) {
        const rng = new Rng(SEED + 1000 + c);
        const tokens = rng.int(1, 90);
        const m = randomModel(rng, tokens);
        const B = rng.pick([2, 4, 8]);
        const numTokens = rng.int(0, tokens);
        const lay = () => randomLayout(rng, B);
        const v1 = producerValues(m, { tp: 1, B, lay: lay(), numTokens, backend, rng });
        const v2 = producerValues(m, { tp: 1, B: 2 * B, lay: lay(), numTokens, backend, rng });
        const v4 = producerValues(m, { tp: 1, B: 4 * B, lay: lay(), numTokens, backend, rng });
        expect(fold(v1, 2), `seed ${SEED + 1000 + c}`).toEqual(Array.from(v2));
        expect(fold(v1, 4), `seed ${SEED + 1000 + c}`).toEqual(Array.from(v4));
      }
    });

    it('changes on a bit flip in a valid token, never past numTokens', () => {
      for (let c = 0; c < CASES; c++) {
        const rng = new Rng(SEED + 2000 + c);
        const tokens = rng.int(2, 60);
        const m = randomModel(rng, tokens);
        const B = rng.pick([4, 8, 16]);
        const numTokens = rng.int(1, tokens);
        const lay = randomLayout(rng, B);
        const layer = rng.pick(m.layers);
        const flip = (tok: number) => {
          const at = (tok * layer.heads + rng.int(0, layer.heads - 1)) * layer.cellBytes + rng.int(0, layer.cellBytes - 1);
          layer.data[at] ^= 1 << rng.int(0, 7);
        };
        const seedRun = SEED + 2000 + c;
        const values = () => producerValues(m, { tp: 1, B, lay, numTokens, backend, rng: new Rng(seedRun) });
        const before = values();
        const tok = rng.int(0, numTokens - 1);
        flip(tok);
        const after = values();
        const block = Math.floor(tok / B);
        expect(after[block], `seed ${seedRun}: flip in token ${tok}`).not.toBe(before[block]);
        after.forEach((v, i) => i !== block && expect(v).toBe(before[i]));
        if (numTokens < tokens) {
          flip(rng.int(numTokens, tokens - 1));
          expect(Array.from(values()), `seed ${seedRun}: flip past numTokens`).toEqual(Array.from(after));
        }
      }
    });

    it('changes when tokens, heads, layers or blocks are swapped', () => {
      for (let c = 0; c < CASES; c++) {
        const rng = new Rng(SEED + 3000 + c);
        const tokens = rng.int(2, 40);
        const m = randomModel(rng, tokens);
        const B = rng.pick([1, 2, 4]);
        const lay = randomLayout(rng, B);
        const seedRun = SEED + 3000 + c;
        const total = () => fold(producerValues(m, { tp: 1, B, lay, numTokens: tokens, backend, rng: new Rng(seedRun) }), 1 << 30)[0];
        const perBlock = () => Array.from(producerValues(m, { tp: 1, B, lay, numTokens: tokens, backend, rng: new Rng(seedRun) }));
        const l = m.layers[0];
        const swap = (a: number, b: number, n: number, data: Uint8Array, data2 = data) => {
          const t = data.slice(a, a + n);
          data.copyWithin(a, b, b + n);
          data2.set(t, b);
        };
        const row = l.heads * l.cellBytes;
        // tokens 0 and 1 (values differ with overwhelming probability; force it)
        l.data[0] ^= 0x5a;
        const t0 = total();
        swap(0, row, row, l.data);
        expect(total(), `seed ${seedRun}: swapped tokens`).not.toBe(t0);
        if (l.heads > 1) {
          const t1 = total();
          swap(0, l.cellBytes, l.cellBytes, l.data);
          expect(total(), `seed ${seedRun}: swapped heads`).not.toBe(t1);
        }
        if (m.layers.length > 1) {
          const t2 = total();
          const a = m.layers[0].data;
          const b = m.layers[1].data;
          const tmp = a.slice();
          a.set(b);
          b.set(tmp);
          expect(total(), `seed ${seedRun}: swapped layers`).not.toBe(t2);
        }
        if (tokens > B) {
          const before = perBlock();
          // swap the KV of block positions 0 and 1 (B tokens each)
          const n = Math.min(B, tokens - B) * row;
          swap(0, B * row, n, l.data);
          expect(perBlock(), `seed ${seedRun}: swapped blocks`).not.toEqual(before);
        }
      }
    });
  });
}

describe.skipIf(!native)(`native backend equals ts bit for bit${native ? '' : ` (skipped: ${nativeUnavailableReason()})`}`, () => {
  it('on random geometries, producer and consumer', () => {
    for (let c = 0; c < CASES * 2; c++) {
      const rng = new Rng(SEED + 4000 + c);
      const tokens = rng.int(1, 80);
      const m = randomModel(rng, tokens);
      const B = rng.pick([1, 4, 16, 32]);
      const numTokens = rng.int(0, tokens);
      const tp = m.mla ? rng.pick(TP_SIZES) : rng.pick(TP_SIZES.filter((t) => t <= m.layers[0].heads || t % m.layers[0].heads === 0));
      const lay = randomLayout(rng, B);
      const nPos = Math.ceil(tokens / B);
      const blockIds = Array.from({ length: nPos }, (_, i) => nPos - 1 - i);
      for (let rank = 0; rank < tp; rank++) {
        const { regions, caches } = rankCaches(m, m.layers, tp, rank, B, lay, blockIds, nPos);
        for (const role of ['producer', 'consumer'] as const) {
          const run = [{ group: 0, blockIds, start: 0, numTokens }];
          const a = new BlockChecksummer([{ groupId: 0, caches }], { tpRank: rank, tpSize: tp, role }, regions, tsBackend).compute(run)[0];
          const b = new BlockChecksummer([{ groupId: 0, caches }], { tpRank: rank, tpSize: tp, role }, regions, native!).compute(run)[0];
          expect([...b.partials.entries()].map(([k, v]) => [k, Array.from(v)]), `seed ${SEED + 4000 + c} rank ${rank} ${role}`).toEqual(
            [...a.partials.entries()].map(([k, v]) => [k, Array.from(v)]),
          );
        }
      }
    }
  });
});

describe('long cells (more than one 256-piece chunk of the ts fast path)', () => {
  it('equals the plain definition on every backend', () => {
    const rng = new Rng(SEED + 5000);
    const width = 2056; // bf16 elements: 4112 bytes = 514 pieces per token
    const cell = width * 2;
    const B = 2;
    const mem = rng.fill(new Uint8Array(3 * B * cell));
    const view = vectorCache({ name: 'model.layers.3.attn', dtype: 'bfloat16', numBlocks: 3, blockSize: B, width, at: { region: 0 } });
    // Definition (SPEC 2): block i at block id 2 - i; token t of the request at position i*B + t.
    const P = cell / 8;
    const m = 2n * (3n * 65536n) + 1n;
    const dv = new DataView(mem.buffer);
    const want: bigint[] = [];
    for (let pos = 0; pos < 2; pos++) {
      let s = 0n;
      for (let t = 0; t < B; t++) {
        const tau = pos * B + t;
        for (let p = 0; p < P; p++) s += dv.getBigUint64((2 - pos) * B * cell + t * cell + 8 * p, true) * m * BigInt(2 * (tau * P + p) + 1);
      }
      want.push(BigInt.asUintN(64, s));
    }
    for (const backend of backends) {
      const ck = new BlockChecksummer([{ groupId: 0, caches: [view] }], { tpRank: 0, tpSize: 1, role: 'producer' }, [mem], backend);
      const [rec] = ck.compute([{ group: 0, blockIds: [2, 1], start: 0, numTokens: 4 }]);
      expect(Array.from(rec.partials.get('1:0')!), backend.name).toEqual(want);
    }
  });
});
