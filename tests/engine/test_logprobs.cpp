// GenerationParams::logprobs: every generated token's log-probability under the target's logits
// at its position (AR: the decode step's row; QuantSpec: the verification's row, for accepted
// candidates and the final token alike), with the most likely alternatives.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/llm_engine.h"
#include "engine/sampler.h"
#include "tiny_model.h"

namespace qs {
namespace {

using testing::greedy_params;
using testing::random_prompt;
using testing::TinyModel;

constexpr int kVocab = testing::kEngineTestVocab;

// log_softmax(row)[id] in long double, the reference for token_logprob.
double reference_logprob(const float* row, int vocab, int32_t id) {
  long double mx = row[0];
  for (int i = 1; i < vocab; ++i) mx = std::max<long double>(mx, row[i]);
  long double sum = 0;
  for (int i = 0; i < vocab; ++i) sum += std::exp(static_cast<long double>(row[i]) - mx);
  return static_cast<double>(row[id] - mx - std::log(sum));
}

// The checks every TokenLogprob list must pass: one entry per token with its id, `top`
// alternatives in descending order, every value a log-probability.
void expect_well_formed(const GenerationResult& r, int top) {
  ASSERT_EQ(r.logprobs.size(), r.tokens.size());
  for (size_t i = 0; i < r.tokens.size(); ++i) {
    const TokenLogprob& lp = r.logprobs[i];
    EXPECT_EQ(lp.id, r.tokens[i]);
    EXPECT_LE(lp.logprob, 0.0f);
    ASSERT_EQ(lp.top.size(), static_cast<size_t>(top));
    for (size_t j = 0; j < lp.top.size(); ++j) {
      EXPECT_LE(lp.top[j].second, 0.0f);
      if (j > 0) {
        EXPECT_GE(lp.top[j - 1].second, lp.top[j].second);
      }
      if (lp.top[j].first == lp.id) {
        EXPECT_EQ(lp.top[j].second, lp.logprob);
      }
    }
    if (!lp.top.empty()) {
      EXPECT_GE(lp.top[0].second, lp.logprob);
    }
  }
}

TEST(Logprobs, TokenLogprobIsLogSoftmaxWithTheTopInOrder) {
  const std::vector<float> row = {1.0f, 3.0f, -2.0f, 3.0f, 0.5f, -50.0f};
  const int vocab = static_cast<int>(row.size());
  for (int32_t id = 0; id < vocab; ++id) {
    const TokenLogprob lp = token_logprob(row.data(), vocab, id, 3);
    EXPECT_EQ(lp.id, id);
    const double want = reference_logprob(row.data(), vocab, id);
    EXPECT_NEAR(lp.logprob, want, 1e-6 * std::max(1.0, std::abs(want)));  // a float's rounding
    ASSERT_EQ(lp.top.size(), 3u);
    // Ties (ids 1 and 3) in id order, then the next most likely.
    EXPECT_EQ(lp.top[0].first, 1);
    EXPECT_EQ(lp.top[1].first, 3);
    EXPECT_EQ(lp.top[2].first, 0);
    EXPECT_EQ(lp.top[0].second, lp.top[1].second);
  }
  EXPECT_EQ(token_logprob(row.data(), vocab, 2, 0).top.size(), 0u);
  EXPECT_EQ(token_logprob(row.data(), vocab, 2, 20).top.size(), row.size());  // at most the vocab
  double total = 0;
  for (int32_t id = 0; id < vocab; ++id)
    total += std::exp(token_logprob(row.data(), vocab, id, 0).logprob);
  EXPECT_NEAR(total, 1.0, 1e-6);
}

// AR: each token's value is log_softmax of the row that predicted it, as a prefill of the prompt
// and the tokens before it computes that row.
TEST(Logprobs, ArValuesAreThePredictingRowsLogSoftmax) {
  const TinyModel tiny = testing::make_tiny_model(testing::engine_test_config(), DType::BF16, 17);
  for (KvType kv : {KvType::kFp16, KvType::kInt8}) {
    auto e = testing::make_tiny_engine(tiny, testing::engine_test_options(DecodeMode::kAr, kv));
    ASSERT_TRUE(e);
    const std::vector<int32_t> prompt = random_prompt(20, kVocab, 3);
    for (bool sample : {false, true}) {
      GenerationParams p = greedy_params(50);  // crosses G = 32: the INT8 view quantizes
      p.logprobs = 4;
      if (sample) {
        p.sampling.temperature = 0.9f;
        p.sampling.top_k = 20;
        p.sampling.seed = 11;
      }
      int streamed = 0;
      p.on_logprob = [&](const TokenLogprob& lp) {
        (void)lp;
        ++streamed;
      };
      auto r = e->generate(prompt, p, nullptr);
      ASSERT_TRUE(r.ok()) << r.error().message;
      expect_well_formed(*r, 4);
      EXPECT_EQ(streamed, static_cast<int>(r->tokens.size()));
      if (!sample) {
        for (const TokenLogprob& lp : r->logprobs) EXPECT_EQ(lp.top[0].first, lp.id);  // argmax
      }
      if (kv != KvType::kFp16) continue;  // the fp cache's prefill reads what decoding read
      std::vector<int32_t> seq = prompt;
      seq.insert(seq.end(), r->tokens.begin(), r->tokens.end() - 1);
      auto rows = e->prefill_logits(seq);
      ASSERT_TRUE(rows.ok());
      for (size_t i = 0; i < r->tokens.size(); ++i) {
        const float* row = rows->data() + (prompt.size() - 1 + i) * kVocab;
        EXPECT_NEAR(r->logprobs[i].logprob, reference_logprob(row, kVocab, r->tokens[i]), 1e-4)
            << "token " << i << (sample ? " (sampled)" : "");
      }
    }
  }
}

// QuantSpec reports the target's values: greedy, the same tokens as AR INT8 with the same
// log-probabilities (the verification rows are the AR steps' rows); sampling, well-formed values
// for accepted candidates and final tokens alike.
TEST(Logprobs, QuantSpecReportsTheTargetsValues) {
  const TinyModel tiny = testing::make_tiny_model(testing::engine_test_config(), DType::BF16, 5);
  auto ar =
      testing::make_tiny_engine(tiny, testing::engine_test_options(DecodeMode::kAr, KvType::kInt8));
  ASSERT_TRUE(ar);
  for (int gamma : {1, 4}) {
    EngineOptions o = testing::engine_test_options(DecodeMode::kQuantSpec, KvType::kFp16);
    o.gamma = gamma;
    auto spec = testing::make_tiny_engine(tiny, o);
    ASSERT_TRUE(spec);
    const std::vector<int32_t> prompt = random_prompt(40, kVocab, 8);
    GenerationParams p = greedy_params(70);
    p.logprobs = 2;
    auto want = ar->generate(prompt, p, nullptr);
    auto got = spec->generate(prompt, p, nullptr);
    ASSERT_TRUE(want.ok() && got.ok());
    ASSERT_EQ(got->tokens, want->tokens);
    ASSERT_GT(got->stats.accepted, 0);
    ASSERT_LT(got->stats.accepted, got->stats.drafted);  // accepted and rejected candidates
    expect_well_formed(*got, 2);
    for (size_t i = 0; i < got->tokens.size(); ++i) {
      EXPECT_NEAR(got->logprobs[i].logprob, want->logprobs[i].logprob, 1e-4) << "token " << i;
      for (size_t j = 0; j < 2; ++j) {
        EXPECT_EQ(got->logprobs[i].top[j].first, want->logprobs[i].top[j].first);
        EXPECT_NEAR(got->logprobs[i].top[j].second, want->logprobs[i].top[j].second, 1e-4);
      }
    }

    GenerationParams s = greedy_params(70);
    s.logprobs = 3;
    s.sampling.temperature = 1.0f;
    s.sampling.seed = 21;
    std::vector<TokenLogprob> streamed;
    s.on_logprob = [&](const TokenLogprob& lp) { streamed.push_back(lp); };
    auto sampled = spec->generate(prompt, s, nullptr);
    ASSERT_TRUE(sampled.ok());
    expect_well_formed(*sampled, 3);
    ASSERT_EQ(streamed.size(), sampled->logprobs.size());
    for (size_t i = 0; i < streamed.size(); ++i) {
      EXPECT_EQ(streamed[i].id, sampled->logprobs[i].id);
      EXPECT_EQ(streamed[i].logprob, sampled->logprobs[i].logprob);
    }
    // Without logprobs nothing is reported, and the tokens do not change.
    s.logprobs = -1;
    s.on_logprob = nullptr;
    auto plain = spec->generate(prompt, s, nullptr);
    ASSERT_TRUE(plain.ok());
    EXPECT_TRUE(plain->logprobs.empty());
    EXPECT_EQ(plain->tokens, sampled->tokens);
  }
}

// Engine::prompt_logprobs (an OpenAI echo with logprobs): entry i is token i + 1's value under
// row i of sequence_logits, with the same alternatives, over several prefill chunks (the rows of a
// chunk predict the next chunk's first token too) in every KV mode; and it bounds `top`.
TEST(Logprobs, PromptLogprobsAreTheSequenceRowsLogSoftmax) {
  const TinyModel tiny = testing::make_tiny_model(testing::engine_test_config(), DType::BF16, 23);
  const std::vector<int32_t> ids = random_prompt(3 * testing::kEngineTestChunk + 7, kVocab, 4);
  const std::pair<DecodeMode, KvType> modes[] = {{DecodeMode::kAr, KvType::kFp16},
                                                 {DecodeMode::kAr, KvType::kInt8},
                                                 {DecodeMode::kQuantSpec, KvType::kFp16}};
  for (const auto& [mode, kv] : modes) {
    auto e = testing::make_tiny_engine(tiny, testing::engine_test_options(mode, kv));
    ASSERT_TRUE(e);
    auto rows = e->sequence_logits(ids);
    ASSERT_TRUE(rows.ok()) << rows.error().message;
    auto got = e->prompt_logprobs(ids, 3);
    ASSERT_TRUE(got.ok()) << got.error().message;
    ASSERT_EQ(got->size(), ids.size() - 1);
    for (size_t i = 0; i + 1 < ids.size(); ++i) {
      const float* row = rows->data() + i * kVocab;
      const TokenLogprob want = token_logprob(row, kVocab, ids[i + 1], 3);
      const TokenLogprob& lp = (*got)[i];
      EXPECT_EQ(lp.id, ids[i + 1]);
      EXPECT_NEAR(lp.logprob, reference_logprob(row, kVocab, ids[i + 1]), 1e-5) << "entry " << i;
      ASSERT_EQ(lp.top.size(), 3u);
      for (size_t j = 0; j < 3; ++j) {
        EXPECT_EQ(lp.top[j].first, want.top[j].first) << "entry " << i;
        // (the scoring pass leaves out the last token: its last chunk's rows are one fewer, so
        // the arithmetic may round differently)
        EXPECT_NEAR(lp.top[j].second, want.top[j].second, 1e-5);
      }
    }
    // One token: nothing predicts it.
    auto one = e->prompt_logprobs({ids[0]}, 0);
    ASSERT_TRUE(one.ok());
    EXPECT_TRUE(one->empty());
    // A stop asked for between chunks ends the pass (after the first chunk here).
    int asked = 0;
    auto stopped = e->prompt_logprobs(ids, 0, [&] { return ++asked > 1; });
    ASSERT_FALSE(stopped.ok());
    EXPECT_EQ(stopped.error().message, "cancelled");
    EXPECT_EQ(asked, 2);
    // And generation still works after the scoring pass (it cleared the cache).
    auto r = e->generate(ids, greedy_params(5), nullptr);
    ASSERT_TRUE(r.ok()) << r.error().message;
  }
  auto e = testing::make_tiny_engine(tiny, EngineOptions{});
  ASSERT_TRUE(e);
  for (int bad : {-1, kMaxTopLogprobs + 1}) {
    auto r = e->prompt_logprobs(ids, bad);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("top"), std::string::npos) << r.error().message;
  }
  EXPECT_FALSE(e->prompt_logprobs({}, 0).ok());  // an empty prompt is an error, as in generate
}

TEST(Logprobs, OutOfRangeCountsAreRejected) {
  const TinyModel tiny = testing::make_tiny_model(testing::engine_test_config(), DType::BF16, 2);
  auto e = testing::make_tiny_engine(tiny, EngineOptions{});
  ASSERT_TRUE(e);
  for (int bad : {-2, kMaxTopLogprobs + 1}) {
    GenerationParams p = greedy_params(4);
    p.logprobs = bad;
    auto r = e->generate(random_prompt(5, kVocab, 1), p, nullptr);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("logprobs"), std::string::npos) << r.error().message;
  }
}

}  // namespace
}  // namespace qs
