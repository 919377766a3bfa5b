// A Jinja-subset interpreter for Hugging Face chat templates.
//
// Pipeline: scan (split the source into text / {{ output }} / {% statement %} segments and apply
// Jinja's whitespace rules) -> lex each tag -> parse into an AST -> render with Python value
// semantics (truthiness, str(), repr(), json.dumps) so that output matches HF byte for byte.
// Parse and render errors travel internally as TemplateError exceptions and leave the public API
// as qs::Error values.
#include "model/chat_template.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <unordered_map>
#include <utility>

namespace qs {

namespace {

using json = nlohmann::ordered_json;

constexpr size_t kMaxOutputBytes = size_t{16} << 20;  // a runaway template fails instead of OOM
constexpr int kMaxDepth = 256;                        // nested evaluation / macro calls
constexpr int64_t kMaxRange = 1'000'000;              // largest range() a template may build

struct TemplateError {
  std::string message;
  int line = 0;  // 0: unknown
};

[[noreturn]] void fail(int line, std::string message) {
  throw TemplateError{std::move(message), line};
}

// ------------------------------------------------------------------------------------------------
// UTF-8 helpers (Python strings count code points)
// ------------------------------------------------------------------------------------------------

// Length in bytes of the UTF-8 sequence starting with `lead` (1 for invalid bytes).
size_t utf8_seq_len(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead >> 5) == 0x6) return 2;
  if ((lead >> 4) == 0xe) return 3;
  if ((lead >> 3) == 0x1e) return 4;
  return 1;
}

// Byte offsets of every code point, plus s.size() at the end.
std::vector<size_t> code_point_offsets(const std::string& s) {
  std::vector<size_t> offs;
  for (size_t i = 0; i < s.size();) {
    offs.push_back(i);
    i += std::min(utf8_seq_len(static_cast<unsigned char>(s[i])), s.size() - i);
  }
  offs.push_back(s.size());
  return offs;
}

uint32_t decode_code_point(const std::string& s, size_t i, size_t* len) {
  const auto c0 = static_cast<unsigned char>(s[i]);
  size_t n = std::min(utf8_seq_len(c0), s.size() - i);
  *len = n;
  if (n == 1) return c0;
  uint32_t cp = c0 & (0x7f >> n);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
  return cp;
}

bool is_python_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

// Python str.strip / lstrip / rstrip; `chars` (when given) is the set of code points to remove.
std::string py_strip(const std::string& s, const std::string* chars, bool left, bool right) {
  std::vector<uint32_t> strip_set;
  if (chars) {
    for (size_t i = 0, n = 0; i < chars->size(); i += n)
      strip_set.push_back(decode_code_point(*chars, i, &n));
  }
  auto strippable = [&](uint32_t cp) {
    return chars ? std::find(strip_set.begin(), strip_set.end(), cp) != strip_set.end()
                 : is_python_space(cp);
  };
  std::vector<size_t> offs = code_point_offsets(s);
  size_t b = 0, e = offs.size() - 1;  // code point indices [b, e)
  size_t n = 0;
  if (left) {
    while (b < e && strippable(decode_code_point(s, offs[b], &n))) ++b;
  }
  if (right) {
    while (e > b && strippable(decode_code_point(s, offs[e - 1], &n))) --e;
  }
  return s.substr(offs[b], offs[e] - offs[b]);
}

bool is_ascii_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

// ------------------------------------------------------------------------------------------------
// Values
// ------------------------------------------------------------------------------------------------

struct Value;
using ValueList = std::vector<Value>;
struct ValueMap;
struct Node;

enum class Builtin { kRaiseException, kNamespace, kRange, kStrftimeNow, kDict };

struct Callable {
  std::string name;
  Builtin builtin = Builtin::kRaiseException;
  const Node* macro = nullptr;  // a {% macro %} of the program (outlives every render)
};

struct Value {
  enum class Kind : uint8_t {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kMap,
    kCallable
  };
  Kind kind = Kind::kUndefined;
  bool boolean = false;
  int64_t integer = 0;
  double number = 0;
  std::string text;    // kString; for kUndefined the name that was looked up (for messages)
  bool tuple = false;  // kList: a Python tuple (prints as "(a, b)", unequal to a list)
  std::shared_ptr<const ValueList> list;
  std::shared_ptr<ValueMap> map;  // mutated only when it is a namespace()
  std::shared_ptr<const Callable> callable;

  static Value undefined(std::string what = "") {
    Value v;
    v.text = std::move(what);
    return v;
  }
  static Value none() { return make(Kind::kNone); }
  static Value from_bool(bool b) {
    Value v = make(Kind::kBool);
    v.boolean = b;
    return v;
  }
  static Value from_int(int64_t i) {
    Value v = make(Kind::kInt);
    v.integer = i;
    return v;
  }
  static Value from_float(double f) {
    Value v = make(Kind::kFloat);
    v.number = f;
    return v;
  }
  static Value from_string(std::string s) {
    Value v = make(Kind::kString);
    v.text = std::move(s);
    return v;
  }
  static Value from_list(ValueList items, bool is_tuple = false) {
    Value v = make(Kind::kList);
    v.list = std::make_shared<const ValueList>(std::move(items));
    v.tuple = is_tuple;
    return v;
  }
  static Value from_map(std::shared_ptr<ValueMap> m) {
    Value v = make(Kind::kMap);
    v.map = std::move(m);
    return v;
  }
  static Value from_callable(Callable c) {
    Value v = make(Kind::kCallable);
    v.callable = std::make_shared<const Callable>(std::move(c));
    return v;
  }

  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_none() const { return kind == Kind::kNone; }
  bool is_string() const { return kind == Kind::kString; }
  bool is_list() const { return kind == Kind::kList; }
  bool is_map() const { return kind == Kind::kMap; }
  bool is_number() const {
    return kind == Kind::kBool || kind == Kind::kInt || kind == Kind::kFloat;
  }
  bool is_integral() const { return kind == Kind::kBool || kind == Kind::kInt; }
  double as_double() const {
    return kind == Kind::kFloat ? number
                                : static_cast<double>(kind == Kind::kBool ? boolean : integer);
  }
  int64_t as_int() const { return kind == Kind::kBool ? (boolean ? 1 : 0) : integer; }

 private:
  static Value make(Kind k) {
    Value v;
    v.kind = k;
    return v;
  }
};

// A Python dict with string keys, in insertion order (what json.dumps and iteration show).
struct ValueMap {
  std::vector<std::pair<std::string, Value>> items;
  bool is_namespace = false;

  const Value* find(std::string_view key) const {
    for (const auto& [k, v] : items) {
      if (k == key) return &v;
    }
    return nullptr;
  }
  void set(const std::string& key, Value value) {
    for (auto& [k, v] : items) {
      if (k == key) {
        v = std::move(value);
        return;
      }
    }
    items.emplace_back(key, std::move(value));
  }
};

const char* type_name(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
      return "undefined";
    case Value::Kind::kNone:
      return "NoneType";
    case Value::Kind::kBool:
      return "bool";
    case Value::Kind::kInt:
      return "int";
    case Value::Kind::kFloat:
      return "float";
    case Value::Kind::kString:
      return "str";
    case Value::Kind::kList:
      return "list";
    case Value::Kind::kMap:
      return v.map->is_namespace ? "Namespace" : "dict";
    case Value::Kind::kCallable:
      return "function";
  }
  return "?";
}

std::string undefined_message(const Value& v) {
  return v.text.empty() ? std::string("a value is undefined") : "'" + v.text + "' is undefined";
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return false;
    case Value::Kind::kBool:
      return v.boolean;
    case Value::Kind::kInt:
      return v.integer != 0;
    case Value::Kind::kFloat:
      return v.number != 0;
    case Value::Kind::kString:
      return !v.text.empty();
    case Value::Kind::kList:
      return !v.list->empty();
    case Value::Kind::kMap:
      return v.map->is_namespace || !v.map->items.empty();
    case Value::Kind::kCallable:
      return true;
  }
  return false;
}

// Python's repr(float): the shortest round-trip digits, fixed notation for exponents in [-4, 16).
std::string py_float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), x, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const size_t epos = sci.find('e');
  std::string digits = sci.substr(0, epos);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exp = std::stoi(sci.substr(epos + 1));
  if (exp >= -4 && exp < 16) {
    std::string out;
    if (exp >= 0) {
      std::string int_part = digits.substr(0, std::min<size_t>(digits.size(), exp + 1));
      int_part.append(static_cast<size_t>(exp + 1) - int_part.size(), '0');
      std::string frac =
          digits.size() > static_cast<size_t>(exp + 1) ? digits.substr(exp + 1) : "0";
      out = int_part + "." + frac;
    } else {
      out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    }
    return sign + out;
  }
  std::string mant = digits.substr(0, 1);
  if (digits.size() > 1) mant += "." + digits.substr(1);
  char ebuf[16];
  std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
  return sign + mant + ebuf;
}

std::string py_repr_string(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (ch == quote || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (ch == '\n') {
      out += "\\n";
    } else if (ch == '\r') {
      out += "\\r";
    } else if (ch == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  out += quote;
  return out;
}

std::string py_repr(const Value& v);

// Python str(): what {{ value }} prints.
std::string py_str(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kBool:
      return v.boolean ? "True" : "False";
    case Value::Kind::kInt:
      return std::to_string(v.integer);
    case Value::Kind::kFloat:
      return py_float_repr(v.number);
    case Value::Kind::kString:
      return v.text;
    case Value::Kind::kList: {
      std::string out = v.tuple ? "(" : "[";
      for (size_t i = 0; i < v.list->size(); ++i) {
        if (i) out += ", ";
        out += py_repr((*v.list)[i]);
      }
      if (v.tuple && v.list->size() == 1) out += ",";
      return out + (v.tuple ? ")" : "]");
    }
    case Value::Kind::kMap: {
      std::string out = v.map->is_namespace ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, item] : v.map->items) {
        if (!first) out += ", ";
        first = false;
        out += py_repr_string(k) + ": " + py_repr(item);
      }
      return out + (v.map->is_namespace ? "}>" : "}");
    }
    case Value::Kind::kCallable:
      return "<function " + v.callable->name + ">";
  }
  return "";
}

std::string py_repr(const Value& v) {
  if (v.is_string()) return py_repr_string(v.text);
  if (v.is_undefined()) return "Undefined";
  return py_str(v);
}

// Python json.dumps(value, ensure_ascii, indent, separators, sort_keys), as HF's tojson.
struct JsonDumpOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;  // nullopt: single line
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
};

void dump_json_string(const std::string& s, bool ensure_ascii, std::string& out) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      switch (c) {
        case '"':
          out += "\\\"";
          break;
        case '\\':
          out += "\\\\";
          break;
        case '\n':
          out += "\\n";
          break;
        case '\r':
          out += "\\r";
          break;
        case '\t':
          out += "\\t";
          break;
        case '\b':
          out += "\\b";
          break;
        case '\f':
          out += "\\f";
          break;
        default:
          if (c < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof(buf), "\\u%04x", c);
            out += buf;
          } else {
            out += static_cast<char>(c);
          }
      }
      ++i;
      continue;
    }
    size_t n = 0;
    const uint32_t cp = decode_code_point(s, i, &n);
    if (!ensure_ascii) {
      out.append(s, i, n);
    } else {
      char buf[16];
      if (cp >= 0x10000) {
        const uint32_t v = cp - 0x10000;
        std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", 0xd800 + (v >> 10), 0xdc00 + (v & 0x3ff));
      } else {
        std::snprintf(buf, sizeof(buf), "\\u%04x", cp);
      }
      out += buf;
    }
    i += n;
  }
  out += '"';
}

void dump_json(const Value& v, const JsonDumpOptions& o, int level, std::string& out, int line) {
  if (level > kMaxDepth) fail(line, "tojson: value nested too deeply");
  auto newline = [&](int lvl) {
    if (!o.indent) return;
    out += '\n';
    for (int i = 0; i < lvl; ++i) out += *o.indent;
  };
  switch (v.kind) {
    case Value::Kind::kNone:
      out += "null";
      return;
    case Value::Kind::kBool:
      out += v.boolean ? "true" : "false";
      return;
    case Value::Kind::kInt:
      out += std::to_string(v.integer);
      return;
    case Value::Kind::kFloat:
      if (std::isnan(v.number)) {
        out += "NaN";
      } else if (std::isinf(v.number)) {
        out += v.number > 0 ? "Infinity" : "-Infinity";
      } else {
        out += py_float_repr(v.number);
      }
      return;
    case Value::Kind::kString:
      dump_json_string(v.text, o.ensure_ascii, out);
      return;
    case Value::Kind::kList: {
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < v.list->size(); ++i) {
        if (i) out += o.item_separator;
        newline(level + 1);
        dump_json((*v.list)[i], o, level + 1, out, line);
      }
      newline(level);
      out += ']';
      return;
    }
    case Value::Kind::kMap: {
      if (v.map->is_namespace) fail(line, "tojson: a namespace is not JSON serializable");
      if (v.map->items.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& item : v.map->items) items.push_back(&item);
      if (o.sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](const auto* a, const auto* b) { return a->first < b->first; });
      }
      out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += o.item_separator;
        newline(level + 1);
        dump_json_string(items[i]->first, o.ensure_ascii, out);
        out += o.key_separator;
        dump_json(items[i]->second, o, level + 1, out, line);
      }
      newline(level);
      out += '}';
      return;
    }
    case Value::Kind::kUndefined:
      fail(line, "tojson: " + undefined_message(v));
    case Value::Kind::kCallable:
      fail(line, "tojson: a function is not JSON serializable");
  }
}

