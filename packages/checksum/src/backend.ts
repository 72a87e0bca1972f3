/**
 * The checksum backend interface: what runs a step's rows over compiled group tables.
 * Tables and rows use the byte layout of `native/include/kvc_checksum.h` (kvc_entry: 128 bytes,
 * kvc_row: six uint32, both little-endian), so every backend reads the same bytes.
 * @module
 */

/** Bytes of one `kvc_entry`. */
export const ENTRY_BYTES = 128;
/** uint32 words of one `kvc_row`: group, block_id, first_token, valid_tokens, out_offset, reserved. */
export const ROW_WORDS = 6;

/** Entry kinds (`KVC_ENTRY_*`). */
export const ENTRY_ATTN = 1;
export const ENTRY_ROWS = 2;
export const ENTRY_STREAM = 3;

/**
 * Compiled tables of several groups: entries of group `g` are entries
 * `groupStart[g] .. groupStart[g+1]` (each {@link ENTRY_BYTES} bytes of `entries`).
 */
export interface PackedTables {
  readonly entries: Uint8Array;
  readonly groupStart: Uint32Array;
  readonly nGroups: number;
}

/**
 * Which implementation sums: `ts` (reference), `native` (C++ addon, CPU), `cuda` (GPU), or
 * `cuda-emulated` (the device path's host side over host memory, for tests without a GPU:
 * backend-emulated.ts).
 */
export type BackendName = 'ts' | 'native' | 'cuda' | 'cuda-emulated';

/**
 * A checksum backend. `sumRows` adds, for every row, each entry's contributions into
 * `out[row.out_offset + entry.column]` (mod 2^64). Host backends read `regions[entry.region]`.
 * @throws RangeError when a table entry or a row is invalid (an entry reaching outside its region,
 *   a block id past `num_blocks`, an output index past `out.length`); nothing is written then.
 */
export interface ChecksumBackend {
  readonly name: BackendName;
  sumRows(tables: PackedTables, regions: readonly Uint8Array[], rows: Uint32Array, out: BigUint64Array): void;
}

/** One region of device memory the tables' `region` indexes: its device address and size. */
export interface DeviceRegion {
  /** Device address (CUDA `void*` as a bigint), e.g. `BigInt(tensor.data_ptr())`. */
  readonly address: bigint;
  /** Bytes of the region; every entry's extent must lie inside it. */
  readonly bytes: number;
}

/** A submitted step of a {@link DeviceChecksumBackend}: pass it to `query` / `collect`. */
export type DeviceTicket = bigint;

/**
 * A checksum context on one device (the `cuda` backend's `CudaChecksumBackend`, or the emulated
 * one): tables set once at registration, then one {@link submit} per step that never waits for the
 * device, and non-blocking {@link query} of its results. One context holds one table set; the
 * call contract is `native/include/kvc_checksum_cuda.h` (tickets, slots, errors).
 */
export interface DeviceChecksumBackend {
  readonly kind: 'device';
  readonly name: 'cuda' | 'cuda-emulated';
  /** CUDA device ordinal of the context. */
  readonly device: number;
  /**
   * Submits whose results can be in flight at once. A submit past it waits for the oldest and
   * its ticket expires, so a caller collects before it has this many in flight.
   */
  readonly slots: number;
  /**
   * Validates the tables against the regions (every entry's extent inside its region) and
   * uploads them; may wait for steps in flight. @throws RangeError for invalid tables.
   */
  setTables(tables: PackedTables, regions: readonly DeviceRegion[]): void;
  /**
   * Enqueues one step's rows ({@link ROW_WORDS} uint32 each) on `stream` (a `cudaStream_t`, 0n: the
   * default stream), ordered after the work already on it; never waits for the device.
   * @returns the ticket. @throws RangeError for an invalid row (nothing is enqueued then).
   */
  submit(rows: Uint32Array, outLen: number, stream?: bigint): DeviceTicket;
  /** True once the ticket's results are in host memory; never blocks. */
  query(ticket: DeviceTicket): boolean;
  /**
   * Adds the ticket's `outLen` results into `out` and releases the ticket; blocks only when
   * {@link query} has not said done yet. @throws RangeError for an unknown or collected ticket.
   */
  collect(ticket: DeviceTicket, out: BigUint64Array): void;
  /** Frees the context (waits for its steps in flight). */
  close(): void;
}

/**
 * Makes device checksum contexts on a device: one per table set (a worker's producer and consumer
 * plans are two). {@link cudaDeviceProvider} (backend-cuda.ts) and `EmulatedDevice`
 * (backend-emulated.ts) implement it.
 */
export interface DeviceChecksumProvider {
  readonly kind: 'device-provider';
  readonly name: 'cuda' | 'cuda-emulated';
  /** A new context on `device`. @throws Error when the device cannot be used (the reason). */
  createContext(device: number): DeviceChecksumBackend;
}

/** True for a {@link DeviceChecksumBackend}. */
export function isDeviceBackend(b: unknown): b is DeviceChecksumBackend {
  return typeof b === 'object' && b !== null && (b as { kind?: unknown }).kind === 'device';
}

/** True for a {@link DeviceChecksumProvider}. */
export function isDeviceProvider(b: unknown): b is DeviceChecksumProvider {
  return typeof b === 'object' && b !== null && (b as { kind?: unknown }).kind === 'device-provider';
}
