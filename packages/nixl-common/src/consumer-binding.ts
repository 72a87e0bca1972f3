/**
 * Who may act on a producer's request after it was served, and how much (`docs/localize.md`,
 * "Binding and budget"): one rule for NIXL (`LEASE`, `RELEASE`, `PUSH_REG`, `LOCALIZE`;
 * producer.ts) and Mooncake (`md`, `loc`; `@kvconnect/mooncake` worker.ts).
 *
 * **Binding by consumer key** (protocol 18 / Mooncake 5; since NIXL 19 / Mooncake 6 only for a
 * Mooncake transfer whose proxy drew no lease capability, below). Every consumer engine draws a
 * random {@link newConsumerKey} once (its scheduler half) and sends it, through its connector
 * metadata, with everything its halves say about a load (NIXL `LEASE`, `PUSH_REG`, `RELEASE`,
 * `LOCALIZE`; Mooncake `md` and `loc`). The producer binds a request to the first key it sees for
 * it while the request is held ({@link ConsumerBindings.claim}: the consumer it is served to).
 * From then on an `md` or `loc` for that request with another key, or none, is refused
 * (`forbidden`) and changes nothing. The side channels authenticate the cluster, not a consumer
 * (one shared secret, `docs/security.md`); the key travels in clear text like the rest of the
 * side channel (proven, not encrypted).
 *
 * **Lease capability** (NIXL protocol 19, Mooncake protocol 6). A first-come binding
 * lets a holder of the cluster secret that knows a request id and asks first take the request
 * from its real consumer. So each request also gets a {@link newLeaseCapability}: an unguessable
 * secret (32 bytes of `crypto.randomBytes`, 64 hex digits) that travels in `kv_transfer_params`
 * (`lease_capability`, {@link LEASE_CAPABILITY_PARAM}) through the trusted P/D proxy to the
 * consumer only: NIXL's producer draws it when the request finishes and returns it in its params;
 * for Mooncake, whose producer returns no params before the consumer starts, the proxy draws it
 * with the `transfer_id` and gives it to both sides. Every message about the request then carries
 * it (NIXL `LEASE`, `RELEASE`, `PUSH_REG`, `LOCALIZE`; Mooncake `md` and `loc`), and the producer
 * ({@link LeaseCapabilities}) compares it in constant time (`crypto.timingSafeEqual`): a message
 * without it, or with another, is refused `forbidden` and changes nothing. A request with a
 * capability is not bound to a consumer key: the capability is its binding. The capability is
 * never written to logs, metrics or error texts (the refusals say only "no lease capability given"
 * or "another lease capability"). Like the rest of the side channel it is proven, not encrypted
 * (`docs/security.md`).
 *
 * **Budget.** {@link LocalizeBudget}: the token ranges ({@link localizeQueryRanges}) are charged
 * to the request asked about (its capability, or its binding), at most `rangesPerSecond` per
 * second (a token bucket holding one second, and at least one largest request), so a peer that
 * draws fresh consumer keys or opens new connections gets no more; at most `maxInFlight`
 * localizations of one connection are computed at once. A question over budget is refused `busy`,
 * and the consumer's drill-down reports it `dropped` (`@kvconnect/core` `LocalizeBusyError`);
 * questions about other requests are not affected.
 * @module
 */
import { timingSafeEqual } from 'node:crypto';
import { isHexToken, newLeaseCapability, randomHexToken, sameCapability, type LocalizeQuery } from '@kvconnect/core';

/** Characters of a consumer key: 32 lowercase hex digits (16 random bytes). */
export const CONSUMER_KEY_CHARS = 32;

/** A fresh consumer key ({@link CONSUMER_KEY_CHARS} hex digits of `crypto.randomBytes`). */
export function newConsumerKey(): string {
  return randomHexToken(CONSUMER_KEY_CHARS);
}

/** Whether `x` is a well-formed consumer key (what the decoders accept). */
export function isConsumerKey(x: unknown): x is string {
  return isHexToken(x, CONSUMER_KEY_CHARS);
}

export { LEASE_CAPABILITY_CHARS, LEASE_CAPABILITY_PARAM, isLeaseCapability, newLeaseCapability, sameCapability } from '@kvconnect/core';

/**
 * Why `given` is not the capability `expected` (`no lease capability given`, `another lease
 * capability`: texts that never hold a capability), or null when it is (constant time, `sameCapability`).
 */
export function capabilityDenied(expected: string, given: string | null | undefined): string | null {
  if (sameCapability(expected, given)) return null;
  return given === null || given === undefined ? 'no lease capability given' : 'another lease capability';
}

/** The lease capability of each held request of one producer (see the module comment). */
export class LeaseCapabilities {
  private readonly caps = new Map<string, string>();

