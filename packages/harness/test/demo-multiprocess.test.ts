/**
 * `kvconnect demo` over the multi-process topology: a proxy, a producer engine and a consumer
 * engine as separate processes on 127.0.0.1, the KV moving through the embedded transfer agent,
 * consumer-side faults injected by the FaultInjectingConnector loaded by module path in the
 * consumer process. Every faulted load must be detected and recomputed, every output must equal
 * the single instance, the report must be written, and no child process may outlive the demo.
 *
 * The engine processes and the bin run `dist/`; `beforeAll` brings it up to date with `tsc --build`.
 */
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { beforeAll, describe, expect, it } from 'vitest';
import { SideChannelClient, decodeLeaseBody } from '@kvconnect/nixl-common';
import { HARNESS_PRESETS, parsePrometheus, processMetrics, runDemo, startPDProcesses } from '../src/index.js';

const ROOT = fileURLToPath(new URL('../../..', import.meta.url));
const BIN = join(ROOT, 'packages/harness/bin/kvconnect.js');
const dir = mkdtempSync(join(tmpdir(), 'kvc-demo-mp-'));
const PROMPTS = [
  'Explain in two sentences why a decode server should verify the KV cache it receives.',
  'The capital of France is',
  'Write a haiku about a block of memory that moved between two machines.',
  'List three reasons a lease on shared memory can expire, and what a consumer should do then.',
];

beforeAll(() => {
  const tsc = join(dirname(createRequire(import.meta.url).resolve('typescript/package.json')), 'bin/tsc');
  const pkgs = ['engine', 'nixl-pull', 'nixl-push', 'mooncake', 'harness'].map((p) => join(ROOT, 'packages', p));
  const r = spawnSync(process.execPath, [tsc, '--build', ...pkgs], { encoding: 'utf8', timeout: 170_000 });
  if (r.status !== 0) throw new Error(`tsc --build failed:\n${`${r.stdout}${r.stderr}`.slice(-4000)}`);
}, 180_000);

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

async function gone(pids: number[]): Promise<boolean> {
  for (let i = 0; i < 50 && pids.some(alive); i++) await new Promise((r) => setTimeout(r, 100));
  return !pids.some(alive);
}

interface SummaryJson {
  topology: string;
  processes: { proxy: number; producer: number; consumer: number };
  workerProcesses: { producer: number[]; consumer: number[] };
  summary: { injected: number; faulted: number; loadWallMs: number; loadBytes: number; loadedUnverified: number };
  logs: string[];
  requests: Array<{ index: number; faults: string[]; changed: Record<string, number[]>; verdict: string; load: string; action: string | null; identical: boolean; error?: string; loadWallMs: number | null; loadBytes: number }>;
  checks: Array<{ ok: boolean; line: string }>;
}

