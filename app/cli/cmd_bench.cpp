// quantspec bench: decode speed over a declared matrix (decoding modes x prompt lengths x gamma x
// repeats) on one model; a table on stdout, every run (with the environment) as JSON.
#include <fmt/core.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "build_commit.h"
#include "commands.h"
#include "files.h"
#include "options.h"
#include "report.h"

namespace qs::cli {

namespace {

// One row of the matrix's mode axis: a decoding mode with its cache.
struct BenchMode {
  DecodeMode mode;
  KvType kv;
};

const std::map<std::string, BenchMode>& bench_modes() {
  static const std::map<std::string, BenchMode> modes{
      {"ar-fp16", {DecodeMode::kAr, KvType::kFp16}},
      {"ar-int8", {DecodeMode::kAr, KvType::kInt8}},
      {"ar-int4", {DecodeMode::kAr, KvType::kInt4}},
      {"quantspec", {DecodeMode::kQuantSpec, KvType::kFp16}},
      {"streamingllm", {DecodeMode::kStreamingLlm, KvType::kFp16}},
      {"snapkv", {DecodeMode::kSnapKv, KvType::kFp16}}};
  return modes;
}

struct BenchArgs {
  ModelOptions model;
  GenerationParams gen;
  std::vector<std::string> modes{"ar-fp16", "ar-int8", "quantspec"};
  std::vector<int> contexts;
  std::vector<int> gammas;  // empty: the engine's default; kAutoGamma: --gamma auto's rounds
  int repeats = 1;
  std::string tokens_file;
  std::string token_dtype = "u16";
  std::string json_out;
};

// A --gammas entry "auto": rounds whose length AdaptiveGamma chooses
// (EngineOptions::adaptive_gamma).
constexpr int kAutoGamma = 0;

std::string commit_id() {
  const char* env = std::getenv("QS_COMMIT");
  return env && *env ? env : build_commit();
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

// The prompt ids: the start of --prompt-tokens, or seeded random ids (random weights make any
// ids as good as any other; the trained model wants real text).
Result<std::vector<int32_t>> prompt_pool(const BenchArgs& a, int need, int vocab) {
  if (!a.tokens_file.empty()) {
    QS_ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                        read_token_file(a.tokens_file, a.token_dtype, vocab));
    if (static_cast<int>(ids.size()) < need) {
      return make_error("--prompt-tokens '" + a.tokens_file + "' has " +
                        std::to_string(ids.size()) + " tokens, fewer than the longest context " +
                        std::to_string(need));
    }
    return ids;
  }
  std::mt19937 rng(static_cast<uint32_t>(a.gen.sampling.seed) + 1);
  std::uniform_int_distribution<int32_t> dist(0, std::min(vocab, 32000) - 1);
  std::vector<int32_t> ids(static_cast<size_t>(need));
  for (int32_t& id : ids) id = dist(rng);
  return ids;
}

// Writes the report to `path` through a temporary file renamed over it, so that the file is always
// a whole report: bench rewrites it after every run, and a bench that is killed (a device call's
// time limit) keeps the runs it finished. Returns an error message, empty on success.
std::string write_report(const std::string& path, const nlohmann::json& report) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) return "cannot write --json file '" + path + "' (cannot create '" + tmp + "')";
    out << report.dump(2) << "\n";
    if (!out.flush()) return "cannot write --json file '" + path + "'";
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return "cannot write --json file '" + path + "': " + ec.message();
  return "";
}

std::string gamma_list(const std::vector<int>& gammas) {
  std::vector<std::string> names;
  for (int g : gammas) names.push_back(g == kAutoGamma ? "auto" : std::to_string(g));
  return fmt::format("{}", fmt::join(names, ","));
}

double gib(double bytes) {
  return bytes / double(1 << 30);
}

