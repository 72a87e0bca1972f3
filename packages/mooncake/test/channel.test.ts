/**
 * The side channel's envelope (protocol version 2: version and compatibility hash checked first)
 * and its authentication (`channel.ts`): the hello / welcome handshake with and without a cluster
 * secret, proofs over every message, replays, stale hellos, and the session caps.
 */
import { describe, expect, it } from 'vitest';
import { Packr } from 'msgpackr';
import { ConsumerSession, ProducerSessions, SIDE_CHANNEL_AUTH_WINDOW_MS, SideChannelAuthError, welcomeProof } from '../src/channel.js';
import { MOONCAKE_COMPAT_HASH, MOONCAKE_PROTOCOL_VERSION, MooncakeIncompatibleError, MooncakeProtocolError, decodeEnvelope, encodeEnvelope, type SideEnvelope } from '../src/protocol.js';

const SECRET = Buffer.from('a-cluster-secret-for-tests');
const OTHER = Buffer.from('another-cluster-secret-000');
const packr = new Packr({ useRecords: false, variableMapSize: true });
/** Every envelope crosses the wire in these tests: encoded, then decoded strictly. */
const wire = (e: SideEnvelope) => decodeEnvelope(encodeEnvelope(e));
const sessions = (secret: Buffer | null, o: Partial<{ maxSessions: number; idleMs: number; now: () => number }> = {}) => new ProducerSessions(secret, { maxSessions: 8, idleMs: 60_000, ...o });

function handshake(p: ProducerSessions, c: ConsumerSession, peer = 'peer-1'): void {
  const w = wire(p.hello(peer, wire(c.hello())));
  expect(w.kind).toBe('welcome');
  c.welcome(w);
}

describe('envelope', () => {
  it('round-trips every field and carries this side\'s version and compatibility hash', () => {
    const e = wire({ kind: 'md', seq: 7, body: new Uint8Array([1, 2, 3]), proof: new Uint8Array(32).fill(9) });
    expect(e).toMatchObject({ kind: 'md', version: MOONCAKE_PROTOCOL_VERSION, compat: MOONCAKE_COMPAT_HASH, seq: 7 });
    expect([...e.body!]).toEqual([1, 2, 3]);
    expect(MOONCAKE_COMPAT_HASH).toMatch(/^[0-9a-f]{16}$/);
  });

  it('another version, another compatibility hash, or no envelope at all (version 1): MooncakeIncompatibleError', () => {
    const other = encodeEnvelope({ kind: 'hello', cn: new Uint8Array(16), ts: 1, version: MOONCAKE_PROTOCOL_VERSION + 1 });
    expect(() => decodeEnvelope(other)).toThrow(MooncakeIncompatibleError);
    expect(() => decodeEnvelope(other)).toThrow(new RegExp(`version ${MOONCAKE_PROTOCOL_VERSION + 1}`));
    expect(() => decodeEnvelope(encodeEnvelope({ kind: 'hello', cn: new Uint8Array(16), ts: 1, compat: '0123456789abcdef' }))).toThrow(/compatibility hash 0123456789abcdef/);
    const v1 = new Uint8Array(packr.pack(new Map<string, unknown>([['status', 0], ['ok_reqs', []]])));
    try {
      decodeEnvelope(v1);
      expect.unreachable();
    } catch (e) {
      expect(e).toBeInstanceOf(MooncakeIncompatibleError);
      expect((e as MooncakeIncompatibleError).peerVersion).toBe(1);
    }
  });

  it('missing or malformed fields: MooncakeProtocolError naming them', () => {
    expect(() => wire({ kind: 'hello', ts: 1 })).toThrow(/cn: required in a hello message/);
    expect(() => wire({ kind: 'md', seq: 1 })).toThrow(/body: required/);
    expect(() => wire({ kind: 'welcome', cn: new Uint8Array(15), sn: new Uint8Array(16) })).toThrow(/cn: expected a bin of 16 bytes/);
    expect(() => decodeEnvelope(encodeEnvelope({ kind: 'nope' as never }))).toThrow(/unknown kind/);
    expect(() => decodeEnvelope(new Uint8Array([0xc1]))).toThrow(MooncakeProtocolError);
  });
});

