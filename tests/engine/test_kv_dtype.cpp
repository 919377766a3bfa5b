// EngineOptions::kv_dtype (--kv-dtype): the full-precision KV rows as f16 on the CPU. Every mode
// runs with them and every cache the engine builds takes them (also the ranks of tensor
// parallelism); the speculative invariants hold with f16 rows as with f32 (greedy QuantSpec =
// greedy AR INT8, greedy sparse drafts = greedy AR fp, both with the same row type); f16 rows
// change the logits by f16 rounding only; auto is f32 on the CPU and f16 on CUDA.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "engine/llm_engine.h"
#include "tiny_model.h"

namespace qs {
namespace {

using testing::greedy_params;
using testing::random_prompt;
using testing::TinyModel;

ModelConfig config() {
  ModelConfig cfg = testing::tiny_config();
  cfg.vocab_size = 97;
  cfg.max_position_embeddings = 4096;
  return cfg;
}

std::unique_ptr<LlmEngine> make_engine(const TinyModel& tiny, EngineOptions o) {
  return testing::make_tiny_engine(tiny, o);
}

EngineOptions options(DecodeMode mode, KvType kv, KvDType rows, int group = 32, int gamma = 0) {
  EngineOptions o = testing::mode_options(mode, kv);
  o.kv_dtype = rows;
  o.group_size = group;
  o.gamma = gamma;
  return o;
}

TEST(KvDType, AutoIsF32OnTheCpuAndF16OnCuda) {
  EngineOptions o;
  EXPECT_EQ(resolve_kv_dtype(o), KvDType::kF32);
  o.device = Device::kCuda;
  EXPECT_EQ(resolve_kv_dtype(o), KvDType::kF16);
  o.kv_dtype = KvDType::kF32;
  EXPECT_EQ(resolve_kv_dtype(o), KvDType::kF32);
  o.device = Device::kCpu;
  o.kv_dtype = KvDType::kF16;
  EXPECT_EQ(resolve_kv_dtype(o), KvDType::kF16);
  EXPECT_STREQ(kv_dtype_name(KvDType::kAuto), "auto");
  EXPECT_STREQ(kv_dtype_name(KvDType::kF32), "f32");
  EXPECT_STREQ(kv_dtype_name(KvDType::kF16), "f16");
  // The default engine on the CPU keeps the f32 reference.
  const TinyModel tiny = testing::make_tiny_model(config(), DType::BF16, 40);
  auto e = make_engine(tiny, EngineOptions{});
  ASSERT_TRUE(e);
  EXPECT_EQ(e->cache().row_dtype(), DType::F32);
}

// The GPU's defaults are what users of HF transformers / vLLM run: f16 rows (above) and bf16
// prefill matmuls; decoding and the CPU reference keep f32-level arithmetic.
TEST(EngineDefaults, GpuPrefillIsBf16) {
  const EngineOptions o;
  EXPECT_EQ(o.prefill_matmul, PrefillMatmul::kBf16);
  EXPECT_STREQ(prefill_matmul_name(o.prefill_matmul), "bf16");
  EXPECT_EQ(o.draft_attention, AttentionOperands::kF16);
  EXPECT_EQ(o.target_attention, AttentionOperands::kF16);
}

// Every AR cache and QuantSpec run with f16 rows; the caches hold f16 rows (half the buffer
// bytes); the f16 logits are close to the f32 ones but not equal (the rounding is really there).
TEST(KvDType, F16RowsRunEveryCacheAndHalveTheBuffer) {
  const TinyModel tiny = testing::make_tiny_model(config(), DType::BF16, 41);
  const std::vector<int32_t> prompt = random_prompt(150, 97, 1);
  const struct {
    DecodeMode mode;
    KvType kv;
  } cases[] = {{DecodeMode::kAr, KvType::kFp16},
               {DecodeMode::kAr, KvType::kInt8},
               {DecodeMode::kAr, KvType::kInt4},
               {DecodeMode::kQuantSpec, KvType::kFp16}};
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(decode_mode_name(c.mode)) + " " + kv_type_name(c.kv));
    auto f16 = make_engine(tiny, options(c.mode, c.kv, KvDType::kF16));
    auto f32 = make_engine(tiny, options(c.mode, c.kv, KvDType::kF32));
    ASSERT_TRUE(f16 && f32);
    EXPECT_EQ(f16->cache().row_dtype(), DType::F16);
    EXPECT_EQ(f32->cache().row_dtype(), DType::F32);
    const QuantizedPlanes* planes = f16->cache().planes();
    const size_t plane_bytes = planes ? static_cast<size_t>(planes->shape().total_bytes()) : 0;
    EXPECT_EQ(2 * (f16->kv_cache_bytes() - plane_bytes), f32->kv_cache_bytes() - plane_bytes);
    auto got = f16->generate(prompt, greedy_params(80), nullptr);
    ASSERT_TRUE(got.ok()) << got.error().message;
    EXPECT_EQ(got->tokens.size(), 80u);
    auto again = f32->generate(prompt, greedy_params(80), nullptr);
    ASSERT_TRUE(again.ok());
    EXPECT_GT(got->stats.target_kv_fp_bytes, 0);
    if (c.mode == DecodeMode::kAr) {
      // The same positions on both: the KV bytes read per step count 2-byte rows.
      EXPECT_EQ(2 * f16->kv_cache_bytes() - plane_bytes, f32->kv_cache_bytes());
      EXPECT_NEAR(2 * got->stats.target_kv_fp_bytes, again->stats.target_kv_fp_bytes,
                  1e-9 * again->stats.target_kv_fp_bytes);
    }
    if (c.mode == DecodeMode::kAr) {
      auto l16 = f16->sequence_logits(prompt);
      auto l32 = f32->sequence_logits(prompt);
      ASSERT_TRUE(l16.ok() && l32.ok());
      double max_abs = 0, max_diff = 0;
      for (size_t i = 0; i < l32->size(); ++i) {
        max_abs = std::max(max_abs, double(std::fabs((*l32)[i])));
        max_diff = std::max(max_diff, double(std::fabs((*l16)[i] - (*l32)[i])));
      }
      EXPECT_GT(max_diff, 0.0);             // the rows really are f16
      EXPECT_LT(max_diff, 1e-2 * max_abs);  // and only rounded
    }
  }
}

