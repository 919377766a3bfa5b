// A decoder-only Llama-family model bound to a backend: the forward pass over any number of
// tokens (prefill chunk, one decode token, or a speculative verification block).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "engine/communicator.h"
#include "engine/engine.h"
#include "kv/kv_cache.h"
#include "model/config.h"
#include "model/weights.h"
#include "quant/weight_quant.h"

namespace qs {

// Which rows of a forward call produce logits.
enum class LogitRows { kNone, kLast, kAll };

// Which weights and which view of the KV history a forward uses (DESIGN §1's two paths).
struct ForwardPath {
  bool draft_weights = false;  // the 4-bit draft weights (make_draft_weights) instead of the
                               // original ones
  // The view of the quantized history (quantized caches): query t reads [0, b(t)) through it.
  // nullopt: full-precision attention over the buffer (prefill; the cache must start at 0).
  std::optional<KvQuantView> kv_view;
  KvReadBytes* kv_read = nullptr;  // when set, gets the KV bytes every layer read
  // Sparse-KV drafts: layer l attends to selection[l] of the full-precision history
  // (fp caches only). nullptr: every position.
  const KvSelection* selection = nullptr;  // [num_layers]
  // When set, called per layer with the call's post-RoPE queries ([m, q_dim], host memory on the
  // CPU): SnapKV's observation window.
  std::function<void(int layer, const float* q, int m)> query_tap;
};

// The target path of a cache mode (AR decoding, verification) and QuantSpec's draft path.
ForwardPath target_path(KvMode mode);
ForwardPath draft_path(KvMode mode);

// Checks that the weights have the shapes, dtypes and presence the config implies and that the
// config is one the forward pass supports. Errors name the tensor or the field.
Status check_model(const ModelConfig& cfg, const ModelWeights& weights);

class Model {
 public:
  // `weights` must pass check_model(cfg, weights). The backend must outlive the model.
  Model(const ModelConfig& cfg, ModelWeights weights, Backend& backend);
  // Tells the backend that the 4-bit draft weights go (Backend::forget_weights4).
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return cfg_; }
  // The last forward's logit rows in backend memory ([rows, vocab]; valid until the next call).
  const float* logits_buffer() const { return logits_ ? logits_->data() : nullptr; }
  // The same rows to change in place (a LogitAdjust before sampling).
  float* mutable_logits_buffer() { return logits_ ? logits_->data() : nullptr; }
  const ModelWeights& weights() const { return weights_; }
  Backend& backend() { return backend_; }

  // Tensor parallelism (engine/tensor_parallel.h, docs/multi-gpu.md): with a communicator, this
  // model is one rank's shard; the o_proj and down_proj outputs are summed over the ranks
  // (all_reduce_sum) before the residual add, and o_proj's bias is added on rank 0 only. Every
  // forward is then a collective: all ranks run the same calls. nullptr (the default): the
  // unsharded model. The communicator must outlive its use.
  void set_communicator(Communicator* comm) { comm_ = comm; }
  Communicator* communicator() const { return comm_; }

  // Runs `ids` at positions [pos, pos + m), m = ids.size() >= 1, pos in [cache.length(),
  // cache.written_end()]: writes their K/V rows (the caller commits) and attends through `path`.
  // logits (host): kLast -> [vocab]; kAll -> [m, vocab]; kNone -> unused (may be null). With
  // `argmax` set, only each row's argmax comes back there instead (kLast -> [1], kAll -> [m];
  // Backend::argmax_rows: what greedy decoding needs, the logits never leave the backend) and
  // logits is unused. With neither, the rows stay in backend memory: logits_buffer() (sampling
  // where the logits are, Backend::sample_rows).
  // Errors: a token id outside [0, vocab), or the cache is full.
  // With path.kv_view set on a quantized cache, query t reads [0, b(t)) through that view and
  // groups below the last query's boundary that are not quantized yet are quantized first
  // (evaluation over rows that are committed by construction; in decoding they always are
  // already). Without it, attention is full precision over the buffer (the cache must start at 0).
  Status forward(std::span<const int32_t> ids, int pos, KvCache& cache, const ForwardPath& path,
                 LogitRows rows, float* logits, int32_t* argmax = nullptr);

  // An error naming the first id outside [0, vocab), if any (forward checks its ids this way).
  Status check_ids(std::span<const int32_t> ids) const;

  // forward() over m ids in backend memory (Backend::alloc_ids), each logit row's argmax going to
  // `argmax` in backend memory ([1] for kLast, [m] for kAll; rows must not be kNone) or, argmax
  // null, the logits staying in logits_buffer() (a sampler draws from them there); queued
  // without waiting: a speculative round's draft feeds each step's token to the next this way and
  // the host reads the round's ids back once. The ids are not range-checked (tokens of this
  // vocabulary's logits, or checked on their way in).
  Status forward_chained(const int32_t* ids, int m, int pos, KvCache& cache,
                         const ForwardPath& path, LogitRows rows, int32_t* argmax);

