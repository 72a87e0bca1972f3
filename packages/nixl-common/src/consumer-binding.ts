/**
 * Who may ask about a producer's request after it was served, and how much (`docs/localize.md`,
 * "Binding and budget"): one rule for NIXL (`LOCALIZE`, `RELEASE`; producer.ts) and Mooncake
 * (`loc`; `@kvconnect/mooncake` worker.ts).
 *
 * **Binding.** Every consumer engine draws a random {@link newConsumerKey} once (its scheduler
 * half) and sends it, through its connector metadata, with everything its halves say about a
 * load: NIXL `LEASE` (heartbeat and pin), `PUSH_REG`, `RELEASE`, `LOCALIZE`; Mooncake `md` and `loc`.
 * The producer binds a request to the first key it sees for it while the request is held
 * ({@link ConsumerBindings.claim}: the consumer it is served to). From then on a `LOCALIZE`, a
 * `RELEASE` or a `loc` for that request with another key, or none, is refused (NIXL `forbidden`,
 * Mooncake `refuse` `forbidden`) and changes nothing: the hold, the lease and the real
 * consumer's later question are intact. The side channels authenticate the cluster, not a
 * consumer (one shared secret, `docs/security.md`): the key is what tells the consumer that got
 * the request from another holder of the secret that merely knows the request id. It travels
 * in clear text like the rest of the side channel (proven, not encrypted), so an attacker that
 * reads the consumer's side-channel traffic can learn it.
 *
 * **Budget.** {@link LocalizeBudget}: per consumer key, at most `maxInFlight` localizations being
 * computed and at most `rangesPerSecond` token ranges ({@link localizeQueryRanges}) per second
 * (a token bucket holding one second, and at least one largest request). A question over budget
 * is refused `busy`, and the consumer's drill-down reports it `dropped` (`@kvconnect/core`
 * `LocalizeBusyError`); other consumers' questions are not affected.
 * @module
 */
import { randomBytes, timingSafeEqual } from 'node:crypto';
import type { LocalizeQuery } from '@kvconnect/core';

/** Characters of a consumer key: 32 lowercase hex digits (16 random bytes). */
export const CONSUMER_KEY_CHARS = 32;
const KEY = /^[0-9a-f]{32}$/;

/** A fresh consumer key ({@link CONSUMER_KEY_CHARS} hex digits of `crypto.randomBytes`). */
export function newConsumerKey(): string {
  return randomBytes(CONSUMER_KEY_CHARS / 2).toString('hex');
}

/** Whether `x` is a well-formed consumer key (what the decoders accept). */
export function isConsumerKey(x: unknown): x is string {
  return typeof x === 'string' && KEY.test(x);
}

/** Requests whose binding a {@link ConsumerBindings} remembers, at most (the oldest go first). */
export const MAX_BINDINGS = 1 << 20;

/** The consumer key each held request of one producer is bound to (see the module comment). */
export class ConsumerBindings {
  private readonly keys = new Map<string, string>();

  /** Binds `requestId` to `key` unless it is bound already; a null key binds nothing. */
  claim(requestId: string, key: string | null): void {
    if (key === null || this.keys.has(requestId)) return;
    this.keys.set(requestId, key);
    if (this.keys.size > MAX_BINDINGS) this.keys.delete(this.keys.keys().next().value!);
  }

  /**
   * Whether `key` may end or question `requestId`: null when it may (the request is bound to
   * `key`, or to none: then it is bound to `key` now), else why not (`served to another consumer (...)`).
   */
  check(requestId: string, key: string | null): string | null {
    const bound = this.keys.get(requestId);
    if (bound === undefined) {
      this.claim(requestId, key);
      return null;
    }
    if (key !== null && timingSafeEqual(Buffer.from(bound), Buffer.from(key))) return null;
    return `served to another consumer (${key === null ? 'no consumer key given' : 'another consumer key'})`;
  }

  /** Why `key` may not end `requestId` (bound to another key), or null (bound to `key`, or unbound: binds nothing). */
  foreign(requestId: string, key: string | null): string | null {
    return this.keys.has(requestId) ? this.check(requestId, key) : null;
  }

  /** Forgets `requestId`'s binding (its blocks are freed). */
  forget(requestId: string): void {
    this.keys.delete(requestId);
  }