// DESIGN §3's invariant does not depend on the row type: with f16 rows on both sides, greedy
// QuantSpec is greedy AR over the INT8 view token for token, and a sparse-KV draft (SnapKV copies
// the f16 keys to the host for its selection) gives greedy AR over the full-precision cache.
TEST(KvDType, GreedySpeculationEqualsGreedyArWithF16Rows) {
  const TinyModel tiny = testing::make_tiny_model(config(), DType::BF16, 42);
  auto ar8 = make_engine(tiny, options(DecodeMode::kAr, KvType::kInt8, KvDType::kF16));
  auto arfp = make_engine(tiny, options(DecodeMode::kAr, KvType::kFp16, KvDType::kF16));
  ASSERT_TRUE(ar8 && arfp);
  int index = 0;
  for (int gamma : {1, 4, 7}) {
    auto spec =
        make_engine(tiny, options(DecodeMode::kQuantSpec, KvType::kFp16, KvDType::kF16, 32, gamma));
    ASSERT_TRUE(spec);
    for (int len : {1, 69, 200}) {
      const std::vector<int32_t> prompt = random_prompt(len, 97, 300 + index++);
      auto want = ar8->generate(prompt, greedy_params(130), nullptr);
      auto got = spec->generate(prompt, greedy_params(130), nullptr);
      ASSERT_TRUE(want.ok() && got.ok());
      ASSERT_EQ(got->tokens, want->tokens) << "gamma " << gamma << " len " << len;
      EXPECT_GT(got->stats.rounds, 0);
      EXPECT_GT(got->stats.flushes, 0);
    }
  }
  for (DecodeMode mode : {DecodeMode::kStreamingLlm, DecodeMode::kSnapKv}) {
    EngineOptions o = options(mode, KvType::kFp16, KvDType::kF16);
    o.gamma = 5;
    o.draft_budget = 0.2;
    o.snap_window = 8;
    o.prefill_chunk = 37;
    auto sparse = make_engine(tiny, o);
    ASSERT_TRUE(sparse);
    EXPECT_EQ(sparse->cache().row_dtype(), DType::F16);
    for (int len : {60, 150}) {
      const std::vector<int32_t> prompt = random_prompt(len, 97, 400 + len);
      auto want = arfp->generate(prompt, greedy_params(70), nullptr);
      auto got = sparse->generate(prompt, greedy_params(70), nullptr);
      ASSERT_TRUE(want.ok() && got.ok());
      EXPECT_EQ(got->tokens, want->tokens) << decode_mode_name(mode) << " len " << len;
      EXPECT_GT(got->stats.rounds, 0);
    }
  }
}

// Tensor parallelism: every rank's cache takes the row type (the summed bytes halve) and the
// ranks together give one rank's tokens.
TEST(KvDType, TensorParallelRanksTakeTheRowType) {
  const TinyModel tiny = testing::make_tiny_model(config(), DType::BF16, 43);
  const std::vector<int32_t> prompt = random_prompt(50, 97, 2);
  for (DecodeMode mode : {DecodeMode::kAr, DecodeMode::kQuantSpec}) {
    EngineOptions o = options(mode, KvType::kFp16, KvDType::kF16);
    o.num_threads = 2;
    auto one = make_engine(tiny, o);
    o.tensor_parallel = 2;
    auto two = make_engine(tiny, o);
    o.kv_dtype = KvDType::kF32;
    auto two32 = make_engine(tiny, o);
    ASSERT_TRUE(one && two && two32);
    const QuantizedPlanes* planes = two->cache().planes();
    const size_t plane_bytes = planes ? 2 * static_cast<size_t>(planes->shape().total_bytes()) : 0;
    EXPECT_EQ(2 * (two->kv_cache_bytes() - plane_bytes), two32->kv_cache_bytes() - plane_bytes)
        << decode_mode_name(mode);
    auto want = one->generate(prompt, greedy_params(40), nullptr);
    auto got = two->generate(prompt, greedy_params(40), nullptr);
    ASSERT_TRUE(want.ok() && got.ok());
    EXPECT_EQ(got->tokens, want->tokens) << decode_mode_name(mode);
    EXPECT_EQ(two->kv_cache_bytes(), one->kv_cache_bytes());
  }
}

}  // namespace
}  // namespace qs
