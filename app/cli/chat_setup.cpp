#include "chat_setup.h"

#include <algorithm>
#include <fstream>
#include <sstream>

namespace qs::cli {

std::string chat_builtin_list() {
  std::string s;
  for (const auto& n : ChatTemplate::builtin_names()) s += (s.empty() ? "" : ", ") + n;
  return s;
}

Result<ChatSetupChoice> resolve_chat_template(const std::string& flag,
                                              const std::filesystem::path& dir,
                                              const Tokenizer& tok, const std::string& fix) {
  QS_ASSIGN_OR_RETURN(ModelChatTemplate model, load_model_chat_template(dir));
  ChatSetupChoice chat;
  chat.tokens.bos_token = model.bos_token;
  chat.tokens.eos_token = model.eos_token;
  if (chat.tokens.bos_token.empty() && tok.bos_id() >= 0)
    chat.tokens.bos_token = tok.id_to_piece(tok.bos_id());
  if (chat.tokens.eos_token.empty() && !tok.eos_ids().empty())
    chat.tokens.eos_token = tok.id_to_piece(tok.eos_ids().front());
  if (!flag.empty()) {
    const auto names = ChatTemplate::builtin_names();
    if (std::find(names.begin(), names.end(), flag) != names.end()) {
      QS_ASSIGN_OR_RETURN(ChatTemplate t, ChatTemplate::builtin(flag));
      chat.chat_template.emplace(std::move(t));
      chat.origin = "built-in '" + flag + "'";
      return chat;
    }
    std::ifstream in(flag, std::ios::binary);
    if (!in) {
      return make_error("--chat-template '" + flag + "' is neither a built-in (" +
                        chat_builtin_list() + ") nor a readable file");
    }
    std::stringstream ss;
    ss << in.rdbuf();
    QS_ASSIGN_OR_RETURN(ChatTemplate t, ChatTemplate::parse(ss.str(), flag));
    chat.chat_template.emplace(std::move(t));
    chat.origin = flag;
    return chat;
  }
  if (!model.source) {
    chat.problem =
        "the model has no chat template (no chat_template in tokenizer_config.json); " + fix;
    chat.origin = "none (" + chat.problem + ")";
    return chat;
  }
  auto t = ChatTemplate::parse(*model.source, model.origin);
  if (!t.ok()) {
    chat.problem = "the model's chat template is not supported: " + t.error().message + "; " + fix;
    chat.origin = "unusable (" + t.error().message + "); " + fix;
    return chat;
  }
  chat.chat_template.emplace(std::move(t.value()));
  chat.origin = model.origin;
  return chat;
}

Result<ChatSetupChoice> require_chat_template(const std::string& flag,
                                              const std::filesystem::path& dir,
                                              const Tokenizer& tok,
                                              const std::string& alternative) {
  const std::string fix =
      "choose one with --chat-template NAME (built-ins: " + chat_builtin_list() +
      ") or a template file" + alternative;
  QS_ASSIGN_OR_RETURN(ChatSetupChoice c, resolve_chat_template(flag, dir, tok, fix));
  if (!c.chat_template) return make_error(c.problem);
  return c;
}

nlohmann::ordered_json chat_opening(const std::string& system) {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if (!system.empty()) messages.push_back({{"role", "system"}, {"content", system}});
  return messages;
}

Result<std::string> render_chat(const ChatSetupChoice& chat,
                                const nlohmann::ordered_json& messages) {
  auto text = chat.chat_template->render(messages, chat.tokens);
  if (!text) return make_error("the chat template rejected the messages: " + text.error().message);
  return std::move(text).value();
}

}  // namespace qs::cli
