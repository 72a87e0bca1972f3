/**
 * @file forward_addon.cc
 * @brief N-API bindings of the reference engine's forward-pass kernels (forward_isa.h):
 *        `fwdMatmul`, `fwdMlp`, `fwdAttend`, `fwdExp`, `fwdSoftmaxExp`, `fwdRope`, `fwdKvWrite`, `fwdKvRead`,
 *        `forwardIsa`, `setForwardIsa`
 *        (declared in native/index.d.ts, used by packages/engine/src/model/native-forward.ts).
 *
 * Every size is checked against the arrays before a kernel runs: a bad argument throws a TypeError
 * (wrong type) or RangeError (a size that does not fit), and nothing is written then. Arguments are
 * all read (which may run JS) before any data pointer is taken.
 */
#include "forward_addon.h"

#include <cmath>
#include <cstring>
#include <string>

#include "forward_isa.h"

namespace {

using kvc_fwd::Kernels;

const Kernels* Pick(const std::string& name) {
#ifdef KVC_FWD_HAVE_X86_VARIANTS
  __builtin_cpu_init();
  // The avx2 variant also uses FMA (forward_kernel.inc fma_exact), a CPUID flag of its own.
  const bool has512 = __builtin_cpu_supports("avx512f"), has2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
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
      Fail(false, std::string(name) + (type == napi_float32_array ? " must be a Float32Array" : type == napi_uint8_array ? " must be a Uint8Array" : " must be a Float64Array"));
      return 0;
    }
    return info[i].As<Napi::TypedArray>().ElementLength();
  }
  /** `need` elements must fit in an array of `have`. */
  void Fits(size_t have, double need, const char* name) {
    if (ok && need > (double)have) Fail(true, std::string(name) + " holds " + std::to_string(have) + " elements, " + std::to_string((size_t)need) + " needed");
  }
  /** A KV cache element type (packages/engine/src/dtype.ts KvDtype); its bytes per element, or 0. */
  int Dtype(size_t i, const char* name) {
    if (!ok) return 0;
    if (i >= info.Length() || !info[i].IsString()) { Fail(false, std::string(name) + " must be a string"); return 0; }
    const std::string d = info[i].As<Napi::String>().Utf8Value();
    if (d == "float32") return 4;
    if (d == "bfloat16") return -2;
    if (d == "float16") return 2;
    Fail(true, std::string(name) + " must be 'float32', 'bfloat16' or 'float16'");
    return 0;
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

/** `name`(x: Float64Array, y: Float64Array): y[i] = f(x[i]) for i < x.length through kernel `f` (y at least as long: RangeError, nothing written). */
Napi::Value ElementwiseF64(const Napi::CallbackInfo& info, const char* name, void (*f)(const double*, double*, size_t)) {
  Args a{info, name};
  const size_t xl = a.Arr(0, napi_float64_array, "x"), yl = a.Arr(1, napi_float64_array, "y");
  a.Fits(yl, (double)xl, "y");
  if (!a.ok) return info.Env().Undefined();
  f(a.Data<double>(0), a.Data<double>(1), xl);
  return info.Env().Undefined();
}

/** fwdExp(x: Float64Array, y: Float64Array): y[i] = exp(x[i]) as Math.exp (fdlibm), through the vector kernel. */
Napi::Value Exp(const Napi::CallbackInfo& info) { return ElementwiseF64(info, "fwdExp", K().exp); }

/** fwdSoftmaxExp(x: Float64Array, y: Float64Array): y[i] = softmaxExp(x[i]) (packages/engine/src/model/softmax-exp.ts), through the vector kernel. */
Napi::Value SoftmaxExp(const Napi::CallbackInfo& info) { return ElementwiseF64(info, "fwdSoftmaxExp", K().softmaxExp); }

/** fwdRope(x, stride, T, heads, dim, cos, sin, tableOffset): see forward_kernel.inc rope (angles from cos/sin[tableOffset ..]). */
Napi::Value Rope(const Napi::CallbackInfo& info) {
  Args a{info, "fwdRope"};
  const size_t xl = a.Arr(0, napi_float32_array, "x");
  const int stride = a.Int(1, "stride"), T = a.Int(2, "T"), heads = a.Int(3, "heads"), dim = a.Int(4, "dim");
  const size_t cl = a.Arr(5, napi_float64_array, "cos"), sl = a.Arr(6, napi_float64_array, "sin");
  const int off = a.Int(7, "tableOffset");
  if (a.ok && dim % 2 != 0) a.Fail(true, "dim must be even");
  if (a.ok && T > 0 && (double)heads * dim > stride) a.Fail(true, "heads * dim must be <= stride");
  a.Fits(xl, Span(T, stride, heads * dim), "x");
  a.Fits(cl, (double)off + (double)T * (dim / 2), "cos");
  a.Fits(sl, (double)off + (double)T * (dim / 2), "sin");
  if (!a.ok) return info.Env().Undefined();
  K().rope(a.Data<float>(0), stride, T, heads, dim, a.Data<double>(5) + off, a.Data<double>(6) + off);
  return info.Env().Undefined();
}

/** float32 bits after a JavaScript number round trip (Float32Array read, write): a signalling NaN comes back quiet. */
inline uint32_t JsF32(uint32_t b) { return ((b & 0x7F800000u) == 0x7F800000u && (b & 0x007FFFFFu) != 0) ? (b | 0x00400000u) : b; }

/** packages/engine/src/dtype.ts toF16Bits of float32 bits `b` (round to nearest even, overflow to infinity). */
uint32_t ToF16(uint32_t b) {
  const uint32_t sign = (b >> 16) & 0x8000, exp = (b >> 23) & 0xff;
  uint32_t mant = b & 0x7fffff;
  if (exp == 0xff) return sign | 0x7c00 | (mant != 0 ? 0x200 | (mant >> 13) : 0);
  const int e = (int)exp - 127;
  if (e > 15) return sign | 0x7c00;
  if (e >= -14) {
    uint32_t h = ((uint32_t)(e + 15) << 10) | (mant >> 13);
    const uint32_t rest = mant & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1) == 1)) h += 1;
    return sign | h;
  }
  if (e < -25) return sign;
  mant |= 0x800000;
  const int drop = -(e + 1);
  const uint32_t q = mant >> drop, rem = mant & ((1u << drop) - 1), halfway = 1u << (drop - 1);
  uint32_t h = q;
  if (rem > halfway || (rem == halfway && (q & 1) == 1)) h += 1;
  return sign | h;
}

