#include "model/config.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "model_test_util.h"

namespace qs {
namespace {

using json = nlohmann::json;

// Hyper-parameters as published for Llama-3.1-8B (only the numbers; no weights).
json llama31_config() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu", "hidden_size": 4096,
    "intermediate_size": 14336, "max_position_embeddings": 131072, "mlp_bias": false,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "use_cache": true, "vocab_size": 128256})");
}

Result<ModelConfig> parse(const json& j) {
  return parse_model_config(j.dump(), "config.json");
}

std::string error_of(const json& j) {
  auto r = parse(j);
  EXPECT_FALSE(r.ok()) << "accepted " << j.dump();
  return r.ok() ? "" : r.error().message;
}

TEST(Config, Llama31WithLlama3RopeScaling) {
  auto c = parse(llama31_config());
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->arch, Architecture::Llama);
  EXPECT_STREQ(architecture_name(c->arch), "LlamaForCausalLM");
  EXPECT_EQ(c->vocab_size, 128256);
  EXPECT_EQ(c->hidden_size, 4096);
  EXPECT_EQ(c->intermediate_size, 14336);
  EXPECT_EQ(c->num_layers, 32);
  EXPECT_EQ(c->num_heads, 32);
  EXPECT_EQ(c->num_kv_heads, 8);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->q_dim(), 4096);
  EXPECT_EQ(c->kv_dim(), 1024);
  EXPECT_EQ(c->max_position_embeddings, 131072);
  EXPECT_FLOAT_EQ(c->rope_theta, 500000.0f);
  EXPECT_FLOAT_EQ(c->rms_norm_eps, 1e-5f);
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::Llama3);
  EXPECT_FLOAT_EQ(c->rope_scaling.factor, 8.0f);
  EXPECT_FLOAT_EQ(c->rope_scaling.low_freq_factor, 1.0f);
  EXPECT_FLOAT_EQ(c->rope_scaling.high_freq_factor, 4.0f);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_EQ(c->sliding_window, 0);
  EXPECT_EQ(c->torch_dtype, "bfloat16");
  EXPECT_EQ(c->bos_token_id, 128000);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int>{128001, 128008, 128009}));
}

TEST(Config, Llama2DefaultsAndNullRopeScaling) {
  json j = json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 11008,
    "max_position_embeddings": 4096, "model_type": "llama", "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 32, "rms_norm_eps": 1e-05,
    "rope_scaling": null, "tie_word_embeddings": false, "torch_dtype": "float16",
    "vocab_size": 32000})");
  auto c = parse(j);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::None);
  EXPECT_FLOAT_EQ(c->rope_theta, 10000.0f);
  EXPECT_EQ(c->num_kv_heads, 32);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int>{2}));

  // Absent optional fields take transformers' defaults.
  for (const char* k : {"num_key_value_heads", "rms_norm_eps", "max_position_embeddings",
                        "tie_word_embeddings", "bos_token_id", "eos_token_id", "rope_scaling"}) {
    j.erase(k);
  }
  auto d = parse(j);
  ASSERT_TRUE(d.ok()) << d.error().message;
  EXPECT_EQ(d->num_kv_heads, 32);
  EXPECT_FLOAT_EQ(d->rms_norm_eps, 1e-6f);
  EXPECT_EQ(d->max_position_embeddings, 2048);
  EXPECT_FALSE(d->tie_word_embeddings);
  EXPECT_EQ(d->bos_token_id, -1);
  EXPECT_TRUE(d->eos_token_ids.empty());
}

TEST(Config, LinearRopeScalingInBothSpellings) {
  json j = llama31_config();
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 4.0}};
  auto c = parse(j);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::Linear);
  EXPECT_FLOAT_EQ(c->rope_scaling.factor, 4.0f);
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2}};
  c = parse(j);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_FLOAT_EQ(c->rope_scaling.factor, 2.0f);
  j["rope_scaling"] = {{"rope_type", "default"}};
  c = parse(j);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::None);
  EXPECT_TRUE(c->warnings.empty());
}

// A scaling factor without a type runs the default RoPE, as in transformers, which warns too.
TEST(Config, RopeKeysTheDefaultTypeIgnoresAreWarned) {
  json j = llama31_config();
  j["rope_scaling"] = {{"factor", 4.0}};
  auto c = parse(j);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::None);
  ASSERT_EQ(c->warnings.size(), 1u);
  EXPECT_EQ(c->warnings[0],
            "config.json: rope_scaling: no 'rope_type' (or 'type'), so the default RoPE is used "
            "and factor ignored");
  j["rope_scaling"] = {{"type", "default"}, {"factor", 4.0}, {"low_freq_factor", 1.0}};
  c = parse(j);
  ASSERT_TRUE(c.ok()) << c.error().message;
  ASSERT_EQ(c->warnings.size(), 1u);
  EXPECT_EQ(c->warnings[0],
            "config.json: rope_scaling: rope type 'default' ignores factor, low_freq_factor");
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2}};
  c = parse(j);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_TRUE(c->warnings.empty());
}

