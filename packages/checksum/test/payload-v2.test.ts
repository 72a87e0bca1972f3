/**
 * Payload version 2 (SPEC 6.1): the token digest, the v2 encoder and the decoder's v2 rules, against
 * `../shared/vectors/identity-v2.json` (read at load time, so a missing file fails this file).
 */
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { PayloadError, type PayloadErrorReason, decodePayload, decodePayloadBase64, encodePayload, encodePayloadBase64, tokenDigest } from '../src/payload.js';
import type { ChecksumPayload } from '../src/types.js';

const IDENTITY_URL = new URL('../../../../shared/vectors/identity-v2.json', import.meta.url);

interface PlainGroup {
  groupId: number;
  fingerprint: string;
  blockSize: number;
  start: number;
  values: string[];
}
interface V2Vector {
  tokenIds: number[];
  numTokens: number;
  producerTpSize: number;
  tokenDigest: string;
  groups: PlainGroup[];
  hex: string;
  base64: string;
}
interface IdentityVectors {
  tokenDigest: Array<{ tokenIds: number[]; numTokens: number; digest: string }>;
  payloadV2: V2Vector[];
  payloadV2Rejects: Array<{ why: string; hex: string }>;
}
const vectors = JSON.parse(readFileSync(IDENTITY_URL, 'utf8')) as IdentityVectors;

const hex = (b: Uint8Array): string => Buffer.from(b).toString('hex');
const unhex = (s: string): Uint8Array => new Uint8Array(Buffer.from(s.replace(/\s+/g, ''), 'hex'));

/** A decoded payload with uint64 as decimal strings, every field (version and digest included). */
function plain(p: ChecksumPayload): Record<string, unknown> {
  return {
    version: p.version,
    numTokens: p.numTokens,
    producerTpSize: p.producerTpSize,
    tokenDigest: p.tokenDigest?.toString(),
    groups: p.groups.map((g) => ({ groupId: g.groupId, fingerprint: g.fingerprint.toString(), blockSize: g.blockSize, start: g.start, values: Array.from(g.values, String) })),
  };
}

function fromVector(v: V2Vector): ChecksumPayload {
  return {
    numTokens: v.numTokens,
    producerTpSize: v.producerTpSize,
    tokenDigest: BigInt(v.tokenDigest),
    groups: v.groups.map((g) => ({ groupId: g.groupId, fingerprint: BigInt(g.fingerprint), blockSize: g.blockSize, start: g.start, values: BigUint64Array.from(g.values, BigInt) })),
  };
}

function reasonOf(bytes: Uint8Array): PayloadErrorReason {
  try {
    decodePayload(bytes);
  } catch (e) {
    expect(e).toBeInstanceOf(PayloadError);
    return (e as PayloadError).reason;
  }
  throw new Error('expected a PayloadError, but the bytes decoded');
}

/** The reason each v2 reject vector must give, by its `why`. */
const V2_REJECT_REASONS: Record<string, PayloadErrorReason> = {
  'v2 without the token digest (arity 3)': 'arity',
  'v2 with arity 5': 'arity',
  'v2 token digest as bin': 'type',
  'v2 token digest negative (int 8 -1)': 'negative',
  'v1 body with 4 fields': 'arity',
  'version 3': 'version',
};

describe('tokenDigest (SPEC 6.1)', () => {
  it.each(vectors.tokenDigest.map((t) => [`${t.numTokens} of ${t.tokenIds.length}`, t] as const))('digests %s tokens as the vector says', (_n, t) => {
    expect(tokenDigest(t.tokenIds, t.numTokens)).toBe(BigInt(t.digest));
    expect(tokenDigest(Uint32Array.from(t.tokenIds), t.numTokens)).toBe(BigInt(t.digest));
  });

  it('covers the empty prompt, a digest over a prefix and the uint32 extremes', () => {
    const cases = vectors.tokenDigest;
    expect(cases.some((t) => t.numTokens === 0)).toBe(true);
    expect(cases.some((t) => t.numTokens < t.tokenIds.length)).toBe(true);
    expect(cases.some((t) => t.tokenIds.includes(2 ** 32 - 1) && t.tokenIds.includes(0))).toBe(true);
  });

  it('is SHA-256 of no bytes for zero tokens, and defaults to every token', () => {
    const empty = createHash('sha256').digest().readBigUInt64LE(0);
    expect(tokenDigest([], 0)).toBe(empty);
    expect(tokenDigest([5, 6, 7], 0)).toBe(empty);
    expect(tokenDigest([5, 6, 7])).toBe(tokenDigest([5, 6, 7, 8], 3));
    expect(tokenDigest([5, 6, 7])).not.toBe(tokenDigest([5, 6, 8]));
  });

  it.each([
    ['more tokens than given', [1, 2], 3],
    ['a negative count', [1, 2], -1],
    ['a fractional count', [1, 2], 1.5],
  ])('throws RangeError for %s', (_what, ids, n) => {
    expect(() => tokenDigest(ids, n)).toThrow(RangeError);
  });

  it.each([[-1], [2 ** 32], [1.5], [Number.NaN]])('throws RangeError for the token id %d', (t) => {
    expect(() => tokenDigest([1, t, 2], 3)).toThrow(RangeError);
    expect(tokenDigest([1, 2, t], 2)).toBe(tokenDigest([1, 2])); // ids past numTokens are not read
  });
});

