/**
 * @file kvc_cuda_kernel.cuh
 * @brief The CUDA checksum kernel's per-lane code and table preparation, shared by the kernel
 *        (kvc_checksum_cuda.cu) and the host emulation in the test (test_cuda.cc --emulate, which
 *        runs this same code lane by lane over host memory, so a machine without a GPU checks the
 *        kernel's index arithmetic). See kvc_checksum_cuda.cu for the design.
 *
 * One warp sums one work item: (row, entry, item) where an entry's items are fixed at set_tables:
 *  - ATTN: item = (pair chunk, token chunk). A "pair" is (local head h, unit k of the part's line);
 *    pairs = heads * K. A lane owns a fixed pair and walks tokens, so m (from h) and the piece
 *    index (from k) are loop-invariant: per 16-byte unit it only adds s = x0 + x1 into A, t * s
 *    into B and x1 into C, and multiplies once at the end:
 *      sum_t x0 (c + 2Pt) + x1 (c + 2 + 2Pt) = c*A + 2P*B + 2*C,  c = 2*first_token*P + 2p + 1.
 *    When a chunk has fewer than 32 pairs, lanes also split its tokens (TL token lanes).
 *  - ROWS with contiguous aligned lines of >= 32 units: item = (line, segment of the line); a lane
 *    walks units k of one line: per unit S0 = sum x_q, S1 = sum q * x_q (q < E elements), and
 *      sum_k (2(j + kE) + 1) S0 + 2 S1 = (2j + 1) A + 2E B + 2 C  with A = sum S0, B = sum k S0,
 *      C = sum S1.
 *  - ROWS otherwise (short or strided lines): item = a range of units numbered over the whole
 *    row, each unit decomposed on its own (the general path).
 *  - STREAM: item = a range of units of the one line, as ROWS lines (GEN: piece by piece).
 * Everything is uint64 arithmetic mod 2^64, exactly the CPU kernel's sums regrouped.
 */
#ifndef KVC_CUDA_KERNEL_CUH
#define KVC_CUDA_KERNEL_CUH

#include "kvc_checksum.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__CUDACC__)
#define KVC_HD __host__ __device__ __forceinline__
#else
#define KVC_HD inline
#endif
#if defined(__CUDA_ARCH__)
#define KVC_UNROLL _Pragma("unroll")
#else
#define KVC_UNROLL
#endif

namespace kvc_cuda_detail {

constexpr int kLanes = 32;
constexpr int kWarps = 8;                  // warps per thread block (independent work items)
constexpr int kThreads = kLanes * kWarps;
constexpr int kUnroll = 4;                 // independent loads each lane has in flight
constexpr uint32_t kMaxPairs = 128;        // ATTN pairs per work item (4 per lane)

enum Path : uint32_t { kV16 = 0, kV8 = 1, kGen = 2 };
enum Mode : uint32_t { kAttn = 0, kRowsLine = 1, kRowsUnit = 2, kStream = 3 };

/** n / d for n < 2^31 and 1 <= d < 2^31 by multiply-high (Granlund-Montgomery, as in PyTorch). */
struct FastDiv {
  uint32_t d, m, s, pad;
};

inline FastDiv make_fastdiv(uint32_t d) {
  uint32_t s = 0;
  while ((1ull << s) < d) ++s;
  uint64_t m = ((1ull << 32) * ((1ull << s) - d)) / d + 1;
  return FastDiv{d, (uint32_t)m, s, 0};
}

KVC_HD uint32_t fdiv(const FastDiv& f, uint32_t n) {
#ifdef __CUDA_ARCH__
  return (__umulhi(n, f.m) + n) >> f.s;
#else
  return (uint32_t)((((uint64_t)n * f.m) >> 32) + n) >> f.s;
#endif
}

/** An entry as the kernel reads it (derived from kvc_entry at set_tables). */
struct DevEntry {
  uint64_t base;       // device address of (block 0, head/row 0, token 0, line byte 0)
  int64_t s_block;     // block stride
  int64_t s_outer;     // ATTN: head stride; ROWS: row stride
  int64_t s_tok;       // ATTN: token stride inside a kernel block
  int64_t s_kb;        // ATTN: kernel block stride
  int64_t s_e0, s_e1;  // ROWS: strides of element dims 0 and 1 (after merging)
  int64_t s_e2;        // ROWS: stride of the line's elements
  uint64_t factor_base;
  FastDiv d_k;         // units per line (K)
  FastDiv d_a;         // ROWS: c1
  FastDiv d_b;         // ATTN: kblock_tokens; ROWS: c0
  FastDiv d_ic;        // ATTN: token chunks per pair chunk; ROWS line mode: segments per line
  uint32_t mode, path, column, outer;
  uint32_t k_units;    // units per line
  uint32_t c0, c1, c2; // ROWS: element dims (c2: elements per line)
  uint32_t byte_start, byte_count, cell_pieces, elem_bytes;
  uint32_t seg_units;  // ROWS/STREAM: units per work item
  uint32_t pairs;      // ATTN: heads * K
  uint32_t pcw;        // ATTN: pairs per work item
  uint32_t tc;         // ATTN: tokens per work item
  uint32_t units_total;  // ROWS unit mode: units per row; STREAM: K
  uint32_t pair_inner;   // ATTN: more than 32 pairs per chunk and heads closer than tokens (NHD-like)
};

/** Per group: its work items in the device map. */
struct DevGroup {
  uint32_t map_off, n_items;
};

KVC_HD uint64_t u64of(uint32_t lo, uint32_t hi) { return ((uint64_t)hi << 32) | lo; }

#ifdef __CUDA_ARCH__
__device__ __forceinline__ uint4 ld16(uint64_t a) { return __ldg(reinterpret_cast<const uint4*>(a)); }
__device__ __forceinline__ uint2 ld8(uint64_t a) { return __ldg(reinterpret_cast<const uint2*>(a)); }
__device__ __forceinline__ uint64_t ldb(uint64_t a) { return __ldg(reinterpret_cast<const unsigned char*>(a)); }
/**
 * LH = 1: the 16-byte load with the L1::no_allocate and L2::256B hints (the default kernel's ATTN
 * loads: on an H200 the 128 MiB step's kernel 38.1 us against 39.0-39.2 us unhinted, same run;
 * bench/cuda/README.md, 2026-12-02 session 5).
 */
template <int LH>
__device__ __forceinline__ uint4 ld16h(uint64_t a) {
  if (LH == 0) return ld16(a);
  uint4 v;
  if (LH == 2) {  // also L2 evict_first (a cache policy): the KV bytes do not push the tables, or the engine's data, out of L2
    uint64_t pol;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(a), "l"(pol));
    return v;
  }
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(a));
  return v;
}
#else  // host emulation (test_cuda --emulate): the same code over host memory
inline uint4 ld16(uint64_t a) {
  uint4 v;
  std::memcpy(&v, reinterpret_cast<const void*>(a), 16);
  return v;
}
inline uint2 ld8(uint64_t a) {
  uint2 v;
  std::memcpy(&v, reinterpret_cast<const void*>(a), 8);
  return v;
}
inline uint64_t ldb(uint64_t a) { return *reinterpret_cast<const unsigned char*>(a); }
template <int LH>
inline uint4 ld16h(uint64_t a) {
  return ld16(a);
}
#endif

