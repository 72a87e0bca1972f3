/**
 * `stale`: the producer's blocks of a finished request hold other bytes before the consumer reads
 * them (field: the lease expired and the freed blocks were reused). The producer worker overwrites
 * them in the step that computes the request's last prompt tokens, after that step's forward
 * pass and KV checksum sums (so the payload describes the right KV) and before the request
 * finishes and any consumer can read; with `restore` (default) it writes the bytes back once the
 * inner connector reports the request in `finishedSending`. `fill: "none"`: blocks freed but not
 * overwritten yet (nothing changes).
 *
 * The blocks are those the producer's scheduler half saw allocated for the request
 * (`updateStateAfterAlloc`): the whole prompt unless the producer chunks its prefill, in which
 * case later chunks' tokens are left as they are (the record says which tokens changed).
 * @module
 */
import type { FaultSpec } from '../../faults.js';
import { fillRuns, loadRuns } from '../bytes.js';
import type { Fault } from '../fault.js';

/** The spec of stale producer blocks. */
export type StaleSpec = Extract<FaultSpec, { kind: 'stale' }>;

/** A `stale` fault. */
export function staleFault(spec: StaleSpec, index: number): Fault<StaleSpec> {
  const fill = spec.fill ?? 'random';
  return {
    spec,
    index,
    needsSnapshot: false,
    producerBlocks({ caches, load, workerSeed, keep }) {
      if (fill === 'none') return { changed: [], detail: 'blocks freed but not overwritten' };
      const runs = loadRuns(caches, load);
      if (spec.restore !== false) keep(runs.map((r) => [r, caches.bytes.read(r.region, r.addr, r.len)] as const));
      return { changed: fillRuns(caches, runs, fill, workerSeed, null), detail: `producer blocks overwritten (${fill}) before the read` };
    },
  };
}
