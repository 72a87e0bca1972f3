/**
 * Producer-side lease bookkeeping (vLLM's NIXL "abort timeout" with consumer heartbeats, and the
 * lease check of vllm#61549): a finished request's blocks are held for the consumer until it is
 * done with them (pull: every consumer rank read them; push: every producer rank wrote its part),
 * it released them, or the lease expired. Heartbeats extend a held lease; a pin keeps it alive
 * while a READ is about to run; transfers in flight (push WRITEs) keep it alive too.
 *
 * Each producer worker reports a request once (`finishedSending`) when it is no longer held; the
 * engine frees the blocks once every worker reported.
 * @module
 */

/** Why a lease ended. */
export type LeaseEnd = 'done' | 'released' | 'expired';

interface Lease {
  expiry: number;
  pinnedUntil: number;
  inflight: number;
  state: 'held' | LeaseEnd;
  /** Consumer ranks that finished (pull: read-done notif senders). */
  readers: Set<string>;
  /** Producer workers done with their part (push). */
  workersDone: Set<string>;
  reported: Set<string>;
  /** When the consumer side was done (pull: last reader; push: last producer worker), ms; null = not yet. */
  doneAt: number | null;
  /** A RELEASE ended the hold after done (`holdAfterDoneMs`). */
  holdEnded: boolean;
  /** `LOCALIZE` requests being answered (the blocks must stay). */
  localizing: number;
}

/** Options of a {@link LeaseTable}. */
export interface LeaseTableOptions {
  /** Lease length, ms (from the finish, and from each heartbeat). */
  leaseMs: number;
  /** The producer workers that report (`ppRank:tpRank` keys); an entry is forgotten once all reported. */
  workers: number;
  /** Clock (ms); default `Date.now`. */
  now?: () => number;
  /** Called once per lease that expires (metrics, logs). */
  onExpired?: (requestId: string) => void;
  /** Blocks stay held this long after the consumer side is done (`localize_hold_ms`), ms; default 0. */
  holdAfterDoneMs?: number;
}

/** The leases of one producer engine. */
export class LeaseTable {
  private readonly leases = new Map<string, Lease>();
  /** How recently forgotten leases ended (bounded), so late peers get a precise answer. */
  private readonly ended = new Map<string, LeaseEnd>();
  private readonly now: () => number;

  constructor(private readonly o: LeaseTableOptions) {
    this.now = o.now ?? Date.now;
  }

  /** Holds `requestId`'s blocks. @returns the expiry (ms since epoch). */
  add(requestId: string): number {
    const expiry = this.now() + this.o.leaseMs;
    this.leases.set(requestId, { expiry, pinnedUntil: 0, inflight: 0, state: 'held', readers: new Set(), workersDone: new Set(), reported: new Set(), doneAt: null, holdEnded: false, localizing: 0 });
    return expiry;
  }

  /** Expires every held lease past its time (not pinned, nothing in flight). */
  sweep(): void {
    const now = this.now();
    for (const [id, l] of this.leases) {
      if (l.state === 'held' && now > l.expiry && now > l.pinnedUntil && l.inflight === 0) {
        l.state = 'expired';
        this.o.onExpired?.(id);
      }
    }
  }

  /** True while `requestId` is held (after a sweep). */
  isHeld(requestId: string): boolean {
    this.sweep();
    return this.leases.get(requestId)?.state === 'held';
  }

  /** The lease's state, or undefined when unknown (never held, or forgotten). */
  stateOf(requestId: string): Lease['state'] | undefined {
    this.sweep();
    return this.leases.get(requestId)?.state;
  }

  /**
   * Heartbeat (`pinMs` 0: expiry = now + leaseMs) or pin (keep alive `pinMs` from now).
   * @returns the expiry per request, 0 for one not held.
   */
  touch(requestIds: readonly string[], pinMs: number): Map<string, number> {
    this.sweep();
    const now = this.now();
    const out = new Map<string, number>();
    for (const id of requestIds) {
      const l = this.leases.get(id);
      if (!l || l.state !== 'held') {
        out.set(id, 0);
        continue;
      }
      l.expiry = Math.max(l.expiry, now + this.o.leaseMs);
      if (pinMs > 0) l.pinnedUntil = Math.max(l.pinnedUntil, now + pinMs);
      out.set(id, Math.max(l.expiry, l.pinnedUntil));
    }
    return out;
  }

