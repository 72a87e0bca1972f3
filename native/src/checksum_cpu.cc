/**
 * @file checksum_cpu.cc
 * @brief CPU kernel of the SPEC v1 checksum (include/kvc_checksum.h): table and row validation,
 *        entry extents, and the weighted sums of ATTN, ROWS and STREAM entries.
 *
 * Every sum is sum x * m * (2j + 1) mod 2^64. Because multiplication mod 2^64 distributes over
 * addition, the kernel sums x * (2j + 1) per slice (one head of one row, one state row, one
 * stream part) into a local accumulator and multiplies it by m once.
 *
 * A part whose bytes do not start or end on a piece boundary (byte_start % 8 != 0 or
 * byte_count % 8 != 0) is handled by placing each edge byte at its shift inside its piece: the
 * contribution of a piece is linear in its bytes, so a piece split over two parts (or a stream
 * piece split over two states) is the sum of what each part adds.
 *
 * Memory is read with memcpy loads (any alignment) as little-endian words; the kernel assumes a
 * little-endian host, as the header says.
 */
#include "kvc_checksum.h"

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#elif defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#endif

static_assert(sizeof(kvc_entry) == 128, "kvc_entry must be 128 bytes");
static_assert(offsetof(kvc_entry, elem_stride) == 48, "kvc_entry layout");
static_assert(offsetof(kvc_entry, elem_count) == 72, "kvc_entry layout");
static_assert(offsetof(kvc_entry, kind) == 84, "kvc_entry layout");
static_assert(offsetof(kvc_entry, block_tokens) == 124, "kvc_entry layout");
static_assert(sizeof(kvc_row) == 24, "kvc_row must be 24 bytes");
static_assert(sizeof(kvc_diag) == 24, "kvc_diag layout");
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kvc_checksum assumes a little-endian host"
#endif

namespace {

typedef __int128 i128;
const i128 kU64Max = (i128)UINT64_MAX;

inline uint64_t ld64(const uint8_t* p) {
  uint64_t x;
  std::memcpy(&x, p, 8);
  return x;
}
inline uint64_t ld32(const uint8_t* p) {
  uint32_t x;
  std::memcpy(&x, p, 4);
  return x;
}
inline uint64_t ld16(const uint8_t* p) {
  uint16_t x;
  std::memcpy(&x, p, 2);
  return x;
}

// Two-lane vectors of uint64 with wrapping adds: SSE2 (baseline of every x86-64), NEON
// (aarch64), else plain scalars. Unaligned loads.
#if defined(__SSE2__)
struct V {
  __m128i v;
};
inline V vzero() { return {_mm_setzero_si128()}; }
inline V vload(const uint8_t* p) { return {_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))}; }
inline V vadd(V a, V b) { return {_mm_add_epi64(a.v, b.v)}; }
inline void vstore(uint64_t* o, V a) { _mm_storeu_si128(reinterpret_cast<__m128i*>(o), a.v); }
#elif defined(__aarch64__) && defined(__ARM_NEON)
struct V {
  uint64x2_t v;
};
inline V vzero() { return {vdupq_n_u64(0)}; }
inline V vload(const uint8_t* p) { return {vreinterpretq_u64_u8(vld1q_u8(p))}; }
inline V vadd(V a, V b) { return {vaddq_u64(a.v, b.v)}; }
inline void vstore(uint64_t* o, V a) { vst1q_u64(o, a.v); }
#else
struct V {
  uint64_t lo, hi;
};
inline V vzero() { return {0, 0}; }
inline V vload(const uint8_t* p) { return {ld64(p), ld64(p + 8)}; }
inline V vadd(V a, V b) { return {a.lo + b.lo, a.hi + b.hi}; }
inline void vstore(uint64_t* o, V a) {
  o[0] = a.lo;
  o[1] = a.hi;
}
#endif