/** Bytes of a line at `line` (its byte 0 is byte bs of the piece stream) that fall in piece p. */
KVC_HD uint64_t gather_piece(uint64_t line, uint32_t bs, uint32_t bc, uint64_t p) {
  uint64_t lo = p * 8u, hi = lo + 8u;
  if (lo < bs) lo = bs;
  if (hi > (uint64_t)bs + bc) hi = (uint64_t)bs + bc;
  uint64_t x = 0;
  for (uint64_t c = lo; c < hi; ++c) x |= ldb(line + (c - bs)) << (8u * (unsigned)(c - p * 8u));
  return x;
}

// ---------------------------------------------------------------------------------------------
// ATTN

/**
 * Lane `lane`'s partial of ATTN work item `c` for row r (block base blk): pairs of the item's pair
 * chunk, tokens of its token chunk below the row's valid tokens.
 */
template <int P, int UNROLL, int LH = 0>
KVC_HD uint64_t attn_lane(const DevEntry& e, const kvc_row& r, uint64_t blk, uint32_t c, uint32_t lane) {
  const uint32_t pc = fdiv(e.d_ic, c), tcn = c - pc * e.d_ic.d;
  const uint32_t t0 = tcn * e.tc;
  const uint32_t t1 = r.valid_tokens < t0 + e.tc ? r.valid_tokens : t0 + e.tc;
  if (t0 >= t1) return 0;
  const uint32_t p0 = pc * e.pcw;
  const uint32_t p1 = p0 + e.pcw < e.pairs ? p0 + e.pcw : e.pairs;
  const uint32_t np = p1 - p0;
  const uint32_t G = np >= (uint32_t)kLanes ? (uint32_t)kLanes : np;  // lanes per token lane
  const uint32_t TL = kLanes / G;                                     // token lanes
  const uint32_t tl = lane / G;
  if (tl >= TL) return 0;
  const uint32_t kbt = e.d_b.d;
  // the token step TL as (kernel blocks, tokens): one carry at most per step
  const uint32_t step_kb = fdiv(e.d_b, TL), step_tin = TL - step_kb * kbt;
  const int64_t d_step = (int64_t)step_kb * e.s_kb + (int64_t)step_tin * e.s_tok;
  const int64_t d_carry = e.s_kb - (int64_t)kbt * e.s_tok;
  const uint64_t cp = e.cell_pieces;
  const uint64_t c_row = 2u * (uint64_t)r.first_token * cp + 2u * (e.byte_start / 8u) + 1u;
  constexpr int U = P == kGen ? 1 : UNROLL;  // byte gathers: no unrolling (registers)
  uint64_t acc = 0;
  for (uint32_t pair = p0 + lane % G; pair < p1; pair += G) {
    const uint32_t h = fdiv(e.d_k, pair), k = pair - h * e.k_units;
    const uint64_t hbase = blk + (uint64_t)((int64_t)h * e.s_outer);
    uint32_t t = t0 + tl;
    const uint32_t kb0 = fdiv(e.d_b, t);
    uint32_t tin = t - kb0 * kbt;
    uint64_t off = (uint64_t)((int64_t)kb0 * e.s_kb + (int64_t)tin * e.s_tok);
    uint64_t A = 0, B = 0, C = 0;
    while (t < t1) {
      uint4 v[U];
      const uint32_t tb = t;  // token of v[0]; v[q] is token tb + q * TL
      KVC_UNROLL
      for (int q = 0; q < U; ++q) {
        v[q] = make_uint4(0, 0, 0, 0);
        if (t < t1) {
          const uint64_t line = hbase + off;
          if (P == kV16) {
            v[q] = ld16h<LH>(line + 16u * k);
          } else if (P == kV8) {
            const uint2 x = ld8(line + 8u * k);
            v[q] = make_uint4(x.x, x.y, 0, 0);
          } else {
            const uint64_t x = gather_piece(line, e.byte_start, e.byte_count, e.byte_start / 8u + k);
            v[q] = make_uint4((uint32_t)x, (uint32_t)(x >> 32), 0, 0);
          }
        }
        t += TL;
        tin += step_tin;
        off += (uint64_t)d_step;
        if (tin >= kbt) {
          tin -= kbt;
          off += (uint64_t)d_carry;
        }
      }
      KVC_UNROLL
      for (int q = 0; q < U; ++q) {
        const uint64_t x0 = u64of(v[q].x, v[q].y);
        if (P == kV16) {
          const uint64_t x1 = u64of(v[q].z, v[q].w);
          const uint64_t s = x0 + x1;
          A += s;
          B += s * (tb + q * TL);
          C += x1;
        } else {
          A += x0;
          B += x0 * (tb + q * TL);
        }
      }
    }
    const uint64_t piece = P == kV16 ? 2u * (uint64_t)k : (uint64_t)k;  // piece index past byte_start / 8
    const uint64_t m = 2u * (e.factor_base + h) + 1u;
    acc += m * ((c_row + 2u * piece) * A + 2u * cp * B + 2u * C);
  }
  return acc;
}

