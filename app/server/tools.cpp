#include "tools.h"

#include <algorithm>
#include <random>
#include <set>

#include "api_common.h"
#include "engine/json_schema.h"

namespace qs::server {

namespace {

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kMistralTag = "[TOOL_CALLS]";

bool is_space(char c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

size_t skip_space(std::string_view s, size_t i) {
  while (i < s.size() && is_space(s[i])) ++i;
  return i;
}

std::string_view trim(std::string_view s) {
  const size_t b = skip_space(s, 0);
  size_t e = s.size();
  while (e > b && is_space(s[e - 1])) --e;
  return s.substr(b, e - b);
}

// The function object of the tool named `name`, or nullptr.
const Json* find_function(const ToolRequest& t, std::string_view name) {
  for (const Json& tool : t.tools) {
    const Json& f = tool["function"];
    if (f["name"].get<std::string>() == name) return &f;
  }
  return nullptr;
}

// A function's parameters schema; none given is a function without arguments (as OpenAI).
Json parameters_of(const Json& function) {
  if (function.contains("parameters") && !function["parameters"].is_null())
    return function["parameters"];
  return Json{{"type", "object"}, {"properties", Json::object()}, {"additionalProperties", false}};
}

// A schema moved to `prefix` inside a larger one: its "#..." references follow it. Literal values
// (const, enum, default, examples) are data, not schemas, and stay as they are.
void rebase_refs(Json& j, const std::string& prefix) {
  if (j.is_array()) {
    for (Json& v : j) rebase_refs(v, prefix);
    return;
  }
  if (!j.is_object()) return;
  for (auto& [k, v] : j.items()) {
    if (k == "const" || k == "enum" || k == "default" || k == "examples") continue;
    if (k == "$ref" && v.is_string()) {
      const std::string ref = v.get<std::string>();
      if (!ref.empty() && ref[0] == '#') v = prefix + ref.substr(1);
    } else {
      rebase_refs(v, prefix);
    }
  }
}

const char* arguments_key(ToolFormat f) {
  return f == ToolFormat::kLlama3Json ? "parameters" : "arguments";
}

std::optional<Json> parse_json(std::string_view s) {
  Json j = Json::parse(s.begin(), s.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

// A call the model wrote: {"name": a tool's name, "arguments" or "parameters": an object (or its
// JSON text)}; anything else is not a call.
std::optional<ToolCall> call_from(const Json& j, const ToolRequest& t) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return std::nullopt;
  const std::string name = j["name"].get<std::string>();
  if (find_function(t, name) == nullptr) return std::nullopt;
  Json args = Json::object();
  for (const char* key : {"arguments", "parameters"}) {
    if (j.contains(key)) args = j[key];
  }
  if (args.is_string()) {
    auto parsed = parse_json(args.get<std::string>());
    if (!parsed) return std::nullopt;
    args = std::move(*parsed);
  }
  if (!args.is_object()) return std::nullopt;
  return ToolCall{"", name, args.dump()};
}

using Calls = std::optional<std::vector<ToolCall>>;

// An array of calls, or one call.
Calls calls_from(const Json& j, const ToolRequest& t) {
  std::vector<ToolCall> calls;
  for (const Json& item : j.is_array() ? j : Json::array({j})) {
    auto call = call_from(item, t);
    if (!call) return std::nullopt;
    calls.push_back(std::move(*call));
  }
  if (calls.empty()) return std::nullopt;
  return calls;
}

// <tool_call>{...}</tool_call> blocks, back to back (the last may lack its closing tag).
Calls parse_hermes(std::string_view s, const ToolRequest& t) {
  std::vector<ToolCall> calls;
  size_t i = skip_space(s, 0);
  while (i < s.size()) {
    if (s.substr(i, kHermesOpen.size()) != kHermesOpen) return std::nullopt;
    i += kHermesOpen.size();
    const size_t close = s.find(kHermesClose, i);
    auto body = parse_json(trim(s.substr(i, close == std::string_view::npos ? s.npos : close - i)));
    if (!body) return std::nullopt;
    auto call = call_from(*body, t);
    if (!call) return std::nullopt;
    calls.push_back(std::move(*call));
    if (close == std::string_view::npos) break;
    i = skip_space(s, close + kHermesClose.size());
  }
  if (calls.empty()) return std::nullopt;
  return calls;
}

// JSON values (objects or arrays of calls) separated by ";" (Llama 3) or whitespace.
Calls parse_json_calls(std::string_view s, const ToolRequest& t) {
  std::vector<ToolCall> calls;
  size_t i = skip_space(s, 0);
  if (s.substr(i, kMistralTag.size()) == kMistralTag) i = skip_space(s, i + kMistralTag.size());
  while (i < s.size()) {
    if (s[i] != '{' && s[i] != '[') return std::nullopt;
    const size_t end = scan_brackets(s, i).end;
    if (end == std::string_view::npos) return std::nullopt;
    auto value = parse_json(s.substr(i, end - i));
    if (!value) return std::nullopt;
    auto some = calls_from(*value, t);
    if (!some) return std::nullopt;
    calls.insert(calls.end(), some->begin(), some->end());
    i = skip_space(s, end);
    if (i < s.size() && s[i] == ';') i = skip_space(s, i + 1);
  }
  if (calls.empty()) return std::nullopt;
  return calls;
}

std::string new_call_id(ToolFormat f) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char kAlnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  // Mistral's template requires ids of 9 letters and digits.
  const bool mistral = f == ToolFormat::kMistral;
  std::string id = mistral ? "" : "call_";
  for (int i = 0; i < (mistral ? 9 : 24); ++i) id += kAlnum[rng() % (sizeof(kAlnum) - 1)];
  return id;
}

// The length of the longest suffix of s that a call's opening tag starts with.
size_t open_tag_prefix(std::string_view s) {
  for (size_t n = std::min(s.size(), kHermesOpen.size() - 1); n > 0; --n) {
    if (kHermesOpen.substr(0, n) == s.substr(s.size() - n)) return n;
  }
  return 0;
}

std::optional<ApiError> read_function(const Json& f, const std::string& p, std::string* name) {
  if (!f.is_object()) return wrong_type(p, "an object", f);
  for (const auto& [k, v] : f.items()) {
    if (k != "name" && k != "description" && k != "parameters" && k != "strict")
      return invalid("unknown parameter '" + p + "." + k + "'", p + "." + k, "unknown_parameter");
  }
  if (!f.contains("name"))
    return invalid("'" + p + "' needs a 'name'", p + ".name", "missing_required_parameter");
  if (auto e = read_name(f["name"], p + ".name", name)) return e;
  if (f.contains("description") && !f["description"].is_string() && !f["description"].is_null())
    return wrong_type(p + ".description", "a string", f["description"]);
  if (f.contains("parameters") && !f["parameters"].is_object() && !f["parameters"].is_null())
    return wrong_type(p + ".parameters", "an object (a JSON Schema)", f["parameters"]);
  if (f.contains("strict") && !f["strict"].is_boolean() && !f["strict"].is_null())
    return wrong_type(p + ".strict", "a boolean", f["strict"]);
  return std::nullopt;
}

std::optional<ApiError> read_tool_list(const Json& tools, ToolRequest* t) {
  if (!tools.is_array()) return wrong_type("tools", "an array", tools);
  if (tools.size() > kMaxTools)
    return invalid("'tools' has " + std::to_string(tools.size()) + " entries; at most " +
                       std::to_string(kMaxTools),
                   "tools");
  std::set<std::string> names;
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string p = "tools[" + std::to_string(i) + "]";
    const Json& tool = tools[i];
    if (!tool.is_object()) return wrong_type(p, "an object", tool);
    for (const auto& [k, v] : tool.items()) {
      if (k != "type" && k != "function")
        return invalid("unknown parameter '" + p + "." + k + "'", p + "." + k, "unknown_parameter");
    }
    if (!tool.contains("type") || !tool["type"].is_string())
      return invalid("'" + p + "' needs a string 'type'", p + ".type",
                     "missing_required_parameter");
    const std::string type = tool["type"].get<std::string>();
    if (type != "function") return unsupported(p + ".type", "tool type '" + type + "'");
    if (!tool.contains("function"))
      return invalid("'" + p + "' needs a 'function'", p + ".function",
                     "missing_required_parameter");
    std::string name;
    if (auto e = read_function(tool["function"], p + ".function", &name)) return e;
    if (!names.insert(name).second)
      return invalid("two tools are named '" + name + "'", p + ".function.name");
  }
  t->tools = tools;
  return std::nullopt;
}

std::optional<ApiError> read_tool_choice(const Json& tc, ToolRequest* t) {
  if (tc.is_string()) {
    const std::string s = tc.get<std::string>();
    if (s == "none") {
      t->choice = ToolChoice::kNone;
    } else if (s == "auto") {
      t->choice = ToolChoice::kAuto;
    } else if (s == "required") {
      t->choice = ToolChoice::kRequired;
    } else {
      return invalid(
          "'tool_choice' must be none, auto, required or {\"type\": \"function\", "
          "\"function\": {\"name\": ...}}, got '" +
              s + "'",
          "tool_choice");
    }
    return std::nullopt;
  }
  if (!tc.is_object()) return wrong_type("tool_choice", "a string or an object", tc);
  for (const auto& [k, v] : tc.items()) {
    if (k != "type" && k != "function")
      return invalid("unknown parameter 'tool_choice." + k + "'", "tool_choice." + k,
                     "unknown_parameter");
  }
  if (!tc.contains("type") || tc["type"] != "function")
    return invalid("'tool_choice.type' must be 'function'", "tool_choice.type");
  if (!tc.contains("function") || !tc["function"].is_object())
    return invalid("'tool_choice' needs a 'function' object with its 'name'",
                   "tool_choice.function", "missing_required_parameter");
  const Json& f = tc["function"];
  for (const auto& [k, v] : f.items()) {
    if (k != "name")
      return invalid("unknown parameter 'tool_choice.function." + k + "'",
                     "tool_choice.function." + k, "unknown_parameter");
  }
  if (!f.contains("name"))
    return invalid("'tool_choice.function' needs a 'name'", "tool_choice.function.name",
                   "missing_required_parameter");
  if (auto e = read_name(f["name"], "tool_choice.function.name", &t->function)) return e;
  t->choice = ToolChoice::kFunction;
  return std::nullopt;
}

// The parameters schemas a constrained reply follows must compile.
std::optional<ApiError> check_constrained(const ToolRequest& t) {
  if (t.choice != ToolChoice::kRequired && t.choice != ToolChoice::kFunction) return std::nullopt;
  if (t.tools.empty()) {
    return invalid(std::string("tool_choice ") +
                       (t.choice == ToolChoice::kRequired ? "'required'" : "naming a function") +
                       " needs 'tools'",
                   "tool_choice");
  }
  if (t.choice == ToolChoice::kFunction && find_function(t, t.function) == nullptr) {
    return invalid("tool_choice names function '" + t.function + "', which is not in 'tools'",
                   "tool_choice.function.name");
  }
  if (t.choice == ToolChoice::kRequired && t.tools.size() > kMaxRequiredTools) {
    return unsupported("tool_choice", "tool_choice 'required' among more than " +
                                          std::to_string(kMaxRequiredTools) +
                                          " tools (name one function, or "
                                          "use 'auto')");
  }
  for (size_t i = 0; i < t.tools.size(); ++i) {
    const Json& f = t.tools[i]["function"];
    if (t.choice == ToolChoice::kFunction && f["name"] != t.function) continue;
    auto grammar = JsonGrammar::compile(parameters_of(f).dump());
    if (!grammar.ok()) {
      return invalid(grammar.error().message,
                     "tools[" + std::to_string(i) + "].function.parameters");
    }
  }
  return std::nullopt;
}

}  // namespace

ToolFormat tool_format_of(std::string_view source) {
  if (source.find(kMistralTag) != std::string_view::npos) return ToolFormat::kMistral;
  if (source.find(kHermesOpen) != std::string_view::npos) return ToolFormat::kHermes;
  const bool llama3 = source.find("<|start_header_id|>") != std::string_view::npos;
  if (source.find("<|python_tag|>") != std::string_view::npos ||
      (llama3 && source.find("\"parameters\"") != std::string_view::npos)) {
    return ToolFormat::kLlama3Json;
  }
  return ToolFormat::kHermes;
}

const char* tool_format_name(ToolFormat f) {
  switch (f) {
    case ToolFormat::kHermes:
      return "hermes";
    case ToolFormat::kLlama3Json:
      return "llama3_json";
    case ToolFormat::kMistral:
      return "mistral";
  }
  return "?";
}

std::optional<ApiError> read_tools(const Json& body, ToolRequest* out) {
  auto has = [&](const char* k) { return body.contains(k) && !body[k].is_null(); };
  ToolRequest t;
  if (has("tools")) {
    if (auto e = read_tool_list(body["tools"], &t)) return e;
  }
  t.choice = t.tools.empty() ? ToolChoice::kNone : ToolChoice::kAuto;
  if (has("tool_choice")) {
    if (auto e = read_tool_choice(body["tool_choice"], &t)) return e;
  }
  if (has("parallel_tool_calls")) {
    if (auto e = read_bool(body["parallel_tool_calls"], "parallel_tool_calls", &t.parallel))
      return e;
  }
  if (t.tools.empty() && t.choice == ToolChoice::kAuto) t.choice = ToolChoice::kNone;
  if (auto e = check_constrained(t)) return e;
  *out = std::move(t);
  return std::nullopt;
}

std::string tool_output_schema(const ToolRequest& t, ToolFormat f) {
  if (t.choice == ToolChoice::kFunction) return parameters_of(*find_function(t, t.function)).dump();
  if (t.choice != ToolChoice::kRequired) return "";
  const std::string key = arguments_key(f);
  Json alternatives = Json::array();
  for (size_t i = 0; i < t.tools.size(); ++i) {
    const Json& function = t.tools[i]["function"];
    Json params = parameters_of(function);
    rebase_refs(params, "#/items/anyOf/" + std::to_string(i) + "/properties/" + key);
    alternatives.push_back(
        Json{{"type", "object"},
             {"properties", {{"name", {{"const", function["name"]}}}, {key, std::move(params)}}},
             {"required", {"name", key}}});
  }
  Json schema = {{"type", "array"}, {"minItems", 1}};
  if (!t.parallel) schema["maxItems"] = 1;
  schema["items"] = Json{{"anyOf", std::move(alternatives)}};
  return schema.dump();
}

std::optional<ApiError> read_message_tool_calls(const Json& calls, const std::string& param,
                                                Json* out) {
  if (!calls.is_array()) return wrong_type(param, "an array", calls);
  Json converted = Json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    const std::string p = param + "[" + std::to_string(i) + "]";
    const Json& c = calls[i];
    if (!c.is_object()) return wrong_type(p, "an object", c);
    for (const auto& [k, v] : c.items()) {
      if (k != "id" && k != "type" && k != "function")
        return invalid("unknown parameter '" + p + "." + k + "'", p + "." + k, "unknown_parameter");
    }
    if (!c.contains("id") || !c["id"].is_string())
      return invalid("'" + p + "' needs a string 'id'", p + ".id", "missing_required_parameter");
    if (c.contains("type") && c["type"] != "function")
      return invalid("'" + p + ".type' must be 'function'", p + ".type");
    if (!c.contains("function") || !c["function"].is_object())
      return invalid("'" + p + "' needs a 'function' object", p + ".function",
                     "missing_required_parameter");
    const Json& f = c["function"];
    for (const auto& [k, v] : f.items()) {
      if (k != "name" && k != "arguments")
        return invalid("unknown parameter '" + p + ".function." + k + "'", p + ".function." + k,
                       "unknown_parameter");
    }
    std::string name;
    if (!f.contains("name"))
      return invalid("'" + p + ".function' needs a 'name'", p + ".function.name",
                     "missing_required_parameter");
    if (auto e = read_name(f["name"], p + ".function.name", &name)) return e;
    if (!f.contains("arguments") || !f["arguments"].is_string())
      return invalid("'" + p + ".function' needs 'arguments' (a JSON text)",
                     p + ".function.arguments", "missing_required_parameter");
    const std::string text = f["arguments"].get<std::string>();
    // An empty text is no arguments (as vLLM); else a JSON object.
    auto args = trim(text).empty() ? std::optional<Json>(Json::object()) : parse_json(text);
    if (!args || !args->is_object()) {
      return invalid("'" + p + ".function.arguments' must be the JSON text of an object",
                     p + ".function.arguments");
    }
    converted.push_back(Json{{"id", c["id"]},
                             {"type", "function"},
                             {"function", {{"name", name}, {"arguments", std::move(*args)}}}});
  }
  *out = std::move(converted);
  return std::nullopt;
}