bool values_equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) return a.as_int() == b.as_int();
    return a.as_double() == b.as_double();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.text == b.text;
    case Value::Kind::kList: {
      if (a.tuple != b.tuple || a.list->size() != b.list->size()) return false;
      for (size_t i = 0; i < a.list->size(); ++i) {
        if (!values_equal((*a.list)[i], (*b.list)[i])) return false;
      }
      return true;
    }
    case Value::Kind::kMap: {
      if (a.map->is_namespace || b.map->is_namespace) return a.map == b.map;
      if (a.map->items.size() != b.map->items.size()) return false;
      for (const auto& [k, v] : a.map->items) {
        const Value* other = b.map->find(k);
        if (!other || !values_equal(v, *other)) return false;
      }
      return true;
    }
    case Value::Kind::kCallable:
      return a.callable == b.callable;
    default:
      return false;
  }
}

// Python ordering for <, <=, >, >=: -1, 0, 1.
int compare_values(const Value& a, const Value& b, const char* op, int line) {
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) {
      return a.as_int() < b.as_int() ? -1 : (a.as_int() > b.as_int() ? 1 : 0);
    }
    const double x = a.as_double(), y = b.as_double();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.text.compare(b.text);  // byte order == code point order in UTF-8
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_list() && b.is_list()) {
    for (size_t i = 0; i < std::min(a.list->size(), b.list->size()); ++i) {
      if (values_equal((*a.list)[i], (*b.list)[i])) continue;
      return compare_values((*a.list)[i], (*b.list)[i], op, line);
    }
    return a.list->size() < b.list->size() ? -1 : (a.list->size() > b.list->size() ? 1 : 0);
  }
  if (a.is_undefined()) fail(line, undefined_message(a));
  if (b.is_undefined()) fail(line, undefined_message(b));
  fail(line, std::string("'") + op + "' not supported between '" + type_name(a) + "' and '" +
                 type_name(b) + "'");
}

Value json_to_value(const json& j) {
  switch (j.type()) {
    case json::value_t::null:
      return Value::none();
    case json::value_t::boolean:
      return Value::from_bool(j.get<bool>());
    case json::value_t::number_integer:
      return Value::from_int(j.get<int64_t>());
    case json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return Value::from_float(static_cast<double>(u));
      }
      return Value::from_int(static_cast<int64_t>(u));
    }
    case json::value_t::number_float:
      return Value::from_float(j.get<double>());
    case json::value_t::string:
      return Value::from_string(j.get<std::string>());
    case json::value_t::array: {
      ValueList items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(json_to_value(e));
      return Value::from_list(std::move(items));
    }
    case json::value_t::object: {
      auto m = std::make_shared<ValueMap>();
      for (const auto& [k, e] : j.items()) m->items.emplace_back(k, json_to_value(e));
      return Value::from_map(std::move(m));
    }
    default:
      return Value::none();
  }
}

// ------------------------------------------------------------------------------------------------
// Scanner: text / output / statement segments with Jinja's whitespace control applied
// (trim_blocks, lstrip_blocks, "-" and "+" modifiers, newline normalization).
// ------------------------------------------------------------------------------------------------

enum class SegmentKind { kText, kOutput, kStatement };

struct Segment {
  SegmentKind kind;
  std::string text;  // text, or the tag's inner source
  int line;
};

struct RawTag {
  char kind;  // '{' output, '%' statement, '#' comment
  std::string inner;
  int line;
  bool strip_before = false;  // "{%-": remove all whitespace before the tag
  bool keep_before = false;   // "{%+": no lstrip_blocks
  bool strip_after = false;   // "-%}": remove all whitespace after the tag
  bool keep_after = false;    // "+%}": no trim_blocks
};

// Jinja lexes a newline-normalized source, without one trailing newline.
std::string normalize_source(std::string_view raw) {
  std::string s;
  s.reserve(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] == '\r') {
      s += '\n';
      if (i + 1 < raw.size() && raw[i + 1] == '\n') ++i;
    } else {
      s += raw[i];
    }
  }
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

// Index just past the end marker of a tag whose content starts at `p`, skipping quoted strings
// and balanced brackets (so `{{ {'a': {'b': 1}} }}` and `{{ "}}" }}` close at the right place).
size_t find_tag_close(const std::string& s, size_t p, const char* close, size_t* inner_end) {
  int depth = 0;
  char quote = 0;
  for (size_t i = p; i < s.size(); ++i) {
    const char c = s[i];
    if (quote) {
      if (c == '\\') {
        ++i;
      } else if (c == quote) {
        quote = 0;
      }
      continue;
    }
    if (c == '\'' || c == '"') {
      quote = c;
    } else if (depth == 0 && s.compare(i, 2, close) == 0) {
      *inner_end = i;
      return i + 2;
    } else if (c == '(' || c == '[' || c == '{') {
      ++depth;
    } else if ((c == ')' || c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return std::string::npos;
}

// Where `{% endraw %}` (with optional modifiers) starts at or after `from`; sets *end past it.
size_t find_endraw(const std::string& s, size_t from, RawTag* tag, size_t* end) {
  for (size_t p = s.find("{%", from); p != std::string::npos; p = s.find("{%", p + 2)) {
    size_t i = p + 2;
    bool strip_before = false;
    if (i < s.size() && (s[i] == '-' || s[i] == '+')) strip_before = s[i++] == '-';
    while (i < s.size() && is_ascii_space(s[i])) ++i;
    if (s.compare(i, 6, "endraw") != 0) continue;
    i += 6;
    while (i < s.size() && is_ascii_space(s[i])) ++i;
    bool strip_after = false, keep_after = false;
    if (i < s.size() && (s[i] == '-' || s[i] == '+')) {
      strip_after = s[i] == '-';
      keep_after = s[i] == '+';
      ++i;
    }
    if (s.compare(i, 2, "%}") != 0) continue;
    tag->kind = '%';
    tag->inner = "endraw";
    tag->strip_before = strip_before;
    tag->strip_after = strip_after;
    tag->keep_after = keep_after;
    *end = i + 2;
    return p;
  }
  return std::string::npos;
}

std::vector<Segment> scan_template(std::string_view raw) {
  const std::string s = normalize_source(raw);
  std::vector<std::string> texts;  // texts[i] precedes tags[i]; one more text than tags
  std::vector<RawTag> tags;
  size_t pos = 0;
  int line = 1;
  auto count_lines = [&](size_t from, size_t to) {
    line += static_cast<int>(std::count(s.begin() + from, s.begin() + to, '\n'));
  };
  for (;;) {
    size_t t = pos;
    for (;;) {
      t = s.find('{', t);
      if (t == std::string::npos || t + 1 >= s.size()) {
        t = std::string::npos;
        break;
      }
      if (s[t + 1] == '{' || s[t + 1] == '%' || s[t + 1] == '#') break;
      ++t;
    }
    if (t == std::string::npos) {
      texts.push_back(s.substr(pos));
      break;
    }
    texts.push_back(s.substr(pos, t - pos));
    count_lines(pos, t);
    RawTag tag;
    tag.kind = s[t + 1];
    tag.line = line;
    size_t p = t + 2;
    if (p < s.size() && s[p] == '-') {
      tag.strip_before = true;
      ++p;
    } else if (p < s.size() && s[p] == '+') {
      tag.keep_before = true;
      ++p;
    }
    size_t inner_end = 0, end = 0;
    if (tag.kind == '#') {
      inner_end = s.find("#}", p);
      if (inner_end == std::string::npos) fail(tag.line, "unclosed comment '{#'");
      end = inner_end + 2;
    } else {
      end = find_tag_close(s, p, tag.kind == '{' ? "}}" : "%}", &inner_end);
      if (end == std::string::npos) {
        fail(tag.line, std::string("unclosed tag '") + (tag.kind == '{' ? "{{" : "{%") + "'");
      }
    }
    tag.inner = s.substr(p, inner_end - p);
    if (!tag.inner.empty() && tag.inner.back() == '-') {
      tag.strip_after = true;
      tag.inner.pop_back();
    } else if (!tag.inner.empty() && tag.inner.back() == '+' && tag.kind != '{') {
      tag.keep_after = true;
      tag.inner.pop_back();
    }
    count_lines(t, end);
    pos = end;
    // {% raw %}...{% endraw %}: the body is text, never parsed.
    const std::string stripped = py_strip(tag.inner, nullptr, true, true);
    if (tag.kind == '%' && stripped == "raw") {
      tags.push_back(tag);
      RawTag endraw;
      endraw.line = line;
      size_t endraw_end = 0;
      const size_t endraw_at = find_endraw(s, pos, &endraw, &endraw_end);
      if (endraw_at == std::string::npos) fail(tag.line, "'{% raw %}' without '{% endraw %}'");
      texts.push_back(s.substr(pos, endraw_at - pos));
      count_lines(pos, endraw_end);
      tags.push_back(endraw);
      pos = endraw_end;
      continue;
    }
    tags.push_back(std::move(tag));
  }

  // Whitespace control. Each text is shaped by the tag before it (its head) and after it (tail).
  for (size_t i = 0; i < texts.size(); ++i) {
    std::string& text = texts[i];
    bool line_starting = i == 0;
    if (i > 0) {
      const RawTag& prev = tags[i - 1];
      if (prev.strip_after) {
        size_t n = 0;
        while (n < text.size() && is_ascii_space(text[n])) ++n;
        line_starting = n > 0 && text[n - 1] == '\n';
        text.erase(0, n);
      } else if (prev.kind != '{' && !prev.keep_after && !text.empty() && text[0] == '\n') {
        text.erase(0, 1);  // trim_blocks
        line_starting = true;
      } else {
        line_starting = false;
      }
    }
    if (i < tags.size()) {
      const RawTag& next = tags[i];
      if (next.strip_before) {
        size_t n = text.size();
        while (n > 0 && is_ascii_space(text[n - 1])) --n;
        text.erase(n);
      } else if (next.kind != '{' && !next.keep_before) {  // lstrip_blocks
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if (l_pos > 0 || line_starting) {
          bool all_space = l_pos < text.size();
          for (size_t k = l_pos; k < text.size(); ++k)
            all_space = all_space && is_ascii_space(text[k]);
          if (all_space) text.erase(l_pos);
        }
      }
    }
  }

  std::vector<Segment> segments;
  for (size_t i = 0; i < texts.size(); ++i) {
    if (!texts[i].empty())
      segments.push_back({SegmentKind::kText, texts[i], i > 0 ? tags[i - 1].line : 1});
    if (i < tags.size() && tags[i].kind != '#') {
      segments.push_back({tags[i].kind == '{' ? SegmentKind::kOutput : SegmentKind::kStatement,
                          tags[i].inner, tags[i].line});
    }
  }
  return segments;
}

// ------------------------------------------------------------------------------------------------
// Tag lexer
// ------------------------------------------------------------------------------------------------

enum class TokenType { kName, kString, kInt, kFloat, kOp, kEnd };

struct Token {
  TokenType type;
  std::string text;  // name, operator, or the unescaped string
  int64_t integer = 0;
  double number = 0;
};

// Python "unicode-escape" decoding of a Jinja string literal body.
std::string unescape_string(const std::string& body, int line) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i] != '\\' || i + 1 == body.size()) {
      out += body[i];
      continue;
    }
    const char e = body[++i];
    auto hex = [&](size_t digits) -> uint32_t {
      uint32_t v = 0;
      for (size_t k = 1; k <= digits; ++k) {
        if (i + k >= body.size()) fail(line, "truncated escape in string literal");
        const char h = body[i + k];
        v <<= 4;
        if (h >= '0' && h <= '9')
          v |= h - '0';
        else if (h >= 'a' && h <= 'f')
          v |= h - 'a' + 10;
        else if (h >= 'A' && h <= 'F')
          v |= h - 'A' + 10;
        else
          fail(line, "bad hex digit in string escape");
      }
      i += digits;
      return v;
    };
    switch (e) {
      case 'n':
        out += '\n';
        break;
      case 't':
        out += '\t';
        break;
      case 'r':
        out += '\r';
        break;
      case '\\':
        out += '\\';
        break;
      case '\'':
        out += '\'';
        break;
      case '"':
        out += '"';
        break;
      case 'a':
        out += '\a';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'v':
        out += '\v';
        break;
      case '\n':
        break;  // line continuation
      case 'x':
        append_utf8(out, hex(2));
        break;
      case 'u':
        append_utf8(out, hex(4));
        break;
      case 'U':
        append_utf8(out, hex(8));
        break;
      default:
        if (e >= '0' && e <= '7') {
          uint32_t v = e - '0';
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7';
               ++k) {
            v = v * 8 + (body[++i] - '0');
          }
          append_utf8(out, v);
        } else {
          out += '\\';
          out += e;
        }
    }
  }
  return out;
}

