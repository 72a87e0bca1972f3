/**
 * The multi-process executor: one worker process per (TP rank, PP stage), the scheduler and the
 * dense parts of the model in the engine process (as vLLM's `--distributed-executor-backend mp`).
 * Each worker process (worker-process.ts) holds its KV cache memory and its connector and KV
 * checksum worker halves; per step the engine sends it the step's {@link SchedulerOutput}, then,
 * layer by layer, the normalized hidden states of its stage, and gets back its columns of the
 * gathered mixer output and, at the end, its `KVConnectorOutput` (plain data, ipc.ts).
 *
 * Processes: `process.execPath` runs the compiled entry `dist/worker-process.js` of this package
 * (the same path from `src/` and from `dist/`; build first: `npm run build`), with fd 3 a socket
 * pair to the engine (stdout goes to the engine's stderr). The worker imports the engine's
 * connector modules (`imports`, then `kv_connector_module_path` through the registry) and creates
 * its connector worker half from the `kv_transfer_config`.
 *
 * Failure: a worker process that exits (killed, crashed) or does not answer within
 * `requestTimeoutMs` sets {@link MultiProcessExecutor.failure} to a {@link WorkerProcessError}
 * (`worker pp0/tp1 exited (signal SIGKILL)`), rejects every pending request, stops the other
 * workers, and tells the engine (`onFailure`), which fails its requests and reports the reason on
 * `/health`.
 * @module
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import type { Socket } from 'node:net';
import { fileURLToPath } from 'node:url';
import { workerKey } from '@kvconnect/core';
import type { BackendName } from '@kvconnect/checksum';
import type { HandshakeMetadataByWorker, KVConnectorOutput } from './contracts.js';
import { forwardSteps, mixerColumns, mixerWidth, type Executor, type ExecutorSetup, type StepExecution, type StepInput, type WorkerMetricsJSON } from './executor.js';
import { FrameDecoder, assertPlainData, decodeMessage, encodeMessage, frame } from './ipc.js';
import type { ModelConfig } from './model/config.js';
import type { ModelWeights } from './model/weights.js';
import type { WorkerOptions } from './worker.js';
import type { WorkerReply, WorkerRequest } from './worker-process.js';

/** The compiled worker entry (from `src/` and from `dist/` alike). */
export const WORKER_ENTRY: string = fileURLToPath(new URL('../dist/worker-process.js', import.meta.url));

/** A worker process died, failed to start, or stopped answering. `worker` is `pp{P}/tp{T}`. */
export class WorkerProcessError extends Error {
  constructor(
    readonly worker: string,
    message: string,
  ) {
    super(`worker ${worker} ${message}`);
    this.name = 'WorkerProcessError';
  }
}

/** Options of a {@link MultiProcessExecutor}. */
export interface MultiProcessExecutorOptions {
  model: ModelConfig;
  /** The engine process's weights (dense parts; the workers build the same seeded weights). */
  weights: ModelWeights;
  /** `workers[pp][tp]`: each worker's options. */
  workers: readonly (readonly WorkerOptions[])[];
  /** Modules every worker process imports first (connector packages that register on import). */
  imports?: readonly string[];
  checksumBackend?: BackendName | 'auto';
  /** How long a worker may take to start and set up (default 60 000 ms). */
  startTimeoutMs?: number;
  /** How long a worker may take to answer a step request (default 60 000 ms). */
  requestTimeoutMs?: number;
  /** The worker entry (default {@link WORKER_ENTRY}). */
  entry?: string;
}

interface Waiter {
  resolve: (v: unknown) => void;
  reject: (e: Error) => void;
  timer: NodeJS.Timeout;
  what: string;
}

const live = new Set<ChildProcess>();
let exitHook = false;

/** One worker process and its request channel. */
class WorkerProcess {
  readonly name: string;
  readonly key: string;
  private readonly sock: Socket;
  private readonly waiters = new Map<number, Waiter>();
  private nextId = 1;
  private dead: Error | null = null;
  readonly exited: Promise<void>;

