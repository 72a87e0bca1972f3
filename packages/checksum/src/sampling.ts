/**
 * Sampled checking (docs/checksum-extensions.md section 2): with `kv_checksum_sample_rate` r < 1,
 * producer and consumer sum, and the consumer compares, only the blocks of each request that lie
 * in **sampled spans**. The choice is the same on both sides without any exchange: it depends on
 * the cluster secret, the request's prompt tokens, the KV cache group id and the logical token
 * position only (never block ids, block sizes or layouts), so a peer without the secret cannot
 * predict which blocks go unchecked.
 *
 * - A **span** is {@link SAMPLE_SPAN_TOKENS} consecutive request positions: span `u` holds
 *   positions `[u*256, (u+1)*256)`. A state group (SPEC 3) has one span, `u = 0`.
 * - The **threshold** `T` is the rate in units of 2^-32: `T = round(r * 2^32)`, clamped to
 *   `[1, 2^32]` ({@link sampleThreshold}); `T = 2^32` means every span.
 * - The **request key** is the SPEC 6.1 token digest of the whole prompt ({@link tokenDigest} over
 *   every prompt token id).
 * - Span `u` of group `g` is sampled iff `h < T`, where `h` is the first 4 bytes, read big-endian,
 *   of `HMAC-SHA256(secret, "kvconnect-kv-checksum-sample-v1" 0x00 || LE u64 requestKey || LE u32 g
 *   || LE u64 u)`.
 * - A block (of either side, any block size B) is **summed** iff one of the spans its token
 *   positions `[p*B, (p+1)*B)` overlap is sampled ({@link BlockSampler.blockSampled}).
 *
 * Sampled sets are monotone in `T` (a span sampled at `T` is sampled at every larger `T`), which
 * is what lets a consumer check a producer that samples at a rate at least its own.
 * @module
 */
import { createHmac } from 'node:crypto';

/** Tokens per sampling span. Every block size up to 256 that divides 256 lies inside one span. */
export const SAMPLE_SPAN_TOKENS = 256;

/** The threshold of rate 1 (every span sampled): 2^32. */
export const SAMPLE_THRESHOLD_ALL = 2 ** 32;

const LABEL = Buffer.from('kvconnect-kv-checksum-sample-v1\0', 'latin1');

/**
 * The sample threshold of a rate: `round(rate * 2^32)` clamped to `[1, 2^32]`.
 * @param rate - `kv_checksum_sample_rate`, in (0, 1].
 * @throws RangeError unless `rate` is a finite number with `0 < rate <= 1`.
 */
export function sampleThreshold(rate: number): number {
  if (typeof rate !== 'number' || !Number.isFinite(rate) || !(rate > 0 && rate <= 1)) {
    throw new RangeError(`kv_checksum_sample_rate must be a number in (0, 1], got ${String(rate)}`);
  }
  return Math.min(SAMPLE_THRESHOLD_ALL, Math.max(1, Math.round(rate * SAMPLE_THRESHOLD_ALL)));
}

/** The rate a threshold stands for: `threshold / 2^32`. */
export function sampleRateOf(threshold: number): number {
  return threshold / SAMPLE_THRESHOLD_ALL;
}

/**
 * The sampled spans of one request (see the module comment for the exact rule). Memoizes each
 * span's HMAC, so a request costs one HMAC per (group, span) it touches.
 */
export class BlockSampler {
  private readonly memo = new Map<string, number>();

  /**
   * @param secret - the cluster secret's bytes (transfer `resolveClusterSecret`).
   * @param requestKey - the request key: the token digest of the whole prompt (uint64).
   * @param threshold - {@link sampleThreshold} of the side's rate.
   * @throws RangeError for an empty secret, a request key outside [0, 2^64) or a threshold outside `[1, 2^32]`.
   */
  constructor(
    private readonly secret: Uint8Array,
    readonly requestKey: bigint,
    readonly threshold: number,
  ) {
    if (!(secret instanceof Uint8Array) || secret.length === 0) throw new RangeError('sampling needs the cluster secret');
    if (typeof requestKey !== 'bigint' || requestKey < 0n || requestKey >= 1n << 64n) throw new RangeError('request key must be a uint64');
    if (!(Number.isSafeInteger(threshold) && threshold >= 1 && threshold <= SAMPLE_THRESHOLD_ALL)) throw new RangeError(`sample threshold ${threshold} outside [1, 2^32]`);
  }

  /** `h` of span `span` of group `groupId`: the HMAC's first 4 bytes, big-endian (uint32). */
  spanHash(groupId: number, span: number): number {
    const k = `${groupId}:${span}`;
    let h = this.memo.get(k);
    if (h === undefined) {
      const msg = Buffer.alloc(20);
      msg.writeBigUInt64LE(this.requestKey, 0);
      msg.writeUInt32LE(groupId >>> 0, 8);
      msg.writeBigUInt64LE(BigInt(span), 12);
      h = createHmac('sha256', this.secret).update(LABEL).update(msg).digest().readUInt32BE(0);
      this.memo.set(k, h);
    }
    return h;
  }

  /** True when span `span` of `groupId` is sampled at `threshold` (default this sampler's). */
  spanSampled(groupId: number, span: number, threshold: number = this.threshold): boolean {
    return threshold >= SAMPLE_THRESHOLD_ALL || this.spanHash(groupId, span) < threshold;
  }

  /**
   * True when block `position` of a group with block size `blockSize` (tokens; 0 for a state
   * group, which has the one span 0) overlaps a sampled span, i.e. is summed.
   */
  blockSampled(groupId: number, blockSize: number, position: number, threshold: number = this.threshold): boolean {
    if (threshold >= SAMPLE_THRESHOLD_ALL) return true;
    if (!(blockSize > 0)) return this.spanSampled(groupId, 0, threshold);
    const first = Math.floor((position * blockSize) / SAMPLE_SPAN_TOKENS);
    const last = Math.floor(((position + 1) * blockSize - 1) / SAMPLE_SPAN_TOKENS);
    for (let u = first; u <= last; u++) if (this.spanSampled(groupId, u, threshold)) return true;
    return false;
  }
}