TEST(Config, TransformersV5RopeParameters) {
  // Llama-3.2-1B shaped, in the v5 layout: rope_theta inside rope_parameters, "dtype".
  json j = json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "hidden_size": 2048, "intermediate_size": 8192,
    "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
    "head_dim": 64, "vocab_size": 128256, "tie_word_embeddings": true, "dtype": "bfloat16",
    "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 8192}})");
  auto c = parse(j);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_FLOAT_EQ(c->rope_theta, 500000.0f);
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::Llama3);
  EXPECT_FLOAT_EQ(c->rope_scaling.factor, 32.0f);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->torch_dtype, "bfloat16");

  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}};
  c = parse(j);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::None);
  EXPECT_FLOAT_EQ(c->rope_theta, 1e6f);

  j["rope_parameters"] = {{"rope_type", "longrope"}, {"rope_theta", 1e6}, {"factor", 4.0}};
  EXPECT_EQ(error_of(j),
            "config.json: rope_parameters: unsupported rope type 'longrope' (supported: "
            "default, linear, llama3, yarn)");
}

// YaRN as Qwen2.5's 128K configs spell it (legacy rope_scaling, "type"), and the v5 layout with
// the keys transformers reads: explicit attention_factor, mscale / mscale_all_dim, betas, truncate,
// and the defaults (original_max_position_embeddings = max_position_embeddings, factor = their
// ratio, attention_factor = 0.1 ln(factor) + 1).
TEST(Config, YarnRope) {
  json j = llama31_config();
  j.erase("rope_scaling");
  j["max_position_embeddings"] = 32768;
  j["rope_scaling"] = {
      {"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
  auto c = parse(j);
  ASSERT_TRUE(c.ok()) << c.error().message;
  const RopeScaling& s = c->rope_scaling;
  EXPECT_EQ(s.type, RopeScalingType::Yarn);
  EXPECT_FLOAT_EQ(s.factor, 4.0f);
  EXPECT_EQ(s.original_max_position_embeddings, 32768);
  EXPECT_EQ(s.beta_fast, 32.0);
  EXPECT_EQ(s.beta_slow, 1.0);
  EXPECT_TRUE(s.truncate);
  EXPECT_DOUBLE_EQ(s.attention_factor, 0.1 * std::log(4.0) + 1.0);
  EXPECT_FLOAT_EQ(c->attention_scale(),
                  static_cast<float>(s.attention_factor * s.attention_factor / std::sqrt(128.0)));

  j.erase("rope_scaling");
  j["max_position_embeddings"] = 131072;
  j["rope_parameters"] = {
      {"rope_type", "yarn"},      {"rope_theta", 1e6}, {"original_max_position_embeddings", 8192},
      {"attention_factor", 1.25}, {"beta_fast", 16},   {"beta_slow", 2},
      {"truncate", false}};
  c = parse(j);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_FLOAT_EQ(c->rope_scaling.factor, 16.0f);  // 131072 / 8192
  EXPECT_EQ(c->rope_scaling.beta_fast, 16.0);
  EXPECT_EQ(c->rope_scaling.beta_slow, 2.0);
  EXPECT_FALSE(c->rope_scaling.truncate);
  EXPECT_EQ(c->rope_scaling.attention_factor, 1.25);

  j["rope_parameters"] = {
      {"rope_type", "yarn"}, {"factor", 40.0}, {"mscale", 1.0}, {"mscale_all_dim", 0.707}};
  c = parse(j);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 131072);
  EXPECT_DOUBLE_EQ(c->rope_scaling.attention_factor,
                   (0.1 * std::log(40.0) + 1.0) / (0.1 * 0.707 * std::log(40.0) + 1.0));

  j["rope_parameters"] = {
      {"rope_type", "yarn"}, {"factor", 4.0}, {"beta_fast", 1}, {"beta_slow", 2}};
  EXPECT_EQ(error_of(j), "config.json: rope_parameters: beta_fast (1) must exceed beta_slow (2)");
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"attention_factor", 0}};
  EXPECT_EQ(error_of(j),
            "config.json: rope_parameters: field 'attention_factor' must be a positive number, "
            "got 0");
}

TEST(Config, MistralSlidingWindow) {
  json j = json::parse(R"({
    "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": false,
    "torch_dtype": "bfloat16", "vocab_size": 32000})");
  auto c = parse(j);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->arch, Architecture::Mistral);
  EXPECT_STREQ(architecture_name(c->arch), "MistralForCausalLM");
  EXPECT_EQ(c->sliding_window, 4096);
  EXPECT_FALSE(c->attention_bias);
  j["sliding_window"] = nullptr;
  c = parse(j);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->sliding_window, 0);
  j["sliding_window"] = -5;
  EXPECT_EQ(error_of(j),
            "config.json: field 'sliding_window' must be an integer in [0, 2147483647], got -5");
}

