#include "api.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <limits>
#include <random>
#include <set>

#include "api_common.h"
#include "engine/json_schema.h"

namespace qs::server {

namespace {

constexpr size_t kMaxStopStrings = 4;  // as OpenAI
constexpr size_t kMaxStopStringBytes = 1024;
constexpr int64_t kMaxTokensLimit = int64_t{1} << 30;
constexpr double kMinTemperature = 1e-6;

bool is_integral_number(const Json& j) {
  if (j.is_number_integer()) return true;
  if (!j.is_number_float()) return false;
  const double d = j.get<double>();
  return std::isfinite(d) && std::floor(d) == d && std::fabs(d) < 9.0e18;
}

// Reads a JSON integer (or a float with no fraction, as JSON Schema's "integer"), with a range.
std::optional<ApiError> read_int(const Json& j, const std::string& param, int64_t lo, int64_t hi,
                                 int64_t* out) {
  if (!is_integral_number(j)) return wrong_type(param, "an integer", j);
  if (j.is_number_unsigned() && j.get<uint64_t>() > static_cast<uint64_t>(hi)) {
    return invalid("'" + param + "' must be at most " + std::to_string(hi), param);
  }
  const int64_t v = j.is_number_float() ? static_cast<int64_t>(j.get<double>()) : j.get<int64_t>();
  if (v < lo || v > hi) {
    return invalid("'" + param + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                       "], got " + std::to_string(v),
                   param);
  }
  *out = v;
  return std::nullopt;
}

std::optional<ApiError> read_number(const Json& j, const std::string& param, double lo, double hi,
                                    double* out) {
  if (!j.is_number()) return wrong_type(param, "a number", j);
  const double v = j.get<double>();
  if (!std::isfinite(v) || v < lo || v > hi) {
    return invalid("'" + param + "' must be a number in [" + Json(lo).dump() + ", " +
                       Json(hi).dump() + "], got " + Json(v).dump(),
                   param);
  }
  *out = v;
  return std::nullopt;
}

std::optional<ApiError> read_stop(const Json& j, std::vector<std::string>* out) {
  std::vector<std::string> stops;
  auto add = [&](const Json& s, const std::string& param) -> std::optional<ApiError> {
    if (!s.is_string()) return wrong_type(param, "a string", s);
    std::string v = s.get<std::string>();
    if (v.empty()) return invalid("stop strings must not be empty", param);
    if (v.size() > kMaxStopStringBytes) {
      return invalid(
          "stop strings are limited to " + std::to_string(kMaxStopStringBytes) + " bytes", param);
    }
    stops.push_back(std::move(v));
    return std::nullopt;
  };
  if (j.is_string()) {
    if (auto e = add(j, "stop")) return e;
  } else if (j.is_array()) {
    if (j.size() > kMaxStopStrings) {
      return invalid("at most " + std::to_string(kMaxStopStrings) + " stop strings are allowed",
                     "stop");
    }
    for (size_t i = 0; i < j.size(); ++i) {
      if (auto e = add(j[i], "stop[" + std::to_string(i) + "]")) return e;
    }
  } else {
    return wrong_type("stop", "a string or an array of strings", j);
  }
  *out = std::move(stops);
  return std::nullopt;
}

// Chat message content: a string, or text parts [{"type": "text", "text": "..."}] joined by "\n".
std::optional<ApiError> read_content(const Json& j, const std::string& param, std::string* out) {
  if (j.is_string()) {
    *out = j.get<std::string>();
    return std::nullopt;
  }
  if (!j.is_array()) return wrong_type(param, "a string or an array of content parts", j);
  std::string text;
  for (size_t i = 0; i < j.size(); ++i) {
    const std::string p = param + "[" + std::to_string(i) + "]";
    const Json& part = j[i];
    if (!part.is_object()) return wrong_type(p, "an object", part);
    for (const auto& [k, v] : part.items()) {
      if (k != "type" && k != "text")
        return invalid("unknown parameter '" + p + "." + k + "'", p + "." + k, "unknown_parameter");
    }
    if (!part.contains("type") || !part["type"].is_string()) {
      return invalid("content part '" + p + "' needs a string 'type'", p + ".type",
                     "missing_required_parameter");
    }
    const std::string type = part["type"].get<std::string>();
    if (type != "text")
      return unsupported(p + ".type", "content part type '" + type + "' (text only)");
    if (!part.contains("text") || !part["text"].is_string()) {
      return invalid("content part '" + p + "' needs a string 'text'", p + ".text",
                     "missing_required_parameter");
    }
    if (i) text += "\n";
    text += part["text"].get<std::string>();
  }
  *out = std::move(text);
  return std::nullopt;
}

std::optional<ApiError> read_messages(const Json& j, Json* out) {
  if (!j.is_array()) return wrong_type("messages", "an array", j);
  if (j.empty()) return invalid("'messages' must contain at least one message", "messages");
  static const std::set<std::string> kKeys = {"role", "content", "name"};
  static const std::set<std::string> kAssistantKeys = {
      "role", "content", "name", "refusal", "tool_calls", "function_call", "audio"};
  static const std::set<std::string> kToolKeys = {"role", "content", "tool_call_id", "name"};
  Json messages = Json::array();
  for (size_t i = 0; i < j.size(); ++i) {
    const std::string p = "messages[" + std::to_string(i) + "]";
    const Json& m = j[i];
    if (!m.is_object()) return wrong_type(p, "an object", m);
    if (!m.contains("role"))
      return invalid(p + " has no 'role'", p + ".role", "missing_required_parameter");
    if (!m["role"].is_string()) return wrong_type(p + ".role", "a string", m["role"]);
    std::string role = m["role"].get<std::string>();
    if (role == "function")
      return unsupported(p + ".role", "the deprecated role 'function' (use 'tool')");
    if (role == "developer") role = "system";
    if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
      return invalid("unknown role '" + role + "' in " + p +
                         " (expected system, developer, user, assistant or tool)",
                     p + ".role");
    }
    const auto& keys = role == "assistant" ? kAssistantKeys : role == "tool" ? kToolKeys : kKeys;
    for (const auto& [k, v] : m.items()) {
      if (!keys.count(k)) {
        return invalid("unknown parameter '" + p + "." + k + "' (for role " + role + ")",
                       p + "." + k, "unknown_parameter");
      }
    }
    for (const char* k : {"function_call", "audio"}) {
      if (m.contains(k) && !m[k].is_null()) {
        return unsupported(p + "." + k, std::string("'") + k +
                                            "' in messages (the deprecated function call / "
                                            "audio; use 'tool_calls')");
      }
    }
    if (m.contains("refusal") && !m["refusal"].is_null() && !m["refusal"].is_string()) {
      return wrong_type(p + ".refusal", "a string or null", m["refusal"]);
    }
    Json calls;
    if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      if (auto e = read_message_tool_calls(m["tool_calls"], p + ".tool_calls", &calls)) return e;
    }
    std::string content;
    if (!m.contains("content") || m["content"].is_null()) {
      if (role != "assistant") {
        return invalid(p + " (role " + role + ") needs a 'content'", p + ".content",
                       "missing_required_parameter");
      }
    } else if (auto e = read_content(m["content"], p + ".content", &content)) {
      return e;
    }
    Json msg = {{"role", role}, {"content", content}};
    if (m.contains("name") && !m["name"].is_null()) {
      if (!m["name"].is_string()) return wrong_type(p + ".name", "a string", m["name"]);
      msg["name"] = m["name"];
    }
    // Templates test `message.tool_calls is defined` (Mistral's): only a message with calls has
    // the key.
    if (!calls.empty()) msg["tool_calls"] = std::move(calls);
    if (role == "tool") {
      if (!m.contains("tool_call_id"))
        return invalid(p + " (role tool) needs a 'tool_call_id'", p + ".tool_call_id",
                       "missing_required_parameter");
      if (!m["tool_call_id"].is_string())
        return wrong_type(p + ".tool_call_id", "a string", m["tool_call_id"]);
      msg["tool_call_id"] = m["tool_call_id"];
    }
    messages.push_back(std::move(msg));
  }
  *out = std::move(messages);
  return std::nullopt;
}