describe('kvconnect demo, multi-process topology', () => {
  it('default (NIXL pull): 4 prompts, faults at rate 0.5, via the bin: faults detected and recomputed, outputs = single instance, report written', async () => {
    const prompts = join(dir, 'prompts.txt');
    writeFileSync(prompts, `# demo prompts\n${PROMPTS.join('\n')}\n`);
    const out = join(dir, 'pull');
    const t0 = Date.now();
    const r = spawnSync(process.execPath, [BIN, 'demo', '--prompts', prompts, '--faults', '0.5', '--out', out, '--max-tokens', '8', '--no-progress'], { encoding: 'utf8', cwd: dir, timeout: 60_000 });
    const ms = Date.now() - t0;
    expect(r.status, `${r.stdout}\n${r.stderr}`).toBe(0);
    expect(ms).toBeLessThan(40_000);
    const lines = r.stdout.split('\n');
    expect(lines.some((l) => l.startsWith('processes on 127.0.0.1: proxy (sequential)'))).toBe(true);
    expect(lines.some((l) => l.startsWith('connector NixlConnector'))).toBe(true);
    expect(lines).toContain('workers: producer 2 worker processes, consumer 1 worker process');
    expect(lines).toContain('outputs identical to a single instance: 4/4');
    expect(lines.some((l) => /^checksum time: producer \d/.test(l))).toBe(true);
    // The connector's metric and the summed load wall time, each under its own name.
    expect(lines.some((l) => /^connector transfer time: \d+\.\d ms over \d+ transfers/.test(l))).toBe(true);
    expect(lines.some((l) => /^load wall time: \d+\.\d ms summed over requests, /.test(l))).toBe(true);
    expect(lines.some((l) => l.startsWith('transfer time'))).toBe(false);
    const s = JSON.parse(readFileSync(join(out, 'summary.json'), 'utf8')) as SummaryJson;
    expect(s.topology).toBe('processes');
    expect(s.requests).toHaveLength(4);
    const faulted = s.requests.filter((q) => q.faults.length > 0);
    expect(faulted).toHaveLength(2);
    for (const q of s.requests) {
      expect(q.error, `r${q.index}`).toBeUndefined();
      expect(q.identical, `r${q.index}`).toBe(true);
      // Verified and used, or detected and recomputed.
      expect(q.verdict === 'verified' ? q.action : `${q.verdict}:${q.action}`, `r${q.index}`).toMatch(/^(use|mismatch:recompute|unverified:recompute)$/);
      if (q.faults.length > 0) expect(q.verdict, `r${q.index} ${q.faults.join('+')}`).not.toBe('verified');
    }
    expect(s.checks.every((c) => c.ok)).toBe(true);
    // Faults planned by prompt index (carried with the request, concurrency 4): the setup line's
    // plan is what the consumer's ground truth says landed on each prompt.
    const plan = lines.find((l) => l.startsWith('faulted requests: '))!;
    const planned = [...plan.matchAll(/r(\d+) ([a-z-]+)/g)].map((m) => [Number(m[1]), m[2]] as const);
    expect(planned.map(([, k]) => k)).toEqual(['bit-flip', 'misplaced-block']);
    for (const [i, kind] of planned) expect(s.requests[i].faults, `r${i}`).toEqual([kind]);
    // The consumer's ground truth: changed blocks of the byte faults, load time and bytes of every load.
    expect(s.summary.injected).toBe(2);
    for (const [i] of planned) expect(Object.keys(s.requests[i].changed).length, `r${i} changed blocks`).toBeGreaterThan(0);
    for (const q of s.requests) {
      expect(q.loadWallMs, `r${q.index} load ms`).toBeGreaterThan(0);
      expect(q.loadBytes, `r${q.index} load bytes`).toBeGreaterThan(0);
    }
    expect(s.summary.loadBytes).toBe(s.requests.reduce((a, q) => a + q.loadBytes, 0));
    // Every process's output in the report folder.
    expect(s.logs).toEqual(['proxy.log', 'producer.log', 'consumer.log']);
    for (const f of s.logs) expect(readFileSync(join(out, f), 'utf8'), f).toMatch(/"event":"ready"/);
    expect(readFileSync(join(out, 'consumer.log'), 'utf8')).toMatch(/KV checksum mismatch/);
    const md = readFileSync(join(out, 'report.md'), 'utf8');
    expect(md).toContain('x-axis ["verified", "mismatch", "unverified"]');
    expect(md).toContain('x-axis ["used", "recomputed", "failed"]');
    expect(md).toMatch(/\| note \| model dense-gqa has seeded random weights/);
    expect(md).toContain('## Summary');
    expect(md).toContain('## Process metrics');
    expect(md).toContain('| outputs identical to a single instance | 4/4 |');
    expect(s.workerProcesses).toMatchObject({ producer: [expect.any(Number), expect.any(Number)], consumer: [expect.any(Number)] });
    // Every child process went away with the demo.
    expect(await gone([...Object.values(s.processes), ...s.workerProcesses.producer, ...s.workerProcesses.consumer])).toBe(true);
  }, 60_000);

  it('--no-checksums: every load is said to be loaded without verification (console, summary.json), not "no load"', async () => {
    const out = join(dir, 'no-checksums');
    const printed: string[] = [];
    const r = await runDemo({ connector: 'pull', checksums: false, prompts: PROMPTS, faultRate: 0, maxTokens: 4, out, progress: false, print: (l) => printed.push(l) });
    expect(r.result.expectations.filter((x) => !x.ok)).toEqual([]);
    expect(printed).toContain('verdicts: verified 0, mismatch 0, unverified 0, loaded (not verified: checksums off) 4');
    expect(printed.filter((l) => / r\d+: /.test(l))).toEqual([0, 1, 2, 3].map((i) => `  r${i}: no fault -> loaded (not verified: checksums off), output identical`));
    expect(printed.some((l) => l.includes('no load'))).toBe(false);
    const s = JSON.parse(readFileSync(join(out, 'summary.json'), 'utf8')) as SummaryJson;
    expect(s.summary.loadedUnverified).toBe(4);
    for (const q of s.requests) {
      expect(q.load, `r${q.index}`).toBe('loaded (not verified: checksums off)');
      expect(q.loadBytes, `r${q.index}`).toBeGreaterThan(0);
    }
    expect(await gone(Object.values(s.processes))).toBe(true);
  }, 60_000);

  it('--connector push (exported runDemo): faults detected and recomputed, outputs = single instance, report written', async () => {
    const out = join(dir, 'push');
    const printed: string[] = [];
    const t0 = Date.now();
    const r = await runDemo({ connector: 'push', prompts: PROMPTS, faultRate: 0.5, maxTokens: 8, out, progress: false, print: (l) => printed.push(l) });
    expect(Date.now() - t0).toBeLessThan(40_000);
    expect(r.topology).toBe('processes');
    expect(r.connector).toBe('nixl-push');
    expect(printed.some((l) => l.startsWith('connector NixlPushConnector'))).toBe(true);
    expect(r.result.expectations.filter((x) => !x.ok)).toEqual([]);
    const run = r.result.runs[0];
    expect(run.requests).toHaveLength(4);
    expect(run.requests.filter((q) => q.faultKinds.length > 0)).toHaveLength(2);
    for (const q of run.requests) {
      expect(q.equalsReference, `r${q.index}`).toBe(true);
      expect(q.kind === 'verified' ? q.action : `${q.kind}:${q.action}`, `r${q.index}`).toMatch(/^(use|mismatch:recompute|unverified:recompute)$/);
      if (q.faultKinds.length > 0) expect(q.kind, `r${q.index}`).not.toBe('verified');
    }
    expect(r.summary.identical).toBe(4);
    expect(r.summary.recomputed).toBe(2);
    expect(r.metrics?.checksumBytes.recv).toBeGreaterThan(0);
    expect(r.metrics?.loads).toMatchObject({ verified: 2 });
    expect(existsSync(r.reportPath)).toBe(true);
    const s = JSON.parse(readFileSync(join(out, 'summary.json'), 'utf8')) as SummaryJson;
    expect(await gone(Object.values(s.processes))).toBe(true);
  }, 60_000);

  it('the engines share the cluster secret passed in KVCONNECT_CLUSTER_SECRET: loads verify, their side channel refuses a peer without it', async () => {
    const secret = 'demo-test-cluster-secret-0123456789abcdef';
    const pd = await startPDProcesses({ connector: 'nixl-pull', model: HARNESS_PRESETS['GQA-S'], idPrefix: `secret-${process.pid}`, clusterSecret: secret });
    try {
      const res = await fetch(`${pd.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ prompt: PROMPTS[1], max_tokens: 4, ignore_eos: true }) });
      const body = (await res.json()) as { kvconnect: { prefill: { kv_transfer_params?: { remote_host: string; remote_port: number } } } };
      expect(res.status).toBe(200);
      expect((await pd.metrics()).loads).toMatchObject({ verified: 1 });
      const { remote_host: host, remote_port: port } = body.kvconnect.prefill.kv_transfer_params!;
      const lease = { type: 'lease', requestIds: ['x'], pinMs: 0 } as const;
      const outsider = new SideChannelClient(host, port, { timeoutMs: 5000 });
      await expect(outsider.request(lease, decodeLeaseBody)).rejects.toMatchObject({ code: 'unauthenticated' });
      outsider.close();
      const member = new SideChannelClient(host, port, { timeoutMs: 5000, clusterSecret: Buffer.from(secret) });
      expect((await member.request(lease, decodeLeaseBody)).get('x')).toBe(0);
      member.close();
    } finally {
      await pd.shutdown();
    }
  }, 60_000);

  it('--connector mooncake (exported runDemo): worker processes by default (producer TP2 = 2), faults detected and recomputed, outputs = single instance', async () => {
    const out = join(dir, 'mooncake');
    const printed: string[] = [];
    const r = await runDemo({ connector: 'mooncake', prompts: PROMPTS, faultRate: 0.5, maxTokens: 8, out, progress: false, print: (l) => printed.push(l) });
    expect(printed).toContain('workers: producer 2 worker processes, consumer 1 worker process');
    expect(r.result.expectations.filter((x) => !x.ok)).toEqual([]);
    expect(r.summary.identical).toBe(4);
    expect(r.summary.recomputed).toBe(2);
    expect(r.metrics?.loads).toMatchObject({ verified: 2 });
    const s = JSON.parse(readFileSync(join(out, 'summary.json'), 'utf8')) as SummaryJson;
    expect(s.workerProcesses.producer).toHaveLength(2);
    expect(s.workerProcesses.consumer).toHaveLength(1);
    // Engines, proxy and every worker process went away with the demo.
    expect(await gone([...Object.values(s.processes), ...s.workerProcesses.producer, ...s.workerProcesses.consumer])).toBe(true);
  }, 60_000);

  it('metrics: Prometheus text of the engines reduces to checksum and transfer numbers (n/a when absent)', () => {
    const producer = parsePrometheus(
      [
        '# HELP kvconnect_kv_checksum_seconds x',
        'kvconnect_kv_checksum_seconds_sum{side="send"} 0.25',
        'kvconnect_kv_checksum_bytes_summed_total{side="send"} 4096',
        'kvconnect_nixl_bytes_transferred_sum{mode="push",op="WRITE"} 8192',
        'kvconnect_nixl_bytes_transferred_count{mode="push",op="WRITE"} 2',
        'kvconnect_mooncake_xfer_time_seconds_sum{op="READ"} 0.5',
        'kvconnect_mooncake_xfer_time_seconds_count{op="READ"} 1',
      ].join('\n'),
    );
    const consumer = parsePrometheus(
      [
        'kvconnect_kv_checksum_seconds_sum{side="recv"} 0.5',
        'kvconnect_kv_checksum_loads_total{verdict="verified"} 3',
        'kvconnect_kv_checksum_loads_total{verdict="mismatch"} 1',
        'kvconnect_kv_checksum_recomputed_total{reason="mismatch"} 1',
        'kvconnect_nixl_xfer_time_seconds_sum{mode="pull",op="READ"} 0.125',
        'kvconnect_nixl_xfer_time_seconds_count{mode="pull",op="READ"} 2',
      ].join('\n'),
    );
    const m = processMetrics(producer, consumer);
    expect(m.checksumSeconds).toEqual({ send: 0.25, recv: 0.5 });
    expect(m.checksumBytes).toEqual({ send: 4096, recv: null });
    expect(m.loads).toEqual({ verified: 3, mismatch: 1 });
    expect(m.recomputed).toBe(1);
    expect(m.failed).toBeNull();
    expect(m.transferSeconds).toBe(0.625);
    expect(m.transferBytes).toBe(8192);
    expect(m.transfers).toBe(3);
    expect(m.connectorMetrics).toEqual(['kvconnect_mooncake_xfer_time_seconds', 'kvconnect_nixl_bytes_transferred', 'kvconnect_nixl_xfer_time_seconds']);
    expect(processMetrics(null, null)).toMatchObject({ transferSeconds: null, loads: null, scraped: { producer: false, consumer: false } });
  });
});
