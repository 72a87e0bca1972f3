/**
 * The side-channel codecs: round trips, SPEC 7's `kv_checksums` (left out when empty), the strict
 * decoders' rejections (field by field, limits), unknown fields, and fuzzing (random bytes,
 * mutated valid messages, arbitrary MessagePack values): a decoder returns a well-typed message or
 * throws a MooncakeProtocolError, nothing else.
 */
import { describe, expect, it } from 'vitest';
import { NixlDecodeError, str as nixlStr } from '@kvconnect/nixl-common';
import fc from 'fast-check';
import { Packr, Unpackr } from 'msgpackr';
import {
  LIMITS,
  MooncakeProtocolError,
  XferStatusCode,
  decodeLocalizeReply,
  decodeLocalizeRequest,
  decodeTransferMetadata,
  decodeTransferResponse,
  encodeLocalizeReply,
  encodeLocalizeRequest,
  encodeTransferMetadata,
  encodeTransferResponse,
  type TransferMetadata,
  type TransferResponse,
} from '../src/protocol.js';

const packr = new Packr({ useRecords: false, variableMapSize: true });
const unpackr = new Unpackr({ useRecords: false, mapsAsObjects: false });

function metadata(): TransferMetadata {
  return {
    agentMetadata: new Uint8Array([1, 2, 3, 4]),
    backend: 'embedded',
    engineId: 'consumer-0',
    tpSize: 2,
    tpRank: 1,
    ppSize: 1,
    ppRank: 0,
    regions: [
      [0x10000, 4096],
      [0x20000, 8192],
    ],
    memory: { kind: 'VRAM', deviceId: 1 },
    caches: [
      {
        kind: 'attention',
        name: 'model.layers.0.self_attn.attn',
        group: 0,
        dtype: 'bfloat16',
        blockSize: 16,
        localHeads: 1,
        replication: { totalKvHeads: 2 },
        parts: [
          { region: 0, offset: 0, bytes: 32, blockStride: 512, headStride: 32, tokenStride: 32 },
          { region: 0, offset: 2048, bytes: 32, blockStride: 512, headStride: 32, tokenStride: 32, kernelBlockTokens: 8, kernelBlockStride: 256 },
        ],
      },
      {
        kind: 'state',
        name: 'model.layers.1.mixer',
        group: 1,
        states: [{ dtype: 'float32', shape: [4, 8], region: 1, offset: 0, blockStride: 128, strides: [32, 4], split: { axis: 0, segments: [[2, 1], [2, 2]] } }],
      },
    ],
    requests: new Map([
      ['req-a', { transferId: 'xfer-1', blocks: [[3, 4, 5], [7]], firstToken: 16, numTokens: 40, leaseCapability: 'ab'.repeat(32) }],
      ['req-b', { transferId: 'xfer-2', blocks: [[-1, 9], [2]], firstToken: 0, numTokens: 20 }],
    ]),
  };
}

function response(): TransferResponse {
  return { status: XferStatusCode.CONTINUE, okReqs: ['req-a'], errReqs: ['req-b'], errMsg: 'no such transfer', kvChecksums: new Map([['req-a', new Uint8Array([9, 8, 7])]]) };
}

const raw = (b: Uint8Array) => unpackr.unpack(b) as Map<string, unknown>;
const repack = (b: Uint8Array, f: (m: Map<string, unknown>) => void) => {
  const m = raw(b);
  f(m);
  return new Uint8Array(packr.pack(m));
};

