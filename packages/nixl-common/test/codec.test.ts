/**
 * Strict decoders of the side channel (requests, responses, engine info, push registrations) and
 * of notifs (SPEC 7): round trips, named rejections, and fuzzing (random bytes, mutated valid
 * messages): a decoder returns a value or throws NixlDecodeError, never anything else.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  KV_CHECKSUM_NOTIF_PREFIX,
  LIMITS,
  NIXL_PROTOCOL_VERSION,
  NixlDecodeError,
  compatHash,
  decodeEngineInfo,
  decodeLeaseBody,
  decodeNotif,
  decodeRequest,
  decodeResponse,
  encodeEngineInfo,
  encodeNotif,
  encodeOk,
  encodeRefusal,
  encodeRequest,
  packr,
  type EngineInfo,
  type PushRegistration,
  type SideRequest,
} from '../src/index.js';
import { makeRank } from './fixtures.js';

const rank0 = makeRank({ kind: 'gqa', layers: 2, kvHeads: 2, headDim: 8 }, 0, 2, { numBlocks: 4, blockSize: 16 }).info;
const rank1 = makeRank({ kind: 'gqa', layers: 2, kvHeads: 2, headDim: 8 }, 1, 2, { numBlocks: 4, blockSize: 16 }).info;
const mamba = makeRank({ kind: 'mamba', layers: 1, kvHeads: 1, headDim: 1, mamba: { numHeads: 4, headDim: 4, dState: 4, nGroups: 1, convKernel: 4 } }, 0, 1, { numBlocks: 4, blockSize: 16 }).info;

const info: EngineInfo = {
  version: NIXL_PROTOCOL_VERSION,
  mode: 'pull',
  compatHash: 'ab'.repeat(32),
  engineId: 'producer-0',
  tpSize: 2,
  ppSize: 1,
  blockSizes: [16],
  groupKinds: ['full-attention'],
  ranks: [rank0, rank1],
};
const reg: PushRegistration = { consumerRequestId: 'd-1', producerRequestId: 'p-1', consumerEngineId: 'consumer-0', rank: mamba, firstToken: 0, numTokens: 12, blockIds: [[3, -1, 4]] };
const requests: SideRequest[] = [
  { type: 'info', version: 15, mode: 'push', compatHash: 'x'.repeat(64) },
  { type: 'lease', requestIds: ['a', 'b'], pinMs: 35_000 },
  { type: 'release', requestIds: ['a'] },
  { type: 'push-reg', reg },
];

const rethrowUnlessDecodeError = (f: () => unknown) => {
  try {
    f();
  } catch (e) {
    if (!(e instanceof NixlDecodeError)) throw e;
  }
};

describe('side-channel codec', () => {
  it('requests round-trip', () => {
    for (const [i, r] of requests.entries()) expect(decodeRequest(encodeRequest(i + 7, r))).toEqual({ seq: i + 7, req: r });
  });
  it('engine info round-trips through an ok response (layouts of attention and state caches)', () => {
    const res = decodeResponse(encodeOk(3, encodeEngineInfo(info)));
    expect(res.ok).toBe(true);
    expect(decodeEngineInfo((res as { body: unknown }).body)).toEqual(info);
    const one = { ...info, tpSize: 1, ranks: [mamba], groupKinds: ['state' as const] };
    expect(decodeEngineInfo(encodeEngineInfo(one))).toEqual(one);
  });
  it('refusals round-trip; lease bodies decode', () => {
    expect(decodeResponse(encodeRefusal(9, 'lease-expired', 'gone'))).toEqual({ seq: 9, ok: false, code: 'lease-expired', message: 'gone' });
    expect(decodeLeaseBody([['a', 5], ['b', 0]])).toEqual(new Map([['a', 5], ['b', 0]]));
  });

  const bad: Array<[string, unknown]> = [
    ['not an array', { seq: 1 }],
    ['unknown type', [1, 99]],
    ['INFO arity', [1, 1, 15, 'pull']],
    ['INFO mode', [1, 1, 15, 'sideways', 'h']],
    ['LEASE negative pin', [1, 2, ['a'], -1]],
    ['LEASE non-string id', [1, 2, [7], 0]],
    ['LEASE empty id', [1, 2, [''], 0]],
    ['RELEASE float seq', [1.5, 3, []]],
    ['PUSH_REG firstToken past numTokens', [1, 4, [...encodeReg(), 0].slice(0, 7).map((x, i) => (i === 4 ? 50 : x))]],
    ['PUSH_REG block id -2', [1, 4, encodeReg().map((x, i) => (i === 6 ? [[-2]] : x))]],
  ];
  function encodeReg(): unknown[] {
    return (decodeRawRequest(encodeRequest(1, { type: 'push-reg', reg }))[2] as unknown[]).slice();
  }
  for (const [name, v] of bad) it(`rejects a request: ${name}`, () => expect(() => decodeRequest(packr.pack(v))).toThrow(NixlDecodeError));

  it('rejects engine infos that do not add up', () => {
    const raw = encodeEngineInfo(info);
    const mut = (i: number, v: unknown) => raw.map((x, k) => (k === i ? v : x));
    expect(() => decodeEngineInfo(mut(8, [encodeEngineInfo(info)[8] as unknown[]][0].slice(0, 1)))).toThrow(/ranks/); // 1 rank for TP 2
    expect(() => decodeEngineInfo(mut(8, [(raw[8] as unknown[])[0], (raw[8] as unknown[])[0]]))).toThrow(/repeated/);
    expect(() => decodeEngineInfo(mut(1, 'both'))).toThrow(/mode/);
    expect(() => decodeEngineInfo(mut(7, ['full-attention', 'state']))).toThrow(/differ in length/);
    // A cache naming a region the rank did not register.
    const r0 = (raw[8] as unknown[][])[0].slice();
    r0[6] = [];
    expect(() => decodeEngineInfo(mut(8, [r0, (raw[8] as unknown[])[1]]))).toThrow(/region/);
    // A replication that does not divide TP.
    const r1 = (raw[8] as unknown[][])[1].slice();
    const c = (r1[7] as unknown[][])[0].slice();
    c[7] = 3;
    r1[7] = [c, (r1[7] as unknown[])[1]];
    expect(() => decodeEngineInfo(mut(8, [(raw[8] as unknown[])[0], r1]))).toThrow(/replicas/);
  });
  it('rejects oversized frames and trailing bytes', () => {
    const ok = encodeRequest(1, requests[1]);
    const trail = new Uint8Array(ok.length + 1);
    trail.set(ok);
    expect(() => decodeRequest(trail)).toThrow(NixlDecodeError);
    expect(() => decodeRequest(new Uint8Array(LIMITS.frameBytes + 1))).toThrow(/more than/);
  });

  it('fuzz: random bytes only ever throw NixlDecodeError', () => {
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 256 }), (b) => {
        rethrowUnlessDecodeError(() => decodeRequest(b));
        rethrowUnlessDecodeError(() => decodeResponse(b));
        rethrowUnlessDecodeError(() => decodeEngineInfo(safeUnpack(b)));
      }),
      { numRuns: 3000 },
    );
  });
  it('fuzz: mutated valid messages decode or throw NixlDecodeError', () => {
    const valid = [...requests.map((r, i) => encodeRequest(i, r)), encodeOk(1, encodeEngineInfo(info))];
    fc.assert(
      fc.property(fc.integer({ min: 0, max: valid.length - 1 }), fc.array(fc.tuple(fc.nat(), fc.integer({ min: 0, max: 255 })), { minLength: 1, maxLength: 4 }), fc.nat(), (k, edits, cut) => {
        const b = valid[k].slice();
        for (const [i, v] of edits) b[i % b.length] = v;
        const t = b.subarray(0, Math.max(1, b.length - (cut % 4)));
        rethrowUnlessDecodeError(() => decodeRequest(t));
        rethrowUnlessDecodeError(() => {
          const r = decodeResponse(t);
          if (r.ok) decodeEngineInfo(r.body);
        });
      }),
      { numRuns: 3000 },
    );
  });
});

function decodeRawRequest(b: Uint8Array): unknown[] {
  return safeUnpack(b) as unknown[];
}
function safeUnpack(b: Uint8Array): unknown {
  try {
    return packr.unpack(b);
  } catch {
    return null;
  }
}

describe('notif codec (SPEC 7)', () => {
  it('plain form: remoteRequestId:producerTpSize (ids may hold colons)', () => {
    const b = encodeNotif('req:with:colons', 2);
    expect(new TextDecoder().decode(b)).toBe('req:with:colons:2');
    expect(decodeNotif(b)).toEqual({ remoteRequestId: 'req:with:colons', size: 2, payload: null });
  });
  it('checksum form: KV_CHECKSUM: + msgpack [id, tp, bin]', () => {
    const payload = new Uint8Array([1, 2, 3, 4]);
    const b = encodeNotif('d-1', 4, payload);
    expect(new TextDecoder().decode(b.subarray(0, 12))).toBe(KV_CHECKSUM_NOTIF_PREFIX);
    const raw = packr.unpack(b.subarray(12)) as unknown[];
    expect([raw[0], raw[1], [...(raw[2] as Uint8Array)]]).toEqual(['d-1', 4, [1, 2, 3, 4]]);
    expect(decodeNotif(b)).toEqual({ remoteRequestId: 'd-1', size: 4, payload });
  });
  const prefix = new TextEncoder().encode(KV_CHECKSUM_NOTIF_PREFIX);
  const withPrefix = (v: unknown) => new Uint8Array([...prefix, ...packr.pack(v)]);
  const bad: Array<[string, Uint8Array]> = [
    ['no size', new TextEncoder().encode('abc')],
    ['size 0', new TextEncoder().encode('abc:0')],
    ['size with a leading zero', new TextEncoder().encode('abc:01')],
    ['negative size', new TextEncoder().encode('abc:-1')],
    ['empty id', new TextEncoder().encode(':2')],
    ['invalid UTF-8', new Uint8Array([0xff, 0x3a, 0x31])],
    ['checksum form, 2 elements', withPrefix(['a', 1])],
    ['checksum form, payload a string', withPrefix(['a', 1, 'xyz'])],
    ['checksum form, tp 0', withPrefix(['a', 0, new Uint8Array(1)])],
    ['checksum form, id a number', withPrefix([5, 1, new Uint8Array(1)])],
    ['checksum form, trailing bytes', new Uint8Array([...withPrefix(['a', 1, new Uint8Array(1)]), 0])],
    ['checksum form, undecodable', new Uint8Array([...prefix, 0xc1])],
    ['checksum form, empty', prefix],
  ];
  for (const [name, b] of bad) it(`rejects ${name}`, () => expect(() => decodeNotif(b)).toThrow(NixlDecodeError));
  it('fuzz: random and mutated notifs decode or throw NixlDecodeError', () => {
    const valid = [encodeNotif('r-1', 2), encodeNotif('r-2', 1, new Uint8Array(40))];
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 200 }), fc.integer({ min: 0, max: 1 }), fc.nat(), fc.integer({ min: 0, max: 255 }), (rand, k, i, v) => {
        rethrowUnlessDecodeError(() => decodeNotif(rand));
        rethrowUnlessDecodeError(() => decodeNotif(new Uint8Array([...prefix, ...rand])));
        const m = valid[k].slice();
        m[i % m.length] = v;
        rethrowUnlessDecodeError(() => decodeNotif(m));
      }),
      { numRuns: 3000 },
    );
  });
});

describe('compatibility hash', () => {
  const base = { backend: 'embedded', groupKinds: ['full-attention' as const], ranks: [rank0] };
  it('differs between pull and push, backends, models and salts; ignores TP rank and block layout', () => {
    const pull = compatHash({ ...base, mode: 'pull' });
    expect(compatHash({ ...base, mode: 'push' })).not.toBe(pull);
    expect(compatHash({ ...base, mode: 'pull', backend: 'nixl' })).not.toBe(pull);
    expect(compatHash({ ...base, mode: 'pull', ranks: [mamba] })).not.toBe(pull);
    expect(compatHash({ ...base, mode: 'pull', salt: 'x' })).not.toBe(pull);
    expect(compatHash({ ...base, mode: 'pull', ranks: [rank1] })).toBe(pull);
    const other = makeRank({ kind: 'gqa', layers: 2, kvHeads: 2, headDim: 8 }, 0, 1, { numBlocks: 9, blockSize: 32, layout: 'HND' }).info;
    expect(compatHash({ ...base, mode: 'pull', ranks: [other] })).toBe(pull);
  });
});
