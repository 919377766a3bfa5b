// What every command prints once at start (stderr): the resolved configuration.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "options.h"

namespace qs::cli {

void print_resolved_config(const char* command, const std::filesystem::path& model_dir,
                           const Engine& engine, const ModelOptions& opts,
                           const GenerationParams* gen);

// A generation's statistics as JSON (generate --stats-json, bench): timings, speculative
// counters and per-step KV bytes, the mode and cache, the backend.
nlohmann::json stats_json(const GenerationResult& result, const Engine& engine,
                          const EngineOptions& options, const GenerationParams& gen);

// The environment switches of the CUDA kernels and engine internals that no flag sets (A/B runs:
// QS_DIRECT_RING, QS_Q4_KERNEL, ...) that are set in this process, name -> value, in a fixed
// order. print_resolved_config prints them; bench records them in its JSON.
std::vector<std::pair<std::string, std::string>> kernel_switches();

// Whether stderr is a terminal (progress output only then).
bool stderr_is_tty();

// On a terminal, a prefill of more than a 64th of the context shows its progress on stderr
// (sets `gen.on_prefill_progress`).
void show_prefill_progress(GenerationParams& gen, int64_t prompt_tokens, int max_context);

}  // namespace qs::cli
