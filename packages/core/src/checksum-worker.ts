/**
 * The KV checksum worker (ARCHITECTURE steps 3 and 7; upstream `KVChecksumWorker`): one per worker
 * (TP rank x PP stage). Sums the blocks the checksum scheduler names in its step metadata:
 * producer sends after the forward pass that wrote them (replica 0 only, SPEC 2), consumer loads
 * as soon as the connector reports them finished, before any forward pass reads them (every
 * replica, SPEC 2 / 8). One backend call per side per step. Never blocks on the network.
 *
 * Device KV (the worker's regions are CUDA device memory, with the `cuda` backend or an emulated
 * device): one submit per side per step on the engine's stream (`WorkerKVCaches.stream`), no host
 * synchronization in the step; the report of the submit step lists the requests in
 * `inFlight`, and their records come in the report of the step whose {@link takeReport} polled
 * them done. The scheduler waits for them (checksum-scheduler.ts).
 * @module
 */
import { performance } from 'node:perf_hooks';
import {
  BlockChecksummer,
  ENTRY_ATTN,
  ENTRY_ROWS,
  ENTRY_STREAM,
  type BackendName,
  type BlockRun,
  type ChecksumBackend,
  type DeviceChecksumProvider,
  type GroupPlan,
  type WorkerGroupRecord,
} from '@kvconnect/checksum';
import type { KVChecksumWorkerHooks } from './checksum-hooks.js';
import type { KVTransferConfig, TransferResults, WorkerKVCaches } from './connector.js';
import { SubBlockSums } from './checksum-sub-blocks.js';
import { localizeOnRank, type DeviceRegionReader } from './checksum-localize.js';
import { emptyReport, type ChecksumStepMeta, type KVChecksumReport, type ReportEntry, type ReportGroup, type StepEntry } from './checksum-report.js';

export { encodeReport, decodeReport, ReportFormatError, REPORT_JSON_FORMAT, type EncodedReport, type KVChecksumReport, type ReportEntry, type ReportGroup } from './checksum-report.js';

/** Options of a {@link KVChecksumWorker}. */
export interface KVChecksumWorkerOptions {
  /** The transfer config; when given and `enable_kv_checksum` is false the worker does nothing. */
  config?: KVTransferConfig;
  /**
   * Checksum backend. Host KV: `auto` (native when the addon loads, else ts), `ts`, `native`, or a
   * host backend object. Device KV: `cuda`, or a device provider (`cudaDeviceProvider()`, an
   * `EmulatedDevice`); each side (producer, consumer) gets its own context. Default `auto`.
   */
  backend?: BackendName | 'auto' | ChecksumBackend | DeviceChecksumProvider;
  /** Called when summing a step fails (a bug or invalid block ids); default: nothing (the groups are reported skipped). */
  onError?: (error: unknown, requestIds: string[]) => void;
  /**
   * Reads device KV into host memory for a drill-down's fine sums (`docs/localize.md`;
   * `@kvconnect/transfer` `readDeviceBytes`). Absent: a group in device memory reports an error.
   */
  readDevice?: DeviceRegionReader;
}

/** Bytes one plan reads: per valid token (attention entries) and per block (state entries). */
interface PlanBytes {
  perToken: number;
  perBlock: number;
}

function planBytes(plan: GroupPlan): PlanBytes {
  let perToken = 0;
  let perBlock = 0;
  for (const e of plan.entries) {
    if (e.kind === ENTRY_ATTN) perToken += e.outerCount * e.byteCount;
    else if (e.kind === ENTRY_ROWS) perBlock += e.outerCount * e.elemCount[0] * e.elemCount[1] * e.elemCount[2] * e.elemBytes;
    else if (e.kind === ENTRY_STREAM) perBlock += e.byteCount;
  }
  return { perToken, perBlock };
}

/** One side's checksummer and its byte accounting. */
interface Side {
  summer: BlockChecksummer;
  bytes: PlanBytes[];
  which: 'send' | 'recv';
  /** Device steps submitted and not yet reported, by the checksummer's ticket. */
  inFlight: Map<number, Prepared>;
}

