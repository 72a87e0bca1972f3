/**
 * How the demo's summary and `summary.json` name loads and their times: a load without a verdict
 * (checksums off) is "loaded (not verified: checksums off)", not "no load"; the load wall time
 * summed over requests is "load wall time" (`loadWallMs`), the connector's metric "connector
 * transfer time", and neither is called plain "transfer time".
 */
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import type { Verdict } from '@kvconnect/checksum';
import { loadStatus, parsePrometheus, processMetrics, processSummaryLines, runDemo, summarize, summaryLines, type RequestOutcome, type RunOutcome } from '../src/index.js';

const verified: Verdict = { verdict: 'verified', mismatches: [], unverified: [], leftOut: [], wrongRequest: false, identity: 'checked' };
const request = (v: Verdict | null, loadWallMs: number | null, loadBytes: number): RequestOutcome =>
  ({ verdict: v, kind: v ? v.verdict : 'none', action: v ? 'use' : null, injected: new Map(), faultKinds: [], equalsReference: true, loadWallMs, loadBytes }) as unknown as RequestOutcome;
const run = (requests: RequestOutcome[]): RunOutcome =>
  ({ requests, checksumSeconds: { send: 0, recv: 0 }, checksumBytes: { send: 0, recv: 0 }, records: [], loads: [], wallMs: 5 }) as unknown as RunOutcome;

describe('report: loads and their times', () => {
  it('a load without a verdict is named by whether it happened and whether the checksums were off', () => {
    expect(loadStatus(request(null, 2.5, 1024), false)).toBe('loaded (not verified: checksums off)');
    expect(loadStatus(request(null, null, 1024), false)).toBe('loaded (not verified: checksums off)');
    expect(loadStatus(request(null, 2.5, 1024), null)).toBe('loaded (not verified)');
    expect(loadStatus(request(null, null, 0), false)).toBe('no load');
    expect(loadStatus(request(verified, 2.5, 1024), true)).toBe('verified');
  });

  it('summary: loaded-but-unverified apart from no load; "load wall time" summed over requests', () => {
    const s = summarize(run([request(null, 1.5, 1024), request(null, 2.5, 1024), request(null, null, 0), request(verified, 4, 2048)]), false);
    expect(s.loadedUnverified).toBe(2);
    expect(s.loadWallMs).toBe(8);
    expect(s).not.toHaveProperty('transferMs');
    const lines = summaryLines(s);
    expect(lines).toContain('verdicts: verified 1, mismatch 0, unverified 0, loaded (not verified: checksums off) 2, no load 1');
    expect(lines.some((l) => l.startsWith('load wall time: 8.0 ms summed over requests, 4.0 KiB loaded; checksum time: '))).toBe(true);
    expect(lines.some((l) => l.startsWith('transfer time'))).toBe(false);
  });

  it('multi-process summary: "connector transfer time" for the metric, "load wall time" for the summed loads', () => {
    const consumer = parsePrometheus(['kvconnect_nixl_xfer_time_seconds_sum{mode="pull",op="READ"} 0.125', 'kvconnect_nixl_xfer_time_seconds_count{mode="pull",op="READ"} 2'].join('\n'));
    const s = summarize(run([request(null, 30, 1024), request(null, 20, 1024)]), false);
    const lines = processSummaryLines(s, processMetrics(null, consumer), 0);
    expect(lines).toContain('connector transfer time: 125.0 ms over 2 transfers');
    expect(lines).toContain('load wall time: 50.0 ms summed over requests, 2.0 KiB loaded');
    expect(lines).toContain('verdicts: verified 0, mismatch 0, unverified 0, loaded (not verified: checksums off) 2');
    expect(lines.some((l) => l.startsWith('transfer time'))).toBe(false);
  });

  it('--no-checksums (in-process demo): console, report and summary.json say the KV was loaded, not verified', async () => {
    const out = mkdtempSync(join(tmpdir(), 'kvc-demo-nocs-'));
    const lines: string[] = [];
    const prompts = ['The capital of France is', 'def fibonacci(n):', 'Why do caches expire?'];
    const d = await runDemo({ connector: 'in-process', checksums: false, prompts, faultRate: 0, maxTokens: 2, out, print: (l) => lines.push(l), progress: false });
    expect(lines).toContain('verdicts: verified 0, mismatch 0, unverified 0, loaded (not verified: checksums off) 3');
    expect(lines.filter((l) => / r\d+: /.test(l))).toEqual(['  r0: no fault -> loaded (not verified: checksums off), use, output identical', '  r1: no fault -> loaded (not verified: checksums off), use, output identical', '  r2: no fault -> loaded (not verified: checksums off), use, output identical']);
    expect(lines.some((l) => l.includes('no load'))).toBe(false);
    expect(lines.some((l) => l.startsWith('load wall time: '))).toBe(true);
    const s = JSON.parse(readFileSync(join(out, 'summary.json'), 'utf8')) as { summary: Record<string, unknown>; requests: Array<Record<string, unknown>> };
    expect(s.summary).toMatchObject({ loadedUnverified: 3, consumerChecksums: false });
    expect(s.summary.loadWallMs).toBeGreaterThan(0);
    expect(s.summary).not.toHaveProperty('transferMs');
    for (const q of s.requests) {
      expect(q).toMatchObject({ verdict: 'none', load: 'loaded (not verified: checksums off)' });
      expect(q.loadWallMs).toBeGreaterThan(0);
      expect(q).not.toHaveProperty('transferMs');
    }
    const md = readFileSync(d.reportPath, 'utf8');
    expect(md).toContain('| verdicts | verified 0, mismatch 0, unverified 0, loaded (not verified: checksums off) 3 |');
    expect(md).toContain('x-axis ["verified", "mismatch", "unverified", "loaded (not verified: checksums off)"]');
    expect(md).not.toContain('no load');
  }, 60_000);
});
