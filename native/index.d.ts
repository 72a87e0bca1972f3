/**
 * Types of the kvconnect native addon (src/addon.cc over include/kvc_checksum.h).
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
  /** Bindings added by the CUDA build (src/addon_cuda.cc) when `withCuda` is true. */
  readonly [binding: string]: unknown;
}

/** The addon, or null when it was not built or failed to load (see {@link loadError}). */
export declare const addon: KvconnectNativeAddon | null;
/** Why {@link addon} is null; null when it loaded. */
export declare const loadError: Error | null;
/** The `KVC_ABI_VERSION` this package expects of the addon. */
export declare const EXPECTED_ABI_VERSION: number;