/** The bytes p[0..n) placed at byte positions off..off+n of one little-endian piece (off+n < 8). */
inline uint64_t partial_piece(const uint8_t* p, unsigned off, unsigned n) {
  // 4-, 2- and 1-byte loads: reads only the part's own bytes, no byte loop.
  uint64_t x = 0;
  unsigned o = 0;
  if (n & 4u) {
    x = ld32(p);
    o = 4;
  }
  if (n & 2u) {
    x |= ld16(p + o) << (8u * o);
    o += 2;
  }
  if (n & 1u) x |= (uint64_t)p[o] << (8u * o);
  return x << (8u * off);
}

/** Tokens of one slice: token t's part starts at base + (t / kbt) * kbs + (t % kbt) * ts. */
struct Walk {
  uint64_t base;  ///< offset of token 0's part from the region start (mod 2^64 arithmetic)
  uint32_t n;     ///< tokens
  uint32_t kbt;   ///< tokens per kernel block (>= 1)
  uint64_t kbs;   ///< kernel block stride (two's complement)
  uint64_t ts;    ///< token stride (two's complement)
};

/**
 * The weighted sum of one slice, the kernel's inner loop: for every token t < w.n, the part's
 * bytes at cell positions [bs, bs + bc) (bytes of a piece outside that range count as 0), with
 * piece c/8 of token t weighted k0 + t*kstep + 2*(c/8); mod 2^64.
 *
 * Whole pieces are summed without multiplications, 4 words (two 2-lane vectors) per iteration:
 * lane L (word 4r + L of a token) keeps a running sum A, B += A after every iteration and
 * G += A after every token. Over N = n*R iterations (R per token), a word x at global iteration
 * i of token t adds x to A, x*(N - i) to B and x*(n - t) to G, so with its weight
 *   kw + 2L + 8i + t*(kstep - 8R)     (kw = weight of the first whole piece of token 0)
 * the lane's sum is (kw + 2L)*A + 8*(N*A - B) + (kstep - 8R)*(n*A - G), all mod 2^64. The
 * partial pieces at the part's edges and the 0-3 words past the last full iteration are added
 * with one multiplication each. Each byte is read once.
 */
uint64_t wsum_slice(const uint8_t* region, const Walk& w, uint64_t bs, uint64_t bc, uint64_t k0, uint64_t kstep) {
  const uint64_t end = bs + bc;
  const uint64_t up = (bs + 7u) & ~(uint64_t)7u, down = end & ~(uint64_t)7u;
  const uint64_t hb = up < end ? up : end;     // first byte of the whole pieces
  const uint64_t we = down > hb ? down : hb;   // end of the whole pieces
  const unsigned lead = (unsigned)(hb - bs), tail = (unsigned)(end - we), off_h = (unsigned)(bs & 7u);
  const uint64_t W = (we - hb) / 8u, R = W / 4u, rem = W % 4u;
  const uint64_t kh = k0 + 2u * (bs / 8u), kw = k0 + 2u * (hb / 8u), ktl = k0 + 2u * (we / 8u);
  V a0 = vzero(), a1 = vzero(), b0 = vzero(), b1 = vzero(), g0 = vzero(), g1 = vzero();
  uint64_t edge = 0, tk = 0, kb_off = 0;
  uint32_t tt = 0;
  for (uint32_t t = 0; t < w.n; ++t, tk += kstep) {
    const uint8_t* q = region + (w.base + kb_off + (uint64_t)tt * w.ts);
    if (lead) edge += partial_piece(q, off_h, lead) * (kh + tk);
    q += lead;
    for (uint64_t r = 0; r < R; ++r, q += 32) {
      V x0 = vload(q), x1 = vload(q + 16);
      a0 = vadd(a0, x0);
      a1 = vadd(a1, x1);
      b0 = vadd(b0, a0);
      b1 = vadd(b1, a1);
    }
    g0 = vadd(g0, a0);
    g1 = vadd(g1, a1);
    uint64_t kr = kw + tk + 8u * R;
    for (uint64_t i = 0; i < rem; ++i, q += 8, kr += 2u) edge += ld64(q) * kr;
    if (tail) edge += partial_piece(q, 0, tail) * (ktl + tk);
    if (++tt == w.kbt) {
      tt = 0;
      kb_off += w.kbs;
    }
  }
  if (R == 0) return edge;
  uint64_t A[4], B[4], G[4];
  vstore(A, a0);
  vstore(A + 2, a1);
  vstore(B, b0);
  vstore(B + 2, b1);
  vstore(G, g0);
  vstore(G + 2, g1);
  const uint64_t N = (uint64_t)w.n * R, T = w.n, dt = kstep - 8u * R;
  uint64_t acc = edge;
  for (unsigned L = 0; L < 4; ++L) acc += (kw + 2u * L) * A[L] + 8u * (N * A[L] - B[L]) + dt * (T * A[L] - G[L]);
  return acc;
}

