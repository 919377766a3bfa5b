// The options shared by every command that runs a model (generate, logits, eval, bench, serve):
// declared once here, each with its environment-variable equivalent (listed in --help).
#pragma once

#include <CLI/CLI.hpp>
#include <filesystem>
#include <map>
#include <string>

#include "engine/engine.h"

namespace qs::cli {

struct ModelOptions {
  std::string model_dir;  // -m; empty: $QS_MODEL, else the bundled default model
  EngineOptions engine;
};

// An option taking one of `choices` (case-insensitive) into `target`; a bad value is a usage
// error naming the allowed ones. The help shows them as a|b|c. `env`: its environment variable
// (none when empty).
template <typename T>
CLI::Option* add_choice_option(CLI::App& app, const std::string& name, T& target,
                               const std::map<std::string, T>& choices, const std::string& help,
                               const std::string& env = {}) {
  std::string names;
  for (const auto& [key, value] : choices) names += (names.empty() ? "" : "|") + key;
  CLI::Option* opt = app.add_option_function<std::string>(
          name, [&target, choices](const std::string& v) { target = choices.at(CLI::detail::to_lower(v)); },
          help)
      ->check(
          [choices, names](const std::string& v) {
            return choices.count(CLI::detail::to_lower(v))
                       ? std::string()
                       : "'" + v + "' is not one of " + names;
          },
          names)
      ->option_text(env.empty() ? names : names + " (Env:" + env + ")");
  if (!env.empty()) opt->envname(env);
  return opt;
}

// -m/--model, --device, --kv-dtype, --threads, --tp, --ctx, --prefill-chunk.
void add_model_options(CLI::App& app, ModelOptions& opts);
// --mode, --kv, --gamma, --group-size, --value-group-size, --draft-weights (the cache and the
// decoding mode; docs/quantspec.md).
void add_decode_options(CLI::App& app, ModelOptions& opts);
// Accepts a draft length in [1, max_gamma] or "auto" (AdaptiveGamma's rounds): --gamma,
// bench's --gammas.
CLI::Validator gamma_validator(int max_gamma);
// Checks across those flags CLI11 cannot express. Empty string when valid.
std::string validate_decode_options(const ModelOptions& opts);
// -n, --temperature, --top-k, --top-p, --min-p, --seed, --stop, --ignore-eos.
void add_generation_options(CLI::App& app, GenerationParams& params);
// --format text|json, --json-schema, --json-schema-file (GenerationParams::json_schema):
// generate and chat.
void add_format_option(CLI::App& app, GenerationParams& params);

// Resolve the model directory: flag, then $QS_MODEL, then the bundled default.
std::filesystem::path resolve_model_dir(const ModelOptions& opts);

// The longest context the model allows: max_position_embeddings, capped by a sliding window
// (sliding-window attention is not implemented); INT32_MAX when config.json names neither.
int64_t model_context_limit(const ModelConfig& config);

// Without --ctx, grows `engine`'s cache to hold a prompt of `prompt_tokens` and `new_tokens`
// after it, up to the model's max_position_embeddings (and sliding window): a long prompt needs no
// flag, and a short one keeps the default cache. `doubling`: grow to twice what is needed (a
// conversation, which goes on, and whose cached turns each growth drops; what is needed alone if
// that does not fit). Then checks that the prompt fits.
// Empty string, or the error (naming --ctx).
std::string fit_context(Engine& engine, const ModelOptions& opts, int64_t prompt_tokens,
                        int64_t new_tokens, bool doubling = false);

// Check ranges CLI11 cannot express (NaN, top_p in (0,1], ...). Empty string when valid.
std::string validate_generation_params(const GenerationParams& params);

}  // namespace qs::cli
