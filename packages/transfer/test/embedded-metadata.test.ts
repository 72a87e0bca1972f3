/**
 * The embedded agent's metadata blob is versioned by its field set (embedded-metadata.ts module
 * comment): version 2 always has 9 fields (the shared mapping last, or nil); version 1 has 7 or
 * 8. A blob whose field count is not its version's is refused naming the version.
 */
import { Packr, Unpackr } from 'msgpackr';
import { afterEach, describe, expect, it } from 'vitest';
import { decodeEmbeddedMetadata, EmbeddedAgent, TransferError } from '../src/index.js';

const packr = new Packr({ useRecords: false, variableMapSize: true });
const unpackr = new Unpackr({ useRecords: false, int64AsType: 'number' });
const open: EmbeddedAgent[] = [];
afterEach(async () => {
  await Promise.all(open.splice(0).map((a) => a.close().catch(() => {})));
});

async function blob(): Promise<unknown[]> {
  const a = await EmbeddedAgent.create({ name: `md-${process.pid}-${open.length}` });
  open.push(a);
  await a.registerMemory([{ bytes: new Uint8Array(4096) }]);
  return unpackr.unpack(await a.getLocalMetadata()) as unknown[];
}
const pack = (v: unknown[]) => new Uint8Array(packr.pack(v));

describe('embedded agent metadata versions', () => {
  it('writes version 2 with 9 fields (no device, no shared mapping: nil, nil) and reads it back', async () => {
    const v = await blob();
    expect(v[1]).toBe(2);
    expect(v).toHaveLength(9);
    expect(v.slice(7)).toEqual([null, null]);
    const p = decodeEmbeddedMetadata(pack(v));
    expect(p.shm).toBeNull();
    expect(p.devices).toEqual([]);
  });

  it('refuses a version 1 blob carrying the 9th field (the shared mapping), naming version 1', async () => {
    const v = await blob();
    v[1] = 1;
    expect(() => decodeEmbeddedMetadata(pack(v))).toThrow(TransferError);
    expect(() => decodeEmbeddedMetadata(pack(v))).toThrow(/metadata version 1 has 7 or 8 fields, this blob 9/);
  });

  it('refuses a version 2 blob without the 9th field, naming version 2', async () => {
    const v = await blob();
    expect(() => decodeEmbeddedMetadata(pack(v.slice(0, 8)))).toThrow(/metadata version 2 has 9 fields, this blob 8/);
    expect(() => decodeEmbeddedMetadata(pack(v.slice(0, 7)))).toThrow(/metadata version 2 has 9 fields, this blob 7/);
  });

  it('reads a version 1 blob of 7 or 8 fields (an older peer), refuses an unknown version', async () => {
    const v = await blob();
    v[1] = 1;
    expect(decodeEmbeddedMetadata(pack(v.slice(0, 7))).shm).toBeNull();
    expect(decodeEmbeddedMetadata(pack(v.slice(0, 8))).devices).toEqual([]);
    v[1] = 3;
    expect(() => decodeEmbeddedMetadata(pack(v))).toThrow(/metadata version 3 is not one of 1, 2/);
  });
});
