// Sparse-KV draft indices (the StreamingLLM and SnapKV self-speculation baselines): which prompt
// positions the draft attends to, per layer and kv head, chosen once after prefill. Positions
// after the selection's dense tail (the recent prompt window, everything generated later) are
// always visible; the K/V stay in the full-precision cache, the draft holds only this index.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"

namespace qs {

class ThreadPool;

// Prompt positions a draft keeps: round(budget * prompt_len) for budget < 1, else the count;
// at least 1, at most prompt_len.
int sparse_keep_count(double budget, int prompt_len);

// Backend::snapkv_scores over host memory, the reference of every backend's (the CPU backend runs
// it): per kv head, the window's query vectors' causal softmax over the prompt's keys, summed per
// candidate. `pool` (optional) spreads the kv heads over threads; the result does not depend on
// it.
void snapkv_scores_reference(const float* q, int window, const void* k_rows, DType row_dtype,
                             int64_t row_stride, const AttentionShape& shape, int prompt_len,
                             int past, float* scores, ThreadPool* pool = nullptr);

class SparseDraftIndex {
 public:
  // StreamingLLM: the first min(sinks, keep) positions and the last keep - sinks of the prompt.
  void build_streaming(int num_layers, int num_kv_heads, int prompt_len, int keep, int sinks);

  // SnapKV for one layer (call begin_snapkv first): `q` holds the post-RoPE queries of the
  // observation window, positions [prompt_len - w, prompt_len), `k` the layer's keys of positions
  // [0, prompt_len) (row r = position r). Each kv head keeps the recent window (up to keep
  // positions) and the keep - w earlier positions of highest pooled score: the window's softmax
  // attention to them, summed over queries and the head's query group, max-pooled (kernel).
  void begin_snapkv(int num_layers, int num_kv_heads, int prompt_len, int keep, int window);
  // The whole selection on the host, f32 keys in host memory: snapkv_scores_reference, then
  // select_snapkv_from_scores. `pool` (optional) spreads the kv heads over threads; the result
  // does not depend on it.
  void select_snapkv_layer(int layer, const float* q, const float* k, int64_t k_stride,
                           const AttentionShape& shape, int kernel, ThreadPool* pool = nullptr);
  // The ranking half: `scores` (host memory, [num_kv_heads, snapkv_candidates()]) are one layer's
  // Backend::snapkv_scores; each kv head keeps its `count` candidates of highest max-pooled
  // score (ties to the earlier position), ascending.
  void select_snapkv_from_scores(int layer, const float* scores, int kernel,
                                 ThreadPool* pool = nullptr);
  // SnapKV: the candidates [0, past) every kv head ranks (the prompt before the recent window);
  // 0 when the draft keeps every position, so that there is nothing to select.
  int snapkv_candidates() const {
    return layers_.empty() || layers_[0].count == 0 ? 0 : layers_[0].dense_from;
  }

  // Copies the positions into `backend`'s memory and points layers() there (attention reads them
  // where it runs). Call once, after the index is built.
  void place(Backend& backend);

  bool empty() const { return layers_.empty(); }
  const KvSelection* layers() const { return layers_.data(); }  // [num_layers]
  // The positions in host memory, also after place(): [num_layers, num_kv_heads, count].
  const std::vector<int32_t>& host_positions() const { return positions_; }
  size_t bytes() const { return positions_.size() * sizeof(int32_t); }

 private:
  void reset(int num_layers, int num_kv_heads, int count, int dense_from);

  int num_kv_heads_ = 0;
  int prompt_len_ = 0;
  int window_ = 0;                  // SnapKV: observation queries
  std::vector<int32_t> positions_;  // [num_layers, num_kv_heads, count] ascending per head
  std::vector<KvSelection> layers_;  // [num_layers] views into positions_ (or placed_)
  std::shared_ptr<Buffer> placed_;   // the positions in backend memory, after place()
};

}  // namespace qs
