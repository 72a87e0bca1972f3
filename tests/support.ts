/** Helpers shared by the cross-package tests (tests/nixl, tests/mooncake, ...). */
import type { KVChecksumObservability } from '@kvconnect/core';
import type { Registry } from 'prom-client';

/** Waits until `cond()` holds, polling every 2 ms; throws `timed out` after `ms`. */
export async function until(cond: () => boolean, ms = 10_000): Promise<void> {
  const t0 = Date.now();
  while (!cond()) {
    if (Date.now() - t0 > ms) throw new Error('timed out');
    await new Promise((r) => setTimeout(r, 2));
  }
}

/**
 * Sum of a prom-client metric's values whose labels include `labels` (a histogram: its `_sum`).
 * @throws Error when `registry` has no metric `name` (a renamed or unregistered metric must fail
 *   the test, not read as 0).
 */
export async function metricValue(registry: Registry, name: string, labels: Record<string, string> = {}): Promise<number> {
  const m = registry.getSingleMetric(name);
  if (!m) throw new Error(`no metric ${name} in the registry (registered: ${registry.getMetricsAsArray().map((x) => x.name).join(', ') || 'none'})`);
  const v = await m.get();
  return v.values
    // a histogram counts its `_sum` (bytes, seconds), not its buckets or `_count`
    .filter((x) => Object.entries(labels).every(([k, l]) => x.labels[k] === l) && !/_(bucket|count)$/.test((x as { metricName?: string }).metricName ?? ''))
    .reduce((a, x) => a + x.value, 0);
}

/** A counter of an engine's checksum observability (e.g. `loads` by `verdict`). */
export async function checksumCounter(obs: KVChecksumObservability, name: keyof KVChecksumObservability['metrics'], labels: Record<string, string> = {}): Promise<number> {
  return metricValue(obs.registry, (await obs.metrics[name].get()).name, labels);
}
