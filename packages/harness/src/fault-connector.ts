/**
 * `FaultInjectingConnector`: a KV connector that wraps any other connector and injects the
 * faults seen in the field (`../shared/cases/field-cases.md`) into real loads, so that the KV
 * checksums can be shown to catch them (or not). Importing this module registers it in the core's
 * `defaultRegistry`; engines can also load it by module path without any engine change:
 *
 * ```json
 * { "kv_connector": "FaultInjectingConnector",
 *   "kv_connector_module_path": "<path or file: URL of this module>",
 *   "kv_role": "kv_consumer", "enable_kv_checksum": true, "kv_checksum_fail_closed": true,
 *   "kv_connector_extra_config": {
 *     "inner": { "kv_connector": "NixlConnector", "kv_connector_extra_config": { } },
 *     "faults": [ { "kind": "bit-flip", "rate": 0.1, "seed": 7 } ] } }
 * ```
 *
 * The inner connector must be registered in the same registry before the engine starts (import
 * its package, or give `inner.kv_connector_module_path` and call {@link prepareFaultInjection}).
 *
 * Consumer faults are applied after the inner connector reports a load finished and before the
 * checksum worker sums it (the engine sums in `afterTransferResults`, right after
 * `getTransferResults` returns), using the worker's registered views to find the bytes. Producer
 * faults (`stale`) change the producer's blocks when the request finishes, before any read, and
 * restore them once the consumer read them. Every injection is recorded with the block positions
 * whose bytes really changed ({@link faultRecords}): the ground truth a harness compares verdicts
 * with.
 *
 * Limitation: `stale` reaches the producer's worker memory from its scheduler half through
 * process-local state, so it needs the producer's scheduler and workers in one process (true for
 * the reference engine).
 * @module
 */
import { performance } from 'node:perf_hooks';
import { DTYPE_BYTES, decodePayload, encodePayload, PayloadError } from '@kvconnect/checksum';
import {
  defaultRegistry,
  KVTransferConfigError,
  parseKVTransferConfig,
  KV_CHECKSUMS_PARAM,
  type BlockIdsPerGroup,
  type ConnectorRequest,
  type FinishReason,
  type KVChecksumCarrier,
  type KVConnectorFactory,
  type KVConnectorOutput,
  type KVConnectorRegistry,
  type KVConnectorScheduler,
  type KVConnectorWorker,
  type KVTransferConfig,
  type KVTransferParams,
  type MatchedTokens,
  type RequestFinishedResult,
  type SchedulerContext,
  type SchedulerOutput,
  type TransferResults,
  type WorkerContext,
  type WorkerKVCaches,
} from '@kvconnect/core';
import { partAddress } from '@kvconnect/engine';
import type { FaultSpec, Fill } from './faults.js';
import { checkFaultList } from './faults.js';
import { registerInProcessConnector } from './in-process-connector.js';
import { forEachAttentionCell, forEachStateRow, hash32, layerNumber, prng, type AttentionSelector, type ByteRun } from './locate.js';
import { Checker } from './validate.js';

/** The registered name. */
export const FAULT_INJECTING_CONNECTOR = 'FaultInjectingConnector';

/** This module's URL: give it as `kv_connector_module_path` to load the connector by module path. */
export const FAULT_CONNECTOR_MODULE: string = import.meta.url;

/** The extra config of a FaultInjectingConnector. */
export interface FaultConnectorConfig {
  /** The wrapped connector: its name, extra config and optional module path. */
  inner: { kv_connector: string; kv_connector_extra_config?: Record<string, unknown>; kv_connector_module_path?: string };
  /** Faults to inject (see `faults.ts`). Default none: the wrapper only measures loads. */
  faults?: FaultSpec[];
}

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
  kind: FaultSpec['kind'];
  side: 'producer' | 'consumer';
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
  /** `performance.now()` when the load started (startLoadKv) and when it was reported finished. */
  startedAt: number;
  finishedAt: number;
  /** KV bytes of the load held by this worker (every loaded token's cells plus the running states). */
  bytes: number;
  /** The load's first loaded token and numTokens. */
  firstToken: number;
  numTokens: number;
}

interface EngineFaultState {
  workers: Set<FaultWorker>;
}

interface FaultProcessState {
  records: InjectionRecord[];
  loads: LoadRecord[];
  engines: Map<string, EngineFaultState>;
}

const STATE_KEY = Symbol.for('kvconnect.harness.faultState');
const G = globalThis as Record<symbol, unknown>;
const state: FaultProcessState = (G[STATE_KEY] as FaultProcessState | undefined) ?? (G[STATE_KEY] = { records: [], loads: [], engines: new Map() } as FaultProcessState);

function engineState(engineId: string): EngineFaultState {
  let e = state.engines.get(engineId);
  if (!e) state.engines.set(engineId, (e = { workers: new Set() }));
  return e;
}

/** Injection records of this process (optionally of some engines only). */
export function faultRecords(engineIds?: Iterable<string>): InjectionRecord[] {
  if (!engineIds) return state.records.slice();
  const ids = new Set(engineIds);
  return state.records.filter((r) => ids.has(r.engineId));
}

/** Load records of this process (optionally of some engines only). */
export function loadRecords(engineIds?: Iterable<string>): LoadRecord[] {
  if (!engineIds) return state.loads.slice();
  const ids = new Set(engineIds);
  return state.loads.filter((r) => ids.has(r.engineId));
}

/** Forgets the records and worker state of `engineIds` (all when omitted). */
export function clearFaultState(engineIds?: Iterable<string>): void {
  if (!engineIds) {
    state.records.length = 0;
    state.loads.length = 0;
    state.engines.clear();
    return;
  }
  const ids = new Set(engineIds);
  state.records = state.records.filter((r) => !ids.has(r.engineId));
  state.loads = state.loads.filter((r) => !ids.has(r.engineId));
  for (const id of ids) state.engines.delete(id);
}

/** The scenario request index of a harness request id (`r<index>.…`), or undefined. */
export function requestIndexOf(requestId: string): number | undefined {
  const m = /^r(\d+)\./.exec(requestId);
  return m ? Number(m[1]) : undefined;
}

/** Whether fault `f` (number `i` in its list) hits request `requestId` (deterministic). */
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

