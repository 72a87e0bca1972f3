/**
 * @file addon_device.h
 * @brief The device-memory half of the N-API addon (src/addon_device.cc, built only with
 *        KVC_WITH_CUDA): `exports.device`, bindings of include/kvc_device.h.
 */
#ifndef KVC_ADDON_DEVICE_H
#define KVC_ADDON_DEVICE_H

#include <napi.h>

/**
 * Adds `exports.device`. Called once from the addon's Init when compiled with KVC_WITH_CUDA.
 * Built with NAPI_DISABLE_CPP_EXCEPTIONS: on failure it leaves a pending JS exception.
 */
void KvcRegisterDevice(Napi::Env env, Napi::Object exports);

#endif  // KVC_ADDON_DEVICE_H
