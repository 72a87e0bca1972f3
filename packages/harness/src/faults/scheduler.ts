/**
 * The FaultInjectingConnector's scheduler half: wraps the inner connector's, applies the params
 * faults of consumer requests (on a copy of the params), hands the workers the loads and the
 * `stale` orders in the step metadata, collects the workers' injections and load timings from
 * their worker metadata, and returns each request's {@link FaultReport} with the request.
 * @module
 */
import {
  type BlockIdsPerGroup,
  type ConnectorRequest,
  type FinishReason,
  type HandshakeMetadataByWorker,
  type KVChecksumCarrier,
  type KVConnectorOutput,
  type KVConnectorScheduler,
  type KVTransferConfig,
  type KVTransferParams,
  type MatchedTokens,
  type RequestFinishedResult,
  type SchedulerContext,
  type SchedulerOutput,
} from '@kvconnect/core';
import type { Fault } from './fault.js';
import { FAULT_REPORT_PARAM, requestIndexOf, withoutFaultReport, type FaultMeta, type FaultReport, type FaultWorkerMeta, type InjectionRecord, type StaleOrder } from './records.js';
import type { LoadMeta } from './bytes.js';
import { faultSelects } from './select.js';

/** A producer request a `stale` fault hits, until its prompt completes. */
interface StaleCandidate {
  request: ConnectorRequest;
  blocks: number[][] | null;
  faults: number[];
}

/** The scheduler half of a FaultInjectingConnector. */
export class FaultScheduler implements KVConnectorScheduler<FaultMeta, FaultWorkerMeta, unknown> {
  sendKvChecksums?: (request: ConnectorRequest, payload: Uint8Array) => void;
  /** The inner connector's (when it has one): localizing a mismatch is not a fault's business. */
  localizeKvChecksums?: KVConnectorScheduler['localizeKvChecksums'];
  private readonly asked = new Map<string, number>();
  private pending: LoadMeta[] = [];
  private readonly staleCandidates = new Map<string, StaleCandidate>();
  /** Params of consumer requests as they arrived (report left out), by scenario index (`replay-params`). */
  private readonly paramsByIndex = new Map<number, KVTransferParams>();
  private readonly touched = new Set<string>();
  private readonly reports = new Map<string, FaultReport>();
  private readonly consumer: boolean;
  private readonly producer: boolean;
  private readonly checksums: boolean;

  constructor(
    private readonly inner: KVConnectorScheduler,
    private readonly faults: readonly Fault[],
    config: KVTransferConfig,
    private readonly ctx: SchedulerContext,
  ) {
    this.consumer = config.kv_role !== 'kv_producer';
    this.producer = config.kv_role !== 'kv_consumer';
    this.checksums = config.enable_kv_checksum;
    if (inner.localizeKvChecksums) this.localizeKvChecksums = (request, query, timeoutMs) => inner.localizeKvChecksums!(request, query, timeoutMs);
    if (inner.sendKvChecksums) {
      this.sendKvChecksums = (request, payload) => inner.sendKvChecksums!(request, this.producerPayload(request, payload));
    }
  }

  private hitting(requestId: string, has: (f: Fault) => boolean): Fault[] {
    return this.faults.filter((f) => has(f) && faultSelects(f.spec, f.index, requestId));
  }

  private reportOf(requestId: string): FaultReport {
    let r = this.reports.get(requestId);
    if (!r) this.reports.set(requestId, (r = { engineId: this.ctx.engineId, injections: [], loads: [] }));
    return r;
  }

  private record(f: Fault, requestId: string, side: 'producer' | 'consumer', detail: string): void {
    const r: InjectionRecord = { engineId: this.ctx.engineId, requestId, index: requestIndexOf(requestId), faultIndex: f.index, kind: f.spec.kind, side, tpRank: -1, ppRank: -1, changed: [], detail };
    this.reportOf(requestId).injections.push(r);
  }

  private producerPayload(request: ConnectorRequest, payload: Uint8Array): Uint8Array {
    let out: Uint8Array = payload;
    for (const f of this.hitting(request.requestId, (x) => x.producerPayload !== undefined)) {
      const r = f.producerPayload!(request.requestId, out);
      if (!r) continue;
      if (r.payload === null) return new Uint8Array(0);
      out = r.payload;
    }
    return out;
  }

  private safeCarrier(req: ConnectorRequest): KVChecksumCarrier {
    try {
      return this.inner.kvChecksumCarrier(req);
    } catch {
      return null;
    }
  }

  /**
   * Consumer, once per request with `do_remote_prefill`: the params faults (`replay-params` first,
   * then the others in list order), before the inner connector and the checksum scheduler read
   * the params. The request gets a faulted copy; the object it arrived with is never changed. The
   * producer's fault report, forwarded by the proxy, is left out of what the request keeps.
   */
  private consumerParams(req: ConnectorRequest): void {
    const arrived = req.kvTransferParams;
    if (!arrived || arrived.do_remote_prefill !== true || this.touched.has(req.requestId)) return;
    this.touched.add(req.requestId);
    let p = withoutFaultReport(arrived);
    const idx = requestIndexOf(req.requestId);
    if (idx !== undefined) this.paramsByIndex.set(idx, { ...p });
    let changed = FAULT_REPORT_PARAM in arrived;
    const withParams = this.hitting(req.requestId, (f) => f.consumerParams !== undefined);
    const ordered = [...withParams.filter((f) => f.spec.kind === 'replay-params'), ...withParams.filter((f) => f.spec.kind !== 'replay-params')];
    for (const f of ordered) {
      const r = f.consumerParams!({ requestId: req.requestId, params: p, carrier: this.safeCarrier({ ...req, kvTransferParams: p }), paramsOf: (i) => this.paramsByIndex.get(i) });
      if (!r) continue;
      p = r.params;
      changed = true;
      this.record(f, req.requestId, 'consumer', r.detail);
    }
    if (changed) (req as { kvTransferParams?: KVTransferParams }).kvTransferParams = p;
  }