describe('transfer metadata', () => {
  it('round-trips', () => {
    const m = metadata();
    expect(decodeTransferMetadata(encodeTransferMetadata(m))).toEqual(m);
  });

  it('is a MessagePack map with vLLM-style snake_case keys', () => {
    const keys = [...raw(encodeTransferMetadata(metadata())).keys()];
    expect(keys).toEqual(['agent_metadata', 'backend', 'engine_id', 'tp_size', 'tp_rank', 'pp_size', 'pp_rank', 'regions', 'memory', 'caches', 'requests']);
  });

  it('ignores unknown fields', () => {
    const b = repack(encodeTransferMetadata(metadata()), (m) => m.set('prefix_replay', [1, 2]));
    expect(decodeTransferMetadata(b)).toEqual(metadata());
  });

  const bad: Array<[string, (m: Map<string, unknown>) => void, RegExp]> = [
    ['a missing field', (m) => m.delete('caches'), /caches: required/],
    ['tp_rank >= tp_size', (m) => m.set('tp_rank', 2), /tp_rank: 2 exceeds 1/],
    ['tp_size 0', (m) => m.set('tp_size', 0), /tp_size/],
    ['a float rank', (m) => m.set('pp_rank', 0.5), /pp_rank: expected a non-negative integer/],
    ['a negative address', (m) => m.set('regions', [[-1, 10]]), /regions\[0\]\[0\]/],
    ['agent metadata as a string', (m) => m.set('agent_metadata', 'abc'), /agent_metadata: expected a bin/],
    ['an empty engine id', (m) => m.set('engine_id', ''), /engine_id: must not be empty/],
    ['no memory (a version-2 message)', (m) => m.delete('memory'), /memory: required/],
    ['an unknown memory kind', (m) => m.set('memory', ['HBM', 0]), /memory\[0\]: expected "DRAM" or "VRAM"/],
    ['host memory on a device other than 0', (m) => m.set('memory', ['DRAM', 2]), /memory\[1\]: DRAM is device 0/],
    ['a memory device out of range', (m) => m.set('memory', ['VRAM', 70_000]), /memory\[1\]: 70000 exceeds 65535/],
    ['a too long engine id', (m) => m.set('engine_id', 'x'.repeat(LIMITS.idLength + 1)), /engine_id: longer than/],
    ['requests as an array', (m) => m.set('requests', []), /requests: expected a map/],
    ['a request key that is a number', (m) => m.set('requests', new Map([[5, ['x', [[1]], 0, 1]]])), /requests key: expected a string/],
    ['num_tokens <= first_token', (m) => m.set('requests', new Map([['r', ['x', [[1]], 4, 4, null]]])), /must exceed first_token/],
    ['a block id that is not an integer', (m) => m.set('requests', new Map([['r', ['x', [['7']], 0, 1, null]]])), /expected a block id/],
    ['a request of four elements (version 5)', (m) => m.set('requests', new Map([['r', ['x', [[1]], 0, 1]]])), /expected \[transfer_id, blocks, first_token, num_tokens, lease_capability\]/],
    ['a malformed lease capability (its value is not echoed)', (m) => m.set('requests', new Map([['r', ['x', [[1]], 0, 1, 'F'.repeat(63) + 'q']]])), /requests\["r"\]\[4\]: expected nil or 64 lowercase hex digits$/],
    ['too many groups', (m) => m.set('requests', new Map([['r', ['x', Array.from({ length: LIMITS.groups + 1 }, () => []), 0, 1, null]]])), /more than 64 entries/],
    [
      'a part in a region not advertised',
      (m) => {
        const c = (m.get('caches') as Array<Map<string, unknown>>)[0];
        (c.get('parts') as unknown[][])[0][0] = 7;
      },
      /region 7 not among the 2 advertised/,
    ],
    ['an unknown cache kind', (m) => ((m.get('caches') as Array<Map<string, unknown>>)[0].set('kind', 'mla'), undefined), /expected "attention" or "state"/],
    ['an unknown dtype', (m) => ((m.get('caches') as Array<Map<string, unknown>>)[0].set('dtype', 'float128'), undefined), /unknown dtype/],
    [
      'a split that does not partition its axis',
      (m) => {
        const s = ((m.get('caches') as Array<Map<string, unknown>>)[1].get('states') as unknown[][])[0];
        s[6] = [0, [[1, 1]]];
      },
      /do not partition/,
    ],
    [
      'strides of another rank than the shape',
      (m) => {
        const s = ((m.get('caches') as Array<Map<string, unknown>>)[1].get('states') as unknown[][])[0];
        s[5] = [4];
      },
      /1 strides for 2 dimensions/,
    ],
  ];
  for (const [what, f, re] of bad) {
    it(`rejects ${what}`, () => {
      const b = repack(encodeTransferMetadata(metadata()), f);
      expect(() => decodeTransferMetadata(b)).toThrow(MooncakeProtocolError);
      expect(() => decodeTransferMetadata(b)).toThrow(re);
    });
  }

  it('rejects a message over the size limit before parsing it', () => {
    const b = encodeTransferMetadata(metadata());
    expect(() => decodeTransferMetadata(b, b.byteLength - 1)).toThrow(/exceed the limit/);
    expect(decodeTransferMetadata(b, b.byteLength).engineId).toBe('consumer-0');
  });

  it('copies bins out of the message buffer', () => {
    const b = encodeTransferMetadata(metadata());
    const m = decodeTransferMetadata(b);
    b.fill(0);
    expect([...m.agentMetadata]).toEqual([1, 2, 3, 4]);
  });
});

