// The model's hyper-parameters as read from a Hugging Face config.json (+ generation_config.json).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"

namespace qs {

enum class Architecture { Llama, Mistral, Qwen2 };
const char* architecture_name(Architecture a);  // "LlamaForCausalLM", ...

enum class RopeScalingType { None, Linear, Llama3, Yarn };

struct RopeScaling {
  RopeScalingType type = RopeScalingType::None;
  float factor = 1.0f;                        // linear, llama3 and yarn
  float low_freq_factor = 1.0f;               // llama3
  float high_freq_factor = 4.0f;              // llama3
  int original_max_position_embeddings = 0;   // llama3 and yarn
  // yarn (transformers' _compute_yarn_parameters): the ramp between interpolated and
  // extrapolated frequencies spans the dimensions that turn beta_fast .. beta_slow times over
  // original_max_position_embeddings (floor / ceil of the bounds when truncate); attention_factor
  // (resolved at parse time from the config's attention_factor, or mscale / mscale_all_dim, or
  // 0.1 ln(factor) + 1) multiplies cos and sin, i.e. the attention scores by its square.
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  bool truncate = true;
  double attention_factor = 1.0;
};

struct ModelConfig {
  Architecture arch = Architecture::Llama;
  int vocab_size = 0;
  int hidden_size = 0;         // d_model
  int intermediate_size = 0;   // MLP hidden
  int num_layers = 0;
  int num_heads = 0;           // query heads
  int num_kv_heads = 0;        // key/value heads (GQA); == num_heads for MHA
  int head_dim = 0;            // from config when present, else hidden_size / num_heads
  int max_position_embeddings = 0;
  float rope_theta = 10000.0f;
  float rms_norm_eps = 1e-6f;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v projections have a bias (Qwen2: always)
  int sliding_window = 0;       // Mistral; 0 = none (full attention)
  std::string torch_dtype;      // "bfloat16", "float16", "float32" (informational)

  // Token ids from config.json / generation_config.json; -1 or empty when absent.
  int bos_token_id = -1;
  std::vector<int> eos_token_ids;

  // What config.json says that is not applied, one line each (as transformers warns about
  // it), e.g. a rope_scaling factor without a scaling type.
  std::vector<std::string> warnings;

  int q_dim() const { return num_heads * head_dim; }
  int kv_dim() const { return num_kv_heads * head_dim; }
  // The softmax scale of q . k: 1 / sqrt(head_dim), times yarn's attention_factor squared (HF
  // scales cos and sin, so both q and k, by it; folding it here leaves the KV cache unscaled).
  float attention_scale() const;
};

// Parse `dir/config.json` and, when present, `dir/generation_config.json`.
// Errors name the file and the offending field ("config.json: unsupported architecture ...").
Result<ModelConfig> load_model_config(const std::filesystem::path& dir);

// Parse config.json text (exposed for tests). `source` names the file in error messages.
Result<ModelConfig> parse_model_config(const std::string& json_text, const std::string& source);

}  // namespace qs
