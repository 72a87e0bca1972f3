/**
 * The executors (executor.ts, multiprocess-executor.ts): workers in their own processes compute
 * the same outputs as workers in the engine's process, bit for bit (TP2, PP2 x TP2, MLA); the
 * connector contract's data crosses between the processes (handshake metadata before the first
 * step, scheduler metadata with Map/Set/bigint, worker meta, async loads finishing between steps,
 * KV checksums computed in the worker processes, worker metrics on the engine's /metrics); a
 * killed worker process fails the engine's requests with its reason and `/health` says so; the
 * in-process executor rejects connector data that is not plain, as worker processes would.
 *
 * Worker processes run `dist/worker-process.js`; `beforeAll` brings dist up to date with `tsc --build`.
 */
import { spawnSync } from 'node:child_process';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { beforeAll, describe, expect, it } from 'vitest';
import { KVConnectorRegistry, type KVConnectorFactory, type KVConnectorOutput } from '@kvconnect/core';
import { Engine, type EngineOptions } from '../src/engine.js';
import fc from 'fast-check';
import { FrameDecoder, FrameError, NotPlainDataError, ROUND_TRIP_SHARED_SHAPES, assertPlainData, decodeMessage, encodeMessage, frame, roundTrip } from '../src/ipc.js';
import { startEngineServer } from '../src/server/engine-server.js';
import { launchEngineProcess } from '../src/server/launcher.js';
import { parseEngineArgs, engineOptionsOf } from '../src/server/main.js';

const ROOT = fileURLToPath(new URL('../../..', import.meta.url));
const PROBE = fileURLToPath(new URL('./fixtures/probe-connector.mjs', import.meta.url));
const PROMPT = 'Workers in their own processes compute what workers in one process do.';

beforeAll(() => {
  const tsc = join(dirname(createRequire(import.meta.url).resolve('typescript/package.json')), 'bin/tsc');
  const r = spawnSync(process.execPath, [tsc, '--build', join(ROOT, 'packages/engine/tsconfig.json')], { encoding: 'utf8', timeout: 120_000 });
  if (r.status !== 0) throw new Error(`tsc --build packages/engine failed:\n${`${r.stdout}${r.stderr}`.slice(-4000)}`);
}, 180_000);

/** What the probe connector's scheduler half keeps (test/fixtures/probe-connector.mjs). */
interface ProbeScheduler {
  handshake: Map<string, { key: string; pid: number; regions: number }> | null;
  handshakeBeforeSchedule: boolean | null;
  workerMetas: Array<{ key: string; pid: number; step: number | null; metaIntact: boolean }>;
}

const probe = (): Record<string, unknown> => ({ kv_connector: 'ProbeConnector', kv_connector_module_path: PROBE, kv_role: 'kv_both', enable_kv_checksum: true });

