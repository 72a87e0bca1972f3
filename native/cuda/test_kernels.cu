/**
 * @file test_kernels.cu
 * @brief Device helpers of the CUDA test (test_cuda.cc): a "forward pass" stand-in that sleeps on
 *        the GPU and then writes the KV, to check that the checksum is ordered after it.
 */
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace {

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

/** Thread 0 of block 0 spins for `ns`; then the grid copies `bytes` from src to dst. */
__global__ void sleep_then_copy(unsigned char* dst, const unsigned char* src, size_t bytes, uint64_t ns,
                                unsigned int* gate) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    const uint64_t t0 = global_ns();
    while (global_ns() - t0 < ns) __nanosleep(1000);
    __threadfence();
    atomicExch(gate, 1u);
  }
  // Every block waits for the gate (all blocks are resident: the grid is small).
  if (threadIdx.x == 0)
    while (atomicAdd(gate, 0u) == 0u) __nanosleep(500);
  __syncthreads();
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < bytes; i += (size_t)gridDim.x * blockDim.x)
    dst[i] = src[i];
}

}  // namespace

/** Enqueues on `stream`: spin for sleep_us microseconds, then copy bytes src -> dst (device). */
extern "C" int kvc_test_sleep_then_copy(void* stream, uint64_t dst, uint64_t src, size_t bytes, uint32_t sleep_us) {
  unsigned int* gate = nullptr;
  if (cudaMallocAsync((void**)&gate, sizeof(unsigned int), (cudaStream_t)stream) != cudaSuccess) return -1;
  if (cudaMemsetAsync(gate, 0, sizeof(unsigned int), (cudaStream_t)stream) != cudaSuccess) return -1;
  sleep_then_copy<<<8, 256, 0, (cudaStream_t)stream>>>((unsigned char*)(uintptr_t)dst,
                                                       (const unsigned char*)(uintptr_t)src, bytes,
                                                       (uint64_t)sleep_us * 1000u, gate);
  if (cudaGetLastError() != cudaSuccess) return -1;
  if (cudaFreeAsync(gate, (cudaStream_t)stream) != cudaSuccess) return -1;
  return 0;
}
