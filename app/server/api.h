// The OpenAI-compatible API surface: request validation (every rejection is an OpenAI-style
// {"error": {"message", "type", "param", "code"}} with a 4xx status) and response / stream chunk
// building. Parameter policy (docs in app/server/README.md):
//  - supported: model, prompt (one, or a batch of up to kMaxPrompts run one after another) /
//    messages, max_tokens (max_completion_tokens), temperature, top_p,
//    n (1..16, one choice after another), stream, stream_options.include_usage, stop, seed, user,
//    logprobs (completions: 0..5 alternatives; chat: true, with top_logprobs 0..20), echo
//    (completions; with logprobs the prompt's tokens are scored too, and max_tokens may be 0),
//    presence_penalty / frequency_penalty (-2..2), logit_bias ({"id": -100..100}, up to 300
//    entries); extensions top_k, min_p, ignore_eos;
//  - response_format (text, json_object, json_schema); chat: tools, tool_choice,
//    parallel_tool_calls (tools.h);
//  - accepted only at their neutral value (else 400 unsupported_parameter): suffix = "",
//    best_of = 1, functions = [], function_call = none / auto (the deprecated forms of tools);
//  - any other field: 400 unknown_parameter (as OpenAI's "Unrecognized request argument").
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "api_common.h"
#include "engine/engine.h"
#include "metrics.h"
#include "model/tokenizer/tokenizer.h"
#include "tools.h"

namespace qs::server {

// {"error": {"message", "type", "param", "code"}}
Json error_json(const ApiError& e);
// Serialize JSON for the wire; invalid UTF-8 is replaced, never thrown on.
std::string dump_json(const Json& j);

enum class Endpoint { kCompletions, kChatCompletions };

// Defaults for what a request leaves out: the shared generation flags of the command line.
struct RequestDefaults {
  GenerationParams gen;
  bool seed_given = false;  // --seed given: requests without "seed" use it; else a random seed
  int64_t max_context = 0;  // > 0: max_tokens above it are rejected outright
  int64_t vocab_size = 0;   // > 0: logit_bias ids at or above it are rejected
};

// The most choices (n) a request may ask for: they run one after another, each prompt after the
// first from the prompt cache.
constexpr int kMaxChoices = 16;
// The most prompts one /v1/completions request may list (a batch: run one after another).
constexpr int kMaxPrompts = 64;

// One /v1/completions prompt: a text, or token ids.
struct PromptInput {
  std::optional<std::string> text;
  std::vector<int64_t> ids;  // when text is unset
};

struct ApiRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  bool stream = false;
  bool include_usage = false;         // stream_options.include_usage
  int n = 1;                          // choices (1 .. kMaxChoices)
  std::optional<int64_t> max_tokens;  // as requested (nullopt: the server default)
  GenerationParams params;            // everything but max_new_tokens, resolved with defaults
  // /v1/completions: the prompts (texts or token ids; several: a batch, whose choices are prompt
  // 0's n, then prompt 1's, ..., index p * n + i).
  std::vector<PromptInput> prompts;
  // /v1/completions: echo the prompt before each choice's text (with logprobs: the prompt
  // tokens' values too, the first null). max_tokens may then be 0 (score the prompt only).
  bool echo = false;
  // /v1/chat/completions: [{"role", "content"[, "name"]}], roles system/user/assistant/tool; an
  // assistant's "tool_calls" and a tool's "tool_call_id" as chat templates read them.
  Json messages;
  ToolRequest tools;  // chat: tools, tool_choice, parallel_tool_calls
};

std::variant<ApiRequest, ApiError> parse_request(std::string_view body, Endpoint endpoint,
                                                 const RequestDefaults& defaults);

