/**
 * @file nixl_addon.cc
 * @brief `exports.transfer`: NIXL's C API (`libnixl_capi.so`) loaded at run time with dlopen,
 *        behind an asynchronous agent object, plus `addressOf` for registering JS memory.
 *
 * Threading. NIXL agents are created with thread sync NONE and no progress thread
 * (docs/backends.md N1, N2: the progress thread spins with a zero delay and standalone notifs
 * were lost with it on), so every NIXL call of an agent happens on one native thread owned by
 * that agent. JS methods enqueue a command and get a promise; the thread runs commands in
 * order, then drives progress by polling `get_xfer_status` for posted transfers and
 * `get_notifs` (the target side must be polled too), then sleeps `pollUs` (transfers in
 * flight) or `idlePollUs` (none). Results, status changes and notifs come back through one
 * thread-safe function; nothing blocks the event loop, and the event loop is kept alive only
 * while commands or transfers are outstanding.
 *
 * Quirks handled (docs/backends.md N3-N6): post may return IN_PROG or SUCCESS; a request is
 * released before it is destroyed; the notif map is cleared after every poll; blobs and names
 * from the library are malloc'd and freed here; shared-memory UCX transports need
 * `ucx_error_handling_mode=none` (the TS side passes backend parameters through).
 *
 * Errors never crash the process: bad arguments throw TypeError/RangeError synchronously; a
 * failing NIXL call rejects its promise with an Error whose `status` is the C API status code.
 */
#include "nixl_addon.h"

#include <cstdint>
#include <cstdlib>
#include <functional>

#include "native_agent_common.h"
#include "nixl_capi.h"

namespace {

using namespace kvc_nixl;

using namespace kvc_agent;

// ---------------------------------------------------------------------------------------------
// Library loading

using NixlLib = kvc_agent::Lib<Api>;

/** Loads `path` (a file path, or a bare soname searched on the library path) and resolves the API. */
NixlLib* LoadLib(const std::string& path, std::string* err) {
  // NIXL's libraries have no RUNPATH: missing siblings are preloaded, recursively; NIXL with its
  // abseil libraries needs about 50 dlopen attempts.
  return kvc_agent::LoadLib<Api>(path, err, 512, true, [](void* h, Api& a, std::string* missing) {
#define REQ(f) Sym(h, "nixl_capi_" #f, &a.f, true, missing)
#define OPT(f) Sym(h, "nixl_capi_" #f, &a.f, false, missing)
    REQ(create_agent); OPT(create_configured_agent); REQ(destroy_agent); REQ(get_local_md); REQ(load_remote_md);
    REQ(invalidate_remote_md); REQ(get_plugin_params); REQ(destroy_mem_list); OPT(create_params); OPT(params_add);
    REQ(destroy_params); REQ(create_backend); REQ(destroy_backend); REQ(create_opt_args); REQ(destroy_opt_args);
    REQ(opt_args_set_notif_msg); REQ(opt_args_set_has_notif); REQ(create_reg_dlist); REQ(destroy_reg_dlist);
    REQ(reg_dlist_add_desc); REQ(register_mem); REQ(deregister_mem); REQ(create_xfer_dlist); REQ(destroy_xfer_dlist);
    REQ(xfer_dlist_add_desc); REQ(prep_xfer_dlist); REQ(release_xfer_dlist_handle); REQ(make_xfer_req);
    REQ(post_xfer_req); REQ(get_xfer_status); REQ(release_xfer_req); REQ(destroy_xfer_req); REQ(gen_notif);
    REQ(create_notif_map); REQ(destroy_notif_map); REQ(get_notifs); REQ(notif_map_size); REQ(notif_map_get_agent_at);
    REQ(notif_map_get_notifs_size); REQ(notif_map_get_notif); REQ(notif_map_clear);
#undef REQ
#undef OPT
  });
}

/** nixlLoad(candidates: string[]): { ok, path, tried: string[] }: the first candidate that loads with every symbol. Never throws for a missing library. */
Napi::Value NixlLoad(const Napi::CallbackInfo& info) {
  return LoadCandidates<NixlLib>(info, "nixlLoad(candidates: string[])", "nixlLoad: candidates must be strings", LoadLib,
                                 [](Napi::Object, NixlLib*) {});
}

// ---------------------------------------------------------------------------------------------
// Agent

struct Desc {
  uintptr_t addr;
  size_t len;
  uint64_t dev;
};

struct AgentState;

struct Cmd {
  const char* what = "";
  std::function<int(AgentState&, Cmd&)> fn;
  napi_deferred deferred = nullptr;
  bool status_result = false;  // resolve with the status number even when negative
  int status = 0;
  std::string err;
  enum { kUndef, kNum, kStr, kBuf } out = kUndef;
  double num = 0;
  std::string str;
  bool closes = false;
  bool tracks_xfer = false;  // a post: num is the transfer id
};

struct Msg {
  enum { kDone, kStatus } type;
  Cmd* cmd;
  uint32_t xfer;
  int code;
};

struct AgentState : WorkerCommon {
  const Api* api = nullptr;
  std::string name;
  std::string backend_name;
  std::vector<std::pair<std::string, std::string>> params;
  bool prog_thread = false;
  uint64_t prog_delay_us = 1000;
  int poll_us = 20;
  int idle_poll_us = 1000;
  std::deque<Cmd*> queue;  // guarded by mu

