import { defineProject } from 'vitest/config';

export default defineProject({
  resolve: { conditions: ['@kvconnect/source'] },
  test: { name: '@kvconnect/mooncake', include: ['test/**/*.test.ts'], testTimeout: 120_000 },
});
