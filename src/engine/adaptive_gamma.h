// The speculation length of each QuantSpec round chosen from what the rounds so far measured
// (`--gamma auto`): the acceptance rate and the costs of a draft step and of the rest of a round.
//
// With a per-token acceptance a, a round that drafts g tokens emits E(g) = (1 - a^(g+1)) / (1 - a)
// tokens on average (the accepted ones, then the correction or the bonus) and costs g * d + v(g)
// (d: one draft step; v(g): the verification of g + 1 positions, the accept/reject and the
// commit). next() is the g in [0, max_gamma] with the most tokens per second,
// E(g) / (g * d + v(g)); g = 0 is a plain target step (one token for v(0): AR decoding over the
// same view), chosen where drafting does not pay (a text the draft cannot predict, or a model
// whose verification costs as much per position as a step). While it is chosen, a round of 1
// probes after 2 plain steps, then 4, 8, .. 64 while the probes find nothing (or the costs alone
// rule drafting out), so that drafting resumes soon after the text becomes predictable and
// probing costs little where it never does. v is kept per g: it is nearly flat on a GPU, but on
// a CPU a verification of more than 8 positions leaves the GEMV for a GEMM that widens every
// weight and costs 3x (docs/perf.md, session 57). A g not measured yet is taken at a lower bound
// of its cost (rest_cost), so the choice tries each length that could pay and keeps it only if
// it does. The estimates follow the recent rounds (exponentially weighted), so a text whose
// acceptance changes (code, then prose) changes g. The choice never changes what is emitted: every
// round's verification is exact (greedy output equals AR's; sampled output follows the target's
// distribution), whatever g.
#pragma once

#include <vector>

namespace qs {

class AdaptiveGamma {
 public:
  // max_gamma >= 1: the largest round (the full-precision buffer is sized for it).
  explicit AdaptiveGamma(int max_gamma);

  // The next round's speculation length, in [0, max_gamma] (0: a plain target step).
  int next() const;

  // One round's outcome: it drafted `gamma` tokens and accepted `accepted` of them; its draft
  // steps took draft_s seconds in all and the rest of the round rest_s. The first timed round is
  // skipped as a warm-up (first-use uploads, lazy allocations); a rest_s <= 0, or a draft_s <= 0
  // after drafting, is not measured and leaves the cost estimates as they were.
  void observe(int gamma, int accepted, double draft_s, double rest_s);

  double acceptance() const;  // the per-token acceptance estimate a, in (0, 1)
  // The estimated seconds of a draft step and of the rest of a round of g (before any timed
  // round: priors in the ratio 0.5 : 1, a draft step reading about a quarter of the bytes).
  double draft_cost() const { return draft_cost_; }
  double rest_cost(int g) const;
  int max_gamma() const { return max_gamma_; }

  // Tokens per second of rounds of g: E(g) / (g * draft_s + rest_s).
  static double tokens_per_second(int g, double acceptance, double draft_s, double rest_s);

  // Plain steps between probes while drafting does not pay: the first and the largest interval.
  static constexpr int kFirstProbeAfter = 2;
  static constexpr int kLastProbeAfter = 64;

 private:
  int best(double acceptance) const;  // the g with the most tokens per second at `acceptance`
  void update_costs(int gamma, double draft_s, double rest_s);

  int max_gamma_;
  // Acceptance: weighted counts of accepted candidates and of rejections (a round that accepted
  // all of its g ended without one), starting from a prior of a = 0.8 worth five tokens.
  double accepted_ = 4.0, rejected_ = 1.0;
  // Costs: weighted means of a draft step's seconds and, per g, of a round's other seconds (0:
  // not measured yet).
  double draft_cost_ = 0.5;
  bool draft_measured_ = false;
  std::vector<double> rest_;  // [max_gamma + 1]
  int timed_rounds_ = 0;
  // Plain steps (g = 0) since the last drafting round, and how many make the next probe due.
  int plain_rounds_ = 0;
  int probe_after_ = kFirstProbeAfter;
};

}  // namespace qs
