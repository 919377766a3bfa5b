#include "options.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>

#include "engine/json_schema.h"
#include "files.h"

namespace qs::cli {

void add_model_options(CLI::App& app, ModelOptions& opts) {
  app.add_option("-m,--model", opts.model_dir,
                 "Model directory (config.json, *.safetensors, tokenizer.json); "
                 "default: the bundled model")
      ->envname("QS_MODEL");
  const std::map<std::string, Device> devices{{"cpu", Device::kCpu}, {"cuda", Device::kCuda}};
  add_choice_option(app, "--device", opts.engine.device, devices,
                    std::string("Where the model runs: cpu, or cuda (the GPU; ") +
                        (cuda_compiled() ? "this build has it" : "needs a build with QS_CUDA=ON") +
                        ")",
                    "QS_DEVICE");
  const std::map<std::string, KvDType> kv_dtypes{
      {"auto", KvDType::kAuto}, {"f32", KvDType::kF32}, {"f16", KvDType::kF16}};
  add_choice_option(app, "--kv-dtype", opts.engine.kv_dtype, kv_dtypes,
                    "Element type of the full-precision KV rows (the whole cache of --kv fp16, "
                    "the buffer of the quantized caches): f32, f16, or auto (f16 on cuda, f32 "
                    "on cpu) [default: auto]",
                    "QS_KV_DTYPE");
  const std::map<std::string, PrefillMatmul> prefill_matmuls{{"exact", PrefillMatmul::kExact},
                                                              {"bf16", PrefillMatmul::kBf16}};
  add_choice_option(app, "--prefill-matmul", opts.engine.prefill_matmul, prefill_matmuls,
                    "Prefill arithmetic on cuda: exact (f32 activations as bf16 hi + lo, two "
                    "GEMMs, and attention on f16 hi/lo operands, three MMAs per product: "
                    "f32-level logits) or bf16 (activations rounded to bf16, one GEMM, like HF "
                    "transformers in bf16, and one MMA per attention product on f16 operands); "
                    "the CPU always computes in f32 [default: bf16]",
                    "QS_PREFILL_MATMUL");
  const std::map<std::string, AttentionOperands> attention_operands{
      {"f16", AttentionOperands::kF16}, {"exact", AttentionOperands::kExact}};
  add_choice_option(app, "--draft-attention", opts.engine.draft_attention, attention_operands,
                    "The draft's attention over the INT4 KV plane on cuda (--mode quantspec, "
                    "--kv int4): f16 (the folded query and value weights as f16 operands, one "
                    "MMA per product: ~2^-12 relative rounding, far below the INT4 view's own "
                    "error; outputs are verified by the target either way) or exact (f32-level, "
                    "~8% slower); the CPU is always exact [default: f16]",
                    "QS_DRAFT_ATTENTION");
  add_choice_option(app, "--target-attention", opts.engine.target_attention, attention_operands,
                    "The target's attention over the INT8 KV view on cuda (--mode quantspec's "
                    "verification, --kv int8): exact (f32-level, the CPU's arithmetic) or f16 "
                    "(the folded query and value weights as f16 operands, one MMA per product: "
                    "up to ~2e-3 of the attention output, ~20x below the INT8 view's own error; "
                    "faster where the GQA verification is issue-bound); greedy QuantSpec equals "
                    "greedy AR INT8 either way; the CPU is always exact [default: f16]",
                    "QS_TARGET_ATTENTION");
  const std::map<std::string, PrefillKv> prefill_kvs{{"exact", PrefillKv::kExact},
                                                     {"quantized", PrefillKv::kQuantized}};
  add_choice_option(app, "--prefill-kv", opts.engine.prefill_kv, prefill_kvs,
                    "Prompt attention with a quantized KV cache (--kv int8|int4, --mode "
                    "quantspec): exact (every prompt row in full precision, the prompt run layer "
                    "by layer so that one layer's rows are held at a time: Llama-2-7B at 128K "
                    "holds 2 GiB of them next to the planes) or quantized (each prefill chunk is "
                    "quantized before the next one reads it, so later chunks read the history "
                    "through the INT8 (INT4) view, as decoding does) [default: exact]",
                    "QS_PREFILL_KV");
  app.add_option("--threads", opts.engine.num_threads, "CPU threads (0: all cores)")
      ->envname("QS_THREADS")
      ->check(CLI::Range(0, 1024));
  app.add_option("--tp", opts.engine.tensor_parallel,
                 "Tensor parallelism: shard the model over N ranks (cuda: devices 0..N-1; cpu: "
                 "N thread groups splitting --threads); attention heads, kv heads and "
                 "intermediate_size must divide by N")
      ->envname("QS_TP")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  app.add_option("--ctx", opts.engine.max_context,
                 "Context capacity in tokens (0: min(model max, 8192); generate, chat and logits "
                 "grow it for a longer prompt and --max-tokens, up to the model's max)")
      ->envname("QS_CTX")
      ->check(CLI::Range(0, 1 << 24));
  app.add_option("--prefill-chunk", opts.engine.prefill_chunk,
                 "Prompt tokens per prefill step (0: 8192 on cuda, 512 on cpu) [default: 0]")
      ->envname("QS_PREFILL_CHUNK")
      ->check(CLI::Range(0, 1 << 20));
}

static void add_sparse_draft_options(CLI::App& app, EngineOptions& e);

CLI::Validator gamma_validator(int max_gamma) {
  return CLI::Validator(
      [max_gamma](std::string& v) -> std::string {
        if (v == "auto") return "";
        const std::string err =
            "must be an integer in [1, " + std::to_string(max_gamma) + "] or auto, got " + v;
        if (v.empty() || v.size() > 6 || v.find_first_not_of("0123456789") != std::string::npos)
          return err;
        const int g = std::stoi(v);
        return g >= 1 && g <= max_gamma ? "" : err;
      },
      "INT|auto");
}

void add_decode_options(CLI::App& app, ModelOptions& opts) {
  EngineOptions& e = opts.engine;
  const std::map<std::string, DecodeMode> modes{{"ar", DecodeMode::kAr},
                                                {"quantspec", DecodeMode::kQuantSpec},
                                                {"streamingllm", DecodeMode::kStreamingLlm},
                                                {"snapkv", DecodeMode::kSnapKv}};
  add_choice_option(app, "--mode", e.mode, modes,
                    "Decoding: ar (autoregressive), quantspec (self-speculative, quantized KV "
                    "draft), or the sparse-KV draft baselines streamingllm and snapkv",
                    "QS_MODE");
  const std::map<std::string, KvType> kvs{
      {"fp16", KvType::kFp16}, {"int8", KvType::kInt8}, {"int4", KvType::kInt4}};
  app.add_option_function<std::string>(
         "--kv",
         [&e, kvs](const std::string& v) {
           e.kv = kvs.at(v);
           e.kv_explicit = true;
         },
         "KV cache of --mode ar: fp16 (full precision, rows of --kv-dtype), int8 (target "
         "view), int4 (draft view) [default: fp16]")
      ->envname("QS_KV")
      ->check(CLI::IsMember({"fp16", "int8", "int4"}));
  app.add_option_function<std::string>(
         "--gamma",
         [&e](const std::string& v) {
           e.adaptive_gamma = v == "auto";
           e.gamma = e.adaptive_gamma ? 0 : std::stoi(v);
         },
         "Draft tokens per round (QuantSpec, sparse drafts), 1 <= gamma < G, or auto: each round "
         "drafts 0.." +
             std::to_string(kAdaptiveGammaMax) +
             ", chosen from the acceptance and step times measured so far [default: " +
             std::to_string(kDefaultGamma) + "]")
      ->envname("QS_GAMMA")
      ->check(gamma_validator(1 << 16));
  app.add_option("--group-size", e.group_size,
                 "G: key quantization group and flush granularity (32, 64 or 128)")
      ->envname("QS_GROUP_SIZE")
      ->capture_default_str()
      ->check(CLI::IsMember({32, 64, 128}));
  app.add_option("--value-group-size", e.value_group_size,
                 "Gv: value channels per quantization group; divides head_dim, >= 32 "
                 "[default: head_dim]")
      ->envname("QS_VALUE_GROUP_SIZE");
  const std::map<std::string, DraftWeights> drafts{{"int4", DraftWeights::kInt4},
                                                   {"int4-mlp", DraftWeights::kInt4Mlp},
                                                   {"native", DraftWeights::kNative}};
  add_choice_option(app, "--draft-weights", e.draft_weights, drafts,
                    "QuantSpec draft weights: int4 (all linear layers + lm_head, group 128), "
                    "int4-mlp (MLP only) or native (KV-only draft) [default: int4]",
                    "QS_DRAFT_WEIGHTS");
  add_sparse_draft_options(app, e);
}

static void add_sparse_draft_options(CLI::App& app, EngineOptions& e) {
  app.add_option("--draft-budget", e.draft_budget,
                 "streamingllm/snapkv: prompt positions the draft keeps, a fraction of the "
                 "prompt (< 1) or a count (>= 1)")
      ->envname("QS_DRAFT_BUDGET")
      ->capture_default_str();
  app.add_option("--sinks", e.sink_tokens, "streamingllm: attention-sink positions kept")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--snap-window", e.snap_window, "snapkv: observation window (last prompt queries)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
}

std::string validate_decode_options(const ModelOptions& opts) {
  const EngineOptions& e = opts.engine;
  const bool sparse = e.mode == DecodeMode::kStreamingLlm || e.mode == DecodeMode::kSnapKv;
  if (sparse && e.kv_explicit && e.kv != KvType::kFp16)
    return std::string("--kv applies to --mode ar only; --mode ") + decode_mode_name(e.mode) +
           " keeps the full-precision KV cache for the target";
  if (sparse && !(e.draft_budget > 0.0 && std::isfinite(e.draft_budget)))
    return "--draft-budget must be a finite number > 0 (a fraction < 1 or a count >= 1), got " +
           std::to_string(e.draft_budget);
  if (e.mode == DecodeMode::kQuantSpec && e.kv_explicit)
    return "--kv applies to --mode ar only; --mode quantspec always uses the hierarchical "
           "cache (INT4 draft view, INT8 target view)";
  if (e.gamma != 0 && (e.gamma < 1 || e.gamma >= e.group_size))
    return "--gamma must be in [1, G - 1] = [1, " + std::to_string(e.group_size - 1) +
           "] (G = --group-size), got " + std::to_string(e.gamma);
  if (e.value_group_size != 0 && (e.value_group_size < 32 || e.value_group_size % 2 != 0))
    return "--value-group-size must divide head_dim and be >= 32, got " +
           std::to_string(e.value_group_size);
  return "";
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
  app.add_option("--presence-penalty", params.adjust.presence_penalty,
                 "Subtract this from the logit of every token already generated (-2..2; 0: off)")
      ->envname("QS_PRESENCE_PENALTY");
  app.add_option("--frequency-penalty", params.adjust.frequency_penalty,
                 "Subtract this times its count from each generated token's logit (-2..2; 0: off)")
      ->envname("QS_FREQUENCY_PENALTY");
  app.add_option("--seed", params.sampling.seed, "Random seed (same seed, same output)")
      ->envname("QS_SEED")
      ->check(CLI::Validator(
          [](std::string& s) {
            // The library's own conversion wraps -1 and saturates past 2^64 - 1.
            const bool digits = !s.empty() && s.size() <= 20 &&
                                s.find_first_not_of("0123456789") == std::string::npos;
            const bool fits = digits && (s.size() < 20 || s <= "18446744073709551615");
            return fits ? std::string() : "must be an integer in [0, 18446744073709551615]";
          },
          "UINT64"));
  app.add_option("--stop", params.stop, "Stop string (repeatable); not included in the output");
  app.add_flag(
      "--ignore-eos", [&params](int64_t) { params.stop_at_eos = false; },
      "Do not stop at the end-of-sequence token");
}

namespace {

// A schema JsonGrammar compiles (its error otherwise).
std::string schema_error(const std::string& schema) {
  auto grammar = JsonGrammar::compile(schema);
  return grammar.ok() ? std::string() : grammar.error().message;
}

}  // namespace

void add_format_option(CLI::App& app, GenerationParams& params) {
  CLI::Option* format =
      app.add_option_function<std::string>(
             "--format",
             [&params](const std::string& v) {
               params.json_schema = v == "json" ? std::string(kJsonObjectSchema) : "";
             },
             "Output format: text, or json (one JSON object; generation ends when it is complete)")
          ->envname("QS_FORMAT")
          ->check(CLI::IsMember({"text", "json"}));
  CLI::Option* inline_schema =
      app.add_option_function<std::string>(
             "--json-schema", [&params](const std::string& v) { params.json_schema = v; },
             "Output one JSON document that this JSON Schema (its text) accepts; generation ends "
             "when it is complete (the keywords supported: app/server/README.md)")
          ->check(CLI::Validator(schema_error, "SCHEMA"));
  CLI::Option* file_schema =
      app.add_option_function<std::string>(
             "--json-schema-file",
             [&params](const std::string& path) { params.json_schema = *cli::read_file(path); },
             "--json-schema with the schema read from a file")
          ->check(CLI::Validator(
              [](std::string& path) {
                auto text = cli::read_file(path);
                return text.ok() ? schema_error(*text) : text.error().message;
              },
              "FILE"));
  format->excludes(inline_schema)->excludes(file_schema);
  inline_schema->excludes(file_schema);
}

std::filesystem::path resolve_model_dir(const ModelOptions& opts) {
  if (!opts.model_dir.empty()) return opts.model_dir;
  return QS_DEFAULT_MODEL_DIR;
}

int64_t model_context_limit(const ModelConfig& c) {
  int64_t limit = c.max_position_embeddings > 0 ? c.max_position_embeddings : INT32_MAX;
  if (c.sliding_window > 0) limit = std::min<int64_t>(limit, c.sliding_window);
  return limit;
}

std::string fit_context(Engine& engine, const ModelOptions& opts, int64_t prompt_tokens,
                        int64_t new_tokens, bool doubling) {
  const ModelConfig& c = engine.config();
  const bool automatic = opts.engine.max_context == 0;
  const int64_t limit = model_context_limit(c);
  const int64_t need = prompt_tokens + std::max<int64_t>(new_tokens, 0);
  if (automatic && std::min(need, limit) > engine.max_context()) {
    const int64_t want = std::min(doubling ? 2 * need : need, limit);
    int64_t tried = want;
    Status st = engine.set_max_context(static_cast<int>(tried));
    if (!st.ok() && want > need) st = engine.set_max_context(static_cast<int>(tried = need));
    if (!st.ok()) {
      return "a context of " + std::to_string(tried) +
             " tokens for the prompt and --max-tokens: " + st.error().message +
             "; set a context with --ctx";
    }
  }
  const int64_t ctx = engine.max_context();
  if (prompt_tokens <= ctx) return {};
  if (automatic && ctx == limit) {
    return "prompt has " + std::to_string(prompt_tokens) +
           " tokens, more than the model's maximum context of " + std::to_string(ctx) +
           " tokens (" +
           (c.sliding_window > 0 && ctx == c.sliding_window ? "its sliding window"
                                                            : "max_position_embeddings") +
           "); --ctx sets a longer one, past what the model was trained for";
  }
  return "prompt has " + std::to_string(prompt_tokens) + " tokens but the context is " +
         std::to_string(ctx) + " tokens (--ctx sets it)";
}

std::string validate_generation_params(const GenerationParams& p) {
  const SamplingParams& s = p.sampling;
  if (!std::isfinite(s.temperature) || s.temperature < 0)
    return "--temperature must be a finite number >= 0";
  if (!std::isfinite(s.top_p) || s.top_p <= 0 || s.top_p > 1) return "--top-p must be in (0, 1]";
  if (!std::isfinite(s.min_p) || s.min_p < 0 || s.min_p > 1) return "--min-p must be in [0, 1]";
  if (!(std::abs(p.adjust.presence_penalty) <= 2.0f))
    return "--presence-penalty must be in [-2, 2]";
  if (!(std::abs(p.adjust.frequency_penalty) <= 2.0f))
    return "--frequency-penalty must be in [-2, 2]";
  for (const auto& stop : p.stop)
    if (stop.empty()) return "--stop must not be empty";
  return "";
}

}  // namespace qs::cli
