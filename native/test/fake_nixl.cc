/**
 * @file fake_nixl.cc
 * @brief An in-process stand-in for NIXL's C API (`libnixl_capi.so`, the functions of NIXL
 *        1.4.0's src/bindings/rust/wrapper.h that kvconnect's shim uses), built as
 *        `libfake_nixl_capi.so` to test the shim's marshalling in CI without NIXL or UCX.
 *
 * Agents of one process share a static table: a READ or WRITE really copies bytes between the
 * registered memory of two agents, and a transfer's notif lands in the target's queue after the
 * copy. Behaviour copied from the real library (docs/backends.md, NIXL):
 *  - errors are collapsed to NIXL_CAPI_ERROR_BACKEND (-2) like the real C API;
 *  - post returns SUCCESS (copied inline) for every other post and IN_PROG otherwise, so both
 *    paths are exercised; an IN_PROG transfer completes on a later get_xfer_status;
 *  - destroy_xfer_req returns INVALID_STATE (-3) unless release_xfer_req came first;
 *  - get_notifs appends to the map (the caller must clear it between polls);
 *  - the metadata blob and the remote agent name are malloc'd and owned by the caller.
 * Test knob: backend parameter `fake_xfer_delay_us` (decimal) keeps every transfer of that
 * agent IN_PROG for that long after its post (all posts then return IN_PROG); a target that
 * is destroyed meanwhile makes the transfer fail (a "remote disconnect").
 * Thread safety: every function takes one global mutex.
 */
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

extern "C" {
typedef int nixl_capi_status_t;
enum { OK = 0, IN_PROG = 1, E_PARAM = -1, E_BACKEND = -2, E_STATE = -3 };
}

