import { readFileSync } from 'node:fs';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  MAX_PAYLOAD_BYTES,
  MAX_PAYLOAD_GROUPS,
  PAYLOAD_VERSION,
  PAYLOAD_VERSIONS,
  PayloadError,
  type PayloadErrorReason,
  decodePayload,
  decodePayloadBase64,
  encodePayload,
  encodePayloadBase64,
  tokenDigest,
} from '../src/payload.js';
import type { ChecksumPayload, PayloadGroup } from '../src/types.js';

// The conformance vectors (SPEC 6). Reading them at load time makes this file fail, not skip,
// when they are missing.
const VECTORS_URL = new URL('../../../../shared/vectors/checksum-v1.json', import.meta.url);

/** A payload as the vectors write it: uint64 fields as decimal strings. */
interface PlainPayload {
  numTokens: number;
  producerTpSize: number;
  groups: Array<{ groupId: number; fingerprint: string; blockSize: number; start: number; values: string[] }>;
}
interface Vectors {
  payload: Array<PlainPayload & { hex: string; base64: string }>;
  payloadAccepts: Array<PlainPayload & { why: string; hex: string }>;
  payloadRejects: Array<{ why: string; hex: string }>;
}
const vectors = JSON.parse(readFileSync(VECTORS_URL, 'utf8')) as Vectors;

function fromPlain(p: PlainPayload): ChecksumPayload {
  return {
    numTokens: p.numTokens,
    producerTpSize: p.producerTpSize,
    groups: p.groups.map((g) => ({
      groupId: g.groupId,
      fingerprint: BigInt(g.fingerprint),
      blockSize: g.blockSize,
      start: g.start,
      values: BigUint64Array.from(g.values, BigInt),
    })),
  };
}

function toPlain(p: ChecksumPayload): PlainPayload {
  return {
    numTokens: p.numTokens,
    producerTpSize: p.producerTpSize,
    groups: p.groups.map((g) => ({
      groupId: g.groupId,
      fingerprint: g.fingerprint.toString(),
      blockSize: g.blockSize,
      start: g.start,
      values: Array.from(g.values, String),
    })),
  };
}

const fields = ({ numTokens, producerTpSize, groups }: PlainPayload): PlainPayload => ({
  numTokens,
  producerTpSize,
  groups,
});
const hex = (b: Uint8Array): string => Buffer.from(b).toString('hex');
const unhex = (s: string): Uint8Array => new Uint8Array(Buffer.from(s.replace(/\s+/g, ''), 'hex'));

/** The error `fn` throws; fails unless it is a PayloadError. */
function payloadError(fn: () => unknown): PayloadError {
  try {
    fn();
  } catch (e) {
    expect(e).toBeInstanceOf(PayloadError);
    return e as PayloadError;
  }
  throw new Error('expected a PayloadError, but nothing was thrown');
}
const reasonOf = (bytes: Uint8Array): PayloadErrorReason => payloadError(() => decodePayload(bytes)).reason;

/** The reason each reject vector must give, by its `why`. */
const REJECT_REASONS: Record<string, PayloadErrorReason> = {
  'version 2 with a version-1 body (arity 3; SPEC 6.1)': 'arity',
  'trailing byte': 'trailing-bytes',
  truncated: 'truncated',
  'values length not a multiple of 8': 'values-length',
  'negative number': 'negative',
  'map instead of array': 'type',
  'deeply nested arrays (stresses recursive generic decoders)': 'arity',
  'producer TP size 0': 'tp-size-zero',
  'string where an integer is expected': 'type',
  'float where an integer is expected': 'type',
  'nil where an integer is expected': 'type',
  'group with 4 fields': 'arity',
  'duplicate group id': 'duplicate-group',
  'block size 0': 'block-size-zero',
  'str where bin is expected': 'type',
  '4097 groups': 'too-many-groups',
};

/** A valid one-group payload with the given group fields (hex), for targeted decoder tests. */
const oneGroup = (groupHex: string): Uint8Array => unhex(`92 01 93 28 01 91 ${groupHex}`);

