/**
 * @file kvc_device.h
 * @brief Device memory for kvconnect's transfer agents and reference engine (C ABI over the CUDA
 *        runtime API; built with KVC_WITH_CUDA into the same library as kvc_checksum_cuda.h).
 *
 * What it provides:
 *  - device allocations with their CUDA IPC handle (cudaMalloc + cudaIpcGetMemHandle);
 *  - opening a peer process's IPC handle (cudaIpcOpenMemHandle, cudaIpcMemLazyEnablePeerAccess);
 *  - pinned host buffers for staging (cudaHostAlloc);
 *  - asynchronous copies on a stream whose completion is polled without blocking (an event
 *    recorded after the copy, cudaEventQuery), and synchronous copies;
 *  - a plain synchronous device-to-device cudaMemcpy (the baseline of bench/cuda).
 *
 * Bounds. The library keeps a table of the memory it handed out (device allocations, opened IPC
 * mappings, pinned host buffers; plus ranges declared with kvc_dev_adopt). Every copy's source and
 * destination range must lie inside one live entry of the right kind, else KVC_ERANGE and nothing
 * is enqueued: a copy never touches memory the library does not know. A freed entry is removed
 * before its memory is released. All functions are thread-safe.
 *
 * Upstream API: CUDA Runtime API, "Interprocess communication" and "Memory management"
 * (https://docs.nvidia.com/cuda/cuda-runtime-api/). A cudaIpcMemHandle_t is 64 bytes
 * (CUDA_IPC_HANDLE_SIZE); a handle opens only in another process of the same host (not in the
 * process that made it), and maps the whole allocation at its base address.
 *
 * Return codes are those of kvc_checksum.h (KVC_OK, KVC_EINVAL, KVC_ERANGE, KVC_ECUDA,
 * KVC_ENOCUDA) plus KVC_CUDA_PENDING from kvc_dev_event_query. kvc_dev_last_error() says why the
 * calling thread's last call failed.
 */
#ifndef KVC_DEVICE_H
#define KVC_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "kvc_checksum_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Bytes of a CUDA IPC memory handle (cudaIpcMemHandle_t). */
#define KVC_IPC_HANDLE_BYTES 64

/** Copy directions of kvc_dev_copy_async / kvc_dev_copy (as cudaMemcpyKind). */
#define KVC_COPY_H2D 1
#define KVC_COPY_D2H 2
#define KVC_COPY_D2D 3

/** cudaMalloc of `bytes` (> 0) on `device`; `handle` (64 bytes, may be NULL) gets its IPC handle. */
KVC_CUDA_API int kvc_dev_alloc(int device, size_t bytes, uint64_t* addr, uint8_t* handle);
/** Frees an allocation of kvc_dev_alloc (waits for the device first: no copy is left reading it). */
KVC_CUDA_API int kvc_dev_free(uint64_t addr);
/**
 * Opens a peer's IPC handle on `device`; *addr is the mapping's base (the peer allocation's first
 * byte). The runtime API does not tell a mapping's size: `bytes` is the size the peer advertised,
 * and copies through the mapping are bounded by it. Opening a handle that is open already returns
 * the same mapping and counts one more reference (kvc_dev_ipc_close drops one).
 */
KVC_CUDA_API int kvc_dev_ipc_open(int device, const uint8_t* handle, size_t bytes, uint64_t* addr);
/** Closes a mapping of kvc_dev_ipc_open (after the device finished with it). */
KVC_CUDA_API int kvc_dev_ipc_close(uint64_t addr);
/** Declares device memory allocated elsewhere (a framework's tensor) so that copies may use it. */
KVC_CUDA_API int kvc_dev_adopt(int device, uint64_t addr, size_t bytes);
/** Forgets a range declared with kvc_dev_adopt. */
KVC_CUDA_API int kvc_dev_unadopt(uint64_t addr);

/** cudaHostAlloc (portable) of `bytes` (> 0) pinned host memory. */
KVC_CUDA_API int kvc_dev_host_alloc(size_t bytes, void** ptr);
/** Frees a buffer of kvc_dev_host_alloc (synchronizes the device first). */
KVC_CUDA_API int kvc_dev_host_free(void* ptr);

/** cudaStreamCreateWithFlags(cudaStreamNonBlocking) on `device`. */
KVC_CUDA_API int kvc_dev_stream_create(int device, uint64_t* stream);
KVC_CUDA_API int kvc_dev_stream_destroy(uint64_t stream);

/**
 * Enqueues a copy of `bytes` on `stream` (0: the legacy default stream) of `device`, then an event;
 * *event identifies it for kvc_dev_event_query / kvc_dev_event_release. Host ranges (H2D source,
 * D2H destination) must lie in a pinned buffer of kvc_dev_host_alloc; device ranges in an
 * allocation, an IPC mapping or an adopted range.
 */
KVC_CUDA_API int kvc_dev_copy_async(int device, uint64_t dst, uint64_t src, size_t bytes, int kind,
                                    uint64_t stream, uint64_t* event);
/** KVC_OK once the event's copy finished, KVC_CUDA_PENDING before, KVC_ECUDA if it failed. Never blocks. */
KVC_CUDA_API int kvc_dev_event_query(uint64_t event);
/** Blocks until the event's copy finished. */
KVC_CUDA_API int kvc_dev_event_wait(uint64_t event);
/** Releases an event (its copy may still run; its completion is then no longer observable). */
KVC_CUDA_API int kvc_dev_event_release(uint64_t event);

/**
 * Synchronous copy (cudaMemcpy; D2D then waits for the default stream): the copy has finished
 * when it returns. H2D source / D2H destination may be any host memory (pageable too): the host
 * side is the caller's; the device side is bounds-checked as above.
 */
KVC_CUDA_API int kvc_dev_copy(int device, uint64_t dst, uint64_t src, size_t bytes, int kind);

/** Why the calling thread's last kvc_dev_* call failed ("" after a success). Thread-local storage. */
KVC_CUDA_API const char* kvc_dev_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* KVC_DEVICE_H */
