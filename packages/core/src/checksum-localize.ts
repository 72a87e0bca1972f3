/**
 * Localizing a KV checksum mismatch (issue #13 section 1; wire and semantics: `docs/localize.md`).
 *
 * When a load mismatches, the consumer's checksum scheduler (after the load failure policy already
 * acted on the verdict) starts a {@link ChecksumLocalizer} drill-down of only the mismatched
 * blocks:
 *
 * 1. its workers compute fine sums (@kvconnect/checksum `fineSums`: per layer, global KV head, K or
 *    V, token range; state rows per segment) of the received blocks, in the very next step's
 *    metadata ({@link LocalizeStepEntry}), before that step's forward pass can overwrite them
 *    (a recompute, or another request reusing freed blocks);
 * 2. the connector's scheduler half asks the producer for the same fine sums over its blocks
 *    (`KVConnectorScheduler.localizeKvChecksums`), which the producer still holds under its lease;
 * 3. the two are compared ({@link compareFineSums}) and the result ({@link Localization}) is
 *    emitted (`load-localized`), logged and counted (`kvconnect_kv_checksum_localizations_total`).
 *
 * The drill-down never delays the load: the verdict's decision is returned first, and a
 * drill-down that has not finished within its deadline is reported `dropped` (`deadline`). Nothing
 * here runs on a verified load.
 *
 * On by default on every consumer (only a mismatch costs anything); the checksum scheduler's
 * `localize` option ({@link LocalizeOptions}) turns it off or changes the deadline and the token
 * range width. The producer must still hold the blocks: NIXL producers hold them after the
 * consumer's read only with `localize_hold_ms` (`docs/localize.md`).
 * @module
 */
import {
  compareFineSums,
  describeRegions,
  fineSums,
  fineSumsWindowed,
  isDeviceRegion,
  mergeFineSums,
  summarizeDifferences,
  type FineSum,
  type GroupPlan,
  type DeviceMemoryRegion,
  type KVMemoryRegion,
  type LocalizedRegion,
  type Verdict,
} from '@kvconnect/checksum';
import type { StepEntry, StepGroupEntry } from './checksum-report.js';
import type { ConnectorRequest, KVCacheGroupConfig, KVConnectorScheduler, KVTransferConfig } from './connector.js';
import type { KVChecksumObservability } from './observability.js';

/** Default token range width of fine sums, tokens. */
export const DEFAULT_LOCALIZE_RANGE_TOKENS = 16;
/** Most token ranges per group a drill-down asks for: the range width doubles until the mismatched span fits. */
export const MAX_LOCALIZE_RANGES = 256;

/** Default deadline of one drill-down, ms (past it: `dropped`, `deadline`). */
export const DEFAULT_LOCALIZE_TIMEOUT_MS = 5000;

/**
 * What a consumer asks its producer (`localizeKvChecksums`): per group, the request positions
 * `[tokenStart, tokenEnd)` whose fine sums it wants (the mismatched chunks; state groups: the
 * running state, any range), keyed by ranges of `rangeTokens` tokens.
 */
export interface LocalizeQuery {
  rangeTokens: number;
  groups: Array<{ groupId: number; tokenStart: number; tokenEnd: number }>;
}

/**
 * The producer's answer: `held` with its fine sums per group (replica 0 of every producer rank,
 * merged; `error` when its ranks could not sum the group), or `gone` when it no longer holds the
 * request's blocks (lease ended, unknown request), with why.
 */
export type LocalizeAnswer =
  | { status: 'held'; groups: Array<{ groupId: number; sums: FineSum[]; error?: string }> }
  | { status: 'gone'; detail: string };

/**
 * What `KVConnectorScheduler.localizeKvChecksums` rejects with when the producer refused the
 * question for its localization budget (NIXL `busy`, Mooncake `refuse` `busy`; `docs/localize.md`
 * "Binding and budget"): the drill-down is reported `dropped` (`detail` `busy: ...`), as one past
 * its deadline. The verdict and its decision are not affected (they came first).
 */
export class LocalizeBusyError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'LocalizeBusyError';
  }
}

/** A worker's order (consumer: in `ChecksumStepMeta.localize`): fine sums of one request's blocks. */
export interface LocalizeStepEntry {
  requestId: string;
  /** The load's numTokens (SPEC 2). */
  numTokens: number;
  rangeTokens: number;
  /** The blocks to sum per group, and the request positions to cover. */
  groups: Array<StepGroupEntry & { tokenStart: number; tokenEnd: number }>;
}