  constructor(
    readonly child: ChildProcess,
    readonly opts: WorkerOptions,
    private readonly onDeath: (e: WorkerProcessError) => void,
    private readonly isClosing: () => boolean,
  ) {
    this.name = `pp${opts.ppRank}/tp${opts.tpRank}`;
    this.key = workerKey(opts.ppRank, opts.tpRank);
    this.sock = child.stdio[3] as Socket;
    const decoder = new FrameDecoder();
    this.sock.on('data', (chunk: Buffer) => {
      let frames;
      try {
        frames = decoder.push(chunk);
      } catch (e) {
        this.die(`sent a bad frame (${e instanceof Error ? e.message : String(e)})`);
        child.kill('SIGKILL');
        return;
      }
      for (const f of frames) {
        const w = this.waiters.get(f.id);
        if (!w) continue;
        this.waiters.delete(f.id);
        clearTimeout(w.timer);
        let r: WorkerReply;
        try {
          r = decodeMessage(f.body) as WorkerReply;
        } catch (e) {
          w.reject(new WorkerProcessError(this.name, `sent an undecodable reply to ${w.what}: ${e instanceof Error ? e.message : String(e)}`));
          continue;
        }
        if (r.ok) w.resolve(r.v);
        else w.reject(new WorkerProcessError(this.name, `${w.what}: ${r.error}`));
      }
    });
    this.sock.on('error', () => {});
    this.exited = new Promise<void>((resolve) => {
      child.once('exit', (code, signal) => {
        live.delete(child);
        this.die(`exited (${signal ? `signal ${signal}` : `code ${code}`})`);
        resolve();
      });
    });
  }

  private die(why: string): void {
    if (this.dead) return;
    const e = new WorkerProcessError(this.name, why);
    this.dead = e;
    for (const w of this.waiters.values()) {
      clearTimeout(w.timer);
      w.reject(e);
    }
    this.waiters.clear();
    if (!this.isClosing()) this.onDeath(e);
  }

  /** Sends an encoded request body; resolves with the reply's value. */
  send(what: string, body: Uint8Array, timeoutMs: number): Promise<unknown> {
    if (this.dead) return Promise.reject(this.dead);
    const id = this.nextId++;
    return new Promise<unknown>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.waiters.delete(id);
        const e = new WorkerProcessError(this.name, `did not answer ${what} within ${timeoutMs} ms`);
        reject(e);
        if (!this.isClosing()) this.onDeath(e);
        this.child.kill('SIGKILL');
      }, timeoutMs);
      timer.unref();
      this.waiters.set(id, { resolve, reject, timer, what });
      this.sock.write(frame(id, body));
    });
  }

  request(m: WorkerRequest, timeoutMs: number): Promise<unknown> {
    return this.send(m.t, encodeMessage(m), timeoutMs);
  }

  /** Closes the channel (the worker exits on its end), then SIGKILL after `graceMs`. */
  async stop(graceMs: number): Promise<void> {
    this.sock.end();
    const t = setTimeout(() => this.child.kill('SIGKILL'), graceMs);
    await this.exited;
    clearTimeout(t);
  }
}

/** Worker processes, one per (TP rank, PP stage); see the module comment. */
export class MultiProcessExecutor implements Executor {
  readonly kind = 'processes' as const;
  private _failure: Error | null = null;
  private readonly listeners: Array<(e: Error) => void> = [];
  private procs: WorkerProcess[][] = [];
  private closing = false;
  private readonly timeoutMs: number;

  constructor(private readonly o: MultiProcessExecutorOptions) {
    this.timeoutMs = o.requestTimeoutMs ?? 60_000;
  }

  get failure(): Error | null {
    return this._failure;
  }

  onFailure(listener: (error: Error) => void): void {
    if (this._failure) listener(this._failure);
    else this.listeners.push(listener);
  }

  /** The worker processes' pids, `[pp][tp]` (after {@link start}). */
  get pids(): number[][] {
    return this.procs.map((s) => s.map((p) => p.child.pid ?? -1));
  }

  private fail(e: Error): void {
    if (this._failure || this.closing) return;
    this._failure = e;
    for (const s of this.procs) for (const p of s) void p.stop(1000);
    for (const l of this.listeners.splice(0)) l(e);
  }

