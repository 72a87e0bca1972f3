/**
 * The `cuda` checksum backend: the CUDA kernel (`native/cuda/`, C ABI
 * `native/include/kvc_checksum_cuda.h`) through the N-API addon of `@kvconnect/native`, built with
 * `KVC_WITH_CUDA` (`KVCONNECT_WITH_CUDA=1 npm ci`, or `npm run build:cuda -w @kvconnect/native`).
 *
 * It reads the same packed tables and rows as the host backends, but its regions are device
 * memory: `{ address: bigint, bytes: number }` per region (e.g. a tensor's `data_ptr()` and its
 * size). One {@link CudaChecksumBackend.submit} per engine step enqueues, on the caller's CUDA
 * stream, one kernel launch that sums every entry of every group for all rows (the rows travel in
 * the launch parameters, or in one pinned host-to-device copy when there are more than 128); the
 * results come back to pinned host memory on a side stream ordered after the kernel, so the step
 * never waits for the GPU. A reader polls {@link CudaChecksumBackend.query}
 * or awaits {@link CudaChecksumBackend.collectAsync}, which wait only on that step's copy.
 * Results are exact (uint64 arithmetic), bit-identical to the `ts` and `native` backends.
 *
 * Where the addon lacks CUDA, or there is no GPU, {@link loadCudaBackend} returns null and
 * {@link cudaUnavailableReason} says why.
 * @module
 */
import { addon as nativeAddon, loadError, type NativeCuda, type NativeCudaContext } from '@kvconnect/native';
import { ENTRY_BYTES, ROW_WORDS, type DeviceChecksumBackend, type DeviceChecksumProvider, type DeviceRegion, type PackedTables } from './backend.js';

export type { DeviceRegion } from './backend.js';

/** Options of a CUDA context (zero or absent: the default). */
export interface CudaBackendOptions {
  /** CUDA device index (default 0). */
  device?: number;
  /** Steps whose results can be in flight at once (default 8, at most 64). */
  slots?: number;
  /** Rows per step the pinned staging holds before it grows (default 4096). */
  maxRows?: number;
  /** Output values per step the staging holds before it grows (default 16384). */
  maxOut?: number;
  /** About the bytes one warp sums per work item (default 32768, 1024..1 MiB). */
  chunkBytes?: number;
}

/** A submitted step: pass it to query / wait / collect. */
export type CudaTicket = bigint;

/** The addon's `cuda` namespace (src/addon_cuda.cc), declared in native/index.d.ts. */
export type CudaBindings = NativeCuda;

interface LoadState {
  readonly cuda: CudaBindings | null;
  readonly reason: string | null;
}

let state: LoadState | undefined;

/** Loads the addon's CUDA bindings once per process and counts devices; never throws. */
function load(): LoadState {
  if (state) return state;
  try {
    const a = nativeAddon;
    const cuda = a?.cuda;
    if (!a) {
      state = { cuda: null, reason: `the native addon is not built or failed to load: ${loadError?.message ?? 'no reason given'}` };
    } else if (!a.withCuda || !cuda || typeof cuda.Context !== 'function') {
      state = {
        cuda: null,
        reason: 'the native addon was built without CUDA (rebuild with KVCONNECT_WITH_CUDA=1 npm ci, or npm run build:cuda -w @kvconnect/native, where nvcc is)',
      };
    } else if (a.entryBytes !== ENTRY_BYTES || a.rowWords !== ROW_WORDS) {
      state = { cuda: null, reason: `the addon's table layout (${a.entryBytes}-byte entries, ${a.rowWords}-word rows) is not this package's: rebuild it` };
    } else if (cuda.deviceCount() < 1) {
      const v = cuda.versions();
      state = { cuda: null, reason: `no CUDA device (runtime ${v.runtime}, driver ${v.driver}): ${cuda.probeError() || 'none found'}` };
    } else {
      state = { cuda, reason: null };
    }
  } catch (e) {
    state = { cuda: null, reason: `cannot load the CUDA bindings of @kvconnect/native: ${e instanceof Error ? e.message : String(e)}` };
  }
  return state;
}

/** Why {@link loadCudaBackend} returns null; null when CUDA is available. */
export function cudaUnavailableReason(): string | null {
  return load().reason;
}

/** The addon's CUDA bindings (device memory helpers for tests and tools), or null. */
export function cudaBindings(): CudaBindings | null {
  return load().cuda;
}

function regionArrays(regions: readonly DeviceRegion[]): [BigUint64Array, BigUint64Array] {
  const addrs = new BigUint64Array(regions.length);
  const bytes = new BigUint64Array(regions.length);
  regions.forEach((r, i) => {
    if (typeof r.address !== 'bigint' || r.address < 0n || r.address >= 1n << 64n) throw new TypeError(`regions[${i}].address must be a bigint device address`);
    if (!Number.isSafeInteger(r.bytes) || r.bytes < 0) throw new TypeError(`regions[${i}].bytes must be a non-negative safe integer`);
    addrs[i] = r.address;
    bytes[i] = BigInt(r.bytes);
  });
  return [addrs, bytes];
}

/**
 * A CUDA checksum context on one device: device tables (set once per table set), pinned staging,
 * a side stream and events. Not thread-safe; one per worker is the intended use.
 */
