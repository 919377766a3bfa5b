// The CPU attention's row kernels (backend/cpu/attention_rows.h) against double-precision sums,
// and their contract: a query's arithmetic does not depend on the rows or queries around it, so
// a block of queries gives, bit for bit, what one call per query gives (a verification block and
// the decoding steps it replaces agree exactly).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/cpu/attention_rows.h"
#include "backend/cpu/cpu_backend.h"
#include "kv/quantized_planes.h"
#include "tiny_model.h"

namespace qs {
namespace {

using testing::randn;

TEST(AttentionRows, DotRowsMatchDoubleSumsAndDoNotDependOnTheBatch) {
  for (int n_ch : {8, 16, 20, 64, 100, 128, 300}) {
    const int stride = n_ch + 3, n = 41;
    const std::vector<float> rows = randn(size_t(n) * stride, n_ch), w = randn(n_ch, n_ch + 1);
    std::vector<float> got(n);
    cpu::dot_rows(w.data(), rows.data(), stride, n_ch, n, got.data());
    for (int r = 0; r < n; ++r) {
      double want = 0.0, mag = 0.0;
      for (int c = 0; c < n_ch; ++c) {
        want += double(w[c]) * rows[size_t(r) * stride + c];
        mag += std::fabs(double(w[c]) * rows[size_t(r) * stride + c]);
      }
      ASSERT_NEAR(got[r], want, 1e-6 * mag) << "n_ch " << n_ch << " row " << r;
      float alone = 0.0f;  // the same row on its own, and as the first row of a shorter batch
      cpu::dot_rows(w.data(), rows.data() + size_t(r) * stride, stride, n_ch, 1, &alone);
      ASSERT_EQ(alone, got[r]) << "n_ch " << n_ch << " row " << r;
    }
  }
}

TEST(AttentionRows, SoftmaxMatchesDoublePrecision) {
  for (int n : {1, 7, 16, 33, 1000}) {
    std::vector<float> s = randn(n, 100 + n, 6.0f);
    if (n > 3) s[2] = -200.0f;  // far below the max: exp underflows to 0
    std::vector<double> want(s.begin(), s.end());
    double mx = -1e300, sum = 0.0;
    for (double x : want) mx = std::max(mx, x);
    for (double& x : want) sum += (x = std::exp(x - mx));
    cpu::softmax_row(s.data(), n);
    // f32 sums of n terms (the scalar build adds them in order): ~sqrt(n) * 6e-8 relative.
    for (int i = 0; i < n; ++i) ASSERT_NEAR(s[i], want[i] / sum, 2e-7 + 1e-5 * want[i] / sum) << n;
  }
}

TEST(AttentionRows, AxpyRowsMatchesAndSplitsAnywhere) {
  for (int n_ch : {8, 16, 20, 64, 128, 300}) {
    const int stride = n_ch + 1, n = 37;
    const std::vector<float> rows = randn(size_t(n) * stride, n_ch), coef = randn(n, 7);
    const std::vector<float> init = randn(n_ch, 8);
    std::vector<float> whole = init, split = init;
    cpu::axpy_rows(coef.data(), rows.data(), stride, n, whole.data(), n_ch);
    cpu::axpy_rows(coef.data(), rows.data(), stride, 10, split.data(), n_ch);
    cpu::axpy_rows(coef.data() + 10, rows.data() + 10 * stride, stride, n - 10, split.data(), n_ch);
    EXPECT_EQ(whole, split) << n_ch;
    for (int c = 0; c < n_ch; ++c) {
      double want = init[c];
      for (int r = 0; r < n; ++r) want += double(coef[r]) * rows[size_t(r) * stride + c];
      ASSERT_NEAR(whole[c], want, 1e-5) << n_ch;
    }
  }
}

// Any number of queries over the same rows: each one's sums bit for bit those of its own call.
TEST(AttentionRows, AxpyRowsMultiEqualsOneCallPerQuery) {
  for (int n_ch : {8, 16, 20, 32, 64, 128, 300}) {
    for (int nq : {1, 2, 3, 4, 5, 9}) {
      const int stride = n_ch + 5, n = 29;
      const std::vector<float> rows = randn(size_t(n) * stride, n_ch + nq);
      std::vector<std::vector<float>> coef, multi, single;
      std::vector<const float*> coef_ptr;
      std::vector<float*> acc_ptr;
      for (int q = 0; q < nq; ++q) {
        coef.push_back(randn(n, 40 + q));
        multi.push_back(randn(n_ch, 60 + q));
      }
      single = multi;
      for (int q = 0; q < nq; ++q) {
        coef_ptr.push_back(coef[q].data());
        acc_ptr.push_back(multi[q].data());
        cpu::axpy_rows(coef[q].data(), rows.data(), stride, n, single[q].data(), n_ch);
      }
      cpu::axpy_rows_multi(coef_ptr.data(), rows.data(), stride, n, acc_ptr.data(), n_ch, nq);
      for (int q = 0; q < nq; ++q) ASSERT_EQ(multi[q], single[q]) << n_ch << " " << nq << " " << q;
    }
  }
}

// One call over a block of m query rows against m one-row calls (and other thread counts, which
// split the tasks differently): equal bit for bit, over f32 and f16 rows and both quantized views.
TEST(AttentionRows, ABlockOfQueriesEqualsOneCallPerQuery) {
  const int G = 32, hd = 64, kvh = 2, nh = 6, kvd = kvh * hd, total = 230, m = 9;
  const std::vector<float> k = randn(size_t(total) * kvd, 21), v = randn(size_t(total) * kvd, 22);
  auto planes = QuantizedPlanes::create(KvPlanesShape{1, kvh, hd, G, hd, 256});
  ASSERT_TRUE(planes.ok());
  for (int g = 0; g < total / G; ++g) {
    planes->append_group(0, k.data() + size_t(g) * G * kvd, v.data() + size_t(g) * G * kvd, g);
  }
  std::vector<uint16_t> k16(k.size()), v16(v.size());
  for (size_t i = 0; i < k.size(); ++i) k16[i] = f32_to_f16(k[i]), v16[i] = f32_to_f16(v[i]);
  const AttentionShape shape{nh, kvh, hd, 0.125f};
  CpuBackend one(1), two(2);
  for (int variant = 0; variant < 4; ++variant) {  // f32 rows, f16 rows, INT8 view, INT4 view
    const KvQuantView view = variant == 2 ? KvQuantView::kTargetInt8 : KvQuantView::kDraftInt4;
    const QuantizedKvSegment seg = planes->segment(0, view);
    for (int pos : {0, 60, 150, 200}) {
      const int base = variant >= 2 ? quant_boundary(pos, G) : 0;
      KvView kv{k.data() + size_t(base) * kvd, v.data() + size_t(base) * kvd, kvd, pos + m};
      if (variant == 1) {
        kv.k = k16.data() + size_t(base) * kvd;
        kv.v = v16.data() + size_t(base) * kvd;
        kv.row_dtype = DType::F16;
      }
      kv.fp_base = base;
      if (variant >= 2) kv.quantized = &seg;
      const std::vector<float> q = randn(size_t(m) * nh * hd, 30 + pos);
      std::vector<float> block(q.size()), block1(q.size()), step(size_t(nh) * hd);
      two.attention(q.data(), m, pos, shape, kv, block.data());
      one.attention(q.data(), m, pos, shape, kv, block1.data());
      EXPECT_EQ(block, block1) << "variant " << variant << " pos " << pos;
      for (int i = 0; i < m; ++i) {
        two.attention(q.data() + size_t(i) * nh * hd, 1, pos + i, shape, kv, step.data());
        const std::vector<float> row(block.begin() + size_t(i) * nh * hd,
                                     block.begin() + size_t(i + 1) * nh * hd);
        ASSERT_EQ(row, step) << "variant " << variant << " pos " << pos + i;
      }
    }
  }
}

}  // namespace
}  // namespace qs
