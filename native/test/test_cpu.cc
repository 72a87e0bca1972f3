// C ABI tests of the CPU checksum kernel (include/kvc_checksum.h). No Node needed.
// Every expected value is computed here independently of the kernel: hand-computed literals from
// SPEC sections 2 and 3, and a naive reference that reads one byte at a time through the header's
// address formulas and multiplies every contribution x * m * (2j + 1) separately.
// Prints one line per failure and a last line "N passed, N failed"; exits 1 on any failure.
#include "kvc_checksum.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

static int g_pass = 0, g_fail = 0;

#define CHECK(cond, ...)                                          \
  do {                                                            \
    if (cond) {                                                   \
      ++g_pass;                                                   \
    } else {                                                      \
      ++g_fail;                                                   \
      std::printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      std::printf(__VA_ARGS__);                                   \
      std::printf("\n");                                          \
    }                                                             \
  } while (0)

typedef unsigned long long ull;

struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed ? seed : 1) {}
  uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
  uint32_t below(uint32_t n) { return (uint32_t)(next() % n); }
};

// Builds a kvc_entry (include/kvc_checksum.h) one field group at a time: a field no call names
// stays 0 (elem_count: 1). Each call sets the fields its comment names, so a test's entry is one
// expression that reads as the geometry it describes.
struct Entry {
  kvc_entry e;
  explicit Entry(uint32_t kind) {
    std::memset(&e, 0, sizeof e);
    e.elem_count[0] = e.elem_count[1] = e.elem_count[2] = 1;
    e.kind = kind;
  }
  // num_blocks, block_stride
  Entry& blocks(uint32_t n, int64_t stride) { e.num_blocks = n; e.block_stride = stride; return *this; }
  // offset
  Entry& at(uint64_t offset) { e.offset = offset; return *this; }
  // factor_base
  Entry& factor(uint64_t base) { e.factor_base = base; return *this; }
  // outer_count, outer_stride (ATTN: local heads; ROWS: rows; STREAM: 1)
  Entry& outer(uint32_t count, int64_t stride) { e.outer_count = count; e.outer_stride = stride; return *this; }
  // ATTN: block_tokens, kblock_tokens, kblock_stride, token_stride
  Entry& tokens(uint32_t block_tokens, uint32_t kblock_tokens, int64_t kblock_stride, int64_t token_stride) {
    e.block_tokens = block_tokens; e.kblock_tokens = kblock_tokens; e.kblock_stride = kblock_stride; e.token_stride = token_stride;
    return *this;
  }
  // ATTN: cell_pieces; the part's byte_start, byte_count
  Entry& cell(uint32_t pieces, uint32_t byte_start, uint32_t byte_count) { e.cell_pieces = pieces; return bytes(byte_start, byte_count); }
  // byte_start, byte_count (ATTN: the part of each cell; STREAM: this state in the stream)
  Entry& bytes(uint32_t byte_start, uint32_t byte_count) { e.byte_start = byte_start; e.byte_count = byte_count; return *this; }
  // ROWS: elem_count[d], elem_stride[d]
  Entry& elem(int d, uint32_t count, int64_t stride) { e.elem_count[d] = count; e.elem_stride[d] = stride; return *this; }
  // ROWS: elem_bytes
  Entry& width(uint32_t elem_bytes) { e.elem_bytes = elem_bytes; return *this; }
  // column
  Entry& col(uint32_t column) { e.column = column; return *this; }
  operator kvc_entry() const { return e; }
};

static kvc_row row(uint32_t group, uint32_t block_id, uint32_t first_token, uint32_t valid, uint32_t out_offset) {
  kvc_row r = {group, block_id, first_token, valid, out_offset, 0};
  return r;
}

// Threads of every Call::run: 1 = kvc_sum_rows_cpu_diag, more = kvc_sum_rows_cpu_mt (main runs
// every test both ways and under every instruction set this CPU runs).
static unsigned g_threads = 1;

// One call of kvc_sum_rows_cpu_diag (or _mt) over a single region.
struct Call {
  std::vector<kvc_entry> entries;
  std::vector<uint32_t> group_start;
  std::vector<const uint8_t*> regions;
  std::vector<uint64_t> region_bytes;
  std::vector<kvc_row> rows;
  std::vector<uint64_t> out;
  kvc_diag diag;

  // One entry (group 0) over the one region `buf`.
  void single(const kvc_entry& e, const std::vector<uint8_t>& buf) {
    entries = {e};
    group_start = {0, 1};
    regions = {buf.data()};
    region_bytes = {buf.size()};
  }

  int run() {
    kvc_tables t = {entries.data(), group_start.data(), (uint32_t)(group_start.size() - 1)};
    std::memset(&diag, 0, sizeof diag);
    if (g_threads > 1)
      return kvc_sum_rows_cpu_mt(&t, regions.data(), region_bytes.data(), (uint32_t)regions.size(), rows.data(),
                                 rows.size(), out.data(), out.size(), g_threads, &diag);
    return kvc_sum_rows_cpu_diag(&t, regions.data(), region_bytes.data(), (uint32_t)regions.size(),
                                 rows.data(), rows.size(), out.data(), out.size(), &diag);
  }
};

// ---- naive references ----------------------------------------------------------------------

static uint64_t addr_attn(const kvc_entry& e, uint32_t blk, uint64_t h, uint64_t t, uint64_t b) {
  return e.offset + (uint64_t)blk * (uint64_t)e.block_stride + (t / e.kblock_tokens) * (uint64_t)e.kblock_stride +
         (t % e.kblock_tokens) * (uint64_t)e.token_stride + h * (uint64_t)e.outer_stride + b;
}

// SPEC 2 through the header's ATTN formula, one byte at a time.
static uint64_t ref_attn(const kvc_entry& e, const uint8_t* region, const kvc_row& r) {
  uint64_t s = 0;
  for (uint64_t h = 0; h < e.outer_count; ++h) {
    uint64_t m = 2 * (e.factor_base + h) + 1;
    for (uint64_t t = 0; t < r.valid_tokens; ++t) {
      for (uint64_t p = 0; p < e.cell_pieces; ++p) {
        uint64_t x = 0;
        for (uint64_t c = 8 * p; c < 8 * p + 8; ++c) {
          if (c < e.byte_start || c >= (uint64_t)e.byte_start + e.byte_count) continue;
          x |= (uint64_t)region[addr_attn(e, r.block_id, h, t, c - e.byte_start)] << (8 * (c % 8));
        }
        uint64_t j = ((uint64_t)r.first_token + t) * e.cell_pieces + p;
        s += x * m * (2 * j + 1);
      }
    }
  }
  return s;
}

