/**
 * Regression (bench/e2e.mjs at concurrency 32): a producer busy with long prefill steps answers
 * its side channel only between steps, so the consumer's pre-READ LEASE pin (pull) or PUSH_REG
 * (push) waits for up to a whole step. These requests used the side channel's handshake timeout
 * (5 s by default) instead of the transfer's deadline: with 3-6 s steps some loads failed at the
 * lease stage, their never-written blocks mismatched in every position and were recomputed.
 *
 * Here every producer step blocks the (shared) event loop for longer than the handshake timeout
 * while many requests run concurrently through the proxy with small block pools: every load must
 * still be read and verified, and every output must equal a single instance's. The first
 * handshake (INFO) with a producer that is busy from the start waits the transfer deadline too.
 */
import { describe, expect, it } from 'vitest';
import { NIXL_METRIC_NAMES } from '@kvconnect/nixl-common';
import { checksumCounter, makeNixlPD, metricValue, single, until } from './utils.js';
import { transfersUnderTest } from '../transfer-engines.js';

const HANDSHAKE_MS = 60;
const STEP_BLOCK_MS = 150;
const N = 8;

const prompt = (i: number) => `request ${i}: the consumer pins the lease of a busy producer before it reads the prompt's KV blocks.`;
const sampling = (i: number) => ({ maxTokens: i % 2 ? 4 : 1, ignoreEos: true });

/** Makes every step of `engine` block the event loop for `ms` first (a long forward pass). */
function slowSteps(engine: { step: () => Promise<unknown> }, ms: number): () => void {
  const step = engine.step;
  engine.step = function (this: unknown) {
    const t = Date.now();
    while (Date.now() - t < ms) {
      /* busy: the process serves no I/O meanwhile */
    }
    return step.call(this);
  };
  return () => {
    engine.step = step;
  };
}

for (const t of transfersUnderTest('nixl')) {
  describe.skipIf(t.skip !== null)(t.label, () => {
    describe('busy producer (side-channel answers slower than the handshake timeout)', () => {
      /** A single instance's outputs of the N prompts, and a P/D pair whose side channels time out after HANDSHAKE_MS. */
      const setUp = async (mode: 'pull' | 'push') => {
        const ref = single('dense-gqa', { numBlocks: 64, maxNumBatchedTokens: 64 });
        const want: number[][] = [];
        for (let i = 0; i < N; i++) want.push((await ref.generate(prompt(i), sampling(i))).tokenIds);
        const extra = { handshake_timeout_ms: HANDSHAKE_MS };
        const pd = await makeNixlPD({
          transfer: t.engine,
          mode,
          model: 'dense-gqa',
          producer: { numBlocks: 64, maxNumBatchedTokens: 64 },
          consumer: { numBlocks: 64, maxNumBatchedTokens: 64 },
          policy: 'recompute',
          producerExtra: extra,
          consumerExtra: extra,
        });
        return { want, pd };
      };
      for (const mode of ['pull', 'push'] as const) {
        it(`${mode}: concurrent loads through the proxy all verify and equal a single instance`, async () => {
          const { want, pd } = await setUp(mode);
          try {
            // Handshake first (its own timeout is the handshake's), then a busy producer.
            expect((await pd.proxy.generate(prompt(0), sampling(0))).tokenIds).toEqual(want[0]);
            const restore = slowSteps(pd.producer, STEP_BLOCK_MS);
            const rs = await Promise.all(Array.from({ length: N }, (_, i) => pd.proxy.generate(prompt(i), sampling(i))));
            restore();
            rs.forEach((r, i) => {
              expect(r.error).toBeUndefined();
              expect(r.tokenIds).toEqual(want[i]);
            });
            expect(await metricValue(pd.consumerMetrics, NIXL_METRIC_NAMES.failedTransfers)).toBe(0);
            expect(await checksumCounter(pd.obs, 'loads', { verdict: 'mismatch' })).toBe(0);
            expect(await checksumCounter(pd.obs, 'loads', { verdict: 'verified' })).toBe(N + 1);
            expect(pd.consumer.stats.loadsUsed).toBe(N + 1);
            expect(pd.consumer.stats.loadsRecomputed).toBe(0);
            await until(() => pd.producer.scheduler.delayedFree.size === 0);
            expect(pd.producer.scheduler.kv.pool.numFree).toBe(64);
          } finally {
            await pd.shutdown();
          }
        });

        it(`${mode}: the first handshake waits the transfer deadline, not the handshake timeout`, async () => {
          const { want, pd } = await setUp(mode);
          try {
            // Busy from the start: the INFO of the first loads is answered only between long steps.
            const restore = slowSteps(pd.producer, STEP_BLOCK_MS);
            const rs = await Promise.all(Array.from({ length: N }, (_, i) => pd.proxy.generate(prompt(i), sampling(i))));
            restore();
            rs.forEach((r, i) => expect(r.tokenIds).toEqual(want[i]));
            expect(await metricValue(pd.consumerMetrics, NIXL_METRIC_NAMES.failedTransfers)).toBe(0);
            expect(pd.consumer.stats.loadsUsed).toBe(N);
            expect(pd.consumer.stats.loadsRecomputed).toBe(0);
          } finally {
            await pd.shutdown();
          }
        });
      }
    });
  });
}
