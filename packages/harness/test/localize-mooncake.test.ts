/**
 * Localizing a mismatch over MooncakeConnector end to end (issue #13 section 1, docs/localize.md):
 * the fault connector flips a bit of loaded KV, the consumer's drill-down asks the producer's
 * workers (`loc`, side-channel protocol 4) while they hold the blocks (`localize_hold_ms`), and the
 * `load-localized` result names exactly where the fault record (and the fault's spec) says. Without
 * a hold the producer no longer holds the blocks: `gone`. (tests/mooncake/localize.test.ts: the
 * verified path sends no `loc`.)
 */
import { describe, expect, it } from 'vitest';
import type { Localization } from '@kvconnect/core';
import { parseScenario, runScenario, type RequestOutcome } from '../src/index.js';

async function run(o: { connectorConfig: Record<string, unknown>; consumer?: Record<string, unknown>; producer?: Record<string, unknown>; faults: Array<Record<string, unknown>> }): Promise<RequestOutcome[]> {
  const s = parseScenario({
    name: 'localize-mooncake',
    model: 'GQA-S',
    connector: 'mooncake',
    mode: 'concurrent',
    connectorConfig: o.connectorConfig,
    ...(o.consumer ? { consumer: o.consumer } : {}),
    ...(o.producer ? { producer: o.producer } : {}),
    requests: [{ promptTokens: 40, promptSeed: 0 }],
    faults: o.faults,
    expect: {},
  });
  return (await runScenario(s)).runs[0].requests;
}

const where = (l: Localization | null) => (l ? l.groups.map((g) => [g.groupId, g.text]) : null);

describe('Mooncake: a mismatch is localized to where the fault was injected', () => {
  it('bit flip (P TP2 -> D TP1, hold 3 s): one layer, head, K or V and 16-token range, as the fault record says', async () => {
    // GQA-S: 4 KV heads of 8 bf16 elements: K is pieces 0-1 of the cell, V pieces 2-3.
    const [o] = await run({ connectorConfig: { localize_hold_ms: 3000 }, producer: { tp: 2 }, faults: [{ kind: 'bit-flip', requests: [0], layer: 1, head: 2, token: 20, piece: 3, bit: 9 }] });
    expect(o.kind).toBe('mismatch');
    expect(o.action).toBe('recompute');
    // The fault record: block 1 (tokens 16-31) of group 0 changed.
    expect([...(o.injected.get(0) ?? [])]).toEqual([1]);
    expect(o.localization?.status).toBe('localized');
    expect(where(o.localization)).toEqual([[0, ['layer 1, head 2, V, tokens 16-31']]]);
    expect(o.equalsReference).toBe(true);
  });

  it('without localize_hold_ms the producer freed the blocks: gone', async () => {
    const [o] = await run({ connectorConfig: {}, faults: [{ kind: 'bit-flip', requests: [0], layer: 0, head: 1, token: 3, piece: 0, bit: 2 }] });
    expect(o.kind).toBe('mismatch');
    expect(o.localization?.status).toBe('gone');
    expect(o.localization?.detail).toMatch(/was served/);
  });
});