// SPEC 3 rows through the header's ROWS formula.
static uint64_t ref_rows(const kvc_entry& e, const uint8_t* region, const kvc_row& r) {
  uint64_t s = 0;
  for (uint64_t i = 0; i < e.outer_count; ++i) {
    uint64_t m = 2 * (e.factor_base + i) + 1;
    uint64_t j = 0;
    for (uint64_t a = 0; a < e.elem_count[0]; ++a)
      for (uint64_t b = 0; b < e.elem_count[1]; ++b)
        for (uint64_t c = 0; c < e.elem_count[2]; ++c, ++j) {
          uint64_t ad = e.offset + (uint64_t)r.block_id * (uint64_t)e.block_stride + i * (uint64_t)e.outer_stride +
                        a * (uint64_t)e.elem_stride[0] + b * (uint64_t)e.elem_stride[1] + c * (uint64_t)e.elem_stride[2];
          uint64_t x = 0;
          for (uint32_t k = 0; k < e.elem_bytes; ++k) x |= (uint64_t)region[ad + k] << (8 * k);
          s += x * m * (2 * j + 1);
        }
  }
  return s;
}

// SPEC 3 (no split): a byte stream read as 8-byte LE pieces, j = piece index.
static uint64_t ref_stream(const std::vector<uint8_t>& stream, uint64_t factor_base) {
  uint64_t s = 0, m = 2 * factor_base + 1;
  for (uint64_t k = 0; 8 * k < stream.size(); ++k) {
    uint64_t x = 0;
    for (uint64_t b = 0; b < 8 && 8 * k + b < stream.size(); ++b) x |= (uint64_t)stream[8 * k + b] << (8 * b);
    s += x * m * (2 * k + 1);
  }
  return s;
}

// ---- tests ---------------------------------------------------------------------------------

// SPEC 2 by hand: 1 layer (3), 2 local heads at global heads 1 and 2, P = 2, one block of 2
// tokens, the second block position (first_token = 2). Pieces hold small numbers:
//   head h, token t, piece p: x = 10*h + 2*t + p + 1.
// m(h) = 2*(3*65536 + 1 + h) + 1 = 393219 + 2h; j = (2 + t)*2 + p.
static void test_hand_attn() {
  std::vector<uint64_t> words(2 * 2 * 2);  // [heads, tokens, pieces], HND
  for (int h = 0; h < 2; ++h)
    for (int t = 0; t < 2; ++t)
      for (int p = 0; p < 2; ++p) words[(h * 2 + t) * 2 + p] = 10 * h + 2 * t + p + 1;
  // head 0: x = 1,2,3,4 at j = 4,5,6,7: 1*9 + 2*11 + 3*13 + 4*15 = 130; * 393219
  // head 1: x = 11,12,13,14:            11*9 + 12*11 + 13*13 + 14*15 = 610; * 393221
  const uint64_t want2 = 130ull * 393219ull + 610ull * 393221ull;
  // only the first token valid: head 0: 1*9 + 2*11 = 31; head 1: 11*9 + 12*11 = 231
  const uint64_t want1 = 31ull * 393219ull + 231ull * 393221ull;

  Call c;
  const kvc_entry e = Entry(KVC_ENTRY_ATTN).blocks(1, 64).factor(3 * 65536 + 1).outer(2, 32).tokens(2, 2, 32, 16).cell(2, 0, 16);
  c.entries = {e};
  c.group_start = {0, 1};
  c.regions = {(const uint8_t*)words.data()};
  c.region_bytes = {64};
  c.rows = {row(0, 0, 2, 2, 0), row(0, 0, 2, 1, 1), row(0, 0, 2, 0, 2)};
  c.out = {5, 0, 7};  // added to, not cleared
  int rc = c.run();
  CHECK(rc == KVC_OK, "rc %d (%s)", rc, c.diag.reason);
  CHECK(c.out[0] == 5 + want2, "got %llu want %llu", (ull)c.out[0], (ull)(5 + want2));
  CHECK(c.out[1] == want1, "got %llu want %llu", (ull)c.out[1], (ull)want1);
  CHECK(c.out[2] == 7, "valid_tokens 0 adds nothing: %llu", (ull)c.out[2]);

  // The same cells split into K (bytes 0..5) and V (bytes 5..16) parts: the piece straddling the
  // parts is the sum of both parts' bytes at their places, so the value is unchanged.
  std::vector<uint8_t> kv(2 * 2 * 16);  // K region [heads, tokens, 5], V region [heads, tokens, 11]
  const uint8_t* src = (const uint8_t*)words.data();
  for (int h = 0; h < 2; ++h)
    for (int t = 0; t < 2; ++t)
      for (int b = 0; b < 16; ++b) {
        uint8_t v = src[(h * 2 + t) * 16 + b];
        if (b < 5) kv[(h * 2 + t) * 5 + b] = v;
        else kv[20 + (h * 2 + t) * 11 + (b - 5)] = v;
      }
  const kvc_entry k = Entry(KVC_ENTRY_ATTN).blocks(1, 20).factor(3 * 65536 + 1).outer(2, 10).tokens(2, 2, 10, 5).cell(2, 0, 5);
  const kvc_entry v = Entry(KVC_ENTRY_ATTN).at(20).blocks(1, 44).factor(3 * 65536 + 1).outer(2, 22).tokens(2, 2, 22, 11).cell(2, 5, 11);
  Call d;
  d.entries = {k, v};
  d.group_start = {0, 2};
  d.regions = {kv.data()};
  d.region_bytes = {kv.size()};
  d.rows = {row(0, 0, 2, 2, 0)};
  d.out = {0};
  rc = d.run();
  CHECK(rc == KVC_OK, "rc %d (%s)", rc, d.diag.reason);
  CHECK(d.out[0] == want2, "split K/V at byte 5: got %llu want %llu", (ull)d.out[0], (ull)want2);
}

