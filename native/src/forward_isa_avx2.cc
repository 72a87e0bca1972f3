// The forward kernels for avx2 (32-byte vectors); see forward_kernel.inc.
#define KVC_FWD_NS avx2
#define KVC_FWD_VB 32
#include "forward_kernel.inc"
