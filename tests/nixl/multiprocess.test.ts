/**
 * NIXL pull and push across processes: producer engine, consumer engine and P/D proxy run as
 * separate Node processes (`bin/kvconnect-engine.js`, `bin/kvconnect-proxy.js`, started by the
 * engine's launcher); the connectors load with `imports` (self-registering modules), KV moves
 * between the processes through EmbeddedAgents over 127.0.0.1 TCP (and through real NIXL agents where
 * NIXL_PREFIX names an install: `transfersUnderTest`), and the consumer verifies the
 * KV checksums. The output equals a single in-process engine's, for TP1 -> TP1 and TP2 -> TP1 with
 * the workers in the engine processes, and for pull TP2 -> TP1 and push TP1 -> TP2 with the
 * consumer's workers in worker processes, and with the workers of both in worker processes (TP1 -> TP1,
 * TP2 -> TP1, TP1 -> TP2, a PP2 producer). A consumer given another request's `kv_transfer_params`
 * (payload version 2, SPEC 8.0) never verifies.
 *
 * The bins run `dist/`; `beforeAll` brings it up to date with `tsc --build`.
 */
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterEach, beforeAll, describe, expect, it } from 'vitest';
import { Engine } from '@kvconnect/engine';
import { launchEngineProcess, launchProxyProcess, type LaunchedProcess } from '../../packages/engine/src/server/launcher.js';
import { transfersUnderTest } from '../transfer-engines.js';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const PULL = join(ROOT, 'packages/nixl-pull/dist/index.js');
const PUSH = join(ROOT, 'packages/nixl-push/dist/index.js');
const PROMPT = 'Prefill in one process, decode in another: the KV crosses over TCP.';
const MAX = 6;

const children: LaunchedProcess[] = [];
const track = <T extends LaunchedProcess>(p: T): T => {
  children.push(p);
  return p;
};

beforeAll(() => {
  const tsc = join(dirname(createRequire(import.meta.url).resolve('typescript/package.json')), 'bin/tsc');
  for (const pkg of ['engine', 'nixl-pull', 'nixl-push']) {
    const r = spawnSync(process.execPath, [tsc, '--build', join(ROOT, 'packages', pkg, 'tsconfig.json')], { encoding: 'utf8', timeout: 120_000 });
    if (r.status !== 0) throw new Error(`tsc --build packages/${pkg} failed:\n${`${r.stdout}${r.stderr}`.slice(-4000)}`);
  }
}, 180_000);

afterEach(async () => {
  await Promise.all(children.splice(0).map((c) => c.stop()));
});

async function metric(url: string, line: string): Promise<boolean> {
  return (await (await fetch(`${url}/metrics`)).text()).includes(line);
}

