/**
 * Prometheus metrics of the NIXL connectors (prom-client), after vLLM's `NixlKVConnectorStats`:
 * transfer time, post time, bytes, descriptors, failed transfers, failed notifs, expired leases.
 * Registered on the engine's registry when the connector is given one (the worker/scheduler
 * context's `metricsRegistry`, or `kv_connector_extra_config.metrics_registry`), else on a
 * registry of their own (never prom-client's global one). Metrics already on the registry (a
 * second connector half of the same engine) are reused.
 * @module
 */
import { Counter, Histogram, Registry, type Metric } from 'prom-client';

/** Metric names. */
export const NIXL_METRIC_NAMES = Object.freeze({
  xferSeconds: 'kvconnect_nixl_xfer_seconds',
  postSeconds: 'kvconnect_nixl_post_seconds',
  bytes: 'kvconnect_nixl_bytes_transferred_total',
  descriptors: 'kvconnect_nixl_descriptors_total',
  transfers: 'kvconnect_nixl_transfers_total',
  failedTransfers: 'kvconnect_nixl_failed_transfers_total',
  failedNotifs: 'kvconnect_nixl_failed_notifications_total',
  expiredLeases: 'kvconnect_nixl_expired_leases_total',
  handshakes: 'kvconnect_nixl_handshakes_total',
});

/** The metrics of one engine's NIXL connector. Labels: `mode` (pull/push), `op` (READ/WRITE), `reason`. */
export interface NixlMetrics {
  readonly registry: Registry;
  /** Wall time of a transfer from post to done, seconds. */
  readonly xferSeconds: Histogram<'mode' | 'op'>;
  /** Time to post a transfer (build + post), seconds. */
  readonly postSeconds: Histogram<'mode' | 'op'>;
  readonly bytes: Counter<'mode' | 'op'>;
  readonly descriptors: Counter<'mode' | 'op'>;
  /** Transfers that completed. */
  readonly transfers: Counter<'mode' | 'op'>;
  /** Loads (consumer) or writes (producer) that failed, by reason. */
  readonly failedTransfers: Counter<'mode' | 'reason'>;
  /** Notifs that did not decode or did not match a load. */
  readonly failedNotifs: Counter<'mode'>;
  /** Producer leases that expired before the consumer was done. */
  readonly expiredLeases: Counter<'mode'>;
  /** Handshakes by result (`ok`, or the refusal / failure code). */
  readonly handshakes: Counter<'mode' | 'result'>;
}

function getOr<T extends Metric>(registry: Registry, name: string, make: () => T): T {
  return (registry.getSingleMetric(name) as T | undefined) ?? make();
}

/** True for a prom-client registry (duck-typed: a `Registry` from another copy of prom-client works too). */
export function isRegistry(x: unknown): x is Registry {
  return typeof x === 'object' && x !== null && typeof (x as Registry).registerMetric === 'function' && typeof (x as Registry).getSingleMetric === 'function';
}

/** The metrics on `registry` (created, or reused when already there). */
export function nixlMetrics(registry: Registry = new Registry()): NixlMetrics {
  const registers = [registry];
  const buckets = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10];
  const N = NIXL_METRIC_NAMES;
  return {
    registry,
    xferSeconds: getOr(registry, N.xferSeconds, () => new Histogram({ name: N.xferSeconds, help: 'NIXL connector transfer time (post to done), seconds', labelNames: ['mode', 'op'], buckets, registers })),
    postSeconds: getOr(registry, N.postSeconds, () => new Histogram({ name: N.postSeconds, help: 'NIXL connector time to build and post a transfer, seconds', labelNames: ['mode', 'op'], buckets, registers })),
    bytes: getOr(registry, N.bytes, () => new Counter({ name: N.bytes, help: 'KV bytes moved by the NIXL connector', labelNames: ['mode', 'op'], registers })),
    descriptors: getOr(registry, N.descriptors, () => new Counter({ name: N.descriptors, help: 'Descriptors (coalesced) in NIXL connector transfers', labelNames: ['mode', 'op'], registers })),
    transfers: getOr(registry, N.transfers, () => new Counter({ name: N.transfers, help: 'NIXL connector transfers that completed', labelNames: ['mode', 'op'], registers })),
    failedTransfers: getOr(registry, N.failedTransfers, () => new Counter({ name: N.failedTransfers, help: 'NIXL connector loads or writes that failed, by reason', labelNames: ['mode', 'reason'], registers })),
    failedNotifs: getOr(registry, N.failedNotifs, () => new Counter({ name: N.failedNotifs, help: 'NIXL notifs that failed to decode or matched no transfer', labelNames: ['mode'], registers })),
    expiredLeases: getOr(registry, N.expiredLeases, () => new Counter({ name: N.expiredLeases, help: 'Producer KV leases that expired before the consumer was done', labelNames: ['mode'], registers })),
    handshakes: getOr(registry, N.handshakes, () => new Counter({ name: N.handshakes, help: 'NIXL side-channel handshakes by result', labelNames: ['mode', 'result'], registers })),
  };
}
