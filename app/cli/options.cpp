#include "options.h"

#include <cmath>
#include <cstdlib>

namespace qs::cli {

void add_model_options(CLI::App& app, ModelOptions& opts) {
  app.add_option("-m,--model", opts.model_dir,
                 "Model directory (config.json, *.safetensors, tokenizer.json); "
                 "default: the bundled model")
      ->envname("QS_MODEL");
  app.add_option("--threads", opts.engine.num_threads, "CPU threads (0: all cores)")
      ->envname("QS_THREADS")
      ->check(CLI::Range(0, 1024));
  app.add_option("--ctx", opts.engine.max_context,
                 "Context capacity in tokens (0: min(model max, 8192))")
      ->envname("QS_CTX")
      ->check(CLI::Range(0, 1 << 24));
  app.add_option("--prefill-chunk", opts.engine.prefill_chunk, "Prompt tokens per prefill step")
      ->envname("QS_PREFILL_CHUNK")
      ->check(CLI::Range(1, 1 << 20));
}

void add_generation_options(CLI::App& app, GenerationParams& params) {
  app.add_option("-n,--max-tokens", params.max_new_tokens, "Maximum new tokens")
      ->envname("QS_MAX_TOKENS")
      ->check(CLI::Range(0, 1 << 24));
  app.add_option("--temperature", params.sampling.temperature, "Sampling temperature (0: greedy)")
      ->envname("QS_TEMPERATURE");
  app.add_option("--top-k", params.sampling.top_k, "Keep the k most likely tokens (0: off)")
      ->envname("QS_TOP_K")
      ->check(CLI::Range(0, 1 << 30));
  app.add_option("--top-p", params.sampling.top_p, "Nucleus sampling mass (1: off)")
      ->envname("QS_TOP_P");
  app.add_option("--min-p", params.sampling.min_p,
                 "Drop tokens below min_p times the top probability (0: off)")
      ->envname("QS_MIN_P");
  app.add_option("--seed", params.sampling.seed, "Random seed (same seed, same output)")
      ->envname("QS_SEED");
  app.add_option("--stop", params.stop, "Stop string (repeatable); not included in the output");
  app.add_flag("--ignore-eos", [&params](int64_t) { params.stop_at_eos = false; },
               "Do not stop at the end-of-sequence token");
}

std::filesystem::path resolve_model_dir(const ModelOptions& opts) {
  if (!opts.model_dir.empty()) return opts.model_dir;
  return QS_DEFAULT_MODEL_DIR;
}

std::string validate_generation_params(const GenerationParams& p) {
  const SamplingParams& s = p.sampling;
  if (!std::isfinite(s.temperature) || s.temperature < 0)
    return "--temperature must be a finite number >= 0";
  if (!std::isfinite(s.top_p) || s.top_p <= 0 || s.top_p > 1) return "--top-p must be in (0, 1]";
  if (!std::isfinite(s.min_p) || s.min_p < 0 || s.min_p > 1) return "--min-p must be in [0, 1]";
  for (const auto& stop : p.stop)
    if (stop.empty()) return "--stop must not be empty";
  return "";
}

}  // namespace qs::cli
