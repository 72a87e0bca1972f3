// Paired A/B statistics for bench/e2e.mjs (issue 16 section 3: "reports overheads with their
// spread"). A run with checksums off and the run with checksums on next to it in time form a pair;
// the overhead of the pair is the ratio of their figures. Over the pairs:
//  - the estimate is the Hodges-Lehmann estimator of the log ratios (the median of all Walsh
//    averages (d_i + d_j) / 2, i <= j; Hodges & Lehmann 1963), back-transformed: exp(HL) - 1.
//    It is as robust as the median of the ratios (a quarter of the pairs may be wild) and less
//    noisy with few pairs;
//  - its interval is a percentile moving-block bootstrap (Kuensch 1989): resamples of n pairs made
//    of blocks of `blockLength` consecutive pairs (so drift between nearby pairs, e.g. the same
//    fresh topology, stays inside a block), from a seeded generator (pure-rand xoroshiro128+) so the
//    same pairs and seed give the same interval;
//  - the verdict against a target ("overhead <= target") is decided only when the whole interval
//    is on one side of it.
import { uniformInt } from 'pure-rand/distribution/uniformInt';
import { xoroshiro128plus } from 'pure-rand/generator/xoroshiro128plus';

/** Bad input to a function of this module (the message says which argument and why). */
export class StatsInputError extends Error {
  constructor(message) {
    super(message);
    this.name = 'StatsInputError';
  }
}

function finiteArray(xs, what) {
  if (!Array.isArray(xs) && !ArrayBuffer.isView(xs)) throw new StatsInputError(`${what}: expected an array of numbers`);
  if (xs.length === 0) throw new StatsInputError(`${what}: empty`);
  for (let i = 0; i < xs.length; i++) {
    if (typeof xs[i] !== 'number' || !Number.isFinite(xs[i])) throw new StatsInputError(`${what}[${i}]: expected a finite number, got ${String(xs[i])}`);
  }
}

/**
 * The q-quantile of `xs` by linear interpolation between order statistics (Hyndman & Fan type 7,
 * R's and NumPy's default): position q * (n - 1) in the sorted values.
 */
export function quantile(xs, q) {
  finiteArray(xs, 'quantile: xs');
  if (!(q >= 0 && q <= 1)) throw new StatsInputError(`quantile: q must be in [0, 1], got ${q}`);
  const s = Float64Array.from(xs).sort();
  const h = q * (s.length - 1);
  const lo = Math.floor(h);
  return lo + 1 < s.length ? s[lo] + (h - lo) * (s[lo + 1] - s[lo]) : s[lo];
}

/** The Hodges-Lehmann location estimate of `xs`: the median of its n (n + 1) / 2 Walsh averages. */
export function hodgesLehmann(xs) {
  finiteArray(xs, 'hodgesLehmann: xs');
  const n = xs.length;
  const w = new Float64Array((n * (n + 1)) / 2);
  let k = 0;
  for (let i = 0; i < n; i++) for (let j = i; j < n; j++) w[k++] = (xs[i] + xs[j]) / 2;
  w.sort();
  const m = w.length >> 1;
  return w.length % 2 ? w[m] : (w[m - 1] + w[m]) / 2;
}

/** ln(num[i] / den[i]) for each pair; both arrays of positive finite figures of equal length. */
export function logRatios(num, den) {
  finiteArray(num, 'logRatios: num');
  finiteArray(den, 'logRatios: den');
  if (num.length !== den.length) throw new StatsInputError(`logRatios: ${num.length} numerators but ${den.length} denominators (one of each per pair)`);
  return Array.from(num, (x, i) => {
    if (!(x > 0) || !(den[i] > 0)) throw new StatsInputError(`logRatios: pair ${i} has a figure <= 0 (${x} / ${den[i]})`);
    return Math.log(x / den[i]);
  });
}

