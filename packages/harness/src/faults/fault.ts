/**
 * The interface every fault implements: one module per fault kind under `kinds/`, created by
 * `createFault` (an exhaustive switch over the kinds). A fault holds no state: what it needs
 * (the worker's caches, the load, queues of held reports) is passed in, and it returns what it
 * changed; the connector halves record it.
 *
 * Each hook names where it runs:
 * - `consumerParams`: the consumer's scheduler half, once per request, before the inner connector
 *   and the checksum scheduler read the request's `kv_transfer_params`;
 * - `producerPayload`: the producer's scheduler half, on the checksum payload handed to the
 *   connector carrier (`sendKvChecksums`);
 * - `producerBlocks`: a producer worker, in the step that computes the request's last prompt
 *   tokens, after the forward pass and the KV checksum sums of that step (the request finishes in
 *   that step: the P/D proxy asks the producer for one token), before any consumer can read;
 * - `consumerNotifs`: a consumer worker, on every step's transfer results, before loaded bytes
 *   are touched;
 * - `consumerLoad`: a consumer worker, once the inner connector reports the load finished and
 *   before the checksum worker sums it;
 * - `consumerPayloads`: a consumer worker, on connector-carried checksum payloads.
 *
 * To add a fault: its spec and validation in `../faults.ts` (`FaultSpec`, `FAULT_KINDS`,
 * `checkFault`), a module in `kinds/` implementing the hooks it needs, and its case in
 * `kinds/index.ts` (the compiler rejects the switch until the case is there).
 * @module
 */
import type { KVChecksumCarrier, KVTransferParams, TransferResults } from '@kvconnect/core';
import type { FaultSpec } from '../faults.js';
import type { LoadMeta, Snapshot } from './bytes.js';
import type { FaultCaches } from './kv-bytes.js';
import type { ChangedGroup } from './records.js';

/** The worker a hook runs on. */
export interface WorkerPlace {
  tpRank: number;
  ppRank: number;
}

/** What a fault did to bytes: the groups whose bytes really changed, and what was done in words. */
export interface Injected {
  changed: ChangedGroup[];
  detail: string;
}

/** Input of {@link Fault.consumerParams}. */
export interface ParamsInput {
  requestId: string;
  /** The params as the request has them so far (earlier faults applied); never mutate: return a copy. */
  params: Readonly<KVTransferParams>;
  /** The inner connector's checksum carrier for the request with these params. */
  carrier: KVChecksumCarrier;
  /** The params (as they arrived) of an earlier request of the scenario, by request index. */
  paramsOf(index: number): Readonly<KVTransferParams> | undefined;
}

/** A consumer load on one worker, for {@link Fault.consumerLoad}. */
export interface LoadInput {
  caches: FaultCaches;
  worker: WorkerPlace;
  load: LoadMeta;
  /** The slots' bytes before the load landed (when a selected fault needs them), else null. */
  snapshot: Snapshot | null;
  /** The step's transfer results (a fault may add invalid blocks). */
  results: TransferResults;
  /** The fault's seed for this request ({@link requestKeySeed}) and the per-worker one. */
  seed: number;
  workerSeed: number;
}

/** A finished producer request's blocks on one worker, for {@link Fault.producerBlocks}. */
export interface BlocksInput {
  caches: FaultCaches;
  worker: WorkerPlace;
  /** Tokens `[0, numTokens)` of the request (the prompt). */
  load: LoadMeta;
  workerSeed: number;
  /** Keeps bytes to write back once the consumer read the request (`restore`). */
  keep(runs: ReadonlyArray<readonly [{ region: number; addr: number }, Uint8Array]>): void;
}

/** A report held back by a notif fault. */
export interface HeldReport {
  id: string;
  target: 'finished-recving' | 'kv-checksums';
  bytes?: Uint8Array;
  /** Steps left (delays). */
  left: number;
}

/** A consumer worker's notif state: reports to repeat or release later, and which (fault, report) pairs were hit. */
export interface NotifState {
  repeat: HeldReport[];
  delayed: HeldReport[];
  done: Set<string>;
}

/** Input of {@link Fault.consumerNotifs} and {@link Fault.consumerPayloads}. */
export interface ResultsInput {
  worker: WorkerPlace;
  /** The step's transfer results (the hook may change them). */
  results: TransferResults;
  state: NotifState;
  /** Whether this fault hits `requestId`. */
  selects(requestId: string): boolean;
}

/** A hit of a results hook: which request, what was done. */
export interface ResultHit {
  requestId: string;
  detail: string;
}

/** One fault of a fault list (`index` = its place in the list, part of its seeds). */
export interface Fault<S extends FaultSpec = FaultSpec> {
  readonly spec: S;
  readonly index: number;
  /** Consumer workers snapshot the load's slots first (fills with `previous`). */
  readonly needsSnapshot: boolean;
  consumerParams?(x: ParamsInput): { params: KVTransferParams; detail: string } | null;
  producerPayload?(requestId: string, payload: Uint8Array): { payload: Uint8Array | null; detail: string } | null;
  producerBlocks?(x: BlocksInput): Injected;
  consumerNotifs?(x: ResultsInput): ResultHit[];
  consumerLoad?(x: LoadInput): Injected | null;
  consumerPayloads?(x: ResultsInput): ResultHit[];
}
