/**
 * The consumer scheduler's verification of one load (SPEC 8): compares the producer's payload with
 * what the consumer's workers summed, group by group, and returns a {@link Verdict}.
 *
 * Pure and total: no I/O, no logging, and no exception for any input the types allow. Where the
 * SPEC is silent (odd records a correct worker never produces), this file picks the fail-safe
 * reading, named at the place it is made; none of them can turn a load `verified`.
 * @module
 */

import { tokenDigest } from './payload.js';
import { SAMPLE_THRESHOLD_ALL, sampleRateOf } from './sampling.js';
import {
  parseReplicaKey,
  type ChecksumPayload,
  type ConsumerGroup,
  type ConsumerLoad,
  type PayloadGroup,
  type ReplicaKey,
  type SubBlockValues,
  type UnverifiedReason,
  type Verdict,
  type WorkerRecord,
} from './types.js';

/** The sub-block values of a payload without any (shared, never written). */
const NO_SUB_BLOCKS: ReadonlyMap<number, SubBlockValues> = new Map();

/** Reduces to uint64: every checksum sum is modulo 2^64 (SPEC, preamble). */
const u64 = (x: bigint): bigint => BigInt.asUintN(64, x);

/**
 * How one scheduled group came out of SPEC 8 steps 1-7.
 * - `ignored`: skipped on both sides (step 1);
 * - `left-out`: state-local across TP sizes (step 2);
 * - `unverified`: the first reason that applied;
 * - `compared`: values were compared; `bad` = mismatching consumer block positions, sorted;
 * - `empty`: an attention group whose loaded blocks hold no valid consumer token (nothing compared).
 */
type GroupOutcome =
  | { kind: 'ignored' }
  | { kind: 'left-out' }
  | { kind: 'unverified'; reason: UnverifiedReason }
  | { kind: 'compared'; bad: number[]; checked: number; skipped: number; sub?: boolean }
  | { kind: 'empty' };

/** What every group check reads besides its own two sides. */
interface LoadContext {
  /** The producer's `numTokens` (payload). */
  readonly producerTokens: number;
  readonly producerTpSize: number;
  /** The consumer's `numTokens` (load). */
  readonly consumerTokens: number;
  readonly consumerTpSize: number;
  /** One record per (PP rank, TP rank) of the consumer's grid (see {@link gridWorkers}). */
  readonly workers: readonly WorkerRecord[];
  /** Sampled checking (sampling.ts): the consumer's sampler, when it samples. */
  readonly sample?: ConsumerLoad['sample'];
  /** The payload's sub-block values by group id (extension payload). */
  readonly subBlocks: ReadonlyMap<number, SubBlockValues>;
}

