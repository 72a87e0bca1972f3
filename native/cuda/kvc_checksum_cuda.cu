/**
 * @file kvc_checksum_cuda.cu
 * @brief The CUDA checksum kernel (include/kvc_checksum_cuda.h): SPEC v1 sums of a step's rows over
 *        the same tables as the CPU kernel (include/kvc_checksum.h), in one launch, bit-exact.
 *
 * Work decomposition (per-lane code in kvc_cuda_kernel.cuh). Every entry is viewed as "lines" of
 * contiguous bytes (ATTN: the part's bytes of one head and token; ROWS: the innermost contiguous
 * element run of one state row, after merging element dims whose strides chain; STREAM: the
 * state's bytes), read in "units": 16-byte loads (path V16), 8-byte loads (V8), or single
 * pieces/elements read byte by byte (GEN: unaligned part edges, strided elements). At set_tables
 * each entry is cut into work items of about chunk_bytes (ATTN: chunks of (head, unit) pairs x
 * chunks of tokens up to block_tokens; ROWS: segments of lines; STREAM: segments), and each group
 * gets its list of (entry, item). The kernel's warps are independent: warp w sums item w % W of
 * row w / W (W = the most items any row's group has; warps past their group's items exit, as do
 * items past a row's valid tokens). A lane keeps the slice factor m and the piece index fixed and
 * accumulates plain sums (A = sum s, B = sum t*s, C = sum x1), multiplying once at the end (the
 * CPU kernel's polynomial regrouped; see kvc_cuda_kernel.cuh); the warp reduces its lanes with
 * shuffles and lane 0 adds the item's uint64 sum with one 64-bit atomicAdd into
 * out[row.out_offset + entry.column]. Addition mod 2^64 is exact and commutative, so the result does
 * not depend on the order, and every byte is read once. Unit numbers are decomposed with
 * multiply-high divisions by divisors fixed per entry.
 *
 * Kernel variants (kvc_cuda_internal.h, for the benchmark; the default is 35 = 2 with hinted loads,
 * and a kernel with only the ATTN V16 paths where the tables allow it): on the ATTN vector
 * paths, for layouts whose heads are closer in memory than tokens (NHD), lanes take their pairs
 * inner so each token's heads are read as contiguous runs (V2: 2 pairs x 2 tokens in flight per
 * lane, 64 registers; V1: 4 pairs, 80 registers); otherwise (HND) tokens inner (V4/V8: 4 or 8
 * tokens in flight per lane; V2 uses 4).
 *
 * Step pipeline (kvc_cuda_submit): the rows reach the kernel either inside its launch parameters
 * (up to kInlineMax = 128 rows, compact: no separate copy at all) or through one pinned host-to-device copy on an
 * upload stream (it overlaps the caller's earlier work; the caller's stream waits for it on the
 * GPU); then, on the caller's stream, the one kernel launch and an event. A side stream (non-blocking)
 * waits on that event (on the GPU) and runs one small kernel that copies the slot's output into its
 * mapped pinned host buffer and zeroes the device output for its next use (results reach the host
 * about 7 us sooner than with a device-to-host copy plus a memset), then records the slot's done
 * event. Slots form a ring;
 * the host waits in submit only when the slot it reuses still has its copy in flight.
 */
#include "kvc_checksum_cuda.h"
#include "kvc_cuda_internal.h"
#include "kvc_cuda_kernel.cuh"

#include <cuda.h>  // the cuLaunchKernel signature only (reached through cudaGetDriverEntryPointByVersion)
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

using namespace kvc_cuda_detail;