/**
 * ATTN, pairs inner (for layouts whose heads are closer in memory than tokens, like NHD, when a
 * chunk has more than 32 pairs): the lane's pairs are lane + 32 i (i < kMaxPairs / 32), taken NP at
 * a time; for each pass the lane walks the tokens, TU tokens at a time, with the loads of its NP
 * pairs and TU tokens in flight together, so a warp reads each token's heads as contiguous runs,
 * like a plain sequential read. Accumulators per pair.
 */
template <int P, int NP, int TU, int LH = 0>
KVC_HD uint64_t attn_lane_pi(const DevEntry& e, const kvc_row& r, uint64_t blk, uint32_t c, uint32_t lane) {
  const uint32_t pc = fdiv(e.d_ic, c), tcn = c - pc * e.d_ic.d;
  const uint32_t t0 = tcn * e.tc;
  const uint32_t t1 = r.valid_tokens < t0 + e.tc ? r.valid_tokens : t0 + e.tc;
  if (t0 >= t1) return 0;
  const uint32_t p0 = pc * e.pcw;
  const uint32_t p1 = p0 + e.pcw < e.pairs ? p0 + e.pcw : e.pairs;
  const uint32_t kbt = e.d_b.d;
  constexpr uint32_t kUB = P == kV16 ? 16u : 8u;
  const uint32_t kb0 = fdiv(e.d_b, t0);
  const uint32_t tin0 = t0 - kb0 * kbt;
  const uint64_t off0 = (uint64_t)((int64_t)kb0 * e.s_kb + (int64_t)tin0 * e.s_tok);
  const int64_t d_carry = e.s_kb - (int64_t)(kbt - 1) * e.s_tok;
  const uint64_t cp = e.cell_pieces;
  const uint64_t c_row = 2u * (uint64_t)r.first_token * cp + 2u * (e.byte_start / 8u) + 1u;
  uint64_t acc = 0;
  for (uint32_t pass = 0; pass < kMaxPairs / kLanes; pass += NP) {
    if (p0 + pass * kLanes >= p1) break;  // uniform over the warp
    uint64_t base[NP], A[NP], B[NP], C[NP];
    KVC_UNROLL
    for (int i = 0; i < NP; ++i) {
      const uint32_t pair = p0 + lane + kLanes * (pass + i);
      const uint32_t h = fdiv(e.d_k, pair), k = pair - h * e.k_units;
      base[i] = blk + (uint64_t)((int64_t)h * e.s_outer) + kUB * k;
      A[i] = B[i] = C[i] = 0;
    }
    uint32_t tin = tin0;
    uint64_t off = off0;
    for (uint32_t t = t0; t < t1; t += TU) {
      uint4 v[TU][NP];
      KVC_UNROLL
      for (int q = 0; q < TU; ++q) {
        KVC_UNROLL
        for (int i = 0; i < NP; ++i) {
          v[q][i] = make_uint4(0, 0, 0, 0);
          if (t + q < t1 && p0 + lane + kLanes * (pass + i) < p1) {
            if (P == kV16) {
              v[q][i] = ld16h<LH>(base[i] + off);
            } else {
              const uint2 x = ld8(base[i] + off);
              v[q][i] = make_uint4(x.x, x.y, 0, 0);
            }
          }
        }
        if (++tin == kbt) {
          tin = 0;
          off += (uint64_t)d_carry;
        } else {
          off += (uint64_t)e.s_tok;
        }
      }
      KVC_UNROLL
      for (int q = 0; q < TU; ++q) {
        KVC_UNROLL
        for (int i = 0; i < NP; ++i) {
          const uint64_t x0 = u64of(v[q][i].x, v[q][i].y);
          if (P == kV16) {
            const uint64_t x1 = u64of(v[q][i].z, v[q][i].w);
            const uint64_t s = x0 + x1;
            A[i] += s;
            B[i] += s * (t + q);
            C[i] += x1;
          } else {
            A[i] += x0;
            B[i] += x0 * (t + q);
          }
        }
      }
    }
    KVC_UNROLL
    for (int i = 0; i < NP; ++i) {
      const uint32_t pair = p0 + lane + kLanes * (pass + i);
      const uint32_t h = fdiv(e.d_k, pair), k = pair - h * e.k_units;
      const uint64_t piece = P == kV16 ? 2u * (uint64_t)k : (uint64_t)k;
      const uint64_t m = 2u * (e.factor_base + h) + 1u;
      if (pair < p1) acc += m * ((c_row + 2u * piece) * A[i] + 2u * cp * B[i] + 2u * C[i]);
    }
  }
  return acc;
}

