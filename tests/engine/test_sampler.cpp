#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <vector>

#include "engine/sampler.h"

namespace qs {
namespace {

std::set<int> support(const std::vector<float>& p) {
  std::set<int> s;
  for (size_t i = 0; i < p.size(); ++i)
    if (p[i] > 0) s.insert(static_cast<int>(i));
  return s;
}

double total(const std::vector<float>& p) {
  double t = 0;
  for (float x : p) t += x;
  return t;
}

TEST(Rng, SeededAndUniform) {
  Rng a(123), b(123), c(124);
  bool differs = false;
  for (int i = 0; i < 100; ++i) {
    uint64_t x = a.next_u64();
    EXPECT_EQ(x, b.next_u64());
    differs |= x != c.next_u64();
  }
  EXPECT_TRUE(differs);
  double sum = 0;
  for (int i = 0; i < 100000; ++i) {
    double u = a.uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / 100000, 0.5, 0.005);
}

TEST(Sampler, ArgmaxTakesLowestIndexOnTies) {
  const std::vector<float> l = {1.0f, 3.0f, -2.0f, 3.0f, 0.5f};
  EXPECT_EQ(argmax(l.data(), 5), 1);
  const std::vector<float> single = {-7.0f};
  EXPECT_EQ(argmax(single.data(), 1), 0);
}

TEST(Sampler, GreedyIsOneHotAndDeterministic) {
  const std::vector<float> l = {0.1f, 2.0f, 2.0f, -1.0f};
  SamplingParams p;  // temperature 0
  std::vector<float> probs;
  token_probabilities(l.data(), 4, p, probs);
  EXPECT_EQ(probs, (std::vector<float>{0, 1, 0, 0}));
  Rng rng(1);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(sample_token(l.data(), 4, p, rng, probs), 1);
}

TEST(Sampler, TemperatureSoftmax) {
  const std::vector<float> l = {0.0f, 1.0f, 2.0f};
  SamplingParams p;
  p.temperature = 2.0f;
  std::vector<float> probs;
  token_probabilities(l.data(), 3, p, probs);
  const double z = 1 + std::exp(0.5) + std::exp(1.0);
  EXPECT_NEAR(probs[0], 1 / z, 1e-6);
  EXPECT_NEAR(probs[1], std::exp(0.5) / z, 1e-6);
  EXPECT_NEAR(probs[2], std::exp(1.0) / z, 1e-6);
}

TEST(Sampler, TopKKeepsTiesAtTheKthValue) {
  const std::vector<float> l = {5, 1, 4, 4, 0, 3};
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 2;
  std::vector<float> probs;
  token_probabilities(l.data(), 6, p, probs);
  EXPECT_EQ(support(probs), (std::set<int>{0, 2, 3}));
  EXPECT_NEAR(total(probs), 1.0, 1e-6);
  p.top_k = 1;
  token_probabilities(l.data(), 6, p, probs);
  EXPECT_EQ(support(probs), (std::set<int>{0}));
  p.top_k = 100;  // larger than the vocabulary: off
  token_probabilities(l.data(), 6, p, probs);
  EXPECT_EQ(support(probs).size(), 6u);
}

TEST(Sampler, TopPKeepsSmallestSetReachingP) {
  // Probabilities 0.5, 0.25, 0.125, 0.0625, 0.0625 via log-probabilities.
  const std::vector<float> p5 = {0.0625f, 0.5f, 0.125f, 0.25f, 0.0625f};
  std::vector<float> l;
  for (float x : p5) l.push_back(std::log(x));
  SamplingParams p;
  p.temperature = 1.0f;
  std::vector<float> probs;
  p.top_p = 0.5f;  // token 1 alone reaches 0.5
  token_probabilities(l.data(), 5, p, probs);
  EXPECT_EQ(support(probs), (std::set<int>{1}));
  p.top_p = 0.7f;  // 0.5 + 0.25
  token_probabilities(l.data(), 5, p, probs);
  EXPECT_EQ(support(probs), (std::set<int>{1, 3}));
  EXPECT_NEAR(probs[1], 2.0 / 3, 1e-6);
  EXPECT_NEAR(probs[3], 1.0 / 3, 1e-6);
  p.top_p = 0.8f;  // 0.875 after three
  token_probabilities(l.data(), 5, p, probs);
  EXPECT_EQ(support(probs), (std::set<int>{1, 2, 3}));
  p.top_p = 0.01f;  // always at least one token
  token_probabilities(l.data(), 5, p, probs);
  EXPECT_EQ(support(probs), (std::set<int>{1}));
}

TEST(Sampler, TopPOverALargeVocabularyNeedingAFullSort) {
  // A flat distribution over 5000 tokens: top-p 0.9 needs 4500 of them (more than the
  // 1024-token sorted prefix the implementation tries first).
  std::vector<float> l(5000, 0.0f);
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 0.9f;
  std::vector<float> probs;
  token_probabilities(l.data(), 5000, p, probs);
  const std::set<int> s = support(probs);
  EXPECT_EQ(s.size(), 4500u);
  EXPECT_EQ(*s.begin(), 0);
  EXPECT_EQ(*s.rbegin(), 4499);  // ties broken by lowest index
}

TEST(Sampler, MinPDropsTokensBelowFractionOfMax) {
  const std::vector<float> pr = {0.4f, 0.3f, 0.15f, 0.1f, 0.05f};
  std::vector<float> l;
  for (float x : pr) l.push_back(std::log(x));
  SamplingParams p;
  p.temperature = 1.0f;
  p.min_p = 0.3f;  // threshold 0.12
  std::vector<float> probs;
  token_probabilities(l.data(), 5, p, probs);
  EXPECT_EQ(support(probs), (std::set<int>{0, 1, 2}));
  EXPECT_NEAR(probs[0], 0.4 / 0.85, 1e-6);
  EXPECT_NEAR(total(probs), 1.0, 1e-6);
}

TEST(Sampler, StepsComposeInOrder) {
  // top-k 4 of 6, then top-p over the renormalized 4, then min-p.
  const std::vector<float> pr = {0.05f, 0.3f, 0.25f, 0.2f, 0.15f, 0.05f};
  std::vector<float> l;
  for (float x : pr) l.push_back(std::log(x));
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 4;     // {1,2,3,4}, renormalized by 0.9: .333 .278 .222 .167
  p.top_p = 0.8f;  // .333+.278+.222 = .833 -> {1,2,3}
  p.min_p = 0.7f;  // of {.4 .333 .267}: threshold .28 -> {1,2}
  std::vector<float> probs;
  token_probabilities(l.data(), 6, p, probs);
  EXPECT_EQ(support(probs), (std::set<int>{1, 2}));
  EXPECT_NEAR(probs[1], 0.3 / 0.55, 1e-6);
}

TEST(Sampler, RejectsBadParams) {
  SamplingParams p;
  EXPECT_TRUE(check_sampling_params(p).ok());
  p.temperature = -1;
  EXPECT_FALSE(check_sampling_params(p).ok());
  p = {};
  p.top_p = 0;
  EXPECT_FALSE(check_sampling_params(p).ok());
  p = {};
  p.top_k = -2;
  EXPECT_FALSE(check_sampling_params(p).ok());
  p = {};
  p.min_p = 1.5f;
  EXPECT_FALSE(check_sampling_params(p).ok());
}

TEST(Sampler, SeededSamplingIsDeterministic) {
  std::vector<float> l(50);
  for (int i = 0; i < 50; ++i) l[i] = std::sin(i * 1.3f) * 2;
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_k = 30;
  p.top_p = 0.95f;
  auto draw = [&](uint64_t seed) {
    Rng rng(seed);
    std::vector<float> scratch;
    std::vector<int> out;
    for (int i = 0; i < 200; ++i) out.push_back(sample_token(l.data(), 50, p, rng, scratch));
    return out;
  };
  EXPECT_EQ(draw(7), draw(7));
  EXPECT_NE(draw(7), draw(8));
}

TEST(Sampler, EmpiricalFrequenciesMatchProbabilities) {
  // Chi-square goodness of fit of 100k draws against the processed distribution.
  const std::vector<float> l = {1.0f, 0.2f, -0.5f, 2.0f, 0.0f, 1.5f, -3.0f, 0.7f};
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_k = 7;  // drops token 6
  std::vector<float> probs;
  token_probabilities(l.data(), 8, p, probs);
  EXPECT_EQ(probs[6], 0.0f);
  Rng rng(2024);
  const int n = 100000;
  std::vector<int> counts(8, 0);
  for (int i = 0; i < n; ++i) ++counts[sample_from(probs, rng)];
  EXPECT_EQ(counts[6], 0);
  double chi2 = 0;
  int df = -1;
  for (int i = 0; i < 8; ++i) {
    if (probs[i] == 0) continue;
    const double expected = probs[i] * n;
    chi2 += (counts[i] - expected) * (counts[i] - expected) / expected;
    ++df;
  }
  // 99.9th percentile of chi-square with 6 degrees of freedom.
  ASSERT_EQ(df, 6);
  EXPECT_LT(chi2, 22.46);
}

TEST(Sampler, SampleAtWalksTheCumulativeSumOverNonZeroTokens) {
  const std::vector<float> p = {0.0f, 0.25f, 0.0f, 0.5f, 0.25f, 0.0f};
  EXPECT_EQ(sample_at(p.data(), 6, 0.0), 1);
  EXPECT_EQ(sample_at(p.data(), 6, 0.2499), 1);
  EXPECT_EQ(sample_at(p.data(), 6, 0.25), 3);
  EXPECT_EQ(sample_at(p.data(), 6, 0.7499), 3);
  EXPECT_EQ(sample_at(p.data(), 6, 0.75), 4);
  EXPECT_EQ(sample_at(p.data(), 6, 0.9999999999), 4);  // never the zero at the end
  const std::vector<float> unnormalized = {2.0f, 0.0f, 6.0f};
  EXPECT_EQ(sample_at(unnormalized.data(), 3, 0.24), 0);
  EXPECT_EQ(sample_at(unnormalized.data(), 3, 0.26), 2);
}

// The round's verdict (DESIGN §4) on hand-made rows: p >= q accepts whatever u; p = 0 rejects and
// the token comes from normalize(max(p - q, 0)); with every candidate accepted, from p[gamma].
TEST(Sampler, SpeculativeVerdictFollowsTheRule) {
  const std::vector<float> p = {0.5f, 0.5f, 0.0f,   // row 0
                                0.2f, 0.3f, 0.5f,   // row 1
                                0.0f, 0.0f, 1.0f};  // row 2 (the bonus row for gamma = 2)
  auto rows = [&](int r) { return p.data() + 3 * r; };
  {  // candidate 0 = token 1: p 0.5 >= q 0.4, accepted even at u = 0.999; candidate 1 = token 0:
     // p 0.2 / q 0.8 = 0.25, rejected at u = 0.3; residual max(p1 - q1, 0) = {0, 0.1, 0.5}.
    std::vector<float> q = {0.3f, 0.4f, 0.3f, 0.8f, 0.2f, 0.0f};
    const int32_t g[] = {1, 0};
    const double u[] = {0.999, 0.3, 0.1};
    const SpecVerdict v = speculative_verdict(rows, q.data(), 2, 3, g, u);
    EXPECT_EQ(v.accepted, 1);
    EXPECT_EQ(v.token, 1);  // 0.1 of the residual's 0.6: token 1 (mass 0.1) starts at 0
    EXPECT_FLOAT_EQ(q[3], 0.0f);
    EXPECT_FLOAT_EQ(q[4], 0.1f);
    EXPECT_FLOAT_EQ(q[5], 0.5f);
    const double u_late[] = {0.999, 0.3, 0.5};
    std::vector<float> q2 = {0.3f, 0.4f, 0.3f, 0.8f, 0.2f, 0.0f};
    EXPECT_EQ(speculative_verdict(rows, q2.data(), 2, 3, g, u_late).token, 2);
    // The deliberately wrong rule draws from p1 itself: 0.5 of {0.2, 0.3, 0.5} is token 2, 0.1
    // token 0.
    std::vector<float> q3 = {0.3f, 0.4f, 0.3f, 0.8f, 0.2f, 0.0f};
    EXPECT_EQ(speculative_verdict(rows, q3.data(), 2, 3, g, u, false).token, 0);
  }
  {  // Both accepted (p / q >= 1): the bonus from row 2.
    std::vector<float> q = {0.4f, 0.4f, 0.2f, 0.1f, 0.1f, 0.8f};
    const int32_t g[] = {0, 1};
    const double u[] = {0.999, 0.999, 0.5};
    const SpecVerdict v = speculative_verdict(rows, q.data(), 2, 3, g, u);
    EXPECT_EQ(v.accepted, 2);
    EXPECT_EQ(v.token, 2);
  }
  {  // gamma = 0: a draw from row 0.
    const double u[] = {0.75};
    EXPECT_EQ(speculative_verdict(rows, nullptr, 0, 3, nullptr, u).token, 1);
  }
}

}  // namespace
}  // namespace qs
