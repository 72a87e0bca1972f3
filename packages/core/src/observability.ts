/**
 * Observability of KV checksums (ARCHITECTURE step 8, SPEC 8 "Metrics and logs say which group,
 * which blocks, why"): typed events (eventemitter3), Prometheus metrics (prom-client) on a
 * registry of their own per engine (never prom-client's global one), and structured logs (pino).
 *
 * One {@link KVChecksumObservability} belongs to one engine: its checksum scheduler records every
 * load verdict and payload into it; the workers' compute time and summed bytes reach it through
 * their reports (workers may run in other processes).
 * @module
 */
import { EventEmitter } from 'eventemitter3';
import { pino, type DestinationStream, type Logger, type LevelWithSilent } from 'pino';
import { Counter, Histogram, Registry } from 'prom-client';
import type { UnverifiedReason, Verdict } from '@kvconnect/checksum';
import type { Localization } from './checksum-localize.js';
import type { LoadError } from './connector.js';

/** pino's logger type, the one logger of kvconnect (re-exported so packages need not depend on pino for the type). */
export type { Logger, LevelWithSilent } from 'pino';

/** Metric names (all counters end in `_total`; the histogram is in seconds). */
export const METRIC_NAMES = Object.freeze({
  loads: 'kvconnect_kv_checksum_loads_total',
  unverified: 'kvconnect_kv_checksum_unverified_total',
  identityUnchecked: 'kvconnect_kv_checksum_identity_unchecked_total',
  wrongRequest: 'kvconnect_kv_checksum_wrong_request_total',
  transferFailed: 'kvconnect_kv_checksum_transfer_failed_total',
  recomputed: 'kvconnect_kv_checksum_recomputed_total',
  failed: 'kvconnect_kv_checksum_failed_total',
  seconds: 'kvconnect_kv_checksum_seconds',
  bytesSummed: 'kvconnect_kv_checksum_bytes_summed_total',
  payloadsSent: 'kvconnect_kv_checksum_payloads_sent_total',
  payloadsNotSent: 'kvconnect_kv_checksum_payloads_not_sent_total',
  sampledBlocks: 'kvconnect_kv_checksum_sampled_blocks_total',
  subBlockGroups: 'kvconnect_kv_checksum_sub_block_groups_total',
  localizations: 'kvconnect_kv_checksum_localizations_total',
});

/** Which side's sums a timing or byte count belongs to: producer sends or consumer loads. */
export type ChecksumSide = 'send' | 'recv';

/** The verdict of one verified load, as events carry it. */
export interface LoadEvent {
  requestId: string;
  /** The verifier's verdict (SPEC 8). */
  verdict: Verdict;
  /** What the engine was told to do with the KV. */
  action: 'use' | 'fail' | 'recompute';
  /** The consumer's numTokens of the load. */
  numTokens: number;
}

/**
 * What the consumer engine did with one finished KV load, whatever decided it: the checksum verdict
 * (SPEC 8), the transport's invalid blocks (the engine's `kv_load_failure_policy`), or neither
 * (a load without checksums). Emitted by the engine once per finished load, after the checksum
 * events of that load.
 */
export interface LoadOutcomeEvent {
  requestId: string;
  /** The checksum verdict; null when the load was not checksummed. */
  verdict: Verdict | null;
  /** What the engine does with the loaded KV. */
  action: 'use' | 'fail' | 'recompute';
  /**
   * What decided `action`: `invalid-blocks` (the connector reported the load failed; the load
   * failure policy applies), `checksum` (the verdict, under the checksum config), `unchecked`
   * (no verdict: the KV is used).
   */
  reason: 'invalid-blocks' | 'checksum' | 'unchecked';
}

/** A load whose transfer failed (a {@link LoadError}): nothing was verified; the load failure policy applies. */
export interface TransferFailedEvent {
  requestId: string;
  /** The cause the connector's worker reported (`reason` `invalid-blocks` when it gave none). */
  loadError: LoadError;
  /** `kv_load_failure_policy`. */
  action: 'fail' | 'recompute';
  /** The consumer's numTokens of the load. */
  numTokens: number;
}

/** A payload the producer handed to a carrier (SPEC 7). */
export interface PayloadSentEvent {
  requestId: string;
  carrier: 'kv_transfer_params' | 'connector';
  /** Encoded payload size in bytes (raw MessagePack, before base64). */
  bytes: number;
  /** Groups in the payload. */
  groups: number[];
}

