// The generation loop: greedy == step-by-step argmax, context clamping, EOS, stop strings,
// streaming, cancellation, seeded sampling, and Engine::load from a directory on disk.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "engine/llm_engine.h"
#include "engine/sampler.h"
#include "tiny_model.h"

namespace qs {
namespace {

namespace fs = std::filesystem;
using testing::TinyModel;

const fs::path kTokenizerDir = fs::path(QS_SOURCE_DIR) / "models/tokenizers/bytelevel";

ModelConfig generate_config() {
  ModelConfig cfg = testing::tiny_config();
  cfg.vocab_size = 2048;  // the test byte-level tokenizer's
  cfg.max_position_embeddings = 128;
  return cfg;
}

std::unique_ptr<LlmEngine> make_engine(const TinyModel& tiny, bool with_tokenizer,
                                       EngineOptions options = {}) {
  std::optional<Tokenizer> tok;
  if (with_tokenizer) {
    Result<Tokenizer> t = Tokenizer::load(kTokenizerDir);
    EXPECT_TRUE(t.ok()) << t.error().message;
    if (!t.ok()) return nullptr;
    tok.emplace(std::move(t).value());
  }
  if (options.num_threads == 0) options.num_threads = 2;
  Result<std::unique_ptr<LlmEngine>> e =
      LlmEngine::create(tiny.cfg, tiny.weights, std::move(tok), options);
  EXPECT_TRUE(e.ok()) << e.error().message;
  return e.ok() ? std::move(e).value() : nullptr;
}

std::vector<int32_t> prompt_ids(int n) {
  std::vector<int32_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = (i * 131 + 7) % 2000;
  return ids;
}

// Greedy continuation computed the slow way: full prefill of the growing sequence each step.
std::vector<int32_t> slow_greedy(LlmEngine& e, std::vector<int32_t> ids, int steps) {
  std::vector<int32_t> out;
  const int vocab = e.config().vocab_size;
  for (int s = 0; s < steps; ++s) {
    Result<std::vector<float>> logits = e.prefill_logits(ids);
    EXPECT_TRUE(logits.ok());
    const int32_t next = argmax(logits->data() + (ids.size() - 1) * vocab, vocab);
    out.push_back(next);
    ids.push_back(next);
  }
  return out;
}

class GenerateTest : public ::testing::Test {
 protected:
  TinyModel tiny = testing::make_tiny_model(generate_config(), DType::BF16, 99);
};

TEST_F(GenerateTest, PrefillLogitsOfTheLastRowsAreTheTailOfAllRows) {
  EngineOptions opt;
  opt.prefill_chunk = 4;
  auto e = make_engine(tiny, false, opt);
  ASSERT_TRUE(e);
  const std::vector<int32_t> ids = prompt_ids(11);
  const size_t vocab = static_cast<size_t>(e->config().vocab_size);
  Result<std::vector<float>> all = e->prefill_logits(ids);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 11 * vocab);
  for (int last : {1, 3, 4, 5, 8, 11, 40}) {  // within, at and across chunk edges; more than n
    Result<std::vector<float>> tail = e->prefill_logits(ids, last);
    ASSERT_TRUE(tail.ok());
    const size_t rows = static_cast<size_t>(std::min(last, 11));
    ASSERT_EQ(tail->size(), rows * vocab) << last;
    const std::vector<float> want(all->end() - rows * vocab, all->end());
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_NEAR((*tail)[i], want[i], 1e-5f * (1.0f + std::abs(want[i]))) << last << " " << i;
    }
  }
}

TEST_F(GenerateTest, GreedyEqualsStepwiseArgmax) {
  EngineOptions opt;
  opt.prefill_chunk = 4;  // the prompt goes in several chunks
  auto e = make_engine(tiny, false, opt);
  ASSERT_TRUE(e);
  const std::vector<int32_t> prompt = prompt_ids(11);
  GenerationParams p;
  p.max_new_tokens = 12;
  Result<GenerationResult> r = e->generate(prompt, p, {});
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->tokens, slow_greedy(*e, prompt, 12));
  EXPECT_EQ(r->finish_reason, "length");
  EXPECT_EQ(r->stats.prompt_tokens, 11);
  EXPECT_EQ(r->stats.generated_tokens, 12);
  EXPECT_GT(r->stats.decode_s, 0.0);
  EXPECT_TRUE(r->text.empty());  // no tokenizer

  // Same again from a reused engine (the cache is reset).
  Result<GenerationResult> again = e->generate(prompt, p, {});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->tokens, r->tokens);
}

