// One result row format for every benchmark under bench/ (issue 16: "one command runs all
// benchmarks and writes one table"). A benchmark calls `result(...)` for each figure it prints;
// when `KVC_BENCH_RESULTS` names a file (bench/all.mjs sets it), the row is appended there as one
// JSON line, otherwise nothing is written (the benchmark's own printout is unchanged). A row with
// a target carries its verdict and a row with a verdict its target, or the row is refused
// (BenchRowError), whether or not the rows are written: a target nobody checks never reaches the
// table.
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

/** A bench row with a target and no verdict, a verdict and no target, or a verdict that is not `met`, `missed` or `figure`. */
export class BenchRowError extends Error {
  /** @param {string} message */
  constructor(message) {
    super(message);
    this.name = 'BenchRowError';
  }
}

/**
 * Checks a finished row (see {@link BenchRow}): `target` absent or "-" exactly when `verdict` is
 * "figure"; returns the row.
 * @template {{ bench?: string, name: string, target?: string, verdict: string }} R
 * @param {R} row
 * @returns {R}
 * @throws {BenchRowError} for a target without a verdict (`figure`), a verdict (`met` / `missed`) without a target, or an unknown verdict
 */
export function checkRow(row) {
  const what = `${row.bench ?? 'bench'} row "${row.name}"`;
  const hasTarget = row.target !== undefined && row.target !== '-' && row.target !== '';
  if (row.verdict !== 'met' && row.verdict !== 'missed' && row.verdict !== 'figure') throw new BenchRowError(`${what}: verdict must be met, missed or figure, got ${JSON.stringify(row.verdict)}`);
  if (hasTarget && row.verdict === 'figure') throw new BenchRowError(`${what}: target "${row.target}" has no verdict (pass met: true / false from checking the figure against it)`);
  if (!hasTarget && row.verdict !== 'figure') throw new BenchRowError(`${what}: verdict ${row.verdict} has no target (pass the target it was checked against)`);
  return row;
}

/**
 * Records one row (see {@link BenchRow}); `met` is true / false against `target`, or undefined
 * for a figure without a target.
 * @param {string} bench
 * @param {{ name: string, figure: string, baseline?: string, ratio?: string, target?: string, met?: boolean }} row
 * @throws {BenchRowError} for a target without `met`, `met` without a target, or a `met` that is not a boolean (see {@link checkRow})
 */
export function result(bench, row) {
  if (row.met !== undefined && typeof row.met !== 'boolean') throw new BenchRowError(`${bench} row "${row.name}": met must be true, false or absent, got ${JSON.stringify(row.met)}`);
  const verdict = row.met === undefined ? 'figure' : row.met ? 'met' : 'missed';
  const out = checkRow({ bench, name: row.name, figure: row.figure, baseline: row.baseline ?? '-', ratio: row.ratio ?? '-', target: row.target ?? '-', verdict });
  const file = process.env.KVC_BENCH_RESULTS;
  if (!file) return;
  appendFileSync(file, `${JSON.stringify(out)}\n`);
}
