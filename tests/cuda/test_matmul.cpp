// matmul on CUDA against the CPU backend: the skinny tensor-core GEMM (m <= 16), its FMA
// fallback, and the cuBLAS path (m > 16), over all weight dtypes, odd shapes and biases.
//
// Tolerances (relative Frobenius error against the CPU's f32 result): both sides accumulate in
// f32; the tensor-core paths carry each activation as a hi + lo pair of the weight's dtype, an
// error of at most 2^-17 (bf16) or 2^-22 (f16) of the value, so bf16 weights are held to 2e-5
// and f16/f32 weights to 2e-6. The fast prefill option (activations rounded to bf16) gets 1e-2.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "backend/cuda/cuda_ops.h"
#include "cuda_test_util.h"

namespace qs {
namespace {

using testing::CudaOpsTest;
using testing::DeviceArray;
using testing::HostWeight;
using testing::random_normal;
using testing::rel_error;

double tolerance(DType dt) {
  return dt == DType::BF16 ? 2e-5 : 2e-6;
}

enum class Path { kAuto, kGemv, kGemm };

struct MatmulCase {
  int m;
  int64_t n, k;
  DType dtype;
  bool bias;
  Path path = Path::kAuto;
};

// Runs one case on both backends with the given weight and returns the relative error.
double run_with(CudaBackend& gpu, CpuBackend& cpu, const MatmulCase& c, const HostWeight& w,
                uint64_t seed) {
  HostWeight b(random_normal(c.n, seed + 1), c.dtype, 1, c.n, "b");
  const std::vector<float> x = random_normal(size_t(c.m) * c.k, seed + 2);
  std::vector<float> want(size_t(c.m) * c.n);
  cpu.matmul(x.data(), c.m, w.view, c.bias ? &b.view : nullptr, want.data());
  DeviceArray xd(gpu, x), y(gpu, want.size());
  y.poison();
  const WeightView* bias = c.bias ? &b.view : nullptr;
  switch (c.path) {
    case Path::kAuto:
      gpu.matmul(xd.data(), c.m, w.view, bias, y.data());
      break;
    case Path::kGemv:
      gpu.matmul_gemv(xd.data(), c.m, w.view, bias, y.data());
      break;
    case Path::kGemm:
      gpu.matmul_gemm(xd.data(), c.m, w.view, bias, y.data());
      break;
  }
  const double err = rel_error(y.to_host(), want);
  gpu.release_weights();
  return err;
}

double run_case(CudaBackend& gpu, CpuBackend& cpu, const MatmulCase& c, uint64_t seed) {
  HostWeight w(random_normal(c.n * c.k, seed, 0.05f), c.dtype, c.n, c.k, "w");
  return run_with(gpu, cpu, c, w, seed);
}

std::string describe(const MatmulCase& c) {
  return std::string(dtype_name(c.dtype)) + " m=" + std::to_string(c.m) +
         " n=" + std::to_string(c.n) + " k=" + std::to_string(c.k) + (c.bias ? " +bias" : "");
}

TEST_F(CudaOpsTest, GemvEveryRowCountAndDtype) {
  // k = 1000: a partial last 32-wide chunk; n = 300: a partial last 16-row tile.
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    for (int m = 1; m <= 16; ++m) {
      const MatmulCase c{m, 300, 1000, dt, m % 3 == 0};
      EXPECT_LT(run_case(gpu(), cpu(), c, 100 + m), tolerance(dt)) << describe(c);
    }
  }
}

TEST_F(CudaOpsTest, GemvOddShapesUseTheFallback) {
  // k % 8 != 0 cannot take 16-byte loads: the FMA path runs, for every dtype.
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    for (int m : {1, 5, 16}) {
      for (int64_t k : {1, 7, 999}) {
        const MatmulCase c{m, 37, k, dt, true};
        EXPECT_LT(run_case(gpu(), cpu(), c, 200 + m + k), tolerance(dt)) << describe(c);
      }
    }
  }
}

TEST_F(CudaOpsTest, GemvRealShapes) {
  // Llama-shaped projections (K split across up to 16 warps per block).
  for (DType dt : {DType::F16, DType::BF16}) {
    for (auto [n, k] : {std::pair<int64_t, int64_t>{4096, 4096}, {1024, 4096}, {4096, 11008}}) {
      HostWeight w(random_normal(n * k, 300 + n + k, 0.05f), dt, n, k, "w");
      for (int m : {1, 8, 16}) {
        const MatmulCase c{m, n, k, dt, false};
        EXPECT_LT(run_with(gpu(), cpu(), c, w, 300 + m), tolerance(dt)) << describe(c);
      }
    }
  }
}

