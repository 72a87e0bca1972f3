/**
 * SPEC 8 verifier: every `verification` case of the shared vectors, then targeted cases whose
 * values are built here from a made-up per-token value (block values are sums of token values,
 * so they regroup across block sizes exactly as SPEC 2 block values do), without verify.ts.
 */
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import type {
  ChecksumPayload,
  ConsumerGroup,
  ConsumerLoad,
  GroupKind,
  UnverifiedReason,
  Verdict,
  WorkerGroupRecord,
  WorkerRecord,
} from '../src/types.js';
import { verdictSummary, verifyLoad } from '../src/verify.js';

// ---------------------------------------------------------------------------------------------
// Conformance vectors
// ---------------------------------------------------------------------------------------------

/** Vectors as stored: uint64 as decimal strings, maps as objects (vectors README). */
interface JsonCase {
  title: string;
  payload:
    | null
    | 'malformed'
    | {
        numTokens: number;
        producerTpSize: number;
        groups: Array<{ groupId: number; fingerprint: string; blockSize: number; start: number; values: string[] }>;
      };
  consumer: {
    numTokens: number;
    tpSize: number;
    ppSize: number;
    groups: Array<Omit<ConsumerGroup, 'fingerprint'> & { fingerprint: string }>;
    workers: Array<{
      ppRank: number;
      tpRank: number;
      groups: Record<string, { start: number; nBlocks: number; skipped: boolean; partials: Record<string, string[]> }>;
    }>;
  };
  expected: Pick<Verdict, 'verdict' | 'mismatches' | 'unverified'>;
}

/** Throws (failing the suite) when the file is missing: the vectors are not optional. */
const vectors = JSON.parse(
  readFileSync(new URL('../../../../shared/vectors/checksum-v1.json', import.meta.url), 'utf8'),
) as { verification: JsonCase[] };

const u64s = (xs: string[]): BigUint64Array => BigUint64Array.from(xs, (x) => BigInt(x));

function payloadFromJson(p: JsonCase['payload']): ChecksumPayload | null | 'malformed' {
  if (p === null || p === 'malformed') return p;
  return {
    numTokens: p.numTokens,
    producerTpSize: p.producerTpSize,
    groups: p.groups.map((g) => ({ ...g, fingerprint: BigInt(g.fingerprint), values: u64s(g.values) })),
  };
}

function loadFromJson(c: JsonCase['consumer']): ConsumerLoad {
  return {
    numTokens: c.numTokens,
    tpSize: c.tpSize,
    ppSize: c.ppSize,
    groups: c.groups.map((g) => ({ ...g, fingerprint: BigInt(g.fingerprint) })),
    workers: c.workers.map((w) => ({
      ppRank: w.ppRank,
      tpRank: w.tpRank,
      groups: new Map(
        Object.entries(w.groups).map(([id, g]) => [
          Number(id),
          {
            start: g.start,
            nBlocks: g.nBlocks,
            skipped: g.skipped,
            partials: new Map(Object.entries(g.partials).map(([key, values]) => [key, u64s(values)])),
          },
        ]),
      ),
    })),
  };
}

describe('verifyLoad: conformance vectors (SPEC 8)', () => {
  it('holds the 30 verification cases', () => {
    expect(vectors.verification).toHaveLength(30);
  });

  for (const c of vectors.verification) {
    it(c.title, () => {
      const { verdict, mismatches, unverified } = verifyLoad(payloadFromJson(c.payload), loadFromJson(c.consumer));
      expect({ verdict, mismatches, unverified }).toEqual(c.expected);
    });
  }
});

// ---------------------------------------------------------------------------------------------
// Builders for targeted cases
// ---------------------------------------------------------------------------------------------

const MASK = (1n << 64n) - 1n;
const FP = 0xfeedn;

/** A made-up uint64 value of token `t` in slice `slice` (a head, shard, layer or state segment). */
const tokenValue = (t: number, slice: number): bigint =>
  (BigInt(t + 1) * 0x9e3779b97f4a7c15n + BigInt(slice + 1) * 0xc2b2ae3d27d4eb4fn) & MASK;

/** Block values of positions `start .. start+n-1` of size `bs`: valid tokens only, summed over `slices`. */
function blocks(bs: number, start: number, n: number, numTokens: number, slices: number[] = [0]): bigint[] {
  const out: bigint[] = [];
  for (let pos = start; pos < start + n; pos++) {
    let sum = 0n;
    for (let t = pos * bs; t < Math.min((pos + 1) * bs, numTokens); t++) {
      for (const s of slices) sum = (sum + tokenValue(t, s)) & MASK;
    }
    out.push(sum);
  }
  return out;
}

/** A copy of `values` with `delta` added to entry `i` (a corrupted block or state). */
function corrupt(values: bigint[], i: number, delta = 1n << 17n): bigint[] {
  return values.map((v, j) => (j === i ? (v + delta) & MASK : v));
}

