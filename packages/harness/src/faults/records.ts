/**
 * What the fault connector reports, and how it travels. Everything here is plain data: a worker's
 * injections and load timings reach its scheduler half in the step's worker metadata
 * ({@link FaultWorkerMeta}), and the scheduler half returns each request's ground truth with the
 * request, in the `kv_transfer_params` its `requestFinished` returns ({@link FAULT_REPORT_PARAM}):
 * the client (the harness's runner, through the P/D proxy) reads it from the result. No shared
 * object, so the halves may run in different processes.
 * @module
 */
import type { KVTransferParams } from '@kvconnect/core';
import type { FaultKind } from '../faults.js';
import type { LoadMeta } from './bytes.js';

/** Changed bytes of one group, as request positions (attention) or the running state. */
export interface ChangedGroup {
  groupId: number;
  /** Attention: sorted request positions of tokens with at least one changed byte. */
  tokens: number[];
  /** State groups: the running state changed. */
  state: boolean;
}

/** One injection: which fault hit which request on which worker, and what really changed. */
export interface InjectionRecord {
  engineId: string;
  requestId: string;
  /** Scenario request index (request id prefix `r<index>.`), if any. */
  index: number | undefined;
  faultIndex: number;
  kind: FaultKind;
  side: 'producer' | 'consumer';
  /** The worker that injected it; -1 for the scheduler half. */
  tpRank: number;
  ppRank: number;
  /** Groups whose loaded bytes changed (empty for faults that change no KV bytes). */
  changed: ChangedGroup[];
  /** What was done, in words. */
  detail: string;
}

/** Timing and size of one worker's share of one load. */
export interface LoadRecord {
  engineId: string;
  requestId: string;
  index: number | undefined;
  tpRank: number;
  ppRank: number;
  /**
   * When the load started (startLoadKv) and when it was reported finished, in epoch milliseconds
   * with sub-millisecond precision (`performance.timeOrigin + performance.now()`), so times of
   * workers in different processes of one host compare.
   */
  startedAt: number;
  finishedAt: number;
  /** KV bytes of the load held by this worker (every loaded token's cells plus the running states). */
  bytes: number;
  /** The load's first loaded token and numTokens. */
  firstToken: number;
  numTokens: number;
}

/** A worker's injection, before its scheduler half names the engine and the request index. */
export type WorkerInjection = Omit<InjectionRecord, 'engineId' | 'index'>;

/** A worker's load record, before its scheduler half names the engine and the request index. */
export type WorkerLoadRecord = Omit<LoadRecord, 'engineId' | 'index'>;

/** Worker-to-scheduler metadata of a fault worker's step: the inner connector's, and what the worker did. */
export interface FaultWorkerMeta<W = unknown> {
  /** The inner connector's `workerMeta` (absent when it gave none). */
  inner?: W;
  injections: WorkerInjection[];
  loads: WorkerLoadRecord[];
}

/** One request's ground truth on one engine, as its scheduler half returns it. */
export interface FaultReport {
  engineId: string;
  injections: InjectionRecord[];
  loads: LoadRecord[];
}

/** The `kv_transfer_params` key under which `requestFinished` returns the request's {@link FaultReport}. */
export const FAULT_REPORT_PARAM = 'kvconnect_fault_report';

/** The scenario request index of a harness request id (`r<index>.…`), or undefined. */
export function requestIndexOf(requestId: string): number | undefined {
  const m = /^r(\d+)\./.exec(requestId);
  return m ? Number(m[1]) : undefined;
}

const isRecordArray = (x: unknown): boolean => Array.isArray(x) && x.every((r) => typeof r === 'object' && r !== null && typeof (r as { requestId?: unknown }).requestId === 'string');

/**
 * The {@link FaultReport} in a request's returned params, or null when there is none.
 * @throws TypeError when the key is present but does not hold a report.
 */
export function faultReportOf(params: KVTransferParams | undefined): FaultReport | null {
  const r = params?.[FAULT_REPORT_PARAM];
  if (r === undefined) return null;
  const o = r as Partial<FaultReport>;
  if (typeof r !== 'object' || r === null || typeof o.engineId !== 'string' || !isRecordArray(o.injections) || !isRecordArray(o.loads)) {
    throw new TypeError(`kv_transfer_params.${FAULT_REPORT_PARAM} is not a fault report`);
  }
  return o as FaultReport;
}

