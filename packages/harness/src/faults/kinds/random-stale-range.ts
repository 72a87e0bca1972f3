/**
 * `random-stale-range`: one seeded range of `rangeTokens` tokens (default 16) of one layer and
 * one global head of the first attention group holds other bytes (`previous` by default), as a
 * partial stale read would leave (consumer, after the load).
 * @module
 */
import { globalHeads as globalHeadsOf } from '@kvconnect/checksum';
import type { FaultSpec } from '../../faults.js';
import { forEachAttentionCell, layerNumber, prng } from '../../locate.js';
import { attentionGroupIndex, fillRuns, type Tagged } from '../bytes.js';
import type { Fault } from '../fault.js';

/** The spec of a random stale range. */
export type RandomStaleRangeSpec = Extract<FaultSpec, { kind: 'random-stale-range' }>;

/** A `random-stale-range` fault. */
export function randomStaleRangeFault(spec: RandomStaleRangeSpec, index: number): Fault<RandomStaleRangeSpec> {
  const fill = spec.fill ?? 'previous';
  return {
    spec,
    index,
    needsSnapshot: fill === 'previous',
    consumerLoad({ caches: c, load: l, snapshot, seed }) {
      const gi = attentionGroupIndex(c, undefined);
      if (gi < 0) return { changed: [], detail: 'no attention group' };
      const gc = c.groupConfigs[gi];
      const r = prng(seed);
      const u = () => r() / 4294967296;
      const layers = gc.layerNames.map(layerNumber).filter((n) => n >= 0);
      const draws = [u(), u(), u()];
      const layer = layers[Math.floor(draws[0] * layers.length)];
      const view = c.groups[gi]?.caches.find((v) => v.kind === 'attention');
      const W = spec.rangeTokens ?? 16;
      const firstRange = Math.floor(l.firstToken / W);
      const nRanges = Math.ceil(l.numTokens / W) - firstRange;
      const k = firstRange + Math.floor(draws[2] * Math.max(1, nRanges));
      if (!view || view.kind !== 'attention') return { changed: [], detail: 'no attention cache on this worker' };
      const globalHeads = globalHeadsOf(view, c.rank.tpSize);
      const head = Math.floor(draws[1] * globalHeads);
      const runs: Tagged[] = [];
      forEachAttentionCell(c, l.blocks, l.firstToken, l.numTokens, { group: gc.groupId, layers: [layer, layer], heads: [head, head], tokens: [k * W, k * W + W - 1] }, (x) =>
        runs.push({ region: x.region, addr: x.addr, len: x.len, groupId: x.groupId, token: x.token }),
      );
      return { changed: fillRuns(c, runs, fill, seed, snapshot), detail: `layer ${layer} head ${head} tokens ${k * W}-${k * W + W - 1} filled with ${fill}` };
    },
  };
}