/**
 * Verifies one load (SPEC 8).
 *
 * @param payload - the producer's decoded payload (SPEC 6, 6.1); `null` when none arrived, `'malformed'`
 *   when the decoder rejected the bytes. Its `numTokens` is the producer's token count and its
 *   groups' `blockSize` the producer's block sizes. A version-2 payload (`version` 2 or a
 *   `tokenDigest`) is checked against `load.tokenIds` (SPEC 8.0).
 * @param load - the consumer's side: its own `numTokens`, its prompt `tokenIds`, TP x PP grid, the
 *   groups its scheduler scheduled (checked in this order) and one record per worker with, per group,
 *   the rows it summed and its partial block values per replica key `"R:r"`.
 * @returns the verdict; `mismatches` and `unverified` are in group check order, `leftOut` lists the
 *   state-local groups not compared because the TP sizes differ (the caller logs them once);
 *   `wrongRequest` and `identity` report SPEC 8.0.
 *
 * Load-level checks come first (`no-payload`, `malformed-payload`, then identity (SPEC 8.0), then
 * `workers-missing`) and end the check. Identity: a version-2 payload whose `tokenDigest` is not the
 * digest of the consumer's first `numTokens` prompt tokens (or a prompt shorter than that) makes
 * the verdict `mismatch` with `wrongRequest`, every loaded block position of every non-skipped
 * scheduled group mismatched, nothing else checked. A version-1 payload is checked as before with
 * `identity: 'unchecked'`. Then each scheduled group gets at most one reason, or is compared: state groups by their
 * one value at block position 0, attention groups in chunks of `max(Bp, Bd)` tokens, per replica
 * check. A group with a reason reports no mismatch.
 *
 * Extensions (docs/checksum-extensions.md): with `load.sample` (sampled checking), a payload sampled
 * below the consumer's threshold (or any sampled payload when the consumer does not sample) is
 * `sample-rate` (load level, after `workers-missing`), only chunks whose every block is in the
 * consumer's sample are compared, and `sampled` reports the rate and block counts; an attention
 * group whose start is unaligned is compared through the payload's sub-block values when they
 * divide both block sizes, and listed in `subBlockGroups`.
 *
 * Stricter than the upstream design in one place (SPEC 8, last paragraph): a loaded block holding
 * valid consumer tokens that no compared chunk covers makes its group `uncovered-tokens` instead of
 * being left unchecked while the load verifies.
 *
 * Choices where the SPEC is silent, all fail-safe:
 * - worker records outside the `ppSize x tpSize` grid are not workers of this load and are ignored,
 *   and of several records for one (PP rank, TP rank) the first counts (a duplicate neither fills a
 *   missing worker nor is summed twice);
 * - a partial array whose length is not the record's `nBlocks` is `rows-differ`, and so is an attention
 *   group with chunks to compare whose `start` (or its payload group's) is not an integer;
 * - a replica key that does not parse as `"R:r"` with `0 <= r < R` is `replica-missing`;
 * - a block size that is not a positive integer is `block-size`;
 * - an attention group whose loaded blocks hold no valid consumer token compares nothing, so alone it
 *   gives `nothing-to-verify`;
 * - identity: a payload with `version` 2 or a `tokenDigest` is checked (the decoder gives both or
 *   neither); a version 2 without a digest cannot match and is a wrong request; a prompt token
 *   that is not a uint32 cannot be digested and counts as a wrong request; a group counts as skipped
 *   for the wrong-request mismatch as in step 1 (the group's or any grid worker's record says so);
 *   a wrong request with no non-skipped group still reports `mismatch` (no positions to name);
 * - a mismatch names the loaded blocks of the chunk that hold valid consumer tokens (loaded blocks
 *   without one are ignored, SPEC 8 step 7).
 */
