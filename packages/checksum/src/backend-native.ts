/**
 * The `native` checksum backend: the C++ CPU kernel (`native/src/checksum_cpu.cc`) through the
 * N-API addon of `@kvconnect/native`. The addon is optional: where it was not built (no
 * compiler, no cmake) {@link loadNativeBackend} returns null and {@link nativeUnavailableReason}
 * says why, and callers fall back to the TypeScript backend.
 * @module
 */
import { addon as nativeAddon, loadError, type KvconnectNativeAddon, type NativeBytes } from '@kvconnect/native';
import { ENTRY_BYTES, ROW_WORDS, type ChecksumBackend, type PackedTables } from './backend.js';

/** The C ABI version (`KVC_ABI_VERSION`) this backend is written for. */
const ABI_VERSION = 1;

interface LoadState {
  readonly addon: KvconnectNativeAddon | null;
  readonly reason: string | null;
}

let state: LoadState | undefined;

/** Loads the addon once per process; never throws. */
function load(): LoadState {
  if (state) return state;
  try {
    const a = nativeAddon;
    if (!a) {
      state = { addon: null, reason: `the addon is not built or failed to load: ${loadError?.message ?? 'no reason given'}` };
    } else if (a.abiVersion !== ABI_VERSION || a.entryBytes !== ENTRY_BYTES || a.rowWords !== ROW_WORDS) {
      state = {
        addon: null,
        reason: `the addon's ABI (version ${a.abiVersion}, ${a.entryBytes}-byte entries, ${a.rowWords}-word rows) is not the expected ` +
          `(version ${ABI_VERSION}, ${ENTRY_BYTES}, ${ROW_WORDS}): rebuild it`,
      };
    } else if (typeof a.sumRows !== 'function') {
      state = { addon: null, reason: 'the addon has no sumRows function' };
    } else {
      state = { addon: a, reason: null };
    }
  } catch (e) {
    state = { addon: null, reason: `cannot load @kvconnect/native: ${e instanceof Error ? e.message : String(e)}` };
  }
  return state;
}

/**
 * The native CPU backend. `sumRows` checks `tables` (groupStart of `nGroups + 1` values) and
 * hands everything to the addon, which checks every entry and row before reading any memory.
 * @throws TypeError for arguments of the wrong type.
 * @throws RangeError for invalid tables or rows (the message names the entry or row); nothing is
 *   written to `out` then.
 */
function makeBackend(addon: KvconnectNativeAddon, threads = 1): ChecksumBackend {
  return {
    name: 'native',
    sumRows(tables: PackedTables, regions: readonly Uint8Array[], rows: Uint32Array, out: BigUint64Array): void {
      if (!(tables.groupStart instanceof Uint32Array) || tables.groupStart.length !== tables.nGroups + 1) {
        throw new RangeError(`groupStart must hold nGroups + 1 = ${tables.nGroups + 1} values, got ${tables.groupStart?.length}`);
      }
      addon.sumRows(tables.entries, tables.groupStart, Array.isArray(regions) ? regions : Array.from(regions), rows, out, threads);
    },
  };
}

let backend: ChecksumBackend | null | undefined;

/** Options of {@link loadNativeBackend}. */
export interface NativeBackendOptions {
  /**
   * Threads per `sumRows` call (integer in [1, 64], default 1): the calling thread plus pool threads
   * of the addon (`kvc_sum_rows_cpu_mt`; the sums equal the single-threaded ones exactly). For large
   * steps; small steps run on fewer threads (at most one per row).
   */
  threads?: number;
}

/**
 * The native CPU backend, or null when the addon is not available (then
 * {@link nativeUnavailableReason} says why). Loads the addon on the first call.
 * @throws RangeError for `threads` outside [1, 64] or not an integer.
 */
export function loadNativeBackend(options: NativeBackendOptions = {}): ChecksumBackend | null {
  const threads = options.threads ?? 1;
  if (!Number.isInteger(threads) || threads < 1 || threads > 64) throw new RangeError(`threads must be an integer in [1, 64], got ${threads}`);
  if (threads !== 1) {
    const { addon } = load();
    return addon ? makeBackend(addon, threads) : null;
  }
  if (backend === undefined) {
    const { addon } = load();
    backend = addon ? makeBackend(addon) : null;
  }
  return backend;
}

/**
 * The instruction set the native kernel's loop runs with (`avx512`, `avx2`, `generic`; chosen once
 * from the CPU, or the `KVC_CPU_ISA` environment variable), null without the addon.
 */
export function nativeCpuIsa(): string | null {
  return load().addon?.cpuIsa() ?? null;
}

/** Why {@link loadNativeBackend} returns null; null when the addon loaded. */
export function nativeUnavailableReason(): string | null {
  return load().reason;
}

/**
 * Plain wrapping sum of the little-endian uint64 words of `buf` in the addon (the baseline of
 * the kernel benchmarks); null when the addon is not available.
 * @throws TypeError if `buf` is not bytes; RangeError if its byte length is not a multiple of 8.
 */
export function plainSum64(buf: NativeBytes): bigint | null {
  const { addon } = load();
  return addon ? addon.plainSum64(buf) : null;
}

/**
 * `sum of x_j * (2j + 1) mod 2^64` over the little-endian uint64 words of `buf` in the addon (one
 * contiguous slice with m = 1, for benchmarks); null when the addon is not available.
 * @throws TypeError if `buf` is not bytes; RangeError if its byte length is not a multiple of 8.
 */
export function weightedSum64(buf: NativeBytes): bigint | null {
  const { addon } = load();
  return addon ? addon.weightedSum64(buf) : null;
}
