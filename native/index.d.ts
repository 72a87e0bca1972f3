/**
 * Types of the kvconnect native addon, its whole surface in one file: the checksum functions
 * (src/addon.cc over include/kvc_checksum.h), NIXL (src/nixl_addon.cc), Mooncake
 * (src/mooncake_addon.cc), shared host memory (src/addon_shm.cc), and, in CUDA builds, the CUDA
 * kernel (src/addon_cuda.cc) and device memory (src/addon_device.cc). index.cjs is the one loader.
 * @module
 */

/** Bytes the addon accepts as memory: any TypedArray, DataView, ArrayBuffer or SharedArrayBuffer. */
export type NativeBytes = ArrayBufferView | ArrayBuffer | SharedArrayBuffer;

/** The functions and constants the addon exports. */
export interface KvconnectNativeAddon {
  /** `KVC_ABI_VERSION` the addon was built with. */
  readonly abiVersion: number;
  /** Bytes of one `kvc_entry` (128). */
  readonly entryBytes: number;
  /** uint32 words of one `kvc_row` (6). */
  readonly rowWords: number;
  /** True iff the addon was compiled with `KVC_WITH_CUDA` (the CUDA bindings are then present). */
  readonly withCuda: boolean;
  /**
   * Sums rows on the CPU (`kvc_sum_rows_cpu_mt`; `threads` default 1): for every row and every entry of its group, adds
   * the entry's contributions into `out[row.out_offset + entry.column]` (mod 2^64).
   * `groupStart` holds nGroups + 1 values, `groupStart[0] === 0` and the last one equals the
   * number of entries (`entries.byteLength / 128`); `rows.length` is a multiple of 6.
   * @throws TypeError for an argument of the wrong type.
   * @throws RangeError for a size that does not fit, an invalid entry (message names `entries[i]`),
   *   an entry reaching outside its region, or an invalid row (`rows[i]`: group, block id,
   *   valid tokens, output index). Nothing is written then.
   */
  sumRows(entries: Uint8Array, groupStart: Uint32Array, regions: readonly NativeBytes[], rows: Uint32Array, out: BigUint64Array, threads?: number): void;
  /**
   * {@link sumRows} off the JS thread (a libuv worker drives the kernel's thread pool,
   * `kvc_sum_rows_cpu_mt`): argument errors throw at once, a failed kernel check rejects with a
   * RangeError (nothing written). The buffers must not change until the promise settles.
   * `threads`: integer in [1, 64] (default 1); the result equals the single-threaded one exactly.
   */
  sumRowsAsync(entries: Uint8Array, groupStart: Uint32Array, regions: readonly NativeBytes[], rows: Uint32Array, out: BigUint64Array, threads?: number): Promise<void>;
  /** The instruction set of the CPU kernel's loop: `avx512`, `avx2` or `generic` (`kvc_cpu_isa`). */
  cpuIsa(): 'avx512' | 'avx2' | 'generic';
  /** Chooses it (`auto` = AVX2, else AVX-512, else generic); false when this CPU cannot run `name` (unchanged then). */
  setCpuIsa(name: 'auto' | 'avx512' | 'avx2' | 'generic'): boolean;
  /** {@link plainSum64} on `threads` threads (the multi-core read baseline, `kvc_plain_sum64_mt`). */
  plainSum64Parallel(buf: NativeBytes, threads: number): bigint;
  /**
   * `[lo, hi)`: the byte offsets (relative to its region) entry `index` of `entries` can read for
   * any block id below its `num_blocks` (`kvc_entry_extent`).
   * @throws TypeError for arguments of the wrong type; RangeError for an index out of range or an
   *   invalid entry.
   */
  entryExtent(entries: Uint8Array, index: number): [bigint, bigint];
  /**
   * Plain wrapping sum of the little-endian uint64 words of `buf` (benchmark baseline).
   * @throws RangeError when `buf.byteLength` is not a multiple of 8.
   */
  plainSum64(buf: NativeBytes): bigint;
  /**
   * `sum of x_j * (2j + 1) mod 2^64` over the little-endian uint64 words of `buf`.
   * @throws RangeError when `buf.byteLength` is not a multiple of 8.
   */
  weightedSum64(buf: NativeBytes): bigint;
  /** NIXL's C API loaded at run time (src/nixl_addon.cc); every build has it. */
  readonly transfer?: NativeNixl;
  /** The Mooncake Transfer Engine's C API loaded at run time (src/mooncake_addon.cc); every build has it. */
  readonly mooncake?: NativeMooncake;
  /** Host memory in shared mappings (src/addon_shm.cc); Linux builds only. */
  readonly shm?: NativeShm;
  /** The CUDA checksum kernel and device helpers (src/addon_cuda.cc); CUDA builds only (`withCuda`). */
  readonly cuda?: NativeCuda;
  /** Device memory for the transfer agents (src/addon_device.cc over include/kvc_device.h); CUDA builds only. */
  readonly device?: NativeDevice;
}

