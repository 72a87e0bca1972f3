/**
 * `kv_checksum_block_sizes` through the P/D flow (docs/checksum-extensions.md section 1): an engine
 * server's `/health` names its KV cache groups, `EngineClient.connect` learns them, and the proxy
 * server (its `PDProxy`) adds the consumer's block sizes to the producer's request when the
 * producer's block size is a larger multiple, so a consumer prefix hit that ends inside a producer
 * block is verified (InProcessConnector, producer block 64, consumer block 16).
 */
import { afterEach, describe, expect, it } from 'vitest';
import type { LoadEvent } from '@kvconnect/core';
import { EngineClient } from '../src/server/engine-client.js';
import { startEngineServer } from '../src/server/engine-server.js';
import { healthKVCacheGroups, parseHealthKVCacheGroups } from '../src/server/kv-cache-groups.js';
import { startProxyServer } from '../src/server/proxy-server.js';
import { makePD } from './utils/pd.js';

const cleanups: Array<() => Promise<unknown>> = [];
afterEach(async () => {
  while (cleanups.length) await cleanups.pop()!().catch(() => {});
});

/** 100 tokens, then a prompt sharing its first 80 (5 consumer blocks of 16; 1.25 producer blocks of 64). */
const FIRST = Array.from({ length: 100 }, (_, i) => 1 + ((i * 7) % 90));
const SECOND = [...FIRST.slice(0, 80), ...Array.from({ length: 40 }, (_, i) => 2 + ((i * 11) % 80))];

describe('/health kv_cache_groups', () => {
  it('round-trips through EngineClient.connect; malformed entries give undefined', async () => {
    const pd = makePD({ model: 'hybrid-mamba2', producer: { blockSize: 64 }, consumer: { blockSize: 16 } });
    cleanups.push(() => pd.shutdown());
    const s = await startEngineServer(pd.consumer);
    cleanups.push(() => s.close());
    const h = (await (await fetch(`${s.url}/health`)).json()) as { kv_cache_groups: Array<{ kind: string }> };
    expect(h.kv_cache_groups).toEqual(pd.consumer.groupConfigs.map((g) => ({ group_id: g.groupId, kind: g.kind, block_size: 16 })));
    expect(h.kv_cache_groups.map((g) => g.kind)).toContain('state');
    const c = await EngineClient.connect(s.url);
    cleanups.push(async () => c.close());
    expect(c.groupConfigs).toEqual(pd.consumer.groupConfigs.map((g) => ({ groupId: g.groupId, kind: g.kind, blockSize: 16 })));
    expect(parseHealthKVCacheGroups({ kv_cache_groups: healthKVCacheGroups(pd.producer.groupConfigs) })?.[0].blockSize).toBe(64);
    for (const bad of [undefined, [], [{ group_id: 0, kind: 'full-attention', block_size: 0 }], [{ group_id: -1, kind: 'full-attention', block_size: 16 }], [{ group_id: 0, kind: 'paged', block_size: 16 }], ['x']]) {
      expect(parseHealthKVCacheGroups({ kv_cache_groups: bad })).toBeUndefined();
    }
  });
});

describe('proxy server adds kv_checksum_block_sizes (producer block 64, consumer block 16)', () => {
  it('an unaligned consumer prefix hit through the proxy server is verified with sub-block values', async () => {
    const pd = makePD({ model: 'dense-gqa', producer: { blockSize: 64 }, consumer: { blockSize: 16 }, failClosed: true, policy: 'fail' });
    cleanups.push(() => pd.shutdown());
    const ev: LoadEvent[] = [];
    for (const e of ['load-verified', 'load-unverified', 'load-mismatch'] as const) pd.obs.events.on(e, (x: LoadEvent) => ev.push(x));
    const p = await startEngineServer(pd.producer);
    const d = await startEngineServer(pd.consumer);
    cleanups.push(() => p.close(), () => d.close());
    const proxy = await startProxyServer({ prefill: [p.url], decode: [d.url] });
    cleanups.push(() => proxy.close());
    for (const prompt of [FIRST, SECOND]) {
      const res = await fetch(`${proxy.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ prompt, max_tokens: 2, temperature: 0 }) });
      expect(res.status).toBe(200);
    }
    expect(ev).toHaveLength(2);
    expect(ev[1].verdict.verdict).toBe('verified');
    expect(ev[1].verdict.subBlockGroups).toEqual([0]);
  });
});
