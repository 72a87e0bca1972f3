/**
 * KV checksums on the device path, end to end without a GPU: both engines' checksum workers sum
 * their KV on an emulated CUDA device (`cuda-emulated`, @kvconnect/checksum backend-emulated.ts),
 * whose results arrive steps after the submit. The producer's finish (its `kv_transfer_params`)
 * waits for its workers' sums; the consumer's request waits after its load until its verdict and
 * never decodes before it; a flipped bit is still a mismatch (fail-closed recompute gives the single
 * instance's output); a device that never completes makes the load unverified
 * (`workers-missing`) after the deadline, never a hang. In-process connector (pd-checksums.test.ts
 * covers the same cases on host backends), and over Mooncake with the workers in worker processes
 * (the reports' `inFlight` crosses processes).
 */
import { spawnSync } from 'node:child_process';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { beforeAll, describe, expect, it } from 'vitest';
import { EmulatedDevice } from '@kvconnect/checksum';
import { KVChecksumObservability, KVChecksumWorker, type KVChecksumReport, type LoadEvent } from '@kvconnect/core';
import { Engine, PDProxy } from '@kvconnect/engine';
import { MOONCAKE_CONNECTOR } from '@kvconnect/mooncake';
import { bootstrapAddressOfEngine } from '../mooncake/utils.js';
import { counter, makePD, single } from '../../packages/engine/test/utils/pd.js';

const PROMPT = 'The quick brown fox jumps over the lazy dog, twice.';
const SAMPLING = { maxTokens: 8, ignoreEos: true };

/** Per step of `engine`: which requests its checksum workers announced in flight, which they reported. */
interface Trace {
  steps: Array<{ step: number; inFlight: string[]; reported: string[]; scheduled: string[]; verdicts: number }>;
}

/** Records, per step, the checksum reports of every worker and the scheduled requests. */
function trace(engine: Engine, verdicts: () => number): Trace {
  const t: Trace = { steps: [] };
  let step = 0;
  let cur: Trace['steps'][number] | null = null;
  const sched = engine.scheduler;
  const schedule = sched.schedule.bind(sched);
  sched.schedule = () => {
    const plan = schedule();
    cur = { step: ++step, inFlight: [], reported: [], scheduled: [...plan.numScheduledTokens.keys()], verdicts: verdicts() };
    t.steps.push(cur);
    return plan;
  };
  for (const w of engine.workers.flat()) {
    const ck = w.checksum as KVChecksumWorker;
    const take = ck.takeReport.bind(ck);
    ck.takeReport = () => {
      const r: KVChecksumReport | null = take();
      if (r && cur) {
        cur.inFlight.push(...(r.inFlight?.sends ?? []), ...(r.inFlight?.recvs ?? []));
        cur.reported.push(...r.sends.map((e) => e.requestId), ...r.recvs.map((e) => e.requestId));
      }
      return r;
    };
  }
  return t;
}

const firstStep = (t: Trace, f: (s: Trace['steps'][number]) => boolean) => t.steps.find(f)?.step ?? Infinity;

