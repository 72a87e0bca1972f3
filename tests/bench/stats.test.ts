/**
 * bench/lib/stats.mjs: the paired overhead statistics of bench/e2e.mjs. Every expected value below
 * is worked out by hand in the comment next to it.
 */
import { xoroshiro128plus } from 'pure-rand/generator/xoroshiro128plus';
import { describe, expect, it } from 'vitest';
import { StatsInputError, blockResampleIndices, hodgesLehmann, logRatios, pairedOverhead, quantile, verdict } from '../../bench/lib/stats.mjs';

describe('quantile (type 7)', () => {
  it('interpolates between order statistics', () => {
    // sorted 1 2 3 4: q = 0.25 -> position 0.75 -> 1 + 0.75 * (2 - 1) = 1.75
    expect(quantile([4, 1, 3, 2], 0.25)).toBe(1.75);
    // q = 0.5 -> position 1.5 -> 2.5; q = 1 -> the maximum; q = 0 -> the minimum
    expect(quantile([4, 1, 3, 2], 0.5)).toBe(2.5);
    expect(quantile([4, 1, 3, 2], 1)).toBe(4);
    expect(quantile([4, 1, 3, 2], 0)).toBe(1);
  });
  it('sorts numerically, not as text', () => {
    // sorted 2 10: q = 0 -> 2 (a text sort would give 10)
    expect(quantile([10, 2], 0)).toBe(2);
  });
});

describe('hodgesLehmann', () => {
  it('is the median of the Walsh averages', () => {
    // 1 2 10: averages 1, 1.5, 5.5, 2, 6, 10 -> sorted 1 1.5 2 5.5 6 10 -> (2 + 5.5) / 2 = 3.75
    expect(hodgesLehmann([1, 2, 10])).toBe(3.75);
    // 0 1 2 3: averages 0 .5 1 1.5 | 1 1.5 2 | 2 2.5 | 3 -> sorted 0 .5 1 1 1.5 1.5 2 2 2.5 3 -> 1.5
    expect(hodgesLehmann([3, 0, 2, 1])).toBe(1.5);
    // one value: its own average
    expect(hodgesLehmann([7])).toBe(7);
  });
  it('is not the plain median', () => {
    // 0 0 3: median 0; averages 0 0 1.5 0 1.5 3 -> sorted 0 0 0 1.5 1.5 3 -> (0 + 1.5) / 2 = 0.75
    expect(hodgesLehmann([0, 0, 3])).toBe(0.75);
  });
});

describe('logRatios', () => {
  it('is ln(num / den) per pair', () => {
    // e / 1 -> 1; 2 / 2 -> 0
    expect(logRatios([Math.E, 2], [1, 2])).toEqual([1, 0]);
  });
});

describe('blockResampleIndices', () => {
  it('is made of runs of consecutive indices, the last one cut', () => {
    const idx = blockResampleIndices(10, 3, xoroshiro128plus(1));
    expect(idx).toHaveLength(10);
    // blocks start at 0, 3, 6, 9 (the last of length 1): each in 0..7, each run consecutive
    for (const s of [0, 3, 6]) {
      expect(idx[s]).toBeGreaterThanOrEqual(0);
      expect(idx[s]).toBeLessThanOrEqual(7);
      expect([idx[s + 1], idx[s + 2]]).toEqual([idx[s] + 1, idx[s] + 2]);
    }
    expect(idx[9]).toBeLessThanOrEqual(7);
  });
  it('with one block of the whole series is the series', () => {
    expect(blockResampleIndices(4, 4, xoroshiro128plus(5))).toEqual([0, 1, 2, 3]);
  });
});