describe('transfer response', () => {
  it('round-trips', () => {
    expect(decodeTransferResponse(encodeTransferResponse(response()))).toEqual(response());
  });

  it('carries kv_checksums as a map of request id to bin (SPEC 7)', () => {
    const m = raw(encodeTransferResponse(response()));
    const kc = m.get('kv_checksums') as Map<string, Uint8Array>;
    expect(kc).toBeInstanceOf(Map);
    expect([...kc.get('req-a')!]).toEqual([9, 8, 7]);
  });

  it('leaves kv_checksums out when empty', () => {
    const m = raw(encodeTransferResponse({ ...response(), kvChecksums: new Map() }));
    expect(m.has('kv_checksums')).toBe(false);
    expect(decodeTransferResponse(encodeTransferResponse({ ...response(), kvChecksums: new Map() })).kvChecksums.size).toBe(0);
  });

  it('accepts an older peer: only status (lists and message absent)', () => {
    const r = decodeTransferResponse(new Uint8Array(packr.pack(new Map([['status', 0]]))));
    expect(r).toEqual({ status: 0, okReqs: [], errReqs: [], errMsg: undefined, kvChecksums: new Map() });
  });

  it('ignores unknown fields', () => {
    const b = repack(encodeTransferResponse(response()), (m) => m.set('prefix_replay_checkpoints', new Map([['x', 1]])).set('zzz', null));
    expect(decodeTransferResponse(b)).toEqual(response());
  });

  const bad: Array<[string, (m: Map<string, unknown>) => void, RegExp]> = [
    ['no status', (m) => m.delete('status'), /status: required/],
    ['status 3', (m) => m.set('status', 3), /status: 3 exceeds 2/],
    ['ok_reqs holding a number', (m) => m.set('ok_reqs', [1]), /ok_reqs\[0\]: expected a string/],
    ['kv_checksums as a list', (m) => m.set('kv_checksums', [1]), /kv_checksums: expected a map/],
    ['a checksum payload as a string', (m) => m.set('kv_checksums', new Map([['req-a', 'abc']])), /expected a bin/],
    ['a checksum payload over the limit', (m) => m.set('kv_checksums', new Map([['req-a', new Uint8Array(LIMITS.payloadBytes + 1)]])), /exceed the limit/],
    ['err_msg as a number', (m) => m.set('err_msg', 5), /err_msg: expected a string/],
  ];
  for (const [what, f, re] of bad) {
    it(`rejects ${what}`, () => {
      const b = repack(encodeTransferResponse(response()), f);
      expect(() => decodeTransferResponse(b)).toThrow(re);
    });
  }

  it('rejects non-maps, trailing garbage and non-MessagePack', () => {
    const trailing = new Uint8Array([...encodeTransferResponse(response()), 0x00]);
    for (const b of [trailing, new Uint8Array(packr.pack([0, [], []])), new Uint8Array([0xc1]), new Uint8Array([]), new Uint8Array([0xdf, 0xff, 0xff, 0xff, 0xff])]) {
      expect(() => decodeTransferResponse(b)).toThrow(MooncakeProtocolError);
    }
  });

  it('rejects deeply nested input with a typed error (no stack overflow escapes)', () => {
    const deep = new Uint8Array(200_000).fill(0x91);
    expect(() => decodeTransferResponse(deep)).toThrow(MooncakeProtocolError);
    expect(() => decodeTransferMetadata(deep)).toThrow(MooncakeProtocolError);
  });
});

