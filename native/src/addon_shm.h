/**
 * @file addon_shm.h
 * @brief The shared-memory half of the N-API addon (src/addon_shm.cc): host memory in memfd
 *        mappings that other processes of the host can map, behind `exports.shm` (Linux only).
 */
#ifndef KVC_ADDON_SHM_H
#define KVC_ADDON_SHM_H

#include <napi.h>

/**
 * Adds `exports.shm` = { alloc, lookup, setGrant, map, headerBytes } (see addon_shm.cc). Called
 * once from the addon's Init; never throws a C++ exception.
 * @param env      the module's environment
 * @param exports  the addon's exports object
 */
void KvcRegisterShm(Napi::Env env, Napi::Object exports);

#endif  // KVC_ADDON_SHM_H
