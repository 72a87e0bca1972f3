/**
 * The FaultInjectingConnector's worker half: wraps the inner connector's worker, applies the
 * worker-side faults (producer `stale`; consumer notif, loaded-bytes and connector-payload
 * faults) using the worker's registered views to find the bytes, and reports what it did in its
 * worker metadata ({@link FaultWorkerMeta}). Everything it knows of its scheduler half comes in
 * the step metadata ({@link FaultMeta}). Host or device KV alike: the faults read and write the
 * regions through one byte-access session per hook call (`kv-bytes.ts`), flushed before the
 * call returns, so on device KV they change the device memory the checksum worker sums.
 * @module
 */
import { performance } from 'node:perf_hooks';
import type { KVConnectorWorker, SchedulerOutput, TransferResults, WorkerContext, WorkerKVCaches } from '@kvconnect/core';
import type { ByteRun } from '../locate.js';
import { loadBytes, snapshot, type LoadMeta, type Snapshot } from './bytes.js';
import type { Fault, NotifState, ResultHit } from './fault.js';
import { kvBytesOf, type FaultCaches } from './kv-bytes.js';
import { newNotifState, releaseHeldReports } from './kinds/index.js';
import type { FaultMeta, FaultWorkerMeta, StaleOrder, WorkerInjection, WorkerLoadRecord } from './records.js';
import { faultSelects, requestKeySeed, workerSeed } from './select.js';

/** Epoch milliseconds with sub-millisecond precision (comparable across processes of one host). */
const now = () => performance.timeOrigin + performance.now();

interface WorkerLoad extends LoadMeta {
  /** When startLoadKv first saw the load ({@link now}); -1 before. */
  startedAt: number;
  snapshot: Snapshot | null;
}

/** The worker half of a FaultInjectingConnector. */
export class FaultWorker implements KVConnectorWorker<FaultMeta | null, FaultWorkerMeta, unknown> {
  private caches: WorkerKVCaches | null = null;
  private readonly loads = new Map<string, WorkerLoad>();
  private readonly restores = new Map<string, Array<readonly [ByteRun, Uint8Array]>>();
  private readonly notifState: NotifState = newNotifState();
  private stale: StaleOrder[] = [];
  private injections: WorkerInjection[] = [];
  private loadRecords: WorkerLoadRecord[] = [];
  private innerMeta: unknown = null;

  constructor(
    private readonly inner: KVConnectorWorker,
    private readonly faults: readonly Fault[],
    private readonly ctx: WorkerContext,
  ) {}

  async registerKvCaches(caches: WorkerKVCaches): Promise<void> {
    kvBytesOf(caches); // refuses mixed host and device regions
    this.caches = caches;
    await this.inner.registerKvCaches(caches);
  }

  getHandshakeMetadata(): unknown {
    return this.inner.getHandshakeMetadata?.() ?? null;
  }

  bindConnectorMetadata(meta: FaultMeta | null): void {
    this.innerMeta = meta?.inner ?? null;
    for (const l of meta?.loads ?? []) if (!this.loads.has(l.requestId)) this.loads.set(l.requestId, { ...l, blocks: l.blocks.map((b) => b.slice()), startedAt: -1, snapshot: null });
    this.stale.push(...(meta?.stale ?? []));
    this.inner.bindConnectorMetadata(this.innerMeta);
  }

  /** A byte-access session over the registered caches (flush it before the hook call returns); null before registration. */
  private session(): FaultCaches | null {
    return this.caches ? { ...this.caches, bytes: kvBytesOf(this.caches) } : null;
  }

  startLoadKv(output: SchedulerOutput): void {
    let c: FaultCaches | null = null;
    for (const l of this.loads.values()) {
      if (l.startedAt >= 0) continue;
      l.startedAt = now();
      if (this.caches && this.faults.some((f) => f.needsSnapshot && f.consumerLoad && faultSelects(f.spec, f.index, l.requestId))) l.snapshot = snapshot((c ??= this.session()!), l);
    }
    this.inner.startLoadKv({ ...output, kvConnectorMetadata: this.innerMeta });
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
    this.innerMeta = null;
    this.inner.clearConnectorMetadata();
  }

  shutdown(): Promise<void> | void {
    return this.inner.shutdown?.();
  }

  private place() {
    return { tpRank: this.ctx.tpRank, ppRank: this.ctx.ppRank };
  }