  /** A transfer of `requestId` started (+1) or ended (-1); a lease with transfers in flight does not expire. */
  inflight(requestId: string, delta: 1 | -1): void {
    const l = this.leases.get(requestId);
    if (l) l.inflight = Math.max(0, l.inflight + delta);
  }

  /** Pull: consumer rank `reader` finished reading; done once `world` distinct readers did. */
  readerDone(requestId: string, reader: string, world: number): boolean {
    const l = this.leases.get(requestId);
    if (!l) return false;
    l.readers.add(reader);
    if (l.state === 'held' && l.readers.size >= world) {
      l.state = 'done';
      l.doneAt = this.now();
    }
    return true;
  }

  /** Push: producer worker `worker` finished its part. */
  workerDone(requestId: string, worker: string): void {
    const l = this.leases.get(requestId);
    if (!l) return;
    l.workersDone.add(worker);
    if (l.doneAt === null && l.workersDone.size >= this.o.workers) l.doneAt = this.now();
  }

  /**
   * Whether `requestId`'s blocks are still held whole (no worker was told to report it in
   * `finishedSending`) and not released or expired: a `LOCALIZE` can read them.
   */
  blocksHeld(requestId: string): boolean {
    this.sweep();
    const l = this.leases.get(requestId);
    if (!l || l.reported.size > 0 || l.holdEnded) return false;
    if (l.state === 'held') return true;
    // done: only within localize_hold_ms of the end of the reads, so that LOCALIZE requests kept in
    // flight cannot pin the blocks past the hold (a running one still delays the free, see take()).
    return l.state === 'done' && l.doneAt !== null && this.now() < l.doneAt + (this.o.holdAfterDoneMs ?? 0);
  }

  /** A `LOCALIZE` of `requestId` started (+1) or ended (-1); while one runs, no worker reports the request. */
  localizing(requestId: string, delta: 1 | -1): void {
    const l = this.leases.get(requestId);
    if (l) l.localizing = Math.max(0, l.localizing + delta);
  }

  /** The consumer will not use the blocks. */
  release(requestId: string): void {
    const l = this.leases.get(requestId);
    if (l) l.holdEnded = true;
    if (l && l.state === 'held') l.state = 'released';
  }

  /**
   * The requests worker `worker` should now report in `finishedSending` (each once): no longer
   * held, or this worker's part done. Entries every worker reported are forgotten.
   */
  take(worker: string): string[] {
    this.sweep();
    const out: string[] = [];
    for (const [id, l] of this.leases) {
      if (l.reported.has(worker)) continue;
      if (l.state === 'held' && !l.workersDone.has(worker)) continue;
      if (l.localizing > 0) continue;
      // localize_hold_ms: done leases stay held a while (a RELEASE or an expiry ends it).
      const hold = this.o.holdAfterDoneMs ?? 0;
      if (hold > 0 && !l.holdEnded && (l.state === 'done' || l.state === 'held') && (l.doneAt === null || this.now() < l.doneAt + hold)) continue;
      if (l.inflight > 0 && l.state !== 'held') continue;
      l.reported.add(worker);
      out.push(id);
      if (l.reported.size >= this.o.workers) {
        this.leases.delete(id);
        if (l.state !== 'held') this.ended.set(id, l.state);
        if (this.ended.size > 4096) this.ended.delete(this.ended.keys().next().value!);
      }
    }
    return out;
  }

  /** How a forgotten lease ended (`expired`, `released`, `done`), while remembered; undefined otherwise. */
  endedAs(requestId: string): LeaseEnd | undefined {
    return this.ended.get(requestId);
  }

  /** Held and unfinished entries (for tests and diagnostics). */
  get size(): number {
    return this.leases.size;
  }
}