function requestKeySeed(f: FaultSpec, i: number, requestId: string): number {
  const idx = requestIndexOf(requestId);
  return hash32(`${f.seed ?? 0}:${i}:${idx !== undefined ? `#${idx}` : requestId}:draw`);
}

/**
 * Validates a FaultInjectingConnector transfer config and returns the inner connector's config
 * (inheriting role and checksum settings) and the faults.
 * @throws KVTransferConfigError listing every problem (paths under `kv_connector_extra_config`).
 */
export function parseFaultConfig(config: KVTransferConfig): { inner: KVTransferConfig; faults: FaultSpec[] } {
  const c = new Checker();
  const base = 'kv_connector_extra_config';
  const x = c.object(config.kv_connector_extra_config, base, ['inner', 'faults']);
  let inner: KVTransferConfig | undefined;
  let faults: FaultSpec[] = [];
  if (x) {
    const io = c.required(x, 'inner', base) ? c.object(x.inner, `${base}.inner`, ['kv_connector', 'kv_connector_extra_config', 'kv_connector_module_path']) : undefined;
    if (io) {
      try {
        inner = parseKVTransferConfig(
          {
            kv_connector: io.kv_connector,
            kv_role: config.kv_role,
            enable_kv_checksum: config.enable_kv_checksum,
            kv_checksum_fail_closed: config.kv_checksum_fail_closed,
            kv_load_failure_policy: config.kv_load_failure_policy,
            kv_connector_extra_config: io.kv_connector_extra_config ?? {},
            ...(io.kv_connector_module_path !== undefined ? { kv_connector_module_path: io.kv_connector_module_path } : {}),
          },
          `${base}.inner`,
        );
        if (inner.kv_connector === FAULT_INJECTING_CONNECTOR) c.fail(`${base}.inner.kv_connector`, 'cannot wrap itself');
      } catch (e) {
        if (e instanceof KVTransferConfigError) c.problems.push(...e.problems);
        else throw e;
      }
    }
    if (x.faults !== undefined) faults = checkFaultList(c, x.faults, `${base}.faults`) ?? [];
  }
  if (c.problems.length > 0) throw new KVTransferConfigError(c.problems);
  return { inner: inner!, faults };
}

/** Scheduler-to-worker metadata of one step. */
interface FaultMeta {
  readonly fault: true;
  inner: unknown;
  loads: LoadMeta[];
}

/** A load the consumer scheduler allocated blocks for. */
interface LoadMeta {
  requestId: string;
  /** The request's whole block table (local prefix hit included). */
  blocks: number[][];
  firstToken: number;
  numTokens: number;
  carrier: KVChecksumCarrier;
}

const isFaultMeta = (m: unknown): m is FaultMeta => typeof m === 'object' && m !== null && (m as FaultMeta).fault === true && 'loads' in m;

const CONSUMER_BYTE_FAULTS = new Set<FaultSpec['kind']>([
  'bit-flip',
  'corrupt-region',
  'misplaced-block',
  'misplaced-tokens',
  'wrong-layout',
  'mamba-bc-sharded',
  'transport-error',
  'replay-params',
  'random-stale-range',
]);

class FaultScheduler implements KVConnectorScheduler {
  sendKvChecksums?: (request: ConnectorRequest, payload: Uint8Array) => void;
  private readonly asked = new Map<string, number>();
  private pending: LoadMeta[] = [];
  private readonly paramsByIndex = new Map<number, KVTransferParams>();
  private readonly touched = new Set<string>();
  private readonly consumer: boolean;
  private readonly producer: boolean;

  constructor(
    private readonly inner: KVConnectorScheduler,
    private readonly faults: FaultSpec[],
    config: KVTransferConfig,
    private readonly ctx: SchedulerContext,
  ) {
    this.consumer = config.kv_role !== 'kv_producer';
    this.producer = config.kv_role !== 'kv_consumer';
    if (inner.sendKvChecksums) {
      this.sendKvChecksums = (request, payload) => inner.sendKvChecksums!(request, this.producerPayload(request, payload));
    }
  }

  private selected(requestId: string, kinds: ReadonlySet<FaultSpec['kind']> | FaultSpec['kind']): Array<[FaultSpec, number]> {
    const ok = (k: FaultSpec['kind']) => (typeof kinds === 'string' ? k === kinds : kinds.has(k));
    return this.faults.map((f, i) => [f, i] as [FaultSpec, number]).filter(([f, i]) => ok(f.kind) && faultSelects(f, i, requestId));
  }

  private record(r: Omit<InjectionRecord, 'engineId' | 'index' | 'tpRank' | 'ppRank' | 'side'>): void {
    state.records.push({ engineId: this.ctx.engineId, index: requestIndexOf(r.requestId), tpRank: -1, ppRank: -1, side: 'consumer', ...r });
  }

  private producerPayload(request: ConnectorRequest, payload: Uint8Array): Uint8Array {
    let out: Uint8Array | null = payload;
    for (const [f, i] of this.selected(request.requestId, 'payload')) {
      if (f.kind !== 'payload' || f.side !== 'producer') continue;
      out = mutatePayload(f, i, request.requestId, out);
      this.record({ requestId: request.requestId, faultIndex: i, kind: 'payload', changed: [], detail: `producer payload ${f.mode}` });
      if (out === null) return new Uint8Array(0);
    }
    return out ?? new Uint8Array(0);
  }

  /** Consumer: params faults (replay, params-carried payload) once per request, before the checksum scheduler reads them. */
  private consumerParams(req: ConnectorRequest): void {
    const p = req.kvTransferParams;
    if (!p || p.do_remote_prefill !== true || this.touched.has(req.requestId)) return;
    this.touched.add(req.requestId);
    const idx = requestIndexOf(req.requestId);
    if (idx !== undefined) this.paramsByIndex.set(idx, { ...p });
    for (const [f, i] of this.selected(req.requestId, 'replay-params')) {
      if (f.kind !== 'replay-params') continue;
      if (f.from === 'unknown') {
        p.remote_request_id = `unknown-${req.requestId}`;
        delete p[KV_CHECKSUMS_PARAM];
        this.record({ requestId: req.requestId, faultIndex: i, kind: f.kind, changed: [], detail: 'unknown transfer reference (no digest)' });
        continue;
      }
      const src = this.paramsByIndex.get(f.from);
      if (!src) continue;
      for (const k of Object.keys(p)) if (k !== 'do_remote_prefill' && k !== 'do_remote_decode') delete p[k];
      for (const [k, v] of Object.entries(src)) if (k !== 'do_remote_prefill' && k !== 'do_remote_decode') p[k] = v;
      this.record({ requestId: req.requestId, faultIndex: i, kind: f.kind, changed: [], detail: `params of request ${f.from} replayed` });
    }
    if (this.safeCarrier(req) !== 'kv_transfer_params') return;
    for (const [f, i] of this.selected(req.requestId, 'payload')) {
      if (f.kind !== 'payload') continue;
      const text = p[KV_CHECKSUMS_PARAM];
      if (f.mode === 'drop') delete p[KV_CHECKSUMS_PARAM];
      else if (typeof text === 'string') {
        const bytes = mutatePayload(f, i, req.requestId, new Uint8Array(Buffer.from(text, 'base64')));
        if (bytes === null) delete p[KV_CHECKSUMS_PARAM];
        else p[KV_CHECKSUMS_PARAM] = Buffer.from(bytes).toString('base64');
      }
      this.record({ requestId: req.requestId, faultIndex: i, kind: f.kind, changed: [], detail: `kv_transfer_params.kv_checksums ${f.mode}` });
    }
  }

  private safeCarrier(req: ConnectorRequest): KVChecksumCarrier {
    try {
      return this.inner.kvChecksumCarrier(req);
    } catch {
      return null;
    }
  }

  getNumNewMatchedTokens(request: ConnectorRequest, numComputedTokens: number): MatchedTokens {
    if (this.consumer) this.consumerParams(request);
    const m = this.inner.getNumNewMatchedTokens(request, numComputedTokens);
    if (this.consumer && m.count !== null && m.count > 0) this.asked.set(request.requestId, numComputedTokens);
    return m;
  }

  updateStateAfterAlloc(request: ConnectorRequest, blocks: BlockIdsPerGroup, numExternalTokens: number): void {
    this.inner.updateStateAfterAlloc(request, blocks, numExternalTokens);
    const local = this.asked.get(request.requestId);
    this.asked.delete(request.requestId);
    if (!this.consumer || numExternalTokens <= 0 || local === undefined) return;
    this.pending.push({ requestId: request.requestId, blocks: blocks.map((b) => b.slice()), firstToken: local, numTokens: local + numExternalTokens, carrier: this.safeCarrier(request) });
  }

  buildConnectorMeta(output: Omit<SchedulerOutput, 'kvConnectorMetadata' | 'kvChecksumMetadata'>): FaultMeta {
    const loads = this.pending;
    this.pending = [];
    return { fault: true, inner: this.inner.buildConnectorMeta(output), loads };
  }

  updateConnectorOutput(outputs: readonly KVConnectorOutput[]): void {
    this.inner.updateConnectorOutput(outputs);
  }

  requestFinished(request: ConnectorRequest, blocks: BlockIdsPerGroup, reason: FinishReason): RequestFinishedResult {
    const res = this.inner.requestFinished(request, blocks, reason);
    this.touched.delete(request.requestId);
    if (this.producer && request.kvTransferParams?.do_remote_decode === true && (reason === 'stop' || reason === 'length')) {
      for (const [f, i] of this.selected(request.requestId, 'stale')) {
        if (f.kind !== 'stale') continue;
        const numTokens = Math.min(request.numComputedTokens, request.promptTokenIds.length);
        for (const w of engineState(this.ctx.engineId).workers) w.makeStale(f, i, request.requestId, blocks, numTokens);
      }
    }
    return res;
  }

  kvChecksumCarrier(request: ConnectorRequest): KVChecksumCarrier {
    return this.inner.kvChecksumCarrier(request);
  }

  shutdown(): Promise<void> | void {
    return this.inner.shutdown?.();
  }
}

/** A payload changed by a `payload` fault; null = dropped. */
function mutatePayload(f: Extract<FaultSpec, { kind: 'payload' }>, i: number, requestId: string, bytes: Uint8Array): Uint8Array | null {
  switch (f.mode) {
    case 'drop':
      return null;
    case 'truncate':
      return bytes.slice(0, Math.min(bytes.length - 1, f.keepBytes ?? Math.floor(bytes.length / 2)));
    case 'garbage': {
      const r = prng(requestKeySeed(f, i, requestId));
      return Uint8Array.from(bytes, () => r() & 0xff);
    }
    case 'drop-group':
      try {
        const p = decodePayload(bytes);
        return encodePayload({ ...p, groups: p.groups.filter((g) => g.groupId !== f.groupId) });
      } catch (e) {
        if (e instanceof PayloadError) return bytes;
        throw e;
      }
  }
}

/** A byte run with its place in the load, for change accounting. */
interface Tagged extends ByteRun {
  groupId: number;
  /** Token position (attention), or -1 for a state row. */
  token: number;
}

interface WorkerLoad extends LoadMeta {
  startedAt: number;
  applied: boolean;
  /** Bytes before the load, by `region:addr` (only when a fault fills with 'previous'). */
  snapshot: Map<string, Uint8Array> | null;
}

class FaultWorker implements KVConnectorWorker {
  private caches: WorkerKVCaches | null = null;
  private readonly loads = new Map<string, WorkerLoad>();
  private readonly restores = new Map<string, Array<[ByteRun, Uint8Array]>>();
  private readonly delayed: Array<{ id: string; left: number; target: 'finished-recving' | 'kv-checksums'; bytes?: Uint8Array }> = [];
  private readonly repeat: Array<{ id: string; target: 'finished-recving' | 'kv-checksums'; bytes?: Uint8Array }> = [];
  private readonly notifDone = new Set<string>();

  constructor(
    private readonly inner: KVConnectorWorker,
    private readonly faults: FaultSpec[],
    private readonly ctx: WorkerContext,
  ) {}

  async registerKvCaches(caches: WorkerKVCaches): Promise<void> {
    this.caches = caches;
    engineState(this.ctx.engineId).workers.add(this);
    await this.inner.registerKvCaches(caches);
  }

  bindConnectorMetadata(meta: unknown): void {
    if (isFaultMeta(meta)) {
      for (const l of meta.loads) if (!this.loads.has(l.requestId)) this.loads.set(l.requestId, { ...l, startedAt: -1, applied: false, snapshot: null });
      this.inner.bindConnectorMetadata(meta.inner);
    } else this.inner.bindConnectorMetadata(meta);
  }

  startLoadKv(output: SchedulerOutput): void {
    for (const l of this.loads.values()) {
      if (l.startedAt >= 0) continue;
      l.startedAt = performance.now();
      const needPrev = this.faults.some((f, i) => CONSUMER_BYTE_FAULTS.has(f.kind) && faultSelects(f, i, l.requestId) && usesPrevious(f));
      if (needPrev) l.snapshot = this.snapshot(l);
    }
    const meta = output.kvConnectorMetadata;
    this.inner.startLoadKv(isFaultMeta(meta) ? { ...output, kvConnectorMetadata: meta.inner } : output);
  }

  waitForLayerLoad(layerName: string): void {
    this.inner.waitForLayerLoad?.(layerName);
  }

  saveKvLayer(layerName: string): void {
    this.inner.saveKvLayer?.(layerName);
  }

  waitForSave(): void {
    this.inner.waitForSave?.();
  }

  clearConnectorMetadata(): void {
    this.inner.clearConnectorMetadata();
  }

  shutdown(): Promise<void> | void {
    engineState(this.ctx.engineId).workers.delete(this);
    return this.inner.shutdown?.();
  }

  private rec(r: Omit<InjectionRecord, 'engineId' | 'index' | 'tpRank' | 'ppRank'>): void {
    state.records.push({ engineId: this.ctx.engineId, index: requestIndexOf(r.requestId), tpRank: this.ctx.tpRank, ppRank: this.ctx.ppRank, ...r });
  }

  private selected(requestId: string, pred: (f: FaultSpec) => boolean): Array<[FaultSpec, number]> {
    return this.faults.map((f, i) => [f, i] as [FaultSpec, number]).filter(([f, i]) => pred(f) && faultSelects(f, i, requestId));
  }

  getTransferResults(): TransferResults {
    const res = this.inner.getTransferResults();
    // Producer: blocks made stale are restored once the consumer read them.
    for (const id of res.finishedSending) {
      const saved = this.restores.get(id);
      if (!saved || !this.caches) continue;
      for (const [run, bytes] of saved) this.caches.regions[run.region].set(bytes, run.addr);
      this.restores.delete(id);
    }
    this.notifs(res);
    for (const id of res.finishedRecving) {
      const l = this.loads.get(id);
      if (!l || l.applied) continue;
      l.applied = true;
      this.applyByteFaults(l, res);
      state.loads.push({
        engineId: this.ctx.engineId,
        requestId: id,
        index: requestIndexOf(id),
        tpRank: this.ctx.tpRank,
        ppRank: this.ctx.ppRank,
        startedAt: l.startedAt < 0 ? performance.now() : l.startedAt,
        finishedAt: performance.now(),
        bytes: this.loadBytes(l),
        firstToken: l.firstToken,
        numTokens: l.numTokens,
      });
      this.loads.delete(id);
    }
    for (const [id, bytes] of [...res.kvChecksums]) {
      for (const [f, i] of this.selected(id, (f) => f.kind === 'payload' && f.side !== 'producer')) {
        if (f.kind !== 'payload') continue;
        const cur = res.kvChecksums.get(id);
        if (!cur) break;
        const out = mutatePayload(f, i, id, cur);
        if (out === null) res.kvChecksums.delete(id);
        else res.kvChecksums.set(id, out);
        this.rec({ requestId: id, faultIndex: i, kind: 'payload', side: 'consumer', changed: [], detail: `connector-carried payload ${f.mode} (${bytes.byteLength} bytes)` });
      }
    }
    return res;
  }

  /** Drops, delays or repeats finishedRecving / kvChecksums reports. */
  private notifs(res: TransferResults): void {
    for (const r of this.repeat.splice(0)) {
      if (r.target === 'finished-recving') res.finishedRecving.add(r.id);
      else if (r.bytes && !res.kvChecksums.has(r.id)) res.kvChecksums.set(r.id, r.bytes);
    }
    for (const d of this.delayed) d.left--;
    for (let k = this.delayed.length - 1; k >= 0; k--) {
      const d = this.delayed[k];
      if (d.left > 0) continue;
      this.delayed.splice(k, 1);
      if (d.target === 'finished-recving') res.finishedRecving.add(d.id);
      else if (d.bytes) res.kvChecksums.set(d.id, d.bytes);
    }
    const ids = new Set([...res.finishedRecving, ...res.kvChecksums.keys()]);
    for (const id of ids) {
      for (const [f, i] of this.selected(id, (f) => f.kind === 'notif')) {
        if (f.kind !== 'notif') continue;
        if (f.tpRanks && !f.tpRanks.includes(this.ctx.tpRank)) continue;
        const key = `${i}:${f.target}:${id}`;
        if (this.notifDone.has(key)) continue;
        const has = f.target === 'finished-recving' ? res.finishedRecving.has(id) : res.kvChecksums.has(id);
        if (!has) continue;
        this.notifDone.add(key);
        const bytes = res.kvChecksums.get(id);
        if (f.mode === 'duplicate') this.repeat.push({ id, target: f.target, bytes });
        else {
          if (f.target === 'finished-recving') res.finishedRecving.delete(id);
          else res.kvChecksums.delete(id);
          if (f.mode === 'delay') this.delayed.push({ id, left: f.steps ?? 3, target: f.target, bytes });
        }
        this.rec({ requestId: id, faultIndex: i, kind: 'notif', side: 'consumer', changed: [], detail: `${f.target} report ${f.mode}${f.mode === 'delay' ? ` by ${f.steps ?? 3} steps` : ''} on TP rank ${this.ctx.tpRank}` });
      }
    }
  }

  /** Byte runs of a load: every loaded token's cells and the running states. */
  private loadRuns(l: LoadMeta): Tagged[] {
    const out: Tagged[] = [];
    const c = this.caches!;
    forEachAttentionCell(c, l.blocks, l.firstToken, l.numTokens, {}, (x) => out.push({ region: x.region, addr: x.addr, len: x.len, groupId: x.groupId, token: x.token }));
    forEachStateRow(c, l.blocks, {}, (r) => {
      for (const e of r.elems) out.push({ ...e, groupId: r.groupId, token: -1 });
    });
    return out;
  }

  private loadBytes(l: LoadMeta): number {
    if (!this.caches) return 0;
    return this.loadRuns(l).reduce((a, r) => a + r.len, 0);
  }

  private snapshot(l: LoadMeta): Map<string, Uint8Array> {
    const m = new Map<string, Uint8Array>();
    if (!this.caches) return m;
    for (const r of this.loadRuns(l)) m.set(`${r.region}:${r.addr}`, this.caches.regions[r.region].slice(r.addr, r.addr + r.len));
    return m;
  }

  /** Writes `fill` over `runs`, returning the changed groups (tokens / state). */
  private fillRuns(runs: Tagged[], fill: Fill, seed: number, snapshot: Map<string, Uint8Array> | null): ChangedGroup[] {
    const regions = this.caches!.regions;
    const rnd = prng(seed);
    const changed = new Changes();
    for (const r of runs) {
      const mem = regions[r.region];
      const before = mem.slice(r.addr, r.addr + r.len);
      let next: Uint8Array;
      if (fill === 'zero') next = new Uint8Array(r.len);
      else if (fill === 'random') next = Uint8Array.from(before, () => rnd() & 0xff);
      else if (fill === 'invert') next = Uint8Array.from(before, (b) => ~b & 0xff);
      else next = snapshot?.get(`${r.region}:${r.addr}`) ?? new Uint8Array(r.len);
      mem.set(next, r.addr);
      if (!equal(before, next)) changed.add(r.groupId, r.token);
    }
    return changed.list();
  }

  private applyByteFaults(l: WorkerLoad, res: TransferResults): void {
    if (!this.caches) return;
    for (const [f, i] of this.selected(l.requestId, (f) => CONSUMER_BYTE_FAULTS.has(f.kind))) {
      const seed = requestKeySeed(f, i, l.requestId) ^ (this.ctx.tpRank * 7919 + this.ctx.ppRank * 104729);
      const rec = (changed: ChangedGroup[], detail: string) => this.rec({ requestId: l.requestId, faultIndex: i, kind: f.kind, side: 'consumer', changed, detail });
      switch (f.kind) {
        case 'bit-flip':
          rec(...this.bitFlip(f, i, l));
          break;
        case 'corrupt-region':
        case 'transport-error': {
          if (f.tpRanks && !f.tpRanks.includes(this.ctx.tpRank)) {
            rec([], `not on TP rank ${this.ctx.tpRank}`);
            break;
          }
          const runs = this.regionRuns(f, l);
          const changed = this.fillRuns(runs, f.fill ?? 'previous', seed, l.snapshot);
          if (f.kind === 'transport-error') for (const b of this.regionBlocks(f, l)) res.invalidBlockIds.add(b);
          rec(changed, `${runs.length} runs filled with ${f.fill ?? 'previous'}${f.kind === 'transport-error' ? '; blocks reported invalid' : ''}`);
          break;
        }
        case 'misplaced-block': {
          const gi = this.groupIndex(f.group, 'attention');
          if (gi < 0) break;
          const B = this.caches.groupConfigs[gi].blockSize;
          const pos = f.position ?? Math.floor(l.firstToken / B);
          const off = f.offset ?? 1;
          rec(this.moveTokens(l, this.caches.groupConfigs[gi].groupId, [pos * B, pos * B + B - 1], off * B), `block position ${pos} <- position ${pos + off}`);
          break;
        }
        case 'misplaced-tokens': {
          const gi = this.groupIndex(f.group, 'attention');
          if (gi < 0) break;
          rec(this.moveTokens(l, this.caches.groupConfigs[gi].groupId, f.tokens, f.sourceOffset), `tokens ${f.tokens[0]}-${f.tokens[1]} <- tokens ${f.tokens[0] + f.sourceOffset}-${f.tokens[1] + f.sourceOffset}`);
          break;
        }
        case 'wrong-layout':
          if (f.tpRanks && !f.tpRanks.includes(this.ctx.tpRank)) break;
          rec(this.wrongLayout(l, f.group), 'blocks permuted as if written in the other layout (HND <-> NHD)');
          break;
        case 'mamba-bc-sharded':
          rec(this.mambaSharded(l, f.group), 'replicated conv B/C rows re-sliced as if sharded');
          break;
        case 'replay-params': {
          const mode = f.producerBlocks ?? 'intact';
          if (mode === 'intact') {
            rec([], 'producer blocks intact');
            break;
          }
          rec(this.fillRuns(this.loadRuns(l), mode === 'zeroed' ? 'zero' : 'random', seed, null), `producer blocks ${mode} before the replayed read`);
          break;
        }
        case 'random-stale-range':
          rec(...this.randomRange(f, i, l));
          break;
        default:
          break;
      }
    }
  }

  /** Index of the group `groupId` (or the first group of `kind` that holds caches here). */
  private groupIndex(groupId: number | undefined, kind: 'attention' | 'state'): number {
    const c = this.caches!;
    if (groupId !== undefined) return c.groupConfigs.findIndex((g) => g.groupId === groupId);
    return c.groupConfigs.findIndex((g, gi) => (kind === 'state' ? g.kind === 'state' : g.kind !== 'state') && c.groups[gi]?.caches.length > 0);
  }

  private selector(f: { group?: number; layers?: [number, number]; heads?: [number, number]; tokens?: [number, number]; part?: 'K' | 'V' }): AttentionSelector {
    return { group: f.group, layers: f.layers, heads: f.heads, tokens: f.tokens, part: f.part };
  }

  private regionRuns(f: Extract<FaultSpec, { kind: 'corrupt-region' | 'transport-error' }>, l: LoadMeta): Tagged[] {
    const c = this.caches!;
    const out: Tagged[] = [];
    const stateOnly = f.states !== undefined || f.segments !== undefined;
    const isState = (gid: number | undefined) => gid !== undefined && c.groupConfigs.find((g) => g.groupId === gid)?.kind === 'state';
    if (!stateOnly && !isState(f.group)) {
      forEachAttentionCell(c, l.blocks, l.firstToken, l.numTokens, this.selector(f), (x) => out.push({ region: x.region, addr: x.addr, len: x.len, groupId: x.groupId, token: x.token }));
    }
    if (stateOnly || f.group === undefined || isState(f.group)) {
      const states = f.states?.map((s) => (s === 'conv' ? 0 : 1));
      const segments = f.segments?.map((s) => ({ x: 0, B: 1, C: 2 })[s]);
      forEachStateRow(c, l.blocks, { group: f.group, layers: f.layers, states, segments: segments && !states?.includes(1) ? segments : undefined }, (r) => {
        if (segments && r.state === 0 && !segments.includes(r.segment)) return;
        for (const e of r.elems) out.push({ ...e, groupId: r.groupId, token: -1 });
      });
    }
    return out;
  }

  private regionBlocks(f: Extract<FaultSpec, { kind: 'corrupt-region' | 'transport-error' }>, l: LoadMeta): Set<number> {
    const c = this.caches!;
    const out = new Set<number>();
    c.groupConfigs.forEach((g, gi) => {
      if (f.group !== undefined && f.group !== g.groupId) return;
      const table = l.blocks[gi] ?? [];
      if (g.kind === 'state') {
        const b = table[table.length - 1];
        if (b !== undefined && b >= 0) out.add(b);
        return;
      }
      const t0 = Math.max(l.firstToken, f.tokens?.[0] ?? 0);
      const t1 = Math.min(l.numTokens - 1, f.tokens?.[1] ?? Infinity);
      for (let t = t0; t <= t1; t++) {
        const b = table[Math.floor(t / g.blockSize)];
        if (b !== undefined && b >= 0) out.add(b);
      }
    });
    return out;
  }

  /** Tokens `range` (clipped to the load) of group `groupId` get the cells of token `t + sourceOffset`. */
  private moveTokens(l: LoadMeta, groupId: number, range: readonly [number, number], sourceOffset: number): ChangedGroup[] {
    const c = this.caches!;
    const writes: Array<[Tagged, Uint8Array]> = [];
    forEachAttentionCell(c, l.blocks, l.firstToken, l.numTokens, { group: groupId, tokens: range }, (x) => {
      const src = x.token + sourceOffset;
      const B = x.view.blockSize;
      const block = l.blocks[x.groupIndex]?.[Math.floor(src / B)];
      let bytes: Uint8Array;
      if (src < 0 || block === undefined || block < 0) bytes = new Uint8Array(x.len);
      else {
        const a = partAddress(x.view.parts[x.part], B, block, x.localHead, src % B);
        bytes = c.regions[x.region].slice(a, a + x.len);
      }
      writes.push([{ region: x.region, addr: x.addr, len: x.len, groupId: x.groupId, token: x.token }, bytes]);
    });
    const changed = new Changes();
    for (const [r, bytes] of writes) {
      const mem = c.regions[r.region];
      if (!equal(mem.subarray(r.addr, r.addr + r.len), bytes)) changed.add(r.groupId, r.token);
      mem.set(bytes, r.addr);
    }
    return changed.list();
  }

  private bitFlip(f: Extract<FaultSpec, { kind: 'bit-flip' }>, i: number, l: LoadMeta): [ChangedGroup[], string] {
    const c = this.caches!;
    const gi = this.groupIndexGlobal(f.group);
    if (gi < 0) return [[], 'no attention group'];
    const gc = c.groupConfigs[gi];
    const r = prng(requestKeySeed(f, i, l.requestId));
    const u = () => r() / 4294967296;
    const layers = gc.layerNames.map(layerNumber).filter((n) => n >= 0);
    const draws = [u(), u(), u(), u(), u()];
    const layer = f.layer ?? layers[Math.floor(draws[0] * layers.length)];
    const view = c.groups[gi]?.caches.find((v) => v.kind === 'attention');
    if (!view || view.kind !== 'attention') return [[], `layer ${layer} not on this worker`];
    const R = view.replication === 'all' ? c.rank.tpSize : typeof view.replication === 'number' ? view.replication : view.replication && view.replication.totalKvHeads < c.rank.tpSize ? c.rank.tpSize / view.replication.totalKvHeads : 1;
    const globalHeads = (view.localHeads * c.rank.tpSize) / R;
    const head = f.head ?? Math.floor(draws[1] * globalHeads);
    const token = f.token ?? l.firstToken + Math.floor(draws[2] * Math.max(1, l.numTokens - l.firstToken));
    const cellBytes = view.parts.reduce((a, p) => a + p.bytes, 0);
    const piece = f.piece ?? Math.floor(draws[3] * Math.floor(cellBytes / 8));
    const bit = f.bit ?? Math.floor(draws[4] * 64);
    const byteInCell = piece * 8 + Math.floor(bit / 8);
    const where = `layer ${layer} head ${head} token ${token} piece ${piece} bit ${bit}`;
    const changed = new Changes();
    forEachAttentionCell(c, l.blocks, l.firstToken, l.numTokens, { group: gc.groupId, layers: [layer, layer], heads: [head, head], tokens: [token, token] }, (x) => {
      if ((f.replicas ?? 'first') === 'first' && x.replica !== 0) return;
      let before = 0;
      for (let q = 0; q < x.part; q++) before += x.view.parts[q].bytes;
      const b = byteInCell - before;
      if (b < 0 || b >= x.len) return;
      c.regions[x.region][x.addr + b] ^= 1 << (bit % 8);
      changed.add(x.groupId, x.token);
    });
    return [changed.list(), where];
  }

  private groupIndexGlobal(groupId: number | undefined): number {
    const c = this.caches!;
    if (groupId !== undefined) return c.groupConfigs.findIndex((g) => g.groupId === groupId);
    return c.groupConfigs.findIndex((g) => g.kind !== 'state');
  }

  private randomRange(f: Extract<FaultSpec, { kind: 'random-stale-range' }>, i: number, l: WorkerLoad): [ChangedGroup[], string] {
    const c = this.caches!;
    const gi = this.groupIndexGlobal(undefined);
    if (gi < 0) return [[], 'no attention group'];
    const gc = c.groupConfigs[gi];
    const r = prng(requestKeySeed(f, i, l.requestId));
    const u = () => r() / 4294967296;
    const layers = gc.layerNames.map(layerNumber).filter((n) => n >= 0);
    const draws = [u(), u(), u()];
    const layer = layers[Math.floor(draws[0] * layers.length)];
    const view = c.groups[gi]?.caches.find((v) => v.kind === 'attention');
    const W = f.rangeTokens ?? 16;
    const firstRange = Math.floor(l.firstToken / W);
    const nRanges = Math.ceil(l.numTokens / W) - firstRange;
    const k = firstRange + Math.floor(draws[2] * Math.max(1, nRanges));
    if (!view || view.kind !== 'attention') return [[], 'no attention cache on this worker'];
    const R = view.replication === 'all' ? c.rank.tpSize : typeof view.replication === 'number' ? view.replication : view.replication && view.replication.totalKvHeads < c.rank.tpSize ? c.rank.tpSize / view.replication.totalKvHeads : 1;
    const globalHeads = (view.localHeads * c.rank.tpSize) / R;
    const head = Math.floor(draws[1] * globalHeads);
    const runs: Tagged[] = [];
    forEachAttentionCell(c, l.blocks, l.firstToken, l.numTokens, { group: gc.groupId, layers: [layer, layer], heads: [head, head], tokens: [k * W, k * W + W - 1] }, (x) => runs.push({ region: x.region, addr: x.addr, len: x.len, groupId: x.groupId, token: x.token }));
    const changed = this.fillRuns(runs, f.fill ?? 'previous', requestKeySeed(f, i, l.requestId), l.snapshot);
    return [changed, `layer ${layer} head ${head} tokens ${k * W}-${k * W + W - 1} filled with ${f.fill ?? 'previous'}`];
  }

  /** Rewrites each loaded block of the group's attention caches as if written in the other layout. */
  private wrongLayout(l: LoadMeta, groupId: number | undefined): ChangedGroup[] {
    const c = this.caches!;
    const changed = new Changes();
    c.groups.forEach((g, gi) => {
      const gc = c.groupConfigs[gi];
      if (gc.kind === 'state' || (groupId !== undefined && gc.groupId !== groupId)) return;
      const table = l.blocks[gi] ?? [];
      for (const v of g.caches) {
        if (v.kind !== 'attention') continue;
        const B = v.blockSize;
        const H = v.localHeads;
        for (let pos = Math.floor(l.firstToken / B); pos < Math.ceil(l.numTokens / B); pos++) {
          const block = table[pos];
          if (block === undefined || block < 0) continue;
          for (const p of v.parts) {
            if ((p.kernelBlockTokens ?? B) !== B) throw new Error(`wrong-layout fault: ${v.name} uses kernel blocks, which this fault does not model`);
            const hb = p.bytes;
            const nhd = p.headStride === hb && p.tokenStride === H * hb;
            const hnd = p.tokenStride === hb && p.headStride === B * hb;
            if (!nhd && !hnd) throw new Error(`wrong-layout fault: ${v.name} is neither NHD nor HND`);
            const base = p.offset + block * p.blockStride;
            const mem = c.regions[p.region];
            const before = mem.slice(base, base + B * H * hb);
            const out = new Uint8Array(B * H * hb);
            for (let h = 0; h < H; h++) {
              for (let t = 0; t < B; t++) {
                const actual = nhd ? t * H * hb + h * hb : h * B * hb + t * hb;
                const wrong = nhd ? h * B * hb + t * hb : t * H * hb + h * hb;
                out.set(before.subarray(actual, actual + hb), wrong);
              }
            }
            mem.set(out, base);
            for (let t = 0; t < B; t++) {
              const tok = pos * B + t;
              if (tok < l.firstToken || tok >= l.numTokens) continue;
              for (let h = 0; h < H; h++) {
                const a = nhd ? t * H * hb + h * hb : h * B * hb + t * hb;
                if (!equal(before.subarray(a, a + hb), out.subarray(a, a + hb))) changed.add(gc.groupId, tok);
              }
            }
          }
        }
      }
    });
    return changed.list();
  }

  /**
   * vllm#55208: the conv state's replicated B/C rows (n_groups < TP) read as a sharded slicer would:
   * segment s of rank r from global row `sum(earlier segments' local sizes * TP) + r * size`; rows
   * past the conv state read the next state's bytes (the temporal/SSM state).
   */
  private mambaSharded(l: LoadMeta, groupId: number | undefined): ChangedGroup[] {
    const c = this.caches!;
    const tp = c.rank.tpSize;
    const rank = c.rank.tpRank;
    const changed = new Changes();
    c.groups.forEach((g, gi) => {
      const gc = c.groupConfigs[gi];
      if (gc.kind !== 'state' || (groupId !== undefined && gc.groupId !== groupId)) return;
      const table = l.blocks[gi] ?? [];
      const block = table[table.length - 1];
      if (block === undefined || block < 0) return;
      for (const v of g.caches) {
        if (v.kind !== 'state') continue;
        const conv = v.states[0];
        const split = conv.split;
        if (!split || split.segments.length < 3) continue;
        const rowBytes: ByteRun[][] = [];
        forEachStateRow(c, l.blocks, { group: gc.groupId, layers: [layerNumber(v.name), layerNumber(v.name)], states: [0] }, (r) => {
          if (r.view === v) rowBytes[r.localRow] = r.elems;
        });
        const local = split.segments.map(([L]) => L);
        const localStart = local.map((_, s) => local.slice(0, s).reduce((a, b) => a + b, 0));
        const globalSize = split.segments.map(([L, R]) => (L * tp) / R);
        const globalStart = globalSize.map((_, s) => globalSize.slice(0, s).reduce((a, b) => a + b, 0));
        const totalRows = globalSize.reduce((a, b) => a + b, 0);
        const rowLen = rowBytes[0]?.reduce((a, e) => a + e.len, 0) ?? 0;
        const next = v.states[1];
        const nextBytes = next ? c.regions[next.region].slice(next.offset + block * next.blockStride, next.offset + block * next.blockStride + next.shape.reduce((a, b) => a * b, 1) * DTYPE_BYTES[next.dtype]) : new Uint8Array(0);
        const readRow = (elems: ByteRun[]) => {
          const out = new Uint8Array(rowLen);
          let o = 0;
          for (const e of elems) {
            out.set(c.regions[e.region].subarray(e.addr, e.addr + e.len), o);
            o += e.len;
          }
          return out;
        };
        const writes: Array<[ByteRun[], Uint8Array]> = [];
        split.segments.forEach(([L, R], s) => {
          if (R <= 1) return;
          const shardedStart = local.slice(0, s).reduce((a, b) => a + b * tp, 0);
          for (let i = 0; i < L; i++) {
            const src = shardedStart + rank * L + i;
            let bytes: Uint8Array;
            if (src >= totalRows) {
              const off = (src - totalRows) * rowLen;
              bytes = new Uint8Array(rowLen);
              bytes.set(nextBytes.subarray(off, Math.min(nextBytes.length, off + rowLen)));
            } else {
              const s2 = globalStart.findIndex((st, k) => src >= st && src < st + globalSize[k]);
              const within = src - globalStart[s2];
              const [L2, R2] = split.segments[s2];
              const shard2 = Math.floor(rank / R2);
              const localIdx = R2 > 1 ? within % L2 : within - shard2 * L2;
              bytes = localIdx >= 0 && localIdx < L2 ? readRow(rowBytes[localStart[s2] + localIdx]) : new Uint8Array(rowLen);
            }
            writes.push([rowBytes[localStart[s] + i], bytes]);
          }
        });
        for (const [elems, bytes] of writes) {
          const before = readRow(elems);
          let o = 0;
          for (const e of elems) {
            c.regions[e.region].set(bytes.subarray(o, o + e.len), e.addr);
            o += e.len;
          }
          if (!equal(before, bytes)) changed.add(gc.groupId, -1);
        }
      }
    });
    return changed.list();
  }

  /** Producer: overwrites a finished request's blocks before any read (lease expired, blocks reused). */
  makeStale(f: Extract<FaultSpec, { kind: 'stale' }>, i: number, requestId: string, blocks: BlockIdsPerGroup, numTokens: number): void {
    if (!this.caches) return;
    const l: LoadMeta = { requestId, blocks: blocks.map((b) => b.slice()), firstToken: 0, numTokens, carrier: null };
    const runs = this.loadRuns(l);
    const fill = f.fill ?? 'random';
    if (fill === 'none') {
      this.rec({ requestId, faultIndex: i, kind: 'stale', side: 'producer', changed: [], detail: 'blocks freed but not overwritten' });
      return;
    }
    if (f.restore !== false) {
      const saved: Array<[ByteRun, Uint8Array]> = runs.map((r) => [r, this.caches!.regions[r.region].slice(r.addr, r.addr + r.len)]);
      this.restores.set(requestId, saved);
    }
    const changed = this.fillRuns(runs, fill, requestKeySeed(f, i, requestId) ^ (this.ctx.tpRank * 7919 + this.ctx.ppRank * 104729), null);
    this.rec({ requestId, faultIndex: i, kind: 'stale', side: 'producer', changed, detail: `producer blocks overwritten (${fill}) before the read` });
  }
}

function usesPrevious(f: FaultSpec): boolean {
  if (f.kind === 'corrupt-region' || f.kind === 'transport-error' || f.kind === 'random-stale-range') return (f.fill ?? 'previous') === 'previous';
  return false;
}

function equal(a: Uint8Array, b: Uint8Array): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

/** Accumulates changed tokens / states per group. */
class Changes {
  private readonly m = new Map<number, { tokens: Set<number>; state: boolean }>();
  add(groupId: number, token: number): void {
    let e = this.m.get(groupId);
    if (!e) this.m.set(groupId, (e = { tokens: new Set(), state: false }));
    if (token < 0) e.state = true;
    else e.tokens.add(token);
  }
  list(): ChangedGroup[] {
    return [...this.m].sort((a, b) => a[0] - b[0]).map(([groupId, e]) => ({ groupId, tokens: [...e.tokens].sort((a, b) => a - b), state: e.state }));
  }
}

/** What the factory needs of a registry: factories by name. */
export interface ConnectorLookup {
  get(name: string): KVConnectorFactory;
  has?(name: string): boolean;
}

/** The `FaultInjectingConnector` factory; the inner connector is created from `lookup`. */
export class FaultInjectingConnectorFactory implements KVConnectorFactory {
  readonly name = FAULT_INJECTING_CONNECTOR;
  constructor(private readonly lookup: ConnectorLookup) {}

  private innerFactory(inner: KVTransferConfig): KVConnectorFactory {
    if (this.lookup.has && !this.lookup.has(inner.kv_connector) && inner.kv_connector_module_path) {
      throw new Error(`FaultInjectingConnector: inner connector ${JSON.stringify(inner.kv_connector)} is not registered yet; await prepareFaultInjection(registry, config) first (it imports ${inner.kv_connector_module_path})`);
    }
    return this.lookup.get(inner.kv_connector);
  }

  createScheduler(config: KVTransferConfig, ctx: SchedulerContext): KVConnectorScheduler {
    const { inner, faults } = parseFaultConfig(config);
    return new FaultScheduler(this.innerFactory(inner).createScheduler(inner, ctx), faults, config, ctx);
  }

  createWorker(config: KVTransferConfig, ctx: WorkerContext): KVConnectorWorker {
    const { inner, faults } = parseFaultConfig(config);
    return new FaultWorker(this.innerFactory(inner).createWorker(inner, ctx), faults, ctx);
  }
}

/**
 * Registers `FaultInjectingConnector` (and the harness's in-process connector) in `registry`,
 * once. Called by `KVConnectorRegistry.loadModule` when an engine loads this module by path.
 */
export function register(registry: KVConnectorRegistry = defaultRegistry): void {
  if (!registry.has(FAULT_INJECTING_CONNECTOR)) registry.register(new FaultInjectingConnectorFactory(registry));
  registerInProcessConnector(registry);
}

/**
 * Makes a FaultInjectingConnector config usable: registers the connector and imports the inner
 * connector's `kv_connector_module_path` when its name is not registered yet.
 */
export async function prepareFaultInjection(registry: KVConnectorRegistry, config: KVTransferConfig): Promise<void> {
  register(registry);
  const { inner } = parseFaultConfig(config);
  await registry.prepare(inner);
}

register(defaultRegistry);