export function verifyLoad(payload: ChecksumPayload | null | 'malformed', load: ConsumerLoad): Verdict {
  if (payload === null) return loadUnverified('no-payload');
  if (payload === 'malformed') return loadUnverified('malformed-payload');
  const workers = gridWorkers(load);
  const identity: Verdict['identity'] = payload.version === 2 || payload.tokenDigest !== undefined ? 'checked' : 'unchecked';
  if (identity === 'checked' && !sameTokens(payload.numTokens, payload.tokenDigest, load.tokenIds ?? [])) {
    return wrongRequest(load, workers);
  }
  if (workers.length < load.tpSize * load.ppSize) return loadUnverified('workers-missing', identity);
  // Sampled checking: the producer must have summed every block the consumer's sample names.
  const sampling = load.sample !== undefined && load.sample.threshold < SAMPLE_THRESHOLD_ALL ? load.sample : undefined;
  if ((payload.sampleThreshold ?? SAMPLE_THRESHOLD_ALL) < (sampling?.threshold ?? SAMPLE_THRESHOLD_ALL)) {
    return loadUnverified('sample-rate', identity);
  }

  const ctx: LoadContext = {
    producerTokens: payload.numTokens,
    producerTpSize: payload.producerTpSize,
    consumerTokens: load.numTokens,
    consumerTpSize: load.tpSize,
    workers,
    sample: sampling,
    subBlocks: payload.subBlocks?.length ? new Map(payload.subBlocks.map((s) => [s.groupId, s])) : NO_SUB_BLOCKS,
  };
  const producerGroups = new Map<number, PayloadGroup>();
  for (const g of payload.groups) if (!producerGroups.has(g.groupId)) producerGroups.set(g.groupId, g);

  const verdict: Verdict = { verdict: 'verified', mismatches: [], unverified: [], leftOut: [], wrongRequest: false, identity };
  let compared = false;
  let checked = 0;
  let skipped = 0;
  for (const group of load.groups) {
    const outcome = checkGroup(group, producerGroups.get(group.groupId), ctx);
    switch (outcome.kind) {
      case 'left-out':
        verdict.leftOut.push(group.groupId);
        break;
      case 'unverified':
        verdict.unverified.push({ groupId: group.groupId, reason: outcome.reason });
        break;
      case 'compared':
        compared = true;
        checked += outcome.checked;
        skipped += outcome.skipped;
        if (outcome.sub) (verdict.subBlockGroups ??= []).push(group.groupId);
        if (outcome.bad.length > 0) verdict.mismatches.push({ groupId: group.groupId, positions: outcome.bad });
        break;
      case 'ignored':
      case 'empty':
        break;
    }
  }
  if (sampling) verdict.sampled = { rate: sampleRateOf(sampling.threshold), checked, skipped };
  if (!compared && verdict.unverified.length === 0) {
    verdict.unverified.push({ groupId: null, reason: 'nothing-to-verify' });
  }
  if (verdict.mismatches.length > 0) verdict.verdict = 'mismatch';
  else if (verdict.unverified.length > 0) verdict.verdict = 'unverified';
  return verdict;
}

/**
 * One line for logs: the verdict, `wrong request` (SPEC 8.0) when so, then each mismatched group
 * with its consumer block positions, each unverified reason (with its group, if any) and each
 * left-out group, in check order, `identity unchecked` for a version-1 payload (SPEC 8.0), then the
 * groups checked with sub-block values and the sample (docs/checksum-extensions.md).
 * For example
 * `mismatch: group 0 blocks [2,3]; group 1 fingerprint; group 4 left out (state-local across TP sizes)`,
 * `mismatch: wrong request; group 0 blocks [0,1,2]`, `verified: identity unchecked` or `unverified: no-payload`.
 */
export function verdictSummary(v: Verdict): string {
  const parts = [
    ...(v.wrongRequest ? ['wrong request'] : []),
    ...v.mismatches.map((m) => `group ${m.groupId} blocks [${m.positions.join(',')}]`),
    ...v.unverified.map((u) => (u.groupId === null ? u.reason : `group ${u.groupId} ${u.reason}`)),
    ...v.leftOut.map((g) => `group ${g} left out (state-local across TP sizes)`),
    ...(v.identity === 'unchecked' ? ['identity unchecked'] : []),
    ...(v.subBlockGroups ?? []).map((g) => `group ${g} unaligned prefix checked with sub-block values`),
    ...(v.sampled ? [`sampled at rate ${v.sampled.rate} (${v.sampled.checked} blocks checked, ${v.sampled.skipped} left out)`] : []),
  ];
  return parts.length === 0 ? v.verdict : `${v.verdict}: ${parts.join('; ')}`;
}

/** A verdict ended by a load-level reason (SPEC 8, "Load level"); `identity` none until a payload decoded. */
function loadUnverified(reason: UnverifiedReason, identity: Verdict['identity'] = 'none'): Verdict {
  return { verdict: 'unverified', mismatches: [], unverified: [{ groupId: null, reason }], leftOut: [], wrongRequest: false, identity };
}

/**
 * SPEC 8.0: true when the consumer's prompt holds at least `numTokens` tokens and the digest of the
 * first `numTokens` of them is `digest`. A token id that is not a uint32 cannot be the producer's,
 * so it (like a prompt too short) gives false.
 */
function sameTokens(numTokens: number, digest: bigint | undefined, tokenIds: ArrayLike<number>): boolean {
  if (digest === undefined || tokenIds.length < numTokens) return false;
  try {
    return tokenDigest(tokenIds, numTokens) === digest;
  } catch {
    return false;
  }
}

