import { Packr } from 'msgpackr';
import { describe, expect, it } from 'vitest';
import { decodeRequest } from '@kvconnect/nixl-common';
import { decodeLocalizeRequest } from '@kvconnect/mooncake';

const packr = new Packr({ useRecords: false, mapsAsObjects: false, moreTypes: false } as never);
const GOOD = 'ab'.repeat(32);
const BAD: unknown[] = ['AB'.repeat(32), 'ab'.repeat(31), 'ab'.repeat(33), 'g'.repeat(64), 'x'.repeat(1 << 20), 1, 1.5, true, [GOOD], { a: GOOD }, new Map([['__proto__', GOOD]]), new Uint8Array(32), 'ab'.repeat(31) + 'a\u0161', ' ' + 'a'.repeat(63), 'a'.repeat(63) + '\n'];

function thrown(f: () => unknown): string {
  try { f(); } catch (e) { return `${(e as Error).name}: ${(e as Error).message}`; }
  return 'no throw';
}

describe('hostile: malformed capabilities in NIXL requests', () => {
  for (const [i, bad] of BAD.entries()) {
    it(`case ${i}`, () => {
      const frames = [
        [1, 2, ['r1'], 0, null, [bad]],
        [1, 2, ['r1', 'r2'], 0, null, [GOOD, bad]],
        [1, 3, ['r1'], null, [bad]],
        [1, 6, 'r1', 16, [[0, 0, 16]], null, bad],
        ...(Array.isArray(bad) ? [] : [[1, 2, ['r1'], 0, null, bad]]),
      ];
      for (const f of frames) {
        const m = thrown(() => decodeRequest(packr.pack(f)));
        expect(m).not.toBe('no throw');
        expect(m.startsWith('NixlDecodeError')).toBe(true);
        if (typeof bad === 'string' && bad.length > 8) expect(m).not.toContain(bad.slice(0, 16));
        expect(m).not.toContain(GOOD);
      }
    });
  }
  it('capabilities count not matching ids', () => {
    for (const caps of [[], [GOOD, GOOD], [null, null, null]]) expect(thrown(() => decodeRequest(packr.pack([1, 2, ['r1', 'r2'].slice(0, 1 + (caps.length === 0 ? 0 : 0)), 0, null, caps])))).toMatch(/NixlDecodeError/);
  });
});

describe('hostile: malformed capabilities in Mooncake loc', () => {
  it('every malformed value is a MooncakeProtocolError that does not echo it', () => {
    const mp = new Packr({ useRecords: false, mapsAsObjects: false, moreTypes: false } as never);
    for (const bad of BAD) {
      const m = thrown(() => decodeLocalizeRequest(mp.pack(new Map<string, unknown>([['transfer_id', 't'], ['range_tokens', 16], ['groups', [[0, 0, 16]]], ['lease_capability', bad]]))));
      expect(m, String(bad).slice(0, 20)).toMatch(/^MooncakeProtocolError/);
      if (typeof bad === 'string' && bad.length > 8) expect(m).not.toContain(bad.slice(0, 16));
    }
  });
});
