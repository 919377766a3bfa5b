// SnapKV's observation scores on CUDA (Backend::snapkv_scores, snapkv.cu) against the CPU
// reference: head_dim 32/64/128/256, GQA groups 1/3/4/8, f32 and f16 rows, padded row strides,
// prompt lengths around the kernels' 64-key chunks, windows 1..32, candidates up to
// prompt_len (past the window's start: the causal edge); and the CUDA engine's SnapKV selection
// against the CPU engine's on the bundled trained model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "cuda_test_util.h"
#include "engine/llm_engine.h"
#include "model/config.h"
#include "model/weights.h"

namespace qs {
namespace {

using testing::CudaOpsTest;
using testing::DeviceArray;
using testing::DeviceBytes;
using testing::random_normal;
using testing::rel_error;

struct SnapCase {
  int heads, kv_heads, head_dim;
  int prompt_len, window, past;
  DType rows = DType::F32;
  int row_pad = 0;  // elements after the kv heads in each row (a multiple of 4)
};

std::string describe(const SnapCase& c) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "heads=%d/%d hd=%d len=%d window=%d past=%d rows=%s pad=%d",
                c.heads, c.kv_heads, c.head_dim, c.prompt_len, c.window, c.past, dtype_name(c.rows),
                c.row_pad);
  return buf;
}

// The CUDA scores and the CPU's of one case: ||gpu - cpu|| / ||cpu||.
double run(CudaBackend& gpu, CpuBackend& cpu, const SnapCase& c, uint64_t seed) {
  const int64_t row_stride = static_cast<int64_t>(c.kv_heads) * c.head_dim + c.row_pad;
  // Keys rounded to f16 values: f32 and f16 rows then hold the same numbers. Queries with a
  // larger spread than the keys: peaked softmaxes as well as flat ones.
  std::vector<float> k = random_normal(static_cast<size_t>(c.prompt_len) * row_stride, seed);
  std::vector<uint16_t> k16(k.size());
  for (size_t i = 0; i < k.size(); ++i) {
    k16[i] = f32_to_f16(k[i]);
    k[i] = f16_to_f32(k16[i]);
  }
  const std::vector<float> q = random_normal(static_cast<size_t>(c.window) * c.heads * c.head_dim,
                                             seed + 1, /*stddev=*/2.0f);
  const AttentionShape shape{c.heads, c.kv_heads, c.head_dim,
                             1.0f / std::sqrt(static_cast<float>(c.head_dim))};
  const bool f16 = c.rows == DType::F16;
  const size_t n = static_cast<size_t>(c.kv_heads) * c.past;
  std::vector<float> want(n);
  cpu.snapkv_scores(q.data(), c.window, f16 ? static_cast<const void*>(k16.data()) : k.data(),
                    c.rows, row_stride, shape, c.prompt_len, c.past, want.data());

  DeviceArray dq(gpu, q), dk(gpu, k), dscores(gpu, n + 1);  // one guard value past the end
  DeviceBytes dk16(gpu, k16);
  dscores.poison();
  gpu.snapkv_scores(dq.data(), c.window, f16 ? static_cast<const void*>(dk16.data()) : dk.data(),
                    c.rows, row_stride, shape, c.prompt_len, c.past, dscores.data());
  std::vector<float> got = dscores.to_host();
  EXPECT_TRUE(std::isnan(got.back())) << describe(c) << ": wrote past the scores";
  got.pop_back();
  return n == 0 ? 0.0 : rel_error(got, want);
}

constexpr double kTol = 1e-4;  // f32 arithmetic in another order, expf

TEST_F(CudaOpsTest, SnapKvScoresMatchCpu) {
  uint64_t seed = 1;
  for (int hd : {64, 128}) {
    for (int group : {1, 4, 8}) {
      for (DType rows : {DType::F32, DType::F16}) {
        for (const auto& [len, window, past] : {std::tuple{37, 8, 29},
                                                {37, 32, 36},
                                                {300, 32, 268},
                                                {300, 16, 299},
                                                {4099, 32, 4067},
                                                {4099, 5, 4098}}) {
          const SnapCase c{2 * group, 2, hd, len, window, past, rows, len == 300 ? 4 : 0};
          const double err = run(gpu(), cpu(), c, seed++);
          EXPECT_LT(err, kTol) << describe(c);
        }
      }
    }
  }
}

