#include "kv/sparse_select.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace qs {

int sparse_keep_count(double budget, int prompt_len) {
  const double k = budget < 1.0 ? std::round(budget * prompt_len) : std::floor(budget);
  return static_cast<int>(std::clamp<double>(k, 1.0, std::max(prompt_len, 1)));
}

void SparseDraftIndex::reset(int num_layers, int num_kv_heads, int count, int dense_from) {
  num_kv_heads_ = num_kv_heads;
  placed_.reset();
  positions_.assign(static_cast<size_t>(num_layers) * num_kv_heads * count, 0);
  layers_.assign(static_cast<size_t>(num_layers), KvSelection{});
  for (int l = 0; l < num_layers; ++l) {
    layers_[l].positions = positions_.data() + static_cast<size_t>(l) * num_kv_heads * count;
    layers_[l].count = count;
    layers_[l].dense_from = dense_from;
  }
}

void SparseDraftIndex::build_streaming(int num_layers, int num_kv_heads, int prompt_len,
                                       int keep, int sinks) {
  QS_CHECK(keep >= 1 && keep <= prompt_len && sinks >= 0);
  if (keep == prompt_len) {  // everything visible: a dense view
    reset(num_layers, num_kv_heads, 0, 0);
    return;
  }
  const int count = std::min(sinks, keep);
  reset(num_layers, num_kv_heads, count, prompt_len - (keep - count));
  for (size_t i = 0; i < positions_.size(); ++i) positions_[i] = static_cast<int32_t>(i % count);
}

void SparseDraftIndex::begin_snapkv(int num_layers, int num_kv_heads, int prompt_len, int keep,
                                    int window) {
  QS_CHECK(keep >= 1 && keep <= prompt_len && window >= 1);
  prompt_len_ = prompt_len;
  window_ = std::min(window, prompt_len);
  const int recent = std::min(window_, keep);
  const int dense_from = prompt_len - recent;
  reset(num_layers, num_kv_heads, std::min(keep - recent, dense_from), dense_from);
}

namespace {

// Runs fn(kvh) for every kv head, spread over `pool` when given: heads are independent and each
// writes its own slice, so the result does not depend on the pool.
template <typename Fn>
void for_each_kv_head(int num_kv_heads, ThreadPool* pool, const Fn& fn) {
  if (pool == nullptr) {
    for (int kvh = 0; kvh < num_kv_heads; ++kvh) fn(kvh);
    return;
  }
  pool->parallel_for(num_kv_heads, [&](int64_t begin, int64_t end) {
    for (int64_t kvh = begin; kvh < end; ++kvh) fn(static_cast<int>(kvh));
  });
}

// q . k over hd floats: 8 independent partial sums (vectorizable), combined pairwise.
float dot_8(const float* q, const float* k, int hd) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int d = 0;
  for (; d + 8 <= hd; d += 8) {
    for (int u = 0; u < 8; ++u) acc[u] += q[d + u] * k[d + u];
  }
  for (; d < hd; ++d) acc[d % 8] += q[d] * k[d];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// snapkv_scores_reference for kv head kvh: out[t], t < past.
void snapkv_head_scores(int kvh, const float* q, int w, const void* k_rows, DType row_dtype,
                        int64_t row_stride, const AttentionShape& shape, int prompt_len, int past,
                        float* out) {
  const int hd = shape.head_dim;
  const int group = shape.num_heads / shape.num_kv_heads;
  const int q0 = prompt_len - w;
  const int nq = group * w;  // the window's query vectors of this kv head: (head, query i)
  // Scores of every query vector against every prompt key, the key rows read once (in order)
  // for all of them: [nq][prompt_len] (causality is applied below).
  std::vector<float> s(static_cast<size_t>(nq) * prompt_len);
  std::vector<const float*> qv(static_cast<size_t>(nq));
  for (int g = 0; g < group; ++g) {
    for (int i = 0; i < w; ++i) {
      qv[static_cast<size_t>(g * w + i)] =
          q + (static_cast<int64_t>(i) * shape.num_heads + kvh * group + g) * hd;
    }
  }
  std::vector<float> key(static_cast<size_t>(hd));  // one f16 key row as f32 (exact)
  for (int t = 0; t < prompt_len; ++t) {
    const int64_t offset = t * row_stride + static_cast<int64_t>(kvh) * hd;
    const float* kr = key.data();
    if (row_dtype == DType::F32) {
      kr = static_cast<const float*>(k_rows) + offset;
    } else {
      to_f32(DType::F16, static_cast<const uint16_t*>(k_rows) + offset, key.data(), key.size());
    }
    for (int j = 0; j < nq; ++j) {
      s[static_cast<size_t>(j) * prompt_len + t] =
          dot_8(qv[static_cast<size_t>(j)], kr, hd) * shape.scale;
    }
  }
  // Per query vector: the softmax over its visible keys [0, q0 + i], summed into the scores of
  // the candidates it sees.
  std::vector<double> score(static_cast<size_t>(past), 0.0);
  std::vector<float> e(static_cast<size_t>(prompt_len));
  for (int j = 0; j < nq; ++j) {
    const float* row = s.data() + static_cast<size_t>(j) * prompt_len;
    const int len = q0 + j % w + 1;  // causal
    float mx = -INFINITY;
    for (int t = 0; t < len; ++t) mx = std::max(mx, row[t]);
    double sum = 0.0;
    for (int t = 0; t < len; ++t) {
      e[static_cast<size_t>(t)] = std::exp(row[t] - mx);  // in (0, 1]: f32 is ample for a ranking
      sum += e[static_cast<size_t>(t)];
    }
    const double inv = 1.0 / sum;
    for (int t = 0; t < std::min(past, len); ++t) {
      score[static_cast<size_t>(t)] += e[static_cast<size_t>(t)] * inv;
    }
  }
  for (int t = 0; t < past; ++t) out[t] = static_cast<float>(score[static_cast<size_t>(t)]);
}

// One kv head's choice: the `count` candidates of highest score max-pooled over `kernel`
// neighbours, ascending. score: [past].
void select_top_pooled(const float* score, int past, int kernel, int count, int32_t* out) {
  std::vector<float> pooled(static_cast<size_t>(past));
  std::vector<int32_t> order(static_cast<size_t>(past));
  const int r = kernel / 2;
  for (int t = 0; t < past; ++t) {
    float best = 0.0f;
    for (int u = std::max(0, t - r); u <= std::min(past - 1, t + r); ++u) {
      best = std::max(best, score[u]);
    }
    pooled[t] = best;
  }
  std::iota(order.begin(), order.end(), 0);
  // Ties (pooling makes many) go to the earlier position: a deterministic choice.
  std::partial_sort(order.begin(), order.begin() + count, order.end(), [&](int32_t a, int32_t b) {
    return pooled[a] != pooled[b] ? pooled[a] > pooled[b] : a < b;
  });
  std::copy(order.begin(), order.begin() + count, out);
  std::sort(out, out + count);
}

}  // namespace

