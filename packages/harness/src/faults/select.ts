/**
 * Which requests a fault hits (deterministic, the same on every side and in every process: a
 * pure function of the fault, its place in the list and the request id).
 * @module
 */
import type { FaultSpec } from '../faults.js';
import { hash32 } from '../locate.js';
import { requestIndexOf } from './records.js';

/** Whether fault `f` (number `i` in its list) hits request `requestId`: `requests`, `requestIds`, then the seeded `rate`. */
export function faultSelects(f: FaultSpec, i: number, requestId: string): boolean {
  const idx = requestIndexOf(requestId);
  if (f.requests && (idx === undefined || !f.requests.includes(idx))) return false;
  if (f.requestIds && !f.requestIds.some((s) => requestId.includes(s))) return false;
  const rate = f.rate ?? 1;
  if (rate >= 1) return true;
  if (rate <= 0) return false;
  const key = idx !== undefined ? `#${idx}` : requestId;
  return hash32(`${f.seed ?? 0}:${i}:${key}`) / 4294967296 < rate;
}

/** The seed of fault `f`'s random choices for a request (its scenario index when it has one, so producer and consumer agree). */
export function requestKeySeed(f: FaultSpec, i: number, requestId: string): number {
  const idx = requestIndexOf(requestId);
  return hash32(`${f.seed ?? 0}:${i}:${idx !== undefined ? `#${idx}` : requestId}:draw`);
}

/** {@link requestKeySeed} made distinct per worker (fills that differ across TP ranks and PP stages). */
export function workerSeed(f: FaultSpec, i: number, requestId: string, tpRank: number, ppRank: number): number {
  return requestKeySeed(f, i, requestId) ^ (tpRank * 7919 + ppRank * 104729);
}
