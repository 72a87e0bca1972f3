/**
 * @file addon.cc
 * @brief N-API addon over the checksum C ABI (include/kvc_checksum.h): `sumRows`, `entryExtent`,
 *        the benchmark baselines `plainSum64` / `weightedSum64`, and constants.
 *
 * Built with NAPI_DISABLE_CPP_EXCEPTIONS: every Napi call is checked, and a bad argument throws a
 * JS TypeError (wrong type) or RangeError (wrong size, index or table contents); nothing here can
 * crash the process or touch memory outside the arguments.
 *
 * Argument handling happens in two phases. Phase 1 checks types and may run JS (array element
 * getters, the SharedArrayBuffer check, wrapping a SharedArrayBuffer in a Uint8Array); phase 2
 * takes raw data pointers, which runs no JS, so no JS can detach or shrink a buffer between
 * taking its pointer and the kernel reading it. The kernel itself runs synchronously.
 */
#include <napi.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kvc_checksum.h"
#include "nixl_addon.h"
#include "mooncake_addon.h"
#ifdef __linux__
#include "addon_shm.h"
#endif
#include "forward_addon.h"
#ifdef KVC_WITH_CUDA
#include "addon_cuda.h"
#include "addon_device.h"
#endif

namespace {

/** Throws a JS TypeError (unless an exception is already pending) and returns undefined. */
Napi::Value ThrowType(Napi::Env env, const std::string& msg) {
  if (!env.IsExceptionPending()) Napi::TypeError::New(env, msg).ThrowAsJavaScriptException();
  return env.Undefined();
}

/** Throws a JS RangeError (unless an exception is already pending) and returns undefined. */
Napi::Value ThrowRange(Napi::Env env, const std::string& msg) {
  if (!env.IsExceptionPending()) Napi::RangeError::New(env, msg).ThrowAsJavaScriptException();
  return env.Undefined();
}

/** A typed array of the given type (phase 1 check only; no pointer taken). */
bool IsTypedArrayOf(napi_env env, napi_value v, napi_typedarray_type want) {
  bool is = false;
  if (napi_is_typedarray(env, v, &is) != napi_ok || !is) return false;
  napi_typedarray_type type;
  size_t length = 0;
  if (napi_get_typedarray_info(env, v, &type, &length, nullptr, nullptr, nullptr) != napi_ok) return false;
  return type == want;
}

/** The data pointer and element count of a typed array (phase 2: runs no JS). */
bool TypedArrayData(napi_env env, napi_value v, void** data, size_t* length) {
  napi_typedarray_type type;
  napi_value ab;
  size_t off = 0;
  *data = nullptr;
  *length = 0;
  return napi_get_typedarray_info(env, v, &type, length, data, &ab, &off) == napi_ok;
}

/**
 * Phase 1 for a byte source (any TypedArray, DataView, ArrayBuffer or SharedArrayBuffer):
 * returns a value whose bytes phase 2 can take (a SharedArrayBuffer becomes a Uint8Array over it),
 * or nullptr with a pending TypeError.
 */
napi_value ByteSource(napi_env env, napi_value v, const std::string& what) {
  bool is = false;
  if ((napi_is_typedarray(env, v, &is) == napi_ok && is) || (napi_is_dataview(env, v, &is) == napi_ok && is) ||
      (napi_is_arraybuffer(env, v, &is) == napi_ok && is))
    return v;
  // Node-API 8 has no SharedArrayBuffer test: use instanceof, then view it as a Uint8Array.
  napi_value global, sab_ctor, u8_ctor;
  napi_valuetype t;
  if (napi_typeof(env, v, &t) == napi_ok && t == napi_object && napi_get_global(env, &global) == napi_ok &&
      napi_get_named_property(env, global, "SharedArrayBuffer", &sab_ctor) == napi_ok &&
      napi_typeof(env, sab_ctor, &t) == napi_ok && t == napi_function &&
      napi_instanceof(env, v, sab_ctor, &is) == napi_ok && is &&
      napi_get_named_property(env, global, "Uint8Array", &u8_ctor) == napi_ok) {
    napi_value view;
    if (napi_new_instance(env, u8_ctor, 1, &v, &view) == napi_ok && IsTypedArrayOf(env, view, napi_uint8_array))
      return view;
  }
  ThrowType(Napi::Env(env), what + " must be a TypedArray, DataView, ArrayBuffer or SharedArrayBuffer");
  return nullptr;
}

/** Phase 2 for a value returned by ByteSource: its bytes. Runs no JS. */
bool ByteData(napi_env env, napi_value v, const uint8_t** data, size_t* len) {
  bool is = false;
  void* p = nullptr;
  *data = nullptr;
  *len = 0;
  if (napi_is_typedarray(env, v, &is) == napi_ok && is) {
    napi_typedarray_type type;
    size_t n = 0, off = 0;
    napi_value ab;
    if (napi_get_typedarray_info(env, v, &type, &n, &p, &ab, &off) != napi_ok) return false;
    size_t w = 1;
    switch (type) {
      case napi_int16_array: case napi_uint16_array: w = 2; break;
      case napi_int32_array: case napi_uint32_array: case napi_float32_array: w = 4; break;
      case napi_float64_array: case napi_bigint64_array: case napi_biguint64_array: w = 8; break;
      default: w = 1; break;
    }
    *data = static_cast<const uint8_t*>(p);
    *len = n * w;
    return true;
  }
  if (napi_is_dataview(env, v, &is) == napi_ok && is) {
    size_t n = 0, off = 0;
    napi_value ab;
    if (napi_get_dataview_info(env, v, &n, &p, &ab, &off) != napi_ok) return false;
    *data = static_cast<const uint8_t*>(p);
    *len = n;
    return true;
  }
  size_t n = 0;
  if (napi_get_arraybuffer_info(env, v, &p, &n) != napi_ok) return false;
  *data = static_cast<const uint8_t*>(p);
  *len = n;
  return true;
}

const char* AtName(uint32_t at) {
  switch (at) {
    case KVC_AT_ENTRY: return "entries";
    case KVC_AT_ROW: return "rows";
    case KVC_AT_GROUP: return "groupStart";
    default: return nullptr;
  }
}

/** The checked arguments of a sumRows call, ready for kvc_sum_rows_cpu_mt. */
struct SumRowsArgs {
  std::vector<kvc_entry> aligned;  ///< a copy of the entries when they are not 8-byte aligned
  kvc_tables tables{};
  std::vector<const uint8_t*> regions;
  std::vector<uint64_t> region_bytes;
  const kvc_row* rows = nullptr;
  size_t n_rows = 0;
  uint64_t* out = nullptr;
  size_t out_len = 0;
  unsigned threads = 1;
};

/** The message of a failed kernel call (diag says where and why). */
std::string KernelError(const char* name, int rc, const kvc_diag& diag) {
  std::string msg = std::string(name) + ": ";
  if (const char* at = AtName(diag.at)) msg += std::string(at) + "[" + std::to_string(diag.index) + "]: ";
  msg += diag.reason ? diag.reason : "invalid arguments";
  msg += rc == KVC_ERANGE ? " (KVC_ERANGE)" : " (KVC_EINVAL)";
  return msg;
}

/**
 * Checks sumRows' arguments (entries, groupStart, regions, rows, out[, threads]) and fills a. On a
 * bad argument it throws (TypeError / RangeError) and returns false.
 */
bool PrepareSumRows(const Napi::CallbackInfo& info, const char* name, SumRowsArgs* a) {
  Napi::Env env = info.Env();
  napi_env e = env;
  const std::string n(name);
  if (info.Length() < 5) {
    ThrowType(env, n + "(entries, groupStart, regions, rows, out[, threads]): 5 arguments expected");
    return false;
  }
  // Phase 1: types (may run JS).
  if (!IsTypedArrayOf(e, info[0], napi_uint8_array)) return ThrowType(env, n + ": entries must be a Uint8Array"), false;
  if (!IsTypedArrayOf(e, info[1], napi_uint32_array)) return ThrowType(env, n + ": groupStart must be a Uint32Array"), false;
  if (!info[2].IsArray()) return ThrowType(env, n + ": regions must be an Array"), false;
  if (!IsTypedArrayOf(e, info[3], napi_uint32_array)) return ThrowType(env, n + ": rows must be a Uint32Array"), false;
  if (!IsTypedArrayOf(e, info[4], napi_biguint64_array)) return ThrowType(env, n + ": out must be a BigUint64Array"), false;
  if (info.Length() > 5 && !info[5].IsUndefined()) {
    if (!info[5].IsNumber()) return ThrowType(env, n + ": threads must be a number"), false;
    const double t = info[5].As<Napi::Number>().DoubleValue();
    if (!(t >= 1 && t <= 64 && t == (double)(unsigned)t)) return ThrowRange(env, n + ": threads must be an integer in [1, 64]"), false;
    a->threads = (unsigned)t;
  }
  if (env.IsExceptionPending()) return false;
  Napi::Array region_list = info[2].As<Napi::Array>();
  const uint32_t n_regions = region_list.Length();
  if (env.IsExceptionPending()) return false;
  std::vector<napi_value> region_vals(n_regions);
  for (uint32_t i = 0; i < n_regions; ++i) {
    Napi::Value v = region_list.Get(i);
    if (env.IsExceptionPending() || v.IsEmpty()) return false;
    region_vals[i] = ByteSource(e, v, n + ": regions[" + std::to_string(i) + "]");
    if (!region_vals[i]) return false;
  }

  // Phase 2: data pointers (no JS runs from here to the kernel's return).
  void *ep, *gp, *rp, *op;
  size_t entries_len, gs_len, rows_len, out_len;
  if (!TypedArrayData(e, info[0], &ep, &entries_len) || !TypedArrayData(e, info[1], &gp, &gs_len) ||
      !TypedArrayData(e, info[3], &rp, &rows_len) || !TypedArrayData(e, info[4], &op, &out_len))
    return ThrowType(env, n + ": cannot read an argument's buffer"), false;
  a->regions.resize(n_regions);
  a->region_bytes.resize(n_regions);
  for (uint32_t i = 0; i < n_regions; ++i) {
    size_t len = 0;
    if (!ByteData(e, region_vals[i], &a->regions[i], &len))
      return ThrowType(env, n + ": cannot read regions[" + std::to_string(i) + "]"), false;
    a->region_bytes[i] = len;
  }

  if (entries_len % sizeof(kvc_entry) != 0)
    return ThrowRange(env, n + ": entries.byteLength (" + std::to_string(entries_len) + ") is not a multiple of " +
                               std::to_string(sizeof(kvc_entry))),
           false;
  const size_t n_entries = entries_len / sizeof(kvc_entry);
  if (gs_len < 1) return ThrowRange(env, n + ": groupStart must hold n_groups + 1 values (at least 1)"), false;
  if (gs_len - 1 > UINT32_MAX) return ThrowRange(env, n + ": too many groups"), false;
  const uint32_t* gs = static_cast<const uint32_t*>(gp);
  if (gs[0] != 0) return ThrowRange(env, n + ": groupStart[0] must be 0, got " + std::to_string(gs[0])), false;
  if (gs[gs_len - 1] != n_entries)
    return ThrowRange(env, n + ": groupStart[" + std::to_string(gs_len - 1) + "] = " + std::to_string(gs[gs_len - 1]) +
                               " but entries holds " + std::to_string(n_entries) + " entries"),
           false;
  if (rows_len % (sizeof(kvc_row) / 4) != 0)
    return ThrowRange(env, n + ": rows.length (" + std::to_string(rows_len) + ") is not a multiple of " +
                               std::to_string(sizeof(kvc_row) / 4)),
           false;

  // kvc_entry holds uint64 fields: copy entries that are not 8-byte aligned.
  const kvc_entry* entries = static_cast<const kvc_entry*>(ep);
  if (n_entries && (reinterpret_cast<uintptr_t>(ep) % alignof(kvc_entry)) != 0) {
    a->aligned.resize(n_entries);
    std::memcpy(a->aligned.data(), ep, n_entries * sizeof(kvc_entry));
    entries = a->aligned.data();
  }
  a->tables = {entries, gs, (uint32_t)(gs_len - 1)};
  a->rows = static_cast<const kvc_row*>(rp);
  a->n_rows = rows_len / (sizeof(kvc_row) / 4);
  a->out = static_cast<uint64_t*>(op);
  a->out_len = out_len;
  return true;
}

int RunSumRows(const SumRowsArgs& a, kvc_diag* diag) {
  return kvc_sum_rows_cpu_mt(&a.tables, a.regions.data(), a.region_bytes.data(), (uint32_t)a.regions.size(), a.rows,
                             a.n_rows, a.out, a.out_len, a.threads, diag);
}

/**
 * sumRows(entries: Uint8Array, groupStart: Uint32Array, regions: Array<bytes>, rows: Uint32Array,
 *         out: BigUint64Array, threads = 1): void — on the calling thread, plus threads - 1 pool
 * threads (kvc_sum_rows_cpu_mt).
 */
Napi::Value SumRows(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  SumRowsArgs a;
  if (!PrepareSumRows(info, "sumRows", &a)) return env.Undefined();
  kvc_diag diag;
  const int rc = RunSumRows(a, &diag);
  if (rc == KVC_OK) return env.Undefined();
  return ThrowRange(env, KernelError("sumRows", rc, diag));
}

/**
 * The kernel run of sumRowsAsync on a libuv thread: the argument objects are kept alive (strong
 * references) until the promise settles.
 */
class SumRowsWorker : public Napi::AsyncWorker {
 public:
  SumRowsWorker(Napi::Env env, SumRowsArgs&& a, std::vector<Napi::ObjectReference>&& keep)
      : Napi::AsyncWorker(env, "kvconnect.sumRowsAsync"), a_(std::move(a)), keep_(std::move(keep)), deferred_(env) {}
  Napi::Promise Promise() { return deferred_.Promise(); }
  void Execute() override { rc_ = RunSumRows(a_, &diag_); }
  void OnOK() override {
    Napi::Env env = Env();
    if (rc_ == KVC_OK) deferred_.Resolve(env.Undefined());
    else deferred_.Reject(Napi::RangeError::New(env, KernelError("sumRowsAsync", rc_, diag_)).Value());
  }

