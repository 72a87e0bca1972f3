/**
 * `replay-params`: the consumer's request arrives with the transfer params of an earlier request
 * (`from`: its scenario index) or with an unknown transfer reference and no digest (`"unknown"`),
 * as when a proxy retries or mixes up requests. The consumer's scheduler half gives the request a
 * copy of its params with the transfer fields replaced (the object it arrived with is left as it
 * is). `producerBlocks`: the replayed producer blocks are intact (default), zeroed, or reused
 * (random bytes), applied to the consumer's loaded bytes after the load.
 * @module
 */
import { KV_CHECKSUMS_PARAM, type KVTransferParams } from '@kvconnect/core';
import type { FaultSpec } from '../../faults.js';
import { fillRuns, loadRuns } from '../bytes.js';
import type { Fault } from '../fault.js';

/** The spec of replayed params. */
export type ReplayParamsSpec = Extract<FaultSpec, { kind: 'replay-params' }>;

/** The P/D routing flags a replay keeps from the request's own params. */
const ROUTING = ['do_remote_prefill', 'do_remote_decode'] as const;

/** A `replay-params` fault. */
export function replayParamsFault(spec: ReplayParamsSpec, index: number): Fault<ReplayParamsSpec> {
  return {
    spec,
    index,
    needsSnapshot: false,
    consumerParams({ requestId, params, paramsOf }) {
      if (spec.from === 'unknown') {
        const { [KV_CHECKSUMS_PARAM]: _digest, ...rest } = params;
        return { params: { ...rest, remote_request_id: `unknown-${requestId}` }, detail: 'unknown transfer reference (no digest)' };
      }
      const src = paramsOf(spec.from);
      if (!src) return null;
      const next: KVTransferParams = {};
      for (const [k, v] of Object.entries(src)) if (!(ROUTING as readonly string[]).includes(k)) next[k] = v;
      for (const k of ROUTING) if (k in params) next[k] = params[k];
      return { params: next, detail: `params of request ${spec.from} replayed` };
    },
    consumerLoad({ caches, load, workerSeed }) {
      const mode = spec.producerBlocks ?? 'intact';
      if (mode === 'intact') return { changed: [], detail: 'producer blocks intact' };
      return { changed: fillRuns(caches, loadRuns(caches, load), mode === 'zeroed' ? 'zero' : 'random', workerSeed, null), detail: `producer blocks ${mode} before the replayed read` };
    },
  };
}
