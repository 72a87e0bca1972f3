// Device memory for the transfer agents and the reference engine: include/kvc_device.h.
// CUDA runtime API only (no driver API, no kernels), so it builds with a static cudart and runs
// wherever libcuda.so.1 is.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "kvc_checksum.h"
#include "kvc_device.h"

namespace {

enum class Kind { Device, Ipc, Adopted, Pinned };

struct Entry {
  Kind kind;
  int device;  // -1 for pinned host memory
  size_t bytes;
  int refs;  // IPC mappings: opens not yet closed
  unsigned char handle[KVC_IPC_HANDLE_BYTES];
};

struct Event {
  cudaEvent_t ev;
  int device;
};

std::mutex g_mu;
std::map<uint64_t, Entry> g_mem;  // by base address
std::map<uint64_t, Event> g_events;
uint64_t g_next_event = 1;
thread_local std::string t_error;

int Fail(int rc, const std::string& msg) {
  t_error = msg;
  return rc;
}

int Cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return KVC_OK;
  cudaGetLastError();  // clear a sticky-free error so that later calls are not affected
  return Fail(e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ? KVC_ENOCUDA : KVC_ECUDA,
              std::string(what) + ": " + cudaGetErrorString(e) + " (" + cudaGetErrorName(e) + ")");
}

int Ok() {
  t_error.clear();
  return KVC_OK;
}

/** Sets `device` as current for the scope. */
struct Guard {
  int prev = -1;
  bool changed = false;
  int rc = KVC_OK;
  explicit Guard(int dev) {
    if (dev < 0) return;
    if (cudaGetDevice(&prev) != cudaSuccess) prev = -1;
    if (prev != dev) {
      rc = Cuda(cudaSetDevice(dev), "cudaSetDevice");
      changed = rc == KVC_OK && prev >= 0;
    }
  }
  ~Guard() {
    if (changed) cudaSetDevice(prev);
  }
};

/** The live entry holding [addr, addr + bytes) whose kind is allowed, or null. Caller holds g_mu. */
const Entry* Find(uint64_t addr, size_t bytes, bool host, int device) {
  if (bytes == 0 || addr + bytes < addr) return nullptr;
  auto it = g_mem.upper_bound(addr);
  if (it == g_mem.begin()) return nullptr;
  --it;
  const Entry& e = it->second;
  if (addr - it->first > e.bytes || bytes > e.bytes - (addr - it->first)) return nullptr;
  if (host != (e.kind == Kind::Pinned)) return nullptr;
  if (!host && e.device != device) return nullptr;
  return &e;
}

int CheckRanges(int device, uint64_t dst, uint64_t src, size_t bytes, int kind, bool host_checked) {
  if (kind != KVC_COPY_H2D && kind != KVC_COPY_D2H && kind != KVC_COPY_D2D) return Fail(KVC_EINVAL, "kind must be H2D (1), D2H (2) or D2D (3)");
  if (bytes == 0) return Fail(KVC_EINVAL, "a copy needs at least one byte");
  const bool dst_host = kind == KVC_COPY_D2H, src_host = kind == KVC_COPY_H2D;
  std::lock_guard<std::mutex> lock(g_mu);
  if ((!dst_host || host_checked) && !Find(dst, bytes, dst_host, device)) {
    char b[160];
    snprintf(b, sizeof b, "destination [0x%llx, +%zu) is not inside %s", (unsigned long long)dst, bytes,
             dst_host ? "a pinned buffer of kvc_dev_host_alloc" : "device memory of this library on that device");
    return Fail(KVC_ERANGE, b);
  }
  if ((!src_host || host_checked) && !Find(src, bytes, src_host, device)) {
    char b[160];
    snprintf(b, sizeof b, "source [0x%llx, +%zu) is not inside %s", (unsigned long long)src, bytes,
             src_host ? "a pinned buffer of kvc_dev_host_alloc" : "device memory of this library on that device");
    return Fail(KVC_ERANGE, b);
  }
  return KVC_OK;
}

cudaMemcpyKind CudaKind(int kind) {
  return kind == KVC_COPY_H2D ? cudaMemcpyHostToDevice : kind == KVC_COPY_D2H ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice;
}

}  // namespace

extern "C" {

int kvc_dev_alloc(int device, size_t bytes, uint64_t* addr, uint8_t* handle) {
  if (!addr || bytes == 0 || device < 0) return Fail(KVC_EINVAL, "kvc_dev_alloc: device >= 0, bytes > 0 and addr needed");
  *addr = 0;
  Guard g(device);
  if (g.rc) return g.rc;
  void* p = nullptr;
  int rc = Cuda(cudaMalloc(&p, bytes), "cudaMalloc");
  if (rc) return rc;
  Entry e{Kind::Device, device, bytes, 0, {}};
  cudaIpcMemHandle_t h;
  rc = Cuda(cudaIpcGetMemHandle(&h, p), "cudaIpcGetMemHandle");
  if (rc) {
    cudaFree(p);
    return rc;
  }
  static_assert(sizeof(h) == KVC_IPC_HANDLE_BYTES, "cudaIpcMemHandle_t is 64 bytes");
  std::memcpy(e.handle, &h, sizeof h);
  if (handle) std::memcpy(handle, &h, sizeof h);
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_mem[(uint64_t)(uintptr_t)p] = e;
  }
  *addr = (uint64_t)(uintptr_t)p;
  return Ok();
}