describe('P/D with device checksums (emulated device, results steps later)', () => {
  it('verified: the producer waits for its sums, the consumer decodes only after its verdict', async () => {
    const ref = await single('dense-gqa').generate(PROMPT, SAMPLING);
    const producerDev = new EmulatedDevice({ completeAfterPolls: 3 });
    const consumerDev = new EmulatedDevice({ completeAfterPolls: 3 });
    const pd = makePD({ model: 'dense-gqa', failClosed: true, policy: 'fail', producer: { tpSize: 2, checksumBackend: producerDev }, consumer: { checksumBackend: consumerDev } });
    await pd.producer.ready;
    await pd.consumer.ready;
    const verdicts: LoadEvent[] = [];
    pd.obs.events.on('load-verified', (e) => verdicts.push(e));
    const prodTrace = trace(pd.producer, () => 0);
    const consTrace = trace(pd.consumer, () => verdicts.length);
    const r = await pd.proxy.generate(PROMPT, SAMPLING);
    expect(r.error).toBeUndefined();
    expect(r.prefill.kvTransferParams?.kv_checksums).toEqual(expect.any(String));
    expect(r.tokenIds).toEqual(ref.tokenIds);
    expect(verdicts).toHaveLength(1);
    expect(await counter(pd.obs, 'loads', { verdict: 'verified' })).toBe(1);
    // Producer: sums submitted in one step, reported in a later one (the finish waited for them).
    const pIn = firstStep(prodTrace, (s) => s.inFlight.length > 0);
    const pRep = firstStep(prodTrace, (s) => s.reported.length > 0);
    expect(pIn).toBeLessThan(pRep);
    expect(pRep).toBeLessThan(Infinity);
    // Consumer: sums in flight, then reported, then the first scheduled step of the request (after the verdict).
    const id = verdicts[0].requestId;
    const cIn = firstStep(consTrace, (s) => s.inFlight.includes(id));
    const cRep = firstStep(consTrace, (s) => s.reported.includes(id));
    const cRun = firstStep(consTrace, (s) => s.scheduled.includes(id));
    expect(cIn).toBeLessThan(cRep);
    expect(cRep).toBeLessThan(cRun);
    expect(consTrace.steps.filter((s) => s.scheduled.includes(id)).every((s) => s.verdicts === 1)).toBe(true);
    expect(producerDev.submits).toBeGreaterThanOrEqual(2); // one per TP rank
    expect(producerDev.syncCalls + consumerDev.syncCalls).toBe(0);
    await pd.shutdown();
  });

  it('sums done within the step that submitted them (as on a GPU): nothing waits for them, few steps per request', async () => {
    // A GPU finishes the step's kernel within the hooks' host time, so one takeReport() reports
    // the request both in flight and summed; the scheduler must not then wait for sums it already
    // has (that waited out inFlightTimeoutMs on both sides: 20 s per request on the H200,
    // bench/cuda/README.md). Counted in engine steps, not time: with the wait, both engines step
    // every millisecond until the deadline (about 1000 steps for 1 s).
    const ref = await single('dense-gqa').generate(PROMPT, SAMPLING);
    const producerDev = new EmulatedDevice({ completeAfterPolls: 0 });
    const consumerDev = new EmulatedDevice({ completeAfterPolls: 0 });
    const pd = makePD({ model: 'dense-gqa', failClosed: true, policy: 'fail', producer: { tpSize: 2, checksumBackend: producerDev, checksumInFlightTimeoutMs: 1000 }, consumer: { checksumBackend: consumerDev, checksumInFlightTimeoutMs: 1000 } });
    await pd.producer.ready;
    await pd.consumer.ready;
    const prodTrace = trace(pd.producer, () => 0);
    const consTrace = trace(pd.consumer, () => 0);
    const r = await pd.proxy.generate(PROMPT, SAMPLING);
    expect(r.error).toBeUndefined();
    expect(r.tokenIds).toEqual(ref.tokenIds);
    expect(r.prefill.kvTransferParams?.kv_checksums).toEqual(expect.any(String));
    expect(await counter(pd.obs, 'loads', { verdict: 'verified' })).toBe(1);
    // Submitted and reported in the same step, on both sides.
    const same = (t: Trace) => t.steps.some((s) => s.inFlight.length > 0 && s.reported.length > 0);
    expect(same(prodTrace)).toBe(true);
    expect(same(consTrace)).toBe(true);
    expect(prodTrace.steps.length).toBeLessThan(50);
    expect(consTrace.steps.length).toBeLessThan(50);
    expect(producerDev.syncCalls + consumerDev.syncCalls).toBe(0);
    await pd.shutdown();
  });

  it('by name (--checksum-backend cuda-emulated): verified, same output as a single instance', async () => {
    const ref = await single('mla').generate(PROMPT, SAMPLING);
    const pd = makePD({ model: 'mla', failClosed: true, policy: 'fail', producer: { checksumBackend: 'cuda-emulated' }, consumer: { tpSize: 2, checksumBackend: 'cuda-emulated' } });
    const r = await pd.proxy.generate(PROMPT, SAMPLING);
    expect(r.error).toBeUndefined();
    expect(r.tokenIds).toEqual(ref.tokenIds);
    expect(await counter(pd.obs, 'loads', { verdict: 'verified' })).toBe(1);
    await pd.shutdown();
  });

  it('a flipped bit in transit is a mismatch; fail-closed recompute matches the single instance', async () => {
    const ref = await single('hybrid-mamba2').generate(PROMPT, SAMPLING);
    const pd = makePD({
      model: 'hybrid-mamba2',
      failClosed: true,
      policy: 'recompute',
      producer: { tpSize: 2, checksumBackend: new EmulatedDevice({ completeAfterPolls: 2 }) },
      consumer: { checksumBackend: new EmulatedDevice({ completeAfterPolls: 4 }) },
    });
    const events: LoadEvent[] = [];
    pd.obs.events.on('load-mismatch', (e) => events.push(e));
    let done = false;
    pd.bus.faultHook = (c, b) => {
      if (!done && c.state === 1 && c.row === 3) {
        b[b.length - 1] ^= 0x40;
        done = true;
      }
    };
    const r = await pd.proxy.generate(PROMPT, SAMPLING);
    expect(done).toBe(true);
    expect(events).toHaveLength(1);
    expect(events[0].action).toBe('recompute');
    expect(events[0].verdict.mismatches.map((m) => m.groupId)).toEqual([1]);
    expect(r.tokenIds).toEqual(ref.tokenIds);
    expect(await counter(pd.obs, 'recomputed')).toBe(1);
    await pd.shutdown();
  });
});

