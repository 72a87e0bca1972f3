/** The `kvconnect` bin (built dist): exit codes and the last line of `run`; `demo` writes a report. */
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { beforeAll, describe, expect, it } from 'vitest';

const pkg = join(dirname(fileURLToPath(import.meta.url)), '..');
const bin = join(pkg, 'bin', 'kvconnect.js');
const dir = mkdtempSync(join(tmpdir(), 'kvc-cli-'));

function scenario(name: string, verdict: string): string {
  const f = join(dir, `${name}.json`);
  writeFileSync(f, JSON.stringify({ name, model: 'GQA-S', requests: [{ promptTokens: 24 }], faults: [{ kind: 'misplaced-block', requests: [0] }], expect: { requests: [{ request: 0, verdict, output: 'reference' }] } }));
  return f;
}

function run(...args: string[]) {
  const r = spawnSync(process.execPath, [bin, ...args], { encoding: 'utf8', cwd: dir });
  return { code: r.status, lines: r.stdout.trim().split('\n'), stderr: r.stderr };
}

beforeAll(() => {
  // The bin imports the built CLI; build it when the test runs before `npm run build`.
  if (!existsSync(join(pkg, 'dist', 'cli.js'))) execFileSync(process.execPath, [join(pkg, '../../node_modules/typescript/bin/tsc'), '--build', pkg], { stdio: 'inherit' });
}, 120_000);

describe('kvconnect CLI', () => {
  it('run: a passing scenario exits 0 with "N passed, 0 failed" last', () => {
    const r = run('run', scenario('pass', 'mismatch'));
    expect(r.code, r.stderr).toBe(0);
    expect(r.lines.at(-1)).toBe('3 passed, 0 failed');
    expect(r.lines[0]).toMatch(/^PASS pass: r0: verdict mismatch/);
  });

  it('run: a failing scenario exits 1 and counts the failure', () => {
    const r = run('run', scenario('pass2', 'mismatch'), scenario('fail', 'verified'));
    expect(r.code).toBe(1);
    expect(r.lines.at(-1)).toBe('5 passed, 1 failed');
    expect(r.lines.some((l) => l.startsWith('FAIL fail: r0: verdict verified'))).toBe(true);
  });

  it('run: a missing file is a failure, not a crash', () => {
    const r = run('run', join(dir, 'nope.json'));
    expect(r.code).toBe(1);
    expect(r.lines.at(-1)).toBe('0 passed, 1 failed');
  });

  it('run: a one-request NIXL scenario finishes and reports in every run (the NIXL poller\'s unref\'d timers do not end the process early)', () => {
    // Before runScenario held the event loop, most of these runs exited with code 13 and no output.
    for (const connector of ['nixl-pull', 'nixl-push']) {
      const f = join(dir, `${connector}-one.json`);
      writeFileSync(f, JSON.stringify({ name: `${connector}-one`, model: 'GQA-S', connector, requests: [{ promptTokens: 32 }], expect: { requests: [{ request: 0, verdict: 'verified', output: 'reference' }] } }));
      for (let k = 0; k < 5; k++) {
        const r = run('run', f);
        expect({ connector, k, code: r.code, last: r.lines.at(-1) }, r.stderr).toEqual({ connector, k, code: 0, last: '3 passed, 0 failed' });
        expect(r.lines[0]).toBe(`PASS ${connector}-one: r0: verdict verified, output = single instance`);
      }
    }
  });

  it('demo: writes a report to --out', () => {
    const prompts = join(dir, 'p.txt');
    writeFileSync(prompts, '# two prompts\nhello there\nthe cache is warm\n');
    const out = join(dir, 'report');
    const r = run('demo', '--prompts', prompts, '--faults', '0.5', '--out', out, '--max-tokens', '3', '--no-progress');
    expect(r.code, r.stderr).toBe(0);
    expect(r.lines.some((l) => l.startsWith('outputs identical to a single instance: 2/2'))).toBe(true);
    expect(existsSync(join(out, 'report.md'))).toBe(true);
  });

  it('demo: rejects a bad --faults value', () => {
    const r = run('demo', '--faults', '2');
    expect(r.code).not.toBe(0);
    expect(r.stderr).toMatch(/share of loads/);
  });
});

describe('kvconnect demo --help', () => {
  it('lists the model presets', async () => {
    const { buildProgram } = await import('../src/cli.js');
    const { MODEL_PRESET_NAMES } = await import('../src/models.js');
    const help = buildProgram(() => {}).commands.find((c) => c.name() === 'demo')!.helpInformation();
    expect(MODEL_PRESET_NAMES.length).toBeGreaterThan(3);
    for (const name of ['dense-gqa', 'mla', 'hybrid-mamba2', 'GQA-S']) expect(help).toContain(name);
    expect(help.replace(/\s+/g, ' ')).toContain(`model preset: ${MODEL_PRESET_NAMES.join(' | ')}`);
  });
});
