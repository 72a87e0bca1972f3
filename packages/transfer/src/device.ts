/**
 * Device memory for the transfer agents and the reference engine's device mode: one interface,
 * {@link DeviceMemory}, with two implementations.
 *
 * - {@link cudaDeviceMemory}: CUDA through the native addon's `device` bindings
 *   (native/src/addon_device.cc over native/include/kvc_device.h: cudaMalloc with
 *   cudaIpcGetMemHandle, cudaIpcOpenMemHandle, cudaHostAlloc staging, cudaMemcpyAsync on a stream
 *   with an event whose completion is polled by cudaEventQuery). Needs the addon built with CUDA
 *   (`KVCONNECT_WITH_CUDA=1 npm ci`) and a GPU at run time.
 * - {@link emulatedDeviceMemory}: the same contract over host memory, for CI (no GPU). Device
 *   memory is a table of host buffers at synthetic addresses; copies are queued per stream and run
 *   on a later event-loop turn (so code that reads a copy's destination before its completion
 *   sees stale bytes, as on a GPU); async host sides must be staging buffers of
 *   {@link DeviceMemory.allocHost}, as pinned memory must be for CUDA. Its IPC handles open only
 *   in the process that made them (another mapping address over the same bytes): emulated memory
 *   is process-local, so two processes never share a {@link DeviceMemory.hostId} and agents in
 *   different processes move emulated device memory over their TCP path with staging. Same-host
 *   IPC is therefore tested in CI with two agents in one process, and across processes only on a
 *   GPU machine (native/cuda/test_device.cu, bench/cuda/README.md).
 *
 * Both check every copy against the memory they know (allocations, opened IPC mappings, staging
 * buffers): a copy never touches memory outside them ({@link DeviceMemoryError} `range`).
 * Device addresses are bigints (CUDA `void*`), sizes are byte counts (safe integers).
 * @module
 */
import { randomBytes, timingSafeEqual } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { hostname } from 'node:os';
import { bindings, type NativeDevice } from '@kvconnect/native';
import type { DeviceMemoryRegion } from '@kvconnect/checksum';

/** Bytes of an IPC handle (`cudaIpcMemHandle_t`, CUDA_IPC_HANDLE_SIZE). */
export const IPC_HANDLE_BYTES = 64;

/** The message of a {@link DeviceMemoryError} `no-cuda`. */
export const NO_CUDA_MESSAGE = 'device memory needs the addon built with CUDA (KVCONNECT_WITH_CUDA=1)';

/**
 * Why a device-memory call failed: `no-cuda` (addon without CUDA, no driver or no GPU), `range`
 * (a range outside known memory, a bad size or argument), `ipc` (a handle that does not open
 * here), `cuda` (the CUDA runtime reported an error).
 */
export type DeviceMemoryErrorCode = 'no-cuda' | 'range' | 'ipc' | 'cuda';

