#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "backend/cpu/row_math.h"

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

int32_t sample_from(const std::vector<float>& probs, Rng& rng) {
  QS_CHECK(!probs.empty());
  return sample_at(probs.data(), static_cast<int>(probs.size()), rng.uniform());
}

TokenLogprob token_logprob(const float* logits, int vocab, int32_t id, int top) {
  QS_CHECK(vocab > 0 && id >= 0 && id < vocab && top >= 0);
  // f32 exponentials (each within an ulp, vectorized) summed in f64: log-probabilities within
  // ~1e-7.
  const float mx = cpu::row_max(logits, vocab);
  const double log_z = mx + std::log(cpu::row_sum_exp(logits, vocab, mx));
  auto logprob_of = [&](int32_t t) { return static_cast<float>(logits[t] - log_z); };
  TokenLogprob r;
  r.id = id;
  r.logprob = logprob_of(id);
  // The `top` most likely in one pass (ties: the lower id); none that cannot come (a -inf
  // logit: JSON mode's mask).
  const std::vector<int32_t> kept = cpu::row_top_k(logits, vocab, std::min(top, vocab));
  for (int32_t t : kept) {
    if (logits[t] != -INFINITY) r.top.emplace_back(t, logprob_of(t));
  }
  return r;
}

std::vector<TokenLogprob> rows_logprobs(Backend& backend, const float* rows, int vocab,
                                        std::span<const int32_t> tokens, int top,
                                        std::vector<float>& scratch) {
  const size_t v = static_cast<size_t>(vocab);
  scratch.resize(tokens.size() * v);
  backend.to_host(rows, scratch.data(), scratch.size());
  std::vector<TokenLogprob> out;
  for (size_t i = 0; i < tokens.size(); ++i)
    out.push_back(token_logprob(scratch.data() + i * v, vocab, tokens[i], top));
  return out;
}

int32_t sample_token(const float* logits, int vocab, const SamplingParams& params, Rng& rng,
                     std::vector<float>& scratch_probs) {
  if (params.temperature <= 0.0f) return argmax(logits, vocab);
  token_probabilities(logits, vocab, params, scratch_probs);
  return sample_from(scratch_probs, rng);
}

}  // namespace qs