/**
 * A failed native call, the one error shape of the addon's NIXL, Mooncake and shared-memory
 * bindings (index.cjs wraps them): argument errors are TypeError / RangeError instead.
 */
export declare class NativeError extends Error {
  readonly name: 'NativeError';
  /** Which bindings failed. */
  readonly backend: 'nixl' | 'mooncake' | 'shm';
  /**
   * The native status: `nixl_capi_status_t` (negative, see NIXL_STATUS of @kvconnect/transfer) for
   * `nixl`; the Transfer Engine's return code for `mooncake`; errno for `shm`; -1 when the
   * failure carried none (e.g. an exception inside the addon).
   */
  readonly status: number;
  constructor(backend: NativeError['backend'], status: number, message: string, options?: { cause?: unknown });
}

/** The result of a library search (`nixlLoad`, `mooncake.load`): the path that loaded, or every path tried and why it failed. */
export interface NativeLibraryLoad {
  readonly ok: boolean;
  readonly path: string | null;
  readonly tried: string[];
}

/** `exports.transfer`: NIXL (`libnixl_capi.so`) through dlopen (src/nixl_addon.cc). */
export interface NativeNixl {
  /** Loads the first candidate path that opens (once per path per process). */
  nixlLoad(candidates: string[]): NativeLibraryLoad;
  /** The virtual address of a view's first byte (registration by address). */
  addressOf(view: ArrayBufferView): number;
  NixlAgentCore: new (
    libPath: string,
    name: string,
    config: { backend: string; params: string[]; progressThread: boolean; progressDelayUs: number; pollUs: number; idlePollUs: number },
    /** A posted transfer ended: its id and `nixl_capi_status_t` (0 success). */
    onStatus: (xferId: number, code: number) => void,
  ) => NixlAgentCore;
}

/**
 * One NIXL agent; every call runs on the agent's native thread. Promises reject with a
 * {@link NativeError} `nixl` whose `status` is the `nixl_capi_status_t`. Descriptor lists are
 * Float64Array triples `[addr, length, deviceId]`; memory types 0 DRAM, 1 VRAM; ops 0 READ, 1 WRITE.
 */
export interface NixlAgentCore {
  init(): Promise<void>;
  registerMem(memType: number, descs: Float64Array): Promise<void>;
  deregisterMem(memType: number, descs: Float64Array): Promise<void>;
  getLocalMd(): Promise<Buffer>;
  /** @returns the remote agent's name. */
  loadRemoteMd(md: Uint8Array): Promise<string>;
  invalidateRemoteMd(name: string): Promise<void>;
  /** @returns the prepared list's id (remote lists: `agent` non-empty). */
  prepDlist(agent: string, memType: number, descs: Float64Array): Promise<number>;
  releaseDlist(id: number): Promise<void>;
  /** @returns the transfer request's id. */
  makeXfer(op: number, localId: number, localIdx: Int32Array, remoteId: number, remoteIdx: Int32Array, notif: Uint8Array | null): Promise<number>;
  /** @returns the post's status (0 done, 1 in progress, negative failed). */
  post(id: number, notif: Uint8Array | null): Promise<number>;
  /** @returns the release's status. */
  releaseXfer(id: number): Promise<number>;
  genNotif(remote: string, msg: Uint8Array): Promise<void>;
  /** Notifs received since the last call, flat: `[sender, payload, sender, payload, ...]`. */
  takeNotifs(): Array<string | Buffer>;
  close(): Promise<void>;
}

