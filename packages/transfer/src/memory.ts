/**
 * Host-memory regions of one agent: synthetic addresses and bounds-checked lookups.
 * @module
 */
import type { DeviceMemory } from './device.js';
import type { HostBytes } from './types.js';

/**
 * Device memory behind a registered region (embedded agent, kind VRAM): where it is and the
 * {@link DeviceMemory} that copies it.
 */
export interface DeviceRef {
  readonly dm: DeviceMemory;
  /** CUDA device ordinal. */
  readonly device: number;
  /** Device address of the region's first byte. */
  readonly address: bigint;
  /** IPC handle of the allocation starting at `address` (null: not shareable by IPC). */
  readonly ipcHandle: Uint8Array | null;
}

/**
 * A registered region: host bytes (`view`), or device memory (`device` set, `view` empty).
 * `alive` turns false at deregistration (in-flight writes then stop).
 */
export interface HostRegion {
  readonly addr: number;
  readonly length: number;
  readonly view: Uint8Array;
  readonly device?: DeviceRef;
  /** Host bytes in a shared mapping of this process (`shared-memory.ts`), as the metadata advertises them. */
  shm?: ShmRef;
  alive: boolean;
}

/** Where a registered host region lies in one of this process's shared mappings. */
export interface ShmRef {
  /** The memfd's name and descriptor. */
  readonly name: string;
  readonly fd: number;
  /** Bytes of the whole mapping and the region's offset in it (header page included). */
  readonly size: number;
  readonly offset: number;
  /** The mapping's grant word while this registration lives. */
  readonly grant: number;
}

/** A byte view of any {@link HostBytes}, or null if it is not one. */
export function toU8(bytes: HostBytes): Uint8Array | null {
  if (bytes instanceof Uint8Array) return bytes;
  if (ArrayBuffer.isView(bytes)) return new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (bytes instanceof ArrayBuffer || (typeof SharedArrayBuffer !== 'undefined' && bytes instanceof SharedArrayBuffer)) return new Uint8Array(bytes);
  return null;
}

/** Regions sorted by address; addresses are handed out upwards, never reused, page-aligned, with a guard page between regions. */
export class RegionTable {
  private regions: HostRegion[] = [];
  private next = 0x10000;

  /** Adds a region (host bytes, or `length` bytes of device memory) and gives it an address. */
  add(view: Uint8Array, device?: { ref: DeviceRef; length: number }): HostRegion {
    const addr = this.next;
    const length = device ? device.length : view.byteLength;
    const r: HostRegion = device ? { addr, length, view, device: device.ref, alive: true } : { addr, length, view, alive: true };
    this.next = Math.ceil((addr + length + 4096) / 4096) * 4096;
    if (!Number.isSafeInteger(this.next)) throw new RangeError('address space exhausted');
    this.regions.push(r); // addresses grow, so the array stays sorted
    return r;
  }

  /** Removes the region at `addr` (marks it dead). Returns false if there is none. */
  remove(addr: number): boolean {
    const i = this.indexOf(addr);
    if (i < 0 || this.regions[i]!.addr !== addr) return false;
    this.regions[i]!.alive = false;
    this.regions.splice(i, 1);
    return true;
  }

  private indexOf(addr: number): number {
    let lo = 0;
    let hi = this.regions.length - 1;
    let best = -1;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      if (this.regions[mid]!.addr <= addr) {
        best = mid;
        lo = mid + 1;
      } else hi = mid - 1;
    }
    return best;
  }

  /** The live region holding all of `[addr, addr + length)`, or null. */
  find(addr: number, length: number): HostRegion | null {
    if (!Number.isSafeInteger(addr) || !Number.isSafeInteger(length) || addr < 0 || length <= 0) return null;
    const i = this.indexOf(addr);
    if (i < 0) return null;
    const r = this.regions[i]!;
    if (addr + length > r.addr + r.length) return null;
    return r;
  }

  /** `[addr, length]` of every live region, flat. */
  flat(): number[] {
    const out: number[] = [];
    for (const r of this.regions) out.push(r.addr, r.length);
    return out;
  }
}

/** Checks `[addr, addr+length)` against flat sorted `[addr, len, ...]` pairs. */
export function inFlatRegions(flat: readonly number[], addr: number, length: number): boolean {
  if (!Number.isSafeInteger(addr) || !Number.isSafeInteger(length) || addr < 0 || length <= 0) return false;
  let lo = 0;
  let hi = flat.length / 2 - 1;
  let best = -1;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1;
    if (flat[2 * mid]! <= addr) {
      best = mid;
      lo = mid + 1;
    } else hi = mid - 1;
  }
  return best >= 0 && addr + length <= flat[2 * best]! + flat[2 * best + 1]!;
}
