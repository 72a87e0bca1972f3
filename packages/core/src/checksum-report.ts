/**
 * What the checksum scheduler and workers exchange: the step metadata
 * (`SchedulerOutput.kvChecksumMetadata`, scheduler -> workers) and the worker report
 * (`KVConnectorOutput.kvChecksumReport`, worker -> scheduler), with a JSON-safe form of the report
 * for engines that move reports across processes.
 *
 * Both in-memory forms are plain data: they survive `structuredClone` (Map, bigint,
 * BigUint64Array and Uint8Array are cloneable). {@link encodeReport} / {@link decodeReport} convert a
 * report to and from a form `JSON.stringify` accepts (bigints as decimal strings, bytes as base64).
 * @module
 */
import { decodeFineSums, encodeFineSums, type GroupKind, type WorkerGroupRecord } from '@kvconnect/checksum';
import type { LocalizedEntry, LocalizeStepEntry } from './checksum-localize.js';

/** The blocks of one request in one group to sum (attention: consecutive positions from `start`; state: the running-state block, `start` 0). */
export interface StepGroupEntry {
  groupId: number;
  /** Block position of `blockIds[0]`. */
  start: number;
  /** Physical block ids (state groups: exactly one). */
  blockIds: number[];
  /** Sampled checking: the indices into `blockIds` to sum, ascending (absent: every block). */
  sample?: number[];
  /** Producer: also sum this group's blocks as sub-blocks of this many tokens (checksum-sub-blocks.ts). */
  subBlockSize?: number;
}

/** One request to sum in a step. */
export interface StepEntry {
  requestId: string;
  /** The request's tokens whose KV the blocks hold (SPEC 2 numTokens). */
  numTokens: number;
  groups: StepGroupEntry[];
}

/** `SchedulerOutput.kvChecksumMetadata` of one step (JSON-safe). */
export interface ChecksumStepMeta {
  /** Producer: requests whose prompt KV this step's forward completes (summed after it, replica 0). */
  send: StepEntry[];
  /** Consumer: loads scheduled this step (summed, every replica, when the load finishes). */
  recv: StepEntry[];
  /** Requests the workers should forget (finished, aborted or verified loads). */
  drop: string[];
  /** Consumer: fine sums to compute now, before this step's forward pass (mismatched loads, checksum-localize.ts). Absent: none. */
  localize?: LocalizeStepEntry[];
}

/** One group of one request in a worker report: the worker's record plus what its plan says about the group. */
export interface ReportGroup extends WorkerGroupRecord {
  groupId: number;
  /** The worker's plan kind; null when the worker holds no cache of the group (e.g. another PP stage's layers). */
  kind: GroupKind | null;
  /** The worker's plan fingerprint of the group (SPEC 5; the group's is the sum over PP stages), uint64. */
  fingerprint: bigint;
  /** Producer: the group's values at sub-block size `blockSize` (docs/checksum-extensions.md section 1), when asked for. */
  sub?: WorkerGroupRecord & { blockSize: number };
}

/** One request in a worker report. */
export interface ReportEntry {
  requestId: string;
  numTokens: number;
  groups: ReportGroup[];
}

/** `KVConnectorOutput.kvChecksumReport`: what one worker summed in one step. */
export interface KVChecksumReport {
  ppRank: number;
  tpRank: number;
  /** Producer sums (replica 0 only) of this step's send entries. */
  sends: ReportEntry[];
  /** Consumer sums (every replica) of loads that finished this step. */
  recvs: ReportEntry[];
  /** Connector-carried payloads received this step (first copy per request on this worker). */
  received: Array<{ requestId: string; payload: Uint8Array }>;
  /** Wall seconds this worker spent summing, per side. */
  seconds: { send: number; recv: number };
  /** KV bytes this worker summed, per side. */
  bytes: { send: number; recv: number };
  /**
   * Requests whose sums this worker submitted this step to a device backend and will report in a
   * later step's `sends` / `recvs` (the scheduler waits for them, up to its deadline). Absent: none.
   */
  inFlight?: { sends: string[]; recvs: string[] };
  /** Consumer: fine sums of this step's `localize` orders (checksum-localize.ts). Absent: none. */
  localized?: LocalizedEntry[];
}

/** The JSON-safe form of a {@link KVChecksumReport} (see {@link encodeReport}). */
export interface EncodedReport {
  format: typeof REPORT_JSON_FORMAT;
  ppRank: number;
  tpRank: number;
  sends: EncodedEntry[];
  recvs: EncodedEntry[];
  received: Array<{ requestId: string; payload: string }>;
  seconds: { send: number; recv: number };
  bytes: { send: number; recv: number };
  inFlight?: { sends: string[]; recvs: string[] };
  /** Fine sums in their wire form (`encodeFineSums`), values base64. */
  localized?: Array<{ requestId: string; groups: Array<{ groupId: number; keys: number[][]; values: string; error?: string }> }>;
}

