/**
 * @file checksum_isa.h
 * @brief Internal: the CPU kernel's summation loop, compiled once per instruction set
 *        (checksum_kernel.inc in checksum_isa_*.cc) and chosen at run time by checksum_cpu.cc.
 *
 * Every variant computes the same sums (SPEC v1 sections 2-3, bit for bit); they differ only in
 * vector width: generic (SSE2 on x86-64, NEON on aarch64, else scalar; 4 words per iteration),
 * AVX2 (8 words) and AVX-512F (16 words). Inputs are validated by kvc_check_rows before any
 * variant runs.
 */
#ifndef KVC_CHECKSUM_ISA_H
#define KVC_CHECKSUM_ISA_H

#include <cstddef>
#include <cstdint>

#include "kvc_checksum.h"

namespace kvc_isa {

/** Adds every row's contributions into out (validated inputs; see kvc_sum_rows_cpu). */
typedef void (*SumRowsFn)(const kvc_tables* tables, const uint8_t* const* regions, const kvc_row* rows,
                          size_t n_rows, uint64_t* out);

namespace generic {
void sum_rows(const kvc_tables* tables, const uint8_t* const* regions, const kvc_row* rows, size_t n_rows, uint64_t* out);
uint64_t weighted_words(const uint8_t* p, size_t n_words);
}  // namespace generic
#if defined(__x86_64__) || defined(_M_X64)
#define KVC_HAVE_X86_VARIANTS 1
namespace avx2 {
void sum_rows(const kvc_tables* tables, const uint8_t* const* regions, const kvc_row* rows, size_t n_rows, uint64_t* out);
uint64_t weighted_words(const uint8_t* p, size_t n_words);
}  // namespace avx2
namespace avx512 {
void sum_rows(const kvc_tables* tables, const uint8_t* const* regions, const kvc_row* rows, size_t n_rows, uint64_t* out);
uint64_t weighted_words(const uint8_t* p, size_t n_words);
}  // namespace avx512
#endif

}  // namespace kvc_isa

#endif
