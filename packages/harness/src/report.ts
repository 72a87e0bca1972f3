/**
 * Summaries and Markdown reports of scenario runs (the demo's report): counts by verdict and
 * reason, recomputed and failed loads, outputs equal to a single instance, load wall time, checksum
 * time and bytes, with Mermaid `xychart-beta` plots. "Load wall time" is the consumer's time per
 * load (first worker start to last worker finish, from the fault injector's ground truth) summed
 * over requests; it is not the connector's transfer time metric (the multi-process demo's
 * "connector transfer time", `kvconnect_{nixl,mooncake}_xfer_time_seconds`), see docs/scenarios.md.
 * @module
 */
import type { RequestOutcome, RunOutcome, ScenarioResult } from './runner.js';

/** The numbers of one run. */
export interface RunSummary {
  requests: number;
  verdicts: { verified: number; mismatch: number; unverified: number; 'transfer-failed': number; none: number };
  /** Unverified (and mismatch-side unverified) reasons, by SPEC 8 code. */
  unverifiedReasons: Record<string, number>;
  recomputed: number;
  failed: number;
  /** Requests whose loaded bytes the injector changed, and requests any fault hit. */
  injected: number;
  faulted: number;
  identical: number;
  errors: number;
  /**
   * Load wall time summed over requests, ms: each request's first worker start to last worker
   * finish of its load (ground truth), added up (concurrent loads overlap, so the sum can exceed the
   * run's wall time). Not the connector's transfer time metric. Checksum compute time by side, ms.
   */
  loadWallMs: number;
  checksumMs: { send: number; recv: number };
  /** KV bytes loaded by the consumers; bytes the checksum workers summed by side. */
  loadBytes: number;
  checksumBytes: { send: number; recv: number };
  wallMs: number;
  /** The consumer's KV checksums in the run (null: not known to the summary). */
  consumerChecksums: boolean | null;
  /**
   * Requests with no verdict whose KV was loaded all the same (a load wall time or bytes recorded):
   * loaded without checksum verification. `verdicts.none` counts them too.
   */
  loadedUnverified: number;
  /** Sampled checking (docs/checksum-extensions.md): loads checked on a sample, their rate(s) and loaded blocks checked / left out. */
  sampled: { loads: number; rates: number[]; checked: number; skipped: number };
  /** Loads with an unaligned prefix hit verified through sub-block values (docs/checksum-extensions.md). */
  subBlockLoads: number;
}

/** A request's load happened: its ground truth recorded a load wall time or loaded bytes. */
const loaded = (q: Pick<RequestOutcome, 'loadWallMs' | 'loadBytes'>) => (q.loadWallMs !== null && q.loadWallMs !== undefined) || q.loadBytes > 0;

/**
 * What a request's KV load was, as the demo's request lines, report and `summary.json` name it: its
 * verdict kind (`verified`, `mismatch`, `unverified`, `transfer-failed`); for a request without a
 * verdict whose KV was loaded (a load wall time or bytes recorded), `loaded (not verified: checksums
 * off)` where the consumer's checksums were off, `loaded (not verified)` where they were on or that
 * is not known (`consumerChecksums` null); `no load` when no load was recorded.
 */
export function loadStatus(q: Pick<RequestOutcome, 'kind' | 'loadWallMs' | 'loadBytes'>, consumerChecksums: boolean | null): string {
  if (q.kind !== 'none') return q.kind;
  if (!loaded(q)) return 'no load';
  return loadedUnverifiedLabel(consumerChecksums);
}

/** {@link loadStatus}'s name of a load without a verdict. */
const loadedUnverifiedLabel = (consumerChecksums: boolean | null) => (consumerChecksums === false ? 'loaded (not verified: checksums off)' : 'loaded (not verified)');

/**
 * The summary of a run. `consumerChecksums`: whether the consumer's KV checksums were on (names a
 * load without a verdict, {@link loadStatus}); null when not known.
 */