/** A failed device-memory call; `code` says why. */
export class DeviceMemoryError extends Error {
  override readonly name: string = 'DeviceMemoryError';
  constructor(
    readonly code: DeviceMemoryErrorCode,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}

/** Copy directions: host to device, device to host, device to device. */
export type CopyKind = 'h2d' | 'd2h' | 'd2d';

/** One enqueued copy. */
export interface DeviceCopy {
  /** True once the copy finished (never blocks). @throws DeviceMemoryError `cuda` if it failed. */
  done(): boolean;
  /** Resolves once the copy finished, polling {@link done} without blocking the event loop; rejects if it failed. */
  settled(): Promise<void>;
  /** Forgets the copy (it may still run; its completion is no longer observable). */
  release(): void;
}

/** Device memory of one process: allocation, IPC, staging and copies (see the module note). */
export interface DeviceMemory {
  /** `'cuda'` or `'emulated'`. */
  readonly backend: 'cuda' | 'emulated';
  /**
   * Which host this process is on for IPC: two processes whose `hostId` is equal can open each
   * other's IPC handles (CUDA: the host's boot id and hostname; emulated: unique per process).
   */
  readonly hostId: string;
  /** Allocates `bytes` on `device`, with the allocation's IPC handle. */
  alloc(device: number, bytes: number): DeviceMemoryRegion;
  /** Frees an allocation of {@link alloc} (after the copies that use it finished). */
  free(region: DeviceMemoryRegion): void;
  /** True if `[address, address + bytes)` is device memory this instance knows (an allocation or an IPC mapping). */
  owns(address: bigint, bytes?: number): boolean;
  /**
   * Maps a peer's allocation by its IPC handle; returns the mapping's address in this process.
   * `bytes` is the size the peer advertised: copies through the mapping are bounded by it. Opening
   * an open handle again returns the same mapping (one more reference).
   * @throws DeviceMemoryError `ipc` when the handle does not open here.
   */
  openIpc(device: number, handle: Uint8Array, bytes: number): bigint;
  /** Drops one reference to a mapping of {@link openIpc}; unmaps it at the last. */
  closeIpc(address: bigint): void;
  /** A host staging buffer (pinned for CUDA) that async copies accept as their host side. */
  allocHost(bytes: number): Uint8Array;
  /** Enqueues a copy on `stream` (default: the instance's own stream of that device); completion is polled. */
  copyAsync(device: number, kind: 'h2d', dst: bigint, src: Uint8Array, bytes: number): DeviceCopy;
  copyAsync(device: number, kind: 'd2h', dst: Uint8Array, src: bigint, bytes: number): DeviceCopy;
  copyAsync(device: number, kind: 'd2d', dst: bigint, src: bigint, bytes: number): DeviceCopy;
  /** Synchronous copy: finished when it returns. The host side may be any Uint8Array. */
  copy(device: number, kind: 'h2d', dst: bigint, src: Uint8Array, bytes: number): void;
  copy(device: number, kind: 'd2h', dst: Uint8Array, src: bigint, bytes: number): void;
  copy(device: number, kind: 'd2d', dst: bigint, src: bigint, bytes: number): void;
}

function checkBytes(what: string, n: number): void {
  if (!Number.isSafeInteger(n) || n <= 0) throw new DeviceMemoryError('range', `${what}: bytes must be a positive safe integer, got ${n}`);
}

function checkDevice(what: string, d: number): void {
  if (!Number.isInteger(d) || d < 0 || d > 65535) throw new DeviceMemoryError('range', `${what}: device must be an integer in 0..65535, got ${d}`);
}

/**
 * Waits without blocking for the copies of one stream: one poller per stream, however many copies
 * are waited for. Copies on one stream finish in the order they were enqueued (CUDA stream order;
 * the emulated queue drains in order), so a tick queries the waiting copies oldest first and stops
 * at the first still running: while a batch of N copies runs, a tick makes about one query, not N.
 * (One poller per copy made N queries and N timers per tick; the embedded agent's CUDA IPC path
 * posts one copy per merged descriptor run, thousands per load of a TP2 producer into a TP1
 * consumer, see bench/cuda/README.md.) A few event-loop turns first, then every millisecond;
 * the turns start again whenever a copy finished.
 */
class StreamPoller {
  /** Queries of copies' completion made so far (tests and benches). */
  polls = 0;
  private readonly waiting: Array<{ done: () => boolean; resolve: () => void; reject: (e: unknown) => void }> = [];
  private running = false;

  /** Resolves once `done()` returned true; rejects if it threw. */
  wait(done: () => boolean): Promise<void> {
    return new Promise((resolve, reject) => {
      this.waiting.push({ done, resolve, reject });
      if (!this.running) {
        this.running = true;
        this.tick(0);
      }
    });
  }

