/**
 * One engine step's block values: which rows to sum (SPEC 2: block positions, valid tokens),
 * one backend call for every request and group of the step, and the per-worker records
 * (partials per replica key) the verifier takes (SPEC 8).
 * @module
 */
import {
  ROW_WORDS,
  isDeviceBackend,
  isDeviceProvider,
  type BackendName,
  type ChecksumBackend,
  type DeviceChecksumBackend,
  type DeviceChecksumProvider,
  type DeviceTicket,
  type PackedTables,
} from './backend.js';
import { tsBackend, validateStep } from './backend-ts.js';
import { loadNativeBackend, nativeUnavailableReason } from './backend-native.js';
import { cudaDeviceProvider } from './backend-cuda.js';
import { packTables, planGroup, type GroupPlan, type GroupSpec, type RankContext } from './plan.js';
import { isDeviceRegion, replicaKeyString, type DeviceMemoryRegion, type KVMemoryRegion, type WorkerGroupRecord } from './types.js';

/** The blocks of one request in one group to sum in this step. */
export interface BlockRun {
  /** Index of the group in the checksummer's groups (not the group id). */
  group: number;
  /**
   * Physical block ids of consecutive block positions `start, start+1, ...` (attention), or the
   * one running-state block (state groups).
   */
  blockIds: ArrayLike<number>;
  /** Block position of `blockIds[0]` (attention; state groups: 0). */
  start: number;
  /** The request's tokens whose KV the blocks hold (SPEC 2 numTokens). */
  numTokens: number;
  /**
   * Sampled checking (sampling.ts): `mask[i] === 0` leaves block `blockIds[i]` unsummed (its
   * values are 0, no KV is read). Absent: every block.
   */
  mask?: ArrayLike<number>;
}

/** Where a run's values are in the step output. */
interface RunSlot {
  group: number;
  start: number;
  nBlocks: number;
  outOffset: number;
  columns: number;
}

/**
 * Builds a step's `kvc_row` array. Buffers grow and are reused across steps, so a step allocates
 * nothing once they are large enough.
 */
export class StepRows {
  private buf = new Uint32Array(ROW_WORDS * 64);
  private n = 0;
  private outLen = 0;
  readonly runs: RunSlot[] = [];

  constructor(private readonly plans: readonly GroupPlan[]) {}

  /** Forgets the previous step. */
  reset(): void {
    this.n = 0;
    this.outLen = 0;
    this.runs.length = 0;
  }

