/**
 * `wrong-layout`: every loaded block of the group's attention caches reads as if written in the
 * other layout (HND <-> NHD; field: the two sides disagree on the KV cache layout). Caches with
 * kernel blocks, or neither NHD nor HND, are not modelled (an error).
 * @module
 */
import type { FaultSpec } from '../../faults.js';
import { equal } from '../bytes.js';
import type { Fault } from '../fault.js';
import { Changes } from '../records.js';

/** The spec of a wrong layout. */
export type WrongLayoutSpec = Extract<FaultSpec, { kind: 'wrong-layout' }>;

/** A `wrong-layout` fault. */
export function wrongLayoutFault(spec: WrongLayoutSpec, index: number): Fault<WrongLayoutSpec> {
  return {
    spec,
    index,
    needsSnapshot: false,
    consumerLoad({ caches: c, worker, load: l }) {
      if (spec.tpRanks && !spec.tpRanks.includes(worker.tpRank)) return null;
      const changed = new Changes();
      c.groups.forEach((g, gi) => {
        const gc = c.groupConfigs[gi];
        if (gc.kind === 'state' || (spec.group !== undefined && gc.groupId !== spec.group)) return;
        const table = l.blocks[gi] ?? [];
        for (const v of g.caches) {
          if (v.kind !== 'attention') continue;
          const B = v.blockSize;
          const H = v.localHeads;
          for (let pos = Math.floor(l.firstToken / B); pos < Math.ceil(l.numTokens / B); pos++) {
            const block = table[pos];
            if (block === undefined || block < 0) continue;
            for (const p of v.parts) {
              if ((p.kernelBlockTokens ?? B) !== B) throw new Error(`wrong-layout fault: ${v.name} uses kernel blocks, which this fault does not model`);
              const hb = p.bytes;
              const nhd = p.headStride === hb && p.tokenStride === H * hb;
              const hnd = p.tokenStride === hb && p.headStride === B * hb;
              if (!nhd && !hnd) throw new Error(`wrong-layout fault: ${v.name} is neither NHD nor HND`);
              const base = p.offset + block * p.blockStride;
              const before = c.bytes.read(p.region, base, B * H * hb);
              const out = new Uint8Array(B * H * hb);
              for (let h = 0; h < H; h++) {
                for (let t = 0; t < B; t++) {
                  const actual = nhd ? t * H * hb + h * hb : h * B * hb + t * hb;
                  const wrong = nhd ? h * B * hb + t * hb : t * H * hb + h * hb;
                  out.set(before.subarray(actual, actual + hb), wrong);
                }
              }
              c.bytes.write(p.region, base, out);
              for (let t = 0; t < B; t++) {
                const tok = pos * B + t;
                if (tok < l.firstToken || tok >= l.numTokens) continue;
                for (let h = 0; h < H; h++) {
                  const a = nhd ? t * H * hb + h * hb : h * B * hb + t * hb;
                  if (!equal(before.subarray(a, a + hb), out.subarray(a, a + hb))) changed.add(gc.groupId, tok);
                }
              }
            }
          }
        }
      });
      return { changed: changed.list(), detail: 'blocks permuted as if written in the other layout (HND <-> NHD)' };
    },
  };
}