/** Why a producer sent no payload for a finished request. */
export type NotSentReason =
  | 'workers-missing' // fewer than TP x PP workers reported the request's sums
  | 'rows-differ' // a worker summed other blocks than scheduled
  | 'no-params' // carrier kv_transfer_params but the connector returned no params
  | 'no-send-hook' // carrier connector but the connector has no sendKvChecksums
  | 'encode-error'; // the payload could not be encoded (limits)

/** Events of the checksum scheduler. Every listener gets one object argument. */
export interface KVChecksumEvents {
  /** A load verified (SPEC 8 verdict `verified`). */
  'load-verified': [LoadEvent];
  /** A load mismatched (emitted whatever the action). */
  'load-mismatch': [LoadEvent];
  /** A load could not be verified (emitted whatever the action). */
  'load-unverified': [LoadEvent];
  /** A load's transfer failed (dead producer, refused connection, timeout...): not a checksum verdict. */
  'load-transfer-failed': [TransferFailedEvent];
  /** The consumer recomputes the prompt: fail-closed + `recompute`, or a failed transfer under `recompute`. */
  'load-recomputed': [LoadEvent | TransferFailedEvent];
  /** The request ends with an error: fail-closed + `fail`, or a failed transfer under `fail`. */
  'load-failed': [LoadEvent | TransferFailedEvent];
  /** A consumer engine finished a KV load and decided what to do with it (every load, checksummed or not). */
  'load-outcome': [LoadOutcomeEvent];
  /** A producer handed a payload to its carrier. */
  'checksum-payload-sent': [PayloadSentEvent];
  /** A producer finished a checksummed request but sent no payload. */
  'checksum-payload-not-sent': [{ requestId: string; reason: NotSentReason; detail: string }];
  /** A consumer received a connector-carried payload for a pending load (first copy only). */
  'checksum-payload-received': [{ requestId: string; bytes: number }];
  /** Checksums were turned off at start (fail-open, connector without a carrier). */
  'checksums-disabled': [{ reason: string }];
  /** A mismatched load's drill-down ended (checksum-localize.ts): where the sides differ, or why that is not known. */
  'load-localized': [Localization];
}

/** Options of {@link KVChecksumObservability}. */
export interface ObservabilityOptions {
  /** A pino logger to use (e.g. a child of the engine's). Default: a new one (see `level`, `destination`). */
  logger?: Logger;
  /** Level of the logger created when `logger` is not given. Default `'info'`; `'silent'` silences it. */
  level?: LevelWithSilent;
  /** Where the created logger writes (any object with `write(line)`). Default: stdout. */
  destination?: DestinationStream;
  /**
   * Fields on every line of the created logger: which engine and role wrote it
   * (`{ engine: 'prefill-0', role: 'kv_producer' }`, see {@link createLogger}).
   */
  bindings?: Record<string, string | number>;
  /** The metrics registry. Default: a new `Registry` (never prom-client's global `register`). */
  registry?: Registry;
  /** Labels added to every metric of the registry (e.g. `{ engine: 'prefill-0' }`). */
  defaultLabels?: Record<string, string>;
  /** Histogram buckets of `kvconnect_kv_checksum_seconds`, in seconds. */
  buckets?: number[];
}

