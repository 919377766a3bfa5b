#include "core/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/argmax.h"
#include "core/error.h"

namespace qs {

namespace {

// Candidates sorted best-first: larger logit first, lower index among equal logits.
struct BetterToken {
  const float* logits;
  bool operator()(int32_t a, int32_t b) const {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  }
};

}  // namespace

void token_probabilities(const float* logits, int vocab, const SamplingParams& params,
                         std::vector<float>& probs) {
  QS_CHECK(vocab > 0);
  probs.assign(static_cast<size_t>(vocab), 0.0f);
  if (params.temperature <= 0.0f) {
    probs[argmax(logits, vocab)] = 1.0f;
    return;
  }
  const BetterToken better{logits};

  // Top-k: keep every token whose logit is >= the k-th largest.
  std::vector<int32_t> kept;
  if (params.top_k > 0 && params.top_k < vocab) {
    std::vector<int32_t> order(static_cast<size_t>(vocab));
    std::iota(order.begin(), order.end(), 0);
    std::nth_element(order.begin(), order.begin() + (params.top_k - 1), order.end(), better);
    const float kth = logits[order[params.top_k - 1]];
    for (int32_t i = 0; i < vocab; ++i) {
      if (logits[i] >= kth) kept.push_back(i);
    }
  } else {
    kept.resize(static_cast<size_t>(vocab));
    std::iota(kept.begin(), kept.end(), 0);
  }

  // Softmax of logits / temperature over the kept set (double sums; f32 results).
  const double inv_t = 1.0 / static_cast<double>(params.temperature);
  float max_logit = -INFINITY;
  for (int32_t i : kept) max_logit = std::max(max_logit, logits[i]);
  double total = 0.0;
  for (int32_t i : kept) {
    double e = std::exp((static_cast<double>(logits[i]) - max_logit) * inv_t);
    probs[i] = static_cast<float>(e);
    total += e;
  }
  for (int32_t i : kept) probs[i] = static_cast<float>(probs[i] / total);

  // Top-p: the most likely tokens until their mass reaches top_p. Usually a few hundred tokens
  // carry the mass, so sort only a prefix unless it falls short.
  if (params.top_p < 1.0f && kept.size() > 1) {
    size_t prefix = std::min<size_t>(kept.size(), 1024);
    size_t keep_count = 0;
    for (;;) {
      std::partial_sort(kept.begin(), kept.begin() + prefix, kept.end(), better);
      double cum = 0.0;
      for (size_t j = 0; j < prefix; ++j) {
        cum += probs[kept[j]];
        if (cum >= params.top_p) {
          keep_count = j + 1;
          break;
        }
      }
      if (keep_count > 0 || prefix == kept.size()) break;
      prefix = kept.size();
    }
    if (keep_count == 0) keep_count = kept.size();  // rounding kept the sum just below top_p
    for (size_t j = keep_count; j < kept.size(); ++j) probs[kept[j]] = 0.0f;
    kept.resize(keep_count);
    double mass = 0.0;
    for (int32_t i : kept) mass += probs[i];
    for (int32_t i : kept) probs[i] = static_cast<float>(probs[i] / mass);
  }

  // Min-p: drop tokens below min_p times the most likely token's probability.
  if (params.min_p > 0.0f) {
    float p_max = 0.0f;
    for (int32_t i : kept) p_max = std::max(p_max, probs[i]);
    const float threshold = params.min_p * p_max;
    double mass = 0.0;
    for (int32_t i : kept) {
      if (probs[i] < threshold) {
        probs[i] = 0.0f;
      } else {
        mass += probs[i];
      }
    }
    for (int32_t i : kept) probs[i] = static_cast<float>(probs[i] / mass);
  }
}

int32_t sample_at(const float* probs, int n, double u) {
  QS_CHECK(n > 0);
  double total = 0.0;
  for (int i = 0; i < n; ++i) total += probs[i];
  QS_CHECK_MSG(total > 0.0, "sample_at: the distribution is all zeros");
  const double target = u * total;
  double cum = 0.0;
  int32_t last_nonzero = -1;
  for (int32_t i = 0; i < n; ++i) {
    if (probs[i] <= 0.0f) continue;
    cum += probs[i];
    last_nonzero = i;
    if (target < cum) return last_nonzero;
  }
  return last_nonzero;  // u landed in the rounding slack at the top
}

SpecVerdict speculative_verdict(const std::function<const float*(int)>& p, float* q, int gamma,
                                int n, const int32_t* g, const double* u, bool residual) {
  QS_CHECK(gamma >= 0 && n > 0);
  SpecVerdict v;
  for (int i = 0; i < gamma; ++i) {
    const float* pi = p(i);
    float* qi = q + static_cast<size_t>(i) * n;
    const double pg = pi[g[i]], qg = qi[g[i]];  // qg > 0: g was drawn from q
    if (u[i] < std::min(1.0, pg / qg)) {
      ++v.accepted;
      continue;
    }
    if (!residual) {
      v.token = sample_at(pi, n, u[gamma]);
      return v;
    }
    double mass = 0.0;
    for (int t = 0; t < n; ++t) {
      const float r = std::max(pi[t] - qi[t], 0.0f);
      qi[t] = r;
      mass += r;
    }
    v.token = sample_at(mass > 0.0 ? qi : pi, n, u[gamma]);
    return v;
  }
  v.token = sample_at(p(gamma), n, u[gamma]);
  return v;
}

}  // namespace qs
