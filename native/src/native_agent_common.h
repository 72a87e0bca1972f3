/**
 * @file native_agent_common.h
 * @brief What the run-time-loaded transfer-agent shims (nixl_addon.cc, mooncake_addon.cc) share:
 *        dlopen with sibling preload, the library registry, the `load(candidates)` and
 *        `addressOf` bindings, argument checks, and the per-agent native worker thread with its
 *        command queue, thread-safe function and promise plumbing.
 */
#pragma once

#include <dlfcn.h>
#include <napi.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kvc_agent {

constexpr double kMaxSafe = 9007199254740991.0;  // 2^53 - 1

Napi::Value ThrowType(Napi::Env env, const std::string& msg);
Napi::Value ThrowRange(Napi::Env env, const std::string& msg);

// ---------------------------------------------------------------------------------------------
// Library loading

/**
 * dlopen(path, RTLD_NOW | RTLD_LOCAL); when a dependency is missing, loads it from the same
 * directory first and retries. `recursive`: a dependency's own missing siblings are loaded the
 * same way and `budget` bounds the total number of dlopen attempts over the recursion; otherwise
 * `budget` bounds the attempts on `path` and dependencies are dlopen'ed plainly.
 */
void* OpenWithSiblings(const std::string& path, std::string* err, int budget, bool recursive);

template <typename F>
void Sym(void* h, const char* name, F* out, bool required, std::string* missing) {
  void* p = dlsym(h, name);
  *out = reinterpret_cast<F>(p);
  if (!p && required) {
    if (!missing->empty()) *missing += ", ";
    *missing += name;
  }
}

template <class Api>
struct Lib {
  std::string path;
  void* handle = nullptr;
  Api api{};
};

template <class Api>
std::map<std::string, std::unique_ptr<Lib<Api>>>& Libs() {
  static std::map<std::string, std::unique_ptr<Lib<Api>>> m;  // never unloaded
  return m;
}

void CloseLib(void* h);

/**
 * Loads `path` (a file path, or a bare soname searched on the library path) once and resolves the
 * API with `resolve(handle, api, &missing)`; a missing required symbol fails the load.
 */
template <class Api, class Resolve>
Lib<Api>* LoadLib(const std::string& path, std::string* err, int budget, bool recursive, Resolve resolve) {
  auto& libs = Libs<Api>();
  auto it = libs.find(path);
  if (it != libs.end()) return it->second.get();
  void* h = OpenWithSiblings(path, err, budget, recursive);
  if (!h) return nullptr;
  auto lib = std::make_unique<Lib<Api>>();
  lib->path = path;
  lib->handle = h;
  std::string missing;
  resolve(h, lib->api, &missing);
  if (!missing.empty()) {
    *err = "missing symbols: " + missing;
    CloseLib(h);
    return nullptr;
  }
  Lib<Api>* out = lib.get();
  libs[path] = std::move(lib);
  return out;
}

/** The API of the library loaded from `path`, or null after throwing TypeError(`not_loaded` + path). */
template <class Api>
const Api* LoadedApi(Napi::Env env, const std::string& path, const char* not_loaded) {
  auto it = Libs<Api>().find(path);
  if (it == Libs<Api>().end()) {
    ThrowType(env, not_loaded + path);
    return nullptr;
  }
  return &it->second->api;
}

/**
 * The body of a `load(candidates: string[])` binding: { ok, path, tried } for the first candidate
 * that `load(path, &err)` loads; `extra(result, lib)` adds fields. Never throws for a missing library.
 */
