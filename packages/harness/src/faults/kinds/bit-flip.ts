/**
 * `bit-flip`: one bit of one loaded cell flips (consumer, after the load; field: SDC in transit or
 * in HBM). Layer, global head, token, 8-byte piece and bit are drawn from the request's seed
 * unless given; with `replicas: "first"` (default) only the first replica of a replicated head
 * changes.
 * @module
 */
import { globalHeads as globalHeadsOf } from '@kvconnect/checksum';
import type { FaultSpec } from '../../faults.js';
import { forEachAttentionCell, layerNumber, prng } from '../../locate.js';
import { attentionGroupIndex } from '../bytes.js';
import type { Fault } from '../fault.js';
import { Changes } from '../records.js';

/** The spec of a bit flip. */
export type BitFlipSpec = Extract<FaultSpec, { kind: 'bit-flip' }>;

/** A `bit-flip` fault. */
export function bitFlipFault(spec: BitFlipSpec, index: number): Fault<BitFlipSpec> {
  return {
    spec,
    index,
    needsSnapshot: false,
    consumerLoad({ caches: c, load: l, seed }) {
      const f = spec;
      const gi = attentionGroupIndex(c, f.group);
      if (gi < 0) return { changed: [], detail: 'no attention group' };
      const gc = c.groupConfigs[gi];
      const r = prng(seed);
      const u = () => r() / 4294967296;
      const layers = gc.layerNames.map(layerNumber).filter((n) => n >= 0);
      const draws = [u(), u(), u(), u(), u()];
      const layer = f.layer ?? layers[Math.floor(draws[0] * layers.length)];
      const view = c.groups[gi]?.caches.find((v) => v.kind === 'attention');
      if (!view || view.kind !== 'attention') return { changed: [], detail: `layer ${layer} not on this worker` };
      const globalHeads = globalHeadsOf(view, c.rank.tpSize);
      const head = f.head ?? Math.floor(draws[1] * globalHeads);
      const token = f.token ?? l.firstToken + Math.floor(draws[2] * Math.max(1, l.numTokens - l.firstToken));
      const cellBytes = view.parts.reduce((a, p) => a + p.bytes, 0);
      const piece = f.piece ?? Math.floor(draws[3] * Math.floor(cellBytes / 8));
      const bit = f.bit ?? Math.floor(draws[4] * 64);
      const byteInCell = piece * 8 + Math.floor(bit / 8);
      const changed = new Changes();
      forEachAttentionCell(c, l.blocks, l.firstToken, l.numTokens, { group: gc.groupId, layers: [layer, layer], heads: [head, head], tokens: [token, token] }, (x) => {
        if ((f.replicas ?? 'first') === 'first' && x.replica !== 0) return;
        let before = 0;
        for (let q = 0; q < x.part; q++) before += x.view.parts[q].bytes;
        const b = byteInCell - before;
        if (b < 0 || b >= x.len) return;
        const byte = c.bytes.read(x.region, x.addr + b, 1);
        byte[0] ^= 1 << (bit % 8);
        c.bytes.write(x.region, x.addr + b, byte);
        changed.add(x.groupId, x.token);
      });
      return { changed: changed.list(), detail: `layer ${layer} head ${head} token ${token} piece ${piece} bit ${bit}` };
    },
  };
}