  private tick(turns: number): void {
    let progressed = false;
    while (this.waiting.length > 0) {
      const w = this.waiting[0]!;
      let d: boolean;
      try {
        this.polls++;
        d = w.done();
      } catch (e) {
        this.waiting.shift();
        w.reject(e);
        progressed = true;
        continue;
      }
      if (!d) break;
      this.waiting.shift();
      w.resolve();
      progressed = true;
    }
    if (this.waiting.length === 0) {
      this.running = false;
      return;
    }
    const next = progressed ? 0 : turns + 1;
    if (next < 16) setImmediate(() => this.tick(next));
    else setTimeout(() => this.tick(next), 1);
  }
}

/** The {@link StreamPoller} of each device's stream of one device memory, with their poll count. */
class StreamPollers {
  private readonly byDevice = new Map<number, StreamPoller>();
  of(device: number): StreamPoller {
    let p = this.byDevice.get(device);
    if (!p) this.byDevice.set(device, (p = new StreamPoller()));
    return p;
  }
  /** Completion queries made so far, over all devices. */
  get polls(): number {
    let n = 0;
    for (const p of this.byDevice.values()) n += p.polls;
    return n;
  }
}

// ---------------------------------------------------------------------------------------------
// CUDA (the native addon)
// ---------------------------------------------------------------------------------------------

type AddonDevice = NativeDevice;

/** The addon's `device` bindings, or why there are none. */
function loadAddonDevice(): AddonDevice | string {
  const r = bindings('device');
  if (r.bindings) return r.bindings;
  return `${NO_CUDA_MESSAGE}: ${r.reason.startsWith('the native addon has no') ? 'this addon was built without CUDA' : r.reason}`;
}

/** This host's identity for CUDA IPC: the kernel boot id and the hostname. */
function cudaHostId(): string {
  let boot = 'unknown-boot';
  try {
    boot = readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim();
  } catch {
    /* not Linux: hostname only */
  }
  return `cuda:${boot}:${hostname()}`;
}

function addonError(e: unknown, what: string): DeviceMemoryError {
  const msg = e instanceof Error ? e.message : String(e);
  const code: DeviceMemoryErrorCode = e instanceof RangeError || e instanceof TypeError ? 'range' : /KVC_ENOCUDA/.test(msg) ? 'no-cuda' : what === 'openIpc' ? 'ipc' : 'cuda';
  return new DeviceMemoryError(code, code === 'no-cuda' ? `${NO_CUDA_MESSAGE}: ${msg}` : msg, { cause: e });
}

class CudaDeviceMemory implements DeviceMemory {
  readonly backend = 'cuda' as const;
  readonly hostId = cudaHostId();
  private readonly streams = new Map<number, bigint>();
  private readonly known = new Map<bigint, number>(); // allocations and mappings: base -> bytes
  private readonly pollers = new StreamPollers();
  constructor(private readonly d: AddonDevice) {}

  /** Completion queries of async copies made so far (one poller per stream: about one per tick, not one per copy). */
  get settlePolls(): number {
    return this.pollers.polls;
  }

  private call<T>(what: string, fn: () => T): T {
    try {
      return fn();
    } catch (e) {
      throw addonError(e, what);
    }
  }

  private stream(device: number): bigint {
    let s = this.streams.get(device);
    if (s === undefined) {
      s = this.call('streamCreate', () => this.d.streamCreate(device));
      this.streams.set(device, s);
    }
    return s;
  }

  alloc(device: number, bytes: number): DeviceMemoryRegion {
    checkDevice('alloc', device);
    checkBytes('alloc', bytes);
    const r = this.call('alloc', () => this.d.alloc(device, bytes));
    this.known.set(r.address, bytes);
    return Object.freeze({ kind: 'device' as const, device, address: r.address, bytes, ipcHandle: r.ipcHandle });
  }

  free(region: DeviceMemoryRegion): void {
    this.call('free', () => this.d.free(region.address));
    this.known.delete(region.address);
  }

  owns(address: bigint, bytes = 1): boolean {
    for (const [base, n] of this.known) if (address >= base && address + BigInt(bytes) <= base + BigInt(n)) return true;
    return false;
  }