template <class LibT, class LoadFn, class Extra>
Napi::Value LoadCandidates(const Napi::CallbackInfo& info, const char* usage, const char* not_strings, LoadFn load, Extra extra) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsArray()) return ThrowType(env, usage);
  Napi::Array c = info[0].As<Napi::Array>();
  uint32_t n = c.Length();
  if (env.IsExceptionPending()) return env.Undefined();
  std::vector<std::string> tried;
  LibT* lib = nullptr;
  for (uint32_t i = 0; i < n && !lib; ++i) {
    Napi::Value v = c.Get(i);
    if (env.IsExceptionPending()) return env.Undefined();
    if (!v.IsString()) return ThrowType(env, not_strings);
    std::string path = v.As<Napi::String>().Utf8Value();
    std::string err;
    lib = load(path, &err);
    if (!lib) tried.push_back(path + ": " + err);
  }
  Napi::Object r = Napi::Object::New(env);
  r.Set("ok", Napi::Boolean::New(env, lib != nullptr));
  r.Set("path", lib ? Napi::String::New(env, lib->path) : env.Null());
  Napi::Array t = Napi::Array::New(env, tried.size());
  for (size_t i = 0; i < tried.size(); ++i) t.Set((uint32_t)i, Napi::String::New(env, tried[i]));
  r.Set("tried", t);
  extra(r, lib);
  if (env.IsExceptionPending()) return env.Undefined();
  return r;
}

/** addressOf(view: TypedArray | DataView): number: the address of the view's first byte. */
Napi::Value AddressOf(const Napi::CallbackInfo& info);

/** A number field of a config object: `dflt` when absent, not a number or outside [lo, hi]. */
double CfgNum(Napi::Object cfg, const char* k, double dflt, double lo, double hi);

// ---------------------------------------------------------------------------------------------
// The per-agent worker thread

/** The state every agent shares; the agent's own state derives from it and adds `queue`. */
struct WorkerCommon {
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;                                        // guarded by mu
  std::vector<std::pair<std::string, std::string>> notifs;  // guarded by mu
  napi_threadsafe_function tsfn = nullptr;
  std::thread thread;

  // JS thread only
  int pending = 0;
  std::unordered_map<uint32_t, bool> js_active;
  bool refd = false;
  bool hook = false;
  napi_env env = nullptr;
};

/** Keeps the event loop alive exactly while commands or reported transfers are outstanding. */
void UpdateRef(WorkerCommon& st);
/** Stops the worker thread and joins it. */
void JoinThread(WorkerCommon& st);
/** Removes the environment cleanup hook when it is still installed. */
void RemoveCleanupHook(napi_env env, WorkerCommon& st);
/** The destructor of an agent object: joins its thread, removes the cleanup hook. */
void StopWorker(WorkerCommon& st);
/** takeNotifs(): flat [name, Buffer, name, Buffer, ...] received since the last call. */
Napi::Value TakeNotifs(Napi::Env env, WorkerCommon* st);
/** Rejects `d` with an Error(msg) whose `prop` is `code`; `clear`: clear an exception left pending first. */
void RejectWithCode(Napi::Env e, napi_deferred d, const std::string& msg, const char* prop, int code, bool clear);
/** Resolves `d` with `v`, or rejects it with the pending exception when there is one. */
void Settle(Napi::Env e, napi_deferred d, napi_value v);
/** Calls the status listener; a throwing listener must not kill the process. */
void CallListener(napi_env env, napi_value js_cb, size_t argc, const napi_value* args);
/** A command came back (JS thread): one less pending; a close joins the thread and removes the hook. */
void CommandDone(napi_env env, WorkerCommon& st, bool closes);

/** Hands `m` to the JS thread; drops it when the environment is going away. */
template <class Msg>
void Send(WorkerCommon& st, Msg* m) {
  if (napi_call_threadsafe_function(st.tsfn, m, napi_tsfn_nonblocking) != napi_ok) {
    delete m->cmd;  // the environment is going away
    delete m;
  }
}

template <class State>
void FinalizeTsfn(napi_env, void* data, void*) {
  auto* sp = static_cast<std::shared_ptr<State>*>(data);
  (*sp)->tsfn = nullptr;
  delete sp;
}

void CleanupHook(void* arg);

/**
 * Creates the thread-safe function (context: a shared_ptr to the state), starts `loop` on the
 * worker thread and installs the cleanup hook. Throws `error` and returns false on failure.
 */
