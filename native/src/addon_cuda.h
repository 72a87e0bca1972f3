/**
 * @file addon_cuda.h
 * @brief The CUDA half of the N-API addon (src/addon_cuda.cc, built only with KVC_WITH_CUDA).
 */
#ifndef KVC_ADDON_CUDA_H
#define KVC_ADDON_CUDA_H

#include <napi.h>

/**
 * Adds the CUDA bindings to the addon's exports. Called once, at the end of the addon's Init,
 * only when the addon is compiled with KVC_WITH_CUDA. Built with NAPI_DISABLE_CPP_EXCEPTIONS:
 * it must not throw C++ exceptions; on failure it leaves a pending JS exception.
 * @param env      the module's environment
 * @param exports  the addon's exports object
 */
void KvcRegisterCuda(Napi::Env env, Napi::Object exports);

#endif  // KVC_ADDON_CUDA_H