interface GroupSpec {
  groupId?: number;
  fingerprint?: bigint;
  blockSize: number;
  start?: number;
  values: bigint[];
}

function payload(numTokens: number, groups: GroupSpec[], producerTpSize = 1): ChecksumPayload {
  return {
    numTokens,
    producerTpSize,
    groups: groups.map((g) => ({
      groupId: g.groupId ?? 0,
      fingerprint: g.fingerprint ?? FP,
      blockSize: g.blockSize,
      start: g.start ?? 0,
      values: BigUint64Array.from(g.values),
    })),
  };
}

function group(g: Partial<ConsumerGroup> & { blockSize: number; nBlocks: number }): ConsumerGroup {
  return { groupId: 0, kind: 'attention' as GroupKind, start: 0, fingerprint: FP, skipped: false, ...g };
}

/** A worker's record of one group: `partials` by replica key; `nBlocks` from the first partial. */
function rec(partials: Record<string, bigint[]>, start = 0, extra: Partial<WorkerGroupRecord> = {}): WorkerGroupRecord {
  const first = Object.values(partials)[0];
  return {
    start,
    nBlocks: first?.length ?? 0,
    skipped: false,
    partials: new Map(Object.entries(partials).map(([k, v]) => [k, BigUint64Array.from(v)])),
    ...extra,
  };
}

function worker(tpRank: number, groups: Record<number, WorkerGroupRecord>, ppRank = 0): WorkerRecord {
  return { ppRank, tpRank, groups: new Map(Object.entries(groups).map(([id, g]) => [Number(id), g])) };
}

function load(
  numTokens: number,
  groups: ConsumerGroup[],
  workers: WorkerRecord[],
  grid: { tpSize?: number; ppSize?: number } = {},
): ConsumerLoad {
  return { numTokens, tpSize: grid.tpSize ?? 1, ppSize: grid.ppSize ?? 1, groups, workers };
}

/** One TP1 consumer worker and group 0 holding `values` under key `1:0`. */
function tp1Load(numTokens: number, g: { blockSize: number; start?: number }, values: bigint[]): ConsumerLoad {
  const start = g.start ?? 0;
  return load(
    numTokens,
    [group({ blockSize: g.blockSize, start, nBlocks: values.length })],
    [worker(0, { 0: rec({ '1:0': values }, start) })],
  );
}

/** Verdicts of version-1 payloads (these builders make no token digest): identity unchecked. */
const VERIFIED: Verdict = { verdict: 'verified', mismatches: [], unverified: [], leftOut: [], wrongRequest: false, identity: 'unchecked' };

function mismatch(...groups: Array<[number, number[]]>): Verdict {
  const mismatches = groups.map(([groupId, positions]) => ({ groupId, positions }));
  return { ...VERIFIED, verdict: 'mismatch', mismatches };
}

function unverified(...reasons: Array<[number | null, UnverifiedReason]>): Verdict {
  return { ...VERIFIED, verdict: 'unverified', unverified: reasons.map(([groupId, reason]) => ({ groupId, reason })) };
}

// ---------------------------------------------------------------------------------------------
// Targeted cases
// ---------------------------------------------------------------------------------------------

