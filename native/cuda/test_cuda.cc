/**
 * @file test_cuda.cc
 * @brief Tests of the CUDA checksum kernel (include/kvc_checksum_cuda.h) on a GPU, no Node needed:
 *  - every attention, state and stateLocal record of ../shared/vectors/checksum-v1.json, built into
 *    tables from the record's fields, in the logical layout and in a random physical relayout;
 *  - random geometries against the CPU kernel (kvc_sum_rows_cpu) and a naive reading of the SPEC:
 *    NHD, HND, interleaved kernel blocks, K/V and odd part splits, padding, unaligned bases,
 *    partial and empty blocks, 2- and 4-byte state rows (1 MiB rows spanning many thread blocks),
 *    strided state layouts, STREAM states with unaligned edges, several groups in one step;
 *  - the copy of the results is ordered after a compute-stream kernel that writes the KV late;
 *  - tickets, validation errors.
 * Usage: kvc_test_cuda [path/to/checksum-v1.json] [--quick] [--emulate]. Prints "N passed, N failed"
 * last; exits 0 only if nothing failed (and 2 when there is no GPU). --emulate needs no GPU: it runs
 * the kernel's per-thread code (kvc_cuda_kernel.cuh) on the CPU, thread by thread, over host memory,
 * for the table-driven cases (not the stream-ordering and ticket tests).
 */
#include "kvc_checksum.h"
#include "kvc_checksum_cuda.h"
#include "kvc_cuda_internal.h"
#include "kvc_cuda_kernel.cuh"
#include "test_json.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <thread>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

extern "C" int kvc_test_sleep_then_copy(void* stream, uint64_t dst, uint64_t src, size_t bytes, uint32_t sleep_us);

using kvct::Json;

namespace {

int g_pass = 0, g_fail = 0;
bool g_emulate = false;
uint64_t g_paths[4][3] = {};  // emulation: entries seen per (mode, path)
uint32_t g_item_bytes = 32768;  // emulation: work item size (the context's chunk_bytes, default)
int g_emu_unroll = 2;          // emulation: the kernel variant (kvc_cuda_debug_set_variant)
int g_emu_spec = 0;            // emulation: 1, 3, 5 = variants 33, 35, 37 (lane_partial_attn16 where the tables are all ATTN V16)
uint64_t g_emu_spec_cases = 0; // emulation: cases that took lane_partial_attn16
uint64_t g_emu_spec_pi = 0;    // emulation: pairs-inner entries among them

void report(bool ok, const std::string& name, const std::string& detail = "") {
  if (ok) ++g_pass;
  else ++g_fail;
  std::printf("%s %s%s%s\n", ok ? "ok  " : "FAIL", name.c_str(), detail.empty() ? "" : ": ", detail.c_str());
  std::fflush(stdout);
}

struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint32_t below(uint32_t n) { return (uint32_t)(next() % n); }
  template <class T>
  T pick(std::initializer_list<T> l) { return *(l.begin() + below((uint32_t)l.size())); }
  void fill(uint8_t* p, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t x = next();
      std::memcpy(p + i, &x, 8);
    }
    for (; i < n; ++i) p[i] = (uint8_t)next();
  }
};

uint64_t ld_le(const uint8_t* p, unsigned n) {
  uint64_t x = 0;
  for (unsigned i = 0; i < n; ++i) x |= (uint64_t)p[i] << (8 * i);
  return x;
}

/** A table set with host copies of its regions, rows, and optionally the expected output. */
struct Case {
  std::vector<kvc_entry> entries;
  std::vector<uint32_t> group_start{0};
  std::vector<std::vector<uint8_t>> regions;
  std::vector<uint32_t> region_align;  // extra misalignment of the device address (0 = none)
  std::vector<kvc_row> rows;
  size_t out_len = 0;
  std::vector<uint64_t> expected;  // empty: none (compare GPU with CPU only)

  void end_group() { group_start.push_back((uint32_t)entries.size()); }
  uint32_t n_groups() const { return (uint32_t)group_start.size() - 1; }
  uint32_t add_region(size_t bytes, Rng& rng) {
    regions.emplace_back(bytes);
    rng.fill(regions.back().data(), bytes);
    region_align.push_back(0);
    return (uint32_t)regions.size() - 1;
  }
};

/** Device copies of a case's regions (each at its requested misalignment from a cudaMalloc base). */
struct DevRegions {
  std::vector<uint64_t> base, addr, bytes;
  explicit DevRegions(const Case& c) {
    for (size_t r = 0; r < c.regions.size(); ++r) {
      uint64_t b = 0;
      const size_t n = c.regions[r].size();
      if (kvc_cuda_dev_alloc(0, n + 64, &b) != KVC_OK) throw std::runtime_error("dev_alloc");
      const uint64_t a = b + c.region_align[r];
      if (n && kvc_cuda_copy_to_device(0, a, c.regions[r].data(), n) != KVC_OK) throw std::runtime_error("copy");
      base.push_back(b);
      addr.push_back(a);
      bytes.push_back(n);
    }
  }
  ~DevRegions() {
    for (uint64_t b : base) kvc_cuda_dev_free(0, b);
  }
};

int cpu_sum(const Case& c, std::vector<uint64_t>& out) {
  out.assign(c.out_len, 0);
  std::vector<const uint8_t*> rp;
  std::vector<uint64_t> rb;
  for (auto& r : c.regions) {
    rp.push_back(r.data());
    rb.push_back(r.size());
  }
  kvc_tables t{c.entries.data(), c.group_start.data(), c.n_groups()};
  return kvc_sum_rows_cpu(&t, rp.data(), rb.data(), (uint32_t)rp.size(), c.rows.data(), c.rows.size(), out.data(),
                          out.size());
}

int gpu_sum(kvc_cuda_ctx* ctx, const Case& c, std::vector<uint64_t>& out, cudaStream_t st, std::string* err) {
  DevRegions dr(c);
  kvc_tables t{c.entries.data(), c.group_start.data(), c.n_groups()};
  int rc = kvc_cuda_set_tables(ctx, &t, dr.addr.data(), dr.bytes.data(), (uint32_t)dr.addr.size());
  if (rc) {
    *err = std::string("set_tables: ") + kvc_cuda_last_error(ctx);
    return rc;
  }
  uint64_t ticket = 0;
  rc = kvc_cuda_submit(ctx, c.rows.data(), c.rows.size(), c.out_len, st, &ticket);
  if (rc) {
    *err = std::string("submit: ") + kvc_cuda_last_error(ctx);
    return rc;
  }
  out.assign(c.out_len, 0);
  rc = kvc_cuda_collect(ctx, ticket, out.data(), out.size());
  if (rc) *err = std::string("collect: ") + kvc_cuda_last_error(ctx);
  return rc;
}

/** The kernel's code run on the CPU: every work item of every row, every thread of its block. */
int emu_sum(const Case& c, std::vector<uint64_t>& out, std::string* err) {
  using namespace kvc_cuda_detail;
  kvc_tables t{c.entries.data(), c.group_start.data(), c.n_groups()};
  // copies at the device addresses' alignment: 64-byte aligned + the case's misalignment
  std::vector<std::vector<uint8_t>> copies(c.regions.size());
  std::vector<uint64_t> addr, rb;
  for (size_t i = 0; i < c.regions.size(); ++i) {
    copies[i].resize(c.regions[i].size() + 128);
    uint64_t a = ((uint64_t)(uintptr_t)copies[i].data() + 63) & ~(uint64_t)63;
    a += c.region_align[i];
    if (!c.regions[i].empty()) std::memcpy((void*)(uintptr_t)a, c.regions[i].data(), c.regions[i].size());
    addr.push_back(a);
    rb.push_back(c.regions[i].size());
  }
  kvc_diag diag;
  int rc = kvc_check_rows(&t, rb.data(), (uint32_t)rb.size(), c.rows.data(), c.rows.size(), c.out_len, &diag);
  if (rc) {
    *err = diag.reason;
    return rc;
  }
  Prepared p;
  uint32_t bad = 0;
  if (const char* why = prepare_tables(&t, addr.data(), g_item_bytes, &p, &bad)) {
    *err = why;
    return KVC_EINVAL;
  }
  for (const DevEntry& e : p.entries) ++g_paths[e.mode % 4][e.path % 3];
  const int spec = g_emu_spec && all_attn_v16(p.entries.data(), p.entries.size()) ? g_emu_spec : 0;
  if (spec) {
    ++g_emu_spec_cases;
    for (const DevEntry& e : p.entries) g_emu_spec_pi += e.pair_inner;
  }
  out.assign(c.out_len, 0);
  for (const kvc_row& r : c.rows) {
    for (uint32_t bx = 0; bx < p.groups[r.group].n_items; ++bx) {
      const DevEntry* e;
      uint64_t blk;
      uint32_t chunk;
      if (!item_of(p.entries.data(), p.groups.data(), p.items.data(), r, bx, &e, &blk, &chunk)) continue;
      uint64_t acc = 0;
      for (uint32_t lane = 0; lane < (uint32_t)kLanes; ++lane)
        acc += spec == 1             ? lane_partial_attn16<1>(*e, blk, r, chunk, lane)
               : spec == 3           ? lane_partial_attn16<3>(*e, blk, r, chunk, lane)
               : spec == 5           ? lane_partial_attn16<5>(*e, blk, r, chunk, lane)
               : g_emu_unroll == 8   ? lane_partial<8>(*e, blk, r, chunk, lane)
               : g_emu_unroll == 4 ? lane_partial<4>(*e, blk, r, chunk, lane)
               : g_emu_unroll == 1 ? lane_partial<1>(*e, blk, r, chunk, lane)
                                   : lane_partial<2>(*e, blk, r, chunk, lane);
      out[r.out_offset + e->column] += acc;
    }
  }
  return KVC_OK;
}