namespace {

// The end of the JSON string starting at s[i] ('"'), one past its closing quote; npos if it does
// not end in s.
size_t string_end(std::string_view s, size_t i) {
  for (++i; i < s.size(); ++i) {
    if (s[i] == '\\') {
      ++i;
    } else if (s[i] == '"') {
      return i + 1;
    }
  }
  return std::string_view::npos;
}

Json call_delta(size_t index) {
  return Json{{"index", index}};
}

}  // namespace

bool RequiredCallScan::header(std::string_view text, ToolFormat f, Json* deltas) {
  // {"name": NAME, "arguments": (pos_ is at the call's '{'): the parts in order, 'k' a key (a
  // string; the constraining schema fixes which), 's' the name, or that punctuation.
  size_t i = pos_ + 1;
  std::string name;
  for (const char* want : {"k", ":", "s", ",", "k", ":"}) {
    i = skip_space(text, i);
    if (i >= text.size()) return false;
    if (*want == ':' || *want == ',') {
      if (text[i] != *want) {
        phase_ = kLost;
        return true;
      }
      ++i;
      continue;
    }
    if (text[i] != '"') {
      phase_ = kLost;
      return true;
    }
    const size_t end = string_end(text, i);
    if (end == std::string_view::npos) return false;
    if (*want == 's') {
      auto value = parse_json(text.substr(i, end - i));
      if (!value || !value->is_string()) {
        phase_ = kLost;
        return true;
      }
      name = value->get<std::string>();
    }
    i = end;
  }
  i = skip_space(text, i);
  if (i >= text.size()) return false;
  calls_.push_back(ToolCall{new_call_id(f), name, ""});
  Json first = call_delta(calls_.size() - 1);
  first["id"] = calls_.back().id;
  first["type"] = "function";
  first["function"] = {{"name", name}, {"arguments", ""}};
  deltas->push_back(std::move(first));
  pos_ = i;
  phase_ = kArguments;
  depth_ = 0;
  in_string_ = escaped_ = false;
  return true;
}

