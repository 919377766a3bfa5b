// Chat-template values: UTF-8 helpers and Python value semantics (str, repr, json.dumps, ==, <).
#include "model/chat_template_value.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <limits>
#include <set>
#include <sstream>
#include <unordered_map>
#include <utility>

namespace qs::chat_template_internal {

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


}  // namespace qs::chat_template_internal