std::vector<Token> lex_tag(const std::string& src, int line) {
  static const char* const kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                     "/",  "%",  "~",  "<",  ">",  "=",  "(", ")", "[",
                                     "]",  "{",  "}",  ",",  ".",  ":",  "|"};
  std::vector<Token> tokens;
  size_t i = 0;
  while (i < src.size()) {
    const char c = src[i];
    if (is_ascii_space(c)) {
      ++i;
      continue;
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < src.size() && (std::isalnum(static_cast<unsigned char>(src[j])) || src[j] == '_'))
        ++j;
      tokens.push_back({TokenType::kName, src.substr(i, j - i)});
      i = j;
      continue;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      bool is_float = false;
      auto digits = [&] {
        while (j < src.size() &&
               (std::isdigit(static_cast<unsigned char>(src[j])) || src[j] == '_'))
          ++j;
      };
      digits();
      if (j + 1 < src.size() && src[j] == '.' &&
          std::isdigit(static_cast<unsigned char>(src[j + 1]))) {
        is_float = true;
        ++j;
        digits();
      }
      if (j < src.size() && (src[j] == 'e' || src[j] == 'E')) {
        size_t k = j + 1;
        if (k < src.size() && (src[k] == '+' || src[k] == '-')) ++k;
        if (k < src.size() && std::isdigit(static_cast<unsigned char>(src[k]))) {
          is_float = true;
          j = k;
          digits();
        }
      }
      std::string lit = src.substr(i, j - i);
      lit.erase(std::remove(lit.begin(), lit.end(), '_'), lit.end());
      Token t{is_float ? TokenType::kFloat : TokenType::kInt, lit};
      if (is_float) {
        t.number = std::strtod(lit.c_str(), nullptr);
      } else {
        auto r = std::from_chars(lit.data(), lit.data() + lit.size(), t.integer);
        if (r.ec != std::errc()) fail(line, "integer literal out of range: " + lit);
      }
      tokens.push_back(std::move(t));
      i = j;
      continue;
    }
    if (c == '\'' || c == '"') {
      size_t j = i + 1;
      while (j < src.size() && src[j] != c) {
        if (src[j] == '\\') ++j;
        ++j;
      }
      if (j >= src.size()) fail(line, "unterminated string literal");
      tokens.push_back({TokenType::kString, unescape_string(src.substr(i + 1, j - i - 1), line)});
      i = j + 1;
      continue;
    }
    bool matched = false;
    for (const char* op : kOps) {
      const size_t n = std::char_traits<char>::length(op);
      if (src.compare(i, n, op) == 0) {
        tokens.push_back({TokenType::kOp, op});
        i += n;
        matched = true;
        break;
      }
    }
    if (!matched) fail(line, std::string("unexpected character '") + c + "'");
  }
  tokens.push_back({TokenType::kEnd, ""});
  return tokens;
}

// ------------------------------------------------------------------------------------------------
// AST
// ------------------------------------------------------------------------------------------------

enum class Op {
  kAdd,
  kSub,
  kMul,
  kDiv,
  kFloorDiv,
  kMod,
  kPow,
  kConcat,
  kEq,
  kNe,
  kLt,
  kLe,
  kGt,
  kGe,
  kIn,
  kNotIn,
  kAnd,
  kOr,
  kNot,
  kNeg,
  kPos,
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,
    kName,
    kList,
    kDict,
    kGetAttr,
    kGetItem,
    kSlice,
    kCall,
    kFilter,
    kTest,
    kUnary,
    kBinary,
    kCompare,
    kCondition,
  };
  Kind kind;
  int line = 0;
  Value literal;                // kLiteral
  std::string name;             // kName / kGetAttr attribute / kFilter, kTest name
  Op op = Op::kAdd;             // kUnary, kBinary
  bool negated = false;         // kTest: "is not"
  bool tuple = false;           // kList: written as a tuple
  std::vector<ExprPtr> args;    // operands, items, callee+arguments, subject+arguments
  std::vector<Op> compare_ops;  // kCompare: args[0] ops[0] args[1] ops[1] args[2] ...
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
};

using NodeList = std::vector<std::unique_ptr<Node>>;

struct Node {
  enum class Kind {
    kText,
    kOutput,
    kIf,
    kFor,
    kSet,
    kSetAttr,
    kSetBlock,
    kBreak,
    kContinue,
    kMacro,
    kGeneration
  };
  Kind kind;
  int line = 0;
  std::string text;                                    // kText
  ExprPtr expr;                                        // kOutput, kSet*, kFor iterable
  std::vector<std::pair<ExprPtr, NodeList>> branches;  // kIf: (condition, body) for if / elif
  NodeList body;                                       // kFor, kSetBlock, kMacro, kGeneration
  NodeList else_body;                                  // kIf, kFor
  std::vector<std::string> targets;                    // kFor / kSet names; kSetAttr {ns, attr}
  ExprPtr filter;                                      // kFor "if" filter
  std::vector<std::string> params;                     // kMacro
  std::vector<ExprPtr> defaults;                       // kMacro (nullptr: no default)
};

const std::set<std::string>& supported_filters() {
  static const std::set<std::string> names = {
      "abs",        "capitalize", "count",    "d",       "default", "dictsort", "e",
      "escape",     "first",      "float",    "indent",  "int",     "items",    "join",
      "last",       "length",     "list",     "lower",   "map",     "max",      "min",
      "reject",     "rejectattr", "replace",  "reverse", "round",   "safe",     "select",
      "selectattr", "sort",       "string",   "sum",     "title",   "tojson",   "trim",
      "unique",     "upper",      "wordcount"};
  return names;
}

const std::set<std::string>& supported_tests() {
  static const std::set<std::string> names = {
      "boolean", "callable",  "defined", "divisibleby", "eq",          "equalto",  "escaped",
      "even",    "false",     "float",   "ge",          "greaterthan", "gt",       "in",
      "integer", "iterable",  "le",      "lessthan",    "lower",       "lt",       "mapping",
      "ne",      "none",      "number",  "odd",         "sameas",      "sequence", "string",
      "true",    "undefined", "upper",   "==",          "!=",          "<",        "<=",
      ">",       ">="};
  return names;
}

// ------------------------------------------------------------------------------------------------
// Parser
// ------------------------------------------------------------------------------------------------

class ExprParser {
 public:
  ExprParser(std::vector<Token> tokens, int line) : toks_(std::move(tokens)), line_(line) {}

