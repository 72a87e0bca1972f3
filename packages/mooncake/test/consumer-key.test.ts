/**
 * Protocol 5's consumer key (`consumer_key` in `md` and `loc`, `@kvconnect/nixl-common`
 * consumer-binding.ts) and refusal codes `forbidden` / `busy`: what the codecs put on the wire,
 * read back, and refuse (MooncakeProtocolError).
 */
import { describe, expect, it } from 'vitest';
import { newConsumerKey } from '@kvconnect/nixl-common';
import { Packr, Unpackr } from 'msgpackr';
import {
  MOONCAKE_PROTOCOL_VERSION,
  MooncakeProtocolError,
  decodeEnvelope,
  decodeLocalizeRequest,
  decodeTransferMetadata,
  encodeEnvelope,
  encodeLocalizeRequest,
  encodeTransferMetadata,
  type TransferMetadata,
} from '../src/protocol.js';

const packr = new Packr({ useRecords: false, variableMapSize: true });
const unpackr = new Unpackr({ useRecords: false, mapsAsObjects: false });
const raw = (b: Uint8Array) => unpackr.unpack(b) as Map<string, unknown>;
const repack = (b: Uint8Array, f: (m: Map<string, unknown>) => void) => {
  const m = raw(b);
  f(m);
  return new Uint8Array(packr.pack(m));
};
const md = (consumerKey?: string): TransferMetadata => ({
  agentMetadata: new Uint8Array([1]),
  backend: 'embedded',
  engineId: 'c',
  tpSize: 1,
  tpRank: 0,
  ppSize: 1,
  ppRank: 0,
  regions: [],
  memory: { kind: 'DRAM', deviceId: 0 },
  caches: [],
  requests: new Map([['r', { transferId: 't', blocks: [[1]], firstToken: 0, numTokens: 4 }]]),
  ...(consumerKey ? { consumerKey } : {}),
});
const query = { rangeTokens: 16, groups: [{ groupId: 0, tokenStart: 0, tokenEnd: 16 }] };

describe('consumer keys on the Mooncake side channel (protocol 5)', () => {
  it('is protocol 5 or later (6 adds lease capabilities: lease-capability.test.ts)', () => {
    expect(MOONCAKE_PROTOCOL_VERSION).toBeGreaterThanOrEqual(5);
  });

  it('md and loc carry consumer_key (32 lowercase hex digits) and read it back; absent or nil: none', () => {
    const key = newConsumerKey();
    expect(raw(encodeTransferMetadata(md(key))).get('consumer_key')).toBe(key);
    expect(decodeTransferMetadata(encodeTransferMetadata(md(key))).consumerKey).toBe(key);
    expect(raw(encodeTransferMetadata(md())).has('consumer_key')).toBe(false);
    expect(decodeTransferMetadata(encodeTransferMetadata(md())).consumerKey).toBeUndefined();
    expect(decodeTransferMetadata(repack(encodeTransferMetadata(md()), (m) => m.set('consumer_key', null))).consumerKey).toBeUndefined();
    const loc = encodeLocalizeRequest({ transferId: 't', query, consumerKey: key });
    expect([...raw(loc).keys()]).toEqual(['transfer_id', 'range_tokens', 'groups', 'consumer_key']);
    expect(decodeLocalizeRequest(loc)).toEqual({ transferId: 't', query, consumerKey: key });
    expect(decodeLocalizeRequest(encodeLocalizeRequest({ transferId: 't', query }))).toEqual({ transferId: 't', query });
  });

  it('refuses a malformed consumer_key in md and loc', () => {
    for (const bad of ['AB'.repeat(16), 'ab'.repeat(15), 'ab'.repeat(17), 'zz'.repeat(16), 7, new Uint8Array(16)]) {
      expect(() => decodeTransferMetadata(repack(encodeTransferMetadata(md()), (m) => m.set('consumer_key', bad))), String(bad)).toThrow(MooncakeProtocolError);
      expect(() => decodeLocalizeRequest(repack(encodeLocalizeRequest({ transferId: 't', query }), (m) => m.set('consumer_key', bad))), String(bad)).toThrow(/consumer_key: expected 32 lowercase hex digits/);
    }
  });

  it('refusal codes forbidden and busy read back; an unknown code reads as bad-message', () => {
    for (const code of ['forbidden', 'busy'] as const) expect(decodeEnvelope(encodeEnvelope({ kind: 'refuse', code, message: 'm' }))).toMatchObject({ kind: 'refuse', code });
    expect(decodeEnvelope(encodeEnvelope({ kind: 'refuse', code: 'later' as never, message: 'm' }))).toMatchObject({ code: 'bad-message' });
  });
});
