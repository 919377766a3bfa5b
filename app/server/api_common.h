// What request parsing (api.cpp, tools.cpp) shares: the API's errors (OpenAI's {"error": {...}}
// objects), the 400 answers it builds, each naming the parameter at fault, and a scan of JSON
// text.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace qs::server {

using Json = nlohmann::ordered_json;

struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // "" -> null
  std::string code;   // "" -> null
};

// 400 invalid_request_error with `code` (default "invalid_value").
ApiError invalid(std::string message, std::string param, std::string code = "invalid_value");
// 400 unsupported_parameter: "<what> is not supported by this server".
ApiError unsupported(const std::string& param, const std::string& what);
// 400 invalid_type: "'<param>' must be <expected>, got <the JSON type of got>".
ApiError wrong_type(const std::string& param, const char* expected, const Json& got);
// JSON Schema's name of j's type: null, boolean, integer, number, string, array, object.
const char* json_type_name(const Json& j);
// A JSON boolean into *out, else wrong_type.
std::optional<ApiError> read_bool(const Json& j, const std::string& param, bool* out);
// A name of OpenAI's form (a json_schema's, a function's): 1 to 64 of a-z, A-Z, 0-9, _ and -.
std::optional<ApiError> read_name(const Json& j, const std::string& param, std::string* out);

// The brackets of JSON text from s[from] (brackets inside strings do not count) up to the end of
// the first object or array: `end` is one past the bracket that closes it (npos when none does),
// `deepest` the most containers open at once on the way.
struct BracketScan {
  size_t end = std::string_view::npos;
  int deepest = 0;
};
BracketScan scan_brackets(std::string_view s, size_t from);

}  // namespace qs::server
