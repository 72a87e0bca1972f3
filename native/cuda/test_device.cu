// Test of the device-memory API (include/kvc_device.h) on a GPU: async copies H2D/D2H/D2D with
// polled completion, bounds refusals, synchronous copies, and CUDA IPC with a second process
// (this executable re-run with --child). Without a GPU it prints why and counts the test skipped.
// Prints "N passed, N failed, N skipped" last; exits 1 on a failure.
#include <cuda_runtime.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kvc_checksum.h"
#include "kvc_device.h"

static int g_pass = 0, g_fail = 0;
#define CHECK(cond, ...)                                  \
  do {                                                    \
    if (cond) {                                           \
      g_pass++;                                           \
    } else {                                              \
      g_fail++;                                           \
      printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      printf(__VA_ARGS__);                                \
      printf(" [%s]\n", kvc_dev_last_error());            \
    }                                                     \
  } while (0)

static int WaitEvent(uint64_t ev) {
  auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    int rc = kvc_dev_event_query(ev);
    if (rc != KVC_CUDA_PENDING) return rc;
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(20)) return KVC_ECUDA;
  }
}

static uint8_t Pattern(size_t i, unsigned seed) { return (uint8_t)((i * 131u + seed * 7u + (i >> 9)) & 0xff); }

static std::string Hex(const uint8_t* p, size_t n) {
  std::string s;
  char b[3];
  for (size_t i = 0; i < n; i++) {
    snprintf(b, sizeof b, "%02x", p[i]);
    s += b;
  }
  return s;
}

// Child: opens the parent's handle, checks seed-1 bytes, writes seed 2 into the first half.
static int Child(const char* hex, size_t bytes) {
  uint8_t h[KVC_IPC_HANDLE_BYTES];
  for (int i = 0; i < KVC_IPC_HANDLE_BYTES; i++) sscanf(hex + 2 * i, "%2hhx", &h[i]);
  uint64_t a = 0, a2 = 0;
  CHECK(kvc_dev_ipc_open(0, h, bytes, &a) == KVC_OK && a != 0, "ipc open");
  CHECK(kvc_dev_ipc_open(0, h, bytes, &a2) == KVC_OK && a2 == a, "second open returns the same mapping");
  void* pin = nullptr;
  CHECK(kvc_dev_host_alloc(bytes, &pin) == KVC_OK, "pinned");
  uint64_t ev = 0;
  CHECK(kvc_dev_copy_async(0, (uint64_t)(uintptr_t)pin, a, bytes, KVC_COPY_D2H, 0, &ev) == KVC_OK, "D2H from the mapping");
  CHECK(WaitEvent(ev) == KVC_OK, "D2H done");
  kvc_dev_event_release(ev);
  size_t bad = 0;
  for (size_t i = 0; i < bytes; i++) bad += ((uint8_t*)pin)[i] != Pattern(i, 1);
  CHECK(bad == 0, "%zu bytes differ in the child", bad);
  CHECK(kvc_dev_copy_async(0, a + bytes - 8, (uint64_t)(uintptr_t)pin, 16, KVC_COPY_H2D, 0, &ev) == KVC_ERANGE, "past the advertised size refused");
  for (size_t i = 0; i < bytes / 2; i++) ((uint8_t*)pin)[i] = Pattern(i, 2);
  CHECK(kvc_dev_copy_async(0, a, (uint64_t)(uintptr_t)pin, bytes / 2, KVC_COPY_H2D, 0, &ev) == KVC_OK, "H2D into the mapping");
  CHECK(WaitEvent(ev) == KVC_OK, "H2D done");
  kvc_dev_event_release(ev);
  CHECK(kvc_dev_ipc_close(a) == KVC_OK && kvc_dev_ipc_close(a) == KVC_OK, "close twice (two opens)");
  CHECK(kvc_dev_ipc_close(a) == KVC_EINVAL, "third close refused");
  kvc_dev_host_free(pin);
  printf("child: %d passed, %d failed\n", g_pass, g_fail);
  return g_fail == 0 ? 0 : 1;
}

