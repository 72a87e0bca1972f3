/**
 * @file mooncake_capi.h
 * @brief Our own declarations of the Mooncake Transfer Engine C API (`libtransfer_engine.so`,
 *        declared by Mooncake in mooncake-transfer-engine/include/transfer_engine_c.h), as
 *        function-pointer types resolved at run time with dlsym.
 *
 * ABI notes:
 *  - `struct transfer_request` gained a `uint32_t file_id` after `target_id` in later releases;
 *    it sits in what was padding before, so the struct is 40 bytes with `target_offset` at
 *    offset 24 either way. We declare the newer layout and zero the field.
 *  - `notify_msg` strings are NUL-terminated and copied with strcpy (not binary-safe): callers
 *    encode binary payloads.
 *  - Return codes of submit/status/free are `Status::code()` ints (0 OK); openSegment returns a
 *    non-negative segment id or a negative error.
 */
#ifndef KVC_MOONCAKE_CAPI_H
#define KVC_MOONCAKE_CAPI_H

#include <cstddef>
#include <cstdint>

namespace kvc_mooncake {

typedef void* Engine;
typedef int32_t SegmentId;
typedef uint64_t BatchId;
constexpr BatchId kInvalidBatch = UINT64_MAX;
constexpr SegmentId kLocalSegment = 0;

enum Opcode : int { kRead = 0, kWrite = 1 };

enum TaskStatus : int {
  kWaiting = 0,
  kPending = 1,
  kInvalid = 2,
  kCanceled = 3,
  kCompleted = 4,
  kTimeout = 5,
  kFailed = 6,
};

struct TransferRequest {
  int opcode;
  void* source;
  SegmentId target_id;
  uint32_t file_id;
  uint64_t target_offset;  // the peer's absolute virtual address
  uint64_t length;
};
static_assert(sizeof(TransferRequest) == 40, "transfer_request must be 40 bytes");

struct TransferStatus {
  int status;
  uint64_t transferred_bytes;
};

struct NotifyMsg {
  char* name;
  char* msg;
};

/** The functions the addon calls; `optional` ones may be null. */
struct Api {
  Engine (*createTransferEngine)(const char*, const char*, const char*, uint64_t, int);
  void (*destroyTransferEngine)(Engine);
  int (*getLocalIpAndPort)(Engine, char*, size_t);
  SegmentId (*openSegment)(Engine, const char*);
  SegmentId (*openSegmentNoCache)(Engine, const char*);  // optional
  int (*closeSegment)(Engine, SegmentId);
  int (*syncSegmentCache)(Engine);                        // optional
  int (*registerLocalMemory)(Engine, void*, size_t, const char*, int);
  int (*unregisterLocalMemory)(Engine, void*);
  BatchId (*allocateBatchID)(Engine, size_t);
  int (*submitTransfer)(Engine, BatchId, TransferRequest*, size_t);
  int (*submitTransferWithNotify)(Engine, BatchId, TransferRequest*, size_t, NotifyMsg);
  int (*getTransferStatus)(Engine, BatchId, size_t, TransferStatus*);
  int (*freeBatchID)(Engine, BatchId);
  int (*genNotifyInEngine)(Engine, uint64_t, NotifyMsg);
  NotifyMsg* (*getNotifsFromEngine)(Engine, int*);
  int (*freeNotifsMsgBuf)(NotifyMsg*, int);
};

/** "COMPLETED", "FAILED", ... for a task status. */
inline const char* TaskStatusName(int s) {
  switch (s) {
    case kWaiting: return "WAITING";
    case kPending: return "PENDING";
    case kInvalid: return "INVALID";
    case kCanceled: return "CANCELED";
    case kCompleted: return "COMPLETED";
    case kTimeout: return "TIMEOUT";
    case kFailed: return "FAILED";
    default: return "UNKNOWN";
  }
}

}  // namespace kvc_mooncake

#endif  // KVC_MOONCAKE_CAPI_H