  /**
   * Adds one request's blocks of one group. Blocks holding no valid token get no row (their
   * values are 0). A skipped or empty plan adds no rows but keeps the run's place.
   * @returns the run's index.
   * @throws RangeError for a group index out of range, a negative start or numTokens, or a state
   *   run without exactly one block.
   */
  add(run: BlockRun): number {
    const plan = this.plans[run.group];
    if (!plan) throw new RangeError(`group index ${run.group} of ${this.plans.length}`);
    if (!(Number.isSafeInteger(run.start) && run.start >= 0 && Number.isSafeInteger(run.numTokens) && run.numTokens >= 0)) {
      throw new RangeError(`bad run: start ${run.start}, numTokens ${run.numTokens}`);
    }
    const columns = plan.columns.length;
    const isState = plan.kind === 'state' || plan.kind === 'state-local';
    if (isState && run.blockIds.length !== 1) throw new RangeError(`a state group sums one running-state block, got ${run.blockIds.length}`);
    const nBlocks = run.blockIds.length;
    const slot: RunSlot = { group: run.group, start: isState ? 0 : run.start, nBlocks, outOffset: this.outLen, columns };
    this.outLen += nBlocks * columns;
    this.runs.push(slot);
    if (columns > 0 && plan.skipReason === null) {
      this.reserve(nBlocks);
      const b = this.buf;
      const ids = run.blockIds;
      let k = this.n;
      const { mask } = run;
      if (isState) {
        if (mask === undefined || mask[0] !== 0) k = this.write(k, run.group, ids[0], 0, 0, slot.outOffset);
      } else {
        const B = plan.blockSize;
        // Only blocks holding a valid token: positions start .. ceil(numTokens / B) - 1.
        const end = Math.min(nBlocks, Math.ceil(run.numTokens / B) - run.start);
        if ((run.start + nBlocks) * B > 0xffffffff) throw new RangeError(`token positions past 2^32`);
        const { numTokens, group } = run;
        let first = run.start * B;
        let out = slot.outOffset;
        if (mask === undefined) {
          // Every block: all but the last one of the positions hold B valid tokens (end's definition).
          // The words every row shares (group, B valid tokens, reserved 0) are written once and
          // copied over the run's rows by doubling (copyWithin: log2(end) memmoves); the loop
          // writes only the three that vary, which halves its stores (bench/checksum.mjs, step rows).
          const endW = k + Math.max(end, 0) * ROW_WORDS;
          if (end > 0) {
            b[k] = group;
            b[k + 3] = B;
            b[k + 5] = 0;
            for (let w = ROW_WORDS; k + w < endW; w *= 2) b.copyWithin(k + w, k, k + Math.min(w, endW - k - w));
          }
          for (let i = 0; i < end; i++, first += B, out += columns) {
            const id = ids[i];
            if (id >>> 0 !== id) throw new RangeError(`block id ${id} at position ${run.start + i} is not a uint32`);
            b[k + 1] = id;
            b[k + 2] = first;
            b[k + 4] = out;
            k += 6; // ROW_WORDS, literal in the hot loop
          }
          const left = numTokens - (first - B); // valid tokens of the last row written
          if (end > 0 && left < B) b[k - 3] = left;
        } else for (let i = 0; i < end; i++, first += B, out += columns) {
          const id = ids[i];
          if (id >>> 0 !== id) throw new RangeError(`block id ${id} at position ${run.start + i} is not a uint32`);
          if (mask[i] === 0) continue;
          const left = numTokens - first;
          b[k] = group;
          b[k + 1] = id;
          b[k + 2] = first;
          b[k + 3] = left < B ? left : B;
          b[k + 4] = out;
          b[k + 5] = 0;
          k += 6; // ROW_WORDS, literal in the hot loop
        }
      }
      this.n = k;
    }
    return this.runs.length - 1;
  }

  /** Makes room for `rows` more rows. */
  private reserve(rows: number): void {
    const need = this.n + rows * ROW_WORDS;
    if (need > this.buf.length) {
      const b = new Uint32Array(Math.max(need, this.buf.length * 2));
      b.set(this.buf.subarray(0, this.n));
      this.buf = b;
    }
  }

  /** Writes one row at word `k`; returns the next row's word. */
  private write(k: number, group: number, blockId: number, first: number, valid: number, out: number): number {
    if (blockId >>> 0 !== blockId) throw new RangeError(`block id ${blockId} is not a uint32`);
    const b = this.buf;
    b[k] = group;
    b[k + 1] = blockId;
    b[k + 2] = first;
    b[k + 3] = valid;
    b[k + 4] = out;
    b[k + 5] = 0;
    return k + ROW_WORDS;
  }

  /** The step's rows (a view of the reused buffer, valid until the next `add`/`reset`). */
  get rows(): Uint32Array {
    return this.buf.subarray(0, this.n);
  }

  /** uint64 values the step's output holds. */
  get outLength(): number {
    return this.outLen;
  }

  /** The record of run `i` from the step output: partials per replica key, one per block. */
  record(i: number, out: BigUint64Array): WorkerGroupRecord {
    return recordOf(this.plans[this.runs[i].group], this.runs[i], out);
  }
}

/** The record of one run (`s`, of `plan`'s group) from a step output. */
function recordOf(plan: GroupPlan, s: RunSlot, out: BigUint64Array): WorkerGroupRecord {
  const partials = new Map<string, BigUint64Array>();
  if (plan.skipReason === null) {
    plan.columns.forEach((key, c) => {
      // One column: a plain copy (no BigInt per block); else every columns-th value.
      let v: BigUint64Array;
      if (s.columns === 1) v = out.slice(s.outOffset, s.outOffset + s.nBlocks);
      else {
        v = new BigUint64Array(s.nBlocks);
        for (let b = 0; b < s.nBlocks; b++) v[b] = out[s.outOffset + b * s.columns + c];
      }
      partials.set(replicaKeyString(key), v);
    });
  }
  return plan.skipReason === null
    ? { start: s.start, nBlocks: s.nBlocks, skipped: false, partials }
    : { start: s.start, nBlocks: s.nBlocks, skipped: true, skipReason: plan.skipReason, partials };
}

