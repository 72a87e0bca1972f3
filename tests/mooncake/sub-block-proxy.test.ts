/**
 * Issue 13 section 2 over Mooncake (concurrent proxy): producer block size 64, consumer block size
 * 16, a second request sharing an 80-token prefix with the first, so the consumer's prefix cache hit
 * ends inside producer block 1 and its load starts at token 80. `PDProxy` adds
 * `kv_checksum_block_sizes` to the producer's request (docs/checksum-extensions.md section 1): the
 * load is verified with sub-block values; without the field it is `unaligned-prefix`.
 */
import { describe, expect, it } from 'vitest';
import type { LoadEvent } from '@kvconnect/core';
import { PDProxy } from '@kvconnect/engine';
import { makeMooncakePD } from './utils.js';

const S = { maxTokens: 3, temperature: 0 } as const;
const FIRST = Array.from({ length: 100 }, (_, i) => 1 + ((i * 7) % 90));
const SECOND = [...FIRST.slice(0, 80), ...Array.from({ length: 40 }, (_, i) => 2 + ((i * 11) % 80))];

for (const withField of [true, false]) {
  describe(`Mooncake, producer block 64 > consumer block 16, ${withField ? 'with' : 'without'} the proxy's kv_checksum_block_sizes`, () => {
    it(withField ? 'the unaligned prefix hit is verified with sub-block values' : 'the unaligned prefix hit is unverified (unaligned-prefix)', async () => {
      const pd = await makeMooncakePD({ model: 'dense-gqa', producer: { blockSize: 64 }, consumer: { blockSize: 16 }, policy: 'fail' });
      try {
        const proxy = withField ? pd.proxy : new PDProxy({ prefill: pd.producer, decode: pd.consumer, mode: 'concurrent', kvChecksumBlockSizes: false });
        const ev: LoadEvent[] = [];
        for (const e of ['load-verified', 'load-unverified', 'load-mismatch'] as const) pd.obs.events.on(e, (x: LoadEvent) => ev.push(x));
        expect((await proxy.generate(FIRST, S)).error).toBeUndefined();
        const hit0 = pd.consumer.stats.prefixCache.hitTokens;
        expect((await proxy.generate(SECOND, S)).error).toBeUndefined();
        expect(pd.consumer.stats.prefixCache.hitTokens - hit0).toBe(80);
        expect(ev).toHaveLength(2);
        if (withField) {
          expect(ev[1].verdict.verdict).toBe('verified');
          expect(ev[1].verdict.subBlockGroups).toEqual([0]);
        } else {
          expect(ev[1].verdict.verdict).toBe('unverified');
          expect(ev[1].verdict.unverified).toEqual([{ groupId: 0, reason: 'unaligned-prefix' }]);
        }
      } finally {
        await pd.shutdown();
      }
    });
  });
}
