// The Engine implementation: one model, one full-precision KV cache (one sequence at a time),
// autoregressive generation. Engine::load (engine.cpp) reads a directory and builds one; tests
// and benchmarks can build one from in-memory parts.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "backend/backend.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "engine/model.h"
#include "engine/speculative.h"
#include "kv/kv_cache.h"
#include "kv/sparse_select.h"

namespace qs {

// The KV capacity a model runs with: options.max_context when set, else
// min(max_position_embeddings, 8192). Sliding-window attention is not implemented, so a model
// with sliding_window > 0 is limited to that window (a larger explicit max_context is an error;
// within the window, sliding-window and full attention are the same).
Result<int> resolve_max_context(const ModelConfig& cfg, const EngineOptions& options);

class LlmEngine final : public Engine {
 public:
  static Result<std::unique_ptr<LlmEngine>> create(const ModelConfig& cfg, ModelWeights weights,
                                                   std::optional<Tokenizer> tokenizer,
                                                   const EngineOptions& options);

  const ModelConfig& config() const override { return model_->config(); }
  const Tokenizer* tokenizer() const override { return tokenizer_ ? &*tokenizer_ : nullptr; }
  int max_context() const override { return cache_.capacity(); }

  Result<std::vector<float>> prefill_logits(const std::vector<int32_t>& ids,
                                            int last_rows = 0) override;
  Result<std::vector<float>> sequence_logits(const std::vector<int32_t>& ids) override;

  // Generates at most min(max_new_tokens, max_context - prompt + 1) tokens (the last one is
  // sampled but never fed back, so it needs no cache slot). finish_reason: "stop" (EOS or stop
  // string), "length", or "cancelled" (on_text returned false).
  Result<GenerationResult> generate(const std::vector<int32_t>& prompt,
                                    const GenerationParams& params,
                                    const TextCallback& on_text) override;

  Model& model() { return *model_; }
  Backend& backend() { return *backend_; }
  const EngineOptions& options() const { return options_; }
  size_t kv_cache_bytes() const override { return cache_.bytes(); }
  std::string device_description() const override { return backend_->description(); }
  int64_t device_memory_in_use() const override { return backend_->memory_in_use(); }
  KvCache& cache() { return cache_; }
  int gamma() const { return gamma_; }
  // Sparse-KV modes: the draft's index, built by the last prefill (empty otherwise).
  const SparseDraftIndex& sparse_index() const { return sparse_; }

  // Building blocks of generate, public for the transaction tests: prefill `prompt` on an empty
  // cache (full-precision attention, then the groups it completes are quantized) and return the
  // logits of its last position; one speculative round after it (QuantSpec mode only).
  Result<std::vector<float>> start(const std::vector<int32_t>& prompt);
  Result<RoundResult> speculative_round(int32_t x, int gamma, const SamplingParams& sampling,
                                        Rng& rng, GenerationStats& stats,
                                        const RoundControl& control = {});
  // The next-token logits after feeding x at position length() through the target path,
  // without committing it.
  Result<std::vector<float>> peek_logits(int32_t x);

 private:
  LlmEngine() = default;
  Status check_prompt(const std::vector<int32_t>& ids) const;
  bool speculative() const { return options_.mode != DecodeMode::kAr; }
  bool sparse() const {
    return options_.mode == DecodeMode::kStreamingLlm || options_.mode == DecodeMode::kSnapKv;
  }
  const KvSelection* draft_selection() const {
    return sparse() && !sparse_.empty() ? sparse_.layers() : nullptr;
  }
  // Runs `ids` on an empty cache in chunks of options_.prefill_chunk; logits of the last
  // position into last_logits_.
  using PrefillProgress = std::function<void(int done, int total)>;
  Status prefill(const std::vector<int32_t>& ids, const PrefillProgress& progress = {});

  // Threads for host-side work that is not a backend op (SnapKV's selection), made on first use.
  ThreadPool& host_pool();

  EngineOptions options_;
  std::unique_ptr<ThreadPool> host_pool_;
  int gamma_ = 0;  // resolved default speculation length (QuantSpec)
  SpecCounters counters_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  KvCache cache_;  // after backend_: destroyed before it
  std::optional<Tokenizer> tokenizer_;
  std::vector<float> last_logits_;  // [vocab]
  std::vector<float> probs_;        // [vocab] sampler scratch
  SparseDraftIndex sparse_;
  std::vector<float> snap_q_;  // [num_layers, window, q_dim] SnapKV observation queries
};

}  // namespace qs