/** A {@link ReportEntry} in JSON-safe form. */
export interface EncodedEntry {
  requestId: string;
  numTokens: number;
  groups: Array<{
    groupId: number;
    kind: GroupKind | null;
    fingerprint: string;
    start: number;
    nBlocks: number;
    skipped: boolean;
    skipReason?: string;
    /** Replica key `"R:r"` -> decimal uint64 strings, one per block. */
    partials: Record<string, string[]>;
    /** {@link ReportGroup.sub}, partials as above. */
    sub?: { blockSize: number; start: number; nBlocks: number; partials: Record<string, string[]> };
  }>;
}

/** The `format` tag of {@link EncodedReport}. */
export const REPORT_JSON_FORMAT = 'kvconnect-checksum-report/json-1';

/** An empty report of a worker. */
export function emptyReport(ppRank: number, tpRank: number): KVChecksumReport {
  return { ppRank, tpRank, sends: [], recvs: [], received: [], seconds: { send: 0, recv: 0 }, bytes: { send: 0, recv: 0 } };
}

function encodeEntry(e: ReportEntry): EncodedEntry {
  return {
    requestId: e.requestId,
    numTokens: e.numTokens,
    groups: e.groups.map((g) => {
      const partials: Record<string, string[]> = {};
      for (const [k, v] of g.partials) partials[k] = Array.from(v, (x) => x.toString());
      const out: EncodedEntry['groups'][number] = { groupId: g.groupId, kind: g.kind, fingerprint: g.fingerprint.toString(), start: g.start, nBlocks: g.nBlocks, skipped: g.skipped, partials };
      if (g.skipReason !== undefined) out.skipReason = g.skipReason;
      if (g.sub) {
        const sp: Record<string, string[]> = {};
        for (const [k, v] of g.sub.partials) sp[k] = Array.from(v, (x) => x.toString());
        out.sub = { blockSize: g.sub.blockSize, start: g.sub.start, nBlocks: g.sub.nBlocks, partials: sp };
      }
      return out;
    }),
  };
}

/**
 * A report in JSON-safe form: bigints as decimal strings, payload bytes as base64. Lossless:
 * `decodeReport(JSON.parse(JSON.stringify(encodeReport(r))))` equals `r`.
 */
export function encodeReport(r: KVChecksumReport): EncodedReport {
  const out: EncodedReport = {
    format: REPORT_JSON_FORMAT,
    ppRank: r.ppRank,
    tpRank: r.tpRank,
    sends: r.sends.map(encodeEntry),
    recvs: r.recvs.map(encodeEntry),
    received: r.received.map((x) => ({ requestId: x.requestId, payload: Buffer.from(x.payload.buffer, x.payload.byteOffset, x.payload.byteLength).toString('base64') })),
    seconds: { ...r.seconds },
    bytes: { ...r.bytes },
  };
  if (r.inFlight) out.inFlight = { sends: [...r.inFlight.sends], recvs: [...r.inFlight.recvs] };
  if (r.localized) {
    out.localized = r.localized.map((l) => ({
      requestId: l.requestId,
      groups: l.groups.map((g) => {
        const w = encodeFineSums(g.sums);
        return { groupId: g.groupId, keys: w.keys, values: Buffer.from(w.values).toString('base64'), ...(g.error !== undefined ? { error: g.error } : {}) };
      }),
    }));
  }
  return out;
}

/** Raised by {@link decodeReport} for a value that is not an encoded report. */
export class ReportFormatError extends Error {
  constructor(message: string) {
    super(`invalid KV checksum report: ${message}`);
    this.name = 'ReportFormatError';
  }
}

const isObj = (x: unknown): x is Record<string, unknown> => typeof x === 'object' && x !== null && !Array.isArray(x);
const isCount = (x: unknown): x is number => typeof x === 'number' && Number.isSafeInteger(x) && x >= 0;

function u64(s: unknown, what: string): bigint {
  if (typeof s !== 'string' || !/^[0-9]{1,20}$/.test(s)) throw new ReportFormatError(`${what}: expected a decimal uint64 string`);
  const v = BigInt(s);
  if (v >= 1n << 64n) throw new ReportFormatError(`${what}: ${s} is past 2^64`);
  return v;
}