describe('device sums that never arrive: deadlines, never a hang', () => {
  it("consumer: the load is unverified (workers-missing) after the deadline; fail-closed recomputes", async () => {
    const ref = await single('dense-gqa').generate(PROMPT, SAMPLING);
    const stalled = new EmulatedDevice({ completeAfterPolls: 1 });
    stalled.stall(true);
    const pd = makePD({ model: 'dense-gqa', failClosed: true, policy: 'recompute', producer: { checksumBackend: 'cuda-emulated' }, consumer: { checksumBackend: stalled, checksumInFlightTimeoutMs: 60 } });
    const events: LoadEvent[] = [];
    pd.obs.events.on('load-unverified', (e) => events.push(e));
    const t0 = Date.now();
    const r = await pd.proxy.generate(PROMPT, SAMPLING);
    expect(Date.now() - t0).toBeGreaterThanOrEqual(60);
    expect(events).toHaveLength(1);
    expect(events[0].verdict.unverified).toEqual([{ groupId: null, reason: 'workers-missing' }]);
    expect(events[0].action).toBe('recompute');
    expect(r.tokenIds).toEqual(ref.tokenIds);
    await pd.shutdown();
  });

  it('producer: the finish goes on without its sums after the deadline (payload not sent)', async () => {
    const stalled = new EmulatedDevice();
    stalled.stall(true);
    const pd = makePD({ model: 'dense-gqa', producer: { checksumBackend: stalled, checksumInFlightTimeoutMs: 60 }, consumer: { checksumBackend: 'cuda-emulated' } });
    const p = await pd.producer.generate(PROMPT, { maxTokens: 1 }, { do_remote_decode: true });
    expect(p.finishReason).toBe('length');
    expect(p.kvTransferParams).toBeDefined();
    expect(p.kvTransferParams?.kv_checksums).toBeUndefined();
    expect(await counter(pd.producer.observability!, 'payloadsNotSent', { reason: 'workers-missing' })).toBe(1);
    await pd.shutdown();
  });
});

describe('device checksums with worker processes (Mooncake, cuda-emulated by name)', () => {
  const ROOT = fileURLToPath(new URL('../..', import.meta.url));
  beforeAll(() => {
    const tsc = join(dirname(createRequire(import.meta.url).resolve('typescript/package.json')), 'bin/tsc');
    const r = spawnSync(process.execPath, [tsc, '--build', join(ROOT, 'packages/engine'), join(ROOT, 'packages/mooncake')], { encoding: 'utf8', timeout: 170_000 });
    if (r.status !== 0) throw new Error(`tsc --build failed:\n${`${r.stdout}${r.stderr}`.slice(-4000)}`);
  }, 180_000);

  it('producer TP2 and consumer TP1 in worker processes: every load verified, equal to a single instance', async () => {
    const ref = await single('dense-gqa').generate(PROMPT, SAMPLING);
    const workers = { executor: 'processes', workerImports: [join(ROOT, 'packages/mooncake/dist/index.js')], checksumBackend: 'cuda-emulated' } as const;
    const extra = { bootstrap_port: 0, abort_timeout_ms: 10_000, transfer_timeout_ms: 15_000 };
    const id = `devck-mp-${process.pid}`;
    const obs = new KVChecksumObservability({ level: 'silent' });
    const producer = new Engine({ model: 'dense-gqa', tpSize: 2, ...workers, engineId: `${id}-p`, observability: new KVChecksumObservability({ level: 'silent' }), kvTransferConfig: { kv_connector: MOONCAKE_CONNECTOR, kv_role: 'kv_producer', enable_kv_checksum: true, kv_connector_extra_config: extra } });
    let consumer: Engine | null = null;
    try {
      await producer.ready;
      consumer = new Engine({
        model: 'dense-gqa',
        ...workers,
        engineId: `${id}-d`,
        observability: obs,
        kvTransferConfig: { kv_connector: MOONCAKE_CONNECTOR, kv_role: 'kv_consumer', enable_kv_checksum: true, kv_checksum_fail_closed: true, kv_load_failure_policy: 'fail', kv_connector_extra_config: { ...extra, remote_bootstrap_addr: await bootstrapAddressOfEngine(producer) } },
      });
      await consumer.ready;
      expect(producer.workerPids.flat()).toHaveLength(2);
      const proxy = new PDProxy({ prefill: producer, decode: consumer, mode: 'concurrent' });
      const r = await proxy.generate(PROMPT, SAMPLING);
      expect(r.error).toBeUndefined();
      expect(r.tokenIds).toEqual(ref.tokenIds);
      expect(await counter(obs, 'loads', { verdict: 'verified' })).toBe(1);
    } finally {
      await consumer?.shutdown();
      await producer.shutdown();
    }
  }, 60_000);
});
