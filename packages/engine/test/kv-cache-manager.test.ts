import { describe, expect, it } from 'vitest';
import { BlockPool, KVCacheManager, blockHashes } from '../src/kv-cache-manager.js';
import type { KVCacheGroupConfig } from '@kvconnect/core';

const full: KVCacheGroupConfig = { groupId: 0, kind: 'full-attention', blockSize: 4, layerNames: ['model.layers.0.self_attn.attn'] };
const swa: KVCacheGroupConfig = { groupId: 1, kind: 'sliding-window', blockSize: 4, layerNames: ['model.layers.1.self_attn.attn'], slidingWindow: 4 };
const state: KVCacheGroupConfig = { groupId: 1, kind: 'state', blockSize: 4, layerNames: ['model.layers.1.mixer'] };
const req = (id: string, tokens: number[]) => ({ requestId: id, allTokenIds: tokens });
const range = (a: number, b: number) => Array.from({ length: b - a }, (_, i) => a + i);

describe('BlockPool', () => {
  it('allocates in LRU order, frees to the tail, and evicts cached blocks it reuses', () => {
    const p = new BlockPool(4);
    expect(p.allocate(2)).toEqual([0, 1]);
    expect(p.numFree).toBe(2);
    p.cache(0, 'h0');
    p.free([1, 0]);
    expect(p.numFree).toBe(4);
    // Queue: 2, 3, 1, 0 -> the cached block 0 is reused last.
    expect(p.allocate(3)).toEqual([2, 3, 1]);
    expect(p.lookup('h0')).toBe(0);
    expect(p.allocate(1)).toEqual([0]);
    expect(p.lookup('h0')).toBeUndefined();
    expect(p.evictions).toBe(1);
    expect(() => p.allocate(1)).toThrow(RangeError);
  });

  it('touch takes a free cached block off the queue; refcounts guard double frees', () => {
    const p = new BlockPool(2);
    const [a] = p.allocate(1);
    p.cache(a, 'k');
    p.free([a]);
    p.touch([a]);
    expect(p.numFree).toBe(1);
    p.touch([a]);
    expect(p.refCount(a)).toBe(2);
    p.free([a, a]);
    expect(() => p.free([a])).toThrow();
  });
});

describe('block hashes', () => {
  it('chain full blocks only, and depend on every earlier token', () => {
    const a = blockHashes(range(0, 10), 4);
    expect(a).toHaveLength(2);
    const b = blockHashes([99, ...range(1, 10)], 4);
    expect(b[0]).not.toBe(a[0]);
    expect(b[1]).not.toBe(a[1]);
    expect(blockHashes(range(0, 12), 4, a).slice(0, 2)).toEqual(a);
  });
});

describe('KVCacheManager', () => {
  it('hits the longest cached prefix of full blocks, capped below the last token', () => {
    const m = new KVCacheManager([full, swa], 4, 32, true);
    const r1 = req('a', range(0, 10));
    const t1 = m.allocateSlots(r1, 10)!;
    expect(t1.map((g) => g.length)).toEqual([3, 3]);
    m.cacheBlocks(r1, 10);
    m.free('a');
    // Same 8-token prefix, different tail.
    const r2 = req('b', [...range(0, 8), 50, 51, 52]);
    const hit = m.getComputedBlocks(r2);
    expect(hit.numTokens).toBe(8);
    expect(hit.blocks[0]).toEqual(t1[0].slice(0, 2));
    expect(hit.blocks[1]).toEqual(t1[1].slice(0, 2));
    const t2 = m.allocateSlots(r2, 11, hit)!;
    expect(t2[0].slice(0, 2)).toEqual(t1[0].slice(0, 2));
    // Exactly 8 tokens: at most 4 may hit (one token left to compute).
    expect(m.getComputedBlocks(req('c', range(0, 8))).numTokens).toBe(4);
    expect(m.getComputedBlocks(req('d', [1, ...range(1, 12)])).numTokens).toBe(0);
  });

  it('neverCache: a request\'s blocks stay out of the cache until freed; an earlier hit stays cached', () => {
    const m = new KVCacheManager([full], 4, 32, true);
    const a = req('a', range(0, 9));
    m.allocateSlots(a, 9);
    m.cacheBlocks(a, 4); // block 0 cached (say, a local prefix)
    m.neverCache('a'); // the rest was loaded and did not verify
    m.cacheBlocks(a, 9);
    m.free('a');
    expect(m.getComputedBlocks(req('b', range(0, 9))).numTokens).toBe(4);
    // Freed: the flag goes with the blocks; a new request of the same id caches again.
    const again = req('a', range(0, 9));
    m.allocateSlots(again, 9);
    m.cacheBlocks(again, 9);
    m.free('a');
    expect(m.getComputedBlocks(req('c', range(0, 9))).numTokens).toBe(8);
  });

  it('prefix caching off, or a state group: never a hit', () => {
    for (const m of [new KVCacheManager([full], 4, 8, false), new KVCacheManager([full, state], 4, 8, true)]) {
      const r = req('a', range(0, 9));
      m.allocateSlots(r, 9);
      m.cacheBlocks(r, 9);
      m.free('a');
      expect(m.getComputedBlocks(req('b', range(0, 9))).numTokens).toBe(0);
    }
  });

  it('state groups hold one running-state block; allocation is all or nothing', () => {
    const m = new KVCacheManager([full, state], 4, 5, true);
    const t = m.allocateSlots(req('a', range(0, 9)), 9)!;
    expect(t.map((g) => g.length)).toEqual([3, 1]);
    expect(m.allocateSlots(req('a', range(0, 13)), 13)!.map((g) => g.length)).toEqual([4, 1]);
    expect(m.allocateSlots(req('b', range(0, 5)), 5)).toBeNull();
    expect(m.pool.numFree).toBe(0);
    m.free('a');
    expect(m.pool.numFree).toBe(5);
  });
});
