/**
 * MooncakeConnector end to end: two engines in one process, real ZeroMQ side channel, a real
 * bootstrap server and embedded agents (or, where MOONCAKE_PREFIX names an install, the real Mooncake
 * Transfer Engine: `transfersUnderTest`) on 127.0.0.1, the proxy in `concurrent` mode. Outputs
 * equal a single instance's and every load verifies its KV checksums (carried on the transfer
 * response, SPEC 7), across TP sizes, block sizes and models.
 */
import { describe, expect, it } from 'vitest';
import type { PresetName } from '@kvconnect/engine';
import { MOONCAKE_METRIC_NAMES } from '@kvconnect/mooncake';
import { PROMTOOL, promtoolCheck, sampleValue } from '../../packages/engine/test/utils/prom.js';
import { counter, makeMooncakePD, prompts, single, until, type SideOptions } from './utils.js';
import { transfersUnderTest } from '../transfer-engines.js';

const S = { maxTokens: 6, ignoreEos: true };

interface Case {
  name: string;
  model: PresetName;
  producer: SideOptions;
  consumer: SideOptions;
}

const CASES: Case[] = [
  { name: 'dense-gqa TP1 -> TP1', model: 'dense-gqa', producer: {}, consumer: {} },
  { name: 'dense-gqa TP2 -> TP1', model: 'dense-gqa', producer: { tpSize: 2 }, consumer: {} },
  { name: 'dense-gqa TP1 -> TP2 (block sizes 16 -> 8, HND)', model: 'dense-gqa', producer: {}, consumer: { tpSize: 2, blockSize: 8, cacheLayout: { layout: 'HND', kvLayout: 'kv-first' } } },
  { name: 'hybrid-mamba2 TP1 -> TP1', model: 'hybrid-mamba2', producer: {}, consumer: {} },
  { name: 'hybrid-mamba2 TP2 -> TP1', model: 'hybrid-mamba2', producer: { tpSize: 2 }, consumer: {} },
  { name: 'hybrid-mamba2 TP1 -> TP2', model: 'hybrid-mamba2', producer: {}, consumer: { tpSize: 2 } },
];

for (const t of transfersUnderTest('mooncake')) {
  describe.skipIf(t.skip !== null)(t.label, () => {
    describe('MooncakeConnector P/D (concurrent proxy)', () => {
      for (const c of CASES) {
        it(`${c.name}: equals a single instance, every load verified`, async () => {
          const pd = await makeMooncakePD({ transfer: t.engine, model: c.model, producer: c.producer, consumer: c.consumer, failClosed: true, policy: 'fail' });
          try {
            expect(pd.producerWorkers().every((w) => w.transferAgent?.backend === t.engine)).toBe(true);
            const ps = prompts(3, c.name.length);
            const ref = single(c.model);
            for (const p of ps) {
              const want = await ref.generate(p, S);
              const got = await pd.proxy.generate(p, S);
              expect(got.error).toBeUndefined();
              expect(got.tokenIds).toEqual(want.tokenIds);
            }
            expect(await counter(pd.obs, 'loads', { verdict: 'verified' })).toBe(ps.length);
            expect(await counter(pd.obs, 'loads')).toBe(ps.length);
            expect(pd.consumer.stats.loadsUsed).toBe(ps.length);
            // Each consumer worker received from every producer worker; bytes moved through the agents.
            const written = pd.producerWorkers().reduce((a, w) => a + w.stats.bytesWritten, 0);
            expect(written).toBeGreaterThan(0);
            expect(pd.producerWorkers().every((w) => w.stats.bytesWritten > 0)).toBe(true);
            // The producer frees its blocks once every consumer worker was served.
            await until(() => pd.producer.scheduler.delayedFree.size === 0);
            expect(pd.producer.scheduler.kv.pool.numFree).toBe(pd.producer.scheduler.kv.pool.numBlocks);
            expect(pd.producerWorkers().every((w) => w.pendingCounts().sends === 0 && w.pendingCounts().waiters === 0)).toBe(true);
            expect(pd.consumerWorkers().every((w) => w.pendingCounts().loads === 0)).toBe(true);
          } finally {
            await pd.shutdown();
          }
        });
      }
    });
  });
}

describe('MooncakeConnector transfer metrics', () => {
  it("the producer's WRITEs are timed, sized and counted per transfer (one per consumer worker); promtool-clean", async () => {
    const pd = await makeMooncakePD({ model: 'dense-gqa', producer: {}, consumer: { tpSize: 2 }, failClosed: true, policy: 'fail' });
    try {
      const got = await pd.proxy.generate(prompts(1, 7)[0], S);
      expect(got.error).toBeUndefined();
      const text = await pd.producer.metricsText();
      const W = { op: 'WRITE' };
      expect(sampleValue(text, `${MOONCAKE_METRIC_NAMES.xferSeconds}_count`, W)).toBe(2);
      expect(sampleValue(text, `${MOONCAKE_METRIC_NAMES.bytes}_count`, W)).toBe(2);
      expect(sampleValue(text, `${MOONCAKE_METRIC_NAMES.bytes}_sum`, W)).toBeGreaterThan(0);
      expect(sampleValue(text, `${MOONCAKE_METRIC_NAMES.descriptors}_count`, W)).toBe(2);
      expect(sampleValue(text, MOONCAKE_METRIC_NAMES.failedTransfers, W)).toBe(0);
      if (PROMTOOL) expect(promtoolCheck(text)).toEqual({ code: 0, output: '' });
    } finally {
      await pd.shutdown();
    }
  });
});