/** A step's runs and how to turn their records into report entries. */
interface Prepared {
  entries: StepEntry[];
  runs: BlockRun[];
  /** Per entry, per group: the run index, or 'unknown' (a group this worker does not know). */
  slots: Array<Array<number | 'unknown'>>;
  /** KV bytes the runs read. */
  bytes: number;
}

/**
 * Implements {@link KVChecksumWorkerHooks}. Construct one per worker; the engine calls the hooks
 * in the order of `checksum-hooks.ts`. Reports are plain data ({@link KVChecksumReport}).
 */
export class KVChecksumWorker implements KVChecksumWorkerHooks {
  readonly enabled: boolean;
  private readonly backend: BackendName | 'auto' | ChecksumBackend | DeviceChecksumProvider;
  private readonly onError: (error: unknown, requestIds: string[]) => void;
  private readonly readDevice: DeviceRegionReader | undefined;
  private caches: WorkerKVCaches | null = null;
  private producer: Side | null = null;
  /** Producer sub-block sums (host KV only), docs/checksum-extensions.md section 1. */
  private subBlocks: SubBlockSums | null = null;
  private consumer: Side | null = null;
  /** group id -> index in the caches' groups (the checksummer's group index). */
  private readonly groupIndex = new Map<number, number>();
  private sends: StepEntry[] = [];
  /** Loads scheduled and not yet finished, by request id. */
  private readonly recvs = new Map<string, StepEntry>();
  /** Requests whose connector-carried payload this worker already reported. */
  private readonly receivedSeen = new Set<string>();
  private report: KVChecksumReport | null = null;

  /** @param options a {@link KVChecksumWorkerOptions}, or just the transfer config. */
  constructor(options: KVChecksumWorkerOptions | KVTransferConfig = {}) {
    const o: KVChecksumWorkerOptions = 'kv_connector' in options ? { config: options } : options;
    this.enabled = o.config ? o.config.enable_kv_checksum : true;
    this.backend = o.backend ?? 'auto';
    this.onError = o.onError ?? (() => {});
    this.readDevice = o.readDevice;
  }

  /** Plans the worker's groups for both roles (producer: replica 0; consumer: every replica). */
  registerKvCaches(caches: WorkerKVCaches): void {
    if (!this.enabled) return;
    this.caches = caches;
    this.groupIndex.clear();
    caches.groups.forEach((g, i) => this.groupIndex.set(g.groupId, i));
    const side = (role: 'producer' | 'consumer'): Side => {
      const summer = new BlockChecksummer(caches.groups, { tpRank: caches.rank.tpRank, tpSize: caches.rank.tpSize, role }, caches.regions, this.backend, { stream: caches.stream });
      return { summer, bytes: summer.plans.map(planBytes), which: role === 'producer' ? 'send' : 'recv', inFlight: new Map() };
    };
    this.producer = side('producer');
    this.consumer = side('consumer');
    this.subBlocks = this.producer.summer.isDevice ? null : new SubBlockSums(caches, this.producer.summer.backend as ChecksumBackend);
  }

  /** Takes the step's metadata ({@link ChecksumStepMeta}; null or undefined: nothing this step). */
  bindStepMeta(meta: unknown): void {
    this.sends = [];
    if (!this.enabled || meta === null || meta === undefined) return;
    const m = meta as ChecksumStepMeta;
    for (const id of m.drop ?? []) {
      this.recvs.delete(id);
      this.receivedSeen.delete(id);
    }
    this.sends = m.send ?? [];
    for (const e of m.recv ?? []) this.recvs.set(e.requestId, e);
    // Mismatched loads (checksum-localize.ts): fine sums now, before this step's forward pass.
    if (m.localize?.length && this.consumer && this.caches) {
      const plans = this.consumer.summer.plans;
      const r = this.ensureReport();
      for (const o of m.localize) (r.localized ??= []).push(localizeOnRank(plans, (g) => this.groupIndex.get(g), this.caches.regions, o, this.readDevice));
    }
  }

  /** Sums this step's send entries (replica 0), in one backend call. */
  afterForward(): void {
    if (!this.enabled || this.sends.length === 0 || !this.producer) return;
    const entries = this.sends;
    this.sends = [];
    const r = this.ensureReport();
    const t0 = performance.now();
    if (this.producer.summer.isDevice) this.submit(this.producer, entries, r);
    else r.sends.push(...this.sum(this.producer, entries, r, 'send'));
    r.seconds.send += (performance.now() - t0) / 1000;
  }