int main(int argc, char** argv) {
  if (argc == 4 && strcmp(argv[1], "--child") == 0) return Child(argv[2], strtoull(argv[3], nullptr, 10));
  int n = 0;
  kvc_cuda_device_count(&n);
  if (n == 0) {
    printf("skipped: no CUDA device (%s)\n0 passed, 0 failed, 1 skipped\n", kvc_cuda_probe_error());
    return 0;
  }
  const size_t B = 1 << 20;
  uint64_t A = 0, Bd = 0;
  uint8_t h[KVC_IPC_HANDLE_BYTES] = {0};
  CHECK(kvc_dev_alloc(0, B, &A, h) == KVC_OK, "alloc A");
  CHECK(kvc_dev_alloc(0, B, &Bd, nullptr) == KVC_OK, "alloc B");
  void *H = nullptr, *H2 = nullptr;
  CHECK(kvc_dev_host_alloc(B, &H) == KVC_OK && kvc_dev_host_alloc(B, &H2) == KVC_OK, "pinned buffers");
  for (size_t i = 0; i < B; i++) ((uint8_t*)H)[i] = Pattern(i, 1);
  uint64_t stream = 0;
  CHECK(kvc_dev_stream_create(0, &stream) == KVC_OK, "stream");
  uint64_t e1 = 0, e2 = 0, e3 = 0;
  CHECK(kvc_dev_copy_async(0, A, (uint64_t)(uintptr_t)H, B, KVC_COPY_H2D, stream, &e1) == KVC_OK, "H2D");
  CHECK(kvc_dev_copy_async(0, Bd, A, B, KVC_COPY_D2D, stream, &e2) == KVC_OK, "D2D");
  CHECK(kvc_dev_copy_async(0, (uint64_t)(uintptr_t)H2, Bd, B, KVC_COPY_D2H, stream, &e3) == KVC_OK, "D2H");
  CHECK(WaitEvent(e3) == KVC_OK && kvc_dev_event_query(e1) == KVC_OK && kvc_dev_event_query(e2) == KVC_OK, "all three done (stream order)");
  CHECK(memcmp(H, H2, B) == 0, "round trip H -> A -> B -> H2 keeps the bytes");
  for (uint64_t e : {e1, e2, e3}) kvc_dev_event_release(e);
  CHECK(kvc_dev_event_query(e1) == KVC_ERANGE, "released event unknown");

  // Bounds: every range must be inside known memory of the right kind.
  uint64_t ev = 0;
  std::vector<uint8_t> pageable(B);
  CHECK(kvc_dev_copy_async(0, A + B - 8, (uint64_t)(uintptr_t)H, 16, KVC_COPY_H2D, 0, &ev) == KVC_ERANGE, "past the allocation's end");
  CHECK(kvc_dev_copy_async(0, A, (uint64_t)(uintptr_t)pageable.data(), 16, KVC_COPY_H2D, 0, &ev) == KVC_ERANGE, "async from pageable memory");
  CHECK(kvc_dev_copy_async(0, A, (uint64_t)(uintptr_t)H, 16, KVC_COPY_D2D, 0, &ev) == KVC_ERANGE, "pinned host memory as a D2D source");
  CHECK(kvc_dev_copy_async(0, 0x1000, A, 16, KVC_COPY_D2D, 0, &ev) == KVC_ERANGE, "unknown destination");
  CHECK(kvc_dev_copy_async(0, A, Bd, 0, KVC_COPY_D2D, 0, &ev) == KVC_EINVAL, "zero bytes");
  CHECK(kvc_dev_copy_async(0, A, Bd, 16, 7, 0, &ev) == KVC_EINVAL, "bad kind");
  // Synchronous copies (pageable host side).
  for (size_t i = 0; i < B; i++) pageable[i] = Pattern(i, 3);
  CHECK(kvc_dev_copy(0, A, (uint64_t)(uintptr_t)pageable.data(), B, KVC_COPY_H2D) == KVC_OK, "sync H2D");
  std::vector<uint8_t> back(B);
  CHECK(kvc_dev_copy(0, (uint64_t)(uintptr_t)back.data(), A + 100, B - 100, KVC_COPY_D2H) == KVC_OK, "sync D2H at an offset");
  CHECK(memcmp(back.data(), pageable.data() + 100, B - 100) == 0, "sync round trip");
  CHECK(kvc_dev_copy(0, (uint64_t)(uintptr_t)back.data(), A + 100, B, KVC_COPY_D2H) == KVC_ERANGE, "sync past the end");

  // CUDA IPC: a second process opens A's handle, checks it, writes the first half.
  CHECK(kvc_dev_copy(0, A, (uint64_t)(uintptr_t)H, B, KVC_COPY_H2D) == KVC_OK, "seed 1 into A");
  std::string hex = Hex(h, sizeof h);
  std::string bytes = std::to_string(B);
  pid_t pid = fork();
  if (pid == 0) {
    execl("/proc/self/exe", argv[0], "--child", hex.c_str(), bytes.c_str(), (char*)nullptr);
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child process exit %d", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  CHECK(kvc_dev_copy(0, (uint64_t)(uintptr_t)back.data(), A, B, KVC_COPY_D2H) == KVC_OK, "read A after the child");
  size_t bad = 0;
  for (size_t i = 0; i < B; i++) bad += back[i] != (i < B / 2 ? Pattern(i, 2) : Pattern(i, 1));
  CHECK(bad == 0, "%zu bytes of A differ from what the child wrote", bad);

  CHECK(kvc_dev_free(A) == KVC_OK, "free A");
  CHECK(kvc_dev_copy(0, A, (uint64_t)(uintptr_t)pageable.data(), 16, KVC_COPY_H2D) == KVC_ERANGE, "freed memory refused");
  CHECK(kvc_dev_free(A) == KVC_EINVAL, "double free refused");
  kvc_dev_free(Bd);
  kvc_dev_host_free(H);
  kvc_dev_host_free(H2);
  kvc_dev_stream_destroy(stream);
  printf("%d passed, %d failed, 0 skipped\n", g_pass, g_fail);
  return g_fail == 0 ? 0 : 1;
}