  // agent thread only
  Agent agent = nullptr;
  Backend backend = nullptr;
  NotifMap nmap = nullptr;
  std::unordered_map<uint32_t, DlistHandle> dlists;
  std::unordered_map<uint32_t, XferReq> xfers;
  std::map<uint32_t, XferReq> active;
  uint32_t next_id = 1;
  bool torn_down = false;
};

int Fail(Cmd& c, const char* fn, int rc) {
  c.err = std::string(fn) + ": " + StatusName(rc) + " (" + std::to_string(rc) + ")";
  return rc < 0 ? rc : kErrBackend;
}

void PollNotifs(AgentState& st) {
  const Api& a = *st.api;
  if (a.get_notifs(st.agent, st.nmap, nullptr) != kSuccess) return;
  size_t n = 0;
  if (a.notif_map_size(st.nmap, &n) != kSuccess || n == 0) {
    a.notif_map_clear(st.nmap);
    return;
  }
  std::vector<std::pair<std::string, std::string>> got;
  for (size_t i = 0; i < n; ++i) {
    const char* who = nullptr;
    size_t k = 0;
    if (a.notif_map_get_agent_at(st.nmap, i, &who) != kSuccess || !who) continue;
    std::string name(who);
    if (a.notif_map_get_notifs_size(st.nmap, name.c_str(), &k) != kSuccess) continue;
    for (size_t j = 0; j < k; ++j) {
      const void* d = nullptr;
      size_t len = 0;
      if (a.notif_map_get_notif(st.nmap, name.c_str(), j, &d, &len) != kSuccess) continue;
      got.emplace_back(name, std::string(static_cast<const char*>(d), d ? len : 0));
    }
  }
  a.notif_map_clear(st.nmap);  // get_notifs appends: clear between polls
  std::lock_guard<std::mutex> lk(st.mu);
  for (auto& g : got) st.notifs.push_back(std::move(g));
}

void Teardown(AgentState& st) {
  if (st.torn_down) return;
  st.torn_down = true;
  const Api& a = *st.api;
  for (auto& x : st.xfers) {
    a.release_xfer_req(st.agent, x.second);  // destroy needs release first
    a.destroy_xfer_req(x.second);
  }
  st.xfers.clear();
  st.active.clear();
  for (auto& d : st.dlists) a.release_xfer_dlist_handle(st.agent, d.second);
  st.dlists.clear();
  if (st.nmap) a.destroy_notif_map(st.nmap);
  st.nmap = nullptr;
  if (st.backend) a.destroy_backend(st.backend);
  st.backend = nullptr;
  if (st.agent) a.destroy_agent(st.agent);
  st.agent = nullptr;
}

void Loop(std::shared_ptr<AgentState> sp) {
  RunLoop(
      *sp, [](AgentState& st) { return st.active.empty() ? st.idle_poll_us : st.poll_us; },
      [](AgentState& st, Cmd* c) {
        if (st.torn_down && !c->closes) {
          c->status = kErrInvalidState;
          c->err = std::string(c->what) + ": the agent is closed";
        } else {
          c->status = c->fn(st, *c);
        }
      },
      [](Cmd* c) { return new Msg{Msg::kDone, c, 0, 0}; },
      [](AgentState& st) {
        if (!st.agent || st.torn_down) return;
        for (auto it = st.active.begin(); it != st.active.end();) {
          int rc = st.api->get_xfer_status(st.agent, it->second);
          if (rc == kInProg) {
            ++it;
            continue;
          }
          Send(st, new Msg{Msg::kStatus, nullptr, it->first, rc});
          it = st.active.erase(it);
        }
        PollNotifs(st);
      },
      Teardown,
      [](Cmd* c) {
        c->status = kErrInvalidState;
        c->err = std::string(c->what) + ": the agent is closed";
      });
}

void CallJs(napi_env env, napi_value js_cb, void* context, void* data) {
  DispatchToJs<AgentState, Msg>(env, context, data, [env, js_cb](Napi::Env e, AgentState& st, Msg* m, Cmd* cmd) {
    if (m->type == Msg::kStatus) {
      st.js_active.erase(m->xfer);
      UpdateRef(st);
      napi_value args[2] = {Napi::Number::New(e, m->xfer), Napi::Number::New(e, m->code)};
      CallListener(env, js_cb, 2, args);
      return;
    }
    Cmd& c = *cmd;
    CommandDone(env, st, c.closes);
    if (c.tracks_xfer && c.status == kInProg) st.js_active[(uint32_t)c.num] = true;
    UpdateRef(st);
    if (c.status < 0 && !c.status_result) {
      RejectWithCode(e, c.deferred, c.err.empty() ? std::string(c.what) + ": " + StatusName(c.status) : c.err, "status", c.status, true);
      return;
    }
    napi_value v;
    switch (c.out) {
      case Cmd::kNum: v = Napi::Number::New(e, c.num); break;
      case Cmd::kStr: v = Napi::String::New(e, c.str); break;
      case Cmd::kBuf: v = Napi::Buffer<char>::Copy(e, c.str.data(), c.str.size()); break;
      default: napi_get_undefined(env, &v); break;
    }
    if (c.status_result) v = Napi::Number::New(e, c.status);
    Settle(e, c.deferred, v);
  });
}

// ---- argument helpers (JS thread) ----

bool GetDescs(Napi::Env env, Napi::Value v, std::vector<Desc>* out, const char* what) {
  if (!v.IsTypedArray() || v.As<Napi::TypedArray>().TypedArrayType() != napi_float64_array) {
    ThrowType(env, std::string(what) + ": descriptors must be a Float64Array of (addr, length, deviceId) triples");
    return false;
  }
  Napi::Float64Array a = v.As<Napi::Float64Array>();
  size_t n = a.ElementLength();
  if (n % 3 != 0) {
    ThrowRange(env, std::string(what) + ": descriptor array length is not a multiple of 3");
    return false;
  }
  for (size_t i = 0; i < n; i += 3) {
    double x[3] = {a[i], a[i + 1], a[i + 2]};
    for (double d : x) {
      if (!(d >= 0 && d <= kMaxSafe && d == (double)(uint64_t)d)) {
        ThrowRange(env, std::string(what) + ": descriptor " + std::to_string(i / 3) + " has a value that is not an integer in [0, 2^53)");
        return false;
      }
    }
    out->push_back(Desc{(uintptr_t)(uint64_t)x[0], (size_t)(uint64_t)x[1], (uint64_t)x[2]});
  }
  return true;
}

bool GetBytes(Napi::Env env, Napi::Value v, std::string* out, bool* present, const char* what) {
  *present = false;
  if (v.IsNull() || v.IsUndefined()) return true;
  if (!v.IsTypedArray() || v.As<Napi::TypedArray>().TypedArrayType() != napi_uint8_array) {
    ThrowType(env, std::string(what) + " must be a Uint8Array or null");
    return false;
  }
  Napi::Uint8Array a = v.As<Napi::Uint8Array>();
  out->assign(reinterpret_cast<const char*>(a.Data()), a.ByteLength());
  *present = true;
  return true;
}

bool GetIndices(Napi::Env env, Napi::Value v, std::vector<int>* out, const char* what) {
  if (!v.IsTypedArray() || v.As<Napi::TypedArray>().TypedArrayType() != napi_int32_array) {
    ThrowType(env, std::string(what) + " must be an Int32Array");
    return false;
  }
  Napi::Int32Array a = v.As<Napi::Int32Array>();
  out->assign(a.Data(), a.Data() + a.ElementLength());
  return true;
}

bool GetU32(Napi::Env env, Napi::Value v, uint32_t* out, const char* what) {
  if (!v.IsNumber()) {
    ThrowType(env, std::string(what) + " must be a number");
    return false;
  }
  double d = v.As<Napi::Number>().DoubleValue();
  if (!(d >= 0 && d <= 4294967295.0 && d == (double)(uint32_t)d)) {
    ThrowRange(env, std::string(what) + " must be a uint32");
    return false;
  }
  *out = (uint32_t)d;
  return true;
}

/** Opt args carrying a notif (or null when there is none). */
int MakeNotifOpt(const Api& a, const std::string& notif, bool has, OptArgs* opt, Cmd& c) {
  *opt = nullptr;
  if (!has) return kSuccess;
  int rc = a.create_opt_args(opt);
  if (rc != kSuccess) return Fail(c, "nixl_capi_create_opt_args", rc);
  rc = a.opt_args_set_notif_msg(*opt, notif.data(), notif.size());
  if (rc == kSuccess) rc = a.opt_args_set_has_notif(*opt, true);
  if (rc != kSuccess) {
    a.destroy_opt_args(*opt);
    *opt = nullptr;
    return Fail(c, "nixl_capi_opt_args_set_notif_msg", rc);
  }
  return kSuccess;
}

class NixlAgentCore : public Napi::ObjectWrap<NixlAgentCore> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "NixlAgentCore",
                       {
                           InstanceMethod<&NixlAgentCore::Init>("init"),
                           InstanceMethod<&NixlAgentCore::RegisterMem>("registerMem"),
                           InstanceMethod<&NixlAgentCore::DeregisterMem>("deregisterMem"),
                           InstanceMethod<&NixlAgentCore::GetLocalMd>("getLocalMd"),
                           InstanceMethod<&NixlAgentCore::LoadRemoteMd>("loadRemoteMd"),
                           InstanceMethod<&NixlAgentCore::InvalidateRemoteMd>("invalidateRemoteMd"),
                           InstanceMethod<&NixlAgentCore::PrepDlist>("prepDlist"),
                           InstanceMethod<&NixlAgentCore::ReleaseDlist>("releaseDlist"),
                           InstanceMethod<&NixlAgentCore::MakeXfer>("makeXfer"),
                           InstanceMethod<&NixlAgentCore::Post>("post"),
                           InstanceMethod<&NixlAgentCore::ReleaseXfer>("releaseXfer"),
                           InstanceMethod<&NixlAgentCore::GenNotif>("genNotif"),
                           InstanceMethod<&NixlAgentCore::TakeNotifs>("takeNotifs"),
                           InstanceMethod<&NixlAgentCore::Close>("close"),
                       });
  }

  /** new NixlAgentCore(libPath, name, { backend, params: string[], progressThread, progressDelayUs, pollUs, idlePollUs }, onStatus) */
  NixlAgentCore(const Napi::CallbackInfo& info) : Napi::ObjectWrap<NixlAgentCore>(info) {
    Napi::Env env = info.Env();
    if (info.Length() < 4 || !info[0].IsString() || !info[1].IsString() || !info[2].IsObject() || !info[3].IsFunction()) {
      ThrowType(env, "new NixlAgentCore(libPath, name, config, onStatus)");
      return;
    }
    std::string path = info[0].As<Napi::String>().Utf8Value();
    const Api* api = LoadedApi<Api>(env, path, "NixlAgentCore: library not loaded (call nixlLoad first): ");
    if (!api) return;
    auto st = std::make_shared<AgentState>();
    st->api = api;
    st->name = info[1].As<Napi::String>().Utf8Value();
    Napi::Object cfg = info[2].As<Napi::Object>();
    Napi::Value b = cfg.Get("backend");
    st->backend_name = b.IsString() ? b.As<Napi::String>().Utf8Value() : "UCX";
    Napi::Value p = cfg.Get("params");
    if (p.IsArray()) {
      Napi::Array pa = p.As<Napi::Array>();
      for (uint32_t i = 0; i + 1 < pa.Length(); i += 2) {
        Napi::Value k = pa.Get(i), v = pa.Get(i + 1);
        if (!k.IsString() || !v.IsString()) {
          ThrowType(env, "NixlAgentCore: params must be strings");
          return;
        }
        st->params.emplace_back(k.As<Napi::String>().Utf8Value(), v.As<Napi::String>().Utf8Value());
      }
    }
    Napi::Value pt = cfg.Get("progressThread");
    st->prog_thread = pt.IsBoolean() && pt.As<Napi::Boolean>().Value();
    auto num = [&](const char* k, double dflt, double lo, double hi) { return CfgNum(cfg, k, dflt, lo, hi); };
    st->prog_delay_us = (uint64_t)num("progressDelayUs", 1000, 0, 1e7);
    st->poll_us = (int)num("pollUs", 20, 0, 1e6);
    st->idle_poll_us = (int)num("idlePollUs", 1000, 1, 1e7);
    if (env.IsExceptionPending()) return;
    if (!StartWorker(env, st, info[3], "kvconnect-nixl", "NixlAgentCore: cannot create a thread-safe function", CallJs, Loop)) return;
    st_ = st;
  }

  ~NixlAgentCore() override {
    if (st_) StopWorker(*st_);
  }

 private:
  std::shared_ptr<AgentState> st_;

  Napi::Value Enqueue(Napi::Env env, Cmd* c) {
    return kvc_agent::Enqueue(env, st_, c, "NixlAgentCore was not constructed", ": the agent is closed", "status", kErrInvalidState);
  }

  Napi::Value Init(const Napi::CallbackInfo& info) {
    Cmd* c = new Cmd();
    c->what = "init";
    c->fn = [](AgentState& st, Cmd& c) -> int {
      const Api& a = *st.api;
      int rc;
      if (a.create_configured_agent) {
        AgentConfig cfg{};
        cfg.enable_prog_thread = st.prog_thread;
        cfg.enable_listen_thread = false;
        cfg.listen_port = 0;
        cfg.thread_sync = 0;
        cfg.num_workers = 1;
        cfg.pthr_delay_us = st.prog_delay_us;
        cfg.lthr_delay_us = 100000;
        cfg.capture_telemetry = false;
        rc = a.create_configured_agent(st.name.c_str(), &cfg, &st.agent);
        if (rc != kSuccess) return Fail(c, "nixl_capi_create_configured_agent", rc);
      } else {
        rc = a.create_agent(st.name.c_str(), &st.agent);  // progress thread on (C API default)
        if (rc != kSuccess) return Fail(c, "nixl_capi_create_agent", rc);
      }
      rc = a.create_notif_map(&st.nmap);
      if (rc != kSuccess) return Fail(c, "nixl_capi_create_notif_map", rc);
      Params params = nullptr;
      if (a.create_params && a.params_add) {
        rc = a.create_params(&params);
        if (rc != kSuccess) return Fail(c, "nixl_capi_create_params", rc);
        for (auto& kv : st.params) {
          rc = a.params_add(params, kv.first.c_str(), kv.second.c_str());
          if (rc != kSuccess) {
            a.destroy_params(params);
            return Fail(c, "nixl_capi_params_add", rc);
          }
        }
      } else {
        MemList mems = nullptr;
        rc = a.get_plugin_params(st.agent, st.backend_name.c_str(), &mems, &params);
        if (rc != kSuccess) return Fail(c, "nixl_capi_get_plugin_params", rc);
        a.destroy_mem_list(mems);
        if (!st.params.empty()) {
          a.destroy_params(params);
          c.err = "backend parameters need nixl_capi_params_add (NIXL >= 1.0)";
          return kErrInvalidParam;
        }
      }
      rc = a.create_backend(st.agent, st.backend_name.c_str(), params, &st.backend);
      a.destroy_params(params);
      if (rc != kSuccess) return Fail(c, "nixl_capi_create_backend", rc);
      return kSuccess;
    };
    return Enqueue(info.Env(), c);
  }

  Napi::Value RegImpl(const Napi::CallbackInfo& info, bool reg) {
    Napi::Env env = info.Env();
    uint32_t mem;
    auto descs = std::make_shared<std::vector<Desc>>();
    if (info.Length() < 2 || !GetU32(env, info[0], &mem, "memType") || !GetDescs(env, info[1], descs.get(), reg ? "registerMem" : "deregisterMem"))
      return ThrowType(env, "registerMem(memType, descs)");
    Cmd* c = new Cmd();
    c->what = reg ? "registerMem" : "deregisterMem";
    c->fn = [mem, descs, reg](AgentState& st, Cmd& c) -> int {
      const Api& a = *st.api;
      RegDlist d = nullptr;
      int rc = a.create_reg_dlist((int)mem, &d, false);
      if (rc != kSuccess) return Fail(c, "nixl_capi_create_reg_dlist", rc);
      for (const Desc& x : *descs) {
        rc = a.reg_dlist_add_desc(d, x.addr, x.len, x.dev, nullptr, 0);
        if (rc != kSuccess) {
          a.destroy_reg_dlist(d);
          return Fail(c, "nixl_capi_reg_dlist_add_desc", rc);
        }
      }
      rc = reg ? a.register_mem(st.agent, d, nullptr) : a.deregister_mem(st.agent, d, nullptr);
      a.destroy_reg_dlist(d);
      if (rc != kSuccess) return Fail(c, reg ? "nixl_capi_register_mem" : "nixl_capi_deregister_mem", rc);
      return kSuccess;
    };
    return Enqueue(env, c);
  }
  Napi::Value RegisterMem(const Napi::CallbackInfo& info) { return RegImpl(info, true); }
  Napi::Value DeregisterMem(const Napi::CallbackInfo& info) { return RegImpl(info, false); }

  Napi::Value GetLocalMd(const Napi::CallbackInfo& info) {
    Cmd* c = new Cmd();
    c->what = "getLocalMd";
    c->out = Cmd::kBuf;
    c->fn = [](AgentState& st, Cmd& c) -> int {
      void* data = nullptr;
      size_t len = 0;
      int rc = st.api->get_local_md(st.agent, &data, &len);
      if (rc != kSuccess) return Fail(c, "nixl_capi_get_local_md", rc);
      c.str.assign(static_cast<const char*>(data), data ? len : 0);
      std::free(data);  // malloc'd by the library, owned by us
      return kSuccess;
    };
    return Enqueue(info.Env(), c);
  }

  Napi::Value LoadRemoteMd(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    auto md = std::make_shared<std::string>();
    bool present;
    if (info.Length() < 1 || !GetBytes(env, info[0], md.get(), &present, "metadata") || !present || md->empty())
      return ThrowType(env, "loadRemoteMd(metadata: non-empty Uint8Array)");
    Cmd* c = new Cmd();
    c->what = "loadRemoteMd";
    c->out = Cmd::kStr;
    c->fn = [md](AgentState& st, Cmd& c) -> int {
      char* name = nullptr;
      int rc = st.api->load_remote_md(st.agent, md->data(), md->size(), &name);
      if (rc != kSuccess) return Fail(c, "nixl_capi_load_remote_md", rc);
      c.str = name ? name : "";
      std::free(name);
      return kSuccess;
    };
    return Enqueue(env, c);
  }

  Napi::Value InvalidateRemoteMd(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (info.Length() < 1 || !info[0].IsString()) return ThrowType(env, "invalidateRemoteMd(name: string)");
    std::string name = info[0].As<Napi::String>().Utf8Value();
    Cmd* c = new Cmd();
    c->what = "invalidateRemoteMd";
    c->fn = [name](AgentState& st, Cmd& c) -> int {
      int rc = st.api->invalidate_remote_md(st.agent, name.c_str());
      return rc == kSuccess ? kSuccess : Fail(c, "nixl_capi_invalidate_remote_md", rc);
    };
    return Enqueue(env, c);
  }

  /** prepDlist(agentName ('' = local), memType, descs): Promise<number> */
  Napi::Value PrepDlist(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    uint32_t mem;
    auto descs = std::make_shared<std::vector<Desc>>();
    if (info.Length() < 3 || !info[0].IsString()) return ThrowType(env, "prepDlist(agentName, memType, descs)");
    std::string agent = info[0].As<Napi::String>().Utf8Value();
    if (!GetU32(env, info[1], &mem, "memType") || !GetDescs(env, info[2], descs.get(), "prepDlist")) return env.Undefined();
    Cmd* c = new Cmd();
    c->what = "prepDlist";
    c->out = Cmd::kNum;
    c->fn = [agent, mem, descs](AgentState& st, Cmd& c) -> int {
      const Api& a = *st.api;
      XferDlist d = nullptr;
      int rc = a.create_xfer_dlist((int)mem, &d, false);
      if (rc != kSuccess) return Fail(c, "nixl_capi_create_xfer_dlist", rc);
      for (const Desc& x : *descs) {
        rc = a.xfer_dlist_add_desc(d, x.addr, x.len, x.dev);
        if (rc != kSuccess) {
          a.destroy_xfer_dlist(d);
          return Fail(c, "nixl_capi_xfer_dlist_add_desc", rc);
        }
      }
      DlistHandle h = nullptr;
      rc = a.prep_xfer_dlist(st.agent, agent.c_str(), d, &h, nullptr);
      a.destroy_xfer_dlist(d);
      if (rc != kSuccess) return Fail(c, "nixl_capi_prep_xfer_dlist", rc);
      uint32_t id = st.next_id++;
      st.dlists[id] = h;
      c.num = id;
      return kSuccess;
    };
    return Enqueue(env, c);
  }

  Napi::Value ReleaseDlist(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    uint32_t id;
    if (info.Length() < 1 || !GetU32(env, info[0], &id, "id")) return ThrowType(env, "releaseDlist(id)");
    Cmd* c = new Cmd();
    c->what = "releaseDlist";
    c->fn = [id](AgentState& st, Cmd& c) -> int {
      auto it = st.dlists.find(id);
      if (it == st.dlists.end()) {
        c.err = "releaseDlist: unknown list";
        return kErrInvalidParam;
      }
      int rc = st.api->release_xfer_dlist_handle(st.agent, it->second);
      st.dlists.erase(it);
      return rc == kSuccess ? kSuccess : Fail(c, "nixl_capi_release_xfer_dlist_handle", rc);
    };
    return Enqueue(env, c);
  }

  /** makeXfer(op, localId, localIdx: Int32Array, remoteId, remoteIdx: Int32Array, notif: Uint8Array | null): Promise<number> */
  Napi::Value MakeXfer(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    uint32_t op, lid, rid;
    auto li = std::make_shared<std::vector<int>>();
    auto ri = std::make_shared<std::vector<int>>();
    auto notif = std::make_shared<std::string>();
    bool has = false;
    if (info.Length() < 6) return ThrowType(env, "makeXfer(op, localId, localIdx, remoteId, remoteIdx, notif)");
    if (!GetU32(env, info[0], &op, "op") || !GetU32(env, info[1], &lid, "localId") || !GetIndices(env, info[2], li.get(), "localIdx") ||
        !GetU32(env, info[3], &rid, "remoteId") || !GetIndices(env, info[4], ri.get(), "remoteIdx") || !GetBytes(env, info[5], notif.get(), &has, "notif"))
      return env.Undefined();
    if (op > 1) return ThrowRange(env, "makeXfer: op must be 0 (READ) or 1 (WRITE)");
    Cmd* c = new Cmd();
    c->what = "makeXfer";
    c->out = Cmd::kNum;
    c->fn = [op, lid, rid, li, ri, notif, has](AgentState& st, Cmd& c) -> int {
      const Api& a = *st.api;
      auto l = st.dlists.find(lid), r = st.dlists.find(rid);
      if (l == st.dlists.end() || r == st.dlists.end()) {
        c.err = "makeXfer: unknown descriptor list";
        return kErrInvalidParam;
      }
      OptArgs opt = nullptr;
      int rc = MakeNotifOpt(a, *notif, has, &opt, c);
      if (rc != kSuccess) return rc;
      XferReq req = nullptr;
      rc = a.make_xfer_req(st.agent, (int)op, l->second, li->data(), li->size(), r->second, ri->data(), ri->size(), &req, opt);
      if (opt) a.destroy_opt_args(opt);
      if (rc != kSuccess) return Fail(c, "nixl_capi_make_xfer_req", rc);
      uint32_t id = st.next_id++;
      st.xfers[id] = req;
      c.num = id;
      return kSuccess;
    };
    return Enqueue(env, c);
  }

  /** post(id, notif | null): Promise<number> resolving with the C API status (0 done, 1 in progress, < 0 failed). */
  Napi::Value Post(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    uint32_t id;
    auto notif = std::make_shared<std::string>();
    bool has = false;
    if (info.Length() < 2 || !GetU32(env, info[0], &id, "id") || !GetBytes(env, info[1], notif.get(), &has, "notif"))
      return ThrowType(env, "post(id, notif)");
    Cmd* c = new Cmd();
    c->what = "post";
    c->status_result = true;
    c->tracks_xfer = true;
    c->num = id;
    c->fn = [id, notif, has](AgentState& st, Cmd& c) -> int {
      const Api& a = *st.api;
      auto it = st.xfers.find(id);
      if (it == st.xfers.end()) {
        c.err = "post: unknown request";
        return kErrInvalidParam;
      }
      if (st.active.count(id)) return kErrInvalidState;  // one post at a time
      OptArgs opt = nullptr;
      int rc = MakeNotifOpt(a, *notif, has, &opt, c);
      if (rc != kSuccess) return rc;
      rc = a.post_xfer_req(st.agent, it->second, opt);
      if (opt) a.destroy_opt_args(opt);
      if (rc == kInProg) st.active[id] = it->second;  // polled by the loop
      return rc;                                       // IN_PROG or SUCCESS (done inline) or an error
    };
    Napi::Value p = Enqueue(env, c);
    return p;
  }

  /** releaseXfer(id): Promise<number> (status of the release; the request is destroyed when it is 0). */
  Napi::Value ReleaseXfer(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    uint32_t id;
    if (info.Length() < 1 || !GetU32(env, info[0], &id, "id")) return ThrowType(env, "releaseXfer(id)");
    st_->js_active.erase(id);
    Cmd* c = new Cmd();
    c->what = "releaseXfer";
    c->status_result = true;
    c->fn = [id](AgentState& st, Cmd& c) -> int {
      const Api& a = *st.api;
      auto it = st.xfers.find(id);
      if (it == st.xfers.end()) {
        c.err = "releaseXfer: unknown request";
        return kErrInvalidParam;
      }
      st.active.erase(id);
      int rc = a.release_xfer_req(st.agent, it->second);  // cancels when in progress
      if (rc != kSuccess) return rc;
      a.destroy_xfer_req(it->second);
      st.xfers.erase(it);
      return kSuccess;
    };
    return Enqueue(env, c);
  }

  Napi::Value GenNotif(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    auto msg = std::make_shared<std::string>();
    bool has;
    if (info.Length() < 2 || !info[0].IsString() || !GetBytes(env, info[1], msg.get(), &has, "message") || !has)
      return ThrowType(env, "genNotif(remote: string, message: Uint8Array)");
    std::string remote = info[0].As<Napi::String>().Utf8Value();
    Cmd* c = new Cmd();
    c->what = "genNotif";
    c->fn = [remote, msg](AgentState& st, Cmd& c) -> int {
      int rc = st.api->gen_notif(st.agent, remote.c_str(), msg->data(), msg->size(), nullptr);
      return rc == kSuccess ? kSuccess : Fail(c, "nixl_capi_gen_notif", rc);
    };
    return Enqueue(env, c);
  }

  /** takeNotifs(): flat [agentName, Buffer, agentName, Buffer, ...] received since the last call. */
  Napi::Value TakeNotifs(const Napi::CallbackInfo& info) { return kvc_agent::TakeNotifs(info.Env(), st_.get()); }

  Napi::Value Close(const Napi::CallbackInfo& info) {
    Cmd* c = new Cmd();
    c->what = "close";
    c->closes = true;
    c->fn = [](AgentState& st, Cmd&) -> int {
      Teardown(st);
      return kSuccess;
    };
    return Enqueue(info.Env(), c);
  }
};

}  // namespace

void KvcRegisterTransfer(Napi::Env env, Napi::Object exports) {
  Napi::Object t = Napi::Object::New(env);
  t.Set("nixlLoad", Napi::Function::New(env, NixlLoad, "nixlLoad"));
  t.Set("addressOf", Napi::Function::New(env, AddressOf, "addressOf"));
  t.Set("NixlAgentCore", NixlAgentCore::Define(env));
  exports.Set("transfer", t);
}