/** Runs `f`; returns 'ok' or 'protocol' and fails the test for any other exception. */
function outcome(f: () => unknown): 'ok' | 'protocol' {
  try {
    f();
    return 'ok';
  } catch (e) {
    if (e instanceof MooncakeProtocolError) return 'protocol';
    throw e;
  }
}

describe('fuzz', () => {
  const decoders = [
    (b: Uint8Array) => decodeTransferMetadata(b),
    (b: Uint8Array) => decodeTransferResponse(b),
  ];

  it('random bytes: a typed error or a valid message, never another exception', () => {
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 256 }), (b) => {
        for (const d of decoders) outcome(() => d(b));
      }),
      { numRuns: 3000 },
    );
  });

  it('mutated valid messages (byte flips, truncation, insertion)', () => {
    const seeds = [encodeTransferMetadata(metadata()), encodeTransferResponse(response())];
    fc.assert(
      fc.property(
        fc.integer({ min: 0, max: 1 }),
        fc.array(fc.tuple(fc.nat(), fc.integer({ min: 0, max: 255 }), fc.integer({ min: 0, max: 2 })), { minLength: 1, maxLength: 6 }),
        (which, edits) => {
          let b = Array.from(seeds[which]);
          for (const [pos, val, kind] of edits) {
            const i = pos % (b.length + 1);
            if (kind === 0 && i < b.length) b[i] = val;
            else if (kind === 1) b = b.slice(0, i);
            else b.splice(i, 0, val);
          }
          const bytes = new Uint8Array(b);
          for (const d of decoders) {
            const r = outcome(() => d(bytes));
            if (r === 'ok' && d === decoders[1]) {
              // A decoded response is well typed.
              const x = decodeTransferResponse(bytes);
              expect([0, 1, 2]).toContain(x.status);
              for (const id of [...x.okReqs, ...x.errReqs]) expect(typeof id).toBe('string');
              for (const v of x.kvChecksums.values()) expect(v).toBeInstanceOf(Uint8Array);
            }
          }
        },
      ),
      { numRuns: 5000 },
    );
  });

  it('arbitrary MessagePack values (maps with the right keys and wrong values)', () => {
    const keys = ['status', 'ok_reqs', 'err_reqs', 'err_msg', 'kv_checksums', 'agent_metadata', 'backend', 'engine_id', 'tp_size', 'tp_rank', 'pp_size', 'pp_rank', 'regions', 'memory', 'caches', 'requests'];
    const value = fc.oneof(fc.anything({ maxDepth: 3 }), fc.uint8Array({ maxLength: 8 }), fc.integer(), fc.double(), fc.constant(null));
    fc.assert(
      fc.property(fc.array(fc.tuple(fc.constantFrom(...keys), value), { maxLength: 12 }), (entries) => {
        let bytes: Uint8Array;
        try {
          bytes = new Uint8Array(packr.pack(new Map(entries)));
        } catch {
          return; // not encodable by msgpackr
        }
        for (const d of decoders) outcome(() => d(bytes));
      }),
      { numRuns: 3000 },
    );
  });

  it('well-formed responses with random content decode to exactly what was encoded', () => {
    const id = fc.string({ minLength: 1, maxLength: 20 });
    fc.assert(
      fc.property(
        fc.constantFrom(0, 1, 2),
        fc.array(id, { maxLength: 5 }),
        fc.array(id, { maxLength: 5 }),
        fc.option(fc.string({ maxLength: 50 }), { nil: undefined }),
        fc.array(fc.tuple(id, fc.uint8Array({ maxLength: 40 })), { maxLength: 4 }),
        (status, ok, err, msg, cks) => {
          const r: TransferResponse = { status: status as 0 | 1 | 2, okReqs: ok, errReqs: err, errMsg: msg, kvChecksums: new Map(cks) };
          expect(decodeTransferResponse(encodeTransferResponse(r))).toEqual(r);
        },
      ),
      { numRuns: 1000 },
    );
  });
});