  // The prompt `ids` (positions [0, n)) on an empty quantized cache, layer by layer: every chunk
  // of `chunk` tokens through layer 0, then through layer 1, ..., with KvCache's layer-major
  // prefill, so only one layer's full-precision rows exist at a time (plus the residual stream of
  // the whole prompt, n x hidden floats). The same calls per chunk as forward() over the chunks
  // in order with full-precision attention followed by cache.commit(n): the same logits of the
  // last position (into `logits`, host, [vocab]) and the same cache, bit for bit. progress gets
  // the (layer, token) steps done, layers x n in all. With a communicator every rank calls it
  // with the same ids and chunk (a collective, as forward).
  // Errors: a token id outside [0, vocab), the cache is too small, memory cannot be had.
  Status prefill_by_layer(std::span<const int32_t> ids, int chunk, KvCache& cache, float* logits,
                          const std::function<void(int64_t)>& progress = {});

  // Builds the draft weights from the original ones (DESIGN §1): kInt4 quantizes every linear
  // layer and lm_head to 4-bit group 128, kInt4Mlp the MLP only, kNative keeps the originals.
  // `threads` quantize rows in parallel (0: one per hardware thread; the result does not depend
  // on it): ~5 ns per weight on one core of the development machine, so 30+ s for a 7B model.
  Status make_draft_weights(DraftWeights kind, int threads = 0);
  // Bytes of weights one draft step reads (the 4-bit tensors at their packed size).
  size_t draft_weight_bytes_per_token() const;

  // Bytes of weights one decode step reads: every layer, the final norm, the LM head, and one
  // embedding row.
  size_t weight_bytes_per_token() const;

 private:
  // Activations for m rows; an error naming the size when the backend cannot allocate them.
  Status ensure_scratch(int m);
  // One decoder layer over m rows (run()'s loop body; see model.cpp). qkv_ready: q_, k_, v_
  // already hold its projections; next_qkv_ready: it computed the next layer's.
  PendingNorm layer(int l, float* h, const PendingNorm& in, bool qkv_ready, int m, int pos,
                    KvCache& cache, const ForwardPath& path, const WeightView* next_norm,
                    bool& next_qkv_ready);
  // Layer l's q / k / v projections into q_, k_, v_ (the draft's 4-bit weights on its path).
  std::array<LinearOp, 3> qkv_ops(int l, const ForwardPath& path) const;
  // A forward's m token ids: host memory (forward) or, chained, backend memory (forward_chained;
  // the argmax then goes to backend memory too).
  struct TokenInput {
    const int32_t* ids;
    int m;
    bool chained;
  };
  // The LM head over `count` normed rows x: logits to the host or each row's argmax (to backend
  // memory when chained).
  void head(const float* x, int count, bool draft, float* logits, int32_t* argmax, bool chained);
  // Both forwards: the checks, then the layer stack and head over ids at [pos, pos + m).
  Status run(const TokenInput& in, int pos, KvCache& cache, const ForwardPath& path, LogitRows rows,
             float* logits, int32_t* argmax);
  // Applies RoPE to q_ and k_ and stores `layer`'s new K/V rows (k_, v_) in the cache (one
  // backend call: Backend::rope_qk_store_kv) unless rows_written (the previous layer's
  // output_and_mlp did), quantizes the groups the last query's boundary needs, and returns the
  // view attention reads (segment: its storage).
  KvView store_and_view(KvCache& cache, const ForwardPath& path, int layer, int pos, int m,
                        QuantizedKvSegment* segment, bool rows_written);
  // RoPE of q_ and k_ with this model's heads and frequencies.
  RopeQK rope_qk() const;
  void linear(const float* x, int m, const WeightView& w, const QuantizedWeight4* w4,
              const WeightView* bias, float* y);
  // x W^T (+ bias) (W, or the 4-bit w4 when set) added to the residual stream h, then the rows
  // norm(h): Backend::linear_add_rmsnorm_deferred (one launch on the GPU; the draft's rows
  // deferred to the next matmuls there), or with tensor parallel the matmul, the all-reduce of
  // the ranks' partial sums and Backend::add_rmsnorm into out. proj_ is scratch.
  PendingNorm linear_add_norm(const float* x, int m, const WeightView& w,
                              const QuantizedWeight4* w4, const WeightView* bias, float* h,
                              const WeightView& norm, float* out);

  // 4-bit draft copies; a null entry means the draft uses the original weight.
  struct DraftLayer {
    std::unique_ptr<QuantizedWeight4> wq, wk, wv, wo, w_gate, w_up, w_down;
  };
  // Drops the draft weights, after telling the backend (their device copies are found by host
  // address: a later weight at the same address must not be taken for one of them).
  void drop_draft_weights();
  std::vector<const QuantizedWeight4*> draft_weights4() const;  // those there are
  // Layer l's draft copies on a draft path, else none (every entry null).
  const DraftLayer& draft_layer(int l, const ForwardPath& path) const;
  std::vector<DraftLayer> draft_layers_;
  std::unique_ptr<QuantizedWeight4> draft_lm_head_;

  ModelConfig cfg_;
  ModelWeights weights_;
  Backend& backend_;
  Communicator* comm_ = nullptr;  // tensor parallelism; nullptr: unsharded
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
