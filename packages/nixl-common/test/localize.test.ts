/**
 * `LOCALIZE` (protocol 17, consumer key since 18; docs/localize.md): the request and answer codecs are strict, and the
 * lease table holds a done request's blocks for `localize_hold_ms` and while a `LOCALIZE` runs.
 */
import { describe, expect, it } from 'vitest';
import { NixlDecodeError, packr } from '../src/codec.js';
import { LeaseTable } from '../src/lease.js';
import { MSG, NIXL_PROTOCOL_VERSION, decodeLocalizeBody, decodeRequest, encodeLocalizeBody, encodeRequest } from '../src/protocol.js';

describe('LOCALIZE codec', () => {
  it('is protocol 19 (17 + consumer keys + lease capabilities), message type 6', () => {
    expect(NIXL_PROTOCOL_VERSION).toBe(19);
    expect(MSG.LOCALIZE).toBe(6);
  });

  it('request round-trips as [seq, 6, requestId, rangeTokens, [[groupId, tokenStart, tokenEnd]...], consumerKey, capability]', () => {
    const req = { type: 'localize' as const, requestId: 'r1', query: { rangeTokens: 16, groups: [{ groupId: 0, tokenStart: 16, tokenEnd: 40 }, { groupId: 2, tokenStart: 0, tokenEnd: 40 }] } };
    const bytes = encodeRequest(9, req);
    expect(packr.unpack(bytes)).toEqual([9, 6, 'r1', 16, [[0, 16, 40], [2, 0, 40]], null, null]);
    expect(decodeRequest(bytes)).toEqual({ seq: 9, req });
    const keyed = { ...req, consumerKey: 'ab'.repeat(16) };
    expect(packr.unpack(encodeRequest(9, keyed))).toEqual([9, 6, 'r1', 16, [[0, 16, 40], [2, 0, 40]], 'ab'.repeat(16), null]);
    expect(decodeRequest(encodeRequest(9, keyed))).toEqual({ seq: 9, req: keyed });
    const capable = { ...keyed, capability: 'cd'.repeat(32) };
    expect(packr.unpack(encodeRequest(9, capable))).toEqual([9, 6, 'r1', 16, [[0, 16, 40], [2, 0, 40]], 'ab'.repeat(16), 'cd'.repeat(32)]);
    expect(decodeRequest(encodeRequest(9, capable))).toEqual({ seq: 9, req: capable });
  });

  it('rejects malformed requests with NixlDecodeError', () => {
    for (const bad of [
      [1, 6, 'r1', 16, null, null],
      [1, 6, 'r1', 16, [], null],
      [1, 6, 'r1', 0, [], null, null],
      [1, 6, 'r1', 16, [[0, 20, 10]], null, null],
      [1, 6, 'r1', 16, [[0, 0, 16], [0, 16, 32]], null, null],
      [1, 6, '', 16, [], null, null],
      [1, 6, 'r1', 16, [[0, -1, 16]], null, null],
      [1, 6, 'r1', 16, [[0, 0]], null, null],
      [1, 6, 'r1', 1, [[0, 0, 1025]], null, null],
      [1, 6, 'r1', 16, [], 'AB'.repeat(16), null],
      [1, 6, 'r1', 16, [], 'ab'.repeat(15), null],
      [1, 6, 'r1', 16, [], 7, null],
      [1, 6, 'r1', 16, [], null, 'CD'.repeat(32)],
      [1, 6, 'r1', 16, [], null, 'cd'.repeat(31)],
      [1, 6, 'r1', 16, [], null, 5],
      [1, 6, 'r1', 16, [], null],
    ]) {
      expect(() => decodeRequest(packr.pack(bad)), JSON.stringify(bad)).toThrow(NixlDecodeError);
    }
  });

  it('answers round-trip: held with fine sums per group (values LE uint64), or gone', () => {
    const held = {
      status: 'held' as const,
      groups: [
        { groupId: 0, sums: [{ layer: 3, head: 4, part: 'V' as const, segment: -1, tokenStart: 32, tokenEnd: 48, replicas: 1, replica: 0, value: 0x0102030405060708n }] },
        { groupId: 1, sums: [], error: 'device memory' },
      ],
    };
    const wire = packr.unpack(packr.pack(encodeLocalizeBody(held))) as [number, Array<[number, number[][], Uint8Array, string | null]>];
    expect(wire[0]).toBe(0);
    expect(wire[1].map(([g, keys, , err]) => [g, keys, err])).toEqual([[0, [[3, 4, 1, 0, 32, 48, 1, 0]], null], [1, [], 'device memory']]);
    expect([...wire[1][0][2]]).toEqual([8, 7, 6, 5, 4, 3, 2, 1]);
    expect(decodeLocalizeBody(wire)).toEqual(held);
    expect(decodeLocalizeBody(packr.unpack(packr.pack(encodeLocalizeBody({ status: 'gone', detail: 'lease expired' }))))).toEqual({ status: 'gone', detail: 'lease expired' });
  });

  it('rejects malformed answers with NixlDecodeError', () => {
    for (const bad of [[2, []], [0], [0, [[0, [[3, 4, 1, 0, 32, 48, 1, 0]], new Uint8Array(7), null]]], [0, [[0, [[3, 4, 9, 0, 32, 48, 1, 0]], new Uint8Array(8), null]]], [0, [[0, [], new Uint8Array(0), null], [0, [], new Uint8Array(0), null]]]]) {
      expect(() => decodeLocalizeBody(bad), JSON.stringify(bad)).toThrow(NixlDecodeError);
    }
  });
});

