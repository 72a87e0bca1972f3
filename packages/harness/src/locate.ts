/**
 * Where KV bytes live in a worker's registered caches (@kvconnect/checksum views): the cells of
 * attention caches by (layer, global head, token, part) and the rows of state caches by (layer,
 * state, segment, row). The fault injector uses these to find the bytes it changes, and reads
 * them back to know the ground truth (which block positions really changed).
 * @module
 */
import { DTYPE_BYTES, contiguousStrides, replicaCount, type AttentionCacheView, type StateCacheView, type StateTensor } from '@kvconnect/checksum';
import type { WorkerKVCaches } from '@kvconnect/core';
import { partAddress } from '@kvconnect/engine';

/** The layer number of a cache name (SPEC 4: its one all-digit component), or -1. */
export function layerNumber(name: string): number {
  const nums = name.split('.').filter((c) => /^[0-9]+$/.test(c));
  return nums.length === 1 ? Number(nums[0]) : -1;
}

/** One byte run of a cell part: `len` bytes at `addr` in region `region`. */
export interface ByteRun {
  region: number;
  addr: number;
  len: number;
}

/** One attention cell part, as {@link forEachAttentionCell} reports it. */
export interface AttentionCell extends ByteRun {
  /** Index of the group in the worker's `groups` (and `groupConfigs`). */
  groupIndex: number;
  groupId: number;
  view: AttentionCacheView;
  layer: number;
  /** Global head (within this cache) and this rank's local head. */
  globalHead: number;
  localHead: number;
  /** Request position of the token. */
  token: number;
  /** Part index in the cell: 0 = K (or the whole vector), 1 = V. */
  part: number;
  /** Replica index of this rank for the cache (0 = the first copy). */
  replica: number;
  /** Block position (consumer side) of the token. */
  position: number;
}

/** Which attention cells {@link forEachAttentionCell} visits (inclusive ranges; absent = all). */
export interface AttentionSelector {
  group?: number;
  layers?: readonly [number, number];
  heads?: readonly [number, number];
  /** Inclusive token range; clipped to `[firstToken, numTokens)` of the load. */
  tokens?: readonly [number, number];
  part?: 'K' | 'V';
}

const within = (x: number, r: readonly [number, number] | undefined) => r === undefined || (x >= r[0] && x <= r[1]);

/**
 * Calls `fn` for every attention cell part this worker holds that `sel` selects, for the tokens
 * `[from, to)` of a request whose block table is `table` (block ids per group).
 */
export function forEachAttentionCell(caches: WorkerKVCaches, table: readonly (readonly number[])[], from: number, to: number, sel: AttentionSelector, fn: (c: AttentionCell) => void): void {
  const tp = caches.rank.tpSize;
  caches.groups.forEach((g, gi) => {
    const groupId = caches.groupConfigs[gi]?.groupId ?? g.groupId;
    if (sel.group !== undefined && sel.group !== groupId) return;
    const blocks = table[gi];
    if (!blocks) return;
    for (const v of g.caches) {
      if (v.kind !== 'attention') continue;
      const layer = layerNumber(v.name);
      if (!within(layer, sel.layers)) continue;
      const R = replicaCount(v, tp);
      const shard = Math.floor(caches.rank.tpRank / R);
      const replica = caches.rank.tpRank % R;
      const B = v.blockSize;
      const t0 = Math.max(from, sel.tokens ? sel.tokens[0] : from);
      const t1 = Math.min(to, sel.tokens ? sel.tokens[1] + 1 : to);
      for (let h = 0; h < v.localHeads; h++) {
        const gh = shard * v.localHeads + h;
        if (!within(gh, sel.heads)) continue;
        for (let tok = t0; tok < t1; tok++) {
          const block = blocks[Math.floor(tok / B)];
          if (block === undefined || block < 0) continue;
          v.parts.forEach((p, q) => {
            if (sel.part === 'K' && q !== 0) return;
            if (sel.part === 'V' && q !== 1) return;
            fn({ groupIndex: gi, groupId, view: v, layer, globalHead: gh, localHead: h, token: tok, part: q, replica, position: Math.floor(tok / B), region: p.region, addr: partAddress(p, B, block, h, tok % B), len: p.bytes });
          });
        }
      }
    }
  });
}

/** Byte strides of a state tensor. */
export function stateStrides(s: StateTensor): number[] {
  return s.strides ? [...s.strides] : contiguousStrides(s.shape, DTYPE_BYTES[s.dtype]);
}

