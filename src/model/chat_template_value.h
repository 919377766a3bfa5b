// Chat-template internals shared by the scanner, parser and renderer: the error type, limits,
// UTF-8 helpers and the Python-semantics Value with str() / repr() / json.dumps / comparisons.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace qs::chat_template_internal {

using json = nlohmann::ordered_json;

constexpr size_t kMaxOutputBytes = size_t{16} << 20;  // a runaway template fails instead of OOM
constexpr int kMaxDepth = 256;                        // nested evaluation / macro calls
constexpr int64_t kMaxRange = 1'000'000;              // largest range() a template may build

struct TemplateError {
  std::string message;
  int line = 0;  // 0: unknown
};

[[noreturn]] void fail(int line, std::string message);

// ------------------------------------------------------------------------------------------------
// UTF-8 helpers (Python strings count code points; defined in chat_template_value.cpp)
// ------------------------------------------------------------------------------------------------

size_t utf8_seq_len(unsigned char lead);
std::vector<size_t> code_point_offsets(const std::string& s);
uint32_t decode_code_point(const std::string& s, size_t i, size_t* len);
bool is_python_space(uint32_t cp);
std::string py_strip(const std::string& s, const std::string* chars, bool left, bool right);
bool is_ascii_space(char c);
void append_utf8(std::string& out, uint32_t cp);

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

const char* type_name(const Value& v);
std::string undefined_message(const Value& v);
bool truthy(const Value& v);
std::string py_float_repr(double x);
std::string py_repr_string(const std::string& s);
std::string py_str(const Value& v);
std::string py_repr(const Value& v);

// Python json.dumps(value, ensure_ascii, indent, separators, sort_keys), as HF's tojson.
struct JsonDumpOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;  // nullopt: single line
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
};

void dump_json_string(const std::string& s, bool ensure_ascii, std::string& out);
void dump_json(const Value& v, const JsonDumpOptions& o, int level, std::string& out, int line);
bool values_equal(const Value& a, const Value& b);
int compare_values(const Value& a, const Value& b, const char* op, int line);
Value json_to_value(const json& j);

}  // namespace qs::chat_template_internal
