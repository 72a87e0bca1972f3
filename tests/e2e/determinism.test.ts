/**
 * Determinism: greedy outputs of 50 prompts, submitted together (continuous batching, chunked
 * prefill), are identical token for token for a single instance, P/D with checksums off, and P/D
 * with checksums on (TP 2 producer, TP 1 consumer with another block size and layout); and for a
 * single instance and P/D over Mooncake with every worker in a process of its own (the worker
 * processes run `dist/`, brought up to date by `tsc --build` first).
 */
import { spawnSync } from 'node:child_process';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterEach, beforeAll, describe, expect, it } from 'vitest';
import { KVChecksumObservability } from '@kvconnect/core';
import { Engine, PDProxy } from '@kvconnect/engine';
import { MOONCAKE_CONNECTOR } from '@kvconnect/mooncake';
import { bootstrapAddressOfEngine } from '../mooncake/utils.js';
import { counter, makePD, prompts, single } from '../../packages/engine/test/utils/pd.js';


const N = 50;
const SAMPLING = { maxTokens: 6, ignoreEos: true };

describe('determinism', () => {
  it(`greedy outputs of ${N} prompts: single = P/D checksums off = P/D checksums on`, async () => {
    const ps = prompts(N);
    const ref = single('dense-gqa', { maxNumBatchedTokens: 96 });
    const a = await Promise.all(ps.map((p) => ref.generate(p, SAMPLING)));
    const off = makePD({ model: 'dense-gqa', checksums: false, producer: { tpSize: 2, maxNumBatchedTokens: 64 }, consumer: { blockSize: 32 } });
    const b = await Promise.all(ps.map((p) => off.proxy.generate(p, SAMPLING)));
    const on = makePD({
      model: 'dense-gqa',
      failClosed: true,
      policy: 'fail',
      producer: { tpSize: 2, maxNumBatchedTokens: 64 },
      consumer: { blockSize: 32, cacheLayout: { layout: 'HND', kvLayout: 'separate' } },
    });
    const c = await Promise.all(ps.map((p) => on.proxy.generate(p, SAMPLING)));
    for (let i = 0; i < N; i++) {
      expect(a[i].tokenIds).toHaveLength(SAMPLING.maxTokens);
      expect(b[i].tokenIds).toEqual(a[i].tokenIds);
      expect(c[i].tokenIds).toEqual(a[i].tokenIds);
      expect(c[i].error).toBeUndefined();
    }
    expect(await counter(on.obs, 'loads', { verdict: 'verified' })).toBe(N);
    expect(await counter(off.obs, 'loads')).toBe(0);
    // Not all outputs are the same sequence (the prompts matter).
    expect(new Set(a.map((r) => r.tokenIds.join(','))).size).toBeGreaterThan(N / 2);
    await off.shutdown();
    await on.shutdown();
  });

  it('seeded temperature sampling: single = P/D checksums on', async () => {
    const ps = prompts(10, 7);
    const sampling = { maxTokens: 6, temperature: 0.8, ignoreEos: true };
    const ref = single('hybrid-mamba2');
    const a = await Promise.all(ps.map((p, i) => ref.generate(p, { ...sampling, seed: i })));
    const pd = makePD({ model: 'hybrid-mamba2', failClosed: true, policy: 'fail', consumer: { tpSize: 2 } });
    const c = await Promise.all(ps.map((p, i) => pd.proxy.generate(p, { ...sampling, seed: i })));
    for (let i = 0; i < ps.length; i++) expect(c[i].tokenIds).toEqual(a[i].tokenIds);
    await pd.shutdown();
  });

  describe('with worker processes', () => {
    const ROOT = fileURLToPath(new URL('../..', import.meta.url));
    beforeAll(() => {
      const tsc = join(dirname(createRequire(import.meta.url).resolve('typescript/package.json')), 'bin/tsc');
      const r = spawnSync(process.execPath, [tsc, '--build', join(ROOT, 'packages/engine'), join(ROOT, 'packages/mooncake')], { encoding: 'utf8', timeout: 170_000 });
      if (r.status !== 0) throw new Error(`tsc --build failed:\n${`${r.stdout}${r.stderr}`.slice(-4000)}`);
    }, 180_000);

    it('greedy outputs of 12 prompts: single = P/D over Mooncake, producer TP2 and consumer TP1 in worker processes, checksums on', async () => {
      const ps = prompts(12, 3);
      const ref = single('dense-gqa', { maxNumBatchedTokens: 96 });
      const a = await Promise.all(ps.map((p) => ref.generate(p, SAMPLING)));
      const workers = { executor: 'processes', workerImports: [join(ROOT, 'packages/mooncake/dist/index.js')] } as const;
      const extra = { bootstrap_port: 0, abort_timeout_ms: 10_000, transfer_timeout_ms: 15_000 };
      const id = `det-mp-${process.pid}`;
      const obs = new KVChecksumObservability({ level: 'silent' });
      const producer = new Engine({ model: 'dense-gqa', tpSize: 2, maxNumBatchedTokens: 64, ...workers, engineId: `${id}-p`, observability: new KVChecksumObservability({ level: 'silent' }), kvTransferConfig: { kv_connector: MOONCAKE_CONNECTOR, kv_role: 'kv_producer', enable_kv_checksum: true, kv_connector_extra_config: extra } });
      let consumer: Engine | null = null;
      try {
        await producer.ready;
        consumer = new Engine({
          model: 'dense-gqa',
          blockSize: 32,
          cacheLayout: { layout: 'HND', kvLayout: 'kv-first' },
          ...workers,
          engineId: `${id}-d`,
          observability: obs,
          kvTransferConfig: { kv_connector: MOONCAKE_CONNECTOR, kv_role: 'kv_consumer', enable_kv_checksum: true, kv_checksum_fail_closed: true, kv_load_failure_policy: 'fail', kv_connector_extra_config: { ...extra, remote_bootstrap_addr: await bootstrapAddressOfEngine(producer) } },
        });
        await consumer.ready;
        expect(producer.workerPids.flat()).toHaveLength(2);
        expect(consumer.workerPids.flat()).toHaveLength(1);
        const proxy = new PDProxy({ prefill: producer, decode: consumer, mode: 'concurrent' });
        const c = await Promise.all(ps.map((p) => proxy.generate(p, SAMPLING)));
        for (let i = 0; i < ps.length; i++) {
          expect(c[i].error).toBeUndefined();
          expect(c[i].tokenIds).toEqual(a[i].tokenIds);
        }
        expect(await counter(obs, 'loads', { verdict: 'verified' })).toBe(ps.length);
      } finally {
        await consumer?.shutdown();
        await producer.shutdown();
      }
    });
  });
});
