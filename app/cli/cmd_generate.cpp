// quantspec generate: stream a completion to stdout, human stats to stderr.
#include <fmt/core.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "chat_setup.h"
#include "commands.h"
#include "files.h"
#include "options.h"
#include "report.h"

namespace qs::cli {

namespace {

struct GenerateArgs {
  ModelOptions model;
  GenerationParams gen;
  std::string prompt;
  std::string prompt_file;
  std::string stats_json;
  bool no_special = false;
  bool chat = false;          // the prompt as a user message through the chat template
  std::string system;         // --system: a system message before it
  std::string chat_template;  // --chat-template: a built-in or a file; empty: the model's own
};

// The text to tokenize: the prompt, or with --chat the chat template's rendering of
// [{system}, {user: prompt}] with the generation prompt (the template writes BOS and the like,
// so it is tokenized without adding special tokens, as HF's apply_chat_template).
Result<std::string> prompt_text(const GenerateArgs& a, const std::string& prompt,
                                const std::filesystem::path& dir, const Tokenizer& tok,
                                std::string* origin) {
  if (!a.chat) return prompt;
  QS_ASSIGN_OR_RETURN(ChatSetupChoice c,
                      require_chat_template(a.chat_template, dir, tok, ", or drop --chat"));
  *origin = c.origin;
  nlohmann::ordered_json messages = chat_opening(a.system);
  messages.push_back({{"role", "user"}, {"content", prompt}});
  return render_chat(c, messages);
}

int run_generate(const GenerateArgs& a) {
  if (std::string bad = validate_generation_params(a.gen); !bad.empty()) return report_error(bad);
  if (std::string bad = validate_decode_options(a.model); !bad.empty()) return report_error(bad);
  std::string prompt = a.prompt;
  if (!a.prompt_file.empty()) {
    auto text = read_file(a.prompt_file);
    if (!text) return report_error(text.error().message);
    prompt = std::move(text.value());
  }
  auto dir = resolve_model_dir(a.model);
  auto engine = Engine::load(dir, a.model.engine);
  if (!engine) return report_error(engine.error().message);
  Engine& eng = *engine.value();
  if (!eng.tokenizer())
    return report_error(dir.string() + ": no tokenizer.json, cannot generate text");

  std::string chat_origin;
  auto text = prompt_text(a, prompt, dir, *eng.tokenizer(), &chat_origin);
  if (!text) return report_error(text.error().message);
  std::vector<int32_t> ids = eng.tokenizer()->encode(*text, !a.no_special && !a.chat);
  if (ids.empty()) return report_error("the prompt is empty (no tokens)");
  if (std::string bad =
          fit_context(eng, a.model, static_cast<int64_t>(ids.size()), a.gen.max_new_tokens);
      !bad.empty())
    return report_error(bad);
  print_resolved_config("generate", dir, eng, a.model, &a.gen);
  if (a.chat)
    fmt::print(stderr, "  chat: the prompt as a user message, template {}\n", chat_origin);
  GenerationParams gen = a.gen;
  show_prefill_progress(gen, static_cast<int64_t>(ids.size()), eng.max_context());
  auto result = eng.generate(ids, gen, [](std::string_view piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    return true;
  });
  std::fputc('\n', stdout);
  std::fflush(stdout);
  if (!result) return report_error(result.error().message);
  const GenerationStats& st = result->stats;
  fmt::print(stderr,
             "[{} prompt tokens, prefill {:.3f} s ({:.1f} tok/s); {} generated, decode {:.3f} s "
             "({:.2f} tok/s); finish: {}]\n",
             st.prompt_tokens, st.prefill_s, st.prefill_s > 0 ? st.prompt_tokens / st.prefill_s : 0,
             st.generated_tokens, st.decode_s, st.decode_tok_s(), result->finish_reason);
  if (st.rounds > 0) {
    fmt::print(stderr,
               "[{}: {} rounds{}, acceptance {:.3f}, mean accepted length {:.2f}; draft {:.3f} "
               "s, verify {:.3f} s, flush {:.3f} s, sample {:.3f} s]\n",
               decode_mode_name(a.model.engine.mode), st.rounds,
               st.plain_steps > 0 ? fmt::format(" and {} plain steps", st.plain_steps) : "",
               st.acceptance_rate(), st.mean_accepted_length(), st.draft_s, st.verify_s, st.flush_s,
               st.sample_s);
  }
  if (!a.stats_json.empty()) {
    const nlohmann::json j = stats_json(*result, eng, a.model.engine, a.gen);
    std::ofstream out(a.stats_json);
    if (!out) return report_error("cannot write --stats-json file '" + a.stats_json + "'");
    out << j.dump(2) << "\n";
  }
  return 0;
}

}  // namespace

CommandRun add_generate_command(CLI::App& root) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* cmd = root.add_subcommand("generate", "Generate a completion of a prompt");
  add_model_options(*cmd, args->model);
  add_decode_options(*cmd, args->model);
  add_generation_options(*cmd, args->gen);
  add_format_option(*cmd, args->gen);
  auto* p = cmd->add_option("-p,--prompt", args->prompt, "Prompt text");
  auto* f = cmd->add_option("-f,--file", args->prompt_file, "Read the prompt from a file");
  p->excludes(f);
  f->excludes(p);
  cmd->add_option("--stats-json", args->stats_json, "Write generation statistics as JSON");
  auto* no_special = cmd->add_flag("--no-special", args->no_special,
                                   "Do not add BOS/special tokens to the prompt");
  auto* chat = cmd->add_flag("--chat", args->chat,
                             "Send the prompt as a user message through the chat template (the "
                             "model's, or --chat-template) and generate the assistant's reply");
  chat->excludes(no_special);
  cmd->add_option("--system", args->system, "With --chat: a system message before the prompt")
      ->needs(chat);
  cmd->add_option("--chat-template", args->chat_template,
                  "With --chat: a built-in template (" + chat_builtin_list() +
                      ") or a Jinja file instead of the model's tokenizer_config.json one")
      ->needs(chat);
  cmd->callback([cmd, p, f] {
    if (p->count() == 0 && f->count() == 0)
      throw CLI::ValidationError("generate", "one of -p/--prompt or -f/--file is required");
    (void)cmd;
  });
  return [args] { return run_generate(*args); };
}

}  // namespace qs::cli