describe('MultiProcessExecutor', () => {
  it('TP2: same outputs and checksums as in process; handshake, metadata, worker meta, async loads and metrics cross the processes', async () => {
    const seen: Record<string, { prod: number[]; checksums: unknown; load: number[]; s: ProbeScheduler; metrics: string }> = {};
    for (const executor of ['inprocess', 'processes'] as const) {
      const e = new Engine({ preset: 'dense-gqa', tpSize: 2, numBlocks: 64, executor, engineId: `probe-${executor}`, kvTransferConfig: probe() });
      try {
        await e.ready;
        const prod = await e.generate(PROMPT, { maxTokens: 6, ignoreEos: true }, { do_remote_decode: true });
        const load = await e.generate(`${PROMPT} And a load.`, { maxTokens: 4, ignoreEos: true }, { probe_load: true });
        expect(load.finishReason).toBe('length');
        // Let the step loop go idle, so the metrics and the worker metas count the same steps.
        while (e.scheduler.hasWork()) await new Promise((r) => setTimeout(r, 5));
        await new Promise((r) => setTimeout(r, 20));
        const s = e.kvConnectorScheduler as unknown as ProbeScheduler;
        const metrics = await e.metricsText();
        seen[executor] = { prod: prod.tokenIds, checksums: prod.kvTransferParams?.kv_checksums, load: load.tokenIds, s: { ...s, workerMetas: s.workerMetas.slice() }, metrics };
      } finally {
        await e.shutdown();
      }
    }
    const a = seen.inprocess;
    const b = seen.processes;
    expect(b.prod).toEqual(a.prod);
    expect(typeof a.checksums).toBe('string');
    expect(b.checksums).toBe(a.checksums);
    expect(b.load).toEqual(a.load);
    for (const [executor, { s }] of Object.entries(seen)) {
      expect(s.handshakeBeforeSchedule, executor).toBe(true);
      expect([...s.handshake!.keys()].sort()).toEqual(['0:0', '0:1']);
      for (const [k, h] of s.handshake!) expect(h).toMatchObject({ key: k, regions: 4 });
      expect(s.workerMetas.length).toBeGreaterThan(0);
      expect(s.workerMetas.every((m) => m.metaIntact)).toBe(true);
      expect(new Set(s.workerMetas.map((m) => m.key))).toEqual(new Set(['0:0', '0:1']));
    }
    expect([...a.s.handshake!.values()].map((h) => h.pid)).toEqual([process.pid, process.pid]);
    const pids = [...b.s.handshake!.values()].map((h) => h.pid);
    expect(new Set(pids).size).toBe(2);
    expect(pids).not.toContain(process.pid);
    expect(new Set(b.s.workerMetas.map((m) => m.pid))).toEqual(new Set(pids));
    // Worker metrics: each worker process's registry, aggregated into the engine's text.
    for (const x of [a, b]) {
      for (const key of ['0:0', '0:1']) expect(x.metrics).toContain(`kvconnect_probe_steps_total{worker="${key}"} ${x.s.workerMetas.filter((m) => m.key === key).length}`);
    }
    expect(b.metrics).toContain('kvconnect_kv_checksum_loads_total');
  });

  const models: Array<[EngineOptions['preset'], number, number, EngineOptions['device']]> = [
    ['hybrid-mamba2', 2, 2, 'cpu'],
    ['mla', 2, 1, 'cpu'],
    ['dense-gqa', 2, 1, 'cuda-emulated'],
  ];
  for (const [preset, tp, pp, device] of models) {
    it(`${preset} TP${tp} x PP${pp}${device !== 'cpu' ? `, KV in ${device} device memory` : ''}: chunked prefill and concurrent requests give the in-process outputs`, async () => {
      const prompts = ['one request in chunks,', 'another, longer request that spans several chunks of the step budget.', 'a third'];
      const run = async (executor: 'inprocess' | 'processes') => {
        const e = new Engine({ preset, tpSize: tp, ppSize: pp, numBlocks: 64, maxNumBatchedTokens: 16, executor, device: executor === 'processes' ? device : 'cpu' });
        try {
          return (await Promise.all(prompts.map((p) => e.generate(p, { maxTokens: 5, ignoreEos: true })))).map((r) => r.tokenIds);
        } finally {
          await e.shutdown();
        }
      };
      const want = await run('inprocess');
      expect(await run('processes')).toEqual(want);
    });
  }

  it('a killed worker process fails the pending request with its reason, then every new one; /health says 503 with it', async () => {
    const e = new Engine({ preset: 'dense-gqa', tpSize: 2, numBlocks: 256, executor: 'processes' });
    const server = await startEngineServer(e, { port: 0 });
    try {
      await e.ready;
      const [[p0, p1]] = e.workerPids;
      const gen = e.generate(PROMPT, { maxTokens: 3000, ignoreEos: true });
      await new Promise((r) => setTimeout(r, 200));
      process.kill(p1, 'SIGKILL');
      await expect(gen).rejects.toThrow('worker pp0/tp1 exited (signal SIGKILL)');
      expect(e.failure?.message).toBe('worker pp0/tp1 exited (signal SIGKILL)');
      await expect(e.generate('again', { maxTokens: 2 })).rejects.toThrow('worker pp0/tp1 exited (signal SIGKILL)');
      const h = await fetch(`${server.url}/health`);
      expect(h.status).toBe(503);
      expect(await h.json()).toMatchObject({ status: 'error', error: 'worker pp0/tp1 exited (signal SIGKILL)' });
      // The other worker process is stopped too.
      const gone = async () => {
        for (let i = 0; i < 100; i++) {
          try {
            process.kill(p0, 0);
          } catch {
            return true;
          }
          await new Promise((r) => setTimeout(r, 50));
        }
        return false;
      };
      expect(await gone()).toBe(true);
    } finally {
      await server.close();
      await e.shutdown();
    }
  });
});