// ---------------------------------------------------------------------------------------------
// ROWS

/** S0 = sum x_q and S1 = sum q * x_q of the W-byte elements packed in n 32-bit words. */
template <int W, int N>
KVC_HD void elem_sums(const uint32_t* x, uint64_t* s0, uint64_t* s1) {
  if (W == 2) {  // at most 8 elements of 16 bits: both sums fit 32 bits
    uint32_t a = 0, b = 0;
    KVC_UNROLL
    for (int i = 0; i < N; ++i) {
      const uint32_t lo = x[i] & 0xffffu, hi = x[i] >> 16;
      a += lo + hi;
      b += lo * (uint32_t)(2 * i) + hi * (uint32_t)(2 * i + 1);
    }
    *s0 = a;
    *s1 = b;
  } else {
    uint64_t a = 0, b = 0;
    KVC_UNROLL
    for (int i = 0; i < N; ++i) {
      a += x[i];
      b += (uint64_t)x[i] * (uint32_t)i;
    }
    *s0 = a;
    *s1 = b;
  }
}

/** Line mode: lane's partial of segment `seg` of one contiguous, aligned line. */
template <int P, int W>
KVC_HD uint64_t rows_line_lane(const DevEntry& e, uint64_t blk, uint32_t c, uint32_t lane) {
  constexpr int kUnitBytes = P == kV16 ? 16 : 8;
  constexpr int kElems = kUnitBytes / W;
  const uint32_t line = fdiv(e.d_ic, c), seg = c - line * e.d_ic.d;
  const uint32_t q1 = fdiv(e.d_a, line), e1 = line - q1 * e.c1;
  const uint32_t i = fdiv(e.d_b, q1), e0 = q1 - i * e.c0;
  const uint64_t la = blk + (uint64_t)((int64_t)i * e.s_outer) + (uint64_t)((int64_t)e0 * e.s_e0) +
                      (uint64_t)((int64_t)e1 * e.s_e1);
  const uint32_t k0 = seg * e.seg_units;
  const uint32_t k1 = k0 + e.seg_units < e.k_units ? k0 + e.seg_units : e.k_units;
  uint64_t A = 0, B = 0, C = 0;
  for (uint32_t k = k0 + lane; k < k1; k += kLanes * kUnroll) {
    uint4 v[kUnroll];
    KVC_UNROLL
    for (int q = 0; q < kUnroll; ++q) {
      const uint32_t kk = k + q * kLanes;
      v[q] = make_uint4(0, 0, 0, 0);
      if (kk < k1) {
        if (P == kV16) {
          v[q] = ld16(la + 16u * kk);
        } else {
          const uint2 x = ld8(la + 8u * kk);
          v[q] = make_uint4(x.x, x.y, 0, 0);
        }
      }
    }
    KVC_UNROLL
    for (int q = 0; q < kUnroll; ++q) {
      const uint32_t x[4] = {v[q].x, v[q].y, v[q].z, v[q].w};
      uint64_t s0, s1;
      elem_sums<W, kUnitBytes / 4>(x, &s0, &s1);
      A += s0;
      B += s0 * (k + q * kLanes);  // zero past k1 (s0 = 0)
      C += s1;
    }
  }
  const uint64_t j = ((uint64_t)e0 * e.c1 + e1) * e.c2;
  const uint64_t m = 2u * (e.factor_base + i) + 1u;
  return m * ((2u * j + 1u) * A + 2u * (uint64_t)kElems * B + 2u * C);
}

