/**
 * @file kvc_checksum.h
 * @brief kvconnect SPEC v1 checksum kernels: the C ABI shared by the CPU kernel, the CUDA kernel,
 *        the N-API addon and the TypeScript reference (packages/checksum/src/plan.ts builds the
 *        same tables byte for byte).
 *
 * A rank's KV cache group is compiled once (at cache registration) into a table of entries; an
 * engine step then sums many rows (one row = one block of one request in one group) in one call.
 * Every entry adds its contributions into one output column of each row's output:
 *   out[row.out_offset + entry.column] += sum of x * m * (2j + 1)   (mod 2^64)
 * All integers are unsigned and wrap mod 2^64 (SPEC section 2: "all arithmetic on checksums is
 * modulo 2^64"). All multi-byte values in memory are little-endian; the kernels assume a
 * little-endian host (x86-64, aarch64) and device.
 *
 * Entry kinds (SPEC sections 2 and 3):
 *  - KVC_ENTRY_ATTN: one part of a token cache (the K bytes, the V bytes, or the whole cell).
 *    Logical cell of (block, head h, token t): parts concatenated in order; this part holds cell
 *    bytes [byte_start, byte_start + byte_count). Address of byte b of the part:
 *      offset + block_id*block_stride + (t / kblock_tokens)*kblock_stride
 *             + (t % kblock_tokens)*token_stride + h*outer_stride + b
 *    Piece p of the cell = cell bytes [8p, 8p+8) read LE; a piece split over two parts is the
 *    sum of each part's bytes shifted to their place (the contribution is linear in the bytes).
 *    m = 2*(factor_base + h) + 1 with factor_base = layer*65536 + global head of local head 0;
 *    j = (row.first_token + t) * cell_pieces + p, for t < row.valid_tokens (<= block_tokens).
 *  - KVC_ENTRY_ROWS: one TP-split segment of a state. Local row i (i < outer_count) starts at
 *    offset + block_id*block_stride + i*outer_stride; its elements are the row-major walk of
 *    elem_count[0..2] with byte strides elem_stride[0..2] (unused dims: count 1), each read as a LE
 *    unsigned integer of elem_bytes (2 or 4), zero-extended: x; j = element index;
 *    m = 2*(factor_base + i) + 1 with factor_base = layer*65536 + segmentStart + shard*localSize.
 *    Rows are not token based: row.first_token and row.valid_tokens are ignored.
 *  - KVC_ENTRY_STREAM: one covered state of a state layer without a split declaration, contiguous
 *    in memory: byte_count bytes at offset + block_id*block_stride, placed at bytes
 *    [byte_start, byte_start + byte_count) of the rank's byte stream. Piece k = stream bytes
 *    [8k, 8k+8) read LE, j = k, m = 2*factor_base + 1 (factor_base = layer*65536 + headOffset + tpRank).
 *
 * Errors: functions return KVC_OK (0) or a negative KVC_E* code; they never abort.
 */
#ifndef KVC_CHECKSUM_H
#define KVC_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVC_ABI_VERSION 1u

#define KVC_ENTRY_ATTN 1u
#define KVC_ENTRY_ROWS 2u
#define KVC_ENTRY_STREAM 3u

#define KVC_OK 0
#define KVC_EINVAL (-1)      /* malformed table or row (unknown kind, zero counts, bad widths) */
#define KVC_ERANGE (-2)      /* a row's block id >= entry num_blocks, or a group index out of range */
#define KVC_ECUDA (-3)       /* a CUDA runtime call failed (CUDA functions only) */
#define KVC_ENOCUDA (-4)     /* built without CUDA, or no device */

