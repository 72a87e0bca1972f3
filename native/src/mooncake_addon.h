/**
 * @file mooncake_addon.h
 * @brief The Mooncake half of the N-API addon (src/mooncake_addon.cc): the Mooncake Transfer
 *        Engine C API (`libtransfer_engine.so`) loaded at run time with dlopen, behind
 *        `exports.mooncake`.
 */
#ifndef KVC_MOONCAKE_ADDON_H
#define KVC_MOONCAKE_ADDON_H

#include <napi.h>

/**
 * Adds `exports.mooncake` = { load, addressOf, MooncakeEngineCore }. Called once from the
 * addon's Init; never throws a C++ exception (NAPI_DISABLE_CPP_EXCEPTIONS); on failure it leaves
 * a pending JS exception. Loading the addon never loads Mooncake: only `load` does.
 * @param env      the module's environment
 * @param exports  the addon's exports object
 */
void KvcRegisterMooncake(Napi::Env env, Napi::Object exports);

#endif  // KVC_MOONCAKE_ADDON_H