/** One state row, as {@link forEachStateRow} reports it. */
export interface StateRow {
  groupIndex: number;
  groupId: number;
  view: StateCacheView;
  layer: number;
  /** State index in the page (0 = conv, 1 = ssm). */
  state: number;
  /** Segment of the state's split (conv: 0 = x, 1 = B, 2 = C); 0 without a split. */
  segment: number;
  /** Row in this rank's state (along the split axis). */
  localRow: number;
  /** Segment's replicas R and this rank's replica index. */
  replicas: number;
  replica: number;
  /** Byte runs of the row's elements (one per element). */
  elems: ByteRun[];
}

/** Which state rows {@link forEachStateRow} visits (absent = all). */
export interface StateSelector {
  group?: number;
  layers?: readonly [number, number];
  /** State indices (0 = conv, 1 = ssm). */
  states?: readonly number[];
  /** Segments of the split (conv: 0 = x, 1 = B, 2 = C). */
  segments?: readonly number[];
}

/** Calls `fn` for every row of every state cache this worker holds in block `table[g][0]` (the running state). */
export function forEachStateRow(caches: WorkerKVCaches, table: readonly (readonly number[])[], sel: StateSelector, fn: (r: StateRow) => void): void {
  const tp = caches.rank.tpSize;
  caches.groups.forEach((g, gi) => {
    const groupId = caches.groupConfigs[gi]?.groupId ?? g.groupId;
    if (sel.group !== undefined && sel.group !== groupId) return;
    const blocks = table[gi];
    const block = blocks?.[blocks.length - 1];
    if (block === undefined || block < 0) return;
    for (const v of g.caches) {
      if (v.kind !== 'state') continue;
      const layer = layerNumber(v.name);
      if (!within(layer, sel.layers)) continue;
      v.states.forEach((s, k) => {
        if (sel.states && !sel.states.includes(k)) return;
        const strides = stateStrides(s);
        const eb = DTYPE_BYTES[s.dtype];
        const axis = s.split?.axis ?? 0;
        const segs = s.split?.segments ?? [[s.shape[axis], 1] as const];
        let row0 = 0;
        segs.forEach(([L, R], si) => {
          if (sel.segments && !sel.segments.includes(si)) {
            row0 += L;
            return;
          }
          for (let i = 0; i < L; i++) {
            const elems: ByteRun[] = [];
            forEachRowElement(s.shape, strides, axis, row0 + i, (off) => elems.push({ region: s.region, addr: s.offset + block * s.blockStride + off, len: eb }));
            fn({ groupIndex: gi, groupId, view: v, layer, state: k, segment: si, localRow: row0 + i, replicas: R, replica: caches.rank.tpRank % R, elems });
          }
          row0 += L;
        });
        void tp;
      });
    }
  });
}

/** Calls `fn(offset)` with the byte offset of every element of row `row` along `axis`. */
export function forEachRowElement(shape: readonly number[], strides: readonly number[], axis: number, row: number, fn: (off: number) => void): void {
  const dims = shape.map((_, d) => d).filter((d) => d !== axis);
  const idx = new Array<number>(dims.length).fill(0);
  const total = dims.reduce((a, d) => a * shape[d], 1);
  for (let k = 0; k < total; k++) {
    let off = row * strides[axis];
    for (let i = 0; i < dims.length; i++) off += idx[i] * strides[dims[i]];
    fn(off);
    for (let i = dims.length - 1; i >= 0; i--) {
      if (++idx[i] < shape[dims[i]]) break;
      idx[i] = 0;
    }
  }
}

/** Copies the bytes of `runs` out of `regions`. */
export function readRuns(regions: readonly Uint8Array[], runs: readonly ByteRun[]): Uint8Array[] {
  return runs.map((r) => regions[r.region].slice(r.addr, r.addr + r.len));
}

/** A small seeded PRNG (mulberry32) returning uint32s. */
export function prng(seed: number): () => number {
  let s = (Math.trunc(seed) ^ 0x6d2b79f5) >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return (t ^ (t >>> 14)) >>> 0;
  };
}

/** A stable 32-bit hash of a string (FNV-1a). */
export function hash32(s: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < s.length; i++) {
    h ^= s.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  // murmur3 finalizer: spreads FNV's output over every bit (FNV alone is biased on short, similar keys).
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}