/** A worker's fine sums of one {@link LocalizeStepEntry} (in `KVChecksumReport.localized`). */
export interface LocalizedEntry {
  requestId: string;
  groups: Array<{ groupId: number; sums: FineSum[]; error?: string }>;
}

/**
 * Reads `bytes` bytes at byte `offset` of a device region into host memory (a device-to-host copy:
 * `@kvconnect/transfer`'s `readDeviceBytes`, which the engine's device memory backs).
 */
export type DeviceRegionReader = (region: DeviceMemoryRegion, offset: number, bytes: number) => Uint8Array;

/**
 * The fine sums of one order on one rank: `plans[groupIndex(groupId)]` summed over `regions`. Host
 * memory is read in place; device memory only through `readDevice` (the mismatched blocks' bytes,
 * `fineSumsWindowed`), and without one a group in device memory gives an error. A group the rank
 * does not know gives no sums; one it cannot sum (skipped plan, device memory without a reader,
 * bad block ids) gives its error instead.
 */
export function localizeOnRank(plans: readonly GroupPlan[], groupIndex: (groupId: number) => number | undefined, regions: readonly KVMemoryRegion[], order: LocalizeStepEntry, readDevice?: DeviceRegionReader): LocalizedEntry {
  const host = regions.every((r) => !isDeviceRegion(r));
  return {
    requestId: order.requestId,
    groups: order.groups.map((g) => {
      const i = groupIndex(g.groupId);
      if (i === undefined || !plans[i]) return { groupId: g.groupId, sums: [] };
      if (!host && !readDevice) return { groupId: g.groupId, sums: [], error: 'device memory (no device reader on this rank: fine sums read host memory only)' };
      try {
        const run = { blockIds: g.blockIds, start: g.start, numTokens: order.numTokens, tokenStart: g.tokenStart, tokenEnd: g.tokenEnd, rangeTokens: order.rangeTokens };
        const sums = host
          ? fineSums(plans[i], regions as readonly Uint8Array[], run)
          : fineSumsWindowed(plans[i], regions, run, (ri, off, n) => {
              const r = regions[ri];
              return isDeviceRegion(r) ? readDevice!(r, off, n) : r.subarray(off, off + n);
            });
        return { groupId: g.groupId, sums };
      } catch (e) {
        return { groupId: g.groupId, sums: [], error: e instanceof Error ? e.message : String(e) };
      }
    }),
  };
}

/**
 * The result of one drill-down:
 * - `localized`: the sides differ where `groups[].regions` say;
 * - `no-difference`: the producer's blocks now hold what the consumer received, yet the checksums
 *   mismatched: the producer's blocks changed after they were checksummed (stale or reused blocks);
 * - `gone`: the producer no longer holds the blocks (`detail` says why);
 * - `dropped`: not finished within the deadline (`detail` `deadline`), the producer refused it
 *   for its budget (`detail` `busy: ...`, {@link LocalizeBusyError}), or the connector closed;
 * - `unsupported`: the connector cannot ask its producer (no `localizeKvChecksums`);
 * - `error`: the producer refused or could not be reached, or a side could not sum (`detail`).
 */
export interface Localization {
  requestId: string;
  status: 'localized' | 'no-difference' | 'gone' | 'dropped' | 'unsupported' | 'error';
  detail: string;
  /** Per mismatched group: where the sides differ (`regions`), and in words (`text`, compacted: `describeRegions`). */
  groups: Array<{ groupId: number; regions: LocalizedRegion[]; text: string[] }>;
  /** Wall time of the drill-down, ms. */
  ms: number;
}

/** A drill-down in progress. */
interface Pending {
  request: ConnectorRequest;
  order: LocalizeStepEntry;
  t0: number;
  workers: Map<string, LocalizedEntry>;
  producer: LocalizeAnswer | Error | undefined;
  timer: NodeJS.Timeout;
}