describe('verifyLoad: different block sizes (SPEC 8.7)', () => {
  const N = 80;

  it('P16 -> D32 regroups the producer blocks into the consumer blocks', () => {
    const p = payload(N, [{ blockSize: 16, values: blocks(16, 0, 5, N) }]);
    const d = blocks(32, 0, 3, N);
    expect(verifyLoad(p, tp1Load(N, { blockSize: 32 }, d))).toEqual(VERIFIED);
    expect(verifyLoad(p, tp1Load(N, { blockSize: 32 }, corrupt(d, 1)))).toEqual(mismatch([0, [1]]));
  });

  it('P16 -> D32 reports a corrupted producer block at the consumer block holding it', () => {
    const p = payload(N, [{ blockSize: 16, values: corrupt(blocks(16, 0, 5, N), 4) }]);
    expect(verifyLoad(p, tp1Load(N, { blockSize: 32 }, blocks(32, 0, 3, N)))).toEqual(mismatch([0, [2]]));
  });

  it('P32 -> D16 reports every consumer block of the corrupted chunk', () => {
    const p = payload(N, [{ blockSize: 32, values: blocks(32, 0, 3, N) }]);
    const d = blocks(16, 0, 5, N);
    expect(verifyLoad(p, tp1Load(N, { blockSize: 16 }, d))).toEqual(VERIFIED);
    expect(verifyLoad(p, tp1Load(N, { blockSize: 16 }, corrupt(d, 3)))).toEqual(mismatch([0, [2, 3]]));
    expect(verifyLoad(p, tp1Load(N, { blockSize: 16 }, corrupt(d, 4)))).toEqual(mismatch([0, [4]]));
  });

  it('counts a producer block past its numTokens as zero, whatever its value', () => {
    const values = [...blocks(16, 0, 3, 40), 0xdeadn];
    const p = payload(40, [{ blockSize: 16, values }]);
    expect(verifyLoad(p, tp1Load(40, { blockSize: 32 }, blocks(32, 0, 2, 40)))).toEqual(VERIFIED);
  });

  it('ignores a loaded consumer block without valid tokens, in the report too', () => {
    const p = payload(40, [{ blockSize: 32, values: blocks(32, 0, 2, 40) }]);
    const d = [...blocks(16, 0, 3, 40), 0xdeadn];
    expect(verifyLoad(p, tp1Load(40, { blockSize: 16 }, d))).toEqual(VERIFIED);
    expect(verifyLoad(p, tp1Load(40, { blockSize: 16 }, corrupt(d, 2)))).toEqual(mismatch([0, [2]]));
  });

  it('leaves a group unverified when a loaded block shares its chunk with a valid block not loaded', () => {
    // Stricter than upstream: consumer block 2 is loaded, block 3 of the same 32-token chunk is not.
    const p = payload(64, [{ blockSize: 32, values: blocks(32, 0, 2, 64) }]);
    expect(verifyLoad(p, tp1Load(64, { blockSize: 16 }, blocks(16, 0, 3, 64)))).toEqual(
      unverified([0, 'uncovered-tokens']),
    );
  });

  it('compares only the loaded blocks when the last valid consumer block is not loaded at equal sizes', () => {
    const p = payload(64, [{ blockSize: 16, values: blocks(16, 0, 4, 64) }]);
    expect(verifyLoad(p, tp1Load(64, { blockSize: 16 }, blocks(16, 0, 3, 64)))).toEqual(VERIFIED);
  });

  it('rejects block sizes that are not positive integers as block-size', () => {
    const p = payload(40, [{ blockSize: 16, values: blocks(16, 0, 3, 40) }]);
    expect(verifyLoad(p, tp1Load(40, { blockSize: 0 }, blocks(16, 0, 3, 40)))).toEqual(unverified([0, 'block-size']));
    expect(verifyLoad(p, tp1Load(40, { blockSize: -16 }, blocks(16, 0, 3, 40)))).toEqual(unverified([0, 'block-size']));
  });
});

describe('verifyLoad: consumer prefix hits (SPEC 8.7)', () => {
  const N = 80;
  const p32 = payload(N, [{ blockSize: 32, values: blocks(32, 0, 3, N) }]);

  it('P32 -> D16 after a 32-token prefix hit (aligned) verifies and finds corruption', () => {
    const d = blocks(16, 2, 3, N);
    expect(verifyLoad(p32, tp1Load(N, { blockSize: 16, start: 2 }, d))).toEqual(VERIFIED);
    expect(verifyLoad(p32, tp1Load(N, { blockSize: 16, start: 2 }, corrupt(d, 1)))).toEqual(mismatch([0, [2, 3]]));
  });

  it('P32 -> D16 after a 16- or 48-token prefix hit is unaligned-prefix, even if corrupted', () => {
    expect(verifyLoad(p32, tp1Load(N, { blockSize: 16, start: 1 }, blocks(16, 1, 4, N)))).toEqual(
      unverified([0, 'unaligned-prefix']),
    );
    expect(verifyLoad(p32, tp1Load(N, { blockSize: 16, start: 3 }, corrupt(blocks(16, 3, 2, N), 0)))).toEqual(
      unverified([0, 'unaligned-prefix']),
    );
  });

  it('P16 -> D32 after a prefix hit: the producer need only send the loaded chunks', () => {
    const d = blocks(32, 1, 2, N);
    const from2 = payload(N, [{ blockSize: 16, start: 2, values: blocks(16, 2, 3, N) }]);
    expect(verifyLoad(from2, tp1Load(N, { blockSize: 32, start: 1 }, d))).toEqual(VERIFIED);
    const from3 = payload(N, [{ blockSize: 16, start: 3, values: blocks(16, 3, 2, N) }]);
    expect(verifyLoad(from3, tp1Load(N, { blockSize: 32, start: 1 }, d))).toEqual(unverified([0, 'uncovered-tokens']));
  });

  it('equal block sizes after a one-block prefix hit verify', () => {
    const p = payload(N, [{ blockSize: 16, values: blocks(16, 0, 5, N) }]);
    expect(verifyLoad(p, tp1Load(N, { blockSize: 16, start: 1 }, blocks(16, 1, 4, N)))).toEqual(VERIFIED);
  });
});