// SPEC 3 by hand: one bf16-width row segment, 2 rows of 3 elements, layer 1, segmentStart 4.
static void test_hand_rows() {
  const uint16_t el[6] = {1, 2, 3, 0xffff, 5, 6};  // row 0: 1 2 3; row 1: 65535 5 6
  // row 0: m = 2*(65536 + 4) + 1 = 131081; 1*1 + 2*3 + 3*5 = 22
  // row 1: m = 131083; 65535*1 + 5*3 + 6*5 = 65580
  const uint64_t want = 22ull * 131081ull + 65580ull * 131083ull;
  const kvc_entry e = Entry(KVC_ENTRY_ROWS).blocks(1, 0).factor(65536 + 4).outer(2, 6).elem(2, 3, 2).width(2).col(1);
  Call c;
  c.entries = {e};
  c.group_start = {0, 1};
  c.regions = {(const uint8_t*)el};
  c.region_bytes = {12};
  c.rows = {row(0, 0, 99, 0, 0)};  // first_token and valid_tokens are ignored by ROWS
  c.out = {0, 0};
  int rc = c.run();
  CHECK(rc == KVC_OK, "rc %d (%s)", rc, c.diag.reason);
  CHECK(c.out[1] == want && c.out[0] == 0, "got %llu want %llu", (ull)c.out[1], (ull)want);

  // 4-byte elements, a [2,2] row walked column-major through strides (transposed view):
  // elements in walk order: a[0][0], a[1][0], a[0][1], a[1][1] with memory a = {7, 8, 9, 10}.
  const uint32_t f[4] = {7, 8, 0xfffffff0u, 10};
  // walk: f[0]=7 (j0), f[2] (j1), f[1]=8 (j2), f[3]=10 (j3); m = 2*0+1 = 1
  const uint64_t want4 = 7ull * 1 + 0xfffffff0ull * 3 + 8ull * 5 + 10ull * 7;
  const kvc_entry g = Entry(KVC_ENTRY_ROWS).blocks(1, 0).outer(1, 0).elem(1, 2, 4).elem(2, 2, 8).width(4);
  Call d;
  d.entries = {g};
  d.group_start = {0, 1};
  d.regions = {(const uint8_t*)f};
  d.region_bytes = {16};
  d.rows = {row(0, 0, 0, 0, 0)};
  d.out = {0};
  rc = d.run();
  CHECK(rc == KVC_OK, "rc %d (%s)", rc, d.diag.reason);
  CHECK(d.out[0] == want4, "got %llu want %llu", (ull)d.out[0], (ull)want4);
}

// SPEC 3 (no split) by hand: states of 12 and 6 bytes make an 18-byte stream.
static void test_hand_stream() {
  uint8_t a[12], b[6];
  for (int i = 0; i < 12; ++i) a[i] = (uint8_t)(i + 1);
  for (int i = 0; i < 6; ++i) b[i] = (uint8_t)(0xf0 + i);
  uint8_t s[18];
  std::memcpy(s, a, 12);
  std::memcpy(s + 12, b, 6);
  uint64_t x0, x1 = 0, x2 = 0;
  std::memcpy(&x0, s, 8);
  std::memcpy(&x1, s + 8, 8);
  std::memcpy(&x2, s + 16, 2);
  const uint64_t fb = 6ull * 65536 + 1;  // layer 6, tpRank 1
  const uint64_t want = (x0 * 1 + x1 * 3 + x2 * 5) * (2 * fb + 1);
  std::vector<uint8_t> region(32);
  std::memcpy(region.data() + 3, a, 12);   // unaligned addresses
  std::memcpy(region.data() + 17, b, 6);
  const kvc_entry e = Entry(KVC_ENTRY_STREAM).at(3).blocks(1, 0).factor(fb).outer(1, 0).bytes(0, 12);
  const kvc_entry f = Entry(KVC_ENTRY_STREAM).at(17).blocks(1, 0).factor(fb).outer(1, 0).bytes(12, 6);
  Call c;
  c.entries = {e, f};
  c.group_start = {0, 2};
  c.regions = {region.data()};
  c.region_bytes = {region.size()};
  c.rows = {row(0, 0, 0, 0, 0)};
  c.out = {0};
  int rc = c.run();
  CHECK(rc == KVC_OK, "rc %d (%s)", rc, c.diag.reason);
  CHECK(c.out[0] == want, "got %llu want %llu", (ull)c.out[0], (ull)want);
}

// Runs one ATTN entry `e` over `buf` with one row per block b < nblocks (first token a random
// multiple of bt, valid(b) valid tokens) through the kernel (into c) and compares every output
// with ref_attn: the kernel's rc, or kSumsDiffer (not a kernel code) when it returned OK with
// other sums.
constexpr int kSumsDiffer = -1000;
template <typename Valid>
static int run_attn_rows(Call& c, const kvc_entry& e, const std::vector<uint8_t>& buf, uint32_t nblocks, uint32_t bt, Rng& rng,
                         Valid valid) {
  c.single(e, buf);
  std::vector<uint64_t> want;
  for (uint32_t b = 0; b < nblocks; ++b) {
    const uint32_t v = valid(b);
    const kvc_row r = row(0, b, rng.below(1000) * bt, v, b);
    c.rows.push_back(r);
    want.push_back(ref_attn(e, buf.data(), r));
  }
  c.out.assign(nblocks, 0);
  const int rc = c.run();
  return rc == KVC_OK && c.out != want ? kSumsDiffer : rc;
}

