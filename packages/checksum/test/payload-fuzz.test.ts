// Fuzz test of the payload decoder (SPEC 6, 6.1: versions 1 and 2): mutated, truncated and random
// bytes must either decode into a payload that meets every invariant (and re-encodes and decodes
// stably) or be rejected with a PayloadError. Anything else thrown fails the test.
//
// The run is seeded (default fixed); the seed is printed first. Replay or vary it with KVC_TEST_SEED=<seed>.
import { readFileSync } from 'node:fs';
import { expect, it } from 'vitest';
import { MAX_PAYLOAD_GROUPS, PayloadError, decodePayload, encodePayload } from '../src/payload.js';
import type { ChecksumPayload } from '../src/types.js';
import { testSeed } from './seed.js';

const CASES = 120_000;
const UINT64_MAX = (1n << 64n) - 1n;

const seed = testSeed('payload fuzz');

/** mulberry32: a small seeded 32-bit PRNG. */
function prng(s: number) {
  let a = s >>> 0;
  const u32 = (): number => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return (t ^ (t >>> 14)) >>> 0;
  };
  const below = (n: number): number => Math.floor((u32() / 2 ** 32) * n);
  return {
    u32,
    below,
    pick: <T>(xs: readonly T[]): T => xs[below(xs.length)],
    u64: (): bigint => (BigInt(u32()) << 32n) | BigInt(u32()),
  };
}
type Rng = ReturnType<typeof prng>;

// MessagePack type bytes that sit on the edges of families, and the bytes of all non-fixed types.
const INTERESTING = [
  ...Array.from({ length: 0x20 }, (_, i) => 0xc0 + i),
  0x00, 0x01, 0x04, 0x05, 0x08, 0x0f, 0x10, 0x7f, 0x80, 0x8f, 0x90, 0x91, 0x92, 0x93, 0x95, 0x9f,
  0xa0, 0xbf, 0xe0, 0xff,
];
const EDGE_NUMBERS = [
  0, 1, 127, 128, 255, 256, 65535, 65536, 2 ** 31 - 1, 2 ** 32 - 1, 2 ** 32, Number.MAX_SAFE_INTEGER,
];
const EDGE_U64 = [0n, 1n, 127n, 128n, 0xffffffffn, 1n << 32n, (1n << 63n) - 1n, 1n << 63n, UINT64_MAX];

function randomCount(r: Rng, min: number): number {
  return Math.max(min, r.below(3) === 0 ? r.pick(EDGE_NUMBERS) : r.below(300));
}

/** A random valid payload; half of them version 2 (with a token digest). */
function randomPayload(r: Rng): ChecksumPayload {
  const nGroups = r.below(8) === 0 ? r.below(40) : r.below(4);
  const ids = new Set<number>();
  while (ids.size < nGroups) ids.add(r.below(2) === 0 ? r.below(64) : randomCount(r, 0));
  const v2 = r.below(2) === 0;
  return {
    version: v2 ? 2 : 1,
    ...(v2 ? { tokenDigest: r.below(2) === 0 ? r.pick(EDGE_U64) : r.u64() } : {}),
    numTokens: randomCount(r, 0),
    producerTpSize: randomCount(r, 1),
    groups: [...ids].map((groupId) => ({
      groupId,
      fingerprint: r.below(2) === 0 ? r.pick(EDGE_U64) : r.u64(),
      blockSize: randomCount(r, 1),
      start: randomCount(r, 0),
      values: BigUint64Array.from({ length: r.below(5) === 0 ? r.below(40) : r.below(4) }, () =>
        r.below(4) === 0 ? r.pick(EDGE_U64) : r.u64(),
      ),
    })),
  };
}

/**
 * Encodes `p` choosing at random among every MessagePack form the decoder must accept (wider
 * and signed integers, array 16/32, bin 16/32), so the corpus covers non-minimal inputs too.
 */
