/**
 * KV checksums end to end: corrupted bytes in transit are mismatches (fail-open uses them and the
 * output changes; fail-closed fails or recomputes), missing or malformed payloads are unverified,
 * a consumer prefix hit verifies only the loaded blocks, and the Mooncake-style concurrent mode
 * carries the payload through the connector.
 */
import { describe, expect, it } from 'vitest';
import { KVChecksumObservability, type LoadEvent } from '@kvconnect/core';
import type { AttentionCacheView } from '@kvconnect/checksum';
import { partAddress } from '@kvconnect/engine';
import type { CopyContext, InProcessBus } from '../../packages/engine/test/utils/in-process-connector.js';
import { counter, makePD, single } from '../../packages/engine/test/utils/pd.js';


const PROMPT = 'The quick brown fox jumps over the lazy dog, twice.';
const SAMPLING = { maxTokens: 8, ignoreEos: true };

/** Flips bit 6 of byte 1 (bf16: an exponent bit) of the first piece matching `match`. */
function flipOnce(bus: InProcessBus, match: (c: CopyContext) => boolean): { hits: number } {
  const state = { hits: 0 };
  bus.faultHook = (c, bytes) => {
    if (state.hits === 0 && match(c)) {
      bytes[1] ^= 0x40;
      state.hits++;
    }
  };
  return state;
}

const kOfToken = (tok: number, layer = 1) => (c: CopyContext) => c.token === tok && c.part === 0 && c.head === 0 && c.name === `model.layers.${layer}.self_attn.attn`;

describe('corrupted KV in transit', () => {
  it('fail-open: mismatch is logged, the KV is used, and decoding changes', async () => {
    const ref = await single('dense-gqa').generate(PROMPT, SAMPLING);
    const lines: string[] = [];
    const obs = new KVChecksumObservability({ level: 'warn', destination: { write: (l: string) => void lines.push(l) } });
    const pd = makePD({ model: 'dense-gqa', failClosed: false, consumerObservability: obs });
    const events: LoadEvent[] = [];
    obs.events.on('load-mismatch', (e) => events.push(e));
    const f = flipOnce(pd.bus, kOfToken(5));
    const r = await pd.proxy.generate(PROMPT, SAMPLING);
    expect(f.hits).toBe(1);
    expect(r.finishReason).toBe('length');
    expect(r.error).toBeUndefined();
    expect(events).toHaveLength(1);
    expect(events[0].action).toBe('use');
    expect(events[0].verdict.mismatches).toEqual([{ groupId: 0, positions: [0] }]);
    expect(await counter(obs, 'loads', { verdict: 'mismatch' })).toBe(1);
    expect(lines.some((l) => l.includes('KV checksum mismatch'))).toBe(true);
    // Decoding depends on the loaded KV: the corrupted cell changes the tokens.
    expect(r.tokenIds).not.toEqual(ref.tokenIds);
    await pd.shutdown();
  });

  it('fail-closed + fail: the request ends with an error', async () => {
    const pd = makePD({ model: 'dense-gqa', failClosed: true, policy: 'fail', consumer: { blockSize: 8 } });
    flipOnce(pd.bus, kOfToken(20, 3));
    const r = await pd.proxy.generate(PROMPT, SAMPLING);
    expect(r.finishReason).toBe('error');
    expect(r.error).toMatch(/mismatch/);
    expect(r.tokenIds).toEqual([]);
    expect(await counter(pd.obs, 'failed')).toBe(1);
    // The consumer freed the request's blocks.
    expect(pd.consumer.scheduler.kv.pool.numFree).toBe(pd.consumer.scheduler.kv.pool.numBlocks);
    await pd.shutdown();
  });

  it('fail-closed + recompute: completes with output identical to a single instance', async () => {
    const ref = await single('dense-gqa').generate(PROMPT, SAMPLING);
    const pd = makePD({ model: 'dense-gqa', failClosed: true, policy: 'recompute', producer: { tpSize: 2 } });
    flipOnce(pd.bus, kOfToken(33, 2));
    const r = await pd.proxy.generate(PROMPT, SAMPLING);
    expect(r.finishReason).toBe('length');
    expect(r.tokenIds).toEqual(ref.tokenIds);
    expect(await counter(pd.obs, 'recomputed')).toBe(1);
    expect(await counter(pd.obs, 'loads', { verdict: 'mismatch' })).toBe(1);
    expect(pd.consumer.stats.loadsRecomputed).toBe(1);
    await pd.shutdown();
  });

  for (const model of ['hybrid-mamba2', 'mla', 'sliding-window'] as const) {
    it(`${model}: a flipped bit is a mismatch; recompute matches the single instance`, async () => {
      const ref = await single(model).generate(PROMPT, SAMPLING);
      const pd = makePD({ model, failClosed: true, policy: 'recompute', producer: { tpSize: 2 } });
      const events: LoadEvent[] = [];
      pd.obs.events.on('load-mismatch', (e) => events.push(e));
      // Mamba: a state row; MLA: the latent; sliding: a sliding-window layer's K.
      const match =
        model === 'hybrid-mamba2' ? (c: CopyContext) => c.state === 1 && c.row === 3 : model === 'mla' ? (c: CopyContext) => c.token === 7 && c.name === 'model.layers.2.self_attn.attn' : kOfToken(9, 1);
      pd.bus.faultHook = (() => {
        let done = false;
        return (c: CopyContext, b: Uint8Array) => {
          if (!done && match(c)) {
            b[b.length - 1] ^= 0x40;
            done = true;
          }
        };
      })();
      const r = await pd.proxy.generate(PROMPT, SAMPLING);
      expect(events).toHaveLength(1);
      const expectGroup = model === 'hybrid-mamba2' ? 1 : model === 'sliding-window' ? 1 : 0;
      expect(events[0].verdict.mismatches.map((m) => m.groupId)).toEqual([expectGroup]);
      expect(r.tokenIds).toEqual(ref.tokenIds);
      await pd.shutdown();
    });
  }
});

