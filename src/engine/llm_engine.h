// The Engine implementation: one model, one KV cache (one sequence at a time), autoregressive or
// speculative generation. With EngineOptions::tensor_parallel = N > 1 the model is sharded over N
// ranks (docs/multi-gpu.md), each with its own backend, Model and KvCache over its kv heads; every
// forward and cache operation runs on all ranks at once (one thread per rank) and the one
// generation loop samples from rank 0's logits. Engine::load (engine.cpp) reads a directory and
// builds one; tests and benchmarks can build one from in-memory parts.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "core/thread_pool.h"
#include "engine/backend_factory.h"
#include "engine/engine.h"
#include "engine/logit_adjust.h"
#include "engine/model.h"
#include "engine/rank_threads.h"
#include "engine/speculative.h"
#include "kv/kv_cache.h"
#include "kv/sparse_select.h"

namespace qs {

// An error naming the first NaN / Inf of a logits row (corrupt weights would otherwise be
// sampled as token 0, silently).
Status check_finite_logits(std::span<const float> logits);

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

  // The full model's configuration (with tensor_parallel > 1, model() is rank 0's shard).
  ~LlmEngine() override;

  const ModelConfig& config() const override { return cfg_; }
  const Tokenizer* tokenizer() const override { return tokenizer_ ? &*tokenizer_ : nullptr; }
  int max_context() const override { return cache_.capacity(); }
  Status set_max_context(int tokens) override;

  Result<std::vector<float>> prefill_logits(const std::vector<int32_t>& ids,
                                            int last_rows = 0) override;
  Result<std::vector<float>> sequence_logits(const std::vector<int32_t>& ids) override;
  Result<std::vector<TokenLogprob>> prompt_logprobs(
      const std::vector<int32_t>& ids, int top, const std::function<bool()>& stop = {}) override;

  // Generates at most min(max_new_tokens, max_context - prompt + 1) tokens (the last one is
  // sampled but never fed back, so it needs no cache slot). finish_reason: "stop" (EOS or stop
  // string), "length", or "cancelled" (on_text returned false).
  Result<GenerationResult> generate(const std::vector<int32_t>& prompt,
                                    const GenerationParams& params,
                                    const TextCallback& on_text) override;

  // Rank 0's model, backend and cache (the only ones when tensor_parallel is 1).
  Model& model() { return *model_; }
  Backend& backend() { return *backend_; }
  const EngineOptions& options() const { return options_; }
  int tensor_parallel() const { return static_cast<int>(peers_.size()) + 1; }
  // Summed over the ranks.
  size_t kv_cache_bytes() const override;
  std::string device_description() const override;
  int64_t device_memory_in_use() const override;
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

  // With EngineOptions::prompt_cache: how many leading tokens of `prompt` the next generate()
  // keeps in the cache instead of prefilling them: the prefix it shares with the tokens the cache
  // holds, at most prompt.size() - 1 (the last prompt token is run, for its logits) unless the
  // previous generation's prompt was this one (its logits are kept: all of it), and 0 where the
  // cache cannot be cut there (KvCache::can_truncate), in the sparse-KV modes, or when the option
  // is off.
  int reusable_prefix(const std::vector<int32_t>& prompt) const;

 private:
  LlmEngine() = default;
  Status check_prompt(const std::vector<int32_t>& ids) const;
  // The target's forward over `ids` from an empty cache, chunk by chunk (prefill_chunk positions,
  // each query t reading the view decoding would see): each chunk's logits rows go where
  // chunk_logits(start, m) points ([m, vocab] host floats, written once it returns the next
  // chunk's pointer or this returns; nullptr stops the pass with an error, "cancelled").
  // sequence_logits and prompt_logprobs.
  using SequenceChunkFn = std::function<float*(int start, int m)>;
  Status for_each_sequence_chunk(const std::vector<int32_t>& ids,
                                 const SequenceChunkFn& chunk_logits);
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
  // decode_rows: the rows decoding will write after the prompt, reserved with the prompt's (the
  // full-precision modes; capped at the capacity). keep_from >= 0: the cache keeps its
  // full-precision rows from there (prompt_cache_keep_from).
  Status prefill(const std::vector<int32_t>& ids, const PrefillProgress& progress = {},
                 int decode_rows = 0, int keep_from = -1);
  // The prompt cache's prefill: keeps positions [0, from) of the cache (reusable_prefix) and runs
  // ids[from..] after them, chunk by chunk, reading the kept history through the mode's view.
  Status extend(const std::vector<int32_t>& ids, int from, const PrefillProgress& progress,
                int decode_rows, int keep_from);
  // The prompt cache's cut: keeps positions [0, n) of every rank's cache (can_truncate_all must
  // hold), forgets the cached tokens until the generation ends, and keeps rows from keep_from
  // (>= 0) on.
  void cut_back(int n, int keep_from);
  // With EngineOptions::prompt_cache on a quantized cache: where a generation from a prompt of
  // `prompt_len` tokens has the cache keep its full-precision rows from
  // (KvCache::keep_rows_from), so that a next prompt that leaves this one within its last
  // kPromptCacheTail tokens, or shares all of it (another completion of the same prompt), keeps
  // the shared prefix; -1 otherwise.
  int prompt_cache_keep_from(int prompt_len) const;
  void keep_rows_all(int from);
  // KvCache::prepare_write of the rows [from, end) on every rank (end capped at the capacity).
  Status reserve_rows_all(int from, int64_t end);
  // prefill's layer-major order (quantized caches, exact attention) on every rank.
  Status prefill_by_layer_all(const std::vector<int32_t>& ids, const PrefillProgress& progress);
  // prefill's chunk-major order: each chunk through every layer (every rank), then the next;
  // snap_q (SnapKV, else null): [num_layers, window, q_dim] gets the last `window` queries.
  // from > 0 (extend): positions [0, from) are in the cache already; the chunks start there.
  Status prefill_by_chunk(const std::vector<int32_t>& ids, const PrefillProgress& progress,
                          int decode_rows, Buffer* snap_q, int window, int from = 0);

