/**
 * End to end through real schedulers and workers with the in-process connector: a correct load
 * verifies for every producer (TP x PP) -> consumer (TP x PP) topology, block size pair, layout
 * and model preset, and the consumer's output equals a single instance token for token.
 */
import { describe, expect, it } from 'vitest';
import { PRESETS, type ModelConfig, type PresetName } from '@kvconnect/engine';
import { counter, makePD, single, type SideOptions } from '../../packages/engine/test/utils/pd.js';


const PROMPT = 'Disaggregated serving moves the KV cache from prefill to decode.';
const SAMPLING = { maxTokens: 6, ignoreEos: true };

async function expectVerifiedAndEqual(model: PresetName | ModelConfig, producer: SideOptions, consumer: SideOptions, prompt = PROMPT): Promise<void> {
  // The reference runs with the same KV dtype (numerics depend on it through rounding).
  const ref = await single(model, { kvDtype: consumer.kvDtype }).generate(prompt, SAMPLING);
  const pd = makePD({ model, producer, consumer, failClosed: true, policy: 'fail' });
  try {
    const r = await pd.proxy.generate(prompt, SAMPLING);
    expect(r.error).toBeUndefined();
    expect(r.finishReason).toBe('length');
    expect(r.tokenIds).toEqual(ref.tokenIds);
    expect(await counter(pd.obs, 'loads', { verdict: 'verified' })).toBe(1);
    expect(await counter(pd.obs, 'loads')).toBe(1);
    expect(pd.consumer.stats.loadsUsed).toBe(1);
    // The consumer computed only the recomputed last prompt token and the decodes.
    expect(pd.consumer.stats.scheduledTokens).toBe(SAMPLING.maxTokens);
    // The producer frees the request's blocks once the consumer read them.
    const t0 = Date.now();
    while (pd.producer.scheduler.delayedFree.size > 0 && Date.now() - t0 < 10_000) await new Promise((res) => setTimeout(res, 2));
    expect(pd.producer.scheduler.delayedFree.size).toBe(0);
    expect(pd.producer.scheduler.kv.pool.numFree).toBe(pd.producer.scheduler.kv.pool.numBlocks);
  } finally {
    await pd.shutdown();
  }
}

describe('P/D topologies (dense-gqa, 4 query / 2 KV heads)', () => {
  const cases: Array<[string, SideOptions, SideOptions]> = [
    ['1x1 -> 1x1', {}, {}],
    ['2x1 -> 1x1', { tpSize: 2 }, {}],
    ['1x1 -> 2x1', {}, { tpSize: 2 }],
    ['1x1 -> 4x1 (KV heads replicated)', {}, { tpSize: 4 }],
    ['4x1 -> 2x1', { tpSize: 4 }, { tpSize: 2 }],
    ['1x2 -> 1x1', { ppSize: 2 }, {}],
    ['1x1 -> 2x2', {}, { tpSize: 2, ppSize: 2 }],
    ['2x2 -> 1x4', { tpSize: 2, ppSize: 2 }, { ppSize: 4 }],
  ];
  for (const [name, p, d] of cases) it(name, () => expectVerifiedAndEqual('dense-gqa', p, d));
});

describe('P/D block sizes and layouts', () => {
  it('block size 16 -> 32', () => expectVerifiedAndEqual('dense-gqa', { blockSize: 16 }, { blockSize: 32 }));
  it('block size 32 -> 16', () => expectVerifiedAndEqual('dense-gqa', { blockSize: 32 }, { blockSize: 16 }));
  it('NHD kv-first -> HND separate, TP 2 -> 1', () =>
    expectVerifiedAndEqual('dense-gqa', { tpSize: 2, cacheLayout: { layout: 'NHD', kvLayout: 'kv-first' } }, { cacheLayout: { layout: 'HND', kvLayout: 'separate' } }));
  it('HND block-kv -> NHD block-kv, fp16', () =>
    expectVerifiedAndEqual('dense-gqa', { kvDtype: 'float16', cacheLayout: { layout: 'HND', kvLayout: 'block-kv' } }, { kvDtype: 'float16', tpSize: 2, cacheLayout: { layout: 'NHD', kvLayout: 'block-kv' } }));
  it('fp32 KV, 16 -> 32, TP 1 -> 2', () => expectVerifiedAndEqual('dense-gqa', { kvDtype: 'float32' }, { kvDtype: 'float32', blockSize: 32, tpSize: 2 }));
});

describe('P/D model presets', () => {
  const topo: Array<[string, SideOptions, SideOptions]> = [
    ['1x1 -> 1x1', {}, {}],
    ['2x1 -> 1x1', { tpSize: 2 }, {}],
    ['1x1 -> 2x2', {}, { tpSize: 2, ppSize: 2 }],
    ['1x2 -> 4x1, 32 -> 16', { ppSize: 2, blockSize: 32 }, { tpSize: 4, blockSize: 16 }],
  ];
  for (const model of ['mla', 'hybrid-mamba2', 'sliding-window'] as const) {
    for (const [name, p, d] of topo) it(`${model} ${name}`, () => expectVerifiedAndEqual(model, p, d));
  }
});

describe('P/D Mamba2 n_groups', () => {
  const g2: ModelConfig = { ...PRESETS['hybrid-mamba2'], name: 'mamba-g2', mamba: { ...PRESETS['hybrid-mamba2'].mamba!, nGroups: 2 } };
  it('n_groups 2: TP 2 (B, C sharded) -> TP 4 (B, C replicated)', () => expectVerifiedAndEqual(g2, { tpSize: 2 }, { tpSize: 4 }));
  it('n_groups 2: TP 4 -> TP 1, fp32 states', () => expectVerifiedAndEqual(g2, { tpSize: 4, kvDtype: 'float32' }, { kvDtype: 'float32' }));
});
