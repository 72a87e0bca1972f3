/**
 * The contract between a host engine and kvconnect's KV checksum scheduler and worker (SPEC 7-8,
 * ARCHITECTURE "One request"). They work with any connector through the connector API and its
 * carrier; the engine calls these hooks at fixed points of its step. Implemented by
 * `KVChecksumScheduler` and `KVChecksumWorker` (checksum-scheduler.ts, checksum-worker.ts).
 * @module
 */
import type { Verdict } from '@kvconnect/checksum';
import type { BlockIdsPerGroup, ConnectorRequest, FinishReason, KVConnectorOutput, KVTransferParams, LoadError, RequestFinishedResult, TransferResults, WorkerKVCaches } from './connector.js';

/**
 * What the engine does with a finished load (after verification). `loadError` is set, and
 * `verdict` null, when the transfer itself failed (outcome `transfer-failed`: nothing was verified,
 * the load failure policy applies whether checksums fail open or closed).
 */
export type LoadDecision =
  /** Use the loaded KV (verified, checksums off, or fail-open). */
  | { action: 'use'; verdict: Verdict | null; loadError?: undefined }
  /** Fail-closed + `fail`: end the request with an error. */
  | { action: 'fail'; verdict: Verdict; loadError?: undefined }
  /**
   * Fail-closed + `recompute`: discard the loaded tokens (numComputedTokens back to the local
   * prefix hit) and prefill them locally; the request then completes normally.
   */
  | { action: 'recompute'; verdict: Verdict; loadError?: undefined }
  /** The transfer failed (`loadError`): `kv_load_failure_policy`, fail-open or fail-closed. */
  | { action: 'fail' | 'recompute'; verdict: null; loadError: LoadError };

/** Engine-facing hooks of the checksum scheduler (runs in the engine's scheduler; never blocks). */
export interface KVChecksumSchedulerHooks {
  /** False when checksums are off (config, or no carrier under fail-open): the engine may skip the hooks. */
  readonly enabled: boolean;
  /**
   * Producer: this step schedules the last prompt tokens of `request`, so after the step's forward
   * the blocks hold the KV of `numTokens` tokens. Records a send entry (every block of every group
   * that holds one of those tokens; state groups: the running-state block).
   */
  onPromptComplete(request: ConnectorRequest, blocks: BlockIdsPerGroup, numTokens: number): void;
  /**
   * Consumer: blocks were allocated for an external load of `numExternalTokens` tokens after a
   * local prefix hit of `numLocalTokens`. Records a receive entry of only the loaded blocks (a
   * local prefix hit is not re-checked). `numLocalTokens + numExternalTokens` is the load's numTokens.
   */
  onLoadScheduled(request: ConnectorRequest, blocks: BlockIdsPerGroup, numLocalTokens: number, numExternalTokens: number): void;
  /** The step's metadata for the checksum workers (`SchedulerOutput.kvChecksumMetadata`). */
  buildStepMeta(): unknown;
  /** Every worker's output of the step: aggregates records and connector-carried payloads. */
  updateFromOutputs(outputs: readonly KVConnectorOutput[]): void;
  /**
   * True while a worker's sums of `request` (producer: its send entry; consumer: its load) are in
   * flight on a device backend (announced in a report's `inFlight`) and their deadline has not
   * passed. The engine holds a consumer's load (as `WAITING_FOR_REMOTE_KVS`) and a producer's
   * normal finish (its `kv_transfer_params`) while it is true; past the deadline it is false and the
   * missing worker makes the load `unverified` (`workers-missing`), the payload not sent.
   * Absent: always false (host backends report in the same step).
   */
  sumsInFlight?(request: ConnectorRequest): boolean;
  /**
   * Consumer: every worker reported `request` in `finishedRecving`. Verifies (SPEC 8, identity
   * first: 8.0, against `request.promptTokenIds`) and applies fail-open / fail-closed and the load
   * failure policy. When a worker reported the load failed (`loadError`: its cause, from
   * `KVConnectorOutput.loadErrors`, or `invalid-blocks`), nothing is verified: the outcome is
   * `transfer-failed` and the action `kv_load_failure_policy`. Emits events, metrics and a
   * structured log naming request, groups, block positions, reason, identity.
   */
  onLoadFinished(request: ConnectorRequest, loadError?: LoadError): LoadDecision;
  /**
   * Producer: `request` finished and the connector returned `result`. Adds `kv_checksums` to the
   * returned params (carrier `kv_transfer_params`) or hands the payload to the connector's
   * `sendKvChecksums` (carrier `connector`). Only for `stop`/`length`; returns the params to send.
   */
  onRequestFinished(request: ConnectorRequest, result: RequestFinishedResult, reason: FinishReason): KVTransferParams | undefined;
}

/** Engine-facing hooks of the checksum worker (one per worker; never blocks on the network). */
export interface KVChecksumWorkerHooks {
  /** Called once with the worker's caches (after the connector's `registerKvCaches`). */
  registerKvCaches(caches: WorkerKVCaches): void;
  /** Called at the start of each step with `SchedulerOutput.kvChecksumMetadata`. */
  bindStepMeta(meta: unknown): void;
  /** Called after the forward pass wrote this step's KV: sums the step's send entries (replica 0). */
  afterForward(): void;
  /**
   * Called with the connector's transfer results of the step, before any later forward pass can
   * read the loaded blocks: sums every replica of each finished load's blocks, and keeps the first
   * connector-carried payload per request.
   */
  afterTransferResults(results: TransferResults): void;
  /** The step's report for `KVConnectorOutput.kvChecksumReport` (then forgets it). */
  takeReport(): unknown;
}