  openIpc(device: number, handle: Uint8Array, bytes: number): bigint {
    checkDevice('openIpc', device);
    checkBytes('openIpc', bytes);
    if (!(handle instanceof Uint8Array) || handle.byteLength !== IPC_HANDLE_BYTES) throw new DeviceMemoryError('ipc', `an IPC handle is ${IPC_HANDLE_BYTES} bytes`);
    const a = this.call('openIpc', () => this.d.ipcOpen(device, handle, bytes));
    this.known.set(a, bytes);
    return a;
  }

  closeIpc(address: bigint): void {
    this.call('closeIpc', () => this.d.ipcClose(address));
  }

  allocHost(bytes: number): Uint8Array {
    checkBytes('allocHost', bytes);
    return this.call('allocHost', () => this.d.hostAlloc(bytes));
  }

  copyAsync(device: number, kind: CopyKind, dst: bigint | Uint8Array, src: bigint | Uint8Array, bytes: number): DeviceCopy {
    checkDevice('copyAsync', device);
    checkBytes('copyAsync', bytes);
    const c = this.call('copyAsync', () => this.d.copyAsync(device, kind, dst, src, bytes, this.stream(device)));
    const done = (): boolean => this.call('copy', () => c.done());
    const poller = this.pollers.of(device);
    return { done, settled: () => poller.wait(done), release: () => c.release() };
  }

  copy(device: number, kind: CopyKind, dst: bigint | Uint8Array, src: bigint | Uint8Array, bytes: number): void {
    checkDevice('copy', device);
    checkBytes('copy', bytes);
    this.call('copy', () => this.d.copy(device, kind, dst, src, bytes));
  }
}

let cudaInstance: CudaDeviceMemory | null = null;

/**
 * CUDA device memory through the addon (one instance per process, as the CUDA driver's state is).
 * @throws DeviceMemoryError `no-cuda` ({@link NO_CUDA_MESSAGE}) when the addon was built without CUDA.
 */
export function cudaDeviceMemory(): DeviceMemory {
  if (cudaInstance) return cudaInstance;
  const d = loadAddonDevice();
  if (typeof d === 'string') throw new DeviceMemoryError('no-cuda', d);
  cudaInstance = new CudaDeviceMemory(d);
  return cudaInstance;
}

// ---------------------------------------------------------------------------------------------
// Emulated (host memory)
// ---------------------------------------------------------------------------------------------

const EMU_MAGIC = Uint8Array.from([0x4b, 0x56, 0x43, 0x45, 0x4d, 0x55, 0x00, 0x01]); // "KVCEMU\0\1"
const EMU_BASE = 0x7e00_0000_0000n;
const EMU_ALIGN = 2n * 1024n * 1024n;

interface EmuEntry {
  readonly base: bigint;
  readonly bytes: number;
  readonly device: number;
  readonly mem: Uint8Array;
  readonly kind: 'alloc' | 'ipc';
  readonly id: number;
  readonly handle: Uint8Array | null; // allocations: their handle; mappings: the handle opened
  refs: number;
}

interface EmuCopy {
  readonly run: () => void;
  finished: boolean;
}

/**
 * Emulated device memory (see the module note). Also gives tests and the engine's
 * `cuda-emulated` mode host views of its memory ({@link hostView}).
 */
export class EmulatedDeviceMemory implements DeviceMemory {
  readonly backend = 'emulated' as const;
  /** Unique to this process (and instance): emulated IPC never crosses processes. */
  readonly hostId: string;
  private readonly token = randomBytes(16);
  private entries: EmuEntry[] = []; // sorted by base
  private next = EMU_BASE;
  private nextId = 1;
  private readonly staging = new WeakSet<ArrayBufferLike>();
  private readonly queues = new Map<number, EmuCopy[]>();
  private readonly pollers = new StreamPollers();
  /** Copies run so far (tests use it to see that a path copied through this layer). */
  copies = 0;

  /** Completion queries of async copies made so far (one poller per device queue: about one per tick, not one per copy). */
  get settlePolls(): number {
    return this.pollers.polls;
  }

