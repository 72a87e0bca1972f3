/**
 * How a consumer's connector says that the `kv_transfer_params` of a request cannot be used (the
 * request then prefills locally): it keeps a reason per request with an {@link UnusableParams}
 * (which counts it on the engine's metrics registry), and returns it from `requestFinished` as
 * `kv_transfer_params: { kv_transfer_params_error: reason }`. The engine server copies it to the
 * response and logs a warning (`packages/engine/src/server/engine-server.ts`).
 *
 * Without this a consumer handed params of another shape (e.g. missing `do_remote_prefill: true`,
 * which vLLM's toy proxy forwards verbatim from the producer) recomputes the whole prompt with no
 * load, no checksum verdict, no error and no log line.
 * @module
 */
import { Counter, type Registry } from 'prom-client';
import type { KVTransferParams } from './connector.js';

/** The key of the reason in the params a consumer returns (and in the engine server's response). */
export const KV_TRANSFER_PARAMS_ERROR = 'kv_transfer_params_error';

/** Name of the counter of requests whose `kv_transfer_params` a connector could not use (labels: `connector`). */
export const UNUSABLE_PARAMS_METRIC = 'kvconnect_kv_transfer_params_unusable_total';

/** True when `p` looks like a producer's params (`remote_engine_id` or `remote_block_ids` set). */
export function hasRemoteKeys(p: KVTransferParams | undefined): boolean {
  if (!p) return false;
  return (p.remote_engine_id !== undefined && p.remote_engine_id !== null) || (p.remote_block_ids !== undefined && p.remote_block_ids !== null);
}

/**
 * The reasons a connector's scheduler half rejected requests' params, until each request
 * finishes. One per connector scheduler (no process-global state).
 */
export class UnusableParams {
  private readonly reasons = new Map<string, string>();
  private readonly counter: Counter<'connector'> | null;

  /**
   * @param connector the connector's registered name (the metric's `connector` label).
   * @param registry the engine's registry (`SchedulerContext.metricsRegistry`); none: not counted.
   */
  constructor(
    readonly connector: string,
    registry?: Registry | null,
  ) {
    this.counter = registry
      ? ((registry.getSingleMetric(UNUSABLE_PARAMS_METRIC) as Counter<'connector'> | undefined) ??
        new Counter({ name: UNUSABLE_PARAMS_METRIC, help: 'Requests whose kv_transfer_params the KV connector could not use (they prefilled locally)', labelNames: ['connector'], registers: [registry] }))
      : null;
  }

  /** Request `requestId`'s params cannot be used, because of `reason` (counted once per request). */
  reject(requestId: string, reason: string): void {
    if (!this.reasons.has(requestId)) this.counter?.inc({ connector: this.connector });
    this.reasons.set(requestId, reason);
  }

  /**
   * Forgets request `requestId` (call from `requestFinished`).
   * @returns `{ kv_transfer_params_error: reason }` merged over `params`, when it was rejected; else `params`.
   */
  take(requestId: string, params?: KVTransferParams): KVTransferParams | undefined {
    const why = this.reasons.get(requestId);
    if (why === undefined) return params;
    this.reasons.delete(requestId);
    return { ...(params ?? {}), [KV_TRANSFER_PARAMS_ERROR]: why };
  }

  /** Requests rejected and not finished yet (for leak tests). */
  get size(): number {
    return this.reasons.size;
  }
}
