/**
 * The demo's report and plan: count charts with whole-number axes, faults planned only where they
 * apply to the model (no `wrong-layout` for MLA, whose cache is neither NHD nor HND), the
 * in-process connector's one name (`in-process`; `inprocess` accepted with a deprecation note),
 * and the note that the presets' weights are seeded random.
 */
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { DEMO_CONNECTORS, DEMO_FAULTS, demoFaultApplies, mermaidCountBar, resolveModelSpec, runDemo } from '../src/index.js';

describe('demo report', () => {
  it('count charts have integer bars and a y axis from 0 to the largest count', () => {
    const md = mermaidCountBar('Unverified reasons', ['payload-missing'], [1], 'loads');
    expect(md).toContain('y-axis "loads" 0 --> 1\n');
    expect(md).toContain('bar [1]');
    expect(mermaidCountBar('Loads by verdict', ['verified', 'mismatch'], [0, 0], 'requests')).toContain('0 --> 1\n');
    expect(mermaidCountBar('Loads by verdict', ['verified', 'mismatch'], [7, 3], 'requests')).toContain('0 --> 7\n');
    expect(() => mermaidCountBar('x', ['a'], [0.5], 'loads')).toThrow(RangeError);
  });

  it('wrong-layout applies to paged attention with heads only (not MLA)', () => {
    const wrong = DEMO_FAULTS.find((f) => f.kind === 'wrong-layout')!;
    expect(demoFaultApplies(wrong, resolveModelSpec('mla'))).toBe(false);
    expect(demoFaultApplies(wrong, resolveModelSpec('dense-gqa'))).toBe(true);
    expect(demoFaultApplies(wrong, resolveModelSpec('hybrid-mamba2'))).toBe(true);
    expect(DEMO_FAULTS.filter((f) => f.kind !== 'wrong-layout').every((f) => demoFaultApplies(f, resolveModelSpec('mla')))).toBe(true);
  });

  it('--model mla --connector inprocess: deprecated alias of in-process, no wrong-layout planned, every fault caught, report written', async () => {
    expect(Object.keys(DEMO_CONNECTORS)).toContain('in-process');
    expect(Object.keys(DEMO_CONNECTORS)).not.toContain('inprocess');
    const out = mkdtempSync(join(tmpdir(), 'kvc-demo-mla-'));
    const lines: string[] = [];
    const prompts = ['The capital of France is', 'def fibonacci(n):', 'Why do caches expire?', 'Once upon a time', 'A good error message', 'Blocks move between machines'];
    const d = await runDemo({ connector: 'inprocess', model: 'mla', prompts, faultRate: 1, maxTokens: 2, out, print: (l) => lines.push(l), progress: false });
    expect(lines[0]).toBe('note: --connector inprocess is deprecated; use --connector in-process');
    expect(d.connector).toBe('in-process');
    const plan = lines.find((l) => l.startsWith('faulted requests: '))!;
    expect(plan).not.toContain('wrong-layout');
    expect(plan.split(', ')).toHaveLength(prompts.length);
    expect(d.result.expectations.filter((x) => !x.ok)).toEqual([]);
    expect(d.summary.verdicts.verified).toBe(0);
    expect(d.summary.identical).toBe(prompts.length);
    // said once, with the summary
    expect(lines.filter((l) => l.includes('seeded random weights'))).toEqual(['note: model mla has seeded random weights (not trained): its outputs are arbitrary tokens; the demo checks that each equals a single instance\'s, token for token']);
    const md = readFileSync(d.reportPath, 'utf8');
    expect(md).toContain('title "Loads by action"');
    expect(md).not.toMatch(/x-axis \[[^\]]*"recomputed"[^\]]*"identical output"/);
  }, 120_000);
});
