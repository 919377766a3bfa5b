// Whole-model conformance on the committed tiny models (models/test/*): the engine's Model
// gives the same logits on CUDA as on the CPU, through prefill (cuBLAS + flash prefill), decode
// and verification blocks, with the KV cache in each backend's memory, full precision and
// through the hierarchical cache's INT8 and INT4 views; with f32 and with f16 full-precision rows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "../engine/spec_rounds.h"
#include "../engine/tiny_model.h"
#include "backend/cuda/cuda_ops.h"
#include "cuda_test_util.h"
#include "engine/model.h"
#include "kv/kv_cache.h"
#include "model/config.h"
#include "model/weights.h"

namespace qs {
namespace {

using testing::CudaOpsTest;
using testing::rel_error;

// Small groups (G = 8): the 95-token run crosses many flushes.
KvCache make_cache(const ModelConfig& cfg, KvMode mode, int capacity, Backend& backend,
                   DType rows) {
  return testing::model_cache(cfg, mode, capacity, backend, /*group_size=*/8, /*max_gamma=*/7,
                              rows);
}

struct Step {
  int m;
};
constexpr Step kSteps[] = {{9}, {23}, {1}, {1}, {1}, {5}, {16}, {40}};

std::vector<int32_t> token_ids(int n, int vocab) {
  std::vector<int32_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = static_cast<int32_t>((i * 7919 + 17) % vocab);
  return ids;
}

class CudaModelTest : public CudaOpsTest, public ::testing::WithParamInterface<const char*> {
 protected:
  // Runs kSteps through the engine's Model on both backends, each with its own cache in `mode`
  // with full-precision rows of type `rows`.
  void check_logits(const char* model_name, KvMode mode, DType rows = DType::F32);
};

void CudaModelTest::check_logits(const char* model_name, KvMode mode, DType rows) {
  const std::filesystem::path dir =
      std::filesystem::path(QS_SOURCE_DIR) / "models/test" / model_name;
  auto cfg = load_model_config(dir);
  ASSERT_TRUE(cfg.ok()) << cfg.error().message;
  ASSERT_TRUE(CudaBackend::check_supported(*cfg).ok());
  auto weights = load_model_weights(dir, *cfg);
  ASSERT_TRUE(weights.ok()) << weights.error().message;
  ASSERT_TRUE(check_model(*cfg, *weights).ok());

  int total = 0;
  for (const Step& s : kSteps) total += s.m;
  const std::vector<int32_t> ids = token_ids(total, cfg->vocab_size);
  const int vocab = cfg->vocab_size;

  // The engine on the CPU is the reference.
  Model on_cpu(*cfg, *weights, cpu());
  Model on_gpu(*cfg, *weights, gpu());
  KvCache cpu_cache = make_cache(*cfg, mode, total, cpu(), rows);
  KvCache gpu_cache = make_cache(*cfg, mode, total, gpu(), rows);
  const ForwardPath path = mode == KvMode::kInt4 ? draft_path(mode) : target_path(mode);
  ForwardPath plain_path = path;
  plain_path.draft_weights = false;  // the original weights: this test is about the KV views

  int pos = 0;
  double worst = 0;
  for (const Step& s : kSteps) {
    std::span<const int32_t> chunk(ids.data() + pos, s.m);
    std::vector<float> cpu_logits(size_t(s.m) * vocab), gpu_logits(cpu_logits.size());
    ASSERT_TRUE(
        on_cpu.forward(chunk, pos, cpu_cache, plain_path, LogitRows::kAll, cpu_logits.data()).ok());
    ASSERT_TRUE(
        on_gpu.forward(chunk, pos, gpu_cache, plain_path, LogitRows::kAll, gpu_logits.data()).ok());
    cpu_cache.commit(pos + s.m);
    gpu_cache.commit(pos + s.m);
    const double err = rel_error(gpu_logits, cpu_logits);
    // Full precision: summation order only. Quantized views: the two backends quantize K/V rows
    // that differ by ~1e-6 (their own projections), so a value next to a rounding boundary gets
    // a neighbouring code (one INT8 step s/16, or one INT4 step s) on one side only; the
    // attention kernels themselves agree to ~1e-6 (tests/cuda/test_attention_quant.cpp). The
    // bounds are far below what a wrong view or flush gives (O(1)).
    // f16 rows: the two backends' K/V rows (~1e-6 apart) can round to neighbouring f16 values,
    // one f16 step (2^-11 relative) in a few elements.
    const bool f16 = rows == DType::F16;
    const double bound = mode == KvMode::kFp     ? (f16 ? 1e-3 : 1e-4)
                         : mode == KvMode::kInt8 ? (f16 ? 3e-3 : 2e-3)
                                                 : 3e-2;
    EXPECT_LT(err, bound) << model_name << " " << kv_mode_name(mode) << " pos=" << pos
                          << " m=" << s.m << (f16 ? " f16 rows" : "");
    worst = std::max(worst, err);
    pos += s.m;
  }
  std::printf("[ max rel error ] %s %s%s logits: %.3g\n", model_name, kv_mode_name(mode),
              rows == DType::F16 ? " (f16 rows)" : "", worst);
}

TEST_P(CudaModelTest, LogitsMatchCpuFullPrecisionKv) { check_logits(GetParam(), KvMode::kFp); }
TEST_P(CudaModelTest, LogitsMatchCpuInt8Kv) { check_logits(GetParam(), KvMode::kInt8); }
TEST_P(CudaModelTest, LogitsMatchCpuInt4Kv) { check_logits(GetParam(), KvMode::kInt4); }
TEST_P(CudaModelTest, LogitsMatchCpuFullPrecisionF16Rows) {
  check_logits(GetParam(), KvMode::kFp, DType::F16);
}
TEST_P(CudaModelTest, LogitsMatchCpuInt8KvF16Rows) {
  check_logits(GetParam(), KvMode::kInt8, DType::F16);
}

// Programmatic dependent launch (launch.cuh) lets a kernel start before the previous one ends;
// a kernel that touched memory before its pdl_begin() would race. The same steps with PDL on
// and off must give bit-identical logits (the kernels are deterministic): full-precision f16
// rows, the INT8 view and the draft (4-bit weights, INT4 view), across flushes.
TEST_P(CudaModelTest, ProgrammaticLaunchGivesIdenticalLogits) {
  const std::filesystem::path dir =
      std::filesystem::path(QS_SOURCE_DIR) / "models/test" / GetParam();
  auto cfg = load_model_config(dir);
  ASSERT_TRUE(cfg.ok()) << cfg.error().message;
  auto weights = load_model_weights(dir, *cfg);
  ASSERT_TRUE(weights.ok()) << weights.error().message;
  Model model(*cfg, *weights, gpu());
  ASSERT_TRUE(model.make_draft_weights(DraftWeights::kInt4).ok());
  int total = 0;
  for (const Step& s : kSteps) total += s.m;
  const std::vector<int32_t> ids = token_ids(total, cfg->vocab_size);
  const bool saved = cuda::pdl_enabled();
  for (KvMode mode : {KvMode::kFp, KvMode::kInt8, KvMode::kInt4}) {
    const ForwardPath path = mode == KvMode::kInt4 ? draft_path(mode) : target_path(mode);
    std::vector<float> runs[2];
    for (int r = 0; r < 2; ++r) {
      cuda::set_pdl_enabled(r == 0);
      KvCache cache = make_cache(*cfg, mode, total, gpu(), DType::F16);
      int pos = 0;
      for (const Step& s : kSteps) {
        std::vector<float> logits(size_t(s.m) * cfg->vocab_size);
        std::span<const int32_t> chunk(ids.data() + pos, s.m);
        ASSERT_TRUE(model.forward(chunk, pos, cache, path, LogitRows::kAll, logits.data()).ok());
        cache.commit(pos + s.m);
        runs[r].insert(runs[r].end(), logits.begin(), logits.end());
        pos += s.m;
      }
    }
    cuda::set_pdl_enabled(saved);
    ASSERT_EQ(runs[0].size(), runs[1].size());
    EXPECT_EQ(0, std::memcmp(runs[0].data(), runs[1].data(), runs[0].size() * sizeof(float)))
        << GetParam() << " " << kv_mode_name(mode);
  }
}

INSTANTIATE_TEST_SUITE_P(TinyModels, CudaModelTest,
                         ::testing::Values("llama2-tiny", "llama3-tiny", "mistral-tiny",
                                           "qwen2-tiny", "qwen2-yarn-tiny"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string name = info.param;
                           for (char& c : name) {
                             if (c == '-') c = '_';
                           }
                           return name;
                         });

// The chained round on the GPU (ids in device memory, the draft steps and the verification
// queued without a wait, one read-back per round) against the same forwards with each draft
// token copied back; f32 and f16 full-precision rows. Each run's Model makes its own 4-bit draft
// weights; the backend finds device copies by host address, so the second run's weights, where
// the first run's were, could take a same-sized stale copy of another matrix unless the first
// Model's end drops them (Model::~Model; the H200 run of session 38 accepted 0 of its drafted
// tokens with f16 rows, the H100 run and the CPU 125 of 202).
class CudaChainedRounds : public CudaOpsTest {
 protected:
  static testing::TinyModel model() {
    ModelConfig cfg = testing::tiny_config();
    cfg.hidden_size = 256;
    cfg.intermediate_size = 384;
    cfg.head_dim = 64;  // a head size the GPU kernels take (4 heads, 2 kv heads)
    cfg.max_position_embeddings = 4096;
    return testing::make_tiny_model(cfg, DType::BF16, 5);
  }
};

TEST_F(CudaChainedRounds, GreedyRoundsEqualStepwiseRounds) {
  const testing::TinyModel tiny = model();
  for (DType rows : {DType::F32, DType::F16}) {
    SCOPED_TRACE(dtype_name(rows));
    testing::expect_chained_rounds_equal_stepwise(tiny, gpu(), rows);
  }
}

// A Model's end frees the device copies of its 4-bit draft weights (Backend::forget_weights4):
// the backend's resident bytes fall back to the 16-bit weights' (whose host tensors live on in
// `tiny`), so a later Model's draft weights at the same host addresses upload afresh.
TEST_F(CudaChainedRounds, ModelEndFreesItsDraftWeightCopies) {
  const testing::TinyModel tiny = model();
  const std::vector<int32_t> ids = testing::random_prompt(40, tiny.cfg.vocab_size, 3);
  std::vector<float> logits(static_cast<size_t>(tiny.cfg.vocab_size));
  size_t target_only = 0, with_draft = 0;
  {
    Model m(tiny.cfg, tiny.weights, gpu());
    ASSERT_TRUE(m.make_draft_weights(DraftWeights::kInt4, 1).ok());
    for (KvMode mode : {KvMode::kFp, KvMode::kInt4}) {
      KvCache cache = make_cache(tiny.cfg, mode, 64, gpu(), DType::F32);
      const ForwardPath path = mode == KvMode::kInt4 ? draft_path(mode) : target_path(mode);
      ASSERT_TRUE(m.forward(ids, 0, cache, path, LogitRows::kLast, logits.data()).ok());
      (mode == KvMode::kFp ? target_only : with_draft) = gpu().resident_weight_bytes();
    }
  }
  EXPECT_GT(with_draft, target_only);
  EXPECT_EQ(gpu().resident_weight_bytes(), target_only);
}

// Sampling: the draws (sample_rows_into) and the verdict (speculative_verdict_into) on the GPU
// from device ids; the same uniforms give the same tokens as the stepwise round's.
TEST_F(CudaChainedRounds, SamplingRoundsEqualStepwiseRounds) {
  const testing::TinyModel tiny = model();
  SamplingParams sampling;
  sampling.temperature = 0.8f;
  sampling.top_k = 40;
  sampling.top_p = 0.95f;
  for (DType rows : {DType::F32, DType::F16}) {
    SCOPED_TRACE(dtype_name(rows));
    testing::expect_chained_rounds_equal_stepwise(tiny, gpu(), rows, sampling);
  }
}

}  // namespace
}  // namespace qs