namespace {

struct Region {
  uintptr_t addr;
  size_t len;
  uint64_t dev;
  int mem;
};

struct FakeAgent {
  std::string name;
  std::vector<Region> regs;
  std::map<std::string, std::vector<Region>> remotes;
  std::map<std::string, std::vector<std::string>> notifs;
  uint64_t delay_us = 0;
  uint64_t posts = 0;
};

std::mutex g_mu;
std::map<std::string, FakeAgent*>& Agents() {
  static std::map<std::string, FakeAgent*> m;
  return m;
}

uint64_t NowUs() {
  return (uint64_t)std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool Inside(const std::vector<Region>& regs, const Region& d) {
  for (const Region& r : regs)
    if (r.mem == d.mem && r.dev == d.dev && d.addr >= r.addr && d.len <= r.len && d.addr - r.addr <= r.len - d.len) return true;
  return false;
}

}  // namespace

struct nixl_capi_agent_s { FakeAgent* a; };
struct nixl_capi_params_s { std::map<std::string, std::string> kv; };
struct nixl_capi_mem_list_s { int unused; };
struct nixl_capi_backend_s { int unused; };
struct nixl_capi_opt_args_s { bool has_notif = false; std::string notif; };
struct nixl_capi_reg_dlist_s { int mem; std::vector<Region> d; };
struct nixl_capi_xfer_dlist_s { int mem; std::vector<Region> d; };
struct nixl_capi_xfer_dlist_handle_s { std::string agent; int mem; std::vector<Region> d; };
struct nixl_capi_xfer_req_s {
  FakeAgent* owner;
  int op;
  std::string remote;
  std::vector<Region> local, rem;
  bool has_notif = false;
  std::string notif;
  int state = 0;  // 0 idle, 1 in progress, 2 done, -1 failed, -2 canceled
  uint64_t due_us = 0;
  bool released = false;
};
struct nixl_capi_notif_map_s { std::map<std::string, std::vector<std::string>> m; };

typedef struct nixl_capi_agent_config_s {
  bool enable_prog_thread;
  bool enable_listen_thread;
  int listen_port;
  int thread_sync;
  unsigned int num_workers;
  uint64_t pthr_delay_us;
  uint64_t lthr_delay_us;
  bool capture_telemetry;
} nixl_capi_agent_config_t;

namespace {

/** Copies the bytes of `x` (caller holds g_mu). Returns false if the target is gone or the memory is no longer registered. */
bool Execute(nixl_capi_xfer_req_s* x) {
  auto it = Agents().find(x->remote);
  if (it == Agents().end()) return false;
  FakeAgent* t = it->second;
  for (size_t i = 0; i < x->local.size(); ++i)
    if (!Inside(t->regs, x->rem[i]) || !Inside(x->owner->regs, x->local[i])) return false;
  for (size_t i = 0; i < x->local.size(); ++i) {
    if (x->op == 0)
      std::memmove(reinterpret_cast<void*>(x->local[i].addr), reinterpret_cast<const void*>(x->rem[i].addr), x->local[i].len);
    else
      std::memmove(reinterpret_cast<void*>(x->rem[i].addr), reinterpret_cast<const void*>(x->local[i].addr), x->local[i].len);
  }
  if (x->has_notif) t->notifs[x->owner->name].push_back(x->notif);
  return true;
}

nixl_capi_status_t CreateAgent(const char* name, nixl_capi_agent_s** agent) {
  if (!name || !agent || !*name) return E_PARAM;
  std::lock_guard<std::mutex> lk(g_mu);
  if (Agents().count(name)) return E_BACKEND;
  FakeAgent* a = new FakeAgent();
  a->name = name;
  Agents()[name] = a;
  *agent = new nixl_capi_agent_s{a};
  return OK;
}

}  // namespace

#define API extern "C" __attribute__((visibility("default")))

API nixl_capi_status_t nixl_capi_create_agent(const char* name, nixl_capi_agent_s** agent) { return CreateAgent(name, agent); }

API nixl_capi_status_t nixl_capi_create_configured_agent(const char* name, const nixl_capi_agent_config_t* cfg, nixl_capi_agent_s** agent) {
  if (!cfg) return E_PARAM;
  return CreateAgent(name, agent);
}

API nixl_capi_status_t nixl_capi_destroy_agent(nixl_capi_agent_s* agent) {
  if (!agent) return E_PARAM;
  std::lock_guard<std::mutex> lk(g_mu);
  Agents().erase(agent->a->name);
  delete agent->a;
  delete agent;
  return OK;
}

API nixl_capi_status_t nixl_capi_create_params(nixl_capi_params_s** p) {
  if (!p) return E_PARAM;
  *p = new nixl_capi_params_s();
  return OK;
}
API nixl_capi_status_t nixl_capi_params_add(nixl_capi_params_s* p, const char* k, const char* v) {
  if (!p || !k || !v) return E_PARAM;
  p->kv[k] = v;
  return OK;
}
API nixl_capi_status_t nixl_capi_destroy_params(nixl_capi_params_s* p) {
  if (!p) return E_PARAM;
  delete p;
  return OK;
}
API nixl_capi_status_t nixl_capi_destroy_mem_list(nixl_capi_mem_list_s* m) {
  if (!m) return E_PARAM;
  delete m;
  return OK;
}
API nixl_capi_status_t nixl_capi_get_plugin_params(nixl_capi_agent_s* agent, const char* plugin, nixl_capi_mem_list_s** mems, nixl_capi_params_s** params) {
  if (!agent || !plugin || !mems || !params) return E_PARAM;
  if (std::strcmp(plugin, "UCX") != 0) return E_BACKEND;
  *mems = new nixl_capi_mem_list_s();
  *params = new nixl_capi_params_s();
  return OK;
}

API nixl_capi_status_t nixl_capi_create_backend(nixl_capi_agent_s* agent, const char* plugin, nixl_capi_params_s* params, nixl_capi_backend_s** backend) {
  if (!agent || !plugin || !params || !backend) return E_PARAM;
  if (std::strcmp(plugin, "UCX") != 0) return E_BACKEND;
  std::lock_guard<std::mutex> lk(g_mu);
  auto it = params->kv.find("fake_xfer_delay_us");
  if (it != params->kv.end()) agent->a->delay_us = std::strtoull(it->second.c_str(), nullptr, 10);
  *backend = new nixl_capi_backend_s();
  return OK;
}
API nixl_capi_status_t nixl_capi_destroy_backend(nixl_capi_backend_s* b) {
  if (!b) return E_PARAM;
  delete b;
  return OK;
}

API nixl_capi_status_t nixl_capi_create_opt_args(nixl_capi_opt_args_s** o) {
  if (!o) return E_PARAM;
  *o = new nixl_capi_opt_args_s();
  return OK;
}
API nixl_capi_status_t nixl_capi_destroy_opt_args(nixl_capi_opt_args_s* o) {
  if (!o) return E_PARAM;
  delete o;
  return OK;
}
API nixl_capi_status_t nixl_capi_opt_args_add_backend(nixl_capi_opt_args_s* o, nixl_capi_backend_s* b) { return o && b ? OK : E_PARAM; }
API nixl_capi_status_t nixl_capi_opt_args_set_notif_msg(nixl_capi_opt_args_s* o, const void* data, size_t len) {
  if (!o || (!data && len)) return E_PARAM;
  o->notif.assign(static_cast<const char*>(data), len);
  return OK;
}
API nixl_capi_status_t nixl_capi_opt_args_set_has_notif(nixl_capi_opt_args_s* o, bool has) {
  if (!o) return E_PARAM;
  o->has_notif = has;
  return OK;
}

API nixl_capi_status_t nixl_capi_create_reg_dlist(int mem, nixl_capi_reg_dlist_s** d) {
  if (!d) return E_PARAM;
  *d = new nixl_capi_reg_dlist_s{mem, {}};
  return OK;
}
API nixl_capi_status_t nixl_capi_destroy_reg_dlist(nixl_capi_reg_dlist_s* d) {
  if (!d) return E_PARAM;
  delete d;
  return OK;
}
API nixl_capi_status_t nixl_capi_reg_dlist_add_desc(nixl_capi_reg_dlist_s* d, uintptr_t addr, size_t len, uint64_t dev, const void*, size_t) {
  if (!d) return E_PARAM;
  d->d.push_back(Region{addr, len, dev, d->mem});
  return OK;
}
API nixl_capi_status_t nixl_capi_register_mem(nixl_capi_agent_s* agent, nixl_capi_reg_dlist_s* d, nixl_capi_opt_args_s*) {
  if (!agent || !d) return E_PARAM;
  std::lock_guard<std::mutex> lk(g_mu);
  for (const Region& r : d->d)
    if (r.len == 0 || r.addr == 0) return E_BACKEND;
  for (const Region& r : d->d) agent->a->regs.push_back(r);
  return OK;
}
API nixl_capi_status_t nixl_capi_deregister_mem(nixl_capi_agent_s* agent, nixl_capi_reg_dlist_s* d, nixl_capi_opt_args_s*) {
  if (!agent || !d) return E_PARAM;
  std::lock_guard<std::mutex> lk(g_mu);
  auto& regs = agent->a->regs;
  for (const Region& r : d->d) {
    bool found = false;
    for (auto it = regs.begin(); it != regs.end(); ++it) {
      if (it->addr == r.addr && it->len == r.len && it->dev == r.dev && it->mem == r.mem) {
        regs.erase(it);
        found = true;
        break;
      }
    }
    if (!found) return E_BACKEND;
  }
  return OK;
}

API nixl_capi_status_t nixl_capi_create_xfer_dlist(int mem, nixl_capi_xfer_dlist_s** d) {
  if (!d) return E_PARAM;
  *d = new nixl_capi_xfer_dlist_s{mem, {}};
  return OK;
}
API nixl_capi_status_t nixl_capi_destroy_xfer_dlist(nixl_capi_xfer_dlist_s* d) {
  if (!d) return E_PARAM;
  delete d;
  return OK;
}
API nixl_capi_status_t nixl_capi_xfer_dlist_add_desc(nixl_capi_xfer_dlist_s* d, uintptr_t addr, size_t len, uint64_t dev) {
  if (!d) return E_PARAM;
  d->d.push_back(Region{addr, len, dev, d->mem});
  return OK;
}

static const char kMagic[8] = {'F', 'A', 'K', 'E', 'N', 'I', 'X', 'L'};

API nixl_capi_status_t nixl_capi_get_local_md(nixl_capi_agent_s* agent, void** data, size_t* len) {
  if (!agent || !data || !len) return E_PARAM;
  std::lock_guard<std::mutex> lk(g_mu);
  std::string b(kMagic, 8);
  uint32_t n = (uint32_t)agent->a->name.size();
  b.append(reinterpret_cast<const char*>(&n), 4);
  b += agent->a->name;
  uint32_t c = (uint32_t)agent->a->regs.size();
  b.append(reinterpret_cast<const char*>(&c), 4);
  for (const Region& r : agent->a->regs) {
    uint64_t f[3] = {(uint64_t)r.addr, (uint64_t)r.len, r.dev};
    int32_t m = r.mem;
    b.append(reinterpret_cast<const char*>(f), sizeof f);
    b.append(reinterpret_cast<const char*>(&m), 4);
  }
  void* p = std::malloc(b.size());
  if (!p) return E_BACKEND;
  std::memcpy(p, b.data(), b.size());
  *data = p;
  *len = b.size();
  return OK;
}

API nixl_capi_status_t nixl_capi_load_remote_md(nixl_capi_agent_s* agent, const void* data, size_t len, char** name_out) {
  if (!agent || !data || !len || !name_out) return E_PARAM;
  const char* p = static_cast<const char*>(data);
  if (len < 16 || std::memcmp(p, kMagic, 8) != 0) return E_BACKEND;
  uint32_t n;
  std::memcpy(&n, p + 8, 4);
  if (n == 0 || n > len - 12 || len - 12 - n < 4) return E_BACKEND;
  std::string name(p + 12, n);
  uint32_t c;
  std::memcpy(&c, p + 12 + n, 4);
  size_t off = 16 + n;
  if ((len - off) / 28 < c || (len - off) != (size_t)c * 28) return E_BACKEND;
  std::vector<Region> regs;
  for (uint32_t i = 0; i < c; ++i, off += 28) {
    uint64_t f[3];
    int32_t m;
    std::memcpy(f, p + off, 24);
    std::memcpy(&m, p + off + 24, 4);
    regs.push_back(Region{(uintptr_t)f[0], (size_t)f[1], f[2], m});
  }
  std::lock_guard<std::mutex> lk(g_mu);
  agent->a->remotes[name] = regs;
  char* out = static_cast<char*>(std::malloc(name.size() + 1));
  if (!out) return E_BACKEND;
  std::memcpy(out, name.c_str(), name.size() + 1);
  *name_out = out;
  return OK;
}

API nixl_capi_status_t nixl_capi_invalidate_remote_md(nixl_capi_agent_s* agent, const char* remote) {
  if (!agent || !remote) return E_PARAM;
  std::lock_guard<std::mutex> lk(g_mu);
  return agent->a->remotes.erase(remote) ? OK : E_BACKEND;
}

API nixl_capi_status_t nixl_capi_prep_xfer_dlist(nixl_capi_agent_s* agent, const char* agent_name, nixl_capi_xfer_dlist_s* descs,
                                                 nixl_capi_xfer_dlist_handle_s** h, nixl_capi_opt_args_s*) {
  if (!agent || !agent_name || !descs || !h) return E_PARAM;
  std::lock_guard<std::mutex> lk(g_mu);
  const std::vector<Region>* regs;
  if (*agent_name == 0 || agent->a->name == agent_name) {
    regs = &agent->a->regs;
  } else {
    auto it = agent->a->remotes.find(agent_name);
    if (it == agent->a->remotes.end()) return E_BACKEND;
    regs = &it->second;
  }
  for (const Region& d : descs->d)
    if (!Inside(*regs, d)) return E_BACKEND;
  *h = new nixl_capi_xfer_dlist_handle_s{agent_name, descs->mem, descs->d};
  return OK;
}

API nixl_capi_status_t nixl_capi_release_xfer_dlist_handle(nixl_capi_agent_s* agent, nixl_capi_xfer_dlist_handle_s* h) {
  if (!agent || !h) return E_PARAM;
  delete h;
  return OK;
}

API nixl_capi_status_t nixl_capi_make_xfer_req(nixl_capi_agent_s* agent, int op, nixl_capi_xfer_dlist_handle_s* lh, const int* lidx, size_t ln,
                                               nixl_capi_xfer_dlist_handle_s* rh, const int* ridx, size_t rn, nixl_capi_xfer_req_s** req,
                                               nixl_capi_opt_args_s* opt) {
  if (!agent || !lh || !rh || !req) return E_PARAM;
  if ((op != 0 && op != 1) || ln != rn || ln == 0 || !lidx || !ridx || !lh->agent.empty() || rh->agent.empty()) return E_BACKEND;
  auto x = new nixl_capi_xfer_req_s();
  x->owner = agent->a;
  x->op = op;
  x->remote = rh->agent;
  for (size_t i = 0; i < ln; ++i) {
    if (lidx[i] < 0 || (size_t)lidx[i] >= lh->d.size() || ridx[i] < 0 || (size_t)ridx[i] >= rh->d.size() ||
        lh->d[lidx[i]].len != rh->d[ridx[i]].len) {
      delete x;
      return E_BACKEND;
    }
    x->local.push_back(lh->d[lidx[i]]);
    x->rem.push_back(rh->d[ridx[i]]);
  }
  if (opt && opt->has_notif) {
    x->has_notif = true;
    x->notif = opt->notif;
  }
  *req = x;
  return OK;
}

API nixl_capi_status_t nixl_capi_post_xfer_req(nixl_capi_agent_s* agent, nixl_capi_xfer_req_s* x, nixl_capi_opt_args_s* opt) {
  if (!agent || !x) return E_PARAM;
  std::lock_guard<std::mutex> lk(g_mu);
  if (x->state == 1 || x->released) return E_BACKEND;
  if (opt && opt->has_notif) {
    x->has_notif = true;
    x->notif = opt->notif;
  }
  if (!Agents().count(x->remote)) {
    x->state = -1;
    return E_BACKEND;
  }
  FakeAgent* a = agent->a;
  if (a->delay_us == 0 && (a->posts++ % 2) == 0) {
    x->state = Execute(x) ? 2 : -1;
    return x->state == 2 ? OK : E_BACKEND;
  }
  x->state = 1;
  x->due_us = NowUs() + a->delay_us;
  return IN_PROG;
}

API nixl_capi_status_t nixl_capi_get_xfer_status(nixl_capi_agent_s* agent, nixl_capi_xfer_req_s* x) {
  if (!agent || !x) return E_PARAM;
  std::lock_guard<std::mutex> lk(g_mu);
  if (x->state == 1) {
    if (!Agents().count(x->remote)) x->state = -1;  // the target went away mid-transfer
    else if (NowUs() >= x->due_us) x->state = Execute(x) ? 2 : -1;
  }
  switch (x->state) {
    case 1: return IN_PROG;
    case 2: return OK;
    default: return E_BACKEND;
  }
}

API nixl_capi_status_t nixl_capi_release_xfer_req(nixl_capi_agent_s* agent, nixl_capi_xfer_req_s* x) {
  if (!agent || !x || x->released) return E_PARAM;
  std::lock_guard<std::mutex> lk(g_mu);
  if (x->state == 1) x->state = -2;
  x->released = true;
  return OK;
}

API nixl_capi_status_t nixl_capi_destroy_xfer_req(nixl_capi_xfer_req_s* x) {
  if (!x) return E_PARAM;
  if (!x->released) return E_STATE;
  delete x;
  return OK;
}

API nixl_capi_status_t nixl_capi_gen_notif(nixl_capi_agent_s* agent, const char* remote, const void* data, size_t len, nixl_capi_opt_args_s*) {
  if (!agent || !remote || (!data && len)) return E_PARAM;
  std::lock_guard<std::mutex> lk(g_mu);
  if (!agent->a->remotes.count(remote)) return E_BACKEND;
  auto it = Agents().find(remote);
  if (it == Agents().end()) return E_BACKEND;
  it->second->notifs[agent->a->name].push_back(std::string(static_cast<const char*>(data), len));
  return OK;
}

API nixl_capi_status_t nixl_capi_create_notif_map(nixl_capi_notif_map_s** m) {
  if (!m) return E_PARAM;
  *m = new nixl_capi_notif_map_s();
  return OK;
}
API nixl_capi_status_t nixl_capi_destroy_notif_map(nixl_capi_notif_map_s* m) {
  if (!m) return E_PARAM;
  delete m;
  return OK;
}
API nixl_capi_status_t nixl_capi_get_notifs(nixl_capi_agent_s* agent, nixl_capi_notif_map_s* m, nixl_capi_opt_args_s*) {
  if (!agent || !m) return E_PARAM;
  std::lock_guard<std::mutex> lk(g_mu);
  for (auto& kv : agent->a->notifs)
    for (auto& s : kv.second) m->m[kv.first].push_back(std::move(s));
  agent->a->notifs.clear();
  return OK;
}
API nixl_capi_status_t nixl_capi_notif_map_size(nixl_capi_notif_map_s* m, size_t* n) {
  if (!m || !n) return E_PARAM;
  *n = m->m.size();
  return OK;
}
API nixl_capi_status_t nixl_capi_notif_map_get_agent_at(nixl_capi_notif_map_s* m, size_t i, const char** name) {
  if (!m || !name || i >= m->m.size()) return E_PARAM;
  auto it = m->m.begin();
  std::advance(it, i);
  *name = it->first.c_str();
  return OK;
}
API nixl_capi_status_t nixl_capi_notif_map_get_notifs_size(nixl_capi_notif_map_s* m, const char* name, size_t* n) {
  if (!m || !name || !n) return E_PARAM;
  auto it = m->m.find(name);
  if (it == m->m.end()) return E_PARAM;
  *n = it->second.size();
  return OK;
}
API nixl_capi_status_t nixl_capi_notif_map_get_notif(nixl_capi_notif_map_s* m, const char* name, size_t i, const void** data, size_t* len) {
  if (!m || !name || !data || !len) return E_PARAM;
  auto it = m->m.find(name);
  if (it == m->m.end() || i >= it->second.size()) return E_PARAM;
  *data = it->second[i].data();
  *len = it->second[i].size();
  return OK;
}
API nixl_capi_status_t nixl_capi_notif_map_clear(nixl_capi_notif_map_s* m) {
  if (!m) return E_PARAM;
  m->m.clear();
  return OK;
}
