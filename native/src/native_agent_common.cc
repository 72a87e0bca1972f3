/**
 * @file native_agent_common.cc
 * @brief The non-template parts of native_agent_common.h.
 */
#include "native_agent_common.h"

#include <dlfcn.h>

#include <cstdint>

namespace kvc_agent {

Napi::Value ThrowType(Napi::Env env, const std::string& msg) {
  if (!env.IsExceptionPending()) Napi::TypeError::New(env, msg).ThrowAsJavaScriptException();
  return env.Undefined();
}
Napi::Value ThrowRange(Napi::Env env, const std::string& msg) {
  if (!env.IsExceptionPending()) Napi::RangeError::New(env, msg).ThrowAsJavaScriptException();
  return env.Undefined();
}

namespace {

std::string DirName(const std::string& p) {
  size_t i = p.rfind('/');
  return i == std::string::npos ? std::string() : p.substr(0, i);
}

void* OpenIn(const std::string& path, int mode, std::string* err, int* budget, bool recursive) {
  const std::string dir = DirName(path);
  while ((*budget)-- > 0) {
    dlerror();
    void* h = dlopen(path.c_str(), mode);
    if (h) return h;
    const char* e = dlerror();
    *err = e ? e : "dlopen failed";
    if (dir.empty()) return nullptr;
    // "libfoo.so.1: cannot open shared object file: No such file or directory"
    size_t colon = err->find(": cannot open shared object file");
    if (colon == std::string::npos) return nullptr;
    size_t start = err->rfind(' ', colon);
    std::string dep = err->substr(start == std::string::npos ? 0 : start + 1, colon - (start == std::string::npos ? 0 : start + 1));
    if (dep.empty() || dep.find('/') != std::string::npos || dep == path) return nullptr;  // the file itself is missing
    std::string dep_path = dir + "/" + dep;
    if (dep_path == path) return nullptr;
    if (recursive) {
      std::string dep_err;
      if (!OpenIn(dep_path, RTLD_NOW | RTLD_GLOBAL, &dep_err, budget, true)) return nullptr;  // not next to it: give up
    } else if (!dlopen(dep_path.c_str(), RTLD_NOW | RTLD_GLOBAL)) {
      return nullptr;
    }
  }
  return nullptr;
}

}  // namespace

void* OpenWithSiblings(const std::string& path, std::string* err, int budget, bool recursive) {
  return OpenIn(path, RTLD_NOW | RTLD_LOCAL, err, &budget, recursive);
}

void CloseLib(void* h) { dlclose(h); }

Napi::Value AddressOf(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  napi_env e = env;
  if (info.Length() < 1) return ThrowType(env, "addressOf(view)");
  bool is = false;
  void* data = nullptr;
  napi_value ab;
  size_t len, off;
  if (napi_is_typedarray(e, info[0], &is) == napi_ok && is) {
    napi_typedarray_type t;
    if (napi_get_typedarray_info(e, info[0], &t, &len, &data, &ab, &off) != napi_ok) return ThrowType(env, "addressOf: cannot read the view");
  } else if (napi_is_dataview(e, info[0], &is) == napi_ok && is) {
    if (napi_get_dataview_info(e, info[0], &len, &data, &ab, &off) != napi_ok) return ThrowType(env, "addressOf: cannot read the view");
  } else {
    return ThrowType(env, "addressOf: expected a TypedArray or DataView");
  }
  double a = (double)reinterpret_cast<uintptr_t>(data);
  if (a > kMaxSafe) return ThrowRange(env, "addressOf: address above 2^53");
  return Napi::Number::New(env, a);
}

double CfgNum(Napi::Object cfg, const char* k, double dflt, double lo, double hi) {
  Napi::Value v = cfg.Get(k);
  double d = v.IsNumber() ? v.As<Napi::Number>().DoubleValue() : dflt;
  return d >= lo && d <= hi ? d : dflt;
}

void UpdateRef(WorkerCommon& st) {
  bool want = st.pending > 0 || !st.js_active.empty();
  if (want == st.refd || !st.tsfn) return;
  if (want) napi_ref_threadsafe_function(st.env, st.tsfn);
  else napi_unref_threadsafe_function(st.env, st.tsfn);
  st.refd = want;
}

void JoinThread(WorkerCommon& st) {
  {
    std::lock_guard<std::mutex> lk(st.mu);
    st.stop = true;
  }
  st.cv.notify_all();
  if (st.thread.joinable()) st.thread.join();
}

void CleanupHook(void* arg) {
  WorkerCommon* st = static_cast<WorkerCommon*>(arg);
  st->hook = false;
  JoinThread(*st);
}

void RemoveCleanupHook(napi_env env, WorkerCommon& st) {
  if (st.hook) {
    napi_remove_env_cleanup_hook(env, CleanupHook, &st);
    st.hook = false;
  }
}

void StopWorker(WorkerCommon& st) {
  JoinThread(st);
  RemoveCleanupHook(st.env, st);
}

Napi::Value TakeNotifs(Napi::Env env, WorkerCommon* st) {
  std::vector<std::pair<std::string, std::string>> got;
  if (st) {
    std::lock_guard<std::mutex> lk(st->mu);
    got.swap(st->notifs);
  }
  Napi::Array out = Napi::Array::New(env, got.size() * 2);
  for (size_t i = 0; i < got.size(); ++i) {
    out.Set((uint32_t)(2 * i), Napi::String::New(env, got[i].first));
    out.Set((uint32_t)(2 * i + 1), Napi::Buffer<char>::Copy(env, got[i].second.data(), got[i].second.size()));
  }
  if (env.IsExceptionPending()) return env.Undefined();
  return out;
}

void RejectWithCode(Napi::Env e, napi_deferred d, const std::string& msg, const char* prop, int code, bool clear) {
  Napi::Error err = Napi::Error::New(e, msg);
  err.Set(prop, Napi::Number::New(e, code));
  napi_value ev = err.Value();
  if (clear && e.IsExceptionPending()) {
    napi_value ex;
    napi_get_and_clear_last_exception(e, &ex);
  }
  napi_reject_deferred(e, d, ev);
}

void Settle(Napi::Env e, napi_deferred d, napi_value v) {
  if (e.IsExceptionPending()) {
    napi_value ex;
    napi_get_and_clear_last_exception(e, &ex);
    napi_reject_deferred(e, d, ex);
    return;
  }
  napi_resolve_deferred(e, d, v);
}

void CallListener(napi_env env, napi_value js_cb, size_t argc, const napi_value* args) {
  napi_value undef, res;
  napi_get_undefined(env, &undef);
  if (napi_call_function(env, undef, js_cb, argc, args, &res) != napi_ok) {
    napi_value ex;
    napi_get_and_clear_last_exception(env, &ex);  // a throwing listener must not kill the process
  }
}

void CommandDone(napi_env env, WorkerCommon& st, bool closes) {
  st.pending--;
  if (closes) {
    JoinThread(st);
    RemoveCleanupHook(env, st);
  }
}

}  // namespace kvc_agent
