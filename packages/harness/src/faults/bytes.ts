/**
 * Byte-level helpers the faults share: the byte runs of a load in a worker's registered caches,
 * snapshots, fills, and change accounting (ground truth: only bytes that really changed count).
 * @module
 */
import type { WorkerKVCaches } from '@kvconnect/core';
import type { Fill } from '../faults.js';
import { forEachAttentionCell, forEachStateRow, prng, type ByteRun } from '../locate.js';
import type { FaultCaches } from './kv-bytes.js';
import { Changes, type ChangedGroup } from './records.js';

/** A load (or a finished request's blocks) as the fault connector tracks it; plain data. */
export interface LoadMeta {
  requestId: string;
  /** The request's whole block table (local prefix hit included), per group. */
  blocks: number[][];
  /** The first loaded token and the load's numTokens: tokens `[firstToken, numTokens)`. */
  firstToken: number;
  numTokens: number;
}

/** A byte run with its place in the load, for change accounting. */
export interface Tagged extends ByteRun {
  groupId: number;
  /** Token position (attention), or -1 for a state row. */
  token: number;
}

/** Bytes of a load before it landed, by `region:addr` (for fills with `previous`). */
export type Snapshot = Map<string, Uint8Array>;

/** True when `a` and `b` hold the same bytes. */
export function equal(a: Uint8Array, b: Uint8Array): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

/** Byte runs of a load on this worker: every loaded token's cells and the running states. */
export function loadRuns(c: WorkerKVCaches, l: LoadMeta): Tagged[] {
  const out: Tagged[] = [];
  forEachAttentionCell(c, l.blocks, l.firstToken, l.numTokens, {}, (x) => out.push({ region: x.region, addr: x.addr, len: x.len, groupId: x.groupId, token: x.token }));
  forEachStateRow(c, l.blocks, {}, (r) => {
    for (const e of r.elems) out.push({ ...e, groupId: r.groupId, token: -1 });
  });
  return out;
}

/** KV bytes of a load held by this worker. */
export function loadBytes(c: WorkerKVCaches, l: LoadMeta): number {
  return loadRuns(c, l).reduce((a, r) => a + r.len, 0);
}

/** The bytes of a load's slots now (before the load lands). */
export function snapshot(c: FaultCaches, l: LoadMeta): Snapshot {
  const m: Snapshot = new Map();
  for (const r of loadRuns(c, l)) m.set(`${r.region}:${r.addr}`, c.bytes.read(r.region, r.addr, r.len));
  return m;
}

/**
 * Writes `fill` over `runs`: zeros, seeded random bytes, the bitwise complement, or the bytes of
 * `snap` (`previous`; zeros where it has none).
 * @returns the groups whose bytes changed (tokens / state).
 */
export function fillRuns(c: FaultCaches, runs: readonly Tagged[], fill: Fill, seed: number, snap: Snapshot | null): ChangedGroup[] {
  const rnd = prng(seed);
  const changed = new Changes();
  for (const r of runs) {
    const before = c.bytes.read(r.region, r.addr, r.len);
    let next: Uint8Array;
    if (fill === 'zero') next = new Uint8Array(r.len);
    else if (fill === 'random') next = Uint8Array.from(before, () => rnd() & 0xff);
    else if (fill === 'invert') next = Uint8Array.from(before, (b) => ~b & 0xff);
    else next = snap?.get(`${r.region}:${r.addr}`) ?? new Uint8Array(r.len);
    c.bytes.write(r.region, r.addr, next);
    if (!equal(before, next)) changed.add(r.groupId, r.token);
  }
  return changed.list();
}

/** Writes each `[run, bytes]` (all read before any is written), returning the groups whose bytes changed. */
export function writeRuns(c: FaultCaches, writes: ReadonlyArray<readonly [Tagged, Uint8Array]>): ChangedGroup[] {
  const changed = new Changes();
  for (const [r, bytes] of writes) {
    if (!equal(c.bytes.read(r.region, r.addr, r.len), bytes)) changed.add(r.groupId, r.token);
    c.bytes.write(r.region, r.addr, bytes);
  }
  return changed.list();
}

/** Index of the group `groupId`, or of the first group of `kind` that holds caches on this worker; -1 for none. */
export function groupIndex(c: WorkerKVCaches, groupId: number | undefined, kind: 'attention' | 'state'): number {
  if (groupId !== undefined) return c.groupConfigs.findIndex((g) => g.groupId === groupId);
  return c.groupConfigs.findIndex((g, gi) => (kind === 'state' ? g.kind === 'state' : g.kind !== 'state') && c.groups[gi]?.caches.length > 0);
}

/** Index of the group `groupId`, or of the first attention group of the engine (held here or not); -1 for none. */
export function attentionGroupIndex(c: WorkerKVCaches, groupId: number | undefined): number {
  if (groupId !== undefined) return c.groupConfigs.findIndex((g) => g.groupId === groupId);
  return c.groupConfigs.findIndex((g) => g.kind !== 'state');
}
