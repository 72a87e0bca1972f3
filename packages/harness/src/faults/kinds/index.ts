/**
 * The fault of a spec: one case per fault kind (the compiler checks the switch is exhaustive; a
 * kind that reaches it unvalidated is a typed error, never ignored).
 * @module
 */
import type { FaultSpec } from '../../faults.js';
import type { Fault } from '../fault.js';
import { bitFlipFault } from './bit-flip.js';
import { corruptRegionFault } from './corrupt-region.js';
import { mambaBcShardedFault } from './mamba-bc-sharded.js';
import { misplacedBlockFault } from './misplaced-block.js';
import { misplacedTokensFault } from './misplaced-tokens.js';
import { notifFault } from './notif.js';
import { payloadFault } from './payload.js';
import { randomStaleRangeFault } from './random-stale-range.js';
import { replayParamsFault } from './replay-params.js';
import { staleFault } from './stale.js';
import { transportErrorFault } from './transport-error.js';
import { wrongLayoutFault } from './wrong-layout.js';

/** A fault kind that is not one of `FAULT_KINDS` (a spec that skipped `checkFault`). */
export class UnknownFaultKindError extends Error {
  constructor(readonly kind: unknown) {
    super(`unknown fault kind ${JSON.stringify(kind)}`);
    this.name = 'UnknownFaultKindError';
  }
}

/**
 * The fault of `spec`, number `index` in its list.
 * @throws UnknownFaultKindError for a kind outside `FAULT_KINDS`.
 */
export function createFault(spec: FaultSpec, index: number): Fault {
  switch (spec.kind) {
    case 'bit-flip':
      return bitFlipFault(spec, index);
    case 'corrupt-region':
      return corruptRegionFault(spec, index);
    case 'misplaced-block':
      return misplacedBlockFault(spec, index);
    case 'misplaced-tokens':
      return misplacedTokensFault(spec, index);
    case 'stale':
      return staleFault(spec, index);
    case 'wrong-layout':
      return wrongLayoutFault(spec, index);
    case 'mamba-bc-sharded':
      return mambaBcShardedFault(spec, index);
    case 'payload':
      return payloadFault(spec, index);
    case 'notif':
      return notifFault(spec, index);
    case 'transport-error':
      return transportErrorFault(spec, index);
    case 'replay-params':
      return replayParamsFault(spec, index);
    case 'random-stale-range':
      return randomStaleRangeFault(spec, index);
    default: {
      const never: never = spec;
      throw new UnknownFaultKindError((never as { kind?: unknown }).kind);
    }
  }
}

export { mutatePayload } from './payload.js';
export { newNotifState, releaseHeldReports } from './notif.js';
