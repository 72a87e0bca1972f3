// Benchmark: 1 GiB of KV loaded through CUDA IPC from another process's allocation (the path of
// the embedded agent on one host: kvc_dev_ipc_open, kvc_dev_copy_async on a stream, completion
// polled with kvc_dev_event_query) against a plain cudaMemcpy device-to-device inside this
// process and against cudaMemcpyPeer(dst on device 0, src on device 0) (issue 15's baseline; with
// one GPU both devices are 0), in the same run. Prints all three, the ratios and a verdict per
// baseline (target: IPC >= 0.8 of it).
//
//   kvc_bench_ipc [--mib N] [--reps R]
// The exporter is this executable re-run with --exporter: it allocates N MiB, fills it, prints
// its IPC handle and waits on stdin. The result is checked byte for byte (on the device).
#include <cuda_runtime.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kvc_checksum.h"
#include "kvc_device.h"

__global__ void Fill(uint32_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] = (uint32_t)(i * 2654435761u) ^ seed;
}

__global__ void Count(const uint32_t* p, size_t n, uint32_t seed, unsigned long long* bad) {
  unsigned long long b = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    b += p[i] != ((uint32_t)(i * 2654435761u) ^ seed);
  if (b) atomicAdd(bad, b);
}

static double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

static int Die(const char* what) {
  fprintf(stderr, "kvc_bench_ipc: %s: %s\n", what, kvc_dev_last_error());
  return 1;
}

static int Exporter(size_t bytes) {
  uint64_t a = 0;
  uint8_t h[KVC_IPC_HANDLE_BYTES];
  if (kvc_dev_alloc(0, bytes, &a, h) != KVC_OK) return Die("exporter alloc");
  Fill<<<1024, 256>>>((uint32_t*)(uintptr_t)a, bytes / 4, 0x5eed);
  if (cudaDeviceSynchronize() != cudaSuccess) return Die("exporter fill");
  for (int i = 0; i < KVC_IPC_HANDLE_BYTES; i++) printf("%02x", h[i]);
  printf("\n");
  fflush(stdout);
  char line[16];
  if (!fgets(line, sizeof line, stdin)) { /* parent gone: exit */ }
  kvc_dev_free(a);
  return 0;
}

static size_t CountBad(uint64_t dst, size_t bytes, uint32_t seed) {
  unsigned long long* d = nullptr;
  cudaMalloc(&d, sizeof *d);
  cudaMemset(d, 0, sizeof *d);
  Count<<<1024, 256>>>((const uint32_t*)(uintptr_t)dst, bytes / 4, seed, d);
  unsigned long long h = ~0ull;
  cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost);
  cudaFree(d);
  return (size_t)h;
}

