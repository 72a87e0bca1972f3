// The AVX2 variant of the CPU kernel's loop, compiled with -mavx2 (CMakeLists.txt): checksum_isa.h.
#if !defined(__AVX2__)
#error "checksum_isa_avx2.cc must be compiled with -mavx2"
#endif
#define KVC_ISA_NS avx2
#define KVC_ISA_WIDEST 256
#include "checksum_kernel.inc"