int run_bench(const BenchArgs& a) {
  if (std::string bad = validate_generation_params(a.gen); !bad.empty()) return report_error(bad);
  if (a.contexts.empty()) return report_error("bench needs --contexts (prompt lengths in tokens)");
  const int max_ctx = *std::max_element(a.contexts.begin(), a.contexts.end());
  const bool sweep_auto = std::find(a.gammas.begin(), a.gammas.end(), kAutoGamma) != a.gammas.end();
  EngineOptions auto_rounds = a.model.engine;  // what an "auto" entry's rounds draft at most
  auto_rounds.gamma = 0;
  auto_rounds.adaptive_gamma = true;
  const int max_gamma = std::max(
      a.gammas.empty() ? kDefaultGamma : *std::max_element(a.gammas.begin(), a.gammas.end()),
      sweep_auto ? auto_rounds.max_round_gamma() : 0);
  const auto dir = resolve_model_dir(a.model);

  nlohmann::json report = {{"command", "bench"}, {"version", QS_VERSION},
                           {"commit", commit_id()},  {"date", utc_now()},
                           // Relative to the working directory when it lies below it, so that
                           // reports name no machine's paths.
                           {"model", std::filesystem::proximate(dir).string()},
                           {"runs", nlohmann::json::array()}};
  // An unwritable --json fails now, not after the benchmark.
  auto save = [&]() {
    return a.json_out.empty() ? std::string() : write_report(a.json_out, report);
  };
  if (std::string bad = save(); !bad.empty()) return report_error(bad);
  std::vector<int32_t> pool;
  bool header = false;
  for (const std::string& mode_name : a.modes) {
    const BenchMode& bm = bench_modes().at(mode_name);
    ModelOptions mo = a.model;
    mo.engine.mode = bm.mode;
    mo.engine.kv = bm.kv;
    mo.engine.kv_explicit = bm.kv != KvType::kFp16;
    // Without --ctx every context runs on a cache of its own size (set_max_context below), so
    // that the memory figures are that context's: the quantized planes are allocated for the
    // whole capacity. Tensor parallelism keeps one cache, sized for the largest.
    const bool ctx_per_run = mo.engine.max_context == 0 && mo.engine.tensor_parallel == 1;
    // The positions a run of `ctx` prompt tokens needs: its tokens and a round's candidates.
    auto capacity_for = [&](int ctx) { return ctx + a.gen.max_new_tokens + max_gamma + 1; };
    if (mo.engine.max_context == 0) mo.engine.max_context = capacity_for(max_ctx);
    // With "auto" in the sweep its rounds draft up to the sweep's largest gamma; the others keep
    // their fixed length (GenerationParams::gamma).
    if (sweep_auto && bm.mode != DecodeMode::kAr) {
      mo.engine.adaptive_gamma = true;
      mo.engine.gamma = max_gamma;
    }
    if (std::string bad = validate_decode_options(mo); !bad.empty()) return report_error(bad);
    auto loaded = Engine::load(dir, mo.engine);
    if (!loaded) return report_error(mode_name + ": " + loaded.error().message);
    Engine& eng = *loaded.value();
    // The mode line names the largest γ of the sweep (the cache is sized for it); the sweep
    // itself on a line of its own.
    GenerationParams shown = a.gen;
    if (!a.gammas.empty()) shown.gamma = max_gamma;
    print_resolved_config("bench", dir, eng, mo, &shown);
    const std::string swept = bm.mode == DecodeMode::kAr ? "-"
                              : a.gammas.empty()         ? "(the mode's)"
                                                         : gamma_list(a.gammas);
    fmt::print(stderr, "  bench: contexts {} gammas {} repeats {}\n", fmt::join(a.contexts, ","),
               swept, a.repeats);
    if (!header) {
      const ModelConfig& c = eng.config();
      report["device"] = eng.device_description();
      report["backend"] = device_name(mo.engine.device);
      report["config"] = {{"layers", c.num_layers}, {"hidden", c.hidden_size},
                          {"heads", c.num_heads},   {"kv_heads", c.num_kv_heads},
                          {"head_dim", c.head_dim}, {"vocab", c.vocab_size},
                          {"intermediate", c.intermediate_size}};
      report["generated_tokens"] = a.gen.max_new_tokens;
      // The quantized views' attention arithmetic (the GPU's choices; the CPU is exact).
      const bool gpu = mo.engine.device == Device::kCuda;
      report["draft_attention"] =
          gpu ? attention_operands_name(mo.engine.draft_attention) : "exact";
      report["target_attention"] =
          gpu ? attention_operands_name(mo.engine.target_attention) : "exact";
      report["kernel_switches"] = nlohmann::json::object();
      for (const auto& [name, value] : kernel_switches()) report["kernel_switches"][name] = value;
      report["temperature"] = a.gen.sampling.temperature;
      fmt::print("device: {}\n", eng.device_description());
      fmt::print("{:<13} {:>7} {:>5} {:>3} {:>9} {:>9} {:>8} {:>7} {:>8} {:>9} {:>8} {:>8}\n",
                 "mode", "context", "gamma", "rep", "prefill_s", "tok/s", "ms/tok", "accept",
                 "draft_ms", "verify_ms", "ms/flush", "peak_GiB");
      auto pool_or = prompt_pool(a, max_ctx, c.vocab_size);
      if (!pool_or) return report_error(pool_or.error().message);
      pool = std::move(pool_or.value());
      header = true;
    }
    {
      // Warm-up: first-use uploads (e.g. the 4-bit draft weights) and lazy allocations happen
      // here, not in the first measured run.
      GenerationParams w = a.gen;
      w.max_new_tokens = 2 * max_gamma + 2;
      w.stop_at_eos = false;
      const std::vector<int32_t> warm(pool.begin(), pool.begin() + std::min<int>(16, max_ctx));
      auto r = eng.generate(warm, w, nullptr);
      if (!r) return report_error(mode_name + " warm-up: " + r.error().message);
    }
    const bool spec = bm.mode != DecodeMode::kAr;
    const std::vector<int> gammas = spec && !a.gammas.empty() ? a.gammas : std::vector<int>{0};
    for (int ctx : a.contexts) {
      const std::vector<int32_t> prompt(pool.begin(), pool.begin() + ctx);
      if (ctx_per_run) {
        const Status sized = eng.set_max_context(capacity_for(ctx));
        if (!sized.ok()) {
          return report_error(mode_name + " context " + std::to_string(ctx) + ": " +
                              sized.error().message);
        }
      }
      for (int g : gammas) {
        for (int rep = 0; rep < a.repeats; ++rep) {
          GenerationParams p = a.gen;
          p.gamma = g;
          p.stop_at_eos = false;
          int64_t peak = eng.device_memory_in_use();
          p.on_prefill_progress = [&](int done, int total) {
            peak = std::max(peak, eng.device_memory_in_use());
            if (stderr_is_tty()) {
              fmt::print(stderr, "\r  prefill {}/{} tokens", done, total);
              if (done == total) fmt::print(stderr, "\r\033[K");
            }
          };
          auto r = eng.generate(prompt, p, nullptr);
          if (!r) return report_error(mode_name + " context " + std::to_string(ctx) + ": " +
                                      r.error().message);
          peak = std::max(peak, eng.device_memory_in_use());
          const GenerationStats& s = r->stats;
          nlohmann::json row = stats_json(*r, eng, mo.engine, p);
          row.erase("tokens");
          // Per decoded token (GenerationStats::decode_tokens: the prompt's logits gave the
          // first); an AR run made one forward per decoded token.
          const int decoded = s.decode_tokens();
          const double ms_per_token = decoded > 0 ? 1e3 * s.decode_s / decoded : 0;
          const double draft_ms = s.drafted > 0 ? 1e3 * s.draft_s / s.drafted : 0;
          const double verify_steps = spec ? s.rounds + s.plain_steps : decoded;
          const double verify_ms = verify_steps > 0 ? 1e3 * s.verify_s / verify_steps : 0;
          // A flush's own cost: the commits that quantized a group (GenerationStats).
          const double flush_ms = s.flushes > 0 ? 1e3 * s.flushing_commit_s / s.flushes : 0;
          row["bench_mode"] = mode_name;
          row["context"] = ctx;
          row["repeat"] = rep;
          row["ms_per_token"] = ms_per_token;
          row["draft_ms_per_step"] = draft_ms;
          row["verify_ms_per_step"] = verify_ms;
          row["flush_ms_per_flush"] = flush_ms;
          // Over every round, plain steps (rounds of 0) included.
          if (s.rounds + s.plain_steps > 0) {
            row["mean_gamma"] = double(s.drafted) / (s.rounds + s.plain_steps);
          }
          row["peak_device_memory_bytes"] = peak;
          report["runs"].push_back(row);
          if (std::string bad = save(); !bad.empty()) return report_error(bad);
          fmt::print(
              "{:<13} {:>7} {:>5} {:>3} {:>9.3f} {:>9.2f} {:>8.3f} {:>7.3f} {:>8.3f} "
              "{:>9.3f} {:>8.2f} {:>8}\n",
              mode_name, ctx,
              !spec             ? "0"
              : g == kAutoGamma ? "auto"
                                : std::to_string(g),
              rep, s.prefill_s, s.decode_tok_s(), ms_per_token, s.acceptance_rate(), draft_ms,
              verify_ms, flush_ms, peak >= 0 ? fmt::format("{:.2f}", gib(double(peak))) : "-");
          std::fflush(stdout);
        }
      }
    }
  }
  if (std::string bad = save(); !bad.empty()) return report_error(bad);
  return 0;
}

}  // namespace

