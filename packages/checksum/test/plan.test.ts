/**
 * Planning (SPEC 1-5): layer numbers and modules, head offsets, aliases, replica resolution, skip
 * reasons, fingerprints, and state splits (Mamba1, Mamba2 sharded / one group, GDN) whose values
 * do not depend on the TP size or the conv layout.
 */
import { createHash } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { tsBackend } from '../src/backend-ts.js';
import { BlockChecksummer } from '../src/compute.js';
import { fingerprintOf, parseLayerName, planGroup, type RankContext } from '../src/plan.js';
import { DTYPE_BYTES, type Dtype } from '../src/types.js';
import {
  gdnStateLayout,
  logicalAttentionCache,
  mamba1StateLayout,
  mamba2StateLayout,
  pagedStateCache,
  vectorCache,
  type AttentionCacheView,
  type CacheView,
  type StateLayout,
} from '../src/views.js';
import { Rng } from './layouts.js';

const P0: RankContext = { tpRank: 0, tpSize: 1, role: 'producer' };

function attn(name: string, o: Partial<{ heads: number; cellBytes: number; dtype: Dtype; blockSize: number; replication: number | 'all' }> = {}): CacheView {
  return logicalAttentionCache({
    name,
    dtype: o.dtype ?? 'bfloat16',
    numBlocks: 4,
    blockSize: o.blockSize ?? 16,
    localHeads: o.heads ?? 2,
    cellBytes: o.cellBytes ?? 32,
    at: { region: 0 },
    replication: o.replication,
  });
}

describe('layer names (SPEC 4)', () => {
  it('takes the one all-digit component and the module up to it', () => {
    expect(parseLayerName('model.layers.7.self_attn.attn')).toEqual({ layer: 7, module: 'model.layers.7' });
    expect(parseLayerName('layers.0')).toEqual({ layer: 0, module: 'layers.0' });
    expect(parseLayerName('model.attn')).toBeNull();
    expect(parseLayerName('model.layers.1.experts.2')).toBeNull();
    expect(parseLayerName('model.layers.1a.attn')).toBeNull();
  });

  it('skips a group whose cache has no layer number, or one layer number in two modules', () => {
    expect(planGroup({ groupId: 0, caches: [attn('model.attn')] }, P0).skipReason).toBe('layer-name');
    expect(planGroup({ groupId: 0, caches: [attn('model.layers.0.attn'), attn('mtp.layers.0.attn')] }, P0).skipReason).toBe('layer-module');
  });

  it('numbers several caches of one module in name order, each after the earlier ones global heads', () => {
    const caches = [attn('model.layers.4.self_attn.indexer', { heads: 1, cellBytes: 16, replication: 'all' }), attn('model.layers.4.self_attn.attn', { heads: 2 })];
    const p = planGroup({ groupId: 0, caches }, { tpRank: 1, tpSize: 2, role: 'consumer' });
    expect(p.skipReason).toBeNull();
    expect(p.caches.map((c) => [c.name, c.headOffset])).toEqual([
      ['model.layers.4.self_attn.attn', 0],
      ['model.layers.4.self_attn.indexer', 4],
    ]);
  });

  it('counts a KV-sharing cache once, under the lowest (layer, name)', () => {
    const c = { ...attn('model.layers.9.attn'), aliases: ['model.layers.3.attn'] } as CacheView;
    const p = planGroup({ groupId: 0, caches: [c] }, P0);
    expect(p.caches.map((x) => [x.name, x.layer])).toEqual([['model.layers.3.attn', 3]]);
    expect(p.entries[0].factorBase).toBe(3n * 65536n);
  });
});

