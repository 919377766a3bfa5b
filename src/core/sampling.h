// The sampling rule's arithmetic (DESIGN.md §4), shared by the engine's sampler (host logits) and
// the backends' default Backend::sample_rows / speculative_verdict, which the GPU kernels follow:
// the processed next-token distribution, a draw from it at a given uniform, and the speculative
// accept / reject decision of one round. C++17 (CUDA sources include it through backend.h).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace qs {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  int top_k = 0;             // 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
  uint64_t seed = 0;         // same seed, same output
};

// The processed next-token distribution, written to probs[0, vocab) (resized to vocab), summing
// to 1: softmax(logits / temperature), restricted to the top_k largest logits (ties at the k-th
// value are kept, as HF does), then to the smallest most-likely set with cumulative probability
// >= top_p, then to tokens with p >= min_p * p_max, renormalized after each step. At least one
// token always survives. temperature == 0 gives the one-hot distribution of argmax.
void token_probabilities(const float* logits, int vocab, const SamplingParams& params,
                         std::vector<float>& probs);

// The draw at uniform u in [0, 1) from probs[0, n) (non-negative, summing to ~1): the first
// index whose cumulative sum (double, in index order) exceeds u times the total, counting only
// non-zero entries; the last non-zero one when u lands in the rounding slack at the top. Never
// a zero-probability token; the total must be > 0.
int32_t sample_at(const float* probs, int n, double u);

// One round's verdict (DESIGN.md §4) over gamma candidates g[0, gamma) drawn from the draft's
// processed distributions q[i] ([gamma, n]); p(i) = token_probabilities(target logits row i),
// [n], asked for in order i = 0, 1, ... only as far as the verdict needs. Candidate i is accepted
// while u[i] < min(1, p_i(g_i) / q_i(g_i)); at the first rejection the token is drawn at u[gamma]
// from normalize(max(p_i - q_i, 0)) (written over q[i]; p_i itself when that is all zero, i.e. p_i
// == q_i up to rounding; `residual` false draws from p_i instead, a deliberately wrong rule for the
// tests' power check); with every candidate accepted, from p[gamma]. u: [gamma + 1] uniforms in [0,
// 1).
struct SpecVerdict {
  int accepted = 0;    // k
  int32_t token = -1;  // y, the token after the k accepted candidates
};
SpecVerdict speculative_verdict(const std::function<const float*(int)>& p, float* q, int gamma,
                                int n, const int32_t* g, const double* u, bool residual = true);

}  // namespace qs
