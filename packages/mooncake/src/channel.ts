/**
 * Authentication and sessions of the MooncakeConnector side channel (protocol version 2, the
 * envelopes of `protocol.ts`). `docs/security.md (Mooncake)` describes the model; the proofs are
 * `@kvconnect/transfer`'s `makeProof` / `checkProof` (HMAC-SHA256 with the cluster secret).
 *
 * Per connection (a consumer worker's DEALER to a producer worker's ROUTER):
 * 1. consumer -> producer `hello {cn, ts, proof?}`: `cn` 16 fresh random bytes, `ts` ms since
 *    the epoch; with a secret `proof = P("hello", v, compat, cn, ts)`. The producer refuses a
 *    missing or wrong proof, or a `ts` more than {@link SIDE_CHANNEL_AUTH_WINDOW_MS} away from its
 *    clock, and else opens a session for the DEALER's routing id (replacing an older one).
 * 2. producer -> consumer `welcome {cn, sn, proof?}`: `sn` 16 fresh random bytes; with a secret
 *    `proof = P("welcome", v, compat, cn, sn)`. The consumer checks the proof for its own `cn`,
 *    and only then sends its transfer metadata (which holds its agent's metadata).
 * 3. `md {seq, body, proof?}` and `resp {seq, body, proof?}`: `seq` counts 1, 2, ... per
 *    direction; with a secret `proof = P("md" | "resp", v, compat, cn, sn, seq, body)`. A
 *    message whose `seq` is not above the last one accepted is a replay and is refused.
 *    `loc {seq, body, proof?}` (version 4, a drill-down's question, `docs/localize.md`) is sealed
 *    as `md` with `P("loc", ...)` and counts in the same `seq`.
 * `P(kind, ...)` is `makeProof(secret, "mooncake-side-channel/" + kind, ...)` with numbers in
 * decimal. Without a secret the same messages flow without proofs (the listeners are then on
 * loopback only). A side with a secret refuses a peer without one, and the reverse.
 * @module
 */
import { checkProof, makeNonce, makeProof } from '@kvconnect/transfer';
import { MOONCAKE_COMPAT_HASH, MOONCAKE_PROTOCOL_VERSION, type RefuseCode, type SideEnvelope } from './protocol.js';

/** How far a hello's timestamp may be from the producer's clock, ms. */
export const SIDE_CHANNEL_AUTH_WINDOW_MS = 30_000;

/** Accepted hellos remembered for replay detection, at most (the oldest go first). */
const MAX_SEEN_HELLOS = 65_536;

/** A side-channel peer failed authentication or the handshake (`code` says how). */
export class SideChannelAuthError extends Error {
  constructor(
    readonly code: RefuseCode,
    message: string,
  ) {
    super(`mooncake side channel: ${message}`);
    this.name = 'SideChannelAuthError';
  }
}

const CTX = 'mooncake-side-channel/';
const V = () => [String(MOONCAKE_PROTOCOL_VERSION), MOONCAKE_COMPAT_HASH] as const;

/** The proof of a hello. */
export function helloProof(secret: Uint8Array, cn: Uint8Array, ts: number): Buffer {
  return makeProof(secret, `${CTX}hello`, ...V(), cn, String(ts));
}

/** The proof of a welcome. */
export function welcomeProof(secret: Uint8Array, cn: Uint8Array, sn: Uint8Array): Buffer {
  return makeProof(secret, `${CTX}welcome`, ...V(), cn, sn);
}

/** The proof of an `md` or `resp` message. */
export function messageProof(secret: Uint8Array, kind: 'md' | 'resp' | 'loc', cn: Uint8Array, sn: Uint8Array, seq: number, body: Uint8Array): Buffer {
  return makeProof(secret, `${CTX}${kind}`, ...V(), cn, sn, String(seq), body);
}

const refuse = (code: RefuseCode, message: string): SideEnvelope => ({ kind: 'refuse', code, message });

