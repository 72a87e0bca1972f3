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

/** Which implementation sums: `ts` (reference), `native` (C++ addon, CPU), `cuda` (GPU). */
export type BackendName = 'ts' | 'native' | 'cuda';

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