/** sum over q < n of word(p + 8q) * (k + 2q), mod 2^64: one contiguous run of pieces. */
inline uint64_t wsum_words(const uint8_t* p, uint64_t n, uint64_t k) {
  const Walk w = {0, 1, 1, 0, 0};
  return wsum_slice(p, w, 0, 8u * n, k, 0);
}

/**
 * Contributions of n bytes at p that sit at positions [c, c + n) of a byte sequence whose piece q
 * (bytes [8q, 8q + 8)) weighs kbase + 2q (bytes of a piece outside the range count as 0).
 */
inline uint64_t wsum_span(const uint8_t* p, uint64_t c, uint64_t n, uint64_t kbase) {
  const Walk w = {0, 1, 1, 0, 0};
  return wsum_slice(p, w, c, n, kbase, 0);
}

/** Adds (count - 1) * stride to lo (negative) or hi (positive). count >= 1. */
inline void span_term(uint64_t count, int64_t stride, i128* lo, i128* hi) {
  i128 d = (i128)(count - 1u) * (i128)stride;
  if (d < 0) *lo += d; else *hi += d;
}

/** The diagnostic sink: fills diag (if any) and returns code. */
inline int fail(kvc_diag* diag, int code, uint32_t at, uint64_t index, const char* reason) {
  if (diag) {
    diag->code = code;
    diag->at = at;
    diag->index = index;
    diag->reason = reason;
  }
  return code;
}

/**
 * Checks an entry's own fields and computes its extent, as kvc_entry_extent; *work is the
 * number of bytes one row reads through it (the work bound: it may not exceed its region).
 * Returns nullptr when valid, else the reason.
 */