// Random ATTN geometries (HND, NHD, K/V split, kernel blocks, unaligned parts and addresses,
// negative strides) against the naive reference.
static void test_random_attn() {
  Rng rng(12345);
  int bad = 0, cases = 0;
  for (int it = 0; it < 400; ++it) {
    const uint32_t P = 1 + (rng.below(2) ? rng.below(6) : rng.below(40)), heads = 1 + rng.below(3), nblocks = 1 + rng.below(3);
    const uint32_t kbt = 1 + rng.below(3), nkb = 1 + rng.below(3), bt = kbt * nkb;
    const uint32_t cell = 8 * P;
    // part: whole cell, an aligned part, or any byte range
    uint32_t bs = 0, bc = cell;
    switch (rng.below(3)) {
      case 1: bs = 8 * rng.below(P); bc = 8 * (1 + rng.below(P - bs / 8)); break;
      case 2: bs = rng.below(cell); bc = 1 + rng.below(cell - bs); break;
      default: break;
    }
    // physical layouts of [blocks, kblocks, ?, ?, bc] with padding
    const uint32_t pad = rng.below(2) * (1 + rng.below(9));
    const uint64_t cellb = bc + pad;
    int64_t ts, os, kbs, bstr;
    if (rng.below(2)) {  // HND: [block][kblock][head][token][cell]
      ts = (int64_t)cellb; os = (int64_t)(cellb * kbt); kbs = os * heads; bstr = kbs * nkb;
    } else {  // NHD: [block][kblock][token][head][cell]
      os = (int64_t)cellb; ts = os * heads; kbs = ts * kbt; bstr = kbs * nkb;
    }
    const uint64_t total = (uint64_t)bstr * nblocks;
    const uint32_t lead = rng.below(9);
    std::vector<uint8_t> buf(total + lead + 8);
    for (auto& x : buf) x = (uint8_t)rng.next();
    kvc_entry e = Entry(KVC_ENTRY_ATTN).at(lead).blocks(nblocks, bstr).factor(rng.below(4) * 65536ull + rng.below(100))
                      .outer(heads, os).tokens(bt, kbt, kbs, ts).cell(P, bs, bc);
    if (rng.below(4) == 0) {  // blocks in reverse order
      e.block_stride = -bstr;
      e.offset = lead + (uint64_t)bstr * (nblocks - 1);
    }
    Call c;
    const int rc = run_attn_rows(c, e, buf, nblocks, bt, rng, [&](uint32_t) { return rng.below(bt + 1); });
    ++cases;
    if (rc != KVC_OK) {
      if (++bad <= 3)
        std::printf("  attn case %d: rc %d (%s) P=%u heads=%u kbt=%u nkb=%u bs=%u bc=%u pad=%u\n", it, rc,
                    c.diag.reason, P, heads, kbt, nkb, bs, bc, pad);
    }
  }
  CHECK(bad == 0, "%d of %d random ATTN cases differ from the reference", bad, cases);
}

// Token parts that follow each other in memory and hold whole pieces only (the K or V half of a
// cell in an HND layout: token stride == byte_count, byte_start % 8 == 0, byte_count a multiple of
// 32, 64 or 128 bytes): the kernel walks each kernel block's parts as one run of bytes
// (checksum_kernel.inc, dense_add). Kernel blocks adjacent or padded, one token per kernel block
// (kbt 1), partial last kernel blocks (valid % kbt != 0), 0 and 1 valid tokens, every vector
// width's loop; against the naive reference.
static void test_adjacent_parts() {
  Rng rng(777);
  int bad = 0, cases = 0;
  const uint32_t widths[] = {32, 64, 128, 256, 384};  // bytes: multiples of each width's iteration
  for (int it = 0; it < 300; ++it) {
    const uint32_t bc = widths[it % 5] * (1 + rng.below(2)), halves = 1 + rng.below(2);
    const uint32_t P = halves * bc / 8 + rng.below(2), cell = 8 * P;  // K and V halves, maybe a spare piece
    const uint32_t bs = halves == 2 && rng.below(2) ? bc : 8 * rng.below((cell - bc) / 8 + 1);
    const uint32_t kbt = it % 7 == 0 ? 1 : 1 + rng.below(16), nkb = 1 + rng.below(3), bt = kbt * nkb;
    const uint32_t heads = 1 + rng.below(3), nblocks = 1 + rng.below(3);
    const int64_t ts = bc, hpad = rng.below(2) * (1 + rng.below(40));
    int64_t os, kbs, bstr;
    if (kbt == 1 && rng.below(2)) {  // [block][head][token][part]: a head's tokens adjacent through kbs
      kbs = bc; os = (int64_t)nkb * bc + hpad; bstr = os * heads;
    } else {  // [block][kblock][head][token][part]
      os = ts * kbt + hpad; kbs = os * heads; bstr = kbs * nkb;
    }
    const uint32_t lead = rng.below(9);
    std::vector<uint8_t> buf((uint64_t)bstr * nblocks + lead + 8);
    for (auto& x : buf) x = (uint8_t)rng.next();
    const uint64_t fb = rng.below(4) * 65536ull;
    const kvc_entry e = Entry(KVC_ENTRY_ATTN)
                            .factor(fb + rng.below(100))
                            .outer(heads, os)
                            .tokens(bt, kbt, kbs, ts)
                            .blocks(nblocks, bstr)
                            .cell(P, bs, bc)
                            .at(lead);
    Call c;
    const int rc = run_attn_rows(c, e, buf, nblocks, bt, rng, [&](uint32_t) {
      const uint32_t pick = rng.below(4);
      return pick == 0 ? bt : pick == 1 ? rng.below(2) : rng.below(bt + 1);
    });
    ++cases;
    if (rc != KVC_OK) {
      if (++bad <= 3)
        std::printf("  adjacent-parts case %d: rc %d (%s) P=%u heads=%u kbt=%u nkb=%u bs=%u bc=%u\n", it, rc, c.diag.reason, P,
                    heads, kbt, nkb, bs, bc);
    }
  }
  CHECK(bad == 0, "%d of %d adjacent-part ATTN cases differ from the reference", bad, cases);
}