describe('handshake and proofs', () => {
  for (const secret of [null, SECRET]) {
    it(`${secret ? 'with' : 'without'} a cluster secret: metadata and responses flow in order`, () => {
      const p = sessions(secret);
      const c = new ConsumerSession(secret);
      handshake(p, c);
      for (let i = 0; i < 3; i++) {
        const md = wire(c.seal(new Uint8Array([i])));
        expect(md.proof !== undefined).toBe(secret !== null);
        const o = p.open('peer-1', md);
        expect('body' in o && [...o.body]).toEqual([i]);
        expect([...c.open(wire(p.seal('peer-1', new Uint8Array([10 + i]))!))]).toEqual([10 + i]);
      }
    });
  }

  it('loc (protocol 4) is sealed with its own proof kind: an md proof does not open as loc, nor the reverse', () => {
    const p = sessions(SECRET);
    const c = new ConsumerSession(SECRET);
    handshake(p, c);
    const loc = wire(c.seal(new Uint8Array([7]), 'loc'));
    expect(loc.kind).toBe('loc');
    const o = p.open('peer-1', loc);
    expect('body' in o && [...o.body]).toEqual([7]);
    // The same body and seq under the other kind: the proof does not check.
    const md = wire(c.seal(new Uint8Array([8])));
    expect(p.open('peer-1', { ...md, kind: 'loc' })).toMatchObject({ refuse: { code: 'unauthenticated' } });
    const loc2 = wire(c.seal(new Uint8Array([9]), 'loc'));
    expect(p.open('peer-1', { ...loc2, kind: 'md' })).toMatchObject({ refuse: { code: 'unauthenticated' } });
  });

  it('a producer with a secret refuses a hello without a proof, with a wrong one, or a stale one', () => {
    const p = sessions(SECRET);
    expect(wire(p.hello('a', wire(new ConsumerSession(null).hello())))).toMatchObject({ kind: 'refuse', code: 'unauthenticated' });
    expect(wire(p.hello('a', wire(new ConsumerSession(OTHER).hello())))).toMatchObject({ kind: 'refuse', code: 'unauthenticated', message: expect.stringMatching(/wrong hello proof/) });
    const stale = wire(new ConsumerSession(SECRET).hello(Date.now() - SIDE_CHANNEL_AUTH_WINDOW_MS - 1000));
    expect(wire(p.hello('a', stale))).toMatchObject({ kind: 'refuse', message: expect.stringMatching(/stale hello/) });
    expect(p.size).toBe(0);
  });

  it('a replayed hello opens no session and evicts none (hostile trial); a fresh hello of the same consumer does', () => {
    const p = new ProducerSessions(SECRET, { maxSessions: 2, idleMs: 60_000 });
    const c = new ConsumerSession(SECRET);
    const h = wire(c.hello(Date.now() - 10));
    expect(wire(p.hello('genuine', h))).toMatchObject({ kind: 'welcome' });
    for (const peer of ['x1', 'x2', 'x3']) expect(wire(p.hello(peer, h))).toMatchObject({ kind: 'refuse', code: 'unauthenticated', message: expect.stringMatching(/replayed hello/) });
    expect(p.size).toBe(1);
    expect(wire(p.hello('genuine', wire(c.hello(Date.now()))))).toMatchObject({ kind: 'welcome' });
  });

  it('a consumer with a secret sends nothing to a producer that cannot prove it (no proof, another secret)', () => {
    for (const producerSecret of [null, OTHER]) {
      const c = new ConsumerSession(SECRET);
      const hello = wire(c.hello());
      // The rogue producer answers as well as it can.
      const w: SideEnvelope = { kind: 'welcome', cn: hello.cn, sn: new Uint8Array(16).fill(1) };
      if (producerSecret) w.proof = welcomeProof(producerSecret, hello.cn!, w.sn!);
      expect(() => c.welcome(wire(w))).toThrow(SideChannelAuthError);
      expect(() => c.seal(new Uint8Array([1]))).toThrow(/no welcome yet/);
    }
  });

  it('a consumer without a secret is told to set one when the producer proves one', () => {
    const c = new ConsumerSession(null);
    const hello = wire(c.hello());
    const sn = new Uint8Array(16).fill(2);
    expect(() => c.welcome(wire({ kind: 'welcome', cn: hello.cn, sn, proof: welcomeProof(SECRET, hello.cn!, sn) }))).toThrow(/set cluster_secret or KVCONNECT_CLUSTER_SECRET/);
  });

  it('a welcome for another hello is refused', () => {
    const c = new ConsumerSession(null);
    c.hello();
    expect(() => c.welcome(wire({ kind: 'welcome', cn: new Uint8Array(16).fill(3), sn: new Uint8Array(16) }))).toThrow(/another hello/);
  });

  it('replayed, reordered or tampered messages are refused, both ways', () => {
    const p = sessions(SECRET);
    const c = new ConsumerSession(SECRET);
    handshake(p, c);
    const m1 = wire(c.seal(new Uint8Array([1])));
    expect('body' in p.open('peer-1', m1)).toBe(true);
    expect(p.open('peer-1', m1)).toMatchObject({ refuse: { code: 'unauthenticated', message: expect.stringMatching(/replayed/) } });
    const m2 = wire(c.seal(new Uint8Array([2])));
    expect(p.open('peer-1', { ...m2, body: new Uint8Array([3]) })).toMatchObject({ refuse: { message: expect.stringMatching(/proof/) } });
    expect(p.open('peer-1', { ...m2, proof: undefined })).toMatchObject({ refuse: { message: expect.stringMatching(/proof/) } });
    // A message of this session replayed from another connection: no session there.
    expect(p.open('peer-2', m2)).toMatchObject({ refuse: { code: 'no-session' } });
    const r1 = wire(p.seal('peer-1', new Uint8Array([9]))!);
    expect([...c.open(r1)]).toEqual([9]);
    expect(() => c.open(r1)).toThrow(/replayed/);
    const r2 = wire(p.seal('peer-1', new Uint8Array([8]))!);
    expect(() => c.open({ ...r2, body: new Uint8Array([7]) })).toThrow(/valid proof/);
  });

  it('messages of one session do not verify in another (fresh nonces per connection)', () => {
    const p = sessions(SECRET);
    const c1 = new ConsumerSession(SECRET);
    const c2 = new ConsumerSession(SECRET);
    handshake(p, c1, 'peer-1');
    handshake(p, c2, 'peer-2');
    const m = wire(c1.seal(new Uint8Array([1])));
    expect(p.open('peer-2', m)).toMatchObject({ refuse: { message: expect.stringMatching(/proof/) } });
  });
});

describe('session bounds', () => {
  it('at most maxSessions; the least recently used goes first', () => {
    const p = sessions(null, { maxSessions: 3 });
    const cs = Array.from({ length: 5 }, () => new ConsumerSession(null));
    cs.forEach((c, i) => handshake(p, c, `peer-${i}`));
    expect(p.size).toBe(3);
    expect(p.open('peer-0', wire(cs[0].seal(new Uint8Array([1]))))).toMatchObject({ refuse: { code: 'no-session' } });
    expect('body' in p.open('peer-4', wire(cs[4].seal(new Uint8Array([1]))))).toBe(true);
  });

  it('sessions idle longer than idleMs are forgotten', () => {
    let now = 1_000_000;
    const p = sessions(null, { idleMs: 1000, now: () => now });
    const a = new ConsumerSession(null);
    handshake(p, a, 'a');
    now += 2000;
    handshake(p, new ConsumerSession(null), 'b');
    expect(p.size).toBe(1);
    expect(p.open('a', wire(a.seal(new Uint8Array([1]))))).toMatchObject({ refuse: { code: 'no-session' } });
  });
});
