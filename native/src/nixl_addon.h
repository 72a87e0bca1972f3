/**
 * @file nixl_addon.h
 * @brief The transfer half of the N-API addon (src/nixl_addon.cc): the NIXL C API loaded at run
 *        time with dlopen, behind `exports.transfer`.
 */
#ifndef KVC_NIXL_ADDON_H
#define KVC_NIXL_ADDON_H

#include <napi.h>

/**
 * Adds `exports.transfer` = { nixlLoad, NixlAgentCore, addressOf }. Called once from the addon's
 * Init; never throws a C++ exception (NAPI_DISABLE_CPP_EXCEPTIONS); on failure it leaves a
 * pending JS exception. Loading the addon never loads NIXL: only `nixlLoad` does.
 * @param env      the module's environment
 * @param exports  the addon's exports object
 */
void KvcRegisterTransfer(Napi::Env env, Napi::Object exports);

#endif  // KVC_NIXL_ADDON_H
