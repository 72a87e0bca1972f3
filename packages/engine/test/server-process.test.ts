/**
 * Engines and the P/D proxy as separate Node processes on 127.0.0.1 (`bin/kvconnect-engine.js`,
 * `bin/kvconnect-proxy.js`, started by the launcher): ready lines, completions equal an in-process
 * engine's, proxy routing (round robin) over two engine processes, connector modules loaded with
 * `--import` and `kv_connector_module_path`, clean exits (SIGTERM, `/shutdown`, parent gone), and
 * launch errors with the child's stderr.
 *
 * No KV moves between processes here: `InProcessConnector` cannot cross processes, so the proxy
 * runs over engines without a transfer connector (each side computes the prompt itself; the output
 * must still equal a single engine's). The real multi-process P/D tests (KV transfer and checksum
 * verdicts across processes) come with the NIXL and Mooncake connectors.
 *
 * The bins run `dist/`; `beforeAll` brings it up to date with `tsc --build` (a no-op after `npm run build`).
 */
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { Engine } from '../src/engine.js';
import { EngineClient } from '../src/server/engine-client.js';
import { LaunchError, launchEngineProcess, launchProxyProcess, type LaunchedProcess } from '../src/server/launcher.js';

const ENGINE_DIR = fileURLToPath(new URL('..', import.meta.url));
const CORE_DIST = fileURLToPath(new URL('../../core/dist/index.js', import.meta.url));
const PROMPT = 'Hello P/D world, from another process!';
const S = { maxTokens: 8, ignoreEos: true };
const BASE = { preset: 'dense-gqa', numBlocks: 256 } as const;

let tmp = '';
const children: LaunchedProcess[] = [];
const track = <T extends LaunchedProcess>(p: T): T => {
  children.push(p);
  return p;
};

beforeAll(() => {
  const tsc = join(dirname(createRequire(import.meta.url).resolve('typescript/package.json')), 'bin/tsc');
  const r = spawnSync(process.execPath, [tsc, '--build', join(ENGINE_DIR, 'tsconfig.json')], { encoding: 'utf8', timeout: 120_000 });
  if (r.status !== 0) {
    const out = `${r.stdout ?? ''}${r.stderr ?? ''}`.slice(-4000);
    if (!existsSync(join(ENGINE_DIR, 'dist/server/main.js'))) throw new Error(`tsc --build packages/engine failed and dist/ is missing:\n${out}`);
    console.warn(`tsc --build packages/engine failed; running the existing dist/:\n${out}`);
  }
  tmp = mkdtempSync(join(tmpdir(), 'kvconnect-server-test-'));
}, 120_000);

afterEach(async () => {
  await Promise.all(children.splice(0).map((c) => c.stop()));
});

afterAll(() => {
  if (tmp) rmSync(tmp, { recursive: true, force: true });
});

function reference(): Engine {
  return new Engine({ ...BASE, engineId: 'ref' });
}

