// AdaptiveGamma (`--gamma auto`): the expected-tokens-per-cost rule and its estimates.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

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

TEST(AdaptiveGamma, EveryCandidateRejectedDraftsOne) {
  AdaptiveGamma a(8);
  for (int i = 0; i < 40; ++i) a.observe(a.next(), 0, 0.3 * a.next(), 1.0);
  EXPECT_LT(a.acceptance(), 0.05);
  EXPECT_EQ(a.next(), 1);
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
  EXPECT_EQ(dear.next(), 1);
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
  a.observe(0, 0, 5.0, 5.0);  // drafted nothing
  EXPECT_NEAR(a.draft_cost(), 0.3, 1e-12);
  EXPECT_NEAR(a.rest_cost(2), 2.0, 1e-12);
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

TEST(AdaptiveGamma, AVerificationThatGrowsWithItsPositionsDraftsOne) {
  // A compute-bound CPU (the bundled model): every candidate accepted, a draft step 0.6 of a
  // one-position verification, each verified position as dear as the first. g = 1 gives
  // 2 / 1.6 tokens per unit, g = 2 3 / 2.7: the choice leaves the prior's 2 for 1.
  AdaptiveGamma a(8);
  int g = 0;
  for (int i = 0; i < 40; ++i) {
    g = a.next();
    a.observe(g, g, 0.6 * g, 0.5 * (g + 1));
  }
  EXPECT_EQ(g, 1);
}

TEST(AdaptiveGamma, TheChoiceStaysInRange) {
  for (int max_gamma : {1, 3, 15}) {
    AdaptiveGamma a(max_gamma);
    for (int i = 0; i < 30; ++i) {
      const int g = a.next();
      ASSERT_GE(g, 1);
      ASSERT_LE(g, max_gamma);
      a.observe(g, i % (g + 1), 0.01 * g, 1.0);
    }
  }
}

}  // namespace
}  // namespace qs
