// GenerationParams::adjust (LogitAdjust: presence / frequency penalties, logit_bias): each row's
// adjustment from its own position's history; greedy QuantSpec with an adjustment still emits
// what greedy AR over the INT8 view with the same adjustment emits (the sampling law with one is
// Drafts/Distribution's quantspec_adjusted case, test_quantspec.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "engine/llm_engine.h"
#include "engine/logit_adjust.h"
#include "tiny_model.h"

namespace qs {
namespace {

using testing::greedy_params;
using testing::random_prompt;
using testing::TinyModel;

constexpr int kVocab = testing::kEngineTestVocab;

TEST(LogitAdjust, RowsCountTheirOwnHistory) {
  CpuBackend backend{1};
  LogitAdjust a;
  a.presence_penalty = 0.5f;
  a.frequency_penalty = 0.25f;
  a.logit_bias = {{4, 2.0f}, {1, -1.0f}};
  const int vocab = 6, rows = 3;
  std::unique_ptr<Buffer> logits = backend.alloc(rows * vocab);
  std::vector<float> zeros(rows * vocab, 0.0f), got(rows * vocab);
  backend.from_host(zeros.data(), logits->data(), zeros.size());
  const std::vector<int32_t> history{2, 2, 5},
      extra{0, 5, 3};  // extra[0] is row 0's past (first 1)
  LogitAdjuster adjuster;
  adjuster.apply(backend, logits->data(), rows, vocab, a, history, extra, /*first=*/1);
  backend.to_host(logits->data(), got.data(), got.size());
  // Row j counts history + extra[0 .. 1 + j).
  std::vector<std::map<int, int>> counts(rows);
  for (int j = 0; j < rows; ++j) {
    for (int32_t t : history) ++counts[j][t];
    for (int i = 0; i < 1 + j; ++i) ++counts[j][extra[i]];
  }
  for (int j = 0; j < rows; ++j) {
    for (int t = 0; t < vocab; ++t) {
      const int c = counts[j].count(t) ? counts[j][t] : 0;
      float want = -0.25f * c - (c > 0 ? 0.5f : 0.0f);
      if (t == 4) want += 2.0f;
      if (t == 1) want -= 1.0f;
      EXPECT_FLOAT_EQ(got[j * vocab + t], want) << "row " << j << " token " << t;
    }
  }
  std::vector<float> host(vocab, 1.0f);
  adjuster.apply_host(host.data(), vocab, a, history);
  EXPECT_FLOAT_EQ(host[2], 1.0f - 0.5f - 0.5f);  // twice: frequency 2 x 0.25, presence 0.5
  EXPECT_FLOAT_EQ(host[4], 3.0f);
}

TEST(LogitAdjust, GreedyQuantSpecEqualsGreedyArInt8WithTheSameAdjustment) {
  const TinyModel tiny = testing::make_tiny_model(testing::engine_test_config(), DType::BF16, 5);
  auto ar =
      testing::make_tiny_engine(tiny, testing::engine_test_options(DecodeMode::kAr, KvType::kInt8));
  ASSERT_TRUE(ar);
  const std::vector<int32_t> prompt = random_prompt(30, kVocab, 4);
  GenerationParams plain = greedy_params(80);
  GenerationParams p = plain;
  p.adjust.frequency_penalty = 1.5f;
  p.adjust.presence_penalty = 0.5f;
  p.adjust.logit_bias = {{7, 3.0f}};
  auto want = ar->generate(prompt, p, nullptr);
  auto unadjusted = ar->generate(prompt, plain, nullptr);
  ASSERT_TRUE(want.ok() && unadjusted.ok());
  EXPECT_NE(want->tokens, unadjusted->tokens);  // the adjustment changes the output
  for (int gamma : {1, 3, 6}) {
    EngineOptions o = testing::engine_test_options(DecodeMode::kQuantSpec, KvType::kFp16);
    o.gamma = gamma;
    auto spec = testing::make_tiny_engine(tiny, o);
    ASSERT_TRUE(spec);
    auto got = spec->generate(prompt, p, nullptr);
    ASSERT_TRUE(got.ok()) << got.error().message;
    EXPECT_EQ(got->tokens, want->tokens) << "gamma " << gamma;
    EXPECT_GT(got->stats.accepted, 0);
    EXPECT_LT(got->stats.accepted, got->stats.drafted);
  }
}

TEST(LogitAdjust, ALargeBiasDecidesTheToken) {
  const TinyModel tiny = testing::make_tiny_model(testing::engine_test_config(), DType::BF16, 9);
  for (DecodeMode mode : {DecodeMode::kAr, DecodeMode::kQuantSpec}) {
    auto e = testing::make_tiny_engine(tiny, testing::engine_test_options(mode, KvType::kFp16));
    ASSERT_TRUE(e);
    for (float temperature : {0.0f, 1.0f}) {
      GenerationParams p = greedy_params(40);
      p.sampling.temperature = temperature;
      p.sampling.seed = 3;
      p.adjust.logit_bias = {{42, 100.0f}};
      auto r = e->generate(random_prompt(10, kVocab, 2), p, nullptr);
      ASSERT_TRUE(r.ok());
      for (int32_t t : r->tokens) EXPECT_EQ(t, 42);
      // Penalties that outgrow the bias end the run: 44 against 2 (presence) + 2 per repeat
      // leaves 42 ahead for about 21 repeats, not for 40.
      p.adjust.frequency_penalty = 2.0f;
      p.adjust.presence_penalty = 2.0f;
      p.adjust.logit_bias = {{42, 44.0f}};
      auto mixed = e->generate(random_prompt(10, kVocab, 2), p, nullptr);
      ASSERT_TRUE(mixed.ok());
      EXPECT_EQ(mixed->tokens[0], 42);
      EXPECT_NE(std::count(mixed->tokens.begin(), mixed->tokens.end(), 42),
                static_cast<long>(mixed->tokens.size()));
    }
  }
}

TEST(LogitAdjust, OutOfRangeValuesAreRejected) {
  const TinyModel tiny = testing::make_tiny_model(testing::engine_test_config(), DType::BF16, 2);
  auto e = testing::make_tiny_engine(tiny, EngineOptions{});
  ASSERT_TRUE(e);
  auto run = [&](LogitAdjust a) {
    GenerationParams p = greedy_params(3);
    p.adjust = a;
    return e->generate(random_prompt(5, kVocab, 1), p, nullptr);
  };
  LogitAdjust a;
  a.presence_penalty = 2.5f;
  auto r = run(a);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("presence_penalty"), std::string::npos) << r.error().message;
  a = LogitAdjust{};
  a.logit_bias = {{kVocab, 1.0f}};
  r = run(a);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("vocabulary"), std::string::npos) << r.error().message;
  a.logit_bias = {{3, 101.0f}};
  r = run(a);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("[-100, 100]"), std::string::npos) << r.error().message;
}

}  // namespace
}  // namespace qs
