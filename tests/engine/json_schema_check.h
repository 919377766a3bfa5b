// The tests' own JSON Schema check of a parsed value: JSON Schema's meaning of the keywords
// json_schema.h supports (standard semantics: any property order, additionalProperties true when
// absent), written over the value's tree, so that it shares nothing with the byte-level
// recognizer it checks.
#pragma once

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

namespace qs::testing {

using OrderedJson = nlohmann::ordered_json;

inline size_t code_points(const std::string& s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

inline bool has_type(const OrderedJson& v, const std::string& type) {
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  if (type == "string") return v.is_string();
  if (type == "number") return v.is_number();
  if (type == "integer") {  // a number past int64 parses as a double
    return v.is_number_integer() ||
           (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
  }
  if (type == "boolean") return v.is_boolean();
  return type == "null" && v.is_null();
}

// A number as digits x 10^exponent, read from its shortest decimal text (exact for the tests'
// values).
struct DecimalValue {
  __int128 digits = 0;
  int exponent = 0;
};
inline DecimalValue decimal_of(const OrderedJson& v) {
  const std::string text = v.dump();
  DecimalValue d;
  bool fraction = false;
  size_t i = 0;
  for (; i < text.size() && text[i] != 'e' && text[i] != 'E'; ++i) {
    if (text[i] == '.') fraction = true;
    if (text[i] < '0' || text[i] > '9') continue;
    d.digits = d.digits * 10 + (text[i] - '0');
    d.exponent -= fraction ? 1 : 0;
  }
  if (i < text.size()) d.exponent += std::stoi(text.substr(i + 1));
  return d;
}

// multipleOf: v / m is a whole number.
inline bool is_multiple(const OrderedJson& v, const OrderedJson& m) {
  DecimalValue a = decimal_of(v), b = decimal_of(m);
  const int common = std::min(a.exponent, b.exponent);
  for (; a.exponent > common; --a.exponent) a.digits *= 10;
  for (; b.exponent > common; --b.exponent) b.digits *= 10;
  return a.digits % b.digits == 0;
}

// Whether `schema` (a part of the document `root`) accepts `v`.
inline bool schema_accepts(const OrderedJson& schema, const OrderedJson& v,
                           const OrderedJson& root) {
  if (schema.is_boolean()) return schema.get<bool>();
  if (schema.contains("$ref")) {
    const std::string ref = schema["$ref"].get<std::string>();
    const OrderedJson& target =
        ref == "#" ? root : root.at(OrderedJson::json_pointer(ref.substr(1)));
    return schema_accepts(target, v, root);
  }
  if (schema.contains("anyOf") || schema.contains("oneOf") || schema.contains("allOf")) {
    int matched = 0, count = 0;
    for (const char* k : {"anyOf", "oneOf", "allOf"}) {
      if (!schema.contains(k)) continue;
      matched = count = 0;
      for (const OrderedJson& s : schema[k]) {
        matched += schema_accepts(s, v, root);
        ++count;
      }
      if (std::string(k) == "anyOf" && matched == 0) return false;
      if (std::string(k) == "oneOf" && matched != 1) return false;
      if (std::string(k) == "allOf" && matched != count) return false;
    }
    return true;
  }
  if (schema.contains("const") && schema["const"] != v) return false;
  if (schema.contains("enum")) {
    bool found = false;
    for (const OrderedJson& e : schema["enum"]) found = found || e == v;
    if (!found) return false;
  }
  if (schema.contains("type")) {
    const OrderedJson& t = schema["type"];
    bool ok = false;
    if (t.is_string()) {
      ok = has_type(v, t.get<std::string>());
    } else {
      for (const OrderedJson& e : t) ok = ok || has_type(v, e.get<std::string>());
    }
    if (!ok) return false;
  }
  if (v.is_object()) {
    const OrderedJson props = schema.value("properties", OrderedJson::object());
    for (const auto& [k, sub] : v.items()) {
      if (schema.contains("propertyNames") &&
          !schema_accepts(schema["propertyNames"], OrderedJson(k), root)) {
        return false;
      }
      if (props.contains(k)) {
        if (!schema_accepts(props[k], sub, root)) return false;
      } else if (schema.contains("additionalProperties") &&
                 !schema_accepts(schema["additionalProperties"], sub, root)) {
        return false;
      }
    }
    if (v.size() < schema.value("minProperties", size_t{0})) return false;
    if (schema.contains("maxProperties") && v.size() > schema["maxProperties"].get<size_t>()) {
      return false;
    }
    for (const OrderedJson& r : schema.value("required", OrderedJson::array())) {
      if (!v.contains(r.get<std::string>())) return false;
    }
  }
  if (v.is_array()) {
    if (v.size() < schema.value("minItems", size_t{0})) return false;
    if (schema.contains("maxItems") && v.size() > schema["maxItems"].get<size_t>()) return false;
    if (schema.value("uniqueItems", false)) {
      for (size_t i = 0; i < v.size(); ++i) {
        for (size_t j = 0; j < i; ++j) {
          if (v[i] == v[j]) return false;
        }
      }
    }
    // prefixItems the first items, items the rest.
    const OrderedJson prefix = schema.value("prefixItems", OrderedJson::array());
    for (size_t i = 0; i < v.size(); ++i) {
      if (i < prefix.size()) {
        if (!schema_accepts(prefix[i], v[i], root)) return false;
      } else if (schema.contains("items") && !schema_accepts(schema["items"], v[i], root)) {
        return false;
      }
    }
  }
  if (v.is_number()) {
    const double x = v.get<double>();
    if (schema.contains("minimum") && x < schema["minimum"].get<double>()) return false;
    if (schema.contains("maximum") && x > schema["maximum"].get<double>()) return false;
    if (schema.contains("exclusiveMinimum") && x <= schema["exclusiveMinimum"].get<double>()) {
      return false;
    }
    if (schema.contains("exclusiveMaximum") && x >= schema["exclusiveMaximum"].get<double>()) {
      return false;
    }
    if (schema.contains("multipleOf") && !is_multiple(v, schema["multipleOf"])) return false;
  }
  if (v.is_string()) {
    const size_t n = code_points(v.get<std::string>());
    if (n < schema.value("minLength", size_t{0})) return false;
    if (schema.contains("maxLength") && n > schema["maxLength"].get<size_t>()) return false;
    // ECMAScript's search over the bytes (the tests' patterns read ASCII where it matters).
    if (schema.contains("pattern") &&
        !std::regex_search(v.get<std::string>(), std::regex(schema["pattern"].get<std::string>(),
                                                            std::regex::ECMAScript)))
      return false;
  }
  return true;
}

}  // namespace qs::testing
