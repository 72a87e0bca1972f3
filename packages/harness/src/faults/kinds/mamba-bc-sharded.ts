/**
 * `mamba-bc-sharded` (vllm#55208): the Mamba conv state's replicated B/C rows (n_groups < TP) read
 * as a sharded slicer would: segment s of rank r from global row `sum(earlier segments' local
 * sizes * TP) + r * size`; rows past the conv state read the next state's bytes (the SSM state).
 * @module
 */
import { DTYPE_BYTES } from '@kvconnect/checksum';
import type { FaultSpec } from '../../faults.js';
import { forEachStateRow, layerNumber, type ByteRun } from '../../locate.js';
import { equal } from '../bytes.js';
import type { Fault } from '../fault.js';
import { Changes } from '../records.js';

/** The spec of Mamba B/C sliced as if sharded. */
export type MambaBcShardedSpec = Extract<FaultSpec, { kind: 'mamba-bc-sharded' }>;

/** A `mamba-bc-sharded` fault. */
export function mambaBcShardedFault(spec: MambaBcShardedSpec, index: number): Fault<MambaBcShardedSpec> {
  return {
    spec,
    index,
    needsSnapshot: false,
    consumerLoad({ caches: c, load: l }) {
      const tp = c.rank.tpSize;
      const rank = c.rank.tpRank;
      const changed = new Changes();
      c.groups.forEach((g, gi) => {
        const gc = c.groupConfigs[gi];
        if (gc.kind !== 'state' || (spec.group !== undefined && gc.groupId !== spec.group)) return;
        const table = l.blocks[gi] ?? [];
        const block = table[table.length - 1];
        if (block === undefined || block < 0) return;
        for (const v of g.caches) {
          if (v.kind !== 'state') continue;
          const conv = v.states[0];
          const split = conv.split;
          if (!split || split.segments.length < 3) continue;
          const rowBytes: ByteRun[][] = [];
          forEachStateRow(c, l.blocks, { group: gc.groupId, layers: [layerNumber(v.name), layerNumber(v.name)], states: [0] }, (r) => {
            if (r.view === v) rowBytes[r.localRow] = r.elems;
          });
          const local = split.segments.map(([L]) => L);
          const localStart = local.map((_, s) => local.slice(0, s).reduce((a, b) => a + b, 0));
          const globalSize = split.segments.map(([L, R]) => (L * tp) / R);
          const globalStart = globalSize.map((_, s) => globalSize.slice(0, s).reduce((a, b) => a + b, 0));
          const totalRows = globalSize.reduce((a, b) => a + b, 0);
          const rowLen = rowBytes[0]?.reduce((a, e) => a + e.len, 0) ?? 0;
          const next = v.states[1];
          const nextBytes = next ? c.bytes.read(next.region, next.offset + block * next.blockStride, next.shape.reduce((a, b) => a * b, 1) * DTYPE_BYTES[next.dtype]) : new Uint8Array(0);
          const readRow = (elems: ByteRun[]) => {
            const out = new Uint8Array(rowLen);
            let o = 0;
            for (const e of elems) {
              out.set(c.bytes.read(e.region, e.addr, e.len), o);
              o += e.len;
            }
            return out;
          };
          const writes: Array<[ByteRun[], Uint8Array]> = [];
          split.segments.forEach(([L, R], s) => {
            if (R <= 1) return;
            const shardedStart = local.slice(0, s).reduce((a, b) => a + b * tp, 0);
            for (let i = 0; i < L; i++) {
              const src = shardedStart + rank * L + i;
              let bytes: Uint8Array;
              if (src >= totalRows) {
                const off = (src - totalRows) * rowLen;
                bytes = new Uint8Array(rowLen);
                bytes.set(nextBytes.subarray(off, Math.min(nextBytes.length, off + rowLen)));
              } else {
                const s2 = globalStart.findIndex((st, k) => src >= st && src < st + globalSize[k]);
                const within = src - globalStart[s2];
                const [L2, R2] = split.segments[s2];
                const shard2 = Math.floor(rank / R2);
                const localIdx = R2 > 1 ? within % L2 : within - shard2 * L2;
                bytes = localIdx >= 0 && localIdx < L2 ? readRow(rowBytes[localStart[s2] + localIdx]) : new Uint8Array(rowLen);
              }
              writes.push([rowBytes[localStart[s] + i], bytes]);
            }
          });
          for (const [elems, bytes] of writes) {
            const before = readRow(elems);
            let o = 0;
            for (const e of elems) {
              c.bytes.write(e.region, e.addr, bytes.subarray(o, o + e.len));
              o += e.len;
            }
            if (!equal(before, bytes)) changed.add(gc.groupId, -1);
          }
        }
      });
      return { changed: changed.list(), detail: 'replicated conv B/C rows re-sliced as if sharded' };
    },
  };
}