/** What a consumer's checksum scheduler localizes (`KVChecksumSchedulerOptions.localize`). */
export interface LocalizeOptions {
  /** Drill into mismatches (default true). */
  enabled?: boolean;
  /** Deadline of one drill-down, ms (default {@link DEFAULT_LOCALIZE_TIMEOUT_MS}). */
  timeoutMs?: number;
  /** Token range width of the fine sums (default {@link DEFAULT_LOCALIZE_RANGE_TOKENS}). */
  rangeTokens?: number;
}

/** Options of a {@link ChecksumLocalizer}. */
export interface ChecksumLocalizerOptions extends LocalizeOptions {
  config: KVTransferConfig;
  connector: KVConnectorScheduler;
  tpSize: number;
  ppSize: number;
  groupConfigs: readonly KVCacheGroupConfig[];
  observability: KVChecksumObservability;
}

const num = (x: unknown, dflt: number, min: number): number => (typeof x === 'number' && Number.isSafeInteger(x) && x >= min ? x : dflt);

/** The consumer side of localization (see the module comment); owned by one checksum scheduler. */
export class ChecksumLocalizer {
  readonly enabled: boolean;
  readonly timeoutMs: number;
  readonly rangeTokens: number;
  private readonly pending = new Map<string, Pending>();
  private next: LocalizeStepEntry[] = [];

  constructor(private readonly o: ChecksumLocalizerOptions) {
    this.enabled = o.enabled !== false;
    this.timeoutMs = num(o.timeoutMs, DEFAULT_LOCALIZE_TIMEOUT_MS, 1);
    this.rangeTokens = num(o.rangeTokens, DEFAULT_LOCALIZE_RANGE_TOKENS, 1);
  }

  /** Drill-downs in progress (diagnostics, leak tests). */
  get inProgress(): number {
    return this.pending.size;
  }

  /**
   * Starts a drill-down of a mismatched load (`verdict.mismatches`; a load of another request's KV,
   * `wrongRequest`, is not drilled into). Returns at once; the result comes as a `load-localized` event.
   * @param entry the load's receive entry (its blocks per group)
   */
  start(request: ConnectorRequest, entry: StepEntry, verdict: Verdict): void {
    if (!this.enabled || verdict.verdict !== 'mismatch' || verdict.wrongRequest || verdict.mismatches.length === 0) return;
    const id = request.requestId;
    const old = this.pending.get(id);
    if (old) clearTimeout(old.timer);
    const groups: LocalizeStepEntry['groups'] = [];
    for (const m of verdict.mismatches) {
      const cfg = this.o.groupConfigs.find((c) => c.groupId === m.groupId);
      const ge = entry.groups.find((g) => g.groupId === m.groupId);
      if (!cfg || !ge || m.positions.length === 0) continue;
      if (cfg.kind === 'state') {
        groups.push({ ...ge, blockIds: [...ge.blockIds], tokenStart: 0, tokenEnd: entry.numTokens });
        continue;
      }
      const first = m.positions[0];
      const last = m.positions[m.positions.length - 1];
      const B = cfg.blockSize;
      groups.push({ groupId: m.groupId, start: first, blockIds: ge.blockIds.slice(first - ge.start, last - ge.start + 1), tokenStart: first * B, tokenEnd: Math.min(entry.numTokens, (last + 1) * B) });
    }
    if (groups.length === 0) return;
    let rangeTokens = this.rangeTokens;
    while (groups.some((g) => Math.ceil((g.tokenEnd - g.tokenStart) / rangeTokens) > MAX_LOCALIZE_RANGES)) rangeTokens *= 2;
    const order: LocalizeStepEntry = { requestId: id, numTokens: entry.numTokens, rangeTokens, groups };
    const t0 = performance.now();
    const ask = this.o.connector.localizeKvChecksums?.bind(this.o.connector);
    if (!ask) {
      this.emit({ requestId: id, status: 'unsupported', detail: `connector ${this.o.config.kv_connector} cannot ask its producer for fine sums`, groups: [], ms: 0 });
      return;
    }
    const p: Pending = { request, order, t0, workers: new Map(), producer: undefined, timer: setTimeout(() => this.drop(id, p, 'deadline'), this.timeoutMs) };
    p.timer.unref?.();
    this.pending.set(id, p);
    this.next.push(order);
    const query: LocalizeQuery = { rangeTokens: order.rangeTokens, groups: groups.map((g) => ({ groupId: g.groupId, tokenStart: g.tokenStart, tokenEnd: g.tokenEnd })) };
    let asked: Promise<LocalizeAnswer>;
    try {
      asked = ask(request, query, this.timeoutMs);
    } catch (e) {
      asked = Promise.reject(e);
    }
    asked.then(
      (a) => this.onProducer(id, p, a),
      (e: unknown) => this.onProducer(id, p, e instanceof Error ? e : new Error(String(e))),
    );
  }

