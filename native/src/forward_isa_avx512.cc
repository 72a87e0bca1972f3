// The forward kernels for avx512 (64-byte vectors); see forward_kernel.inc.
#define KVC_FWD_NS avx512
#define KVC_FWD_VB 64
#include "forward_kernel.inc"
