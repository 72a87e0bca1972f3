/**
 * The engine's device mode across processes: producer and consumer engines as separate Node
 * processes with `device: 'cuda-emulated'` (their KV caches in emulated device memory, one per
 * process: two host ids), NIXL pull over the embedded agent, which moves the device regions over
 * TCP with staging on both sides. The output equals a single host engine's and the load verifies.
 * (Same-host CUDA IPC between processes needs a GPU: native/cuda/test_device.cu, and the GPU test
 * of packages/transfer/test/device.test.ts.)
 *
 * The bins run `dist/`; `beforeAll` brings it up to date with `tsc --build`.
 */
import { spawnSync } from 'node:child_process';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterEach, beforeAll, describe, expect, it } from 'vitest';
import { Engine } from '@kvconnect/engine';
import { launchEngineProcess, launchProxyProcess, type LaunchedProcess } from '../../packages/engine/src/server/launcher.js';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const PULL = join(ROOT, 'packages/nixl-pull/dist/index.js');
const PROMPT = 'Device KV in one process, device KV in another: staged over TCP.';
const MAX = 6;
const children: LaunchedProcess[] = [];

beforeAll(() => {
  const tsc = join(dirname(createRequire(import.meta.url).resolve('typescript/package.json')), 'bin/tsc');
  for (const pkg of ['engine', 'nixl-pull']) {
    const r = spawnSync(process.execPath, [tsc, '--build', join(ROOT, 'packages', pkg, 'tsconfig.json')], { encoding: 'utf8', timeout: 120_000 });
    if (r.status !== 0) throw new Error(`tsc --build packages/${pkg} failed:\n${`${r.stdout}${r.stderr}`.slice(-4000)}`);
  }
}, 180_000);

afterEach(async () => {
  await Promise.all(children.splice(0).map((c) => c.stop()));
});

describe('engine device mode across processes', () => {
  it('pull TP2 -> TP1, both engines with device KV (cuda-emulated): output equals a single instance, the load verifies', async () => {
    const base = { preset: 'dense-gqa' as const, numBlocks: 64, imports: [PULL], device: 'cuda-emulated' as const };
    const [p, d] = await Promise.all([
      launchEngineProcess({ config: { ...base, tpSize: 2, engineId: 'dev-mp-p', kvTransferConfig: { kv_connector: 'NixlConnector', kv_role: 'kv_producer', enable_kv_checksum: true } } }),
      launchEngineProcess({
        config: { ...base, engineId: 'dev-mp-d', kvTransferConfig: { kv_connector: 'NixlConnector', kv_role: 'kv_consumer', enable_kv_checksum: true, kv_checksum_fail_closed: true, kv_load_failure_policy: 'fail' } },
      }),
    ]);
    children.push(p, d);
    const proxy = await launchProxyProcess({ config: { prefill: [p.url], decode: [d.url], mode: 'sequential' } });
    children.push(proxy);
    const res = await fetch(`${proxy.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ prompt: PROMPT, max_tokens: MAX, ignore_eos: true }) });
    expect(res.status).toBe(200);
    const body = (await res.json()) as { choices: Array<{ token_ids: number[] }> };
    const want = await new Engine({ preset: 'dense-gqa', engineId: 'dev-mp-ref' }).generate(PROMPT, { maxTokens: MAX, ignoreEos: true });
    expect(body.choices[0].token_ids).toEqual(want.tokenIds);
    const metrics = await (await fetch(`${d.url}/metrics`)).text();
    expect(metrics).toContain('kvconnect_kv_checksum_loads_total{verdict="verified"} 1');
  });
});