describe('skips what the SPEC does not cover', () => {
  it.each([
    ['cell-bytes', [attn('l.0.a', { cellBytes: 12 })], P0],
    ['dtype', [{ ...attn('l.0.a'), dtype: 'int4' as Dtype }], P0],
    ['replicas', [attn('l.0.a', { replication: 3 })], { tpRank: 0, tpSize: 4, role: 'producer' }],
    ['too-many-heads', [attn('l.0.a', { heads: 40000 }), attn('l.0.b', { heads: 30000 })], P0],
    ['block-size', [attn('l.0.a'), attn('l.1.a', { blockSize: 32 })], P0],
    ['mixed-kinds', [attn('l.0.a'), pagedStateCache({ name: 'l.1.m', numBlocks: 2, at: { region: 0 }, pageBytes: 4096, layout: mamba1StateLayout({ tpSize: 1, intermediateSize: 8, dState: 4, convKernel: 4, convDimFirst: true, convDtype: 'bfloat16', ssmDtype: 'float32' })! })], P0],
  ] as const)('%s', (reason, caches, rank) => {
    const p = planGroup({ groupId: 0, caches: caches as unknown as CacheView[] }, rank as RankContext);
    expect(p.skipReason).toBe(reason);
    expect(p.entries).toHaveLength(0);
  });

  it('a split that does not partition its axis, or 1-byte state elements', () => {
    const lay = mamba1StateLayout({ tpSize: 1, intermediateSize: 8, dState: 4, convKernel: 4, convDimFirst: true, convDtype: 'bfloat16', ssmDtype: 'float32' })!;
    const bad: StateLayout = { states: [{ ...lay.states[0], split: { axis: 0, segments: [[7, 1]] } }, lay.states[1]] };
    expect(planGroup({ groupId: 0, caches: [pagedStateCache({ name: 'l.1.m', numBlocks: 2, at: { region: 0 }, pageBytes: 4096, layout: bad })] }, P0).skipReason).toBe('state-split');
    const fp8: StateLayout = { states: [{ ...lay.states[0], dtype: 'float8_e4m3fn' }, lay.states[1]] };
    expect(planGroup({ groupId: 0, caches: [pagedStateCache({ name: 'l.1.m', numBlocks: 2, at: { region: 0 }, pageBytes: 4096, layout: fp8 })] }, P0).skipReason).toBe('state-width');
  });

  it('GQA replicas come from the KV head count; MLA is held whole', () => {
    const gqa = { ...attn('l.0.a', { heads: 1 }), replication: { totalKvHeads: 2 } } as CacheView;
    const p = planGroup({ groupId: 0, caches: [gqa] }, { tpRank: 3, tpSize: 4, role: 'consumer' });
    expect(p.columns).toEqual([{ replicas: 2, replica: 1 }]);
    expect(p.entries[0].factorBase).toBe(1n); // shard 1 -> global head 1
    const mla = vectorCache({ name: 'l.2.a', dtype: 'bfloat16', numBlocks: 2, blockSize: 16, width: 576, at: { region: 0 } });
    expect(planGroup({ groupId: 0, caches: [mla] }, { tpRank: 1, tpSize: 2, role: 'producer' }).entries).toHaveLength(0);
    expect(planGroup({ groupId: 0, caches: [mla] }, { tpRank: 1, tpSize: 2, role: 'consumer' }).columns).toEqual([{ replicas: 2, replica: 1 }]);
  });
});

describe('fingerprints (SPEC 5)', () => {
  const fp = (text: string) => createHash('sha256').update(text).digest().readBigUInt64LE(0);

  it('is the LE first 8 bytes of SHA-256 of the identity text, summed over the group', () => {
    const p = planGroup({ groupId: 0, caches: [attn('model.layers.0.a', { heads: 2 }), attn('model.layers.1.a', { heads: 2 })] }, { tpRank: 0, tpSize: 2, role: 'producer' });
    const ids = ['["model.layers.0.a","attention","bfloat16",4,32]', '["model.layers.1.a","attention","bfloat16",4,32]'];
    expect(p.caches.map((c) => c.identity)).toEqual(ids);
    expect(p.fingerprint).toBe(BigInt.asUintN(64, fp(ids[0]) + fp(ids[1])));
    expect(fingerprintOf(['a b', 1])).toBe(fp('["a b",1]'));
  });

  it('does not depend on TP size or conv layout for split states, and changes with the conv width', () => {
    const ident = (tp: number, dimFirst: boolean, convKernel = 4) =>
      planGroup(
        { groupId: 0, caches: [pagedStateCache({ name: 'model.layers.1.mixer', numBlocks: 1, at: { region: 0 }, pageBytes: 1 << 20, layout: mamba2StateLayout({ tpSize: tp, intermediateSize: 16, nGroups: 1, dState: 4, convKernel, numHeads: 4, headDim: 4, convDimFirst: dimFirst, convDtype: 'bfloat16', ssmDtype: 'float32' })! })] },
        { tpRank: 0, tpSize: tp, role: 'producer' },
      ).caches[0].identity;
    expect(ident(1, true)).toBe('["model.layers.1.mixer","state",[["bfloat16",[16,4,4],[3]],["float32",[4],[4,4]]]]');
    expect(ident(2, false)).toBe(ident(1, true));
    expect(ident(4, true)).toBe(ident(1, true));
    expect(ident(2, true, 5)).not.toBe(ident(2, true));
  });
});

