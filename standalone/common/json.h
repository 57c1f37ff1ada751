// json.h -- a tiny header-only JSON reader/writer, enough for the server protocol.
//
// Reads: objects, arrays, strings (with \" \\ \/ \b \f \n \r \t \uXXXX escapes; \u is
// decoded to UTF-8, surrogate pairs included), numbers (as double), true/false/null.
// Writes: flat or nested objects built key by key, with numbers that stay valid JSON
// (non-finite doubles are written as null, so a NaN never produces an unparsable line).
// No external dependencies; host code only.
#pragma once

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace hz {
namespace json {

struct Value {
  enum Type { Null, Bool, Number, String, Object, Array };
  Type type = Null;
  bool b = false;
  double num = 0.0;
  std::string str;
  std::vector<std::pair<std::string, Value>> obj;
  std::vector<Value> arr;

  // The member called `key`, or nullptr (also when this is not an object).
  const Value* get(const std::string& key) const {
    if (type != Object) return nullptr;
    for (const auto& kv : obj)
      if (kv.first == key) return &kv.second;
    return nullptr;
  }
  bool is_integer() const { return type == Number && std::floor(num) == num && std::fabs(num) < 9007199254740992.0; }
  const char* type_name() const {
    static const char* names[] = {"null", "bool", "number", "string", "object", "array"};
    return names[type];
  }
};

namespace detail {

// JSON's two-character escapes, one row each: the letter after the backslash and the byte it
// stands for. The reader accepts all eight; the writer uses the short form only where
// `written` (it writes the other control characters as \u00XX, and '/' as itself).
struct Escape {
  char letter;
  char byte;
  bool written;
};
constexpr Escape kEscapes[] = {{'"', '"', true},   {'\\', '\\', true}, {'/', '/', false}, {'b', '\b', false},
                               {'f', '\f', false}, {'n', '\n', true},   {'r', '\r', true}, {'t', '\t', true}};

// The escape that `letter` (after a backslash) stands for, or nullptr.
inline const Escape* escape_of_letter(char letter) {
  for (const Escape& e : kEscapes)
    if (e.letter == letter) return &e;
  return nullptr;
}

// The short escape the writer uses for byte `c`, or nullptr.
inline const Escape* written_escape_of(unsigned char c) {
  for (const Escape& e : kEscapes)
    if (e.written && (unsigned char)e.byte == c) return &e;
  return nullptr;
}

struct Parser {
  const char* p;
  const char* end;
  std::string err;

  void ws() {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) ++p;
  }
  bool fail(const char* what) {
    if (err.empty()) err = what;
    return false;
  }
  bool lit(const char* s) {
    size_t n = std::strlen(s);
    if ((size_t)(end - p) < n || std::strncmp(p, s, n) != 0) return false;
    p += n;
    return true;
  }
  static void put_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += (char)cp;
    } else if (cp < 0x800) {
      out += (char)(0xC0 | (cp >> 6));
      out += (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += (char)(0xE0 | (cp >> 12));
      out += (char)(0x80 | ((cp >> 6) & 0x3F));
      out += (char)(0x80 | (cp & 0x3F));
    } else {
      out += (char)(0xF0 | (cp >> 18));
      out += (char)(0x80 | ((cp >> 12) & 0x3F));
      out += (char)(0x80 | ((cp >> 6) & 0x3F));
      out += (char)(0x80 | (cp & 0x3F));
    }
  }
  bool hex4(unsigned& cp) {
    if (end - p < 4) return fail("truncated \\u escape");
    cp = 0;
    for (int i = 0; i < 4; ++i) {
      char c = *p++;
      cp <<= 4;
      if (c >= '0' && c <= '9') cp |= (unsigned)(c - '0');
      else if (c >= 'a' && c <= 'f') cp |= (unsigned)(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') cp |= (unsigned)(c - 'A' + 10);
      else return fail("bad \\u escape");
    }
    return true;
  }
  bool string(std::string& out) {
    if (p >= end || *p != '"') return fail("expected string");
    ++p;
    while (p < end && *p != '"') {
      unsigned char c = (unsigned char)*p++;
      if (c < 0x20) return fail("control character in string");
      if (c != '\\') {
        out += (char)c;
        continue;
      }
      if (p >= end) return fail("truncated escape");
      char e = *p++;
      if (e != 'u') {
        const Escape* esc = escape_of_letter(e);
        if (!esc) return fail("bad escape");
        out += esc->byte;
        continue;
      }
      unsigned cp;
      if (!hex4(cp)) return false;
      if (cp >= 0xD800 && cp < 0xDC00) {  // high surrogate: expect the low half
        unsigned lo;
        if (!(lit("\\u") && hex4(lo)) || lo < 0xDC00 || lo > 0xDFFF) return fail("bad surrogate pair");
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
      }
      put_utf8(out, cp);
    }
    if (p >= end) return fail("unterminated string");
    ++p;
    return true;
  }
  bool number(double& out) {
    const char* s = p;
    if (p < end && *p == '-') ++p;
    if (p >= end || !(*p >= '0' && *p <= '9')) return fail("bad number");
    while (p < end && ((*p >= '0' && *p <= '9') || *p == '.' || *p == 'e' || *p == 'E' || *p == '+' || *p == '-')) ++p;
    std::string tok(s, p);
    char* stop = nullptr;
    out = std::strtod(tok.c_str(), &stop);
    if (stop != tok.c_str() + tok.size()) return fail("bad number");
    return true;
  }
  // The members of an object or the elements of an array, from its opening bracket at `p`:
  // `item` reads one; commas between them, `close` after the last (or at once: empty).
  template <class Item>
  bool items(char close, const char* expected, Item&& item) {
    ++p;
    ws();
    if (p < end && *p == close) { ++p; return true; }
    for (;;) {
      if (!item()) return false;
      ws();
      if (p < end && *p == ',') { ++p; continue; }
      if (p < end && *p == close) { ++p; return true; }
      return fail(expected);
    }
  }
  bool value(Value& v, int depth) {
    if (depth > 32) return fail("nesting too deep");
    ws();
    if (p >= end) return fail("unexpected end of input");
    char c = *p;
    if (c == '{') {
      v.type = Value::Object;
      return items('}', "expected ',' or '}'", [&] {
        ws();
        std::string key;
        if (!string(key)) return false;
        ws();
        if (p >= end || *p != ':') return fail("expected ':'");
        ++p;
        Value child;
        if (!value(child, depth + 1)) return false;
        v.obj.emplace_back(std::move(key), std::move(child));
        return true;
      });
    }
    if (c == '[') {
      v.type = Value::Array;
      return items(']', "expected ',' or ']'", [&] {
        Value child;
        if (!value(child, depth + 1)) return false;
        v.arr.push_back(std::move(child));
        return true;
      });
    }
    if (c == '"') { v.type = Value::String; return string(v.str); }
    if (lit("true")) { v.type = Value::Bool; v.b = true; return true; }
    if (lit("false")) { v.type = Value::Bool; v.b = false; return true; }
    if (lit("null")) { v.type = Value::Null; return true; }
    v.type = Value::Number;
    return number(v.num);
  }
};

}  // namespace detail

// Parse exactly one JSON value from `text` (surrounding whitespace allowed).
inline bool parse(const std::string& text, Value& out, std::string& err) {
  detail::Parser ps{text.data(), text.data() + text.size(), {}};
  out = Value();
  if (!ps.value(out, 0)) {
    err = ps.err;
    return false;
  }
  ps.ws();
  if (ps.p != ps.end) {
    err = "trailing characters after JSON value";
    return false;
  }
  return true;
}

// A JSON string literal (with quotes) for `s`.
inline std::string quote(const std::string& s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    if (const detail::Escape* esc = detail::written_escape_of(c)) {
      o += '\\';
      o += esc->letter;
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      o += buf;
    } else {
      o += (char)c;
    }
  }
  return o + "\"";
}