  const Token& peek(size_t ahead = 0) const {
    return toks_[std::min(pos_ + ahead, toks_.size() - 1)];
  }
  bool at_end() const { return peek().type == TokenType::kEnd; }
  bool is_op(const char* op, size_t ahead = 0) const {
    return peek(ahead).type == TokenType::kOp && peek(ahead).text == op;
  }
  bool is_name(const char* name, size_t ahead = 0) const {
    return peek(ahead).type == TokenType::kName && peek(ahead).text == name;
  }
  Token next() { return toks_[std::min(pos_++, toks_.size() - 1)]; }
  void expect_op(const char* op) {
    if (!is_op(op)) fail(line_, std::string("expected '") + op + "', found " + describe(peek()));
    ++pos_;
  }
  std::string expect_name() {
    if (peek().type != TokenType::kName) fail(line_, "expected a name, found " + describe(peek()));
    return next().text;
  }
  void expect_end() {
    if (!at_end()) fail(line_, "unexpected " + describe(peek()));
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case TokenType::kEnd:
        return "end of tag";
      case TokenType::kString:
        return "string literal";
      default:
        return "'" + t.text + "'";
    }
  }

  ExprPtr parse_expression(bool with_condition = true) {
    ExprPtr e = parse_or();
    while (with_condition && is_name("if")) {
      ++pos_;
      ExprPtr cond = parse_or();
      ExprPtr otherwise;
      if (is_name("else")) {
        ++pos_;
        otherwise = parse_expression();
      }
      auto node = make(Expr::Kind::kCondition);
      node->args.push_back(std::move(e));
      node->args.push_back(std::move(cond));
      node->args.push_back(std::move(otherwise));  // may be null: undefined
      e = std::move(node);
    }
    return e;
  }

  // `a, b` (for `{% set x = a, b %}`) gives a list.
  ExprPtr parse_tuple() {
    ExprPtr first = parse_expression();
    if (!is_op(",")) return first;
    auto list = make(Expr::Kind::kList);
    list->tuple = true;
    list->args.push_back(std::move(first));
    while (is_op(",")) {
      ++pos_;
      if (at_end()) break;
      list->args.push_back(parse_expression());
    }
    return list;
  }

 private:
  ExprPtr make(Expr::Kind kind) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line_;
    return e;
  }
  ExprPtr binary(Op op, ExprPtr a, ExprPtr b) {
    auto e = make(Expr::Kind::kBinary);
    e->op = op;
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      ++pos_;
      e = binary(Op::kOr, std::move(e), parse_and());
    }
    return e;
  }
  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      ++pos_;
      e = binary(Op::kAnd, std::move(e), parse_not());
    }
    return e;
  }
  ExprPtr parse_not() {
    if (is_name("not")) {
      ++pos_;
      auto e = make(Expr::Kind::kUnary);
      e->op = Op::kNot;
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    ExprPtr first = parse_math1();
    std::unique_ptr<Expr> cmp;
    for (;;) {
      Op op;
      if (is_op("=="))
        op = Op::kEq;
      else if (is_op("!="))
        op = Op::kNe;
      else if (is_op("<"))
        op = Op::kLt;
      else if (is_op("<="))
        op = Op::kLe;
      else if (is_op(">"))
        op = Op::kGt;
      else if (is_op(">="))
        op = Op::kGe;
      else if (is_name("in"))
        op = Op::kIn;
      else if (is_name("not") && is_name("in", 1))
        op = Op::kNotIn;
      else
        break;
      pos_ += op == Op::kNotIn ? 2 : 1;
      if (!cmp) {
        cmp = make(Expr::Kind::kCompare);
        cmp->args.push_back(std::move(first));
      }
      cmp->compare_ops.push_back(op);
      cmp->args.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }
  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Op op = is_op("+") ? Op::kAdd : Op::kSub;
      ++pos_;
      e = binary(op, std::move(e), parse_concat());
    }
    return e;
  }
  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      ++pos_;
      e = binary(Op::kConcat, std::move(e), parse_math2());
    }
    return e;
  }
  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    for (;;) {
      Op op;
      if (is_op("*"))
        op = Op::kMul;
      else if (is_op("/"))
        op = Op::kDiv;
      else if (is_op("//"))
        op = Op::kFloorDiv;
      else if (is_op("%"))
        op = Op::kMod;
      else
        break;
      ++pos_;
      e = binary(op, std::move(e), parse_pow());
    }
    return e;
  }
  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      ++pos_;
      e = binary(Op::kPow, std::move(e), parse_unary(true));
    }
    return e;
  }
  ExprPtr parse_unary(bool with_filter) {
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const Op op = is_op("-") ? Op::kNeg : Op::kPos;
      ++pos_;
      e = make(Expr::Kind::kUnary);
      e->op = op;
      e->args.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token t = next();
    switch (t.type) {
      case TokenType::kName: {
        if (t.text == "true" || t.text == "True") return literal(Value::from_bool(true));
        if (t.text == "false" || t.text == "False") return literal(Value::from_bool(false));
        if (t.text == "none" || t.text == "None") return literal(Value::none());
        auto e = make(Expr::Kind::kName);
        e->name = t.text;
        return e;
      }
      case TokenType::kString: {
        std::string s = t.text;
        while (peek().type == TokenType::kString) s += next().text;  // "a" "b" concatenates
        return literal(Value::from_string(std::move(s)));
      }
      case TokenType::kInt:
        return literal(Value::from_int(t.integer));
      case TokenType::kFloat:
        return literal(Value::from_float(t.number));
      case TokenType::kOp:
        if (t.text == "(") {
          if (is_op(")")) {
            ++pos_;
            auto empty = make(Expr::Kind::kList);
            empty->tuple = true;
            return empty;
          }
          ExprPtr e = parse_expression();
          if (is_op(",")) {
            auto list = make(Expr::Kind::kList);
            list->tuple = true;
            list->args.push_back(std::move(e));
            while (is_op(",")) {
              ++pos_;
              if (is_op(")")) break;
              list->args.push_back(parse_expression());
            }
            e = std::move(list);
          }
          expect_op(")");
          return e;
        }
        if (t.text == "[") {
          auto list = make(Expr::Kind::kList);
          while (!is_op("]")) {
            list->args.push_back(parse_expression());
            if (!is_op(",")) break;
            ++pos_;
          }
          expect_op("]");
          return list;
        }
        if (t.text == "{") {
          auto dict = make(Expr::Kind::kDict);
          while (!is_op("}")) {
            dict->args.push_back(parse_expression());
            expect_op(":");
            dict->args.push_back(parse_expression());
            if (!is_op(",")) break;
            ++pos_;
          }
          expect_op("}");
          return dict;
        }
        break;
      case TokenType::kEnd:
        break;
    }
    fail(line_, "unexpected " + describe(t) + " in expression");
  }

  ExprPtr literal(Value v) {
    auto e = make(Expr::Kind::kLiteral);
    e->literal = std::move(v);
    return e;
  }

  ExprPtr parse_postfix(ExprPtr e) {
    for (;;) {
      if (is_op(".")) {
        ++pos_;
        if (peek().type == TokenType::kInt) {
          auto item = make(Expr::Kind::kGetItem);
          item->args.push_back(std::move(e));
          item->args.push_back(literal(Value::from_int(next().integer)));
          e = std::move(item);
          continue;
        }
        auto attr = make(Expr::Kind::kGetAttr);
        attr->name = expect_name();
        attr->args.push_back(std::move(e));
        e = std::move(attr);
      } else if (is_op("[")) {
        ++pos_;
        e = parse_subscript(std::move(e));
      } else if (is_op("(")) {
        ++pos_;
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr subject) {
    ExprPtr parts[3];
    int colons = 0;
    if (!is_op(":")) parts[0] = parse_expression();
    while (is_op(":") && colons < 2) {
      ++pos_;
      ++colons;
      if (!is_op(":") && !is_op("]")) parts[colons] = parse_expression();
    }
    expect_op("]");
    if (colons == 0) {
      auto item = make(Expr::Kind::kGetItem);
      item->args.push_back(std::move(subject));
      item->args.push_back(std::move(parts[0]));
      return item;
    }
    auto slice = make(Expr::Kind::kSlice);
    slice->args.push_back(std::move(subject));
    for (auto& p : parts) slice->args.push_back(std::move(p));
    return slice;
  }

  // After "(": positional and keyword arguments up to ")". The callee becomes args[0].
  ExprPtr parse_call(ExprPtr callee) {
    auto call = make(Expr::Kind::kCall);
    call->args.push_back(std::move(callee));
    parse_arguments(*call);
    return call;
  }
  void parse_arguments(Expr& target) {
    while (!is_op(")")) {
      if (is_op("*") || is_op("**"))
        fail(line_, "unsupported construct: *args / **kwargs in a call");
      if (peek().type == TokenType::kName && is_op("=", 1)) {
        std::string key = next().text;
        ++pos_;
        target.kwargs.emplace_back(std::move(key), parse_expression());
      } else {
        if (!target.kwargs.empty()) fail(line_, "positional argument after keyword argument");
        target.args.push_back(parse_expression());
      }
      if (!is_op(",")) break;
      ++pos_;
    }
    expect_op(")");
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    for (;;) {
      if (is_op("|")) {
        ++pos_;
        auto f = make(Expr::Kind::kFilter);
        f->name = expect_name();
        if (!supported_filters().count(f->name))
          fail(line_, "unsupported filter '" + f->name + "'");
        f->args.push_back(std::move(e));
        if (is_op("(")) {
          ++pos_;
          parse_arguments(*f);
        }
        e = std::move(f);
      } else if (is_name("is")) {
        ++pos_;
        auto t = make(Expr::Kind::kTest);
        if (is_name("not")) {
          ++pos_;
          t->negated = true;
        }
        t->name = expect_name();
        if (!supported_tests().count(t->name)) fail(line_, "unsupported test '" + t->name + "'");
        t->args.push_back(std::move(e));
        if (is_op("(")) {
          ++pos_;
          parse_arguments(*t);
        } else if ((peek().type == TokenType::kName || peek().type == TokenType::kString ||
                    peek().type == TokenType::kInt || peek().type == TokenType::kFloat ||
                    is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and") && !is_name("if") &&
                   !is_name("in") && !is_name("not")) {
          t->args.push_back(parse_postfix(parse_primary()));  // `x is divisibleby 3`
        }
        e = std::move(t);
      } else if (is_op("(")) {
        ++pos_;
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  std::vector<Token> toks_;
  size_t pos_ = 0;
  int line_;
};

class TemplateParser {
 public:
  explicit TemplateParser(std::vector<Segment> segments) : segs_(std::move(segments)) {}

  NodeList parse() {
    std::string end;
    NodeList nodes = parse_body({}, &end, nullptr);
    return nodes;
  }

 private:
  // Parse nodes until a statement whose keyword is in `terminators` (returned in *found with its
  // parser, positioned after the keyword).
  NodeList parse_body(const std::vector<std::string>& terminators, std::string* found,
                      std::unique_ptr<ExprParser>* found_parser) {
    NodeList nodes;
    while (i_ < segs_.size()) {
      const Segment& seg = segs_[i_++];
      if (seg.kind == SegmentKind::kText) {
        auto n = make(Node::Kind::kText, seg.line);
        n->text = seg.text;
        nodes.push_back(std::move(n));
        continue;
      }
      auto p = std::make_unique<ExprParser>(lex_tag(seg.text, seg.line), seg.line);
      if (seg.kind == SegmentKind::kOutput) {
        auto n = make(Node::Kind::kOutput, seg.line);
        n->expr = p->parse_expression();
        p->expect_end();
        nodes.push_back(std::move(n));
        continue;
      }
      if (p->at_end()) fail(seg.line, "empty tag '{% %}'");
      const std::string keyword = p->expect_name();
      if (std::find(terminators.begin(), terminators.end(), keyword) != terminators.end()) {
        *found = keyword;
        if (found_parser) *found_parser = std::move(p);
        return nodes;
      }
      if (keyword == "raw" || keyword == "endraw") continue;  // the scanner took the body as text
      if (keyword == "if") {
        nodes.push_back(parse_if(*p, seg.line));
      } else if (keyword == "for") {
        nodes.push_back(parse_for(*p, seg.line));
      } else if (keyword == "set") {
        nodes.push_back(parse_set(*p, seg.line));
      } else if (keyword == "break" || keyword == "continue") {
        p->expect_end();
        if (loop_depth_ == 0) fail(seg.line, "'" + keyword + "' outside of a loop");
        nodes.push_back(
            make(keyword == "break" ? Node::Kind::kBreak : Node::Kind::kContinue, seg.line));
      } else if (keyword == "macro") {
        nodes.push_back(parse_macro(*p, seg.line));
      } else if (keyword == "generation") {
        p->expect_end();
        auto n = make(Node::Kind::kGeneration, seg.line);
        n->body = parse_block(seg.line, "generation", {"endgeneration"});
        nodes.push_back(std::move(n));
      } else if (keyword.rfind("end", 0) == 0 || keyword == "elif" || keyword == "else") {
        fail(seg.line, "unexpected '{% " + keyword + " %}'");
      } else {
        fail(seg.line,
             "unsupported tag '{% " + keyword +
                 " %}' (supported: if, for, set, macro, break, continue, raw, generation)");
      }
    }
    if (!terminators.empty()) {
      fail(segs_.empty() ? 0 : segs_.back().line,
           "missing '{% " + terminators.back() + " %}' at the end of the template");
    }
    return nodes;
  }

  NodeList parse_block(int line, const std::string& what, const std::vector<std::string>& ends,
                       std::string* found = nullptr,
                       std::unique_ptr<ExprParser>* parser = nullptr) {
    std::string end;
    std::unique_ptr<ExprParser> p;
    NodeList body = parse_body(ends, &end, &p);
    if (end.empty()) fail(line, "'{% " + what + " %}' is not closed");
    if (found) *found = end;
    if (parser) {
      *parser = std::move(p);
    } else {
      p->expect_end();
    }
    return body;
  }

  std::unique_ptr<Node> make(Node::Kind kind, int line) {
    auto n = std::make_unique<Node>();
    n->kind = kind;
    n->line = line;
    return n;
  }

  std::unique_ptr<Node> parse_if(ExprParser& p, int line) {
    auto n = make(Node::Kind::kIf, line);
    ExprPtr cond = p.parse_expression();
    p.expect_end();
    for (;;) {
      std::string end;
      std::unique_ptr<ExprParser> ep;
      NodeList body = parse_block(line, "if", {"elif", "else", "endif"}, &end, &ep);
      n->branches.emplace_back(std::move(cond), std::move(body));
      if (end == "elif") {
        cond = ep->parse_expression();
        ep->expect_end();
        continue;
      }
      ep->expect_end();
      if (end == "else") n->else_body = parse_block(line, "if", {"endif"});
      return n;
    }
  }

  std::unique_ptr<Node> parse_for(ExprParser& p, int line) {
    auto n = make(Node::Kind::kFor, line);
    const bool paren = p.is_op("(");
    if (paren) p.next();
    n->targets.push_back(p.expect_name());
    while (p.is_op(",")) {
      p.next();
      n->targets.push_back(p.expect_name());
    }
    if (paren) p.expect_op(")");
    if (!p.is_name("in")) fail(line, "expected 'in' in '{% for %}'");
    p.next();
    n->expr = p.parse_expression(/*with_condition=*/false);
    if (p.is_name("if")) {
      p.next();
      n->filter = p.parse_expression();
    }
    if (p.is_name("recursive")) fail(line, "unsupported construct: recursive for loops");
    p.expect_end();
    ++loop_depth_;
    std::string end;
    n->body = parse_block(line, "for", {"else", "endfor"}, &end);
    --loop_depth_;
    if (end == "else") n->else_body = parse_block(line, "for", {"endfor"});
    return n;
  }

  std::unique_ptr<Node> parse_set(ExprParser& p, int line) {
    std::string first = p.expect_name();
    if (p.is_op(".")) {
      p.next();
      auto n = make(Node::Kind::kSetAttr, line);
      n->targets = {first, p.expect_name()};
      p.expect_op("=");
      n->expr = p.parse_tuple();
      p.expect_end();
      return n;
    }
    std::vector<std::string> targets = {first};
    while (p.is_op(",")) {
      p.next();
      targets.push_back(p.expect_name());
    }
    if (p.at_end() && targets.size() == 1) {
      auto n = make(Node::Kind::kSetBlock, line);
      n->targets = targets;
      n->body = parse_block(line, "set", {"endset"});
      return n;
    }
    if (p.is_op("|")) fail(line, "unsupported construct: filtered block set");
    p.expect_op("=");
    auto n = make(Node::Kind::kSet, line);
    n->targets = std::move(targets);
    n->expr = p.parse_tuple();
    p.expect_end();
    return n;
  }

  std::unique_ptr<Node> parse_macro(ExprParser& p, int line) {
    auto n = make(Node::Kind::kMacro, line);
    n->text = p.expect_name();
    p.expect_op("(");
    while (!p.is_op(")")) {
      n->params.push_back(p.expect_name());
      if (p.is_op("=")) {
        p.next();
        n->defaults.push_back(p.parse_expression());
      } else {
        n->defaults.push_back(nullptr);
      }
      if (!p.is_op(",")) break;
      p.next();
    }
    p.expect_op(")");
    p.expect_end();
    const int saved = loop_depth_;
    loop_depth_ = 0;
    n->body = parse_block(line, "macro", {"endmacro"});
    loop_depth_ = saved;
    return n;
  }

  std::vector<Segment> segs_;
  size_t i_ = 0;
  int loop_depth_ = 0;
};

// ------------------------------------------------------------------------------------------------
// Renderer
// ------------------------------------------------------------------------------------------------

using Scope = std::unordered_map<std::string, Value>;

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;

  // Argument `index` or keyword `name`; nullptr when absent.
  const Value* get(size_t index, const char* name) const {
    if (index < positional.size()) return &positional[index];
    for (const auto& [k, v] : keyword) {
      if (k == name) return &v;
    }
    return nullptr;
  }
};

class Renderer {
 public:
  Renderer(std::shared_ptr<Scope> root, const Scope& globals)
      : globals_(globals), scopes_{std::move(root)} {}

  void render(const NodeList& nodes, std::string& out) {
    std::string* saved = out_;
    out_ = &out;
    render_nodes(nodes);
    out_ = saved;
  }

 private:
  // --- statements ---

  void emit(const std::string& s) {
    out_->append(s);
    if (out_->size() > kMaxOutputBytes) fail(0, "rendered text exceeds 16 MiB");
  }

  void render_nodes(const NodeList& nodes) {
    for (const auto& n : nodes) {
      if (break_ || continue_) return;
      render_node(*n);
    }
  }

  void render_node(const Node& n) {
    switch (n.kind) {
      case Node::Kind::kText:
        emit(n.text);
        return;
      case Node::Kind::kOutput:
        emit(py_str(eval(*n.expr)));
        return;
      case Node::Kind::kIf:
        for (const auto& [cond, body] : n.branches) {
          if (truthy(eval(*cond))) {
            render_nodes(body);
            return;
          }
        }
        render_nodes(n.else_body);
        return;
      case Node::Kind::kFor:
        render_for(n);
        return;
      case Node::Kind::kSet:
        assign(n.targets, eval(*n.expr), n.line);
        return;
      case Node::Kind::kSetAttr: {
        Value ns = lookup(n.targets[0]);
        if (!ns.is_map() || !ns.map->is_namespace) {
          fail(n.line, "cannot assign attribute '" + n.targets[1] + "' on '" + n.targets[0] +
                           "': not a namespace()");
        }
        ns.map->set(n.targets[1], eval(*n.expr));
        return;
      }
      case Node::Kind::kSetBlock: {
        std::string captured;
        render(n.body, captured);
        scopes_.back()->insert_or_assign(n.targets[0], Value::from_string(std::move(captured)));
        return;
      }
      case Node::Kind::kBreak:
        break_ = true;
        return;
      case Node::Kind::kContinue:
        continue_ = true;
        return;
      case Node::Kind::kMacro: {
        Callable c;
        c.name = n.text;
        c.macro = &n;
        scopes_.back()->insert_or_assign(n.text, Value::from_callable(std::move(c)));
        return;
      }
      case Node::Kind::kGeneration:
        render_nodes(n.body);
        return;
    }
  }

  void assign(const std::vector<std::string>& targets, const Value& v, int line) {
    if (targets.size() == 1) {
      scopes_.back()->insert_or_assign(targets[0], v);
      return;
    }
    ValueList items = iterate(v, line);
    if (items.size() != targets.size()) {
      fail(line, "cannot unpack " + std::to_string(items.size()) + " values into " +
                     std::to_string(targets.size()) + " names");
    }
    for (size_t i = 0; i < targets.size(); ++i)
      scopes_.back()->insert_or_assign(targets[i], items[i]);
  }

  void render_for(const Node& n) {
    const ValueList all = iterate(eval(*n.expr), n.line);
    scopes_.push_back(std::make_shared<Scope>());
    ValueList items;
    if (n.filter) {
      for (const Value& item : all) {
        assign(n.targets, item, n.line);
        if (truthy(eval(*n.filter))) items.push_back(item);
      }
    } else {
      items = all;
    }
    const int64_t len = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < len; ++i) {
      assign(n.targets, items[i], n.line);
      auto loop = std::make_shared<ValueMap>();
      loop->items = {{"index", Value::from_int(i + 1)},
                     {"index0", Value::from_int(i)},
                     {"revindex", Value::from_int(len - i)},
                     {"revindex0", Value::from_int(len - i - 1)},
                     {"first", Value::from_bool(i == 0)},
                     {"last", Value::from_bool(i == len - 1)},
                     {"length", Value::from_int(len)},
                     {"depth", Value::from_int(1)},
                     {"depth0", Value::from_int(0)},
                     {"previtem", i > 0 ? items[i - 1] : Value::undefined("loop.previtem")},
                     {"nextitem", i + 1 < len ? items[i + 1] : Value::undefined("loop.nextitem")}};
      scopes_.back()->insert_or_assign("loop", Value::from_map(std::move(loop)));
      render_nodes(n.body);
      continue_ = false;
      if (break_) {
        break_ = false;
        break;
      }
    }
    scopes_.pop_back();
    if (items.empty()) render_nodes(n.else_body);
  }

  // --- values ---

  Value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto found = (*it)->find(name);
      if (found != (*it)->end()) return found->second;
    }
    auto g = globals_.find(name);
    if (g != globals_.end()) return g->second;
    return Value::undefined(name);
  }

  ValueList iterate(const Value& v, int line) const {
    switch (v.kind) {
      case Value::Kind::kUndefined:
        return {};
      case Value::Kind::kList:
        return *v.list;
      case Value::Kind::kMap: {
        ValueList keys;
        for (const auto& [k, item] : v.map->items) keys.push_back(Value::from_string(k));
        return keys;
      }
      case Value::Kind::kString: {
        ValueList chars;
        std::vector<size_t> offs = code_point_offsets(v.text);
        for (size_t i = 0; i + 1 < offs.size(); ++i) {
          chars.push_back(Value::from_string(v.text.substr(offs[i], offs[i + 1] - offs[i])));
        }
        return chars;
      }
      default:
        fail(line, std::string("'") + type_name(v) + "' object is not iterable");
    }
  }

  struct DepthGuard {
    explicit DepthGuard(int& d, int line) : depth(d) {
      if (++depth > kMaxDepth) fail(line, "expression or macro calls nested too deeply");
    }
    ~DepthGuard() { --depth; }
    int& depth;
  };

  Value eval(const Expr& e) {
    DepthGuard guard(depth_, e.line);
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.literal;
      case Expr::Kind::kName:
        return lookup(e.name);
      case Expr::Kind::kList: {
        ValueList items;
        for (const auto& a : e.args) items.push_back(eval(*a));
        return Value::from_list(std::move(items), e.tuple);
      }
      case Expr::Kind::kDict: {
        auto m = std::make_shared<ValueMap>();
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          Value k = eval(*e.args[i]);
          if (!k.is_string()) fail(e.line, "dict keys must be strings");
          m->set(k.text, eval(*e.args[i + 1]));
        }
        return Value::from_map(std::move(m));
      }
      case Expr::Kind::kGetAttr:
        return get_attr(eval(*e.args[0]), e.name, e.line);
      case Expr::Kind::kGetItem:
        return get_item(eval(*e.args[0]), eval(*e.args[1]), e.line);
      case Expr::Kind::kSlice:
        return slice(e);
      case Expr::Kind::kCall:
        return call(e);
      case Expr::Kind::kFilter: {
        Value subject = eval(*e.args[0]);
        return apply_filter(e.name, subject, eval_args(e, 1), e.line);
      }
      case Expr::Kind::kTest: {
        Value subject = eval(*e.args[0]);
        const bool r = apply_test(e.name, subject, eval_args(e, 1), e.line);
        return Value::from_bool(e.negated ? !r : r);
      }
      case Expr::Kind::kUnary: {
        if (e.op == Op::kNot) return Value::from_bool(!truthy(eval(*e.args[0])));
        Value v = eval(*e.args[0]);
        if (v.is_undefined()) fail(e.line, undefined_message(v));
        if (!v.is_number())
          fail(e.line, std::string("bad operand type for unary -: '") + type_name(v) + "'");
        if (e.op == Op::kPos) return v.kind == Value::Kind::kBool ? Value::from_int(v.as_int()) : v;
        if (v.kind == Value::Kind::kFloat) return Value::from_float(-v.number);
        return Value::from_int(-v.as_int());
      }
      case Expr::Kind::kBinary: {
        if (e.op == Op::kAnd) {
          Value a = eval(*e.args[0]);
          return truthy(a) ? eval(*e.args[1]) : a;
        }
        if (e.op == Op::kOr) {
          Value a = eval(*e.args[0]);
          return truthy(a) ? a : eval(*e.args[1]);
        }
        return binary(e.op, eval(*e.args[0]), eval(*e.args[1]), e.line);
      }
      case Expr::Kind::kCompare: {
        Value left = eval(*e.args[0]);
        for (size_t i = 0; i < e.compare_ops.size(); ++i) {
          Value right = eval(*e.args[i + 1]);
          if (!compare(e.compare_ops[i], left, right, e.line)) return Value::from_bool(false);
          left = std::move(right);
        }
        return Value::from_bool(true);
      }
      case Expr::Kind::kCondition:
        if (truthy(eval(*e.args[1]))) return eval(*e.args[0]);
        return e.args[2] ? eval(*e.args[2]) : Value::undefined();
    }
    return Value::undefined();
  }

  CallArgs eval_args(const Expr& e, size_t first) {
    CallArgs a;
    for (size_t i = first; i < e.args.size(); ++i) a.positional.push_back(eval(*e.args[i]));
    for (const auto& [k, v] : e.kwargs) a.keyword.emplace_back(k, eval(*v));
    return a;
  }

  static Value get_attr(const Value& obj, const std::string& name, int line) {
    if (obj.is_undefined()) {
      fail(line, undefined_message(obj) + " (cannot read its attribute '" + name + "')");
    }
    if (obj.is_map()) {
      const Value* v = obj.map->find(name);
      return v ? *v : Value::undefined(name);
    }
    return Value::undefined(name);
  }

  static Value get_item(const Value& obj, const Value& key, int line) {
    if (obj.is_undefined()) fail(line, undefined_message(obj) + " (cannot index it)");
    if (obj.is_map()) {
      if (!key.is_string()) return Value::undefined();
      const Value* v = obj.map->find(key.text);
      return v ? *v : Value::undefined(key.text);
    }
    if ((obj.is_list() || obj.is_string()) && key.is_integral()) {
      std::vector<size_t> offs;
      int64_t n;
      if (obj.is_list()) {
        n = static_cast<int64_t>(obj.list->size());
      } else {
        offs = code_point_offsets(obj.text);
        n = static_cast<int64_t>(offs.size()) - 1;
      }
      int64_t i = key.as_int();
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::undefined("index " + std::to_string(key.as_int()));
      if (obj.is_list()) return (*obj.list)[static_cast<size_t>(i)];
      return Value::from_string(obj.text.substr(offs[i], offs[i + 1] - offs[i]));
    }
    return Value::undefined();
  }

  Value slice(const Expr& e) {
    Value obj = eval(*e.args[0]);
    if (obj.is_undefined()) fail(e.line, undefined_message(obj) + " (cannot slice it)");
    std::optional<int64_t> bounds[3];
    for (int k = 0; k < 3; ++k) {
      if (!e.args[k + 1]) continue;
      Value b = eval(*e.args[k + 1]);
      if (b.is_none()) continue;
      if (!b.is_integral()) fail(e.line, "slice indices must be integers");
      bounds[k] = b.as_int();
    }
    std::vector<size_t> offs;
    int64_t n;
    if (obj.is_list()) {
      n = static_cast<int64_t>(obj.list->size());
    } else if (obj.is_string()) {
      offs = code_point_offsets(obj.text);
      n = static_cast<int64_t>(offs.size()) - 1;
    } else {
      fail(e.line, std::string("'") + type_name(obj) + "' object is not subscriptable");
    }
    const int64_t step = bounds[2].value_or(1);
    if (step == 0) fail(e.line, "slice step cannot be zero");
    auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
      if (!v) return dflt;
      int64_t x = *v;
      if (x < 0) x += n;
      if (step > 0) return std::clamp<int64_t>(x, 0, n);
      return std::clamp<int64_t>(x, -1, n - 1);
    };
    const int64_t start = clamp(bounds[0], step > 0 ? 0 : n - 1);
    const int64_t stop = clamp(bounds[1], step > 0 ? n : -1);
    std::vector<int64_t> idx;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) idx.push_back(i);
    if (obj.is_list()) {
      ValueList items;
      for (int64_t i : idx) items.push_back((*obj.list)[static_cast<size_t>(i)]);
      return Value::from_list(std::move(items));
    }
    std::string s;
    for (int64_t i : idx) s.append(obj.text, offs[i], offs[i + 1] - offs[i]);
    return Value::from_string(std::move(s));
  }

  bool compare(Op op, const Value& a, const Value& b, int line) {
    switch (op) {
      case Op::kEq:
        return values_equal(a, b);
      case Op::kNe:
        return !values_equal(a, b);
      case Op::kLt:
        return compare_values(a, b, "<", line) < 0;
      case Op::kLe:
        return compare_values(a, b, "<=", line) <= 0;
      case Op::kGt:
        return compare_values(a, b, ">", line) > 0;
      case Op::kGe:
        return compare_values(a, b, ">=", line) >= 0;
      case Op::kIn:
        return contains(b, a, line);
      case Op::kNotIn:
        return !contains(b, a, line);
      default:
        return false;
    }
  }

  static bool contains(const Value& container, const Value& needle, int line) {
    switch (container.kind) {
      case Value::Kind::kString:
        if (!needle.is_string()) {
          fail(line,
               std::string("'in <string>' requires a string, not '") + type_name(needle) + "'");
        }
        return container.text.find(needle.text) != std::string::npos;
      case Value::Kind::kList:
        for (const Value& v : *container.list) {
          if (values_equal(v, needle)) return true;
        }
        return false;
      case Value::Kind::kMap:
        return needle.is_string() && container.map->find(needle.text) != nullptr;
      case Value::Kind::kUndefined:
        return false;
      default:
        fail(line, std::string("argument of type '") + type_name(container) + "' is not iterable");
    }
  }

  static Value binary(Op op, const Value& a, const Value& b, int line) {
    if (op == Op::kConcat) return Value::from_string(py_str(a) + py_str(b));
    if (a.is_undefined()) fail(line, undefined_message(a));
    if (b.is_undefined()) fail(line, undefined_message(b));
    static const char* const kSymbols[] = {"+", "-", "*", "/", "//", "%", "**"};
    const char* sym = kSymbols[static_cast<int>(op)];
    auto type_error = [&]() -> Value {
      fail(line, std::string("unsupported operand types for ") + sym + ": '" + type_name(a) +
                     "' and '" + type_name(b) + "'");
    };
    if (op == Op::kAdd) {
      if (a.is_string() && b.is_string()) return Value::from_string(a.text + b.text);
      if (a.is_list() && b.is_list()) {
        ValueList items = *a.list;
        items.insert(items.end(), b.list->begin(), b.list->end());
        return Value::from_list(std::move(items));
      }
    }
    if (op == Op::kMul) {
      const Value* seq =
          a.is_string() || a.is_list() ? &a : (b.is_string() || b.is_list() ? &b : nullptr);
      const Value* count = seq == &a ? &b : &a;
      if (seq && count->is_integral()) {
        const int64_t n = std::max<int64_t>(0, count->as_int());
        const size_t unit = seq->is_string() ? seq->text.size() : seq->list->size();
        if (unit * static_cast<size_t>(n) > kMaxOutputBytes) fail(line, "repetition too large");
        if (seq->is_string()) {
          std::string s;
          for (int64_t i = 0; i < n; ++i) s += seq->text;
          return Value::from_string(std::move(s));
        }
        ValueList items;
        for (int64_t i = 0; i < n; ++i)
          items.insert(items.end(), seq->list->begin(), seq->list->end());
        return Value::from_list(std::move(items));
      }
    }
    if (op == Op::kMod && a.is_string()) fail(line, "unsupported construct: '%' string formatting");
    if (!a.is_number() || !b.is_number()) return type_error();
    const bool ints = a.is_integral() && b.is_integral();
    const int64_t x = a.as_int(), y = b.as_int();
    const double fx = a.as_double(), fy = b.as_double();
    int64_t r = 0;
    switch (op) {
      case Op::kAdd:
        if (!ints) return Value::from_float(fx + fy);
        if (__builtin_add_overflow(x, y, &r)) fail(line, "integer overflow");
        return Value::from_int(r);
      case Op::kSub:
        if (!ints) return Value::from_float(fx - fy);
        if (__builtin_sub_overflow(x, y, &r)) fail(line, "integer overflow");
        return Value::from_int(r);
      case Op::kMul:
        if (!ints) return Value::from_float(fx * fy);
        if (__builtin_mul_overflow(x, y, &r)) fail(line, "integer overflow");
        return Value::from_int(r);
      case Op::kDiv:
        if (fy == 0) fail(line, "division by zero");
        return Value::from_float(fx / fy);
      case Op::kFloorDiv:
        if (fy == 0) fail(line, "division by zero");
        if (ints) {
          if (x == std::numeric_limits<int64_t>::min() && y == -1) fail(line, "integer overflow");
          int64_t q = x / y;
          if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
          return Value::from_int(q);
        }
        return Value::from_float(std::floor(fx / fy));
      case Op::kMod:
        if (fy == 0) fail(line, "modulo by zero");
        if (ints) {
          if (y == -1) return Value::from_int(0);
          int64_t m = x % y;
          if (m != 0 && ((m < 0) != (y < 0))) m += y;
          return Value::from_int(m);
        } else {
          double m = std::fmod(fx, fy);
          if (m != 0 && ((m < 0) != (fy < 0))) m += fy;
          return Value::from_float(m);
        }
      case Op::kPow:
        if (ints && y >= 0) {
          int64_t acc = 1;
          for (int64_t i = 0; i < y; ++i) {
            if (__builtin_mul_overflow(acc, x, &acc)) fail(line, "integer overflow");
            if (acc == 0 || acc == 1) break;
          }
          return Value::from_int(acc);
        }
        return Value::from_float(std::pow(fx, fy));
      default:
        return type_error();
    }
  }

  // --- calls ---

  Value call(const Expr& e) {
    const Expr& callee = *e.args[0];
    if (callee.kind == Expr::Kind::kGetAttr) {
      Value obj = eval(*callee.args[0]);
      if (!obj.is_map() || obj.map->find(callee.name) == nullptr ||
          obj.map->find(callee.name)->kind != Value::Kind::kCallable) {
        return call_method(obj, callee.name, eval_args(e, 1), e.line);
      }
    }
    Value fn = eval(callee);
    if (fn.is_undefined()) fail(e.line, undefined_message(fn) + " (called as a function)");
    if (fn.kind != Value::Kind::kCallable) {
      fail(e.line, std::string("'") + type_name(fn) + "' object is not callable");
    }
    CallArgs args = eval_args(e, 1);
    if (fn.callable->macro) return call_macro(*fn.callable->macro, args, e.line);
    return call_builtin(*fn.callable, args, e.line);
  }

  Value call_macro(const Node& macro, const CallArgs& args, int line) {
    if (args.positional.size() > macro.params.size()) {
      fail(line, "macro '" + macro.text + "' takes " + std::to_string(macro.params.size()) +
                     " arguments");
    }
    auto frame = std::make_shared<Scope>();
    for (size_t i = 0; i < macro.params.size(); ++i) {
      const Value* v = args.get(i, macro.params[i].c_str());
      if (v) {
        frame->insert_or_assign(macro.params[i], *v);
      } else if (macro.defaults[i]) {
        frame->insert_or_assign(macro.params[i], eval(*macro.defaults[i]));
      } else {
        frame->insert_or_assign(macro.params[i], Value::undefined(macro.params[i]));
      }
    }
    for (const auto& [k, v] : args.keyword) {
      if (std::find(macro.params.begin(), macro.params.end(), k) == macro.params.end()) {
        fail(line, "macro '" + macro.text + "' has no parameter '" + k + "'");
      }
    }
    DepthGuard guard(depth_, line);
    std::vector<std::shared_ptr<Scope>> saved = {scopes_.front(), frame};
    std::swap(saved, scopes_);
    const bool saved_break = break_, saved_continue = continue_;
    std::string out;
    render(macro.body, out);
    std::swap(saved, scopes_);
    break_ = saved_break;
    continue_ = saved_continue;
    return Value::from_string(std::move(out));
  }

  static Value call_builtin(const Callable& fn, const CallArgs& args, int line) {
    switch (fn.builtin) {
      case Builtin::kRaiseException: {
        const Value* msg = args.get(0, "message");
        fail(line, msg ? py_str(*msg) : std::string("raise_exception() called"));
      }
      case Builtin::kNamespace:
      case Builtin::kDict: {
        auto m = std::make_shared<ValueMap>();
        m->is_namespace = fn.builtin == Builtin::kNamespace;
        for (const Value& p : args.positional) {
          if (!p.is_map()) fail(line, fn.name + "() takes a dict or keyword arguments");
          for (const auto& [k, v] : p.map->items) m->set(k, v);
        }
        for (const auto& [k, v] : args.keyword) m->set(k, v);
        return Value::from_map(std::move(m));
      }
      case Builtin::kRange: {
        std::vector<int64_t> a;
        for (const Value& v : args.positional) {
          if (!v.is_integral()) fail(line, "range() arguments must be integers");
          a.push_back(v.as_int());
        }
        if (a.empty() || a.size() > 3) fail(line, "range() takes 1 to 3 arguments");
        const int64_t start = a.size() == 1 ? 0 : a[0];
        const int64_t stop = a.size() == 1 ? a[0] : a[1];
        const int64_t step = a.size() == 3 ? a[2] : 1;
        if (step == 0) fail(line, "range() step must not be zero");
        ValueList items;
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
          if (static_cast<int64_t>(items.size()) >= kMaxRange) fail(line, "range() too large");
          items.push_back(Value::from_int(i));
        }
        return Value::from_list(std::move(items));
      }
      case Builtin::kStrftimeNow: {
        const Value* fmt = args.get(0, "format");
        if (!fmt || !fmt->is_string()) fail(line, "strftime_now() takes a format string");
        const std::time_t now = std::time(nullptr);
        std::tm tm{};
        localtime_r(&now, &tm);
        char buf[256];
        const size_t n = std::strftime(buf, sizeof(buf), fmt->text.c_str(), &tm);
        return Value::from_string(std::string(buf, n));
      }
    }
    return Value::none();
  }

  static std::string arg_string(const CallArgs& args, size_t i, const char* name, const char* fn,
                                int line) {
    const Value* v = args.get(i, name);
    if (!v || !v->is_string())
      fail(line, std::string(fn) + "() needs a string argument '" + name + "'");
    return v->text;
  }

  static ValueList python_split(const std::string& s, const Value* sep, int64_t maxsplit,
                                int line) {
    ValueList parts;
    if (!sep || sep->is_none()) {
      size_t i = 0;
      int64_t splits = 0;
      while (i < s.size()) {
        while (i < s.size() && is_ascii_space(s[i])) ++i;
        if (i >= s.size()) break;
        if (maxsplit >= 0 && splits == maxsplit) {
          size_t end = s.size();
          while (end > i && is_ascii_space(s[end - 1])) --end;
          parts.push_back(Value::from_string(s.substr(i, end - i)));
          break;
        }
        size_t j = i;
        while (j < s.size() && !is_ascii_space(s[j])) ++j;
        parts.push_back(Value::from_string(s.substr(i, j - i)));
        ++splits;
        i = j;
      }
      return parts;
    }
    if (!sep->is_string() || sep->text.empty())
      fail(line, "split() separator must be a non-empty string");
    size_t start = 0;
    int64_t splits = 0;
    for (;;) {
      const size_t at =
          (maxsplit >= 0 && splits == maxsplit) ? std::string::npos : s.find(sep->text, start);
      if (at == std::string::npos) {
        parts.push_back(Value::from_string(s.substr(start)));
        return parts;
      }
      parts.push_back(Value::from_string(s.substr(start, at - start)));
      start = at + sep->text.size();
      ++splits;
    }
  }

  static std::string ascii_case(std::string s, bool upper) {
    for (char& c : s)
      c = static_cast<char>(upper ? std::toupper(static_cast<unsigned char>(c))
                                  : std::tolower(static_cast<unsigned char>(c)));
    return s;
  }
  static std::string title_case(const std::string& s) {
    std::string out = s;
    bool prev_alpha = false;
    for (char& c : out) {
      const bool alpha = std::isalpha(static_cast<unsigned char>(c));
      if (alpha) c = static_cast<char>(prev_alpha ? std::tolower(c) : std::toupper(c));
      prev_alpha = alpha;
    }
    return out;
  }
  static std::string capitalize(const std::string& s) {
    std::string out = ascii_case(s, false);
    if (!out.empty()) out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
    return out;
  }
  static std::string replace_all(const std::string& s, const std::string& from,
                                 const std::string& to, int64_t count) {
    if (from.empty()) return s;
    std::string out;
    size_t start = 0;
    for (int64_t n = 0; count < 0 || n < count; ++n) {
      const size_t at = s.find(from, start);
      if (at == std::string::npos) break;
      out.append(s, start, at - start);
      out += to;
      start = at + from.size();
    }
    out.append(s, start, std::string::npos);
    return out;
  }

  Value call_method(const Value& obj, const std::string& name, const CallArgs& args, int line) {
    if (obj.is_undefined()) {
      fail(line, undefined_message(obj) + " (cannot call its method '" + name + "')");
    }
    if (obj.is_string()) {
      const std::string& s = obj.text;
      if (name == "strip" || name == "lstrip" || name == "rstrip") {
        const Value* chars = args.get(0, "chars");
        std::string set = chars && chars->is_string() ? chars->text : "";
        return Value::from_string(py_strip(s, chars && chars->is_string() ? &set : nullptr,
                                           name != "rstrip", name != "lstrip"));
      }
      if (name == "upper" || name == "lower")
        return Value::from_string(ascii_case(s, name == "upper"));
      if (name == "title") return Value::from_string(title_case(s));
      if (name == "capitalize") return Value::from_string(capitalize(s));
      if (name == "startswith" || name == "endswith") {
        const Value* arg = args.get(0, "prefix");
        if (!arg) fail(line, name + "() takes an argument");
        ValueList options = arg->is_list() ? *arg->list : ValueList{*arg};
        for (const Value& o : options) {
          if (!o.is_string()) fail(line, name + "() arguments must be strings");
          const std::string& t = o.text;
          const bool hit =
              name == "startswith"
                  ? s.compare(0, t.size(), t) == 0
                  : s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
          if (hit) return Value::from_bool(true);
        }
        return Value::from_bool(false);
      }
      if (name == "split") {
        const Value* maxsplit = args.get(1, "maxsplit");
        return Value::from_list(
            python_split(s, args.get(0, "sep"),
                         maxsplit && maxsplit->is_integral() ? maxsplit->as_int() : -1, line));
      }
      if (name == "splitlines") {
        ValueList lines;
        size_t start = 0;
        for (size_t i = 0; i < s.size(); ++i) {
          if (s[i] == '\n' || s[i] == '\r') {
            lines.push_back(Value::from_string(s.substr(start, i - start)));
            if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
            start = i + 1;
          }
        }
        if (start < s.size()) lines.push_back(Value::from_string(s.substr(start)));
        return Value::from_list(std::move(lines));
      }
      if (name == "replace") {
        const Value* count = args.get(2, "count");
        return Value::from_string(
            replace_all(s, arg_string(args, 0, "old", "replace", line),
                        arg_string(args, 1, "new", "replace", line),
                        count && count->is_integral() ? count->as_int() : -1));
      }
      if (name == "find" || name == "count") {
        const std::string sub = arg_string(args, 0, "sub", name.c_str(), line);
        if (name == "find") {
          const size_t at = s.find(sub);
          if (at == std::string::npos) return Value::from_int(-1);
          return Value::from_int(static_cast<int64_t>(code_point_offsets(s.substr(0, at)).size()) -
                                 1);
        }
        if (sub.empty()) return Value::from_int(static_cast<int64_t>(code_point_offsets(s).size()));
        int64_t n = 0;
        for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size()))
          ++n;
        return Value::from_int(n);
      }
      if (name == "join") {
        const Value* items = args.get(0, "iterable");
        if (!items) fail(line, "join() takes an iterable");
        std::string out;
        bool first = true;
        for (const Value& v : iterate(*items, line)) {
          if (!v.is_string()) fail(line, "join() items must be strings");
          if (!first) out += s;
          first = false;
          out += v.text;
        }
        return Value::from_string(std::move(out));
      }
      if (name == "isdigit" || name == "isspace" || name == "isalpha" || name == "isalnum") {
        if (s.empty()) return Value::from_bool(false);
        for (char c : s) {
          const auto u = static_cast<unsigned char>(c);
          const bool ok = name == "isdigit"   ? std::isdigit(u)
                          : name == "isspace" ? is_ascii_space(c)
                          : name == "isalpha" ? std::isalpha(u)
                                              : std::isalnum(u);
          if (!ok) return Value::from_bool(false);
        }
        return Value::from_bool(true);
      }
    } else if (obj.is_map() && !obj.map->is_namespace) {
      if (name == "items" || name == "keys" || name == "values") {
        ValueList out;
        for (const auto& [k, v] : obj.map->items) {
          if (name == "items") {
            out.push_back(Value::from_list({Value::from_string(k), v}, /*is_tuple=*/true));
          } else {
            out.push_back(name == "keys" ? Value::from_string(k) : v);
          }
        }
        return Value::from_list(std::move(out));
      }
      if (name == "get") {
        const Value* key = args.get(0, "key");
        const Value* dflt = args.get(1, "default");
        const Value* found = key && key->is_string() ? obj.map->find(key->text) : nullptr;
        return found ? *found : (dflt ? *dflt : Value::none());
      }
    }
    fail(line, std::string("unsupported method '") + name + "' on a value of type '" +
                   type_name(obj) + "'");
  }

  // --- filters and tests ---

  Value attribute_of(const Value& v, const std::string& path, int line) {
    Value cur = v;
    size_t start = 0;
    for (;;) {
      const size_t dot = path.find('.', start);
      const std::string part =
          path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      const bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) {
        return std::isdigit(static_cast<unsigned char>(c)) != 0;
      });
      if (numeric && cur.is_list()) {
        cur = get_item(cur, Value::from_int(std::stoll(part)), line);
      } else {
        cur = cur.is_undefined() ? cur : get_attr(cur, part, line);
      }
      if (dot == std::string::npos) return cur;
      start = dot + 1;
    }
  }

  Value apply_filter(const std::string& name, const Value& v, const CallArgs& args, int line) {
    if (name == "trim") {
      const Value* chars = args.get(0, "chars");
      std::string set = chars && chars->is_string() ? chars->text : "";
      return Value::from_string(
          py_strip(py_str(v), chars && chars->is_string() ? &set : nullptr, true, true));
    }
    if (name == "length" || name == "count") {
      switch (v.kind) {
        case Value::Kind::kUndefined:
          return Value::from_int(0);
        case Value::Kind::kString:
          return Value::from_int(static_cast<int64_t>(code_point_offsets(v.text).size()) - 1);
        case Value::Kind::kList:
          return Value::from_int(static_cast<int64_t>(v.list->size()));
        case Value::Kind::kMap:
          return Value::from_int(static_cast<int64_t>(v.map->items.size()));
        default:
          fail(line, std::string("object of type '") + type_name(v) + "' has no len()");
      }
    }
    if (name == "string") return Value::from_string(py_str(v));
    if (name == "safe") return v;
    if (name == "e" || name == "escape") {
      std::string out;
      for (char c : py_str(v)) {
        switch (c) {
          case '&':
            out += "&amp;";
            break;
          case '<':
            out += "&lt;";
            break;
          case '>':
            out += "&gt;";
            break;
          case '"':
            out += "&#34;";
            break;
          case '\'':
            out += "&#39;";
            break;
          default:
            out += c;
        }
      }
      return Value::from_string(std::move(out));
    }
    if (name == "upper" || name == "lower")
      return Value::from_string(ascii_case(py_str(v), name == "upper"));
    if (name == "capitalize") return Value::from_string(capitalize(py_str(v)));
    if (name == "title") return Value::from_string(title_case(py_str(v)));
    if (name == "replace") {
      const Value* count = args.get(2, "count");
      return Value::from_string(replace_all(py_str(v), arg_string(args, 0, "old", "replace", line),
                                            arg_string(args, 1, "new", "replace", line),
                                            count && count->is_integral() ? count->as_int() : -1));
    }
    if (name == "default" || name == "d") {
      const Value* dflt = args.get(0, "default_value");
      const Value* boolean = args.get(1, "boolean");
      const bool use_default = v.is_undefined() || (boolean && truthy(*boolean) && !truthy(v));
      if (use_default) return dflt ? *dflt : Value::from_string("");
      return v;
    }
    if (name == "tojson") {
      JsonDumpOptions o;
      if (const Value* a = args.get(0, "ensure_ascii")) o.ensure_ascii = truthy(*a);
      if (const Value* ind = args.get(1, "indent"); ind && !ind->is_none()) {
        if (ind->is_integral()) {
          o.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, ind->as_int())), ' ');
        } else if (ind->is_string()) {
          o.indent = ind->text;
        } else {
          fail(line, "tojson: indent must be an integer or a string");
        }
        o.item_separator = ",";
      }
      if (const Value* sep = args.get(2, "separators"); sep && !sep->is_none()) {
        if (!sep->is_list() || sep->list->size() != 2 || !(*sep->list)[0].is_string() ||
            !(*sep->list)[1].is_string()) {
          fail(line, "tojson: separators must be a pair of strings");
        }
        o.item_separator = (*sep->list)[0].text;
        o.key_separator = (*sep->list)[1].text;
      }
      if (const Value* sk = args.get(3, "sort_keys")) o.sort_keys = truthy(*sk);
      std::string out;
      dump_json(v, o, 0, out, line);
      return Value::from_string(std::move(out));
    }
    if (name == "abs") {
      if (v.kind == Value::Kind::kFloat) return Value::from_float(std::fabs(v.number));
      if (v.is_integral()) return Value::from_int(std::llabs(v.as_int()));
      fail(line, std::string("bad operand type for abs(): '") + type_name(v) + "'");
    }
    if (name == "int" || name == "float") {
      const Value* dflt = args.get(0, "default");
      const bool to_int = name == "int";
      if (v.is_number())
        return to_int ? Value::from_int(static_cast<int64_t>(v.as_double()))
                      : Value::from_float(v.as_double());
      if (v.is_string()) {
        const std::string t = py_strip(v.text, nullptr, true, true);
        char* end = nullptr;
        if (to_int) {
          const long long i = std::strtoll(t.c_str(), &end, 10);
          if (!t.empty() && end && *end == '\0') return Value::from_int(i);
          const double d = std::strtod(t.c_str(), &end);
          if (!t.empty() && end && *end == '\0') return Value::from_int(static_cast<int64_t>(d));
        } else {
          const double d = std::strtod(t.c_str(), &end);
          if (!t.empty() && end && *end == '\0') return Value::from_float(d);
        }
      }
      if (dflt) return *dflt;
      return to_int ? Value::from_int(0) : Value::from_float(0.0);
    }
    if (name == "round") {
      if (!v.is_number()) fail(line, "round: not a number");
      const Value* prec = args.get(0, "precision");
      const double scale =
          std::pow(10.0, prec && prec->is_integral() ? static_cast<double>(prec->as_int()) : 0.0);
      return Value::from_float(std::nearbyint(v.as_double() * scale) / scale);
    }
    if (name == "wordcount")
      return Value::from_int(
          static_cast<int64_t>(python_split(py_str(v), nullptr, -1, line).size()));
    if (name == "indent") {
      const Value* width = args.get(0, "width");
      const Value* first = args.get(1, "first");
      const Value* blank = args.get(2, "blank");
      std::string pad =
          width && width->is_string()
              ? width->text
              : std::string(width && width->is_integral()
                                ? static_cast<size_t>(std::max<int64_t>(0, width->as_int()))
                                : 4,
                            ' ');
      const std::string s = py_str(v);
      std::string out;
      size_t start = 0;
      bool first_line = true;
      for (;;) {
        const size_t nl = s.find('\n', start);
        const std::string ln =
            s.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
        const bool is_blank = py_strip(ln, nullptr, true, true).empty();
        if ((first_line ? (first && truthy(*first)) : true) &&
            (!is_blank || (blank && truthy(*blank))))
          out += pad;
        out += ln;
        if (nl == std::string::npos) break;
        out += '\n';
        start = nl + 1;
        first_line = false;
      }
      return Value::from_string(std::move(out));
    }
    if (name == "items") {
      if (v.is_undefined()) return Value::from_list({});
      if (!v.is_map()) fail(line, "items: value is not a dict");
      return call_method(v, "items", {}, line);
    }
    if (name == "dictsort") {
      if (!v.is_map()) fail(line, "dictsort: value is not a dict");
      std::vector<std::pair<std::string, Value>> items = v.map->items;
      std::stable_sort(items.begin(), items.end(),
                       [](const auto& a, const auto& b) { return a.first < b.first; });
      ValueList out;
      for (auto& [k, item] : items) {
        out.push_back(Value::from_list({Value::from_string(k), item}, /*is_tuple=*/true));
      }
      return Value::from_list(std::move(out));
    }

    // Filters over sequences.
    ValueList items = iterate(v, line);
    if (name == "list") return Value::from_list(std::move(items));
    if (name == "first" || name == "last") {
      if (items.empty()) return Value::undefined(name);
      return name == "first" ? items.front() : items.back();
    }
    if (name == "reverse") {
      if (v.is_string()) {
        std::string s;
        for (auto it = items.rbegin(); it != items.rend(); ++it) s += it->text;
        return Value::from_string(std::move(s));
      }
      std::reverse(items.begin(), items.end());
      return Value::from_list(std::move(items));
    }
    if (name == "join") {
      const Value* sep = args.get(0, "d");
      const Value* attr = args.get(1, "attribute");
      std::string out;
      for (size_t i = 0; i < items.size(); ++i) {
        if (i && sep) out += py_str(*sep);
        out += py_str(attr ? attribute_of(items[i], py_str(*attr), line) : items[i]);
      }
      return Value::from_string(std::move(out));
    }
    if (name == "select" || name == "reject") {
      const Value* test = args.get(0, "test");
      CallArgs test_args;
      test_args.positional.assign(
          args.positional.begin() + std::min<size_t>(1, args.positional.size()),
          args.positional.end());
      ValueList out;
      for (const Value& item : items) {
        const bool hit = test ? apply_test(py_str(*test), item, test_args, line) : truthy(item);
        if (hit == (name == "select")) out.push_back(item);
      }
      return Value::from_list(std::move(out));
    }
    if (name == "selectattr" || name == "rejectattr") {
      const Value* attr = args.get(0, "attribute");
      if (!attr || !attr->is_string()) fail(line, name + " needs an attribute name");
      const Value* test = args.get(1, "test");
      CallArgs test_args;
      if (args.positional.size() > 2)
        test_args.positional.assign(args.positional.begin() + 2, args.positional.end());
      ValueList out;
      for (const Value& item : items) {
        const Value field = attribute_of(item, attr->text, line);
        const bool hit = test ? apply_test(py_str(*test), field, test_args, line) : truthy(field);
        if (hit == (name == "selectattr")) out.push_back(item);
      }
      return Value::from_list(std::move(out));
    }
    if (name == "map") {
      ValueList out;
      for (const auto& [k, kv] : args.keyword) {
        if (k == "attribute") {
          const Value* dflt = nullptr;
          for (const auto& [dk, dv] : args.keyword) {
            if (dk == "default") dflt = &dv;
          }
          for (const Value& item : items) {
            Value field = attribute_of(item, py_str(kv), line);
            out.push_back(field.is_undefined() && dflt ? *dflt : field);
          }
          return Value::from_list(std::move(out));
        }
      }
      const Value* filter = args.get(0, "filter");
      if (!filter || !filter->is_string()) fail(line, "map needs a filter name or attribute=");
      if (!supported_filters().count(filter->text))
        fail(line, "unsupported filter '" + filter->text + "'");
      CallArgs rest;
      rest.positional.assign(args.positional.begin() + 1, args.positional.end());
      for (const Value& item : items) out.push_back(apply_filter(filter->text, item, rest, line));
      return Value::from_list(std::move(out));
    }
    if (name == "unique") {
      ValueList out;
      for (const Value& item : items) {
        if (std::none_of(out.begin(), out.end(),
                         [&](const Value& o) { return values_equal(o, item); })) {
          out.push_back(item);
        }
      }
      return Value::from_list(std::move(out));
    }
    if (name == "sort" || name == "min" || name == "max") {
      const Value* reverse = name == "sort" ? args.get(0, "reverse") : nullptr;
      const Value* attr = args.get(name == "sort" ? 2 : 1, "attribute");
      auto key = [&](const Value& item) {
        return attr ? attribute_of(item, py_str(*attr), line) : item;
      };
      std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
        return compare_values(key(a), key(b), "<", line) < 0;
      });
      if (name == "min") return items.empty() ? Value::undefined("min") : items.front();
      if (name == "max") return items.empty() ? Value::undefined("max") : items.back();
      if (reverse && truthy(*reverse)) std::reverse(items.begin(), items.end());
      return Value::from_list(std::move(items));
    }
    if (name == "sum") {
      Value acc = Value::from_int(0);
      const Value* attr = args.get(0, "attribute");
      for (const Value& item : items)
        acc = binary(Op::kAdd, acc, attr ? attribute_of(item, py_str(*attr), line) : item, line);
      return acc;
    }
    fail(line, "unsupported filter '" + name + "'");
  }

  bool apply_test(const std::string& name, const Value& v, const CallArgs& args, int line) {
    auto arg = [&]() -> const Value& {
      const Value* a = args.get(0, "other");
      if (!a) fail(line, "test '" + name + "' needs an argument");
      return *a;
    };
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return v.is_none();
    if (name == "boolean") return v.kind == Value::Kind::kBool;
    if (name == "true") return v.kind == Value::Kind::kBool && v.boolean;
    if (name == "false") return v.kind == Value::Kind::kBool && !v.boolean;
    if (name == "integer") return v.kind == Value::Kind::kInt;
    if (name == "float") return v.kind == Value::Kind::kFloat;
    if (name == "number") return v.is_number();
    if (name == "string") return v.is_string();
    if (name == "mapping") return v.is_map() && !v.map->is_namespace;
    if (name == "iterable")
      return v.is_string() || v.is_list() || (v.is_map() && !v.map->is_namespace);
    if (name == "sequence")
      return v.is_string() || v.is_list() || (v.is_map() && !v.map->is_namespace);
    if (name == "callable") return v.kind == Value::Kind::kCallable;
    if (name == "escaped") return false;
    if (name == "lower" || name == "upper") {
      return v.is_string() && ascii_case(v.text, name == "upper") == v.text;
    }
    if (name == "even" || name == "odd" || name == "divisibleby") {
      if (!v.is_integral()) fail(line, "test '" + name + "' needs an integer");
      const int64_t d = name == "divisibleby" ? (arg().is_integral() ? arg().as_int() : 0) : 2;
      if (d == 0) fail(line, "divisibleby: divisor must be a non-zero integer");
      const bool divisible = v.as_int() % d == 0;
      return name == "odd" ? !divisible : divisible;
    }
    if (name == "eq" || name == "equalto" || name == "==") return values_equal(v, arg());
    if (name == "ne" || name == "!=") return !values_equal(v, arg());
    if (name == "lt" || name == "lessthan" || name == "<")
      return compare_values(v, arg(), "<", line) < 0;
    if (name == "le" || name == "<=") return compare_values(v, arg(), "<=", line) <= 0;
    if (name == "gt" || name == "greaterthan" || name == ">")
      return compare_values(v, arg(), ">", line) > 0;
    if (name == "ge" || name == ">=") return compare_values(v, arg(), ">=", line) >= 0;
    if (name == "in") return contains(arg(), v, line);
    if (name == "sameas") {
      const Value& o = arg();
      if (v.kind != o.kind) return false;
      if (v.is_none() || v.is_undefined()) return true;
      if (v.kind == Value::Kind::kBool) return v.boolean == o.boolean;
      if (v.is_map()) return v.map == o.map;
      if (v.is_list()) return v.list == o.list;
      return values_equal(v, o);
    }
    fail(line, "unsupported test '" + name + "'");
  }

  const Scope& globals_;
  std::vector<std::shared_ptr<Scope>> scopes_;
  std::string* out_ = nullptr;
  bool break_ = false;
  bool continue_ = false;
  int depth_ = 0;
};

