/**
 * @file bench_cuda.cu
 * @brief Benchmarks of the CUDA checksum kernel (kvc_checksum_cuda.h), each next to a plain device
 *        read of the same number of bytes (a simple sum kernel: the physical limit) in the same run:
 *  1. attn128: 2048 blocks x 8 heads x 16 tokens x 128 head size, bf16, K and V (128 MiB), vLLM's
 *     [2, blocks, tokens, heads, head size] layout; target <= 40 us and >= 0.8 of the plain read;
 *  2. step28: one step of 64 blocks over 28 layers (one region per layer, scattered block ids),
 *     for 2, 4 and 8 KV heads; target <= 15 us including the launch (device time from an idle GPU,
 *     host submit time, and submit-to-results wall time); with its floors from an idle GPU (an
 *     empty launch, one with a 1 KiB parameter block, a plain read of as many contiguous bytes and
 *     a plain read of the step's own scattered chunks);
 *  3. mamba: 256 rows of 1 MiB states (ROWS fp32 [32,64,128], bf16 [32,64,256], STREAM 1 MiB);
 *     target >= 0.8 of the plain read.
 * Every benchmark first checks its sums against the CPU kernel (kvc_sum_rows_cpu), bit for bit.
 * Kernel variants (kvc_cuda_internal.h): V35 (default) = V32 in a kernel with only the ATTN V16
 * paths where the tables are all ATTN V16; V32 = V2 with hinted 16-byte loads; V2 pairs
 * inner, 64 registers; V1 pairs inner, 80 registers; V8 tokens inner with 8 loads in flight per lane
 * (see kvc_checksum_cuda.cu). The isolated 28-layer step also runs with the launch through
 * cudaLaunchKernel against the default driver cuLaunchKernel, and prints submit()'s host time by phase.
 * The plain read is the best of two kernels (4 or 8 loads in flight per thread) x 4 grid sizes.
 * Usage: kvc_bench_cuda [--quick]. Prints a table; the last lines summarize the targets.
 * kvc_bench_cuda --ab [V ...]: only the A/B of kernel variants (default 35 32 1035 1032 2 33 37;
 * V + 1000: the context with its own side and upload streams, as before session 6), each
 * context checked bit-exact first, interleaved in two rounds: attn128 NHD and HND (step and kernel
 * alone, each twice), step28 at 2 and 8 KV heads (pipelined, kernel alone, queued, isolated twice),
 * and the 2-head step's floor (its own chunks read plainly from idle) with 24-byte and 1 KiB parameters.
 */
#include "kvc_checksum.h"
#include "kvc_checksum_cuda.h"
#include "kvc_cuda_internal.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define CK(x)                                                                                  \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

namespace {

int g_sms = 132;
int g_iters = 50;
std::vector<std::string> g_summary;
bool g_all_exact = true;

__global__ void fill_kernel(uint4* p, size_t n16, uint64_t seed) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n16; i += (size_t)gridDim.x * blockDim.x) {
    uint64_t z = seed + i * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    uint64_t w = z * 0xD6E8FEB86659FD93ull;
    p[i] = make_uint4((uint32_t)z, (uint32_t)(z >> 32), (uint32_t)w, (uint32_t)(w >> 32));
  }
}

/** Keeps the stream busy for `ns` nanoseconds (a stand-in for the forward pass). */
__global__ void spin_kernel(uint64_t ns) {
  uint64_t t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

/** The plain read: sum of all 16-byte words (grid-stride, 4 loads in flight per thread). */
__global__ void __launch_bounds__(256) plain_sum(const uint4* __restrict__ p, size_t n16, unsigned long long* out) {
  uint64_t acc = 0;
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n16; i += 4 * stride) {
    uint4 a = __ldg(p + i), b = __ldg(p + i + stride), c = __ldg(p + i + 2 * stride), d = __ldg(p + i + 3 * stride);
    acc += ((uint64_t)a.y << 32 | a.x) + ((uint64_t)a.w << 32 | a.z) + ((uint64_t)b.y << 32 | b.x) +
           ((uint64_t)b.w << 32 | b.z) + ((uint64_t)c.y << 32 | c.x) + ((uint64_t)c.w << 32 | c.z) +
           ((uint64_t)d.y << 32 | d.x) + ((uint64_t)d.w << 32 | d.z);
  }
  for (; i < n16; i += stride) {
    uint4 a = __ldg(p + i);
    acc += ((uint64_t)a.y << 32 | a.x) + ((uint64_t)a.w << 32 | a.z);
  }
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0 && acc) atomicAdd(out, (unsigned long long)acc);
}

/** The plain read with 8 independent 16-byte loads in flight per thread (for small reads: fewer rounds). */
__global__ void __launch_bounds__(256) plain_sum8(const uint4* __restrict__ p, size_t n16, unsigned long long* out) {
  uint64_t acc = 0;
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + 7 * stride < n16; i += 8 * stride) {
    uint4 v[8];
#pragma unroll
    for (int q = 0; q < 8; ++q) v[q] = __ldg(p + i + q * stride);
#pragma unroll
    for (int q = 0; q < 8; ++q) acc += ((uint64_t)v[q].y << 32 | v[q].x) + ((uint64_t)v[q].w << 32 | v[q].z);
  }
  uint4 v[8];
#pragma unroll
  for (int q = 0; q < 8; ++q) v[q] = i + q * stride < n16 ? __ldg(p + i + q * stride) : make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int q = 0; q < 8; ++q) acc += ((uint64_t)v[q].y << 32 | v[q].x) + ((uint64_t)v[q].w << 32 | v[q].z);
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0 && acc) atomicAdd(out, (unsigned long long)acc);
}

/** A launch that does nothing (the launch floor). */
__global__ void empty_kernel() {}

/** A parameter block the size of the step's (64 inline rows: header + 15 bytes a row). */
struct Blob1K {
  unsigned char b[1024];
};
/** A launch that does nothing with a 1 KiB parameter block (the step's launch floor). */
__global__ void empty_kernel_1k(const __grid_constant__ Blob1K p) {
  if (p.b[threadIdx.x] == 255 && p.b[1023] == 254) asm volatile("trap;");
}

/**
 * A plain read of the step's own bytes: warp w sums the 16-byte words of chunk w (chunk_addr[w],
 * chunk16 words each), U loads in flight per lane; the floor for the step's access pattern (the
 * same scattered chunks, no tables, no per-item arithmetic).
 */
template <int U>
__global__ void __launch_bounds__(256) scatter_sum(const uint64_t* __restrict__ chunk_addr, uint32_t n_chunks, uint32_t chunk16,
                                                   unsigned long long* out) {
  const uint32_t w = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (w >= n_chunks) return;
  const uint4* p = reinterpret_cast<const uint4*>(chunk_addr[w]);
  uint64_t acc = 0;
  for (uint32_t i = lane; i < chunk16; i += 32 * U) {
    uint4 v[U];
#pragma unroll
    for (int q = 0; q < U; ++q) v[q] = i + 32 * q < chunk16 ? __ldg(p + i + 32 * q) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int q = 0; q < U; ++q) acc += ((uint64_t)v[q].y << 32 | v[q].x) + ((uint64_t)v[q].w << 32 | v[q].z);
  }
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
  if (lane == 0 && acc) atomicAdd(out, (unsigned long long)acc);
}