CommandRun add_bench_command(CLI::App& root) {
  auto args = std::make_shared<BenchArgs>();
  args->gen.max_new_tokens = 256;
  CLI::App* cmd = root.add_subcommand(
      "bench", "Decode speed over a matrix of modes x prompt lengths x gamma (table + JSON)");
  add_model_options(*cmd, args->model);
  add_decode_options(*cmd, args->model);
  cmd->remove_option(cmd->get_option("--mode"));
  cmd->remove_option(cmd->get_option("--kv"));
  cmd->remove_option(cmd->get_option("--gamma"));
  add_generation_options(*cmd, args->gen);
  std::string names;
  for (const auto& [name, mode] : bench_modes()) names += (names.empty() ? "" : ",") + name;
  cmd->add_option("--modes", args->modes, "Decoding modes to run, comma-separated: " + names +
                                              " [default: ar-fp16,ar-int8,quantspec]")
      ->delimiter(',')
      ->check(CLI::IsMember([] {
        std::vector<std::string> v;
        for (const auto& [name, mode] : bench_modes()) v.push_back(name);
        return v;
      }()));
  cmd->add_option("--contexts", args->contexts,
                  "Prompt lengths in tokens, comma-separated (e.g. 4096,32768,131072)")
      ->delimiter(',')
      ->required()
      ->check(CLI::Range(1, 1 << 24));
  cmd->add_option_function<std::vector<std::string>>(
         "--gammas",
         [args](const std::vector<std::string>& v) {
           args->gammas.clear();
           for (const std::string& g : v)
             args->gammas.push_back(g == "auto" ? kAutoGamma : std::stoi(g));
         },
         "Speculative modes: draft lengths to sweep, comma-separated, each 1..255 or auto "
         "(--gamma auto's rounds, up to the sweep's largest or " +
             std::to_string(kAdaptiveGammaMax) + ") [default: the engine's]")
      ->delimiter(',')
      ->check(gamma_validator(255));
  cmd->add_option("--repeats", args->repeats, "Runs per cell")->check(CLI::Range(1, 1000));
  cmd->add_option("--prompt-tokens", args->tokens_file,
                  "Prompt ids from a raw token file (e.g. models/default/heldout.u16); "
                  "default: seeded random ids");
  cmd->add_option("--token-dtype", args->token_dtype, "--prompt-tokens element type: u16 or i32")
      ->check(CLI::IsMember({"u16", "i32"}));
  cmd->add_option("-o,--json", args->json_out,
                  "Write every run and the environment as JSON (rewritten after each run)");
  return [args] { return run_bench(*args); };
}

}  // namespace qs::cli
