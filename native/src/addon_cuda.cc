/**
 * @file addon_cuda.cc
 * @brief The CUDA half of the N-API addon (built only with KVC_WITH_CUDA): `exports.cuda`, bindings
 *        of include/kvc_checksum_cuda.h.
 *
 *   cuda.deviceCount(): number                 devices the driver reports (0: none; see probeError)
 *   cuda.probeError(): string                  why deviceCount() found none ("" otherwise)
 *   cuda.versions(): {runtime, driver}         CUDA runtime built in, driver present (0: none)
 *   new cuda.Context(device, {slots, maxRows, maxOut, chunkBytes}?)
 *     .setTables(entries: Uint8Array, groupStart: Uint32Array,
 *                regionAddrs: BigUint64Array, regionBytes: BigUint64Array): void
 *     .submit(rows: Uint32Array, outLen: number, stream: bigint): bigint   ticket; never waits for the GPU
 *     .query(ticket: bigint): boolean          results in host memory?
 *     .wait(ticket: bigint): void              blocks on that submit's done event only
 *     .collect(ticket: bigint, out: BigUint64Array): void   waits, adds the results into out, frees the ticket
 *     .close(): void                           (also done by the garbage collector)
 *   cuda.devAlloc(device, bytes): bigint, cuda.devFree(device, addr), cuda.copyToDevice(device, addr, bytes),
 *   cuda.copyToHost(device, addr, out: Uint8Array)    device memory for tests and tools
 *   cuda.syncCallCount(): number               synchronizing CUDA calls made so far (kvc_cuda_sync_calls)
 *
 * Errors: TypeError for a wrong argument type, RangeError for KVC_EINVAL / KVC_ERANGE (bad tables,
 * rows, tickets; the message says which), Error for KVC_ECUDA / KVC_ENOCUDA. Built with
 * NAPI_DISABLE_CPP_EXCEPTIONS: nothing here throws C++ exceptions. Device addresses are not
 * dereferenced on the host; region extents are checked against the sizes given (as the CPU kernel
 * checks host regions), so the kernel reads only inside the regions the caller declared.
 */
#include "addon_cuda.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kvc_checksum_cuda.h"

