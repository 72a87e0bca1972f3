/** The seed of seeded tests: a fixed default, KVC_TEST_SEED when set, refused when not a uint32. */
import { expect, it } from 'vitest';
import { DEFAULT_TEST_SEED, testSeed } from './seed.js';

it('a fixed default; KVC_TEST_SEED when set; a bad one is refused', () => {
  expect(testSeed('t', undefined)).toBe(20241);
  expect(DEFAULT_TEST_SEED).toBe(20241);
  expect(testSeed('t', '')).toBe(20241);
  expect(testSeed('t', '7')).toBe(7);
  expect(() => testSeed('t', '-1')).toThrow(/KVC_TEST_SEED must be a uint32/);
  expect(() => testSeed('t', 'x')).toThrow(/KVC_TEST_SEED/);
});
