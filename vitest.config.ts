import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    projects: ['packages/*/vitest.config.ts', 'tests/vitest.config.ts'],
    reporters: ['default', './scripts/summary-reporter.ts'],
  },
});