describe('conformance vectors (SPEC 6)', () => {
  it('has payload, payloadAccepts and payloadRejects vectors', () => {
    expect(vectors.payload.length).toBeGreaterThan(0);
    expect(vectors.payloadAccepts.length).toBeGreaterThan(0);
    expect(vectors.payloadRejects.length).toBeGreaterThan(0);
  });

  describe.each(vectors.payload.map((v, i) => [i, v] as const))('payload[%i]', (_i, v) => {
    it('encodes to its hex and base64', () => {
      const p = fromPlain(v);
      expect(hex(encodePayload(p))).toBe(v.hex);
      expect(encodePayloadBase64(p)).toBe(v.base64);
    });
    it('decodes back from its hex and base64', () => {
      expect(toPlain(decodePayload(unhex(v.hex)))).toEqual(fields(v));
      expect(toPlain(decodePayloadBase64(v.base64))).toEqual(fields(v));
    });
  });

  it.each(vectors.payloadAccepts.map((v) => [v.why, v] as const))('accepts %s', (_why, v) => {
    expect(toPlain(decodePayload(unhex(v.hex)))).toEqual(fields(v));
  });

  it.each(vectors.payloadRejects.map((v) => [v.why, v] as const))('rejects %s', (why, v) => {
    const reason = reasonOf(unhex(v.hex));
    if (why in REJECT_REASONS) expect(reason).toBe(REJECT_REASONS[why]);
  });

  it('knows the reason of every reject vector', () => {
    expect(vectors.payloadRejects.map((v) => v.why).filter((w) => !(w in REJECT_REASONS))).toEqual([]);
  });
});