/** A state layer's global logical data, laid out per rank from the split declaration. */
function stateValues(make: (tp: number) => StateLayout | null, tp: number, globalData: (s: number, row: number, e: number) => number, role: 'producer' | 'consumer') {
  const perRank: Array<Map<string, bigint>> = [];
  let producerSum = 0n;
  for (let rank = 0; rank < tp; rank++) {
    const lay = make(tp)!;
    const bytes = lay.states.reduce((a, s) => a + s.shape.reduce((x, y) => x * y, 1) * DTYPE_BYTES[s.dtype], 0);
    const region = new Uint8Array(bytes + 16);
    const view = pagedStateCache({ name: 'model.layers.2.mixer', numBlocks: 1, at: { region: 0, offset: 8 }, pageBytes: bytes, layout: lay });
    // Fill each local element from the global (row, element) it stands for.
    let globalRowBase = 0;
    view.states.slice(0, 2).forEach((st, si) => {
      const split = st.split!;
      const eb = DTYPE_BYTES[st.dtype];
      const shape = st.shape;
      const strides = shape.map((_, d) => shape.slice(d + 1).reduce((a, b) => a * b, 1) * eb);
      const other = shape.map((_, d) => d).filter((d) => d !== split.axis);
      const nElem = other.reduce((a, d) => a * shape[d], 1);
      let localStart = 0;
      let segGlobal = globalRowBase;
      for (const [local, R] of split.segments) {
        const shard = Math.floor(rank / R);
        for (let i = 0; i < local; i++) {
          const grow = segGlobal + shard * local + i;
          for (let e = 0; e < nElem; e++) {
            let rem = e;
            let addr = st.offset + (localStart + i) * strides[split.axis];
            for (let k = other.length - 1; k >= 0; k--) {
              addr += (rem % shape[other[k]]) * strides[other[k]];
              rem = Math.floor(rem / shape[other[k]]);
            }
            const v = globalData(si, grow - globalRowBase, e);
            if (eb === 2) new DataView(region.buffer).setUint16(addr, v & 0xffff, true);
            else new DataView(region.buffer).setUint32(addr, v >>> 0, true);
          }
        }
        localStart += local;
        segGlobal += (local * tp) / R;
      }
      globalRowBase = segGlobal;
    });
    const ck = new BlockChecksummer([{ groupId: 0, caches: [view] }], { tpRank: rank, tpSize: tp, role }, [region], tsBackend);
    expect(ck.plans[0].skipReason).toBeNull();
    const [rec] = ck.compute([{ group: 0, blockIds: [0], start: 0, numTokens: 0 }]);
    const m = new Map([...rec.partials].map(([k, v]) => [k, v[0]]));
    perRank.push(m);
    for (const v of m.values()) producerSum = BigInt.asUintN(64, producerSum + v);
  }
  return { perRank, producerSum };
}

describe('split states (SPEC 3)', () => {
  const rng = new Rng(7);
  const data = Array.from({ length: 4096 }, () => rng.u32());
  const g = (s: number, row: number, e: number) => data[(s * 977 + row * 31 + e) % data.length];

  const layouts: Array<[string, (tp: number, dimFirst: boolean) => StateLayout | null]> = [
    ['Mamba2 n_groups 8 (sharded)', (tp, df) => mamba2StateLayout({ tpSize: tp, intermediateSize: 32, nGroups: 8, dState: 4, convKernel: 4, numHeads: 8, headDim: 4, convDimFirst: df, convDtype: 'bfloat16', ssmDtype: 'float32' })],
    ['Mamba2 n_groups 1 (B, C replicated)', (tp, df) => mamba2StateLayout({ tpSize: tp, intermediateSize: 32, nGroups: 1, dState: 4, convKernel: 4, numHeads: 8, headDim: 4, convDimFirst: df, convDtype: 'float16', ssmDtype: 'float32' })],
    ['Mamba2 n_groups 2 at TP4 (R=2)', (tp, df) => mamba2StateLayout({ tpSize: tp, intermediateSize: 32, nGroups: 2, dState: 4, convKernel: 4, numHeads: 8, headDim: 4, convDimFirst: df, convDtype: 'bfloat16', ssmDtype: 'bfloat16' })],
    ['Mamba1', (tp, df) => mamba1StateLayout({ tpSize: tp, intermediateSize: 16, dState: 4, convKernel: 4, convDimFirst: df, convDtype: 'bfloat16', ssmDtype: 'float32' })],
    ['GDN', (tp, df) => gdnStateLayout({ tpSize: tp, numKHeads: 4, numVHeads: 8, headKDim: 4, headVDim: 4, convKernel: 4, convDimFirst: df, convDtype: 'bfloat16', ssmDtype: 'float32' })],
  ];

  for (const [title, make] of layouts) {
    it(`${title}: the producer's value is the same at TP 1, 2 and 4, dim-first or not`, () => {
      const ref = stateValues((tp) => make(tp, true), 1, g, 'producer').producerSum;
      for (const tp of [2, 4]) for (const df of [true, false]) expect(stateValues((t) => make(t, df), tp, g, 'producer').producerSum, `TP${tp} dimFirst=${df}`).toBe(ref);
    });
  }

  it('consumer replica checks of replicated B and C each equal the whole value; a bad replica breaks only its check', () => {
    const make = (tp: number) => layouts[1][1](tp, true);
    const ref = stateValues(make, 1, g, 'producer').producerSum;
    const check = (perRank: Array<Map<string, bigint>>, k: number) => {
      let s = 0n;
      for (const m of perRank) for (const [key, v] of m) if (k % Number(key.split(':')[0]) === Number(key.split(':')[1])) s += v;
      return BigInt.asUintN(64, s);
    };
    const { perRank } = stateValues(make, 2, g, 'consumer');
    expect(check(perRank, 0)).toBe(ref);
    expect(check(perRank, 1)).toBe(ref);
    // Corrupt the last rank's copy of B: only check 1 (replica 1 = rank 1) differs.
    const bad = stateValues(make, 2, (s, row, e) => g(s, row, e) ^ (s === 0 && row === 32 && e === 0 ? 1 : 0), 'consumer');
    // row 32 is B's first row; both ranks hold it; change rank 1's copy only by recomputing its map
    const rank1 = bad.perRank[1];
    const mixed = [perRank[0], rank1];
    expect(check(mixed, 0)).toBe(ref);
    expect(check(mixed, 1)).not.toBe(ref);
  });
});