const char* entry_extent(const kvc_entry* e, uint64_t* lo_out, uint64_t* hi_out, i128* work) {
  if (e->num_blocks == 0) return "num_blocks is 0";
  i128 lo = (i128)e->offset, hi = (i128)e->offset;
  span_term(e->num_blocks, e->block_stride, &lo, &hi);
  switch (e->kind) {
    case KVC_ENTRY_ATTN: {
      const uint32_t block_tokens = e->block_tokens;
      if (e->outer_count == 0) return "ATTN entry: outer_count (local heads) is 0";
      if (e->kblock_tokens == 0) return "ATTN entry: kblock_tokens is 0";
      if (block_tokens == 0) return "ATTN entry: block_tokens is 0";
      if (block_tokens % e->kblock_tokens != 0)
        return "ATTN entry: block_tokens is not a multiple of kblock_tokens";
      if (e->cell_pieces == 0) return "ATTN entry: cell_pieces is 0";
      if (e->byte_count == 0) return "ATTN entry: byte_count is 0";
      if ((uint64_t)e->byte_start + e->byte_count > (uint64_t)e->cell_pieces * 8u)
        return "ATTN entry: byte_start + byte_count exceeds the cell (cell_pieces * 8)";
      span_term(e->outer_count, e->outer_stride, &lo, &hi);
      span_term(block_tokens / e->kblock_tokens, e->kblock_stride, &lo, &hi);
      span_term(e->kblock_tokens, e->token_stride, &lo, &hi);
      hi += e->byte_count;
      *work = (i128)e->outer_count * block_tokens * e->byte_count;
      break;
    }
    case KVC_ENTRY_ROWS: {
      if (e->block_tokens != 0) return "ROWS entry: block_tokens is not 0";
      if (e->outer_count == 0) return "ROWS entry: outer_count (rows) is 0";
      if (e->elem_bytes != 2 && e->elem_bytes != 4) return "ROWS entry: elem_bytes is not 2 or 4";
      span_term(e->outer_count, e->outer_stride, &lo, &hi);
      i128 elems = 1;
      for (int d = 0; d < 3; ++d) {
        if (e->elem_count[d] == 0) return "ROWS entry: an elem_count is 0";
        span_term(e->elem_count[d], e->elem_stride[d], &lo, &hi);
        elems *= e->elem_count[d];
      }
      hi += e->elem_bytes;
      *work = (i128)e->outer_count * elems * e->elem_bytes;
      break;
    }
    case KVC_ENTRY_STREAM: {
      if (e->block_tokens != 0) return "STREAM entry: block_tokens is not 0";
      if (e->outer_count != 1) return "STREAM entry: outer_count is not 1";
      if (e->byte_count == 0) return "STREAM entry: byte_count is 0";
      hi += e->byte_count;
      *work = e->byte_count;
      break;
    }
    default:
      return "unknown entry kind";
  }
  if (lo < 0) return "entry extent starts before its region (negative offset)";
  if (hi > kU64Max) return "entry extent overflows 64 bits";
  *lo_out = (uint64_t)lo;
  *hi_out = (uint64_t)hi;
  return nullptr;
}

/** True if byte ranges [a, a + an) and [b, b + bn) overlap (both non-empty). */
inline bool overlaps(const void* a, size_t an, const void* b, size_t bn) {
  if (!a || !b || an == 0 || bn == 0) return false;
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return x < y + bn && y < x + an;
}

// ---------------------------------------------------------------------------------------------
// Summation (inputs already validated; all offsets are computed mod 2^64, and the validated
// extents guarantee the final offsets lie inside the region).

void sum_attn(const kvc_entry& e, const uint8_t* region, const kvc_row& r, uint64_t* out) {
  const uint32_t valid = r.valid_tokens;
  if (valid == 0) return;
  const uint64_t P = e.cell_pieces;
  const uint32_t kbt = e.kblock_tokens;
  const uint64_t bs = e.byte_start, bc = e.byte_count;
  const uint64_t ts = (uint64_t)e.token_stride, kbs = (uint64_t)e.kblock_stride;
  const uint64_t os = (uint64_t)e.outer_stride;
  const uint64_t blk = e.offset + (uint64_t)r.block_id * (uint64_t)e.block_stride;
  const uint64_t kstep = 2u * P;                                // weight advance per token
  const uint64_t k0 = 2u * ((uint64_t)r.first_token * P) + 1u;  // weight of piece 0 of token 0
  // Whole cells at consecutive addresses: the tokens of a kernel block are one run of pieces with
  // consecutive j (and the whole block is one run when the kernel blocks follow each other too).
  const bool cells_contig = bs == 0 && bc == 8u * P && ts == bc;
  const bool kblocks_contig = cells_contig && kbs == (uint64_t)kbt * ts;
  const uint32_t full = valid / kbt, rest = valid % kbt;
  uint64_t total = 0;
  for (uint64_t h = 0; h < e.outer_count; ++h) {
    const uint64_t hbase = blk + h * os;
    uint64_t acc;
    if (kblocks_contig) {
      acc = wsum_slice(region, Walk{hbase, 1, 1, 0, 0}, 0, (uint64_t)valid * bc, k0, 0);
    } else if (cells_contig) {
      // full kernel blocks as "tokens" of kbt cells, then the partial one
      acc = full ? wsum_slice(region, Walk{hbase, full, 1, kbs, 0}, 0, (uint64_t)kbt * bc, k0, (uint64_t)kbt * kstep) : 0;
      if (rest)
        acc += wsum_slice(region, Walk{hbase + (uint64_t)full * kbs, 1, 1, 0, 0}, 0, (uint64_t)rest * bc,
                          k0 + (uint64_t)full * kbt * kstep, 0);
    } else {
      acc = wsum_slice(region, Walk{hbase, valid, kbt, kbs, ts}, bs, bc, k0, kstep);
    }
    total += acc * (2u * (e.factor_base + h) + 1u);
  }
  out[r.out_offset + e.column] += total;
}

