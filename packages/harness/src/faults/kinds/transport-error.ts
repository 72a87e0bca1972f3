/**
 * `transport-error`: the transport reports the selected blocks' load failed (their ids go to
 * `invalidBlockIds` and the cause, reason `transport-error`, to `loadErrors`, so the engine reports
 * the load `transfer-failed` and applies `kv_load_failure_policy`), and the selected bytes hold
 * what a failed transfer leaves (`previous` by default).
 * @module
 */
import type { FaultSpec } from '../../faults.js';
import { fillRuns } from '../bytes.js';
import type { Fault } from '../fault.js';
import { regionBlocks, regionRuns } from './region.js';

/** The spec of a transport error. */
export type TransportErrorSpec = Extract<FaultSpec, { kind: 'transport-error' }>;

/** A `transport-error` fault. */
export function transportErrorFault(spec: TransportErrorSpec, index: number): Fault<TransportErrorSpec> {
  const fill = spec.fill ?? 'previous';
  return {
    spec,
    index,
    needsSnapshot: fill === 'previous',
    consumerLoad({ caches, worker, load, snapshot, results, workerSeed }) {
      if (spec.tpRanks && !spec.tpRanks.includes(worker.tpRank)) return { changed: [], detail: `not on TP rank ${worker.tpRank}` };
      const runs = regionRuns(caches, spec, load);
      const changed = fillRuns(caches, runs, fill, workerSeed, snapshot);
      for (const b of regionBlocks(caches, spec, load)) results.invalidBlockIds.add(b);
      (results.loadErrors ??= new Map()).set(load.requestId, { reason: 'transport-error', message: `injected transport error (fault ${index})` });
      return { changed, detail: `${runs.length} runs filled with ${fill}; blocks reported invalid` };
    },
  };
}
