/**
 * @file kvc_checksum_cuda.h
 * @brief The CUDA checksum kernel (SPEC v1 sections 2-3) behind a C ABI: the same tables and rows as
 *        kvc_sum_rows_cpu (kvc_checksum.h), summed on the GPU in one launch per engine step,
 *        bit-identical to the CPU kernel.
 *
 * Life of a context:
 *  1. kvc_cuda_create(): streams, events, pinned and device buffers, and a warm-up launch, so that
 *     the first checksummed step neither loads a module nor allocates.
 *  2. kvc_cuda_set_tables(): at cache registration. Validates every entry like the CPU kernel (the
 *     same kvc_check_rows checks: kinds, counts, widths; every byte an entry can read for block ids
 *     < num_blocks lies inside its region) and uploads a prepared copy of the tables (strides,
 *     divisors, the work items of each group) to device memory. Regions are device addresses.
 *  3. Each step, kvc_cuda_submit(rows, stream): validates the rows (the CPU kernel's row checks)
 *     and enqueues ONE kernel launch on the caller's stream that sums every entry of every group
 *     for all rows. Up to 128 rows travel inside the launch's parameters (a compact 15-byte form,
 *     when every row's group is < 256 and valid_tokens < 65536); more go through one
 *     pinned host-to-device copy on an upload stream that overlaps the caller's earlier work (the
 *     caller's stream waits for it on the GPU). After the kernel an event is recorded on the
 *     caller's stream; a side stream waits for that event (cudaStreamWaitEvent, on the GPU),
 *     copies the results into pinned host memory and re-zeroes the device output (one small kernel
 *     writing the mapped pinned buffer) and records a done
 *     event. submit() never waits for the GPU, except when all `slots` result buffers are still in
 *     flight (then it waits for the oldest's copy).
 *  4. A reader polls kvc_cuda_query() or blocks in kvc_cuda_wait()/kvc_cuda_collect(), which wait only
 *     on that submit's done event (never on the compute stream, never on the device).
 *
 * Tickets: submit() returns an increasing ticket. The context keeps the results of the last `slots`
 * submits; once a ticket is collected, or `slots` newer submits have reused its slot, the ticket is
 * gone and every call with it returns KVC_ERANGE.
 *
 * Bytes read: the entries of the rows' groups, as in kvc_checksum.h. The kernel reads each byte once,
 * with 16-byte loads where the entry's addresses and sizes are 16-byte aligned (8-byte, or byte by
 * byte at unaligned part edges and strided elements, otherwise). One warp sums one work item (a
 * row's entry, or a chunk of it: a 1 MiB state row spreads over 32 warps). Results are exact
 * (uint64 arithmetic mod 2^64), so they equal kvc_sum_rows_cpu bit for bit whatever the order of the
 * GPU's additions.
 *
 * A context is bound to one device and is not thread-safe (one thread submits and collects, or the
 * caller locks). Each call makes the context's device current and restores the caller's device.
 * Errors: KVC_OK (0) or a negative KVC_E* code (kvc_checksum.h); kvc_cuda_last_error() tells more.
 */
#ifndef KVC_CHECKSUM_CUDA_H
#define KVC_CHECKSUM_CUDA_H

#include "kvc_checksum.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define KVC_CUDA_API
#else
#define KVC_CUDA_API __attribute__((visibility("default")))
#endif

/** kvc_cuda_query(): the submit's results are not in host memory yet. */
#define KVC_CUDA_PENDING 1

/** An opaque context: device tables, streams, events, pinned and device staging. */
typedef struct kvc_cuda_ctx kvc_cuda_ctx;

/** Context options; zero fields take the defaults. */
typedef struct kvc_cuda_options {
  uint32_t slots;        /**< submits whose results can be in flight at once (default 8, max 64) */
  uint32_t max_rows;     /**< rows per submit the staging holds without growing (default 4096) */
  uint32_t max_out;      /**< output values per submit the staging holds without growing (default 16384) */
  uint32_t chunk_bytes;  /**< about the bytes one warp sums per work item (default 32768; 1024..1 MiB) */
} kvc_cuda_options;

/**
 * Number of CUDA devices the driver reports. KVC_OK with *count >= 1, or KVC_ENOCUDA (no driver,
 * no device; *count = 0 and kvc_cuda_probe_error() says why).
 */
KVC_CUDA_API int kvc_cuda_device_count(int* count);

/** Why the last kvc_cuda_device_count() found no device ("" when it found one). Static storage. */
KVC_CUDA_API const char* kvc_cuda_probe_error(void);

/** The CUDA runtime version this library was built with (e.g. 13000), and the driver's (0: none). */
KVC_CUDA_API int kvc_cuda_versions(int* runtime_version, int* driver_version);

