/**
 * LocalizeBudget under many consumer keys (consumer-binding.ts, docs/localize.md "Binding and
 * budget"): its per-key state stays bounded, and eviction when no bucket is idle is done in batches.
 */
import { describe, expect, it } from 'vitest';
import { LocalizeBudget } from '../src/index.js';

describe('LocalizeBudget: many consumer keys', () => {
  it('budget: past 65536 consumers none idle, the oldest sixteenth is evicted at once (not one per new key, each after a scan of all); the newest stay', () => {
    const now = 0; // frozen clock: no bucket refills, so none is idle enough to prune
    const b = new LocalizeBudget({ maxInFlight: 4, rangesPerSecond: 65_536, now: () => now });
    const buckets = (b as unknown as { buckets: Map<string, unknown> }).buckets;
    for (let i = 0; i < 65_536; i++) expect(b.take(`k${i}`, 1)).toBe(null); // never done(): in flight
    expect(buckets.size).toBe(65_536); // MAX_BUCKETS of consumer-binding.ts
    expect(b.take('new', 1)).toBe(null);
    // 65536 - 65536/16 kept before the new one is added: the next 4095 new keys need no scan.
    expect(buckets.size).toBe(65_536 - 4096 + 1);
    expect(buckets.has('k0')).toBe(false);
    expect(buckets.has('k4095')).toBe(false);
    expect(buckets.has('k4096')).toBe(true);
    expect(buckets.has('k65535') && buckets.has('new')).toBe(true);
  });
});