// Strided layouts whose heads of one token lie closer than the tokens of one head (NHD): the
// kernel walks them token by token over all heads at once (checksum_kernel.inc, wsum_heads_v, up
// to 32 heads). Odd head counts, 32 and 33 heads (the limit and past it), 1 valid token, kernel
// blocks, parts that cut pieces, heads in reverse order (negative head stride), every vector
// width's loop; on 1..8 threads, with fewer rows than threads too, against the naive reference.
static void test_token_major() {
  Rng rng(4242);
  const uint32_t head_counts[] = {2, 3, 5, 7, 8, 31, 32, 33};
  int bad = 0, cases = 0;
  for (int it = 0; it < 96; ++it) {
    const uint32_t heads = head_counts[it % 8];
    const uint32_t P = 1 + (it % 3 == 0 ? rng.below(4) : rng.below(40)), cell = 8 * P;
    const uint32_t kbt = it % 4 == 1 ? 1 + rng.below(3) : 4 + rng.below(13), nkb = it % 4 == 1 ? 1 + rng.below(3) : 1;
    const uint32_t bt = kbt * nkb, nblocks = 1 + rng.below(5);
    uint32_t bs = 0, bc = cell;
    switch (rng.below(3)) {
      case 1: bs = 8 * rng.below(P); bc = 8 * (1 + rng.below(P - bs / 8)); break;
      case 2: bs = rng.below(cell); bc = 1 + rng.below(cell - bs); break;
      default: break;
    }
    const uint32_t pad = rng.below(2) * (1 + rng.below(9));
    const int64_t os = (int64_t)(bc + pad), ts = os * heads, kbs = ts * kbt, bstr = kbs * nkb;
    const uint32_t lead = rng.below(9);
    std::vector<uint8_t> buf((uint64_t)bstr * nblocks + lead + 8);
    for (auto& x : buf) x = (uint8_t)rng.next();
    kvc_entry e = Entry(KVC_ENTRY_ATTN).at(lead).blocks(nblocks, bstr).factor(rng.below(4) * 65536ull + rng.below(100))
                      .outer(heads, os).tokens(bt, kbt, kbs, ts).cell(P, bs, bc);
    if (rng.below(3) == 0) {  // heads in reverse order
      e.outer_stride = -os;
      e.offset = lead + (uint64_t)os * (heads - 1);
    }
    Call c;
    c.single(e, buf);
    const uint32_t n_rows = 1 + rng.below(it % 2 ? 3 : 12);  // often fewer rows than threads
    std::vector<uint64_t> want(4, 0);
    for (uint32_t i = 0; i < n_rows; ++i) {
      const uint32_t valid = rng.below(4) == 0 ? 1 : rng.below(bt + 1);
      kvc_row r = row(0, rng.below(nblocks), rng.below(1000) * bt, valid, rng.below(4));
      c.rows.push_back(r);
      want[r.out_offset] += ref_attn(e, buf.data(), r);
    }
    const unsigned saved = g_threads;
    for (unsigned th = 1; th <= 8; ++th) {
      g_threads = th;
      c.out.assign(4, 0);
      const int rc = c.run();
      ++cases;
      if (rc != KVC_OK || c.out != want) {
        if (++bad <= 3)
          std::printf("  token-major case %d, %u threads: rc %d (%s) heads=%u P=%u kbt=%u nkb=%u bs=%u bc=%u rows=%u\n", it, th, rc,
                      c.diag.reason, heads, P, kbt, nkb, bs, bc, n_rows);
      }
    }
    g_threads = saved;
  }
  CHECK(bad == 0, "%d of %d token-major ATTN cases differ from the reference", bad, cases);
}

static void test_random_rows() {
  Rng rng(777);
  int bad = 0, cases = 0;
  for (int it = 0; it < 300; ++it) {
    const uint32_t w = rng.below(2) ? 2 : 4;
    const uint32_t d0 = 1 + rng.below(3), d1 = 1 + rng.below(4), d2 = 1 + rng.below(9);
    const uint32_t nrows = 1 + rng.below(4), nblocks = 1 + rng.below(3);
    // a state [nrows, d0, d1, d2] per block, walked in a random dim order (a permuted view)
    const int64_t st2 = w, st1 = st2 * d2, st0 = st1 * d1, rs = st0 * d0, bstr = rs * nrows + rng.below(5);
    const uint64_t fb = rng.below(3) * 65536ull + rng.below(50);
    uint32_t cnt[3] = {d0, d1, d2};
    int64_t str[3] = {st0, st1, st2};
    int perm = (int)rng.below(3);
    if (perm == 1) { std::swap(cnt[1], cnt[2]); std::swap(str[1], str[2]); }
    if (perm == 2) { std::swap(cnt[0], cnt[2]); std::swap(str[0], str[2]); }
    kvc_entry e = Entry(KVC_ENTRY_ROWS)
                      .at(rng.below(7))  // unaligned element addresses
                      .blocks(nblocks, bstr).factor(fb).outer(nrows, rs).width(w)
                      .elem(0, cnt[0], str[0]).elem(1, cnt[1], str[1]).elem(2, cnt[2], str[2]);
    const uint64_t size = e.offset + (uint64_t)bstr * nblocks + 8;
    if (rng.below(3) == 0) {  // rows in reverse order, and the innermost dim reversed
      e.outer_stride = -rs;
      e.offset += (uint64_t)rs * (nrows - 1);
      e.offset += (uint64_t)e.elem_stride[2] * (e.elem_count[2] - 1);
      e.elem_stride[2] = -e.elem_stride[2];
    }
    std::vector<uint8_t> buf(size);
    for (auto& x : buf) x = (uint8_t)rng.next();
    Call c;
    c.single(e, buf);
    std::vector<uint64_t> want;
    for (uint32_t b = 0; b < nblocks; ++b) {
      kvc_row r = row(0, b, 0, 0, b);
      c.rows.push_back(r);
      want.push_back(ref_rows(e, buf.data(), r));
    }
    c.out.assign(nblocks, 0);
    int rc = c.run();
    ++cases;
    if ((rc != KVC_OK || c.out != want) && ++bad <= 3)
      std::printf("  rows case %d: rc %d (%s)\n", it, rc, c.diag.reason);
  }
  CHECK(bad == 0, "%d of %d random ROWS cases differ from the reference", bad, cases);
}

static void test_random_stream() {
  Rng rng(99);
  int bad = 0;
  for (int it = 0; it < 200; ++it) {
    const uint32_t nstates = 1 + rng.below(4);
    std::vector<uint32_t> sizes;
    uint32_t total = 0;
    for (uint32_t i = 0; i < nstates; ++i) { sizes.push_back(1 + rng.below(40)); total += sizes.back(); }
    std::vector<uint8_t> region(total + 64);
    for (auto& x : region) x = (uint8_t)rng.next();
    std::vector<uint8_t> stream;
    Call c;
    uint64_t fb = rng.below(1000);
    uint32_t at = rng.below(5), pos = 0;
    for (uint32_t i = 0; i < nstates; ++i) {
      c.entries.push_back(Entry(KVC_ENTRY_STREAM).at(at).blocks(1, 0).factor(fb).outer(1, 0).bytes(pos, sizes[i]));
      stream.insert(stream.end(), region.begin() + at, region.begin() + at + sizes[i]);
      at += sizes[i] + rng.below(3);
      pos += sizes[i];
    }
    c.group_start = {0, (uint32_t)c.entries.size()};
    c.regions = {region.data()};
    c.region_bytes = {region.size()};
    c.rows = {row(0, 0, 0, 0, 0)};
    c.out = {0};
    int rc = c.run();
    if ((rc != KVC_OK || c.out[0] != ref_stream(stream, fb)) && ++bad <= 3)
      std::printf("  stream case %d: rc %d (%s)\n", it, rc, c.diag.reason);
  }
  CHECK(bad == 0, "%d random STREAM cases differ from the reference", bad);
}