// Small shapes (the compute-sanitizer subset): a prompt of one position (nothing to score), the
// other head_dims, a group of 3, one kv head, the window as long as the prompt, chunk edges
// (64 keys) and candidates the window's first queries do not see.
TEST_F(CudaOpsTest, SnapKvScoresEdgeShapes) {
  const std::vector<SnapCase> cases = {
      {4, 2, 64, 1, 1, 0},
      {4, 2, 64, 2, 1, 1},
      {6, 2, 64, 65, 3, 64, DType::F16},
      {6, 2, 64, 65, 65, 65},
      {8, 1, 128, 129, 32, 97, DType::F16, 8},
      {2, 2, 32, 70, 7, 66},
      {16, 2, 256, 100, 9, 91, DType::F16},
      {16, 2, 256, 40, 12, 40, DType::F32, 4},
  };
  uint64_t seed = 100;
  for (const SnapCase& c : cases) {
    const double err = run(gpu(), cpu(), c, seed++);
    EXPECT_LT(err, kTol) << describe(c);
  }
}

// The whole selection through the engine: the CUDA engine's SnapKV index equals the CPU
// engine's on the bundled model. The two prefills agree to f32 rounding, not bit for bit, so a
// candidate within rounding of a head's cut-off may swap with its neighbour in the ranking: a
// few such swaps are allowed, not more.
class CudaSnapKvEngineTest : public ::testing::TestWithParam<KvDType> {
 protected:
  void SetUp() override {
    if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  }
};

std::unique_ptr<LlmEngine> snapkv_engine(Device device, KvDType rows) {
  const std::filesystem::path dir = std::filesystem::path(QS_SOURCE_DIR) / "models/default";
  auto cfg = load_model_config(dir);
  EXPECT_TRUE(cfg.ok()) << cfg.error().message;
  if (!cfg.ok()) return nullptr;
  auto weights = load_model_weights(dir, *cfg);
  EXPECT_TRUE(weights.ok()) << weights.error().message;
  if (!weights.ok()) return nullptr;
  EngineOptions o;
  o.device = device;
  o.prefill_matmul = PrefillMatmul::kExact;  // f32-level, as the CPU engine it is compared with
  o.mode = DecodeMode::kSnapKv;
  o.kv_dtype = rows;
  o.max_context = 1024;
  o.prefill_chunk = 128;
  auto made = LlmEngine::create(*cfg, std::move(weights).value(), std::nullopt, o);
  EXPECT_TRUE(made.ok()) << made.error().message;
  return made.ok() ? std::move(made).value() : nullptr;
}

TEST_P(CudaSnapKvEngineTest, SelectionEqualsTheCpuEngine) {
  std::unique_ptr<LlmEngine> cpu = snapkv_engine(Device::kCpu, GetParam());
  std::unique_ptr<LlmEngine> gpu = snapkv_engine(Device::kCuda, GetParam());
  ASSERT_TRUE(cpu && gpu);
  std::vector<int32_t> prompt(700);
  for (size_t i = 0; i < prompt.size(); ++i) {
    prompt[i] = static_cast<int32_t>((i * 2654435761u + 17) % 8000);
  }
  ASSERT_TRUE(cpu->start(prompt).ok());
  ASSERT_TRUE(gpu->start(prompt).ok());
  const std::vector<int32_t>& want = cpu->sparse_index().host_positions();
  const std::vector<int32_t>& got = gpu->sparse_index().host_positions();
  ASSERT_EQ(got.size(), want.size());
  // Per (layer, kv head): the CPU's positions the GPU did not select.
  const size_t count = static_cast<size_t>(cpu->sparse_index().layers()[0].count);
  ASSERT_GT(count, 0u);
  size_t differ = 0;
  for (size_t head = 0; head < want.size(); head += count) {
    std::vector<int32_t> missing;
    std::set_difference(want.begin() + head, want.begin() + head + count, got.begin() + head,
                        got.begin() + head + count, std::back_inserter(missing));
    differ += missing.size();
  }
  std::printf("[ snapkv ] %s rows: %zu of %zu selected positions differ\n",
              GetParam() == KvDType::kF16 ? "f16" : "f32", differ, want.size());
  EXPECT_LE(differ, want.size() / 100);
}

INSTANTIATE_TEST_SUITE_P(Rows, CudaSnapKvEngineTest,
                         ::testing::Values(KvDType::kF32, KvDType::kF16), [](const auto& info) {
                           return std::string(info.param == KvDType::kF16 ? "f16" : "f32");
                         });

}  // namespace
}  // namespace qs