void RequiredCallScan::scan(std::string_view text, ToolFormat f, Json* deltas) {
  // Where the current call's arguments start being new in this read.
  size_t piece = phase_ == kArguments ? pos_ : std::string_view::npos;
  auto flush = [&] {
    if (piece == std::string_view::npos || pos_ == piece) return;
    const std::string more(text.substr(piece, pos_ - piece));
    calls_.back().arguments += more;
    Json delta = call_delta(calls_.size() - 1);
    delta["function"] = {{"arguments", more}};
    deltas->push_back(std::move(delta));
    piece = pos_;
  };
  while (phase_ != kDone && phase_ != kLost) {
    if (phase_ != kArguments) pos_ = skip_space(text, pos_);
    if (pos_ >= text.size()) break;
    const char c = text[pos_];
    switch (phase_) {
      case kOpen:
      case kCall:
        if (c != (phase_ == kOpen ? '[' : '{')) {
          phase_ = kLost;
          break;
        }
        if (phase_ == kOpen) {
          ++pos_;
          phase_ = kCall;
        } else {
          phase_ = kHeader;
        }
        break;
      case kHeader:
        if (!header(text, f, deltas)) {
          flush();
          return;
        }
        piece = pos_;
        break;
      case kArguments:
        ++pos_;
        if (in_string_) {
          if (escaped_) {
            escaped_ = false;
          } else if (c == '\\') {
            escaped_ = true;
          } else if (c == '"') {
            in_string_ = false;
          }
        } else if (c == '"') {
          in_string_ = true;
        } else if (c == '{' || c == '[') {
          ++depth_;
        } else if ((c == '}' || c == ']') && --depth_ == 0) {
          flush();
          piece = std::string_view::npos;
          phase_ = kAfter;
        }
        break;
      case kAfter:
        phase_ = c == '}' ? kBetween : kLost;
        ++pos_;
        break;
      case kBetween:
        phase_ = c == ',' ? kCall : c == ']' ? kDone : kLost;
        ++pos_;
        break;
      default:
        break;
    }
  }
  flush();
}

