// 4-bit group-wise draft weights: error bound, input dtypes, short last group, reference matmul.
#include "quant/weight_quant.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "quant/quant4.h"

namespace qs {
namespace {

std::vector<float> random_weight(std::mt19937& rng, int64_t rows, int64_t cols) {
  std::normal_distribution<float> d(0.0f, 0.05f);
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (auto& x : w) x = d(rng);
  w[std::min<size_t>(3, w.size() - 1)] = 0.9f;  // an outlier
  return w;
}

void expect_within_bound(const std::vector<float>& w, const QuantizedWeight4& q) {
  std::vector<float> row(q.cols);
  for (int64_t r = 0; r < q.rows; ++r) {
    dequantize_weight4_row(q, r, row.data());
    for (int64_t c = 0; c < q.cols; ++c) {
      const int64_t g = c / q.group_size;
      const float s = f16_to_f32(q.scale[r * q.groups_per_row + g]);
      const float m = f16_to_f32(q.min[r * q.groups_per_row + g]);
      const float x = w[r * q.cols + c];
      ASSERT_LE(std::fabs(row[c] - x), s / 2 + 0x1p-21f * (std::fabs(x) + std::fabs(m) + 16 * s))
          << "row " << r << " col " << c;
    }
  }
}

TEST(WeightQuant, ErrorBoundWithShortLastGroup) {
  std::mt19937 rng(20);
  const int64_t rows = 7, cols = 300;  // groups of 128, 128 and 44
  std::vector<float> w = random_weight(rng, rows, cols);
  auto q = quantize_weight4(w.data(), DType::F32, rows, cols);
  ASSERT_TRUE(q.ok()) << q.error().message;
  EXPECT_EQ(q->groups_per_row, 3);
  EXPECT_EQ(q->row_bytes, 150);
  EXPECT_EQ(q->bytes(), rows * 150 + rows * 3 * 4);
  expect_within_bound(w, *q);

  // The short group's scale comes from its own 44 columns only.
  for (int64_t r = 0; r < rows; ++r) {
    float lo, hi;
    group_range(w.data() + r * cols + 256, 44, 1, &lo, &hi);
    Quant4Params p = choose_quant4_params(lo, hi);
    EXPECT_EQ(q->scale[r * 3 + 2], p.scale);
    EXPECT_EQ(q->min[r * 3 + 2], p.min);
  }
}

TEST(WeightQuant, OddColumnsAndOtherGroupSizes) {
  std::mt19937 rng(21);
  for (int64_t cols : {1, 129, 255}) {
    for (int group : {32, 128}) {
      std::vector<float> w = random_weight(rng, 3, cols);
      auto q = quantize_weight4(w.data(), DType::F32, 3, cols, group);
      ASSERT_TRUE(q.ok());
      EXPECT_EQ(q->row_bytes, (cols + 1) / 2);
      EXPECT_EQ(q->groups_per_row, (cols + group - 1) / group);
      expect_within_bound(w, *q);
      if (cols % 2) {
        for (int64_t r = 0; r < 3; ++r) EXPECT_EQ(q->codes[r * q->row_bytes + cols / 2] >> 4, 0);
      }
    }
  }
}

TEST(WeightQuant, HalfPrecisionInputsQuantizeLikeTheirF32Values) {
  std::mt19937 rng(22);
  const int64_t rows = 5, cols = 256;
  std::vector<float> w = random_weight(rng, rows, cols);
  std::vector<uint16_t> f16(w.size()), bf16(w.size());
  std::vector<float> from_f16(w.size()), from_bf16(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    f16[i] = f32_to_f16(w[i]);
    bf16[i] = f32_to_bf16(w[i]);
    from_f16[i] = f16_to_f32(f16[i]);
    from_bf16[i] = bf16_to_f32(bf16[i]);
  }
  struct Case {
    const void* data;
    DType dtype;
    const std::vector<float>* values;
  };
  for (const Case& c :
       {Case{f16.data(), DType::F16, &from_f16}, Case{bf16.data(), DType::BF16, &from_bf16}}) {
    auto q = quantize_weight4(c.data, c.dtype, rows, cols);
    auto ref = quantize_weight4(c.values->data(), DType::F32, rows, cols);
    ASSERT_TRUE(q.ok() && ref.ok());
    EXPECT_EQ(q->codes, ref->codes) << dtype_name(c.dtype);
    EXPECT_EQ(q->scale, ref->scale);
    EXPECT_EQ(q->min, ref->min);
    expect_within_bound(*c.values, *q);
  }
}

TEST(WeightQuant, MatmulMatchesDequantizedNaive) {
  std::mt19937 rng(23);
  const int64_t m = 3, n = 37, k = 200;
  std::vector<float> w = random_weight(rng, n, k);
  auto q = quantize_weight4(w.data(), DType::F32, n, k);
  ASSERT_TRUE(q.ok());
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(m * k);
  for (auto& v : x) v = d(rng);

  std::vector<float> y(m * n, -1.0f);
  matmul_weight4(x.data(), m, *q, y.data());

  std::vector<float> wd(n * k);
  for (int64_t r = 0; r < n; ++r) dequantize_weight4_row(*q, r, wd.data() + r * k);
  double max_err_vs_original = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t r = 0; r < n; ++r) {
      double ref = 0, mag = 0, orig = 0, quant_bound = 0;
      for (int64_t c = 0; c < k; ++c) {
        const double xc = x[i * k + c];
        ref += xc * wd[r * k + c];
        mag += std::fabs(xc * wd[r * k + c]);
        orig += xc * w[r * k + c];
        const float s = f16_to_f32(q->scale[r * q->groups_per_row + c / q->group_size]);
        quant_bound += std::fabs(xc) * s / 2;
      }
      ASSERT_NEAR(y[i * n + r], ref, 1e-6 * mag + 1e-30) << "i=" << i << " n=" << r;
      // |y - x W^T| <= sum |x_c| s_c / 2, plus the f32 accumulation error.
      ASSERT_LE(std::fabs(y[i * n + r] - orig), quant_bound * 1.001 + 1e-6 * mag);
      max_err_vs_original = std::fmax(max_err_vs_original, std::fabs(y[i * n + r] - orig));
    }
  }
  EXPECT_GT(max_err_vs_original, 1e-4);  // it really is the quantized weight