  /** Records `requestId`'s capability (replacing an older one). */
  set(requestId: string, capability: string): void {
    // Unbounded on purpose: every entry is a held request (forgotten with it), and dropping one
    // would let anyone act on that request (check() passes a request without a capability).
    this.caps.set(requestId, capability);
  }

  /** Draws, records and returns a fresh capability for `requestId`. */
  grant(requestId: string): string {
    const c = newLeaseCapability();
    this.set(requestId, c);
    return c;
  }

  /** Whether `requestId` has a capability (then {@link check} decides, not a consumer key binding). */
  has(requestId: string): boolean {
    return this.caps.has(requestId);
  }

  /**
   * Why `given` may not act on `requestId` (`no lease capability given`, `another lease
   * capability`), or null when it may (it is the request's capability, or the request has none).
   * The text never holds a capability.
   */
  check(requestId: string, given: string | null | undefined): string | null {
    const c = this.caps.get(requestId);
    return c === undefined ? null : capabilityDenied(c, given);
  }

  /** Forgets `requestId`'s capability (its blocks are freed). */
  forget(requestId: string): void {
    this.caps.delete(requestId);
  }

  /** Capabilities kept (tests, diagnostics). */
  get size(): number {
    return this.caps.size;
  }
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
    // Same length in UTF-16 code units, compared as such: timingSafeEqual throws on buffers of
    // different lengths (UTF-8 lengths differ for a non-ASCII key of the same string length).
    if (key !== null && key.length === bound.length && timingSafeEqual(Buffer.from(bound, 'utf16le'), Buffer.from(key, 'utf16le'))) return null;
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
  /** Localizations of one connection computed at once, at most (default {@link DEFAULT_LOCALIZE_MAX_INFLIGHT}). */
  maxInFlight: number;
  /** Token ranges asked about one request per second, at most (default {@link DEFAULT_LOCALIZE_RANGES_PER_SECOND}). */
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
}

/** Requests whose budget a {@link LocalizeBudget} tracks, at most (full ones are dropped first, else the oldest sixteenth). */
const MAX_BUCKETS = 65_536;

/**
 * The localization budget of one producer (see the module comment): token ranges charged per
 * `request` (the request asked about: what its capability or binding grants, never a key the
 * asker drew), computations in flight counted per `slot` (the asking connection).
 */
export class LocalizeBudget {
  private readonly buckets = new Map<string, Bucket>();
  private readonly inFlight = new Map<string, number>();
  private readonly now: () => number;
  private readonly capacity: number;

  constructor(private readonly o: LocalizeBudgetOptions) {
    this.now = o.now ?? Date.now;
    this.capacity = Math.max(o.rangesPerSecond, MAX_LOCALIZE_REQUEST_RANGES);
  }

  /**
   * Takes `ranges` token ranges of `request`'s budget and one in-flight slot of `slot` (default
   * `request`): null when granted (call {@link done} with the same `slot` when the computation
   * ends), else why not (refuse `busy`; nothing taken).
   */
  take(request: string, ranges: number, slot: string = request): string | null {
    const now = this.now();
    let b = this.buckets.get(request);
    if (b) {
      b.tokens = Math.min(this.capacity, b.tokens + ((now - b.at) * this.o.rangesPerSecond) / 1000);
      b.at = now;
    } else {
      if (this.buckets.size >= MAX_BUCKETS) this.prune(now);
      b = { tokens: this.capacity, at: now };
    }
    const n = this.inFlight.get(slot) ?? 0;
    if (n >= this.o.maxInFlight) return `${n} localizations of this connection are being computed (at most ${this.o.maxInFlight})`;
    if (b.tokens < ranges) return `more than ${this.o.rangesPerSecond} token ranges per second asked about this request (${ranges} asked, ${Math.floor(b.tokens)} left)`;
    b.tokens -= ranges;
    this.inFlight.set(slot, n + 1);
    this.buckets.set(request, b);
    return null;
  }

  /** A computation {@link take} granted on `slot` ended. */
  done(slot: string): void {
    const n = (this.inFlight.get(slot) ?? 0) - 1;
    if (n > 0) this.inFlight.set(slot, n);
    else this.inFlight.delete(slot);
  }

  private prune(now: number): void {
    for (const [k, b] of this.buckets) {
      if (b.tokens + ((now - b.at) * this.o.rangesPerSecond) / 1000 >= this.capacity) this.buckets.delete(k);
    }
    // None full again: the oldest sixteenth goes at once, so that the next new requests do not
    // each scan every bucket again (a scan per new request would cost O(MAX_BUCKETS) each).
    while (this.buckets.size > MAX_BUCKETS - MAX_BUCKETS / 16) this.buckets.delete(this.buckets.keys().next().value!);
  }
}