describe('unverified loads', () => {
  it('no checksums sent -> unverified (no-payload); fail-open uses the KV', async () => {
    const ref = await single('dense-gqa').generate(PROMPT, SAMPLING);
    const pd = makePD({ model: 'dense-gqa', producerChecksums: false });
    const r = await pd.proxy.generate(PROMPT, SAMPLING);
    expect(r.prefill.kvTransferParams?.kv_checksums).toBeUndefined();
    expect(r.tokenIds).toEqual(ref.tokenIds);
    expect(await counter(pd.obs, 'loads', { verdict: 'unverified' })).toBe(1);
    expect(await counter(pd.obs, 'unverified', { reason: 'no-payload' })).toBe(1);
    await pd.shutdown();
  });

  it('a malformed payload -> unverified (malformed-payload), no exception', async () => {
    const ref = await single('dense-gqa').generate(PROMPT, SAMPLING);
    const pd = makePD({ model: 'dense-gqa' });
    const p = await pd.producer.generate(PROMPT, { maxTokens: 1 }, { do_remote_decode: true });
    for (const bad of ['!!not base64!!', 'kgGTHgGRlQDPP3WmL/rGYDYQAMQQ', 42]) {
      const d = await pd.consumer.generate(PROMPT, SAMPLING, { ...p.kvTransferParams, kv_checksums: bad, do_remote_prefill: true });
      expect(d.tokenIds).toEqual(ref.tokenIds);
    }
    expect(await counter(pd.obs, 'unverified', { reason: 'malformed-payload' })).toBe(3);
    await pd.shutdown();
  });
});

describe('prefix hits and carriers', () => {
  it('a consumer prefix hit verifies only the loaded blocks', async () => {
    const shared = 'A shared system prompt of exactly enough bytes!'; // 47 bytes + BOS = 48 = 3 blocks of 16
    const prompt = `${shared} Then the question differs here.`;
    const ref = await single('dense-gqa').generate(prompt, SAMPLING);
    const pd = makePD({ model: 'dense-gqa' });
    await pd.consumer.generate(`${shared} Something else entirely.`, { maxTokens: 2 });
    const tokens = new Set<number>();
    pd.bus.faultHook = (c) => void tokens.add(c.token!);
    const events: LoadEvent[] = [];
    pd.obs.events.on('load-verified', (e) => events.push(e));
    const r = await pd.proxy.generate(prompt, SAMPLING);
    expect(r.tokenIds).toEqual(ref.tokenIds);
    expect(events).toHaveLength(1);
    expect(Math.min(...tokens)).toBe(48);
    expect(pd.consumer.stats.prefixCache.hitTokens).toBeGreaterThanOrEqual(48);
    await pd.shutdown();
  });

  it('a corrupted local prefix is not re-checked (only loaded blocks are)', async () => {
    const shared = 'A shared system prompt of exactly enough bytes!';
    const prompt = `${shared} And now a different tail.`;
    const ref = await single('dense-gqa').generate(prompt, SAMPLING);
    const pd = makePD({ model: 'dense-gqa', failClosed: true, policy: 'fail' });
    await pd.consumer.generate(`${shared} Something else entirely.`, { maxTokens: 2 });
    // Corrupt the consumer's cached prefix blocks in place (K of layer 0, token 1 of each block).
    const kv = pd.consumer.scheduler.kv;
    const w = pd.consumer.workers[0][0];
    const view = w.groups[0].caches[0] as AttentionCacheView;
    let corrupted = 0;
    for (let b = 0; b < kv.pool.numBlocks; b++) {
      if (kv.pool.hashOfBlock(b) === null) continue;
      const k = view.parts[0];
      w.regions[k.region][partAddress(k, view.blockSize, b, 0, 1) + 1] ^= 0x40;
      corrupted++;
    }
    expect(corrupted).toBeGreaterThanOrEqual(3);
    const r = await pd.proxy.generate(prompt, SAMPLING);
    expect(r.error).toBeUndefined();
    expect(await counter(pd.obs, 'loads', { verdict: 'verified' })).toBe(1);
    // The local prefix was used as is: the output shows the corruption.
    expect(r.tokenIds).not.toEqual(ref.tokenIds);
    await pd.shutdown();
  });

  it('concurrent (Mooncake-style) mode: payload through the connector, verified', async () => {
    const ref = await single('dense-gqa').generate(PROMPT, SAMPLING);
    const pd = makePD({ model: 'dense-gqa', mode: 'concurrent', failClosed: true, policy: 'fail', consumer: { tpSize: 2 } });
    const r = await pd.proxy.generate(PROMPT, SAMPLING);
    expect(r.error).toBeUndefined();
    expect(r.tokenIds).toEqual(ref.tokenIds);
    expect(await counter(pd.obs, 'loads', { verdict: 'verified' })).toBe(1);
    await pd.shutdown();
  });
});