template <class State>
bool StartWorker(Napi::Env env, const std::shared_ptr<State>& st, napi_value on_status, const char* resource, const std::string& error,
                 napi_threadsafe_function_call_js call_js, void (*loop)(std::shared_ptr<State>)) {
  st->env = env;
  napi_value name;
  napi_create_string_utf8(env, resource, NAPI_AUTO_LENGTH, &name);
  auto* ctx = new std::shared_ptr<State>(st);
  if (napi_create_threadsafe_function(env, on_status, nullptr, name, 0, 1, ctx, FinalizeTsfn<State>, ctx, call_js, &st->tsfn) != napi_ok) {
    delete ctx;
    ThrowType(env, error);
    return false;
  }
  napi_unref_threadsafe_function(env, st->tsfn);
  st->thread = std::thread(loop, st);
  napi_add_env_cleanup_hook(env, CleanupHook, static_cast<WorkerCommon*>(st.get()));
  st->hook = true;
  return true;
}

/**
 * The body of a thread-safe function's call_js: takes ownership of the message and its command,
 * returns when the environment is tearing down, else calls `handle(e, state, msg, cmd)` in a
 * handle scope.
 */
template <class State, class Msg, class Handle>
void DispatchToJs(napi_env env, void* context, void* data, Handle handle) {
  using Cmd = std::remove_pointer_t<decltype(Msg::cmd)>;
  Msg* m = static_cast<Msg*>(data);
  std::unique_ptr<Msg> guard(m);
  std::unique_ptr<Cmd> cmd(m->cmd);
  if (!env) return;  // tearing down
  State& st = **static_cast<std::shared_ptr<State>*>(context);
  Napi::Env e(env);
  Napi::HandleScope scope(e);
  handle(e, st, m, cmd.get());
}

/**
 * Queues `c` for the worker thread and returns its promise; when the thread is gone the promise is
 * rejected here with `<what><closed_suffix>` and `prop` = `closed_code`.
 */
template <class State, class Cmd>
Napi::Value Enqueue(Napi::Env env, const std::shared_ptr<State>& st, Cmd* c, const char* not_constructed, const char* closed_suffix,
                    const char* prop, int closed_code) {
  if (!st) {
    delete c;
    return ThrowType(env, not_constructed);
  }
  napi_value promise;
  if (napi_create_promise(env, &c->deferred, &promise) != napi_ok) {
    delete c;
    return ThrowType(env, "cannot create a promise");
  }
  {
    std::lock_guard<std::mutex> lk(st->mu);
    if (st->stop) {
      // The thread is gone: reject right here.
      RejectWithCode(env, c->deferred, std::string(c->what) + closed_suffix, prop, closed_code, false);
      delete c;
      return Napi::Value(env, promise);
    }
    st->queue.push_back(c);
  }
  st->pending++;
  UpdateRef(*st);
  st->cv.notify_one();
  return Napi::Value(env, promise);
}

/**
 * The worker thread: waits `wait_us(st)` when idle, runs queued commands in order with
 * `run(st, cmd)` and reports each with `done(cmd)` (a Msg*), calls `poll(st)`, and stops after a
 * close or a stop; then `teardown(st)`, fails the commands left with `closed(cmd)` and releases
 * the thread-safe function.
 */
template <class State, class WaitUs, class Run, class Done, class Poll, class Teardown, class Closed>
void RunLoop(State& st, WaitUs wait_us, Run run, Done done, Poll poll, Teardown teardown, Closed closed) {
  using CmdPtr = typename decltype(st.queue)::value_type;
  for (;;) {
    decltype(st.queue) batch;
    bool stopping;
    {
      std::unique_lock<std::mutex> lk(st.mu);
      if (st.queue.empty() && !st.stop) st.cv.wait_for(lk, std::chrono::microseconds(wait_us(st)));
      batch.swap(st.queue);
      stopping = st.stop;
    }
    bool closing = false;
    for (CmdPtr c : batch) {
      run(st, c);
      if (c->closes) closing = true;
      Send(st, done(c));
    }
    poll(st);
    if (stopping || closing) break;
  }
  teardown(st);
  // Commands enqueued after the stop: fail them.
  decltype(st.queue) rest;
  {
    std::lock_guard<std::mutex> lk(st.mu);
    rest.swap(st.queue);
    st.stop = true;
  }
  for (CmdPtr c : rest) {
    closed(c);
    Send(st, done(c));
  }
  napi_release_threadsafe_function(st.tsfn, napi_tsfn_release);
}

}  // namespace kvc_agent