TEST(Config, Qwen2BiasTiedAndSlidingWindowOff) {
  json j = json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "bos_token_id": 151643, "eos_token_id": 151643,
    "hidden_act": "silu", "hidden_size": 896, "intermediate_size": 4864,
    "max_position_embeddings": 131072, "max_window_layers": 24, "model_type": "qwen2",
    "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 131072,
    "tie_word_embeddings": true, "torch_dtype": "bfloat16", "use_sliding_window": false,
    "vocab_size": 151936})");
  auto c = parse(j);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->arch, Architecture::Qwen2);
  EXPECT_STREQ(architecture_name(c->arch), "Qwen2ForCausalLM");
  EXPECT_TRUE(c->attention_bias);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->sliding_window, 0);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->kv_dim(), 128);
  EXPECT_FLOAT_EQ(c->rope_theta, 1e6f);

  j["use_sliding_window"] = true;
  j["max_window_layers"] = 0;  // every layer
  j["sliding_window"] = 4096;
  c = parse(j);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->sliding_window, 4096);
  j["max_window_layers"] = 24;  // no layer
  c = parse(j);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->sliding_window, 0);
  j["max_window_layers"] = 12;
  EXPECT_EQ(error_of(j),
            "config.json: a sliding window on layers >= max_window_layers (12) only "
            "is not supported");
}

TEST(Config, ArchitectureFromModelTypeAndAttentionBias) {
  json j = llama31_config();
  j.erase("architectures");
  j["model_type"] = "qwen2";
  auto c = parse(j);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->arch, Architecture::Qwen2);
  j["model_type"] = "mistral";
  EXPECT_EQ(parse(j)->arch, Architecture::Mistral);
  j["model_type"] = "llama";
  j["attention_bias"] = true;
  c = parse(j);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->arch, Architecture::Llama);
  EXPECT_TRUE(c->attention_bias);
  j["model_type"] = "gpt2";
  EXPECT_EQ(error_of(j),
            "config.json: unsupported model_type 'gpt2' (supported: llama, mistral, qwen2)");
  j.erase("model_type");
  EXPECT_EQ(error_of(j),
            "config.json: no 'architectures' or 'model_type' field (supported: "
            "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM)");
}

TEST(Config, HeadDimFromConfigOrNull) {
  json j = llama31_config();
  j["head_dim"] = 256;  // larger than hidden / heads (as in some models)
  auto c = parse(j);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->head_dim, 256);
  EXPECT_EQ(c->q_dim(), 8192);
  j["head_dim"] = nullptr;
  EXPECT_EQ(parse(j)->head_dim, 128);
}