describe('verifyLoad: replicas (SPEC 8.5)', () => {
  const N = 40;
  const p = payload(N, [{ blockSize: 16, values: blocks(16, 0, 3, N, [0, 1]) }]);
  /** GQA at TP4 with R = 2: ranks 0,1 hold shard 0 (slice 0), ranks 2,3 shard 1 (slice 1). */
  const gqa = (bad?: { rank: number; block: number }): ConsumerLoad =>
    load(
      N,
      [group({ blockSize: 16, nBlocks: 3 })],
      [0, 1, 2, 3].map((rank) => {
        const values = blocks(16, 0, 3, N, [Math.floor(rank / 2)]);
        const mine = bad?.rank === rank ? corrupt(values, bad.block) : values;
        return worker(rank, { 0: rec({ [`2:${rank % 2}`]: mine }) });
      }),
      { tpSize: 4 },
    );

  it('GQA at TP4: every replica verifies', () => {
    expect(verifyLoad(p, gqa())).toEqual(VERIFIED);
  });

  it('GQA at TP4: one bad replica is a mismatch, whichever replica it is', () => {
    expect(verifyLoad(p, gqa({ rank: 1, block: 2 }))).toEqual(mismatch([0, [2]]));
    expect(verifyLoad(p, gqa({ rank: 2, block: 0 }))).toEqual(mismatch([0, [0]]));
  });

  it('no replica key at all is replica-missing', () => {
    const l = load(N, [group({ blockSize: 16, nBlocks: 3 })], [worker(0, { 0: rec({}, 0, { nBlocks: 3 }) })]);
    expect(verifyLoad(p, l)).toEqual(unverified([0, 'replica-missing']));
  });

  it('a replica key that does not parse is replica-missing', () => {
    for (const key of ['x', '2:2', '0:0']) {
      const w = worker(0, { 0: rec({ [key]: blocks(16, 0, 3, N, [0, 1]) }) });
      const l = load(N, [group({ blockSize: 16, nBlocks: 3 })], [w]);
      expect(verifyLoad(p, l)).toEqual(unverified([0, 'replica-missing']));
    }
  });
});

describe('verifyLoad: state groups (SPEC 8.6)', () => {
  // Mamba2-like: x and ssm rows sharded (R = 1), B and C replicated on both ranks (R = 2).
  const [x0, x1, ssm0, ssm1, bc] = [0, 1, 2, 3, 4].map((slice) => blocks(16, 0, 1, 16, [slice])[0]);
  const whole = (x0 + x1 + ssm0 + ssm1 + bc) & MASK;
  const p = payload(40, [{ groupId: 1, fingerprint: 777n, blockSize: 64, values: [whole] }]);
  const mamba = (bc1 = bc, bc0 = bc): ConsumerLoad =>
    load(
      40,
      [group({ groupId: 1, kind: 'state', fingerprint: 777n, blockSize: 16, nBlocks: 1 })],
      [
        worker(0, { 1: rec({ '1:0': [(x0 + ssm0) & MASK], '2:0': [bc0] }) }),
        worker(1, { 1: rec({ '1:0': [(x1 + ssm1) & MASK], '2:1': [bc1] }) }),
      ],
      { tpSize: 2 },
    );

  it('TP1 -> TP2 with replicated B and C verifies', () => {
    expect(verifyLoad(p, mamba())).toEqual(VERIFIED);
  });

  it('a bad value only in the last rank\'s replicated partial (2:1) is a mismatch at 0', () => {
    expect(verifyLoad(p, mamba((bc + 1n) & MASK))).toEqual(mismatch([1, [0]]));
    expect(verifyLoad(p, mamba(bc, (bc + 1n) & MASK))).toEqual(mismatch([1, [0]]));
  });

  it('needs exactly one value at position 0 on both sides', () => {
    const with_ = (values: bigint[], start = 0) =>
      payload(40, [{ groupId: 1, fingerprint: 777n, blockSize: 64, start, values }]);
    expect(verifyLoad(with_([whole, whole]), mamba())).toEqual(unverified([1, 'uncovered-tokens']));
    expect(verifyLoad(with_([whole], 1), mamba())).toEqual(unverified([1, 'uncovered-tokens']));
    expect(verifyLoad(with_([]), mamba())).toEqual(unverified([1, 'uncovered-tokens']));
    const atOne = load(
      40,
      [group({ groupId: 1, kind: 'state', fingerprint: 777n, blockSize: 16, start: 1, nBlocks: 1 })],
      [worker(0, { 1: rec({ '1:0': [whole] }, 1) })],
    );
    expect(verifyLoad(p, atOne)).toEqual(unverified([1, 'uncovered-tokens']));
  });

  it('state-local: compared at equal TP sizes, left out (and listed) across TP sizes', () => {
    const stateLocal = (tpSize: number, values: bigint[]): ConsumerLoad =>
      load(
        40,
        [group({ groupId: 2, kind: 'state-local', fingerprint: 5n, blockSize: 16, nBlocks: 1 })],
        values.map((v, rank) => worker(rank, { 2: rec({ '1:0': [v] }) })),
        { tpSize },
      );
    const p2 = payload(40, [{ groupId: 2, fingerprint: 5n, blockSize: 16, values: [(x0 + x1) & MASK] }], 2);
    expect(verifyLoad(p2, stateLocal(2, [x0, x1]))).toEqual(VERIFIED);
    expect(verifyLoad(p2, stateLocal(2, [x0, x1 + 1n]))).toEqual(mismatch([2, [0]]));
    expect(verifyLoad(p2, stateLocal(1, [x0]))).toEqual({
      ...unverified([null, 'nothing-to-verify']),
      leftOut: [2],
    });
  });

  it('state-local across TP sizes but skipped on one side is covered-one-side (step 1 first)', () => {
    const p2 = payload(40, [], 2);
    const l = load(40, [group({ groupId: 2, kind: 'state-local', blockSize: 16, nBlocks: 1 })], [
      worker(0, { 2: rec({ '1:0': [1n] }) }),
    ]);
    expect(verifyLoad(p2, l)).toEqual(unverified([2, 'covered-one-side']));
  });
});

