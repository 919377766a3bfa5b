// Token sampling on the host: a seeded RNG of our own and draws through core/sampling.h's rule
// (the logit processing, token_probabilities, which the speculative sampler applies identically
// to draft and target logits; sample_at). Backends sample where the logits are through the same
// rule (Backend::sample_rows).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "core/argmax.h"  // argmax: index of the largest logit, the lowest among ties
#include "core/error.h"
#include "core/sampling.h"  // SamplingParams, token_probabilities, sample_at
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

// A draw from `probs` at rng.uniform() (core/sampling.h sample_at).
int32_t sample_from(const std::vector<float>& probs, Rng& rng);

// Token `id`'s log-probability under log_softmax(logits) (in double) and the `top` most likely
// tokens' (descending, ties by the lower id).
TokenLogprob token_logprob(const float* logits, int vocab, int32_t id, int top);

// token_logprob of tokens[i] in row i of [tokens.size(), vocab] logits in backend memory, copied to
// the host through `scratch`.
std::vector<TokenLogprob> rows_logprobs(Backend& backend, const float* rows, int vocab,
                                        std::span<const int32_t> tokens, int top,
                                        std::vector<float>& scratch);

// Greedy (argmax) when temperature == 0, else a draw from token_probabilities().
int32_t sample_token(const float* logits, int vocab, const SamplingParams& params, Rng& rng,
                     std::vector<float>& scratch_probs);

}  // namespace qs