describe('one set of strict decoders', () => {
  it('nixl-common\'s codec and this side channel report a defect through the same helper, each with its own error type', () => {
    expect(() => nixlStr(5, 'err_msg', 10)).toThrow(NixlDecodeError);
    expect(() => nixlStr(5, 'err_msg', 10)).toThrow(/^err_msg: expected a string, got number 5$/);
    const resp = new Uint8Array(packr.pack(new Map<string, unknown>([['status', 0], ['err_msg', 5]])));
    expect(() => decodeTransferResponse(resp)).toThrow(MooncakeProtocolError);
    expect(() => decodeTransferResponse(resp)).toThrow(/: err_msg: expected a string, got number 5$/);
  });
});

describe('localize request and reply (protocol 4)', () => {
  const query = { rangeTokens: 16, groups: [{ groupId: 0, tokenStart: 16, tokenEnd: 40 }, { groupId: 3, tokenStart: 0, tokenEnd: 0 }] };

  it('a request round-trips; its wire form is the documented map', () => {
    const bytes = encodeLocalizeRequest({ transferId: 't-1', query });
    expect(decodeLocalizeRequest(bytes)).toEqual({ transferId: 't-1', query });
    const m = unpackr.unpack(bytes) as Map<string, unknown>;
    expect([...m.keys()]).toEqual(['transfer_id', 'range_tokens', 'groups']);
    expect(m.get('groups')).toEqual([[0, 16, 40], [3, 0, 0]]);
  });

  it('a malformed request is a MooncakeProtocolError naming the field', () => {
    const enc = (o: Record<string, unknown>) => new Uint8Array(packr.pack(new Map(Object.entries({ transfer_id: 't', range_tokens: 16, groups: [[0, 0, 16]], ...o }))));
    const cases: Array<[Record<string, unknown>, RegExp]> = [
      [{ transfer_id: '' }, /transfer_id/],
      [{ range_tokens: 0 }, /range_tokens/],
      [{ range_tokens: (1 << 20) + 1 }, /range_tokens/],
      [{ groups: [[64, 0, 16]] }, /groups\[0\]\[0\]/],
      [{ groups: [[0, 0, 16], [0, 16, 32]] }, /repeated/],
      [{ groups: [[0, 32, 16]] }, /tokenEnd before tokenStart/],
      [{ groups: [[0, 0, 16 * 1025]] }, /more than 1024 token ranges/],
      [{ groups: [[0, 0]] }, /groups\[0\]/],
      [{ groups: Array.from({ length: 65 }, (_, i) => [i, 0, 1]) }, /groups/],
    ];
    for (const [o, re] of cases) expect(() => decodeLocalizeRequest(enc(o)), JSON.stringify(o)).toThrow(re);
    for (const junk of [new Uint8Array([0xc1]), new Uint8Array(packr.pack([1, 2]))]) expect(() => decodeLocalizeRequest(junk)).toThrow(MooncakeProtocolError);
    const { transfer_id: _t, ...noId } = { transfer_id: 1, range_tokens: 16, groups: [] };
    expect(() => decodeLocalizeRequest(new Uint8Array(packr.pack(new Map(Object.entries(noId)))))).toThrow(/transfer_id: required/);
  });

  it('a reply round-trips (held with fine sums and an error, gone); a malformed one is a MooncakeProtocolError', () => {
    const held = {
      status: 'held' as const,
      groups: [
        { groupId: 0, sums: [{ layer: 1, head: 2, part: 'V' as const, segment: -1, tokenStart: 16, tokenEnd: 32, replicas: 1, replica: 0, value: 0xfedcba9876543210n }] },
        { groupId: 3, sums: [], error: 'device memory' },
      ],
    };
    expect(decodeLocalizeReply(encodeLocalizeReply(held))).toEqual(held);
    expect(decodeLocalizeReply(encodeLocalizeReply({ status: 'gone', detail: 'transfer t: unknown transfer' }))).toEqual({ status: 'gone', detail: 'transfer t: unknown transfer' });
    expect(() => decodeLocalizeReply(new Uint8Array(packr.pack(new Map([['answer', [0, [[0, [[1, 2, 1, 0, 16, 32, 1, 0]], new Uint8Array(7), null]]]]]))))).toThrow(MooncakeProtocolError);
    expect(() => decodeLocalizeReply(new Uint8Array(packr.pack(new Map([['other', 1]]))))).toThrow(/answer: required/);
  });
});