export function summarize(run: RunOutcome, consumerChecksums: boolean | null = null): RunSummary {
  const r = run.requests;
  const reasons: Record<string, number> = {};
  for (const o of r) for (const u of o.verdict?.unverified ?? []) reasons[u.reason] = (reasons[u.reason] ?? 0) + 1;
  return {
    requests: r.length,
    verdicts: {
      verified: r.filter((o) => o.kind === 'verified').length,
      mismatch: r.filter((o) => o.kind === 'mismatch').length,
      unverified: r.filter((o) => o.kind === 'unverified').length,
      'transfer-failed': r.filter((o) => o.kind === 'transfer-failed').length,
      none: r.filter((o) => o.kind === 'none').length,
    },
    unverifiedReasons: reasons,
    recomputed: r.filter((o) => o.action === 'recompute').length,
    failed: r.filter((o) => o.action === 'fail').length,
    injected: r.filter((o) => o.injected.size > 0).length,
    faulted: r.filter((o) => o.faultKinds.length > 0).length,
    identical: r.filter((o) => o.equalsReference).length,
    errors: r.filter((o) => o.error !== undefined).length,
    loadWallMs: r.reduce((a, o) => a + (o.loadWallMs ?? 0), 0),
    checksumMs: { send: run.checksumSeconds.send * 1000, recv: run.checksumSeconds.recv * 1000 },
    loadBytes: r.reduce((a, o) => a + o.loadBytes, 0),
    checksumBytes: { ...run.checksumBytes },
    wallMs: run.wallMs,
    consumerChecksums,
    loadedUnverified: r.filter((o) => o.kind === 'none' && loaded(o)).length,
    sampled: {
      loads: r.filter((o) => o.verdict?.sampled).length,
      rates: [...new Set(r.flatMap((o) => (o.verdict?.sampled ? [o.verdict.sampled.rate] : [])))].sort(),
      checked: r.reduce((a, o) => a + (o.verdict?.sampled?.checked ?? 0), 0),
      skipped: r.reduce((a, o) => a + (o.verdict?.sampled?.skipped ?? 0), 0),
    },
    subBlockLoads: r.filter((o) => (o.verdict?.subBlockGroups?.length ?? 0) > 0).length,
  };
}

const fmt = (x: number, d = 1) => x.toFixed(d);
const bytes = (n: number) => (n >= 1 << 20 ? `${fmt(n / (1 << 20), 2)} MiB` : n >= 1024 ? `${fmt(n / 1024, 1)} KiB` : `${n} B`);

/**
 * The "Where the mismatches are" section (docs/localize.md): one line per mismatched load's
 * drill-down, e.g. `r3: group 0: layer 1, head 2, K, tokens 16-31`; empty when no load has one.
 */
export function localizationLines(requests: readonly RequestOutcome[]): string[] {
  const with_ = requests.filter((q) => q.localization);
  if (with_.length === 0) return [];
  const lines = with_.map((q) => {
    const l = q.localization!;
    const where = l.status === 'localized' ? l.groups.map((g) => `group ${g.groupId}: ${g.text.join('; ')}`).join(' | ') : `${l.status}: ${l.detail}`;
    return `- r${q.index}${q.faultKinds.length ? ` (${q.faultKinds.join(', ')})` : ''}: ${esc(where)}`;
  });
  return ['## Where the mismatches are', '', 'Fine sums asked of the producer after each mismatch (docs/localize.md): layer, KV head, K or V, token range (state: rows).', '', ...lines, ''];
}

/**
 * The summary's `verdicts:` line: counts by verdict and unverified reason, loads failed in transit,
 * loads without a verdict named as {@link loadStatus} names them, and requests with no load.
 */
export function verdictLine(s: RunSummary): string {
  const reasons = Object.entries(s.unverifiedReasons)
    .map(([k, v]) => `${k} ${v}`)
    .join(', ');
  const noLoad = s.verdicts.none - s.loadedUnverified;
  const unchecked = loadedUnverifiedLabel(s.consumerChecksums);
  return `verdicts: verified ${s.verdicts.verified}, mismatch ${s.verdicts.mismatch}, unverified ${s.verdicts.unverified}${reasons ? ` (${reasons})` : ''}${s.verdicts['transfer-failed'] ? `, load failed in transit ${s.verdicts['transfer-failed']}` : ''}${s.loadedUnverified ? `, ${unchecked} ${s.loadedUnverified}` : ''}${noLoad ? `, no load ${noLoad}` : ''}`;
}