ToolReplyReader::ToolReplyReader(ToolRequest t, ToolFormat f) : request_(std::move(t)), format_(f) {
  holding_ = request_.choice == ToolChoice::kRequired;
}

ToolReplyPart ToolReplyReader::feed(std::string_view text) {
  ToolReplyPart part;
  if (request_.choice == ToolChoice::kNone || free_) {
    part.content = text;
    return part;
  }
  text_ += text;
  if (request_.choice == ToolChoice::kRequired) {
    required_.scan(text_, format_, &part.tool_calls);
    return part;
  }
  if (holding_) return part;
  const std::string_view all = text_;
  if (request_.choice == ToolChoice::kFunction) {  // the arguments, from the first visible byte
    const size_t from = call_id_.empty() ? skip_space(all, 0) : sent_;
    if (from == all.size()) return part;
    Json call = {{"index", 0}};
    if (call_id_.empty()) {
      call_id_ = new_call_id(format_);
      call["id"] = call_id_;
      call["type"] = "function";
      call["function"]["name"] = request_.function;
    }
    call["function"]["arguments"] = std::string(all.substr(from));
    part.tool_calls.push_back(std::move(call));
    sent_ = all.size();
    return part;
  }
  if (format_ == ToolFormat::kHermes) {
    const size_t open = all.find(kHermesOpen, sent_);
    const size_t end = open != std::string_view::npos ? open : all.size() - open_tag_prefix(all);
    part.content = all.substr(sent_, end - sent_);
    sent_ = end;
    holding_ = open != std::string_view::npos;
    return part;
  }
  // The JSON formats: a call is the whole reply, so its first visible character decides.
  const size_t first = skip_space(all, 0);
  if (first == all.size()) return part;
  if (all[first] == (format_ == ToolFormat::kLlama3Json ? '{' : '[')) {
    holding_ = true;
    return part;
  }
  free_ = true;
  part.content = std::move(text_);
  return part;
}

