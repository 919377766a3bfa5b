#include "report.h"

#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "engine/json_schema.h"

namespace qs::cli {

namespace {

// The banner's output format: text, json (JSON mode) or json-schema (its size).
std::string format_name(const std::string& json_schema) {
  if (json_schema.empty()) return "text";
  if (json_schema == kJsonObjectSchema) return "json";
  return fmt::format("json-schema ({} bytes)", json_schema.size());
}

double parameter_count(const ModelConfig& c) {
  double h = c.hidden_size, layer = 0;
  layer += h * c.q_dim() + 2.0 * h * c.kv_dim() + c.q_dim() * h;  // attention
  layer += 3.0 * h * c.intermediate_size;                         // MLP
  double emb = static_cast<double>(c.vocab_size) * h;
  return c.num_layers * layer + emb * (c.tie_word_embeddings ? 1 : 2);
}

// " (<type> x<factor>...)" for a scaled RoPE, "" otherwise.
std::string rope_scaling_label(const RopeScaling& s) {
  switch (s.type) {
    case RopeScalingType::None:
      return "";
    case RopeScalingType::Linear:
      return fmt::format(" (linear x{:g})", s.factor);
    case RopeScalingType::Llama3:
      return fmt::format(" (llama3 x{:g} from {})", s.factor, s.original_max_position_embeddings);
    case RopeScalingType::Yarn:
      return fmt::format(" (yarn x{:g} from {}, attention factor {:.4g})", s.factor,
                         s.original_max_position_embeddings, s.attention_factor);
  }
  return "";
}

}  // namespace

// Whether a generation's rounds choose their own length (--gamma auto, no fixed gamma given).
bool adaptive_rounds(const EngineOptions& e, const GenerationParams* gen) {
  return e.adaptive_gamma && !(gen && gen->gamma > 0);
}

// The draft tokens of a round (with --gamma auto: the most a round drafts), as the engine
// resolves them.
int resolved_gamma(const EngineOptions& e, const GenerationParams* gen) {
  return gen && gen->gamma > 0 ? gen->gamma : e.max_round_gamma();
}

std::string gamma_text(const EngineOptions& e, const GenerationParams* gen) {
  const int g = resolved_gamma(e, gen);
  return adaptive_rounds(e, gen) ? fmt::format("auto (0..{} per round)", g) : std::to_string(g);
}

bool stderr_is_tty() {
  return isatty(fileno(stderr)) != 0;
}

void show_prefill_progress(GenerationParams& gen, int64_t prompt_tokens, int max_context) {
  if (!stderr_is_tty() || prompt_tokens <= max_context / 64) return;
  gen.on_prefill_progress = [](int done, int total) {
    fmt::print(stderr, "\r  prefill {}/{} tokens ({:.0f}%)", done, total, 100.0 * done / total);
    if (done == total) fmt::print(stderr, "\r\033[K");
  };
}

void print_resolved_config(const char* command, const std::filesystem::path& model_dir,
                           const Engine& engine, const ModelOptions& opts,
                           const GenerationParams* gen) {
  const ModelConfig& c = engine.config();
  int threads = opts.engine.num_threads > 0 ? opts.engine.num_threads
                                            : static_cast<int>(std::thread::hardware_concurrency());
  const EngineOptions& eo = opts.engine;
  const KvDType rows = resolve_kv_dtype(eo);
  const char* rows_name = kv_dtype_name(rows);
  const double row_bytes = rows == KvDType::kF16 ? 2.0 : 4.0;  // per element
  double kv_gib = 2.0 * c.num_layers * c.kv_dim() * row_bytes * engine.max_context() / (1 << 30);
  std::string kv_label = fmt::format("KV {}", rows_name);
  if (eo.mode == DecodeMode::kQuantSpec || eo.kv != KvType::kFp16) {
    // Four 4-bit code planes + fp16 key (per G tokens) and value (per Gv channels) scale/min,
    // plus the full-precision buffer of 2G + gamma + 1 rows.
    const double gv = eo.value_group_size > 0 ? eo.value_group_size : c.head_dim;
    const double per_token = 2.0 * c.kv_dim() + 4.0 * c.kv_dim() / eo.group_size +
                             4.0 * c.num_kv_heads * (c.head_dim / gv);
    const double buffer_rows = 2.0 * eo.group_size + eo.max_round_gamma() + 1;
    kv_gib = c.num_layers *
             (per_token * engine.max_context() + buffer_rows * 2.0 * c.kv_dim() * row_bytes) /
             (1 << 30);
    kv_label = fmt::format("KV hierarchical (planes + {} buffer)", rows_name);
  }
  fmt::print(stderr, "quantspec {}: model {} ({}, {:.1f}M params, weights {})\n", command,
             model_dir.string(), architecture_name(c.arch), parameter_count(c) / 1e6,
             c.torch_dtype.empty() ? "?" : c.torch_dtype);
  fmt::print(stderr,
             "  layers {} hidden {} heads {}/{} (kv) head_dim {} vocab {} rope_theta {:g}{}\n",
             c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size,
             c.rope_theta, rope_scaling_label(c.rope_scaling));
  const int tp = eo.tensor_parallel;
  std::string backend =
      eo.device == Device::kCuda
          ? (tp > 1 ? fmt::format("cuda (devices {}..{})", eo.device_index,
                                  eo.device_index + tp - 1)
                    : fmt::format("cuda (device {})", eo.device_index))
          : (tp > 1 ? fmt::format("cpu ({} threads per rank)", std::max(1, threads / tp))
                    : fmt::format("cpu ({} threads)", threads));
  backend += fmt::format(", tensor parallel {}, kv dtype {}{}", tp, rows_name,
                         eo.kv_dtype == KvDType::kAuto ? " (auto)" : "");
  if (eo.device == Device::kCuda) {
    backend += fmt::format(", prefill matmul {}, draft attention {}, target attention {}",
                           prefill_matmul_name(eo.prefill_matmul),
                           attention_operands_name(eo.draft_attention),
                           attention_operands_name(eo.target_attention));
  }
  fmt::print(stderr,
             "  backend {}, context {} tokens, {} {:.3f} GiB, "
             "prefill chunk {}, prefill kv {}\n",
             backend, engine.max_context(), kv_label, kv_gib, effective_prefill_chunk(opts.engine),
             prefill_kv_name(eo.prefill_kv));
  for (const std::string& w : engine.load_warnings()) fmt::print(stderr, "  warning: {}\n", w);
  if (c.max_position_embeddings > 0 && engine.max_context() > c.max_position_embeddings) {
    fmt::print(stderr,
               "  warning: the context ({} tokens) is longer than the model's "
               "max_position_embeddings ({}): past that position it runs beyond the length it "
               "was made for, and its outputs may degrade\n",
               engine.max_context(), c.max_position_embeddings);
  }
  const EngineOptions& e = eo;
  const int gv = e.value_group_size > 0 ? e.value_group_size : c.head_dim;
  if (e.mode == DecodeMode::kQuantSpec) {
    fmt::print(stderr,
               "  mode quantspec: gamma {} draft weights {} ; KV hierarchical G {} Gv {} "
               "(draft INT4 view, target INT8 view, {} buffer)\n",
               gamma_text(e, gen), draft_weights_name(e.draft_weights), e.group_size, gv,
               rows_name);
  } else if (e.mode == DecodeMode::kStreamingLlm || e.mode == DecodeMode::kSnapKv) {
    fmt::print(stderr,
               "  mode {}: gamma {} draft weights {} ; draft KV budget {:g}{} (sinks {}, snap "
               "window {}), target KV full precision ({} rows)\n",
               decode_mode_name(e.mode), gamma_text(e, gen), draft_weights_name(e.draft_weights),
               e.draft_budget, e.draft_budget < 1 ? " of the prompt" : " positions", e.sink_tokens,
               e.snap_window, rows_name);
  } else if (e.kv != KvType::kFp16) {
    fmt::print(stderr, "  mode ar: KV {} view of the hierarchical cache, G {} Gv {}\n",
               kv_type_name(e.kv), e.group_size, gv);
  } else {
    fmt::print(stderr, "  mode ar: KV full precision ({} rows)\n", rows_name);
  }
  if (const auto switches = kernel_switches(); !switches.empty()) {
    std::string line;
    for (const auto& [name, value] : switches) line += fmt::format(" {}={}", name, value);
    fmt::print(stderr, "  kernel switches from the environment:{}\n", line);
  }
  if (gen) {
    const SamplingParams& s = gen->sampling;
    fmt::print(stderr,
               "  max_tokens {} temperature {:g} top_k {} top_p {:g} min_p {:g} presence_penalty "
               "{:g} frequency_penalty {:g} seed {} stop_at_eos {} stop strings {} format {}\n",
               gen->max_new_tokens, s.temperature, s.top_k, s.top_p, s.min_p,
               gen->adjust.presence_penalty, gen->adjust.frequency_penalty, s.seed,
               gen->stop_at_eos, gen->stop.size(), format_name(gen->json_schema));
  }
}

std::vector<std::pair<std::string, std::string>> kernel_switches() {
  // Read by src/backend/cuda (attention_quant.cu, gemv.cu, gemv_q4.cu, attention_decode_tc.cu,
  // cuda_backend.cu) and src/engine/llm_engine.cpp.
  static const char* const kNames[] = {
      "QS_CUDA_PDL",         "QS_CUDA_SYNC",       "QS_CUDA_ARGMAX",        "QS_DECODE_TC",
      "QS_GEMV_RING",        "QS_Q4_KERNEL",       "QS_Q4_STAGES",          "QS_DIRECT_RING",
      "QS_DIRECT_TILES",     "QS_DIRECT_REGS",     "QS_DRAFT_REG_PREFETCH", "QS_PROFILE_DECODE",
      "QS_PREFILL_BY_CHUNK", "QS_PREFILL_DIRECT",  "QS_PREFILL_WGMMA",      "QS_PREFILL_WS",
      "QS_GEMV_CARVEOUT",    "QS_FUSE_NORM",       "QS_FUSE_SWIGLU",        "QS_FUSE_ROPE_STORE",
      "QS_DEFER_NORM",       "QS_CHAINED_ROUNDS",  "QS_CUDA_SAMPLE",        "QS_DECODE_TC_T",
      "QS_FLUSH_LAYERS",     "QS_SWIGLU_MIXED",    "QS_INT8_F16",           "QS_QUANT_PREFILL",
      "QS_GQA_TWO_TILES",    "QS_EVEN_COLUMNS",    "QS_INT8_EVEN_COLUMNS",  "QS_QKV_ROWS",
      "QS_Q4_QKV_ROWS",      "QS_DENSE_DEFER_NORM"};
  std::vector<std::pair<std::string, std::string>> set;
  for (const char* name : kNames) {
    if (const char* v = std::getenv(name)) set.emplace_back(name, v);
  }
  return set;
}

nlohmann::json stats_json(const GenerationResult& result, const Engine& engine,
                          const EngineOptions& options, const GenerationParams& gen) {
  const GenerationStats& st = result.stats;
  nlohmann::json j = {
      {"prompt_tokens", st.prompt_tokens},
      {"cached_prompt_tokens", st.cached_prompt_tokens},
      {"generated_tokens", st.generated_tokens},
      {"prefill_s", st.prefill_s},
      {"decode_s", st.decode_s},
      {"decode_tok_s", st.decode_tok_s()},
      {"prefill_tok_s", st.prefill_s > 0 ? st.prompt_tokens / st.prefill_s : 0},
      {"finish_reason", result.finish_reason},
      {"mode", decode_mode_name(options.mode)},
      {"kv", options.mode == DecodeMode::kQuantSpec ? "quantspec" : kv_type_name(options.kv)},
      {"kv_buffer", kv_dtype_name(resolve_kv_dtype(options))},  // the full-precision rows
      // Prefill matmul arithmetic: the GPU's choice, f32 on the CPU.
      {"prefill_matmul",
       options.device == Device::kCuda ? prefill_matmul_name(options.prefill_matmul) : "f32"},
      {"prefill_kv", prefill_kv_name(options.prefill_kv)},
      // The draft's INT4-view attention arithmetic: the GPU's choice, exact on the CPU.
      {"draft_attention", options.device == Device::kCuda
                              ? attention_operands_name(options.draft_attention)
                              : "exact"},
      {"target_attention",  // the INT8 view's: likewise
       options.device == Device::kCuda ? attention_operands_name(options.target_attention)
                                       : "exact"},
      {"kv_cache_bytes", engine.kv_cache_bytes()},
      {"max_context", engine.max_context()},  // the cache's capacity (positions)
      {"group_size", options.group_size},
      {"backend", device_name(options.device)},
      {"tensor_parallel", options.tensor_parallel},
      {"device", engine.device_description()},
      {"tokens", result.tokens},
      {"rounds", st.rounds},
      {"plain_steps", st.plain_steps},
      {"drafted", st.drafted},
      {"accepted", st.accepted},
      {"acceptance_rate", st.acceptance_rate()},
      {"mean_accepted_length", st.mean_accepted_length()},
      {"accepted_histogram", st.accepted_histogram},
      {"draft_s", st.draft_s},
      {"verify_s", st.verify_s},
      {"flush_s", st.flush_s},
      {"flushing_commit_s", st.flushing_commit_s},
      {"sample_s", st.sample_s},
      {"phase_timing", st.phases_backend_timed ? "backend" : "host"},
      {"flushes", st.flushes},
      {"draft_index_bytes", st.draft_index_bytes},
      {"kv_bytes_per_draft_step",
       {{"upper", st.draft_kv_upper_bytes},
        {"lower", st.draft_kv_lower_bytes},
        {"meta", st.draft_kv_meta_bytes},
        {"fp", st.draft_kv_fp_bytes}}},
      {"kv_bytes_per_target_step",
       {{"upper", st.target_kv_upper_bytes},
        {"lower", st.target_kv_lower_bytes},
        {"meta", st.target_kv_meta_bytes},
        {"fp", st.target_kv_fp_bytes}}}};
  if (options.mode != DecodeMode::kAr) {
    j["gamma"] = resolved_gamma(options, &gen);
    j["adaptive_gamma"] = adaptive_rounds(options, &gen);
  }
  return j;
}

}  // namespace qs::cli
