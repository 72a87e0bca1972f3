/** The demo report's lines for sampled checking and sub-block values (docs/checksum-extensions.md). */
import { describe, expect, it } from 'vitest';
import type { Verdict } from '@kvconnect/checksum';
import { summarize, summaryLines } from '../src/report.js';
import type { RequestOutcome, RunOutcome } from '../src/runner.js';

const verdict = (extra: Partial<Verdict>): Verdict => ({ verdict: 'verified', mismatches: [], unverified: [], leftOut: [], wrongRequest: false, identity: 'checked', ...extra });
const request = (v: Verdict | null): RequestOutcome =>
  ({ verdict: v, kind: v ? v.verdict : 'none', action: v ? 'use' : null, injected: new Map(), faultKinds: [], equalsReference: true, loadWallMs: 1, loadBytes: 10 }) as unknown as RequestOutcome;
const run = (requests: RequestOutcome[]): RunOutcome =>
  ({ requests, checksumSeconds: { send: 0, recv: 0 }, checksumBytes: { send: 0, recv: 0 }, records: [], loads: [], wallMs: 5 }) as unknown as RunOutcome;

describe('report: checksum extensions', () => {
  it('says how many loads were sampled, at which rate, and the blocks checked and left out', () => {
    const s = summarize(run([request(verdict({ sampled: { rate: 0.25, checked: 4, skipped: 12 } })), request(verdict({ sampled: { rate: 0.25, checked: 8, skipped: 8 }, subBlockGroups: [0] })), request(verdict({}))]));
    expect(s.sampled).toEqual({ loads: 2, rates: [0.25], checked: 12, skipped: 20 });
    expect(s.subBlockLoads).toBe(1);
    const lines = summaryLines(s);
    expect(lines).toContain('sampled checking: 2 loads at rate 0.25: 12 loaded blocks checked, 20 left out by the sample');
    expect(lines).toContain('unaligned prefix hits verified with sub-block values: 1');
  });

  it('adds no line when neither is in use', () => {
    const lines = summaryLines(summarize(run([request(verdict({})), request(null)])));
    expect(lines.some((l) => l.startsWith('sampled') || l.startsWith('unaligned'))).toBe(false);
  });
});