// logit_bias: {"<token id>": bias in [-100, 100]}, at most kMaxLogitBias entries (OpenAI's 300).
constexpr size_t kMaxLogitBias = 300;
std::optional<ApiError> read_logit_bias(const Json& j, int64_t vocab,
                                        std::vector<std::pair<int32_t, float>>* out) {
  if (!j.is_object()) return wrong_type("logit_bias", "an object", j);
  if (j.size() > kMaxLogitBias)
    return invalid("'logit_bias' has " + std::to_string(j.size()) + " entries; at most " +
                       std::to_string(kMaxLogitBias),
                   "logit_bias");
  for (const auto& [key, value] : j.items()) {
    const std::string param = "logit_bias." + key;
    int64_t id = -1;
    size_t used = 0;
    try {
      id = std::stoll(key, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != key.size() || key.empty() || id < 0 || (vocab > 0 && id >= vocab)) {
      return invalid("'logit_bias' keys are token ids in [0, " + std::to_string(vocab) +
                         "), got '" + key + "'",
                     param);
    }
    double bias = 0;
    if (auto e = read_number(value, param, -100.0, 100.0, &bias)) return e;
    out->emplace_back(static_cast<int32_t>(id), static_cast<float>(bias));
  }
  return std::nullopt;
}

std::optional<ApiError> read_prompt(const Json& j, ApiRequest* r) {
  if (j.is_string()) {
    r->prompts.push_back(PromptInput{j.get<std::string>(), {}});
    return std::nullopt;
  }
  if (!j.is_array())
    return wrong_type("prompt", "a string, an array of strings or an array of token ids", j);
  if (j.empty()) return invalid("'prompt' must not be an empty array", "prompt");
  auto read_ids = [&](const Json& arr, const std::string& param) -> std::optional<ApiError> {
    std::vector<int64_t> ids;
    for (size_t i = 0; i < arr.size(); ++i) {
      int64_t id = 0;
      if (auto e = read_int(arr[i], param + "[" + std::to_string(i) + "]", 0,
                            std::numeric_limits<int32_t>::max(), &id)) {
        return e;
      }
      ids.push_back(id);
    }
    if (ids.empty()) return invalid("'" + param + "' must contain at least one token id", param);
    r->prompts.push_back(PromptInput{std::nullopt, std::move(ids)});
    return std::nullopt;
  };
  if (!j[0].is_string() && !j[0].is_array()) return read_ids(j, "prompt");
  // A batch: strings, or arrays of token ids.
  if (j.size() > static_cast<size_t>(kMaxPrompts)) {
    return unsupported("prompt", "a batch of more than " + std::to_string(kMaxPrompts) +
                                     " prompts (send several requests)");
  }
  const bool texts = j[0].is_string();
  for (size_t i = 0; i < j.size(); ++i) {
    const std::string param = "prompt[" + std::to_string(i) + "]";
    if (texts) {
      if (!j[i].is_string()) return wrong_type(param, "a string", j[i]);
      r->prompts.push_back(PromptInput{j[i].get<std::string>(), {}});
    } else {
      if (!j[i].is_array()) return wrong_type(param, "an array of token ids", j[i]);
      if (auto e = read_ids(j[i], param)) return e;
    }
  }
  return std::nullopt;
}

}  // namespace