/** One entry of a group's table: 128 bytes, little-endian, no padding (checked by static_assert). */
typedef struct kvc_entry {
  uint64_t offset;          /**< bytes from the region's start to (block 0, head/row 0, token 0, byte 0) */
  uint64_t factor_base;     /**< layer*65536 + global head/row of local head/row 0 */
  int64_t block_stride;     /**< bytes between consecutive block ids */
  int64_t outer_stride;     /**< ATTN: bytes between heads; ROWS: bytes between rows */
  int64_t kblock_stride;    /**< ATTN: bytes between the kernel blocks of one block */
  int64_t token_stride;     /**< ATTN: bytes between tokens of one kernel block */
  int64_t elem_stride[3];   /**< ROWS: byte strides of the element dims, row-major */
  uint32_t elem_count[3];   /**< ROWS: element dim sizes (1 for unused dims) */
  uint32_t kind;            /**< KVC_ENTRY_* */
  uint32_t region;          /**< index of the memory region the offsets are relative to */
  uint32_t column;          /**< output column (the replica key's index in the group) */
  uint32_t outer_count;     /**< ATTN: local heads; ROWS: local rows of the segment; STREAM: 1 */
  uint32_t kblock_tokens;   /**< ATTN: tokens per kernel block (the block size when not split) */
  uint32_t byte_start;      /**< ATTN: first cell byte of this part; STREAM: first stream byte */
  uint32_t byte_count;      /**< ATTN: bytes of this part per cell; STREAM: bytes of this state */
  uint32_t cell_pieces;     /**< ATTN: P = cellBytes / 8 */
  uint32_t elem_bytes;      /**< ROWS: 2 or 4 */
  uint32_t num_blocks;      /**< block ids [0, num_blocks) are valid for this entry */
  uint32_t block_tokens;    /**< ATTN: tokens per block; a row's valid_tokens must be <= this
                                 (KVC_ERANGE otherwise); the extent covers tokens [0, block_tokens).
                                 ROWS and STREAM: 0 */
} kvc_entry;

/** One row of a step: 24 bytes (six uint32, little-endian). */
typedef struct kvc_row {
  uint32_t group;           /**< index of the group table (see kvc_tables) */
  uint32_t block_id;        /**< physical block id in the group's caches */
  uint32_t first_token;     /**< request position of the block's first token (position * blockSize) */
  uint32_t valid_tokens;    /**< tokens of this block below numTokens (0..blockSize) */
  uint32_t out_offset;      /**< index of this row's column 0 in the output array */
  uint32_t reserved;
} kvc_row;

/** The tables of several groups: entries of group g are entries[group_start[g] .. group_start[g+1]). */
typedef struct kvc_tables {
  const kvc_entry* entries;
  const uint32_t* group_start;  /**< n_groups + 1 values */
  uint32_t n_groups;
} kvc_tables;

/**
 * Sums rows on the CPU. regions[r] is the host address of region r and region_bytes[r] its size in
 * bytes (n_regions of them). Before reading anything it checks every entry of every group
 * (kind, counts, widths; its extent for block ids < num_blocks inside its region: kvc_entry_extent)
 * and every row (group < n_groups, block_id < num_blocks of the group's entries,
 * out_offset + column < out_len), so no input can make it read or write out of bounds.
 * out (out_len uint64) is added to, not cleared. Returns KVC_OK, KVC_EINVAL or KVC_ERANGE; on an
 * error nothing has been written. The full list of checks is kvc_check_rows's (plus NULL pointers
 * and out overlapping the tables, rows or region lists: KVC_EINVAL); kvc_sum_rows_cpu_diag also
 * says which entry or row failed and why. Single-threaded; regions are only read.
 * @param tables        the group tables
 * @param regions       host address of each region (n_regions of them)
 * @param region_bytes  size in bytes of each region
 * @param n_regions     number of regions
 * @param rows          the rows to sum (may be NULL when n_rows is 0)
 * @param n_rows        number of rows
 * @param out           the output, added to (may be NULL when out_len is 0)
 * @param out_len       number of uint64 in out
 * @return KVC_OK, KVC_EINVAL or KVC_ERANGE
 */
int kvc_sum_rows_cpu(const kvc_tables* tables, const uint8_t* const* regions,
                     const uint64_t* region_bytes, uint32_t n_regions, const kvc_row* rows,
                     size_t n_rows, uint64_t* out, size_t out_len);