/** Unit mode: units [u0, u1) numbered over the whole row, each decomposed on its own. */
template <int P, int W>
KVC_HD uint64_t rows_unit_lane(const DevEntry& e, uint64_t blk, uint32_t c, uint32_t lane) {
  constexpr int kUnitBytes = P == kV16 ? 16 : (P == kV8 ? 8 : W);
  constexpr int kElems = kUnitBytes / W;
  const uint32_t u0 = c * e.seg_units;
  const uint32_t u1 = u0 + e.seg_units < e.units_total ? u0 + e.seg_units : e.units_total;
  uint64_t acc = 0;
  for (uint32_t u = u0 + lane; u < u1; u += kLanes * kUnroll) {
    uint4 v[kUnroll];
    uint64_t j[kUnroll], m[kUnroll];
    KVC_UNROLL
    for (int q = 0; q < kUnroll; ++q) {
      const uint32_t uu = u + q * kLanes;
      v[q] = make_uint4(0, 0, 0, 0);
      m[q] = 0;
      j[q] = 0;
      if (uu < u1) {
        const uint32_t line = fdiv(e.d_k, uu);
        const uint32_t k = uu - line * e.k_units;
        const uint32_t q1 = fdiv(e.d_a, line);
        const uint32_t e1 = line - q1 * e.c1;
        const uint32_t i = fdiv(e.d_b, q1);
        const uint32_t e0 = q1 - i * e.c0;
        const uint64_t la = blk + (uint64_t)((int64_t)i * e.s_outer) + (uint64_t)((int64_t)e0 * e.s_e0) +
                            (uint64_t)((int64_t)e1 * e.s_e1);
        m[q] = 2u * (e.factor_base + i) + 1u;
        j[q] = ((uint64_t)e0 * e.c1 + e1) * e.c2 + (uint64_t)k * kElems;
        if (P == kV16) {
          v[q] = ld16(la + 16u * k);
        } else if (P == kV8) {
          const uint2 x = ld8(la + 8u * k);
          v[q] = make_uint4(x.x, x.y, 0, 0);
        } else {
          const uint64_t a = la + (uint64_t)((int64_t)k * e.s_e2);
          uint32_t x = (uint32_t)ldb(a) | ((uint32_t)ldb(a + 1) << 8);
          if (W == 4) x |= ((uint32_t)ldb(a + 2) << 16) | ((uint32_t)ldb(a + 3) << 24);
          v[q].x = x;
        }
      }
    }
    KVC_UNROLL
    for (int q = 0; q < kUnroll; ++q) {
      const uint32_t x[4] = {v[q].x, v[q].y, v[q].z, v[q].w};
      uint64_t s0, s1;
      elem_sums<W, (kUnitBytes + 3) / 4>(x, &s0, &s1);
      acc += m[q] * ((2u * j[q] + 1u) * s0 + 2u * s1);
    }
  }
  return acc;
}

// ---------------------------------------------------------------------------------------------
// STREAM

template <int P>
KVC_HD uint64_t stream_lane(const DevEntry& e, uint64_t blk, uint32_t c, uint32_t lane) {
  const uint32_t u0 = c * e.seg_units;
  const uint32_t u1 = u0 + e.seg_units < e.units_total ? u0 + e.seg_units : e.units_total;
  const uint64_t piece0 = e.byte_start / 8u;
  const uint64_t m = 2u * e.factor_base + 1u;
  if (P == kGen) {  // unaligned edges: one piece per unit, byte by byte
    uint64_t acc = 0;
    for (uint32_t u = u0 + lane; u < u1; u += kLanes) {
      const uint64_t p = piece0 + u;
      acc += gather_piece(blk, e.byte_start, e.byte_count, p) * (2u * p + 1u);
    }
    return acc * m;
  }
  uint64_t A = 0, B = 0, C = 0;
  for (uint32_t u = u0 + lane; u < u1; u += kLanes * kUnroll) {
    uint4 v[kUnroll];
    KVC_UNROLL
    for (int q = 0; q < kUnroll; ++q) {
      const uint32_t uu = u + q * kLanes;
      v[q] = make_uint4(0, 0, 0, 0);
      if (uu < u1) {
        if (P == kV16) {
          v[q] = ld16(blk + 16u * uu);
        } else {
          const uint2 x = ld8(blk + 8u * uu);
          v[q] = make_uint4(x.x, x.y, 0, 0);
        }
      }
    }
    KVC_UNROLL
    for (int q = 0; q < kUnroll; ++q) {
      const uint64_t x0 = u64of(v[q].x, v[q].y);
      const uint32_t uu = u + q * kLanes;
      if (P == kV16) {
        const uint64_t x1 = u64of(v[q].z, v[q].w);
        const uint64_t s = x0 + x1;
        A += s;
        B += s * uu;
        C += x1;
      } else {
        A += x0;
        B += x0 * uu;
      }
    }
  }
  // V16: unit u holds pieces p0 + 2u, +1: (2p0 + 1 + 4u) x0 + (2p0 + 3 + 4u) x1; V8: (2p0 + 1 + 2u) x
  const uint64_t c0 = 2u * piece0 + 1u;
  if (P == kV16) return m * (c0 * A + 4u * B + 2u * C);
  return m * (c0 * A + 2u * B);
}

// ---------------------------------------------------------------------------------------------
// Dispatch

/**
 * The work item (row r, item bx of its group): its entry, block base address and chunk index.
 * Returns false when bx is past the group's items.
 */
KVC_HD bool item_of(const DevEntry* entries, const DevGroup* groups, const uint2* items, const kvc_row& r, uint32_t bx,
                    const DevEntry** e_out, uint64_t* blk, uint32_t* chunk) {
  const DevGroup g = groups[r.group];
  if (bx >= g.n_items) return false;
  const uint2 it = items[g.map_off + bx];
  const DevEntry& e = entries[it.x];
  *chunk = it.y;
  *blk = e.base + (uint64_t)((int64_t)r.block_id * e.s_block);
  *e_out = &e;
  return true;
}

/**
 * Lane `lane`'s partial sum of chunk `c` of entry e for row r (one warp's work item). AU: loads in
 * flight per lane on the ATTN tokens-inner paths; AU = 1 / 2: the pairs-inner path where it
 * applies (4 pairs x 1 token / 2 pairs x 2 tokens in flight per lane; else tokens inner, kUnroll).
 * LH = 1: the ATTN 16-byte loads carry the L1::no_allocate / L2::256B hints (ld16h).
 */