int kvc_dev_free(uint64_t addr) {
  int device;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_mem.find(addr);
    if (it == g_mem.end() || it->second.kind != Kind::Device) return Fail(KVC_EINVAL, "kvc_dev_free: not an allocation of kvc_dev_alloc");
    device = it->second.device;
    g_mem.erase(it);
  }
  Guard g(device);
  if (g.rc) return g.rc;
  int rc = Cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  if (rc) return rc;
  rc = Cuda(cudaFree((void*)(uintptr_t)addr), "cudaFree");
  return rc ? rc : Ok();
}

int kvc_dev_ipc_open(int device, const uint8_t* handle, size_t bytes, uint64_t* addr) {
  if (!handle || !addr || bytes == 0 || device < 0) return Fail(KVC_EINVAL, "kvc_dev_ipc_open: device >= 0, a handle, bytes > 0 and addr needed");
  *addr = 0;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    for (auto& [base, e] : g_mem) {
      if (e.kind == Kind::Ipc && e.device == device && std::memcmp(e.handle, handle, KVC_IPC_HANDLE_BYTES) == 0) {
        if (bytes > e.bytes) return Fail(KVC_ERANGE, "kvc_dev_ipc_open: the handle is open with a smaller size");
        e.refs++;
        *addr = base;
        return Ok();
      }
    }
  }
  Guard g(device);
  if (g.rc) return g.rc;
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle, sizeof h);
  void* p = nullptr;
  int rc = Cuda(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
  if (rc) return rc;
  Entry e{Kind::Ipc, device, bytes, 1, {}};
  std::memcpy(e.handle, handle, KVC_IPC_HANDLE_BYTES);
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_mem[(uint64_t)(uintptr_t)p] = e;
  }
  *addr = (uint64_t)(uintptr_t)p;
  return Ok();
}

int kvc_dev_ipc_close(uint64_t addr) {
  int device;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_mem.find(addr);
    if (it == g_mem.end() || it->second.kind != Kind::Ipc) return Fail(KVC_EINVAL, "kvc_dev_ipc_close: not a mapping of kvc_dev_ipc_open");
    if (--it->second.refs > 0) return Ok();
    device = it->second.device;
    g_mem.erase(it);
  }
  Guard g(device);
  if (g.rc) return g.rc;
  int rc = Cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  if (rc) return rc;
  rc = Cuda(cudaIpcCloseMemHandle((void*)(uintptr_t)addr), "cudaIpcCloseMemHandle");
  return rc ? rc : Ok();
}

int kvc_dev_adopt(int device, uint64_t addr, size_t bytes) {
  if (device < 0 || addr == 0 || bytes == 0 || addr + bytes < addr) return Fail(KVC_EINVAL, "kvc_dev_adopt: device >= 0, addr != 0, bytes > 0");
  std::lock_guard<std::mutex> lock(g_mu);
  auto next = g_mem.lower_bound(addr);
  if (next != g_mem.end() && next->first < addr + bytes) return Fail(KVC_EINVAL, "kvc_dev_adopt: overlaps known memory");
  if (next != g_mem.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second.bytes > addr) return Fail(KVC_EINVAL, "kvc_dev_adopt: overlaps known memory");
  }
  g_mem[addr] = Entry{Kind::Adopted, device, bytes, 0, {}};
  return Ok();
}

int kvc_dev_unadopt(uint64_t addr) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_mem.find(addr);
  if (it == g_mem.end() || it->second.kind != Kind::Adopted) return Fail(KVC_EINVAL, "kvc_dev_unadopt: not an adopted range");
  g_mem.erase(it);
  return Ok();
}

int kvc_dev_host_alloc(size_t bytes, void** ptr) {
  if (!ptr || bytes == 0) return Fail(KVC_EINVAL, "kvc_dev_host_alloc: bytes > 0 and ptr needed");
  *ptr = nullptr;
  int rc = Cuda(cudaHostAlloc(ptr, bytes, cudaHostAllocPortable), "cudaHostAlloc");
  if (rc) return rc;
  std::lock_guard<std::mutex> lock(g_mu);
  g_mem[(uint64_t)(uintptr_t)*ptr] = Entry{Kind::Pinned, -1, bytes, 0, {}};
  t_error.clear();
  return KVC_OK;
}