describe('encodePayload', () => {
  const base = (over: Partial<ChecksumPayload> = {}, g: Partial<PayloadGroup> = {}): ChecksumPayload => ({
    numTokens: 40,
    producerTpSize: 1,
    groups: [{ groupId: 0, fingerprint: 1n, blockSize: 16, start: 0, values: new BigUint64Array([7n]), ...g }],
    ...over,
  });

  it.each([
    [0, '00'],
    [127, '7f'],
    [128, 'cc80'],
    [255, 'ccff'],
    [256, 'cd0100'],
    [65535, 'cdffff'],
    [65536, 'ce00010000'],
    [2 ** 32 - 1, 'ceffffffff'],
    [2 ** 32, 'cf0000000100000000'],
    [Number.MAX_SAFE_INTEGER, 'cf001fffffffffffff'],
  ])('writes %d in its minimal integer form %s', (n, form) => {
    const bytes = encodePayload({ numTokens: n, producerTpSize: 1, groups: [] });
    expect(hex(bytes)).toBe(`920193${form}0190`);
    expect(decodePayload(bytes).numTokens).toBe(n);
  });

  it.each([
    [0n, '00'],
    [4294967295n, 'ceffffffff'],
    [4294967296n, 'cf0000000100000000'],
    [(1n << 64n) - 1n, 'cfffffffffffffffff'],
  ])('writes fingerprint %s in its minimal form %s', (fp, form) => {
    const bytes = encodePayload(base({}, { fingerprint: fp, values: new BigUint64Array(0) }));
    expect(hex(bytes)).toBe(`92019328019195 00 ${form} 10 00 c400`.replace(/ /g, ''));
    expect(decodePayload(bytes).groups[0].fingerprint).toBe(fp);
  });

  it.each([
    [15, '9f'],
    [16, 'dc0010'],
    [MAX_PAYLOAD_GROUPS, 'dc1000'],
  ])('writes %d groups with header %s', (n, header) => {
    const groups = Array.from({ length: n }, (_, i) => ({
      groupId: i,
      fingerprint: 1n,
      blockSize: 16,
      start: 0,
      values: new BigUint64Array(0),
    }));
    const bytes = encodePayload({ numTokens: 40, producerTpSize: 1, groups });
    expect(hex(bytes.subarray(0, 5 + header.length / 2))).toBe(`9201932801${header}`);
    expect(decodePayload(bytes).groups).toHaveLength(n);
  });

  it.each([
    [0, 'c400'],
    [31, 'c4f8'],
    [32, 'c50100'],
    [8191, 'c5fff8'],
    [8192, 'c600010000'],
  ])('writes %d values with bin header %s, LE', (n, header) => {
    const values = BigUint64Array.from({ length: n }, (_, i) => BigInt(i) * 0x0102030405060708n);
    const bytes = encodePayload(base({}, { values }));
    const at = bytes.length - 8 * n - header.length / 2;
    expect(hex(bytes.subarray(at, at + header.length / 2))).toBe(header);
    const second = at + header.length / 2 + 8; // values[1] = 0x0102030405060708
    if (n > 1) expect(hex(bytes.subarray(second, second + 8))).toBe('0807060504030201');
    expect(decodePayload(bytes).groups[0].values).toEqual(values);
  });

  it('encodes values from a view at an offset into a larger buffer', () => {
    const all = new BigUint64Array([1n, 2n, 3n, 4n]);
    const bytes = encodePayload(base({}, { values: all.subarray(1, 3) }));
    expect(Array.from(decodePayload(bytes).groups[0].values)).toEqual([2n, 3n]);
  });

  it('returns a plain Uint8Array of exactly the payload', () => {
    const bytes = encodePayload(base());
    expect(Object.getPrototypeOf(bytes)).toBe(Uint8Array.prototype);
    expect(bytes.byteOffset).toBe(0);
    expect(bytes.buffer.byteLength).toBe(bytes.length);
  });

  it.each<[string, ChecksumPayload]>([
    ['negative numTokens', base({ numTokens: -1 })],
    ['fractional numTokens', base({ numTokens: 1.5 })],
    ['NaN numTokens', base({ numTokens: Number.NaN })],
    ['numTokens above MAX_SAFE_INTEGER', base({ numTokens: Number.MAX_SAFE_INTEGER + 1 })],
    ['producerTpSize 0', base({ producerTpSize: 0 })],
    ['negative groupId', base({}, { groupId: -1 })],
    ['blockSize 0', base({}, { blockSize: 0 })],
    ['negative start', base({}, { start: -3 })],
    ['negative fingerprint', base({}, { fingerprint: -1n })],
    ['fingerprint 2^64', base({}, { fingerprint: 1n << 64n })],
    ['a repeated groupId', { numTokens: 1, producerTpSize: 1, groups: [...base().groups, ...base().groups] }],
    ['4097 groups', base({ groups: Array.from({ length: 4097 }, (_, i) => ({ ...base().groups[0], groupId: i })) })],
  ])('throws RangeError for %s', (_what, p) => {
    expect(() => encodePayload(p)).toThrow(RangeError);
  });

  it.each<[string, unknown]>([
    ['a string numTokens', base({ numTokens: '40' as unknown as number })],
    ['a number fingerprint', base({}, { fingerprint: 1 as unknown as bigint })],
    ['values as a plain array', base({}, { values: [1n] as unknown as BigUint64Array })],
    ['values as a Uint8Array', base({}, { values: new Uint8Array(8) as unknown as BigUint64Array })],
    ['groups not an array', base({ groups: {} as unknown as PayloadGroup[] })],
  ])('throws TypeError for %s', (_what, p) => {
    expect(() => encodePayload(p as ChecksumPayload)).toThrow(TypeError);
  });

  it('encodes exactly MAX_PAYLOAD_BYTES and refuses one value more', () => {
    // 92 01 93 28 01 91 95 00 01 10 00 c6 <len32> = 16 header bytes.
    const n = (MAX_PAYLOAD_BYTES - 16) / 8;
    const bytes = encodePayload(base({}, { values: new BigUint64Array(n) }));
    expect(bytes.length).toBe(MAX_PAYLOAD_BYTES);
    expect(decodePayload(bytes).groups[0].values.length).toBe(n);
    expect(() => encodePayload(base({}, { values: new BigUint64Array(n + 1) }))).toThrow(RangeError);
  });
});