function decodeEntry(x: unknown, what: string): ReportEntry {
  if (!isObj(x) || typeof x.requestId !== 'string' || !isCount(x.numTokens) || !Array.isArray(x.groups)) throw new ReportFormatError(`${what}: bad entry`);
  return {
    requestId: x.requestId,
    numTokens: x.numTokens,
    groups: x.groups.map((g: unknown, i) => {
      const w = `${what}.groups[${i}]`;
      if (!isObj(g) || !isCount(g.groupId) || !isCount(g.start) || !isCount(g.nBlocks) || typeof g.skipped !== 'boolean' || !isObj(g.partials)) throw new ReportFormatError(`${w}: bad group`);
      if (!(g.kind === null || g.kind === 'attention' || g.kind === 'state' || g.kind === 'state-local')) throw new ReportFormatError(`${w}: bad kind`);
      const partials = new Map<string, BigUint64Array>();
      for (const [k, v] of Object.entries(g.partials)) {
        if (!Array.isArray(v)) throw new ReportFormatError(`${w}.partials.${k}: expected an array`);
        partials.set(k, BigUint64Array.from(v.map((s, j) => u64(s, `${w}.partials.${k}[${j}]`))));
      }
      const out: ReportGroup = { groupId: g.groupId, kind: g.kind, fingerprint: u64(g.fingerprint, `${w}.fingerprint`), start: g.start, nBlocks: g.nBlocks, skipped: g.skipped, partials };
      if (typeof g.skipReason === 'string') out.skipReason = g.skipReason;
      if (g.sub !== undefined) {
        const s = g.sub;
        if (!isObj(s) || !isCount(s.blockSize) || !isCount(s.start) || !isCount(s.nBlocks) || !isObj(s.partials)) throw new ReportFormatError(`${w}.sub: bad sub-block record`);
        const sp = new Map<string, BigUint64Array>();
        for (const [k, v] of Object.entries(s.partials)) {
          if (!Array.isArray(v)) throw new ReportFormatError(`${w}.sub.partials.${k}: expected an array`);
          sp.set(k, BigUint64Array.from(v.map((x, j) => u64(x, `${w}.sub.partials.${k}[${j}]`))));
        }
        out.sub = { blockSize: s.blockSize, start: s.start, nBlocks: s.nBlocks, skipped: false, partials: sp };
      }
      return out;
    }),
  };
}

/**
 * The report an {@link encodeReport} result (or its `JSON.parse`d text) holds.
 * @throws ReportFormatError for anything else.
 */
export function decodeReport(x: unknown): KVChecksumReport {
  if (!isObj(x) || x.format !== REPORT_JSON_FORMAT) throw new ReportFormatError(`expected format ${REPORT_JSON_FORMAT}`);
  if (!isCount(x.ppRank) || !isCount(x.tpRank) || !Array.isArray(x.sends) || !Array.isArray(x.recvs) || !Array.isArray(x.received)) throw new ReportFormatError('bad fields');
  const pair = (v: unknown, what: string) => {
    if (!isObj(v) || typeof v.send !== 'number' || typeof v.recv !== 'number') throw new ReportFormatError(`${what}: expected {send, recv}`);
    return { send: v.send, recv: v.recv };
  };
  const ids = (v: unknown, what: string): string[] => {
    if (!Array.isArray(v) || !v.every((s) => typeof s === 'string')) throw new ReportFormatError(`${what}: expected request ids`);
    return v as string[];
  };
  let inFlight: KVChecksumReport['inFlight'];
  if (x.inFlight !== undefined) {
    if (!isObj(x.inFlight)) throw new ReportFormatError('inFlight: expected {sends, recvs}');
    inFlight = { sends: ids(x.inFlight.sends, 'inFlight.sends'), recvs: ids(x.inFlight.recvs, 'inFlight.recvs') };
  }
  const report: KVChecksumReport = {
    ppRank: x.ppRank,
    tpRank: x.tpRank,
    sends: x.sends.map((e, i) => decodeEntry(e, `sends[${i}]`)),
    recvs: x.recvs.map((e, i) => decodeEntry(e, `recvs[${i}]`)),
    received: x.received.map((r: unknown, i) => {
      if (!isObj(r) || typeof r.requestId !== 'string' || typeof r.payload !== 'string') throw new ReportFormatError(`received[${i}]: bad entry`);
      return { requestId: r.requestId, payload: new Uint8Array(Buffer.from(r.payload, 'base64')) };
    }),
    seconds: pair(x.seconds, 'seconds'),
    bytes: pair(x.bytes, 'bytes'),
  };
  if (inFlight) report.inFlight = inFlight;
  if (x.localized !== undefined) {
    if (!Array.isArray(x.localized)) throw new ReportFormatError('localized: expected an array');
    report.localized = x.localized.map((l: unknown, i) => {
      if (!isObj(l) || typeof l.requestId !== 'string' || !Array.isArray(l.groups)) throw new ReportFormatError(`localized[${i}]: bad entry`);
      return {
        requestId: l.requestId,
        groups: l.groups.map((g: unknown, j) => {
          if (!isObj(g) || !isCount(g.groupId) || typeof g.values !== 'string' || (g.error !== undefined && typeof g.error !== 'string')) throw new ReportFormatError(`localized[${i}].groups[${j}]: bad group`);
          let sums;
          try {
            sums = decodeFineSums(g.keys, new Uint8Array(Buffer.from(g.values, 'base64')));
          } catch (e) {
            throw new ReportFormatError(`localized[${i}].groups[${j}]: ${e instanceof Error ? e.message : String(e)}`);
          }
          return g.error === undefined ? { groupId: g.groupId, sums } : { groupId: g.groupId, sums, error: g.error as string };
        }),
      };
    });
  }
  return report;
}

/** True if `x` looks like an in-memory {@link KVChecksumReport} (shape check of the top level). */
export function isReport(x: unknown): x is KVChecksumReport {
  return isObj(x) && isCount(x.ppRank) && isCount(x.tpRank) && Array.isArray(x.sends) && Array.isArray(x.recvs) && Array.isArray(x.received);
}