export class CudaChecksumBackend implements DeviceChecksumBackend {
  readonly kind = 'device' as const;
  readonly name = 'cuda' as const;
  readonly device: number;
  /** Submits whose results can be in flight at once (`options.slots`, default 8). */
  readonly slots: number;
  private ctx: NativeCudaContext | null;
  private tables: PackedTables | null = null;
  private regions: readonly DeviceRegion[] | null = null;

  /** @internal use {@link loadCudaBackend}. */
  constructor(cuda: CudaBindings, options: CudaBackendOptions = {}) {
    const { device = 0, ...rest } = options;
    this.device = device;
    this.slots = rest.slots || 8;
    this.ctx = new cuda.Context(device, rest);
  }

  private live(): NativeCudaContext {
    if (!this.ctx) throw new Error('the CUDA checksum backend is closed');
    return this.ctx;
  }

  /**
   * Validates the tables against the regions (like the CPU kernel: every entry's extent inside its
   * region) and uploads them. Call at cache registration; may wait for steps in flight.
   * @throws RangeError for invalid tables (the message names the entry); Error for a CUDA failure.
   */
  setTables(tables: PackedTables, regions: readonly DeviceRegion[]): void {
    if (!(tables.groupStart instanceof Uint32Array) || tables.groupStart.length !== tables.nGroups + 1) {
      throw new RangeError(`groupStart must hold nGroups + 1 = ${tables.nGroups + 1} values, got ${tables.groupStart?.length}`);
    }
    const [addrs, bytes] = regionArrays(regions);
    this.live().setTables(tables.entries, tables.groupStart, addrs, bytes);
    this.tables = tables;
    this.regions = regions;
  }

  /**
   * Enqueues one step on `stream` (a `cudaStream_t` as a bigint; `0n`: the legacy default stream)
   * after the work already on it: the KV the rows name must be written by then. Never waits for
   * the GPU (unless every slot still has a step in flight).
   * @param rows six uint32 per row (group, block id, first token, valid tokens, output offset, 0)
   * @param outLen values of the step's output (the rows' output offsets + columns index it)
   * @returns the ticket to query / collect
   * @throws RangeError for an invalid row (nothing is enqueued then)
   */
  submit(rows: Uint32Array, outLen: number, stream: bigint = 0n): CudaTicket {
    return this.live().submit(rows, outLen, stream);
  }

  /** True once the ticket's results are in host memory. */
  query(ticket: CudaTicket): boolean {
    return this.live().query(ticket);
  }

  /** Blocks the calling thread until the ticket's results are in host memory. */
  wait(ticket: CudaTicket): void {
    this.live().wait(ticket);
  }

  /**
   * Waits for the ticket, adds its results into `out` (length must be the submit's `outLen`) and
   * releases it. @throws RangeError for an unknown, expired or collected ticket.
   */
  collect(ticket: CudaTicket, out: BigUint64Array): void {
    this.live().collect(ticket, out);
  }

  /** {@link collect} without blocking the event loop: polls {@link query} until the copy is done. */
  async collectAsync(ticket: CudaTicket, out: BigUint64Array): Promise<void> {
    while (!this.query(ticket)) await new Promise<void>((resolve) => setImmediate(resolve));
    this.collect(ticket, out);
  }

  /**
   * The host backends' call shape on device regions: uploads the tables when they or the regions
   * changed, submits, and collects (adds into `out`) before returning.
   */
  sumRows(tables: PackedTables, regions: readonly DeviceRegion[], rows: Uint32Array, out: BigUint64Array, stream: bigint = 0n): void {
    if (tables !== this.tables || regions !== this.regions) this.setTables(tables, regions);
    this.collect(this.submit(rows, out.length, stream), out);
  }

  /** Frees the context (waits for its steps in flight). Further calls throw. */
  close(): void {
    this.ctx?.close();
    this.ctx = null;
  }
}

/**
 * A CUDA checksum backend on `options.device` (default 0), or null when CUDA is not available
 * (then {@link cudaUnavailableReason} says why). Creating it warms the kernel up, so the first
 * step neither compiles nor allocates.
 * @throws Error when the device exists but the context cannot be created (a CUDA error).
 */
export function loadCudaBackend(options: CudaBackendOptions = {}): CudaChecksumBackend | null {
  const { cuda } = load();
  return cuda ? new CudaChecksumBackend(cuda, options) : null;
}

/**
 * The `cuda` {@link DeviceChecksumProvider}: a {@link CudaChecksumBackend} per context, with
 * `options` (the device comes from the caller). @throws Error naming {@link cudaUnavailableReason}
 * when CUDA is not available.
 */
export function cudaDeviceProvider(options: Omit<CudaBackendOptions, 'device'> = {}): DeviceChecksumProvider {
  return {
    kind: 'device-provider',
    name: 'cuda',
    createContext(device: number): DeviceChecksumBackend {
      const b = loadCudaBackend({ ...options, device });
      if (!b) throw new Error(`the cuda checksum backend is not available: ${cudaUnavailableReason()}`);
      return b;
    },
  };
}

/**
 * Synchronizing CUDA calls the checksum library made so far in this process (see
 * {@link CudaBindings.syncCallCount}); null without CUDA or with an addon that lacks the counter.
 */
export function cudaSyncCallCount(): number | null {
  const c = load().cuda;
  return c && typeof c.syncCallCount === 'function' ? c.syncCallCount() : null;
}
