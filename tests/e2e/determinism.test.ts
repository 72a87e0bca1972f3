/**
 * Determinism: greedy outputs of 50 prompts, submitted together (continuous batching, chunked
 * prefill), are identical token for token for a single instance, P/D with checksums off, and P/D
 * with checksums on (TP 2 producer, TP 1 consumer with another block size and layout).
 */
import { describe, expect, it } from 'vitest';
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
});
