// Our CPU engine against Hugging Face transformers: logits and greedy continuations produced by
// tools/make_test_models.py from the committed tiny models (tests/data/golden/<model>/).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace qs {
namespace {

const std::string kRepo = QS_SOURCE_DIR;

// Reads a little-endian NumPy array of float32 or int32 (C order). Returns the shape.
template <class T>
std::vector<size_t> read_npy(const std::string& path, std::vector<T>& out) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << path;
  char magic[8];
  in.read(magic, 8);
  uint16_t header_len = 0;
  in.read(reinterpret_cast<char*>(&header_len), 2);
  std::string header(header_len, '\0');
  in.read(header.data(), header_len);
  const char* want = sizeof(T) == 4 && std::is_floating_point_v<T> ? "'<f4'" : "'<i4'";
  EXPECT_NE(header.find(want), std::string::npos) << path << ": " << header;
  std::vector<size_t> shape;
  size_t open = header.find('('), close = header.find(')');
  std::stringstream dims(header.substr(open + 1, close - open - 1));
  std::string d;
  size_t numel = 1;
  while (std::getline(dims, d, ','))
    if (d.find_first_not_of(' ') != std::string::npos) {
      shape.push_back(std::stoul(d));
      numel *= shape.back();
    }
  out.resize(numel);
  in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(numel * sizeof(T)));
  EXPECT_TRUE(in) << path << ": truncated";
  return shape;
}

class HfGolden : public ::testing::TestWithParam<std::string> {
 protected:
  std::string model_dir() const { return kRepo + "/models/test/" + GetParam(); }
  std::string golden(const std::string& file) const {
    return kRepo + "/tests/data/golden/" + GetParam() + "/" + file;
  }
};

TEST_P(HfGolden, LogitsMatchTransformers) {
  EngineOptions opts;
  opts.prefill_chunk = 128;  // the 300-token sequence crosses chunk boundaries
  auto engine = Engine::load(model_dir(), opts);
  ASSERT_TRUE(engine.ok()) << engine.error().message;
  for (int n : {40, 300}) {
    std::vector<int32_t> ids;
    std::vector<float> ref;
    read_npy(golden("ids_" + std::to_string(n) + ".npy"), ids);
    auto shape = read_npy(golden("logits_" + std::to_string(n) + ".npy"), ref);
    ASSERT_EQ(shape.size(), 2u);
    ASSERT_EQ(shape[0], static_cast<size_t>(n));
    auto logits = (*engine)->prefill_logits(ids);
    ASSERT_TRUE(logits.ok()) << logits.error().message;
    // A golden may keep only the first columns of the vocabulary (the 300-token one does).
    const size_t vocab = logits->size() / static_cast<size_t>(n), cols = shape[1];
    ASSERT_EQ(logits->size(), vocab * static_cast<size_t>(n));
    ASSERT_LE(cols, vocab);
    float max_ref = 0, max_err = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const float got = (*logits)[(i / cols) * vocab + i % cols];
      max_ref = std::max(max_ref, std::fabs(ref[i]));
      max_err = std::max(max_err, std::fabs(got - ref[i]));
    }
    EXPECT_LE(max_err, 1e-4f * max_ref) << GetParam() << " n=" << n << " max|err| " << max_err
                                        << " max|ref| " << max_ref;
  }
}

TEST_P(HfGolden, GreedyContinuationMatchesTransformers) {
  auto engine = Engine::load(model_dir(), EngineOptions{});
  ASSERT_TRUE(engine.ok()) << engine.error().message;
  std::ifstream in(golden("greedy.json"));
  auto g = nlohmann::json::parse(in);
  std::vector<int32_t> prompt = g["prompt_ids"].get<std::vector<int32_t>>();
  std::vector<int32_t> want = g["greedy_ids"].get<std::vector<int32_t>>();
  GenerationParams params;
  params.max_new_tokens = static_cast<int>(want.size());
  params.stop_at_eos = false;
  auto result = (*engine)->generate(prompt, params, {});
  ASSERT_TRUE(result.ok()) << result.error().message;
  EXPECT_EQ(result->tokens, want);
}

INSTANTIATE_TEST_SUITE_P(Models, HfGolden,
                         ::testing::Values("llama3-tiny", "llama2-tiny", "mistral-tiny",
                                           "qwen2-tiny", "qwen2-yarn-tiny"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s)
                             if (c == '-') c = '_';
                           return s;
                         });

}  // namespace
}  // namespace qs
