// The addon's `shm` bindings: host memory in named shared mappings, for the embedded transfer
// agent's same-host data plane (packages/transfer/src/shared-memory.ts).
//
// alloc(bytes) makes a memfd (memfd_create(2), name `kvc-<32 hex>`) of HEADER + bytes, maps it
// MAP_SHARED and returns an external ArrayBuffer over the `bytes` after the header page. The
// header page holds one uint32 grant word at offset 0 that the owner sets (setGrant) while some
// registration grants peers the mapping, and clears when none does; peers read it before every
// copy. lookup(view) says which of this process's mappings holds a view (fd, name, size, offset
// of the view from the mapping's start). map(path, bytes, name) opens another process's mapping
// through /proc/<pid>/fd/<n>, checks that what opened is a memfd of exactly that name
// (readlink of /proc/self/fd/<fd> is "/memfd:<name> (deleted)"), sealed against shrinking
// (F_SEAL_SHRINK: alloc seals its memfds at their size, so that no owner can truncate one under a
// peer's mapping and make the peer's next copy fault) and exactly `bytes` long (fstat), and maps
// all of it MAP_SHARED (header included) as an external ArrayBuffer.
// Mappings are unmapped when their ArrayBuffer is garbage collected.
//
// Errors: TypeError / RangeError for bad arguments; Error with numeric `status` (errno) and
// `backend: "shm"` when a system call fails.
#include <napi.h>

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "addon_shm.h"