let warnedFallback = false;

/**
 * Marks a plan skipped ('invalid-view', with the detail) when one of its entries would read outside
 * its region or past the work bound, so a registration mistake shows at registration, not as an
 * error in every later step.
 */
function checkAgainstRegions(plan: GroupPlan, regions: readonly { readonly byteLength: number }[]): GroupPlan {
  if (plan.skipReason !== null || plan.entries.length === 0) return plan;
  try {
    validateStep(packTables([plan]), regions, new Uint32Array(0), new BigUint64Array(0));
    return plan;
  } catch (e) {
    return { ...plan, skipReason: 'invalid-view', skipDetail: (e as Error).message, entries: [], columns: [], caches: [], fingerprint: 0n };
  }
}

/** Host backends `KVCONNECT_CHECKSUM_BACKEND` may name. */
const ENV_BACKENDS = ['ts', 'native', 'auto'] as const;

/**
 * The backend to use. `auto`: the one `KVCONNECT_CHECKSUM_BACKEND` names (`ts`, `native` or
 * `auto`), else `native` when the addon loaded, else `ts` (said once, as a process warning).
 * @throws Error when `native` is asked for and the addon is not available, or when the variable
 *   names something else.
 */
export function selectBackend(name: BackendName | 'auto' = 'auto'): ChecksumBackend {
  if (name === 'auto') {
    const env = process.env.KVCONNECT_CHECKSUM_BACKEND;
    if (env !== undefined && env !== '') {
      if (!(ENV_BACKENDS as readonly string[]).includes(env)) throw new Error(`KVCONNECT_CHECKSUM_BACKEND=${env}: expected one of ${ENV_BACKENDS.join(', ')}`);
      name = env as (typeof ENV_BACKENDS)[number];
    }
  }
  if (name === 'ts') return tsBackend;
  const native = loadNativeBackend();
  if (name === 'native') {
    if (!native) throw new Error(`native checksum backend not available: ${nativeUnavailableReason()}`);
    return native;
  }
  if (name !== 'auto') throw new Error(`checksum backend ${String(name)} is not a host backend (use ts, native or auto; the cuda backend sums device memory through loadCudaBackend)`);
  if (native) return native;
  if (!warnedFallback) {
    warnedFallback = true;
    process.emitWarning(`kvconnect: native checksum addon not available (${nativeUnavailableReason()}); using the TypeScript backend`, 'KvconnectWarning');
  }
  return tsBackend;
}

/** A step handed to {@link BlockChecksummer.submit}: what {@link BlockChecksummer.poll} returns. */
export type CompletedStep =
  /** The step's records, one per run, in the order of its runs. */
  | { ticket: number; records: WorkerGroupRecord[] }
  /** The device failed the step (its records are lost). */
  | { ticket: number; error: Error };

/** A step in flight on a device backend. */
interface InFlight {
  ticket: number;
  device: DeviceTicket;
  slots: RunSlot[];
  outLen: number;
}

/** The checksum backend a {@link BlockChecksummer} may be given. */
export type BlockChecksummerBackend = BackendName | 'auto' | ChecksumBackend | DeviceChecksumBackend | DeviceChecksumProvider;

/** Options of a {@link BlockChecksummer}. */
export interface BlockChecksummerOptions {
  /**
   * Device backends: the CUDA stream (`cudaStream_t` as a bigint) {@link BlockChecksummer.submit}
   * enqueues on by default, the engine's stream that writes the KV (default 0n: the legacy default
   * stream).
   */
  stream?: bigint;
}

