// Token sampling: a seeded RNG of our own, the logit processing (temperature, top-k, top-p,
// min-p) as one reusable function, and sampling from a processed distribution. The speculative
// sampler applies token_probabilities() identically to draft and target logits.
#pragma once

#include <cstdint>
#include <vector>

#include "core/argmax.h"  // argmax: index of the largest logit, the lowest among ties
#include "core/error.h"
#include "engine/engine.h"

namespace qs {

// xoshiro256** seeded through splitmix64: the same seed gives the same stream everywhere.
class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t next_u64();
  double uniform();  // [0, 1), 53 random bits

 private:
  uint64_t s_[4];
};

// Rejects values no sampler can honor (negative temperature, top_p outside (0, 1], ...).
Status check_sampling_params(const SamplingParams& params);

// The processed next-token distribution, written to probs[0, vocab) (resized to vocab), summing
// to 1: softmax(logits / temperature), restricted to the top_k largest logits (ties at the k-th
// value are kept, as HF does), then to the smallest most-likely set with cumulative probability
// >= top_p, then to tokens with p >= min_p * p_max, renormalized after each step. At least one
// token always survives. temperature == 0 gives the one-hot distribution of argmax.
void token_probabilities(const float* logits, int vocab, const SamplingParams& params,
                         std::vector<float>& probs);

// A draw from `probs` (non-negative, summing to ~1); never returns a zero-probability token.
int32_t sample_from(const std::vector<float>& probs, Rng& rng);

// Greedy (argmax) when temperature == 0, else a draw from token_probabilities().
int32_t sample_token(const float* logits, int vocab, const SamplingParams& params, Rng& rng,
                     std::vector<float>& scratch_probs);

}  // namespace qs