/** scatter_sum's arguments in a parameter block the size of the step's (1 KiB: 64 inline rows). */
struct ScatterArgs1K {
  const uint64_t* chunk_addr;
  unsigned long long* out;
  uint32_t n_chunks, chunk16;
  unsigned char pad[1024 - 24];
};
/**
 * scatter_sum<4> with its arguments in a 1 KiB parameter block: the floor of the isolated step with
 * the step's own parameter size (the plain floor launches with 24 bytes of parameters).
 */
__global__ void __launch_bounds__(256) scatter_sum_1k(const __grid_constant__ ScatterArgs1K a) {
  const uint32_t w = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (w >= a.n_chunks) return;
  const uint4* p = reinterpret_cast<const uint4*>(a.chunk_addr[w]);
  uint64_t acc = 0;
  for (uint32_t i = lane; i < a.chunk16; i += 32 * 4) {
    uint4 v[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) v[q] = i + 32 * q < a.chunk16 ? __ldg(p + i + 32 * q) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int q = 0; q < 4; ++q) acc += ((uint64_t)v[q].y << 32 | v[q].x) + ((uint64_t)v[q].w << 32 | v[q].z);
  }
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
  if (lane == 0 && acc) atomicAdd(a.out, (unsigned long long)acc);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

/**
 * Median time (us, GPU events f0..f1 on `st`) of `enqueue(i)` launched on an idle stream: each of
 * g_iters * 4 rounds first waits for `st` to drain, the first 5 rounds are warm-up.
 */
template <class F>
double idle_median_us(cudaStream_t st, cudaEvent_t f0, cudaEvent_t f1, F&& enqueue) {
  std::vector<double> v;
  for (int i = 0; i < g_iters * 4; ++i) {
    CK(cudaStreamSynchronize(st));
    CK(cudaEventRecord(f0, st));
    enqueue(i);
    CK(cudaEventRecord(f1, st));
    CK(cudaEventSynchronize(f1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, f0, f1));
    if (i >= 5) v.push_back(ms * 1000.0);
  }
  return median(v);
}


/** Median device time (us) of `fn` over g_iters back-to-back runs, one event pair each. */
template <class F>
double time_pipelined(cudaStream_t st, F fn) {
  for (int i = 0; i < 3; ++i) fn();
  CK(cudaStreamSynchronize(st));
  std::vector<cudaEvent_t> ev(2 * g_iters);
  for (auto& e : ev) CK(cudaEventCreate(&e));
  for (int i = 0; i < g_iters; ++i) {
    CK(cudaEventRecord(ev[2 * i], st));
    fn();
    CK(cudaEventRecord(ev[2 * i + 1], st));
  }
  CK(cudaStreamSynchronize(st));
  std::vector<double> t;
  for (int i = 0; i < g_iters; ++i) {
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
    t.push_back(ms * 1000.0);
  }
  for (auto& e : ev) cudaEventDestroy(e);
  return median(t);
}

/**
 * Best (over two plain read kernels, 4 and 8 loads in flight per thread, and 4 grid sizes each)
 * median time of the plain read of `bytes`: run i reads window i % windows of the buffer at p
 * (windows of `bytes` each, so a small read does not stay in L2). *best_kernel / *best_grid: the
 * winner (8 or 4 loads; blocks).
 */
double plain_read_us(cudaStream_t st, const void* p, size_t bytes, unsigned long long* d_out, int windows = 1,
                     int* best_kernel = nullptr, int* best_grid = nullptr) {
  double best = 1e30;
  for (int kern : {4, 8})
  for (int mult : {2, 4, 8, 16}) {
    const int grid = g_sms * mult;
    int k = 0;
    double t = time_pipelined(st, [&] {
      const uint4* w = reinterpret_cast<const uint4*>(static_cast<const char*>(p) + (size_t)(k++ % windows) * bytes);
      if (kern == 8) plain_sum8<<<grid, 256, 0, st>>>(w, bytes / 16, d_out);
      else plain_sum<<<grid, 256, 0, st>>>(w, bytes / 16, d_out);
    });
    if (t < best) {
      best = t;
      if (best_kernel) *best_kernel = kern;
      if (best_grid) *best_grid = grid;
    }
  }
  return best;
}

struct Tables {
  std::vector<kvc_entry> entries;
  std::vector<uint32_t> group_start{0};
  std::vector<uint64_t> addr, bytes;
  kvc_tables t() const { return kvc_tables{entries.data(), group_start.data(), (uint32_t)group_start.size() - 1}; }
};

kvc_entry attn_entry(uint64_t off, uint64_t fb, int64_t block_stride, int64_t head_stride, int64_t token_stride,
                     uint32_t heads, uint32_t tokens, uint32_t bs, uint32_t bc, uint32_t cell, uint32_t nb, uint32_t region,
                     uint32_t column) {
  kvc_entry e;
  std::memset(&e, 0, sizeof e);
  e.offset = off;
  e.factor_base = fb;
  e.block_stride = block_stride;
  e.outer_stride = head_stride;
  e.kblock_stride = (int64_t)tokens * token_stride;
  e.token_stride = token_stride;
  e.elem_count[0] = e.elem_count[1] = e.elem_count[2] = 1;
  e.kind = KVC_ENTRY_ATTN;
  e.region = region;
  e.column = column;
  e.outer_count = heads;
  e.kblock_tokens = tokens;
  e.byte_start = bs;
  e.byte_count = bc;
  e.cell_pieces = cell / 8;
  e.num_blocks = nb;
  e.block_tokens = tokens;
  return e;
}

/** GPU sums of one submit == CPU sums over host copies of the regions. */
bool verify(kvc_cuda_ctx* ctx, const Tables& T, const std::vector<kvc_row>& rows, size_t out_len, cudaStream_t st,
            const char* name) {
  std::vector<std::vector<uint8_t>> host(T.addr.size());
  std::vector<const uint8_t*> rp;
  for (size_t r = 0; r < T.addr.size(); ++r) {
    host[r].resize(T.bytes[r]);
    CK(cudaMemcpy(host[r].data(), (const void*)T.addr[r], T.bytes[r], cudaMemcpyDeviceToHost));
    rp.push_back(host[r].data());
  }
  std::vector<uint64_t> cpu(out_len, 0), gpu(out_len, 0);
  kvc_tables t = T.t();
  int rc = kvc_sum_rows_cpu(&t, rp.data(), T.bytes.data(), (uint32_t)rp.size(), rows.data(), rows.size(), cpu.data(), out_len);
  uint64_t tk = 0;
  int rg = kvc_cuda_submit(ctx, rows.data(), rows.size(), out_len, st, &tk);
  if (rg == KVC_OK) rg = kvc_cuda_collect(ctx, tk, gpu.data(), out_len);
  const bool ok = rc == KVC_OK && rg == KVC_OK && cpu == gpu;
  std::printf("  %-44s GPU == CPU (%zu sums): %s%s%s\n", name, out_len, ok ? "yes" : "NO", rg ? " gpu error: " : "",
              rg ? kvc_cuda_last_error(ctx) : "");
  if (!ok) g_all_exact = false;
  return ok;
}