/**
 * A rank's block checksums: plans its groups once (at cache registration) and sums the rows of
 * each engine step with one backend call.
 *
 * Host regions (`Uint8Array`) go with a host backend (`ts`, `native`, `auto`) and the synchronous
 * {@link compute}. Device regions ({@link DeviceMemoryRegion}, all on one device) go with a device
 * backend (`cuda`, a {@link DeviceChecksumProvider} such as the emulated device, or a context) and
 * the asynchronous {@link submit} / {@link poll}: one submit per step, never waiting for the
 * device; the records arrive in a later poll. Submit/poll also work on host backends (a submit
 * completes at once), so a caller can use one path for both.
 */
export class BlockChecksummer {
  readonly plans: GroupPlan[];
  readonly tables: PackedTables;
  /** The host backend (host regions) or the device context (device regions; this checksummer's own). */
  readonly backend: ChecksumBackend | DeviceChecksumBackend;
  /** True when the regions are device memory (submit/poll only). */
  readonly isDevice: boolean;
  private readonly step: StepRows;
  private out = new BigUint64Array(0);
  private readonly stream: bigint;
  private nextTicket = 1;
  private readonly inFlight: InFlight[] = [];
  private readonly completed: CompletedStep[] = [];

  /**
   * @param groups the rank's caches per group, in the engine's group order (run.group indexes it).
   * @param rank TP rank and size, and the role (producer: replica 0; consumer: every replica).
   * @param regions the memory the views' `region` indexes point into: all host or all device.
   * @param backend `auto` (default: `cuda` for device regions, else native or ts), `ts`, `native`
   *   or a host backend object for host regions; `cuda`, a device provider or a device context for
   *   device regions.
   * @throws TypeError when regions and backend do not go together (host regions with a device
   *   backend, device regions with a host backend, host and device regions mixed, regions on
   *   several devices); Error when the `cuda` backend is not available (the reason).
   */
  constructor(
    groups: readonly GroupSpec[],
    readonly rank: RankContext,
    readonly regions: readonly KVMemoryRegion[],
    backend: BlockChecksummerBackend = 'auto',
    options: BlockChecksummerOptions = {},
  ) {
    this.stream = options.stream ?? 0n;
    // `auto` on device memory: the cuda backend.
    if (backend === 'auto' && regions.length > 0 && regions.every((r) => isDeviceRegion(r))) backend = 'cuda';
    const wantsDevice = backend === 'cuda' || backend === 'cuda-emulated' || isDeviceBackend(backend) || isDeviceProvider(backend);
    const nDevice = regions.filter((r) => isDeviceRegion(r)).length;
    if (nDevice > 0 && nDevice < regions.length) throw new TypeError(`KV regions must be all host memory or all device memory: ${nDevice} of ${regions.length} are device memory`);
    const backendName = typeof backend === 'object' ? backend.name : backend;
    if (wantsDevice && nDevice < regions.length) {
      throw new TypeError(`the ${backendName} checksum backend sums device memory, but these KV regions are host memory (the engine must keep its KV cache on the GPU)`);
    }
    if (!wantsDevice && nDevice > 0) {
      throw new TypeError(`these KV regions are device memory: they need a device checksum backend (cuda), not ${backendName}`);
    }
    this.isDevice = wantsDevice;
    const sizes = regions.map((r) => (isDeviceRegion(r) ? { byteLength: r.bytes } : r));
    this.plans = groups.map((g) => checkAgainstRegions(planGroup(g, rank), sizes));
    this.tables = packTables(this.plans);
    if (wantsDevice) {
      const dev = regions as readonly DeviceMemoryRegion[];
      const ordinal = dev[0]?.device ?? 0;
      if (dev.some((r) => r.device !== ordinal)) throw new TypeError(`device KV regions of one checksummer must be on one device, got devices ${[...new Set(dev.map((r) => r.device))].join(', ')}`);
      if (backend === 'cuda-emulated') throw new TypeError('the cuda-emulated backend is given as an EmulatedDevice (it holds the emulated memory), not by name');
      const ctx = isDeviceBackend(backend) ? backend : (backend === 'cuda' ? cudaDeviceProvider() : (backend as DeviceChecksumProvider)).createContext(ordinal);
      if (ctx.device !== ordinal) throw new TypeError(`the checksum context is on device ${ctx.device}, the KV regions on device ${ordinal}`);
      ctx.setTables(this.tables, dev.map((r) => ({ address: r.address, bytes: r.bytes })));
      this.backend = ctx;
    } else {
      this.backend = typeof backend === 'object' ? (backend as ChecksumBackend) : selectBackend(backend as BackendName | 'auto');
    }
    this.step = new StepRows(this.plans);
  }

