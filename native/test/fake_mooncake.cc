/**
 * @file fake_mooncake.cc
 * @brief An in-process stand-in for the Mooncake Transfer Engine C API (`libtransfer_engine.so`,
 *        the functions of transfer_engine_c.h that kvconnect's addon uses), built as
 *        `libfake_transfer_engine.so` to test the addon and MooncakeAgent in CI without Mooncake.
 *
 * Engines of one process share a static table keyed by segment name, so a READ or WRITE really
 * copies bytes between the registered memory of two engines and notifies land in the target's
 * queue. Behaviour copied from the real library (docs/backends.md, Mooncake):
 *  - only `P2PHANDSHAKE` metadata is accepted (anything else: createTransferEngine returns NULL);
 *    the segment name is `<local_server_name host>:<port>` with a made-up port, read back with
 *    getLocalIpAndPort; rpc_port and ip_or_host_name are ignored;
 *  - openSegment returns a positive id (the same again on repeat), 0 for the engine's own name,
 *    -1 for an unknown name; it caches the peer's registered buffers at that moment (like the
 *    real segment-descriptor cache): openSegmentNoCache and syncSegmentCache refresh it, and a
 *    transfer to memory the cache does not list FAILS when polled;
 *  - submit accepts anything that fits the batch (code 2 when it does not) and every check
 *    happens when the task is polled: target outside the cached or the live registrations,
 *    a local source outside the initiator's registrations, or a target engine that is gone
 *    give STATUS_FAILED (6); tasks run on the first getTransferStatus after their start time;
 *  - getTransferStatus returns 1 for a task id out of range; freeBatchID returns 4 while a task
 *    is still WAITING/PENDING;
 *  - a notify attached to a batch is queued at submit and delivered to the segment of entries[0]
 *    only from the sender's getTransferStatus once every task of the batch is COMPLETED;
 *  - notify name and msg are NUL-terminated strings (copied as C strings);
 *  - getNotifsFromEngine removes what it returns (malloc'd; free with freeNotifsMsgBuf).
 * registerLocalMemory records each buffer's `location` and accepts only `*`, `cpu:N` and
 * `cuda:N` (the forms of the real engine's buffer locations; anything else returns -1); with the
 * environment variable FAKE_MOONCAKE_REGISTER_LOG set to a path, it appends one line per
 * registration there: `<addr hex> <length> <location>` (tests read it back).
 * Test knob: metadata `P2PHANDSHAKE;fake_delay_us=N` delays every task of that engine by N
 * microseconds after its submit (a stalled transfer); destroying the target meanwhile makes the
 * task fail at its next poll (a "remote disconnect").
 * Thread safety: every function takes one global mutex.
 */
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#define API extern "C" __attribute__((visibility("default")))

extern "C" {
struct transfer_request {
  int opcode;
  void* source;
  int32_t target_id;
  uint32_t file_id;
  uint64_t target_offset;
  uint64_t length;
};
struct transfer_status {
  int status;
  uint64_t transferred_bytes;
};
struct notify_msg {
  char* name;
  char* msg;
};
}

