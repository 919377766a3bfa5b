#include "model/weights.h"

#include <gtest/gtest.h>

#include "model/safetensors.h"
#include "model_test_util.h"

namespace qs {
namespace {

using test::TinyModelOptions;

// The stored values of a bound weight equal what the writer put there.
void expect_values(const WeightView& w, uint32_t seed, DType dtype) {
  ASSERT_FALSE(w.empty()) << w.name;
  EXPECT_EQ(w.dtype, dtype) << w.name;
  std::vector<float> got(w.numel());
  to_f32(w.dtype, w.data, got.data(), got.size());
  std::vector<float> want = test::test_values(got.size(), seed);
  EXPECT_EQ(got, want) << w.name;  // test values are exact in every dtype
}

void expect_model(const ModelWeights& w, const ModelConfig& c,
                  const std::map<std::string, uint32_t>& seeds, DType dtype) {
  ASSERT_EQ(w.layers.size(), static_cast<size_t>(c.num_layers));
  EXPECT_EQ(w.tok_embeddings.rows, c.vocab_size);
  EXPECT_EQ(w.tok_embeddings.cols, c.hidden_size);
  expect_values(w.tok_embeddings, seeds.at("model.embed_tokens.weight"), dtype);
  expect_values(w.final_norm, seeds.at("model.norm.weight"), dtype);
  EXPECT_EQ(w.final_norm.rows, 1);
  EXPECT_EQ(w.final_norm.cols, c.hidden_size);
  for (int i = 0; i < c.num_layers; ++i) {
    const LayerWeights& l = w.layers[i];
    const std::string p = "model.layers." + std::to_string(i) + ".";
    EXPECT_EQ(l.wq.name, p + "self_attn.q_proj.weight");
    EXPECT_EQ(l.wq.rows, c.q_dim());
    EXPECT_EQ(l.wq.cols, c.hidden_size);
    EXPECT_EQ(l.wk.rows, c.kv_dim());
    EXPECT_EQ(l.wo.rows, c.hidden_size);
    EXPECT_EQ(l.wo.cols, c.q_dim());
    EXPECT_EQ(l.w_gate.rows, c.intermediate_size);
    EXPECT_EQ(l.w_down.cols, c.intermediate_size);
    EXPECT_EQ(l.attn_norm.rows, 1);
    expect_values(l.attn_norm, seeds.at(p + "input_layernorm.weight"), dtype);
    expect_values(l.wq, seeds.at(p + "self_attn.q_proj.weight"), dtype);
    expect_values(l.wk, seeds.at(p + "self_attn.k_proj.weight"), dtype);
    expect_values(l.wv, seeds.at(p + "self_attn.v_proj.weight"), dtype);
    expect_values(l.wo, seeds.at(p + "self_attn.o_proj.weight"), dtype);
    expect_values(l.mlp_norm, seeds.at(p + "post_attention_layernorm.weight"), dtype);
    expect_values(l.w_gate, seeds.at(p + "mlp.gate_proj.weight"), dtype);
    expect_values(l.w_up, seeds.at(p + "mlp.up_proj.weight"), dtype);
    expect_values(l.w_down, seeds.at(p + "mlp.down_proj.weight"), dtype);
    const bool bias = c.arch == Architecture::Qwen2 || c.attention_bias;
    EXPECT_EQ(l.bq.empty(), !bias);
    EXPECT_EQ(l.bk.empty(), !bias);
    EXPECT_EQ(l.bv.empty(), !bias);
    if (bias) {
      EXPECT_EQ(l.bq.rows, 1);
      EXPECT_EQ(l.bq.cols, c.q_dim());
      EXPECT_EQ(l.bk.cols, c.kv_dim());
      expect_values(l.bq, seeds.at(p + "self_attn.q_proj.bias"), dtype);
      expect_values(l.bk, seeds.at(p + "self_attn.k_proj.bias"), dtype);
      expect_values(l.bv, seeds.at(p + "self_attn.v_proj.bias"), dtype);
    }
    const bool o_bias = c.arch == Architecture::Llama && c.attention_bias;
    EXPECT_EQ(l.bo.empty(), !o_bias);
    if (o_bias) expect_values(l.bo, seeds.at(p + "self_attn.o_proj.bias"), dtype);
  }
}

TEST(Weights, LoadsLlamaInEveryDtype) {
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    test::TempDir dir;
    ModelConfig c = test::tiny_config();
    auto seeds = test::write_tiny_model(dir.path(), c, {.dtype = dt});
    auto w = load_model_weights(dir.path(), c);
    ASSERT_TRUE(w.ok()) << w.error().message;
    expect_model(*w, c, seeds, dt);
    expect_values(w->lm_head, seeds.at("lm_head.weight"), dt);
    EXPECT_NE(w->lm_head.data, w->tok_embeddings.data);
    EXPECT_EQ(w->files.size(), 1u);
  }
}

TEST(Weights, LoadsShardedModel) {
  test::TempDir dir;
  ModelConfig c = test::tiny_config();
  c.num_layers = 3;
  auto seeds = test::write_tiny_model(dir.path(), c, {.dtype = DType::BF16, .shards = 3});
  ASSERT_FALSE(std::filesystem::exists(dir.path() / "model.safetensors"));
  auto w = load_model_weights(dir.path(), c);
  ASSERT_TRUE(w.ok()) << w.error().message;
  EXPECT_EQ(w->files.size(), 3u);
  expect_model(*w, c, seeds, DType::BF16);
  expect_values(w->lm_head, seeds.at("lm_head.weight"), DType::BF16);
}

TEST(Weights, TiedEmbeddingsUseTheEmbeddingTable) {
  test::TempDir dir;
  ModelConfig c = test::tiny_config();
  c.tie_word_embeddings = true;
  auto seeds = test::write_tiny_model(dir.path(), c, {.write_lm_head = false});
  auto w = load_model_weights(dir.path(), c);
  ASSERT_TRUE(w.ok()) << w.error().message;
  EXPECT_EQ(w->lm_head.data, w->tok_embeddings.data);
  EXPECT_EQ(w->lm_head.rows, c.vocab_size);
  EXPECT_EQ(w->lm_head.name, "model.embed_tokens.weight");

  // Untied, the same files lack lm_head.weight.
  c.tie_word_embeddings = false;
  auto untied = load_model_weights(dir.path(), c);
  ASSERT_FALSE(untied.ok());
  EXPECT_EQ(untied.error().message,
            "model.safetensors: missing tensor 'lm_head.weight' (expected shape [19, 8])");
}

TEST(Weights, Qwen2HasQkvBias) {
  test::TempDir dir;
  ModelConfig c = test::tiny_config(Architecture::Qwen2);
  c.tie_word_embeddings = true;
  auto seeds = test::write_tiny_model(dir.path(), c, {.dtype = DType::BF16});
  auto w = load_model_weights(dir.path(), c);
  ASSERT_TRUE(w.ok()) << w.error().message;
  expect_model(*w, c, seeds, DType::BF16);
  // lm_head.weight is in the file too, but a tied model ignores it.
  EXPECT_EQ(w->lm_head.data, w->tok_embeddings.data);
}

TEST(Weights, LlamaAttentionBiasIncludesOutputBias) {
  test::TempDir dir;
  ModelConfig c = test::tiny_config();
  c.attention_bias = true;
  auto seeds = test::write_tiny_model(dir.path(), c);
  auto w = load_model_weights(dir.path(), c);
  ASSERT_TRUE(w.ok()) << w.error().message;
  expect_model(*w, c, seeds, DType::F32);
}

TEST(Weights, ExtraTensorsAreIgnoredAndMixedDtypesAllowed) {
  test::TempDir dir;
  ModelConfig c = test::tiny_config();
  c.num_layers = 1;
  test::SafetensorsBuilder b;
  uint32_t k = 0;
  for (const auto& [name, shape] : test::tiny_model_tensors(c)) {
    DType dt = name.find("norm") != std::string::npos ? DType::F32 : DType::BF16;
    b.add(name, dt, shape, test::test_values(test::numel_of(shape), k++));
  }
  b.add("model.layers.0.self_attn.rotary_emb.inv_freq", DType::F32, {2}, {1.0f, 0.5f});
  b.add_raw("some.int8.thing", "I8", {3}, "xyz");
  test::write_file(dir.path() / "model.safetensors", b.build());
  auto w = load_model_weights(dir.path(), c);
  ASSERT_TRUE(w.ok()) << w.error().message;
  EXPECT_EQ(w->final_norm.dtype, DType::F32);
  EXPECT_EQ(w->layers[0].wq.dtype, DType::BF16);
}

// Rewrites one tensor of a valid tiny model and returns the load error.
std::string error_with(const std::string& name, const std::string& dtype,
                       std::vector<int64_t> shape, bool remove = false) {
  test::TempDir dir;
  ModelConfig c = test::tiny_config(Architecture::Qwen2);
  test::SafetensorsBuilder b;
  for (const auto& [n, s] : test::tiny_model_tensors(c)) {
    if (n != name) {
      b.add(n, DType::F16, s, test::test_values(test::numel_of(s), 0));
    } else if (!remove) {
      size_t bytes = test::numel_of(shape) * (dtype == "F32" ? 4 : dtype == "I8" ? 1 : 2);
      b.add_raw(n, dtype, shape, std::string(bytes, '\0'));
    }
  }
  test::write_file(dir.path() / "model.safetensors", b.build());
  auto w = load_model_weights(dir.path(), c);
  EXPECT_FALSE(w.ok());
  return w.ok() ? "" : w.error().message;
}

TEST(Weights, ReportsWrongShapeDtypeAndMissingTensors) {
  EXPECT_EQ(error_with("model.layers.0.self_attn.q_proj.weight", "F16", {8, 4}),
            "model.safetensors: tensor 'model.layers.0.self_attn.q_proj.weight' has shape [8, 4], "
            "expected [8, 8]");
  EXPECT_EQ(error_with("model.layers.1.self_attn.k_proj.weight", "F16", {8, 8}),
            "model.safetensors: tensor 'model.layers.1.self_attn.k_proj.weight' has shape [8, 8], "
            "expected [4, 8]");
  EXPECT_EQ(error_with("model.norm.weight", "F16", {1, 8}),
            "model.safetensors: tensor 'model.norm.weight' has shape [1, 8], expected [8]");
  EXPECT_EQ(error_with("model.layers.1.self_attn.v_proj.bias", "F16", {8}),
            "model.safetensors: tensor 'model.layers.1.self_attn.v_proj.bias' has shape [8], "
            "expected [4]");
  EXPECT_EQ(error_with("model.layers.0.mlp.down_proj.weight", "I8", {8, 12}),
            "model.safetensors: tensor 'model.layers.0.mlp.down_proj.weight' has dtype I8, "
            "expected F32, F16 or BF16");
  EXPECT_EQ(error_with("model.layers.1.self_attn.q_proj.bias", "", {}, /*remove=*/true),
            "model.safetensors: missing tensor 'model.layers.1.self_attn.q_proj.bias' (expected "
            "shape [8])");
  EXPECT_EQ(error_with("model.embed_tokens.weight", "BF16", {20, 8}),
            "model.safetensors: tensor 'model.embed_tokens.weight' has shape [20, 8], expected "
            "[19, 8]");
}

TEST(Weights, ShardErrorsNameTheShard) {
  test::TempDir dir;
  ModelConfig c = test::tiny_config();
  test::write_tiny_model(dir.path(), c, {.shards = 2});
  ModelConfig wrong = c;
  wrong.intermediate_size = 16;
  auto w = load_model_weights(dir.path(), wrong);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.error().message,
            "model-00001-of-00002.safetensors: tensor 'model.layers.0.mlp.gate_proj.weight' has "
            "shape [12, 8], expected [16, 8]");
  ModelConfig more_layers = c;
  more_layers.num_layers = 3;
  w = load_model_weights(dir.path(), more_layers);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.error().message,
            "model.safetensors.index.json: missing tensor 'model.layers.2.input_layernorm.weight' "
            "(expected shape [8])");
  std::filesystem::remove(dir.path() / "model-00002-of-00002.safetensors");
  w = load_model_weights(dir.path(), c);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.error().message.find("model.safetensors.index.json: shard "
                                   "'model-00002-of-00002.safetensors' (holding tensor '"),
            0u)
      << w.error().message;
}

TEST(Weights, MissingFilesAreErrors) {
  test::TempDir dir;
  auto w = load_model_weights(dir.path(), test::tiny_config());
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.error().message.find("no model.safetensors"), std::string::npos);
  test::write_file(dir.path() / "model.safetensors", "");
  w = load_model_weights(dir.path(), test::tiny_config());
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.error().message, (dir.path() / "model.safetensors").string() + ": file is empty");
}

}  // namespace
}  // namespace qs
