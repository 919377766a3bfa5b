// quantspec eval ppl | eval accept: perplexity of a KV mode over a text or token file, and the
// acceptance table of QuantSpec over contexts and speculation lengths (docs/quantspec.md).
#include <cstdint>
#include <fmt/core.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include "commands.h"
#include "files.h"
#include "options.h"
#include "report.h"

namespace qs::cli {

namespace {

struct PplArgs {
  ModelOptions model;
  std::string text_file;
  std::string tokens_file;
  std::string token_dtype = "u16";
  int max_windows = 0;
};

struct AcceptArgs {
  ModelOptions model;
  GenerationParams gen;
  std::string text_file;
  std::string tokens_file;
  std::string token_dtype = "u16";
  std::vector<int> contexts;
  std::vector<int> gammas;
};


Result<std::vector<int32_t>> text_tokens(const Engine& eng, const std::string& path) {
  if (!eng.tokenizer()) return make_error("the model directory has no tokenizer.json");
  QS_ASSIGN_OR_RETURN(std::string text, read_file(path));
  return eng.tokenizer()->encode(text, /*add_special=*/true);
}

int run_ppl(const PplArgs& a) {
  if (a.text_file.empty() == a.tokens_file.empty())
    return report_error("eval ppl needs exactly one of -f/--file TEXT or --tokens FILE");
  if (std::string bad = validate_decode_options(a.model); !bad.empty()) return report_error(bad);
  auto dir = resolve_model_dir(a.model);
  auto engine = Engine::load(dir, a.model.engine);
  if (!engine) return report_error(engine.error().message);
  Engine& eng = *engine.value();
  print_resolved_config("eval ppl", dir, eng, a.model, nullptr);
  const int vocab = eng.config().vocab_size;
  auto ids = a.tokens_file.empty() ? text_tokens(eng, a.text_file)
                                   : read_token_file(a.tokens_file, a.token_dtype, vocab);
  if (!ids) return report_error(ids.error().message);
  const std::vector<int32_t>& toks = *ids;
  const int64_t total = static_cast<int64_t>(toks.size());
  if (total < 2)
    return report_error("eval ppl needs at least 2 tokens, got " + std::to_string(total));
  const int window = eng.max_context();
  const int64_t windows_all = (total - 1 + window - 1) / window;
  const int64_t windows =
      a.max_windows > 0 ? std::min<int64_t>(windows_all, a.max_windows) : windows_all;

  double nll = 0.0;
  int64_t scored = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t w = 0; w < windows; ++w) {
    const int64_t begin = w * window;
    const int64_t end = std::min<int64_t>(begin + window, total - 1);  // inputs [begin, end)
    // The window's inputs and its last target: each input's row scores the token after it,
    // chunk by chunk (no [window, vocab] array: 64 GB at 128K positions of a 128K vocabulary).
    const std::vector<int32_t> in(toks.begin() + begin, toks.begin() + end + 1);
    auto logprobs = eng.prompt_logprobs(in, 0);
    if (!logprobs) return report_error(logprobs.error().message);
    for (const TokenLogprob& lp : *logprobs) nll -= double(lp.logprob);
    scored += static_cast<int64_t>(logprobs->size());
    if (stderr_is_tty()) {
      fmt::print(stderr, "\r  window {}/{}: ppl so far {:.4f}", w + 1, windows,
                 std::exp(nll / scored));
      if (w + 1 == windows) fmt::print(stderr, "\n");
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const EngineOptions& e = a.model.engine;
  const std::string kv =
      e.mode == DecodeMode::kQuantSpec ? "int8 (quantspec target view)" : kv_type_name(e.kv);
  fmt::print("ppl: {:.6f}\n", std::exp(nll / scored));
  fmt::print("tokens: {}\n", scored);
  fmt::print("windows: {}\n", windows);
  fmt::print("kv: {}\n", kv);
  fmt::print(
      "method: non-overlapping windows of {} tokens, each from an empty cache; window k feeds "
      "tokens [kT, kT+T) and scores the predictions of [kT+1, kT+T+1); query t reads the "
      "quantized view of [0, b(t)) and full precision after (b(t) = G*(floor(t/G)-1) for t >= "
      "2G, else 0), as decoding does\n",
      window);
  fmt::print(stderr, "[{} tokens scored in {:.1f} s]\n", scored, secs);
  return 0;
}

int run_accept(AcceptArgs a) {
  if (std::string bad = validate_generation_params(a.gen); !bad.empty()) return report_error(bad);
  if (a.model.engine.mode == DecodeMode::kAr) a.model.engine.mode = DecodeMode::kQuantSpec;
  if (std::string bad = validate_decode_options(a.model); !bad.empty()) return report_error(bad);
  for (int g : a.gammas) {
    if (g < 1 || g >= a.model.engine.group_size)
      return report_error("--gamma values must be in [1, G - 1] = [1, " +
                          std::to_string(a.model.engine.group_size - 1) + "], got " +
                          std::to_string(g));
  }
  int max_ctx = 0;
  for (int c : a.contexts) {
    if (c < 1) return report_error("--ctx values must be >= 1, got " + std::to_string(c));
    max_ctx = std::max(max_ctx, c);
  }
  a.model.engine.max_context = max_ctx + a.gen.max_new_tokens + 1;
  auto dir = resolve_model_dir(a.model);
  auto engine = Engine::load(dir, a.model.engine);
  if (!engine) return report_error(engine.error().message);
  Engine& eng = *engine.value();
  print_resolved_config("eval accept", dir, eng, a.model, &a.gen);
  if (a.text_file.empty() == a.tokens_file.empty())
    return report_error("eval accept needs exactly one of -f/--file TEXT or --tokens FILE");
  auto toks = a.tokens_file.empty()
                  ? text_tokens(eng, a.text_file)
                  : read_token_file(a.tokens_file, a.token_dtype, eng.config().vocab_size);
  if (!toks) return report_error(toks.error().message);
  if (static_cast<int>(toks->size()) < max_ctx) {
    return report_error("the prompt source has " + std::to_string(toks->size()) +
                        " tokens, fewer than --ctx " + std::to_string(max_ctx));
  }
  a.gen.stop_at_eos = false;
  fmt::print("{:>8} {:>6} {:>8} {:>10} {:>12} {:>10} {:>9}\n", "ctx", "gamma", "rounds",
             "acceptance", "mean_acc_len", "tok/s", "gen");
  for (int c : a.contexts) {
    const std::vector<int32_t> prompt(toks->begin(), toks->begin() + c);
    for (int g : a.gammas) {
      GenerationParams p = a.gen;
      p.gamma = g;
      auto r = eng.generate(prompt, p, nullptr);
      if (!r) return report_error(r.error().message);
      const GenerationStats& s = r->stats;
      fmt::print("{:>8} {:>6} {:>8} {:>10.4f} {:>12.3f} {:>10.2f} {:>9}\n", c, g, s.rounds,
                 s.acceptance_rate(), s.mean_accepted_length(), s.decode_tok_s(),
                 s.generated_tokens);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

CommandRun add_eval_command(CLI::App& root) {
  CLI::App* eval = root.add_subcommand("eval", "Evaluate: perplexity (ppl), acceptance (accept)");
  eval->require_subcommand(1);

  auto ppl = std::make_shared<PplArgs>();
  CLI::App* p = eval->add_subcommand(
      "ppl", "Perplexity over a text or token file in non-overlapping windows of --ctx tokens");
  add_model_options(*p, ppl->model);
  add_decode_options(*p, ppl->model);
  p->add_option("-f,--file", ppl->text_file, "Text file (tokenized with a leading BOS)");
  p->add_option("--tokens", ppl->tokens_file,
                "Raw little-endian token ids (e.g. models/qs-tiny-16k/heldout.u16)");
  p->add_option("--token-dtype", ppl->token_dtype, "Token file element type: u16 or i32")
      ->check(CLI::IsMember({"u16", "i32"}))
      ->capture_default_str();
  p->add_option("--max-windows", ppl->max_windows, "Evaluate only the first N windows (0: all)")
      ->check(CLI::Range(0, 1 << 30));

  auto acc = std::make_shared<AcceptArgs>();
  acc->gen.max_new_tokens = 64;
  CLI::App* a = eval->add_subcommand(
      "accept", "QuantSpec acceptance per (context, gamma), prompts cut from a text file");
  add_model_options(*a, acc->model);
  a->remove_option(a->get_option("--ctx"));
  add_decode_options(*a, acc->model);
  a->remove_option(a->get_option("--gamma"));
  a->remove_option(a->get_option("--mode"));
  const std::map<std::string, DecodeMode> accept_modes{
      {"quantspec", DecodeMode::kQuantSpec},
      {"streamingllm", DecodeMode::kStreamingLlm},
      {"snapkv", DecodeMode::kSnapKv}};
  add_choice_option(*a, "--mode", acc->model.engine.mode, accept_modes,
                    "Self-speculation draft: quantspec (quantized KV), streamingllm or snapkv "
                    "(sparse KV) [default: quantspec]");
  a->remove_option(a->get_option("--kv"));
  add_generation_options(*a, acc->gen);
  a->add_option("-f,--file", acc->text_file, "Text file the prompts are cut from (its start)");
  a->add_option("--tokens", acc->tokens_file, "Raw little-endian token ids to cut prompts from");
  a->add_option("--token-dtype", acc->token_dtype, "Token file element type: u16 or i32")
      ->check(CLI::IsMember({"u16", "i32"}))
      ->capture_default_str();
  a->add_option("--ctx", acc->contexts, "Prompt lengths in tokens (comma separated)")
      ->required()
      ->delimiter(',');
  a->add_option("--gamma", acc->gammas, "Speculation lengths (comma separated)")
      ->required()
      ->delimiter(',');

  return [eval, p, a, ppl, acc] {
    if (p->parsed()) return run_ppl(*ppl);
    if (a->parsed()) return run_accept(*acc);
    (void)eval;
    return 2;
  };
}

}  // namespace qs::cli
