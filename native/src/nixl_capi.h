/**
 * @file nixl_capi.h
 * @brief Our own declarations of the NIXL C API (`libnixl_capi.so`, declared by NIXL in
 *        src/bindings/rust/wrapper.h, which is not installed), as function-pointer types
 *        resolved at run time with dlsym. Written against NIXL 1.4.0.
 *
 * ABI notes:
 *  - Handles are opaque pointers; statuses are C enums (int).
 *  - `nixl_capi_create_xfer_dlist` / `nixl_capi_create_reg_dlist` took a third `bool sorted`
 *    argument before 1.0 and take two since. We call them with three arguments, the third
 *    false: on x86-64 SysV and AArch64 AAPCS the extra register argument is ignored by the
 *    two-argument version and read as "not sorted" by the old one.
 *  - Metadata blobs, notif messages and agent names given back are binary-safe (pointer plus
 *    length) except agent names (NUL-terminated); blobs and names from get_local_md /
 *    load_remote_md are malloc'd and owned by the caller.
 */
#ifndef KVC_NIXL_CAPI_H
#define KVC_NIXL_CAPI_H

#include <cstddef>
#include <cstdint>

namespace kvc_nixl {

enum Status : int {
  kSuccess = 0,
  kInProg = 1,
  kErrInvalidParam = -1,
  kErrBackend = -2,
  kErrInvalidState = -3,
  kErrException = -4,
  kErrNoTelemetry = -5,
  kErrNotFound = -6,
};

enum MemType : int { kDram = 0, kVram = 1 };
enum XferOp : int { kRead = 0, kWrite = 1 };

typedef void* Agent;
typedef void* Params;
typedef void* MemList;
typedef void* Backend;
typedef void* OptArgs;
typedef void* XferDlist;
typedef void* RegDlist;
typedef void* DlistHandle;
typedef void* XferReq;
typedef void* NotifMap;

/** nixl_capi_agent_config_t (1.4.0). */
struct AgentConfig {
  bool enable_prog_thread;
  bool enable_listen_thread;
  int listen_port;
  int thread_sync;  // 0 NONE, 1 STRICT, 2 RW
  unsigned int num_workers;
  uint64_t pthr_delay_us;
  uint64_t lthr_delay_us;
  bool capture_telemetry;
};

/** The functions the shim calls; `optional` ones may be null. */
struct Api {
  int (*create_agent)(const char*, Agent*);
  int (*create_configured_agent)(const char*, const AgentConfig*, Agent*);  // optional
  int (*destroy_agent)(Agent);
  int (*get_local_md)(Agent, void**, size_t*);
  int (*load_remote_md)(Agent, const void*, size_t, char**);
  int (*invalidate_remote_md)(Agent, const char*);
  int (*get_plugin_params)(Agent, const char*, MemList*, Params*);
  int (*destroy_mem_list)(MemList);
  int (*create_params)(Params*);                          // optional
  int (*params_add)(Params, const char*, const char*);     // optional
  int (*destroy_params)(Params);
  int (*create_backend)(Agent, const char*, Params, Backend*);
  int (*destroy_backend)(Backend);
  int (*create_opt_args)(OptArgs*);
  int (*destroy_opt_args)(OptArgs);
  int (*opt_args_set_notif_msg)(OptArgs, const void*, size_t);
  int (*opt_args_set_has_notif)(OptArgs, bool);
  int (*create_reg_dlist)(int, RegDlist*, bool);
  int (*destroy_reg_dlist)(RegDlist);
  int (*reg_dlist_add_desc)(RegDlist, uintptr_t, size_t, uint64_t, const void*, size_t);
  int (*register_mem)(Agent, RegDlist, OptArgs);
  int (*deregister_mem)(Agent, RegDlist, OptArgs);
  int (*create_xfer_dlist)(int, XferDlist*, bool);
  int (*destroy_xfer_dlist)(XferDlist);
  int (*xfer_dlist_add_desc)(XferDlist, uintptr_t, size_t, uint64_t);
  int (*prep_xfer_dlist)(Agent, const char*, XferDlist, DlistHandle*, OptArgs);
  int (*release_xfer_dlist_handle)(Agent, DlistHandle);
  int (*make_xfer_req)(Agent, int, DlistHandle, const int*, size_t, DlistHandle, const int*, size_t, XferReq*, OptArgs);
  int (*post_xfer_req)(Agent, XferReq, OptArgs);
  int (*get_xfer_status)(Agent, XferReq);
  int (*release_xfer_req)(Agent, XferReq);
  int (*destroy_xfer_req)(XferReq);
  int (*gen_notif)(Agent, const char*, const void*, size_t, OptArgs);
  int (*create_notif_map)(NotifMap*);
  int (*destroy_notif_map)(NotifMap);
  int (*get_notifs)(Agent, NotifMap, OptArgs);
  int (*notif_map_size)(NotifMap, size_t*);
  int (*notif_map_get_agent_at)(NotifMap, size_t, const char**);
  int (*notif_map_get_notifs_size)(NotifMap, const char*, size_t*);
  int (*notif_map_get_notif)(NotifMap, const char*, size_t, const void**, size_t*);
  int (*notif_map_clear)(NotifMap);
};

/** "SUCCESS", "IN_PROG", "ERROR_BACKEND", ... for a status code. */
inline const char* StatusName(int s) {
  switch (s) {
    case kSuccess: return "SUCCESS";
    case kInProg: return "IN_PROG";
    case kErrInvalidParam: return "ERROR_INVALID_PARAM";
    case kErrBackend: return "ERROR_BACKEND";
    case kErrInvalidState: return "ERROR_INVALID_STATE";
    case kErrException: return "ERROR_EXCEPTION";
    case kErrNoTelemetry: return "ERROR_NO_TELEMETRY";
    case kErrNotFound: return "ERROR_NOT_FOUND";
    default: return "UNKNOWN";
  }
}

}  // namespace kvc_nixl

#endif  // KVC_NIXL_CAPI_H