TEST_F(GenerateTest, ContextLimits) {
  EngineOptions opt;
  opt.max_context = 20;
  auto e = make_engine(tiny, false, opt);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->max_context(), 20);
  GenerationParams p;
  p.max_new_tokens = 100;
  p.stop_at_eos = false;
  Result<GenerationResult> r = e->generate(prompt_ids(15), p, {});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->tokens.size(), 6u);  // clamped to context - prompt + 1
  EXPECT_EQ(r->finish_reason, "length");

  r = e->generate(prompt_ids(20), p, {});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->tokens.size(), 1u);

  r = e->generate(prompt_ids(21), p, {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "prompt has 21 tokens but the context is 20");
  EXPECT_FALSE(e->prefill_logits(prompt_ids(21)).ok());

  EXPECT_FALSE(e->generate({}, p, {}).ok());
  r = e->generate({5, 3000}, p, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("out of range"), std::string::npos);
  p.max_new_tokens = 0;
  r = e->generate(prompt_ids(3), p, {});
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->tokens.empty());
}

TEST_F(GenerateTest, DefaultContextAndSlidingWindow) {
  ModelConfig cfg = generate_config();
  EXPECT_EQ(*resolve_max_context(cfg, {}), 128);
  cfg.max_position_embeddings = 100000;
  EXPECT_EQ(*resolve_max_context(cfg, {}), 8192);
  cfg.sliding_window = 4096;
  EXPECT_EQ(*resolve_max_context(cfg, {}), 4096);
  EngineOptions opt;
  opt.max_context = 5000;
  Result<int> r = resolve_max_context(cfg, opt);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("sliding_window"), std::string::npos);
  opt.max_context = 4096;
  EXPECT_EQ(*resolve_max_context(cfg, opt), 4096);
}

TEST_F(GenerateTest, EosEndsWithStop) {
  auto e = make_engine(tiny, false);
  ASSERT_TRUE(e);
  GenerationParams p;
  p.max_new_tokens = 10;
  p.stop_at_eos = false;
  const std::vector<int32_t> free_run = e->generate(prompt_ids(6), p, {})->tokens;
  ASSERT_EQ(free_run.size(), 10u);

  // Make the 4th generated token an EOS id (the first occurrence of that id wins).
  const int32_t eos = free_run[3];
  const size_t first = std::find(free_run.begin(), free_run.end(), eos) - free_run.begin();
  tiny.cfg.eos_token_ids = {eos};
  auto e2 = make_engine(tiny, false);
  p.stop_at_eos = true;
  Result<GenerationResult> r = e2->generate(prompt_ids(6), p, {});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->finish_reason, "stop");
  EXPECT_EQ(r->tokens, std::vector<int32_t>(free_run.begin(), free_run.begin() + first + 1));
  p.stop_at_eos = false;
  EXPECT_EQ(e2->generate(prompt_ids(6), p, {})->tokens, free_run);
}

TEST_F(GenerateTest, SeededSampling) {
  auto e = make_engine(tiny, false);
  ASSERT_TRUE(e);
  GenerationParams p;
  p.max_new_tokens = 16;
  p.stop_at_eos = false;
  p.sampling.temperature = 1.5f;
  p.sampling.top_p = 0.95f;
  p.sampling.seed = 5;
  const auto a = e->generate(prompt_ids(4), p, {})->tokens;
  EXPECT_EQ(e->generate(prompt_ids(4), p, {})->tokens, a);
  p.sampling.seed = 6;
  EXPECT_NE(e->generate(prompt_ids(4), p, {})->tokens, a);
  p.sampling.top_p = 0.0f;
  EXPECT_FALSE(e->generate(prompt_ids(4), p, {}).ok());
}

TEST_F(GenerateTest, StreamedTextStopStringsAndCancel) {
  auto e = make_engine(tiny, true);
  ASSERT_TRUE(e);
  const Tokenizer& tok = *e->tokenizer();
  GenerationParams p;
  p.max_new_tokens = 40;
  p.stop_at_eos = false;
  const std::vector<int32_t> prompt = prompt_ids(8);

  std::string streamed;
  Result<GenerationResult> r = e->generate(prompt, p, [&](std::string_view piece) {
    streamed += piece;
    return true;
  });
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->finish_reason, "length");
  EXPECT_EQ(r->text, tok.decode(r->tokens, /*skip_special=*/true));
  EXPECT_EQ(streamed, r->text);
  ASSERT_GE(r->text.size(), 12u) << "the random model produced too little text to test with";

  // A stop string taken from the middle of the text: output is cut before its first occurrence.
  const std::string full = r->text;
  const std::string stop = full.substr(full.size() / 2, 3);
  const size_t cut = full.find(stop);
  p.stop = {"never-appears", stop};
  streamed.clear();
  Result<GenerationResult> s = e->generate(prompt, p, [&](std::string_view piece) {
    streamed += piece;
    return true;
  });
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->finish_reason, "stop");
  EXPECT_EQ(s->text, full.substr(0, cut));
  EXPECT_EQ(streamed, s->text);
  EXPECT_LE(s->tokens.size(), r->tokens.size());
  EXPECT_EQ(s->tokens,
            std::vector<int32_t>(r->tokens.begin(), r->tokens.begin() + s->tokens.size()));

  // Cancel after the first piece.
  p.stop.clear();
  int calls = 0;
  Result<GenerationResult> c = e->generate(prompt, p, [&](std::string_view) {
    ++calls;
    return false;
  });
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(c->finish_reason, "cancelled");
  EXPECT_LT(c->tokens.size(), r->tokens.size());
}

