// Tensor parallelism over CUDA devices (--tp N --device cuda, docs/multi-gpu.md): NCCL
// communicators, one rank per GPU. On the bundled trained model (6 query / 2 kv heads, so
// --tp 2), the sharded engine gives the one-GPU engine's prefill logits (summation order only)
// and its greedy tokens in AR fp, AR int8 and QuantSpec, twice in a row (the ranks stay in
// lockstep across generations). Skipped with fewer than 2 devices; a build without NCCL must
// say so in the error.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "cuda_test_util.h"
#include "engine/engine.h"

namespace qs {
namespace {

std::unique_ptr<Engine> load(DecodeMode mode, KvType kv, int tp, std::string* error) {
  EngineOptions o;
  o.device = Device::kCuda;
  o.tensor_parallel = tp;
  o.prefill_matmul = PrefillMatmul::kExact;  // f32-level: the ranks' partial sums compared
  o.mode = mode;
  o.kv = kv;
  o.kv_explicit = kv != KvType::kFp16;
  o.group_size = 32;
  o.max_context = 1024;
  o.prefill_chunk = 128;
  auto made = Engine::load(std::filesystem::path(QS_SOURCE_DIR) / "models/default", o);
  if (!made.ok()) {
    *error = made.error().message;
    return nullptr;
  }
  return std::move(made).value();
}

TEST(CudaTensorParallel, TwoGpusGiveOneGpusLogitsAndTokens) {
  if (cuda_device_count() < 2) GTEST_SKIP() << "fewer than 2 CUDA devices";
  const struct {
    const char* name;
    DecodeMode mode;
    KvType kv;
  } cases[] = {{"ar_fp", DecodeMode::kAr, KvType::kFp16},
               {"ar_int8", DecodeMode::kAr, KvType::kInt8},
               {"quantspec", DecodeMode::kQuantSpec, KvType::kFp16}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    std::string err;
    std::unique_ptr<Engine> one = load(c.mode, c.kv, 1, &err);
    ASSERT_TRUE(one) << err;
    std::unique_ptr<Engine> two = load(c.mode, c.kv, 2, &err);
    if (!two && err.find("NCCL") != std::string::npos) GTEST_SKIP() << err;
    ASSERT_TRUE(two) << err;
    std::vector<int32_t> prompt;
    for (int i = 0; i < 300; ++i) prompt.push_back(1 + (i * 7919) % 1000);
    if (c.mode == DecodeMode::kAr) {
      auto a = one->prefill_logits(prompt, 16);
      auto b = two->prefill_logits(prompt, 16);
      ASSERT_TRUE(a.ok() && b.ok());
      const double e = testing::rel_error(*b, *a);
      EXPECT_LT(e, 1e-4);
      std::printf("[ max rel error ] tp 2 vs 1, %s prefill logits: %.3g\n", c.name, e);
    }
    GenerationParams params;
    params.max_new_tokens = 64;
    params.stop_at_eos = false;
    for (int rep = 0; rep < 2; ++rep) {
      auto want = one->generate(prompt, params, {});
      auto got = two->generate(prompt, params, {});
      ASSERT_TRUE(want.ok()) << want.error().message;
      ASSERT_TRUE(got.ok()) << got.error().message;
      EXPECT_EQ(got->tokens, want->tokens) << "generation " << rep;
    }
  }
}

}  // namespace
}  // namespace qs