for (const t of transfersUnderTest('nixl')) {
  describe.skipIf(t.skip !== null)(t.label, () => {
    describe('NIXL across processes (producer, consumer, proxy)', () => {
      type Workers = 'inprocess' | 'processes';
      // [mode, producer TP, producer PP, consumer TP, where the producer and the consumer run their workers]
      const cases: Array<readonly ['pull' | 'push', number, number, number, Workers, Workers]> = [];
      for (const mode of ['pull', 'push'] as const) {
        cases.push([mode, 1, 1, 1, 'inprocess', 'inprocess'], [mode, 2, 1, 1, 'inprocess', 'inprocess']);
        // The consumer's workers in processes of their own (pull: TP2 -> TP1, push: TP1 -> TP2).
        cases.push(mode === 'pull' ? [mode, 2, 1, 1, 'inprocess', 'processes'] : [mode, 1, 1, 2, 'inprocess', 'processes']);
        // The producer's too.
        for (const [ptp, ppp, dtp] of [[1, 1, 1], [2, 1, 1], [1, 1, 2], [1, 2, 1]] as const) cases.push([mode, ptp, ppp, dtp, 'processes', 'processes']);
      }
      // With worker processes the producer's scheduler half serves the side channel from its workers'
      // handshake metadata (getHandshakeMetadata -> setXferHandshakeMetadata) and the leases cross in
      // the step metadata (nixl-common/src/scheduler.ts): nothing is shared between the processes.
      for (const [mode, tp, pp, dtp, pex, dex] of cases) {
        const connector = mode === 'pull' ? 'NixlConnector' : 'NixlPushConnector';
        const name = `${mode} TP${tp}${pp > 1 ? ` PP${pp}` : ''} -> TP${dtp}, workers ${pex} -> ${dex}: the output equals a single instance and the load verifies`;
        it(name, async () => {
          const base = { preset: 'dense-gqa' as const, numBlocks: 128, imports: [mode === 'pull' ? PULL : PUSH] };
          const id = `mp-${mode}-${tp}${pp}${dtp}-${pex[0]}${dex[0]}`;
          const [p, d] = await Promise.all([
            launchEngineProcess({ config: { ...base, executor: pex, tpSize: tp, ppSize: pp, engineId: `${id}-p`, kvTransferConfig: { kv_connector: connector, kv_role: 'kv_producer', enable_kv_checksum: true, kv_connector_extra_config: { ...t.extra } } } }).then(track),
            launchEngineProcess({
              config: {
                ...base,
                executor: dex,
                tpSize: dtp,
                engineId: `${id}-d`,
                kvTransferConfig: { kv_connector: connector, kv_role: 'kv_consumer', enable_kv_checksum: true, kv_connector_extra_config: { ...t.extra }, kv_checksum_fail_closed: true, kv_load_failure_policy: 'fail' },
              },
            }).then(track),
          ]);
          expect(p.ready).toMatchObject({ kvConnector: connector });
          for (const [e, n, x] of [[p, tp * pp, pex], [d, dtp, dex]] as const) {
            const h = (await (await fetch(`${e.url}/health`)).json()) as { executor: string; worker_pids: number[][] };
            expect(h.executor).toBe(x);
            expect(h.worker_pids.flat()).toHaveLength(x === 'processes' ? n : 0);
            // Over real NIXL, the processes that run the connector workers have libnixl_capi.so mapped.
            if (t.engine === 'nixl') for (const pid of x === 'processes' ? h.worker_pids.flat() : [e.pid]) expect(readFileSync(`/proc/${pid}/maps`, 'utf8')).toContain('libnixl_capi.so');
          }
          const proxy = track(await launchProxyProcess({ config: { prefill: [p.url], decode: [d.url], mode: 'sequential' } }));
          const res = await fetch(`${proxy.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ prompt: PROMPT, max_tokens: MAX, ignore_eos: true }) });
          const body = (await res.json()) as { choices: Array<{ token_ids: number[] }>; kvconnect: { prefill: { kv_transfer_params?: Record<string, unknown> } } };
          expect(res.status).toBe(200);
          const want = await new Engine({ preset: 'dense-gqa', engineId: `${id}-ref` }).generate(PROMPT, { maxTokens: MAX, ignoreEos: true });
          expect(body.choices[0].token_ids).toEqual(want.tokenIds);
          const params = body.kvconnect.prefill.kv_transfer_params!;
          expect(params).toMatchObject({ remote_engine_id: `${id}-p`, remote_tp_size: tp, remote_host: '127.0.0.1' });
          if (mode === 'pull') expect(typeof params.kv_checksums).toBe('string');
          else expect(params.kv_checksums).toBeUndefined();
          expect(await metric(d.url, 'kvconnect_kv_checksum_loads_total{verdict="verified"} 1')).toBe(true);
          // The consumer's NIXL metrics (pull: its workers' READs, one per producer rank a consumer rank
          // maps to: max(TP sizes) per producer PP stage) reach its /metrics, from worker processes too.
          if (mode === 'pull') expect((await (await fetch(`${d.url}/metrics`)).text()).match(/^kvconnect_nixl_xfer_time_seconds_count\{mode="pull",op="READ"\} (\d+)$/m)?.[1]).toBe(String(Math.max(tp, dtp) * pp));
        });
      }

      it('pull: a consumer given another request\'s kv_transfer_params (its blocks intact) never verifies: wrong request, recompute', async () => {
        const base = { preset: 'dense-gqa' as const, numBlocks: 128, imports: [PULL] };
        const [p, d] = await Promise.all([
          launchEngineProcess({ config: { ...base, engineId: 'mp-wrong-p', kvTransferConfig: { kv_connector: 'NixlConnector', kv_role: 'kv_producer', enable_kv_checksum: true, kv_connector_extra_config: { ...t.extra } } } }).then(track),
          launchEngineProcess({
            config: {
              ...base,
              engineId: 'mp-wrong-d',
              kvTransferConfig: { kv_connector: 'NixlConnector', kv_role: 'kv_consumer', enable_kv_checksum: true, kv_connector_extra_config: { ...t.extra }, kv_checksum_fail_closed: true, kv_load_failure_policy: 'recompute' },
            },
          }).then(track),
        ]);
        const post = async (url: string, body: unknown) => {
          const res = await fetch(`${url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
          return { status: res.status, body: (await res.json()) as Record<string, any> }; // eslint-disable-line @typescript-eslint/no-explicit-any
        };
        // Request A prefills on the producer; request B (same length, one character apart) gets A's params.
        const promptB = PROMPT.replace('TCP', 'TCQ');
        expect(promptB).not.toBe(PROMPT);
        const a = await post(p.url, { prompt: PROMPT, max_tokens: 1, kv_transfer_params: { do_remote_decode: true } });
        expect(a.status).toBe(200);
        const b = await post(d.url, { prompt: promptB, max_tokens: MAX, ignore_eos: true, kv_transfer_params: { ...a.body.kv_transfer_params, do_remote_prefill: true } });
        expect(b.status).toBe(200);
        expect(b.body.kvconnect.load).toMatchObject({ verdict: 'mismatch', action: 'recompute', wrong_request: true, identity: 'checked' });
        const want = await new Engine({ preset: 'dense-gqa', engineId: 'mp-ref-wrong' }).generate(promptB, { maxTokens: MAX, ignoreEos: true });
        expect(b.body.choices[0].token_ids).toEqual(want.tokenIds);
        expect(await metric(d.url, 'kvconnect_kv_checksum_wrong_request_total 1')).toBe(true);
        expect(await metric(d.url, 'kvconnect_kv_checksum_loads_total{verdict="mismatch"} 1')).toBe(true);
        expect(await metric(d.url, 'kvconnect_kv_checksum_loads_total{verdict="verified"}')).toBe(false);
      });
    });
  });
}