/**
 * SPEC 8.0 wrong request: `mismatch` at every loaded block position (`start .. start + nBlocks - 1`)
 * of every scheduled group that is not skipped (the consumer's flag, or any grid worker's record, as
 * in step 1), in scheduled order; nothing else is checked.
 */
function wrongRequest(load: ConsumerLoad, workers: readonly WorkerRecord[]): Verdict {
  const mismatches: Verdict['mismatches'] = [];
  for (const g of load.groups) {
    if (g.skipped || workers.some((w) => w.groups.get(g.groupId)?.skipped === true)) continue;
    const n = Number.isSafeInteger(g.nBlocks) && g.nBlocks > 0 ? g.nBlocks : 0;
    if (n > 0) mismatches.push({ groupId: g.groupId, positions: Array.from({ length: n }, (_, i) => g.start + i) });
  }
  return { verdict: 'mismatch', mismatches, unverified: [], leftOut: [], wrongRequest: true, identity: 'checked' };
}

/**
 * The first record of each (PP rank, TP rank) inside the load's grid, in record order. Counting
 * these against TP x PP is the `workers-missing` check; they are also the records summed.
 */
function gridWorkers(load: ConsumerLoad): WorkerRecord[] {
  const inGrid = (rank: number, size: number): boolean => Number.isInteger(rank) && rank >= 0 && rank < size;
  const seen = new Set<number>();
  const out: WorkerRecord[] = [];
  for (const w of load.workers) {
    const place = w.ppRank * load.tpSize + w.tpRank; // one number per grid place (both ranks checked in range)
    if (!inGrid(w.ppRank, load.ppSize) || !inGrid(w.tpRank, load.tpSize) || seen.has(place)) continue;
    seen.add(place);
    out.push(w);
  }
  return out;
}

/** SPEC 8 steps 1-7 for one scheduled group; the first reason that applies ends the check. */
function checkGroup(group: ConsumerGroup, producer: PayloadGroup | undefined, ctx: LoadContext): GroupOutcome {
  const records = ctx.workers.map((w) => w.groups.get(group.groupId));
  // Step 1: a worker that could not cover the group makes the consumer's group skipped.
  const consumerSkipped = group.skipped || records.some((r) => r?.skipped === true);
  if (consumerSkipped && producer === undefined) return { kind: 'ignored' };
  if (consumerSkipped || producer === undefined) return { kind: 'unverified', reason: 'covered-one-side' };
  // Step 2.
  if (group.kind === 'state-local' && ctx.producerTpSize !== ctx.consumerTpSize) return { kind: 'left-out' };
  // Step 3.
  if (u64(producer.fingerprint) !== u64(group.fingerprint)) return { kind: 'unverified', reason: 'fingerprint' };
  // Step 4: the records must hold exactly the scheduled rows, every partial one value per row.
  const partials: Array<Map<string, BigUint64Array>> = [];
  for (const r of records) {
    if (r === undefined || r.start !== group.start || r.nBlocks !== group.nBlocks) {
      return { kind: 'unverified', reason: 'rows-differ' };
    }
    for (const values of r.partials.values()) {
      if (values.length !== group.nBlocks) return { kind: 'unverified', reason: 'rows-differ' };
    }
    partials.push(r.partials);
  }
  // Step 5.
  const checks = replicaChecks(partials, group.nBlocks);
  if (checks === null) return { kind: 'unverified', reason: 'replica-missing' };
  // Steps 6 and 7.
  return group.kind === 'attention'
    ? compareAttention(group, producer, checks, ctx)
    : compareState(group, producer, checks, ctx);
}