describe('kvconnect-engine --workers processes', () => {
  it('serves with one worker process per rank; a killed worker: the request in flight gets 500 with the reason, /health 503', async () => {
    const eng = await launchEngineProcess({ config: { preset: 'dense-gqa', tpSize: 2, numBlocks: 256 }, args: ['--workers', 'processes'] });
    try {
      const health = async () => {
        const r = await fetch(`${eng.url}/health`);
        return { status: r.status, body: (await r.json()) as { executor?: string; worker_pids?: number[][]; error?: string } };
      };
      const h = await health();
      expect(h).toMatchObject({ status: 200, body: { executor: 'processes' } });
      const [[, p1]] = h.body.worker_pids!;
      const post = (max: number) => fetch(`${eng.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ prompt: PROMPT, max_tokens: max, ignore_eos: true }) });
      expect((await post(3)).status).toBe(200);
      const long = post(3000);
      await new Promise((r) => setTimeout(r, 300));
      process.kill(p1, 'SIGKILL');
      const res = await long;
      expect(res.status).toBe(500);
      expect(JSON.stringify(await res.json())).toContain('worker pp0/tp1 exited (signal SIGKILL)');
      expect(await health()).toMatchObject({ status: 503, body: { error: 'worker pp0/tp1 exited (signal SIGKILL)' } });
    } finally {
      await eng.stop();
    }
  });
});

describe('MultiProcessExecutor setup', () => {
  it('a worker whose connector setup throws: ready rejects naming the worker, and every worker process exits', async () => {
    const e = new Engine({ preset: 'dense-gqa', tpSize: 2, numBlocks: 32, executor: 'processes', kvTransferConfig: { ...probe(), kv_connector_extra_config: { fail_register: true } } });
    try {
      await expect(e.ready).rejects.toThrow(/^worker pp0\/tp[01] init: probe: registerKvCaches refused$/);
      const pids = e.workerPids.flat();
      expect(pids).toHaveLength(2);
      const alive = (pid: number) => {
        try {
          process.kill(pid, 0);
          return true;
        } catch {
          return false;
        }
      };
      expect(pids.filter(alive)).toEqual([]);
    } finally {
      await e.shutdown();
    }
  });
});

describe('InProcessExecutor: connector data crosses as plain data', () => {
  class Agent {
    readonly fd = 3;
  }
  const registry = new KVConnectorRegistry();
  const factory: KVConnectorFactory = {
    name: 'NotPlain',
    createScheduler: (config) => ({
      getNumNewMatchedTokens: () => ({ count: 0, loadAsync: false }),
      updateStateAfterAlloc: () => {},
      buildConnectorMeta: () => (config.kv_connector_extra_config.where === 'meta' ? { agent: new Agent() } : { fine: new Map([[1, new Set(['a'])]]) }),
      updateConnectorOutput: (outs: readonly KVConnectorOutput[]) => {
        for (const o of outs) if (config.kv_connector_extra_config.where === 'worker-meta' && o.kvConnectorWorkerMeta !== undefined) throw new Error('function crossed');
      },
      requestFinished: () => ({ delayFree: false }),
      kvChecksumCarrier: () => null,
    }),
    createWorker: (config) => ({
      registerKvCaches: () => {},
      bindConnectorMetadata: () => {},
      startLoadKv: () => {},
      getTransferResults: () => ({
        finishedSending: new Set<string>(),
        finishedRecving: new Set<string>(),
        invalidBlockIds: new Set<number>(),
        kvChecksums: new Map<string, Uint8Array>(),
        workerMeta: config.kv_connector_extra_config.where === 'worker-meta' ? { cb: () => 1 } : undefined,
      }),
      clearConnectorMetadata: () => {},
    }),
  };
  registry.register(factory);
  const engine = (where: string, checkPlainData?: boolean) =>
    new Engine({ preset: 'dense-gqa', numBlocks: 32, registry, checkPlainData, kvTransferConfig: { kv_connector: 'NotPlain', kv_role: 'kv_both', kv_connector_extra_config: { where } } });

  it('a class instance in the scheduler metadata: NotPlainDataError naming the path', async () => {
    const e = engine('meta');
    const err = await e.generate('x', { maxTokens: 2 }).catch((x: unknown) => x);
    expect(err).toBeInstanceOf(NotPlainDataError);
    expect((err as Error).message).toContain('SchedulerOutput.kvConnectorMetadata.agent: not plain data (an instance of Agent)');
    // With the check off the same engine shape runs (what the check adds is the error).
    const off = engine('meta', false);
    expect((await off.generate('x', { maxTokens: 2 })).finishReason).toBe('length');
  });

  it('a function in the worker meta: NotPlainDataError naming the worker; plain Map/Set metadata passes', async () => {
    const err = await engine('worker-meta').generate('x', { maxTokens: 2 }).catch((x: unknown) => x);
    expect(err).toBeInstanceOf(NotPlainDataError);
    expect((err as Error).message).toContain('worker 0:0 KVConnectorOutput.kvConnectorWorkerMeta.cb: not plain data (a function cb)');
    expect((await engine('fine').generate('x', { maxTokens: 2 })).finishReason).toBe('length');
  });

  it("executor 'processes' refuses a custom registry and a backend object (they cannot cross processes)", () => {
    expect(() => new Engine({ preset: 'dense-gqa', executor: 'processes', registry })).toThrow(/custom registry cannot cross processes/);
    expect(() => new Engine({ preset: 'dense-gqa', executor: 'processes', checksumBackend: {} as never })).toThrow(/checksumBackend must be a backend name/);
  });
});

describe('ipc', () => {
  it('round trip keeps Map, Set, bigint, typed arrays, nested plain objects and undefined', () => {
    const v = { m: new Map<unknown, unknown>([['a', new Set([1, 2])], [3, { x: [1n, 2n ** 70n] }]]), f: new Float32Array([1.5, -0, NaN]), b: new BigUint64Array([2n ** 64n - 1n]), u: new Uint8Array([9]), o: {}, n: null, d: undefined };
    const r = roundTrip(v, 'v');
    expect(r).toEqual(v);
    expect(r.m).toBeInstanceOf(Map);
    expect(r.m.get('a')).toBeInstanceOf(Set);
    expect(r.f).toBeInstanceOf(Float32Array);
    expect(Object.is(r.f[1], -0)).toBe(true);
    expect(r.b).toBeInstanceOf(BigUint64Array);
    expect(Object.getPrototypeOf(r.o)).toBe(Object.prototype);
  });

  it('round trip (shapes shared between messages) gives what the IPC serializer gives, message after message', () => {
    // The reference is encodeMessage + decodeMessage (per-message shapes, what a worker process receives).
    const plain = fc.anything({ withBigInt: true, withMap: true, withSet: true, withTypedArray: true, maxDepth: 3 });
    fc.assert(
      fc.property(fc.array(plain, { minLength: 1, maxLength: 8 }), (values) => {
        for (const v of values) expect(roundTrip(v, 'v')).toEqual(decodeMessage(encodeMessage(v)));
      }),
      { numRuns: 300 },
    );
  });

  it('round trip past the shared-shape limit, and of objects keyed by data (request ids, block numbers)', () => {
    // More distinct field-name shapes than are shared: the later ones are defined per message; every
    // shape seen before still decodes.
    const shape = (i: number) => ({ [`field${i}`]: i, nested: { requestId: `r${i}`, blocks: [i, i + 1] } });
    for (let round = 0; round < 2; round++) {
      for (let i = 0; i < ROUND_TRIP_SHARED_SHAPES + 50; i++) expect(roundTrip(shape(i), 'v')).toEqual(shape(i));
    }
    // Objects whose keys are data: a new shape per message, never shared, always decoded.
    for (let i = 0; i < 2000; i++) {
      const v = { numScheduledTokens: { [`pd-${i}-d`]: i, [String(i)]: 1 }, stepId: i };
      expect(roundTrip(v, 'v')).toEqual(v);
    }
    expect(roundTrip(shape(3), 'v')).toEqual(shape(3));
  });

  it('assertPlainData names the offending path; cycles and symbols are refused', () => {
    expect(() => assertPlainData({ a: [{ b: new Map([['k', new Date()]]) }] }, 'x')).toThrow('x.a[0].b.get("k"): not plain data (an instance of Date)');
    const c: Record<string, unknown> = {};
    c.self = c;
    expect(() => assertPlainData(c, 'c')).toThrow('c.self: not plain data (a cycle)');
    expect(() => assertPlainData({ s: Symbol('s') }, 'o')).toThrow('o.s: not plain data (a symbol)');
    // A Map key holding a bigint is plain data (its path text cannot be JSON).
    expect(() => assertPlainData(new Map([[[0n], 1]]), 'm')).not.toThrow();
    expect(() => assertPlainData(new Map([[[0n], new Date()]]), 'm')).toThrow('m.get(0): not plain data (an instance of Date)');
    const shared = { k: 1 };
    expect(() => assertPlainData({ a: shared, b: shared }, 'o')).not.toThrow();
  });

  it('frames survive any chunking; a bad length is a FrameError', () => {
    const bodies = [encodeMessage({ t: 'a', v: new Float32Array(1000) }), encodeMessage({ t: 'b' }), encodeMessage(new Map([[1, 2]]))];
    const bytes = Buffer.concat(bodies.map((b, i) => frame(i + 7, b)));
    for (const step of [1, 3, 17, bytes.length]) {
      const d = new FrameDecoder();
      const got = [];
      for (let i = 0; i < bytes.length; i += step) got.push(...d.push(bytes.subarray(i, i + step)));
      expect(got.map((f) => f.id)).toEqual([7, 8, 9]);
      expect(decodeMessage(got[2].body)).toEqual(new Map([[1, 2]]));
    }
    const bad = Buffer.alloc(8);
    bad.writeUInt32LE(2, 0);
    expect(() => new FrameDecoder().push(bad)).toThrow(FrameError);
  });
});

describe('kvconnect-engine flags', () => {
  it('--workers and --distributed-executor-backend choose the executor; imports reach the worker processes', () => {
    const cfg = (args: string[]) => {
      const p = parseEngineArgs(['--preset', 'dense-gqa', ...args]);
      if (p.help) throw new Error('help');
      return p.config;
    };
    expect(cfg(['--workers', 'processes']).executor).toBe('processes');
    expect(cfg(['--distributed-executor-backend', 'mp']).executor).toBe('processes');
    expect(cfg(['--distributed-executor-backend', 'uni']).executor).toBe('inprocess');
    expect(cfg([]).executor).toBeUndefined();
    expect(() => cfg(['--workers', 'threads'])).toThrow(/executor: expected one of inprocess, processes/);
    expect(() => cfg(['--distributed-executor-backend', 'ray'])).toThrow(/expected mp or uni/);
    const o = engineOptionsOf(cfg(['--workers', 'processes', '--import', '@kvconnect/nixl-pull']));
    expect(o).toMatchObject({ executor: 'processes', workerImports: ['@kvconnect/nixl-pull'] });
  });
});
