// The speculation length of each QuantSpec round chosen from what the rounds so far measured
// (`--gamma auto`): the acceptance rate and the costs of a draft step and of the rest of a round.
//
// With a per-token acceptance a, a round that drafts g tokens emits E(g) = (1 - a^(g+1)) / (1 - a)
// tokens on average (the accepted ones, then the correction or the bonus) and costs g * d + v(g)
// (d: one draft step; v(g): the verification of g + 1 positions, the accept/reject and the
// commit). next() is the g in [1, max_gamma] with the most tokens per second,
// E(g) / (g * d + v(g)). v is kept per g: it is nearly flat on a GPU, but on a CPU a
// verification of more than 8 positions leaves the GEMV for a GEMM that widens every weight and
// costs 3x (docs/perf.md, session 57). A g not measured yet is taken at a lower bound of its
// cost (rest_cost), so the choice tries each length that could pay and keeps it only if it does.
// The estimates follow the recent rounds (exponentially weighted), so a text whose acceptance
// changes (code, then prose) changes g. The choice never changes what is emitted: every round's
// verification is exact (greedy output equals AR's; sampled output follows the target's
// distribution), whatever g.
#pragma once

#include <vector>

namespace qs {

class AdaptiveGamma {
 public:
  // max_gamma >= 1: the largest round (the full-precision buffer is sized for it).
  explicit AdaptiveGamma(int max_gamma);

  // The next round's speculation length, in [1, max_gamma].
  int next() const;

  // One round's outcome: it drafted `gamma` tokens and accepted `accepted` of them; its draft
  // steps took draft_s seconds in all and the rest of the round rest_s. Rounds that drafted
  // nothing (gamma 0) are ignored. The first timed round is skipped as a warm-up (first-use
  // uploads, lazy allocations); times <= 0 (not measured) leave the cost estimates as they were.
  void observe(int gamma, int accepted, double draft_s, double rest_s);

  double acceptance() const;  // the per-token acceptance estimate a, in (0, 1)
  // The estimated seconds of a draft step and of the rest of a round of g (before any timed
  // round: priors in the ratio 0.5 : 1, a draft step reading about a quarter of the bytes).
  double draft_cost() const { return draft_cost_; }
  double rest_cost(int g) const;
  int max_gamma() const { return max_gamma_; }

  // Tokens per second of rounds of g: E(g) / (g * draft_s + rest_s).
  static double tokens_per_second(int g, double acceptance, double draft_s, double rest_s);

 private:
  int max_gamma_;
  // Acceptance: weighted counts of accepted candidates and of rejections (a round that accepted
  // all of its g ended without one), starting from a prior of a = 0.8 worth five tokens.
  double accepted_ = 4.0, rejected_ = 1.0;
  // Costs: weighted means of a draft step's seconds and, per g, of a round's other seconds (0:
  // not measured yet).
  double draft_cost_ = 0.5;
  std::vector<double> rest_;  // [max_gamma + 1]
  int timed_rounds_ = 0;
};

}  // namespace qs
