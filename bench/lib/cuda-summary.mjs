// The rows of bench/all.mjs's table from the output of the CUDA benchmark executables
// (native/cuda/bench_cuda.cu -> kvc_bench_cuda, native/cuda/bench_ipc.cu -> kvc_bench_ipc; built as
// bench/cuda/README.md says). Output that does not have the lines a verdict is read from is a
// CudaOutputError, never a missing row: the table must not look met, or merely short, because a
// line changed its wording. Tested in tests/bench/cuda-summary.test.ts against bench/cuda/results-h200.txt
// and bench/cuda/ipc-h200.txt.

/** Output of a CUDA benchmark executable that lacks what its rows are read from (the message says which line). */
export class CudaOutputError extends Error {
  /** @param {string} message */
  constructor(message) {
    super(message);
    this.name = 'CudaOutputError';
  }
}

/**
 * @typedef {object} CudaRow  a row of bench/lib/results.mjs's BenchRow, without `bench`
 * @property {string} name
 * @property {string} figure
 * @property {string} baseline
 * @property {string} ratio
 * @property {string} target
 * @property {'met' | 'missed' | 'figure'} verdict
 */

/**
 * Splits a summary line at its first colon outside parentheses: `attn128 (best: NHD 32K V2): step
 * 39.2 us ...` is named `attn128 (best: NHD 32K V2)`.
 * @param {string} line
 * @returns {[string, string]} name and figure
 */
function nameAndFigure(line) {
  let depth = 0;
  for (let i = 0; i < line.length; i++) {
    const c = line[i];
    if (c === '(') depth++;
    else if (c === ')') depth = Math.max(0, depth - 1);
    else if (c === ':' && depth === 0) return [line.slice(0, i).trim(), line.slice(i + 1).trim()];
  }
  throw new CudaOutputError(`kvc_bench_cuda summary line without "name: figure": ${JSON.stringify(line)}`);
}

/**
 * The rows of one run of `kvc_bench_cuda` (its whole stdout): one `figure` row per summary line
 * (the lines after `summary (...)`, up to the first empty line), then the verdict rows of issue 16
 * part 4: the 128 MiB step (attn128) >= 0.93 of the same run's plain read, and the isolated
 * 28-layer step (2 KV heads, 32 KiB items, the kernel variant the output names in its
 * `kernel variant by default: V<n>` line; outputs without it, before 2026-12-02 session 6: V2) <= 15 us
 * including launch, beside the fastest plain read of the step's own scattered chunks launched alone from idle
 * (`step28 floor` lines; the wording of bench/cuda/results-h200.txt's runs is read too; without
 * such a line the baseline is `-`). A summary that does not say `all exact` (a GPU sum differed
 * from the CPU kernel's) makes both verdicts `missed`.
 * @param {string} stdout
 * @returns {CudaRow[]}
 * @throws {CudaOutputError} no summary, more than one, or no attn128 or 2-head 32 KiB step28 line of that variant
 */
export function kernelRows(stdout) {
  const lines = stdout.split('\n');
  const heads = lines.flatMap((l, i) => (/^summary \(/.test(l) ? [i] : []));
  if (heads.length !== 1) throw new CudaOutputError(`kvc_bench_cuda output: expected one "summary (...)" line, found ${heads.length}`);
  const exact = /: all exact\)\s*$/.test(lines[heads[0]]);
  const summary = [];
  for (const l of lines.slice(heads[0] + 1)) {
    if (!l.trim()) break;
    summary.push(l.trim());
  }
  /** @type {CudaRow[]} */
  const out = summary.map((l) => {
    const [name, figure] = nameAndFigure(l);
    return { name, figure, baseline: '-', ratio: '-', target: '-', verdict: 'figure' };
  });
  const text = summary.join('\n');
  const a = /attn128 \(best: ([^)]*)\): step ([0-9.]+) us.*?= ([0-9.]+) of the plain read ([0-9.]+) us/.exec(text);
  if (!a) throw new CudaOutputError('kvc_bench_cuda summary: no "attn128 (best: ...): step X us ... = R of the plain read Y us" line');
  out.push({ name: `128 MiB step (attn128, ${a[1]}) vs the plain read`, figure: `${a[2]} us`, baseline: `${a[4]} us plain read`, ratio: a[3], target: '>= 0.93', verdict: exact && Number(a[3]) >= 0.93 ? 'met' : 'missed' });
  const dv = /^kernel variant by default: V([0-9]+)\b/m.exec(text);
  const v = dv ? dv[1] : '2';
  const s = new RegExp(`step28 H=2 \\(([0-9.]+) MiB\\) V${v} items 32768 B: queued step ([0-9.]+) us, isolated step ([0-9.]+) us`).exec(text);
  if (!s) throw new CudaOutputError(`kvc_bench_cuda summary: no "step28 H=2 (N MiB) V${v} items 32768 B: queued step X us, isolated step Y us" line`);
  const floorLine = /step28 floor(?:, the step's own scattered chunks read plainly|: plain read of the step's own scattered chunks)[^\n]*alone from idle ([0-9.]+) us/g;
  const floors = [...text.matchAll(floorLine)].map((m) => Number(m[1]));
  const floor = floors.length ? Math.min(...floors) : undefined;
  out.push({
    name: `isolated 28-layer step (2 KV heads, ${s[1]} MiB) from an idle GPU, incl. launch`,
    figure: `${s[3]} us`,
    baseline: floor ? `${floor} us plain read of its chunks` : '-',
    ratio: floor ? (floor / Number(s[3])).toFixed(3) : '-',
    target: '<= 15 us',
    verdict: exact && Number(s[3]) <= 15 ? 'met' : 'missed',
  });
  return out;
}

/**
 * The row of one run of `kvc_bench_ipc` (its whole stdout): the KV load through CUDA IPC from a
 * peer process vs cudaMemcpy D2D in the same process, 1 GiB, with the executable's own verdict
 * (`ratio IPC/D2D throughput: R  verdict: PASS|FAIL`; PASS = ratio >= 0.8 and bytes intact).
 * @param {string} stdout
 * @returns {CudaRow[]}
 * @throws {CudaOutputError} no ratio/verdict line, or no `CUDA IPC load` or `cudaMemcpy D2D` time
 */
export function ipcRows(stdout) {
  const m = /ratio IPC\/D2D throughput: ([0-9.]+)\s+verdict: (PASS|FAIL)/.exec(stdout);
  const ipc = /CUDA IPC load[^\n]*?([0-9.]+) ms/.exec(stdout);
  const d2d = /cudaMemcpy D2D[^\n]*?([0-9.]+) ms/.exec(stdout);
  if (!m) throw new CudaOutputError('kvc_bench_ipc output: no "ratio IPC/D2D throughput: R  verdict: PASS|FAIL" line');
  if (!ipc || !d2d) throw new CudaOutputError(`kvc_bench_ipc output: no ${ipc ? '"cudaMemcpy D2D ... X ms"' : '"CUDA IPC load ... X ms"'} line`);
  return [{ name: 'KV load through CUDA IPC vs cudaMemcpy D2D (1 GiB)', figure: `${ipc[1]} ms`, baseline: `${d2d[1]} ms D2D`, ratio: m[1], target: '>= 0.8', verdict: m[2] === 'PASS' ? 'met' : 'missed' }];
}