namespace {

/**
 * Rows a submit passes inside the kernel's parameters, in a compact form (15 bytes a row, as
 * arrays: block id, first token, output offset, valid tokens as 16 bits, group as 8 bits), when
 * there are at most 128 and every row's group is < 256 and valid_tokens < 65536; more rows, or rows
 * outside that, go through a copy. The parameter block comes in two sizes (kernel instantiations):
 * 64 rows (1 KiB) and 128 rows (1.9 KiB). Measured on an H200 (bench/cuda/README.md): the launch
 * of a step from an idle GPU costs about 1 us less with 1 KiB of parameters than with 3 KiB, and
 * 6 us more with 30 KiB (CUDA 12.1+ allows 32764 bytes); a kernel reading 2048 inline rows from
 * its parameters ran 2.4 us slower than one reading them from device memory (constant-cache
 * misses), so large steps keep the copy.
 */
constexpr uint32_t kInlineTiers[2] = {64, 128};
constexpr uint32_t kInlineMax = 128;

/** The kernel's parameters, less the rows. */
struct LaunchHeader {
  const DevEntry* entries;
  const DevGroup* groups;
  const uint2* items;
  const kvc_row* rows;  // device rows (the copied path, CAP == 1)
  unsigned long long* out;
  FastDiv per_row;      // work items per row (the most any row's group has)
  uint32_t n_rows;
  uint32_t n_work;      // n_rows * per_row.d
};

/** The kernel's parameters: CAP inline rows (compact), or CAP == 1: rows in device memory. */
template <int CAP>
struct LaunchParams {
  LaunchHeader h;
  uint32_t block_id[CAP];
  uint32_t first_token[CAP];
  uint32_t out_offset[CAP];
  uint16_t valid_tokens[CAP];
  uint8_t group[CAP];
};
static_assert(sizeof(LaunchParams<kInlineMax>) <= 4096, "kernel parameters over 4 KiB");

__device__ __forceinline__ uint64_t warp_sum(uint64_t v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/**
 * One launch per step. Warp w of the grid sums work item w % per_row of row w / per_row (warps
 * past their row's group's items exit); warps are independent (no block-wide barrier).
 */
template <int AU, int MIN_BLOCKS, int CAP, int LH = 0, int SPEC = 0>
__global__ void __launch_bounds__(kThreads, MIN_BLOCKS) kvc_sum_kernel(const __grid_constant__ LaunchParams<CAP> p) {
  const uint32_t lane = threadIdx.x & (kLanes - 1);
  for (uint32_t w = blockIdx.x * kWarps + (threadIdx.x >> 5); w < p.h.n_work; w += gridDim.x * kWarps) {
    const uint32_t ri = fdiv(p.h.per_row, w), bx = w - ri * p.h.per_row.d;
    kvc_row r;
    if (CAP == 1) {
      r = p.h.rows[ri];
    } else {
      r.group = p.group[ri];
      r.block_id = p.block_id[ri];
      r.first_token = p.first_token[ri];
      r.valid_tokens = p.valid_tokens[ri];
      r.out_offset = p.out_offset[ri];
      r.reserved = 0;
    }
    const DevEntry* e;
    uint64_t blk;
    uint32_t chunk;
    if (!item_of(p.h.entries, p.h.groups, p.h.items, r, bx, &e, &blk, &chunk)) continue;  // uniform per warp
    uint64_t part;
    if constexpr (SPEC != 0) part = lane_partial_attn16<SPEC>(*e, blk, r, chunk, lane);
    else part = lane_partial<AU, LH>(*e, blk, r, chunk, lane);
    const uint64_t s = warp_sum(part);
    if (lane == 0 && s != 0) atomicAdd(p.h.out + r.out_offset + e->column, (unsigned long long)s);
  }
}

/**
 * After the kernel, on the side stream: copies a slot's results into its pinned host buffer
 * (mapped: the writes go over the bus) and zeroes them for the slot's next use. One launch instead
 * of a device-to-host copy and a memset.
 */
__global__ void kvc_copy_out_kernel(unsigned long long* d_out, unsigned long long* h_out, uint32_t n) {
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    h_out[i] = d_out[i];
    d_out[i] = 0;
  }
}

/**
 * The kernel variants (they differ on the ATTN vector paths only): 1 = pairs inner where it applies,
 * 4 pairs in flight per lane, up to 80 registers (3 blocks per SM); 2 = pairs inner, 2 pairs x 2
 * tokens in flight, 64 registers (4 blocks per SM); 4 / 8 = tokens inner with 4 / 8 loads in flight.
 * 32 = 2 with its 16-byte ATTN loads hinted L1::no_allocate / L2::256B (ld16h): on an H200 the
 * 128 MiB step's kernel 38.1 us against 39.0-39.2 us for 2 (same run; an L2 bulk prefetch of each
 * work item, tried with it, was 12 us slower and was removed: bench/cuda/README.md).
 * 35 (the default since 2026-12-02 session 6) = 32, but where every entry of the tables is ATTN on
 * the 16-byte path (the rule, decided at set_tables) a kernel compiled with only those paths
 * (lane_partial_attn16<3>): 64 registers without spills; on an H200 in one run, kernel alone
 * 37.1-37.4 us against V32's 37.3-38.3 us (128 MiB NHD), 38.4-38.9 against 40.0-40.1 (HND), 10.0-10.1
 * against 10.4-10.7 us (28-layer step, 2 heads) (bench/cuda/README.md). 33 = 35 with unhinted
 * tokens-inner loads, 37 = 35 with an L2 evict_first policy on the loads (A/B only).
 */
constexpr int kAttnVariantDefault = 35;

/**
 * Variants 33, 35, 37: where the tables are all ATTN V16 (all_attn_v16, decided at set_tables), a
 * kernel with only the ATTN V16 paths (lane_partial_attn16<variant - 32>); other tables take V32's
 * kernel.
 */
inline bool is_spec_variant(int variant) { return variant == 33 || variant == 35 || variant == 37; }

template <int CAP>
const void* kernel_of(int variant, bool spec) {
  if (spec && is_spec_variant(variant)) {
    switch (variant) {
      case 33: return (const void*)kvc_sum_kernel<2, 4, CAP, 1, 1>;
      case 37: return (const void*)kvc_sum_kernel<2, 4, CAP, 1, 5>;
      default: return (const void*)kvc_sum_kernel<2, 4, CAP, 1, 3>;
    }
  }
  switch (variant) {
    case 1: return (const void*)kvc_sum_kernel<1, 3, CAP>;
    case 4: return (const void*)kvc_sum_kernel<4, 4, CAP>;
    case 8: return (const void*)kvc_sum_kernel<8, 4, CAP>;
    case 2: return (const void*)kvc_sum_kernel<2, 4, CAP>;
    default: return (const void*)kvc_sum_kernel<2, 4, CAP, 1>;
  }
}

const void* kernel_fn(int variant, bool spec, int cap) {
  switch (cap) {
    case 64: return kernel_of<64>(variant, spec);
    case 128: return kernel_of<128>(variant, spec);
    default: return kernel_of<1>(variant, spec);
  }
}

/** Launches variant `variant` (spec: its specialized kernel) with the parameter block at `params` (a LaunchParams<cap>). */
cudaError_t launch(int variant, bool spec, int cap, dim3 grid, cudaStream_t st, const void* params) {
  void* args[1] = {const_cast<void*>(params)};
  return cudaLaunchKernel(kernel_fn(variant, spec, cap), grid, dim3(kThreads), args, 0, st);
}

/**
 * The driver's cuLaunchKernel and each tier's CUfunction of one variant, resolved once at create:
 * submit() launches through it (the runtime's cudaLaunchKernel looks the function up on every call;
 * on an H200 the isolated 28-layer step was 0.1-0.9 us shorter this way in 5 of 6 same-run A/B pairs,
 * bench/cuda/README.md, 2026-12-02 session 5). If it cannot be resolved, cudaLaunchKernel.
 */
struct DriverLaunch {
  PFN_cuLaunchKernel_v4000 fn = nullptr;
  CUfunction f[3] = {nullptr, nullptr, nullptr};  // cap 1, 64, 128
  int variant = -1;
  bool spec = false;
};

int tier_index(int cap) { return cap == 64 ? 1 : cap == 128 ? 2 : 0; }

cudaError_t driver_prepare(DriverLaunch& d, int variant, bool spec) {
  if (!d.fn) {
    cudaDriverEntryPointQueryResult q{};
    void* fp = nullptr;
    cudaError_t e = cudaGetDriverEntryPointByVersion("cuLaunchKernel", &fp, 4000, cudaEnableDefault, &q);
    if (e != cudaSuccess) return e;
    if (q != cudaDriverEntryPointSuccess || !fp) return cudaErrorSymbolNotFound;
    d.fn = reinterpret_cast<PFN_cuLaunchKernel_v4000>(fp);
  }
  if (d.variant != variant || d.spec != spec) {
    const int caps[3] = {1, 64, 128};
    for (int i = 0; i < 3; ++i) {
      cudaFunction_t f = nullptr;
      cudaError_t e = cudaGetFuncBySymbol(&f, kernel_fn(variant, spec, caps[i]));
      if (e != cudaSuccess) return e;
      d.f[i] = reinterpret_cast<CUfunction>(f);
    }
    d.variant = variant;
    d.spec = spec;
  }
  return cudaSuccess;
}

/**
 * The launch through the driver. A thread on which the runtime has not yet made the device's primary
 * context current (CUDA_ERROR_INVALID_CONTEXT) launches through cudaLaunchKernel, which makes it
 * current, so that thread's later launches take the driver path. In submit() the runtime calls
 * before the launch (event query and record, the rows copy) already make it current, so on CUDA 13
 * this fallback was not reached: test_cuda.cc's fresh-thread test passes without it too; it is kept
 * for runtimes that leave the context unset. Any other driver error is reported as
 * cudaErrorLaunchFailure (the driver's CUresult is not carried further).
 */
cudaError_t driver_launch(const DriverLaunch& d, int variant, bool spec, int cap, dim3 grid, cudaStream_t st, const void* params) {
  void* args[1] = {const_cast<void*>(params)};
  const CUresult r = d.fn(d.f[tier_index(cap)], grid.x, 1, 1, kThreads, 1, 1, 0, reinterpret_cast<CUstream>(st), args, nullptr);
  if (r == CUDA_SUCCESS) return cudaSuccess;
  if (r == CUDA_ERROR_INVALID_CONTEXT) return launch(variant, spec, cap, grid, st, params);
  return cudaErrorLaunchFailure;
}

/** Every kernel instantiation of a variant (and of its specialized kernel) loaded now (an empty launch each), not in a timed step. */
cudaError_t warm_variant(int variant, cudaStream_t st, unsigned long long* out) {
  LaunchParams<kInlineMax> p{};  // large enough for every tier's parameter block
  p.h.out = out;
  p.h.per_row = make_fastdiv(1);
  for (int spec = 0; spec < (is_spec_variant(variant) ? 2 : 1); ++spec)
    for (int cap : {1, 64, 128}) {
      cudaError_t e = launch(variant, spec != 0, cap, dim3(1), st, &p);
      if (e != cudaSuccess) return e;
    }
  return cudaSuccess;
}

// ---------------------------------------------------------------------------------------------
// Host side

/**
 * Synchronizing CUDA runtime calls made by this library (kvc_cuda_sync_calls()): every call that
 * may block the calling thread until device work has finished, or implicitly synchronizes the
 * device: cuda{Device,Stream,Event}Synchronize, blocking cudaMemcpy / cudaMemset, cudaMalloc,
 * cudaFree, cudaHostAlloc, cudaFreeHost. Wrapped at every call site with KVC_SYNC(); cudaEventQuery,
 * the *Async calls, event records and stream waits are not counted (they never block the host).
 */
std::atomic<unsigned long long> g_sync_calls{0};
#define KVC_SYNC(call) (g_sync_calls.fetch_add(1, std::memory_order_relaxed), (call))

struct DeviceGuard {
  int prev = -1;
  bool changed = false;
  explicit DeviceGuard(int dev) {
    if (cudaGetDevice(&prev) == cudaSuccess && prev != dev) changed = cudaSetDevice(dev) == cudaSuccess;
  }
  ~DeviceGuard() {
    if (changed) cudaSetDevice(prev);
  }
};

/**
 * The side and upload streams, one pair per device for the whole process, shared by its contexts
 * (created at the first kvc_cuda_create on the device, never destroyed: they live as long as the
 * process, like the runtime's own). Streams share a few hardware work queues
 * (CUDA_DEVICE_MAX_CONNECTIONS, 8 by default); with a pair per context, from about the 4th context of
 * a process on, the pipelined 128 MiB step took 1.5-3 us longer than the kernel alone (H200, same run:
 * 40.1-40.9 us against 37.7-38.8 us with the shared pair; with CUDA_DEVICE_MAX_CONNECTIONS=32 the own
 * pair showed no such gap: bench/cuda/README.md, 2026-12-02 session 6), the side or upload stream's
 * work queued behind the caller's. One pair per device keeps the library at two streams however
 * many contexts there are. The cost: contexts of one device share the side stream, so one context's
 * copy-out waits (on the GPU) until the steps submitted before it by other contexts are done.
 * kvc_cuda_debug_private_streams(1) gives later contexts their own pair (the previous behaviour).
 */
struct SharedStreams {
  cudaStream_t side = nullptr, upload = nullptr;
};
std::mutex g_streams_mu;
std::map<int, SharedStreams> g_streams;  // by device
std::atomic<bool> g_private_streams{false};

/** The device's shared pair (created on first use, with the device current). */
cudaError_t shared_streams(int device, cudaStream_t* side, cudaStream_t* upload) {
  std::lock_guard<std::mutex> lock(g_streams_mu);
  SharedStreams& p = g_streams[device];
  if (!p.side) {
    cudaError_t e = cudaStreamCreateWithFlags(&p.side, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
      p.side = nullptr;
      return e;
    }
  }
  if (!p.upload) {
    cudaError_t e = cudaStreamCreateWithFlags(&p.upload, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
      p.upload = nullptr;
      return e;
    }
  }
  *side = p.side;
  *upload = p.upload;
  return cudaSuccess;
}

/** One submit's buffers and events; the slots form a ring. */
struct Slot {
  kvc_row* h_rows = nullptr;         // pinned staging of the copied path
  kvc_row* d_rows = nullptr;
  size_t cap_rows = 0;
  uint64_t* h_out = nullptr;         // pinned results (mapped)
  unsigned long long* h_out_dev = nullptr;  // h_out's device address (the copy-out kernel writes it)
  unsigned long long* d_out = nullptr;  // zero whenever the slot is free
  size_t cap_out = 0;
  cudaEvent_t ev_rows = nullptr;     // after the rows' copy, on the upload stream
  cudaEvent_t ev_compute = nullptr;  // after the kernel, on the caller's stream
  cudaEvent_t ev_done = nullptr;     // after the copy back (and the re-zeroing), on the side stream
  uint64_t ticket = 0;               // 0: no live ticket
  size_t out_len = 0;
  bool gpu = false;                  // false: no GPU work was needed (results are zeros)
  bool busy = false;                 // its events may still be pending
};

}  // namespace