  /**
   * Sums every replica of the loads in `results.finishedRecving` this worker has entries for, in
   * one backend call, and keeps the first connector-carried payload per request.
   */
  afterTransferResults(results: TransferResults): void {
    if (!this.enabled) return;
    for (const [id, payload] of results.kvChecksums) {
      if (this.receivedSeen.has(id)) continue;
      if (this.recvs.has(id)) this.receivedSeen.add(id);
      this.ensureReport().received.push({ requestId: id, payload });
    }
    if (!this.consumer) return;
    const loaded: StepEntry[] = [];
    for (const id of results.finishedRecving) {
      const e = this.recvs.get(id);
      if (e) {
        loaded.push(e);
        this.recvs.delete(id);
      }
    }
    if (loaded.length === 0) return;
    const r = this.ensureReport();
    const t0 = performance.now();
    if (this.consumer.summer.isDevice) this.submit(this.consumer, loaded, r);
    else r.recvs.push(...this.sum(this.consumer, loaded, r, 'recv'));
    r.seconds.recv += (performance.now() - t0) / 1000;
  }

  /**
   * The step's report (null when nothing was summed, received or completed), then forgets it.
   * Device KV: first polls the steps in flight (never blocking) and adds the records of those done.
   */
  takeReport(): KVChecksumReport | null {
    for (const side of [this.producer, this.consumer]) if (side && side.inFlight.size > 0) this.collect(side);
    const r = this.report;
    this.report = null;
    return r;
  }

  /** Device steps submitted and not yet reported (both sides), for diagnostics and tests. */
  get stepsInFlight(): number {
    return (this.producer?.inFlight.size ?? 0) + (this.consumer?.inFlight.size ?? 0);
  }

  /** Frees the device contexts (steps in flight are dropped). */
  close(): void {
    for (const side of [this.producer, this.consumer]) {
      side?.inFlight.clear();
      side?.summer.close();
    }
  }

  /** Device KV: submits the entries as one step; on a refused submit, request by request. */
  private submit(side: Side, entries: StepEntry[], report: KVChecksumReport): void {
    const prep = this.prepare(side, entries);
    let ticket: number;
    try {
      ticket = side.summer.submit(prep.runs);
    } catch (e) {
      if (entries.length === 1) {
        this.onError(e, [entries[0].requestId]);
        (side.which === 'send' ? report.sends : report.recvs).push(this.skippedEntry(side, entries[0], 'compute-error'));
        return;
      }
      for (const en of entries) this.submit(side, [en], report);
      return;
    }
    side.inFlight.set(ticket, prep);
    const f = (report.inFlight ??= { sends: [], recvs: [] });
    (side.which === 'send' ? f.sends : f.recvs).push(...entries.map((e) => e.requestId));
  }

  /** Device KV: reports the steps the checksummer's poll says are done. */
  private collect(side: Side): void {
    const t0 = performance.now();
    const done = side.summer.poll();
    if (done.length === 0) return;
    const r = this.ensureReport();
    for (const c of done) {
      const prep = side.inFlight.get(c.ticket);
      if (!prep) continue;
      side.inFlight.delete(c.ticket);
      const list = side.which === 'send' ? r.sends : r.recvs;
      if ('error' in c) {
        this.onError(c.error, prep.entries.map((e) => e.requestId));
        list.push(...prep.entries.map((e) => this.skippedEntry(side, e, 'compute-error')));
        continue;
      }
      r.bytes[side.which] += prep.bytes;
      list.push(...this.entriesOf(side, prep, c.records));
    }
    r.seconds[side.which] += (performance.now() - t0) / 1000;
  }

  /** Loads scheduled and not finished yet (request ids), for diagnostics. */
  pendingLoads(): string[] {
    return [...this.recvs.keys()];
  }

  private ensureReport(): KVChecksumReport {
    if (!this.report) this.report = emptyReport(this.caches?.ppRank ?? 0, this.caches?.rank.tpRank ?? 0);
    return this.report;
  }

