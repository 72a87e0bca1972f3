/**
 * Byte access to a worker's registered KV regions for the faults, whatever memory holds them:
 * host regions (`Uint8Array`) are read and written in place; device regions (a
 * `DeviceMemoryRegion` of @kvconnect/checksum, the engine's `--device cuda | cuda-emulated`) are
 * read and written through the synchronous copies of the process's device memory
 * (`deviceMemoryFor` of @kvconnect/transfer, packages/transfer/src/device.ts: `cudaMemcpy` on
 * the legacy default stream for CUDA, the emulated table in CI), so that a fault changes the very
 * bytes the connector moved and the KV checksum worker sums (the device is the KV's truth; the
 * engine's host mirror copies them in before a layer reads, packages/engine/src/worker.ts).
 *
 * A device session ({@link DeviceKvBytes}) reads whole pages of {@link DEVICE_PAGE_BYTES} once (a
 * run of missing pages is one copy), keeps the writes in those pages, and {@link KvBytes.flush}
 * copies back exactly the byte ranges written (adjacent writes merged), never bytes it only read:
 * a load of another request may be landing in the same region meanwhile. Ordering: a flush
 * returns after its copies finished, so device work enqueued after it (the checksum worker's
 * submit) reads the faulted bytes; the legacy-stream copies also run after device work enqueued
 * before them on the legacy stream (the producer's checksum kernel of the same step, which
 * therefore sums the bytes before a `stale` fault overwrites them).
 * @module
 */
import { isDeviceRegion, type DeviceMemoryRegion } from '@kvconnect/checksum';
import type { WorkerKVCaches } from '@kvconnect/core';
import { deviceMemoryFor, type DeviceMemory } from '@kvconnect/transfer';

/** Bytes per page that a device session reads at once (64 KiB). */
export const DEVICE_PAGE_BYTES = 64 * 1024;

/** Reads and writes of KV bytes by (region index, byte offset in the region, length). */
export interface KvBytes {
  /**
   * A copy of `len` bytes at `addr` of region `region` (writes of this session included).
   * @throws RangeError outside the region.
   */
  read(region: number, addr: number, len: number): Uint8Array;
  /** Writes `bytes` at `addr` of region `region`. @throws RangeError outside the region. */
  write(region: number, addr: number, bytes: Uint8Array): void;
  /** Makes this session's writes land where the checksum reads (device: copies them host to device); a no-op on host regions. */
  flush(): void;
}

/** A worker's caches with byte access to its regions: what fault hooks get. */
export type FaultCaches = WorkerKVCaches & { readonly bytes: KvBytes };

function checkRange(what: string, size: number, region: number, addr: number, len: number): void {
  if (!(Number.isSafeInteger(addr) && Number.isSafeInteger(len) && addr >= 0 && len >= 0 && addr + len <= size)) {
    throw new RangeError(`${what}: [${addr}, +${len}) is outside KV region ${region} (${size} bytes)`);
  }
}

/** Host regions, read and written in place. */
export class HostKvBytes implements KvBytes {
  constructor(private readonly regions: readonly Uint8Array[]) {}

  private mem(region: number): Uint8Array {
    const m = this.regions[region];
    if (!m) throw new RangeError(`no KV region ${region}`);
    return m;
  }

  read(region: number, addr: number, len: number): Uint8Array {
    const m = this.mem(region);
    checkRange('read', m.byteLength, region, addr, len);
    return m.slice(addr, addr + len);
  }

  write(region: number, addr: number, bytes: Uint8Array): void {
    const m = this.mem(region);
    checkRange('write', m.byteLength, region, addr, bytes.byteLength);
    m.set(bytes, addr);
  }

  flush(): void {}
}

/** Copies a device session made (for tests and benches). */
export interface DeviceKvCopies {
  /** Device-to-host copies (page runs read) and their bytes. */
  d2h: number;
  d2hBytes: number;
  /** Host-to-device copies (written ranges flushed) and their bytes. */
  h2d: number;
  h2dBytes: number;
}

/** Device regions, through synchronous copies with a page cache (see the module note). One session: make one, use it, flush it. */
export class DeviceKvBytes implements KvBytes {
  /** Copies made so far by this session. */
  readonly copies: DeviceKvCopies = { d2h: 0, d2hBytes: 0, h2d: 0, h2dBytes: 0 };
  private readonly pages = new Map<number, Map<number, Uint8Array>>();
  private dirty: Array<[region: number, start: number, end: number]> = [];

  /** @param memoryFor the device memory holding an address (default `deviceMemoryFor`). */
  constructor(
    private readonly regions: readonly DeviceMemoryRegion[],
    private readonly memoryFor: (address: bigint) => DeviceMemory = deviceMemoryFor,
  ) {}