ToolReply ToolReplyReader::finish() {
  ToolReply reply;
  if (request_.choice == ToolChoice::kNone || free_) return reply;
  if (request_.choice == ToolChoice::kFunction) {
    // The whole reply is its arguments (as written, even when cut), which went out as they came
    // once one was visible; a reply with none still makes its call.
    reply.streamed = !call_id_.empty();
    if (call_id_.empty()) call_id_ = new_call_id(format_);
    const std::string_view all = text_;
    reply.calls = {
        ToolCall{call_id_, request_.function, std::string(all.substr(skip_space(all, 0)))}};
    return reply;
  }
  if (request_.choice == ToolChoice::kRequired && !required_.calls().empty() && !required_.lost()) {
    // They went out as they came (cut where the reply was).
    reply.calls = required_.calls();
    reply.streamed = true;
    return reply;
  }
  const std::string_view rest = std::string_view(text_).substr(sent_);
  Calls calls;
  if (request_.choice == ToolChoice::kRequired) {
    auto value = parse_json(rest);
    if (value && value->is_array()) calls = calls_from(*value, request_);
  } else if (format_ == ToolFormat::kHermes) {
    calls = parse_hermes(rest, request_);
  } else {
    calls = parse_json_calls(rest, request_);
  }
  if (!calls) {
    reply.content = std::string(rest);
    return reply;
  }
  reply.calls = std::move(*calls);
  for (ToolCall& c : reply.calls) c.id = new_call_id(format_);
  return reply;
}