Json error_json(const ApiError& e) {
  Json err = {{"message", e.message},
              {"type", e.type},
              {"param", e.param.empty() ? Json(nullptr) : Json(e.param)},
              {"code", e.code.empty() ? Json(nullptr) : Json(e.code)}};
  return Json{{"error", std::move(err)}};
}

std::string dump_json(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

namespace {

// Deeper than any request of ours needs; the parser's memory grows with the depth (an 8 MB body
// of brackets would take ~130 MB), so a deeper body is refused before it is parsed.
constexpr int kMaxJsonDepth = 64;

// A request body as a JSON object.
std::variant<Json, ApiError> parse_body(std::string_view body) {
  // Up to the first container's end (the parser stops at anything after it); a malformed body is
  // left to the parser.
  if (scan_brackets(body, 0).deepest > kMaxJsonDepth) {
    return invalid("the request body nests arrays / objects deeper than " +
                       std::to_string(kMaxJsonDepth) + " levels",
                   "", "invalid_json");
  }
  Json j;
  try {
    j = Json::parse(body.begin(), body.end());
  } catch (const Json::exception& e) {  // parse_error, or out_of_range for a number like 1e400
    std::string what = e.what();
    if (const size_t end = what.find("] ");
        what.rfind("[json.exception", 0) == 0 && end != std::string::npos)
      what = what.substr(end + 2);
    return invalid("the request body is not valid JSON: " + what, "", "invalid_json");
  }
  if (!j.is_object())
    return invalid(std::string("the request body must be a JSON object, got ") + json_type_name(j),
                   "");
  return j;
}

// The first field of `j` that `allowed` does not name, as 400 unknown_parameter.
std::optional<ApiError> unknown_field(const Json& j, const std::set<std::string>& allowed) {
  for (const auto& [k, v] : j.items()) {
    if (!allowed.count(k)) return invalid("unknown parameter '" + k + "'", k, "unknown_parameter");
  }
  return std::nullopt;
}

}  // namespace

std::variant<TokenizeRequest, ApiError> parse_tokenize(std::string_view body) {
  auto parsed = parse_body(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const Json& j = std::get<Json>(parsed);
  if (auto e = unknown_field(j, {"model", "prompt", "messages", "tools", "add_special_tokens"}))
    return *e;
  auto has = [&](const char* k) { return j.contains(k) && !j[k].is_null(); };
  if (has("model") && !j["model"].is_string()) return wrong_type("model", "a string", j["model"]);
  TokenizeRequest r;
  // A new endpoint, so no null stands for an absent prompt or conversation (the schema's oneOf).
  auto given = [&](const char* k) { return j.contains(k); };
  if (given("prompt") && given("messages")) {
    return invalid("give one of 'prompt' (text) and 'messages' (a conversation), not both",
                   "messages");
  }
  if (!given("prompt") && !given("messages")) {
    return invalid("missing required parameter: 'prompt' (text) or 'messages' (a conversation)",
                   "prompt", "missing_required_parameter");
  }
  if (given("prompt")) {
    if (!j["prompt"].is_string()) return wrong_type("prompt", "a string", j["prompt"]);
    if (given("tools"))
      return invalid("'tools' go with 'messages' (the chat template shows them)", "tools");
    r.prompt = j["prompt"].get<std::string>();
    r.add_special = true;
  } else {
    if (auto e = read_messages(j["messages"], &r.messages)) return *e;
    ToolRequest tools;
    if (auto e = read_tools(j, &tools)) return *e;
    r.tools = std::move(tools.tools);
    r.add_special = false;  // the chat template writes its special tokens
  }
  if (has("add_special_tokens")) {
    if (auto e = read_bool(j["add_special_tokens"], "add_special_tokens", &r.add_special))
      return *e;
  }
  return r;
}

std::variant<std::vector<int64_t>, ApiError> parse_detokenize(std::string_view body) {
  auto parsed = parse_body(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const Json& j = std::get<Json>(parsed);
  if (auto e = unknown_field(j, {"model", "tokens"})) return *e;
  if (j.contains("model") && !j["model"].is_null() && !j["model"].is_string())
    return wrong_type("model", "a string", j["model"]);
  if (!j.contains("tokens") || j["tokens"].is_null())
    return invalid("missing required parameter 'tokens'", "tokens", "missing_required_parameter");
  if (!j["tokens"].is_array()) return wrong_type("tokens", "an array of token ids", j["tokens"]);
  std::vector<int64_t> ids;
  for (size_t i = 0; i < j["tokens"].size(); ++i) {
    int64_t id = 0;
    if (auto e = read_int(j["tokens"][i], "tokens[" + std::to_string(i) + "]", 0,
                          std::numeric_limits<int32_t>::max(), &id))
      return *e;
    ids.push_back(id);
  }
  return ids;
}

namespace {

// OpenAI's json_schema object {"name", "description", "schema", "strict"}: the schema's text in
// `schema` (its properties in the body's order, which the grammar generates in: Json keeps the
// order of keys). Every schema is followed (strict or not); none is any JSON value.
std::optional<ApiError> read_json_schema(const Json& js, std::string* schema) {
  const std::string p = "response_format.json_schema";
  if (!js.is_object()) return wrong_type(p, "an object", js);
  for (const auto& [k, v] : js.items()) {
    if (k != "name" && k != "description" && k != "schema" && k != "strict") {
      return invalid("unknown parameter '" + p + "." + k + "'", p + "." + k, "unknown_parameter");
    }
  }
  if (!js.contains("name")) {
    return invalid("'" + p + "' needs a 'name'", p + ".name", "missing_required_parameter");
  }
  std::string name;
  if (auto e = read_name(js["name"], p + ".name", &name)) return e;
  if (js.contains("description") && !js["description"].is_string()) {
    return wrong_type(p + ".description", "a string", js["description"]);
  }
  if (js.contains("strict") && !js["strict"].is_boolean() && !js["strict"].is_null()) {
    return wrong_type(p + ".strict", "a boolean", js["strict"]);
  }
  if (!js.contains("schema")) {
    *schema = "{}";
  } else if (!js["schema"].is_object() && !js["schema"].is_boolean()) {
    return wrong_type(p + ".schema", "an object", js["schema"]);
  } else {
    *schema = js["schema"].dump();
  }
  auto grammar = JsonGrammar::compile(*schema);
  if (!grammar.ok()) return invalid(grammar.error().message, p + ".schema");
  return std::nullopt;
}

// response_format: text, json_object or json_schema, as GenerationParams::json_schema.
std::optional<ApiError> read_response_format(const Json& rf, std::string* schema) {
  if (!rf.is_object()) return wrong_type("response_format", "an object", rf);
  if (!rf.contains("type") || !rf["type"].is_string()) {
    return invalid("'response_format' needs a string 'type'", "response_format.type",
                   "missing_required_parameter");
  }
  const std::string type = rf["type"].get<std::string>();
  for (const auto& [k, v] : rf.items()) {
    if (k != "type" && (k != "json_schema" || type != "json_schema")) {
      return invalid("unknown parameter 'response_format." + k + "'", "response_format." + k,
                     "unknown_parameter");
    }
  }
  if (type == "json_schema") {
    if (!rf.contains("json_schema")) {
      return invalid("response_format 'json_schema' needs a 'json_schema' object",
                     "response_format.json_schema", "missing_required_parameter");
    }
    return read_json_schema(rf["json_schema"], schema);
  }
  if (type != "text" && type != "json_object")
    return unsupported("response_format", "response_format '" + type + "'");
  *schema = type == "json_object" ? std::string(kJsonObjectSchema) : "";
  return std::nullopt;
}

}  // namespace

std::variant<ApiRequest, ApiError> parse_request(std::string_view body, Endpoint endpoint,
                                                 const RequestDefaults& defaults) {
  auto parsed = parse_body(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const Json& j = std::get<Json>(parsed);

  const bool chat = endpoint == Endpoint::kChatCompletions;
  static const std::set<std::string> kCommon = {"model",
                                                "max_tokens",
                                                "temperature",
                                                "top_p",
                                                "n",
                                                "stream",
                                                "stream_options",
                                                "stop",
                                                "seed",
                                                "presence_penalty",
                                                "frequency_penalty",
                                                "logit_bias",
                                                "logprobs",
                                                "user",
                                                "top_k",
                                                "min_p",
                                                "ignore_eos",
                                                "response_format"};
  static const std::set<std::string> kCompletionOnly = {"prompt", "echo", "suffix", "best_of"};
  static const std::set<std::string> kChatOnly = {
      "messages",    "max_completion_tokens", "top_logprobs", "tools",
      "tool_choice", "parallel_tool_calls",   "functions",    "function_call"};
  std::set<std::string> allowed = kCommon;
  allowed.insert((chat ? kChatOnly : kCompletionOnly).begin(),
                 (chat ? kChatOnly : kCompletionOnly).end());
  if (auto e = unknown_field(j, allowed)) return *e;

  ApiRequest r;
  r.endpoint = endpoint;
  r.params = defaults.gen;
  auto has = [&](const char* k) { return j.contains(k) && !j[k].is_null(); };

  if (has("model") && !j["model"].is_string()) return wrong_type("model", "a string", j["model"]);
  if (has("user") && !j["user"].is_string()) return wrong_type("user", "a string", j["user"]);

  if (chat) {
    if (!j.contains("messages")) {
      return invalid("missing required parameter 'messages'", "messages",
                     "missing_required_parameter");
    }
    if (auto e = read_messages(j["messages"], &r.messages)) return *e;
  } else {
    if (!j.contains("prompt") || j["prompt"].is_null()) {
      return invalid("missing required parameter 'prompt'", "prompt", "missing_required_parameter");
    }
    if (auto e = read_prompt(j["prompt"], &r)) return *e;
  }

  // Chat may give both (max_tokens is OpenAI's deprecated name): the smaller one wins.
  for (const char* k : {"max_tokens", "max_completion_tokens"}) {
    if (!has(k)) continue;
    int64_t v = 0;
    const int64_t hi = defaults.max_context > 0 ? defaults.max_context : kMaxTokensLimit;
    if (auto e = read_int(j[k], k, 0, hi, &v)) return *e;  // 0: an echo only (below)
    r.max_tokens = r.max_tokens ? std::min(*r.max_tokens, v) : v;
  }
  if (has("temperature")) {
    double t = 0;
    if (auto e = read_number(j["temperature"], "temperature", 0.0, 2.0, &t)) return *e;
    // Below kMinTemperature sampling is greedy anyway, and logits / T could overflow a float.
    r.params.sampling.temperature = t < kMinTemperature ? 0.0f : static_cast<float>(t);
  }
  if (has("top_p")) {
    double p = 0;
    if (auto e = read_number(j["top_p"], "top_p", 0.0, 1.0, &p)) return *e;
    // top_p = 0 keeps only the most likely token: greedy (also when it rounds to 0 as a float).
    if (static_cast<float>(p) <= 0.0f) {
      r.params.sampling.temperature = 0;
      r.params.sampling.top_p = 1;
    } else {
      r.params.sampling.top_p = static_cast<float>(p);
    }
  }
  if (has("top_k")) {
    int64_t k = 0;
    if (auto e = read_int(j["top_k"], "top_k", -1, std::numeric_limits<int32_t>::max(), &k))
      return *e;
    r.params.sampling.top_k = k < 0 ? 0 : static_cast<int>(k);
  }
  if (has("min_p")) {
    double p = 0;
    if (auto e = read_number(j["min_p"], "min_p", 0.0, 1.0, &p)) return *e;
    r.params.sampling.min_p = static_cast<float>(p);
  }
  if (has("n")) {
    int64_t n = 0;
    if (auto e = read_int(j["n"], "n", 1, 128, &n)) return *e;
    if (n > kMaxChoices) {
      return unsupported("n", "n > " + std::to_string(kMaxChoices) +
                                  " (the choices are generated one after another)");
    }
    r.n = static_cast<int>(n);
  }
  if (!chat && has("best_of")) {
    int64_t b = 0;
    if (auto e = read_int(j["best_of"], "best_of", 1, 20, &b)) return *e;
    if (b != 1) return unsupported("best_of", "best_of > 1");
  }
  if (has("stream")) {
    if (auto e = read_bool(j["stream"], "stream", &r.stream)) return *e;
  }
  if (has("stream_options")) {
    const Json& so = j["stream_options"];
    if (!so.is_object()) return wrong_type("stream_options", "an object", so);
    if (!r.stream) {
      return invalid("'stream_options' is only allowed when 'stream' is true", "stream_options");
    }
    for (const auto& [k, v] : so.items()) {
      if (k != "include_usage") {
        return invalid("unknown parameter 'stream_options." + k + "'", "stream_options." + k,
                       "unknown_parameter");
      }
      if (!v.is_null()) {
        if (auto e = read_bool(v, "stream_options.include_usage", &r.include_usage)) return *e;
      }
    }
  }
  if (has("stop")) {
    if (auto e = read_stop(j["stop"], &r.params.stop)) return *e;
  }
  if (has("seed")) {
    const Json& s = j["seed"];
    if (s.is_number_unsigned()) {
      r.params.sampling.seed = s.get<uint64_t>();
    } else {
      int64_t seed = 0;
      if (auto e = read_int(s, "seed", std::numeric_limits<int64_t>::min(),
                            std::numeric_limits<int64_t>::max(), &seed)) {
        return *e;
      }
      r.params.sampling.seed = static_cast<uint64_t>(seed);
    }
  } else if (!defaults.seed_given) {
    static thread_local std::mt19937_64 rng{std::random_device{}()};
    r.params.sampling.seed = rng();
  }
  if (has("ignore_eos")) {
    bool ignore = false;
    if (auto e = read_bool(j["ignore_eos"], "ignore_eos", &ignore)) return *e;
    r.params.stop_at_eos = !ignore;
  }

  // OpenAI's penalties and logit_bias (LogitAdjust: applied to the draft's and the target's rows
  // alike in the speculative modes).
  for (const char* k : {"presence_penalty", "frequency_penalty"}) {
    if (!has(k)) continue;
    double v = 0;
    if (auto e = read_number(j[k], k, -2.0, 2.0, &v)) return *e;
    (k[0] == 'p' ? r.params.adjust.presence_penalty : r.params.adjust.frequency_penalty) =
        static_cast<float>(v);
  }
  if (has("logit_bias")) {
    if (auto e = read_logit_bias(j["logit_bias"], defaults.vocab_size, &r.params.adjust.logit_bias))
      return *e;
  }
  // Log-probabilities: completions' logprobs = the number of alternatives (0..5, OpenAI's
  // limit); chat's logprobs = true with top_logprobs alternatives (0..20).
  if (has("logprobs")) {
    const Json& lp = j["logprobs"];
    if (chat) {
      bool want = false;
      if (auto e = read_bool(lp, "logprobs", &want)) return *e;
      if (want) r.params.logprobs = 0;
    } else {
      int64_t n = 0;
      if (auto e = read_int(lp, "logprobs", 0, 5, &n)) return *e;
      r.params.logprobs = static_cast<int>(n);
    }
  }
  if (has("response_format")) {
    if (auto e = read_response_format(j["response_format"], &r.params.json_schema)) return *e;
  }
  if (chat) {
    if (has("top_logprobs")) {
      int64_t n = 0;
      if (auto e = read_int(j["top_logprobs"], "top_logprobs", 0, kMaxTopLogprobs, &n)) return *e;
      if (r.params.logprobs >= 0) {
        r.params.logprobs = static_cast<int>(n);
      } else if (n > 0) {
        return invalid("'top_logprobs' needs 'logprobs' to be true", "top_logprobs");
      }
    }
    if (has("functions")) {
      if (!j["functions"].is_array()) return wrong_type("functions", "an array", j["functions"]);
      if (!j["functions"].empty())
        return unsupported("functions", "the deprecated 'functions' (use 'tools')");
    }
    if (has("function_call")) {
      const Json& fc = j["function_call"];
      if (!fc.is_string() && !fc.is_object())
        return wrong_type("function_call", "a string or an object", fc);
      if (!fc.is_string() || (fc != "none" && fc != "auto"))
        return unsupported("function_call", "the deprecated 'function_call' (use 'tool_choice')");
    }
    if (auto e = read_tools(j, &r.tools)) return *e;
    const ToolChoice c = r.tools.choice;
    if (!r.params.json_schema.empty() &&
        (c == ToolChoice::kRequired || c == ToolChoice::kFunction)) {
      return invalid(
          "'response_format' and a tool_choice that forces a call both say what the reply is; "
          "give one",
          "response_format");
    }
  } else {
    if (has("echo")) {
      bool echo = false;
      if (auto e = read_bool(j["echo"], "echo", &echo)) return *e;
      r.echo = echo;
    }
    if (has("suffix")) {
      if (!j["suffix"].is_string()) return wrong_type("suffix", "a string", j["suffix"]);
      if (!j["suffix"].get<std::string>().empty())
        return unsupported("suffix", "suffix (insertion)");
    }
  }
  if (r.max_tokens && *r.max_tokens == 0 && !r.echo) {
    return invalid("'max_tokens' must be at least 1 (0 only with 'echo': the prompt alone)",
                   has("max_tokens") ? "max_tokens" : "max_completion_tokens", "invalid_value");
  }
  return r;
}

// ---- responses -------------------------------------------------------------------------------

std::string new_response_id(Endpoint endpoint) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%016llx%08llx", static_cast<unsigned long long>(rng()),
                static_cast<unsigned long long>(rng() & 0xffffffffu));
  return std::string(endpoint == Endpoint::kChatCompletions ? "chatcmpl-" : "cmpl-") + buf;
}

Json usage_json(int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens) {
  return Json{{"prompt_tokens", prompt_tokens},
              {"completion_tokens", completion_tokens},
              {"total_tokens", prompt_tokens + completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
}

Json stats_json(const std::vector<GenerationResult>& results, const ResponseStats& extra) {
  const SpeculativeStats& spec = extra.spec;
  double prefill_s = 0, decode_s = 0;
  int64_t decode_tokens = 0;
  for (const GenerationResult& r : results) {
    prefill_s += r.stats.prefill_s;
    decode_s += r.stats.decode_s;
    decode_tokens += r.stats.decode_tokens();
  }
  Json speculative = {
      {"drafted_tokens", spec.drafted},
      {"accepted_tokens", spec.accepted},
      {"acceptance_rate", spec.drafted > 0 ? Json(static_cast<double>(spec.accepted) /
                                                  static_cast<double>(spec.drafted))
                                           : Json(nullptr)},
      {"rounds", spec.rounds},
      {"mean_accepted_length", spec.rounds > 0 ? Json(1.0 + static_cast<double>(spec.accepted) /
                                                                static_cast<double>(spec.rounds))
                                               : Json(nullptr)}};
  return Json{
      {"mode", extra.mode},
      {"queue_s", extra.queue_s},
      {"prefill_s", prefill_s},
      {"decode_s", decode_s},
      {"decode_tokens_per_s", decode_s > 0 ? static_cast<double>(decode_tokens) / decode_s : 0.0},
      {"speculative", std::move(speculative)}};
}

namespace {

// Code points of UTF-8 text (text_offset counts characters, as Python servers do).
int64_t code_points(const std::string& text) {
  int64_t n = 0;
  for (unsigned char c : text) n += (c & 0xC0) != 0x80;
  return n;
}

Json token_bytes(const std::string& text) {
  Json bytes = Json::array();
  for (unsigned char c : text) bytes.push_back(static_cast<int>(c));
  return bytes;
}

}  // namespace

Json logprobs_json(Endpoint endpoint, const std::vector<TokenLogprob>& entries,
                   const Tokenizer& tokenizer, int64_t* text_offset, std::string_view echoed) {
  if (endpoint == Endpoint::kChatCompletions) {
    Json content = Json::array();
    for (const TokenLogprob& e : entries) {
      const std::string text = tokenizer.token_text(e.id);
      Json top = Json::array();
      for (const auto& [id, logprob] : e.top) {
        const std::string t = tokenizer.token_text(id);
        top.push_back({{"token", t}, {"logprob", logprob}, {"bytes", token_bytes(t)}});
      }
      content.push_back({{"token", text},
                         {"logprob", e.logprob},
                         {"bytes", token_bytes(text)},
                         {"top_logprobs", std::move(top)}});
    }
    return Json{{"content", std::move(content)}, {"refusal", nullptr}};
  }
  Json tokens = Json::array(), token_logprobs = Json::array(), tops = Json::array(),
       offsets = Json::array();
  size_t echo_pos = 0;  // bytes of `echoed` the entries so far produced
  for (const TokenLogprob& e : entries) {
    const std::string text = tokenizer.token_text(e.id);
    tokens.push_back(text);
    bool in_text = true;
    if (echo_pos < echoed.size()) {
      in_text = !tokenizer.is_special(e.id) || echoed.substr(echo_pos).rfind(text, 0) == 0;
      if (in_text) echo_pos += text.size();
    }
    if (std::isnan(e.logprob)) {  // an echoed prompt's first token: nothing predicts it
      token_logprobs.push_back(nullptr);
      tops.push_back(nullptr);
    } else {
      token_logprobs.push_back(e.logprob);
      // The alternatives and the chosen token (as OpenAI's legacy API and vLLM report it).
      Json top = Json::object();
      for (const auto& [id, logprob] : e.top) top[tokenizer.token_text(id)] = logprob;
      top[text] = e.logprob;
      tops.push_back(std::move(top));
    }
    offsets.push_back(*text_offset);
    if (in_text) *text_offset += code_points(text);
  }
  return Json{{"tokens", std::move(tokens)},
              {"token_logprobs", std::move(token_logprobs)},
              {"top_logprobs", std::move(tops)},
              {"text_offset", std::move(offsets)}};
}

namespace {

// usage over a request's choices: each prompt once (its first choice, results[p * n]), every
// choice's completion.
Json choices_usage(const std::vector<GenerationResult>& results, int n) {
  int64_t completion = 0, prompt = 0, cached = 0;
  for (size_t c = 0; c < results.size(); ++c) {
    const GenerationStats& st = results[c].stats;
    completion += st.generated_tokens;
    if (c % static_cast<size_t>(std::max(1, n)) == 0) {
      prompt += st.prompt_tokens;
      cached += st.cached_prompt_tokens;
    }
  }
  return usage_json(prompt, completion, cached);
}

// The response around its choices (object "text_completion" or "chat.completion").
Json response_json(const ResponseMeta& meta, const char* object, Json choices,
                   const std::vector<GenerationResult>& results, const ResponseStats& extra) {
  return Json{{"id", meta.id},
              {"object", object},
              {"created", meta.created},
              {"model", meta.model},
              {"choices", std::move(choices)},
              {"usage", choices_usage(results, extra.n)},
              {"quantspec", stats_json(results, extra)}};
}

Json logprobs_at(const std::vector<Json>& logprobs, size_t i) {
  return i < logprobs.size() ? logprobs[i] : Json(nullptr);
}

}  // namespace

namespace {

// One choice per result: {index, <body key>: body(result), logprobs, finish_reason}.
template <class Body>
Json choices_json(const std::vector<GenerationResult>& results, const std::vector<Json>& logprobs,
                  const char* key, const Body& body) {
  Json choices = Json::array();
  for (size_t i = 0; i < results.size(); ++i) {
    choices.push_back({{"index", i},
                       {key, body(results[i])},
                       {"logprobs", logprobs_at(logprobs, i)},
                       {"finish_reason", results[i].finish_reason}});
  }
  return choices;
}

}  // namespace

Json completion_response(const ResponseMeta& meta, const std::vector<GenerationResult>& results,
                         const ResponseStats& extra, const std::vector<Json>& logprobs) {
  Json choices = choices_json(results, logprobs, "text",
                              [](const GenerationResult& r) { return Json(r.text); });
  return response_json(meta, "text_completion", std::move(choices), results, extra);
}

Json chat_response(const ResponseMeta& meta, const std::vector<GenerationResult>& results,
                   const ResponseStats& extra, const std::vector<Json>& logprobs) {
  Json choices = choices_json(results, logprobs, "message", [](const GenerationResult& r) {
    return Json{{"role", "assistant"}, {"content", r.text}};
  });
  return response_json(meta, "chat.completion", std::move(choices), results, extra);
}

Json completion_chunk(const ResponseMeta& meta, std::string_view text,
                      const std::string& finish_reason, Json logprobs, int index) {
  Json choice = {{"index", index},
                 {"text", std::string(text)},
                 {"logprobs", std::move(logprobs)},
                 {"finish_reason", finish_reason.empty() ? Json(nullptr) : Json(finish_reason)}};
  return Json{{"id", meta.id},
              {"object", "text_completion"},
              {"created", meta.created},
              {"model", meta.model},
              {"choices", Json::array({std::move(choice)})}};
}

Json chat_chunk(const ResponseMeta& meta, const Json& delta, const std::string& finish_reason,
                Json logprobs, int index) {
  Json choice = {{"index", index},
                 {"delta", delta},
                 {"logprobs", std::move(logprobs)},
                 {"finish_reason", finish_reason.empty() ? Json(nullptr) : Json(finish_reason)}};
  return Json{{"id", meta.id},
              {"object", "chat.completion.chunk"},
              {"created", meta.created},
              {"model", meta.model},
              {"choices", Json::array({std::move(choice)})}};
}

Json usage_chunk(const ResponseMeta& meta, Endpoint endpoint,
                 const std::vector<GenerationResult>& results, int n) {
  return Json{{"id", meta.id},
              {"object", endpoint == Endpoint::kChatCompletions ? "chat.completion.chunk"
                                                                : "text_completion"},
              {"created", meta.created},
              {"model", meta.model},
              {"choices", Json::array()},
              {"usage", choices_usage(results, n)}};
}

std::string sse_event(const Json& j) {
  return "data: " + dump_json(j) + "\n\n";
}

}  // namespace qs::server