/** The summary as plain text lines (the demo prints them). */
export function summaryLines(s: RunSummary): string[] {
  return [
    `requests: ${s.requests} (${s.faulted} hit by a fault, ${s.injected} with changed KV bytes)`,
    verdictLine(s),
    `recomputed / failed / errors returned: ${s.recomputed} / ${s.failed} / ${s.errors}`,
    `outputs identical to a single instance: ${s.identical}/${s.requests}`,
    `load wall time: ${fmt(s.loadWallMs)} ms summed over requests, ${bytes(s.loadBytes)} loaded; checksum time: producer ${fmt(s.checksumMs.send, 2)} ms over ${bytes(s.checksumBytes.send)}, consumer ${fmt(s.checksumMs.recv, 2)} ms over ${bytes(s.checksumBytes.recv)}`,
    ...extensionLines(s),
    `wall time: ${fmt(s.wallMs / 1000, 2)} s`,
  ];
}

/** The lines of the checksum extensions in use (docs/checksum-extensions.md): sampled checking, sub-block values; none when neither was. */
export function extensionLines(s: RunSummary): string[] {
  return [
    ...(s.sampled.loads ? [`sampled checking: ${s.sampled.loads} loads at rate ${s.sampled.rates.join(', ')}: ${s.sampled.checked} loaded blocks checked, ${s.sampled.skipped} left out by the sample`] : []),
    ...(s.subBlockLoads ? [`unaligned prefix hits verified with sub-block values: ${s.subBlockLoads}`] : []),
  ];
}

function mermaidBar(title: string, labels: string[], values: number[], yLabel: string): string {
  const max = Math.max(1, ...values);
  return [
    '```mermaid',
    'xychart-beta',
    `    title "${title}"`,
    `    x-axis [${labels.map((l) => JSON.stringify(l)).join(', ')}]`,
    `    y-axis "${yLabel}" 0 --> ${Math.ceil(max * 1.1 * 100) / 100}`,
    `    bar [${values.map((v) => Math.round(v * 100) / 100).join(', ')}]`,
    '```',
  ].join('\n');
}

/**
 * A Mermaid bar chart of counts: integer bars, the y axis from 0 to the largest count (at least 1),
 * so that its ticks are whole numbers of `yLabel`.
 * @throws RangeError for a count that is not a non-negative integer.
 */
export function mermaidCountBar(title: string, labels: string[], counts: number[], yLabel: string): string {
  for (const c of counts) if (!(Number.isSafeInteger(c) && c >= 0)) throw new RangeError(`${title}: count ${c} is not a non-negative integer`);
  return [
    '```mermaid',
    'xychart-beta',
    `    title "${title}"`,
    `    x-axis [${labels.map((l) => JSON.stringify(l)).join(', ')}]`,
    `    y-axis "${yLabel}" 0 --> ${Math.max(1, ...counts)}`,
    `    bar [${counts.join(', ')}]`,
    '```',
  ].join('\n');
}

const esc = (s: string) => s.replace(/\|/g, '\\|').replace(/\n/g, ' ');

