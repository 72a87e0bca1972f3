/**
 * The engine's connector paths with `InProcessConnector` (test utility): a smoke P/D run, load
 * failures reported as invalid blocks (kv_load_failure_policy), abort during a remote load, and
 * the producer's delayed free (consumer read, or lease expiry).
 */
import { describe, expect, it } from 'vitest';
import { Engine } from '../src/engine.js';
import { IN_PROCESS_CONNECTOR, inProcessRegistry } from '@kvconnect/engine/testing';
import { counter, makePD, single, until } from './utils/pd.js';

const PROMPT = 'Hello P/D world, how are you?';
const S = { maxTokens: 5, ignoreEos: true };

describe('P/D through the engine', () => {
  it('1x1 -> 1x1 verifies and equals a single instance; params carry kv_checksums', async () => {
    const pd = makePD({ model: 'dense-gqa' });
    const ref = await single('dense-gqa').generate(PROMPT, S);
    const r = await pd.proxy.generate(PROMPT, S);
    expect(r.prefill.kvTransferParams).toMatchObject({ remote_engine_id: pd.producer.engineId, remote_tp_size: 1 });
    expect(typeof r.prefill.kvTransferParams?.kv_checksums).toBe('string');
    expect(r.tokenIds).toEqual(ref.tokenIds);
    expect(await counter(pd.obs, 'loads', { verdict: 'verified' })).toBe(1);
    expect(await pd.consumer.metricsText()).toContain('kvconnect_kv_checksum_loads_total{verdict="verified"} 1');
    await until(() => pd.producer.scheduler.delayedFree.size === 0);
  });

  for (const policy of ['recompute', 'fail'] as const) {
    it(`a failed load (invalid blocks) -> policy ${policy}`, async () => {
      const ref = await single('dense-gqa').generate(PROMPT, S);
      const pd = makePD({ model: 'dense-gqa', checksums: false, policy });
      pd.bus.failLoads = true;
      const r = await pd.proxy.generate(PROMPT, S);
      if (policy === 'recompute') {
        expect(r.tokenIds).toEqual(ref.tokenIds);
        expect(pd.consumer.stats.loadsRecomputed).toBe(1);
      } else {
        expect(r.finishReason).toBe('error');
        expect(r.error).toMatch(/failed in transit \(transfer-error: load failed \(failLoads\)\)/);
      }
      expect(pd.consumer.scheduler.kv.pool.numFree).toBe(pd.consumer.scheduler.kv.pool.numBlocks);
    });
  }

  it('with checksums on, a failed load is transfer-failed with its cause (fail-open: still the policy), never a mismatch', async () => {
    const ref = await single('dense-gqa').generate(PROMPT, S);
    const pd = makePD({ model: 'dense-gqa', policy: 'recompute' });
    pd.bus.failLoads = true;
    const r = await pd.proxy.generate(PROMPT, S);
    expect(r.tokenIds).toEqual(ref.tokenIds);
    expect(pd.consumer.stats.loadsRecomputed).toBe(1);
    expect(await counter(pd.obs, 'loads', { verdict: 'transfer-failed' })).toBe(1);
    expect(await counter(pd.obs, 'loads', { verdict: 'mismatch' })).toBe(0);
    expect(await counter(pd.obs, 'transferFailed', { reason: 'transfer-error' })).toBe(1);
  });

  for (const corrupt of [true, false]) {
    it(corrupt ? 'fail-open mismatch: the loaded blocks never enter the prefix cache (an innocent request gets no hit)' : 'control: a verified load is cached, the same prompt hits', async () => {
      const prompt = 'The quick brown fox jumps over the lazy dog, again and again, and then once more.';
      const ref = await single('dense-gqa').generate(prompt, S);
      const pd = makePD({ model: 'dense-gqa' }); // fail-open
      if (corrupt) {
        pd.bus.faultHook = (ctx, bytes) => {
          if (ctx.groupId === 0 && ctx.token === 3 && ctx.head === 0 && ctx.part === 0) bytes[0] ^= 1;
        };
      }
      await pd.proxy.generate(prompt, S);
      expect(await counter(pd.obs, 'loads', { verdict: corrupt ? 'mismatch' : 'verified' })).toBe(1);
      pd.bus.faultHook = null;
      const kv = pd.consumer.scheduler.kv;
      const before = kv.stats.hitTokens;
      const innocent = await pd.consumer.generate(prompt, S); // same prompt, no remote load
      const hit = kv.stats.hitTokens - before;
      if (corrupt) {
        expect(hit).toBe(0);
        expect(innocent.tokenIds).toEqual(ref.tokenIds);
      } else {
        expect(hit).toBeGreaterThanOrEqual(64);
      }
    });
  }

  it('abort while waiting for remote KV frees the blocks after the load', async () => {
    const pd = makePD({ model: 'dense-gqa' });
    const p = await pd.producer.generate(PROMPT, { maxTokens: 1 }, { do_remote_decode: true });
    pd.bus.pause();
    const pending = pd.consumer.generate(PROMPT, S, { ...p.kvTransferParams, do_remote_prefill: true }, 'd1');
    await until(() => pd.consumer.scheduler.requests.get('d1')?.status === 'WAITING_FOR_REMOTE_KVS');
    expect(pd.consumer.abort('d1')).toBe(true);
    // The blocks stay allocated while the load is in flight.
    expect(pd.consumer.scheduler.kv.pool.numFree).toBeLessThan(pd.consumer.scheduler.kv.pool.numBlocks);
    pd.bus.resume();
    const r = await pending;
    expect(r.finishReason).toBe('abort');
    expect(pd.consumer.scheduler.kv.pool.numFree).toBe(pd.consumer.scheduler.kv.pool.numBlocks);
  });

  it('the producer keeps blocks until the lease expires when nobody reads them', async () => {
    const { registry } = inProcessRegistry();
    const producer = new Engine({
      model: 'dense-gqa',
      registry,
      engineId: 'lonely-producer',
      kvTransferConfig: { kv_connector: IN_PROCESS_CONNECTOR, kv_role: 'kv_producer', kv_connector_extra_config: { lease_ms: 30 } },
    });
    const r = await producer.generate(PROMPT, { maxTokens: 1 }, { do_remote_decode: true });
    expect(r.kvTransferParams?.remote_block_ids).toBeDefined();
    expect(producer.scheduler.delayedFree.size).toBe(1);
    expect(producer.scheduler.kv.pool.numFree).toBeLessThan(producer.scheduler.kv.pool.numBlocks);
    await until(() => producer.scheduler.delayedFree.size === 0);
    expect(producer.scheduler.kv.pool.numFree).toBe(producer.scheduler.kv.pool.numBlocks);
  });

  it('engines on different buses do not see each other: the load fails and goes to the failure policy', async () => {
    const pd = makePD({ model: 'dense-gqa', checksums: false, policy: 'recompute' });
    const other = makePD({ model: 'dense-gqa', checksums: false, policy: 'fail' });
    // The producer of one pair, the consumer of the other: the consumer's bus has no such producer.
    const p = await pd.producer.generate(PROMPT, { maxTokens: 1 }, { do_remote_decode: true });
    const r = await other.consumer.generate(PROMPT, S, { ...p.kvTransferParams, do_remote_prefill: true });
    expect(r.finishReason).toBe('error');
    expect(r.error).toMatch(/failed in transit \(transfer-error: producer producer-\d+ not on the bus\)/);
    expect(pd.bus.copies).toBe(0);
    expect(other.bus.copies).toBe(0);
    // Nobody read the producer request: it keeps its blocks until its lease expires.
    expect(pd.producer.scheduler.delayedFree.size).toBe(1);
    await Promise.all([pd.shutdown(), other.shutdown()]);
  });
});