int main(int argc, char** argv) {
  size_t mib = 1024;
  int reps = 10;
  bool exporter = false;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--exporter")) exporter = true;
    else if (!strcmp(argv[i], "--mib") && i + 1 < argc) mib = strtoull(argv[++i], nullptr, 10);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
  }
  const size_t bytes = mib << 20;
  if (exporter) return Exporter(bytes);
  int n = 0;
  kvc_cuda_device_count(&n);
  if (n == 0) {
    printf("skipped: no CUDA device (%s)\n", kvc_cuda_probe_error());
    return 0;
  }
  int to_child[2], from_child[2];
  if (pipe(to_child) || pipe(from_child)) return 1;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(to_child[0], 0);
    dup2(from_child[1], 1);
    close(to_child[1]);
    close(from_child[0]);
    std::string m = std::to_string(mib);
    execl("/proc/self/exe", argv[0], "--exporter", "--mib", m.c_str(), (char*)nullptr);
    _exit(127);
  }
  close(to_child[0]);
  close(from_child[1]);
  FILE* in = fdopen(from_child[0], "r");
  char hex[2 * KVC_IPC_HANDLE_BYTES + 8] = {0};
  if (!fgets(hex, sizeof hex, in) || strlen(hex) < 2 * KVC_IPC_HANDLE_BYTES) {
    fprintf(stderr, "kvc_bench_ipc: the exporter gave no handle\n");
    return 1;
  }
  uint8_t h[KVC_IPC_HANDLE_BYTES];
  for (int i = 0; i < KVC_IPC_HANDLE_BYTES; i++) sscanf(hex + 2 * i, "%2hhx", &h[i]);

  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  uint64_t dst = 0, src = 0, mapped = 0, stream = 0;
  if (kvc_dev_alloc(0, bytes, &dst, nullptr) || kvc_dev_alloc(0, bytes, &src, nullptr)) return Die("alloc");
  Fill<<<1024, 256>>>((uint32_t*)(uintptr_t)src, bytes / 4, 0xd2d);
  if (cudaDeviceSynchronize() != cudaSuccess) return Die("fill");
  if (kvc_dev_stream_create(0, &stream)) return Die("stream");
  double t0 = Now();
  if (kvc_dev_ipc_open(0, h, bytes, &mapped)) return Die("ipc open");
  const double open_s = Now() - t0;

  std::vector<double> d2d, ipc, peer;
  for (int r = -1; r < reps; r++) {  // r = -1: warm-up of all three
    cudaDeviceSynchronize();
    t0 = Now();
    // cudaMemcpy device-to-device may return before the copy finished: wait for it.
    if (cudaMemcpy((void*)(uintptr_t)dst, (const void*)(uintptr_t)src, bytes, cudaMemcpyDeviceToDevice) != cudaSuccess ||
        cudaDeviceSynchronize() != cudaSuccess)
      return Die("cudaMemcpy");
    const double a = Now() - t0;
    cudaDeviceSynchronize();
    t0 = Now();
    // cudaMemcpyPeer is asynchronous with respect to the host for device-to-device: wait for it.
    if (cudaMemcpyPeer((void*)(uintptr_t)dst, 0, (const void*)(uintptr_t)src, 0, bytes) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess)
      return Die("cudaMemcpyPeer");
    const double c = Now() - t0;
    cudaDeviceSynchronize();
    t0 = Now();
    uint64_t ev = 0;
    if (kvc_dev_copy_async(0, dst, mapped, bytes, KVC_COPY_D2D, stream, &ev)) return Die("ipc copy");
    int rc;
    while ((rc = kvc_dev_event_query(ev)) == KVC_CUDA_PENDING) {
    }
    const double b = Now() - t0;
    kvc_dev_event_release(ev);
    if (rc != KVC_OK) return Die("ipc copy completion");
    if (r >= 0) {
      d2d.push_back(a);
      ipc.push_back(b);
      peer.push_back(c);
    }
  }
  const size_t bad_ipc = CountBad(dst, bytes, 0x5eed);
  cudaMemcpy((void*)(uintptr_t)dst, (const void*)(uintptr_t)src, bytes, cudaMemcpyDeviceToDevice);
  const size_t bad_d2d = CountBad(dst, bytes, 0xd2d);
  std::sort(d2d.begin(), d2d.end());
  std::sort(ipc.begin(), ipc.end());
  std::sort(peer.begin(), peer.end());
  const double md = d2d[d2d.size() / 2], mi = ipc[ipc.size() / 2], mp = peer[peer.size() / 2];
  const double gd = bytes / md / 1e9, gi = bytes / mi / 1e9, gp = bytes / mp / 1e9;
  const double ratio = gi / gd, ratio_peer = gi / gp;
  printf("device: %s, %zu MiB, %d reps (median; best in brackets), ipc open %.2f ms\n", prop.name, mib, reps, open_s * 1e3);
  printf("cudaMemcpy D2D (same process):     %8.3f ms  %7.1f GB/s  [%.3f ms]\n", md * 1e3, gd, d2d.front() * 1e3);
  printf("cudaMemcpyPeer dev0->dev0:         %8.3f ms  %7.1f GB/s  [%.3f ms]\n", mp * 1e3, gp, peer.front() * 1e3);
  printf("CUDA IPC load (peer process):      %8.3f ms  %7.1f GB/s  [%.3f ms]\n", mi * 1e3, gi, ipc.front() * 1e3);
  printf("words differing after the copies: ipc %zu, d2d %zu\n", bad_ipc, bad_d2d);
  const bool intact = bad_ipc == 0 && bad_d2d == 0;
  const bool ok = intact && ratio >= 0.8 && ratio_peer >= 0.8;
  printf("ratio IPC/D2D throughput: %.3f  verdict: %s (target >= 0.8, bytes intact)\n", ratio, intact && ratio >= 0.8 ? "PASS" : "FAIL");
  printf("ratio IPC/cudaMemcpyPeer(dev0->dev0) throughput: %.3f  verdict: %s (target >= 0.8, bytes intact)\n", ratio_peer, intact && ratio_peer >= 0.8 ? "PASS" : "FAIL");
  kvc_dev_ipc_close(mapped);
  if (write(to_child[1], "x\n", 2) < 0) { /* exporter gone */ }
  close(to_child[1]);
  int status = 0;
  waitpid(pid, &status, 0);
  kvc_dev_free(dst);
  kvc_dev_free(src);
  kvc_dev_stream_destroy(stream);
  return ok ? 0 : 1;
}
