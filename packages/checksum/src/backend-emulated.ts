/**
 * The `cuda-emulated` checksum backend: the host side of the device path without a GPU, so CI runs
 * the asynchronous scheduling, result collection and waiting for verdicts for real. It keeps the
 * `cuda` backend's call contract (`native/include/kvc_checksum_cuda.h`: tables per context, one
 * submit per step that never waits, tickets, a ring of `slots` results, query never blocks) over
 * "device memory" that is host bytes registered in an {@link EmulatedDevice} under made-up device
 * addresses.
 *
 * A submit sums its rows at once with the TypeScript reference backend (what the GPU's stream order
 * gives: the kernel reads the KV as the work enqueued before it left it, whatever the host writes
 * later) but its results become visible only after `completeAfterPolls` queries and
 * `completeAfterMs` milliseconds, or never while the device is {@link EmulatedDevice.stall}ed. Calls
 * the real backend would make synchronizing CUDA calls for (a collect before the results are in,
 * a submit with every slot in flight, setTables with steps in flight) are counted in
 * {@link EmulatedDevice.syncCalls}, like the addon's counter (`cuda.syncCallCount()`).
 * @module
 */
import { ROW_WORDS, type DeviceChecksumBackend, type DeviceChecksumProvider, type DeviceRegion, type DeviceTicket, type PackedTables } from './backend.js';
import { tsBackend, validateStep } from './backend-ts.js';
import type { DeviceMemoryRegion } from './types.js';

/** Options of an {@link EmulatedDevice}. */
export interface EmulatedDeviceOptions {
  /** The CUDA device ordinal it pretends to be (default 0). */
  device?: number;
  /** Queries of a ticket that answer "pending" before it completes (default 2: a later step). */
  completeAfterPolls?: number;
  /** Milliseconds after the submit before a ticket can complete (default 0). */
  completeAfterMs?: number;
  /** Results in flight per context (default 8, as the cuda backend). */
  slots?: number;
}

/** Base of the emulated device addresses (any non-zero 64-bit value would do). */
const ADDRESS_BASE = 0x7f00_0000_0000n;
/** Emulated allocations are this aligned, as cudaMalloc's (256 bytes). */
const ALIGN = 256n;

interface Allocation {
  address: bigint;
  bytes: Uint8Array;
}

/**
 * An emulated CUDA device: "device memory" (host bytes at device addresses) and the
 * {@link DeviceChecksumProvider} of `cuda-emulated` contexts over it.
 */
export class EmulatedDevice implements DeviceChecksumProvider {
  readonly kind = 'device-provider' as const;
  readonly name = 'cuda-emulated' as const;
  readonly device: number;
  readonly completeAfterPolls: number;
  readonly completeAfterMs: number;
  readonly slots: number;
  /** Synchronizing calls the real backend would have made (see the module doc). */
  syncCalls = 0;
  /** Submits made on every context of this device. */
  submits = 0;
  private readonly allocations: Allocation[] = [];
  private next = ADDRESS_BASE;
  private stalled = false;

  constructor(options: EmulatedDeviceOptions = {}) {
    this.device = options.device ?? 0;
    this.completeAfterPolls = options.completeAfterPolls ?? 2;
    this.completeAfterMs = options.completeAfterMs ?? 0;
    this.slots = options.slots ?? 8;
    for (const [k, v] of [['device', this.device], ['completeAfterPolls', this.completeAfterPolls], ['completeAfterMs', this.completeAfterMs]] as const) {
      if (!(Number.isSafeInteger(v) && v >= 0)) throw new RangeError(`EmulatedDevice: ${k} must be a non-negative integer, got ${v}`);
    }
    if (!(Number.isSafeInteger(this.slots) && this.slots >= 1 && this.slots <= 64)) throw new RangeError(`EmulatedDevice: slots must be in [1, 64], got ${this.slots}`);
  }

  /**
   * Places `bytes` (kept by reference: host writes to it are device writes) at a new device
   * address and returns its {@link DeviceMemoryRegion}.
   */
  expose(bytes: Uint8Array): DeviceMemoryRegion {
    const address = this.next;
    this.next += ((BigInt(bytes.byteLength) + ALIGN - 1n) / ALIGN) * ALIGN + ALIGN; // a gap between allocations
    this.allocations.push({ address, bytes });
    return { kind: 'device', device: this.device, address, bytes: bytes.byteLength };
  }

  /**
   * Backs an existing device region (e.g. emulated device memory of another layer, at its own
   * address) with `bytes` (kept by reference), so that contexts of this device read `bytes` there.
   * @throws RangeError when the sizes differ, the region is on another device, or it overlaps an
   *   allocation of this device.
   */
  adopt(region: DeviceMemoryRegion, bytes: Uint8Array): DeviceMemoryRegion {
    if (region.device !== this.device) throw new RangeError(`emulated device ${this.device} cannot adopt a region of device ${region.device}`);
    if (bytes.byteLength !== region.bytes) throw new RangeError(`adopt: ${bytes.byteLength} bytes for a ${region.bytes}-byte region`);
    const end = region.address + BigInt(region.bytes);
    if (this.allocations.some((a) => region.address < a.address + BigInt(a.bytes.byteLength) && a.address < end)) {
      throw new RangeError(`adopt: [0x${region.address.toString(16)}, +${region.bytes}) overlaps an allocation of emulated device ${this.device}`);
    }
    this.allocations.push({ address: region.address, bytes });
    return region;
  }

