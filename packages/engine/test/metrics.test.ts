/**
 * The engine's own metrics under vLLM's names (src/metrics.ts): values after known requests, the
 * `model_name` and `engine` labels, and a text exposition promtool accepts.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { Engine } from '../src/engine.js';
import { ENGINE_METRIC_NAMES } from '../src/metrics.js';
import { makePD } from './utils/pd.js';
import { PROMTOOL, promtoolCheck, readExposition, sampleValue } from './utils/prom.js';

const PROMPT = 'The quick brown fox jumps over the lazy dog, again and again.';
const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0)) await c();
});

describe('engine metrics (vLLM names, kvconnect_ prefix)', () => {
  it('count requests, tokens, latencies and prefix cache tokens with model_name and engine labels', async () => {
    const e = new Engine({ preset: 'dense-gqa', engineId: 'metrics-e0', servedModelName: 'my-model' });
    cleanups.push(() => e.shutdown());
    const promptLen = e.tokenizer.encode(PROMPT).length;
    await e.generate(PROMPT, { maxTokens: 4, ignoreEos: true });
    await e.generate(PROMPT, { maxTokens: 4, ignoreEos: true });
    const text = await e.metricsText();
    const L = { model_name: 'my-model', engine: 'metrics-e0' };
    const N = ENGINE_METRIC_NAMES;
    expect(sampleValue(text, N.promptTokens, L)).toBe(2 * promptLen);
    expect(sampleValue(text, N.generationTokens, L)).toBe(8);
    expect(sampleValue(text, N.requestSuccess, { ...L, finished_reason: 'length' })).toBe(2);
    expect(sampleValue(text, `${N.timeToFirstToken}_count`, L)).toBe(2);
    expect(sampleValue(text, `${N.e2eRequestLatency}_count`, L)).toBe(2);
    expect(sampleValue(text, `${N.e2eRequestLatency}_sum`, L)).toBeGreaterThanOrEqual(sampleValue(text, `${N.timeToFirstToken}_sum`, L));
    expect(sampleValue(text, N.numRequestsRunning, L)).toBe(0);
    expect(sampleValue(text, N.numRequestsWaiting, L)).toBe(0);
    // block size 16: the second request finds the first one's full blocks
    expect(sampleValue(text, N.prefixCacheQueries, L)).toBe(2 * promptLen);
    expect(sampleValue(text, N.prefixCacheHits, L)).toBe(Math.floor((promptLen - 1) / 16) * 16);
    const usage = sampleValue(text, N.kvCacheUsagePerc, L);
    expect(usage).toBeGreaterThanOrEqual(0);
    expect(usage).toBeLessThanOrEqual(1);
    // a second scrape does not count the cache again
    expect(sampleValue(await e.metricsText(), N.prefixCacheQueries, L)).toBe(2 * promptLen);
    for (const name of Object.values(N)) expect(readExposition(text).types.has(name.replace(/_total$/, '')) || readExposition(text).types.has(name), name).toBe(true);
  });

  it.skipIf(!PROMTOOL)('promtool check metrics accepts a P/D consumer engine (engine, checksum and connector metrics)', async () => {
    const pd = makePD({ model: 'dense-gqa' });
    cleanups.push(() => pd.shutdown());
    const r = await pd.producer.generate(PROMPT, { maxTokens: 1 }, { do_remote_decode: true });
    await pd.consumer.generate(PROMPT, { maxTokens: 3 }, r.kvTransferParams);
    const text = await pd.consumer.metricsText();
    expect(text).toContain('kvconnect_num_requests_running{');
    expect(readExposition(text).samples.length).toBeGreaterThan(0);
    expect(promtoolCheck(text)).toEqual({ code: 0, output: '' });
  });
});
