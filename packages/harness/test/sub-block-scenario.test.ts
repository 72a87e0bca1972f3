/**
 * scenarios/sub-block-prefix-hit.json (docs/checksum-extensions.md section 1): the harness's P/D
 * proxy carries `kv_checksum_block_sizes`, so a consumer prefix hit inside a producer block (64 > 16)
 * is verified and the report says so; the flipped bit in the unaligned part is a mismatch.
 */
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { loadScenarioFile, runFiles, runScenario } from '../src/index.js';
import { extensionLines, summarize } from '../src/report.js';

const FILE = fileURLToPath(new URL('../scenarios/sub-block-prefix-hit.json', import.meta.url));

describe('scenario sub-block-prefix-hit', () => {
  it('verifies the unaligned prefix hit with sub-block values and catches the fault in it', async () => {
    const r = await runScenario(loadScenarioFile(FILE), { file: FILE });
    expect(r.skipped).toBeUndefined();
    const failed = r.expectations.filter((x) => !x.ok).map((x) => x.line);
    expect(failed, failed.join('\n')).toEqual([]);
    const run = r.runs[0];
    expect(run.requests.map((q) => q.verdict?.subBlockGroups)).toEqual([[0], [0]]);
    expect(extensionLines(summarize(run))).toEqual(['unaligned prefix hits verified with sub-block values: 2']);
  });

  it('kvconnect run prints the sub-block line', async () => {
    const lines: string[] = [];
    const r = await runFiles([FILE], (l) => lines.push(l));
    expect(r.failed).toBe(0);
    expect(lines).toContain('  unaligned prefix hits verified with sub-block values: 2');
  });
});