  constructor() {
    this.hostId = `emulated:${hostname()}:${process.pid}:${this.token.toString('hex')}`;
  }

  private find(address: bigint, bytes: number, device?: number): EmuEntry | null {
    let lo = 0;
    let hi = this.entries.length - 1;
    let best = -1;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      if (this.entries[mid]!.base <= address) {
        best = mid;
        lo = mid + 1;
      } else hi = mid - 1;
    }
    if (best < 0) return null;
    const e = this.entries[best]!;
    if (address + BigInt(bytes) > e.base + BigInt(e.bytes)) return null;
    if (device !== undefined && e.device !== device) return null;
    return e;
  }

  private insert(e: EmuEntry): void {
    this.entries.push(e);
    this.entries.sort((a, b) => (a.base < b.base ? -1 : a.base > b.base ? 1 : 0));
  }

  private reserve(bytes: number): bigint {
    const base = this.next;
    this.next = ((base + BigInt(bytes) + EMU_ALIGN) / EMU_ALIGN + 1n) * EMU_ALIGN; // a guard gap after each
    return base;
  }

  alloc(device: number, bytes: number): DeviceMemoryRegion {
    checkDevice('alloc', device);
    checkBytes('alloc', bytes);
    const id = this.nextId++;
    const handle = new Uint8Array(IPC_HANDLE_BYTES);
    handle.set(EMU_MAGIC, 0);
    handle.set(this.token, 8);
    new DataView(handle.buffer).setUint32(24, id, true);
    handle.set(randomBytes(32), 32);
    const base = this.reserve(bytes);
    this.insert({ base, bytes, device, mem: new Uint8Array(bytes), kind: 'alloc', id, handle, refs: 0 });
    return Object.freeze({ kind: 'device' as const, device, address: base, bytes, ipcHandle: handle.slice() });
  }

  free(region: DeviceMemoryRegion): void {
    const i = this.entries.findIndex((e) => e.base === region.address && e.kind === 'alloc');
    if (i < 0) throw new DeviceMemoryError('range', `free: 0x${region.address.toString(16)} is not an allocation of this emulated device memory`);
    this.entries.splice(i, 1);
  }

  owns(address: bigint, bytes = 1): boolean {
    return this.find(address, bytes) !== null;
  }

  openIpc(device: number, handle: Uint8Array, bytes: number): bigint {
    checkDevice('openIpc', device);
    checkBytes('openIpc', bytes);
    if (!(handle instanceof Uint8Array) || handle.byteLength !== IPC_HANDLE_BYTES) throw new DeviceMemoryError('ipc', `an IPC handle is ${IPC_HANDLE_BYTES} bytes`);
    if (!timingSafeEqual(handle.subarray(0, 8), EMU_MAGIC)) throw new DeviceMemoryError('ipc', 'not an emulated IPC handle');
    if (!timingSafeEqual(handle.subarray(8, 24), this.token)) throw new DeviceMemoryError('ipc', 'an emulated IPC handle of another process: emulated device memory is process-local');
    const open = this.entries.find((e) => e.kind === 'ipc' && e.handle !== null && timingSafeEqual(e.handle, handle));
    if (open) {
      if (bytes > open.bytes) throw new DeviceMemoryError('range', 'openIpc: the handle is open with a smaller size');
      open.refs++;
      return open.base;
    }
    const id = new DataView(handle.buffer, handle.byteOffset).getUint32(24, true);
    const a = this.entries.find((e) => e.kind === 'alloc' && e.id === id);
    if (!a || !timingSafeEqual(a.handle!, handle)) throw new DeviceMemoryError('ipc', 'openIpc: no live allocation has this handle');
    if (a.device !== device) throw new DeviceMemoryError('ipc', `openIpc: the allocation is on device ${a.device}, not ${device}`);
    if (bytes > a.bytes) throw new DeviceMemoryError('range', `openIpc: ${bytes} bytes advertised but the allocation has ${a.bytes}`);
    const base = this.reserve(bytes);
    this.insert({ base, bytes, device, mem: a.mem.subarray(0, bytes), kind: 'ipc', id: a.id, handle: handle.slice(), refs: 1 });
    return base;
  }

