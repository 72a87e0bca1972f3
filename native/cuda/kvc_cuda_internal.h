/**
 * @file kvc_cuda_internal.h
 * @brief Internal hooks of the CUDA checksum library for the benchmark and the test (not exported
 *        from the shared library; they link the object files).
 */
#ifndef KVC_CUDA_INTERNAL_H
#define KVC_CUDA_INTERNAL_H

#include "kvc_checksum_cuda.h"

/**
 * Launches the context's last kernel again on `stream`, with the same rows and tables, adding into
 * a scratch output (never a slot's). Times the kernel alone, without the step's copies. The last
 * submit's rows must still be in its slot (no newer submit into that slot).
 */
int kvc_cuda_debug_relaunch(kvc_cuda_ctx* ctx, void* stream);

/**
 * Selects the kernel variant of the ATTN vector paths (kvc_checksum_cuda.cu, launch()): 1 or 2 =
 * pairs inner where the layout suits it (4 pairs, 80 registers / 2 pairs x 2 tokens, 64 registers),
 * 4 or 8 = tokens inner with 4 or 8 loads in flight per lane; 32 = 2 with its 16-byte ATTN loads
 * hinted L1::no_allocate / L2::256B; 33, 35 (the default), 37: where the tables are all ATTN V16, a
 * kernel with only those paths (kvc_cuda_kernel.cuh lane_partial_attn16<variant - 32>), else V32's.
 */
int kvc_cuda_debug_set_variant(kvc_cuda_ctx* ctx, int variant);

/** Submits of this context that launched a specialized kernel (variants 33, 35, 37 over all-ATTN-V16 tables). */
unsigned long long kvc_cuda_debug_spec_launches(const kvc_cuda_ctx* ctx);

/**
 * How submit() enqueues a step (for the benchmark's comparisons and the test's coverage): rows go
 * inline (compact, in the launch's parameters) when there are at most inline_limit of them (default
 * and max 128; 0: always the copied path), in a parameter block of at least min_tier rows (default
 * 0: the smallest that holds them: 64 or 128); copy_out_kernel != 0 (default): the
 * results go to host memory through one small kernel that also re-zeroes them, else through a
 * device-to-host copy and a memset.
 */
int kvc_cuda_debug_set_submit(kvc_cuda_ctx* ctx, uint32_t inline_limit, uint32_t min_tier, int copy_out_kernel);

/**
 * driver != 0 (the default when it resolved at create): submit() launches through the driver's
 * cuLaunchKernel (resolved with cudaGetDriverEntryPointByVersion, each tier's CUfunction cached);
 * 0: through cudaLaunchKernel (the benchmark's A/B of the isolated step's launch, issue 16 part 4).
 * Returns KVC_ECUDA when the driver entry point cannot be resolved.
 */
int kvc_cuda_debug_set_launch(kvc_cuda_ctx* ctx, int driver);

/**
 * enable != 0: each later submit() records its host time by phase; us (may be NULL) gets the
 * last timed submit's phases in microseconds: [0] row checks, [1] device guard + slot drain +
 * buffer growth, [2] parameter fill (inline rows or the rows' copy enqueue), [3] the kernel
 * launch call, [4] the event record, stream wait and the results' copy-out enqueue.
 */
int kvc_cuda_debug_submit_times(kvc_cuda_ctx* ctx, int enable, double us[5]);

/**
 * on != 0: contexts created after this call get their own side and upload streams (the behaviour
 * before 2026-12-02 session 6, for the benchmark's A/B); 0 (the default): the device's shared pair.
 */
void kvc_cuda_debug_private_streams(int on);

#endif  // KVC_CUDA_INTERNAL_H
