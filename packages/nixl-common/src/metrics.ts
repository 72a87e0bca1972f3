/**
 * Prometheus metrics of the NIXL connectors (prom-client), as vLLM's NixlConnector exports them
 * (`NixlKVConnectorStats` / `NixlPromMetrics`): transfer time, post time, bytes and descriptors per
 * transfer (histograms), failed transfers, failed notifs, expired leases.
 * Registered on the engine's registry when the connector is given one (the worker/scheduler
 * context's `metricsRegistry`, or `kv_connector_extra_config.metrics_registry`), else on a
 * registry of their own (never prom-client's global one). Metrics already on the registry (a
 * second connector half of the same engine) are reused.
 * @module
 */
import { Counter, Histogram, Registry, type Metric } from 'prom-client';

/**
 * Metric names: vLLM's NixlConnector metrics (`NixlPromMetrics` in
 * vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py) with `kvconnect_` for `vllm:`
 * (`vllm:nixl_xfer_time_seconds` is `kvconnect_nixl_xfer_time_seconds`; promtool refuses `:`),
 * same types and buckets; the handshakes counter is kvconnect's own. A transfer count is the
 * `_count` of the transfer-time histogram.
 */
export const NIXL_METRIC_NAMES = Object.freeze({
  xferSeconds: 'kvconnect_nixl_xfer_time_seconds',
  postSeconds: 'kvconnect_nixl_post_time_seconds',
  bytes: 'kvconnect_nixl_bytes_transferred',
  descriptors: 'kvconnect_nixl_num_descriptors',
  failedTransfers: 'kvconnect_nixl_num_failed_transfers_total',
  failedNotifs: 'kvconnect_nixl_num_failed_notifications_total',
  expiredLeases: 'kvconnect_nixl_num_kv_expired_reqs_total',
  handshakes: 'kvconnect_nixl_handshakes_total',
});

/** The metrics of one engine's NIXL connector. Labels: `mode` (pull/push), `op` (READ/WRITE), `reason`. */
export interface NixlMetrics {
  readonly registry: Registry;
  /** Wall time of a transfer from post to done, seconds (vLLM's `nixl_xfer_time_seconds`). */
  readonly xferSeconds: Histogram<'mode' | 'op'>;
  /** Time to post a transfer (build + post), seconds (vLLM's `nixl_post_time_seconds`). */
  readonly postSeconds: Histogram<'mode' | 'op'>;
  /** Bytes per completed transfer (vLLM's `nixl_bytes_transferred`; `_sum` is the total). */
  readonly bytes: Histogram<'mode' | 'op'>;
  /** Descriptors (coalesced) per completed transfer (vLLM's `nixl_num_descriptors`). */
  readonly descriptors: Histogram<'mode' | 'op'>;
  /** Loads (consumer) or writes (producer) that failed, by reason (vLLM's `nixl_num_failed_transfers`). */
  readonly failedTransfers: Counter<'mode' | 'reason'>;
  /** Notifs that did not decode or did not match a load (vLLM's `nixl_num_failed_notifications`). */
  readonly failedNotifs: Counter<'mode'>;
  /** Producer leases that expired before the consumer was done (vLLM's `nixl_num_kv_expired_reqs`). */
  readonly expiredLeases: Counter<'mode'>;
  /** Handshakes by result (`ok`, or the refusal / failure code). */
  readonly handshakes: Counter<'mode' | 'result'>;
}

/** vLLM's buckets (nixl_connector.py): post time; transfer time drops the first. */
const TIME_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0];
/** vLLM's bytes buckets: 2 KiB to 8 GiB, every factor of 4. */
const BYTES_BUCKETS = Array.from({ length: 12 }, (_, i) => 2 ** (11 + 2 * i));
const DESCRIPTOR_BUCKETS = [10, 20, 30, 50, 75, 100, 200, 400, 1000, 2000, 4000, 10000, 20000, 50000];

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
  const N = NIXL_METRIC_NAMES;
  const labelNames = ['mode', 'op'] as const;
  return {
    registry,
    xferSeconds: getOr(registry, N.xferSeconds, () => new Histogram({ name: N.xferSeconds, help: 'Histogram of transfer duration for NIXL KV Cache transfers (post to done), seconds.', labelNames, buckets: TIME_BUCKETS.slice(1), registers })),
    postSeconds: getOr(registry, N.postSeconds, () => new Histogram({ name: N.postSeconds, help: 'Histogram of transfer post time for NIXL KV Cache transfers (build and post), seconds.', labelNames, buckets: TIME_BUCKETS, registers })),
    bytes: getOr(registry, N.bytes, () => new Histogram({ name: N.bytes, help: 'Histogram of bytes transferred per NIXL KV Cache transfers.', labelNames, buckets: BYTES_BUCKETS, registers })),
    descriptors: getOr(registry, N.descriptors, () => new Histogram({ name: N.descriptors, help: 'Histogram of number of descriptors per NIXL KV Cache transfers.', labelNames, buckets: DESCRIPTOR_BUCKETS, registers })),
    failedTransfers: getOr(registry, N.failedTransfers, () => new Counter({ name: N.failedTransfers, help: 'Number of failed NIXL KV Cache transfers (loads or writes), by reason.', labelNames: ['mode', 'reason'], registers })),
    failedNotifs: getOr(registry, N.failedNotifs, () => new Counter({ name: N.failedNotifs, help: 'Number of failed NIXL KV Cache notifications (undecodable, or matching no transfer).', labelNames: ['mode'], registers })),
    expiredLeases: getOr(registry, N.expiredLeases, () => new Counter({ name: N.expiredLeases, help: 'Number of requests that had their KV expire (producer lease ended before the consumer was done).', labelNames: ['mode'], registers })),
    handshakes: getOr(registry, N.handshakes, () => new Counter({ name: N.handshakes, help: 'NIXL side-channel handshakes by result', labelNames: ['mode', 'result'], registers })),
  };
}