const Scope& builtin_globals() {
  static const Scope globals = [] {
    Scope g;
    auto add = [&](const char* name, Builtin b) {
      Callable c;
      c.name = name;
      c.builtin = b;
      g.emplace(name, Value::from_callable(std::move(c)));
    };
    add("raise_exception", Builtin::kRaiseException);
    add("namespace", Builtin::kNamespace);
    add("range", Builtin::kRange);
    add("strftime_now", Builtin::kStrftimeNow);
    add("dict", Builtin::kDict);
    return g;
  }();
  return globals;
}

// ------------------------------------------------------------------------------------------------
// Built-in templates (our own, equivalent to the public model templates they are named after;
// tests/chat compares them with HF renders of those templates)
// ------------------------------------------------------------------------------------------------

// Llama-2-chat: the system prompt goes into the first user turn inside <<SYS>> markers.
constexpr const char* kLlama2Template = R"JINJA(
{%- if messages[0]['role'] == 'system' -%}
  {%- set system_message = messages[0]['content'] -%}
  {%- set loop_messages = messages[1:] -%}
{%- else -%}
  {%- set system_message = none -%}
  {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
  {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
    {{- raise_exception('llama2 template: after an optional system message, roles must alternate user/assistant/user/...') -}}
  {%- endif -%}
  {%- set content = message['content'] -%}
  {%- if loop.first and system_message is not none -%}
    {%- set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + content -%}
  {%- endif -%}
  {%- if message['role'] == 'user' -%}
    {{- bos_token + '[INST] ' + content | trim + ' [/INST]' -}}
  {%- else -%}
    {{- ' ' + content | trim + ' ' + eos_token -}}
  {%- endif -%}
{%- endfor -%}
)JINJA";

// Llama-3-Instruct: header-delimited turns closed by <|eot_id|>.
constexpr const char* kLlama3Template = R"JINJA(
{%- for message in messages -%}
  {%- if loop.first -%}{{- bos_token -}}{%- endif -%}
  {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
{%- endif -%}
)JINJA";

// Mistral-Instruct v0.1/v0.2 layout; a leading system message is folded into the first user turn.
constexpr const char* kMistralTemplate = R"JINJA(
{%- if messages[0]['role'] == 'system' -%}
  {%- set system_message = messages[0]['content'] -%}
  {%- set loop_messages = messages[1:] -%}
{%- else -%}
  {%- set system_message = none -%}
  {%- set loop_messages = messages -%}
{%- endif -%}
{{- bos_token -}}
{%- for message in loop_messages -%}
  {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
    {{- raise_exception('mistral template: after an optional system message, roles must alternate user/assistant/user/...') -}}
  {%- endif -%}
  {%- if message['role'] == 'user' -%}
    {%- if loop.first and system_message is not none -%}
      {{- '[INST] ' + system_message + '\n\n' + message['content'] + ' [/INST]' -}}
    {%- else -%}
      {{- '[INST] ' + message['content'] + ' [/INST]' -}}
    {%- endif -%}
  {%- else -%}
    {{- message['content'] + eos_token -}}
  {%- endif -%}
{%- endfor -%}
)JINJA";

// ChatML (Qwen2 and many others), without an implicit default system prompt.
constexpr const char* kChatmlTemplate = R"JINJA(
{%- for message in messages -%}
  {{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|im_start|>assistant\n' -}}
{%- endif -%}
)JINJA";

const std::vector<std::pair<std::string, const char*>>& builtin_templates() {
  static const std::vector<std::pair<std::string, const char*>> t = {{"llama2", kLlama2Template},
                                                                     {"llama3", kLlama3Template},
                                                                     {"mistral", kMistralTemplate},
                                                                     {"chatml", kChatmlTemplate}};
  return t;
}

std::string special_token_text(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string()) {
    return j["content"].get<std::string>();
  }
  return "";
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// Public API
// ------------------------------------------------------------------------------------------------

struct ChatTemplateProgram {
  std::string name;
  NodeList nodes;
};

ChatTemplate::ChatTemplate(std::unique_ptr<ChatTemplateProgram> program)
    : program_(std::move(program)) {}
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;
ChatTemplate::~ChatTemplate() = default;

const std::string& ChatTemplate::name() const {
  return program_->name;
}

static std::string format_template_error(const std::string& name, const TemplateError& e) {
  if (e.line > 0) return name + " line " + std::to_string(e.line) + ": " + e.message;
  return name + ": " + e.message;
}

Result<ChatTemplate> ChatTemplate::parse(std::string_view source, std::string name) {
  auto program = std::make_unique<ChatTemplateProgram>();
  program->name = std::move(name);
  try {
    program->nodes = TemplateParser(scan_template(source)).parse();
  } catch (const TemplateError& e) {
    return make_error(format_template_error(program->name, e));
  }
  return ChatTemplate(std::move(program));
}

Result<ChatTemplate> ChatTemplate::builtin(std::string_view name) {
  for (const auto& [n, text] : builtin_templates()) {
    if (n == name) return parse(text, "built-in chat template '" + n + "'");
  }
  std::string known;
  for (const auto& n : builtin_names()) known += (known.empty() ? "" : ", ") + n;
  return make_error("unknown built-in chat template '" + std::string(name) + "' (known: " + known +
                    ")");
}

std::vector<std::string> ChatTemplate::builtin_names() {
  std::vector<std::string> names;
  for (const auto& [n, text] : builtin_templates()) names.push_back(n);
  return names;
}

Result<std::string> ChatTemplate::render(const nlohmann::ordered_json& messages,
                                         const ChatRenderOptions& options) const {
  return render(messages, options, nlohmann::ordered_json::object());
}

Result<std::string> ChatTemplate::render(const nlohmann::ordered_json& messages,
                                         const ChatRenderOptions& options,
                                         const nlohmann::ordered_json& extra) const {
  if (!messages.is_array()) return make_error(program_->name + ": messages must be a JSON array");
  if (!extra.is_object())
    return make_error(program_->name + ": extra variables must be a JSON object");
  auto root = std::make_shared<Scope>();
  root->emplace("messages", json_to_value(messages));
  root->emplace("bos_token", Value::from_string(options.bos_token));
  root->emplace("eos_token", Value::from_string(options.eos_token));
  root->emplace("add_generation_prompt", Value::from_bool(options.add_generation_prompt));
  root->emplace("tools", Value::none());
  root->emplace("documents", Value::none());
  for (const auto& [k, v] : extra.items()) root->insert_or_assign(k, json_to_value(v));
  std::string out;
  try {
    Renderer(root, builtin_globals()).render(program_->nodes, out);
  } catch (const TemplateError& e) {
    return make_error(format_template_error(program_->name, e));
  }
  return out;
}

Result<ModelChatTemplate> parse_tokenizer_config_chat_template(const std::string& json_text,
                                                               const std::string& source) {
  json cfg = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (cfg.is_discarded() || !cfg.is_object())
    return make_error(source + ": not a valid JSON object");
  ModelChatTemplate out;
  out.origin = source;
  if (cfg.contains("bos_token")) out.bos_token = special_token_text(cfg["bos_token"]);
  if (cfg.contains("eos_token")) out.eos_token = special_token_text(cfg["eos_token"]);
  if (!cfg.contains("chat_template") || cfg["chat_template"].is_null()) return out;
  const json& t = cfg["chat_template"];
  if (t.is_string()) {
    out.source = t.get<std::string>();
    return out;
  }
  if (t.is_array()) {
    for (const json& entry : t) {
      if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
          entry["template"].is_string()) {
        out.source = entry["template"].get<std::string>();
        out.origin = source + " (chat_template 'default')";
        return out;
      }
    }
    return make_error(source +
                      ": chat_template is a list of named templates without a 'default' entry");
  }
  return make_error(source + ": chat_template must be a string or a list of {name, template}");
}

Result<ModelChatTemplate> load_model_chat_template(const std::filesystem::path& dir) {
  auto read = [](const std::filesystem::path& p) -> std::optional<std::string> {
    std::ifstream in(p, std::ios::binary);
    if (!in) return std::nullopt;
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  ModelChatTemplate out;
  std::error_code ec;
  const auto cfg_path = dir / "tokenizer_config.json";
  if (std::filesystem::exists(cfg_path, ec)) {
    auto text = read(cfg_path);
    if (!text) return make_error(cfg_path.string() + ": cannot read");
    QS_ASSIGN_OR_RETURN(out, parse_tokenizer_config_chat_template(*text, cfg_path.string()));
  }
  const auto jinja_path = dir / "chat_template.jinja";
  if (std::filesystem::exists(jinja_path, ec)) {
    auto text = read(jinja_path);
    if (!text) return make_error(jinja_path.string() + ": cannot read");
    out.source = std::move(*text);
    out.origin = jinja_path.string();
  }
  return out;
}

}  // namespace qs
