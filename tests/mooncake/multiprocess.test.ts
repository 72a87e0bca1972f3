/**
 * MooncakeConnector across processes: a producer engine, a consumer engine and a concurrent-mode
 * proxy as three Node processes on 127.0.0.1, the engines' workers in the engine processes (TP1 ->
 * TP1) or in worker processes of their own (TP1 -> TP1, TP2 -> TP1, TP1 -> TP2, a PP2 producer;
 * the producer's workers register with its bootstrap server through the handshake hooks). The KV moves producer -> consumer
 * through the bootstrap server, the ZeroMQ side channel and the embedded agents; the consumer's
 * load verifies its checksums (carried on the transfer response) and the answer equals an
 * in-process single engine's. Once without a cluster secret and once with KVCONNECT_CLUSTER_SECRET
 * in the engines' environment (bootstrap and side channel proven; an unproven query gets a 401).
 *
 * The bins run `dist/`; `beforeAll` brings the engine and this package up to date with `tsc --build`.
 */
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import * as net from 'node:net';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterEach, beforeAll, describe, expect, it } from 'vitest';
import { Engine, launchEngineProcess, launchProxyProcess, type LaunchedProcess } from '@kvconnect/engine';
import { transfersUnderTest } from '../transfer-engines.js';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const MOONCAKE_DIST = join(ROOT, 'packages/mooncake/dist/index.js');
const PROMPTS = ['Mooncake across processes: prefill here, decode there.', 'A second prompt, somewhat longer than the first one, to span blocks.'];
const S = { max_tokens: 8, ignore_eos: true };

const children: LaunchedProcess[] = [];
afterEach(async () => {
  await Promise.all(children.splice(0).map((c) => c.stop()));
});

beforeAll(() => {
  const tsc = join(dirname(createRequire(import.meta.url).resolve('typescript/package.json')), 'bin/tsc');
  for (const p of ['packages/engine', 'packages/mooncake']) {
    const r = spawnSync(process.execPath, [tsc, '--build', join(ROOT, p)], { encoding: 'utf8', timeout: 120_000 });
    if (r.status !== 0) console.warn(`tsc --build ${p} failed; running the existing dist/:\n${`${r.stdout}${r.stderr}`.slice(-2000)}`);
  }
}, 180_000);

async function freePort(): Promise<number> {
  const s = net.createServer();
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', () => r()));
  const port = (s.address() as net.AddressInfo).port;
  await new Promise<void>((r) => s.close(() => r()));
  return port;
}

for (const t of transfersUnderTest('mooncake')) {
  describe.skipIf(t.skip !== null)(t.label, () => {
    describe('MooncakeConnector, producer / consumer / proxy processes', () => {
      // [producer TP, producer PP, consumer TP, where the engines run their workers, cluster secret]
      const cases = [
        [1, 1, 1, 'inprocess', null],
        [1, 1, 1, 'processes', null],
        [2, 1, 1, 'processes', null],
        [1, 1, 2, 'processes', null],
        [1, 2, 1, 'processes', null],
        [2, 1, 1, 'processes', 'multiprocess-cluster-secret-0123'],
      ] as const;
      for (const [ptp, ppp, dtp, executor, secret] of cases) {
        it(`TP${ptp}${ppp > 1 ? ` PP${ppp}` : ''} -> TP${dtp}, workers ${executor}${secret ? ', KVCONNECT_CLUSTER_SECRET set' : ''}: the answer equals a single engine, the load is verified`, async () => {
          const port = await freePort();
          // The engines read the cluster secret from their environment (as the demo passes it).
          const env = secret ? { ...process.env, KVCONNECT_CLUSTER_SECRET: secret } : { ...process.env, KVCONNECT_CLUSTER_SECRET: '' };
          const base = { preset: 'dense-gqa' as const, numBlocks: 256, imports: [MOONCAKE_DIST], executor };
          const extra = { bootstrap_port: port, abort_timeout_ms: 20_000, transfer_timeout_ms: 30_000, ...t.extra };
          const id = `mp-mc-${ptp}${ppp}${dtp}-${executor}${secret ? '-s' : ''}`;
          const [prod, cons] = await Promise.all([
            launchEngineProcess({
              env,
              config: { ...base, tpSize: ptp, ppSize: ppp, engineId: `${id}-prod`, kvTransferConfig: { kv_connector: 'MooncakeConnector', kv_role: 'kv_producer', enable_kv_checksum: true, kv_connector_extra_config: extra } },
            }),
            launchEngineProcess({
              env,
              config: {
                ...base,
                tpSize: dtp,
                engineId: `${id}-cons`,
                kvTransferConfig: {
                  kv_connector: 'MooncakeConnector',
                  kv_role: 'kv_consumer',
                  enable_kv_checksum: true,
                  kv_checksum_fail_closed: true,
                  kv_load_failure_policy: 'fail',
                  kv_connector_extra_config: { ...extra, remote_bootstrap_addr: `127.0.0.1:${port}` },
                },
              },
            }),
          ]);
          children.push(prod, cons);
          expect(prod.ready).toMatchObject({ kvConnector: 'MooncakeConnector', kvRole: 'kv_producer' });
          expect(prod.ready.registeredConnectors).toContain('MooncakeConnector');
          for (const [e, n] of [[prod, ptp * ppp], [cons, dtp]] as const) {
            const h = (await (await fetch(`${e.url}/health`)).json()) as { executor: string; worker_pids: number[][] };
            expect(h.executor).toBe(executor);
            expect(h.worker_pids.flat()).toHaveLength(executor === 'processes' ? n : 0);
            // Over the real Transfer Engine, the processes that run the connector workers have libtransfer_engine.so mapped.
            if (t.engine === 'mooncake') for (const pid of executor === 'processes' ? h.worker_pids.flat() : [e.pid]) expect(readFileSync(`/proc/${pid}/maps`, 'utf8')).toContain('libtransfer_engine.so');
          }
          // With the secret, the producer's bootstrap server answers no unproven query.
          expect((await fetch(`http://127.0.0.1:${port}/query?engine_id=${id}-prod`)).status).toBe(secret ? 401 : 200);
          const proxy = await launchProxyProcess({ config: { prefill: [prod.url], decode: [cons.url], mode: 'concurrent' } });
          children.push(proxy);
          const ref = new Engine({ preset: 'dense-gqa', numBlocks: 256, engineId: `${id}-ref` });
          for (const prompt of PROMPTS) {
            const want = await ref.generate(prompt, { maxTokens: S.max_tokens, ignoreEos: true });
            const res = await fetch(`${proxy.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ prompt, ...S }) });
            const body = (await res.json()) as { choices: Array<{ token_ids: number[] }>; kvconnect: { decode: { load?: { verdict: string; action: string } }; prefill: { checksum_payload?: { sent: boolean; carrier: string } } } };
            expect(res.status, JSON.stringify(body)).toBe(200);
            expect(body.choices[0].token_ids).toEqual(want.tokenIds);
            expect(body.kvconnect.decode.load).toMatchObject({ verdict: 'verified', action: 'use' });
            expect(body.kvconnect.prefill.checksum_payload).toMatchObject({ sent: true, carrier: 'connector' });
          }
        });
      }
    });
  });
}
