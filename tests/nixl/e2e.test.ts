/**
 * NIXL pull and push end to end: two engines in one process with real EmbeddedAgents over
 * 127.0.0.1 TCP, and with real NIXL agents where NIXL_PREFIX names an install (`transfersUnderTest`).
 * Outputs equal a single instance token for token and the checksums verify, for
 * TP 1->1, 2->1, 1->2, block sizes 16->32 and 32->16, dense ('dense-gqa') and 'hybrid-mamba2'.
 */
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import type { PresetName } from '@kvconnect/engine';
import { NIXL_METRIC_NAMES } from '@kvconnect/nixl-common';
import { PROMTOOL, promtoolCheck, sampleValue } from '../../packages/engine/test/utils/prom.js';
import { checksumCounter, makeNixlPD, metricValue, single, until, type SideOptions } from './utils.js';
import { transfersUnderTest, type TransferUnderTest } from '../transfer-engines.js';

const PROMPT = 'Disaggregated serving moves the KV cache from prefill to decode over NIXL.';
const S = { maxTokens: 5, ignoreEos: true };

async function expectEqual(t: TransferUnderTest, mode: 'pull' | 'push', model: PresetName, producer: SideOptions, consumer: SideOptions): Promise<void> {
  const ref = await single(model).generate(PROMPT, S);
  const pd = await makeNixlPD({ transfer: t.engine, mode, model, producer, consumer, policy: 'fail' });
  try {
    expect(pd.producer.workers[0][0].connector).toMatchObject({ agent: { backend: t.engine } });
    const r = await pd.proxy.generate(PROMPT, S);
    expect(r.error).toBeUndefined();
    expect(r.tokenIds).toEqual(ref.tokenIds);
    expect(await checksumCounter(pd.obs, 'loads', { verdict: 'verified' })).toBe(1);
    expect(pd.consumer.stats.loadsUsed).toBe(1);
    expect(pd.consumer.stats.scheduledTokens).toBe(S.maxTokens);
    const initiator = mode === 'pull' ? pd.consumerMetrics : pd.producerMetrics;
    expect(await metricValue(initiator, NIXL_METRIC_NAMES.bytes)).toBeGreaterThan(0);
    await until(() => pd.producer.scheduler.delayedFree.size === 0);
    expect(pd.producer.scheduler.kv.pool.numFree).toBe(pd.producer.scheduler.kv.pool.numBlocks);
  } finally {
    await pd.shutdown();
  }
}

for (const t of transfersUnderTest('nixl')) {
  describe.skipIf(t.skip !== null)(t.label, () => {
    for (const mode of ['pull', 'push'] as const) {
      describe(`NIXL ${mode}`, () => {
        const cases: Array<[string, SideOptions, SideOptions]> = [
          ['TP1 -> TP1', {}, {}],
          ['TP2 -> TP1', { tpSize: 2 }, {}],
          ['TP1 -> TP2', {}, { tpSize: 2 }],
          ['block 16 -> 32', { blockSize: 16 }, { blockSize: 32 }],
          ['block 32 -> 16', { blockSize: 32 }, { blockSize: 16 }],
        ];
        for (const model of ['dense-gqa', 'hybrid-mamba2'] as const) {
          for (const [name, p, d] of cases) it(`${model} ${name}`, () => expectEqual(t, mode, model, p, d));
        }
      });
    }
  });
}

describe("NIXL metrics as vLLM's NixlConnector", () => {
  it('one histogram sample per transfer for time, bytes and descriptors; promtool-clean', async () => {
    const pd = await makeNixlPD({ mode: 'pull', model: 'dense-gqa', producer: { tpSize: 2 }, policy: 'fail' });
    try {
      await pd.proxy.generate(PROMPT, S);
      const text = await pd.consumerMetrics.metrics();
      const L = { mode: 'pull', op: 'READ' };
      // TP2 -> TP1: the consumer's one worker reads from both producer ranks, one transfer each
      expect(sampleValue(text, `${NIXL_METRIC_NAMES.xferSeconds}_count`, L)).toBe(2);
      expect(sampleValue(text, `${NIXL_METRIC_NAMES.bytes}_count`, L)).toBe(2);
      expect(sampleValue(text, `${NIXL_METRIC_NAMES.descriptors}_count`, L)).toBe(2);
      expect(sampleValue(text, `${NIXL_METRIC_NAMES.bytes}_sum`, L)).toBe(await metricValue(pd.consumerMetrics, NIXL_METRIC_NAMES.bytes, L));
      expect(sampleValue(text, `${NIXL_METRIC_NAMES.bytes}_sum`, L)).toBeGreaterThan(0);
      if (PROMTOOL) expect(promtoolCheck(text)).toEqual({ code: 0, output: '' });
    } finally {
      await pd.shutdown();
    }
  });
});

// Real NIXL when NIXL_PREFIX names an install (then the agent searches it), else the fake library.
const REAL_NIXL = process.env.NIXL_PREFIX !== undefined && process.env.NIXL_PREFIX !== '';

describe(`backend nixl (through the addon, over ${REAL_NIXL ? `real NIXL at ${process.env.NIXL_PREFIX}` : 'the fake libnixl_capi'})`, () => {
  const FAKE = fileURLToPath(new URL('../../native/build/test/libfake_nixl_capi.so', import.meta.url));
  const native = createRequire(import.meta.url)('@kvconnect/native') as { addon: { transfer?: unknown } | null };
  const missing = !native.addon?.transfer || (!REAL_NIXL && !existsSync(FAKE));
  const skipNote = !missing ? '' : !native.addon?.transfer ? ' (skipped: the native addon has no transfer bindings)' : ` (skipped: ${FAKE} is not built)`;
  for (const mode of ['pull', 'push'] as const) {
    it.skipIf(missing)(`${mode} dense-gqa TP2 -> TP1 verifies and equals a single instance${skipNote}`, async () => {
      const ref = await single('dense-gqa').generate(PROMPT, S);
      const extra = REAL_NIXL ? { backend: 'nixl' } : { backend: 'nixl', nixl_library: FAKE };
      const pd = await makeNixlPD({ mode, model: 'dense-gqa', producer: { tpSize: 2 }, policy: 'fail', producerExtra: extra, consumerExtra: extra });
      try {
        expect(pd.producer.workers[0][0].connector).toMatchObject({ agent: { backend: 'nixl' } });
        const r = await pd.proxy.generate(PROMPT, S);
        expect(r.tokenIds).toEqual(ref.tokenIds);
        expect(await checksumCounter(pd.obs, 'loads', { verdict: 'verified' })).toBe(1);
        await until(() => pd.producer.scheduler.delayedFree.size === 0);
      } finally {
        await pd.shutdown();
      }
    });
  }
  it('an unknown backend is a config error', async () => {
    await expect(makeNixlPD({ mode: 'pull', model: 'dense-gqa', producerExtra: { backend: 'ucx' } })).rejects.toThrow(/backend/);
  });
});
