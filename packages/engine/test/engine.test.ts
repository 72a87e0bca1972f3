import { describe, expect, it } from 'vitest';
import { Engine } from '../src/engine.js';
import { PRESETS } from '../src/model/config.js';

const S = { maxTokens: 6, ignoreEos: true };

describe('Engine', () => {
  it('generates text from text, and from token ids', async () => {
    const e = new Engine({ model: 'dense-gqa' });
    const a = await e.generate('Hello engine', S);
    expect(a.tokenIds).toHaveLength(6);
    expect(a.finishReason).toBe('length');
    expect(typeof a.text).toBe('string');
    const b = await new Engine({ preset: 'dense-gqa', tpSize: 2 }).generate(e.tokenizer.encode('Hello engine'), S);
    expect(b.tokenIds).toEqual(a.tokenIds);
    expect(e.checksumMetrics).toBeNull();
  });

  it('prefix caching, chunked prefill and preemption do not change outputs', async () => {
    const prompts = ['Shared prefix for every prompt here: one', 'Shared prefix for every prompt here: two', 'Shared prefix for every prompt here: three', 'Something else'];
    const base = new Engine({ model: 'dense-gqa', enablePrefixCaching: false });
    const ref = await Promise.all(prompts.map((p) => base.generate(p, { ...S, maxTokens: 10 })));
    const cached = new Engine({ model: 'dense-gqa', blockSize: 8 });
    await cached.generate(prompts[0], S);
    const got = await Promise.all(prompts.map((p) => cached.generate(p, { ...S, maxTokens: 10 })));
    expect(got.map((r) => r.tokenIds)).toEqual(ref.map((r) => r.tokenIds));
    expect(cached.stats.prefixCache.hitTokens).toBeGreaterThan(0);
    // Few blocks and a small budget: chunked prefill and preemptions.
    const tight = new Engine({ model: 'dense-gqa', blockSize: 4, numBlocks: 24, maxNumBatchedTokens: 16 });
    const t = await Promise.all(prompts.map((p) => tight.generate(p, { ...S, maxTokens: 10 })));
    expect(t.map((r) => r.tokenIds)).toEqual(ref.map((r) => r.tokenIds));
    expect(tight.stats.preemptions).toBeGreaterThan(0);
  });

  it('long prefill threshold (default a quarter of the budget) chunks a long prompt beside short ones, outputs unchanged', async () => {
    const long = 'A long prompt that would take the whole step budget of the engine without the threshold.';
    const shorts = ['short one', 'short two'];
    const base = new Engine({ model: 'dense-gqa', maxNumBatchedTokens: 512, longPrefillTokenThreshold: 0 });
    const ref = await Promise.all([long, ...shorts].map((p) => base.generate(p, S)));
    for (const model of ['dense-gqa', 'hybrid-mamba2'] as const) {
      const refM = model === 'dense-gqa' ? ref : await Promise.all([long, ...shorts].map((p) => new Engine({ model, longPrefillTokenThreshold: 0 }).generate(p, S)));
      const e = new Engine({ model, maxNumBatchedTokens: 32 });
      const ids = await Promise.all([long, ...shorts].map((p, i) => e.addRequest(p, S, undefined, `q${i}`)));
      const first = await e.step();
      expect(Object.fromEntries(first.numScheduledTokens)).toEqual({ q0: 8, q1: 8, q2: 8 });
      while (e.scheduler.numUnfinished > 0) await e.step();
      const got = await Promise.all([long, ...shorts].map((p) => e.generate(p, S)));
      expect(ids).toHaveLength(3);
      expect(got.map((r) => r.tokenIds)).toEqual(refM.map((r) => r.tokenIds));
    }
  });

  it('hybrid Mamba2: preemption recomputes the state from scratch', async () => {
    const prompts = ['Mamba state one, a longer prompt', 'Mamba state two', 'Three'];
    const base = new Engine({ model: 'hybrid-mamba2' });
    const ref = await Promise.all(prompts.map((p) => base.generate(p, { ...S, maxTokens: 10 })));
    // Threshold off: this schedule is the one that runs out of blocks.
    const tight = new Engine({ model: 'hybrid-mamba2', blockSize: 4, numBlocks: 20, maxNumBatchedTokens: 8, longPrefillTokenThreshold: 0, tpSize: 2 });
    const t = await Promise.all(prompts.map((p) => tight.generate(p, { ...S, maxTokens: 10 })));
    expect(t.map((r) => r.tokenIds)).toEqual(ref.map((r) => r.tokenIds));
    expect(tight.stats.preemptions).toBeGreaterThan(0);
  });

  it('seeded temperature sampling is reproducible per request', async () => {
    const e = new Engine({ model: 'sliding-window' });
    const p = 'Sampling with a seed';
    const [a, b, c] = await Promise.all([e.generate(p, { ...S, temperature: 1, seed: 5 }), e.generate(p, { ...S, temperature: 1, seed: 5 }), e.generate(p, { ...S, temperature: 1, seed: 6 })]);
    expect(b.tokenIds).toEqual(a.tokenIds);
    expect(c.tokenIds).not.toEqual(a.tokenIds);
  });

  it('abort resolves the request with finishReason abort', async () => {
    const e = new Engine({ model: 'dense-gqa', maxNumBatchedTokens: 4 });
    const id = await e.addRequest('a prompt that needs several chunks', S);
    await e.step();
    expect(e.abort(id)).toBe(true);
    const r = await e.generate('next', { maxTokens: 1 });
    expect(r.finishReason).toBe('length');
    expect(e.scheduler.kv.pool.numFree).toBe(e.scheduler.kv.pool.numBlocks);
  });

  it('step() by hand reports scheduled tokens and finished requests', async () => {
    const e = new Engine({ model: 'mla', maxNumBatchedTokens: 8 });
    await e.addRequest([256, 1, 2, 3, 4, 5, 6, 7, 8, 9], { maxTokens: 2, ignoreEos: true }, undefined, 'x');
    const s1 = await e.step();
    expect(s1.numScheduledTokens.get('x')).toBe(8);
    await e.step();
    const s3 = await e.step();
    expect(s3.finished.map((f) => f.requestId)).toEqual(['x']);
    expect(s3.finished[0].tokenIds).toHaveLength(2);
  });

  it('rejects configs that do not shard, and unknown connectors', async () => {
    expect(() => new Engine({ model: 'dense-gqa', tpSize: 3 })).toThrow(RangeError);
    expect(() => new Engine({ model: { ...PRESETS['hybrid-mamba2'], mamba: { ...PRESETS['hybrid-mamba2'].mamba!, nGroups: 3 } }, tpSize: 2 })).toThrow(RangeError);
    const e = new Engine({ model: 'dense-gqa', kvTransferConfig: { kv_connector: 'NoSuchConnector', kv_role: 'kv_both' } });
    await expect(e.ready).rejects.toThrow(/NoSuchConnector/);
  });
});