/** `exports.mooncake`: the Transfer Engine (`libtransfer_engine.so`) through dlopen (src/mooncake_addon.cc). */
export interface NativeMooncake {
  load(candidates: string[]): NativeLibraryLoad & { readonly hasNoCache: boolean };
  addressOf(view: ArrayBufferView): number;
  MooncakeEngineCore: new (
    libPath: string,
    config: { metadata: string; serverName: string; autoDiscover: boolean; pollUs: number; idlePollUs: number },
    /** A batch ended: its id, the final task status (`STATUS_*`, negative when polling failed) and the return code. */
    onStatus: (xferId: number, status: number, rc: number) => void,
  ) => MooncakeEngineCore;
}

/**
 * One Transfer Engine; calls run on the engine's native thread. Promises reject with a
 * {@link NativeError} `mooncake` whose `status` is the engine's return code. Entries are
 * Float64Array triples `[localAddr, remoteAddr, length]`; opcodes 0 READ, 1 WRITE.
 */
export interface MooncakeEngineCore {
  /** @returns the segment name (`ip:port`). */
  init(): Promise<string>;
  registerMem(addr: number, length: number, location: string): Promise<void>;
  unregisterMem(addr: number): Promise<void>;
  /** @returns the segment id. */
  openSegment(name: string, refresh: boolean): Promise<number>;
  /** @returns the batch id (its end is reported through `onStatus`). */
  submit(opcode: number, segmentId: number, entries: Float64Array, notifyName: string | null, notifyMsg: string | null): Promise<number>;
  abandon(id: number): Promise<void>;
  genNotify(segmentId: number, name: string, msg: string): Promise<void>;
  takeNotifs(): Array<string | Buffer>;
  close(): Promise<void>;
}

/** Where one of this process's shared mappings holds a view (`shm.lookup`). */
export interface NativeShmInfo {
  /** The memfd's descriptor in this process (peers open `/proc/<pid>/fd/<fd>`). */
  readonly fd: number;
  /** The memfd's name, `kvc-` and 32 hex digits. */
  readonly name: string;
  /** Bytes of the whole mapping: the header page and the data. */
  readonly size: number;
  /** Byte offset of the view's first byte from the mapping's start (header included). */
  readonly offset: number;
}

/**
 * `exports.shm`: host memory in memfd mappings other processes of the host can map
 * (src/addon_shm.cc). Each mapping is a header page (uint32 grant word at byte 0) followed by
 * the data; mappings are unmapped when their ArrayBuffer is collected. Failures of system calls
 * throw a {@link NativeError} `shm` with errno as `status`.
 */
export interface NativeShm {
  /** Bytes of the header page before the data (4096). */
  readonly headerBytes: number;
  /** A new zeroed mapping of `bytes` data bytes, as an external ArrayBuffer over its data. */
  alloc(bytes: number): ArrayBuffer;
  /** The mapping of this process that holds all of `view`, or null. */
  lookup(view: ArrayBufferView | ArrayBuffer): NativeShmInfo | null;
  /** Sets the grant word of the mapping holding `view` (0: no peer may access it). @throws RangeError when none does. */
  setGrant(view: ArrayBufferView | ArrayBuffer, value: number): void;
  /**
   * Maps all `bytes` (header included) of the memfd named `name` that `path` opens (e.g.
   * `/proc/<pid>/fd/<fd>`).
   * @throws RangeError when what opened is not that memfd, not sealed against shrinking
   *   (`alloc` seals its memfds, so that no owner can truncate one under a peer's mapping), or not
   *   exactly `bytes` long.
   */
  map(path: string, bytes: number, name: string): ArrayBuffer;
}

