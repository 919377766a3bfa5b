// A Jinja-subset interpreter for Hugging Face chat templates.
//
// Pipeline: scan (split the source into text / {{ output }} / {% statement %} segments and apply
// Jinja's whitespace rules) -> lex each tag -> parse into an AST -> render with Python value
// semantics (truthiness, str(), repr(), json.dumps) so that output matches HF byte for byte.
// Parse and render errors travel internally as TemplateError exceptions and leave the public API
// as qs::Error values.
#include "model/chat_template.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "model/chat_template_builtins.h"
#include "model/chat_template_eval.h"
#include "model/chat_template_parser.h"
#include "model/chat_template_value.h"

namespace qs {

namespace {

using chat_template_internal::json;
using chat_template_internal::json_to_value;
using chat_template_internal::NodeList;
using chat_template_internal::Scope;
using chat_template_internal::TemplateError;
using chat_template_internal::Value;

std::string special_token_text(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string()) {
    return j["content"].get<std::string>();
  }
  return "";
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// Public API
// ------------------------------------------------------------------------------------------------

struct ChatTemplateProgram {
  std::string name;
  std::string source;
  NodeList nodes;
};

ChatTemplate::ChatTemplate(std::unique_ptr<ChatTemplateProgram> program)
    : program_(std::move(program)) {}
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;
ChatTemplate::~ChatTemplate() = default;

const std::string& ChatTemplate::name() const {
  return program_->name;
}

const std::string& ChatTemplate::source() const {
  return program_->source;
}

static std::string format_template_error(const std::string& name, const TemplateError& e) {
  if (e.line > 0) return name + " line " + std::to_string(e.line) + ": " + e.message;
  return name + ": " + e.message;
}

Result<ChatTemplate> ChatTemplate::parse(std::string_view source, std::string name) {
  auto program = std::make_unique<ChatTemplateProgram>();
  program->name = std::move(name);
  program->source = std::string(source);
  try {
    program->nodes = chat_template_internal::parse_template(source);
  } catch (const TemplateError& e) {
    return make_error(format_template_error(program->name, e));
  }
  return ChatTemplate(std::move(program));
}

Result<ChatTemplate> ChatTemplate::builtin(std::string_view name) {
  for (const auto& [n, text] : chat_template_internal::builtin_templates()) {
    if (n == name) return parse(text, "built-in chat template '" + n + "'");
  }
  std::string known;
  for (const auto& n : builtin_names()) known += (known.empty() ? "" : ", ") + n;
  return make_error("unknown built-in chat template '" + std::string(name) + "' (known: " + known +
                    ")");
}

std::vector<std::string> ChatTemplate::builtin_names() {
  std::vector<std::string> names;
  for (const auto& [n, text] : chat_template_internal::builtin_templates()) names.push_back(n);
  return names;
}

Result<std::string> ChatTemplate::render(const nlohmann::ordered_json& messages,
                                         const ChatRenderOptions& options) const {
  return render(messages, options, nlohmann::ordered_json::object());
}

Result<std::string> ChatTemplate::render(const nlohmann::ordered_json& messages,
                                         const ChatRenderOptions& options,
                                         const nlohmann::ordered_json& extra) const {
  if (!messages.is_array()) return make_error(program_->name + ": messages must be a JSON array");
  if (!extra.is_object())
    return make_error(program_->name + ": extra variables must be a JSON object");
  auto root = std::make_shared<Scope>();
  root->emplace("messages", json_to_value(messages));
  root->emplace("bos_token", Value::from_string(options.bos_token));
  root->emplace("eos_token", Value::from_string(options.eos_token));
  root->emplace("add_generation_prompt", Value::from_bool(options.add_generation_prompt));
  root->emplace("tools", Value::none());
  root->emplace("documents", Value::none());
  for (const auto& [k, v] : extra.items()) root->insert_or_assign(k, json_to_value(v));
  std::string out;
  try {
    chat_template_internal::render_template(program_->nodes, root, out);
  } catch (const TemplateError& e) {
    return make_error(format_template_error(program_->name, e));
  }
  return out;
}

Result<ModelChatTemplate> parse_tokenizer_config_chat_template(const std::string& json_text,
                                                               const std::string& source) {
  json cfg = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (cfg.is_discarded() || !cfg.is_object())
    return make_error(source + ": not a valid JSON object");
  ModelChatTemplate out;
  out.origin = source;
  if (cfg.contains("bos_token")) out.bos_token = special_token_text(cfg["bos_token"]);
  if (cfg.contains("eos_token")) out.eos_token = special_token_text(cfg["eos_token"]);
  if (!cfg.contains("chat_template") || cfg["chat_template"].is_null()) return out;
  const json& t = cfg["chat_template"];
  if (t.is_string()) {
    out.source = t.get<std::string>();
    return out;
  }
  if (t.is_array()) {
    for (const json& entry : t) {
      if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
          entry["template"].is_string()) {
        out.source = entry["template"].get<std::string>();
        out.origin = source + " (chat_template 'default')";
        return out;
      }
    }
    return make_error(source +
                      ": chat_template is a list of named templates without a 'default' entry");
  }
  return make_error(source + ": chat_template must be a string or a list of {name, template}");
}

Result<ModelChatTemplate> load_model_chat_template(const std::filesystem::path& dir) {
  auto read = [](const std::filesystem::path& p) -> std::optional<std::string> {
    std::ifstream in(p, std::ios::binary);
    if (!in) return std::nullopt;
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  ModelChatTemplate out;
  std::error_code ec;
  const auto cfg_path = dir / "tokenizer_config.json";
  if (std::filesystem::exists(cfg_path, ec)) {
    auto text = read(cfg_path);
    if (!text) return make_error(cfg_path.string() + ": cannot read");
    QS_ASSIGN_OR_RETURN(out, parse_tokenizer_config_chat_template(*text, cfg_path.string()));
  }
  const auto jinja_path = dir / "chat_template.jinja";
  if (std::filesystem::exists(jinja_path, ec)) {
    auto text = read(jinja_path);
    if (!text) return make_error(jinja_path.string() + ": cannot read");
    out.source = std::move(*text);
    out.origin = jinja_path.string();
  }
  return out;
}

}  // namespace qs
