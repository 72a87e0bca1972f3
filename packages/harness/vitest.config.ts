import { defineProject } from 'vitest/config';

export default defineProject({
  resolve: { conditions: ['@kvconnect/source'] },
  // Tests import workspace packages from src (TypeScript), not from a possibly stale dist.
  ssr: { resolve: { conditions: ['@kvconnect/source'] } },
  test: { name: '@kvconnect/harness', include: ['test/**/*.test.ts'], testTimeout: 120_000 },
});