/** dtype.ts fromF16Bits as float32 bits (exact; NaN is JavaScript's NaN, 0x7FC00000). */
uint32_t FromF16(uint32_t h) {
  const uint32_t sign = (h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  if (exp == 0x1f) return mant == 0 ? sign | 0x7F800000u : 0x7FC00000u;
  if (exp != 0) return sign | ((exp + 112) << 23) | (mant << 13);
  float f = (float)mant * 0x1p-24f;  // exact
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return sign | b;
}

/**
 * Checks the arguments shared by fwdKvWrite / fwdKvRead: mem (Uint8Array), addr (Float64Array of
 * byte addresses, one a row), dtype, hd, rows (Float32Array, addr.length * hd). Every address
 * must be an integer with its row inside mem.
 */
struct KvArgs {
  size_t rows = 0;
  int eb = 0;  // bytes per element, negative for bfloat16
  int hd = 0;
  bool Check(Args& a) {
    const size_t ml = a.Arr(0, napi_uint8_array, "mem");
    rows = a.Arr(1, napi_float64_array, "addr");
    eb = a.Dtype(2, "dtype");
    hd = a.Int(3, "hd");
    const size_t fl = a.Arr(4, napi_float32_array, "rows");
    a.Fits(fl, (double)rows * hd, "rows");
    if (!a.ok) return false;
    const double span = (double)hd * (eb < 0 ? -eb : eb);
    const double* ad = a.Data<double>(1);
    for (size_t i = 0; i < rows; i++) {
      if (!(ad[i] >= 0 && ad[i] == std::floor(ad[i]) && ad[i] + span <= (double)ml)) {
        a.Fail(true, "addr[" + std::to_string(i) + "] is not an integer address whose row fits in mem");
        return false;
      }
    }
    return true;
  }
};

/** fwdKvWrite(mem, addr, dtype, hd, src): row i (src[i * hd ..]) as `dtype` at mem[addr[i] + d * bytes] (dtype.ts writeElem). */
Napi::Value KvWrite(const Napi::CallbackInfo& info) {
  Args a{info, "fwdKvWrite"};
  KvArgs k;
  if (!k.Check(a)) return info.Env().Undefined();
  uint8_t* mem = a.Data<uint8_t>(0);
  const double* ad = a.Data<double>(1);
  const float* src = a.Data<float>(4);
  for (size_t i = 0; i < k.rows; i++) {
    uint8_t* p = mem + (size_t)ad[i];
    for (int d = 0; d < k.hd; d++) {
      uint32_t b;
      std::memcpy(&b, src + i * k.hd + d, 4);
      b = JsF32(b);
      if (k.eb == 4) {
        for (int j = 0; j < 4; j++) p[4 * d + j] = (uint8_t)(b >> (8 * j));
        continue;
      }
      uint32_t h;
      if (k.eb < 0) h = ((b & 0x7f800000u) == 0x7f800000u && (b & 0x007fffffu) != 0) ? (((b >> 16) | 0x0040) & 0xffff) : (((b + 0x7fffu + ((b >> 16) & 1)) >> 16) & 0xffff);
      else h = ToF16(b);
      p[2 * d] = (uint8_t)h;
      p[2 * d + 1] = (uint8_t)(h >> 8);
    }
  }
  return info.Env().Undefined();
}

/** fwdKvRead(mem, addr, dtype, hd, dst): dst[i * hd + d] = the `dtype` element at mem[addr[i] + d * bytes] (dtype.ts readElem). */
Napi::Value KvRead(const Napi::CallbackInfo& info) {
  Args a{info, "fwdKvRead"};
  KvArgs k;
  if (!k.Check(a)) return info.Env().Undefined();
  const uint8_t* mem = a.Data<uint8_t>(0);
  const double* ad = a.Data<double>(1);
  float* dst = a.Data<float>(4);
  for (size_t i = 0; i < k.rows; i++) {
    const uint8_t* p = mem + (size_t)ad[i];
    for (int d = 0; d < k.hd; d++) {
      uint32_t b;
      if (k.eb == 4) b = JsF32((uint32_t)p[4 * d] | ((uint32_t)p[4 * d + 1] << 8) | ((uint32_t)p[4 * d + 2] << 16) | ((uint32_t)p[4 * d + 3] << 24));
      else {
        const uint32_t h = (uint32_t)p[2 * d] | ((uint32_t)p[2 * d + 1] << 8);
        b = k.eb < 0 ? JsF32(h << 16) : FromF16(h);
      }
      std::memcpy(dst + i * k.hd + d, &b, 4);
    }
  }
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
  exports.Set("fwdSoftmaxExp", Napi::Function::New(env, SoftmaxExp, "fwdSoftmaxExp"));
  exports.Set("fwdRope", Napi::Function::New(env, Rope, "fwdRope"));
  exports.Set("fwdKvWrite", Napi::Function::New(env, KvWrite, "fwdKvWrite"));
  exports.Set("fwdKvRead", Napi::Function::New(env, KvRead, "fwdKvRead"));
  exports.Set("forwardIsa", Napi::Function::New(env, ForwardIsa, "forwardIsa"));
  exports.Set("setForwardIsa", Napi::Function::New(env, SetForwardIsa, "setForwardIsa"));
}