/** The CUDA checksum kernel's per-device context (src/addon_cuda.cc `Context`). */
export interface NativeCudaContext {
  readonly device: number;
  setTables(entries: Uint8Array, groupStart: Uint32Array, regionAddrs: BigUint64Array, regionBytes: BigUint64Array): void;
  submit(rows: Uint32Array, outLen: number, stream: bigint): bigint;
  query(ticket: bigint): boolean;
  wait(ticket: bigint): void;
  collect(ticket: bigint, out: BigUint64Array): void;
  close(): void;
}

/** Options of a CUDA checksum context (zero or absent: the default). */
export interface NativeCudaContextOptions {
  /** Steps whose results can be in flight at once (default 8, at most 64). */
  slots?: number;
  /** Rows per step the pinned staging holds before it grows (default 4096). */
  maxRows?: number;
  /** Output values per step the staging holds before it grows (default 16384). */
  maxOut?: number;
  /** About the bytes one warp sums per work item (default 32768, 1024..1 MiB). */
  chunkBytes?: number;
}

/** `exports.cuda` (src/addon_cuda.cc): errors are Error / RangeError whose message ends with the `KVC_E*` code. */
export interface NativeCuda {
  deviceCount(): number;
  probeError(): string;
  versions(): { runtime: number; driver: number };
  Context: new (device: number, options?: NativeCudaContextOptions) => NativeCudaContext;
  devAlloc(device: number, bytes: number): bigint;
  devFree(device: number, address: bigint): void;
  copyToDevice(device: number, address: bigint, bytes: Uint8Array): void;
  copyToHost(device: number, address: bigint, out: Uint8Array): void;
  /**
   * Synchronizing CUDA calls the library made so far in this process (`kvc_cuda_sync_calls`,
   * native/include/kvc_checksum_cuda.h); absent in an addon built before it existed.
   */
  syncCallCount?(): number;
}

/** Copy directions of {@link NativeDevice.copyAsync}. */
export type NativeCopyKind = 'h2d' | 'd2h' | 'd2d';

/** One enqueued device copy (src/addon_device.cc `DeviceCopy`). */
export interface NativeDeviceCopy {
  done(): boolean;
  wait(): void;
  release(): void;
}

/** `exports.device` (src/addon_device.cc over include/kvc_device.h): errors are RangeError, or Error whose message ends `(KVC_ECUDA)` / `(KVC_ENOCUDA)`. */
export interface NativeDevice {
  readonly ipcHandleBytes: number;
  alloc(device: number, bytes: number): { address: bigint; ipcHandle: Uint8Array };
  free(address: bigint): void;
  ipcOpen(device: number, handle: Uint8Array, bytes: number): bigint;
  ipcClose(address: bigint): void;
  adopt(device: number, address: bigint, bytes: number): void;
  unadopt(address: bigint): void;
  hostAlloc(bytes: number): Uint8Array;
  streamCreate(device: number): bigint;
  streamDestroy(stream: bigint): void;
  copyAsync(device: number, kind: NativeCopyKind, dst: bigint | Uint8Array, src: bigint | Uint8Array, bytes: number, stream?: bigint): NativeDeviceCopy;
  copy(device: number, kind: NativeCopyKind, dst: bigint | Uint8Array, src: bigint | Uint8Array, bytes: number): void;
}

/** The addon's bindings under `key`, or why there are none (`bindings()` of index.cjs). */
export type NativeBindings<K extends 'transfer' | 'mooncake' | 'shm' | 'cuda' | 'device'> =
  | { readonly bindings: NonNullable<KvconnectNativeAddon[K]>; readonly reason: '' }
  | { readonly bindings: null; readonly reason: string };

/**
 * The addon's `key` bindings, or why there are none (addon not built or stale, or built without them).
 * @param what how a missing `key` is named in the reason (default `key`).
 */
export declare function bindings<K extends 'transfer' | 'mooncake' | 'shm' | 'cuda' | 'device'>(key: K, what?: string): NativeBindings<K>;

