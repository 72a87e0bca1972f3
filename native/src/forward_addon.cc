/**
 * @file forward_addon.cc
 * @brief N-API bindings of the reference engine's forward-pass kernels (forward_isa.h):
 *        `fwdMatmul`, `fwdMlp`, `fwdAttend`, `fwdExp`, `forwardIsa`, `setForwardIsa`
 *        (declared in native/index.d.ts, used by packages/engine/src/model/native-forward.ts).
 *
 * Every size is checked against the arrays before a kernel runs: a bad argument throws a TypeError
 * (wrong type) or RangeError (a size that does not fit), and nothing is written then. Arguments are
 * all read (which may run JS) before any data pointer is taken.
 */
#include "forward_addon.h"

#include <cmath>
#include <string>

#include "forward_isa.h"

namespace {

using kvc_fwd::Kernels;

const Kernels* Pick(const std::string& name) {
#ifdef KVC_FWD_HAVE_X86_VARIANTS
  __builtin_cpu_init();
  const bool has512 = __builtin_cpu_supports("avx512f"), has2 = __builtin_cpu_supports("avx2");
  if (name == "avx512") return has512 ? &kvc_fwd::avx512::kernels : nullptr;
  if (name == "avx2") return has2 ? &kvc_fwd::avx2::kernels : nullptr;
  if (name == "auto") return has512 ? &kvc_fwd::avx512::kernels : has2 ? &kvc_fwd::avx2::kernels : &kvc_fwd::generic::kernels;
#else
  if (name == "auto") return &kvc_fwd::generic::kernels;
#endif
  if (name == "generic") return &kvc_fwd::generic::kernels;
  return nullptr;
}

const char* NameOf(const Kernels* k) {
#ifdef KVC_FWD_HAVE_X86_VARIANTS
  if (k == &kvc_fwd::avx512::kernels) return "avx512";
  if (k == &kvc_fwd::avx2::kernels) return "avx2";
#endif
  (void)k;
  return "generic";
}

const Kernels* active = nullptr;  // the addon's one ISA choice, as kvc_set_cpu_isa for the checksum kernel

const Kernels& K() {
  if (!active) active = Pick("auto");
  return *active;
}

struct Args {
  const Napi::CallbackInfo& info;
  const char* fn;
  bool ok = true;