describe('decodePayload', () => {
  it('exports the SPEC constants', () => {
    expect([PAYLOAD_VERSION, MAX_PAYLOAD_BYTES, MAX_PAYLOAD_GROUPS]).toEqual([2, 16 * 1024 * 1024, 4096]);
    expect(PAYLOAD_VERSIONS).toEqual([1, 2]);
  });

  it('returns values that own aligned memory, copied from an unaligned input', () => {
    const payload = oneGroup('95 00 01 10 00 c410 0100000000000000 ffffffffffffffff');
    const backing = new Uint8Array(payload.length + 3);
    backing.set(payload, 3); // odd offset: a BigUint64Array view over it is impossible
    const input = backing.subarray(3);
    const { values } = decodePayload(input).groups[0];
    expect(values).toBeInstanceOf(BigUint64Array);
    expect(Array.from(values)).toEqual([1n, (1n << 64n) - 1n]);
    expect(values.byteOffset).toBe(0);
    expect(values.buffer.byteLength).toBe(16);
    backing.fill(0);
    expect(Array.from(values)).toEqual([1n, (1n << 64n) - 1n]);
  });

  it('does not alias a pooled Node Buffer', () => {
    const bytes = Buffer.from(vectors.payload[0].hex, 'hex'); // small Buffers share one pool
    const { values } = decodePayload(bytes).groups[0];
    expect(values.buffer).not.toBe(bytes.buffer);
    expect(values.buffer.byteLength).toBe(values.byteLength);
  });

  it('rejects more than MAX_PAYLOAD_BYTES before parsing', () => {
    const bytes = new Uint8Array(MAX_PAYLOAD_BYTES + 1);
    bytes[0] = 0xc1; // would be a type error if it were parsed
    expect(reasonOf(bytes)).toBe('too-large');
  });

  it('checks declared lengths against the bytes left before allocating', () => {
    const allocated: number[] = [];
    const spy = <T extends abstract new (...args: never[]) => unknown>(C: T): T =>
      new Proxy(C, {
        construct(target, args, newTarget) {
          if (typeof args[0] === 'number') allocated.push(args[0]);
          return Reflect.construct(target, args, newTarget) as object;
        },
      });
    const g = globalThis as unknown as Record<string, unknown>;
    const real = { BigUint64Array, Uint8Array, ArrayBuffer };
    g.BigUint64Array = spy(BigUint64Array);
    g.Uint8Array = spy(Uint8Array);
    g.ArrayBuffer = spy(ArrayBuffer);
    let reasons: PayloadErrorReason[];
    try {
      reasons = [
        oneGroup('95 00 01 10 00 c6 fffffff8'), // bin32 of 4 GiB - 8, no bytes
        oneGroup('95 00 01 10 00 c5 fff8 0000'), // bin16 of 65528, 2 bytes
        unhex('92 01 93 28 01 dd 00001000'), // 4096 groups declared, none there
      ].map(reasonOf);
    } finally {
      Object.assign(g, real);
    }
    expect(reasons).toEqual(['truncated', 'truncated', 'truncated']);
    expect(allocated.filter((n) => n > 64)).toEqual([]);
  });

  it('checks the group count before reading the groups', () => {
    expect(reasonOf(unhex('92 01 93 28 01 dd ffffffff'))).toBe('too-many-groups');
    expect(reasonOf(unhex('92 01 93 28 01 dc 1001'))).toBe('too-many-groups');
  });

  it.each([
    ['empty input', ''],
    ['a cut array16 header', '92 01 dc 00'],
    ['a cut uint64', '92 01 93 cf 0000'],
    ['a missing group', '92 01 93 28 01 92 95 00 01 10 00 c400'],
    ['a cut bin header', '92 01 93 28 01 91 95 00 01 10 00 c5 00'],
  ])('rejects %s as truncated', (_what, h) => {
    expect(reasonOf(unhex(h))).toBe('truncated');
  });

  it('rejects trailing bytes', () => {
    expect(reasonOf(unhex('920193280190 00'))).toBe('trailing-bytes');
    expect(reasonOf(unhex('920193280190 920193280190'))).toBe('trailing-bytes');
  });

  it.each([
    ['negative fixint', '920193 ff 0190'],
    ['int8 -1', '920193 d0ff 0190'],
    ['int16 -1', '920193 d1ffff 0190'],
    ['int32 -2^31', '920193 d280000000 0190'],
    ['int64 -1', '920193 d3ffffffffffffffff 0190'],
    ['int64 -2^63', '920193 d38000000000000000 0190'],
    ['int64 fingerprint -1', '920193280191 95 00 d3ffffffffffffffff 10 00 c400'],
    ['int8 fingerprint -1', '920193280191 95 00 d0ff 10 00 c400'],
    ['negative fixint version', '92 ff 93280190'],
  ])('rejects a %s as negative', (_what, h) => {
    expect(reasonOf(unhex(h))).toBe('negative');
  });

  it.each([
    ['int64', '920193 d3001fffffffffffff 0190', Number.MAX_SAFE_INTEGER],
    ['int32', '920193 d27fffffff 0190', 2 ** 31 - 1],
    ['int16', '920193 d17fff 0190', 32767],
    ['int8', '920193 d07f 0190', 127],
    ['uint64', '920193 cf001fffffffffffff 0190', Number.MAX_SAFE_INTEGER],
  ])('accepts a non-negative %s numTokens', (_what, h, n) => {
    expect(decodePayload(unhex(h)).numTokens).toBe(n);
  });

  it('reads int64 and uint64 fingerprints exactly', () => {
    const fp = (h: string): bigint => decodePayload(oneGroup(`95 00 ${h} 10 00 c400`)).groups[0].fingerprint;
    expect(fp('d3 7fffffffffffffff')).toBe((1n << 63n) - 1n);
    expect(fp('cf ffffffffffffffff')).toBe((1n << 64n) - 1n);
    expect(fp('cf 8000000000000001')).toBe((1n << 63n) + 1n);
    expect(fp('ce ffffffff')).toBe(0xffffffffn);
  });

  it.each([
    ['numTokens', '920193 cf0020000000000000 0190'],
    ['numTokens (int64)', '920193 d30020000000000000 0190'],
    ['producerTpSize', '920193 28 cfffffffffffffffff 90'],
    ['groupId', '920193280191 95 cf0020000000000000 01 10 00 c400'],
    ['blockSize', '920193280191 95 00 01 cf0020000000000000 00 c400'],
    ['start', '920193280191 95 00 01 10 cfffffffffffffffff c400'],
  ])('rejects %s above MAX_SAFE_INTEGER', (_what, h) => {
    expect(reasonOf(unhex(h))).toBe('integer-too-large');
  });

  it.each([
    ['version 0', '92 00 93280190'],
    ['version 3 with any body', '92 03 c0'],
    ['version 2^64-1', '92 cfffffffffffffffff 93280190'],
  ])('rejects %s', (_what, h) => {
    expect(reasonOf(unhex(h))).toBe('version');
  });

  it.each([
    ['a 3-element top level', '93 01 93280190 00'],
    ['a 1-element top level', '91 01'],
    ['a 2-element body', '9201 92 28 01'],
    ['a 4-element body', '9201 94 28 01 90 00'],
    ['a 6-element group', '920193280191 96 00 01 10 00 c400 00'],
    ['an array32 body of 2^32-1 elements', '9201 dd ffffffff'],
  ])('rejects %s (arity)', (_what, h) => {
    expect(reasonOf(unhex(h))).toBe('arity');
  });

  it.each([
    ['a map top level', '80'],
    ['a bin body', '9201 c400'],
    ['bool numTokens', '920193 c3 0190'],
    ['float32 producerTpSize', '920193 28 ca3f800000 90'],
    ['the never-used byte 0xc1', '920193 c1 0190'],
    ['fixext groupId', '920193280191 95 d40100 01 10 00 c400'],
    ['str fingerprint', '920193280191 95 00 a131 10 00 c400'],
    ['a map for groups', '920193 28 01 80'],
    ['an integer for a group', '920193 28 01 91 00'],
    ['an array for values', '920193280191 95 00 01 10 00 90'],
    ['str8 for values', '920193280191 95 00 01 10 00 d9 00'],
  ])('rejects %s (type)', (_what, h) => {
    expect(reasonOf(unhex(h))).toBe('type');
  });

  it('accepts bin32 values and array32 headers', () => {
    const groups = 'dd00000001 dd00000005 07 05 20 03 c6 00000008 0900000000000000';
    const p = decodePayload(unhex(`dd00000002 01 dd00000003 28 01 ${groups}`));
    expect(toPlain(p)).toEqual({
      numTokens: 40,
      producerTpSize: 1,
      groups: [{ groupId: 7, fingerprint: '5', blockSize: 32, start: 3, values: ['9'] }],
    });
  });

  it('rejects non-bytes input with a PayloadError', () => {
    const notBytes: unknown[] = [null, undefined, 'kgE=', [0x92, 0x01], new ArrayBuffer(4), new Uint16Array(2)];
    for (const v of notBytes) {
      expect(payloadError(() => decodePayload(v as Uint8Array)).reason).toBe('type');
    }
  });

  it('makes PayloadError an Error with a name, a reason and a message', () => {
    const e = payloadError(() => decodePayload(unhex('920193280090')));
    expect(e).toBeInstanceOf(Error);
    expect(e.name).toBe('PayloadError');
    expect(e.reason).toBe('tp-size-zero');
    expect(e.message).toMatch(/producerTpSize/);
  });
});

