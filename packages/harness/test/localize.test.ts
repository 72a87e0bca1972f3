/**
 * Localizing a mismatch end to end (issue #13 section 1, docs/localize.md): NIXL pull and push with
 * real embedded agents, the fault connector injecting each fault kind that changes loaded KV, and
 * the consumer's drill-down (`load-localized`) naming exactly where the fault record (and the
 * fault's own spec) says the bytes changed (tests/nixl/localize.test.ts: the verified path, a
 * producer that no longer holds the blocks).
 */
import { describe, expect, it } from 'vitest';
import type { Localization } from '@kvconnect/core';
import { parseScenario, runScenario, type RequestOutcome, type RunOutcome } from '../src/index.js';

const HOLD = { localize_hold_ms: 3000 };

async function run(o: { connector?: 'nixl-pull' | 'nixl-push'; model?: unknown; consumer?: Record<string, unknown>; producer?: Record<string, unknown>; faults: Array<Record<string, unknown>>; requests?: number; connectorConfig?: Record<string, unknown> }): Promise<RequestOutcome[]> {
  return (await runFull(o)).requests;
}

async function runFull(o: Parameters<typeof run>[0]): Promise<RunOutcome> {
  const s = parseScenario({
    name: 'localize',
    model: o.model ?? 'GQA-S',
    connector: o.connector ?? 'nixl-pull',
    connectorConfig: o.connectorConfig ?? HOLD,
    ...(o.consumer ? { consumer: o.consumer } : {}),
    ...(o.producer ? { producer: o.producer } : {}),
    requests: Array.from({ length: o.requests ?? 1 }, (_, i) => ({ promptTokens: 40, promptSeed: i })),
    faults: o.faults,
    expect: {},
  });
  return (await runScenario(s)).runs[0];
}

/** The drill-down's regions in words, per group. */
const where = (l: Localization | null) => (l ? l.groups.map((g) => [g.groupId, g.text]) : null);

/** 16-token ranges `[start, end)` (clipped to 40 tokens) holding the record's changed tokens of group 0. */
function rangesOf(o: RequestOutcome): Array<[number, number]> {
  const toks = new Set<number>();
  for (const r of o.injected.get(0) ?? []) for (let t = r * 16; t < Math.min(40, r * 16 + 16); t++) toks.add(t);
  return [...new Set([...toks].map((t) => Math.floor(t / 16) * 16))].sort((a, b) => a - b).map((s) => [s, Math.min(40, s + 16)]);
}