int kvc_dev_host_free(void* ptr) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_mem.find((uint64_t)(uintptr_t)ptr);
    if (it == g_mem.end() || it->second.kind != Kind::Pinned) return Fail(KVC_EINVAL, "kvc_dev_host_free: not a buffer of kvc_dev_host_alloc");
    g_mem.erase(it);
  }
  int rc = Cuda(cudaFreeHost(ptr), "cudaFreeHost");  // synchronizes the device
  return rc ? rc : Ok();
}

int kvc_dev_stream_create(int device, uint64_t* stream) {
  if (!stream || device < 0) return Fail(KVC_EINVAL, "kvc_dev_stream_create: device >= 0 and stream needed");
  Guard g(device);
  if (g.rc) return g.rc;
  cudaStream_t s = nullptr;
  int rc = Cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  if (rc) return rc;
  *stream = (uint64_t)(uintptr_t)s;
  return Ok();
}

int kvc_dev_stream_destroy(uint64_t stream) {
  if (stream == 0) return Fail(KVC_EINVAL, "kvc_dev_stream_destroy: the default stream is not destroyed");
  int rc = Cuda(cudaStreamDestroy((cudaStream_t)(uintptr_t)stream), "cudaStreamDestroy");
  return rc ? rc : Ok();
}

int kvc_dev_copy_async(int device, uint64_t dst, uint64_t src, size_t bytes, int kind, uint64_t stream, uint64_t* event) {
  if (!event || device < 0) return Fail(KVC_EINVAL, "kvc_dev_copy_async: device >= 0 and event needed");
  *event = 0;
  int rc = CheckRanges(device, dst, src, bytes, kind, true);
  if (rc) return rc;
  Guard g(device);
  if (g.rc) return g.rc;
  cudaEvent_t ev;
  rc = Cuda(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
  if (rc) return rc;
  cudaStream_t s = (cudaStream_t)(uintptr_t)stream;
  rc = Cuda(cudaMemcpyAsync((void*)(uintptr_t)dst, (const void*)(uintptr_t)src, bytes, CudaKind(kind), s), "cudaMemcpyAsync");
  if (!rc) rc = Cuda(cudaEventRecord(ev, s), "cudaEventRecord");
  if (rc) {
    cudaEventDestroy(ev);
    return rc;
  }
  std::lock_guard<std::mutex> lock(g_mu);
  *event = g_next_event++;
  g_events[*event] = Event{ev, device};
  t_error.clear();
  return KVC_OK;
}

int kvc_dev_event_query(uint64_t event) {
  cudaEvent_t ev;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_events.find(event);
    if (it == g_events.end()) return Fail(KVC_ERANGE, "kvc_dev_event_query: unknown or released event");
    ev = it->second.ev;
  }
  cudaError_t e = cudaEventQuery(ev);
  if (e == cudaErrorNotReady) {
    cudaGetLastError();
    return KVC_CUDA_PENDING;
  }
  int rc = Cuda(e, "cudaEventQuery");
  return rc ? rc : Ok();
}

int kvc_dev_event_wait(uint64_t event) {
  cudaEvent_t ev;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_events.find(event);
    if (it == g_events.end()) return Fail(KVC_ERANGE, "kvc_dev_event_wait: unknown or released event");
    ev = it->second.ev;
  }
  int rc = Cuda(cudaEventSynchronize(ev), "cudaEventSynchronize");
  return rc ? rc : Ok();
}

int kvc_dev_event_release(uint64_t event) {
  Event e;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_events.find(event);
    if (it == g_events.end()) return Fail(KVC_ERANGE, "kvc_dev_event_release: unknown or released event");
    e = it->second;
    g_events.erase(it);
  }
  int rc = Cuda(cudaEventDestroy(e.ev), "cudaEventDestroy");  // resources freed once the event completes
  return rc ? rc : Ok();
}

int kvc_dev_copy(int device, uint64_t dst, uint64_t src, size_t bytes, int kind) {
  if (device < 0) return Fail(KVC_EINVAL, "kvc_dev_copy: device >= 0");
  if (kind != KVC_COPY_D2D && ((kind == KVC_COPY_H2D && src == 0) || (kind == KVC_COPY_D2H && dst == 0)))
    return Fail(KVC_EINVAL, "kvc_dev_copy: null host pointer");
  int rc = CheckRanges(device, dst, src, bytes, kind, false);
  if (rc) return rc;
  Guard g(device);
  if (g.rc) return g.rc;
  rc = Cuda(cudaMemcpy((void*)(uintptr_t)dst, (const void*)(uintptr_t)src, bytes, CudaKind(kind)), "cudaMemcpy");
  // cudaMemcpy device-to-device may return before the copy finished (CUDA Runtime API, "API
  // synchronization behavior"): wait for the legacy default stream it ran on.
  if (!rc && kind == KVC_COPY_D2D) rc = Cuda(cudaStreamSynchronize(0), "cudaStreamSynchronize");
  return rc ? rc : Ok();
}

const char* kvc_dev_last_error(void) { return t_error.c_str(); }

}  // extern "C"