TEST_F(GenerateTest, StopStringsNeedATokenizer) {
  auto e = make_engine(tiny, false);
  GenerationParams p;
  p.stop = {"x"};
  Result<GenerationResult> r = e->generate(prompt_ids(3), p, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("tokenizer"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// Engine::load on a directory written here: config.json + model.safetensors (+ tokenizer).

void write_safetensors(const fs::path& file, const ModelWeights& w, bool tied) {
  std::vector<const WeightView*> tensors = {&w.tok_embeddings, &w.final_norm};
  if (!tied) tensors.push_back(&w.lm_head);
  for (const LayerWeights& L : w.layers) {
    for (const WeightView* t : {&L.attn_norm, &L.wq, &L.wk, &L.wv, &L.wo, &L.bq, &L.bk, &L.bv,
                                &L.mlp_norm, &L.w_gate, &L.w_up, &L.w_down}) {
      if (!t->empty()) tensors.push_back(t);
    }
  }
  std::string header = "{";
  size_t offset = 0;
  for (const WeightView* t : tensors) {
    const size_t bytes = t->numel() * dtype_size(t->dtype);
    // Appended piece by piece: GCC 12's -Wrestrict misfires on "literal" + std::string&&.
    std::string shape = "[";
    if (t->rows != 1) shape += std::to_string(t->rows) + ",";
    shape += std::to_string(t->cols);
    shape += "]";
    if (header.size() > 1) header += ",";
    header += "\"" + t->name + "\":{\"dtype\":\"" + dtype_name(t->dtype) + "\",\"shape\":" + shape +
              ",\"data_offsets\":[" + std::to_string(offset) + "," +
              std::to_string(offset + bytes) + "]}";
    offset += bytes;
  }
  header += "}";
  while (header.size() % 8) header += ' ';
  std::ofstream out(file, std::ios::binary);
  const uint64_t len = header.size();
  out.write(reinterpret_cast<const char*>(&len), 8);
  out.write(header.data(), header.size());
  for (const WeightView* t : tensors) {
    out.write(static_cast<const char*>(t->data), t->numel() * dtype_size(t->dtype));
  }
}

TEST_F(GenerateTest, LoadsAModelDirectory) {
  const fs::path dir = fs::temp_directory_path() / ("qs_engine_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const ModelConfig& c = tiny.cfg;
  std::ofstream(dir / "config.json")
      << "{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\",\"vocab_size\":"
      << c.vocab_size << ",\"hidden_size\":" << c.hidden_size
      << ",\"intermediate_size\":" << c.intermediate_size
      << ",\"num_hidden_layers\":" << c.num_layers << ",\"num_attention_heads\":" << c.num_heads
      << ",\"num_key_value_heads\":" << c.num_kv_heads
      << ",\"max_position_embeddings\":" << c.max_position_embeddings
      << ",\"rope_theta\":10000.0,\"rms_norm_eps\":1e-05,\"torch_dtype\":\"bfloat16\"}";
  write_safetensors(dir / "model.safetensors", tiny.weights, false);
  fs::copy_file(kTokenizerDir / "tokenizer.json", dir / "tokenizer.json");
  fs::copy_file(kTokenizerDir / "tokenizer_config.json", dir / "tokenizer_config.json");

  EngineOptions opt;
  opt.num_threads = 2;
  Result<std::unique_ptr<Engine>> loaded = Engine::load(dir, opt);
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  Engine& e = **loaded;
  EXPECT_NE(e.tokenizer(), nullptr);
  EXPECT_EQ(e.max_context(), 128);

  // Same logits as the in-memory engine over the same weights.
  auto mem = make_engine(tiny, false);
  const std::vector<int32_t> ids = prompt_ids(9);
  Result<std::vector<float>> a = e.prefill_logits(ids), b = mem->prefill_logits(ids);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);

  fs::remove(dir / "model.safetensors");
  Result<std::unique_ptr<Engine>> missing = Engine::load(dir, opt);
  EXPECT_FALSE(missing.ok());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace qs
