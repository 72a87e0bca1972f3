/**
 * The producer's write plan: applied by hand for every producer rank, it fills exactly the
 * consumer's loaded cells with the producer's bytes, for TP sizes 1/2/4 on either side (with GQA
 * replication), different block sizes and layouts, and TP-split states with replicated segments;
 * nothing outside the loaded tokens is touched; contiguous runs are coalesced; disagreeing
 * layouts are refused with LayoutMismatchError.
 */
import { describe, expect, it } from 'vitest';
import { pagedAttentionBytes, pagedAttentionCache, type AttentionCacheView, type StateCacheView } from '@kvconnect/checksum';
import type { HostWorkerKVCaches } from '@kvconnect/core';
import type { RegisteredRegion } from '@kvconnect/transfer';
import { LayoutMismatchError, describeLayout, partOffset, planWrites, workerMemory, type WritePlan } from '../src/layout.js';
import type { WireLoad } from '../src/protocol.js';

const KV_HEADS = 2;
const HEAD = 4; // elements
const NB = 16;
const ROWS = 4; // x rows of the state (global), plus one replicated B row
const COLS = 3;

interface Rank {
  caches: HostWorkerKVCaches;
  addrs: number[];
}

function rank(tpRank: number, tpSize: number, blockSize: number, layout: 'NHD' | 'HND', base: number, fill: boolean): Rank {
  const heads = Math.max(1, KV_HEADS / tpSize);
  const o = { dtype: 'bfloat16' as const, numBlocks: NB, blockSize, numHeads: heads, headSize: HEAD, layout, kvLayout: 'kv-first' as const };
  const attnBytes = pagedAttentionBytes(o);
  const attn: AttentionCacheView = pagedAttentionCache({ ...o, name: 'model.layers.0.self_attn.attn', at: { region: 0 }, replication: { totalKvHeads: KV_HEADS } });
  const xLocal = ROWS / tpSize;
  const rows = xLocal + 1;
  const state: StateCacheView = {
    kind: 'state',
    name: 'model.layers.1.mixer',
    numBlocks: NB,
    states: [{ dtype: 'float32', shape: [rows, COLS], region: 1, offset: 8, blockStride: rows * COLS * 4 + 4, split: { axis: 0, segments: [[xLocal, 1], [1, tpSize]] } }],
  };
  const regions = [new Uint8Array(attnBytes), new Uint8Array(8 + NB * (rows * COLS * 4 + 4))];
  if (fill) {
    // Attention: a value per (block, token, global head, part, byte), replicas equal.
    const shard = Math.floor(tpRank / Math.max(1, tpSize / KV_HEADS));
    for (let b = 0; b < NB; b++)
      for (let t = 0; t < blockSize; t++)
        for (let h = 0; h < heads; h++)
          attn.parts.forEach((p, q) => {
            const a = partOffset(p, blockSize, b, h, t);
            for (let k = 0; k < p.bytes; k++) regions[0][a + k] = (b * 31 + t * 7 + (shard * heads + h) * 13 + q * 5 + k) & 0xff;
          });
    const dv = new DataView(regions[1].buffer);
    const st = state.states[0];
    for (let b = 0; b < NB; b++)
      for (let r = 0; r < rows; r++) {
        const global = r < xLocal ? tpRank * xLocal + r : ROWS;
        for (let c = 0; c < COLS; c++) dv.setFloat32(st.offset + b * st.blockStride + (r * COLS + c) * 4, b * 1000 + global * 10 + c, true);
      }
  }
  const caches: HostWorkerKVCaches = {
    rank: { tpRank, tpSize },
    ppRank: 0,
    ppSize: 1,
    regions,
    groups: [
      { groupId: 0, caches: [attn] },
      { groupId: 1, caches: [state] },
    ],
    groupConfigs: [
      { groupId: 0, kind: 'full-attention', blockSize, layerNames: [attn.name] },
      { groupId: 1, kind: 'state', blockSize, layerNames: [state.name] },
    ],
  };
  return { caches, addrs: [base, base + 0x100000] };
}