// A number literal; integers stay integers, non-finite values become null.
inline std::string number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[40];
  if (std::floor(v) == v && std::fabs(v) < 9007199254740992.0)
    std::snprintf(buf, sizeof buf, "%lld", (long long)v);
  else
    std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// Serialize a Value (objects keep their member order).
inline std::string dump(const Value& v) {
  switch (v.type) {
    case Value::Null: return "null";
    case Value::Bool: return v.b ? "true" : "false";
    case Value::Number: return number(v.num);
    case Value::String: return quote(v.str);
    case Value::Array: {
      std::string o = "[";
      for (size_t i = 0; i < v.arr.size(); ++i) o += (i ? "," : "") + dump(v.arr[i]);
      return o + "]";
    }
    case Value::Object: {
      std::string o = "{";
      for (size_t i = 0; i < v.obj.size(); ++i) o += (i ? "," : "") + quote(v.obj[i].first) + ":" + dump(v.obj[i].second);
      return o + "}";
    }
  }
  return "null";
}

// Builds one JSON object key by key: Writer().num("a", 1).str("b", "x").done().
class Writer {
 public:
  Writer& raw(const std::string& key, const std::string& json_text) {
    s_ += (first_ ? "" : ",") + quote(key) + ":" + json_text;
    first_ = false;
    return *this;
  }
  Writer& num(const std::string& key, double v) { return raw(key, number(v)); }
  Writer& str(const std::string& key, const std::string& v) { return raw(key, quote(v)); }
  Writer& boolean(const std::string& key, bool v) { return raw(key, v ? "true" : "false"); }
  Writer& null(const std::string& key) { return raw(key, "null"); }
  Writer& value(const std::string& key, const Value& v) { return raw(key, dump(v)); }
  Writer& strings(const std::string& key, const std::vector<std::string>& v) {
    std::string o = "[";
    for (size_t i = 0; i < v.size(); ++i) o += (i ? "," : "") + quote(v[i]);
    return raw(key, o + "]");
  }
  std::string done() const { return "{" + s_ + "}"; }

 private:
  std::string s_;
  bool first_ = true;
};

}  // namespace json
}  // namespace hz
