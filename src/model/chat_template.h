// Chat templates: the Jinja `chat_template` of a Hugging Face tokenizer_config.json, rendered by
// our own interpreter of the Jinja subset that real chat templates use, with the environment HF's
// `apply_chat_template` uses (trim_blocks, lstrip_blocks, loop controls, raise_exception,
// tojson = Python json.dumps, strftime_now, namespace). A construct outside the subset (a tag,
// filter, test or method we do not implement) is an Error naming it and its line.
#pragma once

#include <filesystem>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace qs {

struct ChatRenderOptions {
  std::string bos_token;  // the `bos_token` variable ("" when the model has none)
  std::string eos_token;  // the `eos_token` variable
  bool add_generation_prompt = true;
};

struct ChatTemplateProgram;  // the parsed template (defined in chat_template.cpp)

class ChatTemplate {
 public:
  // Parse template text. `name` labels error messages ("chat_template line 3: ...").
  static Result<ChatTemplate> parse(std::string_view source, std::string name = "chat_template");
  // One of builtin_names(): "llama2", "llama3", "mistral", "chatml".
  static Result<ChatTemplate> builtin(std::string_view name);
  static std::vector<std::string> builtin_names();

  // Render `messages` (a JSON array of {"role", "content", ...} objects). The template also sees
  // bos_token, eos_token, add_generation_prompt, tools = none, documents = none, and every key of
  // `extra` (a JSON object, e.g. {"date_string": "26 Jul 2024"}), as HF passes its kwargs.
  // Errors: raise_exception() from the template, undefined values used in arithmetic, etc.
  Result<std::string> render(const nlohmann::ordered_json& messages,
                             const ChatRenderOptions& options) const;
  Result<std::string> render(const nlohmann::ordered_json& messages,
                             const ChatRenderOptions& options,
                             const nlohmann::ordered_json& extra) const;

  const std::string& name() const;
  const std::string& source() const;  // the template text

  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;
  ~ChatTemplate();

 private:
  explicit ChatTemplate(std::unique_ptr<ChatTemplateProgram> program);
  std::unique_ptr<ChatTemplateProgram> program_;
};

// What a model directory says about chat formatting.
struct ModelChatTemplate {
  std::optional<std::string> source;  // template text; nullopt when the model ships none
  std::string origin;                 // where it came from, for messages ("tokenizer_config.json")
  std::string bos_token;              // tokenizer_config.json bos_token ("" when absent)
  std::string eos_token;              // tokenizer_config.json eos_token ("" when absent)
};

// Read `dir/tokenizer_config.json` (chat_template as a string, or a list of {name, template}
// where "default" is taken) and, when present, `dir/chat_template.jinja` (newer HF layout, which
// wins). A directory without tokenizer_config.json gives an empty result, not an error.
Result<ModelChatTemplate> load_model_chat_template(const std::filesystem::path& dir);

// Parse tokenizer_config.json text (exposed for tests); `source` names the file in errors.
Result<ModelChatTemplate> parse_tokenizer_config_chat_template(const std::string& json_text,
                                                               const std::string& source);

}  // namespace qs