// A valid one-group call that each error test breaks in one place.
static Call good_call(std::vector<uint8_t>& buf) {
  buf.assign(2 * 2 * 4 * 16, 0x5a);  // 2 blocks of [2 heads, 4 tokens, 16 bytes]
  Call c;
  c.entries = {Entry(KVC_ENTRY_ATTN).blocks(2, 128).outer(2, 64).tokens(4, 4, 128, 16).cell(2, 0, 16)};
  c.group_start = {0, 1};
  c.regions = {buf.data()};
  c.region_bytes = {buf.size()};
  c.rows = {row(0, 0, 0, 4, 0), row(0, 1, 4, 2, 1)};
  c.out = {11, 22};
  return c;
}

template <class F>
static void expect_error(const char* what, int code, uint32_t at, uint64_t index, const char* why, F breaker) {
  std::vector<uint8_t> buf;
  Call c = good_call(buf);
  breaker(c);
  int rc = c.run();
  CHECK(rc == code, "%s: rc %d want %d (%s)", what, rc, code, c.diag.reason);
  CHECK(c.diag.code == code && c.diag.at == at && c.diag.index == index && c.diag.reason != nullptr,
        "%s: diag code %d at %u index %llu", what, c.diag.code, c.diag.at, (ull)c.diag.index);
  CHECK(c.diag.reason && std::strstr(c.diag.reason, why), "%s: reason \"%s\" lacks \"%s\"", what, c.diag.reason, why);
  CHECK(c.out.empty() || (c.out[0] == 11 && (c.out.size() < 2 || c.out[1] == 22)), "%s: out written on error", what);
}