/**
 * Creates a context on `device` (options may be NULL) and warms the kernel up.
 * Returns KVC_OK, KVC_ENOCUDA (no such device), KVC_ECUDA or KVC_EINVAL (bad options).
 */
KVC_CUDA_API int kvc_cuda_create(int device, const kvc_cuda_options* options, kvc_cuda_ctx** ctx);

/** Waits for the context's work in flight, then frees everything. NULL is a no-op. */
KVC_CUDA_API void kvc_cuda_destroy(kvc_cuda_ctx* ctx);

/**
 * Validates and uploads the tables of every group. region_addr[r] is the device address of region r,
 * region_bytes[r] its size (n_regions of each). Replaces earlier tables (after the work in flight
 * that reads them has finished: this call may wait). On an error the earlier tables stay.
 * Returns KVC_OK, KVC_EINVAL (malformed entry), KVC_ERANGE (an entry reaches outside its region,
 * or names a region >= n_regions) or KVC_ECUDA.
 */
KVC_CUDA_API int kvc_cuda_set_tables(kvc_cuda_ctx* ctx, const kvc_tables* tables,
                                     const uint64_t* region_addr, const uint64_t* region_bytes,
                                     uint32_t n_regions);

/**
 * Enqueues one step: for every row, every entry of its group adds into
 * result[row.out_offset + entry.column] (result: out_len uint64, zero before this submit).
 * `stream` is the caller's cudaStream_t (NULL: the legacy default stream); the KV the rows name must
 * be written by work already enqueued on that stream (or ordered before it). Nothing is enqueued on
 * an error. Returns KVC_OK with *ticket set, KVC_EINVAL (no tables, malformed row), KVC_ERANGE
 * (group, block id or output index out of range) or KVC_ECUDA.
 */
KVC_CUDA_API int kvc_cuda_submit(kvc_cuda_ctx* ctx, const kvc_row* rows, size_t n_rows,
                                 size_t out_len, void* stream, uint64_t* ticket);

/** KVC_OK if the ticket's results are in host memory, KVC_CUDA_PENDING if not yet, else an error. */
KVC_CUDA_API int kvc_cuda_query(kvc_cuda_ctx* ctx, uint64_t ticket);

/**
 * Blocks until the ticket's results are in host memory (its done event only). Once kvc_cuda_query()
 * said done, it returns at once without a synchronizing call (so does kvc_cuda_collect()).
 */
KVC_CUDA_API int kvc_cuda_wait(kvc_cuda_ctx* ctx, uint64_t ticket);

/**
 * Waits for the ticket, adds its out_len results into out[0..out_len) (mod 2^64, like the CPU
 * kernel's out), and releases the ticket. out_len must equal the submit's. Returns KVC_OK,
 * KVC_ERANGE (unknown, expired or collected ticket; out_len differs) or KVC_ECUDA.
 */
KVC_CUDA_API int kvc_cuda_collect(kvc_cuda_ctx* ctx, uint64_t ticket, uint64_t* out, size_t out_len);

/**
 * Synchronizing CUDA runtime calls this library has made in this process, over every context and the
 * device memory helpers below: calls that may block the calling thread until device work finishes
 * (cudaDeviceSynchronize, cudaStreamSynchronize, cudaEventSynchronize, blocking cudaMemcpy and
 * cudaMemset) or that synchronize implicitly (cudaMalloc, cudaFree, cudaHostAlloc, cudaFreeHost).
 * A steady-state step (submit, then query until done, then collect) makes none: the difference of
 * two readings around it is 0. Context creation, kvc_cuda_set_tables, a submit that grows its
 * staging or finds every slot in flight, kvc_cuda_wait on a pending ticket and kvc_cuda_destroy do.
 * Thread-safe (an atomic counter); never reset.
 */
KVC_CUDA_API unsigned long long kvc_cuda_sync_calls(void);

/** The context's last error message ("" if none). Valid until the next call on the context. */
KVC_CUDA_API const char* kvc_cuda_last_error(const kvc_cuda_ctx* ctx);

/**
 * Device memory helpers for tests and tools that have no CUDA framework of their own (the Node
 * tests): plain cudaMalloc/cudaFree and synchronous copies on `device`.
 */
KVC_CUDA_API int kvc_cuda_dev_alloc(int device, size_t bytes, uint64_t* addr);
KVC_CUDA_API int kvc_cuda_dev_free(int device, uint64_t addr);
KVC_CUDA_API int kvc_cuda_copy_to_device(int device, uint64_t dst, const void* src, size_t bytes);
KVC_CUDA_API int kvc_cuda_copy_to_host(int device, void* dst, uint64_t src, size_t bytes);

#ifdef __cplusplus
}
#endif
#endif /* KVC_CHECKSUM_CUDA_H */
