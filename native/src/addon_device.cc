/**
 * @file addon_device.cc
 * @brief `exports.device` of the N-API addon (built only with KVC_WITH_CUDA): bindings of
 *        include/kvc_device.h for the transfer agents' device regions and the engine's device mode.
 *
 *   device.alloc(device, bytes): {address: bigint, ipcHandle: Uint8Array(64)}   cudaMalloc + IPC handle
 *   device.free(address: bigint)
 *   device.ipcOpen(device, handle: Uint8Array(64), bytes): bigint               mapping of a peer's allocation
 *   device.ipcClose(address: bigint)
 *   device.adopt(device, address, bytes) / device.unadopt(address)             memory allocated elsewhere
 *   device.hostAlloc(bytes): Uint8Array                                        pinned (cudaHostAlloc); freed by the GC
 *   device.streamCreate(device): bigint / device.streamDestroy(stream)
 *   device.copyAsync(device, kind, dst, src, bytes, stream): DeviceCopy
 *       kind 'h2d' (dst bigint, src pinned Uint8Array), 'd2h' (dst pinned Uint8Array, src bigint),
 *       'd2d' (both bigint); the copy and then an event are enqueued on `stream` (0n: default).
 *     DeviceCopy.done(): boolean   cudaEventQuery: never blocks; throws if the copy failed
 *     DeviceCopy.wait(): void      blocks until the copy finished
 *     DeviceCopy.release(): void   (also done by the GC); the host buffer is referenced until then
 *   device.copy(device, kind, dst, src, bytes): void   synchronous; host side any Uint8Array
 *
 * Host buffers are given as Uint8Arrays and device memory as bigint addresses. Errors: TypeError
 * for a wrong argument type, RangeError for KVC_EINVAL / KVC_ERANGE (a range outside known memory:
 * include/kvc_device.h keeps the table), Error for KVC_ECUDA / KVC_ENOCUDA; the message carries
 * kvc_dev_last_error(). Built with NAPI_DISABLE_CPP_EXCEPTIONS: nothing here throws C++ exceptions.
 */
#include "addon_device.h"

#include <cstdint>
#include <cstring>
#include <string>

#include "kvc_checksum.h"
#include "kvc_device.h"