/** Applies a plan: copies bytes from the producer's regions to the consumer's, by address. */
function apply(plan: WritePlan, p: Rank, c: Rank): void {
  const find = (r: Rank, addr: number): [Uint8Array, number] => {
    for (let i = 0; i < r.addrs.length; i++) if (addr >= r.addrs[i] && addr < r.addrs[i] + r.caches.regions[i].byteLength) return [r.caches.regions[i], addr - r.addrs[i]];
    throw new Error(`address ${addr} not registered`);
  };
  plan.local.forEach((l, i) => {
    const [src, so] = find(p, l.addr);
    const [dst, dof] = find(c, plan.remote[i].addr);
    expect(plan.remote[i].length).toBe(l.length);
    dst.set(src.subarray(so, so + l.length), dof);
  });
}

function blocksFor(n: number, first: number, bs: number): number[] {
  return Array.from({ length: Math.ceil(n / bs) }, (_, i) => first + i);
}

/** A rank's regions as an agent registered them (host memory). */
const registered = (r: { caches: { regions: readonly Uint8Array[] }; addrs: readonly number[] }): RegisteredRegion[] => r.addrs.map((addr, i) => ({ addr, length: r.caches.regions[i].byteLength, kind: 'DRAM', deviceId: 0 }));

describe('planWrites', () => {
  const combos: Array<[number, number, number, number, 'NHD' | 'HND']> = [
    [1, 1, 4, 4, 'NHD'],
    [1, 2, 4, 8, 'HND'],
    [2, 1, 8, 4, 'NHD'],
    [2, 4, 4, 4, 'HND'],
    [4, 2, 8, 8, 'NHD'],
    [1, 4, 8, 4, 'NHD'],
    [4, 1, 4, 8, 'HND'],
  ];
  for (const [tpP, tpD, Bp, Bd, layoutD] of combos) {
    it(`TP${tpP} (block ${Bp}) -> TP${tpD} (block ${Bd}, ${layoutD}): every loaded cell exactly once, nothing else`, () => {
      const N = 13;
      const first = 4;
      const producers = Array.from({ length: tpP }, (_, r) => rank(r, tpP, Bp, 'NHD', 0x10000000 * (r + 1), true));
      const pBlocks = [blocksFor(N, 2, Bp), [9]];
      for (let d = 0; d < tpD; d++) {
        const consumer = rank(d, tpD, Bd, layoutD, 0x90000000 + d * 0x1000000, false);
        const dBlocks = [blocksFor(N, 5, Bd), [3]];
        const load: WireLoad = { transferId: 't', blocks: dBlocks, firstToken: first, numTokens: N };
        const side = { tpSize: tpD, tpRank: d, regions: consumer.addrs.map((a, i) => [a, consumer.caches.regions[i].byteLength] as const), caches: describeLayout(consumer.caches) };
        let cells = 0;
        const writers = new Map<string, number>();
        for (const p of producers) {
          const plan = planWrites({ caches: p.caches, regions: registered(p), blocks: pBlocks, numTokens: N }, side, load);
          cells += plan.cells;
          // Record who wrote each destination byte range.
          plan.remote.forEach((x) => {
            for (let k = 0; k < x.length; k += 2) {
              const key = String(x.addr + k);
              writers.set(key, (writers.get(key) ?? 0) + 1);
            }
          });
          apply(plan, p, consumer);
        }
        expect([...writers.values()].every((n) => n === 1)).toBe(true);
        // Attention: loaded tokens equal the producer's logical cells; earlier tokens untouched.
        const ca = consumer.caches.groups[0].caches[0] as AttentionCacheView;
        const heads = ca.localHeads;
        const shard = Math.floor(d / Math.max(1, tpD / KV_HEADS));
        for (let t = 0; t < N; t++)
          for (let h = 0; h < heads; h++)
            ca.parts.forEach((part, q) => {
              const a = partOffset(part, Bd, dBlocks[0][Math.floor(t / Bd)], h, t % Bd);
              const gh = shard * heads + h;
              const pb = pBlocks[0][Math.floor(t / Bp)];
              for (let k = 0; k < part.bytes; k++) {
                const want = t < first ? 0 : (pb * 31 + (t % Bp) * 7 + gh * 13 + q * 5 + k) & 0xff;
                expect(consumer.caches.regions[0][a + k]).toBe(want);
              }
            });
        // State: every local row holds its global row's values from the producer's block 9.
        const sv = (consumer.caches.groups[1].caches[0] as StateCacheView).states[0];
        const dv = new DataView(consumer.caches.regions[1].buffer);
        const xLocal = ROWS / tpD;
        for (let r = 0; r < xLocal + 1; r++) {
          const global = r < xLocal ? d * xLocal + r : ROWS;
          for (let c = 0; c < COLS; c++) expect(dv.getFloat32(sv.offset + 3 * sv.blockStride + (r * COLS + c) * 4, true)).toBe(9 * 1000 + global * 10 + c);
        }
        expect(cells).toBe((N - first) * heads * 2 + (xLocal + 1) * COLS);
      }
    });
  }

  it('coalesces contiguous runs (same layout, consecutive blocks)', () => {
    const p = rank(0, 1, 4, 'NHD', 0x10000, true);
    const c = rank(0, 1, 4, 'NHD', 0x900000, false);
    const plan = planWrites(
      { caches: p.caches, regions: registered(p), blocks: [[2, 3, 4, 5], [1]], numTokens: 16 },
      { tpSize: 1, tpRank: 0, regions: c.addrs.map((a, i) => [a, c.caches.regions[i].byteLength] as const), caches: describeLayout(c.caches) },
      { transferId: 't', blocks: [[6, 7, 8, 9], [2]], firstToken: 0, numTokens: 16 },
    );
    // K run, V run, and the state's 5 rows in one run.
    expect(plan.local).toHaveLength(3);
    expect(plan.bytes).toBe(16 * 2 * 2 * HEAD * 2 + 5 * COLS * 4);
  });

  it('device KV: descriptors in the memory of each side (kind and CUDA device), the same bytes as host KV', () => {
    const p = rank(0, 1, 4, 'NHD', 0x10000, true);
    const c = rank(0, 1, 4, 'NHD', 0x900000, false);
    const load: WireLoad = { transferId: 't', blocks: [[6, 7, 8, 9], [2]], firstToken: 0, numTokens: 16 };
    const blocks = [[2, 3, 4, 5], [1]];
    const consumer = { tpSize: 1, tpRank: 0, regions: c.addrs.map((a, i) => [a, c.caches.regions[i].byteLength] as const), caches: describeLayout(c.caches) };
    const host = planWrites({ caches: p.caches, regions: registered(p), blocks, numTokens: 16 }, consumer, load);
    expect([host.localKind, host.remoteKind]).toEqual(['DRAM', 'DRAM']);
    const vram = registered(p).map((r) => ({ ...r, kind: 'VRAM' as const, deviceId: 3 }));
    const dev = planWrites({ caches: p.caches, regions: vram, blocks, numTokens: 16 }, { ...consumer, memory: { kind: 'VRAM', deviceId: 1 } }, load);
    expect([dev.localKind, dev.remoteKind]).toEqual(['VRAM', 'VRAM']);
    expect(dev.local.map((d) => [d.addr, d.length])).toEqual(host.local.map((d) => [d.addr, d.length]));
    expect(dev.remote.map((d) => [d.addr, d.length])).toEqual(host.remote.map((d) => [d.addr, d.length]));
    expect(new Set(dev.local.map((d) => d.deviceId))).toEqual(new Set([3]));
    expect(new Set(dev.remote.map((d) => d.deviceId))).toEqual(new Set([1]));
  });

  it('a worker\'s KV is in one memory: regions of several kinds or devices are refused', () => {
    const r = (kind: 'DRAM' | 'VRAM', deviceId: number): RegisteredRegion => ({ addr: 4096, length: 64, kind, deviceId });
    expect(workerMemory([r('VRAM', 2), r('VRAM', 2)])).toEqual({ kind: 'VRAM', deviceId: 2 });
    expect(workerMemory([r('DRAM', 0)])).toEqual({ kind: 'DRAM', deviceId: 0 });
    expect(() => workerMemory([r('VRAM', 0), r('DRAM', 0)])).toThrow(LayoutMismatchError);
    expect(() => workerMemory([r('VRAM', 0), r('VRAM', 1)])).toThrow(/one memory/);
  });

  const mismatch = (mutate: (c: ReturnType<typeof describeLayout>) => void, load: Partial<WireLoad> = {}, tpD = 1) => () => {
    const p = rank(0, 1, 4, 'NHD', 0x10000, true);
    const c = rank(0, tpD, 4, 'NHD', 0x900000, false);
    const caches = describeLayout(c.caches);
    mutate(caches);
    return planWrites(
      { caches: p.caches, regions: registered(p), blocks: [[2, 3], [1]], numTokens: 8 },
      { tpSize: tpD, tpRank: 0, regions: c.addrs.map((a, i) => [a, c.caches.regions[i].byteLength] as const), caches },
      { transferId: 't', blocks: [[6, 7], [2]], firstToken: 0, numTokens: 8, ...load },
    );
  };

  it('refuses disagreeing layouts and impossible loads', () => {
    expect(mismatch((c) => ((c[0] as { dtype: string }).dtype = 'float32'))).toThrow(/dtype float32 on the consumer, bfloat16 on the producer/);
    expect(mismatch((c) => (c[0] as { parts: unknown[] }).parts.pop())).toThrow(/cell parts differ/);
    expect(mismatch((c) => ((c[1] as { states: Array<{ split?: unknown }> }).states[0].split = undefined))).toThrow(/a TP split on one side only/);
    expect(mismatch(() => {}, { numTokens: 9 })).toThrow(/asks for 9 tokens; the producer computed 8/);
    expect(mismatch(() => {}, { blocks: [[6], [2]] })).toThrow(/the consumer gave no block for token 4/);
    expect(mismatch((c) => ((c[0] as { parts: Array<{ offset: number }> }).parts[1].offset = 1 << 30))).toThrow(/outside region/);
    expect(mismatch((c) => ((c[0] as { localHeads: number }).localHeads = 1 << 20))).toThrow(/2 KV heads do not shard into 1048576 per rank at TP 1/);
    expect(mismatch((c) => ((c[1] as { states: Array<{ split: { segments: number[][] } }> }).states[0].split.segments[1] = [1, 2]), {}, 1)).toThrow(/segment 1: 0.5 rows on the consumer, 1 on the producer/);
    expect(mismatch(() => {})).not.toThrow();
    // SPEC 1: 3 KV heads at TP 4 have no replica count (R = 4/3); the layout is refused, not floored to R = 1.
    const noR = mismatch((c) => ((c[0] as { replication?: unknown }).replication = { totalKvHeads: 3 }), {}, 4);
    expect(noR).toThrow(LayoutMismatchError);
    expect(noR).toThrow(/cannot tell the replicas of 3 KV heads at TP 4/);
    for (const f of [mismatch((c) => ((c[0] as { dtype: string }).dtype = 'float32'))]) expect(f).toThrow(LayoutMismatchError);
  });

  it('skips caches this producer worker does not hold (another PP stage)', () => {
    const plan = mismatch((c) => c.forEach((x) => (x.name = `other.${x.name}`)))();
    expect(plan.local).toHaveLength(0);
  });
});
