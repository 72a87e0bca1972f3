/**
 * Every field case of `../shared/cases/field-cases.md` (and the upstream determinism check) as a
 * scenario file in this folder, run through the harness runner: every expectation must pass.
 */
import { readdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { loadScenarioFile, runScenario } from '@kvconnect/harness';

const dir = dirname(fileURLToPath(import.meta.url));
const files = readdirSync(dir)
  .filter((f) => f.endsWith('.json'))
  .sort();

describe('field cases', () => {
  it('has a scenario for every case of field-cases.md', () => {
    const ids = new Set(files.map((f) => f.replace(/[a-z]?(-.*)?\.json$/, '')));
    for (const id of ['F01', 'F02', 'F04', 'F05', 'F06', 'F07', 'F08', 'F10', 'F11', 'F13', 'F16', 'F18', 'U01']) expect(ids, id).toContain(id);
  });

  for (const f of files) {
    it(f.replace(/\.json$/, ''), async () => {
      const s = loadScenarioFile(join(dir, f));
      const r = await runScenario(s, { file: f });
      expect(r.skipped, r.skipped).toBeUndefined();
      const failed = r.expectations.filter((x) => !x.ok).map((x) => x.line);
      expect(failed, failed.join('\n')).toEqual([]);
      expect(r.expectations.length).toBeGreaterThan(0);
    });
  }
});