struct kvc_cuda_ctx {
  int device = 0;
  kvc_cuda_options opt{};
  cudaStream_t side = nullptr;    // copies the results back
  cudaStream_t upload = nullptr;  // copies rows in (the copied path), ahead of the caller's stream
  bool own_streams = false;       // side and upload are this context's (kvc_cuda_debug_private_streams), else the device's shared pair
  std::vector<Slot> slots;
  uint64_t next_ticket = 1;
  uint32_t next_slot = 0;
  // Tables (device) and their host summary.
  DevEntry* d_entries = nullptr;
  DevGroup* d_groups = nullptr;
  uint2* d_items = nullptr;
  std::vector<HostGroup> groups;
  bool have_tables = false;
  bool spec = false;  // the tables are all ATTN V16 (all_attn_v16): variants 33, 35, 37 take their specialized kernel
  unsigned long long spec_launches = 0;  // submits that launched a specialized kernel (kvc_cuda_debug_spec_launches)
  // The last launch (for kvc_cuda_debug_relaunch).
  int variant = kAttnVariantDefault;
  // How a step is enqueued (kvc_cuda_debug_set_submit): rows inline up to inline_limit, in a
  // parameter block of at least min_tier rows; results copied out by a kernel or by a copy + memset.
  uint32_t inline_limit = kInlineMax;
  uint32_t min_tier = 0;
  bool copy_out_kernel = true;
  bool use_driver_launch = false;  // resolved at create; kvc_cuda_debug_set_launch turns it off (A/B)
  DriverLaunch drv;
  bool time_submit = false;        // kvc_cuda_debug_submit_times
  double submit_us[5] = {0, 0, 0, 0, 0};
  alignas(16) unsigned char last[sizeof(LaunchParams<kInlineMax>)];  // the last launch's parameters
  int last_cap = 1;
  dim3 last_grid{0, 0, 0};
  size_t last_out_len = 0;
  unsigned long long* scratch_out = nullptr;
  size_t scratch_len = 0;
  std::string err;