static void test_errors() {
  {
    std::vector<uint8_t> buf;
    Call c = good_call(buf);
    CHECK(c.run() == KVC_OK, "the good call fails: %s", c.diag.reason);
    CHECK(c.diag.code == KVC_OK && c.diag.at == KVC_AT_NONE, "diag on success");
  }
  const int EI = KVC_EINVAL, ER = KVC_ERANGE;
  const uint32_t ENT = KVC_AT_ENTRY, ROW = KVC_AT_ROW;
  expect_error("unknown kind", EI, ENT, 0, "unknown entry kind", [](Call& c) { c.entries[0].kind = 9; });
  expect_error("kind 0", EI, ENT, 0, "unknown entry kind", [](Call& c) { c.entries[0].kind = 0; });
  expect_error("num_blocks 0", EI, ENT, 0, "num_blocks is 0", [](Call& c) { c.entries[0].num_blocks = 0; });
  expect_error("heads 0", EI, ENT, 0, "outer_count (local heads) is 0", [](Call& c) { c.entries[0].outer_count = 0; });
  expect_error("kblock_tokens 0", EI, ENT, 0, "kblock_tokens is 0", [](Call& c) { c.entries[0].kblock_tokens = 0; });
  expect_error("block_tokens 0", EI, ENT, 0, "block_tokens is 0", [](Call& c) { c.entries[0].block_tokens = 0; });
  expect_error("block_tokens % kblock", EI, ENT, 0, "not a multiple of kblock_tokens", [](Call& c) { c.entries[0].kblock_tokens = 3; });
  expect_error("cell_pieces 0", EI, ENT, 0, "cell_pieces is 0", [](Call& c) { c.entries[0].cell_pieces = 0; });
  expect_error("byte_count 0", EI, ENT, 0, "byte_count is 0", [](Call& c) { c.entries[0].byte_count = 0; });
  expect_error("part past cell", EI, ENT, 0, "exceeds the cell", [](Call& c) { c.entries[0].byte_start = 1; });
  expect_error("part past cell (u32 wrap)", EI, ENT, 0, "exceeds the cell", [](Call& c) {
    c.entries[0].byte_start = 0xfffffff8u;
    c.entries[0].byte_count = 16;
  });
  expect_error("ROWS elem_bytes 3", EI, ENT, 0, "elem_bytes is not 2 or 4", [](Call& c) {
    c.entries[0] = Entry(KVC_ENTRY_ROWS).blocks(2, 0).outer(1, 0).width(3);
  });
  expect_error("ROWS elem_bytes 8", EI, ENT, 0, "elem_bytes is not 2 or 4", [](Call& c) {
    c.entries[0] = Entry(KVC_ENTRY_ROWS).blocks(2, 0).outer(1, 0).width(8);
  });
  expect_error("ROWS elem_count 0", EI, ENT, 0, "an elem_count is 0", [](Call& c) {
    c.entries[0] = Entry(KVC_ENTRY_ROWS).blocks(2, 0).outer(1, 0).width(2).elem(1, 0, 0);
  });
  expect_error("ROWS block_tokens != 0", EI, ENT, 0, "block_tokens is not 0", [](Call& c) {
    c.entries[0] = Entry(KVC_ENTRY_ROWS).blocks(2, 0).outer(1, 0).width(2);
    c.entries[0].block_tokens = 1;
  });
  expect_error("STREAM outer_count 2", EI, ENT, 0, "outer_count is not 1", [](Call& c) {
    c.entries[0] = Entry(KVC_ENTRY_STREAM).blocks(2, 0).outer(2, 0).bytes(0, 8);
  });
  expect_error("STREAM byte_count 0", EI, ENT, 0, "byte_count is 0", [](Call& c) {
    c.entries[0] = Entry(KVC_ENTRY_STREAM).blocks(2, 0).outer(1, 0);
  });
  expect_error("negative extent", EI, ENT, 0, "starts before its region", [](Call& c) { c.entries[0].block_stride = -128; });
  expect_error("extent overflows 2^64", EI, ENT, 0, "overflows 64 bits", [](Call& c) {
    c.entries[0].offset = UINT64_MAX - 100;
  });
  expect_error("huge strides overflow 2^64", EI, ENT, 0, "overflows 64 bits", [](Call& c) {
    c.entries[0].block_stride = INT64_MAX;
    c.entries[0].num_blocks = 0xffffffffu;
  });
  expect_error("extent past region", ER, ENT, 0, "exceeds its region", [](Call& c) { c.region_bytes[0] -= 1; });
  expect_error("offset past region", ER, ENT, 0, "exceeds its region", [](Call& c) { c.entries[0].offset = 1; });
  expect_error("num_blocks past region", ER, ENT, 0, "exceeds its region", [](Call& c) { c.entries[0].num_blocks = 3; });
  expect_error("region index past", ER, ENT, 0, "region index is past", [](Call& c) { c.entries[0].region = 1; });
  expect_error("second entry bad", ER, ENT, 1, "exceeds its region", [](Call& c) {
    c.entries.push_back(c.entries[0]);
    c.entries[1].token_stride = 17;
    c.group_start[1] = 2;
  });
  expect_error("overlapping strides (work bound)", EI, ENT, 0, "more bytes per block", [](Call& c) {
    c.entries[0].outer_stride = 0;
    c.entries[0].token_stride = 0;
    c.entries[0].kblock_stride = 0;
    c.entries[0].block_stride = 0;
    c.entries[0].outer_count = 1000;
  });
  expect_error("group_start decreasing", EI, KVC_AT_GROUP, 1, "non-decreasing", [](Call& c) {
    c.group_start = {1, 0};
  });
  expect_error("row group past", ER, ROW, 1, "group index is past", [](Call& c) { c.rows[1].group = 1; });
  expect_error("row block id past", ER, ROW, 1, "block_id is past", [](Call& c) { c.rows[1].block_id = 2; });
  expect_error("row out past", ER, ROW, 0, "past the output", [](Call& c) { c.rows[0].out_offset = 2; });
  expect_error("row out + column past", ER, ROW, 1, "past the output", [](Call& c) { c.entries[0].column = 1; });
  expect_error("row out_offset + column wraps u32", ER, ROW, 0, "past the output", [](Call& c) {
    c.entries[0].column = 0xffffffffu;
    c.rows[0].out_offset = 1;
    c.rows[1].out_offset = 0xffffffffu;
  });
  expect_error("row valid past block_tokens", ER, ROW, 0, "valid_tokens exceeds", [](Call& c) { c.rows[0].valid_tokens = 5; });
  expect_error("out shorter", ER, ROW, 1, "past the output", [](Call& c) { c.out.resize(1); });
  {
    // NULL output and NULL region addresses
    std::vector<uint8_t> buf;
    Call c = good_call(buf);
    kvc_tables t = {c.entries.data(), c.group_start.data(), 1};
    kvc_diag d;
    int rc = kvc_sum_rows_cpu_diag(&t, c.regions.data(), c.region_bytes.data(), 1, c.rows.data(), 2, nullptr, 2, &d);
    CHECK(rc == KVC_EINVAL && d.at == KVC_AT_ARGS, "out NULL: rc %d", rc);
    const uint8_t* none[1] = {nullptr};
    rc = kvc_sum_rows_cpu_diag(&t, none, c.region_bytes.data(), 1, c.rows.data(), 2, c.out.data(), 2, &d);
    CHECK(rc == KVC_EINVAL && d.at == KVC_AT_ENTRY && c.out[0] == 11, "region NULL: rc %d", rc);
  }
  {
    // out overlapping the rows
    std::vector<uint8_t> buf;
    Call c = good_call(buf);
    kvc_tables t = {c.entries.data(), c.group_start.data(), 1};
    std::vector<uint64_t> mem(16, 0);
    kvc_row* rows = (kvc_row*)mem.data();
    rows[0] = c.rows[0];
    rows[1] = c.rows[1];
    kvc_diag d;
    int rc = kvc_sum_rows_cpu_diag(&t, c.regions.data(), c.region_bytes.data(), 1, rows, 2, mem.data() + 2, 4, &d);
    CHECK(rc == KVC_EINVAL && d.at == KVC_AT_ARGS, "out overlapping rows: rc %d", rc);
    rc = kvc_sum_rows_cpu_diag(&t, c.regions.data(), c.region_bytes.data(), 1, rows, 2, mem.data() + 6, 4, &d);
    CHECK(rc == KVC_OK, "out right after rows: rc %d (%s)", rc, d.reason);
  }
  {
    // no rows: tables still checked; kvc_sum_rows_cpu (no diag) gives the same codes
    std::vector<uint8_t> buf;
    Call c = good_call(buf);
    c.entries[0].kind = 7;
    kvc_tables t = {c.entries.data(), c.group_start.data(), 1};
    int rc = kvc_sum_rows_cpu(&t, c.regions.data(), c.region_bytes.data(), 1, nullptr, 0, nullptr, 0);
    CHECK(rc == KVC_EINVAL, "bad table with no rows: rc %d", rc);
    c.entries[0].kind = KVC_ENTRY_ATTN;
    rc = kvc_sum_rows_cpu(&t, c.regions.data(), c.region_bytes.data(), 1, nullptr, 0, nullptr, 0);
    CHECK(rc == KVC_OK, "no rows: rc %d", rc);
    rc = kvc_sum_rows_cpu(nullptr, c.regions.data(), c.region_bytes.data(), 1, nullptr, 0, nullptr, 0);
    CHECK(rc == KVC_EINVAL, "NULL tables: rc %d", rc);
    c.rows[1].block_id = 9;
    rc = kvc_sum_rows_cpu(&t, c.regions.data(), c.region_bytes.data(), 1, c.rows.data(), 2, c.out.data(), 2);
    CHECK(rc == KVC_ERANGE && c.out[0] == 11, "kvc_sum_rows_cpu row error: rc %d", rc);
  }
}

