// The AVX-512F variant of the CPU kernel's loop, compiled with -mavx512f (CMakeLists.txt): checksum_isa.h.
#if !defined(__AVX512F__)
#error "checksum_isa_avx512.cc must be compiled with -mavx512f"
#endif
#define KVC_ISA_NS avx512
#define KVC_ISA_WIDEST 512
#include "checksum_kernel.inc"