  // Tensor parallelism: the same forward on every rank (rank 0: model_ on cache_, logits into
  // `logits`, or with `argmax` only each row's argmax there (Model::forward); the others
  // into their own scratch), and a cache operation on every rank's cache. With one rank these
  // are the plain calls on model_ and cache_.
  Status forward_all(std::span<const int32_t> ids, int pos, const ForwardPath& path, LogitRows rows,
                     float* logits, int32_t* argmax = nullptr);
  // Runs fn on every rank's cache (on that rank's thread); the first error.
  Status each_cache(const std::function<Status(KvCache&)>& fn);
  void commit_all(int length);
  void truncate_all(int length);
  bool can_truncate_all(int length) const;  // KvCache::can_truncate on every rank
  // Empties every rank's cache (and forgets the prompt cache's tokens).
  void clear_all();
  // How a SpeculativeDecoder over model_ runs on all ranks (empty with one rank).
  DecoderDispatch dispatch();

  // SnapKV's index from the prefill's observation queries `snap_q` (backend memory, [num_layers,
  // window, q_dim]) and the committed prompt: each layer's scores where the KV lives
  // (Backend::snapkv_scores), their pooling and ranking on the host.
  void select_snapkv(const float* snap_q, int prompt_len, int window);
  // Threads for host-side work that is not a backend op (SnapKV's ranking), made on first use.
  ThreadPool& host_pool();
  // The prompt's last logits row for the first token: last_logits_, or with an active adjustment
  // a copy adjusted (no token generated yet: logit_bias alone).
  const std::vector<float>& first_logits(const LogitAdjust& adjust, LogitAdjuster& adjuster);
  // params.adjust, with the constraint of params.json_schema when it is set (json_constraints_;
  // json_vocab_ is made on first use from the tokenizer).
  Result<LogitAdjust> resolve_adjust(const GenerationParams& params);
  Result<JsonConstraint*> json_constraint(const std::string& schema);

  EngineOptions options_;
  std::unique_ptr<ThreadPool> host_pool_;
  int gamma_ = 0;  // resolved default speculation length (QuantSpec)
  SpecCounters counters_;
  ModelConfig cfg_;  // the full (unsharded) model's
  // tensor_parallel > 1: the shards' copied column slices (the rest are views of the weights'
  // mappings, which the shards' ModelWeights keep).
  std::vector<std::shared_ptr<std::vector<uint8_t>>> shard_storage_;
  std::unique_ptr<Backend> backend_;  // rank 0's
  std::unique_ptr<Model> model_;
  KvCache cache_;  // after backend_: destroyed before it
  // Ranks 1..tensor_parallel-1, each with its own backend, shard and cache.
  struct Peer {
    std::unique_ptr<Backend> backend;
    std::unique_ptr<Model> model;
    KvCache cache;
    std::vector<float> logits;  // this rank's copy of the logits (rank 0's are returned)
  };
  std::vector<Peer> peers_;
  std::unique_ptr<RankCommunicators> comms_;  // destroyed before the backends
  std::unique_ptr<RankThreads> rank_threads_;  // joined first
  std::optional<Tokenizer> tokenizer_;
  std::shared_ptr<const JsonVocab> json_vocab_;
  // The schemas met last (the newest at the back), kept with their masks: a server's clients
  // send the same few schemas again and again.
  std::vector<std::pair<std::string, std::unique_ptr<JsonConstraint>>> json_constraints_;
  std::vector<float> last_logits_;  // [vocab]
  std::vector<float> adjusted_logits_;  // first_logits
  // EngineOptions::prompt_cache: the tokens of the committed positions [0, cache_.length()) as
  // the last generate() left them; empty when the cache's contents are not known to match a
  // token sequence (another call changed them, or a generation failed).
  std::vector<int32_t> cached_ids_;
  // The logits at the last position of that generation's prompt (prompt_logits_len_ tokens), so
  // that the same prompt again (the next choice, a retry) runs nothing: it samples from them.
  std::vector<float> prompt_logits_;
  size_t prompt_logits_len_ = 0;
  std::vector<float> probs_;        // [vocab] sampler scratch
  SparseDraftIndex sparse_;
};

}  // namespace qs