 private:
  SumRowsArgs a_;
  std::vector<Napi::ObjectReference> keep_;
  Napi::Promise::Deferred deferred_;
  kvc_diag diag_{};
  int rc_ = KVC_OK;
};

/**
 * sumRowsAsync(entries, groupStart, regions, rows, out, threads = 1): Promise<void> — sumRows off
 * the JS thread (a libuv worker thread drives the pool). Argument errors throw at once; a kernel
 * check that fails rejects with a RangeError and writes nothing. The caller must not modify the
 * buffers until the promise settles.
 */
Napi::Value SumRowsAsync(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  SumRowsArgs a;
  if (!PrepareSumRows(info, "sumRowsAsync", &a)) return env.Undefined();
  std::vector<Napi::ObjectReference> keep;
  for (size_t i = 0; i < 5; ++i) keep.push_back(Napi::Persistent(info[i].As<Napi::Object>()));
  Napi::Array region_list = info[2].As<Napi::Array>();
  for (uint32_t i = 0; i < region_list.Length(); ++i) {
    Napi::Value v = region_list.Get(i);
    if (env.IsExceptionPending()) return env.Undefined();
    if (v.IsObject()) keep.push_back(Napi::Persistent(v.As<Napi::Object>()));
  }
  auto* w = new SumRowsWorker(env, std::move(a), std::move(keep));
  Napi::Promise p = w->Promise();
  w->Queue();
  return p;
}

/** cpuIsa(): string — the instruction set of the CPU kernel's loop (kvc_cpu_isa). */
Napi::Value CpuIsa(const Napi::CallbackInfo& info) { return Napi::String::New(info.Env(), kvc_cpu_isa()); }

/** setCpuIsa(name: 'auto' | 'generic' | 'avx2' | 'avx512'): boolean — false when this CPU cannot. */
Napi::Value SetCpuIsa(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsString()) return ThrowType(env, "setCpuIsa(name): a string expected");
  const std::string name = info[0].As<Napi::String>().Utf8Value();
  if (env.IsExceptionPending()) return env.Undefined();
  return Napi::Boolean::New(env, kvc_set_cpu_isa(name.c_str()) == KVC_OK);
}

