/**
 * @file checksum_cpu.cc
 * @brief CPU kernel of the SPEC v1 checksum (include/kvc_checksum.h): table and row validation,
 *        entry extents, the run-time choice of the summation loop's instruction set, and the
 *        multi-threaded mode.
 *
 * The weighted sums of ATTN, ROWS and STREAM entries are in checksum_kernel.inc, compiled once
 * per instruction set (generic SSE2/NEON, AVX2, AVX-512F: checksum_isa.h); the widest one the CPU
 * supports is chosen once (kvc_cpu_isa), so one build runs everywhere. All variants give the same
 * sums bit for bit.
 *
 * Multi-threaded mode (kvc_sum_rows_cpu_mt): the rows are split into contiguous ranges, one per
 * thread of a persistent pool; each thread sums into its own zeroed copy of the output and the
 * copies are added into out at the end (addition mod 2^64 is associative and commutative, so the
 * result equals the single-threaded one exactly).
 */
#include "kvc_checksum.h"

#include <cstddef>
#include <cstdint>
#include <cstring>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "checksum_isa.h"

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
// Instruction-set choice (checksum_isa.h).

struct IsaVariant {
  const char* name;
  kvc_isa::SumRowsFn sum_rows;
  uint64_t (*weighted_words)(const uint8_t*, size_t);
};

const IsaVariant kGeneric = {"generic", kvc_isa::generic::sum_rows, kvc_isa::generic::weighted_words};
#if defined(KVC_HAVE_X86_VARIANTS)
const IsaVariant kAvx2 = {"avx2", kvc_isa::avx2::sum_rows, kvc_isa::avx2::weighted_words};
const IsaVariant kAvx512 = {"avx512", kvc_isa::avx512::sum_rows, kvc_isa::avx512::weighted_words};
#endif

/** The variant called `name` if this CPU runs it ("auto": the widest it runs), else nullptr. */
const IsaVariant* variant_named(const char* name) {
  const bool any = std::strcmp(name, "auto") == 0;
#if defined(KVC_HAVE_X86_VARIANTS)
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f");
  const bool avx2 = __builtin_cpu_supports("avx2");
  // "auto" prefers AVX2 where both run: the loop is bound by memory, and on the Xeon of the GPU
  // machine (bench/README.md, 2026-12-01) the AVX2 loop reached 0.91-1.02 of the read-sum on
  // contiguous KV where the AVX-512 one reached 0.75-0.81 (512-bit operations lower the core's
  // clock). KVC_CPU_ISA=avx512 or kvc_set_cpu_isa("avx512") still chooses it. (Those AVX-512
  // figures predate the software prefetch of its HND walk, which it lacked: 2 iterations per
  // token were under the prefetch threshold; checksum_kernel.inc, wsum_slice_v.)
  if (std::strcmp(name, "avx512") == 0) return avx512 ? &kAvx512 : nullptr;
  if ((any || std::strcmp(name, "avx2") == 0) && avx2) return &kAvx2;
  if (std::strcmp(name, "avx2") == 0) return nullptr;
  if (any && avx512) return &kAvx512;
#endif
  if (any || std::strcmp(name, "generic") == 0) return &kGeneric;
  return nullptr;
}

/** The chosen variant: KVC_CPU_ISA if set and runnable, else the widest runnable one. */
std::atomic<const IsaVariant*> g_isa{nullptr};

const IsaVariant* isa() {
  const IsaVariant* v = g_isa.load(std::memory_order_acquire);
  if (v) return v;
  const char* env = std::getenv("KVC_CPU_ISA");
  v = env && *env ? variant_named(env) : nullptr;
  if (!v) v = variant_named("auto");
  g_isa.store(v, std::memory_order_release);
  return v;
}

inline kvc_isa::SumRowsFn isa_sum_rows() { return isa()->sum_rows; }

// ---------------------------------------------------------------------------------------------
// The thread pool of the multi-threaded mode: persistent threads, one parallel call at a time.

class Pool {
 public:
  /** Runs task(i) for i in [0, n): task 0 on the calling thread, the others on pool threads. */
  template <class F>
  void run(unsigned n, F&& task) {
    std::lock_guard<std::mutex> call(call_mu_);
    grow(n - 1);
    {
      std::lock_guard<std::mutex> lk(mu_);
      job_ = [&task](unsigned i) { task(i); };
      tasks_ = n;
      pending_ = n - 1;
      ++gen_;
    }
    cv_.notify_all();
    task(0u);
    std::unique_lock<std::mutex> lk(mu_);
    done_.wait(lk, [this] { return pending_ == 0; });
    job_ = nullptr;
  }

