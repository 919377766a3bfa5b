#include "engine/json_schema.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <span>
#include <utility>

#include "engine/json_formats.h"

namespace qs {

namespace {

// nlohmann's ordered object keeps the properties in the order the schema gives them.
using Schema = nlohmann::ordered_json;

constexpr size_t kMaxNodes = 20000;

// A schema number times kJsonUnit, rounded down and up (equal when it is a whole number of units).
struct Scaled {
  JsonScaled floor = 0, ceil = 0;
};

// Exact for the number as the schema wrote it: a double is taken as its shortest decimal text
// (0.1 is 0.1, not the binary fraction nearest to it). |v| <= kJsonMaxBound.
Scaled scaled(const Schema& v) {
  if (v.is_number_integer()) {
    const JsonScaled x =
        v.is_number_unsigned() ? JsonScaled{v.get<uint64_t>()} : JsonScaled{v.get<int64_t>()};
    return {x * kJsonUnit, x * kJsonUnit};
  }
  const std::string text = fmt::format("{}", v.get<double>());  // [-]digits[.digits][e[+-]n]
  JsonScaled digits = 0;
  int exponent = kJsonUnitDigits;  // the power of ten `digits` is multiplied by, in units
  bool fraction = false;
  size_t i = text[0] == '-' ? 1 : 0;
  for (; i < text.size() && text[i] != 'e'; ++i) {
    if (text[i] == '.') {
      fraction = true;
    } else {
      digits = digits * 10 + (text[i] - '0');
      exponent -= fraction ? 1 : 0;
    }
  }
  if (i < text.size()) exponent += std::stoi(text.substr(i + 1));
  JsonScaled q = digits;
  bool exact = true;
  for (; exponent > 0; --exponent) q *= 10;
  if (exponent < -30) {  // far below one unit
    exact = q == 0;
    q = 0;
  } else if (exponent < 0) {
    JsonScaled d = 1;
    for (; exponent < 0; ++exponent) d *= 10;
    exact = q % d == 0;
    q /= d;
  }
  if (text[0] == '-') return {-(q + (exact ? 0 : 1)), -q};
  return {q, q + (exact ? 0 : 1)};
}

// Whether the number v is a multiple of the (positive) number m, exactly as written.
bool is_multiple_of(const Schema& v, const Schema& m) {
  const auto within = [](const Schema& x) {
    return std::abs(x.get<double>()) <= static_cast<double>(kJsonMaxBound);
  };
  if (!within(v) || !within(m)) return false;
  const Scaled a = scaled(v), b = scaled(m);
  return a.floor == a.ceil && b.floor == b.ceil && b.floor > 0 && a.floor % b.floor == 0;
}

constexpr size_t kMaxLiteralBytes = size_t{1} << 20;
constexpr int kMaxDepth = 128;
constexpr int64_t kMaxLength = 65535;  // JsonThread counts a string's characters in 16 bits

// Assertions this engine does not enforce: a schema using one is refused rather than followed
// loosely.
const std::set<std::string, std::less<>> kUnsupported = {
    "patternProperties",
    "dependentRequired",
    "dependentSchemas",
    "dependencies",
    "contains",
    "minContains",
    "maxContains",
    "additionalItems",
    "unevaluatedProperties",
    "unevaluatedItems",
    "not",
    "if",
    "then",
    "else",
    "$dynamicRef",
    "$recursiveRef",
};
const char* const kObjectWords[] = {"properties",    "required",      "additionalProperties",
                                    "propertyNames", "minProperties", "maxProperties"};
const char* const kArrayWords[] = {"items", "prefixItems", "minItems", "maxItems", "uniqueItems"};
const char* const kStringWords[] = {"minLength", "maxLength", "pattern"};
const char* const kBoundWords[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
const char* const kNumberWords[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                                    "multipleOf"};
// Keywords that constrain a value: beside $ref, anyOf, oneOf and allOf they are refused (this
// compiler does not intersect schemas).
const char* const kConstraints[] = {"type",
                                    "enum",
                                    "const",
                                    "properties",
                                    "required",
                                    "additionalProperties",
                                    "propertyNames",
                                    "minProperties",
                                    "maxProperties",
                                    "items",
                                    "prefixItems",
                                    "minItems",
                                    "maxItems",
                                    "uniqueItems",
                                    "minLength",
                                    "maxLength",
                                    "minimum",
                                    "maximum",
                                    "exclusiveMinimum",
                                    "exclusiveMaximum",
                                    "multipleOf"};

bool has_any(const Schema& s, std::span<const char* const> words) {
  return std::any_of(words.begin(), words.end(), [&](const char* w) { return s.contains(w); });
}

std::string type_name(const Schema& v) {
  return v.is_number_integer() ? "integer" : v.type_name();
}

std::string escape_pointer(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

class JsonSchemaCompiler {
 public:
  explicit JsonSchemaCompiler(const Schema& doc) : doc_(doc) {}

  Result<JsonGrammar> run() {
    QS_ASSIGN_OR_RETURN(g_.root_, compile(doc_, "#", 0));
    QS_TRY(flatten_unions());
    QS_TRY(resolve_unique_items());
    prune_unproducible();
    if (!producible_[static_cast<size_t>(g_.root_)]) {
      return make_error("json_schema: the schema accepts no value");
    }
    build_key_tries();
    return std::move(g_);
  }

 private:
  Error error_at(const std::string& at, const std::string& what) const {
    return make_error(fmt::format("json_schema at '{}': {}", at, what));
  }

  Result<int32_t> new_node(const std::string& at) {
    if (g_.nodes_.size() >= kMaxNodes) {
      return error_at(at, fmt::format("the schema needs more than {} nodes", kMaxNodes));
    }
    g_.nodes_.emplace_back();
    where_.push_back(at);
    return static_cast<int32_t>(g_.nodes_.size() - 1);
  }
  JsonNode& node(int32_t id) { return g_.nodes_[static_cast<size_t>(id)]; }

  int32_t new_trie() {
    g_.tries_.emplace_back();
    return static_cast<int32_t>(g_.tries_.size() - 1);
  }
  // Adds `text` to the trie at `root` with `value` at its end.
  void insert(int32_t root, std::string_view text, int32_t value) {
    int32_t at = root;
    g_.tries_[static_cast<size_t>(at)].below.push_back(value);
    for (char ch : text) {
      const auto c = static_cast<uint8_t>(ch);
      int32_t next = g_.child(at, c);
      if (next < 0) {
        next = new_trie();
        g_.tries_[static_cast<size_t>(at)].edges.emplace_back(c, next);
      }
      at = next;
      g_.tries_[static_cast<size_t>(at)].below.push_back(value);
    }
    g_.tries_[static_cast<size_t>(at)].value = value;
  }

  // Node `id` becomes one of the literal texts `texts`.
  Status fill_literals(int32_t id, const std::vector<std::string>& texts, const std::string& at) {
    const int32_t root = new_trie();
    node(id).kind = JsonNode::Kind::kLiterals;
    node(id).trie = root;
    std::set<std::string_view> seen;
    for (const std::string& t : texts) {
      literal_bytes_ += t.size();
      if (literal_bytes_ > kMaxLiteralBytes) {
        return error_at(at,
                        fmt::format("the enum and const values exceed {} bytes", kMaxLiteralBytes));
      }
      if (seen.insert(t).second) insert(root, t, static_cast<int32_t>(seen.size() - 1));
    }
    return Status::ok_status();
  }

  // Any JSON value (made once).
  Result<int32_t> any() {
    if (any_ >= 0) return any_;
    QS_ASSIGN_OR_RETURN(any_, new_node("#"));
    QS_ASSIGN_OR_RETURN(const int32_t object, new_node("#"));
    node(object).kind = JsonNode::Kind::kObject;
    node(object).additional = any_;
    QS_ASSIGN_OR_RETURN(const int32_t array, new_node("#"));
    node(array).kind = JsonNode::Kind::kArray;
    node(array).items = any_;
    QS_ASSIGN_OR_RETURN(const int32_t string, new_node("#"));
    node(string).kind = JsonNode::Kind::kString;
    QS_ASSIGN_OR_RETURN(const int32_t number, new_node("#"));
    node(number).kind = JsonNode::Kind::kNumber;
    QS_ASSIGN_OR_RETURN(const int32_t words, new_node("#"));
    QS_TRY(fill_literals(words, {"true", "false", "null"}, "#"));
    node(any_).alternatives = {object, array, string, number, words};
    return any_;
  }

  // A schema's node. Each schema object gets its node before its subschemas are compiled, so a
  // $ref back to it (recursion) finds it.
  Result<int32_t> compile(const Schema& s, const std::string& at, int depth) {
    if (depth > kMaxDepth) return error_at(at, fmt::format("nested deeper than {}", kMaxDepth));
    if (s.is_boolean()) {
      if (s.get<bool>()) return any();
      QS_ASSIGN_OR_RETURN(const int32_t never, new_node(at));  // a union of nothing
      return never;
    }
    if (!s.is_object()) {
      return error_at(at, "a schema must be an object or a boolean, got " + type_name(s));
    }
    if (auto it = memo_.find(&s); it != memo_.end()) return it->second;
    QS_ASSIGN_OR_RETURN(const int32_t id, new_node(at));
    memo_[&s] = id;
    for (const auto& [key, value] : s.items()) {
      (void)value;
      if (kUnsupported.count(key)) {
        return error_at(at, fmt::format("'{}' is not supported", key));
      }
    }
    QS_TRY(fill(id, s, at, depth));
    return id;
  }

  Status fill(int32_t id, const Schema& s, const std::string& at, int depth) {
    for (const char* combinator : {"$ref", "anyOf", "oneOf", "allOf"}) {
      if (!s.contains(combinator)) continue;
      if (has_any(s, kConstraints)) {
        return error_at(at, fmt::format("'{}' beside other constraints (type, properties, ...) "
                                        "is not supported",
                                        combinator));
      }
      QS_ASSIGN_OR_RETURN(std::vector<int32_t> alts,
                          combined(s, combinator, at + "/" + combinator, depth));
      node(id).alternatives = std::move(alts);  // a union: flatten_unions resolves it
      return Status::ok_status();
    }
    if (s.contains("enum") || s.contains("const")) return fill_enum(id, s, at);
    QS_ASSIGN_OR_RETURN(const std::vector<std::string> types, types_of(s, at));
    if (types.empty()) {
      QS_ASSIGN_OR_RETURN(const int32_t all, any());
      node(id).alternatives = {all};
      return Status::ok_status();
    }
    if (types.size() == 1) return fill_typed(id, s, types[0], at, depth);
    std::vector<int32_t> alts;
    for (const std::string& t : types) {
      QS_ASSIGN_OR_RETURN(const int32_t alt, new_node(at));
      QS_TRY(fill_typed(alt, s, t, at, depth));
      alts.push_back(alt);
    }
    node(id).alternatives = std::move(alts);
    return Status::ok_status();
  }

  Result<std::vector<int32_t>> combined(const Schema& s, const std::string& word,
                                        const std::string& at, int depth) {
    const Schema& v = s[word];
    if (word == "$ref") {
      if (!v.is_string()) return error_at(at, "'$ref' must be a string");
      QS_ASSIGN_OR_RETURN(const Schema* target, resolve(v.get<std::string>(), at));
      QS_ASSIGN_OR_RETURN(const int32_t t, compile(*target, v.get<std::string>(), depth + 1));
      return std::vector<int32_t>{t};
    }
    if (!v.is_array() || v.empty()) {
      return error_at(at, fmt::format("'{}' must be a non-empty array of schemas", word));
    }
    if (word == "allOf" && v.size() != 1) {
      return error_at(at, "'allOf' of more than one schema is not supported");
    }
    std::vector<int32_t> alts;
    for (size_t i = 0; i < v.size(); ++i) {
      QS_ASSIGN_OR_RETURN(const int32_t a, compile(v[i], fmt::format("{}/{}", at, i), depth + 1));
      alts.push_back(a);
    }
    return alts;
  }

  // "#", "#/$defs/name", any JSON pointer into the document.
  Result<const Schema*> resolve(const std::string& ref, const std::string& at) {
    if (ref.empty() || ref[0] != '#') {
      return error_at(at, fmt::format("'$ref' \"{}\" is not supported: only references inside "
                                      "the schema (\"#...\")",
                                      ref));
    }
    if (ref == "#") return &doc_;
    try {
      const Schema& target = doc_.at(Schema::json_pointer(ref.substr(1)));
      return &target;
    } catch (const Schema::exception&) {
      return error_at(at, fmt::format("'$ref' \"{}\" names nothing in the schema", ref));
    }
  }

  Status fill_enum(int32_t id, const Schema& s, const std::string& at) {
    std::vector<Schema> values;
    if (s.contains("const")) values.push_back(s["const"]);
    if (s.contains("enum")) {
      if (!s["enum"].is_array()) return error_at(at, "'enum' must be an array");
      for (const Schema& v : s["enum"]) {
        if (!s.contains("const") || v == s["const"]) values.push_back(v);
      }
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      QS_ASSIGN_OR_RETURN(types, types_of(s, at));
    }
    QS_ASSIGN_OR_RETURN(const std::optional<JsonPattern> pattern, pattern_of(s, at));
    std::vector<std::string> texts;
    for (const Schema& v : values) {
      const std::string t = type_name(v);
      const bool typed =
          types.empty() || std::any_of(types.begin(), types.end(), [&](const std::string& want) {
            return want == t || (want == "number" && v.is_number());
          });
      // Bounds beside an enum hold for its numbers too.
      const auto num = [&](const char* w) {
        return s.contains(w) && s[w].is_number() && v.is_number();
      };
      const bool outside = (num("minimum") && v < s["minimum"]) ||
                           (num("maximum") && v > s["maximum"]) ||
                           (num("exclusiveMinimum") && v <= s["exclusiveMinimum"]) ||
                           (num("exclusiveMaximum") && v >= s["exclusiveMaximum"]) ||
                           (num("multipleOf") && !is_multiple_of(v, s["multipleOf"]));
      const bool unmatched = pattern && v.is_string() && !pattern->matches(v.get<std::string>());
      if (typed && !outside && !unmatched) texts.push_back(v.dump());
    }
    return fill_literals(id, texts, at);
  }

  Result<std::vector<std::string>> types_of(const Schema& s, const std::string& at) {
    static const std::set<std::string, std::less<>> kNames = {
        "object", "array", "string", "number", "integer", "boolean", "null"};
    // Every value (a number's type takes the integers).
    static const std::vector<std::string> kTypes = {"object", "array",   "string",
                                                    "number", "boolean", "null"};
    std::vector<std::string> types;
    if (!s.contains("type")) {
      if (has_any(s, kObjectWords)) return std::vector<std::string>{"object"};
      if (has_any(s, kArrayWords)) return std::vector<std::string>{"array"};
      if (has_any(s, kStringWords)) return std::vector<std::string>{"string"};
      if (has_any(s, kNumberWords)) return std::vector<std::string>{"number"};
      // Any value, with a string in its format.
      if (format_of(s).pattern) return kTypes;
      return types;  // any value
    }
    const Schema& t = s["type"];
    if (t.is_string()) {
      types.push_back(t.get<std::string>());
    } else if (t.is_array() && !t.empty()) {
      for (const Schema& e : t) {
        if (!e.is_string()) return error_at(at, "'type' must be a name or a list of names");
        types.push_back(e.get<std::string>());
      }
    } else {
      return error_at(at, "'type' must be a name or a non-empty list of names");
    }
    for (const std::string& name : types) {
      if (!kNames.count(name)) return error_at(at, fmt::format("unknown type \"{}\"", name));
    }
    return types;
  }

  // The schema's "format" where it is one followed (json_formats.h); other formats, and a
  // "format" that is not a string, are annotations.
  static JsonFormat format_of(const Schema& s) {
    if (!s.contains("format") || !s["format"].is_string()) return {};
    return json_format(s["format"].get<std::string>());
  }

  // The automaton of the strings the schema's "pattern" and "format" both admit (none when it
  // has neither).
  Result<std::optional<JsonPattern>> pattern_of(const Schema& s, const std::string& at) {
    std::optional<JsonPattern> pattern;
    if (s.contains("pattern")) {
      if (!s["pattern"].is_string()) return error_at(at, "'pattern' must be a string");
      auto p = JsonPattern::compile(s["pattern"].get<std::string>());
      if (!p.ok()) return error_at(at + "/pattern", p.error().message);
      pattern = std::move(p).value();
    }
    const JsonFormat format = format_of(s);
    if (format.pattern && !pattern) return std::optional<JsonPattern>(*format.pattern);
    if (format.pattern) {
      auto both = JsonPattern::intersect(*pattern, *format.pattern);
      if (!both.ok()) return error_at(at, both.error().message + " ('pattern' with 'format')");
      pattern = std::move(both).value();
    }
    return pattern;
  }

  // A bound keyword's value: -1 when absent.
  Result<int32_t> bound(const Schema& s, const char* word, int64_t most, const std::string& at) {
    if (!s.contains(word)) return -1;
    const Schema& v = s[word];
    if (!v.is_number_integer() || v.get<int64_t>() < 0) {
      return error_at(at, fmt::format("'{}' must be a non-negative integer", word));
    }
    if (v.get<int64_t>() > most) {
      return error_at(at, fmt::format("'{}' above {} is not supported", word, most));
    }
    return static_cast<int32_t>(v.get<int64_t>());
  }

  Status fill_typed(int32_t id, const Schema& s, const std::string& type, const std::string& at,
                    int depth) {
    using Kind = JsonNode::Kind;
    if (type == "boolean") return fill_literals(id, {"true", "false"}, at);
    if (type == "null") return fill_literals(id, {"null"}, at);
    if (type == "number" || type == "integer") return fill_number(id, s, type == "integer", at);
    if (type == "string") {
      QS_ASSIGN_OR_RETURN(const int32_t lo, bound(s, "minLength", kMaxLength, at));
      QS_ASSIGN_OR_RETURN(int32_t hi, bound(s, "maxLength", kMaxLength, at));
      const int format_max = format_of(s).max_length;  // the format's own bound, if any
      if (format_max >= 0) hi = hi < 0 ? format_max : std::min(hi, format_max);
      QS_ASSIGN_OR_RETURN(std::optional<JsonPattern> pattern, pattern_of(s, at));
      node(id).kind = Kind::kString;
      node(id).min_length = std::max(lo, 0);
      node(id).max_length = hi;
      if (pattern && (lo > 0 || hi >= 0)) {  // the bounds and the pattern followed together
        auto lengths = PatternLengths::build(*pattern, std::max(lo, 0), hi);
        if (!lengths.ok()) return error_at(at, lengths.error().message);
        node(id).lengths = static_cast<int32_t>(g_.lengths_.size());
        g_.lengths_.push_back(std::move(lengths).value());
      }
      if (pattern) {
        node(id).pattern = static_cast<int32_t>(g_.patterns_.size());
        g_.patterns_.push_back(std::move(*pattern));
      }
      return Status::ok_status();
    }
    if (type == "array") return fill_array(id, s, at, depth);
    return fill_object(id, s, at, depth);
  }

  // A number's or an integer's bounds, inclusive, in units: minimum and exclusiveMinimum (a
  // number, as JSON Schema 2020-12 and OpenAPI 3.1 write it) both count, the tighter wins.
  Status fill_number(int32_t id, const Schema& s, bool integer, const std::string& at) {
    JsonNode& n = node(id);
    n.kind = integer ? JsonNode::Kind::kInteger : JsonNode::Kind::kNumber;
    QS_ASSIGN_OR_RETURN(n.multiple, multiple_units(s, integer, at));
    // The values a bound is rounded to
    const JsonScaled step = n.multiple != 0 ? n.multiple : integer ? kJsonUnit : 1;
    if (n.multiple != 0) {  // bounded, so that the value is tracked exactly
      n.minimum = -JsonScaled{kJsonMaxBound} * kJsonUnit;
      n.maximum = JsonScaled{kJsonMaxBound} * kJsonUnit;
    }
    for (const char* word : kBoundWords) {
      if (!s.contains(word)) continue;
      const Schema& v = s[word];
      if (!v.is_number()) {
        return error_at(at, fmt::format("'{}' must be a number (the boolean form of draft 4 is "
                                        "not supported)",
                                        word));
      }
      if (!(std::abs(v.get<double>()) <= static_cast<double>(kJsonMaxBound))) {
        return error_at(at, fmt::format("'{}' beyond 1e18 is not supported", word));
      }
      const Scaled x = scaled(v);
      const std::string_view w = word;
      if (w == "minimum") n.minimum = std::max(n.minimum, json_ceil_div(x.ceil, step) * step);
      if (w == "exclusiveMinimum") {
        n.minimum = std::max(n.minimum, (json_floor_div(x.floor, step) + 1) * step);
      }
      if (w == "maximum") n.maximum = std::min(n.maximum, json_floor_div(x.floor, step) * step);
      if (w == "exclusiveMaximum") {
        n.maximum = std::min(n.maximum, (json_ceil_div(x.ceil, step) - 1) * step);
      }
    }
    if (n.multiple != 0) {  // the implicit bounds too
      n.minimum = json_ceil_div(n.minimum, step) * step;
      n.maximum = json_floor_div(n.maximum, step) * step;
    }
    return Status::ok_status();
  }

  // multipleOf in units (0: none); an integer's is the least common multiple with kJsonUnit.
  Result<JsonScaled> multiple_units(const Schema& s, bool integer, const std::string& at) const {
    if (!s.contains("multipleOf")) return JsonScaled{0};
    const Schema& v = s["multipleOf"];
    if (!v.is_number() || !(v.get<double>() > 0)) {
      return error_at(at, "'multipleOf' must be a number greater than 0");
    }
    if (!(v.get<double>() <= static_cast<double>(kJsonMaxBound))) {
      return error_at(at, "'multipleOf' beyond 1e18 is not supported");
    }
    const Scaled x = scaled(v);
    if (x.floor != x.ceil || x.floor == 0) {
      return error_at(at, fmt::format("'multipleOf' with more than {} decimal places is not "
                                      "supported",
                                      kJsonUnitDigits));
    }
    if (!integer) return x.floor;
    JsonScaled a = x.floor, b = kJsonUnit;  // gcd
    while (b != 0) a = std::exchange(b, a % b);
    return x.floor / a * kJsonUnit;
  }

  Status fill_array(int32_t id, const Schema& s, const std::string& at, int depth) {
    QS_ASSIGN_OR_RETURN(const int32_t lo,
                        bound(s, "minItems", std::numeric_limits<int32_t>::max(), at));
    QS_ASSIGN_OR_RETURN(const int32_t hi,
                        bound(s, "maxItems", std::numeric_limits<int32_t>::max(), at));
    std::vector<int32_t> prefix;  // a tuple's items (2020-12's prefixItems)
    if (s.contains("prefixItems")) {
      const Schema& list = s["prefixItems"];
      if (!list.is_array()) return error_at(at, "'prefixItems' must be an array of schemas");
      for (size_t i = 0; i < list.size(); ++i) {
        QS_ASSIGN_OR_RETURN(const int32_t item,
                            compile(list[i], fmt::format("{}/prefixItems/{}", at, i), depth + 1));
        prefix.push_back(item);
      }
    }
    int32_t items = -1;
    if (!s.contains("items")) {
      QS_ASSIGN_OR_RETURN(items, any());
    } else if (s["items"].is_array()) {
      return error_at(at, "'items' as a list (a tuple) is not supported: write 'prefixItems'");
    } else {
      QS_ASSIGN_OR_RETURN(items, compile(s["items"], at + "/items", depth + 1));
    }
    if (s.contains("uniqueItems") && !s["uniqueItems"].is_boolean()) {
      return error_at(at, "'uniqueItems' must be a boolean");
    }
    JsonNode& n = node(id);
    n.kind = JsonNode::Kind::kArray;
    n.prefix_items = std::move(prefix);
    n.items = items;
    n.min_items = std::max(lo, 0);
    n.max_items = hi;
    n.unique = s.value("uniqueItems", false);  // resolve_unique_items checks its items
    return Status::ok_status();
  }

  // A unique array's items must be one literal node (an enum, a const, a boolean) or one integer
  // node, through $ref too: its item is that node, its values come in ascending order (a
  // literal's by its index). An integer item is bounded, within +-kJsonMaxBound, so that its
  // value is tracked exactly (a copy of the node where it was not).
  Status resolve_unique_items() {
    using Kind = JsonNode::Kind;
    for (size_t id = 0; id < g_.nodes_.size(); ++id) {
      if (g_.nodes_[id].kind != Kind::kArray || !g_.nodes_[id].unique) continue;
      int32_t item = g_.nodes_[id].items;
      const JsonNode& u = node(item);
      if (u.kind == Kind::kUnion && u.alternatives.size() == 1) item = u.alternatives[0];
      const Kind kind = node(item).kind;
      if (!g_.nodes_[id].prefix_items.empty() ||
          (kind != Kind::kLiterals && kind != Kind::kInteger)) {
        return error_at(where_[id],
                        "'uniqueItems' is supported for items of one enum, const, "
                        "boolean or integer schema (no prefixItems)");
      }
      constexpr JsonScaled kMost = JsonScaled{kJsonMaxBound} * kJsonUnit;
      if (kind == Kind::kInteger && (node(item).minimum < -kMost || node(item).maximum > kMost)) {
        JsonNode bounded = node(item);
        const JsonScaled step = bounded.integer_step();
        bounded.minimum = std::max(bounded.minimum, json_ceil_div(-kMost, step) * step);
        bounded.maximum = std::min(bounded.maximum, json_floor_div(kMost, step) * step);
        QS_ASSIGN_OR_RETURN(item, new_node(where_[static_cast<size_t>(item)]));
        node(item) = std::move(bounded);
      }
      g_.nodes_[id].items = item;
    }
    return Status::ok_status();
  }

  // How many values a unique array's item node has (enough for its minItems?).
  JsonScaled distinct_values(const JsonNode& item) const {
    if (item.kind == JsonNode::Kind::kLiterals) return std::ssize(g_.trie(item.trie).below);
    const JsonScaled step = item.integer_step();
    if (item.minimum > item.maximum) return 0;
    return json_floor_div(item.maximum, step) - json_ceil_div(item.minimum, step) + 1;
  }

  Status fill_object(int32_t id, const Schema& s, const std::string& at, int depth) {
    std::vector<JsonNode::Property> props;
    if (s.contains("properties")) {
      if (!s["properties"].is_object()) return error_at(at, "'properties' must be an object");
      for (const auto& [name, sub] : s["properties"].items()) {
        QS_ASSIGN_OR_RETURN(const int32_t v,
                            compile(sub, at + "/properties/" + escape_pointer(name), depth + 1));
        const std::string quoted = Schema(name).dump();
        props.push_back({quoted.substr(1, quoted.size() - 2), v, false});
      }
    }
    if (s.contains("required")) {
      if (!s["required"].is_array()) return error_at(at, "'required' must be an array of names");
      for (const Schema& r : s["required"]) {
        const std::string quoted = r.is_string() ? Schema(r).dump() : "";
        auto it = std::find_if(props.begin(), props.end(), [&](const JsonNode::Property& p) {
          return quoted.size() >= 2 && p.name == quoted.substr(1, quoted.size() - 2);
        });
        if (it == props.end()) {
          return error_at(at, fmt::format("required {} is not one of 'properties'", r.dump()));
        }
        it->required = true;
      }
    }
    int32_t additional = -1;
    const bool listed = s.contains("properties") && !s["properties"].empty();
    if (!s.contains("additionalProperties")) {
      if (!listed) {
        QS_ASSIGN_OR_RETURN(additional, any());
      }
    } else {
      QS_ASSIGN_OR_RETURN(
          additional, compile(s["additionalProperties"], at + "/additionalProperties", depth + 1));
      if (s["additionalProperties"].is_boolean() && !s["additionalProperties"].get<bool>()) {
        additional = -1;
      }
    }
    if (s.contains("propertyNames")) {
      // The names it allows: listed properties outside them are left out, the others become
      // properties after them, each with additionalProperties' schema (a dict keyed by an enum).
      QS_ASSIGN_OR_RETURN(const std::vector<std::string> names,
                          property_names(s["propertyNames"], at + "/propertyNames"));
      const auto allowed = [&](const JsonNode::Property& p) {
        return std::find(names.begin(), names.end(), p.name) != names.end();
      };
      for (const JsonNode::Property& p : props) {
        if (p.required && !allowed(p)) {
          return error_at(at, fmt::format("required \"{}\" is not one of 'propertyNames'", p.name));
        }
      }
      std::erase_if(props, [&](const JsonNode::Property& p) { return !allowed(p); });
      for (const std::string& name : names) {
        const bool listed_already =
            std::any_of(props.begin(), props.end(),
                        [&](const JsonNode::Property& p) { return p.name == name; });
        if (!listed_already && additional >= 0) props.push_back({name, additional, false});
      }
      additional = -1;
    }
    QS_ASSIGN_OR_RETURN(const int32_t lo,
                        bound(s, "minProperties", std::numeric_limits<int32_t>::max(), at));
    QS_ASSIGN_OR_RETURN(const int32_t hi,
                        bound(s, "maxProperties", std::numeric_limits<int32_t>::max(), at));
    JsonNode& n = node(id);
    n.kind = JsonNode::Kind::kObject;
    n.properties = std::move(props);
    n.additional = additional;
    n.min_properties = std::max(lo, 0);
    n.max_properties = hi;
    return Status::ok_status();
  }

  // propertyNames' names (JSON-escaped, as JsonNode::Property's): the strings of an enum or a
  // const, also through $ref (pydantic's dict[Literal[...], V] and dict[AnEnum, V]).
  Result<std::vector<std::string>> property_names(const Schema& s, const std::string& at) {
    const Schema* p = &s;
    for (int hops = 0; p->is_object() && p->contains("$ref"); ++hops) {
      if (hops > kMaxDepth || !(*p)["$ref"].is_string()) {
        return error_at(at, "'propertyNames' has a '$ref' that leads to no schema");
      }
      QS_ASSIGN_OR_RETURN(p, resolve((*p)["$ref"].get<std::string>(), at));
    }
    const Schema& names = *p;
    const bool string_type = !names.is_object() || !names.contains("type") ||
                             (names["type"].is_string() && names["type"] == "string");
    if (!names.is_object() || !(names.contains("enum") || names.contains("const")) ||
        !string_type || has_any(names, kStringWords) || names.contains("format")) {
      return error_at(at,
                      "'propertyNames' other than an enum or const of strings is not "
                      "supported");
    }
    std::vector<std::string> out;
    const auto add = [&](const Schema& v) {
      if (!v.is_string() || (names.contains("const") && v != names["const"])) return;
      const std::string quoted = v.dump();
      const std::string name = quoted.substr(1, quoted.size() - 2);
      if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
    };
    if (names.contains("enum")) {
      if (!names["enum"].is_array()) return error_at(at, "'enum' must be an array");
      for (const Schema& v : names["enum"]) add(v);
    } else {
      add(names["const"]);
    }
    return out;
  }

  // Every union's alternatives become the non-union nodes it reaches.
  Status flatten_unions() {
    const size_t n = g_.nodes_.size();
    std::vector<int> state(n, 0);  // 0 not done, 1 in progress, 2 done
    std::function<Status(int32_t)> visit = [&](int32_t id) -> Status {
      JsonNode& u = node(id);
      if (u.kind != JsonNode::Kind::kUnion || state[static_cast<size_t>(id)] == 2) {
        return Status::ok_status();
      }
      if (state[static_cast<size_t>(id)] == 1) {
        return error_at(where_[static_cast<size_t>(id)],
                        "the schema refers to itself with no value in between");
      }
      state[static_cast<size_t>(id)] = 1;
      std::vector<int32_t> flat;
      const std::vector<int32_t> alts = u.alternatives;
      for (int32_t a : alts) {
        QS_TRY(visit(a));
        const JsonNode& alt = node(a);
        if (alt.kind == JsonNode::Kind::kUnion) {
          flat.insert(flat.end(), alt.alternatives.begin(), alt.alternatives.end());
        } else {
          flat.push_back(a);
        }
      }
      std::sort(flat.begin(), flat.end());
      flat.erase(std::unique(flat.begin(), flat.end()), flat.end());
      node(id).alternatives = std::move(flat);
      state[static_cast<size_t>(id)] = 2;
      return Status::ok_status();
    };
    for (size_t id = 0; id < n; ++id) QS_TRY(visit(static_cast<int32_t>(id)));
    return Status::ok_status();
  }

  // Which nodes some finite value matches (least fixpoint), and nothing else is offered: a
  // generation can then always finish what it starts.
  void prune_unproducible() {
    using Kind = JsonNode::Kind;
    const size_t n = g_.nodes_.size();
    producible_.assign(n, false);
    auto ok = [&](int32_t id) { return id >= 0 && producible_[static_cast<size_t>(id)]; };
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t i = 0; i < n; ++i) {
        if (producible_[i]) continue;
        const JsonNode& u = g_.nodes_[i];
        bool p = false;
        switch (u.kind) {
          case Kind::kObject: {
            // Its required properties can be made, within maxProperties, and minProperties of
            // them all (other keys: as many as wanted).
            const auto made =
                std::count_if(u.properties.begin(), u.properties.end(),
                              [&](const JsonNode::Property& q) { return ok(q.value); });
            const auto required =
                std::count_if(u.properties.begin(), u.properties.end(),
                              [](const JsonNode::Property& q) { return q.required; });
            p = std::all_of(
                    u.properties.begin(), u.properties.end(),
                    [&](const JsonNode::Property& q) { return !q.required || ok(q.value); }) &&
                (u.max_properties < 0 ||
                 (required <= u.max_properties && u.min_properties <= u.max_properties)) &&
                (ok(u.additional) || made >= u.min_properties);
            break;
          }
          case Kind::kArray:
            // Its first min_items items can be made (unique ones: that many values).
            p = (u.max_items < 0 || u.min_items <= u.max_items) &&
                (!u.unique ||
                 u.min_items <= distinct_values(g_.nodes_[static_cast<size_t>(u.items)])) &&
                std::all_of(u.prefix_items.begin(),
                            u.prefix_items.begin() +
                                std::min<ptrdiff_t>(u.min_items, std::ssize(u.prefix_items)),
                            ok) &&
                (u.min_items <= std::ssize(u.prefix_items) || ok(u.items));
            break;
          case Kind::kString:
            p = (u.max_length < 0 || u.min_length <= u.max_length) &&
                (u.pattern < 0 || g_.pattern(u.pattern).satisfiable()) &&
                (u.lengths < 0 || g_.lengths(u.lengths).satisfiable());
            break;
          case Kind::kNumber:
          case Kind::kInteger:
            p = u.minimum <= u.maximum;
            break;
          case Kind::kLiterals:
            p = !g_.trie(u.trie).below.empty();
            break;
          case Kind::kUnion:
            p = std::any_of(u.alternatives.begin(), u.alternatives.end(), ok);
            break;
        }
        if (p) {
          producible_[i] = true;
          changed = true;
        }
      }
    }
    for (JsonNode& u : g_.nodes_) {
      std::erase_if(u.alternatives, [&](int32_t a) { return !ok(a); });
      std::erase_if(u.properties, [&](const JsonNode::Property& q) { return !ok(q.value); });
      if (u.additional >= 0 && !ok(u.additional)) u.additional = -1;
      if (u.kind == Kind::kArray) {
        // An array ends before the first item no value makes.
        if (!ok(u.items)) u.items = -1;
        auto cut = std::find_if_not(u.prefix_items.begin(), u.prefix_items.end(), ok);
        const bool rest = cut == u.prefix_items.end() && u.items >= 0;
        u.prefix_items.erase(cut, u.prefix_items.end());
        const auto most = static_cast<int32_t>(u.prefix_items.size());
        if (!rest) u.max_items = u.max_items < 0 ? most : std::min(u.max_items, most);
      }
    }
  }

  void build_key_tries() {
    for (JsonNode& u : g_.nodes_) {
      if (u.kind != JsonNode::Kind::kObject) continue;
      const auto count = static_cast<int32_t>(u.properties.size());
      u.last_may.assign(static_cast<size_t>(count) + 1, count - 1);
      u.required_from.assign(static_cast<size_t>(count) + 1, 0);
      for (int32_t i = count - 1; i >= 0; --i) {
        const bool req = u.properties[static_cast<size_t>(i)].required;
        if (req && u.last_required < 0) u.last_required = i;
        u.last_may[static_cast<size_t>(i)] = req ? i : u.last_may[static_cast<size_t>(i) + 1];
        u.required_from[static_cast<size_t>(i)] = u.required_from[static_cast<size_t>(i) + 1] + req;
      }
      if (count == 0) continue;
      u.keys = new_trie();
      for (int32_t i = 0; i < count; ++i)
        insert(u.keys, u.properties[static_cast<size_t>(i)].name, i);
    }
  }

  const Schema& doc_;
  JsonGrammar g_;
  std::vector<std::string> where_;  // each node's place, for errors
  std::map<const Schema*, int32_t> memo_;
  std::vector<bool> producible_;
  int32_t any_ = -1;
  size_t literal_bytes_ = 0;
};

Result<JsonGrammar> JsonGrammar::compile(std::string_view schema) {
  Schema doc;
  try {
    doc = Schema::parse(schema);
  } catch (const Schema::exception& e) {
    return make_error(std::string("json_schema: the schema is not valid JSON: ") + e.what());
  }
  return JsonSchemaCompiler(doc).run();
}

int32_t JsonGrammar::child(int32_t trie, uint8_t byte) const {
  for (const auto& [b, next] : tries_[static_cast<size_t>(trie)].edges) {
    if (b == byte) return next;
  }
  return -1;
}

std::string JsonGrammar::literal_bytes() const {
  std::vector<bool> seen(256, false);
  for (const JsonTrieNode& t : tries_) {
    for (const auto& [b, next] : t.edges) seen[b] = true;
  }
  std::string out;
  for (int b = 0; b < 256; ++b) {
    if (seen[static_cast<size_t>(b)]) out += static_cast<char>(b);
  }
  return out;
}

}  // namespace qs