function looseEncode(p: ChecksumPayload, r: Rng): Uint8Array {
  const out: number[] = [];
  const be = (v: bigint, n: number): void => {
    for (let i = n - 1; i >= 0; i--) out.push(Number((v >> BigInt(8 * i)) & 0xffn));
  };
  const int = (value: number | bigint): void => {
    const v = BigInt(value);
    const forms: Array<[number, number]> = [[0xcf, 8]]; // [type byte, bytes]; 0 bytes = fixint
    if (v < 0x80n) forms.push([Number(v), 0], [0xd0, 1]);
    if (v < 0x100n) forms.push([0xcc, 1]);
    if (v < 0x8000n) forms.push([0xd1, 2]);
    if (v < 0x10000n) forms.push([0xcd, 2]);
    if (v < 0x80000000n) forms.push([0xd2, 4]);
    if (v < 0x100000000n) forms.push([0xce, 4]);
    if (v < 1n << 63n) forms.push([0xd3, 8]);
    const [tag, n] = r.pick(forms);
    out.push(tag);
    be(v, n);
  };
  const array = (n: number): void => {
    const forms: Array<[number, number]> = [[0xdc, 2], [0xdd, 4]];
    if (n < 16) forms.push([0x90 | n, 0]);
    const [tag, len] = r.pick(forms);
    out.push(tag);
    be(BigInt(n), len);
  };
  const v2 = p.tokenDigest !== undefined;
  array(2);
  int(v2 ? 2 : 1);
  array(v2 ? 4 : 3);
  int(p.numTokens);
  int(p.producerTpSize);
  if (v2) int(p.tokenDigest!);
  array(p.groups.length);
  for (const g of p.groups) {
    array(5);
    int(g.groupId);
    int(g.fingerprint);
    int(g.blockSize);
    int(g.start);
    const n = g.values.byteLength;
    const [tag, len] = r.pick<[number, number]>(n < 0x100 ? [[0xc4, 1], [0xc5, 2], [0xc6, 4]] : [[0xc5, 2], [0xc6, 4]]);
    out.push(tag);
    be(BigInt(n), len);
    out.push(...new Uint8Array(g.values.buffer, g.values.byteOffset, n));
  }
  return Uint8Array.from(out);
}

function mutate(input: Uint8Array, r: Rng): Uint8Array {
  const b = Array.from(input);
  for (let k = 1 + r.below(3); k > 0; k--) {
    const at = r.below(b.length + 1);
    switch (r.below(5)) {
      case 0: // bit flip
        if (at < b.length) b[at] ^= 1 << r.below(8);
        break;
      case 1: // interesting byte
        if (at < b.length) b[at] = r.pick(INTERESTING);
        break;
      case 2: // random byte
        if (at < b.length) b[at] = r.below(256);
        break;
      case 3: // insertion
        b.splice(at, 0, ...Array.from({ length: 1 + r.below(4) }, () => randomByte(r)));
        break;
      default: // deletion
        b.splice(at, 1 + r.below(4));
    }
  }
  return Uint8Array.from(b);
}

/** Half the time an interesting byte, else any byte. */
const randomByte = (r: Rng): number => (r.below(2) ? r.pick(INTERESTING) : r.below(256));

function randomBytes(r: Rng): Uint8Array {
  const prefix = r.pick([
    [],
    [0x92],
    [0x92, 0x01],
    [0x92, 0x01, 0x93],
    [0x92, 0x01, 0x93, 0x28, 0x01],
    [0x92, 0x02],
    [0x92, 0x02, 0x94],
    [0x92, 0x02, 0x94, 0x28, 0x01],
  ]);
  const tail = Array.from({ length: r.below(48) }, () => randomByte(r));
  return Uint8Array.from([...prefix, ...tail]);
}

/** Why `p` breaks a SPEC 6 / 6.1 invariant, or undefined if it meets them all. */
function violation(p: ChecksumPayload): string | undefined {
  const count = (v: number, min: number): boolean => Number.isSafeInteger(v) && v >= min;
  if (p.version !== 1 && p.version !== 2) return 'version';
  if ((p.version === 2) !== (p.tokenDigest !== undefined)) return 'tokenDigest present iff version 2';
  if (p.tokenDigest !== undefined && (typeof p.tokenDigest !== 'bigint' || p.tokenDigest < 0n || p.tokenDigest > UINT64_MAX)) return 'tokenDigest';
  if (!count(p.numTokens, 0)) return 'numTokens';
  if (!count(p.producerTpSize, 1)) return 'producerTpSize';
  if (!Array.isArray(p.groups) || p.groups.length > MAX_PAYLOAD_GROUPS) return 'groups';
  if (new Set(p.groups.map((g) => g.groupId)).size !== p.groups.length) return 'duplicate groupId';
  for (const g of p.groups) {
    if (!count(g.groupId, 0) || !count(g.blockSize, 1) || !count(g.start, 0)) return 'group integers';
    if (typeof g.fingerprint !== 'bigint' || g.fingerprint < 0n || g.fingerprint > UINT64_MAX) return 'fingerprint';
    if (!(g.values instanceof BigUint64Array)) return 'values type';
    if (g.values.byteOffset !== 0 || g.values.buffer.byteLength !== g.values.byteLength) return 'values not owned';
  }
  return undefined;
}

function samePayload(a: ChecksumPayload, b: ChecksumPayload): boolean {
  return (
    (a.version ?? 1) === (b.version ?? 1) &&
    a.tokenDigest === b.tokenDigest &&
    a.numTokens === b.numTokens &&
    a.producerTpSize === b.producerTpSize &&
    a.groups.length === b.groups.length &&
    a.groups.every((g, i) => {
      const h = b.groups[i];
      return (
        g.groupId === h.groupId &&
        g.fingerprint === h.fingerprint &&
        g.blockSize === h.blockSize &&
        g.start === h.start &&
        g.values.length === h.values.length &&
        g.values.every((v, j) => v === h.values[j])
      );
    })
  );
}

