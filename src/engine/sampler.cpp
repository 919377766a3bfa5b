#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

namespace qs {

namespace {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t rotl(uint64_t x, int k) {
  return (x << k) | (x >> (64 - k));
}

// Candidates sorted best-first: larger logit first, lower index among equal logits.
struct BetterToken {
  const float* logits;
  bool operator()(int32_t a, int32_t b) const {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  }
};

}  // namespace

Rng::Rng(uint64_t seed) {
  uint64_t state = seed;
  for (uint64_t& s : s_) s = splitmix64(state);
}

uint64_t Rng::next_u64() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Rng::uniform() {
  return static_cast<double>(next_u64() >> 11) * 0x1.0p-53;
}

Status check_sampling_params(const SamplingParams& p) {
  if (!(p.temperature >= 0.0f) || std::isinf(p.temperature)) {
    return make_error("sampling: temperature must be >= 0 and finite, got " +
                      std::to_string(p.temperature));
  }
  if (p.top_k < 0)
    return make_error("sampling: top_k must be >= 0, got " + std::to_string(p.top_k));
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
    return make_error("sampling: top_p must be in (0, 1], got " + std::to_string(p.top_p));
  }
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) {
    return make_error("sampling: min_p must be in [0, 1], got " + std::to_string(p.min_p));
  }
  return Status::ok_status();
}

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

int32_t sample_from(const std::vector<float>& probs, Rng& rng) {
  QS_CHECK(!probs.empty());
  double total = 0.0;
  for (float p : probs) total += p;
  QS_CHECK_MSG(total > 0.0, "sample_from: the distribution is all zeros");
  const double u = rng.uniform() * total;
  double cum = 0.0;
  int32_t last_nonzero = -1;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] <= 0.0f) continue;
    cum += probs[i];
    last_nonzero = static_cast<int32_t>(i);
    if (u < cum) return last_nonzero;
  }
  return last_nonzero;  // u landed in the rounding slack at the top
}

int32_t sample_token(const float* logits, int vocab, const SamplingParams& params, Rng& rng,
                     std::vector<float>& scratch_probs) {
  if (params.temperature <= 0.0f) return argmax(logits, vocab);
  token_probabilities(logits, vocab, params, scratch_probs);
  return sample_from(scratch_probs, rng);
}

}  // namespace qs
