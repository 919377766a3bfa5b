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
  for (int h = g; h >= 1; --h) {
    if (rest_[h] > 0) return rest_[h];
  }
  for (int h = g + 1; h <= max_gamma_; ++h) {
    if (rest_[h] > 0) return rest_[h] * (g + 1) / (h + 1);
  }
  return 1.0;  // the prior
}

double AdaptiveGamma::acceptance() const {
  // Kept inside (0, 1) so that E(g) stays finite and every g keeps a chance to be chosen.
  return std::clamp(accepted_ / (accepted_ + rejected_), 0.01, 0.99);
}

double AdaptiveGamma::tokens_per_second(int g, double acceptance, double draft_s, double rest_s) {
  const double expected = (1.0 - std::pow(acceptance, g + 1)) / (1.0 - acceptance);
  return expected / (g * draft_s + rest_s);
}

int AdaptiveGamma::next() const {
  const double a = acceptance();
  int best = 1;
  double best_rate = tokens_per_second(1, a, draft_cost_, rest_cost(1));
  for (int g = 2; g <= max_gamma_; ++g) {
    const double rate = tokens_per_second(g, a, draft_cost_, rest_cost(g));
    if (rate > best_rate) {
      best = g;
      best_rate = rate;
    }
  }
  return best;
}

void AdaptiveGamma::observe(int gamma, int accepted, double draft_s, double rest_s) {
  if (gamma <= 0) return;
  QS_CHECK(accepted >= 0 && accepted <= gamma && gamma <= max_gamma_);
  accepted_ = kAcceptanceDecay * accepted_ + accepted;
  rejected_ = kAcceptanceDecay * rejected_ + (accepted < gamma ? 1.0 : 0.0);
  if (draft_s <= 0 || rest_s <= 0) return;
  if (timed_rounds_++ == 0) return;  // warm-up
  // The first measurement of each estimate replaces its prior; later ones are averaged in.
  const double step = draft_s / gamma;
  draft_cost_ = timed_rounds_ == 2 ? step : kCostDecay * draft_cost_ + (1.0 - kCostDecay) * step;
  double& rest = rest_[gamma];
  rest = rest > 0 ? kCostDecay * rest + (1.0 - kCostDecay) * rest_s : rest_s;
}

}  // namespace qs