describe('base64 carrier (SPEC 7)', () => {
  const valid = vectors.payload[1].base64; // ends in "=="

  it.each([
    ['missing padding', valid.replace(/=+$/, '')],
    ['a bad character', `!${valid.slice(1)}`],
    ['URL-safe alphabet', valid.replace(/\//g, '_')],
    ['whitespace', `${valid.slice(0, 8)}\n${valid.slice(8)}`],
    ['non-zero unused bits', valid.replace(/w==$/, 'x==')],
    ['extra padding', `${valid}=`],
  ])('rejects %s', (_what, s) => {
    expect(s).not.toBe(valid);
    expect(payloadError(() => decodePayloadBase64(s)).reason).toBe('base64');
  });

  it('rejects a non-string with a PayloadError', () => {
    for (const v of [undefined, null, 42, {}, new Uint8Array(4)]) {
      expect(payloadError(() => decodePayloadBase64(v as string)).reason).toBe('base64');
    }
  });

  it('rejects text longer than a maximal payload before decoding', () => {
    const s = 'A'.repeat(4 * Math.ceil(MAX_PAYLOAD_BYTES / 3) + 4);
    expect(payloadError(() => decodePayloadBase64(s)).reason).toBe('too-large');
  });

  it('passes decoder errors through', () => {
    expect(payloadError(() => decodePayloadBase64('')).reason).toBe('truncated');
    expect(payloadError(() => decodePayloadBase64('kgKTKAGQ')).reason).toBe('arity'); // v2, 3-element body
    expect(payloadError(() => decodePayloadBase64('kgOTKAGQ')).reason).toBe('version'); // version 3
  });
});

describe('round trip of random payloads', () => {
  const safeEdge = fc.oneof(
    fc.constantFrom(0, 127, 128, 255, 256, 65535, 65536, 2 ** 32 - 1, 2 ** 32, Number.MAX_SAFE_INTEGER),
    fc.nat(),
    fc.maxSafeNat(),
  );
  const group = fc.record({
    groupId: safeEdge,
    fingerprint: fc.oneof(
      fc.constantFrom(0n, 127n, 128n, 0xffffffffn, 1n << 32n, (1n << 64n) - 1n),
      fc.bigInt({ min: 0n, max: (1n << 64n) - 1n }),
    ),
    blockSize: safeEdge.map((n) => Math.max(1, n)),
    start: safeEdge,
    values: fc.oneof(
      { weight: 4, arbitrary: fc.bigUint64Array({ maxLength: 40 }) },
      { weight: 1, arbitrary: fc.bigUint64Array({ minLength: 30, maxLength: 40 }) }, // bin 8 / bin 16 edge
    ),
  });
  const payload = fc.record({
    numTokens: safeEdge,
    producerTpSize: safeEdge.map((n) => Math.max(1, n)),
    groups: fc.uniqueArray(group, { selector: (g) => g.groupId, maxLength: 20 }),
  });

  it('decode(encode(p)) equals p, through bytes and base64 (seeded)', () => {
    fc.assert(
      fc.property(payload, (p) => {
        const bytes = encodePayload(p);
        expect(toPlain(decodePayload(bytes))).toEqual(toPlain(p));
        expect(toPlain(decodePayloadBase64(encodePayloadBase64(p)))).toEqual(toPlain(p));
        expect(hex(encodePayload(decodePayload(bytes)))).toBe(hex(bytes));
      }),
      { seed: 20240601, numRuns: 500 },
    );
  });
});
