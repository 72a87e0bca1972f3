/**
 * `corrupt-region`: the selected cells / state rows of a load hold other bytes (consumer, after
 * the load): what the slots held before the load (`previous`, default: a partial write), zeros,
 * seeded random bytes, or the complement.
 * @module
 */
import type { FaultSpec } from '../../faults.js';
import { fillRuns } from '../bytes.js';
import type { Fault } from '../fault.js';
import { regionRuns } from './region.js';

/** The spec of a corrupt region. */
export type CorruptRegionSpec = Extract<FaultSpec, { kind: 'corrupt-region' }>;

/** A `corrupt-region` fault. */
export function corruptRegionFault(spec: CorruptRegionSpec, index: number): Fault<CorruptRegionSpec> {
  const fill = spec.fill ?? 'previous';
  return {
    spec,
    index,
    needsSnapshot: fill === 'previous',
    consumerLoad({ caches, worker, load, snapshot, workerSeed }) {
      if (spec.tpRanks && !spec.tpRanks.includes(worker.tpRank)) return { changed: [], detail: `not on TP rank ${worker.tpRank}` };
      const runs = regionRuns(caches, spec, load);
      return { changed: fillRuns(caches, runs, fill, workerSeed, snapshot), detail: `${runs.length} runs filled with ${fill}` };
    },
  };
}