/** The Prometheus metrics of one engine's KV checksums. */
export interface KVChecksumMetrics {
  /**
   * `kvconnect_kv_checksum_loads_total{verdict}`: finished loads by outcome: the SPEC 8 verdict
   * (`verified`, `mismatch`, `unverified`), or `transfer-failed` (the transfer failed; nothing verified).
   */
  loads: Counter<'verdict'>;
  /** `kvconnect_kv_checksum_unverified_total{reason}`: unverified reasons (SPEC 8 codes), one per reason reported. */
  unverified: Counter<'reason'>;
  /**
   * `kvconnect_kv_checksum_identity_unchecked_total`: loads checked against a version-1 payload, which
   * does not bind the KV to the request's tokens (SPEC 8.0; the producer predates payload version 2).
   */
  identityUnchecked: Counter<string>;
  /**
   * `kvconnect_kv_checksum_wrong_request_total`: loads whose version-2 payload belongs to other tokens
   * than the request's prompt (SPEC 8.0 `wrongRequest`); each is also a `mismatch` in `loads`.
   */
  wrongRequest: Counter<string>;
  /** `kvconnect_kv_checksum_transfer_failed_total{reason}`: loads whose transfer failed, by the cause's reason code. */
  transferFailed: Counter<'reason'>;
  /** `kvconnect_kv_checksum_recomputed_total`: loads recomputed by the failure policy (mismatch, unverified or transfer-failed). */
  recomputed: Counter<string>;
  /** `kvconnect_kv_checksum_failed_total`: loads failed by the failure policy. */
  failed: Counter<string>;
  /** `kvconnect_kv_checksum_seconds{side}`: wall time of one worker's checksum computation in one step, seconds. */
  seconds: Histogram<'side'>;
  /** `kvconnect_kv_checksum_bytes_summed_total{side}`: KV bytes the workers summed. */
  bytesSummed: Counter<'side'>;
  /** `kvconnect_kv_checksum_payloads_sent_total{carrier}`: payloads a producer handed to a carrier. */
  payloadsSent: Counter<'carrier'>;
  /** `kvconnect_kv_checksum_payloads_not_sent_total{reason}`: finished checksummed requests without a payload. */
  payloadsNotSent: Counter<'reason'>;
  /** `kvconnect_kv_checksum_sampled_blocks_total{outcome}`: sampled checking, loaded blocks `checked` or `skipped` by the sample (docs/checksum-extensions.md). */
  sampledBlocks: Counter<'outcome'>;
  /** `kvconnect_kv_checksum_sub_block_groups_total`: groups whose unaligned prefix hit was verified with sub-block values. */
  subBlockGroups: Counter<string>;
  /** `kvconnect_kv_checksum_localizations_total{result}`: drill-downs of mismatched loads by `Localization.status`. */
  localizations: Counter<'result'>;
}

/**
 * Events, metrics and logs of one engine's KV checksums.
 *
 * - `events`: a typed eventemitter3 emitter ({@link KVChecksumEvents});
 * - `registry`: the prom-client registry holding {@link KVChecksumMetrics} (serve it with
 *   `registry.metrics()`);
 * - `logger`: pino; lines carry `requestId`, `groupId`, `positions`, `reason` fields.
 */
export class KVChecksumObservability {
  readonly events = new EventEmitter<KVChecksumEvents>();
  readonly registry: Registry;
  readonly metrics: KVChecksumMetrics;
  readonly logger: Logger;
  private readonly onceKeys = new Set<string>();

  constructor(options: ObservabilityOptions = {}) {
    this.logger = options.logger ?? createLogger({ level: options.level, destination: options.destination, bindings: options.bindings });
    this.registry = options.registry ?? new Registry();
    if (options.defaultLabels) this.registry.setDefaultLabels(options.defaultLabels);
    const registers = [this.registry];
    this.metrics = {
      loads: new Counter({ name: METRIC_NAMES.loads, help: 'Finished KV loads by verdict (SPEC 8), or transfer-failed', labelNames: ['verdict'], registers }),
      unverified: new Counter({ name: METRIC_NAMES.unverified, help: 'Reasons KV loads could not be verified (SPEC 8 reason codes)', labelNames: ['reason'], registers }),
      identityUnchecked: new Counter({ name: METRIC_NAMES.identityUnchecked, help: 'KV loads checked against a version-1 payload: not bound to the request tokens (SPEC 8.0)', registers }),
      wrongRequest: new Counter({ name: METRIC_NAMES.wrongRequest, help: 'KV loads whose checksums belong to another request (SPEC 8.0 token digest differs)', registers }),
      transferFailed: new Counter({ name: METRIC_NAMES.transferFailed, help: 'KV loads whose transfer failed (nothing verified), by cause', labelNames: ['reason'], registers }),
      recomputed: new Counter({ name: METRIC_NAMES.recomputed, help: 'KV loads discarded and recomputed locally (load failure policy recompute: fail-closed verdicts and failed transfers)', registers }),
      failed: new Counter({ name: METRIC_NAMES.failed, help: 'KV loads that failed their request (load failure policy fail: fail-closed verdicts and failed transfers)', registers }),
      seconds: new Histogram({
        name: METRIC_NAMES.seconds,
        help: 'Wall time of one worker checksum computation in one engine step, in seconds',
        labelNames: ['side'],
        buckets: options.buckets ?? [0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1],
        registers,
      }),
      bytesSummed: new Counter({ name: METRIC_NAMES.bytesSummed, help: 'KV bytes summed by checksum workers', labelNames: ['side'], registers }),
      payloadsSent: new Counter({ name: METRIC_NAMES.payloadsSent, help: 'Checksum payloads handed to a carrier by the producer', labelNames: ['carrier'], registers }),
      payloadsNotSent: new Counter({ name: METRIC_NAMES.payloadsNotSent, help: 'Finished checksummed requests whose payload was not sent', labelNames: ['reason'], registers }),
      sampledBlocks: new Counter({ name: METRIC_NAMES.sampledBlocks, help: 'Sampled checking: loaded KV blocks checked or skipped by the sample', labelNames: ['outcome'], registers }),
      subBlockGroups: new Counter({ name: METRIC_NAMES.subBlockGroups, help: 'KV cache groups whose unaligned prefix hit was verified with sub-block values', registers }),
      localizations: new Counter({ name: METRIC_NAMES.localizations, help: 'Drill-downs of mismatched KV loads (finer sums from the producer), by result', labelNames: ['result'], registers }),
    };
  }

