// The options shared by every command that runs a model (generate, logits, eval, bench, serve):
// declared once here, each with its environment-variable equivalent (listed in --help).
#pragma once

#include <CLI/CLI.hpp>
#include <filesystem>
#include <string>

#include "engine/engine.h"

namespace qs::cli {

struct ModelOptions {
  std::string model_dir;  // -m; empty: $QS_MODEL, else the bundled default model
  EngineOptions engine;
};

// -m/--model, --threads, --ctx, --prefill-chunk.
void add_model_options(CLI::App& app, ModelOptions& opts);
// --mode, --kv, --gamma, --group-size, --value-group-size, --draft-weights (the cache and the
// decoding mode; docs/quantspec.md).
void add_decode_options(CLI::App& app, ModelOptions& opts);
// Checks across those flags CLI11 cannot express. Empty string when valid.
std::string validate_decode_options(const ModelOptions& opts);
// -n, --temperature, --top-k, --top-p, --min-p, --seed, --stop, --ignore-eos.
void add_generation_options(CLI::App& app, GenerationParams& params);

// Resolve the model directory: flag, then $QS_MODEL, then the bundled default.
std::filesystem::path resolve_model_dir(const ModelOptions& opts);

// Check ranges CLI11 cannot express (NaN, top_p in (0,1], ...). Empty string when valid.
std::string validate_generation_params(const GenerationParams& params);

}  // namespace qs::cli