const sameBytes = (a: Uint8Array, b: Uint8Array): boolean => a.length === b.length && a.every((x, i) => x === b[i]);

/**
 * Decodes `bytes`: returns the rejection reason, or the payload after checking it. Throws (a
 * plain Error describing the defect) on anything that is not allowed.
 */
function check(bytes: Uint8Array): string | ChecksumPayload {
  let p: ChecksumPayload;
  try {
    p = decodePayload(bytes);
  } catch (e) {
    if (e instanceof PayloadError) return e.reason;
    throw new Error(`decoder threw a non-PayloadError: ${String(e)}`);
  }
  const why = violation(p);
  if (why) throw new Error(`decoded payload breaks an invariant: ${why}`);
  const again = encodePayload(p);
  if (again.length > bytes.length) throw new Error('minimal re-encoding is longer than the input');
  const p2 = decodePayload(again);
  if (!samePayload(p, p2)) throw new Error('decode(encode(p)) differs from p');
  if (!sameBytes(encodePayload(p2), again)) throw new Error('re-encoding is not stable');
  return p;
}

function loadCorpus(r: Rng): Uint8Array[] {
  const read = (name: string) => JSON.parse(readFileSync(new URL(`../../../../shared/vectors/${name}`, import.meta.url), 'utf8'));
  type Hex = Array<{ hex: string }>;
  const v = read('checksum-v1.json') as Record<'payload' | 'payloadAccepts' | 'payloadRejects', Hex>;
  const v2 = read('identity-v2.json') as Record<'payloadV2' | 'payloadV2Rejects', Hex>;
  const small = [...v.payload, ...v.payloadAccepts, ...v.payloadRejects, ...v2.payloadV2, ...v2.payloadV2Rejects].filter((x) => x.hex.length <= 2048);
  const corpus: Uint8Array[] = small.map((x) => Uint8Array.from(Buffer.from(x.hex, 'hex')));
  for (let i = 0; i < 64; i++) {
    const p = randomPayload(r);
    corpus.push(encodePayload(p), looseEncode(p, r));
  }
  return corpus;
}

it(`decodes ${CASES} mutated, truncated and random payloads into valid payloads or PayloadErrors`, () => {
  const r = prng(seed);
  const corpus = loadCorpus(r);
  const tally = new Map<string, number>();
  let failure: string | undefined;
  const t0 = performance.now();
  for (let i = 0; i < CASES && failure === undefined; i++) {
    let bytes: Uint8Array;
    let expected: ChecksumPayload | undefined; // the payload `bytes` must decode to, if known
    switch (i % 6) {
      case 0:
      case 1:
      case 2:
        bytes = mutate(r.pick(corpus), r);
        break;
      case 3: {
        const src = r.pick(corpus);
        bytes = src.subarray(0, r.below(src.length));
        break;
      }
      case 4:
        bytes = randomBytes(r);
        break;
      default:
        // Every accepted form of a random payload decodes to that payload.
        expected = randomPayload(r);
        bytes = looseEncode(expected, r);
    }
    try {
      const outcome = check(bytes);
      if (expected && (typeof outcome === 'string' || !samePayload(outcome, expected))) {
        const got = typeof outcome === 'string' ? `a rejection (${outcome})` : 'another payload';
        throw new Error(`an accepted encoding of a valid payload decodes to ${got}`);
      }
      const key = typeof outcome === 'string' ? outcome : 'ok';
      tally.set(key, (tally.get(key) ?? 0) + 1);
    } catch (e) {
      failure = `seed ${seed}, case ${i}, bytes ${Buffer.from(bytes).toString('hex')}: ${(e as Error).message}`;
    }
  }
  const ms = performance.now() - t0;
  const outcomes = JSON.stringify(Object.fromEntries([...tally].sort()));
  console.log(`payload fuzz: ${CASES} cases in ${ms.toFixed(0)} ms; outcomes ${outcomes}`);

  expect(failure).toBeUndefined();
  // The fuzzer must keep reaching both valid payloads and the decoder's checks.
  expect(tally.get('ok') ?? 0).toBeGreaterThan(CASES / 10);
  const mustReach = ['arity', 'type', 'negative', 'truncated', 'trailing-bytes', 'values-length', 'version'];
  for (const reason of [...mustReach, 'duplicate-group', 'integer-too-large']) {
    expect(tally.get(reason) ?? 0, reason).toBeGreaterThan(0);
  }
});
