/** Types of cuda-summary.mjs (the rows of bench/all.mjs's table from the CUDA benchmark executables' output). */
/** Output of a CUDA benchmark executable that lacks what its rows are read from (the message says which line). */
export class CudaOutputError extends Error {}
/** A row of bench/lib/results.mjs's BenchRow, without `bench`. */
export interface CudaRow {
  name: string;
  figure: string;
  baseline: string;
  ratio: string;
  target: string;
  verdict: 'met' | 'missed' | 'figure';
}
/** The rows of one run of `kvc_bench_cuda` (its whole stdout); throws CudaOutputError. */
export function kernelRows(stdout: string): CudaRow[];
/** The row of one run of `kvc_bench_ipc` (its whole stdout); throws CudaOutputError. */
export function ipcRows(stdout: string): CudaRow[];
