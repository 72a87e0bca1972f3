/**
 * A vitest reporter that ends the run with one plain line `N passed, N failed, N skipped`, the
 * closing line CI tooling reads in any language (it runs after vitest's default reporter).
 */
import type { Reporter, TestModule } from 'vitest/node';

export default class SummaryReporter implements Reporter {
  onTestRunEnd(testModules: ReadonlyArray<TestModule>): void {
    let passed = 0;
    let failed = 0;
    let skipped = 0;
    for (const m of testModules) {
      for (const t of m.children.allTests()) {
        const s = t.result().state;
        if (s === 'passed') passed++;
        else if (s === 'failed') failed++;
        else skipped++;
      }
      if (m.state() === 'failed' && [...m.children.allTests()].length === 0) failed++; // a file that failed to load
    }
    process.stdout.write(`\n${passed} passed, ${failed} failed, ${skipped} skipped\n`);
  }
}
