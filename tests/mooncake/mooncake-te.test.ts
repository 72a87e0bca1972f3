/**
 * MooncakeConnector with `backend: 'mooncake'`: the workers move KV with MooncakeAgent over the
 * Mooncake Transfer Engine C API. In CI the library is the in-process fake
 * (native/build/test/libfake_transfer_engine.so, through MOONCAKE_LIBRARY): its engines share one
 * table, so a producer and a consumer engine in one process really copy bytes between their KV
 * caches. With MOONCAKE_PREFIX set (and MOONCAKE_LIBRARY unset) the real library is used.
 * Outputs equal a single instance's and every load verifies its KV checksums.
 */
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createAgent, mooncakeUnavailableReason } from '@kvconnect/mooncake';
import { ClusterSecretError, decodeMooncakeMetadata } from '@kvconnect/transfer';
import { counter, makeMooncakePD, prompts, single, until } from './utils.js';

const FAKE = fileURLToPath(new URL('../../native/build/test/libfake_transfer_engine.so', import.meta.url));
const native = createRequire(import.meta.url)('@kvconnect/native') as { addon: { mooncake?: unknown } | null };
const useReal = !!process.env.MOONCAKE_PREFIX && !process.env.MOONCAKE_LIBRARY;
const missing = useReal ? null : !native.addon?.mooncake ? 'the native addon has no Mooncake bindings (cd native && node scripts/install.cjs)' : !existsSync(FAKE) ? `${FAKE} is not built` : null;

const S = { maxTokens: 6, ignoreEos: true };

describe.skipIf(!!missing)(`MooncakeConnector P/D over the Mooncake Transfer Engine (${useReal ? 'real library' : 'fake library'})${missing ? ` (skipped: ${missing})` : ''}`, () => {
  const saved = process.env.MOONCAKE_LIBRARY;
  beforeAll(() => {
    if (!useReal) process.env.MOONCAKE_LIBRARY = FAKE;
  });
  afterAll(() => {
    if (saved === undefined) delete process.env.MOONCAKE_LIBRARY;
    else process.env.MOONCAKE_LIBRARY = saved;
  });

  it('createAgent makes a MooncakeAgent', async () => {
    expect(mooncakeUnavailableReason()).toBeNull();
    const a = await createAgent('mooncake', 'mc-te-agent', '127.0.0.1');
    try {
      expect(a.backend).toBe('mooncake');
    } finally {
      await a.close();
    }
  });

  it('the engine starts with the configured host (its segment name); a non-loopback host needs a cluster secret', async () => {
    const a = await createAgent('mooncake', 'mc-te-bind', '127.0.0.3');
    try {
      expect(decodeMooncakeMetadata(await a.getLocalMetadata()).segment).toMatch(/^127\.0\.0\.3:\d+$/);
    } finally {
      await a.close();
    }
    await expect(createAgent('mooncake', 'mc-te-bind-2', '192.0.2.7')).rejects.toThrow(ClusterSecretError);
    if (!useReal) {
      // The fake starts no listener: check that the configured host reaches the engine's init.
      const b = await createAgent('mooncake', 'mc-te-bind-3', '192.0.2.7', Buffer.from('a-cluster-secret-of-tests'));
      try {
        expect(decodeMooncakeMetadata(await b.getLocalMetadata()).segment).toMatch(/^192\.0\.2\.7:\d+$/);
      } finally {
        await b.close();
      }
    }
  });

  for (const c of [
    { name: 'dense-gqa TP1 -> TP1', model: 'dense-gqa' as const, producer: {}, consumer: {}, extra: {} },
    { name: 'dense-gqa TP2 -> TP1', model: 'dense-gqa' as const, producer: { tpSize: 2 }, consumer: {}, extra: {} },
    { name: 'dense-gqa TP2 -> TP1 with a cluster secret', model: 'dense-gqa' as const, producer: { tpSize: 2 }, consumer: {}, extra: { cluster_secret: 'mooncake-te-cluster-secret' } },
  ]) {
    it(`${c.name}: equals a single instance, every load verified`, async () => {
      const pd = await makeMooncakePD({ model: c.model, producer: c.producer, consumer: c.consumer, failClosed: true, policy: 'fail', extra: { backend: 'mooncake', ...c.extra } });
      try {
        expect(pd.producerWorkers().every((w) => w.transferAgent?.backend === 'mooncake')).toBe(true);
        expect(pd.consumerWorkers().every((w) => w.transferAgent?.backend === 'mooncake')).toBe(true);
        const ps = prompts(3, c.name.length);
        const ref = single(c.model);
        for (const p of ps) {
          const want = await ref.generate(p, S);
          const got = await pd.proxy.generate(p, S);
          expect(got.error).toBeUndefined();
          expect(got.tokenIds).toEqual(want.tokenIds);
        }
        expect(await counter(pd.obs, 'loads', { verdict: 'verified' })).toBe(ps.length);
        expect(pd.consumer.stats.loadsUsed).toBe(ps.length);
        expect(pd.producerWorkers().every((w) => w.stats.bytesWritten > 0)).toBe(true);
        await until(() => pd.producer.scheduler.delayedFree.size === 0);
        expect(pd.producer.scheduler.kv.pool.numFree).toBe(pd.producer.scheduler.kv.pool.numBlocks);
      } finally {
        await pd.shutdown();
      }
    });
  }
});
