/**
 * The shared strict field decoders (`strict-decode.ts`): each accepts what is in range and reports
 * everything else through the caller's `fail` (its typed error), with the field path and what was
 * there (packages/mooncake/test/protocol.test.ts checks that nixl-common and the Mooncake side
 * channel both report through them).
 */
import { describe, expect, it } from 'vitest';
import { describeValue, strictDecoders } from '../src/index.js';

class TestDecodeError extends Error {
  constructor(readonly path: string, readonly detail: string) {
    super(`${path}: ${detail}`);
  }
}
const d = strictDecoders((path, detail) => {
  throw new TestDecodeError(path, detail);
});
const bad = (f: () => unknown, detail: RegExp) => {
  try {
    f();
  } catch (e) {
    expect(e).toBeInstanceOf(TestDecodeError);
    expect((e as TestDecodeError).path).toBe('f');
    expect((e as TestDecodeError).detail).toMatch(detail);
    return;
  }
  throw new Error('expected a TestDecodeError');
};

describe('strictDecoders', () => {
  it('nat / pos: safe integers in range', () => {
    expect(d.nat(0, 'f')).toBe(0);
    expect(d.nat(7, 'f', 7)).toBe(7);
    expect(d.pos(1, 'f')).toBe(1);
    bad(() => d.nat(8, 'f', 7), /^8 exceeds 7$/);
    bad(() => d.nat(-1, 'f'), /expected a non-negative integer, got number -1/);
    bad(() => d.nat(1.5, 'f'), /got number 1.5/);
    bad(() => d.nat(2 ** 53, 'f'), /expected a non-negative integer/);
    bad(() => d.nat('1', 'f'), /got string/);
    bad(() => d.pos(0, 'f'), /expected an integer >= 1/);
  });
  it('str: length bounds in code units; empty refused unless min 0', () => {
    expect(d.str('ab', 'f', 2)).toBe('ab');
    expect(d.str('', 'f', 2, 0)).toBe('');
    bad(() => d.str('', 'f', 2), /must not be empty/);
    bad(() => d.str('abc', 'f', 2), /longer than 2 characters/);
    bad(() => d.str(null, 'f', 2), /expected a string, got null/);
  });
  it('bin: at most max bytes, copied out of the buffer', () => {
    const src = new Uint8Array([1, 2, 3]);
    const b = d.bin(src, 'f', 3);
    src[0] = 9;
    expect([...b]).toEqual([1, 2, 3]);
    bad(() => d.bin(new Uint8Array(4), 'f', 3), /4 bytes exceed the limit of 3/);
    bad(() => d.bin([1], 'f', 3), /expected a bin, got array/);
  });
  it('arr / strMap / bool / oneOf', () => {
    expect(d.arr([1, 2], 'f', 2, 1)).toEqual([1, 2]);
    bad(() => d.arr([1, 2, 3], 'f', 2), /more than 2 entries/);
    bad(() => d.arr([], 'f', 2, 1), /fewer than 1 entries/);
    bad(() => d.arr(new Map(), 'f', 2), /expected an array, got map/);
    expect(d.strMap(new Map([['k', 1]]), 'f', 1, 4).get('k')).toBe(1);
    bad(() => d.strMap(new Map([['a', 1], ['b', 2]]), 'f', 1, 4), /more than 1 entries/);
    bad(() => d.strMap({ a: 1 }, 'f', 1, 4), /expected a map, got object/);
    expect(() => d.strMap(new Map([[5, 1]]), 'f', 1, 4)).toThrow(/^f key: expected a string, got number 5$/);
    expect(d.bool(false, 'f')).toBe(false);
    bad(() => d.bool(0, 'f'), /expected a boolean, got number 0/);
    expect(d.oneOf('DRAM', 'f', ['DRAM', 'VRAM'])).toBe('DRAM');
    bad(() => d.oneOf('HBM', 'f', ['DRAM', 'VRAM']), /expected one of DRAM, VRAM, got "HBM"/);
    expect(describeValue(new Uint8Array(1))).toBe('bin');
  });
});
