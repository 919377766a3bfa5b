// The model's weights: one table per architecture, every tensor checked against the config.
// Tensors stay in their file dtype (F32/F16/BF16) and point into the memory-mapped safetensors
// files (zero-copy); the backend converts as it reads.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "model/config.h"

namespace qs {

// A read-only 1-D or 2-D weight. Row-major: shape {rows, cols}; a vector has rows == 1.
// Linear layers follow PyTorch: W is {out_features, in_features}, y = x W^T (+ b).
struct WeightView {
  const void* data = nullptr;  // into a mapping owned by ModelWeights
  DType dtype = DType::F32;
  int64_t rows = 0;
  int64_t cols = 0;
  std::string name;  // the safetensors name, for messages

  bool empty() const { return data == nullptr; }
  int64_t numel() const { return rows * cols; }
};

struct LayerWeights {
  WeightView attn_norm;  // {1, hidden}           input_layernorm.weight
  WeightView wq;         // {q_dim, hidden}       self_attn.q_proj.weight
  WeightView wk;         // {kv_dim, hidden}      self_attn.k_proj.weight
  WeightView wv;         // {kv_dim, hidden}      self_attn.v_proj.weight
  WeightView wo;         // {hidden, q_dim}       self_attn.o_proj.weight
  WeightView bq;         // {1, q_dim}  or empty  self_attn.q_proj.bias (Qwen2)
  WeightView bk;         // {1, kv_dim} or empty
  WeightView bv;         // {1, kv_dim} or empty
  WeightView bo;         // {1, hidden} or empty  self_attn.o_proj.bias (Llama attention_bias only)
  WeightView mlp_norm;   // {1, hidden}           post_attention_layernorm.weight
  WeightView w_gate;     // {inter, hidden}       mlp.gate_proj.weight
  WeightView w_up;       // {inter, hidden}       mlp.up_proj.weight
  WeightView w_down;     // {hidden, inter}       mlp.down_proj.weight
};

class SafetensorsFile;  // model/safetensors.h

struct ModelWeights {
  WeightView tok_embeddings;  // {vocab, hidden}  model.embed_tokens.weight
  std::vector<LayerWeights> layers;
  WeightView final_norm;      // {1, hidden}      model.norm.weight
  WeightView lm_head;         // {vocab, hidden}  lm_head.weight, or tok_embeddings when tied

  std::vector<std::shared_ptr<SafetensorsFile>> files;  // keeps the mappings alive
  // The checkpoint's tensors the architecture does not read (sorted): what transformers warns
  // about as "weights of the model checkpoint not used", e.g. biases with attention_bias false
  // (not lm_head.weight of a tied model, which transformers ties over silently).
  std::vector<std::string> unused;
};

// Open model.safetensors or model.safetensors.index.json (sharded) in `dir`, and bind every
// tensor the architecture needs, checking name, dtype (F32/F16/BF16), shape and byte range.
// Errors: "model.safetensors: tensor 'model.layers.0.self_attn.q_proj.weight' has shape
// [64, 32], expected [64, 64]" and the like.
Result<ModelWeights> load_model_weights(const std::filesystem::path& dir, const ModelConfig& cfg);

}  // namespace qs