  /** True the first time `key` is seen (for warn-once logs). */
  once(key: string): boolean {
    if (this.onceKeys.has(key)) return false;
    this.onceKeys.add(key);
    return true;
  }

  /** Records a load outcome: counters by verdict and reason, identity (SPEC 8.0), policy counters. */
  recordLoad(verdict: Verdict, action: LoadEvent['action']): void {
    this.metrics.loads.inc({ verdict: verdict.verdict });
    for (const u of verdict.unverified) this.metrics.unverified.inc({ reason: u.reason satisfies UnverifiedReason });
    if (verdict.identity === 'unchecked') this.metrics.identityUnchecked.inc();
    if (verdict.wrongRequest) this.metrics.wrongRequest.inc();
    if (verdict.sampled) for (const outcome of ['checked', 'skipped'] as const) this.metrics.sampledBlocks.inc({ outcome }, verdict.sampled[outcome]);
    if (verdict.subBlockGroups) this.metrics.subBlockGroups.inc(verdict.subBlockGroups.length);
    this.recordAction(action);
  }

  /** Records a load whose transfer failed: `loads{verdict="transfer-failed"}`, the cause's reason, the policy counter. */
  recordTransferFailed(loadError: LoadError, action: TransferFailedEvent['action']): void {
    this.metrics.loads.inc({ verdict: 'transfer-failed' });
    this.metrics.transferFailed.inc({ reason: loadError.reason });
    this.recordAction(action);
  }

  private recordAction(action: LoadEvent['action']): void {
    if (action === 'recompute') this.metrics.recomputed.inc();
    if (action === 'fail') this.metrics.failed.inc();
  }

  /** Records one worker's checksum work of one step. */
  recordCompute(side: ChecksumSide, seconds: number, bytes: number): void {
    if (seconds > 0) this.metrics.seconds.observe({ side }, seconds);
    if (bytes > 0) this.metrics.bytesSummed.inc({ side }, bytes);
  }
}

/**
 * The one logger kvconnect's processes write with (pino, name `kvconnect`): JSON lines carrying
 * `bindings` (by convention `engine` and `role` for an engine, `component: 'proxy'` for the proxy)
 * on every line.
 * @param o.level pino level (default `info`); `o.destination` any `write(line)` object (default
 *   stdout).
 */
export function createLogger(o: { level?: LevelWithSilent; destination?: DestinationStream; bindings?: Record<string, string | number> } = {}): Logger {
  const opts = { level: o.level ?? 'info', name: 'kvconnect' };
  const base = o.destination ? pino(opts, o.destination) : pino(opts);
  return o.bindings && Object.keys(o.bindings).length > 0 ? base.child(o.bindings) : base;
}

/** A logger that writes nothing (a connector half given no `ctx.logger`). */
export function silentLogger(): Logger {
  return pino({ level: 'silent' });
}

/**
 * A new {@link KVChecksumObservability}.
 * @example createObservability({ level: 'silent' }) // no logs, fresh registry
 */
export function createObservability(options: ObservabilityOptions = {}): KVChecksumObservability {
  return new KVChecksumObservability(options);
}
