/**
 * The seed of a seeded (property / fuzz) test file: `KVC_TEST_SEED` (a uint32) when set, else a
 * fixed default, so every run checks the same cases unless asked otherwise. Printed once per file,
 * with the command line that replays it.
 */
export const DEFAULT_TEST_SEED = 20241;

/** @throws Error for a `KVC_TEST_SEED` that is not a uint32. */
export function testSeed(file: string, env: string | undefined = process.env.KVC_TEST_SEED): number {
  let seed = DEFAULT_TEST_SEED;
  if (env !== undefined && env !== '') {
    const n = Number(env);
    if (!Number.isInteger(n) || n < 0 || n >= 2 ** 32) throw new Error(`KVC_TEST_SEED must be a uint32, got ${env}`);
    seed = n;
  }
  console.log(`${file}: seed ${seed}${seed === DEFAULT_TEST_SEED ? ' (default)' : ''}; replay with KVC_TEST_SEED=${seed}`);
  return seed;
}