  /** Sums entries in one call; on failure, request by request so one bad request does not hide the others. */
  private sum(side: Side, entries: StepEntry[], report: KVChecksumReport, which: 'send' | 'recv'): ReportEntry[] {
    try {
      return this.sumAll(side, entries, report, which);
    } catch (e) {
      if (entries.length === 1) {
        this.onError(e, [entries[0].requestId]);
        return [this.skippedEntry(side, entries[0], 'compute-error')];
      }
      return entries.flatMap((en) => this.sum(side, [en], report, which));
    }
  }

  private sumAll(side: Side, entries: StepEntry[], report: KVChecksumReport, which: 'send' | 'recv'): ReportEntry[] {
    const prep = this.prepare(side, entries);
    const records = side.summer.compute(prep.runs);
    report.bytes[which] += prep.bytes;
    const out = this.entriesOf(side, prep, records);
    if (which === 'send') this.subBlocks?.attach(entries, out);
    return out;
  }

  /** The runs of `entries` (one per known group), their slots and the KV bytes they read. */
  private prepare(side: Side, entries: StepEntry[]): Prepared {
    const runs: BlockRun[] = [];
    const slots: Array<Array<number | 'unknown'>> = [];
    for (const e of entries) {
      slots.push(
        e.groups.map((g) => {
          const idx = this.groupIndex.get(g.groupId);
          if (idx === undefined) return 'unknown';
          runs.push({ group: idx, blockIds: g.blockIds, start: g.start, numTokens: e.numTokens, ...(g.sample ? { mask: sampleMask(g.sample, g.blockIds.length) } : {}) });
          return runs.length - 1;
        }),
      );
    }
    let bytes = 0;
    for (const run of runs) {
      const pb = side.bytes[run.group];
      const plan = side.summer.plans[run.group];
      if (plan.skipReason !== null) continue;
      if (plan.kind === 'attention') {
        for (let i = 0; i < run.blockIds.length; i++) if (run.mask?.[i] !== 0) bytes += pb.perToken * validTokens(run, i, plan.blockSize);
      } else if (run.mask?.[0] !== 0) bytes += pb.perBlock * run.blockIds.length;
    }
    return { entries, runs, slots, bytes };
  }

  /** Report entries of a prepared step from its records (one per run). */
  private entriesOf(side: Side, { entries, slots }: Prepared, records: readonly WorkerGroupRecord[]): ReportEntry[] {
    return entries.map((e, i) => ({
      requestId: e.requestId,
      numTokens: e.numTokens,
      groups: e.groups.map((g, j): ReportGroup => {
        const slot = slots[i][j];
        if (slot === 'unknown') return unknownGroup(g.groupId, g.start, g.blockIds.length);
        const plan = side.summer.plans[this.groupIndex.get(g.groupId)!];
        return { groupId: g.groupId, kind: plan.kind, fingerprint: plan.fingerprint, ...records[slot] };
      }),
    }));
  }

  private skippedEntry(side: Side, e: StepEntry, reason: string): ReportEntry {
    return {
      requestId: e.requestId,
      numTokens: e.numTokens,
      groups: e.groups.map((g) => {
        const idx = this.groupIndex.get(g.groupId);
        const plan = idx === undefined ? null : side.summer.plans[idx];
        const isState = plan?.kind === 'state' || plan?.kind === 'state-local';
        return { groupId: g.groupId, kind: plan?.kind ?? null, fingerprint: plan?.fingerprint ?? 0n, start: isState ? 0 : g.start, nBlocks: g.blockIds.length, skipped: true, skipReason: reason, partials: new Map() };
      }),
    };
  }
}

/** A run's mask (1 = sum) from a step entry's sampled indices (`StepGroupEntry.sample`). */
function sampleMask(sample: readonly number[], n: number): Uint8Array {
  const mask = new Uint8Array(n);
  for (const i of sample) if (i >= 0 && i < n) mask[i] = 1;
  return mask;
}

/** Valid tokens of block `i` of a run (SPEC 2): `min(B, max(0, numTokens - position * B))`. */
function validTokens(run: BlockRun, i: number, B: number): number {
  return Math.max(0, Math.min(B, run.numTokens - (run.start + i) * B));
}

function unknownGroup(groupId: number, start: number, nBlocks: number): ReportGroup {
  return { groupId, kind: null, fingerprint: 0n, start, nBlocks, skipped: true, skipReason: 'unknown-group', partials: new Map() };
}