  private region(i: number): DeviceMemoryRegion {
    const r = this.regions[i];
    if (!r) throw new RangeError(`no KV region ${i}`);
    return r;
  }

  /** The pages of `[addr, addr + len)` of region `ri`, read from the device where missing (one copy per run of missing pages). */
  private load(ri: number, addr: number, len: number): Map<number, Uint8Array> {
    const r = this.region(ri);
    let pages = this.pages.get(ri);
    if (!pages) this.pages.set(ri, (pages = new Map()));
    if (len === 0) return pages;
    const last = Math.floor((addr + len - 1) / DEVICE_PAGE_BYTES);
    for (let p = Math.floor(addr / DEVICE_PAGE_BYTES); p <= last; p++) {
      if (pages.has(p)) continue;
      let q = p;
      while (q + 1 <= last && !pages.has(q + 1)) q++;
      const start = p * DEVICE_PAGE_BYTES;
      const end = Math.min((q + 1) * DEVICE_PAGE_BYTES, r.bytes);
      const buf = new Uint8Array(end - start);
      this.memoryFor(r.address).copy(r.device, 'd2h', buf, r.address + BigInt(start), buf.byteLength);
      this.copies.d2h++;
      this.copies.d2hBytes += buf.byteLength;
      for (let k = p; k <= q; k++) pages.set(k, buf.subarray((k - p) * DEVICE_PAGE_BYTES, Math.min((k - p + 1) * DEVICE_PAGE_BYTES, buf.byteLength)));
      p = q;
    }
    return pages;
  }

  /** Calls `fn(page, offsetInPage, offsetInRange, n)` over the pages of `[addr, addr + len)`. */
  private each(pages: Map<number, Uint8Array>, addr: number, len: number, fn: (page: Uint8Array, at: number, o: number, n: number) => void): void {
    let o = 0;
    while (o < len) {
      const a = addr + o;
      const at = a % DEVICE_PAGE_BYTES;
      const n = Math.min(len - o, DEVICE_PAGE_BYTES - at);
      fn(pages.get(Math.floor(a / DEVICE_PAGE_BYTES))!, at, o, n);
      o += n;
    }
  }

  read(region: number, addr: number, len: number): Uint8Array {
    checkRange('read', this.region(region).bytes, region, addr, len);
    const out = new Uint8Array(len);
    this.each(this.load(region, addr, len), addr, len, (page, at, o, n) => out.set(page.subarray(at, at + n), o));
    return out;
  }

  write(region: number, addr: number, bytes: Uint8Array): void {
    checkRange('write', this.region(region).bytes, region, addr, bytes.byteLength);
    if (bytes.byteLength === 0) return;
    this.each(this.load(region, addr, bytes.byteLength), addr, bytes.byteLength, (page, at, o, n) => page.set(bytes.subarray(o, o + n), at));
    this.dirty.push([region, addr, addr + bytes.byteLength]);
  }

  /** Copies every written range (merged where they touch or overlap) host to device, then forgets the pages. */
  flush(): void {
    const ranges = this.dirty.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
    this.dirty = [];
    const merged: Array<[number, number, number]> = [];
    for (const x of ranges) {
      const m = merged[merged.length - 1];
      if (m && m[0] === x[0] && x[1] <= m[2]) m[2] = Math.max(m[2], x[2]);
      else merged.push([x[0], x[1], x[2]]);
    }
    for (const [ri, start, end] of merged) {
      const r = this.region(ri);
      const buf = this.read(ri, start, end - start);
      this.memoryFor(r.address).copy(r.device, 'h2d', r.address + BigInt(start), buf, buf.byteLength);
      this.copies.h2d++;
      this.copies.h2dBytes += buf.byteLength;
    }
    this.pages.clear();
  }
}

/**
 * A byte-access session over `caches`' regions: {@link HostKvBytes} on host regions,
 * a new {@link DeviceKvBytes} on device regions.
 * @throws TypeError when host and device regions are mixed (the core contract allows neither).
 */
export function kvBytesOf(caches: WorkerKVCaches, memoryFor?: (address: bigint) => DeviceMemory): KvBytes {
  const dev = caches.regions.filter((r) => isDeviceRegion(r)).length;
  if (dev === 0) return new HostKvBytes(caches.regions as readonly Uint8Array[]);
  if (dev !== caches.regions.length) throw new TypeError('a worker\'s KV regions must be all host or all device memory');
  return new DeviceKvBytes(caches.regions as readonly DeviceMemoryRegion[], memoryFor);
}