describe('payload version 2 vectors (SPEC 6.1)', () => {
  it('has payloadV2 and payloadV2Rejects vectors', () => {
    expect(vectors.payloadV2.length).toBeGreaterThan(0);
    expect(vectors.payloadV2Rejects.length).toBeGreaterThan(0);
  });

  describe.each(vectors.payloadV2.map((v, i) => [i, v] as const))('payloadV2[%i]', (_i, v) => {
    it('has the digest of its tokens', () => {
      expect(tokenDigest(v.tokenIds, v.numTokens)).toBe(BigInt(v.tokenDigest));
    });
    it('encodes to its hex and base64 (a digest makes it version 2)', () => {
      expect(hex(encodePayload(fromVector(v)))).toBe(v.hex);
      expect(encodePayloadBase64(fromVector(v))).toBe(v.base64);
      expect(hex(encodePayload({ ...fromVector(v), version: 2 }))).toBe(v.hex);
    });
    it('decodes back from its hex and base64 with version 2 and the digest', () => {
      const want = { ...plain(fromVector(v)), version: 2 };
      expect(plain(decodePayload(unhex(v.hex)))).toEqual(want);
      expect(plain(decodePayloadBase64(v.base64))).toEqual(want);
    });
  });

  it.each(vectors.payloadV2Rejects.map((v) => [v.why, v] as const))('rejects %s', (why, v) => {
    expect(why in V2_REJECT_REASONS, `no expected reason for ${why}`).toBe(true);
    expect(reasonOf(unhex(v.hex))).toBe(V2_REJECT_REASONS[why]);
  });
});

describe('encodePayload and decodePayload, version 2', () => {
  const groups = [{ groupId: 0, fingerprint: 1n, blockSize: 16, start: 0, values: new BigUint64Array([7n]) }];

  it.each([
    [0n, '00'],
    [127n, '7f'],
    [128n, 'cc80'],
    [0xffffffffn, 'ceffffffff'],
    [1n << 32n, 'cf0000000100000000'],
    [(1n << 64n) - 1n, 'cfffffffffffffffff'],
  ])('writes the digest %d in its minimal form %s', (d, form) => {
    const bytes = encodePayload({ numTokens: 40, producerTpSize: 1, tokenDigest: d, groups: [] });
    expect(hex(bytes)).toBe(`92029428 01${form}90`.replace(/\s/g, ''));
    expect(decodePayload(bytes)).toMatchObject({ version: 2, tokenDigest: d });
  });

  it('writes version 1 without a digest and the decoder says version 1 with none', () => {
    const bytes = encodePayload({ numTokens: 40, producerTpSize: 1, groups });
    expect(hex(bytes).slice(0, 6)).toBe('920193');
    const p = decodePayload(bytes);
    expect(p.version).toBe(1);
    expect('tokenDigest' in p).toBe(false);
  });

  it('accepts a v2 digest in any integer family holding a value >= 0', () => {
    // uint 8 and int 64 forms of 5, where the minimal form is a positive fixint.
    for (const form of ['cc05', 'd30000000000000005', 'd005']) {
      expect(decodePayload(unhex(`9202942801${form}90`)).tokenDigest).toBe(5n);
    }
  });

  it.each([
    ['version 2 without a digest', { version: 2 as const }],
    ['version 1 with a digest', { version: 1 as const, tokenDigest: 5n }],
    ['another version', { version: 3 as unknown as 2, tokenDigest: 5n }],
    ['a digest that is not a bigint', { tokenDigest: 5 as unknown as bigint }],
  ])('throws TypeError for %s', (_what, over) => {
    expect(() => encodePayload({ numTokens: 40, producerTpSize: 1, groups, ...over })).toThrow(TypeError);
  });

  it.each([[-1n], [1n << 64n]])('throws RangeError for the digest %d', (d) => {
    expect(() => encodePayload({ numTokens: 40, producerTpSize: 1, groups, tokenDigest: d })).toThrow(RangeError);
  });

  it('decode(encode(p)) equals p for random v1 and v2 payloads (seeded)', () => {
    const seed = 20261201;
    console.log(`payload v2 round trip: fast-check seed ${seed}`);
    const u64 = fc.bigInt({ min: 0n, max: (1n << 64n) - 1n });
    const payload = fc.record({
      numTokens: fc.maxSafeNat(),
      producerTpSize: fc.integer({ min: 1, max: 1024 }),
      digest: fc.option(fc.oneof(fc.constantFrom(0n, 127n, 128n, 0xffffffffn, 1n << 32n, (1n << 64n) - 1n), u64)),
      groups: fc.uniqueArray(
        fc.record({ groupId: fc.nat(), fingerprint: u64, blockSize: fc.integer({ min: 1, max: 4096 }), start: fc.nat(), values: fc.bigUint64Array({ maxLength: 12 }) }),
        { selector: (g) => g.groupId, maxLength: 6 },
      ),
    });
    fc.assert(
      fc.property(payload, ({ digest, ...rest }) => {
        const p: ChecksumPayload = digest === null ? rest : { ...rest, tokenDigest: digest };
        const bytes = encodePayload(p);
        const back = decodePayload(bytes);
        expect(plain(back)).toEqual({ ...plain(p), version: digest === null ? 1 : 2 });
        expect(hex(encodePayload(back))).toBe(hex(bytes));
      }),
      { seed, numRuns: 300 },
    );
  });
});
