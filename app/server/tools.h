// Tool calling on /v1/chat/completions: OpenAI's tools, tool_choice and parallel_tool_calls, the
// assistant's tool_calls and the tool role in messages (docs in app/server/README.md).
//
//  - The chat template sees the request's tools as `tools` (HF apply_chat_template's argument)
//    and an assistant message's calls with their arguments as objects, as vLLM passes them.
//  - tool_choice "required" or a named function constrains the reply with a JSON Schema
//    (tool_output_schema): "required" is an array of {"name", "arguments"} objects (one when
//    parallel_tool_calls is false), a named function its arguments object; a stream sends the
//    calls as they come (RequiredCallScan; as OpenAI: cut by max_tokens, the arguments are cut
//    too). As vLLM's guided
//    tool choice, the reply is plain JSON, not the model's own call format.
//  - tool_choice "auto" (the default with tools) leaves the reply free and takes out the calls
//    written in the model's format (ToolFormat, read from its chat template); a reply whose calls
//    do not parse, or name a function not in tools, is content.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "api_common.h"
#include "engine/json_constraint.h"

namespace qs::server {

// How a model writes its calls, as its chat template teaches it.
enum class ToolFormat {
  kHermes,      // <tool_call>{"name": ..., "arguments": {...}}</tool_call>, after any text
                // (Qwen2 / 2.5, Hermes; the default for templates that say nothing)
  kLlama3Json,  // the whole reply {"name": ..., "parameters": {...}}, several joined by ";"
                // (Llama 3.1 / 3.2)
  kMistral,     // [TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...] (Mistral v0.3; the
                // special token is left out of decoded text, so a reply that is such an array)
};

ToolFormat tool_format_of(std::string_view chat_template_source);
const char* tool_format_name(ToolFormat f);

enum class ToolChoice { kNone, kAuto, kRequired, kFunction };

struct ToolRequest {
  Json tools = Json::array();  // as given: [{"type": "function", "function": {...}}]
  ToolChoice choice = ToolChoice::kNone;
  std::string function;  // kFunction: its name
  bool parallel = true;  // parallel_tool_calls
};

// The most tools a request may give (OpenAI's limit), and the most "required" can choose among
// (each is followed as a reading of the reply until its name differs: JsonState's limit).
constexpr size_t kMaxTools = 128;
constexpr size_t kMaxRequiredTools = kJsonMaxThreads;

// tools, tool_choice and parallel_tool_calls of a chat request body. The parameters schemas that
// will constrain a reply ("required", a named function) are compiled here, so that one the engine
// cannot follow is a 400 naming it.
std::optional<ApiError> read_tools(const Json& body, ToolRequest* out);

// The JSON Schema that constrains the reply ("" for tool_choice none / auto). The arguments'
// key is the model's own ("parameters" for kLlama3Json, else "arguments").
std::string tool_output_schema(const ToolRequest& t, ToolFormat f);

// An assistant message's tool_calls (OpenAI's form: arguments are a JSON text) as chat templates
// read them (arguments an object), checked.
std::optional<ApiError> read_message_tool_calls(const Json& calls, const std::string& param,
                                                Json* out);

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // a JSON object's text
};

// What may go out of a reply now: content, and for a named function or "required" (tool_choice)
// the calls' next pieces as stream deltas ([{"index": i, ...}]: a call's first with its id and
// name).
struct ToolReplyPart {
  std::string content;
  Json tool_calls = Json::array();
};

// What a reply says besides its content: the calls it makes.
struct ToolReply {
  std::string content;  // the text not sent yet (all of it when the calls did not parse)
  std::vector<ToolCall> calls;
  bool streamed = false;  // the calls already went out as feed()'s deltas (a named function's,
                          // "required"'s)
};

// tool_choice "required"'s reply, [{"name": ..., "arguments": {...}}, ...] in that key order (the
// constraining schema's), read as it comes: each call once its name is whole, then its arguments
// as they are written.
class RequiredCallScan {
 public:
  // Reads `text` (all of the reply so far) past where it stopped; appends stream deltas for what
  // is new to `deltas` (a call's first with its id and name, then pieces of its arguments).
  void scan(std::string_view text, ToolFormat f, Json* deltas);
  // The calls begun so far, their arguments as written (cut where the reply was).
  const std::vector<ToolCall>& calls() const { return calls_; }
  // The reply left the expected form (not met under the constraint): its calls are read whole
  // at its end.
  bool lost() const { return phase_ == kLost; }

 private:
  enum Phase { kOpen, kCall, kHeader, kArguments, kAfter, kBetween, kDone, kLost };
  bool header(std::string_view text, ToolFormat f, Json* deltas);  // false: more text needed
  Phase phase_ = kOpen;
  size_t pos_ = 0;  // read up to here
  int depth_ = 0;   // the arguments' open objects and arrays
  bool in_string_ = false, escaped_ = false;
  std::vector<ToolCall> calls_;
};

// A reply as it is generated: which of its text may go out as content now, and at its end the
// calls. A reply without tools (tool_choice none) passes through unchanged.
class ToolReplyReader {
 public:
  ToolReplyReader(ToolRequest t, ToolFormat f);
  // Appends text; returns what may be sent now: content (text that cannot start a call), or a
  // named function's arguments as they come (from their first visible character on).
  ToolReplyPart feed(std::string_view text);
  // At the reply's end: the calls (with their ids), and the content that was held back (all of
  // the held text when it holds no call that parses).
  ToolReply finish();

 private:
  ToolRequest request_;
  ToolFormat format_;
  std::string text_;
  size_t sent_ = 0;
  bool holding_ = false;  // a call may have started at sent_: nothing more goes out
  bool free_ = false;     // the reply cannot hold a call: it goes out as it comes
  std::string call_id_;   // a named function's call, once its first delta went out
  RequiredCallScan required_;
};

// A choice's finish_reason once its calls are known (OpenAI: "tool_calls" for calls the model
// chose, "stop" for a named function).
std::string tool_finish_reason(const ToolRequest& t, const ToolReply& reply,
                               const std::string& finish_reason);

// message.tool_calls: [{"id", "type": "function", "function": {"name", "arguments"}}]; with
// `index` (stream deltas) each call also carries its index.
Json tool_calls_json(const std::vector<ToolCall>& calls, bool index = false);

// A chat response's choice ({"message": {"role", "content"}, "finish_reason", ...}) with the calls
// its content makes taken out into message.tool_calls (content null when nothing else is left).
void take_tool_calls(const ToolRequest& t, ToolFormat f, Json* choice);

}  // namespace qs::server