template <int AU = 1, int LH = 0>
KVC_HD uint64_t lane_partial(const DevEntry& e, uint64_t blk, const kvc_row& r, uint32_t c, uint32_t lane) {
  switch (e.mode) {
    case kAttn:
      if (e.path == kV16) {
        if (AU == 1 && e.pair_inner) return attn_lane_pi<kV16, 4, 1, LH>(e, r, blk, c, lane);
        if (AU == 2 && e.pair_inner) return attn_lane_pi<kV16, 2, 2, LH>(e, r, blk, c, lane);
        return attn_lane<kV16, AU <= 2 ? kUnroll : AU, LH>(e, r, blk, c, lane);
      }
      if (e.path == kV8) {
        if (AU == 1 && e.pair_inner) return attn_lane_pi<kV8, 4, 1>(e, r, blk, c, lane);
        if (AU == 2 && e.pair_inner) return attn_lane_pi<kV8, 2, 2>(e, r, blk, c, lane);
        return attn_lane<kV8, AU <= 2 ? kUnroll : AU>(e, r, blk, c, lane);
      }
      return attn_lane<kGen, 1>(e, r, blk, c, lane);
    case kRowsLine:
      if (e.elem_bytes == 2) return e.path == kV16 ? rows_line_lane<kV16, 2>(e, blk, c, lane) : rows_line_lane<kV8, 2>(e, blk, c, lane);
      return e.path == kV16 ? rows_line_lane<kV16, 4>(e, blk, c, lane) : rows_line_lane<kV8, 4>(e, blk, c, lane);
    case kRowsUnit:
      if (e.elem_bytes == 2) {
        if (e.path == kV16) return rows_unit_lane<kV16, 2>(e, blk, c, lane);
        if (e.path == kV8) return rows_unit_lane<kV8, 2>(e, blk, c, lane);
        return rows_unit_lane<kGen, 2>(e, blk, c, lane);
      }
      if (e.path == kV16) return rows_unit_lane<kV16, 4>(e, blk, c, lane);
      if (e.path == kV8) return rows_unit_lane<kV8, 4>(e, blk, c, lane);
      return rows_unit_lane<kGen, 4>(e, blk, c, lane);
    default:
      if (e.path == kV16) return stream_lane<kV16>(e, blk, c, lane);
      if (e.path == kV8) return stream_lane<kV8>(e, blk, c, lane);
      return stream_lane<kGen>(e, blk, c, lane);
  }
}

/**
 * The specialized kernels' per-lane code (kvc_checksum_cuda.cu, variants 33, 35, 37): for tables
 * whose every entry is ATTN on the 16-byte path, only the two ATTN V16 paths are compiled in (no
 * ROWS, STREAM, V8 or byte paths: less code and fewer registers than lane_partial's whole dispatch;
 * on sm_90 64 registers without spills, where the general kernel spills 16 bytes).
 * Both paths as the general V32 (pairs inner 2 pairs x 2 tokens, tokens inner 4 loads), and:
 * SPEC 3 (variant 35, the default): loads hinted L1::no_allocate / L2::256B on both paths;
 * SPEC 1 (33): the tokens-inner loads unhinted; SPEC 5 (37): as 3 plus an L2 evict_first policy.
 * (Tried and removed, 2026-12-02 session 6: 4 pairs x 1 token, which spills at 64 registers, and
 * 2 pairs x 4 tokens: both slower on the H200, bench/cuda/README.md.)
 */
template <int SPEC>
KVC_HD uint64_t lane_partial_attn16(const DevEntry& e, uint64_t blk, const kvc_row& r, uint32_t c, uint32_t lane) {
  constexpr int LH = SPEC == 5 ? 2 : 1;
  constexpr int LHTI = SPEC == 1 ? 0 : LH;
  if (e.pair_inner) return attn_lane_pi<kV16, 2, 2, LH>(e, r, blk, c, lane);
  return attn_lane<kV16, kUnroll, LHTI>(e, r, blk, c, lane);
}

/** True when every entry takes the ATTN V16 path (the specialized kernels apply). */
inline bool all_attn_v16(const DevEntry* e, size_t n) {
  if (n == 0) return false;
  for (size_t i = 0; i < n; ++i)
    if (e[i].mode != kAttn || e[i].path != kV16) return false;
  return true;
}

// ---------------------------------------------------------------------------------------------
// Table preparation (host)

/** Lowest set bit of x (as an alignment); 0 -> 2^63 (no constraint). */
inline uint64_t low_bit(uint64_t x) { return x ? (x & (~x + 1u)) : (1ull << 63); }

/** Host copy of a group's row checks, to validate a step's rows in O(rows). */
struct HostGroup {
  uint32_t min_blocks = UINT32_MAX;        // min num_blocks of its entries
  uint32_t max_column = 0;
  uint32_t min_block_tokens = UINT32_MAX;  // ATTN entries only
  uint32_t n_items = 0;
  bool has_entries = false;
};