/** `params` without the fault report (what an inner connector and the checksum scheduler see). */
export function withoutFaultReport(params: KVTransferParams): KVTransferParams {
  if (!(FAULT_REPORT_PARAM in params)) return { ...params };
  const { [FAULT_REPORT_PARAM]: _report, ...rest } = params;
  return rest;
}

/** The fields of a request's outcome that its ground truth fills (see {@link applyGroundTruth}). */
export interface GroundTruthFields {
  /** Scenario request index. */
  index: number;
  /** Fault kinds recorded for the request (appended, no duplicates). */
  faultKinds: string[];
  /** Changed consumer block positions per group id (a state group's running state: position 0). */
  injected: Map<number, number[]>;
  /** Wall time of the request's load on the consumer, ms (first start to last finish over its workers); null when no load was recorded. */
  loadWallMs: number | null;
  /** KV bytes the consumer's workers loaded for it. */
  loadBytes: number;
}

/**
 * Fills a request's ground truth from the fault reports' records: the fault kinds that hit it,
 * the consumer blocks whose loaded bytes changed (tokens outside the consumer's load, e.g. a
 * producer-side change of a prefix-cached token, are left out), its load time and bytes.
 * @param consumerIds engine ids of the consumers (loads of other engines are not the request's load)
 * @param blockSizeOf the consumer's block size, in tokens, of a group id
 */
export function applyGroundTruth(o: GroundTruthFields, records: readonly InjectionRecord[], loads: readonly LoadRecord[], consumerIds: ReadonlySet<string>, blockSizeOf: (groupId: number) => number): void {
  const mine = loads.filter((l) => l.index === o.index && consumerIds.has(l.engineId));
  if (mine.length > 0) {
    o.loadWallMs = Math.max(...mine.map((l) => l.finishedAt)) - Math.min(...mine.map((l) => l.startedAt));
    o.loadBytes = mine.reduce((a, l) => a + l.bytes, 0);
  }
  const first = mine.length ? Math.min(...mine.map((l) => l.firstToken)) : 0;
  const numTokens = mine.length ? Math.max(...mine.map((l) => l.numTokens)) : Infinity;
  const pos = new Map<number, Set<number>>();
  for (const rec of records.filter((x) => x.index === o.index)) {
    if (!o.faultKinds.includes(rec.kind)) o.faultKinds.push(rec.kind);
    if (rec.side === 'producer' && mine.length === 0) continue;
    for (const g of rec.changed) {
      const B = blockSizeOf(g.groupId);
      let set = pos.get(g.groupId);
      if (!set) pos.set(g.groupId, (set = new Set()));
      if (g.state) set.add(0);
      for (const t of g.tokens) if (t >= first && t < numTokens) set.add(Math.floor(t / B));
      if (set.size === 0) pos.delete(g.groupId);
    }
  }
  for (const [g, set] of [...pos].sort((a, b) => a[0] - b[0])) o.injected.set(g, [...set].sort((a, b) => a - b));
}

/** Accumulates changed tokens / states per group. */
export class Changes {
  private readonly m = new Map<number, { tokens: Set<number>; state: boolean }>();
  /** Marks token `token` of group `groupId` changed; a negative token marks the running state. */
  add(groupId: number, token: number): void {
    let e = this.m.get(groupId);
    if (!e) this.m.set(groupId, (e = { tokens: new Set(), state: false }));
    if (token < 0) e.state = true;
    else e.tokens.add(token);
  }
  /** The changes, groups and tokens sorted. */
  list(): ChangedGroup[] {
    return [...this.m].sort((a, b) => a[0] - b[0]).map(([groupId, e]) => ({ groupId, tokens: [...e.tokens].sort((a, b) => a - b), state: e.state }));
  }
}

/** Producer: a request whose prompt completes this step, for a `stale` fault (number `faultIndex`). */
export interface StaleOrder {
  requestId: string;
  faultIndex: number;
  /** The blocks the scheduler half saw allocated for the request, per group. */
  blocks: number[][];
  /** The prompt's tokens. */
  numTokens: number;
}

/** Scheduler-to-worker metadata of a fault connector's step (plain data). */
export interface FaultMeta<S = unknown> {
  /** The inner connector's metadata. */
  inner: S;
  /** Consumer: loads the scheduler half allocated blocks for this step. */
  loads: LoadMeta[];
  /** Producer: `stale` faults to apply this step. */
  stale: StaleOrder[];
}
