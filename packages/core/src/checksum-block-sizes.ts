/**
 * The value of `kv_transfer_params.kv_checksum_block_sizes` (docs/checksum-extensions.md section 1)
 * that whoever routes a request (the P/D proxy, a router) puts in the producer's request once it
 * knows the consumer: for each attention KV cache group whose producer block size is a larger
 * multiple of the consumer's, the consumer's block size. The producer then also sends sub-block
 * values for that group, so a consumer prefix hit that ends inside a producer block is verified.
 * @module
 */
import type { KVCacheGroupConfig } from './connector.js';

/** The fields of a KV cache group this module reads. */
export type BlockSizeGroup = Pick<KVCacheGroupConfig, 'groupId' | 'kind' | 'blockSize'>;

/**
 * True when a producer group of `producerBlockSize` tokens per block can send sub-block values of
 * `consumerBlockSize` tokens (docs/checksum-extensions.md section 1: `S < Bp` and `Bp mod S == 0`,
 * `S` a positive integer). Equal sizes need nothing (false).
 */
export function subBlockSizeFits(producerBlockSize: number, consumerBlockSize: unknown): consumerBlockSize is number {
  return (
    typeof consumerBlockSize === 'number' &&
    Number.isSafeInteger(consumerBlockSize) &&
    consumerBlockSize > 0 &&
    consumerBlockSize < producerBlockSize &&
    producerBlockSize % consumerBlockSize === 0
  );
}

/**
 * The `kv_checksum_block_sizes` object (group id in decimal text -> the consumer's block size in
 * tokens) for a producer with KV cache groups `producer` and a consumer with `consumer` (groups
 * matched by `groupId`; state groups and groups of either side's kind `state` are left out), or
 * `undefined` when no group needs sub-block values (every size equal, or not a multiple).
 */
export function kvChecksumBlockSizes(producer: readonly BlockSizeGroup[], consumer: readonly BlockSizeGroup[]): Record<string, number> | undefined {
  const out: Record<string, number> = {};
  let any = false;
  for (const p of producer) {
    if (p.kind === 'state') continue;
    const d = consumer.find((c) => c.groupId === p.groupId);
    if (!d || d.kind === 'state' || !subBlockSizeFits(p.blockSize, d.blockSize)) continue;
    out[String(p.groupId)] = d.blockSize;
    any = true;
  }
  return any ? out : undefined;
}