  ThreadPool pool(2);
  std::vector<float> y_threaded(m * n, -1.0f);
  matmul_weight4(x.data(), m, *q, y_threaded.data(), &pool);
  EXPECT_EQ(y_threaded, y);
  auto q_threaded = quantize_weight4(w.data(), DType::F32, n, k, kWeightQuantGroup, "", &pool);
  ASSERT_TRUE(q_threaded.ok());
  EXPECT_EQ(q_threaded->codes, q->codes);
  EXPECT_EQ(q_threaded->scale, q->scale);
}

TEST(WeightQuant, RejectsBadInputWithAClearMessage) {
  const int32_t ints[4] = {1, 2, 3, 4};
  auto bad_dtype =
      quantize_weight4(ints, DType::I32, 2, 2, 128, "model.layers.0.mlp.up_proj.weight");
  ASSERT_FALSE(bad_dtype.ok());
  EXPECT_NE(bad_dtype.error().message.find("model.layers.0.mlp.up_proj.weight"), std::string::npos);
  EXPECT_NE(bad_dtype.error().message.find("I32"), std::string::npos);

  const float f[4] = {0, 1, 2, 3};
  EXPECT_FALSE(quantize_weight4(f, DType::F32, 0, 4).ok());
  EXPECT_FALSE(quantize_weight4(f, DType::F32, 2, 2, 0).ok());
}

}  // namespace
}  // namespace qs