/**
 * SPEC 8 step 5. Returns, for each check `k` in `0 .. maxR-1`, the consumer's value of each loaded
 * block (index = offset from the group's `start`): over every worker, the sum of the partials whose
 * key `(R, r)` has `r == k mod R`. Returns `null` (`replica-missing`) when no key is present, a key
 * does not parse, or an `R` is seen without every replica `0 .. R-1`.
 *
 * Every array holds `nBlocks` values (step 4 checked the partials' lengths). A sum of one term is
 * that term's array itself, not a copy (the common case: TP 1, or one rank per replica key and
 * check); the caller only reads the result, and nothing here writes into a worker's partials.
 */
function replicaChecks(partials: ReadonlyArray<Map<string, BigUint64Array>>, nBlocks: number): BigUint64Array[] | null {
  // Per key present: the key and its per-block sum over every worker (`owned`: a copy of ours).
  const byKey = new Map<string, { key: ReplicaKey; sums: BigUint64Array; owned: boolean }>();
  for (const map of partials) {
    for (const [name, values] of map) {
      const entry = byKey.get(name);
      if (entry === undefined) {
        let key: ReplicaKey;
        try {
          key = parseReplicaKey(name);
        } catch {
          return null;
        }
        byKey.set(name, { key, sums: asUint64Array(values), owned: false });
        continue;
      }
      if (!entry.owned) entry.sums = entry.sums.slice();
      entry.owned = true;
      addInto(entry.sums, values, nBlocks);
    }
  }
  if (byKey.size === 0) return null;

  const replicasSeen = new Map<number, Set<number>>();
  for (const { key } of byKey.values()) {
    const set = replicasSeen.get(key.replicas) ?? new Set<number>();
    set.add(key.replica);
    replicasSeen.set(key.replicas, set);
  }
  for (const [replicas, seen] of replicasSeen) if (seen.size !== replicas) return null;

  const maxR = Math.max(...replicasSeen.keys());
  const checks: BigUint64Array[] = [];
  for (let k = 0; k < maxR; k++) {
    // Every R seen has all its replicas, so at least one key has r == k mod R.
    let check: BigUint64Array | undefined;
    let owned = false;
    for (const { key, sums } of byKey.values()) {
      if (key.replica !== k % key.replicas) continue;
      if (check === undefined) {
        check = sums;
        continue;
      }
      if (!owned) check = check.slice();
      owned = true;
      addInto(check, sums, nBlocks);
    }
    checks.push(check!);
  }
  return checks;
}

/**
 * `acc[i] = (acc[i] + x[i]) mod 2^64` for `i < n`: a BigUint64Array element store reduces modulo
 * 2^64 (ECMAScript ToBigUint64), which is the SPEC's arithmetic (preamble: every sum is modulo
 * 2^64); no `BigInt.asUintN` per element.
 */
function addInto(acc: BigUint64Array, x: ArrayLike<bigint>, n: number): void {
  for (let i = 0; i < n; i++) acc[i] += x[i];
}

/**
 * The values as a BigUint64Array: the array itself when it is one (what the types ask of
 * partials), else a copy reduced modulo 2^64, which changes no sum modulo 2^64.
 */
function asUint64Array(values: ArrayLike<bigint>): BigUint64Array {
  return values instanceof BigUint64Array ? values : BigUint64Array.from(values as ArrayLike<bigint>);
}

/**
 * True when `a[ai .. ai+n)` and `b[bi .. bi+n)` hold the same values: one native comparison of
 * their bytes (equal uint64 values have equal bytes in one host's order), no BigInt per element.
 */
function sameValues(a: BigUint64Array, ai: number, b: BigUint64Array, bi: number, n: number): boolean {
  return Buffer.from(a.buffer, a.byteOffset + 8 * ai, 8 * n).equals(Buffer.from(b.buffer, b.byteOffset + 8 * bi, 8 * n));
}

/**
 * SPEC 8 step 6 (kinds `state` and `state-local`): the payload holds exactly one value, at block
 * position 0, and the consumer exactly one row, at position 0; every check must equal that value.
 */