/** entryExtent(entries: Uint8Array, index: number): [lo: bigint, hi: bigint] */
Napi::Value EntryExtent(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  napi_env e = env;
  if (info.Length() < 2) return ThrowType(env, "entryExtent(entries, index): 2 arguments expected");
  if (!IsTypedArrayOf(e, info[0], napi_uint8_array)) return ThrowType(env, "entryExtent: entries must be a Uint8Array");
  if (!info[1].IsNumber()) return ThrowType(env, "entryExtent: index must be a number");
  double index = info[1].As<Napi::Number>().DoubleValue();
  if (env.IsExceptionPending()) return env.Undefined();
  void* ep;
  size_t len;
  if (!TypedArrayData(e, info[0], &ep, &len)) return ThrowType(env, "entryExtent: cannot read entries");
  const size_t n = len / sizeof(kvc_entry);
  if (!(index >= 0 && index < (double)n && index == (double)(uint64_t)index))
    return ThrowRange(env, "entryExtent: index must be an integer in [0, " + std::to_string(n) + ")");
  kvc_entry entry;
  std::memcpy(&entry, static_cast<const uint8_t*>(ep) + (size_t)index * sizeof(kvc_entry), sizeof entry);
  uint64_t lo = 0, hi = 0;
  if (kvc_entry_extent(&entry, &lo, &hi) != KVC_OK) {
    const char* why = kvc_entry_check(&entry);
    return ThrowRange(env, "entryExtent: entries[" + std::to_string((size_t)index) + "]: " + (why ? why : "invalid entry"));
  }
  Napi::Array r = Napi::Array::New(env, 2);
  if (env.IsExceptionPending()) return env.Undefined();
  r.Set(0u, Napi::BigInt::New(env, lo));
  r.Set(1u, Napi::BigInt::New(env, hi));
  if (env.IsExceptionPending()) return env.Undefined();
  return r;
}