namespace {

constexpr size_t kHeader = 4096;

struct Mapping {
  uint8_t* base;
  size_t size;  // header + bytes
  int fd;
  std::string name;
};

// This process's own mappings, by base address (the allocator's table; guarded by mu).
std::mutex mu;
std::map<uintptr_t, Mapping> own;

Napi::Value SysError(Napi::Env env, const std::string& what, int err) {
  Napi::Error e = Napi::Error::New(env, "shm." + what + ": " + strerror(err));
  e.Set("status", Napi::Number::New(env, err));
  e.Set("backend", Napi::String::New(env, "shm"));
  e.ThrowAsJavaScriptException();
  return env.Undefined();
}

bool ToSize(const Napi::Value& v, size_t* out) {
  if (!v.IsNumber()) return false;
  double d = v.As<Napi::Number>().DoubleValue();
  if (!(d >= 1 && d <= 9007199254740991.0 && d == (double)(uint64_t)d)) return false;
  *out = (size_t)d;
  return true;
}

bool ValidName(const std::string& n) {
  if (n.size() != 36 || n.compare(0, 4, "kvc-") != 0) return false;
  for (size_t i = 4; i < n.size(); ++i) {
    char c = n[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

void FreeOwn(napi_env, void*, void* hint) {
  uintptr_t base = (uintptr_t)hint;
  std::lock_guard<std::mutex> lk(mu);
  auto it = own.find(base);
  if (it == own.end()) return;
  munmap(it->second.base, it->second.size);
  close(it->second.fd);
  own.erase(it);
}

void FreeMapped(napi_env, void* data, void* hint) { munmap(data, (size_t)(uintptr_t)hint); }

Napi::Value Alloc(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  size_t bytes;
  if (!ToSize(info[0], &bytes) || bytes > (size_t)1 << 46) {
    Napi::RangeError::New(env, "shm.alloc: bytes must be a positive safe integer").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  unsigned char rnd[16];
  if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) return SysError(env, "alloc: getrandom", errno);
  static const char* hex = "0123456789abcdef";
  std::string name = "kvc-";
  for (unsigned char b : rnd) {
    name += hex[b >> 4];
    name += hex[b & 15];
  }
  int fd = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return SysError(env, "alloc: memfd_create", errno);
  size_t size = kHeader + bytes;
  // Sealed at its size: a mapping of it can never lose pages under a peer (no SIGBUS).
  if (ftruncate(fd, (off_t)size) != 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    int err = errno;
    close(fd);
    return SysError(env, "alloc: ftruncate/seal", err);
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int err = errno;
    close(fd);
    return SysError(env, "alloc: mmap", err);
  }
  uint8_t* base = (uint8_t*)p;
  {
    std::lock_guard<std::mutex> lk(mu);
    own[(uintptr_t)base] = Mapping{base, size, fd, name};
  }
  napi_value ab;
  napi_status s = napi_create_external_arraybuffer(env, base + kHeader, bytes, FreeOwn, (void*)(uintptr_t)base, &ab);
  if (s != napi_ok) {
    FreeOwn(env, nullptr, (void*)(uintptr_t)base);
    Napi::Error::New(env, "shm.alloc: external ArrayBuffers are not supported by this runtime").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  return Napi::Value(env, ab);
}

/** Data pointer and length of an ArrayBuffer or view. */
bool Bytes(napi_env env, napi_value v, uint8_t** data, size_t* len) {
  bool is = false;
  if (napi_is_arraybuffer(env, v, &is) == napi_ok && is) return napi_get_arraybuffer_info(env, v, (void**)data, len) == napi_ok;
  if (napi_is_typedarray(env, v, &is) == napi_ok && is) {
    napi_typedarray_type t;
    size_t n = 0, off = 0;
    napi_value ab;
    if (napi_get_typedarray_info(env, v, &t, &n, (void**)data, &ab, &off) != napi_ok) return false;
    size_t el = 1;
    switch (t) {
      case napi_int16_array: case napi_uint16_array: el = 2; break;
      case napi_int32_array: case napi_uint32_array: case napi_float32_array: el = 4; break;
      case napi_float64_array: case napi_bigint64_array: case napi_biguint64_array: el = 8; break;
      default: el = 1;
    }
    *len = n * el;
    return true;
  }
  if (napi_is_dataview(env, v, &is) == napi_ok && is) {
    napi_value ab;
    size_t off = 0;
    return napi_get_dataview_info(env, v, len, (void**)data, &ab, &off) == napi_ok;
  }
  return false;
}

/** The own mapping holding [p, p + len) in its data part, or null (call with mu held). */
const Mapping* Find(uint8_t* p, size_t len) {
  auto it = own.upper_bound((uintptr_t)p);
  if (it == own.begin()) return nullptr;
  --it;
  const Mapping& m = it->second;
  if (p < m.base + kHeader || p + len > m.base + m.size) return nullptr;
  return &m;
}

Napi::Value Lookup(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  uint8_t* p = nullptr;
  size_t len = 0;
  if (!Bytes(env, info[0], &p, &len)) {
    Napi::TypeError::New(env, "shm.lookup: expected an ArrayBuffer or a view").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  std::lock_guard<std::mutex> lk(mu);
  const Mapping* m = p ? Find(p, len) : nullptr;
  if (!m) return env.Null();
  Napi::Object o = Napi::Object::New(env);
  o.Set("fd", Napi::Number::New(env, m->fd));
  o.Set("name", Napi::String::New(env, m->name));
  o.Set("size", Napi::Number::New(env, (double)m->size));
  o.Set("offset", Napi::Number::New(env, (double)(p - m->base)));
  return o;
}

Napi::Value SetGrant(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  uint8_t* p = nullptr;
  size_t len = 0;
  if (!Bytes(env, info[0], &p, &len) || !info[1].IsNumber()) {
    Napi::TypeError::New(env, "shm.setGrant: expected a view of a shared mapping and a uint32").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  uint32_t v = info[1].As<Napi::Number>().Uint32Value();
  std::lock_guard<std::mutex> lk(mu);
  const Mapping* m = p ? Find(p, len) : nullptr;
  if (!m) {
    Napi::RangeError::New(env, "shm.setGrant: not a view of a shared mapping of this process").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  __atomic_store_n((uint32_t*)m->base, v, __ATOMIC_SEQ_CST);
  return env.Undefined();
}

Napi::Value Map(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  size_t bytes;
  if (!info[0].IsString() || !ToSize(info[1], &bytes) || bytes <= kHeader || !info[2].IsString()) {
    Napi::TypeError::New(env, "shm.map: expected (path, bytes > 4096, name)").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  std::string path = info[0].As<Napi::String>().Utf8Value();
  std::string name = info[2].As<Napi::String>().Utf8Value();
  if (!ValidName(name)) {
    Napi::RangeError::New(env, "shm.map: not a kvconnect mapping name").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return SysError(env, "map: open " + path, errno);
  // What opened must be that memfd, not a file the peer named.
  char link[64];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  char target[256];
  ssize_t n = readlink(link, target, sizeof target - 1);
  std::string want = "/memfd:" + name + " (deleted)";
  if (n < 0 || (size_t)n != want.size() || memcmp(target, want.data(), want.size()) != 0) {
    close(fd);
    Napi::RangeError::New(env, "shm.map: " + path + " is not the memfd " + name).ThrowAsJavaScriptException();
    return env.Undefined();
  }
  // Only a memfd sealed against shrinking: else its owner could truncate it under our mapping
  // and the next copy would fault (SIGBUS) in this process.
  int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
    close(fd);
    Napi::RangeError::New(env, "shm.map: " + name + " is not sealed against shrinking").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    return SysError(env, "map: fstat", err);
  }
  if ((uint64_t)st.st_size != (uint64_t)bytes) {
    close(fd);
    Napi::RangeError::New(env, "shm.map: " + name + " is " + std::to_string((long long)st.st_size) + " bytes, not " + std::to_string(bytes)).ThrowAsJavaScriptException();
    return env.Undefined();
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  close(fd);
  if (p == MAP_FAILED) return SysError(env, "map: mmap", err);
  napi_value ab;
  if (napi_create_external_arraybuffer(env, p, bytes, FreeMapped, (void*)(uintptr_t)bytes, &ab) != napi_ok) {
    munmap(p, bytes);
    Napi::Error::New(env, "shm.map: external ArrayBuffers are not supported by this runtime").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  return Napi::Value(env, ab);
}

}  // namespace

void KvcRegisterShm(Napi::Env env, Napi::Object exports) {
  Napi::Object s = Napi::Object::New(env);
  s.Set("alloc", Napi::Function::New(env, Alloc, "alloc"));
  s.Set("lookup", Napi::Function::New(env, Lookup, "lookup"));
  s.Set("setGrant", Napi::Function::New(env, SetGrant, "setGrant"));
  s.Set("map", Napi::Function::New(env, Map, "map"));
  s.Set("headerBytes", Napi::Number::New(env, (double)kHeader));
  exports.Set("shm", s);
}