describe('pairedOverhead', () => {
  const L = Math.log(1.1);
  it('estimate: exp(HL of the log ratios) - 1', () => {
    // ratios 1, 1.21, 1.1 -> logs 0, 2L, L -> Walsh 0, L, L/2, 2L, 1.5L, L -> sorted 0 .5L L L 1.5L 2L
    // -> median L -> overhead 1.1 - 1 = 0.1
    const r = pairedOverhead([100, 121, 110], [100, 100, 100]);
    expect(r.estimate).toBeCloseTo(0.1, 12);
    expect(r.n).toBe(3);
  });
  it('equal ratios: the interval is the point', () => {
    // every pair +5%: every resample's HL is ln 1.05 -> [0.05, 0.05]
    const r = pairedOverhead([105, 210, 315, 420], [100, 200, 300, 400]);
    for (const x of [r.estimate, r.lo, r.hi]) expect(x).toBeCloseTo(0.05, 12);
  });
  it('cuts the block length to half the pairs, so a resample is never the sample itself', () => {
    // 3 pairs, blocks of 9 asked: floor(3 / 2) = 1. Logs 0, 2L, L: the resample {0, 0, 0} (HL 0)
    // has probability 1/27 > 2.5% and {2L, 2L, 2L} too, so lo = 0 and hi = 0.21 (a block of all
    // 3 would give lo = hi = 0.1)
    const r = pairedOverhead([100, 121, 110], [100, 100, 100], { blockLength: 9 });
    expect(r.blockLength).toBe(1);
    expect(r.lo).toBeCloseTo(0, 12);
    expect(r.hi).toBeCloseTo(0.21, 12);
    // 7 pairs, blocks of 5 asked: floor(7 / 2) = 3
    expect(pairedOverhead([1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1], { blockLength: 5, resamples: 10 }).blockLength).toBe(3);
  });
  it('two pairs, blocks of one: the interval spans the all-low and all-high resamples', () => {
    // logs 0 and 2L. Resamples {0,0} (HL 0), {2L,2L} (HL 2L), mixed (Walsh 0, L, 2L -> L), each
    // all-equal one with probability 1/4: the 2.5% and 97.5% quantiles of 4000 are 0 and 2L
    // -> overheads 0 and 1.21 - 1 = 0.21; the estimate of the sample is L -> 0.1.
    const r = pairedOverhead([100, 121], [100, 100], { blockLength: 1 });
    expect(r.estimate).toBeCloseTo(0.1, 12);
    expect(r.lo).toBeCloseTo(0, 12);
    expect(r.hi).toBeCloseTo(0.21, 12);
    expect(2 * L).toBeCloseTo(Math.log(1.21), 12);
  });
  it('is reproducible from its seed', () => {
    const on = [101, 97, 112, 95, 108, 103, 99, 120];
    const off = [100, 100, 100, 100, 100, 100, 100, 100];
    const a = pairedOverhead(on, off, { seed: 7, resamples: 500 });
    const b = pairedOverhead(on, off, { seed: 7, resamples: 500 });
    expect([a.lo, a.hi]).toEqual([b.lo, b.hi]);
    expect(a.lo).toBeLessThan(a.estimate);
    expect(a.hi).toBeGreaterThan(a.estimate);
  });
  it('bad input is a StatsInputError', () => {
    expect(() => pairedOverhead([], [])).toThrow(StatsInputError);
    expect(() => pairedOverhead([1, 2], [1])).toThrow(/2 numerators but 1 denominators/);
    expect(() => pairedOverhead([1, 0], [1, 1])).toThrow(/pair 1 has a figure <= 0/);
    expect(() => pairedOverhead([1, Number.NaN], [1, 1])).toThrow(StatsInputError);
    expect(() => pairedOverhead([1], [1], { level: 1 })).toThrow(/level/);
    expect(() => pairedOverhead([1], [1], { blockLength: 0 })).toThrow(/blockLength/);
    expect(() => pairedOverhead([1], [1], { seed: 0.5 })).toThrow(/seed/);
    expect(() => hodgesLehmann([])).toThrow(StatsInputError);
  });
});

describe('verdict', () => {
  it('decides only when the whole interval is on one side of the target', () => {
    expect(verdict({ lo: -0.01, hi: 0.02 }, 0.02)).toBe('met'); // hi == target: met
    expect(verdict({ lo: 0.005, hi: 0.021 }, 0.02)).toBe('MISSED (undecided)');
    expect(verdict({ lo: 0.0201, hi: 0.05 }, 0.02)).toBe('MISSED');
    expect(verdict({ lo: 0.02, hi: 0.05 }, 0.02)).toBe('MISSED (undecided)'); // lo == target: could be met
  });
  it('bad input is a StatsInputError', () => {
    expect(() => verdict({ lo: 0.1, hi: 0 }, 0.02)).toThrow(/lo 0.1 > hi 0/);
    expect(() => verdict({ lo: Number.NaN, hi: 0 }, 0.02)).toThrow(StatsInputError);
  });
});