describe('lease hold for LOCALIZE', () => {
  it('a done lease is reported only after localize_hold_ms, or at once after a RELEASE', () => {
    let now = 1000;
    const t = new LeaseTable({ leaseMs: 10_000, workers: 1, holdAfterDoneMs: 500, now: () => now });
    t.add('a');
    t.add('b');
    t.readerDone('a', 'c0', 1);
    t.readerDone('b', 'c0', 1);
    expect(t.take('0:0')).toEqual([]);
    expect(t.blocksHeld('a')).toBe(true);
    t.release('b');
    expect(t.take('0:0')).toEqual(['b']);
    now += 501;
    expect(t.take('0:0')).toEqual(['a']);
    expect(t.blocksHeld('a')).toBe(false);
  });

  it('without a hold a done lease is reported at once; a LOCALIZE in progress keeps it', () => {
    const t = new LeaseTable({ leaseMs: 10_000, workers: 1 });
    t.add('a');
    t.readerDone('a', 'c0', 1);
    t.localizing('a', 1);
    expect(t.take('0:0')).toEqual([]);
    t.localizing('a', -1);
    expect(t.take('0:0')).toEqual(['a']);
  });

  it('LOCALIZE requests kept in flight cannot pin a done lease past its hold: no new one is served after it (hostile trial)', () => {
    let now = 1000;
    const t = new LeaseTable({ leaseMs: 10_000, workers: 1, holdAfterDoneMs: 200, now: () => now });
    t.add('a');
    t.readerDone('a', 'c0', 1);
    t.localizing('a', 1); // a LOCALIZE runs across the end of the hold
    now += 201;
    expect(t.blocksHeld('a')).toBe(false); // the next LOCALIZE is answered gone
    expect(t.take('0:0')).toEqual([]); // the running one still reads the blocks
    t.localizing('a', -1);
    expect(t.take('0:0')).toEqual(['a']);
  });

  it('push: held until every producer worker wrote, then the hold', () => {
    let now = 0;
    const t = new LeaseTable({ leaseMs: 10_000, workers: 2, holdAfterDoneMs: 100, now: () => now });
    t.add('a');
    t.workerDone('a', '0:0');
    expect(t.take('0:0')).toEqual([]);
    t.workerDone('a', '0:1');
    now = 50;
    expect(t.take('0:0')).toEqual([]);
    now = 101;
    expect(t.take('0:0')).toEqual(['a']);
    expect(t.take('0:1')).toEqual(['a']);
  });
});