void snapkv_scores_reference(const float* q, int window, const void* k_rows, DType row_dtype,
                             int64_t row_stride, const AttentionShape& shape, int prompt_len,
                             int past, float* scores, ThreadPool* pool) {
  QS_CHECK(window >= 1 && window <= prompt_len && past >= 0 && past <= prompt_len);
  QS_CHECK(shape.num_kv_heads >= 1 && shape.num_heads % shape.num_kv_heads == 0);
  QS_CHECK(row_stride >= static_cast<int64_t>(shape.num_kv_heads) * shape.head_dim);
  QS_CHECK_MSG(kv_row_dtype_supported(row_dtype), "snapkv_scores: rows are F32 or F16");
  for_each_kv_head(shape.num_kv_heads, pool, [&](int kvh) {
    snapkv_head_scores(kvh, q, window, k_rows, row_dtype, row_stride, shape, prompt_len, past,
                       scores + static_cast<int64_t>(kvh) * past);
  });
}

void SparseDraftIndex::select_snapkv_layer(int layer, const float* q, const float* k,
                                           int64_t k_stride, const AttentionShape& shape,
                                           int kernel, ThreadPool* pool) {
  const int past = snapkv_candidates();
  if (past == 0) return;
  std::vector<float> scores(static_cast<size_t>(num_kv_heads_) * past);
  snapkv_scores_reference(q, window_, k, DType::F32, k_stride, shape, prompt_len_, past,
                          scores.data(), pool);
  select_snapkv_from_scores(layer, scores.data(), kernel, pool);
}

void SparseDraftIndex::select_snapkv_from_scores(int layer, const float* scores, int kernel,
                                                 ThreadPool* pool) {
  KvSelection& sel = layers_.at(static_cast<size_t>(layer));
  if (sel.count == 0) return;
  const int past = sel.dense_from;
  int32_t* layer_out = positions_.data() + (sel.positions - positions_.data());
  for_each_kv_head(num_kv_heads_, pool, [&](int kvh) {
    select_top_pooled(scores + static_cast<int64_t>(kvh) * past, past, kernel, sel.count,
                      layer_out + static_cast<int64_t>(kvh) * sel.count);
  });
}

void SparseDraftIndex::place(Backend& backend) {
  static_assert(sizeof(int32_t) == sizeof(float));
  QS_CHECK_MSG(!placed_, "SparseDraftIndex::place called twice");
  if (positions_.empty()) return;
  placed_ = backend.alloc(positions_.size());
  backend.from_host(reinterpret_cast<const float*>(positions_.data()), placed_->data(),
                    positions_.size());
  const auto* base = reinterpret_cast<const int32_t*>(placed_->data());
  for (KvSelection& sel : layers_) sel.positions = base + (sel.positions - positions_.data());
}

}  // namespace qs
