/**
 * Test utility: builds producer/consumer engine pairs over `InProcessConnector` and a single
 * instance with the same model, and helpers to compare them.
 */
import { KVChecksumObservability } from '@kvconnect/core';
import { Engine, type EngineOptions } from '../../src/engine.js';
import { PDProxy } from '../../src/proxy.js';
import { IN_PROCESS_CONNECTOR, InProcessBus, inProcessRegistry } from '@kvconnect/engine/testing';

let seq = 0;

/** Options of one side. */
export type SideOptions = Partial<Omit<EngineOptions, 'kvTransferConfig' | 'engineId'>>;

/** Options of {@link makePD}. */
export interface PDOptions {
  model: EngineOptions['model'];
  producer?: SideOptions;
  consumer?: SideOptions;
  /** Checksums on both sides (default true). */
  checksums?: boolean;
  /** Checksums on the producer only (default: `checksums`). */
  producerChecksums?: boolean;
  failClosed?: boolean;
  policy?: 'fail' | 'recompute';
  mode?: 'sequential' | 'concurrent';
  /** The consumer's checksum observability (default: a silent one). */
  consumerObservability?: KVChecksumObservability;
  /** The bus the two engines meet on (default: a new one). */
  bus?: InProcessBus;
}

/** A P/D pair: producer, consumer, proxy and the consumer's checksum observability. */
export interface PD {
  producer: Engine;
  consumer: Engine;
  proxy: PDProxy;
  obs: KVChecksumObservability;
  /** The pair's bus (fault hooks, pause/resume, failLoads). */
  bus: InProcessBus;
  shutdown(): Promise<void>;
}

/** A producer and a consumer over `InProcessConnector`, on a bus and registry of their own. */
export function makePD(o: PDOptions): PD {
  const { registry, bus } = inProcessRegistry(o.bus);
  const id = seq++;
  const checks = o.checksums ?? true;
  const obs = o.consumerObservability ?? new KVChecksumObservability({ level: 'silent' });
  const base = { model: o.model, numBlocks: 256, maxNumBatchedTokens: 256, registry } as const;
  const producer = new Engine({
    ...base,
    ...o.producer,
    engineId: `producer-${id}`,
    kvTransferConfig: { kv_connector: IN_PROCESS_CONNECTOR, kv_role: 'kv_producer', enable_kv_checksum: o.producerChecksums ?? checks },
    observability: new KVChecksumObservability({ level: 'silent' }),
  });
  const consumer = new Engine({
    ...base,
    ...o.consumer,
    engineId: `consumer-${id}`,
    kvTransferConfig: {
      kv_connector: IN_PROCESS_CONNECTOR,
      kv_role: 'kv_consumer',
      enable_kv_checksum: checks,
      kv_checksum_fail_closed: o.failClosed ?? false,
      kv_load_failure_policy: o.policy ?? 'recompute',
    },
    observability: obs,
  });
  const proxy = new PDProxy({ prefill: producer, decode: consumer, mode: o.mode });
  return {
    producer,
    consumer,
    proxy,
    obs,
    bus,
    async shutdown() {
      await producer.shutdown();
      await consumer.shutdown();
    },
  };
}

/** A single instance of `model`. */
export function single(model: EngineOptions['model'], o: SideOptions = {}): Engine {
  return new Engine({ model, numBlocks: 256, maxNumBatchedTokens: 256, ...o, engineId: `single-${seq++}` });
}

/** Counter value of a prom-client counter with optional labels. */
export async function counter(obs: KVChecksumObservability, name: keyof KVChecksumObservability['metrics'], labels: Record<string, string> = {}): Promise<number> {
  const m = await (obs.metrics[name] as unknown as { get(): Promise<{ values: Array<{ value: number; labels: Record<string, string> }> }> }).get();
  return m.values.filter((v) => Object.entries(labels).every(([k, x]) => v.labels[k] === x)).reduce((a, v) => a + v.value, 0);
}

/** Waits until `cond()` or throws after `ms`. */
export async function until(cond: () => boolean, ms = 5000): Promise<void> {
  const t0 = Date.now();
  while (!cond()) {
    if (Date.now() - t0 > ms) throw new Error('timed out');
    await new Promise((r) => setTimeout(r, 2));
  }
}

/** Prompts of varied lengths (real text). */
export function prompts(n: number, seed = 1): string[] {
  const words = ['kv', 'cache', 'prefill', 'decode', 'block', 'tensor', 'parallel', 'checksum', 'layer', 'token', 'the', 'a', 'of', 'engine', 'mamba', 'latent', 'window', 'proxy'];
  const out: string[] = [];
  let s = seed;
  for (let i = 0; i < n; i++) {
    const len = 3 + (i * 7 + seed) % 9;
    const ws: string[] = [];
    for (let k = 0; k < len; k++) {
      s = (s * 1103515245 + 12345) >>> 0;
      ws.push(words[s % words.length]);
    }
    out.push(`${i}: ${ws.join(' ')}.`);
  }
  return out;
}
