/**
 * Choosing the transfer engine: `transfer.ts` (which connector takes which engine, what its
 * `kv_connector_extra_config` gets, the demo's loopback defaults), a scenario's `transfer`, a
 * scenario over a library that does not load (skipped with the one-line reason), and `kvconnect demo
 * --transfer` refusing a missing library or a wrong pairing with a one-line error before any process
 * starts (the built bin); over the real library where NIXL_PREFIX / MOONCAKE_PREFIX is set, the demo's
 * engine processes map it and the demo's checks pass.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { beforeAll, describe, expect, it } from 'vitest';
import { CONNECTOR_TRANSFERS, loopbackTransferEnv, parseScenario, resolveModelSpec, runDemo, runScenario, startPDProcesses, transferExtraConfig, transferMismatch, ValidationError } from '../src/index.js';

const base = { name: 't', model: 'GQA-S', requests: [{ promptTokens: 24 }], expect: { requests: [{ request: 0, output: 'reference' }] } };

describe('transfer.ts', () => {
  it('which connector takes which engine', () => {
    expect(CONNECTOR_TRANSFERS).toEqual({ 'in-process': ['embedded'], 'nixl-pull': ['embedded', 'nixl'], 'nixl-push': ['embedded', 'nixl'], mooncake: ['embedded', 'mooncake'] });
    expect(transferMismatch('nixl-pull', 'nixl')).toBeNull();
    expect(transferMismatch('mooncake', 'mooncake')).toBeNull();
    expect(transferMismatch('nixl-push', 'mooncake')).toBe('connector nixl-push cannot use transfer engine mooncake (it takes embedded or nixl)');
    expect(transferMismatch('in-process', 'nixl')).toBe('connector in-process cannot use transfer engine nixl (it takes embedded)');
    expect(transferMismatch('mooncake', 'rdma')).toBe('transfer must be one of embedded, nixl, mooncake, got "rdma"');
  });
  it('the connectors get backend for a library engine, nothing for embedded', () => {
    expect(transferExtraConfig('embedded')).toEqual({});
    expect(transferExtraConfig('nixl')).toEqual({ backend: 'nixl' });
    expect(transferExtraConfig('mooncake')).toEqual({ backend: 'mooncake' });
  });
  it('loopback defaults for the demo processes, a variable already set is kept', () => {
    expect(loopbackTransferEnv('nixl', {})).toEqual({ UCX_NET_DEVICES: 'lo' });
    expect(loopbackTransferEnv('nixl', { UCX_NET_DEVICES: 'eth0' })).toEqual({});
    expect(loopbackTransferEnv('mooncake', {})).toEqual({ MC_FORCE_TCP: '1' });
    expect(loopbackTransferEnv('embedded', {})).toEqual({});
  });
});

describe('scenario transfer', () => {
  it('defaults to embedded; nixl with a NIXL connector, mooncake with mooncake', () => {
    expect(parseScenario(base).transfer).toBe('embedded');
    expect(parseScenario({ ...base, connector: 'nixl-push', transfer: 'nixl' }).transfer).toBe('nixl');
    expect(parseScenario({ ...base, connector: 'mooncake', transfer: 'mooncake' }).transfer).toBe('mooncake');
  });
  it('a wrong pairing or name is a validation error at transfer', () => {
    for (const [connector, transfer, msg] of [
      ['nixl-pull', 'mooncake', /transfer: connector nixl-pull cannot use transfer engine mooncake/],
      ['in-process', 'nixl', /transfer: connector in-process cannot use transfer engine nixl/],
      ['mooncake', 'ucx', /transfer: transfer must be one of embedded, nixl, mooncake, got "ucx"/],
    ] as const) {
      const e = (() => {
        try {
          parseScenario({ ...base, connector, transfer });
        } catch (x) {
          return x;
        }
        return null;
      })();
      expect(e).toBeInstanceOf(ValidationError);
      expect((e as Error).message).toMatch(msg);
    }
  });
  it('a library that does not load: the scenario is skipped with the one-line reason', async () => {
    const saved = { NIXL_PREFIX: process.env.NIXL_PREFIX, NIXL_LIBRARY: process.env.NIXL_LIBRARY };
    process.env.NIXL_PREFIX = '/nonexistent/kvc-nixl';
    process.env.NIXL_LIBRARY = '/nonexistent/kvc-nixl/libnixl_capi.so';
    try {
      const r = await runScenario(parseScenario({ ...base, connector: 'nixl-pull', transfer: 'nixl' }));
      expect(r.runs).toEqual([]);
      expect(r.skipped).toMatch(/^transfer engine nixl: libnixl_capi\.so cannot be loaded \(NIXL_PREFIX=\/nonexistent\/kvc-nixl is set.*install NIXL .*NIXL_PREFIX/);
      expect(r.skipped).not.toContain('\n');
    } finally {
      for (const [k, v] of Object.entries(saved)) {
        if (v === undefined) delete process.env[k];
        else process.env[k] = v;
      }
    }
  });
});

describe('kvconnect demo --transfer (built bin)', () => {
  const pkg = join(dirname(fileURLToPath(import.meta.url)), '..');
  const bin = join(pkg, 'bin', 'kvconnect.js');
  const dir = mkdtempSync(join(tmpdir(), 'kvc-transfer-'));
  beforeAll(() => {
    const pkgs = ['engine', 'nixl-pull', 'nixl-push', 'mooncake', 'harness'].map((p) => join(pkg, '..', p));
    execFileSync(process.execPath, [join(pkg, '../../node_modules/typescript/bin/tsc'), '--build', ...pkgs], { stdio: 'inherit' });
  }, 170_000);
  const demo = (env: NodeJS.ProcessEnv, ...args: string[]) => {
    const r = spawnSync(process.execPath, [bin, 'demo', '--no-progress', '--out', join(dir, 'out'), ...args], { encoding: 'utf8', cwd: dir, env, timeout: 60_000 });
    return { code: r.status, stdout: r.stdout, stderr: r.stderr };
  };
  const noLibs = () => {
    const env = { ...process.env };
    for (const k of ['NIXL_LIBRARY', 'MOONCAKE_LIBRARY']) delete env[k];
    return { ...env, NIXL_PREFIX: '/nonexistent/kvc-nixl', MOONCAKE_PREFIX: '/nonexistent/kvc-mooncake' };
  };

  for (const [connector, transfer, lib, prefixEnv] of [
    ['pull', 'nixl', 'libnixl_capi.so', 'NIXL_PREFIX'],
    ['mooncake', 'mooncake', 'libtransfer_engine.so', 'MOONCAKE_PREFIX'],
  ] as const) {
    it(`--connector ${connector} --transfer ${transfer} without the library: exit 2, one line naming what to install and ${prefixEnv}, nothing started`, () => {
      const r = demo(noLibs(), '--connector', connector, '--transfer', transfer);
      expect(r.code, r.stderr).toBe(2);
      const lines = r.stderr.trim().split('\n');
      expect(lines).toHaveLength(1);
      expect(lines[0]).toMatch(new RegExp(`^kvconnect: transfer engine ${transfer}: ${lib.replace(/\./g, '\\.')} cannot be loaded \\(${prefixEnv}=/nonexistent/.* install .* set ${prefixEnv} to its install prefix`));
      expect(r.stdout).not.toMatch(/started:/);
    });
  }

  it('--connector push --transfer mooncake: exit 2, the pairing named', () => {
    const r = demo(noLibs(), '--connector', 'push', '--transfer', 'mooncake');
    expect(r.code).toBe(2);
    expect(r.stderr.trim()).toBe('kvconnect: --transfer: connector nixl-push cannot use transfer engine mooncake (it takes embedded or nixl)');
  });

  for (const [connector, processConnector, transfer, prefixEnv, lib] of [
    ['pull', 'nixl-pull', 'nixl', 'NIXL_PREFIX', 'libnixl_capi.so'],
    ['mooncake', 'mooncake', 'mooncake', 'MOONCAKE_PREFIX', 'libtransfer_engine.so'],
  ] as const) {
    const prefix = process.env[prefixEnv];
    const title = `--connector ${connector} --transfer ${transfer} over the real library: the engine processes' workers map ${lib}, the demo's checks pass${prefix ? '' : ` (skipped: ${prefixEnv} is not set)`}`;
    it.skipIf(!prefix)(title, async () => {
      const pd = await startPDProcesses({ connector: processConnector, transfer, model: resolveModelSpec('dense-gqa'), idPrefix: `transfer-${transfer}-${process.pid}` });
      try {
        const w = await pd.workerPids();
        expect(w.producer.length + w.consumer.length).toBe(3);
        for (const pid of [...w.producer, ...w.consumer]) expect(readFileSync(`/proc/${pid}/maps`, 'utf8')).toContain(lib);
        const res = await fetch(`${pd.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ prompt: 'The KV cache crosses over a real transfer engine.', max_tokens: 4, ignore_eos: true }) });
        expect(res.status).toBe(200);
      } finally {
        await pd.shutdown();
      }
      const lines: string[] = [];
      const r = await runDemo({ connector, transfer, prompts: ['The capital of France is', 'Two sentences on why a decode server verifies its KV cache.', 'A haiku about a moving block.', 'Three reasons a lease expires.'], faultRate: 0.5, out: join(dir, `real-${transfer}`), progress: false, print: (l) => lines.push(l) });
      expect(r.transfer).toBe(transfer);
      expect(lines.some((l) => l.includes(`(transfer ${transfer}`))).toBe(true);
      expect(r.result.expectations.filter((x) => !x.ok)).toEqual([]);
      expect(r.summary.identical).toBe(4);
    }, 240_000);
  }
});