  /**
   * The host bytes behind `[address, address + bytes)`.
   * @throws RangeError when the range is not inside one allocation of this device.
   */
  memory(address: bigint, bytes: number): Uint8Array {
    for (const a of this.allocations) {
      if (address >= a.address && address + BigInt(bytes) <= a.address + BigInt(a.bytes.byteLength)) {
        const off = Number(address - a.address);
        return a.bytes.subarray(off, off + bytes);
      }
    }
    throw new RangeError(`emulated device ${this.device}: [0x${address.toString(16)}, +${bytes}) is not inside an allocation`);
  }

  /** While stalled, no ticket completes (a hung device, for deadline tests). */
  stall(on: boolean): void {
    this.stalled = on;
  }

  /** @internal */
  get isStalled(): boolean {
    return this.stalled;
  }

  /** A new `cuda-emulated` context on this device. @throws RangeError for another device ordinal. */
  createContext(device: number = this.device): DeviceChecksumBackend {
    if (device !== this.device) throw new RangeError(`emulated device ${this.device} cannot make a context on device ${device}`);
    return new EmulatedDeviceContext(this);
  }
}

interface Step {
  ticket: DeviceTicket;
  out: BigUint64Array;
  pollsLeft: number;
  readyAt: number;
}

/** One `cuda-emulated` context (see the module doc); made by {@link EmulatedDevice.createContext}. */
class EmulatedDeviceContext implements DeviceChecksumBackend {
  readonly kind = 'device' as const;
  readonly name = 'cuda-emulated' as const;
  readonly device: number;
  readonly slots: number;
  private tables: PackedTables | null = null;
  private host: Uint8Array[] = [];
  /** Steps in flight or done but not collected, oldest first (at most `slots`). */
  private readonly ring: Step[] = [];
  private nextTicket = 1n;
  private closed = false;

  constructor(private readonly dev: EmulatedDevice) {
    this.device = dev.device;
    this.slots = dev.slots;
  }

  private live(): void {
    if (this.closed) throw new Error('the emulated CUDA checksum context is closed');
  }

  setTables(tables: PackedTables, regions: readonly DeviceRegion[]): void {
    this.live();
    const host = regions.map((r, i) => {
      if (typeof r.address !== 'bigint' || r.address <= 0n) throw new TypeError(`regions[${i}].address must be a non-zero bigint device address`);
      return this.dev.memory(r.address, r.bytes);
    });
    validateStep(tables, host, new Uint32Array(0), new BigUint64Array(0));
    if (this.ring.some((s) => !this.done(s, false))) this.dev.syncCalls++; // the real one drains the steps in flight
    this.tables = tables;
    this.host = host;
  }

  submit(rows: Uint32Array, outLen: number, _stream: bigint = 0n): DeviceTicket {
    this.live();
    if (!this.tables) throw new RangeError('submit: no tables (call setTables first)');
    if (!(rows instanceof Uint32Array) || rows.length % ROW_WORDS !== 0) throw new RangeError(`submit: rows must be a Uint32Array of whole ${ROW_WORDS}-word rows`);
    if (!(Number.isSafeInteger(outLen) && outLen >= 0)) throw new TypeError('submit: outLen must be an integer >= 0');
    const out = new BigUint64Array(outLen);
    tsBackend.sumRows(this.tables, this.host, rows, out); // validates first: nothing is enqueued on an error
    if (this.ring.length >= this.slots) {
      // Every slot in flight: the real submit waits for the oldest, whose ticket then expires.
      const oldest = this.ring.shift()!;
      if (!this.done(oldest, false)) this.dev.syncCalls++;
    }
    const ticket = this.nextTicket++;
    this.ring.push({ ticket, out, pollsLeft: this.dev.completeAfterPolls, readyAt: Date.now() + this.dev.completeAfterMs });
    this.dev.submits++;
    return ticket;
  }

  private find(ticket: DeviceTicket, what: string): Step {
    this.live();
    const s = this.ring.find((x) => x.ticket === ticket);
    if (!s) throw new RangeError(`${what}: unknown, expired or collected ticket ${ticket}`);
    return s;
  }

  /** Whether the step completed; `poll` counts as one query. */
  private done(s: Step, poll: boolean): boolean {
    if (this.dev.isStalled) return false;
    if (poll && s.pollsLeft > 0) s.pollsLeft--;
    return s.pollsLeft === 0 && Date.now() >= s.readyAt;
  }

  query(ticket: DeviceTicket): boolean {
    return this.done(this.find(ticket, 'query'), true);
  }

  collect(ticket: DeviceTicket, out: BigUint64Array): void {
    const s = this.find(ticket, 'collect');
    if (out.length !== s.out.length) throw new RangeError(`collect: out has ${out.length} values, the submit ${s.out.length}`);
    if (!this.done(s, false)) {
      if (this.dev.isStalled) throw new Error('collect: the emulated device is stalled (a real one would block here)');
      this.dev.syncCalls++; // the real collect blocks on the step's done event
    }
    for (let i = 0; i < out.length; i++) out[i] = BigInt.asUintN(64, out[i] + s.out[i]);
    this.ring.splice(this.ring.indexOf(s), 1);
  }

  close(): void {
    this.ring.length = 0;
    this.closed = true;
  }
}