  int fail(int code, const char* fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    err = buf;
    return code;
  }
  int cuda_fail(cudaError_t e, const char* what) {
    cudaGetLastError();  // clear a sticky launch error
    return fail(e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ? KVC_ENOCUDA : KVC_ECUDA, "%s: %s (%s)", what,
                cudaGetErrorString(e), cudaGetErrorName(e));
  }
};

namespace {

#define KVC_CU(call, what)                                  \
  do {                                                      \
    cudaError_t e_ = (call);                                \
    if (e_ != cudaSuccess) return ctx->cuda_fail(e_, what); \
  } while (0)

/** Waits for a slot's copy (if one may be pending) and marks it free; its ticket expires. */
int drain_slot(kvc_cuda_ctx* ctx, Slot& s) {
  if (s.busy && s.gpu) KVC_CU(KVC_SYNC(cudaEventSynchronize(s.ev_done)), "cudaEventSynchronize");
  s.busy = false;
  s.ticket = 0;
  return KVC_OK;
}

int drain_all(kvc_cuda_ctx* ctx) {
  for (auto& s : ctx->slots) {
    if (s.busy && s.gpu) KVC_CU(KVC_SYNC(cudaEventSynchronize(s.ev_done)), "cudaEventSynchronize");
  }
  return KVC_OK;
}

/** Grows a free slot's buffers (a slow path: allocation; the new device output is zeroed). */
int grow_slot(kvc_cuda_ctx* ctx, Slot& s, size_t rows, size_t outs) {
  if (rows > s.cap_rows) {
    const size_t cap = std::max(rows, s.cap_rows * 2);
    if (s.h_rows) KVC_SYNC(cudaFreeHost(s.h_rows));
    if (s.d_rows) KVC_SYNC(cudaFree(s.d_rows));
    s.h_rows = nullptr;
    s.d_rows = nullptr;
    s.cap_rows = 0;
    KVC_CU(KVC_SYNC(cudaHostAlloc((void**)&s.h_rows, cap * sizeof(kvc_row), cudaHostAllocDefault)), "cudaHostAlloc (rows)");
    KVC_CU(KVC_SYNC(cudaMalloc((void**)&s.d_rows, cap * sizeof(kvc_row))), "cudaMalloc (rows)");
    s.cap_rows = cap;
  }
  if (outs > s.cap_out) {
    const size_t cap = std::max(outs, s.cap_out * 2);
    if (s.h_out) KVC_SYNC(cudaFreeHost(s.h_out));
    if (s.d_out) KVC_SYNC(cudaFree(s.d_out));
    s.h_out = nullptr;
    s.d_out = nullptr;
    s.cap_out = 0;
    KVC_CU(KVC_SYNC(cudaHostAlloc((void**)&s.h_out, cap * 8u, cudaHostAllocMapped)), "cudaHostAlloc (output)");
    KVC_CU(cudaHostGetDevicePointer((void**)&s.h_out_dev, s.h_out, 0), "cudaHostGetDevicePointer (output)");
    KVC_CU(KVC_SYNC(cudaMalloc((void**)&s.d_out, cap * 8u)), "cudaMalloc (output)");
    KVC_CU(KVC_SYNC(cudaMemset(s.d_out, 0, cap * 8u)), "cudaMemset (output)");
    s.cap_out = cap;
  }
  return KVC_OK;
}

void free_tables(kvc_cuda_ctx* ctx) {
  if (ctx->d_entries) KVC_SYNC(cudaFree(ctx->d_entries));
  if (ctx->d_groups) KVC_SYNC(cudaFree(ctx->d_groups));
  if (ctx->d_items) KVC_SYNC(cudaFree(ctx->d_items));
  ctx->d_entries = nullptr;
  ctx->d_groups = nullptr;
  ctx->d_items = nullptr;
  ctx->groups.clear();
  ctx->have_tables = false;
  ctx->last_grid = dim3(0, 0, 0);
}

char g_probe_error[256] = "";

/** The compact inline rows of a LaunchParams<CAP> at buf (after its header). */
template <int CAP>
void fill_inline(void* buf, const kvc_row* rows, size_t n) {
  auto* p = static_cast<LaunchParams<CAP>*>(buf);
  for (size_t i = 0; i < n; ++i) {
    p->block_id[i] = rows[i].block_id;
    p->first_token[i] = rows[i].first_token;
    p->out_offset[i] = rows[i].out_offset;
    p->valid_tokens[i] = (uint16_t)rows[i].valid_tokens;
    p->group[i] = (uint8_t)rows[i].group;
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// C ABI

extern "C" {

int kvc_cuda_device_count(int* count) {
  if (count) *count = 0;
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    snprintf(g_probe_error, sizeof g_probe_error, "cudaGetDeviceCount: %s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
    cudaGetLastError();
    return KVC_ENOCUDA;
  }
  if (n <= 0) {
    snprintf(g_probe_error, sizeof g_probe_error, "no CUDA device");
    return KVC_ENOCUDA;
  }
  g_probe_error[0] = 0;
  if (count) *count = n;
  return KVC_OK;
}

const char* kvc_cuda_probe_error(void) { return g_probe_error; }

int kvc_cuda_versions(int* runtime_version, int* driver_version) {
  int rv = 0, dv = 0;
  cudaRuntimeGetVersion(&rv);
  cudaDriverGetVersion(&dv);
  if (runtime_version) *runtime_version = rv;
  if (driver_version) *driver_version = dv;
  return KVC_OK;
}

int kvc_cuda_create(int device, const kvc_cuda_options* options, kvc_cuda_ctx** out) {
  if (!out) return KVC_EINVAL;
  *out = nullptr;
  int n = 0;
  if (kvc_cuda_device_count(&n) != KVC_OK || device < 0 || device >= n) return KVC_ENOCUDA;
  kvc_cuda_options o{};
  if (options) o = *options;
  if (!o.slots) o.slots = 8;
  if (!o.max_rows) o.max_rows = 4096;
  if (!o.max_out) o.max_out = 16384;
  if (!o.chunk_bytes) o.chunk_bytes = 32768;
  if (o.slots > 64 || o.chunk_bytes < 1024 || o.chunk_bytes > (1u << 20)) return KVC_EINVAL;

  kvc_cuda_ctx* ctx = new kvc_cuda_ctx();
  ctx->device = device;
  ctx->opt = o;
  DeviceGuard guard(device);
  auto bail = [&](int rc) {
    kvc_cuda_destroy(ctx);
    return rc;
  };
  if (g_private_streams.load()) {
    ctx->own_streams = true;
    if (cudaStreamCreateWithFlags(&ctx->side, cudaStreamNonBlocking) != cudaSuccess ||
        cudaStreamCreateWithFlags(&ctx->upload, cudaStreamNonBlocking) != cudaSuccess)
      return bail(KVC_ECUDA);
  } else if (shared_streams(device, &ctx->side, &ctx->upload) != cudaSuccess) {
    ctx->side = ctx->upload = nullptr;
    return bail(KVC_ECUDA);
  }
  ctx->slots.resize(o.slots);
  for (auto& s : ctx->slots) {
    if (cudaEventCreateWithFlags(&s.ev_rows, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&s.ev_compute, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&s.ev_done, cudaEventDisableTiming) != cudaSuccess)
      return bail(KVC_ECUDA);
    if (grow_slot(ctx, s, o.max_rows, o.max_out) != KVC_OK) return bail(KVC_ECUDA);
  }
  // Warm-up: load the module and run every stage of a step once (an empty launch, the event wait,
  // the copy back and the re-zeroing), so the first real step loads and allocates nothing.
  Slot& s = ctx->slots[0];
  if (warm_variant(kAttnVariantDefault, ctx->side, s.d_out) != cudaSuccess) return bail(KVC_ECUDA);
  kvc_copy_out_kernel<<<1, 256, 0, ctx->side>>>(s.d_out, s.h_out_dev, 1);
  if (cudaGetLastError() != cudaSuccess) return bail(KVC_ECUDA);
  if (cudaMemcpyAsync(s.d_rows, s.h_rows, sizeof(kvc_row), cudaMemcpyHostToDevice, ctx->upload) != cudaSuccess ||
      cudaEventRecord(s.ev_rows, ctx->upload) != cudaSuccess || cudaStreamWaitEvent(ctx->side, s.ev_rows, 0) != cudaSuccess ||
      cudaEventRecord(s.ev_compute, ctx->side) != cudaSuccess ||
      cudaStreamWaitEvent(ctx->side, s.ev_compute, 0) != cudaSuccess ||
      cudaMemcpyAsync(s.h_out, s.d_out, 8, cudaMemcpyDeviceToHost, ctx->side) != cudaSuccess ||
      cudaMemsetAsync(s.d_out, 0, 8, ctx->side) != cudaSuccess || cudaEventRecord(s.ev_done, ctx->side) != cudaSuccess ||
      KVC_SYNC(cudaEventSynchronize(s.ev_done)) != cudaSuccess)
    return bail(KVC_ECUDA);
  ctx->use_driver_launch = driver_prepare(ctx->drv, ctx->variant, ctx->spec) == cudaSuccess;
  cudaGetLastError();  // a failed resolution leaves cudaLaunchKernel in use, not an error
  *out = ctx;
  return KVC_OK;
}

void kvc_cuda_destroy(kvc_cuda_ctx* ctx) {
  if (!ctx) return;
  DeviceGuard guard(ctx->device);
  for (auto& s : ctx->slots) {
    if (s.busy && s.gpu && s.ev_done) KVC_SYNC(cudaEventSynchronize(s.ev_done));
    if (s.ev_rows) cudaEventDestroy(s.ev_rows);
    if (s.ev_compute) cudaEventDestroy(s.ev_compute);
    if (s.ev_done) cudaEventDestroy(s.ev_done);
    if (s.h_rows) KVC_SYNC(cudaFreeHost(s.h_rows));
    if (s.d_rows) KVC_SYNC(cudaFree(s.d_rows));
    if (s.h_out) KVC_SYNC(cudaFreeHost(s.h_out));
    if (s.d_out) KVC_SYNC(cudaFree(s.d_out));
  }
  for (cudaStream_t q : {ctx->side, ctx->upload})
    if (q) {  // a shared stream: also waits for other contexts' work enqueued so far (bounded), then stays
      KVC_SYNC(cudaStreamSynchronize(q));
      if (ctx->own_streams) cudaStreamDestroy(q);
    }
  if (ctx->scratch_out) KVC_SYNC(cudaFree(ctx->scratch_out));
  free_tables(ctx);
  delete ctx;
}

int kvc_cuda_set_tables(kvc_cuda_ctx* ctx, const kvc_tables* tables, const uint64_t* region_addr,
                        const uint64_t* region_bytes, uint32_t n_regions) {
  if (!ctx) return KVC_EINVAL;
  ctx->err.clear();
  if (!tables) return ctx->fail(KVC_EINVAL, "tables is NULL");
  if (n_regions && !region_addr) return ctx->fail(KVC_EINVAL, "region_addr is NULL");
  // The CPU kernel's checks of the tables (kinds, counts, widths, extents inside the regions).
  kvc_diag diag;
  int rc = kvc_check_rows(tables, region_bytes, n_regions, nullptr, 0, 0, &diag);
  if (rc != KVC_OK) {
    const char* at = diag.at == KVC_AT_ENTRY ? "entry" : diag.at == KVC_AT_GROUP ? "group_start" : "arguments";
    return ctx->fail(rc, "%s %llu: %s", at, (unsigned long long)diag.index, diag.reason);
  }
  const uint32_t ng = tables->n_groups;
  const uint32_t e_first = tables->group_start[0], e_end = tables->group_start[ng];
  for (uint32_t i = e_first; i < e_end; ++i) {
    const kvc_entry& e = tables->entries[i];
    if (region_bytes[e.region] != 0 && region_addr[e.region] == 0)
      return ctx->fail(KVC_EINVAL, "entry %u: its region's device address is 0", i);
    if (region_addr[e.region] > UINT64_MAX - region_bytes[e.region])
      return ctx->fail(KVC_ERANGE, "entry %u: region address + size overflows 64 bits", i);
  }
  Prepared prep;
  uint32_t bad = 0;
  if (const char* why = prepare_tables(tables, region_addr, ctx->opt.chunk_bytes, &prep, &bad))
    return ctx->fail(KVC_EINVAL, "entry %u: %s", bad, why);
  DeviceGuard guard(ctx->device);
  rc = drain_all(ctx);  // work in flight reads the old tables
  if (rc) return rc;
  DevEntry* d_entries = nullptr;
  DevGroup* d_groups = nullptr;
  uint2* d_items = nullptr;
  auto upload = [&](void** dst, const void* src, size_t bytes) -> cudaError_t {
    cudaError_t e = KVC_SYNC(cudaMalloc(dst, std::max<size_t>(bytes, 16)));
    if (e == cudaSuccess && bytes) e = KVC_SYNC(cudaMemcpy(*dst, src, bytes, cudaMemcpyHostToDevice));
    return e;
  };
  cudaError_t e = upload((void**)&d_entries, prep.entries.data(), prep.entries.size() * sizeof(DevEntry));
  if (e == cudaSuccess) e = upload((void**)&d_groups, prep.groups.data(), prep.groups.size() * sizeof(DevGroup));
  if (e == cudaSuccess) e = upload((void**)&d_items, prep.items.data(), prep.items.size() * sizeof(uint2));
  if (e != cudaSuccess) {
    if (d_entries) KVC_SYNC(cudaFree(d_entries));
    if (d_groups) KVC_SYNC(cudaFree(d_groups));
    if (d_items) KVC_SYNC(cudaFree(d_items));
    return ctx->cuda_fail(e, "uploading the tables");
  }
  free_tables(ctx);
  ctx->d_entries = d_entries;
  ctx->d_groups = d_groups;
  ctx->d_items = d_items;
  ctx->groups = std::move(prep.host);
  ctx->have_tables = true;
  ctx->spec = all_attn_v16(prep.entries.data(), prep.entries.size());
  if (ctx->use_driver_launch) KVC_CU(driver_prepare(ctx->drv, ctx->variant, ctx->spec), "resolving the driver launch");
  return KVC_OK;
}

int kvc_cuda_submit(kvc_cuda_ctx* ctx, const kvc_row* rows, size_t n_rows, size_t out_len, void* stream,
                    uint64_t* ticket) {
  if (!ctx) return KVC_EINVAL;
  using clk = std::chrono::steady_clock;
  clk::time_point tp[6];
  if (ctx->time_submit) tp[0] = clk::now();
  ctx->err.clear();
  if (!ticket) return ctx->fail(KVC_EINVAL, "ticket is NULL");
  if (!ctx->have_tables) return ctx->fail(KVC_EINVAL, "no tables: call kvc_cuda_set_tables first");
  if (n_rows && !rows) return ctx->fail(KVC_EINVAL, "rows is NULL");
  if (n_rows > 0x7fffffffull) return ctx->fail(KVC_EINVAL, "too many rows");
  // The CPU kernel's row checks, from each group's precomputed bounds (same result, O(rows)).
  uint32_t grid_x = 0, max_group = 0, max_valid = 0;
  const uint32_t ng = (uint32_t)ctx->groups.size();
  for (size_t i = 0; i < n_rows; ++i) {
    const kvc_row& r = rows[i];
    max_group = std::max(max_group, r.group);
    max_valid = std::max(max_valid, r.valid_tokens);
    if (r.group >= ng) return ctx->fail(KVC_ERANGE, "rows[%zu]: group index is past n_groups", i);
    const HostGroup& g = ctx->groups[r.group];
    if (!g.has_entries) continue;
    if (r.block_id >= g.min_blocks) return ctx->fail(KVC_ERANGE, "rows[%zu]: block_id is past an entry's num_blocks", i);
    if ((uint64_t)r.out_offset + g.max_column >= (uint64_t)out_len)
      return ctx->fail(KVC_ERANGE, "rows[%zu]: out_offset + entry column is past the output", i);
    if (r.valid_tokens > g.min_block_tokens)
      return ctx->fail(KVC_ERANGE, "rows[%zu]: valid_tokens exceeds the entry's block_tokens", i);
    grid_x = std::max(grid_x, g.n_items);
  }
  if ((uint64_t)n_rows * grid_x >= 0x80000000ull)
    return ctx->fail(KVC_EINVAL, "step too large for one launch (rows * work items per row >= 2^31): split it");
  if (ctx->time_submit) tp[1] = clk::now();
  DeviceGuard guard(ctx->device);
  Slot& s = ctx->slots[ctx->next_slot];
  int rc = drain_slot(ctx, s);  // waits only when every slot still has a step in flight
  if (rc) return rc;
  // rows inline (compact) when they fit: no copy, no cross-stream wait
  const bool inline_rows = n_rows <= ctx->inline_limit && max_group < 256u && max_valid < 65536u;
  rc = grow_slot(ctx, s, inline_rows ? 0 : n_rows, out_len);
  if (rc) return rc;
  ctx->next_slot = (ctx->next_slot + 1) % (uint32_t)ctx->slots.size();
  s.ticket = ctx->next_ticket++;
  s.out_len = out_len;
  s.gpu = grid_x > 0 && n_rows > 0;
  s.busy = true;
  if (!s.gpu) {  // nothing to read: the results are zeros
    if (out_len) std::memset(s.h_out, 0, out_len * 8u);
    *ticket = s.ticket;
    return KVC_OK;
  }
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  if (ctx->time_submit) tp[2] = clk::now();
  LaunchHeader& p = *reinterpret_cast<LaunchHeader*>(ctx->last);
  p.entries = ctx->d_entries;
  p.groups = ctx->d_groups;
  p.items = ctx->d_items;
  p.out = s.d_out;
  p.n_rows = (uint32_t)n_rows;
  cudaError_t e = cudaSuccess;
  int cap = 1;
  if (inline_rows) {
    p.rows = nullptr;
    const size_t want = std::max<size_t>(n_rows, ctx->min_tier);
    cap = want <= kInlineTiers[0] ? (int)kInlineTiers[0] : (int)kInlineTiers[1];
    if (cap == 64) fill_inline<64>(ctx->last, rows, n_rows);
    else fill_inline<128>(ctx->last, rows, n_rows);
  } else {
    // The copy runs on the upload stream, so it overlaps the work already on the caller's stream
    // (the forward pass); the caller's stream waits for it on the GPU just before the kernel.
    p.rows = s.d_rows;
    std::memcpy(s.h_rows, rows, n_rows * sizeof(kvc_row));
    e = cudaMemcpyAsync(s.d_rows, s.h_rows, n_rows * sizeof(kvc_row), cudaMemcpyHostToDevice, ctx->upload);
    if (e == cudaSuccess) e = cudaEventRecord(s.ev_rows, ctx->upload);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(st, s.ev_rows, 0);
  }
  p.per_row = make_fastdiv(grid_x);
  p.n_work = (uint32_t)((uint64_t)n_rows * grid_x);
  const dim3 grid((p.n_work + kWarps - 1) / kWarps);
  if (ctx->time_submit) tp[3] = clk::now();
  if (e == cudaSuccess)
    e = ctx->use_driver_launch ? driver_launch(ctx->drv, ctx->variant, ctx->spec, cap, grid, st, ctx->last)
                               : launch(ctx->variant, ctx->spec, cap, grid, st, ctx->last);
  if (e == cudaSuccess && ctx->spec && is_spec_variant(ctx->variant)) ++ctx->spec_launches;
  if (ctx->time_submit) tp[4] = clk::now();
  if (e == cudaSuccess) e = cudaEventRecord(s.ev_compute, st);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(ctx->side, s.ev_compute, 0);
  if (ctx->copy_out_kernel && out_len <= 0x7fffffffu) {
    // one small kernel: results into the mapped pinned buffer, device output re-zeroed
    const uint32_t n = (uint32_t)out_len, blocks = std::min<uint32_t>((n + 255u) / 256u, 256u);
    if (e == cudaSuccess) {
      kvc_copy_out_kernel<<<blocks, 256, 0, ctx->side>>>(s.d_out, s.h_out_dev, n);
      e = cudaGetLastError();
    }
  } else {
    if (e == cudaSuccess) e = cudaMemcpyAsync(s.h_out, s.d_out, out_len * 8u, cudaMemcpyDeviceToHost, ctx->side);
    if (e == cudaSuccess) e = cudaMemsetAsync(s.d_out, 0, out_len * 8u, ctx->side);
  }
  if (e == cudaSuccess) e = cudaEventRecord(s.ev_done, ctx->side);
  if (e != cudaSuccess) {
    s.ticket = 0;  // drain_slot still waits on ev_done (safe whether or not it was recorded)
    return ctx->cuda_fail(e, "enqueueing the step");
  }
  ctx->last_grid = grid;
  ctx->last_cap = cap;
  ctx->last_out_len = out_len;
  *ticket = s.ticket;
  if (ctx->time_submit) {
    tp[5] = clk::now();
    for (int i = 0; i < 5; ++i) ctx->submit_us[i] = std::chrono::duration<double, std::micro>(tp[i + 1] - tp[i]).count();
  }
  return KVC_OK;
}

static Slot* find_slot(kvc_cuda_ctx* ctx, uint64_t ticket) {
  if (ticket == 0) return nullptr;
  for (auto& s : ctx->slots)
    if (s.ticket == ticket) return &s;
  return nullptr;
}

int kvc_cuda_query(kvc_cuda_ctx* ctx, uint64_t ticket) {
  if (!ctx) return KVC_EINVAL;
  Slot* s = find_slot(ctx, ticket);
  if (!s) return ctx->fail(KVC_ERANGE, "unknown, expired or collected ticket %llu", (unsigned long long)ticket);
  if (!s->gpu) return KVC_OK;
  DeviceGuard guard(ctx->device);
  cudaError_t e = cudaEventQuery(s->ev_done);
  if (e == cudaSuccess) return KVC_OK;
  if (e == cudaErrorNotReady) return KVC_CUDA_PENDING;
  return ctx->cuda_fail(e, "cudaEventQuery");
}

int kvc_cuda_wait(kvc_cuda_ctx* ctx, uint64_t ticket) {
  if (!ctx) return KVC_EINVAL;
  Slot* s = find_slot(ctx, ticket);
  if (!s) return ctx->fail(KVC_ERANGE, "unknown, expired or collected ticket %llu", (unsigned long long)ticket);
  if (!s->gpu) return KVC_OK;
  DeviceGuard guard(ctx->device);
  // A done copy (the reader polled it) needs no synchronizing call: collect after query stays
  // free of them.
  cudaError_t q = cudaEventQuery(s->ev_done);
  if (q == cudaSuccess) return KVC_OK;
  if (q != cudaErrorNotReady) return ctx->cuda_fail(q, "cudaEventQuery");
  KVC_CU(KVC_SYNC(cudaEventSynchronize(s->ev_done)), "cudaEventSynchronize");
  return KVC_OK;
}

int kvc_cuda_collect(kvc_cuda_ctx* ctx, uint64_t ticket, uint64_t* out, size_t out_len) {
  if (!ctx) return KVC_EINVAL;
  Slot* s = find_slot(ctx, ticket);
  if (!s) return ctx->fail(KVC_ERANGE, "unknown, expired or collected ticket %llu", (unsigned long long)ticket);
  if (out_len != s->out_len)
    return ctx->fail(KVC_ERANGE, "out_len %zu differs from the submit's %zu", out_len, s->out_len);
  if (out_len && !out) return ctx->fail(KVC_EINVAL, "out is NULL");
  int rc = kvc_cuda_wait(ctx, ticket);
  if (rc) return rc;
  for (size_t i = 0; i < out_len; ++i) out[i] += s->h_out[i];
  s->ticket = 0;
  s->busy = false;
  return KVC_OK;
}

unsigned long long kvc_cuda_sync_calls(void) { return g_sync_calls.load(std::memory_order_relaxed); }

const char* kvc_cuda_last_error(const kvc_cuda_ctx* ctx) { return ctx ? ctx->err.c_str() : "context is NULL"; }

int kvc_cuda_dev_alloc(int device, size_t bytes, uint64_t* addr) {
  if (!addr) return KVC_EINVAL;
  *addr = 0;
  DeviceGuard guard(device);
  void* p = nullptr;
  if (KVC_SYNC(cudaMalloc(&p, bytes ? bytes : 1)) != cudaSuccess) {
    cudaGetLastError();
    return KVC_ECUDA;
  }
  *addr = (uint64_t)(uintptr_t)p;
  return KVC_OK;
}

int kvc_cuda_dev_free(int device, uint64_t addr) {
  DeviceGuard guard(device);
  return KVC_SYNC(cudaFree((void*)(uintptr_t)addr)) == cudaSuccess ? KVC_OK : KVC_ECUDA;
}

int kvc_cuda_copy_to_device(int device, uint64_t dst, const void* src, size_t bytes) {
  if (bytes && (!src || !dst)) return KVC_EINVAL;
  DeviceGuard guard(device);
  return KVC_SYNC(cudaMemcpy((void*)(uintptr_t)dst, src, bytes, cudaMemcpyHostToDevice)) == cudaSuccess ? KVC_OK : KVC_ECUDA;
}

int kvc_cuda_copy_to_host(int device, void* dst, uint64_t src, size_t bytes) {
  if (bytes && (!src || !dst)) return KVC_EINVAL;
  DeviceGuard guard(device);
  return KVC_SYNC(cudaMemcpy(dst, (const void*)(uintptr_t)src, bytes, cudaMemcpyDeviceToHost)) == cudaSuccess ? KVC_OK : KVC_ECUDA;
}

}  // extern "C"

// ---------------------------------------------------------------------------------------------
// Internal (kvc_cuda_internal.h): for the benchmark only.

int kvc_cuda_debug_relaunch(kvc_cuda_ctx* ctx, void* stream) {
  if (!ctx || ctx->last_grid.x == 0) return KVC_EINVAL;
  DeviceGuard guard(ctx->device);
  const size_t need = std::max<size_t>(ctx->last_out_len, 1);
  if (ctx->scratch_len < need) {
    if (ctx->scratch_out) KVC_SYNC(cudaFree(ctx->scratch_out));
    ctx->scratch_out = nullptr;
    ctx->scratch_len = 0;
    KVC_CU(KVC_SYNC(cudaMalloc((void**)&ctx->scratch_out, need * 8u)), "cudaMalloc (scratch)");
    ctx->scratch_len = need;
  }
  LaunchParams<kInlineMax> p;
  std::memcpy(&p, ctx->last, sizeof p);
  p.h.out = ctx->scratch_out;  // never the slot's output, which must stay zero while the slot is free
  KVC_CU(launch(ctx->variant, ctx->spec, ctx->last_cap, ctx->last_grid, static_cast<cudaStream_t>(stream), &p), "relaunch");
  return KVC_OK;
}

int kvc_cuda_debug_set_variant(kvc_cuda_ctx* ctx, int variant) {
  if (!ctx || (variant != 1 && variant != 2 && variant != 4 && variant != 8 && variant != 32 && !is_spec_variant(variant)))
    return KVC_EINVAL;
  if (variant != ctx->variant) {  // load the variant's module now, not in a timed launch
    DeviceGuard guard(ctx->device);
    KVC_CU(warm_variant(variant, ctx->side, ctx->slots[0].d_out), "warm-up");
    KVC_CU(KVC_SYNC(cudaStreamSynchronize(ctx->side)), "warm-up");
  }
  ctx->variant = variant;
  if (ctx->use_driver_launch) KVC_CU(driver_prepare(ctx->drv, variant, ctx->spec), "resolving the driver launch");
  return KVC_OK;
}

int kvc_cuda_debug_set_submit(kvc_cuda_ctx* ctx, uint32_t inline_limit, uint32_t min_tier, int copy_out_kernel) {
  if (!ctx || inline_limit > kInlineMax || min_tier > kInlineMax) return KVC_EINVAL;
  ctx->inline_limit = inline_limit;
  ctx->min_tier = min_tier;
  ctx->copy_out_kernel = copy_out_kernel != 0;
  return KVC_OK;
}

int kvc_cuda_debug_set_launch(kvc_cuda_ctx* ctx, int driver) {
  if (!ctx) return KVC_EINVAL;
  if (driver) {
    DeviceGuard guard(ctx->device);
    KVC_CU(driver_prepare(ctx->drv, ctx->variant, ctx->spec), "resolving the driver launch");
  }
  ctx->use_driver_launch = driver != 0;
  return KVC_OK;
}

int kvc_cuda_debug_submit_times(kvc_cuda_ctx* ctx, int enable, double us[5]) {
  if (!ctx) return KVC_EINVAL;
  ctx->time_submit = enable != 0;
  if (us) std::memcpy(us, ctx->submit_us, sizeof ctx->submit_us);
  return KVC_OK;
}

unsigned long long kvc_cuda_debug_spec_launches(const kvc_cuda_ctx* ctx) { return ctx ? ctx->spec_launches : 0; }

void kvc_cuda_debug_private_streams(int on) { g_private_streams.store(on != 0); }
