/**
 * `misplaced-block`: the block at one position of a load holds the block `offset` positions later
 * (consumer, after the load; field: block tables misaligned between the sides). Default: the first
 * loaded position, offset 1.
 * @module
 */
import type { FaultSpec } from '../../faults.js';
import { groupIndex } from '../bytes.js';
import type { Fault } from '../fault.js';
import { moveTokens } from './move.js';

/** The spec of a misplaced block. */
export type MisplacedBlockSpec = Extract<FaultSpec, { kind: 'misplaced-block' }>;

/** A `misplaced-block` fault. */
export function misplacedBlockFault(spec: MisplacedBlockSpec, index: number): Fault<MisplacedBlockSpec> {
  return {
    spec,
    index,
    needsSnapshot: false,
    consumerLoad({ caches, load }) {
      const gi = groupIndex(caches, spec.group, 'attention');
      if (gi < 0) return null;
      const { blockSize: B, groupId } = caches.groupConfigs[gi];
      const pos = spec.position ?? Math.floor(load.firstToken / B);
      const off = spec.offset ?? 1;
      return { changed: moveTokens(caches, load, groupId, [pos * B, pos * B + B - 1], off * B), detail: `block position ${pos} <- position ${pos + off}` };
    },
  };
}
