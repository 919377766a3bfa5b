// A decoder-only Llama-family model bound to a backend: the forward pass over any number of
// tokens (prefill chunk, one decode token, or a speculative verification block).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "kv/fp_cache.h"
#include "model/config.h"
#include "model/weights.h"

namespace qs {

// Which rows of a forward call produce logits.
enum class LogitRows { kNone, kLast, kAll };

// Checks that the weights have the shapes, dtypes and presence the config implies and that the
// config is one the forward pass supports. Errors name the tensor or the field.
Status check_model(const ModelConfig& cfg, const ModelWeights& weights);

class Model {
 public:
  // `weights` must pass check_model(cfg, weights). The backend must outlive the model.
  Model(const ModelConfig& cfg, ModelWeights weights, Backend& backend);

  const ModelConfig& config() const { return cfg_; }
  const ModelWeights& weights() const { return weights_; }
  Backend& backend() { return backend_; }

  // Runs `ids` at positions [pos, pos + m), m = ids.size() >= 1, on a cache holding at least
  // [0, pos); writes their K/V and sets cache.length() = pos + m (later rows are dropped).
  // logits (host): kLast -> [vocab]; kAll -> [m, vocab]; kNone -> unused (may be null).
  // Errors: a token id outside [0, vocab), or the cache is full.
  Status forward(std::span<const int32_t> ids, int pos, FpKvCache& cache, LogitRows rows,
                 float* logits);

  // Bytes of weights one decode step reads: every layer, the final norm, the LM head, and one
  // embedding row.
  size_t weight_bytes_per_token() const;

 private:
  void ensure_scratch(int m);

  ModelConfig cfg_;
  ModelWeights weights_;
  Backend& backend_;
  std::vector<float> inv_freq_;  // [head_dim / 2] RoPE inverse frequencies

  // Activations for up to scratch_rows_ tokens (backend memory).
  int scratch_rows_ = 0;
  std::unique_ptr<Buffer> hidden_;  // [m, hidden]  residual stream
  std::unique_ptr<Buffer> normed_;  // [m, hidden]  rmsnorm output
  std::unique_ptr<Buffer> q_;       // [m, q_dim]
  std::unique_ptr<Buffer> k_;       // [m, kv_dim]
  std::unique_ptr<Buffer> v_;       // [m, kv_dim]
  std::unique_ptr<Buffer> attn_;    // [m, q_dim]   attention output before o_proj
  std::unique_ptr<Buffer> proj_;    // [m, hidden]  o_proj / down_proj output
  std::unique_ptr<Buffer> gate_;    // [m, inter]
  std::unique_ptr<Buffer> up_;      // [m, inter]
  int logits_rows_ = 0;
  std::unique_ptr<Buffer> logits_;  // [logits_rows_, vocab]
};

}  // namespace qs