/** Common body of plainSum64 / weightedSum64. */
Napi::Value WordSum(const Napi::CallbackInfo& info, const char* name, uint64_t (*fn)(const uint8_t*, size_t)) {
  Napi::Env env = info.Env();
  napi_env e = env;
  if (info.Length() < 1) return ThrowType(env, std::string(name) + "(buf): 1 argument expected");
  napi_value src = ByteSource(e, info[0], std::string(name) + ": buf");
  if (!src) return env.Undefined();
  const uint8_t* p;
  size_t len;
  if (!ByteData(e, src, &p, &len)) return ThrowType(env, std::string(name) + ": cannot read buf");
  if (len % 8 != 0)
    return ThrowRange(env, std::string(name) + ": buf.byteLength (" + std::to_string(len) + ") is not a multiple of 8");
  Napi::BigInt r = Napi::BigInt::New(env, fn(p, len / 8));
  if (env.IsExceptionPending()) return env.Undefined();
  return r;
}

Napi::Value PlainSum64(const Napi::CallbackInfo& info) { return WordSum(info, "plainSum64", kvc_plain_sum64); }

/** plainSum64Parallel(buf, threads): bigint — the multi-core read baseline (kvc_plain_sum64_mt). */
Napi::Value PlainSum64Parallel(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 2 || !info[1].IsNumber()) return ThrowType(env, "plainSum64Parallel(buf, threads): 2 arguments expected");
  const double t = info[1].As<Napi::Number>().DoubleValue();
  if (!(t >= 1 && t <= 64 && t == (double)(unsigned)t)) return ThrowRange(env, "plainSum64Parallel: threads must be an integer in [1, 64]");
  napi_env e = env;
  napi_value src = ByteSource(e, info[0], "plainSum64Parallel: buf");
  if (!src) return env.Undefined();
  const uint8_t* p;
  size_t len;
  if (!ByteData(e, src, &p, &len)) return ThrowType(env, "plainSum64Parallel: cannot read buf");
  if (len % 8 != 0) return ThrowRange(env, "plainSum64Parallel: buf.byteLength is not a multiple of 8");
  return Napi::BigInt::New(env, kvc_plain_sum64_mt(p, len / 8, (unsigned)t));
}
Napi::Value WeightedSum64(const Napi::CallbackInfo& info) {
  return WordSum(info, "weightedSum64", kvc_weighted_sum64);
}

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  exports.Set("abiVersion", Napi::Number::New(env, KVC_ABI_VERSION));
  exports.Set("entryBytes", Napi::Number::New(env, (double)sizeof(kvc_entry)));
  exports.Set("rowWords", Napi::Number::New(env, (double)(sizeof(kvc_row) / 4)));