  /** Bindings kept (tests, diagnostics). */
  get size(): number {
    return this.keys.size;
  }
}

/** The token ranges a query asks for: per group `ceil((tokenEnd - tokenStart) / rangeTokens)`, at least 1 (a state group). */
export function localizeQueryRanges(query: LocalizeQuery): number {
  let n = 0;
  for (const g of query.groups) n += Math.max(1, Math.ceil((g.tokenEnd - g.tokenStart) / query.rangeTokens));
  return n;
}

/** The largest {@link localizeQueryRanges} of one request the decoders accept (64 groups x 1024 ranges). */
export const MAX_LOCALIZE_REQUEST_RANGES = 64 * 1024;

/** Options of a {@link LocalizeBudget} (extra config `localize_max_inflight_per_peer`, `localize_ranges_per_second_per_peer`). */
export interface LocalizeBudgetOptions {
  /** Localizations of one consumer computed at once, at most (default {@link DEFAULT_LOCALIZE_MAX_INFLIGHT}). */
  maxInFlight: number;
  /** Token ranges of one consumer per second, at most (default {@link DEFAULT_LOCALIZE_RANGES_PER_SECOND}). */
  rangesPerSecond: number;
  /** Clock, ms (tests). */
  now?: () => number;
}

/** Default `localize_max_inflight_per_peer`. */
export const DEFAULT_LOCALIZE_MAX_INFLIGHT = 4;
/** Default `localize_ranges_per_second_per_peer`: one largest request per second, or 256 drill-downs of 256 ranges. */
export const DEFAULT_LOCALIZE_RANGES_PER_SECOND = 65_536;

interface Bucket {
  tokens: number;
  at: number;
  inFlight: number;
}

/** Consumers whose budget a {@link LocalizeBudget} tracks, at most (idle full ones are dropped first, else the oldest sixteenth). */
const MAX_BUCKETS = 65_536;

/** Per consumer budget of localizations (see the module comment). */
export class LocalizeBudget {
  private readonly buckets = new Map<string, Bucket>();
  private readonly now: () => number;
  private readonly capacity: number;

  constructor(private readonly o: LocalizeBudgetOptions) {
    this.now = o.now ?? Date.now;
    this.capacity = Math.max(o.rangesPerSecond, MAX_LOCALIZE_REQUEST_RANGES);
  }

  /**
   * Takes `ranges` token ranges of `peer`'s budget and one in-flight slot: null when granted
   * (call {@link done} when the computation ends), else why not (refuse `busy`; nothing taken).
   */
  take(peer: string, ranges: number): string | null {
    const now = this.now();
    let b = this.buckets.get(peer);
    if (b) {
      b.tokens = Math.min(this.capacity, b.tokens + ((now - b.at) * this.o.rangesPerSecond) / 1000);
      b.at = now;
    } else {
      if (this.buckets.size >= MAX_BUCKETS) this.prune(now);
      b = { tokens: this.capacity, at: now, inFlight: 0 };
    }
    if (b.inFlight >= this.o.maxInFlight) return `${b.inFlight} localizations of this consumer are being computed (at most ${this.o.maxInFlight})`;
    if (b.tokens < ranges) return `this consumer asked for more than ${this.o.rangesPerSecond} token ranges per second (${ranges} asked, ${Math.floor(b.tokens)} left)`;
    b.tokens -= ranges;
    b.inFlight++;
    this.buckets.set(peer, b);
    return null;
  }

  /** A computation {@link take} granted `peer` ended. */
  done(peer: string): void {
    const b = this.buckets.get(peer);
    if (b) b.inFlight = Math.max(0, b.inFlight - 1);
  }

  private prune(now: number): void {
    for (const [k, b] of this.buckets) {
      if (b.inFlight === 0 && b.tokens + ((now - b.at) * this.o.rangesPerSecond) / 1000 >= this.capacity) this.buckets.delete(k);
    }
    // None idle enough: the oldest sixteenth goes at once, so that the next new consumers do not
    // each scan every bucket again (a scan per new key would cost O(MAX_BUCKETS) each).
    while (this.buckets.size > MAX_BUCKETS - MAX_BUCKETS / 16) this.buckets.delete(this.buckets.keys().next().value!);
  }
}
