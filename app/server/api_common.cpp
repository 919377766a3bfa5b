#include "api_common.h"

#include <algorithm>
#include <cctype>

namespace qs::server {

ApiError invalid(std::string message, std::string param, std::string code) {
  ApiError e;
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}

ApiError unsupported(const std::string& param, const std::string& what) {
  return invalid(what + " is not supported by this server", param, "unsupported_parameter");
}

const char* json_type_name(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::boolean:
      return "boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return "integer";
    case Json::value_t::number_float:
      return "number";
    case Json::value_t::string:
      return "string";
    case Json::value_t::array:
      return "array";
    case Json::value_t::object:
      return "object";
    default:
      return "value";
  }
}

ApiError wrong_type(const std::string& param, const char* expected, const Json& got) {
  return invalid("'" + param + "' must be " + expected + ", got " + json_type_name(got), param,
                 "invalid_type");
}

std::optional<ApiError> read_bool(const Json& j, const std::string& param, bool* out) {
  if (!j.is_boolean()) return wrong_type(param, "a boolean", j);
  *out = j.get<bool>();
  return std::nullopt;
}

std::optional<ApiError> read_name(const Json& j, const std::string& param, std::string* out) {
  if (!j.is_string()) return wrong_type(param, "a string", j);
  std::string n = j.get<std::string>();
  const bool well_formed =
      !n.empty() && n.size() <= 64 && std::all_of(n.begin(), n.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
      });
  if (!well_formed)
    return invalid("'" + param + "' must be 1 to 64 characters of a-z, A-Z, 0-9, _ and -", param);
  *out = std::move(n);
  return std::nullopt;
}

BracketScan scan_brackets(std::string_view s, size_t from) {
  BracketScan scan;
  int depth = 0;
  bool in_string = false;
  for (size_t i = from; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      scan.deepest = std::max(scan.deepest, ++depth);
    } else if ((c == '}' || c == ']') && --depth == 0) {
      scan.end = i + 1;
      return scan;
    }
  }
  return scan;
}

}  // namespace qs::server
