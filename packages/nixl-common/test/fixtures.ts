/**
 * Test fixtures: synthetic worker ranks (real @kvconnect/checksum views over fresh memory) and a
 * byte-level simulator of descriptor pairs, to check mappings against the logical content.
 */
import { DTYPE_BYTES, mamba2StateLayout, pagedAttentionBytes, pagedAttentionCache, pagedStateCache, vectorCache, type CacheView, type GroupSpec } from '@kvconnect/checksum';
import type { KVCacheGroupConfig, WorkerKVCaches } from '@kvconnect/core';
import { buildRankInfo, partOffset, rowElementOffsets, type Pair, type RankInfo } from '../src/index.js';

/** A model for the fixtures: attention layers (GQA), MLA layers or Mamba2 layers. */
export interface FixtureModel {
  kind: 'gqa' | 'mla' | 'mamba';
  layers: number;
  kvHeads: number;
  headDim: number;
  /** Mamba2 sizes. */
  mamba?: { numHeads: number; headDim: number; dState: number; nGroups: number; convKernel: number };
}

/** One synthetic rank: views, memory, info. */
export interface FixtureRank {
  caches: WorkerKVCaches;
  info: RankInfo;
  regions: Uint8Array[];
  base: number[];
}

let nextAddr = 0x100000;

/** Builds a rank of `m` at (tpRank, tpSize) with `blockSize`, `numBlocks`, NHD or HND. */
export function makeRank(m: FixtureModel, tpRank: number, tpSize: number, o: { blockSize: number; numBlocks: number; layout?: 'NHD' | 'HND'; kvLayout?: 'kv-first' | 'block-kv' | 'separate' }): FixtureRank {
  const regions: Uint8Array[] = [];
  const add = (n: number) => {
    regions.push(new Uint8Array(n));
    return regions.length - 1;
  };
  const caches: CacheView[] = [];
  for (let l = 0; l < m.layers; l++) {
    const name = `model.layers.${l}.attn`;
    if (m.kind === 'gqa') {
      const local = m.kvHeads >= tpSize ? m.kvHeads / tpSize : 1;
      const sizes = { dtype: 'bfloat16', numBlocks: o.numBlocks, blockSize: o.blockSize, numHeads: local, headSize: m.headDim, kvLayout: o.kvLayout ?? 'kv-first' } as const;
      const bytes = pagedAttentionBytes(sizes);
      const region = add(bytes);
      const v = sizes.kvLayout === 'separate' ? { region: add(bytes) } : undefined;
      caches.push(pagedAttentionCache({ ...sizes, name, layout: o.layout ?? 'NHD', at: { region }, v, replication: { totalKvHeads: m.kvHeads } }));
    } else if (m.kind === 'mla') {
      caches.push(vectorCache({ name, dtype: 'bfloat16', numBlocks: o.numBlocks, blockSize: o.blockSize, width: m.headDim, at: { region: add(o.numBlocks * o.blockSize * m.headDim * 2) } }));
    } else {
      const mb = m.mamba!;
      const layout = mamba2StateLayout({ tpSize, intermediateSize: mb.numHeads * mb.headDim, nGroups: mb.nGroups, dState: mb.dState, convKernel: mb.convKernel, numHeads: mb.numHeads, headDim: mb.headDim, convDimFirst: true, convDtype: 'bfloat16', ssmDtype: 'float32' })!;
      let page = 0;
      for (const s of layout.states) page += s.shape.reduce((a, b) => a * b, 1) * DTYPE_BYTES[s.dtype];
      caches.push(pagedStateCache({ name: `model.layers.${l}.mixer`, numBlocks: o.numBlocks, at: { region: add(o.numBlocks * page) }, pageBytes: page, layout }));
    }
  }
  const kind: KVCacheGroupConfig['kind'] = m.kind === 'mamba' ? 'state' : 'full-attention';
  const groups: GroupSpec[] = [{ groupId: 0, caches }];
  const groupConfigs: KVCacheGroupConfig[] = [{ groupId: 0, kind, blockSize: o.blockSize, layerNames: caches.map((c) => c.name) }];
  const wk: WorkerKVCaches = { rank: { tpRank, tpSize }, ppRank: 0, ppSize: 1, regions, groups, groupConfigs };
  const base = regions.map((r) => {
    const a = nextAddr;
    nextAddr += Math.ceil((r.byteLength + 4096) / 4096) * 4096;
    return a;
  });
  const info = buildRankInfo(wk, `agent-${tpSize}-${tpRank}-${base[0]}`, new Uint8Array([1]), regions.map((r, i) => ({ addr: base[i], length: r.byteLength, kind: 'DRAM', deviceId: 0 })));
  return { caches: wk, info, regions, base };
}

