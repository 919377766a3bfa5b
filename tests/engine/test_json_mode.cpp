// JSON mode through the engine (GenerationParams::json_object) on the committed test models with
// their tokenizers (byte-level BPE and SentencePiece-style): every output is a prefix of one JSON
// object, a complete one ends the generation, greedy QuantSpec emits what greedy AR INT8 emits
// in JSON mode, and log-probabilities name no token the mask removed. The sampling law under the
// mask is Drafts/Distribution's quantspec_json case (test_quantspec.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/json_constraint.h"
#include "engine/llm_engine.h"
#include "tiny_model.h"

#ifndef QS_SOURCE_DIR
#error "QS_SOURCE_DIR must be defined"
#endif

namespace qs {
namespace {

class JsonMode : public ::testing::TestWithParam<const char*> {
 protected:
  std::unique_ptr<Engine> load(DecodeMode mode, int gamma = 0) {
    EngineOptions o = testing::engine_test_options(
        mode, mode == DecodeMode::kQuantSpec ? KvType::kFp16 : KvType::kInt8);
    if (gamma > 0) o.gamma = gamma;
    o.num_threads = 2;
    o.max_context = 512;
    auto e = Engine::load(std::filesystem::path(QS_SOURCE_DIR) / "models/test" / GetParam(), o);
    EXPECT_TRUE(e.ok()) << e.error().message;
    return e.ok() ? std::move(e).value() : nullptr;
  }

  static int32_t id_of(const Tokenizer& t, const std::string& bytes) {
    for (int32_t id = 0; id < t.vocab_size(); ++id) {
      if (!t.is_special(id) && t.token_bytes(id) == bytes) return id;
    }
    ADD_FAILURE() << "no token '" << bytes << "'";
    return 0;
  }

  // A prompt, and closing tokens favoured so that random weights finish some objects.
  GenerationParams params(const Tokenizer& t, int n, float temperature, uint64_t seed) {
    GenerationParams p;
    p.max_new_tokens = n;
    p.sampling.temperature = temperature;
    p.sampling.seed = seed;
    p.json_object = true;
    for (const char* b : {"\"", "}", ":", ","}) p.adjust.logit_bias.emplace_back(id_of(t, b), 4.0f);
    return p;
  }

  // The output's bytes are taken by the grammar; complete exactly when it finished with "stop",
  // and then the text parses as one object.
  static void expect_json(const Tokenizer& t, const GenerationResult& r, int n) {
    JsonState s;
    for (int32_t id : r.tokens) ASSERT_TRUE(s.advance(t.token_bytes(id))) << r.text;
    if (r.finish_reason == "stop") {
      EXPECT_TRUE(s.complete()) << r.text;
      const nlohmann::json parsed = nlohmann::json::parse(r.text);
      EXPECT_TRUE(parsed.is_object()) << r.text;
    } else {
      EXPECT_EQ(r.finish_reason, "length");
      EXPECT_FALSE(s.complete()) << r.text;
      EXPECT_EQ(static_cast<int>(r.tokens.size()), n);
    }
  }
};

TEST_P(JsonMode, SampledOutputsArePrefixesOfOneObject) {
  auto ar = load(DecodeMode::kAr);
  auto spec = load(DecodeMode::kQuantSpec, 3);
  ASSERT_TRUE(ar && spec);
  const Tokenizer& t = *ar->tokenizer();
  const std::vector<int32_t> prompt = t.encode("Answer in JSON: what is 2 + 2?", true);
  int complete = 0;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    for (Engine* e : {ar.get(), spec.get()}) {
      auto r = e->generate(prompt, params(t, 60, 1.0f, seed), nullptr);
      ASSERT_TRUE(r.ok()) << r.error().message;
      expect_json(t, *r, 60);
      complete += r->finish_reason == "stop";
    }
  }
  EXPECT_GT(complete, 0);  // the finished case is exercised too
}

TEST_P(JsonMode, GreedyQuantSpecEqualsGreedyArInt8) {
  auto ar = load(DecodeMode::kAr);
  ASSERT_TRUE(ar);
  const Tokenizer& t = *ar->tokenizer();
  const std::vector<int32_t> prompt = t.encode("{\"name\": \"quantspec\", \"tags\": [", true);
  GenerationParams p = params(t, 80, 0.0f, 1);
  p.adjust.logit_bias.clear();  // the model's own choices, which stay in strings longer
  auto want = ar->generate(prompt, p, nullptr);
  ASSERT_TRUE(want.ok()) << want.error().message;
  expect_json(t, *want, 80);
  for (int gamma : {1, 3, 6}) {
    auto spec = load(DecodeMode::kQuantSpec, gamma);
    ASSERT_TRUE(spec);
    auto got = spec->generate(prompt, p, nullptr);
    ASSERT_TRUE(got.ok()) << got.error().message;
    EXPECT_EQ(got->tokens, want->tokens) << "gamma " << gamma;
    EXPECT_EQ(got->finish_reason, want->finish_reason);
  }
}

TEST_P(JsonMode, LogprobsNameOnlyAllowedTokens) {
  auto spec = load(DecodeMode::kQuantSpec, 3);
  ASSERT_TRUE(spec);
  const Tokenizer& t = *spec->tokenizer();
  GenerationParams p = params(t, 30, 0.8f, 3);
  p.logprobs = 20;
  auto r = spec->generate(t.encode("JSON:", true), p, nullptr);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->logprobs.size(), r->tokens.size());
  JsonState s;
  for (const TokenLogprob& lp : r->logprobs) {
    EXPECT_TRUE(std::isfinite(lp.logprob));
    for (const auto& [id, v] : lp.top) {
      EXPECT_TRUE(std::isfinite(v));
      JsonState u = s;
      EXPECT_TRUE(u.advance(t.token_bytes(id))) << "alternative '" << t.token_bytes(id) << "'";
    }
    ASSERT_TRUE(s.advance(t.token_bytes(lp.id)));
  }
}

INSTANTIATE_TEST_SUITE_P(Models, JsonMode, ::testing::Values("llama3-tiny", "llama2-tiny"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param).substr(0, 6);
                         });

TEST(JsonModeErrors, AModelWithoutATokenizerIsRefused) {
  const testing::TinyModel tiny =
      testing::make_tiny_model(testing::engine_test_config(), DType::BF16, 5);
  auto e =
      testing::make_tiny_engine(tiny, testing::engine_test_options(DecodeMode::kAr, KvType::kInt8));
  ASSERT_TRUE(e);
  GenerationParams p = testing::greedy_params(4);
  p.json_object = true;
  auto r = e->generate(testing::random_prompt(5, testing::kEngineTestVocab, 1), p, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("JSON mode needs the model's tokenizer"), std::string::npos)
      << r.error().message;
}

}  // namespace
}  // namespace qs
