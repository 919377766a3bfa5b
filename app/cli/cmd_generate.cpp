// quantspec generate: stream a completion to stdout, human stats to stderr.
#include <cstdint>
#include <fmt/core.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

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
};


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

  std::vector<int32_t> ids = eng.tokenizer()->encode(prompt, !a.no_special);
  if (ids.empty()) return report_error("the prompt is empty (no tokens)");
  if (std::string bad =
          fit_context(eng, a.model, static_cast<int64_t>(ids.size()), a.gen.max_new_tokens);
      !bad.empty())
    return report_error(bad);
  print_resolved_config("generate", dir, eng, a.model, &a.gen);
  GenerationParams gen = a.gen;
  if (stderr_is_tty() && static_cast<int>(ids.size()) > eng.max_context() / 64) {
    gen.on_prefill_progress = [](int done, int total) {
      fmt::print(stderr, "\r  prefill {}/{} tokens ({:.0f}%)", done, total, 100.0 * done / total);
      if (done == total) fmt::print(stderr, "\r\033[K");
    };
  }
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
    fmt::print(
        stderr,
        "[{}: {} rounds, acceptance {:.3f}, mean accepted length {:.2f}; draft {:.3f} "
        "s, verify {:.3f} s, flush {:.3f} s, sample {:.3f} s]\n",
        decode_mode_name(a.model.engine.mode), st.rounds, st.acceptance_rate(), st.mean_accepted_length(), st.draft_s, st.verify_s,
        st.flush_s, st.sample_s);
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
  auto* p = cmd->add_option("-p,--prompt", args->prompt, "Prompt text");
  auto* f = cmd->add_option("-f,--file", args->prompt_file, "Read the prompt from a file");
  p->excludes(f);
  f->excludes(p);
  cmd->add_option("--stats-json", args->stats_json, "Write generation statistics as JSON");
  cmd->add_flag("--no-special", args->no_special, "Do not add BOS/special tokens to the prompt");
  cmd->callback([cmd, p, f] {
    if (p->count() == 0 && f->count() == 0)
      throw CLI::ValidationError("generate", "one of -p/--prompt or -f/--file is required");
    (void)cmd;
  });
  return [args] { return run_generate(*args); };
}

}  // namespace qs::cli