 private:
  void grow(unsigned want) {
    while (threads_ < want) {
      const unsigned index = ++threads_;  // pool thread k runs task k (k >= 1)
      std::thread([this, index] { loop(index); }).detach();
    }
  }
  void loop(unsigned index) {
    uint64_t seen = 0;
    for (;;) {
      std::function<void(unsigned)> job;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return gen_ != seen; });
        seen = gen_;
        if (index >= tasks_) continue;
        job = job_;
      }
      job(index);
      std::lock_guard<std::mutex> lk(mu_);
      if (--pending_ == 0) done_.notify_one();
    }
  }
  std::mutex call_mu_, mu_;
  std::condition_variable cv_, done_;
  std::function<void(unsigned)> job_;
  unsigned threads_ = 0, tasks_ = 0, pending_ = 0;
  uint64_t gen_ = 0;
};

/** The process's pool (never destroyed: its threads are detached and idle at exit). */
Pool& pool() {
  static Pool* p = new Pool();
  return *p;
}

/** Most threads a multi-threaded call uses. */
constexpr unsigned kMaxThreads = 64;

}  // namespace

extern "C" {

const char* kvc_cpu_isa(void) { return isa()->name; }

int kvc_set_cpu_isa(const char* name) {
  if (!name) return KVC_EINVAL;
  const IsaVariant* v = variant_named(name);
  if (!v) return KVC_EINVAL;
  g_isa.store(v, std::memory_order_release);
  return KVC_OK;
}



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

/** Every check of kvc_sum_rows_cpu_diag (kvc_check_rows, NULL pointers, overlaps). */
static int check_sum_args(const kvc_tables* tables, const uint8_t* const* regions,
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

  return KVC_OK;
}

int kvc_sum_rows_cpu_diag(const kvc_tables* tables, const uint8_t* const* regions,
                          const uint64_t* region_bytes, uint32_t n_regions, const kvc_row* rows,
                          size_t n_rows, uint64_t* out, size_t out_len, kvc_diag* diag) {
  const int rc = check_sum_args(tables, regions, region_bytes, n_regions, rows, n_rows, out, out_len, diag);
  if (rc != KVC_OK) return rc;
  isa_sum_rows()(tables, regions, rows, n_rows, out);
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

uint64_t kvc_weighted_sum64(const uint8_t* p, size_t n_words) { return isa()->weighted_words(p, n_words); }

int kvc_sum_rows_cpu_mt(const kvc_tables* tables, const uint8_t* const* regions, const uint64_t* region_bytes,
                        uint32_t n_regions, const kvc_row* rows, size_t n_rows, uint64_t* out, size_t out_len,
                        unsigned n_threads, kvc_diag* diag) {
  if (n_threads == 0) n_threads = 1;
  if (n_threads > kMaxThreads) n_threads = kMaxThreads;
  if (n_threads > n_rows) n_threads = n_rows ? (unsigned)n_rows : 1u;
  // The single-threaded call does every check (and sums when one thread is asked for).
  if (n_threads == 1) return kvc_sum_rows_cpu_diag(tables, regions, region_bytes, n_regions, rows, n_rows, out, out_len, diag);
  const int rc = check_sum_args(tables, regions, region_bytes, n_regions, rows, n_rows, out, out_len, diag);
  if (rc != KVC_OK) return rc;
  std::vector<std::vector<uint64_t>> partial(n_threads - 1);
  const kvc_isa::SumRowsFn sum = isa_sum_rows();
  pool().run(n_threads, [&](unsigned t) {
    const size_t a = n_rows * t / n_threads, b = n_rows * (t + 1) / n_threads;
    uint64_t* dst = out;
    if (t > 0) {
      partial[t - 1].assign(out_len, 0);
      dst = partial[t - 1].data();
    }
    sum(tables, regions, rows + a, b - a, dst);
  });
  for (const auto& p : partial)
    for (size_t i = 0; i < out_len; ++i) out[i] += p[i];
  return KVC_OK;
}

uint64_t kvc_plain_sum64_mt(const uint8_t* p, size_t n_words, unsigned n_threads) {
  if (n_threads == 0) n_threads = 1;
  if (n_threads > kMaxThreads) n_threads = kMaxThreads;
  if (n_threads == 1 || n_words < 4096) return kvc_plain_sum64(p, n_words);
  std::vector<uint64_t> part(n_threads, 0);
  pool().run(n_threads, [&](unsigned t) {
    const size_t a = n_words * t / n_threads, b = n_words * (t + 1) / n_threads;
    part[t] = kvc_plain_sum64(p + 8u * a, b - a);
  });
  uint64_t s = 0;
  for (uint64_t x : part) s += x;
  return s;
}

}  // extern "C"
