// One result row format for every benchmark under bench/ (issue 16: "one command runs all
// benchmarks and writes one table"). A benchmark calls `result(...)` for each figure it prints;
// when `KVC_BENCH_RESULTS` names a file (bench/all.mjs sets it), the row is appended there as one
// JSON line, otherwise nothing is written (the benchmark's own printout is unchanged).
import { appendFileSync } from 'node:fs';

/**
 * @typedef {object} BenchRow
 * @property {string} bench     the benchmark script, e.g. "checksum"
 * @property {string} name      what was measured
 * @property {string} figure    the figure with its unit, e.g. "24.9 GB/s"
 * @property {string} [baseline] the same run's baseline with its unit ("-" when there is none)
 * @property {string} [ratio]   figure over baseline as the target reads it ("-" when none)
 * @property {string} [target]  the target, e.g. ">= 0.90" ("-" for figures without one)
 * @property {'met' | 'missed' | 'figure'} verdict  met / missed against the target, or a plain figure
 */

/**
 * Records one row (see {@link BenchRow}); `met` is true / false against a target, or undefined
 * for a figure without a target.
 * @param {string} bench
 * @param {{ name: string, figure: string, baseline?: string, ratio?: string, target?: string, met?: boolean }} row
 */
export function result(bench, row) {
  const file = process.env.KVC_BENCH_RESULTS;
  if (!file) return;
  const verdict = row.met === undefined ? 'figure' : row.met ? 'met' : 'missed';
  const out = { bench, name: row.name, figure: row.figure, baseline: row.baseline ?? '-', ratio: row.ratio ?? '-', target: row.target ?? '-', verdict };
  appendFileSync(file, `${JSON.stringify(out)}\n`);
}
