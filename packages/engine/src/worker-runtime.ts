/**
 * A worker's side of every step, wherever the worker runs (the engine's process or its own): the
 * connector worker half and the KV checksum worker of one TP rank x PP stage, called in the order
 * packages/core/src/connector.ts fixes, around the worker's share of each mixer.
 *
 * - {@link WorkerRuntime.setup}: `registry.prepare` (imports `kv_connector_module_path`), the
 *   connector's `createWorker` and `registerKvCaches`, the `KVChecksumWorker`'s
 *   `registerKvCaches`, then `getHandshakeMetadata`;
 * - {@link WorkerRuntime.begin}: `bindConnectorMetadata`, `bindStepMeta`, `startLoadKv`;
 * - {@link WorkerRuntime.mixer} (per layer of the stage): `waitForLayerLoad`, the mixer, `saveKvLayer`;
 * - {@link WorkerRuntime.end}: `waitForSave`, `afterForward`, `getTransferResults`,
 *   `afterTransferResults`, `clearConnectorMetadata`, then the worker's {@link KVConnectorOutput}
 *   (with `takeReport()` and the results' `workerMeta`).
 * @module
 */
import { KVChecksumWorker, workerKey, type KVConnectorRegistry, type Logger } from '@kvconnect/core';
import { readDeviceBytes } from '@kvconnect/transfer';
import { checksumWorkerSetup, type EngineChecksumBackend } from './checksum-device.js';
import type { Registry } from 'prom-client';
import type { KVConnectorOutput, SchedulerOutput } from './contracts.js';
import { runMixer, type ExecutorSetup } from './executor.js';
import type { ModelWeights } from './model/weights.js';
import type { ForwardSegment, Worker } from './worker.js';

/** Where a worker runtime finds its connector and where its halves put metrics. */
export interface WorkerEnv {
  /** The registry the connector's worker half is created from. */
  registry: KVConnectorRegistry;
  /** Given to the connector's worker half as `ctx.metricsRegistry`. */
  metricsRegistry?: Registry;
  /** KV checksum backend (default `auto`; see checksum-device.ts for which KV memory it reads). */
  checksumBackend?: EngineChecksumBackend;
  /** The engine's logger: the connector's worker half gets a child naming the PP stage and TP rank (`ctx.logger`). */
  logger?: Logger;
}

/** One worker's connector and checksum hooks and mixer compute (see the module comment). */
export class WorkerRuntime {
  /** `workerKey(ppRank, tpRank)`. */
  readonly key: string;
  private segs: readonly ForwardSegment[] = [];

  constructor(
    readonly worker: Worker,
    private readonly weights: ModelWeights,
    private readonly env: WorkerEnv,
  ) {
    this.key = workerKey(worker.ppRank, worker.tpRank);
  }

  /**
   * Creates the connector worker half and the checksum worker and registers the caches with both.
   * @returns the connector's handshake metadata, or null (no connector, or none).
   */
  async setup(s: ExecutorSetup): Promise<unknown> {
    const cfg = s.transferConfig;
    if (!cfg) return null;
    const w = this.worker;
    await this.env.registry.prepare(cfg);
    const c = this.env.registry.createWorker(cfg, { engineId: s.engineId, tpRank: w.tpRank, tpSize: w.tpSize, ppRank: w.ppRank, ppSize: w.ppSize, metricsRegistry: this.env.metricsRegistry, logger: this.env.logger?.child({ half: 'worker', pp: w.ppRank, tp: w.tpRank }) });
    w.connector = c;
    await c.registerKvCaches(w.kvCaches());
    if (s.checksum) {
      const setup = checksumWorkerSetup(this.env.checksumBackend ?? 'auto', w.kvCaches(), w.checksumKvCaches());
      const ck = new KVChecksumWorker({ config: cfg, backend: setup.backend, readDevice: readDeviceBytes });
      ck.registerKvCaches(setup.caches);
      w.checksum = ck;
    }
    return c.getHandshakeMetadata?.() ?? null;
  }

  /** Start of a step: binds the metadata and starts the step's loads; keeps `segs` for {@link mixer}. */
  begin(out: SchedulerOutput, segs: readonly ForwardSegment[]): void {
    const w = this.worker;
    w.connector?.bindConnectorMetadata(out.kvConnectorMetadata);
    w.checksum?.bindStepMeta(out.kvChecksumMetadata);
    w.connector?.startLoadKv(out);
    this.segs = segs;
  }

  /** This worker's share of layer `li`'s mixer for the step's segments, into `out` (see `runMixer`). */
  mixer(li: number, hn: Float32Array, out: Float32Array): void {
    runMixer(this.worker, li, this.weights.layers[li], hn, this.segs, out);
  }

  /** End of a step: the save, checksum and transfer-result hooks; the worker's output. */
  end(): KVConnectorOutput {
    const w = this.worker;
    this.segs = [];
    w.connector?.waitForSave?.();
    w.checksum?.afterForward();
    const res = w.connector?.getTransferResults() ?? { finishedSending: new Set<string>(), finishedRecving: new Set<string>(), invalidBlockIds: new Set<number>(), kvChecksums: new Map<string, Uint8Array>() };
    w.checksum?.afterTransferResults(res);
    w.connector?.clearConnectorMetadata();
    const o: KVConnectorOutput = {
      ppRank: w.ppRank,
      tpRank: w.tpRank,
      finishedSending: res.finishedSending,
      finishedRecving: res.finishedRecving,
      invalidBlockIds: res.invalidBlockIds,
      kvChecksums: res.kvChecksums,
      kvChecksumReport: w.checksum?.takeReport(),
    };
    if (res.loadErrors !== undefined && res.loadErrors.size > 0) o.loadErrors = res.loadErrors;
    if (res.workerMeta !== undefined) o.kvConnectorWorkerMeta = res.workerMeta;
    return o;
  }

  /** Shuts the connector worker half down. */
  async shutdown(): Promise<void> {
    await this.worker.connector?.shutdown?.();
    this.worker.freeDevice();
  }
}