namespace {

Napi::Value ThrowType(Napi::Env env, const std::string& msg) {
  if (!env.IsExceptionPending()) Napi::TypeError::New(env, msg).ThrowAsJavaScriptException();
  return env.Undefined();
}

Napi::Value ThrowRange(Napi::Env env, const std::string& msg) {
  if (!env.IsExceptionPending()) Napi::RangeError::New(env, msg).ThrowAsJavaScriptException();
  return env.Undefined();
}

Napi::Value ThrowError(Napi::Env env, const std::string& msg) {
  if (!env.IsExceptionPending()) Napi::Error::New(env, msg).ThrowAsJavaScriptException();
  return env.Undefined();
}

const char* CodeName(int rc) {
  switch (rc) {
    case KVC_EINVAL: return "KVC_EINVAL";
    case KVC_ERANGE: return "KVC_ERANGE";
    case KVC_ECUDA: return "KVC_ECUDA";
    case KVC_ENOCUDA: return "KVC_ENOCUDA";
    default: return "error";
  }
}

/** Throws the JS error matching a KVC_E* code. */
Napi::Value ThrowCode(Napi::Env env, const std::string& where, int rc, const char* detail) {
  std::string msg = where + ": " + (detail && *detail ? detail : "failed") + " (" + CodeName(rc) + ")";
  if (rc == KVC_EINVAL || rc == KVC_ERANGE) return ThrowRange(env, msg);
  return ThrowError(env, msg);
}

bool IsTypedArrayOf(napi_env env, napi_value v, napi_typedarray_type want) {
  bool is = false;
  if (napi_is_typedarray(env, v, &is) != napi_ok || !is) return false;
  napi_typedarray_type type;
  size_t length = 0;
  if (napi_get_typedarray_info(env, v, &type, &length, nullptr, nullptr, nullptr) != napi_ok) return false;
  return type == want;
}

/** Data pointer and element count of a typed array (runs no JS). */
bool TypedArrayData(napi_env env, napi_value v, void** data, size_t* length) {
  napi_typedarray_type type;
  napi_value ab;
  size_t off = 0;
  *data = nullptr;
  *length = 0;
  return napi_get_typedarray_info(env, v, &type, length, data, &ab, &off) == napi_ok;
}

/** A bigint in [0, 2^64) or a non-negative safe-integer number, as uint64. */
bool ToU64(const Napi::Value& v, uint64_t* out) {
  if (v.IsBigInt()) {
    bool lossless = false;
    *out = v.As<Napi::BigInt>().Uint64Value(&lossless);
    if (!lossless) return false;
    // Uint64Value wraps negatives: reject them
    int64_t sv = v.As<Napi::BigInt>().Int64Value(&lossless);
    return !(lossless && sv < 0);
  }
  if (v.IsNumber()) {
    double d = v.As<Napi::Number>().DoubleValue();
    if (!(d >= 0 && d <= 9007199254740991.0 && d == (double)(uint64_t)d)) return false;
    *out = (uint64_t)d;
    return true;
  }
  return false;
}

bool ToDevice(const Napi::Value& v, int* device) {
  if (!v.IsNumber()) return false;
  double d = v.As<Napi::Number>().DoubleValue();
  if (!(d >= 0 && d < 65536 && d == (double)(int)d)) return false;
  *device = (int)d;
  return true;
}

class Context : public Napi::ObjectWrap<Context> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "Context",
                       {InstanceMethod<&Context::SetTables>("setTables"), InstanceMethod<&Context::Submit>("submit"),
                        InstanceMethod<&Context::Query>("query"), InstanceMethod<&Context::Wait>("wait"),
                        InstanceMethod<&Context::Collect>("collect"), InstanceMethod<&Context::Close>("close"),
                        InstanceAccessor<&Context::Device>("device")});
  }

  explicit Context(const Napi::CallbackInfo& info) : Napi::ObjectWrap<Context>(info) {
    Napi::Env env = info.Env();
    int device = 0;
    if (info.Length() < 1 || !ToDevice(info[0], &device)) {
      ThrowType(env, "cuda.Context(device, options?): device must be an integer >= 0");
      return;
    }
    kvc_cuda_options o{};
    if (info.Length() >= 2 && !info[1].IsUndefined() && !info[1].IsNull()) {
      if (!info[1].IsObject()) {
        ThrowType(env, "cuda.Context: options must be an object");
        return;
      }
      Napi::Object opt = info[1].As<Napi::Object>();
      const char* names[4] = {"slots", "maxRows", "maxOut", "chunkBytes"};
      uint32_t* dst[4] = {&o.slots, &o.max_rows, &o.max_out, &o.chunk_bytes};
      for (int i = 0; i < 4; ++i) {
        Napi::Value v = opt.Get(names[i]);
        if (env.IsExceptionPending()) return;
        if (v.IsUndefined()) continue;
        uint64_t x = 0;
        if (!ToU64(v, &x) || x > UINT32_MAX) {
          ThrowType(env, std::string("cuda.Context: options.") + names[i] + " must be an integer in [0, 2^32)");
          return;
        }
        *dst[i] = (uint32_t)x;
      }
    }
    device_ = device;
    int rc = kvc_cuda_create(device, &o, &ctx_);
    if (rc != KVC_OK) {
      std::string why = rc == KVC_ENOCUDA ? std::string("no CUDA device ") + std::to_string(device) + ": " + kvc_cuda_probe_error()
                        : rc == KVC_EINVAL ? "bad options (slots <= 64, chunkBytes in [1024, 1 MiB])"
                                           : "CUDA runtime error while creating the context";
      ThrowCode(env, "cuda.Context", rc, why.c_str());
      ctx_ = nullptr;
    }
  }

  ~Context() override { kvc_cuda_destroy(ctx_); }

 private:
  kvc_cuda_ctx* ctx_ = nullptr;
  int device_ = 0;

  bool Alive(Napi::Env env, const char* what) {
    if (ctx_) return true;
    ThrowError(env, std::string("cuda.Context.") + what + ": the context is closed");
    return false;
  }

  Napi::Value Device(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), device_); }

  /** setTables(entries, groupStart, regionAddrs, regionBytes) */
  Napi::Value SetTables(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    napi_env e = env;
    if (!Alive(env, "setTables")) return env.Undefined();
    if (info.Length() < 4) return ThrowType(env, "setTables(entries, groupStart, regionAddrs, regionBytes): 4 arguments expected");
    if (!IsTypedArrayOf(e, info[0], napi_uint8_array)) return ThrowType(env, "setTables: entries must be a Uint8Array");
    if (!IsTypedArrayOf(e, info[1], napi_uint32_array)) return ThrowType(env, "setTables: groupStart must be a Uint32Array");
    if (!IsTypedArrayOf(e, info[2], napi_biguint64_array))
      return ThrowType(env, "setTables: regionAddrs must be a BigUint64Array");
    if (!IsTypedArrayOf(e, info[3], napi_biguint64_array))
      return ThrowType(env, "setTables: regionBytes must be a BigUint64Array");
    void *ep, *gp, *ap, *bp;
    size_t entries_len, gs_len, na, nb;
    if (!TypedArrayData(e, info[0], &ep, &entries_len) || !TypedArrayData(e, info[1], &gp, &gs_len) ||
        !TypedArrayData(e, info[2], &ap, &na) || !TypedArrayData(e, info[3], &bp, &nb))
      return ThrowType(env, "setTables: cannot read an argument's buffer");
    if (entries_len % sizeof(kvc_entry) != 0)
      return ThrowRange(env, "setTables: entries.byteLength (" + std::to_string(entries_len) + ") is not a multiple of " +
                                 std::to_string(sizeof(kvc_entry)));
    const size_t n_entries = entries_len / sizeof(kvc_entry);
    if (gs_len < 1 || gs_len - 1 > UINT32_MAX) return ThrowRange(env, "setTables: groupStart must hold n_groups + 1 values");
    const uint32_t* gs = static_cast<const uint32_t*>(gp);
    if (gs[0] != 0) return ThrowRange(env, "setTables: groupStart[0] must be 0");
    if (gs[gs_len - 1] != n_entries)
      return ThrowRange(env, "setTables: groupStart[n_groups] = " + std::to_string(gs[gs_len - 1]) + " but entries holds " +
                                 std::to_string(n_entries) + " entries");
    if (na != nb) return ThrowRange(env, "setTables: regionAddrs and regionBytes differ in length");
    if (na > UINT32_MAX) return ThrowRange(env, "setTables: too many regions");
    std::vector<kvc_entry> entries(n_entries);  // aligned copy
    if (n_entries) std::memcpy(entries.data(), ep, entries_len);
    kvc_tables t{entries.data(), gs, (uint32_t)(gs_len - 1)};
    int rc = kvc_cuda_set_tables(ctx_, &t, static_cast<const uint64_t*>(ap), static_cast<const uint64_t*>(bp), (uint32_t)na);
    if (rc != KVC_OK) return ThrowCode(env, "setTables", rc, kvc_cuda_last_error(ctx_));
    return env.Undefined();
  }

  /** submit(rows: Uint32Array, outLen: number, stream: bigint): bigint */
  Napi::Value Submit(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    napi_env e = env;
    if (!Alive(env, "submit")) return env.Undefined();
    if (info.Length() < 2) return ThrowType(env, "submit(rows, outLen, stream?): 2 or 3 arguments expected");
    if (!IsTypedArrayOf(e, info[0], napi_uint32_array)) return ThrowType(env, "submit: rows must be a Uint32Array");
    uint64_t out_len = 0, stream = 0;
    if (!ToU64(info[1], &out_len)) return ThrowType(env, "submit: outLen must be an integer >= 0");
    if (info.Length() >= 3 && !info[2].IsUndefined() && !ToU64(info[2], &stream))
      return ThrowType(env, "submit: stream must be a bigint (a cudaStream_t; 0n: the default stream)");
    void* rp;
    size_t rows_len;
    if (!TypedArrayData(e, info[0], &rp, &rows_len)) return ThrowType(env, "submit: cannot read rows");
    const size_t words = sizeof(kvc_row) / 4;
    if (rows_len % words != 0)
      return ThrowRange(env, "submit: rows.length (" + std::to_string(rows_len) + ") is not a multiple of " + std::to_string(words));
    uint64_t ticket = 0;
    int rc = kvc_cuda_submit(ctx_, static_cast<const kvc_row*>(rp), rows_len / words, (size_t)out_len,
                             reinterpret_cast<void*>((uintptr_t)stream), &ticket);
    if (rc != KVC_OK) return ThrowCode(env, "submit", rc, kvc_cuda_last_error(ctx_));
    return Napi::BigInt::New(env, ticket);
  }

  bool Ticket(const Napi::CallbackInfo& info, const char* what, uint64_t* ticket) {
    Napi::Env env = info.Env();
    if (!Alive(env, what)) return false;
    if (info.Length() < 1 || !info[0].IsBigInt() || !ToU64(info[0], ticket)) {
      ThrowType(env, std::string(what) + ": ticket must be the bigint submit() returned");
      return false;
    }
    return true;
  }

  Napi::Value Query(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    uint64_t t = 0;
    if (!Ticket(info, "query", &t)) return env.Undefined();
    int rc = kvc_cuda_query(ctx_, t);
    if (rc == KVC_OK || rc == KVC_CUDA_PENDING) return Napi::Boolean::New(env, rc == KVC_OK);
    return ThrowCode(env, "query", rc, kvc_cuda_last_error(ctx_));
  }

  Napi::Value Wait(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    uint64_t t = 0;
    if (!Ticket(info, "wait", &t)) return env.Undefined();
    int rc = kvc_cuda_wait(ctx_, t);
    if (rc != KVC_OK) return ThrowCode(env, "wait", rc, kvc_cuda_last_error(ctx_));
    return env.Undefined();
  }

  Napi::Value Collect(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    napi_env e = env;
    uint64_t t = 0;
    if (!Ticket(info, "collect", &t)) return env.Undefined();
    if (info.Length() < 2 || !IsTypedArrayOf(e, info[1], napi_biguint64_array))
      return ThrowType(env, "collect(ticket, out): out must be a BigUint64Array");
    void* op;
    size_t n;
    if (!TypedArrayData(e, info[1], &op, &n)) return ThrowType(env, "collect: cannot read out");
    int rc = kvc_cuda_collect(ctx_, t, static_cast<uint64_t*>(op), n);
    if (rc != KVC_OK) return ThrowCode(env, "collect", rc, kvc_cuda_last_error(ctx_));
    return env.Undefined();
  }

  Napi::Value Close(const Napi::CallbackInfo& info) {
    kvc_cuda_destroy(ctx_);
    ctx_ = nullptr;
    return info.Env().Undefined();
  }
};

