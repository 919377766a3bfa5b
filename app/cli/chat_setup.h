// The chat template a command renders messages with (serve's /v1/chat/completions, generate
// --chat): --chat-template (a built-in name or a Jinja file) or the model's own.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "core/error.h"
#include "model/chat_template.h"
#include "model/tokenizer/tokenizer.h"

namespace qs::cli {

struct ChatSetupChoice {
  std::optional<ChatTemplate> chat_template;  // none: `problem` says why
  ChatRenderOptions tokens;                   // bos_token / eos_token the template sees
  std::string problem;
  std::string origin;  // where the template came from, for the resolved configuration
};

// The built-in templates' names, comma-separated (for help texts and messages).
std::string chat_builtin_list();

// `flag`: --chat-template's value (empty: the model's own). A broken --chat-template is an error;
// a model without a usable template gives no template and a `problem` that ends with `fix`.
Result<ChatSetupChoice> resolve_chat_template(const std::string& flag,
                                              const std::filesystem::path& dir,
                                              const Tokenizer& tok, const std::string& fix);

// For the commands that cannot go without a template (generate --chat, chat): as
// resolve_chat_template, and no usable template is an error naming --chat-template (then
// `alternative`, e.g. ", or drop --chat").
Result<ChatSetupChoice> require_chat_template(const std::string& flag,
                                              const std::filesystem::path& dir,
                                              const Tokenizer& tok,
                                              const std::string& alternative = "");

// A conversation's first messages: the system message, when there is one.
nlohmann::ordered_json chat_opening(const std::string& system);

// `messages` rendered by `chat`'s template with the generation prompt (the text to tokenize
// without added special tokens: the template writes BOS and the like, as HF's
// apply_chat_template).
Result<std::string> render_chat(const ChatSetupChoice& chat,
                                const nlohmann::ordered_json& messages);

}  // namespace qs::cli