  /**
   * Sums one step's runs on a host backend; returns one record per run, in order.
   * @throws RangeError for runs outside the caches (block ids past numBlocks, bad groups).
   * @throws Error on device regions (they are summed through {@link submit} / {@link poll}).
   */
  compute(runs: readonly BlockRun[]): WorkerGroupRecord[] {
    if (this.isDevice) throw new Error('BlockChecksummer.compute is synchronous: device regions are summed through submit() and poll()');
    const s = this.step;
    s.reset();
    for (const r of runs) s.add(r);
    if (this.out.length < s.outLength) this.out = new BigUint64Array(Math.max(s.outLength, this.out.length * 2));
    const out = this.out.subarray(0, s.outLength);
    out.fill(0n);
    if (s.rows.length > 0) (this.backend as ChecksumBackend).sumRows(this.tables, this.regions as readonly Uint8Array[], s.rows, out);
    return runs.map((_, i) => s.record(i, out));
  }

  /**
   * Submits one step's runs: on a device backend one `submit` on `stream` (default: the
   * constructor's), which never waits for the device; on a host backend the step is summed now.
   * Either way the records come from a later {@link poll}. When the device's `slots` steps are
   * already in flight, the oldest is collected first (that waits for it).
   * @returns the step's ticket (increasing numbers), as {@link poll} names it.
   * @throws RangeError for runs outside the caches (nothing is submitted then).
   */
  submit(runs: readonly BlockRun[], stream: bigint = this.stream): number {
    const ticket = this.nextTicket++;
    if (!this.isDevice) {
      this.completed.push({ ticket, records: this.compute(runs) });
      return ticket;
    }
    const ctx = this.backend as DeviceChecksumBackend;
    const s = this.step;
    s.reset();
    for (const r of runs) s.add(r);
    const slots = s.runs.slice();
    if (s.rows.length === 0) {
      // Nothing to read (skipped groups, blocks without valid tokens): zeros, no device work.
      const out = new BigUint64Array(s.outLength);
      this.completed.push({ ticket, records: slots.map((x) => recordOf(this.plans[x.group], x, out)) });
      return ticket;
    }
    if (this.inFlight.length >= ctx.slots) this.finish(this.inFlight.shift()!, true);
    const device = ctx.submit(s.rows, s.outLength, stream);
    this.inFlight.push({ ticket, device, slots, outLen: s.outLength });
    return ticket;
  }

  /** Collects `f` (waiting for it when `wait`) into the completed steps. */
  private finish(f: InFlight, wait: boolean): boolean {
    const ctx = this.backend as DeviceChecksumBackend;
    try {
      if (!wait && !ctx.query(f.device)) return false;
      const out = new BigUint64Array(f.outLen);
      ctx.collect(f.device, out);
      this.completed.push({ ticket: f.ticket, records: f.slots.map((x) => recordOf(this.plans[x.group], x, out)) });
    } catch (e) {
      this.completed.push({ ticket: f.ticket, error: e instanceof Error ? e : new Error(String(e)) });
    }
    return true;
  }

  /**
   * The steps completed since the last call, in submit order within each backend's completion;
   * never blocks (a device step is collected only once its results are in host memory).
   */
  poll(): CompletedStep[] {
    for (let i = 0; i < this.inFlight.length; ) {
      if (this.finish(this.inFlight[i], false)) this.inFlight.splice(i, 1);
      else i++;
    }
    return this.completed.splice(0, this.completed.length);
  }

  /** Submitted steps whose records {@link poll} has not returned yet. */
  get pending(): number {
    return this.inFlight.length + this.completed.length;
  }

  /** Frees the device context (its steps in flight are dropped). */
  close(): void {
    this.inFlight.length = 0;
    if (this.isDevice) (this.backend as DeviceChecksumBackend).close();
  }
}