function compareState(group: ConsumerGroup, producer: PayloadGroup, checks: readonly BigUint64Array[], ctx: LoadContext): GroupOutcome {
  if (producer.start !== 0 || producer.values.length !== 1 || group.start !== 0 || group.nBlocks !== 1) {
    return { kind: 'unverified', reason: 'uncovered-tokens' };
  }
  if (ctx.sample && !ctx.sample.blockSampled(group.groupId, 0, 0)) return { kind: 'compared', bad: [], checked: 0, skipped: 1 };
  const expected = producer.values[0];
  return { kind: 'compared', bad: checks.some((check) => check[0] !== expected) ? [0] : [], checked: 1, skipped: 0 };
}

/** Block positions `first .. last` (inclusive) of one side that hold valid tokens of a chunk. */
interface BlockSpan {
  readonly first: number;
  readonly last: number;
}

/**
 * The blocks of size `blockSize` that hold the `valid` valid tokens of chunk `k` (of `chunkTokens`
 * tokens, a multiple of `blockSize`): the chunk's first block up to the block of its last valid token.
 */
function chunkBlocks(k: number, chunkTokens: number, blockSize: number, valid: number): BlockSpan {
  const first = (k * chunkTokens) / blockSize;
  return { first, last: first + Math.ceil(valid / blockSize) - 1 };
}

/** `min(C, max(0, numTokens - k*C))`: one side's valid tokens in chunk `k` (SPEC 8 step 7). */
function validTokens(numTokens: number, k: number, chunkTokens: number): number {
  return Math.min(chunkTokens, Math.max(0, numTokens - k * chunkTokens));
}

/**
 * SPEC 8 step 7 (kind `attention`): regroups both sides into chunks of `C = max(Bp, Bd)` tokens and
 * compares every chunk that holds a loaded consumer block with valid consumer tokens. Coverage of
 * every such chunk is checked before any value is compared, so one uncovered chunk makes the whole
 * group `uncovered-tokens` without a mismatch.
 */
function compareAttention(
  group: ConsumerGroup,
  payloadGroup: PayloadGroup,
  checks: readonly BigUint64Array[],
  ctx: LoadContext,
): GroupOutcome {
  let producer: Pick<PayloadGroup, 'blockSize' | 'start' | 'values'> = payloadGroup;
  let bp = producer.blockSize;
  const bd = group.blockSize;
  const positive = (n: number): boolean => Number.isSafeInteger(n) && n > 0;
  if (!positive(bp) || !positive(bd)) return { kind: 'unverified', reason: 'block-size' };
  let c = Math.max(bp, bd);
  if (c % bp !== 0 || c % bd !== 0) return { kind: 'unverified', reason: 'block-size' };
  let sub = false;
  if ((group.start * bd) % c !== 0) {
    // docs/checksum-extensions.md section 1: the producer's values at a block size S that divides
    // both Bp and Bd replace its own, so chunks are max(S, Bd) = Bd tokens and the start is aligned.
    const s = ctx.subBlocks.get(group.groupId);
    if (s === undefined || !positive(s.blockSize) || bp % s.blockSize !== 0 || bd % s.blockSize !== 0) {
      return { kind: 'unverified', reason: 'unaligned-prefix' };
    }
    producer = s;
    bp = s.blockSize;
    c = bd;
    sub = true;
  }

  const { all, loaded } = loadedChunks(group, bd, c, ctx.consumerTokens);
  if (all.length === 0) return { kind: 'empty' };
  // Sampled checking: only chunks whose every block (both sides) the sample names were summed.
  const { sample } = ctx;
  const chunks = sample ? all.filter((k) => chunkSampled(k, c, bp, bd, group.groupId, sample)) : all;
  const loadedIn = (k: number): number => {
    let n = 0;
    for (let pos = k * (c / bd); pos < (k + 1) * (c / bd); pos++) if (pos >= group.start && pos < group.start + group.nBlocks && pos * bd < ctx.consumerTokens) n++;
    return n;
  };
  // The counts of the sample (verdict.sampled); without a sample they are not reported, and
  // `checked` is just the loaded blocks with valid tokens.
  let checked = loaded;
  let skipped = 0;
  if (sample) {
    checked = 0;
    for (const k of chunks) checked += loadedIn(k);
    for (const k of all) skipped += loadedIn(k);
    skipped -= checked;
  }

  const sides: ChunkSides = { c, bp, bd, producer, group, producerTokens: ctx.producerTokens, consumerTokens: ctx.consumerTokens };
  const cover = coverage(chunks, sides);
  if (cover === 'uncovered') return { kind: 'unverified', reason: 'uncovered-tokens' };
  // A start that is not an integer names no block position (a correct scheduler never gives one):
  // fail-safe, nothing is compared.
  if (chunks.length > 0 && !(Number.isInteger(group.start) && Number.isInteger(producer.start))) return { kind: 'unverified', reason: 'rows-differ' };
  const differs = cover === 'single' ? singleBlockDiffs(chunks, sides, checks) : spanDiffs(chunks, sides, checks);
  return { kind: 'compared', bad: badPositions(chunks, sides, differs), checked, skipped, ...(sub ? { sub } : {}) };
}

