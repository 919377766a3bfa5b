// SnapKV's observation scores (Backend::snapkv_scores) on the CPU backend: against a naive
// double-precision reference over GQA shapes, f32 and f16 rows and the causal window's edges,
// and the split selection (scores as the op computes them, then the host's ranking) against the
// host path SparseDraftIndex::select_snapkv_layer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kv/sparse_select.h"

namespace qs {
namespace {

struct ScoresCase {
  int heads, kv_heads, head_dim;
  int prompt_len, window, past;
};

// Random queries [window, heads * head_dim] and keys [prompt_len, row_stride] (padded rows),
// the keys rounded to f16 values so that f32 and f16 rows hold the same numbers.
struct ScoresInputs {
  std::vector<float> q, k;
  std::vector<uint16_t> k16;
  int64_t row_stride = 0;
};

ScoresInputs make_inputs(const ScoresCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.5f);
  ScoresInputs in;
  in.row_stride = static_cast<int64_t>(c.kv_heads) * c.head_dim + 3;
  in.q.resize(static_cast<size_t>(c.window) * c.heads * c.head_dim);
  in.k.resize(static_cast<size_t>(c.prompt_len) * in.row_stride);
  for (float& x : in.q) x = nd(rng);
  for (float& x : in.k) x = f16_to_f32(f32_to_f16(nd(rng)));
  in.k16.resize(in.k.size());
  for (size_t i = 0; i < in.k.size(); ++i) in.k16[i] = f32_to_f16(in.k[i]);
  return in;
}

// The definition, in double: for kv head h, query vector (g, i) softmaxed over keys
// [0, q0 + i], its probabilities summed into the candidates [0, past) it sees.
std::vector<double> naive_scores(const ScoresCase& c, const ScoresInputs& in, float scale) {
  const int group = c.heads / c.kv_heads, q0 = c.prompt_len - c.window;
  std::vector<double> out(static_cast<size_t>(c.kv_heads) * c.past, 0.0);
  for (int h = 0; h < c.kv_heads; ++h) {
    for (int g = 0; g < group; ++g) {
      for (int i = 0; i < c.window; ++i) {
        const float* qv =
            in.q.data() + (static_cast<size_t>(i) * c.heads + h * group + g) * c.head_dim;
        std::vector<double> s(static_cast<size_t>(q0 + i + 1));
        for (int t = 0; t <= q0 + i; ++t) {
          const float* kr = in.k.data() + t * in.row_stride + h * c.head_dim;
          double d = 0.0;
          for (int x = 0; x < c.head_dim; ++x) d += double(qv[x]) * kr[x];
          s[t] = d * scale;
        }
        const double mx = *std::max_element(s.begin(), s.end());
        double sum = 0.0;
        for (double& v : s) sum += (v = std::exp(v - mx));
        for (int t = 0; t < std::min(c.past, q0 + i + 1); ++t) {
          out[static_cast<size_t>(h) * c.past + t] += s[t] / sum;
        }
      }
    }
  }
  return out;
}

AttentionShape shape_of(const ScoresCase& c) {
  return AttentionShape{c.heads, c.kv_heads, c.head_dim,
                        1.0f / std::sqrt(static_cast<float>(c.head_dim))};
}

TEST(SnapKvScores, CpuMatchesTheDefinitionInDouble) {
  CpuBackend cpu(2);
  std::vector<ScoresCase> cases;
  for (const auto& [heads, kv_heads] : {std::pair{2, 2}, {8, 2}, {8, 1}, {6, 2}}) {
    // past beyond q0 = prompt_len - window: candidates that the window's first queries do not see.
    for (const auto& [len, window, past] : {std::tuple{1, 1, 0},
                                            {1, 1, 1},
                                            {5, 5, 5},
                                            {37, 1, 36},
                                            {37, 8, 29},
                                            {37, 8, 33},
                                            {37, 8, 37},
                                            {90, 16, 1}}) {
      cases.push_back({heads, kv_heads, 16, len, window, past});
    }
  }
  cases.push_back({4, 2, 24, 41, 7, 34});  // head_dim not a multiple of 8
  uint32_t seed = 1;
  for (const ScoresCase& c : cases) {
    const ScoresInputs in = make_inputs(c, seed++);
    const AttentionShape shape = shape_of(c);
    const std::vector<double> want = naive_scores(c, in, shape.scale);
    for (DType rows : {DType::F32, DType::F16}) {
      const void* k = rows == DType::F32 ? static_cast<const void*>(in.k.data()) : in.k16.data();
      std::vector<float> got(want.size() + 1, -1.0f);  // one guard value past the end
      cpu.snapkv_scores(in.q.data(), c.window, k, rows, in.row_stride, shape, c.prompt_len, c.past,
                        got.data());
      for (size_t t = 0; t < want.size(); ++t) {
        ASSERT_NEAR(got[t], want[t], 1e-5 * std::max(1.0, want[t]))
            << "heads " << c.heads << "/" << c.kv_heads << " len " << c.prompt_len << " window "
            << c.window << " past " << c.past << " " << dtype_name(rows) << " at " << t;
      }
      EXPECT_EQ(got.back(), -1.0f);
    }
  }
}

TEST(SnapKvScores, RankingTheOpsScoresEqualsTheHostPath) {
  const ScoresCase c{8, 2, 32, 300, 16, 300 - 16};
  const int keep = 16 + 40, kernel = 7;
  const ScoresInputs in = make_inputs(c, 77);
  const AttentionShape shape = shape_of(c);
  SparseDraftIndex host;
  host.begin_snapkv(1, c.kv_heads, c.prompt_len, keep, c.window);
  host.select_snapkv_layer(0, in.q.data(), in.k.data(), in.row_stride, shape, kernel);
  ASSERT_EQ(host.snapkv_candidates(), c.past);
  CpuBackend cpu(3);
  ThreadPool pool(2);
  for (DType rows : {DType::F32, DType::F16}) {
    const void* k = rows == DType::F32 ? static_cast<const void*>(in.k.data()) : in.k16.data();
    std::vector<float> scores(static_cast<size_t>(c.kv_heads) * c.past);
    cpu.snapkv_scores(in.q.data(), c.window, k, rows, in.row_stride, shape, c.prompt_len, c.past,
                      scores.data());
    SparseDraftIndex split;
    split.begin_snapkv(1, c.kv_heads, c.prompt_len, keep, c.window);
    split.select_snapkv_from_scores(0, scores.data(), kernel, &pool);
    EXPECT_EQ(split.host_positions(), host.host_positions()) << dtype_name(rows);
  }
}

TEST(SnapKvScores, NothingToRankWhenTheDraftKeepsEverything) {
  SparseDraftIndex idx;
  idx.begin_snapkv(2, 2, /*prompt_len=*/40, /*keep=*/8, /*window=*/8);  // keep == window
  EXPECT_EQ(idx.snapkv_candidates(), 0);
  idx.begin_snapkv(2, 2, 40, 20, 8);
  EXPECT_EQ(idx.snapkv_candidates(), 32);
}

}  // namespace
}  // namespace qs