std::string first_diff(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b, const char* an, const char* bn) {
  if (a.size() != b.size()) return "sizes differ";
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) {
      char buf[200];
      std::snprintf(buf, sizeof buf, "out[%zu]: %s %" PRIu64 " != %s %" PRIu64, i, an, a[i], bn, b[i]);
      return buf;
    }
  return "";
}

/** GPU == CPU (== expected, if the case has it). */
void check_case(kvc_cuda_ctx* ctx, cudaStream_t st, const Case& c, const std::string& name) {
  std::vector<uint64_t> g, cpu;
  std::string err;
  int rc = g_emulate ? emu_sum(c, g, &err) : gpu_sum(ctx, c, g, st, &err);
  if (rc) return report(false, name, "gpu rc " + std::to_string(rc) + " " + err);
  rc = cpu_sum(c, cpu);
  if (rc) return report(false, name, "cpu rc " + std::to_string(rc));
  std::string d = first_diff(g, cpu, "gpu", "cpu");
  if (d.empty() && !c.expected.empty()) d = first_diff(g, c.expected, "gpu", "expected");
  bool nonzero = false;
  for (uint64_t v : g) nonzero |= v != 0;
  if (d.empty() && !nonzero && c.out_len && c.expected.empty()) d = "all sums are zero (suspicious)";
  report(d.empty(), name, d);
}

// ---------------------------------------------------------------------------------------------
// Attention caches: logical view [nb, H, B, cell], placed in memory by a layout.

struct AttnCache {
  uint32_t nb = 1, H = 1, B = 1, cell = 8;
  std::vector<uint8_t> data;  // logical bytes
  uint64_t factor_base = 0;
  uint32_t column = 0;
};

struct AttnLayout {
  int perm[4] = {0, 3, 1, 2};  // outer -> inner among 0 block, 1 kernel block, 2 token in kernel block, 3 head
  uint32_t kbt = 0;            // kernel block tokens (0: B)
  std::vector<uint32_t> cuts;  // part boundaries inside the cell
  bool separate = false;       // each part in its own region
  uint32_t pad_line = 0, pad_dim[4] = {0, 0, 0, 0};
  uint32_t base_off = 0;       // bytes before the first part
  uint32_t misalign = 0;       // device address misalignment of the region(s)
};

AttnLayout identity_layout() { return AttnLayout{}; }  // [block][head][token][cell]

AttnLayout random_layout(Rng& rng, const AttnCache& a, bool allow_unaligned) {
  AttnLayout L;
  int p[4] = {0, 1, 2, 3};
  for (int i = 3; i > 0; --i) std::swap(p[i], p[rng.below(i + 1)]);
  std::copy(p, p + 4, L.perm);
  std::vector<uint32_t> divs;
  for (uint32_t d = 1; d <= a.B; ++d)
    if (a.B % d == 0) divs.push_back(d);
  L.kbt = divs[rng.below((uint32_t)divs.size())];
  switch (rng.below(4)) {
    case 0: break;                                          // whole cell
    case 1: if (a.cell >= 16) L.cuts = {a.cell / 2}; break;  // K/V (may split a piece)
    case 2: if (a.cell > 1) L.cuts = {1 + rng.below(a.cell - 1)}; break;
    default:
      if (a.cell > 2) {
        uint32_t x = 1 + rng.below(a.cell - 1), y = 1 + rng.below(a.cell - 1);
        if (x != y) L.cuts = {std::min(x, y), std::max(x, y)};
      }
  }
  L.separate = rng.below(2);
  auto pad = [&]() -> uint32_t { return allow_unaligned ? rng.pick<uint32_t>({0, 0, 0, 16, 8, 1, 3}) : rng.pick<uint32_t>({0, 0, 16, 32}); };
  L.pad_line = pad();
  for (int i = 0; i < 4; ++i) L.pad_dim[i] = pad();
  L.base_off = allow_unaligned ? rng.pick<uint32_t>({0, 16, 8, 4, 1, 256}) : rng.pick<uint32_t>({0, 16, 256});
  L.misalign = allow_unaligned ? rng.pick<uint32_t>({0, 0, 8, 2}) : 0;
  return L;
}

/** Places `a` with layout L into new region(s) of c; adds its entries to the current group. */
void add_attn(Case& c, const AttnCache& a, const AttnLayout& L, Rng& rng) {
  const uint32_t kbt = L.kbt ? L.kbt : a.B;
  std::vector<uint32_t> bounds{0};
  for (uint32_t x : L.cuts) bounds.push_back(x);
  bounds.push_back(a.cell);
  const uint32_t count[4] = {a.nb, a.B / kbt, kbt, a.H};
  uint32_t shared_region = UINT32_MAX;
  uint64_t shared_off = L.base_off;
  struct Part { uint32_t bs, bc, region; uint64_t off; int64_t stride[4]; };
  std::vector<Part> parts;
  std::vector<uint64_t> part_size;
  for (size_t q = 0; q + 1 < bounds.size(); ++q) {
    Part P;
    P.bs = bounds[q];
    P.bc = bounds[q + 1] - bounds[q];
    uint64_t running = P.bc + L.pad_line;
    for (int i = 3; i >= 0; --i) {
      const int d = L.perm[i];
      P.stride[d] = (int64_t)running;
      running = running * count[d] + L.pad_dim[d];
    }
    parts.push_back(P);
    part_size.push_back(running);
  }
  // regions
  if (!L.separate) {
    uint64_t total = L.base_off;
    for (uint64_t s : part_size) total += s + 8;
    shared_region = c.add_region(total + rng.below(64), rng);
    c.region_align[shared_region] = L.misalign;
  }
  for (size_t q = 0; q < parts.size(); ++q) {
    Part& P = parts[q];
    if (L.separate) {
      P.region = c.add_region(L.base_off + part_size[q] + rng.below(64), rng);
      c.region_align[P.region] = L.misalign;
      P.off = L.base_off;
    } else {
      P.region = shared_region;
      P.off = shared_off;
      shared_off += part_size[q] + 8;
    }
    std::vector<uint8_t>& R = c.regions[P.region];
    for (uint32_t b = 0; b < a.nb; ++b)
      for (uint32_t h = 0; h < a.H; ++h)
        for (uint32_t t = 0; t < a.B; ++t) {
          const uint64_t addr = P.off + b * P.stride[0] + (t / kbt) * P.stride[1] + (t % kbt) * P.stride[2] + h * P.stride[3];
          std::memcpy(&R[addr], &a.data[(((uint64_t)b * a.H + h) * a.B + t) * a.cell + P.bs], P.bc);
        }
    kvc_entry e;
    std::memset(&e, 0, sizeof e);
    e.offset = P.off;
    e.factor_base = a.factor_base;
    e.block_stride = P.stride[0];
    e.outer_stride = P.stride[3];
    e.kblock_stride = P.stride[1];
    e.token_stride = P.stride[2];
    e.elem_count[0] = e.elem_count[1] = e.elem_count[2] = 1;
    e.kind = KVC_ENTRY_ATTN;
    e.region = P.region;
    e.column = a.column;
    e.outer_count = a.H;
    e.kblock_tokens = kbt;
    e.byte_start = P.bs;
    e.byte_count = P.bc;
    e.cell_pieces = a.cell / 8;
    e.num_blocks = a.nb;
    e.block_tokens = a.B;
    c.entries.push_back(e);
  }
}

