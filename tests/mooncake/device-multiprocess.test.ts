/**
 * MooncakeConnector with device KV and worker processes: producer TP2 and consumer TP1 engines
 * with `device: 'cuda-emulated'` and `executor: 'processes'` (one worker process per TP rank, each
 * with its own emulated device memory: one host id per process, so no IPC between them). The
 * Mooncake workers register their device regions as VRAM, the producer's workers reach its
 * bootstrap server through the handshake hooks, the consumer is told the producer's bootstrap
 * address by its config, and the embedded agents move the device regions over TCP with pinned
 * staging on both sides. The output equals a single host instance and the load verifies.
 * (Same-host CUDA IPC between processes needs a GPU: bench/cuda/pd-device.mjs.)
 *
 * The worker processes run `dist/`; `beforeAll` brings it up to date with `tsc --build`.
 */
import { spawnSync } from 'node:child_process';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { beforeAll, describe, expect, it } from 'vitest';
import { KVChecksumObservability } from '@kvconnect/core';
import { Engine, PDProxy } from '@kvconnect/engine';
import { MOONCAKE_CONNECTOR } from '@kvconnect/mooncake';
import { bootstrapAddressOfEngine, counter, single } from './utils.js';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const PROMPT = 'Device KV in worker processes, moved by Mooncake with staging.';
const S = { maxTokens: 6, ignoreEos: true };

beforeAll(() => {
  const tsc = join(dirname(createRequire(import.meta.url).resolve('typescript/package.json')), 'bin/tsc');
  const r = spawnSync(process.execPath, [tsc, '--build', join(ROOT, 'packages/engine'), join(ROOT, 'packages/mooncake')], { encoding: 'utf8', timeout: 170_000 });
  if (r.status !== 0) throw new Error(`tsc --build failed:\n${`${r.stdout}${r.stderr}`.slice(-4000)}`);
}, 180_000);

describe('MooncakeConnector, device KV (cuda-emulated), worker processes', () => {
  it('producer TP2 -> consumer TP1: equals a single instance, the load verifies', async () => {
    const ref = await single('dense-gqa').generate(PROMPT, S);
    const base = { model: 'dense-gqa', numBlocks: 64, executor: 'processes', device: 'cuda-emulated', workerImports: [join(ROOT, 'packages/mooncake/dist/index.js')] } as const;
    const extra = { bootstrap_port: 0, abort_timeout_ms: 10_000, transfer_timeout_ms: 15_000 };
    const id = `mc-devmp-${process.pid}`;
    const obs = new KVChecksumObservability({ level: 'silent' });
    const producer = new Engine({ ...base, tpSize: 2, engineId: `${id}-p`, observability: new KVChecksumObservability({ level: 'silent' }), kvTransferConfig: { kv_connector: MOONCAKE_CONNECTOR, kv_role: 'kv_producer', enable_kv_checksum: true, kv_connector_extra_config: extra } });
    let consumer: Engine | null = null;
    try {
      await producer.ready;
      consumer = new Engine({
        ...base,
        engineId: `${id}-d`,
        observability: obs,
        kvTransferConfig: { kv_connector: MOONCAKE_CONNECTOR, kv_role: 'kv_consumer', enable_kv_checksum: true, kv_checksum_fail_closed: true, kv_load_failure_policy: 'fail', kv_connector_extra_config: { ...extra, remote_bootstrap_addr: await bootstrapAddressOfEngine(producer) } },
      });
      await consumer.ready;
      expect(producer.workerPids.flat()).toHaveLength(2);
      expect(consumer.workerPids.flat()).toHaveLength(1);
      expect(new Set([...producer.workerPids.flat(), ...consumer.workerPids.flat(), process.pid]).size).toBe(4);
      const r = await new PDProxy({ prefill: producer, decode: consumer, mode: 'concurrent' }).generate(PROMPT, S);
      expect(r.error).toBeUndefined();
      expect(r.tokenIds).toEqual(ref.tokenIds);
      expect(await counter(obs, 'loads', { verdict: 'verified' })).toBe(1);
      expect(consumer.stats.loadsUsed).toBe(1);
    } finally {
      await consumer?.shutdown();
      await producer.shutdown();
    }
  }, 90_000);
});