  private rec(f: Fault, requestId: string, side: 'producer' | 'consumer', changed: WorkerInjection['changed'], detail: string): void {
    this.injections.push({ requestId, faultIndex: f.index, kind: f.spec.kind, side, ...this.place(), changed, detail });
  }

  private hitting(requestId: string, has: (f: Fault) => boolean): Fault[] {
    return this.faults.filter((f) => has(f) && faultSelects(f.spec, f.index, requestId));
  }

  /**
   * The inner connector's results, after: restoring `stale` blocks the consumer read; this step's
   * `stale` orders; notif faults; loaded-bytes faults on loads reported finished (then their load
   * record); connector-carried payload faults. `workerMeta` carries the inner's and what was done.
   */
  getTransferResults(): TransferResults<FaultWorkerMeta> {
    const got = this.inner.getTransferResults();
    const res: TransferResults<FaultWorkerMeta> = { finishedSending: new Set(got.finishedSending), finishedRecving: new Set(got.finishedRecving), invalidBlockIds: new Set(got.invalidBlockIds), kvChecksums: new Map(got.kvChecksums), loadErrors: new Map(got.loadErrors) };
    const c = this.session();
    // Producer: blocks made stale are restored once the consumer read them.
    for (const id of res.finishedSending) {
      const saved = this.restores.get(id);
      if (!saved || !c) continue;
      for (const [run, bytes] of [...saved].reverse()) c.bytes.write(run.region, run.addr, bytes);
      this.restores.delete(id);
    }
    // Producer: this step computed the prompts' last tokens (and their checksums); nobody read them yet.
    for (const o of this.stale.splice(0)) {
      const f = this.faults.find((x) => x.index === o.faultIndex);
      if (!f?.producerBlocks || !c) continue;
      const r = f.producerBlocks({
        caches: c,
        worker: this.place(),
        load: { requestId: o.requestId, blocks: o.blocks, firstToken: 0, numTokens: o.numTokens },
        workerSeed: workerSeed(f.spec, f.index, o.requestId, this.ctx.tpRank, this.ctx.ppRank),
        keep: (runs) => this.restores.set(o.requestId, [...(this.restores.get(o.requestId) ?? []), ...runs.map(([r, b]) => [{ region: r.region, addr: r.addr, len: b.length }, b] as const)]),
      });
      this.rec(f, o.requestId, 'producer', r.changed, r.detail);
    }
    // Consumer: reports dropped, delayed or repeated.
    releaseHeldReports(this.notifState, res);
    this.resultHooks(res, (f) => f.consumerNotifs);
    // Consumer: loads reported finished, before the checksum worker sums them.
    for (const id of res.finishedRecving) {
      const l = this.loads.get(id);
      if (!l) continue;
      this.loads.delete(id);
      if (c) {
        for (const f of this.hitting(id, (x) => x.consumerLoad !== undefined)) {
          const r = f.consumerLoad!({ caches: c, worker: this.place(), load: l, snapshot: l.snapshot, results: res, seed: requestKeySeed(f.spec, f.index, id), workerSeed: workerSeed(f.spec, f.index, id, this.ctx.tpRank, this.ctx.ppRank) });
          if (r) this.rec(f, id, 'consumer', r.changed, r.detail);
        }
      }
      const t = now();
      this.loadRecords.push({ requestId: id, ...this.place(), startedAt: l.startedAt < 0 ? t : l.startedAt, finishedAt: t, bytes: c ? loadBytes(c, l) : 0, firstToken: l.firstToken, numTokens: l.numTokens });
    }
    // The bytes changed above land before the checksum worker sums this step's loads.
    c?.bytes.flush();
    // Consumer: connector-carried checksum payloads.
    this.resultHooks(res, (f) => f.consumerPayloads);
    const meta: FaultWorkerMeta = { injections: this.injections, loads: this.loadRecords };
    if (got.workerMeta !== undefined) meta.inner = got.workerMeta;
    this.injections = [];
    this.loadRecords = [];
    return meta.injections.length > 0 || meta.loads.length > 0 || meta.inner !== undefined ? { ...res, workerMeta: meta } : res;
  }

  private resultHooks(res: TransferResults, hook: (f: Fault) => Fault['consumerNotifs']): void {
    for (const f of this.faults) {
      const h = hook(f);
      if (!h) continue;
      const hits: ResultHit[] = h.call(f, { worker: this.place(), results: res, state: this.notifState, selects: (id) => faultSelects(f.spec, f.index, id) });
      for (const x of hits) this.rec(f, x.requestId, 'consumer', [], x.detail);
    }
  }
}
