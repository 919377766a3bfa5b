// JSON output through the engine (GenerationParams::json_schema) on the committed test models with
// their tokenizers (byte-level BPE and SentencePiece-style), in JSON mode and under a JSON Schema:
// every output is a prefix of one document the schema accepts, a complete one ends the
// generation, greedy QuantSpec emits what greedy AR INT8 emits under the same constraint, and
// log-probabilities name no token the mask removed. The sampling law under the mask is
// Drafts/Distribution's quantspec_json case (test_quantspec.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/json_constraint.h"
#include "engine/llm_engine.h"
#include "json_schema_check.h"
#include "tiny_model.h"

#ifndef QS_SOURCE_DIR
#error "QS_SOURCE_DIR must be defined"
#endif

namespace qs {
namespace {

// Every kind of node: listed and optional properties, an enum, a bounded string and array, a
// union through a reference.
constexpr const char* kSchema = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 12},
    "size": {"enum": ["small", "large", 3]},
    "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}, "maxItems": 3},
    "score": {"type": "number"}
  },
  "required": ["name", "size"],
  "$defs": {"tag": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 4},
                               {"type": "null"}]}}
})";

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
  GenerationParams params(const Tokenizer& t, int n, float temperature, uint64_t seed,
                          std::string_view schema = kJsonObjectSchema) {
    GenerationParams p;
    p.max_new_tokens = n;
    p.sampling.temperature = temperature;
    p.sampling.seed = seed;
    p.json_schema = schema;
    for (const char* b : {"\"", "}", ":", ","}) p.adjust.logit_bias.emplace_back(id_of(t, b), 4.0f);
    return p;
  }

  // The output's bytes are taken by the grammar; complete exactly when it finished with "stop",
  // and then the text parses as one document the schema accepts.
  static void expect_json(const Tokenizer& t, const GenerationResult& r, int n,
                          std::string_view schema = kJsonObjectSchema) {
    JsonRecognizer rec(JsonGrammar::compile(schema).value());
    JsonState s = rec.start();
    for (int32_t id : r.tokens) ASSERT_TRUE(rec.advance(s, t.token_bytes(id))) << r.text;
    if (r.finish_reason == "stop") {
      EXPECT_TRUE(rec.finished(s)) << r.text;
      const auto parsed = testing::OrderedJson::parse(r.text);
      const auto want = testing::OrderedJson::parse(schema);
      EXPECT_TRUE(testing::schema_accepts(want, parsed, want)) << r.text;
    } else {
      EXPECT_EQ(r.finish_reason, "length");
      EXPECT_FALSE(rec.finished(s)) << r.text;
      EXPECT_EQ(static_cast<int>(r.tokens.size()), n);
    }
  }

  // Six seeds on each engine: every output passes expect_json, and some finish (so that the
  // finished case is exercised too).
  void expect_sampled_documents(Engine& ar, Engine& spec, const char* text, int n,
                                std::string_view schema) {
    const Tokenizer& t = *ar.tokenizer();
    const std::vector<int32_t> prompt = t.encode(text, true);
    int complete = 0;
    for (uint64_t seed = 1; seed <= 6; ++seed) {
      for (Engine* e : {&ar, &spec}) {
        auto r = e->generate(prompt, params(t, n, 1.0f, seed, schema), nullptr);
        ASSERT_TRUE(r.ok()) << r.error().message;
        expect_json(t, *r, n, schema);
        complete += r->finish_reason == "stop";
      }
    }
    EXPECT_GT(complete, 0);
  }
};

TEST_P(JsonMode, SampledOutputsArePrefixesOfOneObject) {
  auto ar = load(DecodeMode::kAr);
  auto spec = load(DecodeMode::kQuantSpec, 3);
  ASSERT_TRUE(ar && spec);
  expect_sampled_documents(*ar, *spec, "Answer in JSON: what is 2 + 2?", 60, kJsonObjectSchema);
}

TEST_P(JsonMode, SchemaOutputsAreDocumentsItAccepts) {
  auto ar = load(DecodeMode::kAr);
  auto spec = load(DecodeMode::kQuantSpec, 3);
  ASSERT_TRUE(ar && spec);
  expect_sampled_documents(*ar, *spec, "Describe the box in JSON:", 80, kSchema);
  const Tokenizer& t = *ar->tokenizer();
  const std::vector<int32_t> prompt = t.encode("Describe the box in JSON:", true);
  // Greedy: QuantSpec's tokens are AR INT8's under the same schema.
  GenerationParams p = params(t, 80, 0.0f, 1, kSchema);
  auto want = ar->generate(prompt, p, nullptr);
  auto got = spec->generate(prompt, p, nullptr);
  ASSERT_TRUE(want.ok() && got.ok());
  expect_json(t, *want, 80, kSchema);
  EXPECT_EQ(got->tokens, want->tokens);
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
  JsonRecognizer rec(JsonGrammar::compile(kJsonObjectSchema).value());
  JsonState s = rec.start();
  for (const TokenLogprob& lp : r->logprobs) {
    EXPECT_TRUE(std::isfinite(lp.logprob));
    for (const auto& [id, v] : lp.top) {
      EXPECT_TRUE(std::isfinite(v));
      JsonState u = s;
      EXPECT_TRUE(rec.advance(u, t.token_bytes(id))) << "alternative '" << t.token_bytes(id) << "'";
    }
    ASSERT_TRUE(rec.advance(s, t.token_bytes(lp.id)));
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
  p.json_schema = kJsonObjectSchema;
  auto r = e->generate(testing::random_prompt(5, testing::kEngineTestVocab, 1), p, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("JSON output needs the model's tokenizer"), std::string::npos)
      << r.error().message;
}

}  // namespace
}  // namespace qs