/** The addon, or null when it was not built or failed to load (see {@link loadError}). */
export declare const addon: KvconnectNativeAddon | null;
/** Why {@link addon} is null; null when it loaded. */
export declare const loadError: Error | null;
/** The `KVC_ABI_VERSION` this package expects of the addon. */
export declare const EXPECTED_ABI_VERSION: number;

// ---------------------------------------------------------------------------------------------
// Forward-pass kernels of the reference engine (src/forward_addon.cc over src/forward_isa.h; used
// by packages/engine/src/model/native-forward.ts). float32 operands, float64 sums in index order;
// every instruction set gives the same bits. Sizes are element counts; a size that does not fit
// its array throws a RangeError and writes nothing, a wrong type a TypeError.
// ---------------------------------------------------------------------------------------------
export interface KvconnectNativeAddon {
  /** `y[t*yStride + r] = fround(sum_i w[r*cols + i] * x[t*xStride + i])` for r < rows, t < T; with `residual`, `y = fround(y + that)`. */
  fwdMatmul(w: Float32Array, rows: number, cols: number, x: Float32Array, xStride: number, T: number, y: Float32Array, yStride: number, residual: boolean): void;
  /** The SwiGLU MLP block of `T` rows of `h` (`[T, H]`, in place): rmsNorm(norm), gate/up `[I, H]`, down `[H, I]`, residual add. */
  fwdMlp(h: Float32Array, T: number, H: number, norm: Float32Array, gate: Float32Array, up: Float32Array, down: Float32Array, I: number): void;
  /**
   * One query head's causal softmax attention for `n` tokens at positions `start..`: query row j at
   * `q[j*qStride]` (rotated), keys/values `[position, hd]` from position 0, `window` tokens (0: all);
   * output row j at `out[j*outStride]` (`hd` floats).
   */
  fwdAttend(q: Float32Array, qStride: number, n: number, k: Float32Array, v: Float32Array, hd: number, start: number, window: number, scale: number, out: Float32Array, outStride: number): void;
  /**
   * RoPE (packages/engine/src/model/weights.ts applyRope) in place on `heads` heads (`dim` wide) of
   * `T` rows of `x` (row stride `stride`), row t's angles at `cos`/`sin[tableOffset + t*dim/2 ..]`.
   */
  fwdRope(x: Float32Array, stride: number, T: number, heads: number, dim: number, cos: Float64Array, sin: Float64Array, tableOffset: number): void;
  /**
   * KV cache rows out of float32: row i (`src[i*hd ..]`, `hd` elements) as `dtype` (little-endian,
   * round to nearest even, as packages/engine/src/dtype.ts writeElem) at byte `addr[i]` of `mem`.
   * Every row must fit in `mem` (RangeError, nothing written).
   */
  fwdKvWrite(mem: Uint8Array, addr: Float64Array, dtype: 'float32' | 'bfloat16' | 'float16', hd: number, src: Float32Array): void;
  /** KV cache rows into float32 (dtype.ts readElem): `dst[i*hd + d]` = element d of the row at byte `addr[i]` of `mem`. */
  fwdKvRead(mem: Uint8Array, addr: Float64Array, dtype: 'float32' | 'bfloat16' | 'float16', hd: number, dst: Float32Array): void;
  /** `y[i] = Math.exp(x[i])` bit for bit (fdlibm, as V8), through the vector kernel. */
  fwdExp(x: Float64Array, y: Float64Array): void;
  /** `y[i] = softmaxExp(x[i])` bit for bit (packages/engine/src/model/softmax-exp.ts: the softmax's float32 exponential), through the vector kernel. */
  fwdSoftmaxExp(x: Float64Array, y: Float64Array): void;
  /** The instruction set of the forward kernels: `avx512`, `avx2` or `generic`. */
  forwardIsa(): 'avx512' | 'avx2' | 'generic';
  /** Chooses it (`auto` = the widest this CPU runs); false when this CPU cannot run `name` (unchanged then). */
  setForwardIsa(name: 'auto' | 'avx512' | 'avx2' | 'generic'): boolean;
}