namespace {

Napi::Value Throw(Napi::Env env, int rc, const std::string& where) {
  if (env.IsExceptionPending()) return env.Undefined();
  const char* why = kvc_dev_last_error();
  std::string msg = "device." + where + ": " + (why && *why ? why : "failed");
  if (rc == KVC_EINVAL || rc == KVC_ERANGE) Napi::RangeError::New(env, msg).ThrowAsJavaScriptException();
  else Napi::Error::New(env, msg + (rc == KVC_ENOCUDA ? " (KVC_ENOCUDA)" : " (KVC_ECUDA)")).ThrowAsJavaScriptException();
  return env.Undefined();
}

Napi::Value ThrowType(Napi::Env env, const std::string& msg) {
  if (!env.IsExceptionPending()) Napi::TypeError::New(env, "device." + msg).ThrowAsJavaScriptException();
  return env.Undefined();
}

bool ToU64(const Napi::Value& v, uint64_t* out) {
  if (v.IsBigInt()) {
    bool lossless = false;
    int64_t sv = v.As<Napi::BigInt>().Int64Value(&lossless);
    if (lossless && sv < 0) return false;
    *out = v.As<Napi::BigInt>().Uint64Value(&lossless);
    return lossless;
  }
  if (v.IsNumber()) {
    double d = v.As<Napi::Number>().DoubleValue();
    if (!(d >= 0 && d <= 9007199254740991.0 && d == (double)(uint64_t)d)) return false;
    *out = (uint64_t)d;
    return true;
  }
  return false;
}

bool ToAddr(const Napi::Value& v, uint64_t* out) { return v.IsBigInt() && ToU64(v, out); }

bool ToDevice(const Napi::Value& v, int* device) {
  if (!v.IsNumber()) return false;
  double d = v.As<Napi::Number>().DoubleValue();
  if (!(d >= 0 && d < 65536 && d == (double)(int)d)) return false;
  *device = (int)d;
  return true;
}

/** The bytes of a Uint8Array (no JS runs). */
bool U8(const Napi::Value& v, uint8_t** data, size_t* len) {
  if (!v.IsTypedArray() || v.As<Napi::TypedArray>().TypedArrayType() != napi_uint8_array) return false;
  Napi::Uint8Array a = v.As<Napi::Uint8Array>();
  *data = a.Data();
  *len = a.ByteLength();
  return true;
}

/** 'h2d' | 'd2h' | 'd2d' -> KVC_COPY_*, 0 otherwise. */
int Kind(const Napi::Value& v) {
  if (!v.IsString()) return 0;
  std::string s = v.As<Napi::String>().Utf8Value();
  return s == "h2d" ? KVC_COPY_H2D : s == "d2h" ? KVC_COPY_D2H : s == "d2d" ? KVC_COPY_D2D : 0;
}

/**
 * Reads (device, kind, dst, src, bytes) of copy / copyAsync: device sides as bigint addresses,
 * host sides as Uint8Arrays whose [0, bytes) is used (bytes <= their length). `host` gets the
 * Uint8Array argument (to keep it referenced).
 */
bool CopyArgs(const Napi::CallbackInfo& info, const char* name, int* device, int* kind, uint64_t* dst, uint64_t* src,
              uint64_t* bytes, Napi::Value* host) {
  Napi::Env env = info.Env();
  std::string usage = std::string(name) + "(device, kind 'h2d'|'d2h'|'d2d', dst, src, bytes" +
                      (std::strcmp(name, "copyAsync") == 0 ? ", stream)" : ")");
  if (info.Length() < 5 || !ToDevice(info[0], device) || !(*kind = Kind(info[1])) || !ToU64(info[4], bytes)) {
    ThrowType(env, usage);
    return false;
  }
  for (int side = 0; side < 2; side++) {  // 0: dst, 1: src
    const Napi::Value& v = info[2 + side];
    const bool is_host = side == 0 ? *kind == KVC_COPY_D2H : *kind == KVC_COPY_H2D;
    uint64_t* out = side == 0 ? dst : src;
    if (is_host) {
      uint8_t* p;
      size_t n;
      if (!U8(v, &p, &n)) {
        ThrowType(env, usage + ": the host side must be a Uint8Array");
        return false;
      }
      if (*bytes > n) {
        Napi::RangeError::New(env, "device." + std::string(name) + ": bytes exceeds the host buffer").ThrowAsJavaScriptException();
        return false;
      }
      *out = (uint64_t)(uintptr_t)p;
      *host = v;
    } else if (!ToAddr(v, out)) {
      ThrowType(env, usage + ": device sides are bigint addresses");
      return false;
    }
  }
  return true;
}

/** One enqueued copy: its event, and a reference to its host buffer until released. */
class DeviceCopy : public Napi::ObjectWrap<DeviceCopy> {
 public:
  static Napi::FunctionReference* ctor;
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "DeviceCopy",
                       {InstanceMethod<&DeviceCopy::Done>("done"), InstanceMethod<&DeviceCopy::Wait>("wait"),
                        InstanceMethod<&DeviceCopy::Release>("release")});
  }
  explicit DeviceCopy(const Napi::CallbackInfo& info) : Napi::ObjectWrap<DeviceCopy>(info) {}
  ~DeviceCopy() override { Drop(); }

  void Init(uint64_t event, Napi::Value host) {
    event_ = event;
    if (!host.IsEmpty() && !host.IsUndefined()) host_ = Napi::Persistent(host.As<Napi::Object>());
  }

 private:
  uint64_t event_ = 0;
  bool finished_ = false;
  Napi::ObjectReference host_;

  void Drop() {
    if (event_) kvc_dev_event_release(event_);
    event_ = 0;
    if (!host_.IsEmpty()) host_.Reset();
  }

  Napi::Value Done(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (finished_) return Napi::Boolean::New(env, true);
    if (!event_) return Throw(env, KVC_EINVAL, "DeviceCopy.done: released");
    int rc = kvc_dev_event_query(event_);
    if (rc == KVC_CUDA_PENDING) return Napi::Boolean::New(env, false);
    if (rc != KVC_OK) return Throw(env, rc, "DeviceCopy.done");
    finished_ = true;
    Drop();
    return Napi::Boolean::New(env, true);
  }

  Napi::Value Wait(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (finished_) return env.Undefined();
    if (!event_) return Throw(env, KVC_EINVAL, "DeviceCopy.wait: released");
    int rc = kvc_dev_event_wait(event_);
    if (rc != KVC_OK) return Throw(env, rc, "DeviceCopy.wait");
    finished_ = true;
    Drop();
    return env.Undefined();
  }

  Napi::Value Release(const Napi::CallbackInfo& info) {
    Drop();
    return info.Env().Undefined();
  }
};