namespace {

enum { WAITING = 0, PENDING = 1, INVALID = 2, CANCELED = 3, COMPLETED = 4, TIMEOUT = 5, FAILED = 6 };

struct Region {
  uintptr_t addr;
  size_t len;
  std::string location;
};

/** `*`, `cpu:N` or `cuda:N` (N decimal digits). */
bool GoodLocation(const char* loc) {
  if (!loc) return false;
  if (std::strcmp(loc, "*") == 0) return true;
  const char* d = std::strncmp(loc, "cpu:", 4) == 0 ? loc + 4 : std::strncmp(loc, "cuda:", 5) == 0 ? loc + 5 : nullptr;
  if (!d || !*d) return false;
  for (; *d; ++d)
    if (*d < '0' || *d > '9') return false;
  return true;
}

struct Task {
  transfer_request req;
  uint64_t start_us;
  int status = WAITING;
  uint64_t done_bytes = 0;
};

struct Batch {
  size_t capacity = 0;
  std::vector<Task> tasks;
  bool has_notify = false;
  bool notify_sent = false;
  std::string notify_target;  // segment name of entries[0]
  std::string notify_name, notify_msg;
};

struct Engine {
  std::string name;
  std::vector<Region> regs;
  std::map<std::string, int32_t> seg_ids;          // name -> id
  std::map<int32_t, std::string> segs;             // id -> name
  std::map<int32_t, std::vector<Region>> cache;    // id -> the peer's buffers when last fetched
  int32_t next_seg = 1;
  std::map<uint64_t, Batch> batches;
  uint64_t next_batch = 1;
  std::vector<std::pair<std::string, std::string>> notifs;
  uint64_t delay_us = 0;
};

std::mutex g_mu;
int g_port = 15000;

std::map<std::string, Engine*>& Engines() {
  static std::map<std::string, Engine*> m;
  return m;
}

uint64_t NowUs() {
  return (uint64_t)std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool Inside(const std::vector<Region>& regs, uintptr_t addr, uint64_t len) {
  if (len == 0) return false;
  for (const Region& r : regs)
    if (addr >= r.addr && addr - r.addr <= r.len && len <= r.len - (addr - r.addr)) return true;
  return false;
}

Engine* ByName(const std::string& n) {
  auto it = Engines().find(n);
  return it == Engines().end() ? nullptr : it->second;
}

/** The engine a segment id of `e` names (its own for 0), or null. */
Engine* Target(Engine* e, int32_t id, std::string* name) {
  if (id == 0) {
    *name = e->name;
    return e;
  }
  auto it = e->segs.find(id);
  if (it == e->segs.end()) return nullptr;
  *name = it->second;
  return ByName(it->second);
}

void Run(Engine* e, Task& t) {
  std::string tname;
  Engine* tgt = Target(e, t.req.target_id, &tname);
  if (!tgt) {
    t.status = FAILED;  // the peer is gone
    return;
  }
  if (t.status != WAITING && t.status != PENDING) return;
  if (NowUs() < t.start_us) {
    t.status = PENDING;
    return;
  }
  const std::vector<Region>* cached = &tgt->regs;
  if (t.req.target_id != 0) {
    auto c = e->cache.find(t.req.target_id);
    cached = c == e->cache.end() ? nullptr : &c->second;
  }
  const uintptr_t remote = (uintptr_t)t.req.target_offset;
  const uintptr_t local = reinterpret_cast<uintptr_t>(t.req.source);
  if (!cached || !Inside(*cached, remote, t.req.length) || !Inside(tgt->regs, remote, t.req.length) ||
      !Inside(e->regs, local, t.req.length) || (t.req.opcode != 0 && t.req.opcode != 1)) {
    t.status = FAILED;
    return;
  }
  if (t.req.opcode == 1) std::memmove(reinterpret_cast<void*>(remote), t.req.source, t.req.length);
  else std::memmove(t.req.source, reinterpret_cast<const void*>(remote), t.req.length);
  t.status = COMPLETED;
  t.done_bytes = t.req.length;
}

Engine* Eng(void* engine) { return static_cast<Engine*>(engine); }

int Submit(void* engine, uint64_t batch_id, transfer_request* entries, size_t count, const notify_msg* nm) {
  Engine* e = Eng(engine);
  if (!e) return -1;
  auto it = e->batches.find(batch_id);
  if (it == e->batches.end()) return -1;
  Batch& b = it->second;
  if (b.tasks.size() + count > b.capacity) return 2;
  if (count == 0) return -1;
  const uint64_t start = NowUs() + e->delay_us;
  for (size_t i = 0; i < count; ++i) {
    Task t;
    t.req = entries[i];
    t.start_us = start;
    b.tasks.push_back(t);
  }
  if (nm) {
    std::string tname;
    if (entries[0].target_id == 0) tname = e->name;
    else {
      auto s = e->segs.find(entries[0].target_id);
      if (s != e->segs.end()) tname = s->second;
    }
    b.has_notify = true;
    b.notify_sent = false;
    b.notify_target = tname;
    b.notify_name = nm->name ? nm->name : "";
    b.notify_msg = nm->msg ? nm->msg : "";
  }
  return 0;
}

int32_t Open(Engine* e, const char* name, bool refresh) {
  if (!e || !name) return -1;
  std::string n(name);
  if (n == e->name) return 0;
  Engine* peer = ByName(n);
  if (!peer) return -1;
  auto it = e->seg_ids.find(n);
  int32_t id;
  if (it == e->seg_ids.end()) {
    id = e->next_seg++;
    e->seg_ids[n] = id;
    e->segs[id] = n;
    refresh = true;
  } else {
    id = it->second;
  }
  if (refresh) e->cache[id] = peer->regs;
  return id;
}

}  // namespace

API void* createTransferEngine(const char* metadata_conn_string, const char* local_server_name, const char* /*ip_or_host_name*/,
                               uint64_t /*rpc_port*/, int /*auto_discover*/) {
  std::lock_guard<std::mutex> lk(g_mu);
  if (!metadata_conn_string) return nullptr;
  std::string meta(metadata_conn_string);
  const std::string p2p = "P2PHANDSHAKE";
  if (meta.compare(0, p2p.size(), p2p) != 0) return nullptr;  // no metadata server in the fake
  auto* e = new Engine();
  size_t k = meta.find("fake_delay_us=");
  if (k != std::string::npos) e->delay_us = std::strtoull(meta.c_str() + k + 14, nullptr, 10);
  std::string host = local_server_name && *local_server_name ? local_server_name : "127.0.0.1";
  size_t colon = host.find(':');
  if (colon != std::string::npos) host = host.substr(0, colon);
  do {
    e->name = host + ":" + std::to_string(g_port++);
  } while (ByName(e->name));
  Engines()[e->name] = e;
  return e;
}

API void destroyTransferEngine(void* engine) {
  std::lock_guard<std::mutex> lk(g_mu);
  Engine* e = Eng(engine);
  if (!e) return;
  Engines().erase(e->name);
  delete e;
}

API int getLocalIpAndPort(void* engine, char* buf_out, size_t buf_len) {
  std::lock_guard<std::mutex> lk(g_mu);
  Engine* e = Eng(engine);
  if (!e || !buf_out || buf_len == 0) return -1;
  std::snprintf(buf_out, buf_len, "%s", e->name.c_str());
  return 0;
}

API int32_t openSegment(void* engine, const char* segment_name) {
  std::lock_guard<std::mutex> lk(g_mu);
  return Open(Eng(engine), segment_name, false);
}

API int32_t openSegmentNoCache(void* engine, const char* segment_name) {
  std::lock_guard<std::mutex> lk(g_mu);
  return Open(Eng(engine), segment_name, true);
}

API int closeSegment(void* engine, int32_t /*segment_id*/) {
  std::lock_guard<std::mutex> lk(g_mu);
  return Eng(engine) ? 0 : -1;
}

API int syncSegmentCache(void* engine) {
  std::lock_guard<std::mutex> lk(g_mu);
  Engine* e = Eng(engine);
  if (!e) return -1;
  for (auto& s : e->segs)
    if (Engine* p = ByName(s.second)) e->cache[s.first] = p->regs;
  return 0;
}

API int registerLocalMemory(void* engine, void* addr, size_t length, const char* location, int /*remote_accessible*/) {
  std::lock_guard<std::mutex> lk(g_mu);
  Engine* e = Eng(engine);
  if (!e || !addr || length == 0 || !GoodLocation(location)) return -1;
  for (const Region& r : e->regs)
    if (r.addr == (uintptr_t)addr) return -1;  // already registered
  e->regs.push_back(Region{(uintptr_t)addr, length, location});
  if (const char* log = std::getenv("FAKE_MOONCAKE_REGISTER_LOG")) {
    if (FILE* f = std::fopen(log, "a")) {
      std::fprintf(f, "%llx %zu %s\n", (unsigned long long)(uintptr_t)addr, length, location);
      std::fclose(f);
    }
  }
  return 0;
}

API int unregisterLocalMemory(void* engine, void* addr) {
  std::lock_guard<std::mutex> lk(g_mu);
  Engine* e = Eng(engine);
  if (!e) return -1;
  for (auto it = e->regs.begin(); it != e->regs.end(); ++it) {
    if (it->addr == (uintptr_t)addr) {
      e->regs.erase(it);
      return 0;
    }
  }
  return -1;
}

API uint64_t allocateBatchID(void* engine, size_t batch_size) {
  std::lock_guard<std::mutex> lk(g_mu);
  Engine* e = Eng(engine);
  if (!e || batch_size == 0) return UINT64_MAX;
  uint64_t id = e->next_batch++;
  e->batches[id].capacity = batch_size;
  return id;
}

API int submitTransfer(void* engine, uint64_t batch_id, transfer_request* entries, size_t count) {
  std::lock_guard<std::mutex> lk(g_mu);
  return Submit(engine, batch_id, entries, count, nullptr);
}

API int submitTransferWithNotify(void* engine, uint64_t batch_id, transfer_request* entries, size_t count, notify_msg nm) {
  std::lock_guard<std::mutex> lk(g_mu);
  return Submit(engine, batch_id, entries, count, &nm);
}

API int getTransferStatus(void* engine, uint64_t batch_id, size_t task_id, transfer_status* status) {
  std::lock_guard<std::mutex> lk(g_mu);
  Engine* e = Eng(engine);
  if (!e || !status) return -1;
  auto it = e->batches.find(batch_id);
  if (it == e->batches.end()) return -1;
  Batch& b = it->second;
  if (task_id >= b.tasks.size()) return 1;
  Task& t = b.tasks[task_id];
  Run(e, t);
  status->status = t.status;
  status->transferred_bytes = t.done_bytes;
  if (t.status == COMPLETED && b.has_notify && !b.notify_sent) {
    bool all = true;
    for (Task& o : b.tasks) {
      if (o.status != COMPLETED) {
        all = false;
        break;
      }
    }
    if (all) {
      b.notify_sent = true;
      if (Engine* tgt = ByName(b.notify_target)) tgt->notifs.emplace_back(b.notify_name, b.notify_msg);
    }
  }
  return 0;
}

API int freeBatchID(void* engine, uint64_t batch_id) {
  std::lock_guard<std::mutex> lk(g_mu);
  Engine* e = Eng(engine);
  if (!e) return -1;
  auto it = e->batches.find(batch_id);
  if (it == e->batches.end()) return -1;
  for (Task& t : it->second.tasks) {
    if (t.status == WAITING || t.status == PENDING) {
      std::string n;
      if (Target(e, t.req.target_id, &n)) return 4;  // still in flight
      t.status = FAILED;
    }
  }
  e->batches.erase(it);
  return 0;
}

API int genNotifyInEngine(void* engine, uint64_t target_id, notify_msg nm) {
  std::lock_guard<std::mutex> lk(g_mu);
  Engine* e = Eng(engine);
  if (!e) return -1;
  std::string n;
  Engine* tgt = Target(e, (int32_t)target_id, &n);
  if (!tgt) return -1;
  tgt->notifs.emplace_back(nm.name ? nm.name : "", nm.msg ? nm.msg : "");
  return 0;
}

API notify_msg* getNotifsFromEngine(void* engine, int* size) {
  std::lock_guard<std::mutex> lk(g_mu);
  Engine* e = Eng(engine);
  if (size) *size = 0;
  if (!e || !size || e->notifs.empty()) return nullptr;
  auto* out = static_cast<notify_msg*>(std::calloc(e->notifs.size(), sizeof(notify_msg)));
  if (!out) return nullptr;
  for (size_t i = 0; i < e->notifs.size(); ++i) {
    out[i].name = strdup(e->notifs[i].first.c_str());
    out[i].msg = strdup(e->notifs[i].second.c_str());
  }
  *size = (int)e->notifs.size();
  e->notifs.clear();
  return out;
}

API int freeNotifsMsgBuf(notify_msg* msg, int size) {
  if (!msg) return 0;
  for (int i = 0; i < size; ++i) {
    std::free(msg[i].name);
    std::free(msg[i].msg);
  }
  std::free(msg);
  return 0;
}
