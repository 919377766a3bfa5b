// AdaptiveGamma (`--gamma auto`): the expected-tokens-per-cost rule and its estimates.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "engine/adaptive_gamma.h"

namespace qs {
namespace {

TEST(AdaptiveGamma, TokensPerSecondIsTheExpectedRoundOverItsCost) {
  // E(3) at a = 0.9 is 1 + 0.9 + 0.81 + 0.729 = 3.439 tokens, for 3 draft steps at 0.48 of a
  // verification each plus the verification.
  EXPECT_NEAR(AdaptiveGamma::tokens_per_second(3, 0.9, 0.48, 1.0), 3.439 / 2.44, 1e-12);
  EXPECT_NEAR(AdaptiveGamma::tokens_per_second(1, 0.5, 2.0, 2.0), 1.5 / 4.0, 1e-12);
}

TEST(AdaptiveGamma, BeforeAnyRoundThePriorChooses) {
  const AdaptiveGamma a(8);
  EXPECT_NEAR(a.acceptance(), 0.8, 1e-12);
  EXPECT_NEAR(a.draft_cost() / a.rest_cost(3), 0.5, 1e-12);
  // At a = 0.8 and a ratio of 0.5: 1.2, 1.22, 1.18 tokens per cost for g = 1, 2, 3.
  EXPECT_EQ(a.next(), 2);
}

TEST(AdaptiveGamma, EveryCandidateAcceptedAndACheapDraftDraftTheMost) {
  AdaptiveGamma a(6);
  for (int i = 0; i < 40; ++i) a.observe(a.next(), a.next(), 0.1 * a.next(), 1.0);
  EXPECT_GT(a.acceptance(), 0.95);
  EXPECT_NEAR(a.draft_cost(), 0.1, 1e-9);
  EXPECT_EQ(a.next(), 6);
}

// Rounds whose verification costs `verify` whatever their length, with a draft step of 0.3 of
// it, where `accepts(i, g)` candidates of round i are accepted: the lengths chosen.
std::vector<int> run_rounds(AdaptiveGamma& a, int rounds,
                            const std::function<int(int, int)>& accepts) {
  std::vector<int> chosen;
  for (int i = 0; i < rounds; ++i) {
    const int g = a.next();
    chosen.push_back(g);
    a.observe(g, accepts(i, g), 0.3 * g, 1.0);
  }
  return chosen;
}

// The rounds after each of which a probe (a round of 1 among plain steps) came.
std::vector<int> probes(const std::vector<int>& chosen) {
  std::vector<int> at;
  for (size_t i = 1; i < chosen.size(); ++i) {
    if (chosen[i] == 1 && chosen[i - 1] == 0) at.push_back(static_cast<int>(i));
  }
  return at;
}

TEST(AdaptiveGamma, EveryCandidateRejectedStepsPlainlyAndProbesLessAndLess) {
  AdaptiveGamma a(8);
  const std::vector<int> chosen = run_rounds(a, 300, [](int, int) { return 0; });
  EXPECT_LT(a.acceptance(), 0.15);
  // Plain steps (one token for 1.0) against rounds of 1 (one token for 1.3). Once they are
  // chosen, each probe finds nothing and the next waits twice as many plain steps, up to the
  // largest wait.
  const std::vector<int> at = probes(chosen);
  std::vector<int> gaps;  // plain steps between probes
  for (size_t i = 1; i < at.size(); ++i) gaps.push_back(at[i] - at[i - 1] - 1);
  // (The wait of kFirstProbeAfter follows a drafting round, so the first gap between two probes
  // is twice it.)
  const auto first = std::find(gaps.begin(), gaps.end(), 2 * AdaptiveGamma::kFirstProbeAfter);
  ASSERT_GE(std::distance(first, gaps.end()), 6) << "probes at doubling gaps";
  for (auto g = first + 1; g != gaps.end(); ++g) {
    EXPECT_EQ(*g, std::min(2 * g[-1], AdaptiveGamma::kLastProbeAfter));
  }
  EXPECT_EQ(gaps.back(), AdaptiveGamma::kLastProbeAfter);
  int drafting = 0;  // of the last 200 rounds
  for (int i = 100; i < 300; ++i) drafting += chosen[i] > 0;
  EXPECT_LE(drafting, 4);
}

TEST(AdaptiveGamma, AProbeThatFindsAPredictableTextResumesDrafting) {
  AdaptiveGamma a(8);
  const std::vector<int> chosen =
      run_rounds(a, 200, [](int i, int g) { return i < 120 ? 0 : g; });  // then every candidate
  EXPECT_EQ(chosen[119], 0);
  int first_long = -1;
  for (int i = 120; i < 200 && first_long < 0; ++i) {
    if (chosen[i] >= 4) first_long = i;
  }
  ASSERT_GT(first_long, 0);
  EXPECT_LE(first_long - 120, AdaptiveGamma::kLastProbeAfter + 12);
  EXPECT_EQ(chosen.back(), 8);
}

TEST(AdaptiveGamma, AnExpensiveDraftDraftsLess) {
  // The same candidates (accepted with probability 0.5, the same draws) and a verification that
  // costs the same at every length, at two draft costs: the cheap draft affords longer rounds.
  AdaptiveGamma cheap(8), dear(8);
  for (AdaptiveGamma* a : {&cheap, &dear}) {
    const double step = a == &cheap ? 0.05 : 0.9;
    std::mt19937 rng(3);
    for (int i = 0; i < 200; ++i) {
      const int g = a->next();
      int k = 0;
      while (k < g && rng() % 2 == 0) ++k;
      a->observe(g, k, step * g, 1.0);
    }
  }
  EXPECT_NEAR(cheap.acceptance(), 0.5, 0.2);
  EXPECT_NEAR(dear.acceptance(), 0.5, 0.2);
  EXPECT_NEAR(cheap.draft_cost(), 0.05, 1e-9);
  EXPECT_NEAR(dear.draft_cost(), 0.9, 1e-9);
  EXPECT_GT(cheap.next(), dear.next());
  EXPECT_LE(dear.next(), 1);  // plain steps (1 token for 1.0 against 1.5 for 1.9), or a probe
}

TEST(AdaptiveGamma, TheAcceptanceIsPerTokenNotPerCandidateDrafted) {
  // Rounds of 4 whose first two candidates are accepted, the third rejected: 2 accepted per
  // rejection, a = 2/3 (accepted / drafted would say 1/2).
  AdaptiveGamma a(8);
  for (int i = 0; i < 200; ++i) a.observe(4, 2, 0.4, 1.0);
  EXPECT_NEAR(a.acceptance(), 2.0 / 3.0, 1e-6);
}

TEST(AdaptiveGamma, TheEstimatesFollowTheRecentRounds) {
  AdaptiveGamma a(8);
  for (int i = 0; i < 40; ++i) {  // a text the draft predicts
    const int g = a.next();
    a.observe(g, g, 0.1 * g, 1.0);
  }
  const int long_rounds = a.next();
  for (int i = 0; i < 40; ++i) {  // then one it does not
    const int g = a.next();
    a.observe(g, 0, 0.1 * g, 1.0);
  }
  EXPECT_EQ(long_rounds, 8);
  EXPECT_EQ(a.next(), 1);
}

TEST(AdaptiveGamma, TheFirstTimedRoundIsAWarmUpAndUntimedRoundsKeepTheCosts) {
  AdaptiveGamma a(8);
  a.observe(2, 1, 50.0, 100.0);  // first-use costs (e.g. CUDA graph capture): ignored
  EXPECT_NEAR(a.draft_cost(), 0.5, 1e-12);
  EXPECT_NEAR(a.rest_cost(2), 1.0, 1e-12);
  a.observe(2, 1, 0.6, 2.0);  // the first measured round replaces the priors: 0.3 per step
  EXPECT_NEAR(a.draft_cost(), 0.3, 1e-12);
  EXPECT_NEAR(a.rest_cost(2), 2.0, 1e-12);
  a.observe(2, 1, 0.0, 0.0);  // not measured
  a.observe(0, 0, 0.0, 0.5);  // a plain step: its own cost, no draft step
  EXPECT_NEAR(a.draft_cost(), 0.3, 1e-12);
  EXPECT_NEAR(a.rest_cost(2), 2.0, 1e-12);
  EXPECT_NEAR(a.rest_cost(0), 0.5, 1e-12);
  a.observe(2, 1, 1.0, 1.0);  // 0.8 * 0.3 + 0.2 * 0.5; 0.8 * 2 + 0.2 * 1
  EXPECT_NEAR(a.draft_cost(), 0.34, 1e-12);
  EXPECT_NEAR(a.rest_cost(2), 1.8, 1e-12);
}

TEST(AdaptiveGamma, AnUnmeasuredLengthCostsALowerBound) {
  AdaptiveGamma a(8);
  a.observe(2, 2, 0.2, 1.0);  // warm-up
  a.observe(2, 2, 0.2, 1.0);
  a.observe(5, 5, 0.5, 3.0);
  EXPECT_NEAR(a.rest_cost(1), 1.0 * 2 / 3, 1e-12);  // none below: 2 of the 3 positions of g = 2
  EXPECT_NEAR(a.rest_cost(4), 1.0, 1e-12);
  EXPECT_NEAR(a.rest_cost(5), 3.0, 1e-12);
  EXPECT_NEAR(a.rest_cost(8), 3.0, 1e-12);
}

TEST(AdaptiveGamma, ALengthWhoseVerificationJumpsIsTriedThenLeft) {
  // A CPU whose verification of more than 8 positions (g > 7) costs 3x: the choice climbs to
  // the longest round while every candidate is accepted, finds g = 8 dear and settles below it.
  auto verify_s = [](int g) { return g <= 7 ? 1.0 : 3.0; };
  AdaptiveGamma a(8);
  bool tried_8 = false;
  int g = 0;
  for (int i = 0; i < 60; ++i) {
    g = a.next();
    tried_8 = tried_8 || g == 8;
    a.observe(g, g, 0.1 * g, verify_s(g));
  }
  EXPECT_TRUE(tried_8);
  EXPECT_EQ(g, 7);
}

TEST(AdaptiveGamma, AVerificationThatGrowsWithItsPositionsStepsPlainly) {
  // A compute-bound CPU (the bundled model): every candidate accepted, a draft step 1.2 of a
  // one-position verification (0.5), each verified position as dear as the first. A plain step
  // gives 1 / 0.5 tokens per unit, g = 1 2 / 1.6, g = 2 3 / 2.7: the choice leaves the prior's 2
  // for plain steps, and the probes (accepted, but not paying) come ever more rarely.
  AdaptiveGamma a(8);
  std::vector<int> chosen;
  for (int i = 0; i < 200; ++i) {
    const int g = a.next();
    chosen.push_back(g);
    a.observe(g, g, 0.6 * g, 0.5 * (g + 1));
  }
  int drafting = 0;
  for (int i = 100; i < 200; ++i) drafting += chosen[i] > 0;
  EXPECT_LE(drafting, 2);
  EXPECT_EQ(a.next(), 0);
}

TEST(AdaptiveGamma, TheChoiceStaysInRange) {
  for (int max_gamma : {1, 3, 15}) {
    AdaptiveGamma a(max_gamma);
    for (int i = 0; i < 30; ++i) {
      const int g = a.next();
      ASSERT_GE(g, 0);
      ASSERT_LE(g, max_gamma);
      a.observe(g, i % (g + 1), 0.01 * g, 1.0);
    }
  }
}

}  // namespace
}  // namespace qs
