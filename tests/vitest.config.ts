import { defineProject } from 'vitest/config';

export default defineProject({
  resolve: { conditions: ['@kvconnect/source'] },
  test: { name: 'cross-package', include: ['**/*.test.ts'], testTimeout: 120_000 },
});