/**
 * What the value comparison of one attention group reads (SPEC 8 step 7): the chunk size `c`, both
 * block sizes, the producer's values (its own or sub-block values), the consumer's group and both
 * token counts. The loops over chunks live in small functions of their own, each returning right
 * after its loop (V8 compiles a long loop on the stack; code after it in the same function would
 * be deoptimized on every call).
 */
interface ChunkSides {
  readonly c: number;
  readonly bp: number;
  readonly bd: number;
  readonly producer: Pick<PayloadGroup, 'start' | 'values'>;
  readonly group: ConsumerGroup;
  readonly producerTokens: number;
  readonly consumerTokens: number;
}

/**
 * Chunks (of `c` tokens) holding a loaded consumer block with a valid consumer token, ascending,
 * and how many such blocks there are. Loaded blocks are consecutive, so their chunks are too.
 */
function loadedChunks(group: ConsumerGroup, bd: number, c: number, consumerTokens: number): { all: number[]; loaded: number } {
  const all: number[] = [];
  let loaded = 0;
  for (let pos = Math.max(group.start, 0); pos < group.start + group.nBlocks && pos * bd < consumerTokens; pos++) {
    const k = Math.floor((pos * bd) / c);
    if (all[all.length - 1] !== k) all.push(k);
    loaded++;
  }
  return { all, loaded };
}

/**
 * Coverage of every chunk to compare: equal valid-token counts on both sides, and each side holds
 * every block with valid tokens of the chunk (chunkBlocks). `single` when, besides, every chunk is
 * one block on each side (then its sums are block values: Bp == Bd, or one last chunk).
 */
function coverage(chunks: readonly number[], s: ChunkSides): 'uncovered' | 'single' | 'spans' {
  let single = true;
  for (const k of chunks) {
    const valid = validTokens(s.consumerTokens, k, s.c);
    if (validTokens(s.producerTokens, k, s.c) !== valid) return 'uncovered';
    const p = chunkBlocks(k, s.c, s.bp, valid);
    const d = chunkBlocks(k, s.c, s.bd, valid);
    const producerHolds = p.first >= s.producer.start && p.last < s.producer.start + s.producer.values.length;
    const consumerHolds = d.first >= s.group.start && d.last < s.group.start + s.group.nBlocks;
    if (!producerHolds || !consumerHolds) return 'uncovered';
    if (p.first !== p.last || d.first !== d.last) single = false;
  }
  return single ? 'single' : 'spans';
}

/** The consumer's or the producer's blocks of chunk `k` that hold its valid tokens (chunkBlocks). */
function spanOf(k: number, s: ChunkSides, blockSize: number): BlockSpan {
  return chunkBlocks(k, s.c, blockSize, validTokens(s.consumerTokens, k, s.c));
}

