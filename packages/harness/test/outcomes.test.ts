/**
 * The runner learns each load's outcome from the consumer engine's typed `load-outcome` events and
 * knows each request by its explicit index (in its request id), also with requests in flight
 * together: a transport error on one request and a bit flip on another land on exactly those.
 */
import { describe, expect, it } from 'vitest';
import { parseScenario, runScenario } from '../src/index.js';

describe('load outcomes per request', () => {
  it('concurrent requests: invalid blocks and a mismatch are attributed to the requests that had them', async () => {
    const s = parseScenario({
      name: 'outcomes',
      model: 'GQA-S',
      generate: { count: 6, promptTokens: [24, 40], maxTokens: 2 },
      concurrency: 3,
      consumer: { policy: 'recompute' },
      faults: [
        { requests: [1], kind: 'transport-error', tokens: [16, 20] },
        { requests: [4], kind: 'bit-flip', layer: 1, head: 2, token: 18, piece: 1, bit: 9 },
      ],
      expect: {},
    });
    const r = await runScenario(s);
    const got = r.runs[0].requests.map((o) => ({ i: o.index, invalid: o.invalidBlocks, kind: o.kind, action: o.action }));
    expect(got).toEqual([
      { i: 0, invalid: false, kind: 'verified', action: 'use' },
      { i: 1, invalid: true, kind: expect.any(String), action: 'recompute' },
      { i: 2, invalid: false, kind: 'verified', action: 'use' },
      { i: 3, invalid: false, kind: 'verified', action: 'use' },
      { i: 4, invalid: false, kind: 'mismatch', action: 'recompute' },
      { i: 5, invalid: false, kind: 'verified', action: 'use' },
    ]);
    expect(r.runs[0].requests.every((o) => o.equalsReference)).toBe(true);
  });
});