/** A Markdown report of a scenario result (first run, or every run with a heading each). */
export function markdownReport(r: ScenarioResult, o: { title?: string; setup?: string[]; prompts?: string[] } = {}): string {
  const out: string[] = [`# ${o.title ?? `kvconnect scenario ${r.scenario.name}`}`, '', `Generated ${new Date().toISOString()}.`, ''];
  if (r.scenario.description) out.push(r.scenario.description, '');
  if (o.setup?.length) out.push('## Setup', '', ...o.setup.map((l) => `- ${l}`), '');
  for (const run of r.runs) {
    const s = summarize(run, r.scenario.consumer.checksums ?? run.spec.checksums ?? r.scenario.checksums);
    if (r.runs.length > 1) out.push(`## ${run.label || 'run'}`, '');
    out.push('## Summary', '', '| | |', '|---|---|');
    for (const l of summaryLines(s)) {
      const [k, ...v] = l.split(': ');
      out.push(`| ${esc(k)} | ${esc(v.join(': '))} |`);
    }
    // Verdicts (what the checksums said), actions (what the consumer did) and outputs: one chart each.
    const noLoad = s.verdicts.none - s.loadedUnverified;
    const verdictLabels = ['verified', 'mismatch', 'unverified', ...(s.loadedUnverified ? [loadedUnverifiedLabel(s.consumerChecksums)] : []), ...(noLoad ? ['no load'] : [])];
    const verdictCounts = [s.verdicts.verified, s.verdicts.mismatch, s.verdicts.unverified, ...(s.loadedUnverified ? [s.loadedUnverified] : []), ...(noLoad ? [noLoad] : [])];
    out.push('', '## Verdicts', '', mermaidCountBar('Loads by verdict', verdictLabels, verdictCounts, 'requests'), '');
    const used = run.requests.filter((q) => q.action === 'use').length;
    out.push('## Actions', '', mermaidCountBar('Loads by action', ['used', 'recomputed', 'failed'], [used, s.recomputed, s.failed], 'requests'), '');
    out.push(mermaidCountBar('Outputs against a single instance', ['identical', 'different'], [s.identical, s.requests - s.identical], 'requests'), '');
    const reasons = Object.entries(s.unverifiedReasons);
    if (reasons.length) out.push(mermaidCountBar('Unverified reasons', reasons.map(([k]) => k), reasons.map(([, v]) => v), 'loads'), '');
    out.push('## Load wall time and checksum time per request', '');
    // Per-load figures exist only where the loads ran in this process; no chart of zeros otherwise.
    if (run.requests.some((q) => q.loadWallMs !== null && q.loadWallMs !== undefined)) {
      out.push(mermaidBar('KV load wall time per request (ms)', run.requests.map((q) => `r${q.index}`), run.requests.map((q) => q.loadWallMs ?? 0), 'ms'), '');
    } else out.push('Per-request KV load wall time: n/a (the loads ran in the consumer process; see the summary for totals).', '');
    if (run.requests.some((q) => q.loadBytes > 0)) {
      out.push(mermaidBar('KV bytes loaded per request (KiB)', run.requests.map((q) => `r${q.index}`), run.requests.map((q) => q.loadBytes / 1024), 'KiB'), '');
    } else out.push('Per-request KV bytes: n/a (the loads ran in the consumer process; see the summary for totals).', '');
    out.push(
      mermaidBar('Checksum compute time (ms)', ['producer', 'consumer'], [s.checksumMs.send, s.checksumMs.recv], 'ms'),
      '',
      '## Requests',
      '',
      '| # | prompt | fault | changed blocks | verdict | action | tokens | = single instance | load wall ms |',
      '|---|---|---|---|---|---|---|---|---|',
    );
    for (const q of run.requests) {
      const prompt = o.prompts?.[q.index] ?? '';
      const changed = [...q.injected].map(([g, p]) => `g${g}[${p.join(',')}]`).join(' ');
      const verdict = q.verdict ? `${q.kind}${q.verdict.mismatches.length ? ` ${q.verdict.mismatches.map((m) => `g${m.groupId}[${m.positions.join(',')}]`).join(' ')}` : ''}${q.verdict.unverified.length ? ` (${q.verdict.unverified.map((u) => u.reason).join(', ')})` : ''}` : loadStatus(q, s.consumerChecksums);
      out.push(`| ${q.index} | ${esc(prompt.length > 40 ? `${prompt.slice(0, 40)}...` : prompt)} | ${q.faultKinds.join(', ') || '-'} | ${changed || '-'} | ${esc(verdict)} | ${q.action ?? '-'} | ${q.tokenIds.length} | ${q.equalsReference ? 'yes' : 'no'} | ${q.loadWallMs === null ? '-' : fmt(q.loadWallMs, 2)} |`);
    }
    out.push('');
    out.push(...localizationLines(run.requests));
  }
  if (r.expectations.length) out.push('## Checks', '', ...r.expectations.map((x) => `- ${x.ok ? 'PASS' : '**FAIL**'} ${esc(x.line.replace(/^(PASS|FAIL) /, ''))}`), '');
  return out.join('\n');
}