/**
 * The lowest and one-past-highest byte offsets (relative to the region) an entry can read for any
 * block id in [0, num_blocks). Returns KVC_OK or KVC_EINVAL (negative extent, overflow, bad kind).
 * Computed exactly (128-bit arithmetic) from the count and stride of every dimension: ATTN blocks,
 * heads, block_tokens / kblock_tokens kernel blocks, kblock_tokens tokens, byte_count bytes; ROWS
 * blocks, rows, the three element dims, elem_bytes; STREAM blocks, byte_count bytes. The entry
 * must pass kvc_entry_check (an invalid entry gives KVC_EINVAL; kvc_entry_check says why).
 * @param e   the entry
 * @param lo  receives the lowest byte offset read
 * @param hi  receives one past the highest byte offset read
 * @return KVC_OK or KVC_EINVAL (lo and hi are then unchanged)
 */
int kvc_entry_extent(const kvc_entry* e, uint64_t* lo, uint64_t* hi);

/** kvc_diag.at: where a check failed. */
#define KVC_AT_NONE 0u   /* no failure */
#define KVC_AT_ARGS 1u   /* the arguments (a NULL pointer, an output overlapping the inputs) */
#define KVC_AT_GROUP 2u  /* group_start[index] */
#define KVC_AT_ENTRY 3u  /* entries[index] (index counts from entries[0], not from the group) */
#define KVC_AT_ROW 4u    /* rows[index] */

/** What a failed check found: filled by kvc_check_rows and kvc_sum_rows_cpu_diag (24 bytes). */
typedef struct kvc_diag {
  int32_t code;             /**< KVC_OK or the KVC_E* code returned */
  uint32_t at;              /**< KVC_AT_*: what index refers to */
  uint64_t index;           /**< index of the failing entry, row or group_start element */
  const char* reason;       /**< static NUL-terminated English text ("ok" on success); never NULL */
} kvc_diag;

/**
 * Checks tables and rows against region sizes without reading any region (so it serves device
 * regions too): what kvc_sum_rows_cpu checks before summing.
 *  - tables: group_start non-decreasing (KVC_EINVAL, at GROUP); every entry in
 *    [group_start[0], group_start[n_groups]) valid by itself (kvc_entry_check; KVC_EINVAL, at ENTRY),
 *    region < n_regions and its extent's hi <= region_bytes[region] (KVC_ERANGE, at ENTRY), and the
 *    bytes one block reads through it (ATTN outer_count*block_tokens*byte_count, ROWS
 *    outer_count*prod(elem_count)*elem_bytes, STREAM byte_count) <= region_bytes[region]
 *    (KVC_EINVAL: overlapping strides; bounds the work of a call);
 *  - rows (KVC_ERANGE, at ROW): group < n_groups, and for every entry of the group: block_id <
 *    num_blocks, out_offset + column < out_len, and for ATTN valid_tokens <= block_tokens.
 * @param tables        the group tables (entries may be NULL when there are none)
 * @param region_bytes  size in bytes of each region (n_regions values)
 * @param n_regions     number of regions
 * @param rows          n_rows rows (may be NULL when n_rows is 0)
 * @param n_rows        number of rows
 * @param out_len       number of uint64 in the output the rows address
 * @param diag          if not NULL, receives the code, the failing index and a reason
 * @return KVC_OK, KVC_EINVAL or KVC_ERANGE
 */
int kvc_check_rows(const kvc_tables* tables, const uint64_t* region_bytes, uint32_t n_regions,
                   const kvc_row* rows, size_t n_rows, size_t out_len, kvc_diag* diag);

/**
 * kvc_sum_rows_cpu with a diagnostic: the same checks (kvc_check_rows, plus NULL region addresses
 * and an output overlapping the tables, rows or region lists: KVC_EINVAL, at ARGS), the same sums.
 * The output may overlap a region (the sums then read what was written; memory-safe, meaningless).
 * @param diag  if not NULL, receives the code, the failing index and a reason
 * @return KVC_OK, KVC_EINVAL or KVC_ERANGE; on an error nothing has been written
 */
