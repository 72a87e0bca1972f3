import { describe, expect, it } from 'vitest';
import type { KVCacheGroupConfig } from '@kvconnect/core';
import { Request } from '../src/request.js';
import { Scheduler, type StepPlan } from '../src/scheduler.js';

const groups: KVCacheGroupConfig[] = [{ groupId: 0, kind: 'full-attention', blockSize: 4, layerNames: ['model.layers.0.self_attn.attn'] }];
const EOS = 257;
const range = (a: number, b: number) => Array.from({ length: b - a }, (_, i) => a + i);

function sched(o: { numBlocks?: number; budget?: number; prefix?: boolean; maxNumSeqs?: number; longPrefill?: number } = {}) {
  return new Scheduler({ groupConfigs: groups, blockSize: 4, numBlocks: o.numBlocks ?? 64, maxNumBatchedTokens: o.budget ?? 32, maxNumSeqs: o.maxNumSeqs, longPrefillTokenThreshold: o.longPrefill, enablePrefixCaching: o.prefix ?? true, worldSize: 1, eosTokenId: EOS });
}

/** Runs a step with a fake model: every sampled token is 7. */
function step(s: Scheduler): StepPlan {
  const plan = s.schedule();
  const sampled = new Map<string, number>();
  for (const seg of plan.segments) if (seg.needLogits) sampled.set(seg.request.requestId, 7);
  s.updateFromOutput(plan, sampled, []);
  return plan;
}

const tokensOf = (p: StepPlan) => Object.fromEntries([...p.numScheduledTokens]);

describe('Scheduler', () => {
  it('chunked prefill under the token budget, then decode', () => {
    const s = sched({ budget: 8 });
    const r = new Request('a', range(0, 20), { maxTokens: 3 }, undefined, 0);
    s.addRequest(r);
    const plans = [step(s), step(s), step(s)];
    expect(plans.map(tokensOf)).toEqual([{ a: 8 }, { a: 8 }, { a: 4 }]);
    expect(plans.map((p) => p.segments[0].start)).toEqual([0, 8, 16]);
    expect(plans.map((p) => p.segments[0].needLogits)).toEqual([false, false, true]);
    expect(r.outputTokenIds).toEqual([7]);
    expect(tokensOf(step(s))).toEqual({ a: 1 });
    step(s);
    expect(r.finishReason).toBe('length');
    expect(r.outputTokenIds).toEqual([7, 7, 7]);
    expect(s.kv.pool.numFree).toBe(64);
  });

  it('continuous batching: decodes first, new prompts fill the rest of the budget', () => {
    const s = sched({ budget: 10 });
    s.addRequest(new Request('a', range(0, 6), { maxTokens: 4 }, undefined, 0));
    expect(tokensOf(step(s))).toEqual({ a: 6 });
    s.addRequest(new Request('b', range(10, 30), { maxTokens: 2 }, undefined, 1));
    expect(tokensOf(step(s))).toEqual({ a: 1, b: 9 });
    expect(tokensOf(step(s))).toEqual({ a: 1, b: 9 });
    expect(tokensOf(step(s))).toEqual({ a: 1, b: 2 });
  });

  it('preempts the latest request when blocks run out, and recomputes it later', () => {
    // 6 blocks of 4 tokens: a and b need 2 blocks each for their prompts, then grow.
    const s = sched({ numBlocks: 6, budget: 64, prefix: false });
    const a = new Request('a', range(0, 8), { maxTokens: 12 }, undefined, 0);
    const b = new Request('b', range(100, 108), { maxTokens: 12 }, undefined, 0);
    s.addRequest(a);
    s.addRequest(b);
    const preempted: string[] = [];
    for (let i = 0; i < 60 && !(a.isFinished && b.isFinished); i++) preempted.push(...step(s).preempted);
    expect(preempted).toContain('b');
    expect(b.numPreemptions).toBeGreaterThan(0);
    expect(a.finishReason).toBe('length');
    expect(b.finishReason).toBe('length');
    expect(b.outputTokenIds).toHaveLength(12);
    expect(s.stats.preemptions).toBeGreaterThan(0);
    expect(s.kv.pool.numFree).toBe(6);
  });

  it('stops at EOS unless ignoreEos, and at stop token ids', () => {
    const s = sched();
    const a = new Request('a', [1, 2, 3], { maxTokens: 5 }, undefined, 0);
    const b = new Request('b', [1, 2, 3], { maxTokens: 3, ignoreEos: true }, undefined, 0);
    const c = new Request('c', [1, 2, 3], { maxTokens: 5, stopTokenIds: [9] }, undefined, 0);
    for (const r of [a, b, c]) s.addRequest(r);
    const plan = s.schedule();
    s.updateFromOutput(plan, new Map([['a', EOS], ['b', EOS], ['c', 9]]), []);
    expect(a.finishReason).toBe('stop');
    expect(b.isFinished).toBe(false);
    expect(c.finishReason).toBe('stop');
    expect(c.outputTokenIds).toEqual([9]);
    expect(s.schedule().finishedRequestIds).toEqual(new Set(['a', 'c']));
  });

  it('a prefix hit skips the cached tokens', () => {
    const s = sched({ budget: 64 });
    s.addRequest(new Request('a', range(0, 13), { maxTokens: 1 }, undefined, 0));
    step(s);
    s.addRequest(new Request('b', [...range(0, 12), 99, 98], { maxTokens: 1 }, undefined, 0));
    const p = step(s);
    expect(p.segments[0].start).toBe(12);
    expect(tokensOf(p)).toEqual({ b: 2 });
  });

  it('long prefill threshold: a long prompt is chunked while a short request arriving later is served every step', () => {
    const s = sched({ numBlocks: 256, budget: 32, longPrefill: 8 });
    const long = new Request('long', range(0, 400), { maxTokens: 1 }, undefined, 0);
    s.addRequest(long);
    // Alone it keeps the whole budget.
    expect(tokensOf(step(s))).toEqual({ long: 32 });
    const short = new Request('short', range(500, 506), { maxTokens: 3 }, undefined, 1);
    s.addRequest(short);
    const plans: StepPlan[] = [];
    while (!short.isFinished && plans.length < 20) plans.push(step(s));
    // Prefill and two decodes: three steps, each with the long prompt at the threshold.
    expect(plans.map(tokensOf)).toEqual([
      { long: 8, short: 6 },
      { long: 8, short: 1 },
      { long: 8, short: 1 },
    ]);
    expect(short.finishReason).toBe('length');
    expect(long.isFinished).toBe(false);
    // Alone again: the whole budget.
    expect(tokensOf(step(s))).toEqual({ long: 32 });
  });

  it('long prefill threshold: off (0) a long prompt takes the whole budget and a later short request waits', () => {
    const s = sched({ numBlocks: 256, budget: 32, longPrefill: 0 });
    s.addRequest(new Request('long', range(0, 400), { maxTokens: 1 }, undefined, 0));
    step(s);
    s.addRequest(new Request('short', range(500, 506), { maxTokens: 3 }, undefined, 1));
    expect(tokensOf(step(s))).toEqual({ long: 32 });
    expect(() => sched({ longPrefill: -1 })).toThrow(RangeError);
  });

  it('abort frees the blocks and reports the id next step', () => {
    const s = sched();
    s.addRequest(new Request('a', range(0, 9), { maxTokens: 5 }, undefined, 0));
    step(s);
    expect(s.abort('a')).toBe(true);
    expect(s.abort('a')).toBe(false);
    expect(s.kv.pool.numFree).toBe(64);
    expect([...s.schedule().finishedRequestIds]).toEqual(['a']);
  });
});
