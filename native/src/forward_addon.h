// Registers the forward-pass bindings (forward_addon.cc) on the addon's exports.
#ifndef KVC_FORWARD_ADDON_H
#define KVC_FORWARD_ADDON_H
#include <napi.h>
void KvcRegisterForward(Napi::Env env, Napi::Object exports);
#endif