Napi::Value DeviceCount(const Napi::CallbackInfo& info) {
  int n = 0;
  kvc_cuda_device_count(&n);
  return Napi::Number::New(info.Env(), n);
}

Napi::Value ProbeError(const Napi::CallbackInfo& info) {
  int n = 0;
  kvc_cuda_device_count(&n);
  return Napi::String::New(info.Env(), kvc_cuda_probe_error());
}

Napi::Value Versions(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int rv = 0, dv = 0;
  kvc_cuda_versions(&rv, &dv);
  Napi::Object o = Napi::Object::New(env);
  o.Set("runtime", Napi::Number::New(env, rv));
  o.Set("driver", Napi::Number::New(env, dv));
  if (env.IsExceptionPending()) return env.Undefined();
  return o;
}

Napi::Value DevAlloc(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int device = 0;
  uint64_t bytes = 0;
  if (info.Length() < 2 || !ToDevice(info[0], &device) || !ToU64(info[1], &bytes))
    return ThrowType(env, "devAlloc(device, bytes): a device index and a byte count");
  uint64_t addr = 0;
  int rc = kvc_cuda_dev_alloc(device, (size_t)bytes, &addr);
  if (rc != KVC_OK) return ThrowCode(env, "devAlloc", rc, "cudaMalloc failed");
  return Napi::BigInt::New(env, addr);
}

