/**
 * Deterministic pseudo-random numbers for seeded weights and per-request sampling (no global state).
 * @module
 */

/** A seeded 32-bit PRNG (mulberry32): `next()` in [0, 1), reproducible from its seed. */
export class SeededRng {
  private s: number;
  constructor(seed: number) {
    this.s = (Math.trunc(seed) ^ 0x6d2b79f5) >>> 0;
  }
  /** The next uint32. */
  u32(): number {
    this.s = (this.s + 0x6d2b79f5) >>> 0;
    let t = this.s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return (t ^ (t >>> 14)) >>> 0;
  }
  /** Uniform in [0, 1). */
  next(): number {
    return this.u32() / 4294967296;
  }
  /** Standard normal (Box-Muller). */
  normal(): number {
    const u = Math.max(this.next(), 1e-12);
    const v = this.next();
    return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * v);
  }
}