/** Median of per-submit device time, pipelined (host ahead of the GPU); submit i uses row set i % n. */
double checksum_us(kvc_cuda_ctx* ctx, const std::vector<std::vector<kvc_row>>& sets, size_t out_len, cudaStream_t st) {
  size_t k = 0;
  return time_pipelined(st, [&] {
    const std::vector<kvc_row>& rows = sets[k++ % sets.size()];
    uint64_t tk = 0;
    if (kvc_cuda_submit(ctx, rows.data(), rows.size(), out_len, st, &tk) != KVC_OK) {
      std::fprintf(stderr, "submit: %s\n", kvc_cuda_last_error(ctx));
      std::exit(1);
    }
  });
}

void line(const char* name, size_t bytes, double us, double plain) {
  std::printf("  %-50s %8.1f us %6.0f GB/s | plain read %7.1f us %6.0f GB/s | ratio %.3f\n", name, us, bytes / us / 1e3, plain,
              bytes / plain / 1e3, plain / us);
}

/** Median device time of the context's last kernel alone (relaunched; no copies). */
double kernel_only_us(kvc_cuda_ctx* ctx, cudaStream_t st) {
  return time_pipelined(st, [&] {
    if (kvc_cuda_debug_relaunch(ctx, st) != KVC_OK) {
      std::fprintf(stderr, "relaunch: %s\n", kvc_cuda_last_error(ctx));
      std::exit(1);
    }
  });
}

// ---------------------------------------------------------------------------------------------

void bench_attn128(cudaStream_t st, unsigned long long* d_out, bool quick) {
  std::printf("\n[attn128] 2048 blocks x 8 heads x 16 tokens x 128 head size, bf16, K and V (128 MiB)\n");
  const uint32_t nb = 2048, H = 8, T = 16, D = 128, row_b = D * 2;
  const uint64_t half = (uint64_t)nb * T * H * row_b, bytes = 2 * half;
  void* kv = nullptr;
  CK(cudaMalloc(&kv, bytes));
  fill_kernel<<<g_sms * 8, 256, 0, st>>>((uint4*)kv, bytes / 16, 42);
  CK(cudaStreamSynchronize(st));
  int pk = 4, pg = 0;
  const double plain = plain_read_us(st, kv, bytes, d_out, 1, &pk, &pg);
  std::printf("  plain read (best of 2 kernels x 4 grids): %.1f us, %d loads per thread in flight, %d blocks\n", plain, pk, pg);
  struct Layout { const char* name; bool hnd; };
  double best_nhd = 1e30, best_nhd_kernel = 0;
  std::string best_name;
  for (Layout L : {Layout{"NHD [2,blocks,tokens,heads,D]", false}, Layout{"HND [2,blocks,heads,tokens,D]", true}}) {
    Tables Tb;
    Tb.addr = {(uint64_t)kv};
    Tb.bytes = {bytes};
    const int64_t bstride = (int64_t)T * H * row_b;
    const int64_t hs = L.hnd ? (int64_t)T * row_b : row_b, ts = L.hnd ? row_b : (int64_t)H * row_b;
    Tb.entries.push_back(attn_entry(0, 5u * 65536u, bstride, hs, ts, H, T, 0, row_b, 2 * row_b, nb, 0, 0));
    Tb.entries.push_back(attn_entry(half, 5u * 65536u, bstride, hs, ts, H, T, row_b, row_b, 2 * row_b, nb, 0, 0));
    Tb.group_start.push_back(2);
    std::vector<kvc_row> rows;
    for (uint32_t i = 0; i < nb; ++i) rows.push_back(kvc_row{0, i, i * T, T, i, 0});
    // (variant, items): V32 (the default: V2 with hinted loads) at every item size, V2 (unhinted, as
    // before 2026-12-02 session 5), V1 / V8, then V32 and V2 again (drift within the run)
    struct VC { int variant; uint32_t chunk; };
    for (VC vc : {VC{35, 8192u}, VC{35, 16384u}, VC{35, 32768u}, VC{32, 32768u}, VC{2, 32768u}, VC{1, 32768u},
                  VC{8, 32768u}, VC{35, 32768u}, VC{32, 32768u}}) {
      const int variant = vc.variant;
      const uint32_t chunk = vc.chunk;
      if (quick && (chunk != 32768u || variant != 35)) continue;
      if (L.hnd && (chunk != 32768u || variant == 1)) continue;
      kvc_cuda_options o{};
      o.chunk_bytes = chunk;
      o.max_rows = nb;
      kvc_cuda_ctx* ctx = nullptr;
      if (kvc_cuda_create(0, &o, &ctx) != KVC_OK) std::exit(1);
      kvc_cuda_debug_set_variant(ctx, variant);
      kvc_tables t = Tb.t();
      if (kvc_cuda_set_tables(ctx, &t, Tb.addr.data(), Tb.bytes.data(), 1) != KVC_OK) {
        std::fprintf(stderr, "set_tables: %s\n", kvc_cuda_last_error(ctx));
        std::exit(1);
      }
      char name[96];
      std::snprintf(name, sizeof name, "%s %uK V%d", L.hnd ? "HND" : "NHD", chunk / 1024, variant);
      verify(ctx, Tb, rows, nb, st, name);
      const double us = checksum_us(ctx, {rows}, nb, st);
      const double kus = kernel_only_us(ctx, st);
      line((std::string(name) + ": step").c_str(), bytes, us, plain);
      line((std::string(name) + ": kernel only").c_str(), bytes, kus, plain);
      if (variant == 35 && chunk == 32768u) {  // the previous path: rows copied, results by copy + memset
        kvc_cuda_debug_set_submit(ctx, 128, 0, 0);
        line((std::string(name) + ": step, results by copy + memset (previous)").c_str(), bytes, checksum_us(ctx, {rows}, nb, st), plain);
        kvc_cuda_debug_set_submit(ctx, 128, 0, 1);
        line((std::string(name) + ": step again (copy-out kernel)").c_str(), bytes, checksum_us(ctx, {rows}, nb, st), plain);
      }
      if (!L.hnd && us < best_nhd) best_nhd = us, best_nhd_kernel = kus, best_name = name;
      kvc_cuda_destroy(ctx);
    }
  }
  char buf[200];
  std::snprintf(buf, sizeof buf,
                "attn128 (best: %s): step %.1f us (rows copy + kernel; target <= 40) = %.3f of the plain read %.1f us "
                "(target >= 0.8; issue 16: >= 0.93); kernel alone %.1f us = %.3f",
                best_name.c_str(), best_nhd, plain / best_nhd, plain, best_nhd_kernel, plain / best_nhd_kernel);
  g_summary.push_back(buf);
  CK(cudaFree(kv));
}