int kvc_sum_rows_cpu_diag(const kvc_tables* tables, const uint8_t* const* regions,
                          const uint64_t* region_bytes, uint32_t n_regions, const kvc_row* rows,
                          size_t n_rows, uint64_t* out, size_t out_len, kvc_diag* diag);

/**
 * Checks one entry by itself: kind, non-zero counts (num_blocks, outer_count, kblock_tokens,
 * block_tokens, cell_pieces, byte_count, elem_count), ATTN block_tokens a multiple of
 * kblock_tokens and byte_start + byte_count <= cell_pieces*8, ROWS elem_bytes in {2, 4},
 * STREAM outer_count == 1, block_tokens == 0 for ROWS and STREAM, and an extent in [0, 2^64).
 * @param e  the entry
 * @return NULL when valid, else a static NUL-terminated reason
 */
const char* kvc_entry_check(const kvc_entry* e);

/**
 * Plain wrapping sum of n_words little-endian uint64 words at p (any alignment): the benchmark
 * baseline of the kernels.
 * @param p        the words (n_words * 8 bytes)
 * @param n_words  number of words
 * @return sum of the words mod 2^64
 */
uint64_t kvc_plain_sum64(const uint8_t* p, size_t n_words);

/**
 * Weighted sum of n_words little-endian uint64 words at p (any alignment):
 * sum of x_j * (2j + 1) mod 2^64, the kernel's inner loop over one contiguous slice with m = 1.
 * @param p        the words (n_words * 8 bytes)
 * @param n_words  number of words
 * @return the weighted sum mod 2^64
 */
uint64_t kvc_weighted_sum64(const uint8_t* p, size_t n_words);

/**
 * The instruction set the CPU kernel's loop runs with: "avx512" (AVX-512F), "avx2" or "generic"
 * (SSE2 on x86-64, NEON on aarch64, else scalar). Chosen once, at the first call of any kernel
 * function: the value of the environment variable KVC_CPU_ISA when this CPU runs it, else AVX2
 * if the CPU runs it (faster than AVX-512 on memory-bound sums where 512-bit operations lower the
 * clock: bench/README.md), else AVX-512F, else generic. Every variant gives the same sums bit for bit.
 * @return a static string
 */
const char* kvc_cpu_isa(void);

/**
 * Chooses the loop's instruction set ("auto" = the default choice above, "generic", "avx2",
 * "avx512") for later calls (tests
 * and benchmarks compare the variants). Not thread-safe against calls running at the same time.
 * @return KVC_OK, or KVC_EINVAL for an unknown name or one this CPU does not run (unchanged then)
 */
int kvc_set_cpu_isa(const char* name);

/**
 * kvc_sum_rows_cpu_diag on n_threads threads: the same checks first (nothing is written on an
 * error), then the rows split into n_threads contiguous ranges, each summed by one thread of a
 * persistent pool into its own zeroed copy of out (the calling thread sums the first range into
 * out), the copies added into out at the end. The result equals the single-threaded one exactly.
 * One call runs at a time (concurrent calls wait). n_threads is clamped to [1, 64] and to n_rows.
 * Extra memory: (n_threads - 1) * out_len * 8 bytes for the copies.
 */
int kvc_sum_rows_cpu_mt(const kvc_tables* tables, const uint8_t* const* regions, const uint64_t* region_bytes,
                        uint32_t n_regions, const kvc_row* rows, size_t n_rows, uint64_t* out, size_t out_len,
                        unsigned n_threads, kvc_diag* diag);

/**
 * kvc_plain_sum64 split over n_threads threads of the same pool (the benchmark baseline of the
 * multi-threaded mode: the machine's multi-core read bandwidth). Same result as kvc_plain_sum64.
 */
uint64_t kvc_plain_sum64_mt(const uint8_t* p, size_t n_words, unsigned n_threads);

#ifdef __cplusplus
}
#endif
#endif /* KVC_CHECKSUM_H */
