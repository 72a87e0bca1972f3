/**
 * The FrameReader fed from one reused read buffer (as the embedded agent's outgoing connections
 * read, `onread` in embedded-conn.ts): with `copyRetained()` after each push, frames split at any
 * byte decode the same as from fresh buffers, even though the buffer is overwritten between reads;
 * and payload bytes read in place (directTarget / pushDirect, SocketReads in embedded-conn.ts).
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

describe('FrameReader with reads in place (directTarget / pushDirect)', () => {
  it('offers the rest of the current segment only while nothing is buffered, and lands bytes read into it', () => {
    const segs = [new Uint8Array(100), new Uint8Array(50)];
    const src = pattern(150, 61);
    let seg = 0;
    let off = 0;
    let ended = 0;
    const reader = new FrameReader({
      onHeader: () => ({
        direct: () => ({ seg: segs[seg]!, off }),
        advance: (n: number) => {
          off += n;
          if (off === segs[seg]!.length) (seg++, (off = 0));
        },
        write: (c: Buffer) => {
          for (const b of c) {
            segs[seg]![off++] = b;
            if (off === segs[seg]!.length) (seg++, (off = 0));
          }
        },
        end: () => void ended++,
      }),
      onProtocolError: (m) => {
        throw new Error(m);
      },
    });
    expect(reader.directTarget()).toBeNull(); // between frames
    const head = Buffer.concat([encodeFrame([F.RDATA, 1], 150), Buffer.from(src.subarray(0, 30))]);
    reader.push(head.subarray(0, head.length - 1)); // the 30th payload byte still missing
    expect(reader.directTarget()?.off).toBe(29);
    reader.push(head.subarray(head.length - 1));
    const t = reader.directTarget()!;
    expect([t.seg === segs[0], t.off]).toEqual([true, 30]);
    // A socket read of 60 bytes into the rest of segment 0 (it holds 70 more).
    t.seg.set(src.subarray(30, 90), t.off);
    reader.pushDirect(60);
    expect(reader.directTarget()?.off).toBe(90);
    // Bytes that come through a buffer instead land through write() and move the offer on.
    reader.push(Buffer.from(src.subarray(90, 100)));
    const t2 = reader.directTarget()!;
    expect([t2.seg === segs[1], t2.off]).toEqual([true, 0]);
    t2.seg.set(src.subarray(100, 150));
    reader.pushDirect(50);
    expect(ended).toBe(1);
    expect(Buffer.concat([segs[0]!, segs[1]!])).toEqual(Buffer.from(src));
    expect(reader.directTarget()).toBeNull();
    expect(reader.payloadBeforeNext).toBe(150);
  });

  it('fails the connection when more bytes are reported in place than were offered', () => {
    const errors: string[] = [];
    const seg = new Uint8Array(100);
    const reader = new FrameReader({
      onHeader: () => ({ direct: () => ({ seg, off: 0 }), advance: () => {}, write: () => {}, end: () => {} }),
      onProtocolError: (m) => void errors.push(m),
    });
    reader.push(encodeFrame([F.RDATA, 1], 300));
    expect(reader.directTarget()?.seg).toBe(seg);
    reader.pushDirect(101);
    expect(errors).toEqual(['101 bytes read in place where 100 were offered']);
    expect(reader.directTarget()).toBeNull();
  });
});
