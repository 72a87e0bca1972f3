/**
 * Prometheus metrics of `MooncakeConnector` (prom-client), named and bucketed as the NIXL
 * connectors' (`@kvconnect/nixl-common` metrics.ts, after vLLM's NixlConnector): transfer time,
 * bytes and descriptors per transfer, failed transfers. The producer's workers WRITE the KV into
 * the consumer's memory, so the producer engine's `/metrics` carries them. Registered on the
 * engine's registry (`ctx.metricsRegistry`) and reused by every worker half there; else on a
 * registry of their own (never prom-client's global one).
 * @module
 */
import { Counter, Histogram, Registry, type Metric } from 'prom-client';

/** Metric names. */
export const MOONCAKE_METRIC_NAMES = Object.freeze({
  xferSeconds: 'kvconnect_mooncake_xfer_time_seconds',
  bytes: 'kvconnect_mooncake_bytes_transferred',
  descriptors: 'kvconnect_mooncake_num_descriptors',
  failedTransfers: 'kvconnect_mooncake_num_failed_transfers_total',
});

/** The metrics of one engine's Mooncake connector. Label `op`: `WRITE` (the producer's transfers). */
export interface MooncakeMetrics {
  /** One WRITE from post to done, seconds. */
  readonly xferSeconds: Histogram<'op'>;
  /** Bytes per completed WRITE. */
  readonly bytes: Histogram<'op'>;
  /** Descriptors per completed WRITE. */
  readonly descriptors: Histogram<'op'>;
  /** WRITEs (or their planning) that failed: the consumer worker got an error response. */
  readonly failedTransfers: Counter<'op'>;
}

function getOr<T extends Metric>(registry: Registry, name: string, make: () => T): T {
  return (registry.getSingleMetric(name) as T | undefined) ?? make();
}

/** The metrics on `registry` (created, or reused when already there). */
export function mooncakeMetrics(registry: Registry = new Registry()): MooncakeMetrics {
  const registers = [registry];
  const N = MOONCAKE_METRIC_NAMES;
  const labelNames = ['op'] as const;
  return {
    xferSeconds: getOr(registry, N.xferSeconds, () => new Histogram({ name: N.xferSeconds, help: 'Histogram of transfer duration for Mooncake KV Cache transfers (post to done), seconds.', labelNames, buckets: [0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0], registers })),
    bytes: getOr(registry, N.bytes, () => new Histogram({ name: N.bytes, help: 'Histogram of bytes transferred per Mooncake KV Cache transfers.', labelNames, buckets: Array.from({ length: 12 }, (_, i) => 2 ** (11 + 2 * i)), registers })),
    descriptors: getOr(registry, N.descriptors, () => new Histogram({ name: N.descriptors, help: 'Histogram of number of descriptors per Mooncake KV Cache transfers.', labelNames, buckets: [10, 20, 30, 50, 75, 100, 200, 400, 1000, 2000, 4000, 10000, 20000, 50000], registers })),
    failedTransfers: getOr(registry, N.failedTransfers, () => new Counter({ name: N.failedTransfers, help: 'Number of failed Mooncake KV Cache transfers.', labelNames, registers })),
  };
}
