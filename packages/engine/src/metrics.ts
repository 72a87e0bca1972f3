/**
 * The engine's own Prometheus metrics, named as vLLM names them (vllm/v1/metrics/loggers.py,
 * `PrometheusStatLogger`; https://docs.vllm.ai/en/latest/design/metrics.html) with `kvconnect_`
 * where vLLM has `vllm:` (`vllm:num_requests_running` is `kvconnect_num_requests_running`): same
 * meaning, type, unit, labels and buckets, and promtool-clean (promtool refuses `:` in names,
 * which Prometheus keeps for recording rules). A scrape config's `metric_relabel_configs` gives
 * vLLM's names back for vLLM dashboards (docs/metrics.md). Every metric carries vLLM's
 * `model_name` label (the first served model name) and `engine` (the engine id; vLLM puts the
 * engine index there).
 * @module
 */
import { Counter, Gauge, Histogram, type Registry } from 'prom-client';
import type { FinishReason } from './contracts.js';

/** The metric names: vLLM's with `kvconnect_` for `vllm:` (counters end in `_total`, as vLLM's exposition shows them). */
export const ENGINE_METRIC_NAMES = Object.freeze({
  numRequestsRunning: 'kvconnect_num_requests_running',
  numRequestsWaiting: 'kvconnect_num_requests_waiting',
  kvCacheUsagePerc: 'kvconnect_kv_cache_usage_perc',
  timeToFirstToken: 'kvconnect_time_to_first_token_seconds',
  e2eRequestLatency: 'kvconnect_e2e_request_latency_seconds',
  promptTokens: 'kvconnect_prompt_tokens_total',
  generationTokens: 'kvconnect_generation_tokens_total',
  requestSuccess: 'kvconnect_request_success_total',
  numPreemptions: 'kvconnect_num_preemptions_total',
  prefixCacheQueries: 'kvconnect_prefix_cache_queries_total',
  prefixCacheHits: 'kvconnect_prefix_cache_hits_total',
});

/** vLLM's buckets of `time_to_first_token_seconds`, seconds. */
const TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0];
/** vLLM's buckets of `e2e_request_latency_seconds`, seconds. */
const LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0];

/** What the gauges and cache counters read at scrape time (the engine's scheduler, once ready). */
export interface EngineMetricsSource {
  /** Running requests, waiting requests (waiting for remote KV included), KV blocks in use 0..1; null before the engine is ready. */
  queues(): { running: number; waiting: number; kvUsage: number; preemptions: number; prefixQueriedTokens: number; prefixHitTokens: number } | null;
}

type Labels = 'model_name' | 'engine';

/**
 * The engine metrics on `registry`: gauges read {@link EngineMetricsSource} when scraped; the
 * request histograms and token counters are fed by {@link requestArrived},
 * {@link firstToken} and {@link requestFinished} (times from `performance.now()`, ms).
 */
export class EngineMetrics {
  private readonly labels: Record<Labels, string>;
  private readonly ttft: Histogram<Labels>;
  private readonly e2e: Histogram<Labels>;
  private readonly promptTokens: Counter<Labels>;
  private readonly generationTokens: Counter<Labels>;
  private readonly success: Counter<Labels | 'finished_reason'>;
  private readonly arrivals = new Map<string, { at: number; first: boolean }>();

  constructor(registry: Registry, labels: { modelName: string; engine: string }, source: EngineMetricsSource) {
    this.labels = { model_name: labels.modelName, engine: labels.engine };
    const registers = [registry];
    const labelNames = ['model_name', 'engine'] as const;
    const N = ENGINE_METRIC_NAMES;
    const own = this.labels;
    const gauge = (name: string, help: string, read: (q: NonNullable<ReturnType<EngineMetricsSource['queues']>>) => number) =>
      new Gauge({
        name,
        help,
        labelNames,
        registers,
        collect() {
          const q = source.queues();
          if (q) this.set(own, read(q));
        },
      });
    // a counter whose total lives elsewhere (the scheduler's stats): add what it grew by since the last scrape
    const mirror = (name: string, help: string, read: (q: NonNullable<ReturnType<EngineMetricsSource['queues']>>) => number) => {
      let seen = 0;
      return new Counter({
        name,
        help,
        labelNames,
        registers,
        collect() {
          const q = source.queues();
          if (!q) return;
          const now = read(q);
          if (now > seen) this.inc(own, now - seen);
          seen = Math.max(seen, now);
        },
      });
    };
    gauge(N.numRequestsRunning, 'Number of requests in model execution batches.', (q) => q.running);
    gauge(N.numRequestsWaiting, 'Number of requests waiting to be processed (waiting for remote KV included).', (q) => q.waiting);
    gauge(N.kvCacheUsagePerc, 'KV-cache usage. 1 means 100 percent usage.', (q) => q.kvUsage);
    mirror(N.numPreemptions, 'Cumulative number of preemption from the engine.', (q) => q.preemptions);
    mirror(N.prefixCacheQueries, 'Prefix cache queries, in terms of number of queried tokens.', (q) => q.prefixQueriedTokens);
    mirror(N.prefixCacheHits, 'Prefix cache hits, in terms of number of cached tokens.', (q) => q.prefixHitTokens);
    this.ttft = new Histogram({ name: N.timeToFirstToken, help: 'Histogram of time to first token in seconds.', labelNames, buckets: TTFT_BUCKETS, registers });
    this.e2e = new Histogram({ name: N.e2eRequestLatency, help: 'Histogram of e2e request latency in seconds.', labelNames, buckets: LATENCY_BUCKETS, registers });
    this.promptTokens = new Counter({ name: N.promptTokens, help: 'Number of prefill tokens processed.', labelNames, registers });
    this.generationTokens = new Counter({ name: N.generationTokens, help: 'Number of generation tokens processed.', labelNames, registers });
    this.success = new Counter({ name: N.requestSuccess, help: 'Count of finished requests, by finish reason.', labelNames: [...labelNames, 'finished_reason'], registers });
    for (const r of ['stop', 'length', 'abort', 'error'] satisfies FinishReason[]) this.success.inc({ ...own, finished_reason: r }, 0);
    for (const m of [this.ttft, this.e2e]) m.zero(own);
    for (const c of [this.promptTokens, this.generationTokens]) c.inc(own, 0);
  }

  /** A request entered the engine at `atMs` (`performance.now()`). */
  requestArrived(requestId: string, atMs: number): void {
    this.arrivals.set(requestId, { at: atMs, first: false });
  }

  /** The request's first output token was sampled at `atMs` (later calls for it are ignored). */
  firstToken(requestId: string, atMs: number): void {
    const a = this.arrivals.get(requestId);
    if (!a || a.first) return;
    a.first = true;
    this.ttft.observe(this.labels, Math.max(0, atMs - a.at) / 1000);
  }

  /** The request finished at `atMs` with `promptTokens` prompt and `generationTokens` output tokens. */
  requestFinished(requestId: string, atMs: number, reason: FinishReason, promptTokens: number, generationTokens: number): void {
    const a = this.arrivals.get(requestId);
    this.arrivals.delete(requestId);
    if (a) this.e2e.observe(this.labels, Math.max(0, atMs - a.at) / 1000);
    this.promptTokens.inc(this.labels, promptTokens);
    this.generationTokens.inc(this.labels, generationTokens);
    this.success.inc({ ...this.labels, finished_reason: reason });
  }
}
