// Small typed accessors over nlohmann::json that turn a wrong or missing field into an Error
// naming the component and field, instead of an exception.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"

namespace qs::tok {

using Json = nlohmann::json;

inline std::string json_type_name(const Json& j) {
  return j.is_null() ? "null" : std::string(j.type_name());
}

inline Result<std::string> get_string(const Json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) {
    return make_error(where + ": field '" + key + "' must be a string, got " +
                      (it == j.end() ? std::string("nothing") : json_type_name(*it)));
  }
  return it->get<std::string>();
}

inline Result<bool> get_bool(const Json& j, const char* key, bool fallback,
                             const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) {
    return make_error(where + ": field '" + key + "' must be a boolean, got " +
                      json_type_name(*it));
  }
  return it->get<bool>();
}

inline Result<int64_t> get_int(const Json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer()) {
    return make_error(where + ": field '" + key + "' must be an integer, got " +
                      (it == j.end() ? std::string("nothing") : json_type_name(*it)));
  }
  return it->get<int64_t>();
}

// The "type" of a component object.
inline Result<std::string> get_type(const Json& j, const std::string& kind) {
  if (!j.is_object()) {
    return make_error("tokenizer.json: " + kind + " must be an object, got " + json_type_name(j));
  }
  return get_string(j, "type", "tokenizer.json: " + kind);
}

}  // namespace qs::tok
