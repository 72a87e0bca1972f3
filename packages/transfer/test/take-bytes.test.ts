import { describe, expect, it } from 'vitest';
import { takeBytes } from '../src/wire.js';

describe('takeBytes (frame readers of the embedded agent and the NIXL side channel)', () => {
  it('returns a view inside the first chunk, one copy across chunks, and leaves the rest queued', () => {
    const a = Buffer.from([1, 2, 3]);
    const chunks = [a, Buffer.from([4, 5]), Buffer.from([6, 7, 8])];
    const v = takeBytes(chunks, 2);
    expect([...v]).toEqual([1, 2]);
    expect(v.buffer).toBe(a.buffer); // a view, no copy
    expect([...takeBytes(chunks, 4)]).toEqual([3, 4, 5, 6]); // across three chunks
    expect(chunks.map((c) => [...c])).toEqual([[7, 8]]);
    expect([...takeBytes(chunks, 2)]).toEqual([7, 8]);
    expect(chunks).toEqual([]);
  });
});