#ifdef KVC_WITH_CUDA
  exports.Set("withCuda", Napi::Boolean::New(env, true));
#else
  exports.Set("withCuda", Napi::Boolean::New(env, false));
#endif
  exports.Set("sumRows", Napi::Function::New(env, SumRows, "sumRows"));
  exports.Set("sumRowsAsync", Napi::Function::New(env, SumRowsAsync, "sumRowsAsync"));
  exports.Set("cpuIsa", Napi::Function::New(env, CpuIsa, "cpuIsa"));
  exports.Set("setCpuIsa", Napi::Function::New(env, SetCpuIsa, "setCpuIsa"));
  exports.Set("plainSum64Parallel", Napi::Function::New(env, PlainSum64Parallel, "plainSum64Parallel"));
  exports.Set("entryExtent", Napi::Function::New(env, EntryExtent, "entryExtent"));
  exports.Set("plainSum64", Napi::Function::New(env, PlainSum64, "plainSum64"));
  exports.Set("weightedSum64", Napi::Function::New(env, WeightedSum64, "weightedSum64"));
  if (env.IsExceptionPending()) return exports;
  KvcRegisterTransfer(env, exports);
  if (env.IsExceptionPending()) return exports;
  KvcRegisterMooncake(env, exports);
  if (env.IsExceptionPending()) return exports;
#ifdef __linux__
  KvcRegisterShm(env, exports);
  if (env.IsExceptionPending()) return exports;
#endif
  KvcRegisterForward(env, exports);
  if (env.IsExceptionPending()) return exports;
#ifdef KVC_WITH_CUDA
  KvcRegisterCuda(env, exports);
  if (env.IsExceptionPending()) return exports;
  KvcRegisterDevice(env, exports);
#endif
  return exports;
}

}  // namespace

NODE_API_MODULE(kvconnect_native, Init)