template <unsigned W>
inline uint64_t ld_elem(const uint8_t* p) {
  return W == 2 ? ld16(p) : ld32(p);
}

/**
 * sum over i < n of elem(p + i * stride) * (k + 2i). The stride is signed: every address it
 * reaches lies inside the region (validated extent), so the pointer arithmetic stays in bounds.
 */
template <unsigned W>
inline uint64_t wsum_elems(const uint8_t* p, uint64_t n, int64_t stride, uint64_t k) {
  uint64_t a0 = 0, a1 = 0;
  uint64_t i = 0;
  if (stride == (int64_t)W) {
    for (; i + 2 <= n; i += 2, k += 4) {
      a0 += ld_elem<W>(p + i * W) * k;
      a1 += ld_elem<W>(p + (i + 1) * W) * (k + 2);
    }
  } else {
    for (; i + 2 <= n; i += 2, k += 4) {
      a0 += ld_elem<W>(p + (int64_t)i * stride) * k;
      a1 += ld_elem<W>(p + (int64_t)(i + 1) * stride) * (k + 2);
    }
  }
  if (i < n) a0 += ld_elem<W>(p + (int64_t)i * stride) * k;
  return a0 + a1;
}

template <unsigned W>
void sum_rows_w(const kvc_entry& e, const uint8_t* region, const kvc_row& r, uint64_t* out) {
  const uint64_t c0 = e.elem_count[0], c1 = e.elem_count[1], c2 = e.elem_count[2];
  const uint64_t s0 = (uint64_t)e.elem_stride[0], s1 = (uint64_t)e.elem_stride[1];  // mod 2^64
  const uint64_t blk = e.offset + (uint64_t)r.block_id * (uint64_t)e.block_stride;
  uint64_t total = 0;
  for (uint64_t i = 0; i < e.outer_count; ++i) {
    const uint64_t rbase = blk + i * (uint64_t)e.outer_stride;
    uint64_t acc = 0;
    uint64_t k = 1;  // 2 * element index + 1
    for (uint64_t i0 = 0; i0 < c0; ++i0) {
      for (uint64_t i1 = 0; i1 < c1; ++i1) {
        acc += wsum_elems<W>(region + (rbase + i0 * s0 + i1 * s1), c2, e.elem_stride[2], k);
        k += 2u * c2;
      }
    }
    total += acc * (2u * (e.factor_base + i) + 1u);
  }
  out[r.out_offset + e.column] += total;
}

void sum_stream(const kvc_entry& e, const uint8_t* region, const kvc_row& r, uint64_t* out) {
  const uint64_t blk = e.offset + (uint64_t)r.block_id * (uint64_t)e.block_stride;
  uint64_t acc = wsum_span(region + blk, e.byte_start, e.byte_count, 1u);
  out[r.out_offset + e.column] += acc * (2u * e.factor_base + 1u);
}

}  // namespace

