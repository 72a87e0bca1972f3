/**
 * @file mooncake_addon.cc
 * @brief `exports.mooncake`: the Mooncake Transfer Engine C API (`libtransfer_engine.so`) loaded
 *        at run time with dlopen, behind an asynchronous engine object, plus `addressOf` for
 *        registering JS memory.
 *
 * Threading. Every Transfer Engine call of an engine happens on one native thread owned by that
 * engine object. JS methods enqueue a command and get a promise; the thread runs commands in
 * order, then polls `getTransferStatus` for the tasks of submitted batches and
 * `getNotifsFromEngine`, then sleeps `pollUs` (transfers in flight) or `idlePollUs` (none).
 * Results, status changes and notifies come back through one thread-safe function; nothing
 * blocks the event loop, and the event loop is kept alive only while commands or reported
 * transfers are outstanding.
 *
 * Quirks handled (docs/backends.md M4-M6):
 *  - a notify attached to a batch is sent only when the sender's own getTransferStatus sees the
 *    whole batch COMPLETED: every batch is polled to a final state, also after JS stopped caring
 *    about it (timeout, release);
 *  - freeBatchID refuses (code 4) while a task is in flight: such batches are kept and freed
 *    once every task reached a final state;
 *  - the Transfer Engine has no cancel: an abandoned batch runs to its end;
 *  - notifies are NUL-terminated strings copied by the library; the result of
 *    getNotifsFromEngine is freed with freeNotifsMsgBuf.
 *
 * Errors never crash the process: bad arguments throw TypeError/RangeError synchronously; a
 * failing call rejects its promise with an Error whose `code` is the C API return code.
 */
#include "mooncake_addon.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>

#include "mooncake_capi.h"
#include "native_agent_common.h"

namespace {

using namespace kvc_mooncake;

using namespace kvc_agent;

constexpr int kErrClosed = -1000;                 // our own code: the engine is closed
constexpr int kErrArg = -1001;                    // our own code: a bad argument caught here

// ---------------------------------------------------------------------------------------------
// Library loading

using MooncakeLib = kvc_agent::Lib<Api>;

/** Loads `path`; a missing dependency next to it is preloaded (not recursively) and the load retried. */
MooncakeLib* LoadLib(const std::string& path, std::string* err) {
  return kvc_agent::LoadLib<Api>(path, err, 16, false, [](void* h, Api& a, std::string* missing) {
#define REQ(f) Sym(h, #f, &a.f, true, missing)
#define OPT(f) Sym(h, #f, &a.f, false, missing)
    REQ(createTransferEngine); REQ(destroyTransferEngine); REQ(getLocalIpAndPort); REQ(openSegment); OPT(openSegmentNoCache);
    REQ(closeSegment); OPT(syncSegmentCache); REQ(registerLocalMemory); REQ(unregisterLocalMemory); REQ(allocateBatchID);
    REQ(submitTransfer); REQ(submitTransferWithNotify); REQ(getTransferStatus); REQ(freeBatchID); REQ(genNotifyInEngine);
    REQ(getNotifsFromEngine); REQ(freeNotifsMsgBuf);
#undef REQ
#undef OPT
  });
}

/** load(candidates: string[]): { ok, path, tried: string[] }: the first candidate that loads with every symbol. */
Napi::Value Load(const Napi::CallbackInfo& info) {
  return LoadCandidates<MooncakeLib>(info, "load(candidates: string[])", "load: candidates must be strings", LoadLib, [](Napi::Object r, MooncakeLib* lib) {
    r.Set("hasNoCache", Napi::Boolean::New(r.Env(), lib && lib->api.openSegmentNoCache));
  });
}

// ---------------------------------------------------------------------------------------------
// Engine

struct EngineState;

struct Cmd {
  const char* what = "";
  std::function<int(EngineState&, Cmd&)> fn;
  napi_deferred deferred = nullptr;
  int code = 0;  // 0 ok, else the failing call's return code (or ours)
  std::string err;
  enum { kUndef, kNum, kStr } out = kUndef;
  double num = 0;
  std::string str;
  bool closes = false;
  bool tracks = false;  // a submit: num is the transfer id
};

struct Msg {
  enum { kDone, kStatus } type;
  Cmd* cmd;
  uint32_t xfer;
  int status;  // task status (4 COMPLETED, 6 FAILED, ...) or -1 when getTransferStatus itself failed
  int rc;      // getTransferStatus return code
};

struct Batch {
  BatchId id;
  size_t count;
  size_t next = 0;         // tasks [0, next) reached a final state
  bool reported = false;   // JS was told (or does not care any more)
  bool abandoned = false;
};

struct EngineState : WorkerCommon {
  const Api* api = nullptr;
  std::string metadata, server_name;
  bool auto_discover = true;
  int poll_us = 20;
  int idle_poll_us = 1000;
  std::deque<Cmd*> queue;  // guarded by mu