Napi::Value DevFree(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int device = 0;
  uint64_t addr = 0;
  if (info.Length() < 2 || !ToDevice(info[0], &device) || !info[1].IsBigInt() || !ToU64(info[1], &addr))
    return ThrowType(env, "devFree(device, addr): a device index and a bigint address");
  int rc = kvc_cuda_dev_free(device, addr);
  if (rc != KVC_OK) return ThrowCode(env, "devFree", rc, "cudaFree failed");
  return env.Undefined();
}

/** copyToDevice(device, addr, src: Uint8Array) / copyToHost(device, addr, dst: Uint8Array) */
Napi::Value Copy(const Napi::CallbackInfo& info, bool to_device) {
  Napi::Env env = info.Env();
  napi_env e = env;
  const char* name = to_device ? "copyToDevice" : "copyToHost";
  int device = 0;
  uint64_t addr = 0;
  if (info.Length() < 3 || !ToDevice(info[0], &device) || !info[1].IsBigInt() || !ToU64(info[1], &addr) ||
      !IsTypedArrayOf(e, info[2], napi_uint8_array))
    return ThrowType(env, std::string(name) + "(device, addr: bigint, bytes: Uint8Array)");
  void* p;
  size_t n;
  if (!TypedArrayData(e, info[2], &p, &n)) return ThrowType(env, std::string(name) + ": cannot read the buffer");
  int rc = to_device ? kvc_cuda_copy_to_device(device, addr, p, n) : kvc_cuda_copy_to_host(device, p, addr, n);
  if (rc != KVC_OK) return ThrowCode(env, name, rc, "cudaMemcpy failed");
  return env.Undefined();
}