describe('verifyLoad: workers (SPEC 8, load level and step 4)', () => {
  const N = 40;
  const p = payload(N, [{ blockSize: 16, values: blocks(16, 0, 3, N, [0, 1, 2, 3]) }]);
  const g = group({ blockSize: 16, nBlocks: 3 });
  /** TP2 x PP2: stage `pp` holds layers 2pp, 2pp+1; rank `tp` holds one shard of each (slice 2pp+tp). */
  const part = (pp: number, tp: number): bigint[] => blocks(16, 0, 3, N, [2 * pp + tp]);

  it('a PP2 consumer sums both stages', () => {
    const ws = [0, 1].flatMap((pp) => [0, 1].map((tp) => worker(tp, { 0: rec({ '1:0': part(pp, tp) }) }, pp)));
    expect(verifyLoad(p, load(N, [g], ws, { tpSize: 2, ppSize: 2 }))).toEqual(VERIFIED);
    ws[3] = worker(1, { 0: rec({ '1:0': corrupt(part(1, 1), 1) }) }, 1);
    expect(verifyLoad(p, load(N, [g], ws, { tpSize: 2, ppSize: 2 }))).toEqual(mismatch([0, [1]]));
    expect(verifyLoad(p, load(N, [g], ws.slice(0, 3), { tpSize: 2, ppSize: 2 }))).toEqual(
      unverified([null, 'workers-missing']),
    );
  });

  const tp2 = payload(N, [{ blockSize: 16, values: blocks(16, 0, 3, N, [0, 1]) }]);
  const rank = (tp: number, values = blocks(16, 0, 3, N, [tp])) => worker(tp, { 0: rec({ '1:0': values }) });

  it('a duplicate record counts once: it neither fills a missing worker nor is summed twice', () => {
    const missing = unverified([null, 'workers-missing']);
    expect(verifyLoad(tp2, load(N, [g], [rank(0), rank(0)], { tpSize: 2 }))).toEqual(missing);
    expect(verifyLoad(tp2, load(N, [g], [rank(0), rank(1), rank(0)], { tpSize: 2 }))).toEqual(VERIFIED);
    expect(verifyLoad(tp2, load(N, [g], [rank(0), rank(1), rank(1, [7n, 7n, 7n])], { tpSize: 2 }))).toEqual(VERIFIED);
  });

  it('a record outside the TP x PP grid is not a worker of the load', () => {
    const missing = unverified([null, 'workers-missing']);
    expect(verifyLoad(tp2, load(N, [g], [rank(0), rank(2)], { tpSize: 2 }))).toEqual(missing);
    expect(verifyLoad(tp2, load(N, [g], [rank(0), rank(1), rank(2)], { tpSize: 2 }))).toEqual(VERIFIED);
  });

  it('load-level reasons come in order and end the check', () => {
    const missing = load(N, [g], [rank(0)], { tpSize: 2 });
    expect(verifyLoad(null, missing)).toEqual({ ...unverified([null, 'no-payload']), identity: 'none' });
    expect(verifyLoad('malformed', missing)).toEqual({ ...unverified([null, 'malformed-payload']), identity: 'none' });
  });

  it('a worker without a record for a scheduled group, or with other rows, is rows-differ', () => {
    const none = worker(1, {});
    expect(verifyLoad(tp2, load(N, [g], [rank(0), none], { tpSize: 2 }))).toEqual(unverified([0, 'rows-differ']));
    const fewer = worker(1, { 0: rec({ '1:0': blocks(16, 0, 2, N, [1]) }) });
    expect(verifyLoad(tp2, load(N, [g], [rank(0), fewer], { tpSize: 2 }))).toEqual(unverified([0, 'rows-differ']));
  });
});