  /** Producer: a request with `do_remote_decode` that a `stale` fault hits waits for its prompt to complete. */
  private noteStale(req: ConnectorRequest): void {
    if (req.kvTransferParams?.do_remote_decode !== true || this.staleCandidates.has(req.requestId)) return;
    const faults = this.hitting(req.requestId, (f) => f.producerBlocks !== undefined).map((f) => f.index);
    if (faults.length > 0) this.staleCandidates.set(req.requestId, { request: req, blocks: null, faults });
  }

  getNumNewMatchedTokens(request: ConnectorRequest, numComputedTokens: number): MatchedTokens {
    if (this.consumer) this.consumerParams(request);
    if (this.producer) this.noteStale(request);
    const m = this.inner.getNumNewMatchedTokens(request, numComputedTokens);
    if (this.consumer && m.count !== null && m.count > 0) this.asked.set(request.requestId, numComputedTokens);
    return m;
  }

  setXferHandshakeMetadata(metadata: HandshakeMetadataByWorker<unknown>): void | Promise<void> {
    return this.inner.setXferHandshakeMetadata?.(metadata);
  }

  updateStateAfterAlloc(request: ConnectorRequest, blocks: BlockIdsPerGroup, numExternalTokens: number): void {
    this.inner.updateStateAfterAlloc(request, blocks, numExternalTokens);
    const stale = this.staleCandidates.get(request.requestId);
    if (stale) stale.blocks = blocks.map((b) => b.slice());
    const local = this.asked.get(request.requestId);
    this.asked.delete(request.requestId);
    if (!this.consumer || numExternalTokens <= 0 || local === undefined) return;
    this.pending.push({ requestId: request.requestId, blocks: blocks.map((b) => b.slice()), firstToken: local, numTokens: local + numExternalTokens });
  }

  buildConnectorMeta(output: Omit<SchedulerOutput, 'kvConnectorMetadata' | 'kvChecksumMetadata'>): FaultMeta {
    const loads = this.pending;
    this.pending = [];
    const stale: StaleOrder[] = [];
    for (const [id, c] of this.staleCandidates) {
      const n = output.numScheduledTokens.get(id);
      const P = c.request.promptTokenIds.length;
      if (n === undefined || !c.blocks || c.request.numComputedTokens + n < P) continue;
      this.staleCandidates.delete(id);
      for (const faultIndex of c.faults) stale.push({ requestId: id, faultIndex, blocks: c.blocks, numTokens: P });
    }
    return { inner: this.inner.buildConnectorMeta(output), loads, stale };
  }

  /** Takes the workers' injections and load records; the inner connector gets its own worker metadata. */
  updateConnectorOutput(outputs: readonly KVConnectorOutput<FaultWorkerMeta>[]): void {
    const engineId = this.ctx.engineId;
    for (const o of outputs) {
      const w = o.kvConnectorWorkerMeta;
      if (!w) continue;
      for (const x of w.injections) this.reportOf(x.requestId).injections.push({ engineId, index: requestIndexOf(x.requestId), ...x });
      for (const x of w.loads) this.reportOf(x.requestId).loads.push({ engineId, index: requestIndexOf(x.requestId), ...x });
    }
    this.inner.updateConnectorOutput(
      outputs.map((o) => {
        const { kvConnectorWorkerMeta, ...rest } = o;
        return kvConnectorWorkerMeta?.inner === undefined ? rest : { ...rest, kvConnectorWorkerMeta: kvConnectorWorkerMeta.inner };
      }),
    );
  }

  /**
   * The inner connector's result, with the request's {@link FaultReport} added to the returned
   * params under {@link FAULT_REPORT_PARAM} when anything was recorded for it. A producer-side
   * `payload` fault is recorded here, when the request's payload is about to go to the connector
   * carrier (the change itself is made in `sendKvChecksums`).
   */
  requestFinished(request: ConnectorRequest, blocks: BlockIdsPerGroup, reason: FinishReason): RequestFinishedResult {
    const res = this.inner.requestFinished(request, blocks, reason);
    const id = request.requestId;
    this.touched.delete(id);
    this.staleCandidates.delete(id);
    if (this.producer && this.checksums && this.sendKvChecksums && request.kvTransferParams?.do_remote_decode === true && (reason === 'stop' || reason === 'length') && this.safeCarrier(request) === 'connector') {
      for (const f of this.hitting(id, (x) => x.producerPayload !== undefined)) this.record(f, id, 'producer', f.spec.kind === 'payload' ? `producer payload ${f.spec.mode}` : 'producer payload');
    }
    const report = this.reports.get(id);
    this.reports.delete(id);
    if (!report) return res;
    return { ...res, kvTransferParams: { ...(res.kvTransferParams ?? {}), [FAULT_REPORT_PARAM]: report } };
  }

  kvChecksumCarrier(request: ConnectorRequest): KVChecksumCarrier {
    return this.inner.kvChecksumCarrier(request);
  }

  shutdown(): Promise<void> | void {
    return this.inner.shutdown?.();
  }
}
