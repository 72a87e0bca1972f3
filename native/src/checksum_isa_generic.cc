// The generic variant of the CPU kernel's loop (SSE2 / NEON / scalar): checksum_isa.h.
#define KVC_ISA_NS generic
#define KVC_ISA_WIDEST 128
#include "checksum_kernel.inc"