extern "C" {

int kvc_entry_extent(const kvc_entry* e, uint64_t* lo, uint64_t* hi) {
  if (!e || !lo || !hi) return KVC_EINVAL;
  i128 work = 0;
  uint64_t l = 0, h = 0;
  if (entry_extent(e, &l, &h, &work)) return KVC_EINVAL;
  *lo = l;
  *hi = h;
  return KVC_OK;
}

const char* kvc_entry_check(const kvc_entry* e) {
  if (!e) return "entry is NULL";
  i128 work = 0;
  uint64_t l = 0, h = 0;
  return entry_extent(e, &l, &h, &work);
}

int kvc_check_rows(const kvc_tables* tables, const uint64_t* region_bytes, uint32_t n_regions,
                   const kvc_row* rows, size_t n_rows, size_t out_len, kvc_diag* diag) {
  fail(diag, KVC_OK, KVC_AT_NONE, 0, "ok");
  if (!tables) return fail(diag, KVC_EINVAL, KVC_AT_ARGS, 0, "tables is NULL");
  if (!tables->group_start) return fail(diag, KVC_EINVAL, KVC_AT_ARGS, 0, "group_start is NULL");
  if (n_regions && !region_bytes) return fail(diag, KVC_EINVAL, KVC_AT_ARGS, 0, "region_bytes is NULL");
  if (n_rows && !rows) return fail(diag, KVC_EINVAL, KVC_AT_ARGS, 0, "rows is NULL");
  const uint32_t* gs = tables->group_start;
  const uint32_t ng = tables->n_groups;
  for (uint32_t g = 0; g < ng; ++g)
    if (gs[g] > gs[g + 1])
      return fail(diag, KVC_EINVAL, KVC_AT_GROUP, g + 1u, "group_start is not non-decreasing");
  const uint32_t e_first = gs[0], e_end = gs[ng];
  if (e_end > e_first && !tables->entries) return fail(diag, KVC_EINVAL, KVC_AT_ARGS, 0, "entries is NULL");

  // Entries: own fields, extent, region, work bound.
  for (uint32_t i = e_first; i < e_end; ++i) {
    const kvc_entry& e = tables->entries[i];
    uint64_t lo = 0, hi = 0;
    i128 work = 0;
    if (const char* why = entry_extent(&e, &lo, &hi, &work)) return fail(diag, KVC_EINVAL, KVC_AT_ENTRY, i, why);
    if (e.region >= n_regions)
      return fail(diag, KVC_ERANGE, KVC_AT_ENTRY, i, "entry region index is past the regions given");
    if (hi > region_bytes[e.region])
      return fail(diag, KVC_ERANGE, KVC_AT_ENTRY, i, "entry extent exceeds its region");
    if (work > (i128)region_bytes[e.region])
      return fail(diag, KVC_EINVAL, KVC_AT_ENTRY, i,
                  "entry reads more bytes per block than its region holds (overlapping strides)");
  }

  // Rows.
  for (size_t ri = 0; ri < n_rows; ++ri) {
    const kvc_row& r = rows[ri];
    if (r.group >= ng) return fail(diag, KVC_ERANGE, KVC_AT_ROW, ri, "row group index is past n_groups");
    for (uint32_t i = gs[r.group]; i < gs[r.group + 1]; ++i) {
      const kvc_entry& e = tables->entries[i];
      if (r.block_id >= e.num_blocks)
        return fail(diag, KVC_ERANGE, KVC_AT_ROW, ri, "row block_id is past an entry's num_blocks");
      if ((uint64_t)r.out_offset + e.column >= (uint64_t)out_len)
        return fail(diag, KVC_ERANGE, KVC_AT_ROW, ri, "row out_offset + entry column is past the output");
      if (e.kind == KVC_ENTRY_ATTN && r.valid_tokens > e.block_tokens)
        return fail(diag, KVC_ERANGE, KVC_AT_ROW, ri, "row valid_tokens exceeds the entry's block_tokens");
    }
  }
  return KVC_OK;
}

int kvc_sum_rows_cpu_diag(const kvc_tables* tables, const uint8_t* const* regions,
                          const uint64_t* region_bytes, uint32_t n_regions, const kvc_row* rows,
                          size_t n_rows, uint64_t* out, size_t out_len, kvc_diag* diag) {
  int rc = kvc_check_rows(tables, region_bytes, n_regions, rows, n_rows, out_len, diag);
  if (rc != KVC_OK) return rc;
  if (n_regions && !regions) return fail(diag, KVC_EINVAL, KVC_AT_ARGS, 0, "regions is NULL");
  if (out_len && !out) return fail(diag, KVC_EINVAL, KVC_AT_ARGS, 0, "out is NULL");
  const uint32_t* gs = tables->group_start;
  const uint32_t e_first = gs[0], e_end = gs[tables->n_groups];
  for (uint32_t i = e_first; i < e_end; ++i) {
    const kvc_entry& e = tables->entries[i];
    if (!regions[e.region] && region_bytes[e.region] != 0)
      return fail(diag, KVC_EINVAL, KVC_AT_ENTRY, i, "the entry's region address is NULL");
  }
  // The output is written while the tables and rows are read: it may not share their memory
  // (a write could change a validated row or entry).
  const size_t out_b = out_len * sizeof(uint64_t);
  if (overlaps(out, out_b, rows, n_rows * sizeof(kvc_row)) ||
      overlaps(out, out_b, tables, sizeof(kvc_tables)) ||
      overlaps(out, out_b, gs, ((size_t)tables->n_groups + 1u) * sizeof(uint32_t)) ||
      (e_end > e_first && overlaps(out, out_b, tables->entries + e_first, (size_t)(e_end - e_first) * sizeof(kvc_entry))) ||
      overlaps(out, out_b, regions, (size_t)n_regions * sizeof(void*)) ||
      overlaps(out, out_b, region_bytes, (size_t)n_regions * sizeof(uint64_t)))
    return fail(diag, KVC_EINVAL, KVC_AT_ARGS, 0, "out overlaps the tables, the rows or the region lists");

  for (size_t ri = 0; ri < n_rows; ++ri) {
    const kvc_row& r = rows[ri];
    for (uint32_t i = gs[r.group]; i < gs[r.group + 1]; ++i) {
      const kvc_entry& e = tables->entries[i];
      const uint8_t* region = regions[e.region];
      switch (e.kind) {
        case KVC_ENTRY_ATTN: sum_attn(e, region, r, out); break;
        case KVC_ENTRY_ROWS:
          if (e.elem_bytes == 2) sum_rows_w<2>(e, region, r, out);
          else sum_rows_w<4>(e, region, r, out);
          break;
        default: sum_stream(e, region, r, out); break;
      }
    }
  }
  return KVC_OK;
}

int kvc_sum_rows_cpu(const kvc_tables* tables, const uint8_t* const* regions,
                     const uint64_t* region_bytes, uint32_t n_regions, const kvc_row* rows,
                     size_t n_rows, uint64_t* out, size_t out_len) {
  return kvc_sum_rows_cpu_diag(tables, regions, region_bytes, n_regions, rows, n_rows, out, out_len, nullptr);
}

uint64_t kvc_plain_sum64(const uint8_t* p, size_t n_words) {
  uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  size_t i = 0;
  for (; i + 4 <= n_words; i += 4, p += 32) {
    a0 += ld64(p);
    a1 += ld64(p + 8);
    a2 += ld64(p + 16);
    a3 += ld64(p + 24);
  }
  for (; i < n_words; ++i, p += 8) a0 += ld64(p);
  return (a0 + a1) + (a2 + a3);
}

uint64_t kvc_weighted_sum64(const uint8_t* p, size_t n_words) { return wsum_words(p, n_words, 1u); }

}  // extern "C"