  /** The workers' orders of this step (`ChecksumStepMeta.localize`); then forgets them. */
  takeStepEntries(): LocalizeStepEntry[] {
    const n = this.next;
    this.next = [];
    return n;
  }

  /** One worker's fine sums (`KVChecksumReport.localized`), `key` = `ppRank:tpRank`. */
  onWorker(key: string, e: LocalizedEntry): void {
    const p = this.pending.get(e.requestId);
    if (!p) return;
    p.workers.set(key, e);
    this.maybeFinish(e.requestId, p);
  }

  /** Drops every drill-down in progress (`dropped`, `detail`). */
  close(detail = 'shutdown'): void {
    for (const [id, p] of [...this.pending]) this.drop(id, p, detail);
  }

  private onProducer(id: string, p: Pending, a: LocalizeAnswer | Error): void {
    if (this.pending.get(id) !== p) return;
    if (a instanceof LocalizeBusyError) return this.drop(id, p, `busy: ${a.message}`);
    p.producer = a;
    this.maybeFinish(id, p);
  }

  private drop(id: string, p: Pending, detail: string): void {
    if (this.pending.get(id) !== p) return;
    this.finish(id, p, { status: 'dropped', detail, groups: [] });
  }

  private maybeFinish(id: string, p: Pending): void {
    const a = p.producer;
    if (a === undefined) return;
    if (a instanceof Error) return this.finish(id, p, { status: 'error', detail: `producer: ${a.message}`, groups: [] });
    if (a.status === 'gone') return this.finish(id, p, { status: 'gone', detail: a.detail, groups: [] });
    if (p.workers.size < this.o.tpSize * this.o.ppSize) return;
    const errors: string[] = [];
    const groups: Localization['groups'] = [];
    for (const g of p.order.groups) {
      const prod = a.groups.find((x) => x.groupId === g.groupId);
      if (!prod) {
        errors.push(`group ${g.groupId}: the producer sent no fine sums`);
        continue;
      }
      if (prod.error) errors.push(`group ${g.groupId}: producer: ${prod.error}`);
      const mine: FineSum[][] = [];
      for (const [key, w] of p.workers) {
        const wg = w.groups.find((x) => x.groupId === g.groupId);
        if (wg?.error) errors.push(`group ${g.groupId}: consumer worker ${key}: ${wg.error}`);
        if (wg) mine.push(wg.sums);
      }
      const regions = summarizeDifferences(compareFineSums(prod.sums, mergeFineSums(mine)));
      if (regions.length > 0) groups.push({ groupId: g.groupId, regions, text: describeRegions(regions) });
    }
    if (errors.length > 0) return this.finish(id, p, { status: 'error', detail: errors.join('; '), groups });
    if (groups.length === 0) return this.finish(id, p, { status: 'no-difference', detail: "the producer's blocks now hold the received bytes: they changed after they were checksummed (stale or reused blocks)", groups });
    this.finish(id, p, { status: 'localized', detail: groups.map((g) => `group ${g.groupId}: ${g.text.join('; ')}`).join(' | '), groups });
  }

  private finish(id: string, p: Pending, r: Omit<Localization, 'requestId' | 'ms'>): void {
    clearTimeout(p.timer);
    this.pending.delete(id);
    this.emit({ requestId: id, ...r, ms: performance.now() - p.t0 });
  }

  private emit(loc: Localization): void {
    const obs = this.o.observability;
    obs.metrics.localizations.inc({ result: loc.status });
    const line = { requestId: loc.requestId, status: loc.status, detail: loc.detail, groups: loc.groups.map((g) => ({ groupId: g.groupId, where: g.text })), ms: Math.round(loc.ms) };
    if (loc.status === 'localized') obs.logger.error(line, `KV checksum mismatch localized: ${loc.detail}`);
    else obs.logger.warn(line, `KV checksum mismatch not localized (${loc.status}): ${loc.detail}`);
    obs.events.emit('load-localized', loc);
  }
}
