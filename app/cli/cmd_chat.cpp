// quantspec chat: a conversation in the terminal. Each line read from stdin is a user message
// (a trailing backslash continues it, and lines between two """ lines make one message);
// the whole conversation is rendered by the chat template and the reply streams to stdout. The
// engine keeps the previous turn's KV (its prompt cache), so a turn prefills only what is new: a
// long document given once with -f is not read again for each question.
#include <fmt/core.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "chat_setup.h"
#include "commands.h"
#include "files.h"
#include "options.h"
#include "report.h"

namespace qs::cli {

namespace {

// Ctrl-C during a reply stops it (the conversation keeps what was said); at the prompt it ends
// the program as usual. Whichever thread the signal lands on, the handler only reads and writes
// these lock-free atomics, or re-raises with the default action.
std::atomic<bool> g_replying{false};
std::atomic<bool> g_stop_reply{false};

extern "C" void on_sigint(int sig) {
  if (g_replying.load()) {
    g_stop_reply.store(true);
    return;
  }
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

struct ChatArgs {
  ModelOptions model;
  GenerationParams gen;
  std::string system;
  std::string document_file;
  std::string chat_template;
};

// The reply as the conversation keeps it: without the whitespace around it, as templates such as
// Llama 3's trim it. A template that writes "Assistant: " before the content then renders the
// reply as the tokens that were generated after "Assistant:", so the next turn's prompt repeats
// the cache through the reply and only the new message is prefilled (a prompt that diverged at
// the reply's first token would prefill the whole reply again, and under a quantized cache a
// reply longer than the rows it keeps, EngineOptions::prompt_cache_rows, the whole prompt).
std::string trimmed(const std::string& s) {
  const char* ws = " \t\n\r";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return {};
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

// One turn: render the conversation with the new user message, generate the reply (streamed to
// stdout) and append both to `messages`. An error leaves `messages` as it was.
Status chat_turn(Engine& eng, const ChatArgs& a, const ChatSetupChoice& chat,
                 nlohmann::ordered_json& messages, const std::string& user) {
  nlohmann::ordered_json next = messages;
  next.push_back({{"role", "user"}, {"content", user}});
  QS_ASSIGN_OR_RETURN(const std::string text, render_chat(chat, next));
  const std::vector<int32_t> ids = eng.tokenizer()->encode(text, /*add_special=*/false);
  const int before = eng.max_context();
  if (std::string bad = fit_context(eng, a.model, static_cast<int64_t>(ids.size()),
                                    a.gen.max_new_tokens, /*doubling=*/true);
      !bad.empty()) {
    return make_error("the conversation: " + bad + " (/reset starts a new one)");
  }
  if (eng.max_context() != before)
    fmt::print(stderr, "  (context grown to {} tokens; the conversation is prefilled again)\n",
               eng.max_context());
  GenerationParams gen = a.gen;
  show_prefill_progress(gen, static_cast<int64_t>(ids.size()), eng.max_context());
  g_stop_reply.store(false);
  g_replying.store(true);
  auto result = eng.generate(ids, gen, [](std::string_view piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    return !g_stop_reply.load();
  });
  g_replying.store(false);
  std::fputc('\n', stdout);
  std::fflush(stdout);
  if (!result) return result.error();
  const GenerationStats& st = result->stats;
  fmt::print(stderr,
             "[{} prompt tokens ({} cached), prefill {:.3f} s; {} generated, {:.2f} tok/s; "
             "finish: {}]\n",
             st.prompt_tokens, st.cached_prompt_tokens, st.prefill_s, st.generated_tokens,
             st.decode_tok_s(), result->finish_reason);
  messages = std::move(next);
  messages.push_back({{"role", "assistant"}, {"content", trimmed(result->text)}});
  return Status::ok_status();
}

// One message from `in`: a line, several joined by a trailing backslash, or the lines between
// two lines of three double quotes ("""), with their newlines. False at the end of the input.
bool read_message(std::istream& in, std::string& message, bool interactive) {
  auto next_line = [&](std::string& line) {
    if (!std::getline(in, line)) return false;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    return true;
  };
  std::string line;
  if (!next_line(line)) return false;
  message.clear();
  if (line == "\"\"\"") {
    while (next_line(line) && line != "\"\"\"") message += (message.empty() ? "" : "\n") + line;
    return true;
  }
  while (!line.empty() && line.back() == '\\') {
    line.pop_back();
    message += line + "\n";
    if (interactive) fmt::print(stderr, ". ");
    if (!next_line(line)) return true;
  }
  message += line;
  return true;
}

int run_chat(ChatArgs& a) {
  if (std::string bad = validate_generation_params(a.gen); !bad.empty()) return report_error(bad);
  if (std::string bad = validate_decode_options(a.model); !bad.empty()) return report_error(bad);
  std::string document;
  if (!a.document_file.empty()) {
    auto text = read_file(a.document_file);
    if (!text) return report_error(text.error().message);
    document = std::move(text.value());
  }
  const auto dir = resolve_model_dir(a.model);
  a.model.engine.prompt_cache = true;
  auto engine = Engine::load(dir, a.model.engine);
  if (!engine) return report_error(engine.error().message);
  Engine& eng = *engine.value();
  if (!eng.tokenizer()) return report_error(dir.string() + ": no tokenizer.json, cannot chat");
  auto chat = require_chat_template(a.chat_template, dir, *eng.tokenizer());
  if (!chat) return report_error(chat.error().message);
  print_resolved_config("chat", dir, eng, a.model, &a.gen);
  fmt::print(stderr,
             "  chat template: {}; a line of stdin per message (a trailing \\ continues it; "
             "lines between two \"\"\" lines make one), /reset, /exit; Ctrl-C stops a reply\n",
             chat->origin);

  const bool interactive = isatty(fileno(stdin)) != 0 && stderr_is_tty();  // "> " prompts
  std::signal(SIGINT, on_sigint);
  nlohmann::ordered_json messages = chat_opening(a.system);
  bool failed = false;
  std::string line;
  while (true) {
    if (interactive) fmt::print(stderr, "> ");
    if (!read_message(std::cin, line, interactive)) break;
    if (line.empty()) continue;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      messages = chat_opening(a.system);
      fmt::print(stderr, "  (a new conversation)\n");
      continue;
    }
    // The document, if any, leads the first user message.
    const bool first = messages.empty() || messages.back()["role"] == "system";
    const std::string user = first && !document.empty() ? document + "\n\n" + line : line;
    if (Status st = chat_turn(eng, a, *chat, messages, user); !st.ok()) {
      report_error(st.error().message);
      failed = true;
    }
  }
  return failed ? 1 : 0;
}

}  // namespace

CommandRun add_chat_command(CLI::App& root) {
  auto args = std::make_shared<ChatArgs>();
  CLI::App* cmd = root.add_subcommand(
      "chat",
      "Converse in the terminal: each line (or \"\"\" block) of stdin is a user message, "
      "rendered with the chat template; a turn prefills only what is new since the last one");
  add_model_options(*cmd, args->model);
  add_decode_options(*cmd, args->model);
  add_generation_options(*cmd, args->gen);
  add_format_option(*cmd, args->gen);
  cmd->add_option("--system", args->system, "A system message before the conversation");
  cmd->add_option("-f,--file", args->document_file,
                  "A document the conversation is about: it leads the first user message");
  cmd->add_option("--chat-template", args->chat_template,
                  "A built-in template (" + chat_builtin_list() +
                      ") or a Jinja file instead of the model's tokenizer_config.json one");
  return [args] { return run_chat(*args); };
}

}  // namespace qs::cli