TEST(Config, Errors) {
  EXPECT_EQ(parse_model_config("{not json", "config.json")
                .error()
                .message.find("config.json: invalid JSON: "),
            0u);
  EXPECT_EQ(parse_model_config("[1]", "config.json").error().message,
            "config.json: expected a JSON object");

  json j = llama31_config();
  j["architectures"] = {"GPT2LMHeadModel"};
  EXPECT_EQ(error_of(j),
            "config.json: unsupported architecture 'GPT2LMHeadModel' (supported: "
            "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM)");

  auto with = [](const char* key, json value) {
    json j = llama31_config();
    if (value.is_discarded()) {
      j.erase(key);
    } else {
      j[key] = value;
    }
    return error_of(j);
  };
  const json absent = json(json::value_t::discarded);
  EXPECT_EQ(with("hidden_size", absent), "config.json: missing field 'hidden_size'");
  EXPECT_EQ(with("hidden_size", 0),
            "config.json: field 'hidden_size' must be an integer in [1, 2147483647], got 0");
  EXPECT_EQ(with("vocab_size", -3),
            "config.json: field 'vocab_size' must be an integer in [1, 2147483647], got -3");
  EXPECT_EQ(with("num_hidden_layers", "32"),
            "config.json: field 'num_hidden_layers' must be an integer, got \"32\"");
  EXPECT_EQ(with("intermediate_size", 1e20),
            "config.json: field 'intermediate_size' must be an integer, got 1e+20");
  EXPECT_EQ(with("num_attention_heads", 4294967296ull),
            "config.json: field 'num_attention_heads' must be an integer in [1, 2147483647], got "
            "4294967296");
  EXPECT_EQ(with("num_key_value_heads", 5),
            "config.json: num_attention_heads (32) must be a multiple of num_key_value_heads (5)");
  EXPECT_EQ(with("num_attention_heads", 36),
            "config.json: num_attention_heads (36) must be a multiple of num_key_value_heads (8)");
  EXPECT_EQ(with("head_dim", 63), "config.json: head_dim (63) must be even for rotary embeddings");
  EXPECT_EQ(with("hidden_size", 4100),
            "config.json: hidden_size (4100) must be a multiple of num_attention_heads (32) when "
            "head_dim is not given");
  EXPECT_EQ(with("rms_norm_eps", -1.0),
            "config.json: field 'rms_norm_eps' must be a positive number, got -1.0");
  EXPECT_EQ(with("rope_theta", 0),
            "config.json: field 'rope_theta' must be a positive number, got 0");
  EXPECT_EQ(with("rope_theta", 1e-300),
            "config.json: field 'rope_theta' must be a positive number a float holds (>= "
            "1.17549e-38), got 1e-300");
  EXPECT_EQ(with("tie_word_embeddings", 1),
            "config.json: field 'tie_word_embeddings' must be true or false, got 1");
  EXPECT_EQ(
      with("eos_token_id", json::array({1, "x"})),
      "config.json: field 'eos_token_id' must be a token id or a list of them, got [1,\"x\"]");
  EXPECT_EQ(with("hidden_act", "gelu"),
            "config.json: field 'hidden_act' is 'gelu'; only 'silu' is supported");
  EXPECT_EQ(with("mlp_bias", true),
            "config.json: field 'mlp_bias' is true; MLP biases are not supported");
  EXPECT_EQ(with("quantization_config", {{"quant_method", "gptq"}}),
            "config.json: quantized checkpoints (quantization_config) are not supported; use the "
            "fp16/bf16 model");

  EXPECT_EQ(with("rope_scaling", {{"type", "dynamic"}, {"factor", 2.0}}),
            "config.json: rope_scaling: unsupported rope type 'dynamic' (supported: default, "
            "linear, llama3, yarn)");
  EXPECT_EQ(with("rope_scaling", {{"rope_type", "longrope"}}),
            "config.json: rope_scaling: unsupported rope type 'longrope' (supported: default, "
            "linear, llama3, yarn)");
  EXPECT_EQ(with("rope_scaling", {{"rope_type", "linear"}}),
            "config.json: rope_scaling: missing field 'factor'");
  EXPECT_EQ(with("rope_scaling", {{"rope_type", "linear"}, {"factor", 0}}),
            "config.json: rope_scaling: field 'factor' must be a positive number, got 0");
  EXPECT_EQ(with("rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}}),
            "config.json: rope_scaling: missing field 'low_freq_factor'");
  EXPECT_EQ(with("rope_scaling", {{"rope_type", "llama3"},
                                  {"factor", 8.0},
                                  {"low_freq_factor", 4.0},
                                  {"high_freq_factor", 4.0},
                                  {"original_max_position_embeddings", 8192}}),
            "config.json: rope_scaling: high_freq_factor (4) must exceed low_freq_factor (4)");
  EXPECT_EQ(with("rope_scaling", "linear"),
            "config.json: field 'rope_scaling' must be an object or null");
}

TEST(Config, LoadFromDirectoryWithGenerationConfigOverride) {
  test::TempDir dir;
  auto missing = load_model_config(dir.path());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().message, (dir.path() / "config.json").string() + ": no such file");
  auto no_dir = load_model_config(dir.path() / "nope");
  ASSERT_FALSE(no_dir.ok());
  EXPECT_EQ(no_dir.error().message,
            (dir.path() / "nope").string() + ": model directory does not exist");

  test::write_file(dir.path() / "config.json", llama31_config().dump());
  auto c = load_model_config(dir.path());
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->eos_token_ids.size(), 3u);

  test::write_file(dir.path() / "generation_config.json",
                   R"({"bos_token_id": 7, "eos_token_id": 9, "do_sample": true})");
  c = load_model_config(dir.path());
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->bos_token_id, 7);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int>{9}));

  // Fields the generation config leaves out keep config.json's values.
  test::write_file(dir.path() / "generation_config.json", R"({"eos_token_id": [5, 6]})");
  c = load_model_config(dir.path());
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->bos_token_id, 128000);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int>{5, 6}));

  test::write_file(dir.path() / "generation_config.json", "{oops");
  c = load_model_config(dir.path());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().message.find("generation_config.json: invalid JSON"), 0u);

  std::filesystem::remove(dir.path() / "generation_config.json");
  std::filesystem::create_directory(dir.path() / "generation_config.json");
  c = load_model_config(dir.path());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().message,
            (dir.path() / "generation_config.json").string() + ": is a directory, expected a file");

  test::write_file(dir.path() / "config.json", "");
  c = load_model_config(dir.path());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().message.find("config.json: invalid JSON"), 0u);
}

}  // namespace
}  // namespace qs