// Every kernel variant the benchmark compares computes the same function.
TEST_F(CudaOpsTest, GemvEveryTuning) {
  const cuda::GemvTuning saved = cuda::gemv_tuning();
  const cuda::GemvTuning tunings[] = {{4, false, 0, -1}, {4, true, 0, -1},  {8, false, 0, -1},
                                      {8, true, 0, -1},  {4, false, 4, -1}, {8, true, 2, -1},
                                      {0, true, 0, -1},  {0, true, 0, 4},   {0, true, 0, 6}};
  for (const cuda::GemvTuning& t : tunings) {
    cuda::set_gemv_tuning(t);
    for (DType dt : {DType::F16, DType::BF16}) {
      for (auto [n, k] : {std::pair<int64_t, int64_t>{300, 1000}, {37, 8}, {1024, 4096}}) {
        HostWeight w(random_normal(n * k, 900 + n + k, 0.05f), dt, n, k, "w");
        for (int m : {1, 2, 3, 4, 5, 8, 9, 16}) {
          const MatmulCase c{m, n, k, dt, m % 2 == 1};
          EXPECT_LT(run_with(gpu(), cpu(), c, w, 950 + m), tolerance(dt))
              << describe(c) << " unroll=" << t.mma_unroll << " l2=" << t.l2_prefetch
              << " coalesced<=" << t.coalesced_max_rows << " ring=" << t.ring_stages;
        }
      }
    }
  }
  cuda::set_gemv_tuning(saved);
}

// matmul_group over dense weights: one tensor-core launch for groups of 2 and 3 matrices of
// the same cols (partial tiles, biases), every row count, both half dtypes; and the per-matrix
// fallback (mixed dtypes, m > 16); each output against the CPU.
TEST_F(CudaOpsTest, GemvGroupMatchesCpu) {
  const int64_t k = 1000;
  const int64_t rows[3] = {300, 64, 17};
  for (DType dt : {DType::BF16, DType::F16}) {
    std::vector<std::unique_ptr<HostWeight>> ws, bs;
    for (int i = 0; i < 3; ++i) {
      ws.push_back(std::make_unique<HostWeight>(random_normal(rows[i] * k, 60 + i, 0.05f),
                                                i == 2 && dt == DType::F16 ? DType::BF16 : dt,
                                                rows[i], k, "w"));
      bs.push_back(std::make_unique<HostWeight>(random_normal(rows[i], 70 + i), DType::F32, 1,
                                                rows[i], "b"));
    }
    for (int m : {1, 2, 3, 5, 8, 9, 16, 17}) {
      for (int count : {2, 3}) {
        const std::vector<float> x = random_normal(size_t(m) * k, 80 + m);
        DeviceArray xd(gpu(), x);
        std::vector<std::unique_ptr<DeviceArray>> ys;
        LinearOp ops[3];
        for (int i = 0; i < count; ++i) {
          ys.push_back(std::make_unique<DeviceArray>(gpu(), size_t(m) * rows[i]));
          ys.back()->poison();
          ops[i] = {&ws[i]->view, nullptr, i == 1 ? nullptr : &bs[i]->view, ys.back()->data()};
        }
        gpu().matmul_group(xd.data(), m, ops, count);
        for (int i = 0; i < count; ++i) {
          std::vector<float> want(size_t(m) * rows[i]);
          cpu().matmul(x.data(), m, *ops[i].w, ops[i].bias, want.data());
          EXPECT_LT(rel_error(ys[i]->to_host(), want), tolerance(DType::BF16))
              << dtype_name(dt) << " m=" << m << " op " << i << " of " << count;
        }
      }
    }
    gpu().release_weights();
  }
}

TEST_F(CudaOpsTest, GemvPathHandlesMoreThan16Rows) {
  const MatmulCase c{37, 200, 256, DType::BF16, true, Path::kGemv};
  EXPECT_LT(run_case(gpu(), cpu(), c, 400), tolerance(c.dtype)) << describe(c);
}

TEST_F(CudaOpsTest, GemmPrefillRows) {
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    for (int m : {17, 64, 333}) {
      for (bool bias : {false, true}) {
        const MatmulCase c{m, 520, 1000, dt, bias};
        EXPECT_LT(run_case(gpu(), cpu(), c, 500 + m), tolerance(dt)) << describe(c);
      }
    }
  }
  // The GEMM path at decode row counts too.
  for (int m : {1, 3}) {
    const MatmulCase c{m, 130, 96, DType::BF16, true, Path::kGemm};
    EXPECT_LT(run_case(gpu(), cpu(), c, 600 + m), tolerance(c.dtype)) << describe(c);
  }
}

TEST_F(CudaOpsTest, FastPrefillMatmulIsBf16Accurate) {
  CudaBackendOptions opt;
  opt.exact_prefill = false;
  auto fast = CudaBackend::create(opt);
  ASSERT_TRUE(fast.ok()) << fast.error().message;
  const MatmulCase c{100, 256, 2048, DType::BF16, true};
  const double err = run_case(**fast, cpu(), c, 700);
  EXPECT_LT(err, 1e-2) << describe(c);
}

TEST_F(CudaOpsTest, DeviceResidentWeightsAreUsedInPlace) {
  const int64_t n = 64, k = 128;
  HostWeight w(random_normal(n * k, 800, 0.05f), DType::F32, n, k);
  const std::vector<float> x = random_normal(k, 801);
  std::vector<float> want(n);
  cpu().matmul(x.data(), 1, w.view, nullptr, want.data());
  // The same weight, placed in device memory by the caller.
  DeviceArray wd(gpu(), w.values);
  WeightView dev_view = w.view;
  dev_view.data = wd.data();
  DeviceArray xd(gpu(), x), y(gpu(), n);
  const size_t before = gpu().resident_weight_bytes();
  gpu().matmul(xd.data(), 1, dev_view, nullptr, y.data());
  EXPECT_EQ(gpu().resident_weight_bytes(), before);  // nothing uploaded
  EXPECT_LT(rel_error(y.to_host(), want), 2e-6);
}

}  // namespace
}  // namespace qs
