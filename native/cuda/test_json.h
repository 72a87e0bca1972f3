/**
 * @file test_json.h
 * @brief A small strict JSON reader and a base64 decoder for the C++ tests (no dependency, so CI
 *        compiles the tests wherever nvcc is). Reads ../shared/vectors/checksum-v1.json.
 */
#ifndef KVC_TEST_JSON_H
#define KVC_TEST_JSON_H

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace kvct {

struct Json {
  enum Type { Null, Bool, Num, Str, Arr, Obj } type = Null;
  bool b = false;
  double num = 0;
  std::string str;  // Str, and the literal text of Num
  std::vector<Json> arr;
  std::vector<std::pair<std::string, Json>> obj;

  const Json& at(const std::string& k) const {
    for (auto& kv : obj)
      if (kv.first == k) return kv.second;
    throw std::runtime_error("json: no key " + k);
  }
  bool has(const std::string& k) const {
    for (auto& kv : obj)
      if (kv.first == k) return true;
    return false;
  }
  const Json& operator[](const std::string& k) const { return at(k); }
  const Json& operator[](size_t i) const {
    if (type != Arr || i >= arr.size()) throw std::runtime_error("json: bad index");
    return arr[i];
  }
  size_t size() const { return type == Arr ? arr.size() : obj.size(); }
  /** A JSON number that is a non-negative integer. */
  uint64_t u() const {
    if (type != Num) throw std::runtime_error("json: not a number");
    return std::strtoull(str.c_str(), nullptr, 10);
  }
  /** A uint64 written as a decimal string (the vectors' convention). */
  uint64_t u64s() const {
    if (type != Str) throw std::runtime_error("json: uint64 is not a string");
    return std::strtoull(str.c_str(), nullptr, 10);
  }
  const std::string& s() const {
    if (type != Str) throw std::runtime_error("json: not a string");
    return str;
  }
};

class JsonParser {
 public:
  explicit JsonParser(const std::string& t) : t_(t) {}
  Json parse() {
    Json v = value();
    ws();
    if (i_ != t_.size()) fail("trailing bytes");
    return v;
  }

 private:
  const std::string& t_;
  size_t i_ = 0;
  [[noreturn]] void fail(const char* why) { throw std::runtime_error(std::string("json: ") + why + " at " + std::to_string(i_)); }
  void ws() {
    while (i_ < t_.size() && (t_[i_] == ' ' || t_[i_] == '\n' || t_[i_] == '\r' || t_[i_] == '\t')) ++i_;
  }
  char peek() {
    ws();
    if (i_ >= t_.size()) fail("unexpected end");
    return t_[i_];
  }
  void expect(char c) {
    if (peek() != c) fail("unexpected character");
    ++i_;
  }
  Json value() {
    char c = peek();
    Json v;
    if (c == '{') {
      v.type = Json::Obj;
      ++i_;
      if (peek() == '}') { ++i_; return v; }
      for (;;) {
        std::string k = string();
        expect(':');
        v.obj.emplace_back(std::move(k), value());
        if (peek() == ',') { ++i_; continue; }
        expect('}');
        return v;
      }
    }
    if (c == '[') {
      v.type = Json::Arr;
      ++i_;
      if (peek() == ']') { ++i_; return v; }
      for (;;) {
        v.arr.push_back(value());
        if (peek() == ',') { ++i_; continue; }
        expect(']');
        return v;
      }
    }
    if (c == '"') {
      v.type = Json::Str;
      v.str = string();
      return v;
    }
    if (t_.compare(i_, 4, "true") == 0) { i_ += 4; v.type = Json::Bool; v.b = true; return v; }
    if (t_.compare(i_, 5, "false") == 0) { i_ += 5; v.type = Json::Bool; return v; }
    if (t_.compare(i_, 4, "null") == 0) { i_ += 4; return v; }
    size_t s = i_;
    while (i_ < t_.size() && (std::strchr("+-0123456789.eE", t_[i_]) != nullptr)) ++i_;
    if (s == i_) fail("bad value");
    v.type = Json::Num;
    v.str = t_.substr(s, i_ - s);
    v.num = std::strtod(v.str.c_str(), nullptr);
    return v;
  }
  std::string string() {
    expect('"');
    std::string out;
    while (i_ < t_.size() && t_[i_] != '"') {
      char c = t_[i_++];
      if (c != '\\') { out += c; continue; }
      if (i_ >= t_.size()) fail("bad escape");
      char e = t_[i_++];
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'u': {
          if (i_ + 4 > t_.size()) fail("bad \\u");
          unsigned cp = (unsigned)std::strtoul(t_.substr(i_, 4).c_str(), nullptr, 16);
          i_ += 4;
          if (cp < 0x80) out += (char)cp;
          else if (cp < 0x800) { out += (char)(0xc0 | (cp >> 6)); out += (char)(0x80 | (cp & 0x3f)); }
          else { out += (char)(0xe0 | (cp >> 12)); out += (char)(0x80 | ((cp >> 6) & 0x3f)); out += (char)(0x80 | (cp & 0x3f)); }
          break;
        }
        default: out += e;
      }
    }
    if (i_ >= t_.size()) fail("unterminated string");
    ++i_;
    return out;
  }
};

inline std::vector<uint8_t> base64_decode(const std::string& s) {
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::vector<uint8_t> out;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : s) {
    if (c == '=') break;
    int v = val(c);
    if (v < 0) throw std::runtime_error("base64: bad character");
    acc = (acc << 6) | (uint32_t)v;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back((uint8_t)(acc >> bits));
    }
  }
  return out;
}

}  // namespace kvct

#endif  // KVC_TEST_JSON_H