Napi::FunctionReference* DeviceCopy::ctor = nullptr;

Napi::Value Alloc(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int device = 0;
  uint64_t bytes = 0;
  if (info.Length() < 2 || !ToDevice(info[0], &device) || !ToU64(info[1], &bytes) || bytes == 0)
    return ThrowType(env, "alloc(device, bytes): a device index and a byte count > 0");
  uint64_t addr = 0;
  Napi::Uint8Array handle = Napi::Uint8Array::New(env, KVC_IPC_HANDLE_BYTES);
  if (env.IsExceptionPending()) return env.Undefined();
  int rc = kvc_dev_alloc(device, (size_t)bytes, &addr, handle.Data());
  if (rc != KVC_OK) return Throw(env, rc, "alloc");
  Napi::Object o = Napi::Object::New(env);
  o.Set("address", Napi::BigInt::New(env, addr));
  o.Set("ipcHandle", handle);
  return o;
}

Napi::Value Free(const Napi::CallbackInfo& info) {
  uint64_t addr = 0;
  if (info.Length() < 1 || !ToAddr(info[0], &addr)) return ThrowType(info.Env(), "free(address: bigint)");
  int rc = kvc_dev_free(addr);
  return rc == KVC_OK ? info.Env().Undefined() : Throw(info.Env(), rc, "free");
}

Napi::Value IpcOpen(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int device = 0;
  uint8_t* h;
  size_t n;
  uint64_t bytes = 0;
  if (info.Length() < 3 || !ToDevice(info[0], &device) || !U8(info[1], &h, &n) || n != KVC_IPC_HANDLE_BYTES || !ToU64(info[2], &bytes))
    return ThrowType(env, "ipcOpen(device, handle: Uint8Array(64), bytes)");
  uint64_t addr = 0;
  int rc = kvc_dev_ipc_open(device, h, (size_t)bytes, &addr);
  return rc == KVC_OK ? Napi::BigInt::New(env, addr) : Throw(env, rc, "ipcOpen");
}

Napi::Value IpcClose(const Napi::CallbackInfo& info) {
  uint64_t addr = 0;
  if (info.Length() < 1 || !ToAddr(info[0], &addr)) return ThrowType(info.Env(), "ipcClose(address: bigint)");
  int rc = kvc_dev_ipc_close(addr);
  return rc == KVC_OK ? info.Env().Undefined() : Throw(info.Env(), rc, "ipcClose");
}

Napi::Value Adopt(const Napi::CallbackInfo& info) {
  int device = 0;
  uint64_t addr = 0, bytes = 0;
  if (info.Length() < 3 || !ToDevice(info[0], &device) || !ToAddr(info[1], &addr) || !ToU64(info[2], &bytes))
    return ThrowType(info.Env(), "adopt(device, address: bigint, bytes)");
  int rc = kvc_dev_adopt(device, addr, (size_t)bytes);
  return rc == KVC_OK ? info.Env().Undefined() : Throw(info.Env(), rc, "adopt");
}

Napi::Value Unadopt(const Napi::CallbackInfo& info) {
  uint64_t addr = 0;
  if (info.Length() < 1 || !ToAddr(info[0], &addr)) return ThrowType(info.Env(), "unadopt(address: bigint)");
  int rc = kvc_dev_unadopt(addr);
  return rc == KVC_OK ? info.Env().Undefined() : Throw(info.Env(), rc, "unadopt");
}

void FreePinned(napi_env, void* data, void*) { kvc_dev_host_free(data); }