std::string tool_finish_reason(const ToolRequest& t, const ToolReply& reply,
                               const std::string& finish_reason) {
  if (reply.calls.empty() || t.choice == ToolChoice::kFunction || finish_reason == "length")
    return finish_reason;
  return "tool_calls";
}

Json tool_calls_json(const std::vector<ToolCall>& calls, bool index) {
  Json out = Json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    Json call;
    if (index) call["index"] = i;
    call["id"] = calls[i].id;
    call["type"] = "function";
    call["function"] = {{"name", calls[i].name}, {"arguments", calls[i].arguments}};
    out.push_back(std::move(call));
  }
  return out;
}

void take_tool_calls(const ToolRequest& t, ToolFormat f, Json* choice) {
  if (t.choice == ToolChoice::kNone) return;
  Json& message = (*choice)["message"];
  ToolReplyReader reader(t, f);
  std::string content = reader.feed(message["content"].get<std::string>()).content;
  ToolReply reply = reader.finish();
  if (reply.calls.empty()) return;
  content += reply.content;
  message["content"] = trim(content).empty() ? Json(nullptr) : Json(content);
  message["tool_calls"] = tool_calls_json(reply.calls);
  (*choice)["finish_reason"] =
      tool_finish_reason(t, reply, (*choice)["finish_reason"].get<std::string>());
}

}  // namespace qs::server