/** The byte a logical attention cell holds: (cache, global head, token, part, byte). */
export function cellByte(name: string, g: number, t: number, part: number, b: number): number {
  let h = 2166136261;
  for (const x of [name.length, g, t, part, b, name.charCodeAt(13) || 0]) h = Math.imul(h ^ x, 16777619);
  return (h >>> 24) & 0xff || 1;
}

/** The byte of a state element: (cache, state, global row, element byte). */
export function stateByte(name: string, k: number, g: number, e: number): number {
  return cellByte(name, 1000 + k, g, 7, e);
}

/** Global rows of segment s of a state: `[segmentStart, ...]` helper. */
function globalRow(split: { segments: ReadonlyArray<readonly [number, number]> }, tpRank: number, tpSize: number, localRow: number): number {
  let start = 0;
  let off = 0;
  for (const [L, R] of split.segments) {
    if (localRow < off + L) return start + Math.floor(tpRank / R) * L + (localRow - off);
    off += L;
    start += (L * tpSize) / R;
  }
  throw new Error('row out of range');
}

/** Fills a rank's caches with the logical content of `blocks` (tokens `< numTokens`, every global head / row). */
export function fill(r: FixtureRank, blocks: number[], numTokens: number): void {
  visit(r, blocks, numTokens, 0, (mem, off, want) => {
    mem[off] = want;
  });
}

/**
 * Calls `f(memory, offset, expected byte)` for every byte of the logical content of tokens
 * `[first, numTokens)` in `blocks` (attention), or of the running state (state caches).
 */
export function visit(r: FixtureRank, blocks: number[], numTokens: number, first: number, f: (mem: Uint8Array, off: number, want: number) => void): void {
  const { tpRank, tpSize } = r.caches.rank;
  for (const c of r.info.caches) {
    if (c.kind === 'attention') {
      const g0 = Math.floor(tpRank / c.replicas) * c.localHeads;
      for (let h = 0; h < c.localHeads; h++) {
        for (let t = first; t < numTokens; t++) {
          const b = blocks[Math.floor(t / c.blockSize)];
          c.parts.forEach((p, q) => {
            const off = partOffset(p, b, h, t % c.blockSize);
            for (let i = 0; i < p.bytes; i++) f(r.regions[p.region], off + i, cellByte(c.name, g0 + h, t, q, i));
          });
        }
      }
    } else {
      const b = blocks[blocks.length - 1];
      c.states.forEach((s, k) => {
        const eb = DTYPE_BYTES[s.dtype];
        const axis = s.split!.axis;
        for (let row = 0; row < s.shape[axis]; row++) {
          const g = globalRow(s.split!, tpRank, tpSize, row);
          rowElementOffsets(s.shape, s.strides, axis, row).forEach((o, e) => {
            for (let i = 0; i < eb; i++) f(r.regions[s.region], s.offset + b * s.blockStride + o + i, stateByte(c.name, k, g, e * eb + i));
          });
        }
      });
    }
  }
}

/** Copies every pair's bytes from the producer ranks' memory to the consumer's (address-resolved). */
export function simulate(pairs: readonly Pair[], src: FixtureRank, dst: FixtureRank): void {
  const at = (r: FixtureRank, addr: number, len: number): [Uint8Array, number] => {
    const i = r.base.findIndex((b, k) => addr >= b && addr + len <= b + r.regions[k].byteLength);
    if (i < 0) throw new Error(`address ${addr} outside ${r.info.agentName}`);
    return [r.regions[i], addr - r.base[i]];
  };
  for (const p of pairs) {
    const [sm, so] = at(src, p.src, p.len);
    const [dm, doff] = at(dst, p.dst, p.len);
    dm.set(sm.subarray(so, so + p.len), doff);
  }
}
