/** Types of stats.mjs: paired A/B statistics of bench/e2e.mjs (issue 16 section 3). */
import type { RandomGenerator } from 'pure-rand/types/RandomGenerator';

/** Bad input to a function of stats.mjs (the message says which argument and why). */
export class StatsInputError extends Error {}

/** The q-quantile (0 <= q <= 1) of `xs`, linear interpolation between order statistics (Hyndman & Fan type 7). Throws StatsInputError. */
export function quantile(xs: ArrayLike<number>, q: number): number;

/** The Hodges-Lehmann location estimate: the median of the n (n + 1) / 2 Walsh averages (x_i + x_j) / 2, i <= j. Throws StatsInputError on empty or non-finite input. */
export function hodgesLehmann(xs: ArrayLike<number>): number;

/** ln(num[i] / den[i]) per pair; throws StatsInputError on unequal lengths or a figure <= 0. */
export function logRatios(num: ArrayLike<number>, den: ArrayLike<number>): number[];

/** Indices of one moving-block resample of `n` items in blocks of `blockLength` consecutive indices (1 <= blockLength <= n); advances `rng`. */
export function blockResampleIndices(n: number, blockLength: number, rng: RandomGenerator): number[];

/** Options of {@link pairedOverhead}. */
export interface OverheadOptions {
  /** Confidence level of the interval, in (0, 1); default 0.95. */
  level?: number;
  /** Consecutive pairs per bootstrap block (cut to floor(n / 2), at least 1: two blocks or more per resample); default 3. */
  blockLength?: number;
  /** Bootstrap resamples; default 4000. */
  resamples?: number;
  /** Integer seed of the xoroshiro128+ generator; default 16. */
  seed?: number;
}

/** An overhead (0.01 = +1%) with its interval and how it was computed. */
export interface Overhead {
  /** exp(Hodges-Lehmann estimate of the pairs' log ratios) - 1. */
  estimate: number;
  /** Lower and upper ends of the percentile block-bootstrap interval, as overheads. */
  lo: number;
  hi: number;
  /** Number of pairs. */
  n: number;
  level: number;
  /** The block length used (after the cut to floor(n / 2), at least 1). */
  blockLength: number;
  resamples: number;
  seed: number;
}

/** The paired overhead of `num` over `den` (pair i: two runs next to each other in time). Throws StatsInputError. */
export function pairedOverhead(num: ArrayLike<number>, den: ArrayLike<number>, options?: OverheadOptions): Overhead;

/** The verdict of an interval against "overhead <= target". Throws StatsInputError on NaN or lo > hi. */
export function verdict(interval: { lo: number; hi: number }, target: number): 'met' | 'MISSED' | 'MISSED (undecided)';