  void Fail(bool range, const std::string& msg) {
    if (!ok) return;
    ok = false;
    Napi::Env env = info.Env();
    if (env.IsExceptionPending()) return;
    if (range) Napi::RangeError::New(env, std::string(fn) + ": " + msg).ThrowAsJavaScriptException();
    else Napi::TypeError::New(env, std::string(fn) + ": " + msg).ThrowAsJavaScriptException();
  }
  /** A non-negative integer below 2^31. */
  int Int(size_t i, const char* name) {
    if (!ok) return 0;
    if (i >= info.Length() || !info[i].IsNumber()) { Fail(false, std::string(name) + " must be a number"); return 0; }
    const double d = info[i].As<Napi::Number>().DoubleValue();
    if (!(d >= 0 && d < 2147483648.0 && d == std::floor(d))) { Fail(true, std::string(name) + " must be an integer in [0, 2^31)"); return 0; }
    return (int)d;
  }
  double Num(size_t i, const char* name) {
    if (!ok) return 0;
    if (i >= info.Length() || !info[i].IsNumber()) { Fail(false, std::string(name) + " must be a number"); return 0; }
    return info[i].As<Napi::Number>().DoubleValue();
  }
  bool Bool(size_t i, const char* name) {
    if (!ok) return false;
    if (i >= info.Length() || !info[i].IsBoolean()) { Fail(false, std::string(name) + " must be a boolean"); return false; }
    return info[i].As<Napi::Boolean>().Value();
  }
  /** Checks that argument i is a typed array of `type`; its element count, or 0. */
  size_t Arr(size_t i, napi_typedarray_type type, const char* name) {
    if (!ok) return 0;
    if (i >= info.Length() || !info[i].IsTypedArray() || info[i].As<Napi::TypedArray>().TypedArrayType() != type) {
      Fail(false, std::string(name) + (type == napi_float32_array ? " must be a Float32Array" : " must be a Float64Array"));
      return 0;
    }
    return info[i].As<Napi::TypedArray>().ElementLength();
  }
  /** `need` elements must fit in an array of `have`. */
  void Fits(size_t have, double need, const char* name) {
    if (ok && need > (double)have) Fail(true, std::string(name) + " holds " + std::to_string(have) + " elements, " + std::to_string((size_t)need) + " needed");
  }
  template <typename T>
  T* Data(size_t i) { return reinterpret_cast<T*>(static_cast<uint8_t*>(info[i].As<Napi::TypedArray>().ArrayBuffer().Data()) + info[i].As<Napi::TypedArray>().ByteOffset()); }
};

/** Elements a strided `[n, width]` operand spans: (n - 1) * stride + width, 0 for n = 0. */
double Span(int n, int stride, int width) { return n == 0 ? 0 : (double)(n - 1) * stride + width; }

/** fwdMatmul(w, rows, cols, x, xStride, T, y, yStride, residual): see forward_kernel.inc matmul. */
Napi::Value Matmul(const Napi::CallbackInfo& info) {
  Args a{info, "fwdMatmul"};
  const size_t wl = a.Arr(0, napi_float32_array, "w");
  const int rows = a.Int(1, "rows"), cols = a.Int(2, "cols");
  const size_t xl = a.Arr(3, napi_float32_array, "x");
  const int xStride = a.Int(4, "xStride"), T = a.Int(5, "T");
  const size_t yl = a.Arr(6, napi_float32_array, "y");
  const int yStride = a.Int(7, "yStride");
  const bool residual = a.Bool(8, "residual");
  a.Fits(wl, (double)rows * cols, "w");
  if (a.ok && T > 0 && (cols > xStride || rows > yStride)) a.Fail(true, "cols must be <= xStride and rows <= yStride");
  a.Fits(xl, Span(T, xStride, cols), "x");
  a.Fits(yl, Span(T, yStride, rows), "y");
  if (!a.ok) return info.Env().Undefined();
  K().matmul(a.Data<float>(0), rows, cols, a.Data<float>(3), xStride, T, a.Data<float>(6), yStride, residual);
  return info.Env().Undefined();
}

/** fwdMlp(h, T, H, norm, gate, up, down, I): see forward_kernel.inc mlp. */
Napi::Value Mlp(const Napi::CallbackInfo& info) {
  Args a{info, "fwdMlp"};
  const size_t hl = a.Arr(0, napi_float32_array, "h");
  const int T = a.Int(1, "T"), H = a.Int(2, "H");
  const size_t nl = a.Arr(3, napi_float32_array, "norm"), gl = a.Arr(4, napi_float32_array, "gate");
  const size_t ul = a.Arr(5, napi_float32_array, "up"), dl = a.Arr(6, napi_float32_array, "down");
  const int I = a.Int(7, "I");
  a.Fits(hl, (double)T * H, "h");
  a.Fits(nl, H, "norm");
  a.Fits(gl, (double)I * H, "gate");
  a.Fits(ul, (double)I * H, "up");
  a.Fits(dl, (double)I * H, "down");
  if (a.ok && H == 0) a.Fail(true, "H must be positive");
  if (!a.ok) return info.Env().Undefined();
  K().mlp(a.Data<float>(0), T, H, a.Data<float>(3), a.Data<float>(4), a.Data<float>(5), a.Data<float>(6), I);
  return info.Env().Undefined();
}

/** fwdAttend(q, qStride, n, k, v, hd, start, window, scale, out, outStride): see forward_kernel.inc attend. */
Napi::Value Attend(const Napi::CallbackInfo& info) {
  Args a{info, "fwdAttend"};
  const size_t ql = a.Arr(0, napi_float32_array, "q");
  const int qStride = a.Int(1, "qStride"), n = a.Int(2, "n");
  const size_t kl = a.Arr(3, napi_float32_array, "k"), vl = a.Arr(4, napi_float32_array, "v");
  const int hd = a.Int(5, "hd"), start = a.Int(6, "start"), window = a.Int(7, "window");
  const double scale = a.Num(8, "scale");
  const size_t ol = a.Arr(9, napi_float32_array, "out");
  const int outStride = a.Int(10, "outStride");
  if (a.ok && n > 0 && (hd > qStride || hd > outStride)) a.Fail(true, "hd must be <= qStride and outStride");
  if (a.ok && (double)start + n >= 2147483648.0) a.Fail(true, "start + n must be below 2^31");
  a.Fits(ql, Span(n, qStride, hd), "q");
  a.Fits(kl, ((double)start + n) * hd, "k");
  a.Fits(vl, ((double)start + n) * hd, "v");
  a.Fits(ol, Span(n, outStride, hd), "out");
  if (!a.ok) return info.Env().Undefined();
  K().attend(a.Data<float>(0), qStride, n, a.Data<float>(3), a.Data<float>(4), hd, start, window, scale, a.Data<float>(9), outStride);
  return info.Env().Undefined();
}

/** fwdExp(x: Float64Array, y: Float64Array): y[i] = exp(x[i]) as Math.exp (fdlibm), through the vector kernel. */
Napi::Value Exp(const Napi::CallbackInfo& info) {
  Args a{info, "fwdExp"};
  const size_t xl = a.Arr(0, napi_float64_array, "x"), yl = a.Arr(1, napi_float64_array, "y");
  a.Fits(yl, (double)xl, "y");
  if (!a.ok) return info.Env().Undefined();
  K().exp(a.Data<double>(0), a.Data<double>(1), xl);
  return info.Env().Undefined();
}

Napi::Value ForwardIsa(const Napi::CallbackInfo& info) { return Napi::String::New(info.Env(), NameOf(&K())); }

/** setForwardIsa(name: 'auto' | 'generic' | 'avx2' | 'avx512'): false when this CPU cannot (unchanged then). */
Napi::Value SetForwardIsa(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsString()) {
    Napi::TypeError::New(env, "setForwardIsa(name): a string expected").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  const Kernels* k = Pick(info[0].As<Napi::String>().Utf8Value());
  if (k) active = k;
  return Napi::Boolean::New(env, k != nullptr);
}

}  // namespace

void KvcRegisterForward(Napi::Env env, Napi::Object exports) {
  exports.Set("fwdMatmul", Napi::Function::New(env, Matmul, "fwdMatmul"));
  exports.Set("fwdMlp", Napi::Function::New(env, Mlp, "fwdMlp"));
  exports.Set("fwdAttend", Napi::Function::New(env, Attend, "fwdAttend"));
  exports.Set("fwdExp", Napi::Function::New(env, Exp, "fwdExp"));
  exports.Set("forwardIsa", Napi::Function::New(env, ForwardIsa, "forwardIsa"));
  exports.Set("setForwardIsa", Napi::Function::New(env, SetForwardIsa, "setForwardIsa"));
}
