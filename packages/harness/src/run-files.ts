/**
 * Running scenario files: what `kvconnect run FILE...` does, as a function (tests use it too).
 * @module
 */
import { loadScenarioFile } from './scenario.js';
import { runScenario, type RunScenarioOptions, type ScenarioResult } from './runner.js';
import { ValidationError } from './validate.js';
import { extensionLines, summarize } from './report.js';

/** Totals of {@link runFiles}. */
export interface RunFilesResult {
  passed: number;
  failed: number;
  skipped: number;
  results: ScenarioResult[];
}

/**
 * Runs scenario files in order, printing one line per expectation (`PASS ...` / `FAIL ...`), a
 * `SKIP` line per scenario that cannot run here, the report's lines of the checksum extensions in
 * use (`  unaligned prefix hits verified with sub-block values: N`, report.ts `extensionLines`, one
 * set per run), and last `N passed, N failed`. A file that does
 * not validate prints its problems and counts as one failure.
 */
export async function runFiles(files: readonly string[], print: (line: string) => void = console.log, o: Omit<RunScenarioOptions, 'file'> = {}): Promise<RunFilesResult> {
  let passed = 0;
  let failed = 0;
  let skipped = 0;
  const results: ScenarioResult[] = [];
  for (const file of files) {
    let s;
    try {
      s = loadScenarioFile(file);
    } catch (e) {
      failed++;
      if (e instanceof ValidationError) {
        print(`FAIL ${file}: invalid scenario`);
        for (const p of e.problems) print(`  ${p.path || '(root)'}: ${p.message}`);
      } else print(`FAIL ${file}: ${e instanceof Error ? e.message : String(e)}`);
      continue;
    }
    let r: ScenarioResult;
    try {
      r = await runScenario(s, { ...o, file });
    } catch (e) {
      failed++;
      print(`FAIL ${s.name}: the run threw: ${e instanceof Error ? e.stack ?? e.message : String(e)}`);
      continue;
    }
    results.push(r);
    if (r.skipped) {
      skipped++;
      print(`SKIP ${s.name}: ${r.skipped}`);
      continue;
    }
    for (const x of r.expectations) {
      if (x.ok) passed++;
      else failed++;
      print(x.line);
    }
    for (const run of r.runs) for (const l of extensionLines(summarize(run))) print(`  ${l}`);
  }
  if (skipped > 0) print(`${skipped} scenario(s) skipped`);
  print(`${passed} passed, ${failed} failed`);
  return { passed, failed, skipped, results };
}