describe('verifyLoad: groups and the final verdict (SPEC 8)', () => {
  const N = 40;
  const values = blocks(16, 0, 3, N);

  it('gives each group at most its first reason, and keeps check order in both lists', () => {
    const p = payload(N, [
      { groupId: 0, values, blockSize: 16 },
      { groupId: 1, values, blockSize: 16, fingerprint: 1n },
      { groupId: 2, values, blockSize: 16 },
      { groupId: 9, values, blockSize: 16 },
    ]);
    const groups = [2, 1, 3, 0].map((groupId) => group({ groupId, blockSize: 16, nBlocks: 3 }));
    // Group 1: fingerprint and rows both differ; group 3: absent from the payload and rows differ.
    const w = worker(0, {
      2: rec({ '1:0': corrupt(values, 0) }),
      1: rec({ '1:0': values }, 1),
      0: rec({ '1:0': corrupt(values, 2) }),
    });
    expect(verifyLoad(p, load(N, groups, [w]))).toEqual({
      verdict: 'mismatch',
      mismatches: [
        { groupId: 2, positions: [0] },
        { groupId: 0, positions: [2] },
      ],
      unverified: [
        { groupId: 1, reason: 'fingerprint' },
        { groupId: 3, reason: 'covered-one-side' },
      ],
      leftOut: [],
      wrongRequest: false,
      identity: 'unchecked',
    });
  });

  it('an empty groups payload with nothing scheduled is nothing-to-verify', () => {
    expect(verifyLoad(payload(N, []), load(N, [], [worker(0, {})]))).toEqual(unverified([null, 'nothing-to-verify']));
  });

  it('groups skipped on both sides, or loaded blocks without valid tokens, verify nothing', () => {
    const skipped = load(N, [group({ blockSize: 16, nBlocks: 3, skipped: true })], [worker(0, {})]);
    expect(verifyLoad(payload(N, []), skipped)).toEqual(unverified([null, 'nothing-to-verify']));
    const past = payload(N, [{ blockSize: 16, start: 3, values: [5n] }]);
    expect(verifyLoad(past, tp1Load(N, { blockSize: 16, start: 3 }, [5n]))).toEqual(
      unverified([null, 'nothing-to-verify']),
    );
  });

  it('a worker that skipped a group the producer also left out ignores the group', () => {
    const w = worker(0, { 0: rec({}, 0, { nBlocks: 3, skipped: true }) });
    const l = load(N, [group({ blockSize: 16, nBlocks: 3 })], [w]);
    expect(verifyLoad(payload(N, []), l)).toEqual(unverified([null, 'nothing-to-verify']));
  });
});