/**
 * Values of covered chunks that are one block on each side: `differs[j]` = 1 when any check's
 * block value of `chunks[j]` differs from the producer's. Runs of chunks whose blocks are
 * consecutive on both sides are compared in bulk ({@link markDiffering}).
 */
function singleBlockDiffs(chunks: readonly number[], s: ChunkSides, checks: readonly BigUint64Array[]): Uint8Array {
  const n = chunks.length;
  const differs = new Uint8Array(n);
  let first = 0;
  // A chunk's first block (chunkBlocks: k * C / B) is its only one on each side here.
  for (let j = 1; j <= n; j++) {
    if (j < n && (chunks[j] * s.c) / s.bp === (chunks[j - 1] * s.c) / s.bp + 1 && (chunks[j] * s.c) / s.bd === (chunks[j - 1] * s.c) / s.bd + 1) continue;
    const pOff = (chunks[first] * s.c) / s.bp - s.producer.start;
    const dOff = (chunks[first] * s.c) / s.bd - s.group.start;
    for (const check of checks) markDiffering(s.producer.values, pOff, check, dOff, j - first, differs, first);
    first = j;
  }
  return differs;
}

/**
 * Values of covered chunks in general: `differs[j]` = 1 when any check's sum over the consumer's
 * blocks of `chunks[j]` differs from the producer's sum over its blocks of it (mod 2^64; blocks
 * past a side's numTokens are outside its span, so they count as zero).
 */
function spanDiffs(chunks: readonly number[], s: ChunkSides, checks: readonly BigUint64Array[]): Uint8Array {
  const n = chunks.length;
  const differs = new Uint8Array(n);
  const expected = spanSums(chunks, s, s.bp, s.producer.values, s.producer.start);
  for (const check of checks) markDiffering(expected, 0, spanSums(chunks, s, s.bd, check, s.group.start), 0, n, differs, 0);
  return differs;
}

/** Per chunk, the sum mod 2^64 of `values[pos - base]` over one side's blocks `pos` of the chunk. */
function spanSums(chunks: readonly number[], s: ChunkSides, blockSize: number, values: BigUint64Array, base: number): BigUint64Array {
  const sums = new BigUint64Array(chunks.length);
  for (let j = 0; j < chunks.length; j++) {
    const span = spanOf(chunks[j], s, blockSize);
    for (let pos = span.first; pos <= span.last; pos++) sums[j] += values[pos - base];
  }
  return sums;
}

/** The consumer's block positions of the chunks marked in `differs`, ascending (SPEC 8 step 7). */
function badPositions(chunks: readonly number[], s: ChunkSides, differs: Uint8Array): number[] {
  const bad: number[] = [];
  for (let j = 0; j < chunks.length; j++) {
    if (differs[j] !== 1) continue;
    const d = spanOf(chunks[j], s, s.bd);
    for (let pos = d.first; pos <= d.last; pos++) bad.push(pos);
  }
  return bad;
}

/**
 * Sets `differs[at + q]` to 1 for each `q < n` where `a[ai + q] != b[bi + q]`; one bulk comparison
 * first, so a run that matches costs no BigInt.
 */
function markDiffering(a: BigUint64Array, ai: number, b: BigUint64Array, bi: number, n: number, differs: Uint8Array, at: number): void {
  if (sameValues(a, ai, b, bi, n)) return;
  for (let q = 0; q < n; q++) if (a[ai + q] !== b[bi + q]) differs[at + q] = 1;
}

/**
 * Sampled checking: true when every block of chunk `k` (of `c` tokens) on both sides (block sizes
 * `bp`, `bd`) is one the consumer's sample names; the producer samples at a threshold at least the
 * consumer's (checked at load level), so it summed them too.
 */
function chunkSampled(k: number, c: number, bp: number, bd: number, groupId: number, sample: NonNullable<ConsumerLoad['sample']>): boolean {
  for (const b of [bp, bd]) {
    for (let pos = (k * c) / b; pos < ((k + 1) * c) / b; pos++) if (!sample.blockSampled(groupId, b, pos)) return false;
  }
  return true;
}