/**
 * One producer-side session (a consumer worker connection that said hello). Opaque outside this
 * module: {@link ProducerSessions.open} hands it out and {@link ProducerSessions.seal} takes it,
 * so the answers to an accepted message go out even when the session was dropped since.
 */
export interface ProducerSession {
  cn: Uint8Array;
  sn: Uint8Array;
  seqIn: number;
  seqOut: number;
  lastUsed: number;
}

/** Options of {@link ProducerSessions}. */
export interface ProducerSessionOptions {
  /** Most sessions kept; the least recently used goes first. */
  maxSessions: number;
  /** A session unused this long is forgotten, ms. */
  idleMs: number;
  /** The clock (tests). */
  now?: () => number;
}

/** The producer worker's sessions, by peer (the DEALER's routing id, hex). */
export class ProducerSessions {
  private readonly sessions = new Map<string, ProducerSession>();
  /** Hellos accepted within the auth window (nonce and timestamp -> when it may be forgotten): a replayed one is refused. */
  private readonly seenHellos = new Map<string, number>();
  private readonly now: () => number;

  constructor(
    private readonly secret: Uint8Array | null,
    private readonly o: ProducerSessionOptions,
  ) {
    this.now = o.now ?? Date.now;
  }

  /** Sessions kept. */
  get size(): number {
    return this.sessions.size;
  }

  private sweep(now: number): void {
    for (const [k, s] of this.sessions) {
      if (now - s.lastUsed <= this.o.idleMs) break; // least recently used first
      this.sessions.delete(k);
    }
  }

  /** Answers a hello: a welcome (a new session for `peer`), or a refusal. */
  hello(peer: string, e: SideEnvelope): SideEnvelope {
    const now = this.now();
    if (this.secret) {
      if (!e.proof) return refuse('unauthenticated', 'this producer requires the cluster secret (set cluster_secret or KVCONNECT_CLUSTER_SECRET)');
      if (Math.abs(now - e.ts!) > SIDE_CHANNEL_AUTH_WINDOW_MS) return refuse('unauthenticated', `stale hello (timestamp ${e.ts}, producer clock ${now})`);
      if (!checkProof(e.proof, this.secret, `${CTX}hello`, ...V(), e.cn!, String(e.ts))) return refuse('unauthenticated', 'wrong hello proof (another cluster secret?)');
      // A captured hello replayed from other connections must not open sessions (and evict real ones).
      for (const [k, until] of this.seenHellos) {
        if (until > now && this.seenHellos.size < MAX_SEEN_HELLOS) break; // oldest first
        this.seenHellos.delete(k);
      }
      const key = `${Buffer.from(e.cn!).toString('hex')}:${e.ts}`;
      if (this.seenHellos.has(key)) return refuse('unauthenticated', 'replayed hello (this nonce and timestamp opened a session already)');
      this.seenHellos.set(key, e.ts! + 2 * SIDE_CHANNEL_AUTH_WINDOW_MS);
    }
    this.sweep(now);
    this.sessions.delete(peer);
    while (this.sessions.size >= this.o.maxSessions) this.sessions.delete(this.sessions.keys().next().value!);
    const sn = makeNonce();
    this.sessions.set(peer, { cn: e.cn!, sn, seqIn: 0, seqOut: 0, lastUsed: now });
    const w: SideEnvelope = { kind: 'welcome', cn: e.cn, sn };
    if (this.secret) w.proof = welcomeProof(this.secret, e.cn!, sn);
    return w;
  }

  /**
   * Opens an `md` (or `loc`) message of `peer`: its body and session when the session, the sequence number
   * and the proof check out, else the refusal to send back.
   */
  open(peer: string, e: SideEnvelope): { body: Uint8Array; session: ProducerSession } | { refuse: SideEnvelope } {
    const s = this.sessions.get(peer);
    if (!s) return { refuse: refuse('no-session', 'no session for this connection (say hello first; the producer may have restarted)') };
    if (e.seq! <= s.seqIn) return { refuse: refuse('unauthenticated', `replayed or reordered message (seq ${e.seq} after ${s.seqIn})`) };
    const kind = e.kind === 'loc' ? 'loc' : 'md';
    if (this.secret && !checkProof(e.proof, this.secret, `${CTX}${kind}`, ...V(), s.cn, s.sn, String(e.seq), e.body!)) return { refuse: refuse('unauthenticated', 'wrong or missing message proof') };
    if (!this.secret && e.proof) return { refuse: refuse('unauthenticated', 'the message carries a proof but this producer has no cluster secret') };
    s.seqIn = e.seq!;
    s.lastUsed = this.now();
    this.sessions.delete(peer);
    this.sessions.set(peer, s); // most recently used last
    return { body: e.body!, session: s };
  }