/** Merges ROWS element dims whose strides chain (row-major order is kept, so j is unchanged). */
inline void merge_dims(const kvc_entry& e, uint32_t c[3], int64_t s[3]) {
  uint32_t cc[3];
  int64_t ss[3];
  int n = 0;
  for (int d = 0; d < 3; ++d)
    if (e.elem_count[d] > 1) {
      cc[n] = e.elem_count[d];
      ss[n] = e.elem_stride[d];
      ++n;
    }
  // (outer a = k, inner b = k + 1) -> one dim of count c_a * c_b and stride s_b if s_a == c_b * s_b
  for (int k = n - 2; k >= 0; --k) {
    if ((__int128)ss[k] == (__int128)cc[k + 1] * ss[k + 1] && (uint64_t)cc[k] * cc[k + 1] < 0x80000000ull) {
      cc[k + 1] *= cc[k];
      for (int q = k; q + 1 < n; ++q) {
        cc[q] = cc[q + 1];
        ss[q] = ss[q + 1];
      }
      --n;
    }
  }
  // right-align: unused outer dims have count 1 and stride 0
  for (int d = 0; d < 3; ++d) {
    c[d] = 1;
    s[d] = 0;
  }
  for (int k = 0; k < n; ++k) {
    c[3 - n + k] = cc[k];
    s[3 - n + k] = ss[k];
  }
  if (n == 0) s[2] = (int64_t)e.elem_bytes;
}

inline uint32_t ceil_div(uint64_t a, uint64_t b) { return (uint32_t)((a + b - 1) / b); }

/**
 * Prepares one validated entry for items of about item_bytes bytes; *n_items gets its work item
 * count. Returns nullptr or why the CUDA kernel cannot take the entry.
 */
inline const char* prepare_entry(const kvc_entry& e, uint64_t region_addr, uint32_t item_bytes, DevEntry* out,
                                 uint64_t* n_items) {
  DevEntry d;
  std::memset(&d, 0, sizeof d);
  d.base = region_addr + e.offset;
  d.s_block = e.block_stride;
  d.factor_base = e.factor_base;
  d.column = e.column;
  d.outer = e.outer_count;
  d.d_a = d.d_b = d.d_ic = make_fastdiv(1);
  uint64_t align = low_bit(d.base);
  if (e.num_blocks > 1) align = std::min(align, low_bit((uint64_t)e.block_stride));
  const uint64_t min_seg = (uint64_t)kLanes * kUnroll;  // units a warp loads in one pass
  auto piece_path = [&](uint32_t bs, uint32_t bc, uint64_t al, uint64_t* unit_bytes) {
    const bool piece_aligned = bs % 8u == 0;
    if (piece_aligned && bc % 16u == 0 && al >= 16) {
      d.path = kV16;
      d.k_units = bc / 16u;
      *unit_bytes = 16;
    } else if (piece_aligned && bc % 8u == 0 && al >= 8) {
      d.path = kV8;
      d.k_units = bc / 8u;
      *unit_bytes = 8;
    } else {
      d.path = kGen;
      d.k_units = (uint32_t)(((uint64_t)bs + bc + 7u) / 8u - bs / 8u);
      *unit_bytes = 8;
    }
  };
  if (e.kind == KVC_ENTRY_ATTN) {
    d.mode = kAttn;
    d.s_outer = e.outer_stride;
    d.s_tok = e.token_stride;
    d.s_kb = e.kblock_stride;
    d.byte_start = e.byte_start;
    d.byte_count = e.byte_count;
    d.cell_pieces = e.cell_pieces;
    if (e.outer_count > 1) align = std::min(align, low_bit((uint64_t)e.outer_stride));
    if (e.kblock_tokens > 1) align = std::min(align, low_bit((uint64_t)e.token_stride));
    if (e.block_tokens > e.kblock_tokens) align = std::min(align, low_bit((uint64_t)e.kblock_stride));
    uint64_t ub = 16;
    piece_path(e.byte_start, e.byte_count, align, &ub);
    const uint64_t pairs = (uint64_t)e.outer_count * d.k_units;
    if (pairs >= 0x80000000ull || e.block_tokens >= 0x80000000u || e.kblock_tokens >= 0x80000000u)
      return "ATTN entry too large for the CUDA kernel (heads * units per cell or tokens >= 2^31)";
    d.pairs = (uint32_t)pairs;
    d.pcw = (uint32_t)std::min<uint64_t>(pairs, kMaxPairs);
    uint64_t tc = std::max<uint64_t>(1, item_bytes / ((uint64_t)d.pcw * ub));
    if (tc >= (uint64_t)kUnroll) tc -= tc % kUnroll;
    tc = std::min<uint64_t>(tc, e.block_tokens);
    d.tc = (uint32_t)tc;
    const uint32_t n_tc = ceil_div(e.block_tokens, tc), n_pc = ceil_div(pairs, d.pcw);
    d.d_ic = make_fastdiv(n_tc);
    d.d_b = make_fastdiv(e.kblock_tokens);
    const uint64_t a_tok = e.token_stride < 0 ? (uint64_t)0 - (uint64_t)e.token_stride : (uint64_t)e.token_stride;
    const uint64_t a_head = e.outer_stride < 0 ? (uint64_t)0 - (uint64_t)e.outer_stride : (uint64_t)e.outer_stride;
    d.pair_inner = d.pcw > (uint32_t)kLanes && d.path != kGen && (e.kblock_tokens == 1 || a_tok >= a_head) ? 1u : 0u;
    *n_items = (uint64_t)n_tc * n_pc;
  } else if (e.kind == KVC_ENTRY_ROWS) {
    uint32_t c[3];
    int64_t s[3];
    merge_dims(e, c, s);
    d.s_outer = e.outer_stride;
    d.s_e0 = s[0];
    d.s_e1 = s[1];
    d.s_e2 = s[2];
    d.c0 = c[0];
    d.c1 = c[1];
    d.c2 = c[2];
    d.elem_bytes = e.elem_bytes;
    if (e.outer_count > 1) align = std::min(align, low_bit((uint64_t)e.outer_stride));
    if (c[0] > 1) align = std::min(align, low_bit((uint64_t)s[0]));
    if (c[1] > 1) align = std::min(align, low_bit((uint64_t)s[1]));
    const uint64_t line_bytes = (uint64_t)c[2] * e.elem_bytes;
    const bool contig = c[2] == 1 || s[2] == (int64_t)e.elem_bytes;
    uint64_t ub = e.elem_bytes;
    if (contig && line_bytes % 16u == 0 && align >= 16) {
      d.path = kV16;
      d.k_units = (uint32_t)(line_bytes / 16u);
      ub = 16;
    } else if (contig && line_bytes % 8u == 0 && align >= 8) {
      d.path = kV8;
      d.k_units = (uint32_t)(line_bytes / 8u);
      ub = 8;
    } else {
      d.path = kGen;
      d.k_units = c[2];
    }
    d.d_a = make_fastdiv(c[1]);
    d.d_b = make_fastdiv(c[0]);
    const uint64_t lines = (uint64_t)e.outer_count * c[0] * c[1];
    const uint64_t total = lines * d.k_units;
    if (total >= 0x80000000ull) return "ROWS entry too large for the CUDA kernel (units per block >= 2^31)";
    uint64_t seg = std::max<uint64_t>(min_seg, item_bytes / ub);
    if (d.path == kGen) seg = std::max<uint64_t>(min_seg, seg / 4);  // byte loads: smaller items
    seg -= seg % min_seg;
    if (d.path != kGen && d.k_units >= min_seg) {  // long aligned lines: line mode
      d.mode = kRowsLine;
      d.seg_units = (uint32_t)seg;
      const uint32_t n_seg = ceil_div(d.k_units, seg);
      d.d_ic = make_fastdiv(n_seg);
      *n_items = lines * n_seg;
    } else {
      d.mode = kRowsUnit;
      d.seg_units = (uint32_t)seg;
      d.units_total = (uint32_t)total;
      *n_items = ceil_div(total, seg);
    }
  } else {  // STREAM
    d.mode = kStream;
    d.byte_start = e.byte_start;
    d.byte_count = e.byte_count;
    uint64_t ub = 16;
    piece_path(e.byte_start, e.byte_count, align, &ub);
    uint64_t seg = std::max<uint64_t>(min_seg, item_bytes / ub);
    if (d.path == kGen) seg = std::max<uint64_t>(min_seg, seg / 4);
    seg -= seg % min_seg;
    d.seg_units = (uint32_t)seg;
    d.units_total = d.k_units;
    *n_items = ceil_div(d.k_units, seg);
  }
  if (d.k_units == 0 || d.k_units >= 0x80000000u) return "entry line too large for the CUDA kernel";
  d.d_k = make_fastdiv(d.k_units);
  if (*n_items >= 0x80000000ull) return "entry needs too many work items";
  *out = d;
  return nullptr;
}