// POST /tokenize (as vLLM's): {"model"?, "prompt": text, "add_special_tokens"? (default true)} or
// {"model"?, "messages": [...], "tools"?, "add_special_tokens"? (default false)}: the ids that
// /v1/completions or /v1/chat/completions would run for it, so that a client can check that a
// long document fits the context before sending it.
struct TokenizeRequest {
  std::optional<std::string> prompt;  // else `messages`, and the `tools` the template shows
  Json messages;
  Json tools = Json::array();
  bool add_special = true;
};
std::variant<TokenizeRequest, ApiError> parse_tokenize(std::string_view body);
// POST /detokenize: {"model"?, "tokens": [ids]} (ids checked against the vocabulary by the caller).
std::variant<std::vector<int64_t>, ApiError> parse_detokenize(std::string_view body);

// ---- responses -------------------------------------------------------------------------------

struct ResponseMeta {
  std::string id;       // "cmpl-..." / "chatcmpl-..."
  int64_t created = 0;  // unix seconds
  std::string model;
};

std::string new_response_id(Endpoint endpoint);

// OpenAI's usage object; prompt_tokens_details.cached_tokens: the prompt tokens the prompt cache
// kept (GenerationStats::cached_prompt_tokens).
Json usage_json(int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens);
// What the per-response "quantspec" field reports besides the engine's GenerationStats.
struct ResponseStats {
  std::string mode = "ar";  // the engine's decoding mode: "ar" or "quantspec"
  SpeculativeStats spec;    // drafted / accepted / rounds (zero in "ar")
  double queue_s = 0;       // arrival -> generation start
  int n = 1;                // choices per prompt: usage counts each prompt once (results[p * n])
};

// The "quantspec" field: mode, timing over a request's choices (prefill and decode time summed,
// decode tokens per second of all of them) and speculative statistics (drafted, accepted,
// acceptance rate = accepted / drafted, mean accepted length = 1 + accepted / rounds; null when
// undefined).
Json stats_json(const std::vector<GenerationResult>& results, const ResponseStats& extra);

// A choice's "logprobs" for `entries` (a response's tokens, or those of one stream chunk), each
// token as Tokenizer::token_text. Completions (OpenAI's legacy form): {tokens, token_logprobs,
// top_logprobs: [{text: logprob}] (the alternatives and the chosen token), text_offset: code
// points from the completion's start, carried across chunks in *text_offset}. Chat: {content:
// [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}], refusal: null}.
// `echoed`: the text of an echoed prompt the entries start with (its tokens' entries first); a
// special token of the prompt that this text does not hold where the token falls (the BOS the
// tokenizer added) is 0 code points wide.
Json logprobs_json(Endpoint endpoint, const std::vector<TokenLogprob>& entries,
                   const Tokenizer& tokenizer, int64_t* text_offset, std::string_view echoed = {});

// A response with one choice per result (index i: results[i]); usage counts the prompt once.
// `logprobs`: each choice's logprobs_json (empty, or shorter: null for the rest).
Json completion_response(const ResponseMeta& meta, const std::vector<GenerationResult>& results,
                         const ResponseStats& extra, const std::vector<Json>& logprobs = {});
Json chat_response(const ResponseMeta& meta, const std::vector<GenerationResult>& results,
                   const ResponseStats& extra, const std::vector<Json>& logprobs = {});

// Stream chunks of choice `index`. `finish_reason` empty: null.
Json completion_chunk(const ResponseMeta& meta, std::string_view text,
                      const std::string& finish_reason, Json logprobs = nullptr, int index = 0);
Json chat_chunk(const ResponseMeta& meta, const Json& delta, const std::string& finish_reason,
                Json logprobs = nullptr, int index = 0);
// The stream's usage chunk (stream_options.include_usage): each prompt once (results[p * n]),
// every choice's tokens.
Json usage_chunk(const ResponseMeta& meta, Endpoint endpoint,
                 const std::vector<GenerationResult>& results, int n = 1);

// One Server-Sent Event: "data: <json>\n\n".
std::string sse_event(const Json& j);
constexpr std::string_view kSseDone = "data: [DONE]\n\n";

}  // namespace qs::server