  closeIpc(address: bigint): void {
    const i = this.entries.findIndex((e) => e.base === address && e.kind === 'ipc');
    if (i < 0) throw new DeviceMemoryError('range', `closeIpc: 0x${address.toString(16)} is not an IPC mapping`);
    if (--this.entries[i]!.refs === 0) this.entries.splice(i, 1);
  }

  allocHost(bytes: number): Uint8Array {
    checkBytes('allocHost', bytes);
    const b = new Uint8Array(bytes);
    this.staging.add(b.buffer);
    return b;
  }

  /** A live host view of `[address, address + bytes)` of emulated device memory (emulation only: tests and the engine's emulated mode). */
  hostView(address: bigint, bytes: number): Uint8Array {
    const e = this.find(address, bytes);
    if (!e) throw new DeviceMemoryError('range', `hostView: [0x${address.toString(16)}, +${bytes}) is not emulated device memory`);
    const off = Number(address - e.base);
    return e.mem.subarray(off, off + bytes);
  }

  private dev(what: string, address: bigint, bytes: number, device: number): Uint8Array {
    const e = this.find(address, bytes, device);
    if (!e) throw new DeviceMemoryError('range', `${what}: [0x${address.toString(16)}, +${bytes}) is not device memory of this emulated device memory on device ${device}`);
    const off = Number(address - e.base);
    return e.mem.subarray(off, off + bytes);
  }

  private host(what: string, buf: unknown, bytes: number, pinned: boolean): Uint8Array {
    if (!(buf instanceof Uint8Array)) throw new DeviceMemoryError('range', `${what}: the host side must be a Uint8Array`);
    if (bytes > buf.byteLength) throw new DeviceMemoryError('range', `${what}: bytes exceeds the host buffer`);
    if (pinned && !this.staging.has(buf.buffer)) throw new DeviceMemoryError('range', `${what}: the host side of an async copy must be a staging buffer of allocHost (pinned memory)`);
    return buf.subarray(0, bytes);
  }

  /** Resolves both sides to views (bounds-checked now, like the CUDA library at enqueue time). */
  private sides(what: string, device: number, kind: CopyKind, dst: unknown, src: unknown, bytes: number, pinned: boolean): [Uint8Array, Uint8Array] {
    checkDevice(what, device);
    checkBytes(what, bytes);
    if (kind === 'h2d') return [this.dev(what, dst as bigint, bytes, device), this.host(what, src, bytes, pinned)];
    if (kind === 'd2h') return [this.host(what, dst, bytes, pinned), this.dev(what, src as bigint, bytes, device)];
    if (kind === 'd2d') return [this.dev(what, dst as bigint, bytes, device), this.dev(what, src as bigint, bytes, device)];
    throw new DeviceMemoryError('range', `${what}: kind must be h2d, d2h or d2d`);
  }

  copyAsync(device: number, kind: CopyKind, dst: bigint | Uint8Array, src: bigint | Uint8Array, bytes: number): DeviceCopy {
    const [d, s] = this.sides('copyAsync', device, kind, dst, src, bytes, true);
    const c: EmuCopy = { run: () => d.set(s), finished: false };
    let q = this.queues.get(device);
    if (!q) this.queues.set(device, (q = []));
    q.push(c);
    if (q.length === 1) setImmediate(() => this.drain(device));
    const done = (): boolean => c.finished;
    const poller = this.pollers.of(device);
    return { done, settled: () => poller.wait(done), release: () => {} };
  }

  /** Runs a device's queued copies in order (the stream), one event-loop turn after they were enqueued. */
  private drain(device: number): void {
    const q = this.queues.get(device)!;
    const batch = q.splice(0);
    for (const c of batch) {
      c.run();
      c.finished = true;
      this.copies++;
    }
    if (q.length) setImmediate(() => this.drain(device));
  }