/** Everything set_tables uploads, and the host's per-group row checks. */
struct Prepared {
  std::vector<DevEntry> entries;  // entries[group_start[0] ..) re-based at 0
  std::vector<DevGroup> groups;
  std::vector<uint2> items;       // (entry, chunk) per work item, group by group
  std::vector<HostGroup> host;
};

/**
 * Prepares tables already checked by kvc_check_rows (tables only). Returns nullptr, or why the
 * kernel cannot take them with *bad_entry set.
 */
inline const char* prepare_tables(const kvc_tables* t, const uint64_t* region_addr, uint32_t item_bytes, Prepared* p,
                                  uint32_t* bad_entry) {
  const uint32_t ng = t->n_groups;
  const uint32_t e_first = t->group_start[0], e_end = t->group_start[ng];
  p->entries.assign(e_end - e_first, DevEntry{});
  p->groups.assign(ng, DevGroup{});
  p->host.assign(ng, HostGroup{});
  p->items.clear();
  for (uint32_t g = 0; g < ng; ++g) {
    p->groups[g].map_off = (uint32_t)p->items.size();
    for (uint32_t i = t->group_start[g]; i < t->group_start[g + 1]; ++i) {
      const kvc_entry& e = t->entries[i];
      uint64_t n = 0;
      DevEntry& d = p->entries[i - e_first];
      *bad_entry = i;
      if (const char* why = prepare_entry(e, region_addr[e.region], item_bytes, &d, &n)) return why;
      if (p->items.size() + n >= 0x7fffffffull) return "too many work items";
      for (uint64_t c = 0; c < n; ++c) p->items.push_back(make_uint2(i - e_first, (uint32_t)c));
      HostGroup& h = p->host[g];
      h.has_entries = true;
      h.min_blocks = std::min(h.min_blocks, e.num_blocks);
      h.max_column = std::max(h.max_column, e.column);
      if (e.kind == KVC_ENTRY_ATTN) h.min_block_tokens = std::min(h.min_block_tokens, e.block_tokens);
    }
    p->groups[g].n_items = (uint32_t)p->items.size() - p->groups[g].map_off;
    p->host[g].n_items = p->groups[g].n_items;
  }
  return nullptr;
}

}  // namespace kvc_cuda_detail

#endif  // KVC_CUDA_KERNEL_CUH
