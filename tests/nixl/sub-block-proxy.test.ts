/**
 * Issue 13 section 2 end to end (docs/checksum-extensions.md section 1): NIXL push with producer
 * block size 64 and consumer block size 16. A second request shares an 80-token prefix with the
 * first, so the consumer's prefix cache hit (5 blocks of 16) ends inside the producer's block 1
 * (tokens 64..127) and the load starts at token 80, not a multiple of 64. `PDProxy` knows both
 * engines' KV cache groups and adds `kv_checksum_block_sizes` to the producer's request, so the
 * load is verified with sub-block values; without that field it is `unaligned-prefix`.
 */
import { describe, expect, it } from 'vitest';
import type { LoadEvent } from '@kvconnect/core';
import { PDProxy } from '@kvconnect/engine';
import { corruptingFactory, makeNixlPD, type NixlPD } from './utils.js';

const S = { maxTokens: 3, temperature: 0 } as const;
/** 100 tokens; the second prompt keeps the first 80 (5 consumer blocks, 1.25 producer blocks). */
const FIRST = Array.from({ length: 100 }, (_, i) => 1 + ((i * 7) % 90));
const SECOND = [...FIRST.slice(0, 80), ...Array.from({ length: 40 }, (_, i) => 2 + ((i * 11) % 80))];

/** Load events of the consumer, in order. */
function loads(pd: NixlPD): LoadEvent[] {
  const out: LoadEvent[] = [];
  for (const e of ['load-verified', 'load-unverified', 'load-mismatch'] as const) pd.obs.events.on(e, (ev: LoadEvent) => out.push(ev));
  return out;
}

describe('NIXL push, producer block 64 > consumer block 16: prefix hit inside a producer block', () => {
  it('with the proxy field: the second load starts at token 80 and is verified with sub-block values', async () => {
    const pd = await makeNixlPD({ mode: 'push', model: 'dense-gqa', producer: { blockSize: 64 }, consumer: { blockSize: 16 }, policy: 'fail' });
    try {
      const ev = loads(pd);
      const r1 = await pd.proxy.generate(FIRST, S);
      expect(r1.error).toBeUndefined();
      const hit0 = pd.consumer.stats.prefixCache.hitTokens;
      const r2 = await pd.proxy.generate(SECOND, S);
      expect(r2.error).toBeUndefined();
      // The consumer's prefix cache served 80 tokens of the second request.
      expect(pd.consumer.stats.prefixCache.hitTokens - hit0).toBe(80);
      expect(ev).toHaveLength(2);
      expect(ev[1].verdict.verdict).toBe('verified');
      expect(ev[1].verdict.subBlockGroups).toEqual([0]);
      expect(ev[1].verdict.unverified).toEqual([]);
    } finally {
      await pd.shutdown();
    }
  });

  it('with the proxy field: a bit flipped in the load of the unaligned hit is a mismatch (policy fail ends the request)', async () => {
    const c = corruptingFactory();
    const pd = await makeNixlPD({ mode: 'push', model: 'dense-gqa', producer: { blockSize: 64 }, consumer: { blockSize: 16 }, policy: 'fail', producerExtra: { agent_factory: c.factory } });
    try {
      const ev = loads(pd);
      await pd.proxy.generate(FIRST, S);
      c.agents[0].corrupt = 1;
      const r2 = await pd.proxy.generate(SECOND, S);
      expect(c.agents[0].corrupted).toBe(1);
      expect(ev).toHaveLength(2);
      expect(ev[1].verdict.verdict).toBe('mismatch');
      expect(ev[1].verdict.subBlockGroups).toEqual([0]);
      expect(ev[1].verdict.mismatches.map((m) => m.groupId)).toEqual([0]);
      expect(r2.finishReason).toBe('error');
    } finally {
      await pd.shutdown();
    }
  });

  it('without the proxy field (kvChecksumBlockSizes: false): the same load is unverified (unaligned-prefix)', async () => {
    const pd = await makeNixlPD({ mode: 'push', model: 'dense-gqa', producer: { blockSize: 64 }, consumer: { blockSize: 16 }, policy: 'fail', failClosed: false });
    try {
      const proxy = new PDProxy({ prefill: pd.producer, decode: pd.consumer, kvChecksumBlockSizes: false });
      const ev = loads(pd);
      await proxy.generate(FIRST, S);
      const r2 = await proxy.generate(SECOND, S);
      expect(r2.error).toBeUndefined();
      expect(ev).toHaveLength(2);
      expect(ev[1].verdict.verdict).toBe('unverified');
      expect(ev[1].verdict.unverified).toEqual([{ groupId: 0, reason: 'unaligned-prefix' }]);
      expect(ev[1].verdict.subBlockGroups).toBeUndefined();
    } finally {
      await pd.shutdown();
    }
  });
});