  copy(device: number, kind: CopyKind, dst: bigint | Uint8Array, src: bigint | Uint8Array, bytes: number): void {
    const [d, s] = this.sides('copy', device, kind, dst, src, bytes, false);
    d.set(s);
    this.copies++;
  }
}

let emulatedInstance: EmulatedDeviceMemory | null = null;

/**
 * The process's emulated device memory (one per process, standing in for the CUDA driver's
 * process-wide state, so that the engine's allocations and the agents' copies meet in one table).
 */
export function emulatedDeviceMemory(): EmulatedDeviceMemory {
  emulatedInstance ??= new EmulatedDeviceMemory();
  return emulatedInstance;
}

/**
 * The device memory that holds `address`: the emulated one when it knows the address, else CUDA.
 * @throws DeviceMemoryError `no-cuda` when the address is not emulated and there is no CUDA.
 */
export function deviceMemoryFor(address: bigint): DeviceMemory {
  if (emulatedInstance?.owns(address)) return emulatedInstance;
  return cudaDeviceMemory();
}

/** Where an engine allocates its KV cache: host memory, CUDA, or emulated device memory (CI). */
export type KVDeviceMode = 'cpu' | 'cuda' | 'cuda-emulated';

/**
 * The device memory of an engine device mode (null for `cpu`).
 * @throws DeviceMemoryError `no-cuda` for `cuda` without a CUDA build of the addon.
 */
export function deviceMemoryOf(mode: KVDeviceMode): DeviceMemory | null {
  if (mode === 'cpu') return null;
  if (mode === 'cuda-emulated') return emulatedDeviceMemory();
  if (mode === 'cuda') return cudaDeviceMemory();
  throw new DeviceMemoryError('range', `device mode must be cpu, cuda or cuda-emulated, got ${String(mode)}`);
}

/**
 * Host staging buffers of one {@link DeviceMemory} for the TCP path of device regions: buffers of
 * `chunkBytes` are reused (at most `keep` kept), larger ones are allocated for one use. A buffer
 * goes back only once no copy and no socket write uses it any more.
 */
export class StagingPool {
  private readonly free: Uint8Array[] = [];
  constructor(
    readonly dm: DeviceMemory,
    readonly chunkBytes: number,
    private readonly keep = 8,
  ) {}

  /** A staging buffer of at least `bytes` (its first `bytes` are returned as the view). */
  take(bytes: number): Uint8Array {
    if (bytes > this.chunkBytes) return this.dm.allocHost(bytes);
    return (this.free.pop() ?? this.dm.allocHost(this.chunkBytes)).subarray(0, bytes);
  }

  /** Returns a buffer of {@link take}. */
  give(buf: Uint8Array): void {
    if (buf.buffer.byteLength === this.chunkBytes && buf.byteOffset === 0 && this.free.length < this.keep) this.free.push(new Uint8Array(buf.buffer, 0, this.chunkBytes));
  }
}

/**
 * Copies `bytes` bytes at byte `offset` of a device region into a new host buffer (a synchronous
 * device-to-host copy through the {@link DeviceMemory} that holds the address: emulated or CUDA).
 * Used to localize a mismatch in device KV (`docs/localize.md`: fine sums of the mismatched
 * blocks only).
 * @throws DeviceMemoryError `range` when the range is outside the region; the copy's errors.
 */
export function readDeviceBytes(region: DeviceMemoryRegion, offset: number, bytes: number): Uint8Array {
  if (!Number.isSafeInteger(offset) || offset < 0 || !Number.isSafeInteger(bytes) || bytes < 0 || offset + bytes > region.bytes) throw new DeviceMemoryError('range', `read of ${bytes} bytes at ${offset} outside a device region of ${region.bytes} bytes`);
  const out = new Uint8Array(bytes);
  if (bytes > 0) deviceMemoryFor(region.address).copy(region.device, 'd2h', out, region.address + BigInt(offset), bytes);
  return out;
}