Napi::Value HostAlloc(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  uint64_t bytes = 0;
  if (info.Length() < 1 || !ToU64(info[0], &bytes) || bytes == 0) return ThrowType(env, "hostAlloc(bytes > 0)");
  void* p = nullptr;
  int rc = kvc_dev_host_alloc((size_t)bytes, &p);
  if (rc != KVC_OK) return Throw(env, rc, "hostAlloc");
  napi_value ab;
  if (napi_create_external_arraybuffer(env, p, (size_t)bytes, FreePinned, nullptr, &ab) != napi_ok) {
    kvc_dev_host_free(p);
    if (!env.IsExceptionPending()) Napi::Error::New(env, "device.hostAlloc: external ArrayBuffers are not supported here").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  return Napi::Uint8Array::New(env, (size_t)bytes, Napi::ArrayBuffer(env, ab), 0);
}

Napi::Value StreamCreate(const Napi::CallbackInfo& info) {
  int device = 0;
  if (info.Length() < 1 || !ToDevice(info[0], &device)) return ThrowType(info.Env(), "streamCreate(device)");
  uint64_t s = 0;
  int rc = kvc_dev_stream_create(device, &s);
  return rc == KVC_OK ? Napi::BigInt::New(info.Env(), s) : Throw(info.Env(), rc, "streamCreate");
}

Napi::Value StreamDestroy(const Napi::CallbackInfo& info) {
  uint64_t s = 0;
  if (info.Length() < 1 || !ToAddr(info[0], &s)) return ThrowType(info.Env(), "streamDestroy(stream: bigint)");
  int rc = kvc_dev_stream_destroy(s);
  return rc == KVC_OK ? info.Env().Undefined() : Throw(info.Env(), rc, "streamDestroy");
}

Napi::Value CopyAsync(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int device = 0, kind = 0;
  uint64_t dst = 0, src = 0, bytes = 0, stream = 0;
  Napi::Value host;
  if (!CopyArgs(info, "copyAsync", &device, &kind, &dst, &src, &bytes, &host)) return env.Undefined();
  if (info.Length() >= 6 && !info[5].IsUndefined() && !ToAddr(info[5], &stream)) return ThrowType(env, "copyAsync: stream must be a bigint");
  Napi::Object obj = DeviceCopy::ctor->New({});
  if (env.IsExceptionPending()) return env.Undefined();
  uint64_t ev = 0;
  int rc = kvc_dev_copy_async(device, dst, src, (size_t)bytes, kind, stream, &ev);
  if (rc != KVC_OK) return Throw(env, rc, "copyAsync");
  DeviceCopy::Unwrap(obj)->Init(ev, host);
  return obj;
}

Napi::Value Copy(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int device = 0, kind = 0;
  uint64_t dst = 0, src = 0, bytes = 0;
  Napi::Value host;
  if (!CopyArgs(info, "copy", &device, &kind, &dst, &src, &bytes, &host)) return env.Undefined();
  int rc = kvc_dev_copy(device, dst, src, (size_t)bytes, kind);
  return rc == KVC_OK ? env.Undefined() : Throw(env, rc, "copy");
}

}  // namespace

void KvcRegisterDevice(Napi::Env env, Napi::Object exports) {
  Napi::Object d = Napi::Object::New(env);
  if (env.IsExceptionPending()) return;
  Napi::Function copyCtor = DeviceCopy::Define(env);
  DeviceCopy::ctor = new Napi::FunctionReference(Napi::Persistent(copyCtor));  // lives as long as the process
  d.Set("alloc", Napi::Function::New(env, Alloc, "alloc"));
  d.Set("free", Napi::Function::New(env, Free, "free"));
  d.Set("ipcOpen", Napi::Function::New(env, IpcOpen, "ipcOpen"));
  d.Set("ipcClose", Napi::Function::New(env, IpcClose, "ipcClose"));
  d.Set("adopt", Napi::Function::New(env, Adopt, "adopt"));
  d.Set("unadopt", Napi::Function::New(env, Unadopt, "unadopt"));
  d.Set("hostAlloc", Napi::Function::New(env, HostAlloc, "hostAlloc"));
  d.Set("streamCreate", Napi::Function::New(env, StreamCreate, "streamCreate"));
  d.Set("streamDestroy", Napi::Function::New(env, StreamDestroy, "streamDestroy"));
  d.Set("copyAsync", Napi::Function::New(env, CopyAsync, "copyAsync"));
  d.Set("copy", Napi::Function::New(env, Copy, "copy"));
  d.Set("ipcHandleBytes", Napi::Number::New(env, KVC_IPC_HANDLE_BYTES));
  if (env.IsExceptionPending()) return;
  exports.Set("device", d);
}
