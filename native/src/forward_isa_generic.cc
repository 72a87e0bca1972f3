// The forward kernels for generic (16-byte vectors); see forward_kernel.inc.
#define KVC_FWD_NS generic
#define KVC_FWD_VB 16
#include "forward_kernel.inc"