/**
 * Indices of one moving-block resample of a series of `n` items: ceil(n / blockLength) blocks of
 * `blockLength` consecutive indices, each starting uniformly in 0..n - blockLength, concatenated
 * and cut to `n`. `rng` is a pure-rand generator (advanced in place).
 */
export function blockResampleIndices(n, blockLength, rng) {
  if (!Number.isInteger(n) || n < 1) throw new StatsInputError(`blockResampleIndices: n must be a positive integer, got ${n}`);
  if (!Number.isInteger(blockLength) || blockLength < 1 || blockLength > n) throw new StatsInputError(`blockResampleIndices: blockLength must be an integer in 1..${n}, got ${blockLength}`);
  const out = new Array(n);
  for (let k = 0; k < n; ) {
    const start = uniformInt(rng, 0, n - blockLength);
    for (let j = 0; j < blockLength && k < n; j++) out[k++] = start + j;
  }
  return out;
}

/**
 * The paired overhead of `num` over `den` (e.g. TTFT on over TTFT off, pair i being two runs next
 * to each other in time): the Hodges-Lehmann estimate of the pairs' log ratios and its percentile
 * moving-block bootstrap interval, both as overheads exp(x) - 1 (0.01 = +1%).
 * Options: level (default 0.95), blockLength (pairs per bootstrap block, default 3, cut to half
 * the number of pairs, at least 1, so that a resample has two blocks or more), resamples (default 4000), seed (an integer, default 16).
 * Throws StatsInputError on empty or unequal arrays, figures <= 0 or bad options.
 */
export function pairedOverhead(num, den, { level = 0.95, blockLength = 3, resamples = 4000, seed = 16 } = {}) {
  const d = logRatios(num, den);
  if (!(level > 0 && level < 1)) throw new StatsInputError(`pairedOverhead: level must be in (0, 1), got ${level}`);
  if (!Number.isInteger(resamples) || resamples < 1) throw new StatsInputError(`pairedOverhead: resamples must be a positive integer, got ${resamples}`);
  if (!Number.isInteger(seed)) throw new StatsInputError(`pairedOverhead: seed must be an integer, got ${seed}`);
  if (!Number.isInteger(blockLength) || blockLength < 1) throw new StatsInputError(`pairedOverhead: blockLength must be a positive integer, got ${blockLength}`);
  const n = d.length;
  // At least two blocks per resample: with one block of all n pairs every resample would be the sample itself.
  const L = Math.min(blockLength, Math.max(1, Math.floor(n / 2)));
  const rng = xoroshiro128plus(seed);
  const boot = new Float64Array(resamples);
  const sample = new Array(n);
  for (let b = 0; b < resamples; b++) {
    const idx = blockResampleIndices(n, L, rng);
    for (let i = 0; i < n; i++) sample[i] = d[idx[i]];
    boot[b] = hodgesLehmann(sample);
  }
  const a = (1 - level) / 2;
  const ov = (x) => Math.expm1(x);
  return { estimate: ov(hodgesLehmann(d)), lo: ov(quantile(boot, a)), hi: ov(quantile(boot, 1 - a)), n, level, blockLength: L, resamples, seed };
}

/**
 * The verdict of an overhead interval against "overhead <= target": 'met' when the whole interval
 * is at or below the target, 'MISSED' when it is wholly above, 'MISSED (undecided)' when it
 * straddles the target (the pairs cannot tell).
 */
export function verdict({ lo, hi }, target) {
  for (const [k, v] of [['lo', lo], ['hi', hi], ['target', target]]) {
    if (typeof v !== 'number' || Number.isNaN(v)) throw new StatsInputError(`verdict: ${k} must be a number, got ${String(v)}`);
  }
  if (lo > hi) throw new StatsInputError(`verdict: interval lo ${lo} > hi ${hi}`);
  if (hi <= target) return 'met';
  if (lo > target) return 'MISSED';
  return 'MISSED (undecided)';
}