describe('registration mistakes show at registration', () => {
  it('a KV-sharing set given as one view per layer counts once; two different caches under one name skip', () => {
    const mk = (n: string, a: string[], offset = 0): CacheView => {
      const v = attn(n) as AttentionCacheView;
      return { ...v, aliases: a, parts: [{ ...v.parts[0], offset }] };
    };
    const one = planGroup({ groupId: 0, caches: [mk('model.layers.7.attn', ['model.layers.5.attn']), mk('model.layers.5.attn', ['model.layers.7.attn'])] }, P0);
    const single = planGroup({ groupId: 0, caches: [mk('model.layers.5.attn', ['model.layers.7.attn'])] }, P0);
    expect(one.caches.map((c) => [c.name, c.headOffset])).toEqual([['model.layers.5.attn', 0]]);
    expect(one.fingerprint).toBe(single.fingerprint);
    const clash = planGroup({ groupId: 0, caches: [mk('model.layers.7.attn', ['model.layers.5.attn']), mk('model.layers.5.attn', [], 4096)] }, P0);
    expect(clash.skipReason).toBe('invalid-view');
  });

  it('views that read outside their memory are skipped when the checksummer is built, not at every step', () => {
    const v = { kind: 'attention', name: 'model.layers.0.attn', dtype: 'bfloat16', numBlocks: 1, blockSize: 16, localHeads: 8, parts: [{ region: 0, offset: 0, bytes: 16, blockStride: 0, headStride: 0, tokenStride: 0 }] } as CacheView;
    const ck = new BlockChecksummer([{ groupId: 0, caches: [v] }], P0, [new Uint8Array(64)], tsBackend);
    expect(ck.plans[0].skipReason).toBe('invalid-view');
    const [rec] = ck.compute([{ group: 0, blockIds: [0], start: 0, numTokens: 16 }]);
    expect(rec.skipped).toBe(true);
    const small = new BlockChecksummer([{ groupId: 0, caches: [attn('model.layers.0.attn')] }], P0, [new Uint8Array(100)], tsBackend);
    expect(small.plans[0].skipReason).toBe('invalid-view');
    expect(planGroup({ groupId: 0, caches: [{ ...attn('model.layers.0.attn'), numBlocks: 2 ** 32 } as CacheView] }, P0).skipReason).toBe('invalid-view');
  });

  it('KVCONNECT_CHECKSUM_BACKEND chooses the host backend of auto', async () => {
    const { selectBackend } = await import('../src/compute.js');
    const old = process.env.KVCONNECT_CHECKSUM_BACKEND;
    try {
      process.env.KVCONNECT_CHECKSUM_BACKEND = 'ts';
      expect(selectBackend().name).toBe('ts');
      expect(new BlockChecksummer([], P0, []).backend.name).toBe('ts');
      process.env.KVCONNECT_CHECKSUM_BACKEND = 'gpu';
      expect(() => selectBackend()).toThrow(/expected one of/);
    } finally {
      if (old === undefined) delete process.env.KVCONNECT_CHECKSUM_BACKEND;
      else process.env.KVCONNECT_CHECKSUM_BACKEND = old;
    }
  });
});