  // engine thread only
  Engine engine = nullptr;
  std::map<uint32_t, Batch> batches;  // submitted, not yet freed
  uint32_t next_id = 1;
  bool torn_down = false;
};

int Fail(Cmd& c, const char* fn, int rc) {
  c.err = std::string(c.what) + ": " + fn + " returned " + std::to_string(rc);
  return rc == 0 ? -1 : rc;
}

void PollNotifs(EngineState& st) {
  int n = 0;
  NotifyMsg* m = st.api->getNotifsFromEngine(st.engine, &n);
  if (!m) return;
  std::vector<std::pair<std::string, std::string>> got;
  for (int i = 0; i < n; ++i) got.emplace_back(m[i].name ? m[i].name : "", m[i].msg ? m[i].msg : "");
  st.api->freeNotifsMsgBuf(m, n);
  std::lock_guard<std::mutex> lk(st.mu);
  for (auto& g : got) st.notifs.push_back(std::move(g));
}

/** Polls every batch; reports the first failure or the completion of reported batches; frees finished ones. */
void PollBatches(EngineState& st) {
  const Api& a = *st.api;
  for (auto it = st.batches.begin(); it != st.batches.end();) {
    Batch& b = it->second;
    int fail_status = -2, fail_rc = 0;
    while (b.next < b.count) {
      TransferStatus s{};
      int rc = a.getTransferStatus(st.engine, b.id, b.next, &s);
      if (rc != 0) {
        fail_status = -1;
        fail_rc = rc;
        b.next = b.count;  // give up on this batch
        break;
      }
      if (s.status == kWaiting || s.status == kPending) break;
      if (s.status != kCompleted && fail_status == -2) fail_status = s.status;
      b.next++;
    }
    if (!b.reported && fail_status != -2) {
      b.reported = true;
      Send(st, new Msg{Msg::kStatus, nullptr, it->first, fail_status, fail_rc});
    }
    if (b.next >= b.count) {
      if (!b.reported) {
        b.reported = true;
        Send(st, new Msg{Msg::kStatus, nullptr, it->first, kCompleted, 0});
      }
      int rc = a.freeBatchID(st.engine, b.id);
      if (rc == 0 || fail_status == -1) {
        it = st.batches.erase(it);
        continue;
      }
    }
    ++it;
  }
}

void Teardown(EngineState& st) {
  if (st.torn_down) return;
  st.torn_down = true;
  st.batches.clear();
  if (st.engine) st.api->destroyTransferEngine(st.engine);
  st.engine = nullptr;
}

void Loop(std::shared_ptr<EngineState> sp) {
  RunLoop(
      *sp,
      [](EngineState& st) {
        // Poll fast only while JS waits for a batch; abandoned ones (timed out, released) are
        // still polled to their end, at the idle pace.
        bool hot = false;
        for (auto& b : st.batches) hot = hot || !b.second.reported;
        return hot ? st.poll_us : st.idle_poll_us;
      },
      [](EngineState& st, Cmd* c) {
        if (st.torn_down && !c->closes) {
          c->code = kErrClosed;
          c->err = std::string(c->what) + ": the engine is closed";
        } else if (!st.engine && !c->closes && std::strcmp(c->what, "init") != 0) {
          c->code = kErrClosed;
          c->err = std::string(c->what) + ": the engine was not created";
        } else {
          c->code = c->fn(st, *c);
        }
      },
      [](Cmd* c) { return new Msg{Msg::kDone, c, 0, 0, 0}; },
      [](EngineState& st) {
        if (st.engine && !st.torn_down) {
          PollBatches(st);
          PollNotifs(st);
        }
      },
      Teardown,
      [](Cmd* c) {
        c->code = kErrClosed;
        c->err = std::string(c->what) + ": the engine is closed";
      });
}

void CallJs(napi_env env, napi_value js_cb, void* context, void* data) {
  DispatchToJs<EngineState, Msg>(env, context, data, [env, js_cb](Napi::Env e, EngineState& st, Msg* m, Cmd* cmd) {
    if (m->type == Msg::kStatus) {
      st.js_active.erase(m->xfer);
      UpdateRef(st);
      napi_value args[3] = {Napi::Number::New(e, m->xfer), Napi::Number::New(e, m->status), Napi::Number::New(e, m->rc)};
      CallListener(env, js_cb, 3, args);
      return;
    }
    Cmd& c = *cmd;
    CommandDone(env, st, c.closes);
    if (c.tracks && c.code == 0) st.js_active[(uint32_t)c.num] = true;
    UpdateRef(st);
    if (c.code != 0) {
      RejectWithCode(e, c.deferred, c.err.empty() ? std::string(c.what) + " failed with " + std::to_string(c.code) : c.err, "status", c.code, true);
      return;
    }
    napi_value v;
    switch (c.out) {
      case Cmd::kNum: v = Napi::Number::New(e, c.num); break;
      case Cmd::kStr: v = Napi::String::New(e, c.str); break;
      default: napi_get_undefined(env, &v); break;
    }
    Settle(e, c.deferred, v);
  });
}

// ---- argument helpers (JS thread) ----

bool GetNum(Napi::Env env, Napi::Value v, double* out, const char* what, double hi) {
  if (!v.IsNumber()) {
    ThrowType(env, std::string(what) + " must be a number");
    return false;
  }
  double d = v.As<Napi::Number>().DoubleValue();
  if (!(d >= 0 && d <= hi && d == (double)(uint64_t)d)) {
    ThrowRange(env, std::string(what) + " must be an integer in [0, " + std::to_string((uint64_t)hi) + "]");
    return false;
  }
  *out = d;
  return true;
}

bool GetStr(Napi::Env env, Napi::Value v, std::string* out, const char* what, bool nullable, bool* present) {
  if (present) *present = false;
  if (nullable && (v.IsNull() || v.IsUndefined())) return true;
  if (!v.IsString()) {
    ThrowType(env, std::string(what) + " must be a string" + (nullable ? " or null" : ""));
    return false;
  }
  *out = v.As<Napi::String>().Utf8Value();
  if (out->find('\0') != std::string::npos) {
    ThrowRange(env, std::string(what) + " must not contain NUL characters");
    return false;
  }
  if (present) *present = true;
  return true;
}

class MooncakeEngineCore : public Napi::ObjectWrap<MooncakeEngineCore> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "MooncakeEngineCore",
                       {
                           InstanceMethod<&MooncakeEngineCore::Init>("init"),
                           InstanceMethod<&MooncakeEngineCore::RegisterMem>("registerMem"),
                           InstanceMethod<&MooncakeEngineCore::UnregisterMem>("unregisterMem"),
                           InstanceMethod<&MooncakeEngineCore::OpenSegment>("openSegment"),
                           InstanceMethod<&MooncakeEngineCore::Submit>("submit"),
                           InstanceMethod<&MooncakeEngineCore::Abandon>("abandon"),
                           InstanceMethod<&MooncakeEngineCore::GenNotify>("genNotify"),
                           InstanceMethod<&MooncakeEngineCore::TakeNotifs>("takeNotifs"),
                           InstanceMethod<&MooncakeEngineCore::Close>("close"),
                       });
  }

  /** new MooncakeEngineCore(libPath, { metadata, serverName, autoDiscover, pollUs, idlePollUs }, onStatus(id, status, rc)) */
  MooncakeEngineCore(const Napi::CallbackInfo& info) : Napi::ObjectWrap<MooncakeEngineCore>(info) {
    Napi::Env env = info.Env();
    if (info.Length() < 3 || !info[0].IsString() || !info[1].IsObject() || !info[2].IsFunction()) {
      ThrowType(env, "new MooncakeEngineCore(libPath, config, onStatus)");
      return;
    }
    std::string path = info[0].As<Napi::String>().Utf8Value();
    const Api* api = LoadedApi<Api>(env, path, "MooncakeEngineCore: library not loaded (call load first): ");
    if (!api) return;
    auto st = std::make_shared<EngineState>();
    st->api = api;
    Napi::Object cfg = info[1].As<Napi::Object>();
    if (!GetStr(env, cfg.Get("metadata"), &st->metadata, "config.metadata", false, nullptr)) return;
    if (!GetStr(env, cfg.Get("serverName"), &st->server_name, "config.serverName", false, nullptr)) return;
    Napi::Value ad = cfg.Get("autoDiscover");
    st->auto_discover = !ad.IsBoolean() || ad.As<Napi::Boolean>().Value();
    auto num = [&](const char* k, double dflt, double lo, double hi) { return CfgNum(cfg, k, dflt, lo, hi); };
    st->poll_us = (int)num("pollUs", 20, 0, 1e6);
    st->idle_poll_us = (int)num("idlePollUs", 1000, 1, 1e7);
    if (env.IsExceptionPending()) return;
    if (!StartWorker(env, st, info[2], "kvconnect-mooncake", "MooncakeEngineCore: cannot create a thread-safe function", CallJs, Loop)) return;
    st_ = st;
  }

  ~MooncakeEngineCore() override {
    if (st_) StopWorker(*st_);
  }

 private:
  std::shared_ptr<EngineState> st_;

  Napi::Value Enqueue(Napi::Env env, Cmd* c) {
    return kvc_agent::Enqueue(env, st_, c, "MooncakeEngineCore was not constructed", ": the engine is closed", "status", kErrClosed);
  }

  /** init(): Promise<string>: creates the engine; resolves with its segment name (getLocalIpAndPort). */
  Napi::Value Init(const Napi::CallbackInfo& info) {
    Cmd* c = new Cmd();
    c->what = "init";
    c->out = Cmd::kStr;
    c->fn = [](EngineState& st, Cmd& c) -> int {
      if (st.engine) {
        c.err = "init: already created";
        return kErrArg;
      }
      st.engine = st.api->createTransferEngine(st.metadata.c_str(), st.server_name.c_str(), st.server_name.c_str(), 0,
                                               st.auto_discover ? 1 : 0);
      if (!st.engine) {
        c.err = "createTransferEngine(\"" + st.metadata + "\", \"" + st.server_name + "\") returned NULL (see the engine's log on stderr; MC_LOG_LEVEL)";
        return -1;
      }
      char buf[512] = {0};
      int rc = st.api->getLocalIpAndPort(st.engine, buf, sizeof buf);
      if (rc != 0 || !buf[0]) return Fail(c, "getLocalIpAndPort", rc);
      c.str = buf;
      return 0;
    };
    return Enqueue(info.Env(), c);
  }

  /** registerMem(addr, length, location): Promise<void> */
  Napi::Value RegisterMem(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    double addr, len;
    std::string loc;
    if (info.Length() < 3 || !GetNum(env, info[0], &addr, "addr", kMaxSafe) || !GetNum(env, info[1], &len, "length", kMaxSafe) ||
        !GetStr(env, info[2], &loc, "location", false, nullptr))
      return ThrowType(env, "registerMem(addr, length, location)");
    Cmd* c = new Cmd();
    c->what = "registerMem";
    c->fn = [addr, len, loc](EngineState& st, Cmd& c) -> int {
      int rc = st.api->registerLocalMemory(st.engine, reinterpret_cast<void*>((uintptr_t)(uint64_t)addr), (size_t)(uint64_t)len, loc.c_str(), 1);
      return rc == 0 ? 0 : Fail(c, "registerLocalMemory", rc);
    };
    return Enqueue(env, c);
  }

  /** unregisterMem(addr): Promise<void> */
  Napi::Value UnregisterMem(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    double addr;
    if (info.Length() < 1 || !GetNum(env, info[0], &addr, "addr", kMaxSafe)) return ThrowType(env, "unregisterMem(addr)");
    Cmd* c = new Cmd();
    c->what = "unregisterMem";
    c->fn = [addr](EngineState& st, Cmd& c) -> int {
      int rc = st.api->unregisterLocalMemory(st.engine, reinterpret_cast<void*>((uintptr_t)(uint64_t)addr));
      return rc == 0 ? 0 : Fail(c, "unregisterLocalMemory", rc);
    };
    return Enqueue(env, c);
  }

  /** openSegment(name, refresh: boolean): Promise<number>: the segment id; `refresh` re-reads the peer's buffers. */
  Napi::Value OpenSegment(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    std::string name;
    if (info.Length() < 2 || !GetStr(env, info[0], &name, "name", false, nullptr) || !info[1].IsBoolean())
      return ThrowType(env, "openSegment(name: string, refresh: boolean)");
    bool refresh = info[1].As<Napi::Boolean>().Value();
    Cmd* c = new Cmd();
    c->what = "openSegment";
    c->out = Cmd::kNum;
    c->fn = [name, refresh](EngineState& st, Cmd& c) -> int {
      const Api& a = *st.api;
      SegmentId id;
      if (refresh && a.openSegmentNoCache) {
        id = a.openSegmentNoCache(st.engine, name.c_str());
      } else {
        if (refresh && a.syncSegmentCache) a.syncSegmentCache(st.engine);
        id = a.openSegment(st.engine, name.c_str());
      }
      if (id < 0) {
        c.err = "openSegment(\"" + name + "\") returned " + std::to_string(id) + " (the peer's segment cannot be reached)";
        return id;
      }
      c.num = id;
      return 0;
    };
    return Enqueue(env, c);
  }

  /**
   * submit(opcode, segmentId, entries: Float64Array (localAddr, remoteAddr, length triples),
   *        notifyName: string | null, notifyMsg: string | null): Promise<number> (the transfer id).
   */
  Napi::Value Submit(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    double op, seg;
    if (info.Length() < 5 || !GetNum(env, info[0], &op, "opcode", 1) || !GetNum(env, info[1], &seg, "segmentId", 2147483647.0))
      return ThrowType(env, "submit(opcode, segmentId, entries, notifyName, notifyMsg)");
    if (!info[2].IsTypedArray() || info[2].As<Napi::TypedArray>().TypedArrayType() != napi_float64_array)
      return ThrowType(env, "submit: entries must be a Float64Array of (localAddr, remoteAddr, length) triples");
    Napi::Float64Array fa = info[2].As<Napi::Float64Array>();
    size_t n = fa.ElementLength();
    if (n == 0 || n % 3 != 0) return ThrowRange(env, "submit: entries must hold a positive multiple of 3 values");
    auto reqs = std::make_shared<std::vector<TransferRequest>>(n / 3);
    for (size_t i = 0; i < n; i += 3) {
      double x[3] = {fa[i], fa[i + 1], fa[i + 2]};
      for (double d : x)
        if (!(d >= 0 && d <= kMaxSafe && d == (double)(uint64_t)d))
          return ThrowRange(env, "submit: entry " + std::to_string(i / 3) + " has a value that is not an integer in [0, 2^53)");
      TransferRequest& r = (*reqs)[i / 3];
      std::memset(&r, 0, sizeof r);
      r.opcode = (int)op;
      r.source = reinterpret_cast<void*>((uintptr_t)(uint64_t)x[0]);
      r.target_id = (SegmentId)seg;
      r.file_id = 0;
      r.target_offset = (uint64_t)x[1];
      r.length = (uint64_t)x[2];
    }
    std::string name, msg;
    bool has_name = false, has_msg = false;
    if (!GetStr(env, info[3], &name, "notifyName", true, &has_name) || !GetStr(env, info[4], &msg, "notifyMsg", true, &has_msg)) return env.Undefined();
    bool notify = has_name && has_msg;
    Cmd* c = new Cmd();
    c->what = "submit";
    c->out = Cmd::kNum;
    c->tracks = true;
    c->fn = [reqs, name, msg, notify](EngineState& st, Cmd& c) -> int {
      const Api& a = *st.api;
      BatchId b = a.allocateBatchID(st.engine, reqs->size());
      if (b == kInvalidBatch) {
        c.err = "submit: allocateBatchID returned INVALID_BATCH";
        return -1;
      }
      int rc;
      if (notify) {
        NotifyMsg nm{const_cast<char*>(name.c_str()), const_cast<char*>(msg.c_str())};
        rc = a.submitTransferWithNotify(st.engine, b, reqs->data(), reqs->size(), nm);
      } else {
        rc = a.submitTransfer(st.engine, b, reqs->data(), reqs->size());
      }
      if (rc != 0) {
        a.freeBatchID(st.engine, b);
        return Fail(c, notify ? "submitTransferWithNotify" : "submitTransfer", rc);
      }
      uint32_t id = st.next_id++;
      st.batches[id] = Batch{b, reqs->size()};
      c.num = id;
      return 0;
    };
    return Enqueue(env, c);
  }

  /** abandon(id): Promise<void>: JS no longer waits for it; the batch runs to its end and is freed. */
  Napi::Value Abandon(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    double id;
    if (info.Length() < 1 || !GetNum(env, info[0], &id, "id", 4294967295.0)) return ThrowType(env, "abandon(id)");
    st_->js_active.erase((uint32_t)id);
    UpdateRef(*st_);
    Cmd* c = new Cmd();
    c->what = "abandon";
    c->fn = [id](EngineState& st, Cmd&) -> int {
      auto it = st.batches.find((uint32_t)id);
      if (it != st.batches.end()) {
        it->second.reported = true;
        it->second.abandoned = true;
      }
      return 0;
    };
    return Enqueue(env, c);
  }

  /** genNotify(segmentId, name, msg): Promise<void> */
  Napi::Value GenNotify(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    double seg;
    std::string name, msg;
    if (info.Length() < 3 || !GetNum(env, info[0], &seg, "segmentId", 2147483647.0) || !GetStr(env, info[1], &name, "name", false, nullptr) ||
        !GetStr(env, info[2], &msg, "msg", false, nullptr))
      return ThrowType(env, "genNotify(segmentId, name, msg)");
    Cmd* c = new Cmd();
    c->what = "genNotify";
    c->fn = [seg, name, msg](EngineState& st, Cmd& c) -> int {
      NotifyMsg nm{const_cast<char*>(name.c_str()), const_cast<char*>(msg.c_str())};
      int rc = st.api->genNotifyInEngine(st.engine, (uint64_t)seg, nm);
      return rc == 0 ? 0 : Fail(c, "genNotifyInEngine", rc);
    };
    return Enqueue(env, c);
  }

  /** takeNotifs(): flat [name, Buffer(msg), name, Buffer(msg), ...] received since the last call. */
  Napi::Value TakeNotifs(const Napi::CallbackInfo& info) { return kvc_agent::TakeNotifs(info.Env(), st_.get()); }

  Napi::Value Close(const Napi::CallbackInfo& info) {
    Cmd* c = new Cmd();
    c->what = "close";
    c->closes = true;
    c->fn = [](EngineState& st, Cmd&) -> int {
      Teardown(st);
      return 0;
    };
    return Enqueue(info.Env(), c);
  }
};

}  // namespace

void KvcRegisterMooncake(Napi::Env env, Napi::Object exports) {
  Napi::Object m = Napi::Object::New(env);
  m.Set("load", Napi::Function::New(env, Load, "load"));
  m.Set("addressOf", Napi::Function::New(env, AddressOf, "addressOf"));
  m.Set("MooncakeEngineCore", MooncakeEngineCore::Define(env));
  exports.Set("mooncake", m);
}