describe('engine and proxy processes', () => {
  it('an engine process answers completions equal to an in-process engine; SIGTERM exits 0', async () => {
    const events: Array<Record<string, unknown>> = [];
    const e = track(await launchEngineProcess({ config: { ...BASE, engineId: 'mp-a' }, onEvent: (ev) => events.push(ev) }));
    expect(e.engineId).toBe('mp-a');
    expect(e.url).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
    expect(e.ready).toMatchObject({ event: 'ready', engineId: 'mp-a', model: 'dense-gqa', kvConnector: null, pid: e.pid });
    const client = await EngineClient.connect(e.url);
    expect(client.engineId).toBe('mp-a');
    const ref = reference();
    for (const prompt of [PROMPT, [256, ...Buffer.from('token ids')]]) {
      const want = await ref.generate(prompt, S);
      const got = await client.generate(prompt, S);
      expect(got.tokenIds).toEqual(want.tokenIds);
      expect(got.text).toBe(want.text);
      expect(got.finishReason).toBe('length');
    }
    const bad = await fetch(`${e.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"prompt":' });
    expect(bad.status).toBe(400);
    const m = await fetch(`${e.url}/metrics`);
    expect(m.status).toBe(200);
    expect(m.headers.get('content-type')).toMatch(/^text\/plain/);
    expect(await e.stop()).toEqual({ code: 0, signal: null });
    expect(events).toEqual([{ event: 'exit', reason: 'SIGTERM' }]);
  });

  it('a proxy process routes round robin over two engine processes (no KV connector) and equals a single engine', async () => {
    const [a, b] = await Promise.all([
      launchEngineProcess({ config: { ...BASE, engineId: 'mp-p0' } }).then(track),
      launchEngineProcess({ config: { ...BASE, engineId: 'mp-p1' } }).then(track),
    ]);
    const proxy = track(await launchProxyProcess({ config: { prefill: [a.url, b.url], decode: [b.url, a.url], mode: 'sequential' } }));
    expect(proxy.mode).toBe('sequential');
    expect(proxy.ready).toMatchObject({ prefill: [{ url: a.url, engineId: 'mp-p0' }, { url: b.url, engineId: 'mp-p1' }], decode: [{ engineId: 'mp-p1' }, { engineId: 'mp-p0' }] });
    const h = await (await fetch(`${proxy.url}/health`)).json();
    expect(h).toMatchObject({ status: 'ok', mode: 'sequential' });
    const ref = reference();
    const prompts = ['first request', 'second request', 'third'];
    const routes: string[] = [];
    for (const prompt of prompts) {
      const res = await fetch(`${proxy.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ prompt, max_tokens: 8, ignore_eos: true }) });
      expect(res.status).toBe(200);
      const body = (await res.json()) as any;
      const want = await ref.generate(prompt, S);
      expect(body.choices[0].token_ids).toEqual(want.tokenIds);
      expect(body.kvconnect.prefill).toMatchObject({ finish_reason: 'length' });
      expect(body.kvconnect.prefill.kv_transfer_params).toBeUndefined();
      routes.push(`${body.kvconnect.prefill.engine_id}->${body.kvconnect.decode.engine_id}`);
    }
    expect(routes).toEqual(['mp-p0->mp-p1', 'mp-p1->mp-p0', 'mp-p0->mp-p1']);
    // The proxy shuts down on /shutdown; the engines on SIGTERM.
    expect((await fetch(`${proxy.url}/shutdown`, { method: 'POST' })).status).toBe(200);
    expect(await proxy.exited).toEqual({ code: 0, signal: null });
  });

  it('connector modules load from --import (self-registering) and kv_connector_module_path (register export)', async () => {
    const coreUrl = pathToFileURL(CORE_DIST).href;
    const halves = `
      const scheduler = () => ({
        getNumNewMatchedTokens: () => ({ count: 0, loadAsync: false }),
        updateStateAfterAlloc() {}, buildConnectorMeta: () => null, updateConnectorOutput() {},
        requestFinished: () => ({ delayFree: false }), kvChecksumCarrier: () => null,
      });
      const worker = () => ({
        registerKvCaches() {}, bindConnectorMetadata() {}, startLoadKv() {}, clearConnectorMetadata() {},
        getTransferResults: () => ({ finishedSending: new Set(), finishedRecving: new Set(), invalidBlockIds: new Set(), kvChecksums: new Map() }),
      });
      const factory = (name) => ({ name, createScheduler: scheduler, createWorker: worker });`;
    const selfReg = join(tmp, 'self-registering.mjs');
    writeFileSync(selfReg, `import { defaultRegistry } from ${JSON.stringify(coreUrl)};\n${halves}\ndefaultRegistry.register(factory('NoopSelfRegistered'));\n`);
    const viaPath = join(tmp, 'register-export.mjs');
    writeFileSync(viaPath, `${halves}\nexport function register(registry) { registry.register(factory('NoopModulePath')); }\n`);
    const e = track(
      await launchEngineProcess({
        config: { ...BASE, engineId: 'mp-mod', imports: [selfReg], kvTransferConfig: { kv_connector: 'NoopModulePath', kv_role: 'kv_both', kv_connector_module_path: viaPath } },
      }),
    );
    expect(e.ready).toMatchObject({ kvConnector: 'NoopModulePath', kvRole: 'kv_both' });
    expect(e.ready.registeredConnectors).toEqual(expect.arrayContaining(['NoopSelfRegistered', 'NoopModulePath', 'MultiConnector']));
    const got = await new EngineClient(e.url).generate(PROMPT, S);
    expect(got.tokenIds).toEqual((await reference().generate(PROMPT, S)).tokenIds);
    const h = await (await fetch(`${e.url}/health`)).json();
    expect(h).toMatchObject({ kv_connector: 'NoopModulePath', kv_role: 'kv_both' });
  });

  it('exits 0 on POST /shutdown and when its parent goes away (stdin closes)', async () => {
    const [a, b] = await Promise.all([launchEngineProcess({ config: { ...BASE } }).then(track), launchEngineProcess({ config: { ...BASE } }).then(track)]);
    await new EngineClient(a.url).shutdown();
    expect(await a.exited).toEqual({ code: 0, signal: null });
    b.child.stdin!.end();
    expect(await b.exited).toEqual({ code: 0, signal: null });
  });

  it('launch errors reject with the exit code and the child stderr', async () => {
    const bad = await launchEngineProcess({ config: { ...BASE, preset: 'nope' as 'mla' } }).catch((x: unknown) => x);
    expect(bad).toBeInstanceOf(LaunchError);
    expect((bad as LaunchError).message).toMatch(/exited before it was ready \(code 2/);
    expect((bad as LaunchError).stderr).toMatch(/preset: expected one of/);
    const setup = await launchEngineProcess({ config: { ...BASE, kvTransferConfig: { kv_connector: 'NoSuchConnector', kv_role: 'kv_producer' } } }).catch((x: unknown) => x);
    expect(setup).toBeInstanceOf(LaunchError);
    expect((setup as LaunchError).message).toMatch(/code 2/);
    expect((setup as LaunchError).stderr).toMatch(/^error: engine options: unknown KV connector "NoSuchConnector"; registered: MultiConnector$/m);
    expect((setup as LaunchError).stderr).not.toMatch(/^\s+at /m);
    // a bad kv_connector_extra_config key: the same one clean error line as a bad kv_transfer_config key
    for (const kvTransferConfig of [
      { kv_connector: 'NixlConnector', kv_role: 'kv_producer', kv_bogus: 1 },
      { kv_connector: 'NixlConnector', kv_role: 'kv_producer', kv_connector_extra_config: { lease_msec: 1 } },
    ]) {
      const e = await launchEngineProcess({ config: { ...BASE, imports: ['@kvconnect/nixl-pull'], kvTransferConfig } }).catch((x: unknown) => x);
      expect(e).toBeInstanceOf(LaunchError);
      expect((e as LaunchError).message).toMatch(/code 2/);
      const key = kvTransferConfig.kv_connector_extra_config ? 'kv_connector_extra_config.lease_msec' : 'kv_bogus';
      expect((e as LaunchError).stderr.trim()).toMatch(new RegExp(`^error: engine options: invalid kv_transfer_config: ${key}: unknown key \\(known: [^\\n]*\\)$`));
    }
    // a kvconnect connector whose package was not imported: the error says which one to import
    const noImport = await launchEngineProcess({ config: { ...BASE, kvTransferConfig: { kv_connector: 'NixlConnector', kv_role: 'kv_producer' } } }).catch((x: unknown) => x);
    expect((noImport as LaunchError).stderr).toMatch(/^error: engine options: unknown KV connector "NixlConnector"; .*it is in @kvconnect\/nixl-pull: import it first \(kvconnect-engine --import @kvconnect\/nixl-pull/m);
    const proxy = await launchProxyProcess({ config: { prefill: ['http://127.0.0.1:9'], decode: ['http://127.0.0.1:9'], connectTimeoutMs: 200 } }).catch((x: unknown) => x);
    expect(proxy).toBeInstanceOf(LaunchError);
    expect((proxy as LaunchError).stderr).toMatch(/not reachable/);
    const slow = await launchEngineProcess({ config: { ...BASE }, readyTimeoutMs: 1 }).catch((x: unknown) => x);
    expect(slow).toBeInstanceOf(LaunchError);
    expect((slow as LaunchError).message).toMatch(/no ready line within 1 ms/);
  });
});
