/**
 * `notif`: a consumer worker's report of a finished load (`finished-recving`) or of a
 * connector-carried payload (`kv-checksums`) is dropped, repeated in the next step, or delayed
 * by `steps` steps (field: lost, duplicated or late transfer notifications). Optionally on some
 * TP ranks only. The held reports live in the worker's {@link NotifState}, passed in.
 * @module
 */
import type { TransferResults } from '@kvconnect/core';
import type { FaultSpec } from '../../faults.js';
import type { Fault, NotifState, ResultHit } from '../fault.js';

/** The spec of a notif fault. */
export type NotifSpec = Extract<FaultSpec, { kind: 'notif' }>;

/** A fresh notif state (one per consumer worker). */
export function newNotifState(): NotifState {
  return { repeat: [], delayed: [], done: new Set() };
}

/** Puts back the reports repeated from the previous step and the delays that ran out (call once per step, before the notif faults). */
export function releaseHeldReports(state: NotifState, res: TransferResults): void {
  for (const r of state.repeat.splice(0)) {
    if (r.target === 'finished-recving') res.finishedRecving.add(r.id);
    else if (r.bytes && !res.kvChecksums.has(r.id)) res.kvChecksums.set(r.id, r.bytes);
  }
  for (const d of state.delayed) d.left--;
  for (let k = state.delayed.length - 1; k >= 0; k--) {
    const d = state.delayed[k];
    if (d.left > 0) continue;
    state.delayed.splice(k, 1);
    if (d.target === 'finished-recving') res.finishedRecving.add(d.id);
    else if (d.bytes) res.kvChecksums.set(d.id, d.bytes);
  }
}

/** A `notif` fault. */
export function notifFault(spec: NotifSpec, index: number): Fault<NotifSpec> {
  return {
    spec,
    index,
    needsSnapshot: false,
    consumerNotifs({ worker, results: res, state, selects }) {
      if (spec.tpRanks && !spec.tpRanks.includes(worker.tpRank)) return [];
      const hits: ResultHit[] = [];
      for (const id of new Set([...res.finishedRecving, ...res.kvChecksums.keys()])) {
        if (!selects(id)) continue;
        const key = `${index}:${spec.target}:${id}`;
        if (state.done.has(key)) continue;
        const has = spec.target === 'finished-recving' ? res.finishedRecving.has(id) : res.kvChecksums.has(id);
        if (!has) continue;
        state.done.add(key);
        const bytes = res.kvChecksums.get(id);
        if (spec.mode === 'duplicate') state.repeat.push({ id, target: spec.target, bytes, left: 0 });
        else {
          if (spec.target === 'finished-recving') res.finishedRecving.delete(id);
          else res.kvChecksums.delete(id);
          if (spec.mode === 'delay') state.delayed.push({ id, left: spec.steps ?? 3, target: spec.target, bytes });
        }
        hits.push({ requestId: id, detail: `${spec.target} report ${spec.mode}${spec.mode === 'delay' ? ` by ${spec.steps ?? 3} steps` : ''} on TP rank ${worker.tpRank}` });
      }
      return hits;
    },
  };
}
