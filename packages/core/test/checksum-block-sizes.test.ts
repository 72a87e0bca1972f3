/** `kvChecksumBlockSizes` / `subBlockSizeFits` (docs/checksum-extensions.md section 1). */
import { describe, expect, it } from 'vitest';
import { kvChecksumBlockSizes, subBlockSizeFits, type BlockSizeGroup } from '../src/index.js';

const g = (groupId: number, blockSize: number, kind: BlockSizeGroup['kind'] = 'full-attention'): BlockSizeGroup => ({ groupId, kind, blockSize });

describe('kvChecksumBlockSizes', () => {
  it('names attention groups whose producer block size is a larger multiple of the consumer\'s', () => {
    expect(kvChecksumBlockSizes([g(0, 64), g(1, 64, 'sliding-window')], [g(0, 16), g(1, 32, 'sliding-window')])).toEqual({ 0: 16, 1: 32 });
    // Equal, larger, not a multiple, state group, group missing on the consumer: nothing.
    expect(kvChecksumBlockSizes([g(0, 16)], [g(0, 16)])).toBeUndefined();
    expect(kvChecksumBlockSizes([g(0, 16)], [g(0, 64)])).toBeUndefined();
    expect(kvChecksumBlockSizes([g(0, 48)], [g(0, 32)])).toBeUndefined();
    expect(kvChecksumBlockSizes([g(0, 64), g(1, 64, 'state')], [g(0, 64), g(1, 16, 'state')])).toBeUndefined();
    expect(kvChecksumBlockSizes([g(0, 64), g(1, 64)], [g(0, 64)])).toBeUndefined();
    expect(kvChecksumBlockSizes([g(0, 64), g(1, 64)], [g(1, 16)])).toEqual({ 1: 16 });
  });

  it('subBlockSizeFits rejects non-integers and non-positive sizes', () => {
    expect(subBlockSizeFits(64, 16)).toBe(true);
    for (const s of [0, -16, 16.5, '16', null, undefined, 64, 128, Number.NaN]) expect(subBlockSizeFits(64, s)).toBe(false);
  });
});
