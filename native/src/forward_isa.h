/**
 * @file forward_isa.h
 * @brief Internal: the reference engine's forward-pass kernels (packages/engine/src/model/native-forward.ts),
 *        compiled once per instruction set (forward_kernel.inc in forward_isa_*.cc, all with
 *        -ffp-contract=off and without -ffast-math; FMA only explicitly, on products of two float32
 *        values, which are exact in float64: forward_kernel.inc fma_exact) and chosen at run time by
 *        forward_addon.cc.
 *
 * Every kernel computes exactly what the JavaScript forward pass computes
 * (packages/engine/src/model/weights.ts `dotRow`/`rmsNorm`/`applyRope`, executor.ts `mlp`,
 * worker.ts `attention`/`softmaxAttend`): float32 operands, each dot product accumulated in float64
 * in index order and rounded to float32 once; every sum in its JavaScript order. Vectors only
 * compute independent outputs side by side (one lane per token, context position or head
 * element), never split one sum into partial sums, so every variant gives the same bits whatever
 * the vector width, TP, PP or block size. `exp` is the fdlibm algorithm V8's `Math.exp` uses
 * (V8 src/base/ieee754.cc, from FreeBSD msun e_exp.c), lane by lane.
 */
#ifndef KVC_FORWARD_ISA_H
#define KVC_FORWARD_ISA_H

#include <cstddef>
#include <cstdint>

namespace kvc_fwd {

/** One variant's kernels (see forward_kernel.inc for each one's contract). */
struct Kernels {
  void (*matmul)(const float* w, int rows, int cols, const float* x, int xStride, int T, float* y, int yStride, bool residual);
  void (*mlp)(float* h, int T, int H, const float* norm, const float* gate, const float* up, const float* down, int I);
  void (*attend)(const float* q, int qStride, int n, const float* k, const float* v, int hd, int start, int window,
                 double scale, float* out, int outStride);
  void (*exp)(const double* x, double* y, size_t n);
  void (*softmaxExp)(const double* x, double* y, size_t n);
  void (*rope)(float* x, int stride, int T, int heads, int dim, const double* cos, const double* sin);
};

/** The fdlibm / V8 `Math.exp` of one double (forward_exp.cc). */
double exp_fdlibm(double x);

namespace generic { extern const Kernels kernels; }
#if defined(__x86_64__) || defined(_M_X64)
#define KVC_FWD_HAVE_X86_VARIANTS 1
namespace avx2 { extern const Kernels kernels; }
namespace avx512 { extern const Kernels kernels; }
#endif

}  // namespace kvc_fwd

#endif