describe('verifyLoad: fail-safety', () => {
  const N = 40;

  it('a payload group with too few values is uncovered-tokens', () => {
    const p = payload(N, [{ blockSize: 32, values: blocks(32, 0, 1, N) }]);
    expect(verifyLoad(p, tp1Load(N, { blockSize: 16 }, blocks(16, 0, 3, N)))).toEqual(
      unverified([0, 'uncovered-tokens']),
    );
  });

  it('worker partial arrays shorter or longer than nBlocks are rows-differ', () => {
    const p = payload(N, [{ blockSize: 16, values: blocks(16, 0, 3, N) }]);
    for (const values of [blocks(16, 0, 2, N), blocks(16, 0, 4, N)]) {
      const w = worker(0, { 0: rec({ '1:0': values }, 0, { nBlocks: 3 }) });
      const l = load(N, [group({ blockSize: 16, nBlocks: 3 })], [w]);
      expect(verifyLoad(p, l)).toEqual(unverified([0, 'rows-differ']));
    }
  });

  it('of two payload groups with one id, the first counts', () => {
    const values = blocks(16, 0, 3, N);
    const p = payload(N, [
      { blockSize: 16, values },
      { blockSize: 16, values: corrupt(values, 0) },
    ]);
    expect(verifyLoad(p, tp1Load(N, { blockSize: 16 }, values))).toEqual(VERIFIED);
  });

  it('loaded blocks at negative positions hold no token and are ignored', () => {
    const p = payload(N, [{ blockSize: 16, values: blocks(16, 0, 3, N) }]);
    const d = [0xdeadn, ...blocks(16, 0, 3, N)];
    expect(verifyLoad(p, tp1Load(N, { blockSize: 16, start: -1 }, d))).toEqual(VERIFIED);
  });

  it('never throws, and the verdict always agrees with its lists', () => {
    const small = fc.integer({ min: -2, max: 6 });
    const u64 = fc.bigInt({ min: 0n, max: MASK });
    const key = fc.constantFrom('1:0', '2:0', '2:1', '4:3', '0:0', 'x');
    const partials = fc.dictionary(key, fc.array(u64, { maxLength: 5 }));
    const workerGroup = fc.record({ start: small, nBlocks: small, skipped: fc.boolean(), partials });
    const arb = fc.record({
      payload: fc.oneof(
        fc.constantFrom(null, 'malformed' as const),
        fc.record({
          numTokens: fc.integer({ min: -1, max: 100 }),
          producerTpSize: fc.integer({ min: 1, max: 3 }),
          groups: fc.array(
            fc.record({
              groupId: fc.integer({ min: 0, max: 2 }),
              fingerprint: fc.constantFrom(0n, FP),
              blockSize: fc.constantFrom(0, 1, 8, 16, 24, 32),
              start: small,
              values: fc.array(u64, { maxLength: 8 }),
            }),
            { maxLength: 3 },
          ),
        }),
      ),
      load: fc.record({
        numTokens: fc.integer({ min: -1, max: 100 }),
        tpSize: fc.integer({ min: 0, max: 3 }),
        ppSize: fc.integer({ min: 1, max: 2 }),
        groups: fc.array(
          fc.record({
            groupId: fc.integer({ min: 0, max: 2 }),
            kind: fc.constantFrom<GroupKind>('attention', 'state', 'state-local'),
            blockSize: fc.constantFrom(0, 1, 8, 16, 24, 32),
            start: small,
            nBlocks: small,
            fingerprint: fc.constantFrom(0n, FP),
            skipped: fc.boolean(),
          }),
          { maxLength: 3 },
        ),
        workers: fc.array(
          fc.record({
            ppRank: fc.integer({ min: -1, max: 2 }),
            tpRank: fc.integer({ min: -1, max: 3 }),
            groups: fc.dictionary(fc.constantFrom('0', '1', '2'), workerGroup),
          }),
          { maxLength: 5 },
        ),
      }),
    });
    fc.assert(
      fc.property(arb, ({ payload: rawPayload, load: rawLoad }) => {
        const p =
          rawPayload === null || rawPayload === 'malformed'
            ? rawPayload
            : {
                ...rawPayload,
                groups: rawPayload.groups.map((g) => ({ ...g, values: BigUint64Array.from(g.values) })),
              };
        const l: ConsumerLoad = {
          ...rawLoad,
          workers: rawLoad.workers.map((w) => ({
            ...w,
            groups: new Map(
              Object.entries(w.groups).map(([id, r]) => [
                Number(id),
                { ...r, partials: new Map(Object.entries(r.partials).map(([k, v]) => [k, BigUint64Array.from(v)])) },
              ]),
            ),
          })),
        };
        const v = verifyLoad(p, l);
        const implied = v.mismatches.length > 0 ? 'mismatch' : v.unverified.length > 0 ? 'unverified' : 'verified';
        expect(v.verdict).toBe(implied);
        for (const m of v.mismatches) {
          expect(m.positions.length).toBeGreaterThan(0);
          expect(m.positions).toEqual([...m.positions].sort((a, b) => a - b));
        }
        expect(verdictSummary(v)).toContain(v.verdict);
      }),
      { numRuns: 2000, seed: 20240611 },
    );
  });
});

describe('verdictSummary', () => {
  it('names the verdict, groups, block positions and reasons on one line', () => {
    expect(verdictSummary({ ...VERIFIED, identity: 'checked' })).toBe('verified');
    const v: Verdict = {
      verdict: 'mismatch',
      mismatches: [{ groupId: 0, positions: [2, 3] }],
      unverified: [{ groupId: 1, reason: 'fingerprint' }],
      leftOut: [4],
      wrongRequest: false,
      identity: 'checked',
    };
    const s = verdictSummary(v);
    expect(s).not.toContain('\n');
    expect(s).toBe(
      'mismatch: group 0 blocks [2,3]; group 1 fingerprint; group 4 left out (state-local across TP sizes)',
    );
    expect(verdictSummary({ ...unverified([null, 'no-payload']), identity: 'none' })).toBe('unverified: no-payload');
  });

  it('says when identity was unchecked (version 1) and when the KV is another request\'s (SPEC 8.0)', () => {
    expect(verdictSummary(VERIFIED)).toBe('verified: identity unchecked');
    expect(verdictSummary(unverified([null, 'workers-missing']))).toBe('unverified: workers-missing; identity unchecked');
    expect(verdictSummary({ ...mismatch([0, [0, 1]]), wrongRequest: true, identity: 'checked' })).toBe('mismatch: wrong request; group 0 blocks [0,1]');
  });
});

// ---------------------------------------------------------------------------------------------
// Identity (SPEC 8.0)
// ---------------------------------------------------------------------------------------------