describe('a mismatch is localized to where the fault was injected (NIXL pull, P TP1 -> D TP2)', () => {
  it('bit flip: one layer, head, K or V and 16-token range', async () => {
    // GQA-S: 4 KV heads of 8 bf16 elements: K is pieces 0-1 of the cell, V pieces 2-3.
    const [o] = await run({ consumer: { tp: 2 }, faults: [{ kind: 'bit-flip', requests: [0], layer: 1, head: 2, token: 20, piece: 1, bit: 9 }] });
    expect(o.kind).toBe('mismatch');
    expect(o.action).toBe('recompute');
    expect(o.localization?.status).toBe('localized');
    expect(where(o.localization)).toEqual([[0, ['layer 1, head 2, K, tokens 16-31']]]);
    expect(o.equalsReference).toBe(true);
  });

  it('bit flip on every replica of a replicated head (GQA-S at TP 8: R = 2) and on the first only', async () => {
    const [all, first] = await run({
      consumer: { tp: 8 },
      requests: 2,
      faults: [
        { kind: 'bit-flip', requests: [0], layer: 0, head: 3, token: 35, piece: 3, bit: 1, replicas: 'all' },
        { kind: 'bit-flip', requests: [1], layer: 0, head: 3, token: 35, piece: 3, bit: 1 },
      ],
    });
    expect(where(all.localization)).toEqual([[0, ['layer 0, head 3, V, tokens 32-39']]]);
    expect(where(first.localization)).toEqual([[0, ['layer 0, head 3, V, tokens 32-39, replica 2:0']]]);
  });

  it('corrupted region: exactly its layers, heads, part and tokens', async () => {
    const [o] = await run({ consumer: { tp: 2 }, faults: [{ kind: 'corrupt-region', requests: [0], fill: 'random', layers: [1, 1], heads: [1, 2], tokens: [32, 39], part: 'V' }] });
    expect(where(o.localization)).toEqual([[0, ['layer 1, heads 1-2, V, tokens 32-39']]]);
  });

  it('random stale range: the layer, head and range its record names', async () => {
    const r = await runFull({ consumer: { tp: 2 }, faults: [{ kind: 'random-stale-range', requests: [0], seed: 5, fill: 'random' }] });
    const o = r.requests[0];
    const details = r.records.filter((x) => x.kind === 'random-stale-range').map((x) => x.detail);
    const rec = /layer (\d+) head (\d+) tokens (\d+)-(\d+)/.exec(details[0] ?? '');
    expect(rec).not.toBeNull();
    const [, layer, head, a, b] = rec!.map(Number);
    expect(where(o.localization)).toEqual([[0, [`layer ${layer}, head ${head}, K and V, tokens ${a}-${Math.min(b, 39)}`]]]);
  });

  for (const [name, fault, consumer] of [
    ['misplaced block', { kind: 'misplaced-block', position: 1 }, { tp: 2 }],
    ['misplaced tokens', { kind: 'misplaced-tokens', tokens: [18, 21], sourceOffset: 3 }, { tp: 2 }],
    ['wrong layout (consumer HND read as NHD)', { kind: 'wrong-layout' }, { tp: 2, layout: 'HND' }],
  ] as const) {
    it(`${name}: every layer, head, K and V of exactly the changed token ranges`, async () => {
      const [o] = await run({ consumer, faults: [{ requests: [0], ...fault }] });
      expect(o.localization?.status).toBe('localized');
      const g = o.localization!.groups;
      expect(g.map((x) => x.groupId)).toEqual([0]);
      const tokens = new Set(g[0].regions.flatMap((r) => r.tokens.map(([s, e]) => `${s}-${e}`)));
      // The regions' ranges are exactly the 16-token ranges of the tokens the record says changed.
      const want = new Set<string>();
      for (const [s, e] of rangesOf(o)) want.add(`${s}-${e}`);
      expect(mergeRanges(tokens)).toEqual(mergeRanges(want));
      expect(new Set(g[0].regions.map((r) => r.layer))).toEqual(new Set([0, 1]));
    });
  }

  it('Mamba B/C sliced as if sharded: conv B (rank 1 copy) and C rows of the Mamba layers only', async () => {
    const [o] = await run({ model: { preset: 'HYB-S', overrides: { mamba: { nGroups: 1 } } }, consumer: { tp: 2 }, faults: [{ kind: 'mamba-bc-sharded', requests: [0] }] });
    expect(o.kind).toBe('mismatch');
    // HYB-S: layers 1 and 2 are Mamba2 (4 heads x 4 = 16 channels, dState 4): conv rows x 0-15, B 16-19, C 20-23 (SPEC 3 global rows).
    expect(where(o.localization)).toEqual([
      [
        1,
        ['layer 1, conv segment 1, rows 16-19, replica 2:1', 'layer 1, conv segment 2, rows 20-23', 'layer 2, conv segment 1, rows 16-19, replica 2:1', 'layer 2, conv segment 2, rows 20-23'],
      ],
    ]);
  });

  it('stale producer blocks: the producer now holds what was received (changed after checksumming)', async () => {
    const [o] = await run({ consumer: { tp: 2 }, faults: [{ kind: 'stale', requests: [0] }] });
    expect(o.kind).toBe('mismatch');
    expect(o.localization?.status).toBe('no-difference');
    expect(o.localization?.detail).toMatch(/changed after they were checksummed/);
  });
});

describe('NIXL push', () => {
  it('bit flip: localized as with pull', async () => {
    const [o] = await run({ connector: 'nixl-push', consumer: { tp: 2 }, faults: [{ kind: 'bit-flip', requests: [0], layer: 0, head: 1, token: 7, piece: 2, bit: 60 }] });
    expect(where(o.localization)).toEqual([[0, ['layer 0, head 1, V, tokens 0-15']]]);
  });
});

/** Ranges `"s-e"` merged where they touch. */
function mergeRanges(set: Set<string>): string[] {
  const r = [...set].map((x) => x.split('-').map(Number) as [number, number]).sort((a, b) => a[0] - b[0]);
  const out: Array<[number, number]> = [];
  for (const [s, e] of r) {
    const last = out[out.length - 1];
    if (last && last[1] >= s) last[1] = Math.max(last[1], e);
    else out.push([s, e]);
  }
  return out.map(([s, e]) => `${s}-${e}`);
}


describe("the demo report's section", () => {
  it('one line per drill-down: where, or why not', async () => {
    const { localizationLines } = await import('../src/report.js');
    const base = { faultKinds: ['bit-flip'] } as unknown as RequestOutcome;
    const loc = (status: Localization['status'], detail: string, text: string[] = []): Localization => ({ requestId: 'r', status, detail, groups: text.length ? [{ groupId: 0, regions: [], text }] : [], ms: 1 });
    const lines = localizationLines([
      { ...base, index: 3, localization: loc('localized', '', ['layer 1, head 2, K, tokens 16-31']) },
      { ...base, index: 4, faultKinds: [], localization: loc('gone', 'request x: lease expired') },
      { ...base, index: 5, localization: null },
    ]);
    expect(lines.slice(4)).toEqual(['- r3 (bit-flip): group 0: layer 1, head 2, K, tokens 16-31', '- r4: gone: request x: lease expired', '']);
    expect(lines[0]).toBe('## Where the mismatches are');
    expect(localizationLines([{ ...base, index: 0, localization: null }])).toEqual([]);
  });
});