static void test_extent() {
  uint64_t lo = 1, hi = 1;
  const kvc_entry e = Entry(KVC_ENTRY_ATTN).at(1000).blocks(3, 4096).outer(4, -256).tokens(6, 2, 1024, 32).cell(4, 8, 24);  // heads in reverse
  // lo = 1000 - 3*256 = 232; hi = 1000 + 2*4096 + 2*1024 + 1*32 + 24 = 11296
  int rc = kvc_entry_extent(&e, &lo, &hi);
  CHECK(rc == KVC_OK && lo == 232 && hi == 11296, "ATTN extent rc %d [%llu, %llu)", rc, (ull)lo, (ull)hi);
  const kvc_entry r = Entry(KVC_ENTRY_ROWS).at(10).blocks(2, 100).outer(3, 20).elem(0, 2, -4).elem(2, 5, 2).width(2);
  // lo = 10 - 4 = 6; hi = 10 + 100 + 40 + 8 + 2 = 160
  rc = kvc_entry_extent(&r, &lo, &hi);
  CHECK(rc == KVC_OK && lo == 6 && hi == 160, "ROWS extent rc %d [%llu, %llu)", rc, (ull)lo, (ull)hi);
  kvc_entry s = Entry(KVC_ENTRY_STREAM).at(5).blocks(4, 64).outer(1, 0).bytes(100, 40);
  rc = kvc_entry_extent(&s, &lo, &hi);
  CHECK(rc == KVC_OK && lo == 5 && hi == 5 + 3 * 64 + 40, "STREAM extent rc %d [%llu, %llu)", rc, (ull)lo, (ull)hi);
  s.kind = 0;
  CHECK(kvc_entry_extent(&s, &lo, &hi) == KVC_EINVAL, "bad kind extent");
  CHECK(kvc_entry_extent(nullptr, &lo, &hi) == KVC_EINVAL, "NULL extent");
  CHECK(kvc_entry_check(&e) == nullptr && kvc_entry_check(&s) != nullptr, "kvc_entry_check");
}

static void test_plain_weighted() {
  const uint64_t w[5] = {1, UINT64_MAX, 5, 7, 1ull << 63};
  uint8_t buf[41];
  std::memcpy(buf + 1, w, 40);  // unaligned
  CHECK(kvc_plain_sum64(buf + 1, 5) == (uint64_t)(1 + UINT64_MAX + 5 + 7 + (1ull << 63)), "plain sum");
  uint64_t want = 1 * 1 + UINT64_MAX * 3 + 5 * 5 + 7 * 7 + (1ull << 63) * 9;
  CHECK(kvc_weighted_sum64(buf + 1, 5) == want, "weighted sum %llu", (ull)kvc_weighted_sum64(buf + 1, 5));
  CHECK(kvc_plain_sum64(buf, 0) == 0 && kvc_weighted_sum64(buf, 0) == 0, "empty sums");
}

// Long slices (every vector width's main loop and remainder) and many rows sharing output words,
// single- vs multi-threaded: the multi-threaded sums must equal the single-threaded ones exactly.
static void test_long_and_parallel() {
  Rng rng(777);
  std::vector<uint8_t> buf(1u << 20);
  for (auto& x : buf) x = (uint8_t)rng.next();
  for (uint32_t n = 0; n < 80; ++n) {  // weighted words vs the definition
    uint64_t want = 0;
    for (uint32_t j = 0; j < n; ++j) {
      uint64_t x;
      std::memcpy(&x, buf.data() + 3 + 8 * j, 8);
      want += x * (2u * j + 1u);
    }
    CHECK(kvc_weighted_sum64(buf.data() + 3, n) == want, "weighted sum of %u words", n);
  }
  // 64 heads x 16 tokens x 48 pieces, NHD, 40 blocks; 200 rows over the blocks, out offsets shared.
  const int64_t token_stride = 4 * 8 * 48, block_stride = 16 * token_stride;
  const kvc_entry e = Entry(KVC_ENTRY_ATTN).blocks((uint32_t)(buf.size() / (uint64_t)block_stride), block_stride)
                          .outer(4, 8 * 48).tokens(16, 16, block_stride, token_stride).cell(48, 0, 8 * 48);
  Call c;
  c.single(e, buf);
  for (uint32_t i = 0; i < 200; ++i) c.rows.push_back(row(0, rng.below(e.num_blocks), 16 * rng.below(100), 1 + rng.below(16), rng.below(37)));
  c.out.assign(37, 0);
  const unsigned saved = g_threads;
  g_threads = 1;
  int rc = c.run();
  const std::vector<uint64_t> single = c.out;
  for (unsigned th : {2u, 3u, 8u, 200u, 1000u}) {
    g_threads = th;
    c.out.assign(37, 0);
    int rc2 = c.run();
    CHECK(rc == KVC_OK && rc2 == KVC_OK && c.out == single, "%u threads equal 1 thread (rc %d/%d)", th, rc, rc2);
  }
  // an error found by the checks leaves out untouched, threads or not
  g_threads = 4;
  c.rows[150].block_id = e.num_blocks;
  c.out.assign(37, 5);
  rc = c.run();
  CHECK(rc == KVC_ERANGE && c.diag.at == KVC_AT_ROW && c.diag.index == 150 && c.out == std::vector<uint64_t>(37, 5),
        "threaded row error rc %d at %u index %llu", rc, c.diag.at, (ull)c.diag.index);
  g_threads = saved;
  const uint64_t words = buf.size() / 8;
  CHECK(kvc_plain_sum64_mt(buf.data(), words, 4) == kvc_plain_sum64(buf.data(), words), "plain sum on 4 threads");
}

int main() {
  const char* isas[] = {"generic", "avx2", "avx512"};
  int ran = 0;
  for (const char* isa : isas) {
    if (kvc_set_cpu_isa(isa) != KVC_OK) {
      std::printf("skipped: instruction set %s (this CPU does not run it)\n", isa);
      continue;
    }
    CHECK(std::strcmp(kvc_cpu_isa(), isa) == 0, "kvc_cpu_isa() = %s after choosing %s", kvc_cpu_isa(), isa);
    ++ran;
    for (unsigned th : {1u, 3u}) {
      g_threads = th;
      test_hand_attn();
      test_hand_rows();
      test_hand_stream();
      test_random_attn();
      test_adjacent_parts();
      test_random_rows();
      test_random_stream();
      test_errors();
    }
    g_threads = 1;
    test_extent();
    test_plain_weighted();
    test_long_and_parallel();
    test_token_major();
  }
  CHECK(ran >= 1, "at least the generic instruction set ran");
  CHECK(kvc_set_cpu_isa("sse9") == KVC_EINVAL && kvc_set_cpu_isa(nullptr) == KVC_EINVAL, "unknown instruction sets refused");
  CHECK(kvc_set_cpu_isa("auto") == KVC_OK, "auto");
  std::printf("instruction set (auto): %s\n", kvc_cpu_isa());
  std::printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail ? 1 : 0;
}