/** SPEC 6.1 digest, written here from the SPEC text (not payload.ts): SHA-256 of LE uint32 ids, first 8 bytes LE. */
function digestOf(ids: readonly number[]): bigint {
  const b = Buffer.alloc(4 * ids.length);
  ids.forEach((t, i) => b.writeUInt32LE(t, 4 * i));
  return createHash('sha256').update(b).digest().readBigUInt64LE(0);
}

describe('verifyLoad: identity (SPEC 8.0)', () => {
  const N = 40;
  const prompt = Array.from({ length: N + 2 }, (_, i) => 1000 + 7 * i); // consumer prompt (2 more than loaded)
  const values = blocks(16, 0, 3, N);
  const v2 = (digest: bigint): ChecksumPayload => ({ ...payload(N, [{ blockSize: 16, values }]), version: 2, tokenDigest: digest });
  const withTokens = (l: ConsumerLoad, tokenIds?: number[]): ConsumerLoad => ({ ...l, tokenIds });
  const CHECKED: Verdict = { ...VERIFIED, identity: 'checked' };
  const wrong = (...groups: Array<[number, number[]]>): Verdict => ({ ...mismatch(...groups), wrongRequest: true, identity: 'checked' });

  it('verifies a version-2 payload whose digest is that of the first numTokens prompt tokens', () => {
    expect(verifyLoad(v2(digestOf(prompt.slice(0, N))), withTokens(tp1Load(N, { blockSize: 16 }, values), prompt))).toEqual(CHECKED);
  });

  it('another request\'s intact KV and checksums: mismatch at every loaded block, wrongRequest', () => {
    const other = prompt.map((t, i) => (i === 5 ? t + 1 : t));
    expect(verifyLoad(v2(digestOf(other.slice(0, N))), withTokens(tp1Load(N, { blockSize: 16 }, values), prompt))).toEqual(wrong([0, [0, 1, 2]]));
  });

  it('a prompt shorter than the producer\'s numTokens, or none given, is a wrong request', () => {
    const d = digestOf(prompt.slice(0, N));
    expect(verifyLoad(v2(d), withTokens(tp1Load(N, { blockSize: 16 }, values), prompt.slice(0, N - 1)))).toEqual(wrong([0, [0, 1, 2]]));
    expect(verifyLoad(v2(d), tp1Load(N, { blockSize: 16 }, values))).toEqual(wrong([0, [0, 1, 2]]));
    expect(verifyLoad({ ...v2(d), tokenDigest: undefined }, withTokens(tp1Load(N, { blockSize: 16 }, values), prompt))).toEqual(wrong([0, [0, 1, 2]]));
  });

  it('a prompt token that is not a uint32 is a wrong request, never an exception', () => {
    const bad = prompt.map((t, i) => (i === 3 ? -1 : t));
    expect(verifyLoad(v2(digestOf(prompt.slice(0, N))), withTokens(tp1Load(N, { blockSize: 16 }, values), bad))).toEqual(wrong([0, [0, 1, 2]]));
  });

  it('is checked before workers-missing, and names only loaded positions of non-skipped groups', () => {
    const d = digestOf(prompt.slice(0, 10)); // not the digest of the first 40
    const groups = [group({ groupId: 0, blockSize: 16, start: 1, nBlocks: 2 }), group({ groupId: 1, blockSize: 16, nBlocks: 3, skipped: true }), group({ groupId: 2, blockSize: 16, nBlocks: 3 })];
    const w = worker(0, { 0: rec({ '1:0': values.slice(1) }, 1), 2: rec({}, 0, { nBlocks: 3, skipped: true }) });
    const l = withTokens(load(N, groups, [w], { tpSize: 2 }), prompt); // rank 1 missing
    expect(verifyLoad(v2(d), l)).toEqual(wrong([0, [1, 2]]));
    expect(verifyLoad(v2(digestOf(prompt.slice(0, N))), l)).toEqual({ ...unverified([null, 'workers-missing']), identity: 'checked' });
    expect(verifyLoad(null, l)).toEqual({ ...unverified([null, 'no-payload']), identity: 'none' });
  });

  it('checks a version-1 payload as before, identity unchecked, whatever the prompt', () => {
    expect(verifyLoad(payload(N, [{ blockSize: 16, values }]), withTokens(tp1Load(N, { blockSize: 16 }, values), [1, 2, 3]))).toEqual(VERIFIED);
    expect(verifyLoad(payload(N, [{ blockSize: 16, values }]), withTokens(tp1Load(N, { blockSize: 16 }, corrupt(values, 1)), prompt))).toEqual(mismatch([0, [1]]));
  });

  it('a right request with a corrupted block is a plain mismatch (wrongRequest false)', () => {
    expect(verifyLoad(v2(digestOf(prompt.slice(0, N))), withTokens(tp1Load(N, { blockSize: 16 }, corrupt(values, 2)), prompt))).toEqual({ ...mismatch([0, [2]]), identity: 'checked' });
  });
});
