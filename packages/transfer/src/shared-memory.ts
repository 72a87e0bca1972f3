/**
 * Host memory in shared mappings: the same-host data plane of the embedded agent.
 *
 * Host KV memory allocated here lives in memfd mappings of the native addon (native/src/addon_shm.cc,
 * `exports.shm`): ordinary host bytes for the engine, and, when the embedded agent registers them,
 * advertised in its metadata (memfd name and descriptor, mapping size, offset, grant word) with a
 * {@link sameHostKey}. A peer on the same host (same key) maps the mapping through
 * `/proc/<pid>/fd/<fd>` after its authenticated handshake with the agent and copies directly
 * (`embedded.ts`, "Same-host host memory"); others, and memory allocated elsewhere, use the TCP path.
 *
 * {@link SharedHostArena} hands out page-aligned slices of mappings of at least `chunkBytes`
 * (64 MiB by default), so that an engine with many KV regions holds few descriptors. Where the
 * addon has no shm bindings (not Linux, not built) it hands out ordinary heap memory.
 * @module
 */
import { readFileSync, readlinkSync } from 'node:fs';
import { bindings, type NativeShm, type NativeShmInfo } from '@kvconnect/native';

/** The addon's shm bindings, or why there are none. */
export function sharedMemoryBindings(): { readonly shm: NativeShm | null; readonly reason: string } {
  const r = bindings('shm', 'shared-memory');
  return { shm: r.bindings, reason: r.reason };
}

/**
 * Where this process is, for the same-host data plane: the kernel boot id
 * (`/proc/sys/kernel/random/boot_id`) and this process's PID namespace (`/proc/self/ns/pid`): two
 * processes with equal keys name each other by the same pid in `/proc/<pid>/fd` (network
 * namespaces do not matter; a process whose `/proc` shows another PID namespace fails the addon's
 * memfd check and falls back to TCP). Null when either cannot be read (not Linux).
 */
export function sameHostKey(): string | null {
  try {
    const boot = readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim();
    return `${boot}:${readlinkSync('/proc/self/ns/pid')}`;
  } catch {
    return null;
  }
}

/** Where one of this process's shared mappings holds `view` (`shm.lookup`), or null (heap memory, or no shm bindings). */
export function lookupShared(view: Uint8Array): NativeShmInfo | null {
  const { shm } = sharedMemoryBindings();
  return shm ? shm.lookup(view) : null;
}

const PAGE = 4096;

/**
 * Allocates host memory from shared mappings (or the heap where there are none), for one owner
 * (an engine worker): no state is shared between arenas.
 */
export class SharedHostArena {
  private chunk: Uint8Array | null = null;
  private used = 0;
  /** Whether allocations come from shared mappings (false: the heap, see {@link reason}). */
  readonly shared: boolean;
  /** Why allocations come from the heap ('' when shared). */
  readonly reason: string;
  private readonly shm: NativeShm | null;

  /**
   * @param options.chunkBytes bytes of each mapping (default 64 MiB); a larger allocation gets its own.
   * @param options.shared false: always the heap.
   */
  constructor(private readonly options: { readonly chunkBytes?: number; readonly shared?: boolean } = {}) {
    const { shm, reason } = options.shared === false ? { shm: null, reason: 'disabled' } : sharedMemoryBindings();
    this.shm = shm;
    this.shared = shm !== null;
    this.reason = shm ? '' : reason;
  }

  /**
   * `bytes` zeroed bytes, page-aligned within their mapping.
   * @throws RangeError for a negative or unsafe size; NativeError `shm` when the mapping cannot be made.
   */
  alloc(bytes: number): Uint8Array {
    if (!Number.isSafeInteger(bytes) || bytes < 0) throw new RangeError(`SharedHostArena.alloc: bytes must be a non-negative safe integer, got ${bytes}`);
    if (!this.shm || bytes === 0) return new Uint8Array(bytes);
    const chunkBytes = this.options.chunkBytes ?? 64 * 1024 * 1024;
    if (bytes >= chunkBytes) return new Uint8Array(this.shm.alloc(bytes));
    if (!this.chunk || this.used + bytes > this.chunk.byteLength) {
      this.chunk = new Uint8Array(this.shm.alloc(chunkBytes));
      this.used = 0;
    }
    const v = this.chunk.subarray(this.used, this.used + bytes);
    this.used = Math.ceil((this.used + bytes) / PAGE) * PAGE;
    return v;
  }
}
