// backend/cpu/row_math.h: the vectorized row reductions behind token_logprob (max, the sum of
// shifted exponentials, the top k) against plain scalar references, over lengths around the
// vector width, ties, underflowing terms and Llama-3's vocabulary.
#include "backend/cpu/row_math.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

namespace qs {
namespace {

std::vector<float> make_row(int64_t n, int kind, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    if (kind == 0) {
      x[i] = normal(rng);  // logits
    } else if (kind == 1) {
      x[i] = static_cast<float>(static_cast<int>(rng() % 7));  // ties
    } else {
      x[i] = (i % 3 == 0) ? 50.0f : -100.0f + normal(rng);  // terms that underflow
    }
  }
  return x;
}

// The k most likely by (value desc, index asc), by sorting every index.
std::vector<int32_t> reference_top_k(const std::vector<float>& x, int k) {
  std::vector<int32_t> idx(x.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return x[a] > x[b]; });
  idx.resize(static_cast<size_t>(k));
  return idx;
}

TEST(RowMath, MatchesScalarReferences) {
  for (int64_t n : {1, 2, 7, 8, 15, 16, 17, 31, 33, 127, 128, 129, 1000, 128256}) {
    for (int kind = 0; kind < 3; ++kind) {
      const std::vector<float> x = make_row(n, kind, static_cast<uint32_t>(n * 3 + kind));
      const float mx = *std::max_element(x.begin(), x.end());
      EXPECT_EQ(cpu::row_max(x.data(), n), mx) << "n=" << n << " kind=" << kind;
      long double want = 0;
      for (float v : x) want += std::exp(static_cast<long double>(v) - mx);
      const double got = cpu::row_sum_exp(x.data(), n, mx);
      EXPECT_NEAR(got, static_cast<double>(want), 1e-6 * static_cast<double>(want))
          << "n=" << n << " kind=" << kind;
      // The same bits on a second call (a fixed order).
      EXPECT_EQ(cpu::row_sum_exp(x.data(), n, mx), got);
      for (int k : {0, 1, 3, 20}) {
        if (k > n) continue;
        EXPECT_EQ(cpu::row_top_k(x.data(), n, k), reference_top_k(x, k))
            << "n=" << n << " kind=" << kind << " k=" << k;
      }
    }
  }
}

TEST(RowMath, TopKOfTheWholeRowIsItsOrder) {
  const std::vector<float> x = make_row(45, 1, 9);  // many ties
  EXPECT_EQ(cpu::row_top_k(x.data(), 45, 45), reference_top_k(x, 45));
}

}  // namespace
}  // namespace qs