/** The SPEC's definition over the logical view: adds cache a's contributions for the rows. */
void naive_attn(const AttnCache& a, const std::vector<kvc_row>& rows, uint32_t group, std::vector<uint64_t>& out) {
  const uint64_t P = a.cell / 8;
  for (const kvc_row& r : rows) {
    if (r.group != group) continue;
    for (uint32_t h = 0; h < a.H; ++h) {
      const uint64_t m = 2 * (a.factor_base + h) + 1;
      for (uint32_t t = 0; t < r.valid_tokens; ++t)
        for (uint64_t p = 0; p < P; ++p) {
          const uint64_t x = ld_le(&a.data[(((uint64_t)r.block_id * a.H + h) * a.B + t) * a.cell + 8 * p], 8);
          const uint64_t j = ((uint64_t)r.first_token + t) * P + p;
          out[r.out_offset + a.column] += x * m * (2 * j + 1);
        }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// State caches (ROWS): a logical row-major array `shape` of `eb`-byte elements per block, split
// along `axis` into segments; placed in memory by a dim permutation with padding.

struct StateSeg {
  uint32_t local_rows;
  uint64_t factor_base;
  uint32_t column;
};

struct StateCache {
  uint32_t nb = 1, eb = 2, axis = 0;
  std::vector<uint32_t> shape;
  std::vector<StateSeg> segs;
  std::vector<uint8_t> data;  // nb logical arrays
  uint64_t elems() const {
    uint64_t n = 1;
    for (uint32_t d : shape) n *= d;
    return n;
  }
};

struct StateLayout {
  std::vector<int> perm;  // physical order (outer -> inner) of the logical dims; empty: identity
  std::vector<uint32_t> pad;  // per logical dim, bytes added after it
  uint32_t pad_block = 0, base_off = 0, misalign = 0;
  bool scatter_unused = false;  // put the count-1 elem dims at random places
};

StateLayout random_state_layout(Rng& rng, const StateCache& s, bool allow_unaligned) {
  StateLayout L;
  const int nd = (int)s.shape.size();
  L.perm.resize(nd);
  for (int i = 0; i < nd; ++i) L.perm[i] = i;
  if (rng.below(2))
    for (int i = nd - 1; i > 0; --i) std::swap(L.perm[i], L.perm[rng.below(i + 1)]);
  L.pad.resize(nd);
  for (int i = 0; i < nd; ++i) L.pad[i] = rng.below(3) ? 0 : (allow_unaligned ? rng.pick<uint32_t>({2, 4, 16, 6}) : 16);
  L.pad_block = rng.pick<uint32_t>({0, 16, 64});
  L.base_off = allow_unaligned ? rng.pick<uint32_t>({0, 16, 2, 4, 8}) : rng.pick<uint32_t>({0, 16, 256});
  L.misalign = allow_unaligned ? rng.pick<uint32_t>({0, 0, 4, 2}) : 0;
  L.scatter_unused = rng.below(2);
  return L;
}

void add_state(Case& c, const StateCache& s, const StateLayout& Lin, Rng& rng) {
  const int nd = (int)s.shape.size();
  StateLayout L = Lin;
  if (L.perm.empty()) {
    L.perm.resize(nd);
    for (int i = 0; i < nd; ++i) L.perm[i] = i;
  }
  if (L.pad.empty()) L.pad.assign(nd, 0);
  std::vector<int64_t> stride(nd);
  uint64_t running = s.eb;
  for (int i = nd - 1; i >= 0; --i) {
    const int d = L.perm[i];
    stride[d] = (int64_t)running;
    running = running * s.shape[d] + L.pad[d];
  }
  const uint64_t block_bytes = running + L.pad_block;
  const uint32_t reg = c.add_region(L.base_off + block_bytes * s.nb + rng.below(32), rng);
  c.region_align[reg] = L.misalign;
  std::vector<uint8_t>& R = c.regions[reg];
  // place every element
  const uint64_t n = s.elems();
  std::vector<uint32_t> idx(nd);
  for (uint32_t b = 0; b < s.nb; ++b)
    for (uint64_t e = 0; e < n; ++e) {
      uint64_t rem = e;
      for (int d = nd - 1; d >= 0; --d) {
        idx[d] = (uint32_t)(rem % s.shape[d]);
        rem /= s.shape[d];
      }
      uint64_t addr = L.base_off + b * block_bytes;
      for (int d = 0; d < nd; ++d) addr += idx[d] * stride[d];
      std::memcpy(&R[addr], &s.data[(b * n + e) * s.eb], s.eb);
    }
  // one entry per segment
  uint32_t row0 = 0;
  for (const StateSeg& g : s.segs) {
    kvc_entry e;
    std::memset(&e, 0, sizeof e);
    e.offset = L.base_off + (uint64_t)row0 * stride[s.axis];
    e.factor_base = g.factor_base;
    e.block_stride = (int64_t)block_bytes;
    e.outer_stride = stride[s.axis];
    std::vector<std::pair<uint32_t, int64_t>> dims;
    for (int d = 0; d < nd; ++d)
      if (d != (int)s.axis) dims.push_back({s.shape[d], stride[d]});
    while (dims.size() < 3) {
      const size_t at = L.scatter_unused ? rng.below((uint32_t)dims.size() + 1) : 0;
      dims.insert(dims.begin() + at, {1u, (int64_t)rng.below(100)});
    }
    for (int d = 0; d < 3; ++d) {
      e.elem_count[d] = dims[d].first;
      e.elem_stride[d] = dims[d].second;
    }
    e.kind = KVC_ENTRY_ROWS;
    e.region = reg;
    e.column = g.column;
    e.outer_count = g.local_rows;
    e.elem_bytes = s.eb;
    e.num_blocks = s.nb;
    c.entries.push_back(e);
    row0 += g.local_rows;
  }
}

void naive_state(const StateCache& s, const std::vector<kvc_row>& rows, uint32_t group, std::vector<uint64_t>& out) {
  const int nd = (int)s.shape.size();
  const uint64_t n = s.elems();
  const uint64_t per_row = n / s.shape[s.axis];
  std::vector<uint32_t> idx(nd);
  for (const kvc_row& r : rows) {
    if (r.group != group) continue;
    // element e of the logical array -> (axis index, index within the row's element walk)
    std::vector<uint64_t> acc(s.shape[s.axis], 0);
    for (uint64_t e = 0; e < n; ++e) {
      uint64_t rem = e;
      for (int d = nd - 1; d >= 0; --d) {
        idx[d] = (uint32_t)(rem % s.shape[d]);
        rem /= s.shape[d];
      }
      uint64_t j = 0;
      for (int d = 0; d < nd; ++d)
        if (d != (int)s.axis) j = j * s.shape[d] + idx[d];
      const uint64_t x = ld_le(&s.data[((uint64_t)r.block_id * n + e) * s.eb], s.eb);
      acc[idx[s.axis]] += x * (2 * j + 1);
    }
    (void)per_row;
    uint32_t row0 = 0;
    for (const StateSeg& g : s.segs) {
      for (uint32_t i = 0; i < g.local_rows; ++i) out[r.out_offset + g.column] += acc[row0 + i] * (2 * (g.factor_base + i) + 1);
      row0 += g.local_rows;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Stream states (STREAM): byte strings per block, concatenated into one piece stream.

struct StreamCache {
  uint32_t nb = 1;
  std::vector<uint32_t> sizes;        // bytes of each state
  std::vector<std::vector<uint8_t>> data;  // per state: nb * size bytes
  uint64_t factor_base = 0;
  uint32_t column = 0;
};

void add_stream(Case& c, const StreamCache& s, Rng& rng, bool separate, uint32_t align_to, uint32_t misalign) {
  uint32_t byte_start = 0;
  uint32_t reg = UINT32_MAX;
  uint64_t block_bytes = 0;
  std::vector<uint64_t> off;
  for (uint32_t sz : s.sizes) {
    block_bytes = (block_bytes + align_to - 1) / align_to * align_to;
    off.push_back(block_bytes);
    block_bytes += sz;
  }
  block_bytes = (block_bytes + align_to - 1) / align_to * align_to;
  if (!separate) {
    reg = c.add_region(block_bytes * s.nb + 16, rng);
    c.region_align[reg] = misalign;
  }
  for (size_t q = 0; q < s.sizes.size(); ++q) {
    const uint32_t sz = s.sizes[q];
    kvc_entry e;
    std::memset(&e, 0, sizeof e);
    uint32_t r = reg;
    uint64_t o = off[q];
    int64_t bstride = (int64_t)block_bytes;
    if (separate) {
      bstride = (int64_t)((sz + align_to - 1) / align_to * align_to);
      r = c.add_region((uint64_t)bstride * s.nb + 16, rng);
      c.region_align[r] = misalign;
      o = 0;
    }
    for (uint32_t b = 0; b < s.nb; ++b) std::memcpy(&c.regions[r][o + b * bstride], &s.data[q][(uint64_t)b * sz], sz);
    e.offset = o;
    e.factor_base = s.factor_base;
    e.block_stride = bstride;
    e.elem_count[0] = e.elem_count[1] = e.elem_count[2] = 1;
    e.kind = KVC_ENTRY_STREAM;
    e.region = r;
    e.column = s.column;
    e.outer_count = 1;
    e.byte_start = byte_start;
    e.byte_count = sz;
    e.num_blocks = s.nb;
    c.entries.push_back(e);
    byte_start += sz;
  }
}

void naive_stream(const StreamCache& s, const std::vector<kvc_row>& rows, uint32_t group, std::vector<uint64_t>& out) {
  for (const kvc_row& r : rows) {
    if (r.group != group) continue;
    std::vector<uint8_t> bytes;
    for (size_t q = 0; q < s.sizes.size(); ++q)
      bytes.insert(bytes.end(), s.data[q].begin() + (uint64_t)r.block_id * s.sizes[q],
                   s.data[q].begin() + (uint64_t)(r.block_id + 1) * s.sizes[q]);
    while (bytes.size() % 8) bytes.push_back(0);
    const uint64_t m = 2 * s.factor_base + 1;
    for (uint64_t k = 0; k < bytes.size() / 8; ++k) out[r.out_offset + s.column] += ld_le(&bytes[8 * k], 8) * m * (2 * k + 1);
  }
}

// ---------------------------------------------------------------------------------------------
// Vectors

std::map<std::string, uint32_t> key_columns(const Json& partials) {
  std::map<std::string, uint32_t> cols;
  uint32_t i = 0;
  for (auto& kv : partials.obj) cols[kv.first] = i++;
  return cols;
}

void vectors_attention(kvc_cuda_ctx* ctx, cudaStream_t st, const Json& rec, Rng& rng) {
  const uint32_t B = (uint32_t)rec["blockSize"].u(), numTokens = (uint32_t)rec["numTokens"].u();
  const uint32_t start = (uint32_t)rec["startPosition"].u(), nBlocks = (uint32_t)rec["nBlocks"].u();
  std::map<std::string, const Json*> caches;
  for (auto& cj : rec["caches"].arr) caches[cj["name"].s()] = &cj;
  for (auto& rank : rec["ranks"].arr) {
    const auto cols = key_columns(rank["partials"]);
    const uint32_t ncols = (uint32_t)cols.size();
    for (int variant = 0; variant < 3; ++variant) {
      Case c;
      std::vector<AttnCache> as;
      for (auto& rc : rank["caches"].arr) {
        const Json& g = *caches.at(rc["name"].s());
        AttnCache a;
        a.nb = nBlocks;
        a.H = (uint32_t)rc["localHeads"].u();
        a.B = B;
        a.cell = (uint32_t)g["cellBytes"].u();
        a.data = kvct::base64_decode(rc["data"].s());
        a.factor_base = g["layer"].u() * 65536u + rc["headBase"].u();
        a.column = cols.at(rc["replicaKey"].s());
        if (a.data.size() != (size_t)a.nb * a.H * a.B * a.cell) throw std::runtime_error("vector data size");
        AttnLayout L = variant == 0 ? identity_layout() : random_layout(rng, a, variant == 2);
        add_attn(c, a, L, rng);
        as.push_back(std::move(a));
      }
      c.end_group();
      for (uint32_t i = 0; i < nBlocks; ++i) {
        const uint64_t ft = (uint64_t)(start + i) * B;
        const uint32_t valid = ft >= numTokens ? 0 : (uint32_t)std::min<uint64_t>(B, numTokens - ft);
        c.rows.push_back(kvc_row{0, i, (uint32_t)ft, valid, i * ncols, 0});
      }
      c.out_len = (size_t)nBlocks * ncols;
      c.expected.assign(c.out_len, 0);
      for (auto& kv : rank["partials"].obj)
        for (uint32_t i = 0; i < nBlocks; ++i) c.expected[i * ncols + cols.at(kv.first)] = kv.second[i].u64s();
      // the naive reading must agree with the vector too (checks this test's table building)
      std::vector<uint64_t> nv(c.out_len, 0);
      for (auto& a : as) naive_attn(a, c.rows, 0, nv);
      std::string name = "vectors attention '" + rec["title"].s() + "' rank " + std::to_string(rank["tpRank"].u()) +
                         (variant == 0 ? " logical layout" : variant == 1 ? " random layout" : " random unaligned layout");
      if (nv != c.expected) {
        report(false, name, "naive reference differs from the vector: " + first_diff(nv, c.expected, "naive", "vector"));
        continue;
      }
      check_case(ctx, st, c, name);
    }
  }
}

uint32_t dtype_bytes(const std::string& d) {
  if (d == "float32") return 4;
  if (d == "float16" || d == "bfloat16") return 2;
  return 1;
}

void vectors_state(kvc_cuda_ctx* ctx, cudaStream_t st, const Json& rec, Rng& rng) {
  const uint64_t layer = rec["layer"].u(), tp = rec["tpSize"].u();
  const uint64_t rank_no_check = 0;
  (void)rank_no_check;
  for (auto& rank : rec["ranks"].arr) {
    const uint64_t tpRank = rank["tpRank"].u();
    const auto cols = key_columns(rank["partials"]);
    for (int variant = 0; variant < 3; ++variant) {
      Case c;
      std::vector<StateCache> ss;
      uint64_t seg_start = 0;  // headOffset 0: the record's layer is its module's only cache
      for (auto& sj : rank["states"].arr) {
        StateCache s;
        s.nb = 1;
        s.eb = dtype_bytes(sj["dtype"].s());
        s.axis = (uint32_t)sj["axis"].u();
        for (auto& d : sj["shape"].arr) s.shape.push_back((uint32_t)d.u());
        s.data = kvct::base64_decode(sj["data"].s());
        for (auto& seg : sj["segments"].arr) {
          const uint64_t local = seg[0].u(), R = seg[1].u();
          const uint64_t shard = tpRank / R;
          StateSeg g;
          g.local_rows = (uint32_t)local;
          g.factor_base = layer * 65536u + seg_start + shard * local;
          g.column = cols.at(std::to_string(R) + ":" + std::to_string(tpRank % R));
          s.segs.push_back(g);
          seg_start += local * tp / R;
        }
        if (s.data.size() != s.elems() * s.eb) throw std::runtime_error("state data size");
        StateLayout L;
        if (variant) L = random_state_layout(rng, s, variant == 2);
        add_state(c, s, L, rng);
        ss.push_back(std::move(s));
      }
      c.end_group();
      c.rows.push_back(kvc_row{0, 0, 0, 0, 0, 0});
      c.out_len = cols.size();
      c.expected.assign(c.out_len, 0);
      for (auto& kv : rank["partials"].obj) c.expected[cols.at(kv.first)] = kv.second.u64s();
      std::vector<uint64_t> nv(c.out_len, 0);
      for (auto& s : ss) naive_state(s, c.rows, 0, nv);
      std::string name = "vectors state '" + rec["title"].s() + "' rank " + std::to_string(tpRank) +
                         (variant == 0 ? " logical layout" : variant == 1 ? " random layout" : " random unaligned layout");
      if (nv != c.expected) {
        report(false, name, "naive reference differs from the vector: " + first_diff(nv, c.expected, "naive", "vector"));
        continue;
      }
      check_case(ctx, st, c, name);
    }
  }
}

void vectors_state_local(kvc_cuda_ctx* ctx, cudaStream_t st, const Json& rec, Rng& rng) {
  const uint64_t layer = rec["layer"].u();
  for (auto& rank : rec["ranks"].arr) {
    const uint64_t tpRank = rank["tpRank"].u();
    for (int variant = 0; variant < 3; ++variant) {
      Case c;
      StreamCache s;
      s.nb = 1;
      s.factor_base = layer * 65536u + tpRank;
      for (auto& sj : rank["states"].arr) {
        s.data.push_back(kvct::base64_decode(sj["data"].s()));
        s.sizes.push_back((uint32_t)s.data.back().size());
      }
      add_stream(c, s, rng, variant != 0, variant == 2 ? 2 : 16, variant == 2 ? 2 : 0);
      c.end_group();
      c.rows.push_back(kvc_row{0, 0, 0, 0, 0, 0});
      c.out_len = 1;
      c.expected = {rank["partials"]["1:0"].u64s()};
      std::vector<uint64_t> nv(1, 0);
      naive_stream(s, c.rows, 0, nv);
      std::string name = "vectors stateLocal '" + rec["title"].s() + "' rank " + std::to_string(tpRank) +
                         (variant == 0 ? " one region" : variant == 1 ? " separate regions" : " unaligned");
      if (nv != c.expected) {
        report(false, name, "naive reference differs from the vector: " + first_diff(nv, c.expected, "naive", "vector"));
        continue;
      }
      check_case(ctx, st, c, name);
    }
  }
}

void run_vectors(kvc_cuda_ctx* ctx, cudaStream_t st, const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    report(false, "vectors", "cannot read " + path);
    return;
  }
  std::stringstream ss;
  ss << f.rdbuf();
  Json doc;
  try {
    doc = kvct::JsonParser(ss.str()).parse();
  } catch (const std::exception& e) {
    report(false, "vectors", e.what());
    return;
  }
  Rng rng(7);
  size_t n = 0;
  try {
    for (auto& rec : doc["attention"].arr) vectors_attention(ctx, st, rec, rng), ++n;
    for (auto& rec : doc["state"].arr) vectors_state(ctx, st, rec, rng), ++n;
    for (auto& rec : doc["stateLocal"].arr) vectors_state_local(ctx, st, rec, rng), ++n;
  } catch (const std::exception& e) {
    report(false, "vectors", e.what());
  }
  std::printf("(vectors: %zu records)\n", n);
}

// ---------------------------------------------------------------------------------------------
// Random geometries

AttnCache random_attn(Rng& rng, uint32_t nb, uint32_t column) {
  AttnCache a;
  a.nb = nb;
  a.H = rng.pick<uint32_t>({1, 2, 3, 4, 5, 8});
  a.B = rng.pick<uint32_t>({1, 2, 4, 6, 16, 32});
  a.cell = rng.pick<uint32_t>({8, 16, 24, 32, 40, 64, 136, 256, 512});
  a.data.resize((size_t)a.nb * a.H * a.B * a.cell);
  rng.fill(a.data.data(), a.data.size());
  a.factor_base = (uint64_t)rng.below(100) * 65536u + rng.below(64);
  if (rng.below(8) == 0) a.factor_base = rng.next();  // wrap-around of m
  a.column = column;
  return a;
}

void random_rows(Case& c, Rng& rng, uint32_t group, uint32_t nb, uint32_t B, uint32_t ncols, uint32_t n) {
  for (uint32_t i = 0; i < n; ++i) {
    kvc_row r{};
    r.group = group;
    r.block_id = rng.below(nb);
    const uint32_t pos = rng.below(4) == 0 ? rng.below(1u << 20) : rng.below(200);
    r.first_token = pos * B;
    const uint32_t k = rng.below(6);
    r.valid_tokens = k == 0 ? 0 : k == 1 ? rng.below(B + 1) : B;
    r.out_offset = (uint32_t)c.out_len;
    c.out_len += ncols;
    c.rows.push_back(r);
  }
}

void random_attention_cases(kvc_cuda_ctx* ctx, cudaStream_t st, int n_cases, uint64_t seed) {
  Rng rng(seed);
  for (int k = 0; k < n_cases; ++k) {
    Case c;
    const uint32_t nb = 1 + rng.below(k % 4 == 0 ? 200 : 12);
    const uint32_t ncaches = 1 + rng.below(3), ncols = 1 + rng.below(3);
    std::vector<AttnCache> as;
    std::string desc;
    const bool unaligned = rng.below(3) == 0;
    uint32_t B = 0;
    for (uint32_t q = 0; q < ncaches; ++q) {
      AttnCache a = random_attn(rng, nb, rng.below(ncols));
      if (B) a.B = B, a.data.resize((size_t)a.nb * a.H * a.B * a.cell), rng.fill(a.data.data(), a.data.size());
      B = a.B;
      AttnLayout L = random_layout(rng, a, unaligned);
      char buf[160];
      std::snprintf(buf, sizeof buf, " [H%u B%u kbt%u cell%u perm%d%d%d%d parts%zu%s]", a.H, a.B, L.kbt, a.cell, L.perm[0],
                    L.perm[1], L.perm[2], L.perm[3], L.cuts.size() + 1, L.separate ? " split" : "");
      desc += buf;
      add_attn(c, a, L, rng);
      as.push_back(std::move(a));
    }
    c.end_group();
    random_rows(c, rng, 0, nb, B, ncols, 1 + rng.below(k % 5 == 0 ? 300 : 20));
    std::vector<uint64_t> nv(c.out_len, 0);
    for (auto& a : as) naive_attn(a, c.rows, 0, nv);
    c.expected = nv;
    check_case(ctx, st, c, "random attention #" + std::to_string(k) + (unaligned ? " unaligned" : "") + desc);
  }
}

/**
 * Random attention steps whose every entry takes the ATTN V16 path (cells and parts multiples of
 * 16 bytes, 16-byte pads and offsets, aligned regions), with enough heads x units for the pairs-inner
 * path in some of them: the steps the specialized kernels (variants 33, 35, 37) take.
 */
void random_attn16_cases(kvc_cuda_ctx* ctx, cudaStream_t st, int n_cases, uint64_t seed) {
  Rng rng(seed);
  for (int k = 0; k < n_cases; ++k) {
    Case c;
    const uint32_t nb = 1 + rng.below(k % 4 == 0 ? 100 : 12);
    const uint32_t ncaches = 1 + rng.below(2), ncols = 1 + rng.below(3);
    const uint32_t B = rng.pick<uint32_t>({1, 4, 16, 32});
    std::vector<AttnCache> as;
    std::string desc;
    for (uint32_t q = 0; q < ncaches; ++q) {
      AttnCache a;
      a.nb = nb;
      a.H = rng.pick<uint32_t>({1, 2, 3, 4, 8, 16});
      a.B = B;
      a.cell = rng.pick<uint32_t>({32, 64, 256, 512, 1024});
      a.data.resize((size_t)a.nb * a.H * a.B * a.cell);
      rng.fill(a.data.data(), a.data.size());
      a.factor_base = (uint64_t)rng.below(100) * 65536u + rng.below(64);
      if (rng.below(8) == 0) a.factor_base = rng.next();
      a.column = rng.below(ncols);
      AttnLayout L;
      int p[4] = {0, 1, 2, 3};
      if (rng.below(2)) {  // NHD-like [block][kernel block][token][head] or a random order
        p[1] = 1, p[2] = 2, p[3] = 3;
      } else {
        for (int i = 3; i > 0; --i) std::swap(p[i], p[rng.below(i + 1)]);
      }
      std::copy(p, p + 4, L.perm);
      std::vector<uint32_t> divs;
      for (uint32_t d = 1; d <= a.B; ++d)
        if (a.B % d == 0) divs.push_back(d);
      L.kbt = divs[rng.below((uint32_t)divs.size())];
      if (rng.below(2)) L.cuts = {a.cell / 2};  // K and V parts
      L.separate = rng.below(2);
      L.pad_line = rng.pick<uint32_t>({0, 0, 16, 32});
      for (int i = 0; i < 4; ++i) L.pad_dim[i] = rng.pick<uint32_t>({0, 0, 16, 32});
      L.base_off = rng.pick<uint32_t>({0, 16, 256});
      char buf[160];
      std::snprintf(buf, sizeof buf, " [H%u B%u kbt%u cell%u perm%d%d%d%d parts%zu%s]", a.H, a.B, L.kbt, a.cell, L.perm[0],
                    L.perm[1], L.perm[2], L.perm[3], L.cuts.size() + 1, L.separate ? " split" : "");
      desc += buf;
      add_attn(c, a, L, rng);
      as.push_back(std::move(a));
    }
    c.end_group();
    random_rows(c, rng, 0, nb, B, ncols, 1 + rng.below(k % 5 == 0 ? 300 : 20));
    std::vector<uint64_t> nv(c.out_len, 0);
    for (auto& a : as) naive_attn(a, c.rows, 0, nv);
    c.expected = nv;
    check_case(ctx, st, c, "random aligned attention #" + std::to_string(k) + desc);
  }
}

StateCache random_state_cache(Rng& rng, uint32_t nb, uint32_t ncols) {
  StateCache s;
  s.nb = nb;
  s.eb = rng.below(2) ? 2 : 4;
  const int nd = 1 + (int)rng.below(4);
  for (int d = 0; d < nd; ++d) s.shape.push_back(1 + rng.below(d == 0 ? 9 : 7));
  s.axis = rng.below(nd);
  uint32_t left = s.shape[s.axis];
  while (left) {
    const uint32_t take = 1 + rng.below(left);
    StateSeg g{take, (uint64_t)rng.below(60) * 65536u + rng.below(1000), rng.below(ncols)};
    if (rng.below(10) == 0) g.factor_base = rng.next();
    s.segs.push_back(g);
    left -= take;
  }
  s.data.resize(s.elems() * s.eb * nb);
  rng.fill(s.data.data(), s.data.size());
  return s;
}

void random_state_cases(kvc_cuda_ctx* ctx, cudaStream_t st, int n_cases, uint64_t seed) {
  Rng rng(seed);
  for (int k = 0; k < n_cases; ++k) {
    Case c;
    const uint32_t nb = 1 + rng.below(8), ncols = 1 + rng.below(3);
    const uint32_t nstates = 1 + rng.below(2);
    std::vector<StateCache> ss;
    const bool unaligned = rng.below(3) == 0;
    std::string desc;
    for (uint32_t q = 0; q < nstates; ++q) {
      StateCache s = random_state_cache(rng, nb, ncols);
      StateLayout L = random_state_layout(rng, s, unaligned);
      char buf[96];
      std::snprintf(buf, sizeof buf, " [eb%u nd%zu axis%u segs%zu]", s.eb, s.shape.size(), s.axis, s.segs.size());
      desc += buf;
      add_state(c, s, L, rng);
      ss.push_back(std::move(s));
    }
    c.end_group();
    random_rows(c, rng, 0, nb, 1, ncols, 1 + rng.below(10));
    std::vector<uint64_t> nv(c.out_len, 0);
    for (auto& s : ss) naive_state(s, c.rows, 0, nv);
    c.expected = nv;
    check_case(ctx, st, c, "random state #" + std::to_string(k) + (unaligned ? " unaligned" : "") + desc);
  }
}

void random_stream_cases(kvc_cuda_ctx* ctx, cudaStream_t st, int n_cases, uint64_t seed) {
  Rng rng(seed);
  for (int k = 0; k < n_cases; ++k) {
    Case c;
    StreamCache s;
    s.nb = 1 + rng.below(6);
    const uint32_t n = 1 + rng.below(3);
    for (uint32_t q = 0; q < n; ++q) {
      uint32_t sz = rng.below(4) == 0 ? 1 + rng.below(40) : 8 * (1 + rng.below(300));
      if (rng.below(3) == 0) sz += rng.below(8);
      s.sizes.push_back(sz);
      s.data.emplace_back((size_t)sz * s.nb);
      rng.fill(s.data.back().data(), s.data.back().size());
    }
    s.factor_base = (uint64_t)rng.below(60) * 65536u + rng.below(8);
    s.column = 0;
    const bool sep = rng.below(2);
    const uint32_t al = rng.pick<uint32_t>({1, 2, 8, 16});
    const uint32_t mis = rng.pick<uint32_t>({0, 0, 1, 8});
    add_stream(c, s, rng, sep, al, mis);
    c.end_group();
    random_rows(c, rng, 0, s.nb, 1, 1, 1 + rng.below(6));
    std::vector<uint64_t> nv(c.out_len, 0);
    naive_stream(s, c.rows, 0, nv);
    c.expected = nv;
    check_case(ctx, st, c, "random stream #" + std::to_string(k) + " states " + std::to_string(n) +
                               " align " + std::to_string(al) + " misalign " + std::to_string(mis));
  }
}

/** 1 MiB state rows (ROWS, 2 and 4 bytes, contiguous and strided) and 1 MiB STREAM rows. */
void big_state_cases(kvc_cuda_ctx* ctx, cudaStream_t st) {
  Rng rng(99);
  struct Shape { uint32_t eb; std::vector<uint32_t> shape; bool transpose; const char* name; };
  const Shape shapes[] = {
      {4, {32, 64, 128}, false, "ssm fp32 [32,64,128] (1 MiB rows)"},
      {4, {32, 64, 128}, false, "ssm fp32 [32,64,128] (1 MiB rows) at an 8-byte aligned address"},
      {2, {32, 64, 256}, false, "ssm bf16 [32,64,256] (1 MiB rows)"},
      {4, {32, 64, 128}, true, "ssm fp32 [32,64,128] stored [64,128,32]"},
      {2, {4, 8192}, true, "conv bf16 [4, 8192] axis 1 (not dim-first)"},
  };
  for (const Shape& sh : shapes) {
    Case c;
    StateCache s;
    s.nb = 8;
    s.eb = sh.eb;
    s.shape = sh.shape;
    s.axis = sh.shape.size() == 2 ? 1 : 0;
    const uint32_t rows_total = s.shape[s.axis];
    s.segs = {{rows_total / 2, 11u * 65536u + 5, 0}, {rows_total - rows_total / 2, 11u * 65536u + 900, 1}};
    s.data.resize(s.elems() * s.eb * s.nb);
    rng.fill(s.data.data(), s.data.size());
    StateLayout L;
    if (sh.transpose) {
      for (size_t d = 1; d < s.shape.size(); ++d) L.perm.push_back((int)d);
      L.perm.push_back(0);
    }
    if (std::strstr(sh.name, "8-byte")) L.misalign = 8;
    add_state(c, s, L, rng);
    c.end_group();
    for (uint32_t i = 0; i < 12; ++i) c.rows.push_back(kvc_row{0, (i * 5) % s.nb, 0, 0, 2 * i, 0});
    c.out_len = 24;
    check_case(ctx, st, c, std::string("big state ") + sh.name);
  }
  {
    Case c;
    StreamCache s;
    s.nb = 6;
    s.sizes = {1u << 20, 4096 + 3, (1u << 19) + 5};
    for (uint32_t sz : s.sizes) {
      s.data.emplace_back((size_t)sz * s.nb);
      rng.fill(s.data.back().data(), s.data.back().size());
    }
    s.factor_base = 3u * 65536u + 1;
    add_stream(c, s, rng, false, 16, 0);
    c.end_group();
    for (uint32_t i = 0; i < 6; ++i) c.rows.push_back(kvc_row{0, 5 - i, 0, 0, i, 0});
    c.out_len = 6;
    std::vector<uint64_t> nv(c.out_len, 0);
    naive_stream(s, c.rows, 0, nv);
    c.expected = nv;
    check_case(ctx, st, c, "big stream 1 MiB + odd states");
  }
}

/** Attention, state and stream groups in one table set; one submit with interleaved rows. */
void mixed_groups_case(kvc_cuda_ctx* ctx, cudaStream_t st) {
  Rng rng(1234);
  Case c;
  AttnCache a1 = random_attn(rng, 40, 0), a2 = random_attn(rng, 40, 1);
  a2.B = a1.B;
  a2.data.resize((size_t)a2.nb * a2.H * a2.B * a2.cell);
  rng.fill(a2.data.data(), a2.data.size());
  add_attn(c, a1, random_layout(rng, a1, false), rng);
  add_attn(c, a2, random_layout(rng, a2, false), rng);
  c.end_group();
  StateCache s = random_state_cache(rng, 5, 2);
  add_state(c, s, StateLayout{}, rng);
  c.end_group();
  c.end_group();  // an empty group
  StreamCache sc;
  sc.nb = 3;
  sc.sizes = {64, 40};
  for (uint32_t sz : sc.sizes) {
    sc.data.emplace_back((size_t)sz * sc.nb);
    rng.fill(sc.data.back().data(), sc.data.back().size());
  }
  sc.factor_base = 9;
  add_stream(c, sc, rng, false, 8, 0);
  c.end_group();
  for (int i = 0; i < 60; ++i) {
    switch (rng.below(4)) {
      case 0: random_rows(c, rng, 0, 40, a1.B, 2, 1); break;
      case 1: random_rows(c, rng, 1, 5, 1, 2, 1); break;
      case 2: random_rows(c, rng, 2, 1, 1, 1, 1); break;
      default: random_rows(c, rng, 3, 3, 1, 1, 1); break;
    }
  }
  std::vector<uint64_t> nv(c.out_len, 0);
  naive_attn(a1, c.rows, 0, nv);
  naive_attn(a2, c.rows, 0, nv);
  naive_state(s, c.rows, 1, nv);
  naive_stream(sc, c.rows, 3, nv);
  c.expected = nv;
  check_case(ctx, st, c, "mixed groups in one step (attention, state, empty, stream)");
}

// ---------------------------------------------------------------------------------------------
// Ordering, tickets, validation

/** A compute-stream kernel sleeps, then writes the KV; the checksum enqueued after it must see it. */
void ordering_case(kvc_cuda_ctx* ctx, cudaStream_t st, uint32_t n_blocks, bool copied = false) {
  Rng rng(5);
  Case c;
  AttnCache a;
  a.nb = n_blocks;
  a.H = 8;
  a.B = 16;
  a.cell = 512;
  a.data.resize((size_t)a.nb * a.H * a.B * a.cell);
  rng.fill(a.data.data(), a.data.size());
  a.factor_base = 7u * 65536u;
  add_attn(c, a, identity_layout(), rng);  // region 0 holds a.data (new KV)
  c.end_group();
  for (uint32_t i = 0; i < a.nb; ++i) c.rows.push_back(kvc_row{0, i, i * 16, 16, i, 0});
  c.out_len = a.nb;
  std::vector<uint64_t> want;
  cpu_sum(c, want);
  // device: region starts with OLD bytes; src holds the new ones
  const size_t n = c.regions[0].size();
  std::vector<uint8_t> old_bytes(n);
  rng.fill(old_bytes.data(), n);
  uint64_t region = 0, src = 0;
  kvc_cuda_dev_alloc(0, n, &region);
  kvc_cuda_dev_alloc(0, n, &src);
  kvc_cuda_copy_to_device(0, region, old_bytes.data(), n);
  kvc_cuda_copy_to_device(0, src, c.regions[0].data(), n);
  kvc_tables t{c.entries.data(), c.group_start.data(), c.n_groups()};
  const uint64_t rb = n;
  int rc = kvc_cuda_set_tables(ctx, &t, &region, &rb, 1);
  std::string detail;
  bool ok = rc == KVC_OK;
  if (!ok) detail = kvc_cuda_last_error(ctx);
  if (ok && kvc_test_sleep_then_copy(st, region, src, n, 300000) != 0) ok = false, detail = "sleep kernel launch";
  uint64_t ticket = 0;
  auto t0 = std::chrono::steady_clock::now();
  if (ok) {
    rc = kvc_cuda_submit(ctx, c.rows.data(), c.rows.size(), c.out_len, st, &ticket);
    if (rc) ok = false, detail = kvc_cuda_last_error(ctx);
  }
  const double submit_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const int q = ok ? kvc_cuda_query(ctx, ticket) : -100;
  std::vector<uint64_t> got(c.out_len, 0);
  if (ok) {
    rc = kvc_cuda_collect(ctx, ticket, got.data(), got.size());
    if (rc) ok = false, detail = kvc_cuda_last_error(ctx);
  }
  const double total_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  kvc_cuda_dev_free(0, region);
  kvc_cuda_dev_free(0, src);
  char buf[200];
  std::snprintf(buf, sizeof buf, "submit %.3f ms (host never waited), query right after: %s, results after %.1f ms", submit_ms,
                q == KVC_CUDA_PENDING ? "pending" : "NOT pending", total_ms);
  if (ok && q != KVC_CUDA_PENDING) ok = false;
  if (ok && submit_ms > 50) ok = false;
  if (ok && got != want) {
    ok = false;
    detail = "checksum did not see the KV written before it on the stream: " + first_diff(got, want, "gpu", "cpu(new)");
  }
  report(ok, "ordering: " + std::to_string(n_blocks) + " rows (" + (copied ? "copied" : "inline") +
                 ") after a late compute-stream write",
         std::string(buf) + (detail.empty() ? "" : "; " + detail));
}

void ticket_and_validation_cases(kvc_cuda_ctx* ctx, cudaStream_t st) {
  Rng rng(77);
  Case c;
  AttnCache a = random_attn(rng, 4, 0);
  add_attn(c, a, identity_layout(), rng);
  c.end_group();
  for (uint32_t i = 0; i < 4; ++i) c.rows.push_back(kvc_row{0, i, i * a.B, a.B, i, 0});
  c.out_len = 4;
  std::vector<uint64_t> want;
  cpu_sum(c, want);
  DevRegions dr(c);
  kvc_tables t{c.entries.data(), c.group_start.data(), c.n_groups()};
  int rc = kvc_cuda_set_tables(ctx, &t, dr.addr.data(), dr.bytes.data(), 1);
  report(rc == KVC_OK, "tickets: set_tables", kvc_cuda_last_error(ctx));
  // more submits than slots (8): the oldest expire, the newest collect right
  std::vector<uint64_t> tickets;
  for (int i = 0; i < 10; ++i) {
    uint64_t tk = 0;
    rc = kvc_cuda_submit(ctx, c.rows.data(), c.rows.size(), c.out_len, st, &tk);
    if (rc) break;
    tickets.push_back(tk);
  }
  std::vector<uint64_t> got(4, 0);
  bool ok = tickets.size() == 10;
  ok = ok && kvc_cuda_collect(ctx, tickets[0], got.data(), 4) == KVC_ERANGE;
  ok = ok && kvc_cuda_collect(ctx, tickets[1], got.data(), 4) == KVC_ERANGE;
  for (int i = 2; ok && i < 10; ++i) {
    std::fill(got.begin(), got.end(), 0);
    ok = kvc_cuda_collect(ctx, tickets[i], got.data(), 4) == KVC_OK && got == want;
  }
  ok = ok && kvc_cuda_collect(ctx, tickets[9], got.data(), 4) == KVC_ERANGE;  // collected
  report(ok, "tickets: 10 submits over 8 slots (2 expire, 8 exact, a collected ticket is gone)");
  {
    uint64_t tk = 0;
    kvc_cuda_submit(ctx, c.rows.data(), c.rows.size(), c.out_len, st, &tk);
    rc = kvc_cuda_collect(ctx, tk, got.data(), 3);
    bool ok2 = rc == KVC_ERANGE;
    std::fill(got.begin(), got.end(), 0);
    ok2 = ok2 && kvc_cuda_wait(ctx, tk) == KVC_OK && kvc_cuda_query(ctx, tk) == KVC_OK &&
          kvc_cuda_collect(ctx, tk, got.data(), 4) == KVC_OK && got == want;
    report(ok2, "tickets: wrong out_len is refused, then wait/query/collect");
  }
  // empty submit: zeros, no GPU work
  {
    uint64_t tk = 0;
    std::vector<uint64_t> z(5, 123);
    bool ok3 = kvc_cuda_submit(ctx, nullptr, 0, 5, st, &tk) == KVC_OK && kvc_cuda_query(ctx, tk) == KVC_OK &&
               kvc_cuda_collect(ctx, tk, z.data(), 5) == KVC_OK && z == std::vector<uint64_t>(5, 123);
    report(ok3, "empty submit adds nothing");
  }
  // row validation: nothing enqueued, error code like the CPU kernel
  struct Bad { kvc_row r; size_t out_len; int want; const char* what; };
  const Bad bad[] = {
      {{1, 0, 0, 1, 0, 0}, 4, KVC_ERANGE, "group past n_groups"},
      {{0, 4, 0, 1, 0, 0}, 4, KVC_ERANGE, "block_id past num_blocks"},
      {{0, 0, 0, a.B + 1, 0, 0}, 4, KVC_ERANGE, "valid_tokens past block_tokens"},
      {{0, 0, 0, 1, 4, 0}, 4, KVC_ERANGE, "out_offset past out_len"},
  };
  for (const Bad& b : bad) {
    std::vector<uint64_t> cpu_out(b.out_len, 0);
    std::vector<const uint8_t*> rp{c.regions[0].data()};
    const int cpu_rc = kvc_sum_rows_cpu(&t, rp.data(), dr.bytes.data(), 1, &b.r, 1, cpu_out.data(), b.out_len);
    uint64_t tk = 0;
    const int gpu_rc = kvc_cuda_submit(ctx, &b.r, 1, b.out_len, st, &tk);
    report(gpu_rc == b.want && cpu_rc == b.want, std::string("validation: ") + b.what,
           "gpu " + std::to_string(gpu_rc) + " cpu " + std::to_string(cpu_rc) + " (" + kvc_cuda_last_error(ctx) + ")");
  }
  // table validation: an extent past its region, an unknown kind; the earlier tables stay
  {
    uint64_t lo = 0, hi = 0;
    kvc_entry_extent(&c.entries[0], &lo, &hi);
    const uint64_t small = hi - 1;  // one byte short of what entry 0 reads
    int r1 = kvc_cuda_set_tables(ctx, &t, dr.addr.data(), &small, 1);
    std::string m1 = kvc_cuda_last_error(ctx);
    std::vector<kvc_entry> e2 = c.entries;
    e2[0].kind = 9;
    kvc_tables t2{e2.data(), c.group_start.data(), 1};
    int r2 = kvc_cuda_set_tables(ctx, &t2, dr.addr.data(), dr.bytes.data(), 1);
    uint64_t tk = 0;
    std::fill(got.begin(), got.end(), 0);
    bool still = kvc_cuda_submit(ctx, c.rows.data(), 4, 4, st, &tk) == KVC_OK && kvc_cuda_collect(ctx, tk, got.data(), 4) == KVC_OK &&
                 got == want;
    report(r1 == KVC_ERANGE && r2 == KVC_EINVAL && still, "validation: tables (extent past region, unknown kind); old tables kept",
           m1 + " | " + kvc_cuda_last_error(ctx));
  }
}

}  // namespace

/**
 * The synchronizing-call counter (kvc_cuda_sync_calls): a steady-state step (submit, query until
 * done, collect) makes none, 50 steps in a row after one warm-up step, with the sums right; a wait
 * on a pending ticket is counted (the counter counts at all).
 */
void sync_calls_case(cudaStream_t st) {
  Rng rng(9);
  Case c;
  AttnCache a;
  a.nb = 64;
  a.H = 4;
  a.B = 16;
  a.cell = 256;
  a.data.resize((size_t)a.nb * a.H * a.B * a.cell);
  rng.fill(a.data.data(), a.data.size());
  a.factor_base = 3u * 65536u;
  add_attn(c, a, identity_layout(), rng);
  c.end_group();
  for (uint32_t i = 0; i < 28; ++i) c.rows.push_back(kvc_row{0, (i * 7) % a.nb, i * 16, 16, i, 0});
  c.out_len = 28;
  std::vector<uint64_t> want;
  cpu_sum(c, want);
  kvc_cuda_ctx* ctx = nullptr;
  if (kvc_cuda_create(0, nullptr, &ctx) != KVC_OK) return report(false, "sync calls: create");
  const size_t n = c.regions[0].size();
  uint64_t region = 0, src = 0;
  kvc_cuda_dev_alloc(0, n, &region);
  kvc_cuda_dev_alloc(0, n, &src);
  kvc_cuda_copy_to_device(0, region, c.regions[0].data(), n);
  kvc_cuda_copy_to_device(0, src, c.regions[0].data(), n);
  kvc_tables t{c.entries.data(), c.group_start.data(), c.n_groups()};
  const uint64_t rb = n;
  std::string detail;
  bool ok = kvc_cuda_set_tables(ctx, &t, &region, &rb, 1) == KVC_OK;
  unsigned long long steps_with_sync = 0, max_per_step = 0;
  for (int step = 0; ok && step < 51; ++step) {  // step 0: warm-up
    const unsigned long long before = kvc_cuda_sync_calls();
    uint64_t ticket = 0;
    if (kvc_cuda_submit(ctx, c.rows.data(), c.rows.size(), c.out_len, st, &ticket) != KVC_OK) {
      ok = false, detail = kvc_cuda_last_error(ctx);
      break;
    }
    int q;
    while ((q = kvc_cuda_query(ctx, ticket)) == KVC_CUDA_PENDING) {
    }
    std::vector<uint64_t> got(c.out_len, 0);
    if (q != KVC_OK || kvc_cuda_collect(ctx, ticket, got.data(), got.size()) != KVC_OK) {
      ok = false, detail = kvc_cuda_last_error(ctx);
      break;
    }
    const unsigned long long d = kvc_cuda_sync_calls() - before;
    if (step > 0 && d) ++steps_with_sync, max_per_step = std::max(max_per_step, d);
    if (got != want) ok = false, detail = "step " + std::to_string(step) + ": " + first_diff(got, want, "gpu", "cpu");
  }
  // a wait on a pending ticket (the stream busy with a long kernel) is a counted synchronizing call
  unsigned long long wait_delta = 0;
  if (ok && kvc_test_sleep_then_copy(st, region, src, n, 200000) == 0) {
    uint64_t ticket = 0;
    if (kvc_cuda_submit(ctx, c.rows.data(), c.rows.size(), c.out_len, st, &ticket) == KVC_OK) {
      const unsigned long long before = kvc_cuda_sync_calls();
      const bool pending = kvc_cuda_query(ctx, ticket) == KVC_CUDA_PENDING;
      kvc_cuda_wait(ctx, ticket);
      wait_delta = kvc_cuda_sync_calls() - before;
      if (!pending) ok = false, detail = "the step after a 200 ms kernel was not pending";
      std::vector<uint64_t> got(c.out_len, 0);
      kvc_cuda_collect(ctx, ticket, got.data(), got.size());
    }
  }
  kvc_cuda_destroy(ctx);
  kvc_cuda_dev_free(0, region);
  kvc_cuda_dev_free(0, src);
  char buf[200];
  std::snprintf(buf, sizeof buf, "50 steps after warm-up: %llu with a synchronizing call (max %llu); wait on a pending ticket: %llu", steps_with_sync,
                max_per_step, wait_delta);
  report(ok && steps_with_sync == 0 && wait_delta == 1, "sync calls: zero per steady-state step", std::string(buf) + (detail.empty() ? "" : "; " + detail));
}

/**
 * submit() from a thread that has made no CUDA call yet: the launch goes through the driver's
 * cuLaunchKernel, which needs the device's context current on that thread; the sums of that step
 * and of a second one from the same thread equal the CPU kernel's. Inline rows, so the launch is the
 * step's first call that needs a context. (On CUDA 13 / driver 580 the context is already current
 * there: DeviceGuard's cudaGetDevice binds it, and a build without driver_launch's
 * CUDA_ERROR_INVALID_CONTEXT fallback passed this case too; the fallback is defensive.)
 */
void fresh_thread_case(cudaStream_t st) {
  Rng rng(77);
  Case c;
  AttnCache a = random_attn(rng, 8, 0);
  AttnLayout L = identity_layout();
  add_attn(c, a, L, rng);
  c.end_group();
  random_rows(c, rng, 0, 8, a.B, 1, 16);
  std::vector<uint64_t> cpu;
  if (cpu_sum(c, cpu) != KVC_OK) return report(false, "submit from a fresh thread", "cpu sum failed");
  kvc_cuda_ctx* ctx = nullptr;
  if (kvc_cuda_create(0, nullptr, &ctx) != KVC_OK) return report(false, "submit from a fresh thread", "create failed");
  DevRegions dr(c);
  kvc_tables t{c.entries.data(), c.group_start.data(), c.n_groups()};
  if (kvc_cuda_set_tables(ctx, &t, dr.addr.data(), dr.bytes.data(), (uint32_t)dr.addr.size()) != KVC_OK) {
    kvc_cuda_destroy(ctx);
    return report(false, "submit from a fresh thread", "set_tables failed");
  }
  std::string detail;
  bool ok = true;
  std::thread th([&] {
    for (int step = 0; step < 2 && ok; ++step) {
      uint64_t tk = 0;
      std::vector<uint64_t> g(c.out_len, 0);
      int rc = kvc_cuda_submit(ctx, c.rows.data(), c.rows.size(), c.out_len, st, &tk);
      if (rc == KVC_OK) rc = kvc_cuda_collect(ctx, tk, g.data(), g.size());
      if (rc != KVC_OK) detail = "step " + std::to_string(step) + ": " + kvc_cuda_last_error(ctx);
      else detail = first_diff(g, cpu, "gpu", "cpu");
      ok = rc == KVC_OK && detail.empty();
    }
  });
  th.join();
  report(ok, "submit from a fresh thread (launch through the driver): 2 steps equal the CPU's", detail);
  kvc_cuda_destroy(ctx);
}

int main(int argc, char** argv) {
  std::string vectors = "../shared/vectors/checksum-v1.json";
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    else if (std::strcmp(argv[i], "--emulate") == 0) g_emulate = true;
    else vectors = argv[i];
  }
  if (g_emulate) {
    std::printf("emulation: the kernel's per-thread code on the CPU (no GPU used)\n");
    run_vectors(nullptr, nullptr, vectors);
    random_attention_cases(nullptr, nullptr, quick ? 40 : 300, 1);
    random_state_cases(nullptr, nullptr, quick ? 40 : 200, 2);
    random_stream_cases(nullptr, nullptr, quick ? 20 : 100, 3);
    big_state_cases(nullptr, nullptr);
    mixed_groups_case(nullptr, nullptr);
    g_emu_unroll = 8;  // the other variants
    random_attention_cases(nullptr, nullptr, quick ? 20 : 100, 24);
    g_emu_unroll = 1;
    random_attention_cases(nullptr, nullptr, quick ? 20 : 100, 25);
    g_emu_unroll = 2;
    // the specialized ATTN V16 kernels (variants 33, 35, 37), over random attention steps (those whose
    // tables are all ATTN V16 take them; the count is checked so the path cannot silently go unused)
    for (int sp : {1, 3, 5}) {
      g_emu_spec = sp;
      const uint64_t before = g_emu_spec_cases, pi_before = g_emu_spec_pi;
      random_attention_cases(nullptr, nullptr, quick ? 20 : 80, 50 + sp);
      random_attn16_cases(nullptr, nullptr, quick ? 20 : 80, 60 + sp);
      for (uint32_t ib : {8192u, 1024u}) {  // more items per entry: partial pair and token chunks
        g_item_bytes = ib;
        random_attn16_cases(nullptr, nullptr, quick ? 10 : 40, 70 + sp + ib);
      }
      g_item_bytes = 32768;
      report(g_emu_spec_cases > before && g_emu_spec_pi > pi_before,
             "emulated variant " + std::to_string(32 + sp) + " took the specialized path, pairs inner among them",
             std::to_string(g_emu_spec_cases - before) + " cases, " + std::to_string(g_emu_spec_pi - pi_before) + " pairs-inner entries");
    }
    g_emu_spec = 0;
    g_item_bytes = 8192;
    random_attention_cases(nullptr, nullptr, quick ? 20 : 100, 26);
    random_state_cases(nullptr, nullptr, quick ? 20 : 100, 27);
    g_item_bytes = 1024;  // smaller items: more chunks per entry
    g_emu_unroll = 4;
    random_attention_cases(nullptr, nullptr, quick ? 20 : 100, 21);
    random_state_cases(nullptr, nullptr, quick ? 20 : 100, 22);
    random_stream_cases(nullptr, nullptr, quick ? 10 : 50, 23);
    big_state_cases(nullptr, nullptr);
    const char* kinds[4] = {"ATTN", "ROWS line", "ROWS unit", "STREAM"};
    for (int k = 0; k < 4; ++k)
      std::printf("(entries emulated: %s V16 %" PRIu64 ", V8 %" PRIu64 ", GEN %" PRIu64 ")\n", kinds[k], g_paths[k][0],
                  g_paths[k][1], g_paths[k][2]);
    std::printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
  }
  int rv = 0, dv = 0;
  kvc_cuda_versions(&rv, &dv);
  int n = 0;
  if (kvc_cuda_device_count(&n) != KVC_OK) {
    std::printf("cuda runtime %d, driver %d: no GPU (%s)\n", rv, dv, kvc_cuda_probe_error());
    std::printf("0 passed, 0 failed (skipped: no GPU)\n");
    return 2;
  }
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  std::printf("cuda runtime %d, driver %d, device 0: %s, %d SMs, cc %d.%d\n", rv, dv, prop.name, prop.multiProcessorCount,
              prop.major, prop.minor);
  kvc_cuda_ctx* ctx = nullptr;
  int rc = kvc_cuda_create(0, nullptr, &ctx);
  report(rc == KVC_OK, "create (with warm-up)");
  if (rc) {
    std::printf("%d passed, %d failed\n", g_pass, g_fail);
    return 1;
  }
  cudaStream_t st;
  cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
  run_vectors(ctx, st, vectors);
  random_attention_cases(ctx, st, quick ? 40 : 300, 1);
  random_state_cases(ctx, st, quick ? 40 : 200, 2);
  random_stream_cases(ctx, st, quick ? 20 : 100, 3);
  big_state_cases(ctx, st);
  mixed_groups_case(ctx, st);
  ordering_case(ctx, st, 64);
  ordering_case(ctx, st, 128);
  ordering_case(ctx, st, 256, true);
  // the copied rows path (inline rows off; copy-out by memcpy + memset), and 3000 rows (copied)
  {
    kvc_cuda_ctx* cp = nullptr;
    if (kvc_cuda_create(0, nullptr, &cp) == KVC_OK && kvc_cuda_debug_set_submit(cp, 0, 0, 0) == KVC_OK) {
      random_attention_cases(cp, st, quick ? 10 : 60, 41);
      random_state_cases(cp, st, quick ? 10 : 40, 42);
      mixed_groups_case(cp, st);
      ordering_case(cp, st, 64, true);
      kvc_cuda_debug_set_submit(cp, 128, 128, 1);  // every step in the 128-row parameter block
      random_attention_cases(cp, st, quick ? 10 : 40, 43);
      kvc_cuda_destroy(cp);
    } else {
      report(false, "create (copied rows path)");
    }
  }
  // a context with its own side and upload streams (kvc_cuda_debug_private_streams; the default
  // contexts above share the device's pair) next to the shared ones, both in use
  {
    kvc_cuda_debug_private_streams(1);
    kvc_cuda_ctx* own = nullptr;
    const int rc_own = kvc_cuda_create(0, nullptr, &own);
    kvc_cuda_debug_private_streams(0);
    if (rc_own == KVC_OK) {
      random_attention_cases(own, st, quick ? 10 : 40, 44);
      random_attn16_cases(own, st, quick ? 10 : 40, 45);
      random_attn16_cases(ctx, st, quick ? 10 : 40, 46);  // the default context (variant 35, shared streams)
      kvc_cuda_destroy(own);
    } else {
      report(false, "create (own streams)");
    }
  }
  ticket_and_validation_cases(ctx, st);
  sync_calls_case(st);
  // the same kernel with a different chunk size (more work items per entry)
  {
    kvc_cuda_options o{};
    o.chunk_bytes = 1024;
    kvc_cuda_ctx* small = nullptr;
    if (kvc_cuda_create(0, &o, &small) == KVC_OK) {
      random_attention_cases(small, st, quick ? 10 : 60, 11);
      random_state_cases(small, st, quick ? 10 : 60, 12);
      big_state_cases(small, st);
      kvc_cuda_destroy(small);
    } else {
      report(false, "create with chunk_bytes 1024");
    }
  }
  fresh_thread_case(st);
  // the other kernel variants (ATTN paths: pairs inner with 80 registers; 2 pairs x 2 tokens without
  // the default's load hints; tokens inner, 4 or 8 loads)
  for (int variant : {1, 2, 4, 8, 32, 33, 35, 37}) {
    kvc_cuda_ctx* v = nullptr;
    if (kvc_cuda_create(0, nullptr, &v) == KVC_OK && kvc_cuda_debug_set_variant(v, variant) == KVC_OK) {
      random_attention_cases(v, st, quick ? 10 : 80, 30 + variant);
      mixed_groups_case(v, st);
      if (variant > 32) random_attn16_cases(v, st, quick ? 20 : 80, 60 + variant);
      if (variant > 32)  // the specialized kernel ran (over the steps whose tables are all ATTN V16)
        report(kvc_cuda_debug_spec_launches(v) > 0, "variant " + std::to_string(variant) + " launched its specialized kernel",
               std::to_string(kvc_cuda_debug_spec_launches(v)) + " submits");
      kvc_cuda_destroy(v);
    } else {
      report(false, "create (kernel variant " + std::to_string(variant) + ")");
    }
  }
  cudaError_t le = cudaDeviceSynchronize();
  report(le == cudaSuccess, "no asynchronous CUDA error", cudaGetErrorString(le));
  cudaStreamDestroy(st);
  kvc_cuda_destroy(ctx);
  std::printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail ? 1 : 0;
}
