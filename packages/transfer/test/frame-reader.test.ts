/**
 * The FrameReader fed from one reused read buffer (as the embedded agent's outgoing connections
 * read, `onread` in embedded-conn.ts): with `copyRetained()` after each push, frames split at any
 * byte decode the same as from fresh buffers, even though the buffer is overwritten between reads.
 */
import { describe, expect, it } from 'vitest';
import { encodeFrame, F, FrameReader, type Header } from '../src/wire.js';
import { pattern } from './patterns.js';

function stream(): { bytes: Buffer; frames: Array<{ id: number; payload: Buffer }> } {
  const frames = Array.from({ length: 40 }, (_, i) => ({ id: i + 1, payload: Buffer.from(pattern(1 + ((i * 977) % 3001), i)) }));
  const parts: Buffer[] = [];
  for (const f of frames) parts.push(encodeFrame([F.RDATA, f.id], f.payload.length), f.payload);
  return { bytes: Buffer.concat(parts), frames };
}

function readAll(bytes: Buffer, readSize: number, copyRetained: boolean): Array<{ id: number; payload: Buffer }> | string {
  const got: Array<{ id: number; payload: Buffer }> = [];
  let err: string | null = null;
  const reader = new FrameReader({
    onHeader: (h: Header, n: number) => {
      const parts: Buffer[] = [];
      return { write: (c: Buffer) => void parts.push(Buffer.from(c)), end: () => void got.push({ id: (h as { id: number }).id, payload: Buffer.concat(parts, n) }) };
    },
    onProtocolError: (m) => void (err = m),
  });
  const reused = Buffer.alloc(readSize);
  for (let off = 0; off < bytes.length && err === null; off += readSize) {
    const n = Math.min(readSize, bytes.length - off);
    reused.fill(0xee); // what the next read leaves in the buffer's unused part
    bytes.copy(reused, 0, off, off + n);
    reader.push(reused.subarray(0, n));
    if (copyRetained) reader.copyRetained();
  }
  return err ?? got;
}

describe('FrameReader over one reused read buffer', () => {
  const { bytes, frames } = stream();
  for (const readSize of [1, 5, 13, 64, 1000, 4096]) {
    it(`decodes every frame read ${readSize} bytes at a time`, () => {
      const got = readAll(bytes, readSize, true);
      expect(typeof got).not.toBe('string');
      expect((got as typeof frames).map((f) => f.id)).toEqual(frames.map((f) => f.id));
      (got as typeof frames).forEach((f, i) => expect(Buffer.compare(f.payload, frames[i]!.payload)).toBe(0));
    });
  }
  it('without copyRetained the reused buffer corrupts retained bytes (why it exists)', () => {
    const got = readAll(bytes, 5, false);
    const ok = typeof got !== 'string' && got.length === frames.length && got.every((f, i) => f.id === frames[i]!.id && Buffer.compare(f.payload, frames[i]!.payload) === 0);
    expect(ok).toBe(false);
  });
});
