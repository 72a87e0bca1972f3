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
import { readdirSync, readFileSync, readlinkSync } from 'node:fs';
import { endianness } from 'node:os';
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

/**
 * Whether process `pid` (of this host and PID namespace: `sameHostKey`) holds the far end of
 * `socket`, a connected TCP socket of this process: the socket whose local address and port are
 * our remote ones and whose remote address and port are our local ones in `/proc/<pid>/net/tcp`
 * and `tcp6` (the table of that process's network namespace, `proc(5)`; IPv4 and IPv4-mapped IPv6
 * compare equal) must be one of `/proc/<pid>/fd` (`socket:[inode]`). Ports alone do not bind: a
 * process that holds a socket with the same port pair between other addresses is not the far end
 * (a peer that translates addresses, NAT, therefore falls back to TCP).
 * It binds a peer's advertised shared mappings (`/proc/<pid>/fd/<n>`) to the process that
 * answered the authenticated handshake on `socket`: another agent that re-advertises the
 * mappings of a process it is not fails it. False when anything cannot be read (another user's
 * process, not Linux) or the socket is not connected.
 */
export function processHoldsPeerSocket(
  pid: number,
  socket: { readonly localPort?: number; readonly remotePort?: number; readonly localAddress?: string; readonly remoteAddress?: string },
): boolean {
  const mine = socket.localPort;
  const theirs = socket.remotePort;
  const mineAt = socket.localAddress === undefined ? null : ipBytes(socket.localAddress);
  const theirsAt = socket.remoteAddress === undefined ? null : ipBytes(socket.remoteAddress);
  if (!Number.isInteger(pid) || pid <= 0 || !mine || !theirs || mineAt === null || theirsAt === null) return false;
  try {
    const port = (a: string) => parseInt(a.slice(a.lastIndexOf(':') + 1), 16);
    // Addresses too, not only ports: another socket of `pid` with the same port pair between other
    // addresses (e.g. 127.0.0.3:ourPort -> 127.0.0.1:theirPort) is not the far end of `socket`.
    const at = (a: string, want: Uint8Array) => {
      const b = procIpBytes(a.slice(0, a.lastIndexOf(':')));
      return b !== null && b.every((x, i) => x === want[i]);
    };
    const inodes = new Set<string>();
    for (const table of ['tcp', 'tcp6']) {
      let text: string;
      try {
        text = readFileSync(`/proc/${pid}/net/${table}`, 'utf8');
      } catch {
        continue;
      }
      for (const line of text.split('\n').slice(1)) {
        const f = line.trim().split(/\s+/);
        if (f.length > 9 && port(f[1]!) === theirs && port(f[2]!) === mine && at(f[1]!, theirsAt) && at(f[2]!, mineAt)) inodes.add(f[9]!);
      }
    }
    if (inodes.size === 0) return false;
    for (const fd of readdirSync(`/proc/${pid}/fd`)) {
      let link: string;
      try {
        link = readlinkSync(`/proc/${pid}/fd/${fd}`);
      } catch {
        continue;
      }
      const m = /^socket:\[(\d+)\]$/.exec(link);
      if (m && inodes.has(m[1]!)) return true;
    }
    return false;
  } catch {
    return false;
  }
}

/**
 * An IP address as Node prints it (`net.Socket` `localAddress` / `remoteAddress`: dotted IPv4,
 * IPv6 with `::` and an optional dotted tail or `%scope`) as 16 bytes, IPv4 as IPv4-mapped
 * IPv6 (`::ffff:a.b.c.d`, RFC 4291 section 2.5.5.2); null when it is not an address.
 */
function ipBytes(text: string): Uint8Array | null {
  const out = new Uint8Array(16);
  const ip = text.replace(/%.*$/, '');
  const v4 = (t: string, o: number): boolean => {
    const p = t.split('.');
    if (p.length !== 4 || !p.every((x) => /^\d{1,3}$/.test(x) && Number(x) <= 255)) return false;
    p.forEach((x, i) => (out[o + i] = Number(x)));
    return true;
  };
  if (!ip.includes(':')) {
    out[10] = out[11] = 0xff;
    return v4(ip, 12) ? out : null;
  }
  const halves = ip.split('::');
  if (halves.length > 2) return null;
  const groups = (h: string) => (h === '' ? [] : h.split(':'));
  const head = groups(halves[0]!);
  const tail = halves.length === 2 ? groups(halves[1]!) : [];
  const last = (halves.length === 2 ? tail : head).at(-1);
  let words = 8;
  if (last !== undefined && last.includes('.')) {
    if (!v4(last, 12)) return null;
    (halves.length === 2 ? tail : head).pop();
    words = 6;
  }
  if (halves.length === 1 ? head.length !== words : head.length + tail.length > words - 1) return null;
  const put = (g: string[], from: number): boolean =>
    g.every((x, i) => {
      if (!/^[0-9a-fA-F]{1,4}$/.test(x)) return false;
      const v = parseInt(x, 16);
      out[2 * (from + i)] = v >> 8;
      out[2 * (from + i) + 1] = v & 0xff;
      return true;
    });
  return put(head, 0) && put(tail, words - tail.length) ? out : null;
}

/**
 * An address of `/proc/<pid>/net/tcp` (8 hex digits) or `tcp6` (32): 32-bit words in host byte
 * order (`proc(5)`, the kernel's `%08X` of `__be32` words), as 16 bytes like {@link ipBytes}.
 */
function procIpBytes(hex: string): Uint8Array | null {
  if (!/^([0-9A-Fa-f]{8}|[0-9A-Fa-f]{32})$/.test(hex)) return null;
  const out = new Uint8Array(16);
  const le = endianness() === 'LE';
  const o = hex.length === 8 ? 12 : 0;
  if (hex.length === 8) out[10] = out[11] = 0xff;
  for (let w = 0; w < hex.length / 8; w++) {
    const v = parseInt(hex.slice(8 * w, 8 * w + 8), 16);
    for (let i = 0; i < 4; i++) out[o + 4 * w + i] = le ? (v >>> (8 * i)) & 0xff : (v >>> (24 - 8 * i)) & 0xff;
  }
  return out;
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
