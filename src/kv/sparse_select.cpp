#include "kv/sparse_select.h"

#include <algorithm>
#include <cmath>
#include <numeric>

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

void SparseDraftIndex::select_snapkv_layer(int layer, const float* q, const float* k,
                                           int64_t k_stride, const AttentionShape& shape,
                                           int kernel, ThreadPool* pool) {
  KvSelection& sel = layers_.at(static_cast<size_t>(layer));
  if (sel.count == 0) return;
  int32_t* layer_out = positions_.data() + (sel.positions - positions_.data());
  auto one_head = [&](int kvh) {
    select_snapkv_head(kvh, q, k, k_stride, shape, kernel, sel,
                       layer_out + static_cast<int64_t>(kvh) * sel.count);
  };
  if (pool == nullptr) {
    for (int kvh = 0; kvh < shape.num_kv_heads; ++kvh) one_head(kvh);
    return;
  }
  // Heads are independent and each writes its own slice: the result does not depend on the pool.
  pool->parallel_for(shape.num_kv_heads, [&](int64_t begin, int64_t end) {
    for (int64_t kvh = begin; kvh < end; ++kvh) one_head(static_cast<int>(kvh));
  });
}

namespace {

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

}  // namespace

void SparseDraftIndex::select_snapkv_head(int kvh, const float* q, const float* k,
                                          int64_t k_stride, const AttentionShape& shape,
                                          int kernel, const KvSelection& sel,
                                          int32_t* out) const {
  const int hd = shape.head_dim;
  const int group = shape.num_heads / shape.num_kv_heads;
  const int past = sel.dense_from;  // candidates [0, past)
  const int w = window_;
  const int q0 = prompt_len_ - w;
  const int nq = group * w;  // the window's query vectors of this kv head: (head, query i)
  // Scores of every query vector against every prompt key, the key rows read once (in order)
  // for all of them: [nq][prompt_len] (causality is applied below).
  std::vector<float> s(static_cast<size_t>(nq) * prompt_len_);
  std::vector<const float*> qv(static_cast<size_t>(nq));
  for (int g = 0; g < group; ++g) {
    for (int i = 0; i < w; ++i) {
      qv[static_cast<size_t>(g * w + i)] =
          q + (static_cast<int64_t>(i) * shape.num_heads + kvh * group + g) * hd;
    }
  }
  for (int t = 0; t < prompt_len_; ++t) {
    const float* kr = k + t * k_stride + static_cast<int64_t>(kvh) * hd;
    for (int j = 0; j < nq; ++j) {
      s[static_cast<size_t>(j) * prompt_len_ + t] = dot_8(qv[static_cast<size_t>(j)], kr, hd) *
                                                    shape.scale;
    }
  }
  // Per query vector: the softmax over its visible keys [0, q0 + i], summed into the candidates'
  // scores.
  std::vector<double> score(static_cast<size_t>(past), 0.0);
  std::vector<float> e(static_cast<size_t>(prompt_len_));
  for (int j = 0; j < nq; ++j) {
    const float* row = s.data() + static_cast<size_t>(j) * prompt_len_;
    const int len = q0 + j % w + 1;  // causal
    float mx = -INFINITY;
    for (int t = 0; t < len; ++t) mx = std::max(mx, row[t]);
    double sum = 0.0;
    for (int t = 0; t < len; ++t) {
      e[static_cast<size_t>(t)] = std::exp(row[t] - mx);  // in (0, 1]: f32 is ample for a ranking
      sum += e[static_cast<size_t>(t)];
    }
    const double inv = 1.0 / sum;
    for (int t = 0; t < past; ++t) score[static_cast<size_t>(t)] += e[static_cast<size_t>(t)] * inv;
  }
  std::vector<double> pooled(static_cast<size_t>(past));
  std::vector<int32_t> order(static_cast<size_t>(past));
  const int r = kernel / 2;
  for (int t = 0; t < past; ++t) {
    double best = 0.0;
    for (int u = std::max(0, t - r); u <= std::min(past - 1, t + r); ++u) {
      best = std::max(best, score[u]);
    }
    pooled[t] = best;
  }
  std::iota(order.begin(), order.end(), 0);
  // Ties (pooling makes many) go to the earlier position: a deterministic choice.
  std::partial_sort(order.begin(), order.begin() + sel.count, order.end(),
                    [&](int32_t a, int32_t b) {
                      return pooled[a] != pooled[b] ? pooled[a] > pooled[b] : a < b;
                    });
  std::copy(order.begin(), order.begin() + sel.count, out);
  std::sort(out, out + sel.count);
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