void bench_step28(cudaStream_t st, unsigned long long* d_out, bool quick) {
  const uint32_t layers = 28, nb = 2048, T = 16, D = 128, row_b = D * 2, n_rows = 64;
  for (uint32_t H : {2u, 4u, 8u}) {
    if (quick && H != 2u) continue;
    std::printf("\n[step28] one step of %u blocks over %u layers, %u KV heads x 16 tokens x 128, bf16, K and V\n", n_rows,
                layers, H);
    const uint64_t half = (uint64_t)nb * T * H * row_b, per_layer = 2 * half;
    Tables Tb;
    std::vector<void*> bufs;
    for (uint32_t l = 0; l < layers; ++l) {
      void* p = nullptr;
      CK(cudaMalloc(&p, per_layer));
      fill_kernel<<<g_sms * 4, 256, 0, st>>>((uint4*)p, per_layer / 16, 1000 + l);
      bufs.push_back(p);
      Tb.addr.push_back((uint64_t)p);
      Tb.bytes.push_back(per_layer);
      const int64_t bstride = (int64_t)T * H * row_b;
      Tb.entries.push_back(attn_entry(0, (uint64_t)l * 65536u, bstride, row_b, (int64_t)H * row_b, H, T, 0, row_b, 2 * row_b, nb, l, 0));
      Tb.entries.push_back(attn_entry(half, (uint64_t)l * 65536u, bstride, row_b, (int64_t)H * row_b, H, T, row_b, row_b, 2 * row_b, nb, l, 0));
    }
    Tb.group_start.push_back((uint32_t)Tb.entries.size());
    CK(cudaStreamSynchronize(st));
    // 32 disjoint sets of 64 scattered blocks, used in turn (a step's KV is not left in L2 by the last)
    std::vector<std::vector<kvc_row>> sets(nb / n_rows);
    for (uint32_t k = 0; k < sets.size(); ++k)
      for (uint32_t i = 0; i < n_rows; ++i) sets[k].push_back(kvc_row{0, ((k * n_rows + i) * 797u) % nb, i * T, T, i, 0});
    const std::vector<kvc_row>& rows = sets[0];
    const uint64_t bytes = (uint64_t)n_rows * layers * 2 * T * H * row_b;
    // plain read of the same number of bytes (contiguous), rotating over 8 windows like the row sets
    void* big = nullptr;
    CK(cudaMalloc(&big, 8 * bytes));
    fill_kernel<<<g_sms * 4, 256, 0, st>>>((uint4*)big, 8 * bytes / 16, 99);
    int pk = 4, pg = g_sms * 4;
    const double plain = plain_read_us(st, big, bytes, d_out, 8, &pk, &pg);
    std::printf("  plain read (best of 2 kernels x 4 grids): %.1f us, %d loads per thread in flight, %d blocks\n", plain, pk, pg);
    if (H == 2u) {
      // floors of the isolated step from an idle GPU (same events as the isolated step below): an
      // empty launch, and the plain read of the step's bytes launched alone
      cudaEvent_t f0, f1;
      CK(cudaEventCreate(&f0));
      CK(cudaEventCreate(&f1));
      auto idle_us = [&](auto&& enqueue) { return idle_median_us(st, f0, f1, enqueue); };
      // spin_kernel(0) sleeps once (__nanosleep(1000)): empty_kernel is the real empty launch
      const double spin0 = idle_us([&](int) { spin_kernel<<<1, 32, 0, st>>>(0); });
      const double empty = idle_us([&](int) { empty_kernel<<<1, 32, 0, st>>>(); });
      const double alone = idle_us([&](int i) {
        const uint4* w = reinterpret_cast<const uint4*>(static_cast<const char*>(big) + (size_t)(i % 8) * bytes);
        plain_sum<<<g_sms * 4, 256, 0, st>>>(w, bytes / 16, d_out);
      });
      double alone_best = 1e30;
      int ab_k = 4, ab_g = 0;
      for (int kern : {4, 8})
        for (int mult : {2, 4, 8, 16}) {
          const double t = idle_us([&](int i) {
            const uint4* w = reinterpret_cast<const uint4*>(static_cast<const char*>(big) + (size_t)(i % 8) * bytes);
            if (kern == 8) plain_sum8<<<g_sms * mult, 256, 0, st>>>(w, bytes / 16, d_out);
            else plain_sum<<<g_sms * mult, 256, 0, st>>>(w, bytes / 16, d_out);
          });
          if (t < alone_best) alone_best = t, ab_k = kern, ab_g = g_sms * mult;
        }
      std::printf("  floors from an idle GPU: empty launch %.1f us (spin_kernel(0), as before: %.1f us), plain read of %.1f MiB launched alone %.1f us "
                  "(4 loads, %d blocks, as before); best plain read alone %.1f us (%d loads, %d blocks)\n",
                  empty, spin0, bytes / 1048576.0, alone, g_sms * 4, alone_best, ab_k, ab_g);
      char fb[240];
      std::snprintf(fb, sizeof fb, "step28 floors from an idle GPU: empty launch %.1f us (%.1f with the 1 us sleep of before), plain read alone %.1f us "
                    "(as before; best of 2 kernels x 4 grids %.1f us) (%.1f MiB)", empty, spin0, alone, alone_best, bytes / 1048576.0);
      g_summary.push_back(fb);
      const double empty1k = idle_us([&](int) {
        Blob1K b;
        std::memset(&b, 0, sizeof b);
        empty_kernel_1k<<<1, 32, 0, st>>>(b);
      });
      // the step's own scattered 8 KiB chunks (every (layer, K/V) of each row), read plainly: row
      // major (warp w: row w / 56, as the checksum kernel's order) and layer major
      const uint32_t per_row = layers * 2, n_chunks = n_rows * per_row;
      const uint32_t chunk16 = (uint32_t)(T * H * row_b / 16);
      std::vector<uint64_t> ca[2];
      for (int order = 0; order < 2; ++order)
        for (const auto& set : sets)
          for (uint32_t w = 0; w < n_chunks; ++w) {
            const uint32_t ri = order == 0 ? w / per_row : w % n_rows, x = order == 0 ? w % per_row : w / n_rows;
            const kvc_entry& e = Tb.entries[x];
            ca[order].push_back(Tb.addr[e.region] + e.offset + (uint64_t)set[ri].block_id * (uint64_t)e.block_stride);
          }
      uint64_t* d_ca = nullptr;
      CK(cudaMalloc(&d_ca, 2 * ca[0].size() * 8));
      CK(cudaMemcpy(d_ca, ca[0].data(), ca[0].size() * 8, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(d_ca + ca[0].size(), ca[1].data(), ca[1].size() * 8, cudaMemcpyHostToDevice));
      std::printf("  floors from an idle GPU: empty launch with a 1 KiB parameter block %.1f us\n", empty1k);
      for (int order = 0; order < 2; ++order)
        for (int u : {4, 16}) {
          auto enq = [&](int i) {
            const uint64_t* a = d_ca + (size_t)order * ca[0].size() + (size_t)(i % sets.size()) * n_chunks;
            if (u == 4) scatter_sum<4><<<(n_chunks + 7) / 8, 256, 0, st>>>(a, n_chunks, chunk16, d_out);
            else scatter_sum<16><<<(n_chunks + 7) / 8, 256, 0, st>>>(a, n_chunks, chunk16, d_out);
          };
          int k = 0;
          const double pipe = time_pipelined(st, [&] { enq(k++); });
          const double idle = idle_us(enq);
          std::printf("  plain read of the step's own %u chunks of %u B (%s, warp per chunk, %d loads in flight): pipelined %.1f us, "
                      "alone from an idle GPU %.1f us\n", n_chunks, chunk16 * 16, order == 0 ? "row major" : "layer major", u, pipe, idle);
          char sb[200];
          std::snprintf(sb, sizeof sb, "step28 floor, the step's own scattered chunks read plainly (%s, %d loads): pipelined %.1f us, alone from idle %.1f us",
                        order == 0 ? "row major" : "layer major", u, pipe, idle);
          g_summary.push_back(sb);
        }
      CK(cudaFree(d_ca));
      cudaEventDestroy(f0);
      cudaEventDestroy(f1);
    }
    CK(cudaFree(big));
    // work-item size sweep (issue 16 part 4): smaller items put more loads in flight at once for a
    // small step; 0 = the default (32 KiB). Each line: the default kernel variant, the default submit.
    // (2 and 1 KiB items, 22.9 and 32.4 us isolated on the H200, are no longer swept: README.)
    // V35 (the default), V32 (the general kernel, hinted) and V2 (unhinted loads, as before
    // 2026-12-02 session 5) A/B, twice each
    for (uint32_t chunk : {0u, 4096u})
    for (int variant : {35, 32, 2, 8, 1, 35, 32, 2}) {
    if (quick && variant != 35) continue;
    if (chunk != 0 && (variant != 35 || H != 2u)) continue;
    if (H != 2u && variant == 1) continue;
    std::printf("  kernel variant V%d%s, work items of %u bytes\n", variant, variant == 35 ? " (default)" : "", chunk ? chunk : 32768u);
    kvc_cuda_ctx* ctx = nullptr;
    kvc_cuda_options copt{};
    copt.chunk_bytes = chunk;
    if (kvc_cuda_create(0, &copt, &ctx) != KVC_OK) std::exit(1);
    kvc_cuda_debug_set_variant(ctx, variant);
    kvc_tables t = Tb.t();
    if (kvc_cuda_set_tables(ctx, &t, Tb.addr.data(), Tb.bytes.data(), (uint32_t)Tb.addr.size()) != KVC_OK) {
      std::fprintf(stderr, "set_tables: %s\n", kvc_cuda_last_error(ctx));
      std::exit(1);
    }
    verify(ctx, Tb, rows, n_rows, st, "step28");
    const double pipelined = checksum_us(ctx, sets, n_rows, st);
    line("pipelined (device time per step)", bytes, pipelined, plain);
    line("kernel alone (same rows again)", bytes, kernel_only_us(ctx, st), plain);
    // isolated steps: GPU idle before each; device time from an event recorded before submit()
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<uint64_t> out(n_rows);
    std::vector<double> phase[5];  // host time by phase of submit() (kvc_cuda_debug_submit_times), when on
    bool timing_on = false;
    auto isolated = [&](double* d, double* hs, double* w) {
      std::vector<double> dev, host_submit, wall;
      for (auto& ph : phase) ph.clear();
      for (int i = 0; i < g_iters * 4; ++i) {
        CK(cudaStreamSynchronize(st));
        auto t0 = std::chrono::steady_clock::now();
        CK(cudaEventRecord(e0, st));
        uint64_t tk = 0;
        const std::vector<kvc_row>& rs = sets[i % sets.size()];
        if (kvc_cuda_submit(ctx, rs.data(), rs.size(), n_rows, st, &tk) != KVC_OK) std::exit(1);
        auto t1 = std::chrono::steady_clock::now();
        CK(cudaEventRecord(e1, st));
        std::fill(out.begin(), out.end(), 0);
        if (kvc_cuda_collect(ctx, tk, out.data(), n_rows) != KVC_OK) std::exit(1);
        auto t2 = std::chrono::steady_clock::now();
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (i < 5) continue;  // warm
        dev.push_back(ms * 1000.0);
        double ph[5];
        if (timing_on && kvc_cuda_debug_submit_times(ctx, 1, ph) == KVC_OK)
          for (int k = 0; k < 5; ++k) phase[k].push_back(ph[k]);
        host_submit.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
        wall.push_back(std::chrono::duration<double, std::micro>(t2 - t0).count());
      }
      *d = median(dev), *hs = median(host_submit), *w = median(wall);
    };
    static int enq_done = 0;
    if (variant == 35 && H == 2u && chunk == 0 && !enq_done++) {  // the enqueueing options, isolated step (the default last)
      struct Opt { uint32_t lim, tier; int ck; const char* what; };
      for (Opt o : {Opt{0, 0, 0, "rows copied, results by copy + memset"},
                    Opt{128, 128, 0, "rows inline (1.9 KiB parameters), results by copy + memset"},
                    Opt{128, 0, 0, "rows inline (1 KiB parameters), results by copy + memset"},
                    Opt{128, 128, 1, "rows inline (1.9 KiB parameters), results by the copy-out kernel"}}) {
        kvc_cuda_debug_set_submit(ctx, o.lim, o.tier, o.ck);
        double d, hs, w;
        isolated(&d, &hs, &w);
        std::printf("  isolated step, %s: device %.1f us, submit() %.1f us, results after %.1f us\n", o.what, d, hs, w);
      }
      kvc_cuda_debug_set_submit(ctx, 128, 0, 1);
    }
    if (H == 2u && chunk == 0) {
      // issue 16 part 4: where submit()'s host time goes (timed by phase: a few clock reads more),
      // and the launch through the driver's cuLaunchKernel against cudaLaunchKernel, interleaved
      double d, hs, w;
      kvc_cuda_debug_submit_times(ctx, 1, nullptr);
      timing_on = true;
      isolated(&d, &hs, &w);
      timing_on = false;
      kvc_cuda_debug_submit_times(ctx, 0, nullptr);
      std::printf("  isolated step, submit() timed by phase: device %.1f us, submit() %.1f us: row checks %.2f, guard + drain + grow %.2f, "
                  "parameter fill %.2f, launch call %.2f, events + copy-out enqueue %.2f us (medians)\n",
                  d, hs, median(phase[0]), median(phase[1]), median(phase[2]), median(phase[3]), median(phase[4]));
      char pb[240];
      std::snprintf(pb, sizeof pb, "step28 V%d submit() by phase (us): checks %.2f, guard+drain+grow %.2f, fill %.2f, launch call %.2f, after %.2f",
                    variant, median(phase[0]), median(phase[1]), median(phase[2]), median(phase[3]), median(phase[4]));
      g_summary.push_back(pb);
      for (int round = 0; round < 2; ++round)
        for (int drv : {0, 1}) {
          if (kvc_cuda_debug_set_launch(ctx, drv) != KVC_OK) {
            std::printf("  driver launch: %s\n", kvc_cuda_last_error(ctx));
            continue;
          }
          isolated(&d, &hs, &w);
          std::printf("  isolated step, launch by %s (round %d): device %.1f us, submit() %.1f us, results after %.1f us\n",
                      drv ? "cuLaunchKernel (driver)" : "cudaLaunchKernel", round + 1, d, hs, w);
          char lb[200];
          std::snprintf(lb, sizeof lb, "step28 V%d isolated, launch by %s (round %d): %.1f us, submit() %.1f us", variant,
                        drv ? "cuLaunchKernel" : "cudaLaunchKernel", round + 1, d, hs);
          g_summary.push_back(lb);
        }
      kvc_cuda_debug_set_launch(ctx, 1);  // back to the default
    }
    double d, hs, w;
    isolated(&d, &hs, &w);
    // queued step: the stream is busy (a 200 us kernel) when submit() is called, as in an engine
    // step: the device time from an event before submit() to one after it, launch latency hidden
    std::vector<double> queued;
    for (int i = 0; i < g_iters; ++i) {
      CK(cudaStreamSynchronize(st));
      spin_kernel<<<1, 32, 0, st>>>(200000);
      CK(cudaEventRecord(e0, st));
      uint64_t tk = 0;
      const std::vector<kvc_row>& rs = sets[i % sets.size()];
      if (kvc_cuda_submit(ctx, rs.data(), rs.size(), n_rows, st, &tk) != KVC_OK) std::exit(1);
      CK(cudaEventRecord(e1, st));
      std::fill(out.begin(), out.end(), 0);
      if (kvc_cuda_collect(ctx, tk, out.data(), n_rows) != KVC_OK) std::exit(1);
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      queued.push_back(ms * 1000.0);
    }
    const double qd = median(queued);
    std::printf("  queued step (submitted while the stream is busy): device %.1f us\n", qd);
    std::printf("  isolated step: device %.1f us (event before submit -> event after the kernel, GPU idle before: includes the host's\n"
                "                 row copy and launch), host submit() %.1f us, submit -> results in host memory %.1f us\n",
                d, hs, w);
    char buf[240];
    std::snprintf(buf, sizeof buf,
                  "step28 H=%u (%.1f MiB) V%d items %u B: queued step %.1f us, isolated step %.1f us device incl. launch (target <= 15), "
                  "submit() %.1f us host, results after %.1f us; pipelined %.1f us = %.3f of the plain read",
                  H, bytes / 1048576.0, variant, chunk ? chunk : 32768u, qd, d, hs, w, pipelined, plain / pipelined);
    g_summary.push_back(buf);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    kvc_cuda_destroy(ctx);
    }
    for (void* p : bufs) CK(cudaFree(p));
  }
}

void bench_mamba(cudaStream_t st, unsigned long long* d_out, bool quick) {
  std::printf("\n[mamba] 256 rows of 1 MiB states (256 MiB)\n");
  const uint32_t nb = 256;
  const uint64_t row_bytes = 1u << 20, bytes = (uint64_t)nb * row_bytes;
  void* buf = nullptr;
  CK(cudaMalloc(&buf, bytes));
  fill_kernel<<<g_sms * 8, 256, 0, st>>>((uint4*)buf, bytes / 16, 7);
  CK(cudaStreamSynchronize(st));
  const double plain = plain_read_us(st, buf, bytes, d_out);
  struct V { const char* name; uint32_t eb; uint32_t c1, c2; bool stream; };
  double worst = 1e30;
  for (V v : {V{"ROWS fp32 ssm [32 rows, 64, 128]", 4, 64, 128, false}, V{"ROWS bf16 ssm [32 rows, 64, 256]", 2, 64, 256, false},
              V{"STREAM 1 MiB", 0, 0, 0, true}}) {
    if (quick && v.eb == 2) continue;
    Tables Tb;
    Tb.addr = {(uint64_t)buf};
    Tb.bytes = {bytes};
    kvc_entry e;
    std::memset(&e, 0, sizeof e);
    e.block_stride = (int64_t)row_bytes;
    e.num_blocks = nb;
    e.factor_base = 12u * 65536u + 64;
    if (v.stream) {
      e.kind = KVC_ENTRY_STREAM;
      e.outer_count = 1;
      e.byte_count = (uint32_t)row_bytes;
      e.elem_count[0] = e.elem_count[1] = e.elem_count[2] = 1;
    } else {
      e.kind = KVC_ENTRY_ROWS;
      e.outer_count = 32;
      e.outer_stride = (int64_t)(row_bytes / 32);
      e.elem_count[0] = 1;
      e.elem_count[1] = v.c1;
      e.elem_count[2] = v.c2;
      e.elem_stride[1] = (int64_t)v.c2 * v.eb;
      e.elem_stride[2] = v.eb;
      e.elem_bytes = v.eb;
    }
    Tb.entries.push_back(e);
    Tb.group_start.push_back(1);
    std::vector<kvc_row> rows;
    for (uint32_t i = 0; i < nb; ++i) rows.push_back(kvc_row{0, (i * 37u) % nb, 0, 0, i, 0});
    double best = 1e30;
    for (uint32_t chunk : {8192u, 32768u}) {
      if (quick && chunk != 8192u) continue;
      kvc_cuda_options o{};
      o.max_rows = nb;
      o.chunk_bytes = chunk;
      kvc_cuda_ctx* ctx = nullptr;
      if (kvc_cuda_create(0, &o, &ctx) != KVC_OK) std::exit(1);
      kvc_tables t = Tb.t();
      if (kvc_cuda_set_tables(ctx, &t, Tb.addr.data(), Tb.bytes.data(), 1) != KVC_OK) {
        std::fprintf(stderr, "set_tables: %s\n", kvc_cuda_last_error(ctx));
        std::exit(1);
      }
      const std::string name = std::string(v.name) + " chunk " + std::to_string(chunk / 1024) + " KiB";
      verify(ctx, Tb, rows, nb, st, name.c_str());
      const double us = checksum_us(ctx, {rows}, nb, st);
      line((name + ": step").c_str(), bytes, us, plain);
      line((name + ": kernel only").c_str(), bytes, kernel_only_us(ctx, st), plain);
      best = std::min(best, us);
      kvc_cuda_destroy(ctx);
    }
    worst = std::min(worst, plain / best);
  }
  char b[160];
  std::snprintf(b, sizeof b, "mamba 256 x 1 MiB: worst variant %.3f of the plain read %.1f us (target >= 0.8)", worst, plain);
  g_summary.push_back(b);
  CK(cudaFree(buf));
}


// ---------------------------------------------------------------------------------------------
// --ab: the kernel variants side by side, interleaved, two rounds (issue 16 part 4, session 6)

/** The step28 tables (64 blocks x 28 layers, H KV heads, NHD) and 32 disjoint row sets. */
struct Step28 {
  Tables Tb;
  std::vector<void*> bufs;
  std::vector<std::vector<kvc_row>> sets;
  uint64_t bytes = 0;
};

Step28 make_step28(cudaStream_t st, uint32_t H) {
  const uint32_t layers = 28, nb = 2048, T = 16, D = 128, row_b = D * 2, n_rows = 64;
  Step28 S;
  const uint64_t half = (uint64_t)nb * T * H * row_b, per_layer = 2 * half;
  for (uint32_t l = 0; l < layers; ++l) {
    void* p = nullptr;
    CK(cudaMalloc(&p, per_layer));
    fill_kernel<<<g_sms * 4, 256, 0, st>>>((uint4*)p, per_layer / 16, 1000 + l);
    S.bufs.push_back(p);
    S.Tb.addr.push_back((uint64_t)p);
    S.Tb.bytes.push_back(per_layer);
    const int64_t bstride = (int64_t)T * H * row_b;
    S.Tb.entries.push_back(attn_entry(0, (uint64_t)l * 65536u, bstride, row_b, (int64_t)H * row_b, H, T, 0, row_b, 2 * row_b, nb, l, 0));
    S.Tb.entries.push_back(attn_entry(half, (uint64_t)l * 65536u, bstride, row_b, (int64_t)H * row_b, H, T, row_b, row_b, 2 * row_b, nb, l, 0));
  }
  S.Tb.group_start.push_back((uint32_t)S.Tb.entries.size());
  CK(cudaStreamSynchronize(st));
  S.sets.resize(nb / n_rows);
  for (uint32_t k = 0; k < S.sets.size(); ++k)
    for (uint32_t i = 0; i < n_rows; ++i) S.sets[k].push_back(kvc_row{0, ((k * n_rows + i) * 797u) % nb, i * T, T, i, 0});
  S.bytes = (uint64_t)n_rows * layers * 2 * T * H * row_b;
  return S;
}

/** A context of kernel variant v % 1000; v >= 1000: with its own side and upload streams (as before session 6). */
kvc_cuda_ctx* ab_ctx(int v, const Tables& Tb, uint32_t max_rows) {
  kvc_cuda_options o{};
  o.max_rows = max_rows;
  kvc_cuda_ctx* ctx = nullptr;
  const int variant = v % 1000;
  kvc_cuda_debug_private_streams(v >= 1000);
  const int rc = kvc_cuda_create(0, &o, &ctx);
  kvc_cuda_debug_private_streams(0);
  if (rc != KVC_OK || kvc_cuda_debug_set_variant(ctx, variant) != KVC_OK) {
    std::fprintf(stderr, "create / variant %d failed\n", variant);
    std::exit(1);
  }
  kvc_tables t = Tb.t();
  if (kvc_cuda_set_tables(ctx, &t, Tb.addr.data(), Tb.bytes.data(), (uint32_t)Tb.addr.size()) != KVC_OK) {
    std::fprintf(stderr, "set_tables: %s\n", kvc_cuda_last_error(ctx));
    std::exit(1);
  }
  return ctx;
}

/** Isolated step from an idle GPU (as bench_step28): medians of device e0 -> e1 and host submit(). */
void ab_isolated(kvc_cuda_ctx* ctx, const Step28& S, cudaStream_t st, double* dev_us, double* host_us) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const size_t n_rows = S.sets[0].size();
  std::vector<uint64_t> out(n_rows);
  std::vector<double> dev, hs;
  for (int i = 0; i < g_iters * 4; ++i) {
    CK(cudaStreamSynchronize(st));
    auto t0 = std::chrono::steady_clock::now();
    CK(cudaEventRecord(e0, st));
    uint64_t tk = 0;
    const std::vector<kvc_row>& rs = S.sets[i % S.sets.size()];
    if (kvc_cuda_submit(ctx, rs.data(), rs.size(), n_rows, st, &tk) != KVC_OK) std::exit(1);
    auto t1 = std::chrono::steady_clock::now();
    CK(cudaEventRecord(e1, st));
    if (kvc_cuda_collect(ctx, tk, out.data(), n_rows) != KVC_OK) std::exit(1);
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    if (i < 5) continue;
    dev.push_back(ms * 1000.0);
    hs.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  *dev_us = median(dev);
  *host_us = median(hs);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

double ab_queued(kvc_cuda_ctx* ctx, const Step28& S, cudaStream_t st) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const size_t n_rows = S.sets[0].size();
  std::vector<uint64_t> out(n_rows);
  std::vector<double> q;
  for (int i = 0; i < g_iters; ++i) {
    CK(cudaStreamSynchronize(st));
    spin_kernel<<<1, 32, 0, st>>>(200000);
    CK(cudaEventRecord(e0, st));
    uint64_t tk = 0;
    const std::vector<kvc_row>& rs = S.sets[i % S.sets.size()];
    if (kvc_cuda_submit(ctx, rs.data(), rs.size(), n_rows, st, &tk) != KVC_OK) std::exit(1);
    CK(cudaEventRecord(e1, st));
    if (kvc_cuda_collect(ctx, tk, out.data(), n_rows) != KVC_OK) std::exit(1);
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    q.push_back(ms * 1000.0);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return median(q);
}

void bench_ab(cudaStream_t st, unsigned long long* d_out, const std::vector<int>& variants) {
  std::printf("\n[ab] kernel variants interleaved, two rounds; every context checked bit-exact against the CPU kernel first\n");
  // attn128, NHD and HND
  {
    const uint32_t nb = 2048, H = 8, T = 16, D = 128, row_b = D * 2;
    const uint64_t half = (uint64_t)nb * T * H * row_b, bytes = 2 * half;
    void* kv = nullptr;
    CK(cudaMalloc(&kv, bytes));
    fill_kernel<<<g_sms * 8, 256, 0, st>>>((uint4*)kv, bytes / 16, 42);
    CK(cudaStreamSynchronize(st));
    for (int hnd = 0; hnd < 2; ++hnd) {
      Tables Tb;
      Tb.addr = {(uint64_t)kv};
      Tb.bytes = {bytes};
      const int64_t bstride = (int64_t)T * H * row_b;
      const int64_t hs = hnd ? (int64_t)T * row_b : row_b, ts = hnd ? row_b : (int64_t)H * row_b;
      Tb.entries.push_back(attn_entry(0, 5u * 65536u, bstride, hs, ts, H, T, 0, row_b, 2 * row_b, nb, 0, 0));
      Tb.entries.push_back(attn_entry(half, 5u * 65536u, bstride, hs, ts, H, T, row_b, row_b, 2 * row_b, nb, 0, 0));
      Tb.group_start.push_back(2);
      std::vector<kvc_row> rows;
      for (uint32_t i = 0; i < nb; ++i) rows.push_back(kvc_row{0, i, i * T, T, i, 0});
      int pk = 0, pg = 0;
      const double plain0 = plain_read_us(st, kv, bytes, d_out, 1, &pk, &pg);
      std::printf("  attn128 %s: plain read %.1f us (%d loads, %d blocks)\n", hnd ? "HND" : "NHD", plain0, pk, pg);
      for (int round = 1; round <= 2; ++round)
        for (int v : variants) {
          kvc_cuda_ctx* ctx = ab_ctx(v, Tb, nb);
          char name[64];
          std::snprintf(name, sizeof name, "ab attn128 %s V%d r%d", hnd ? "HND" : "NHD", v, round);
          verify(ctx, Tb, rows, nb, st, name);
          const double s1 = checksum_us(ctx, {rows}, nb, st);
          const double k1 = kernel_only_us(ctx, st);
          const double s2 = checksum_us(ctx, {rows}, nb, st);
          const double k2 = kernel_only_us(ctx, st);
          std::printf("  %s: step %.1f / %.1f us, kernel alone %.1f / %.1f us; plain %.1f: step %.3f, kernel %.3f (spec launches %llu)\n", name,
                      s1, s2, k1, k2, plain0, plain0 / std::min(s1, s2), plain0 / std::min(k1, k2), kvc_cuda_debug_spec_launches(ctx));
          kvc_cuda_destroy(ctx);
        }
      const double plain1 = plain_read_us(st, kv, bytes, d_out, 1, &pk, &pg);
      std::printf("  attn128 %s: plain read again %.1f us (%d loads, %d blocks)\n", hnd ? "HND" : "NHD", plain1, pk, pg);
    }
    CK(cudaFree(kv));
  }
  // step28, 2 and 8 KV heads
  for (uint32_t H : {2u, 8u}) {
    Step28 S = make_step28(st, H);
    const uint32_t n_rows = (uint32_t)S.sets[0].size();
    void* big = nullptr;
    CK(cudaMalloc(&big, 8 * S.bytes));
    fill_kernel<<<g_sms * 4, 256, 0, st>>>((uint4*)big, 8 * S.bytes / 16, 99);
    int pk = 0, pg = 0;
    const double plain = plain_read_us(st, big, S.bytes, d_out, 8, &pk, &pg);
    CK(cudaFree(big));
    std::printf("  step28 H=%u (%.1f MiB): plain read %.1f us (%d loads, %d blocks)\n", H, S.bytes / 1048576.0, plain, pk, pg);
    if (H == 2u) {
      // the floor: the step's own chunks read plainly, launched alone from an idle GPU, with 24 bytes of
      // parameters and with a 1 KiB parameter block (the step's size), interleaved, two rounds
      const uint32_t layers = 28, per_row = layers * 2, n_chunks = n_rows * per_row, chunk16 = 8192 / 16;
      std::vector<uint64_t> ca;
      for (const auto& set : S.sets)
        for (uint32_t w = 0; w < n_chunks; ++w) {
          const kvc_entry& e = S.Tb.entries[w % per_row];
          ca.push_back(S.Tb.addr[e.region] + e.offset + (uint64_t)set[w / per_row].block_id * (uint64_t)e.block_stride);
        }
      uint64_t* d_ca = nullptr;
      CK(cudaMalloc(&d_ca, ca.size() * 8));
      CK(cudaMemcpy(d_ca, ca.data(), ca.size() * 8, cudaMemcpyHostToDevice));
      cudaEvent_t f0, f1;
      CK(cudaEventCreate(&f0));
      CK(cudaEventCreate(&f1));
      auto idle_us = [&](auto&& enqueue) { return idle_median_us(st, f0, f1, enqueue); };
      for (int round = 1; round <= 2; ++round) {
        const double small = idle_us([&](int i) {
          scatter_sum<4><<<(n_chunks + 7) / 8, 256, 0, st>>>(d_ca + (size_t)(i % S.sets.size()) * n_chunks, n_chunks, chunk16, d_out);
        });
        const double k1 = idle_us([&](int i) {
          ScatterArgs1K a;
          std::memset(&a, 0, sizeof a);
          a.chunk_addr = d_ca + (size_t)(i % S.sets.size()) * n_chunks;
          a.out = d_out;
          a.n_chunks = n_chunks;
          a.chunk16 = chunk16;
          scatter_sum_1k<<<(n_chunks + 7) / 8, 256, 0, st>>>(a);
        });
        std::printf("  ab step28 floor r%d: the step's own chunks read plainly, alone from idle: 24-byte parameters %.1f us, 1 KiB parameters %.1f us\n",
                    round, small, k1);
      }
      cudaEventDestroy(f0);
      cudaEventDestroy(f1);
      CK(cudaFree(d_ca));
    }
    for (int round = 1; round <= 2; ++round)
      for (int v : variants) {
        kvc_cuda_ctx* ctx = ab_ctx(v, S.Tb, 4096);
        char name[64];
        std::snprintf(name, sizeof name, "ab step28 H=%u V%d r%d", H, v, round);
        if (H == 2u || round == 1) verify(ctx, S.Tb, S.sets[0], n_rows, st, name);
        const double pipe = checksum_us(ctx, S.sets, n_rows, st);
        const double kern = kernel_only_us(ctx, st);
        double iso = 0, hs = 0;
        ab_isolated(ctx, S, st, &iso, &hs);
        const double q = ab_queued(ctx, S, st);
        double iso2 = 0, hs2 = 0;
        ab_isolated(ctx, S, st, &iso2, &hs2);
        std::printf("  %s: pipelined %.1f us (%.3f of the plain read), kernel alone %.1f us, queued %.1f us, isolated %.1f / %.1f us "
                    "(submit() %.1f / %.1f us) (spec launches %llu)\n",
                    name, pipe, plain / pipe, kern, q, iso, iso2, hs, hs2, kvc_cuda_debug_spec_launches(ctx));
        kvc_cuda_destroy(ctx);
      }
    for (void* p : S.bufs) CK(cudaFree(p));
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  // --ab [V ...]: only the variant A/B (default variants 32 2 33 34 35 36)
  const bool ab = argc > 1 && std::strcmp(argv[1], "--ab") == 0;
  std::vector<int> ab_variants;
  for (int i = 2; ab && i < argc; ++i) ab_variants.push_back(std::atoi(argv[i]));
  if (ab && ab_variants.empty()) ab_variants = {35, 32, 1035, 1032, 2, 33, 37};
  int n = 0;
  if (kvc_cuda_device_count(&n) != KVC_OK) {
    std::printf("no GPU: %s\n", kvc_cuda_probe_error());
    return 2;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  g_sms = prop.multiProcessorCount;
  int rv = 0, dv = 0;
  kvc_cuda_versions(&rv, &dv);
  std::printf("device: %s, %d SMs, L2 %d MiB, cc %d.%d; runtime %d driver %d; median of %d timed runs per figure\n", prop.name,
              g_sms, prop.l2CacheSize >> 20, prop.major, prop.minor, rv, dv, g_iters);
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  unsigned long long* d_out = nullptr;
  CK(cudaMalloc(&d_out, 8));
  if (ab) {
    bench_ab(st, d_out, ab_variants);
    std::printf("\nab: %s\n", g_all_exact ? "all exact" : "MISMATCH");
    return g_all_exact ? 0 : 1;
  }
  g_summary.push_back("kernel variant by default: V35 (V32 in a kernel with only the ATTN V16 paths where the tables allow it); "
                      "the library's side and upload streams shared by its contexts");
  bench_attn128(st, d_out, quick);
  bench_step28(st, d_out, quick);
  bench_mamba(st, d_out, quick);
  std::printf("\nsummary (every figure checked bit-exact against the CPU kernel first: %s)\n", g_all_exact ? "all exact" : "MISMATCH");
  for (auto& s : g_summary) std::printf("  %s\n", s.c_str());
  CK(cudaFree(d_out));
  CK(cudaStreamDestroy(st));
  return g_all_exact ? 0 : 1;
}
