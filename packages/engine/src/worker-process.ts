/**
 * The entry of a worker process (one per TP rank x PP stage, started by `MultiProcessExecutor`,
 * multiprocess-executor.ts): it holds the worker's KV cache memory, its connector worker half and
 * KV checksum worker (a {@link WorkerRuntime}), and computes its share of each mixer.
 *
 * Channel: file descriptor 3, a socket pair to the engine process, carrying {@link frame}s of
 * msgpackr messages (ipc.ts). Requests are handled one at a time, in order; each gets one reply
 * `{ ok: true, v }` or `{ ok: false, error }` with the request's id:
 * - `init { worker, setup, imports, checksumBackend }`: imports `imports` (connector packages
 *   register themselves on import, as the engine process did), builds the worker and the model's
 *   seeded weights, runs {@link WorkerRuntime.setup}; replies the handshake metadata (or null);
 * - `begin { out, segs, end }`: {@link WorkerRuntime.begin}; with `end` (a step without forward
 *   pass, e.g. while only transfers are pending) also {@link WorkerRuntime.end}, replying its output;
 * - `mixer { layer, hn }`: the worker's columns of the layer's gathered mixer output, packed
 *   `[T, count]` float32 (`mixerColumns` in executor.ts);
 * - `end`: replies the step's `KVConnectorOutput`;
 * - `metrics`: replies the worker's Prometheus registry as `getMetricsAsJSON()` (the connector
 *   worker half registers its metrics there);
 * - `shutdown`: the connector's `shutdown`, a reply, then exit 0.
 *
 * Between requests the process's event loop is free, so a connector's asynchronous transfers make
 * progress and show up in a later `getTransferResults`. The process exits when the engine's end of
 * the socket closes (the engine exited), and with code 1 on an uncaught error.
 * stdout is the engine's stderr (the engine's stdout carries only its JSON event lines).
 * @module
 */
import { Socket } from 'node:net';
import { createLogger, defaultRegistry, type LevelWithSilent } from '@kvconnect/core';
import type { BackendName } from '@kvconnect/checksum';
import { Registry } from 'prom-client';
import type { SchedulerOutput } from './contracts.js';
import { mixerColumns, mixerWidth, type ExecutorSetup } from './executor.js';
import { FrameDecoder, assertPlainData, decodeMessage, encodeMessage, frame } from './ipc.js';
import { buildWeights } from './model/weights.js';
import { Worker, type ForwardSegment, type WorkerOptions } from './worker.js';
import { WorkerRuntime } from './worker-runtime.js';

/** A request from the engine process (see the module comment). */
export type WorkerRequest =
  | { t: 'init'; worker: WorkerOptions; setup: ExecutorSetup; imports: string[]; checksumBackend: BackendName | 'auto' }
  | { t: 'begin'; out: SchedulerOutput; segs: readonly ForwardSegment[]; end: boolean }
  | { t: 'mixer'; layer: number; hn: Float32Array }
  | { t: 'end' }
  | { t: 'metrics' }
  | { t: 'shutdown' };

/** A worker process's reply. */
export type WorkerReply = { ok: true; v: unknown } | { ok: false; error: string };

function main(): void {
  const sock = new Socket({ fd: 3, readable: true, writable: true });
  const decoder = new FrameDecoder();
  const registry = new Registry();
  let rt: WorkerRuntime | null = null;
  let opts: WorkerOptions | null = null;
  let T = 0;
  let chain = Promise.resolve();

  const handle = async (m: WorkerRequest): Promise<unknown> => {
    if (m.t === 'init') {
      opts = m.worker;
      process.title = `kvconnect-worker pp${opts.ppRank}/tp${opts.tpRank}`;
      for (const mod of m.imports) await defaultRegistry.loadModule(mod);
      // logs on stderr (the engine process's, inherited), at the engine's level (KVCONNECT_LOG_LEVEL, set by kvconnect-engine)
      const logger = createLogger({
        level: (process.env.KVCONNECT_LOG_LEVEL as LevelWithSilent | undefined) ?? 'warn',
        destination: { write: (line: string) => process.stderr.write(line) },
        bindings: { engine: m.setup.engineId, role: m.setup.transferConfig?.kv_role ?? 'none' },
      });
      rt = new WorkerRuntime(new Worker(opts), buildWeights(opts.model), { registry: defaultRegistry, metricsRegistry: registry, checksumBackend: m.checksumBackend, logger });
      return rt.setup(m.setup);
    }
    if (m.t === 'metrics') return registry.getMetricsAsJSON();
    if (!rt || !opts) throw new Error(`${m.t} before init`);
    switch (m.t) {
      case 'begin':
        rt.begin(m.out, m.segs);
        T = 0;
        for (const s of m.segs) T += s.tokenIds.length;
        return m.end ? rt.end() : null;
      case 'mixer': {
        const width = mixerWidth(opts.model, m.layer);
        const out = new Float32Array(T * width);
        rt.mixer(m.layer, m.hn, out);
        const { start, count } = mixerColumns(opts.model, m.layer, opts.tpRank, opts.tpSize);
        const packed = new Float32Array(T * count);
        for (let i = 0; i < T; i++) packed.set(out.subarray(i * width + start, i * width + start + count), i * count);
        return packed;
      }
      case 'end':
        return rt.end();
      case 'shutdown':
        await rt.shutdown();
        return null;
    }
  };

  const reply = (id: number, r: WorkerReply) => {
    sock.write(frame(id, encodeMessage(r)));
  };

  sock.on('data', (chunk: Buffer) => {
    let frames;
    try {
      frames = decoder.push(chunk);
    } catch (e) {
      process.stderr.write(`kvconnect worker: bad frame from the engine: ${e instanceof Error ? e.message : String(e)}\n`);
      process.exit(1);
    }
    for (const f of frames) {
      chain = chain.then(async () => {
        let m: WorkerRequest | null = null;
        try {
          m = decodeMessage(f.body) as WorkerRequest;
          const v = await handle(m);
          if (m.t === 'init' || m.t === 'begin' || m.t === 'end') assertPlainData(v, m.t === 'init' ? 'handshake metadata' : 'KVConnectorOutput');
          reply(f.id, { ok: true, v });
        } catch (e) {
          reply(f.id, { ok: false, error: e instanceof Error ? e.message : String(e) });
        }
        if (m?.t === 'shutdown') sock.end(() => process.exit(0));
      });
    }
  });
  // The engine's end closed: the engine exited or gave this worker up.
  sock.on('end', () => process.exit(0));
  sock.on('error', () => process.exit(1));
  process.on('uncaughtException', (e) => {
    process.stderr.write(`kvconnect worker: ${e.stack ?? e.message}\n`);
    process.exit(1);
  });
  process.on('unhandledRejection', (e) => {
    process.stderr.write(`kvconnect worker: unhandled rejection: ${e instanceof Error ? (e.stack ?? e.message) : String(e)}\n`);
    process.exit(1);
  });
}

main();
