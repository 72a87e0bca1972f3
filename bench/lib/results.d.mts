/** Types of results.mjs (the one result row format of the benchmarks under bench/). */
/** A row of bench/all.mjs's table. */
export interface BenchRow {
  bench?: string;
  name: string;
  figure?: string;
  baseline?: string;
  ratio?: string;
  target?: string;
  verdict: string;
}
/** A row with a target and no verdict, a verdict and no target, or an unknown verdict. */
export class BenchRowError extends Error {}
/** Checks a finished row (target absent or "-" exactly when the verdict is "figure"); returns it; throws BenchRowError. */
export function checkRow<R extends BenchRow>(row: R): R;
/** Records one row (appended to the file KVC_BENCH_RESULTS names, if any); throws BenchRowError. */
export function result(bench: string, row: { name: string; figure: string; baseline?: string; ratio?: string; target?: string; met?: boolean }): void;