  /** Seals a response body in `session` (from {@link open}; a peer id: its current session, or null when it has none). */
  seal(session: ProducerSession | string, body: Uint8Array): SideEnvelope | null {
    const s = typeof session === 'string' ? this.sessions.get(session) : session;
    if (!s) return null;
    const seq = ++s.seqOut;
    const e: SideEnvelope = { kind: 'resp', seq, body };
    if (this.secret) e.proof = messageProof(this.secret, 'resp', s.cn, s.sn, seq, body);
    return e;
  }
}

/** The consumer side of one connection: the hello it sends, the welcome it checks, its messages. */
export class ConsumerSession {
  private readonly cn = makeNonce();
  private sn: Uint8Array | null = null;
  private seqOut = 0;
  private seqIn = 0;

  constructor(private readonly secret: Uint8Array | null) {}

  /** Whether the welcome was accepted. */
  get ready(): boolean {
    return this.sn !== null;
  }

  /** The hello to send first. */
  hello(now: number = Date.now()): SideEnvelope {
    const e: SideEnvelope = { kind: 'hello', cn: this.cn, ts: now };
    if (this.secret) e.proof = helloProof(this.secret, this.cn, now);
    return e;
  }

  /**
   * Checks the producer's welcome.
   * @throws SideChannelAuthError when it answers another hello, lacks a valid proof (with a
   *   secret), or carries one this side cannot check (without a secret).
   */
  welcome(e: SideEnvelope): void {
    if (!Buffer.from(e.cn!).equals(this.cn)) throw new SideChannelAuthError('unauthenticated', 'the welcome answers another hello');
    if (this.secret) {
      if (!checkProof(e.proof, this.secret, `${CTX}welcome`, ...V(), this.cn, e.sn!)) throw new SideChannelAuthError('unauthenticated', 'the producer did not prove the cluster secret (no or wrong welcome proof): not sending it the transfer metadata');
    } else if (e.proof) {
      throw new SideChannelAuthError('unauthenticated', 'the producer uses a cluster secret and this consumer has none (set cluster_secret or KVCONNECT_CLUSTER_SECRET)');
    }
    this.sn = e.sn!;
  }

  /** Seals a metadata body (`md`), or a localize request (`loc`), after {@link welcome}. */
  seal(body: Uint8Array, kind: 'md' | 'loc' = 'md'): SideEnvelope {
    if (!this.sn) throw new SideChannelAuthError('no-session', 'no welcome yet');
    const seq = ++this.seqOut;
    const e: SideEnvelope = { kind, seq, body };
    if (this.secret) e.proof = messageProof(this.secret, kind, this.cn, this.sn, seq, body);
    return e;
  }

  /**
   * Opens a response: its body.
   * @throws SideChannelAuthError for a response before the welcome, out of order, or without a valid proof.
   */
  open(e: SideEnvelope): Uint8Array {
    if (!this.sn) throw new SideChannelAuthError('no-session', 'a response before the welcome');
    if (e.seq! <= this.seqIn) throw new SideChannelAuthError('unauthenticated', `replayed or reordered response (seq ${e.seq} after ${this.seqIn})`);
    if (this.secret && !checkProof(e.proof, this.secret, `${CTX}resp`, ...V(), this.cn, this.sn, String(e.seq), e.body!)) throw new SideChannelAuthError('unauthenticated', 'a response without a valid proof');
    this.seqIn = e.seq!;
    return e.body!;
  }
}
