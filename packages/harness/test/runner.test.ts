import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { checkExpectations, parseScenario, runDemo, runFiles, runScenario } from '../src/index.js';

describe('runner', () => {
  it('compares with a single instance and reports failing expectations as FAIL lines', async () => {
    const s = parseScenario({
      name: 'wrong-expectations',
      model: 'GQA-S',
      requests: [{ promptTokens: 30 }, { prompt: 'hello kv world' }],
      faults: [{ kind: 'bit-flip', requests: [0], token: 3 }],
      expect: {
        requests: [
          { request: 0, verdict: 'verified' },
          { request: 1, verdict: 'verified', output: 'reference', action: 'use' },
          { request: 0, mismatches: [{ group: 0, positions: [1] }] },
        ],
        counts: { mismatch: 1, verified: 1, injected: 1, recomputed: 1 },
      },
    });
    const r = await runScenario(s);
    const lines = r.expectations.map((x) => x.line);
    expect(lines[0]).toMatch(/^FAIL wrong-expectations: r0: verdict verified -- r0: verdict mismatch, expected verified/);
    expect(lines[1]).toMatch(/^PASS wrong-expectations: r1:/);
    expect(lines[2]).toMatch(/^FAIL .*mismatches g0\[0\], expected g0\[1\]/);
    expect(lines.filter((l) => l.includes('count')).every((l) => l.startsWith('PASS'))).toBe(true);
    // The same outcomes checked again give the same lines (pure).
    expect(checkExpectations(s, r.runs).map((x) => x.line)).toEqual(lines);
  });

  it('fails a false verify (a fault whose bytes the checksum cannot see is impossible here, so fake one)', async () => {
    const s = parseScenario({ name: 'fv', model: 'GQA-S', requests: [{ promptTokens: 20 }], expect: {} });
    const r = await runScenario(s);
    r.runs[0].requests[0].injected.set(0, [0]);
    const lines = checkExpectations(s, r.runs).map((x) => x.line);
    expect(lines.find((l) => l.includes('no load verified'))).toMatch(/^FAIL .*r0 VERIFIED over changed bytes g0\[0\]/);
  });

  it('skips scenarios whose connector is not available, with the reason', async () => {
    const s = parseScenario({ name: 'mc', model: 'GQA-S', connector: 'mooncake', mode: 'concurrent', requests: [{ promptTokens: 20 }], expect: {} });
    const r = await runScenario(s);
    if (r.skipped) expect(r.skipped).toMatch(/mooncake/i);
    else {
      expect(r.expectations.length).toBeGreaterThan(0);
      // The consumer found the producer's bootstrap server through its config (no lookup in the process): the load verified.
      expect(r.runs[0].requests[0].kind).toBe('verified');
    }
  });

  it('runFiles prints problems of an invalid file and the totals last', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'kvc-'));
    const bad = join(dir, 'bad.json');
    writeFileSync(bad, JSON.stringify({ name: 'b', model: 'GQA-S', requests: [], expect: { requests: 1 } }));
    const lines: string[] = [];
    const r = await runFiles([bad], (l) => lines.push(l));
    expect(r.failed).toBe(1);
    expect(lines).toContain('  requests: expected a non-empty array of requests');
    expect(lines).toContain('  expect.requests: expected an array of request expectations');
    expect(lines.at(-1)).toBe('0 passed, 1 failed');
  });
});

describe('demo', () => {
  it('runs prompts through P/D with faults and writes a report with plots', async () => {
    const out = mkdtempSync(join(tmpdir(), 'kvc-demo-'));
    const lines: string[] = [];
    const d = await runDemo({ prompts: ['The capital of France is', 'def fibonacci(n):', 'A good error message tells the user', 'Why do caches expire?', 'Once upon a time'], faultRate: 0.6, maxTokens: 4, out, print: (l) => lines.push(l), progress: false });
    expect(d.summary.requests).toBe(5);
    expect(d.summary.faulted).toBe(3);
    expect(d.summary.identical).toBe(5);
    expect(d.summary.verdicts.verified).toBe(2);
    expect(d.summary.recomputed).toBe(3);
    expect(lines.some((l) => l.startsWith('verdicts: verified 2'))).toBe(true);
    const md = readFileSync(d.reportPath, 'utf8');
    expect(md).toContain('xychart-beta');
    expect(md).toContain('| 4 |');
    expect(JSON.parse(readFileSync(join(out, 'summary.json'), 'utf8')).summary.requests).toBe(5);
  });
});
