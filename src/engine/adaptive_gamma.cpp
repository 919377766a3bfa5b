#include "engine/adaptive_gamma.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace qs {

namespace {

// Per observed round, the weight of what came before: ~10 rounds of memory for the acceptance,
// ~5 for the costs (which change only with the context length).
constexpr double kAcceptanceDecay = 0.9;
constexpr double kCostDecay = 0.8;
// The acceptance estimate's range: E(g) stays finite and every g keeps a chance to be chosen.
constexpr double kMinAcceptance = 0.01;
constexpr double kMaxAcceptance = 0.99;

}  // namespace

AdaptiveGamma::AdaptiveGamma(int max_gamma) : max_gamma_(max_gamma) {
  QS_CHECK_MSG(max_gamma >= 1, "adaptive gamma: the largest round must draft at least 1 token");
  rest_.assign(static_cast<size_t>(max_gamma) + 1, 0.0);
}

double AdaptiveGamma::rest_cost(int g) const {
  // Unmeasured lengths get a lower bound of their cost, so that each is tried at least once
  // when it could pay: the nearest shorter round's (a verification of more positions costs no
  // less), or below every measured one the nearest longer round's in proportion to the positions
  // verified (it costs no less than that share).
  for (int h = g; h >= 0; --h) {
    if (rest_[h] > 0) return rest_[h];
  }
  for (int h = g + 1; h <= max_gamma_; ++h) {
    if (rest_[h] > 0) return rest_[h] * (g + 1) / (h + 1);
  }
  return 1.0;  // the prior
}

double AdaptiveGamma::acceptance() const {
  return std::clamp(accepted_ / (accepted_ + rejected_), kMinAcceptance, kMaxAcceptance);
}

double AdaptiveGamma::tokens_per_second(int g, double acceptance, double draft_s, double rest_s) {
  const double expected = (1.0 - std::pow(acceptance, g + 1)) / (1.0 - acceptance);
  return expected / (g * draft_s + rest_s);
}

int AdaptiveGamma::best(double a) const {
  int best = 0;
  double best_rate = tokens_per_second(0, a, draft_cost_, rest_cost(0));
  for (int g = 1; g <= max_gamma_; ++g) {
    const double rate = tokens_per_second(g, a, draft_cost_, rest_cost(g));
    if (rate > best_rate) {
      best = g;
      best_rate = rate;
    }
  }
  return best;
}

int AdaptiveGamma::next() const {
  const int g = best(acceptance());
  return g == 0 && plain_rounds_ >= probe_after_ ? 1 : g;
}

void AdaptiveGamma::observe(int gamma, int accepted, double draft_s, double rest_s) {
  QS_CHECK(gamma >= 0 && accepted >= 0 && accepted <= gamma && gamma <= max_gamma_);
  const bool probe = gamma > 0 && plain_rounds_ >= probe_after_;
  if (gamma > 0) {
    accepted_ = kAcceptanceDecay * accepted_ + accepted;
    rejected_ = kAcceptanceDecay * rejected_ + (accepted < gamma ? 1.0 : 0.0);
  }
  update_costs(gamma, draft_s, rest_s);
  if (gamma == 0) {
    ++plain_rounds_;
    return;
  }
  // After a probe plain steps may still pay: if drafting would not pay even with every
  // candidate accepted (the costs decide), or this probe found nothing, the next probe waits
  // twice as long; a probe that found an accepted candidate while the acceptance decides is
  // followed soon by another (the text may have changed), as is a drafting round that pays.
  const bool plain_ahead = best(acceptance()) == 0;
  const bool costs_decide = best(kMaxAcceptance) == 0;
  probe_after_ = probe && plain_ahead && (costs_decide || accepted == 0)
                     ? std::min(2 * probe_after_, kLastProbeAfter)
                     : kFirstProbeAfter;
  plain_rounds_ = 0;
}

void AdaptiveGamma::update_costs(int gamma, double draft_s, double rest_s) {
  if (rest_s <= 0 || (gamma > 0 && draft_s <= 0)) return;
  if (timed_rounds_++ == 0) return;  // warm-up
  // The first measurement of each estimate replaces its prior; later ones are averaged in.
  if (gamma > 0) {
    const double step = draft_s / gamma;
    draft_cost_ = draft_measured_ ? kCostDecay * draft_cost_ + (1.0 - kCostDecay) * step : step;
    draft_measured_ = true;
  }
  double& rest = rest_[gamma];
  rest = rest > 0 ? kCostDecay * rest + (1.0 - kCostDecay) * rest_s : rest_s;
}

}  // namespace qs