  async start(setup: ExecutorSetup): Promise<HandshakeMetadataByWorker<unknown>> {
    const entry = this.o.entry ?? WORKER_ENTRY;
    if (!existsSync(entry)) throw new Error(`${entry} is missing: build @kvconnect/engine first (npm run build, or npx tsc --build packages/engine)`);
    if (!exitHook) {
      exitHook = true;
      process.on('exit', () => {
        for (const c of live) c.kill('SIGKILL');
      });
    }
    this.procs = this.o.workers.map((stage) =>
      stage.map((opts) => {
        const child = spawn(process.execPath, [entry], { stdio: ['ignore', 2, 'inherit', 'pipe'], env: process.env });
        live.add(child);
        return new WorkerProcess(child, opts, (e) => this.fail(e), () => this.closing);
      }),
    );
    const all = this.procs.flat();
    let replies: unknown[];
    try {
      replies = await Promise.all(
        all.map((p) => p.request({ t: 'init', worker: p.opts, setup, imports: [...(this.o.imports ?? [])], checksumBackend: this.o.checksumBackend ?? 'auto' }, this.o.startTimeoutMs ?? 60_000)),
      );
    } catch (e) {
      // A worker that could not start: stop them all (the engine's setup fails with `e`).
      this.closing = true;
      await Promise.all(all.map((p) => p.stop(1000)));
      throw e;
    }
    const out = new Map<string, unknown>();
    all.forEach((p, i) => {
      if (replies[i] !== null && replies[i] !== undefined) out.set(p.key, replies[i]);
    });
    return out;
  }

  async execute(input: StepInput): Promise<StepExecution> {
    if (this._failure) throw this._failure;
    assertPlainData(input.schedulerOutput, 'SchedulerOutput');
    const all = this.procs.flat();
    const segs = input.segments;
    const empty = segs.length === 0;
    const begin = encodeMessage({ t: 'begin', out: input.schedulerOutput, segs, end: empty } satisfies WorkerRequest);
    const begun = await Promise.all(all.map((p) => p.send('begin', begin, this.timeoutMs)));
    if (empty) return { logits: new Map(), outputs: begun as KVConnectorOutput[] };
    const m = this.o.model;
    let T = 0;
    for (const s of segs) T += s.tokenIds.length;
    const it = forwardSteps(m, this.o.weights, this.procs.length, segs);
    let logits: Map<string, Float32Array>;
    for (let r = it.next(); ; r = it.next()) {
      if (r.done) {
        logits = r.value;
        break;
      }
      const call = r.value;
      const stage = this.procs[call.stage];
      const body = encodeMessage({ t: 'mixer', layer: call.layer, hn: call.hn } satisfies WorkerRequest);
      const parts = (await Promise.all(stage.map((p) => p.send('mixer', body, this.timeoutMs)))) as Float32Array[];
      const width = mixerWidth(m, call.layer);
      stage.forEach((p, tp) => {
        const { start, count } = mixerColumns(m, call.layer, tp, stage.length);
        const part = parts[tp];
        if (!(part instanceof Float32Array) || part.length !== T * count) throw new WorkerProcessError(p.name, `returned a mixer output of the wrong shape for layer ${call.layer}`);
        for (let i = 0; i < T; i++) call.out.set(part.subarray(i * count, (i + 1) * count), i * width + start);
      });
    }
    const end = encodeMessage({ t: 'end' } satisfies WorkerRequest);
    const outputs = (await Promise.all(all.map((p) => p.send('end', end, this.timeoutMs)))) as KVConnectorOutput[];
    return { logits, outputs };
  }

  async workerMetrics(): Promise<WorkerMetricsJSON[]> {
    if (this._failure) return [];
    return (await Promise.all(this.procs.flat().map((p) => p.request({ t: 'metrics' }, this.timeoutMs)))) as WorkerMetricsJSON[];
  }

  async shutdown(): Promise<void> {
    if (this.closing) return;
    const all = this.procs.flat();
    const failed = this._failure !== null;
    this.closing = true;
    if (!failed) await Promise.allSettled(all.map((p) => p.request({ t: 'shutdown' }, 10_000)));
    await Promise.all(all.map((p) => p.stop(2000)));
  }
}