/** syncCallCount(): number of synchronizing CUDA calls made so far (kvc_cuda_sync_calls). */
Napi::Value SyncCallCount(const Napi::CallbackInfo& info) {
  return Napi::Number::New(info.Env(), (double)kvc_cuda_sync_calls());
}

Napi::Value CopyToDevice(const Napi::CallbackInfo& info) { return Copy(info, true); }
Napi::Value CopyToHost(const Napi::CallbackInfo& info) { return Copy(info, false); }

}  // namespace

void KvcRegisterCuda(Napi::Env env, Napi::Object exports) {
  Napi::Object cuda = Napi::Object::New(env);
  if (env.IsExceptionPending()) return;
  cuda.Set("deviceCount", Napi::Function::New(env, DeviceCount, "deviceCount"));
  cuda.Set("probeError", Napi::Function::New(env, ProbeError, "probeError"));
  cuda.Set("versions", Napi::Function::New(env, Versions, "versions"));
  cuda.Set("Context", Context::Define(env));
  cuda.Set("devAlloc", Napi::Function::New(env, DevAlloc, "devAlloc"));
  cuda.Set("devFree", Napi::Function::New(env, DevFree, "devFree"));
  cuda.Set("copyToDevice", Napi::Function::New(env, CopyToDevice, "copyToDevice"));
  cuda.Set("copyToHost", Napi::Function::New(env, CopyToHost, "copyToHost"));
  cuda.Set("syncCallCount", Napi::Function::New(env, SyncCallCount, "syncCallCount"));
  if (env.IsExceptionPending()) return;
  exports.Set("cuda", cuda);
}
