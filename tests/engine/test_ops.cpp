// Every CPU op against a plain double-precision reference; the fused ops against the separate ops.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/rope_freq.h"
#include "core/thread_pool.h"
#include "tiny_model.h"

namespace qs {
namespace {

using testing::TinyModel;

std::vector<float> random_vec(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// |got - want| within rel * scale + abs_tol for every element.
void expect_close(const std::vector<float>& got, const std::vector<double>& want,
                  const std::vector<double>& scale, double rel, double abs_tol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::abs(got[i] - want[i]) > rel * scale[i] + abs_tol) {
      if (++bad <= 5) {
        ADD_FAILURE() << what << ": element " << i << " got " << got[i] << " want " << want[i];
      }
    }
  }
}

TEST(ThreadPool, CoversEveryIndexOnce) {
  ThreadPool pool(3);
  EXPECT_EQ(pool.num_threads(), 3);
  for (int64_t n : {1, 2, 3, 7, 100, 1001}) {
    for (int64_t chunks : {0, 1, 2, 5, 64, 5000}) {
      std::vector<std::atomic<int>> hits(n);
      pool.parallel_for(
          n,
          [&](int64_t b, int64_t e) {
            ASSERT_LT(b, e);
            for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
          },
          chunks);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << n << " " << chunks;
    }
  }
}

TEST(ThreadPool, NestedLoopsRunSerially) {
  ThreadPool pool(2);
  std::atomic<int64_t> sum{0};
  pool.parallel_for(10, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      pool.parallel_for(10, [&](int64_t b2, int64_t e2) {
        for (int64_t j = b2; j < e2; ++j) sum += i * 10 + j;
      });
    }
  });
  EXPECT_EQ(sum.load(), 99 * 100 / 2);
}

class MatmulTest : public ::testing::TestWithParam<DType> {};

TEST_P(MatmulTest, BothPathsMatchReference) {
  const DType dtype = GetParam();
  CpuBackend cpu(2);
  std::mt19937 rng(42);
  const std::pair<int, int> shapes[] = {{37, 45}, {64, 128}, {33, 17}, {5, 3}, {130, 259}};
  for (auto [n, k] : shapes) {
    TinyModel store;
    WeightView w = store.make("w", n, k, dtype, rng, 0.5f);
    WeightView bias = store.make("b", 1, n, dtype, rng, 0.5f);
    const std::vector<double> wd = testing::to_double(w);
    const std::vector<double> bd = testing::to_double(bias);
    std::vector<int> ms;
    for (int m = 1; m <= 16; ++m) ms.push_back(m);
    ms.push_back(64);
    for (int m : ms) {
      const std::vector<float> x = random_vec(static_cast<size_t>(m) * k, rng);
      std::vector<double> want(static_cast<size_t>(m) * n), bound(want.size());
      for (int i = 0; i < m; ++i)
        for (int j = 0; j < n; ++j) {
          double s = 0, a = 0;
          for (int c = 0; c < k; ++c) {
            s += x[i * k + c] * wd[j * k + c];
            a += std::abs(x[i * k + c] * wd[j * k + c]);
          }
          want[i * n + j] = s;
          bound[i * n + j] = a;
        }
      const std::string tag = std::string(dtype_name(dtype)) + " n=" + std::to_string(n) +
                              " k=" + std::to_string(k) + " m=" + std::to_string(m);
      std::vector<float> y(want.size(), NAN);
      if (m <= CpuBackend::kGemvMaxRows) {
        cpu.matmul_gemv(x.data(), m, w, y.data());
        expect_close(y, want, bound, 1e-6, 1e-6, "gemv " + tag);
      }
      std::fill(y.begin(), y.end(), NAN);
      cpu.matmul_sgemm(x.data(), m, w, y.data());
      expect_close(y, want, bound, 1e-6, 1e-6, "sgemm " + tag);

      // The dispatching entry point, with a bias.
      std::fill(y.begin(), y.end(), NAN);
      cpu.matmul(x.data(), m, w, &bias, y.data());
      for (int i = 0; i < m; ++i)
        for (int j = 0; j < n; ++j) want[i * n + j] += bd[j];
      expect_close(y, want, bound, 1e-6, 1e-6, "matmul+bias " + tag);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, MatmulTest,
                         ::testing::Values(DType::F32, DType::F16, DType::BF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(Ops, EmbeddingAllDtypes) {
  CpuBackend cpu(2);
  std::mt19937 rng(1);
  for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
    TinyModel store;
    WeightView table = store.make("emb", 11, 13, dtype, rng, 1.0f);
    const std::vector<double> td = testing::to_double(table);
    const std::vector<int32_t> ids = {3, 0, 10, 3};
    std::vector<float> out(ids.size() * 13);
    cpu.embedding(table, ids.data(), static_cast<int>(ids.size()), out.data());
    for (size_t i = 0; i < ids.size(); ++i)
      for (int c = 0; c < 13; ++c) ASSERT_EQ(out[i * 13 + c], td[ids[i] * 13 + c]);
  }
}

TEST(Ops, RmsNorm) {
  CpuBackend cpu(2);
  std::mt19937 rng(2);
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (int d : {1, 7, 64, 333}) {
      const int m = 5;
      TinyModel store;
      WeightView g = store.make("g", 1, d, dtype, rng, 0.3f, 1.0f);
      const std::vector<double> gd = testing::to_double(g);
      const std::vector<float> x = random_vec(static_cast<size_t>(m) * d, rng, 3.0f);
      const float eps = 1e-5f;
      std::vector<double> want(x.size()), scale(x.size());
      for (int i = 0; i < m; ++i) {
        double ss = 0;
        for (int c = 0; c < d; ++c) ss += double(x[i * d + c]) * x[i * d + c];
        const double r = 1.0 / std::sqrt(ss / d + eps);
        for (int c = 0; c < d; ++c) {
          want[i * d + c] = gd[c] * x[i * d + c] * r;
          scale[i * d + c] = std::abs(want[i * d + c]);
        }
      }
      std::vector<float> out(x.size());
      cpu.rmsnorm(x.data(), g, m, eps, out.data());
      expect_close(out, want, scale, 1e-6, 1e-7, "rmsnorm d=" + std::to_string(d));
      std::vector<float> in_place = x;  // out may alias x
      cpu.rmsnorm(in_place.data(), g, m, eps, in_place.data());
      EXPECT_EQ(in_place, out);
    }
  }
}

TEST(Ops, SwigluAndAdd) {
  CpuBackend cpu(2);
  std::mt19937 rng(3);
  for (int64_t n : {1, 9, 100000}) {  // the last one takes the threaded path
    const std::vector<float> g = random_vec(n, rng, 4.0f), u = random_vec(n, rng);
    std::vector<float> out(n);
    cpu.swiglu(g.data(), u.data(), n, out.data());
    std::vector<double> want(n), scale(n);
    for (int64_t i = 0; i < n; ++i) {
      want[i] = double(g[i]) / (1 + std::exp(-double(g[i]))) * u[i];
      scale[i] = std::abs(want[i]);
    }
    expect_close(out, want, scale, 1e-6, 1e-7, "swiglu");
    std::vector<float> y = g;
    cpu.add(y.data(), u.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], g[i] + u[i]);
  }
}

// RoPE configurations: theta, scaling. Llama3 parameters put frequencies into all three bands.
ModelConfig rope_config(RopeScalingType type, int head_dim) {
  ModelConfig c = testing::tiny_config();
  c.head_dim = head_dim;
  c.rope_theta = 10000.0f;
  c.rope_scaling.type = type;
  if (type == RopeScalingType::Linear) c.rope_scaling.factor = 4.0f;
  if (type == RopeScalingType::Llama3) {
    c.rope_theta = 500000.0f;
    c.rope_scaling.factor = 8.0f;
    c.rope_scaling.low_freq_factor = 1.0f;
    c.rope_scaling.high_freq_factor = 4.0f;
    c.rope_scaling.original_max_position_embeddings = 64;
  }
  if (type == RopeScalingType::Yarn) {  // Qwen2.5-like: factor 4; 64 old positions put the ramp
    c.rope_theta = 1000000.0f;          // inside every head_dim below
    c.rope_scaling.factor = 4.0f;
    c.rope_scaling.original_max_position_embeddings = 64;
  }
  return c;
}

TEST(Rope, InverseFrequenciesMatchFormula) {
  for (auto type : {RopeScalingType::None, RopeScalingType::Linear, RopeScalingType::Llama3,
                    RopeScalingType::Yarn}) {
    for (int hd : {16, 64, 128}) {
      const ModelConfig c = rope_config(type, hd);
      const std::vector<float> got = rope_inv_freq(c);
      const std::vector<double> want = testing::reference_inv_freq(c);
      ASSERT_EQ(got.size(), want.size());
      for (size_t j = 0; j < got.size(); ++j) {
        EXPECT_NEAR(got[j], want[j], 2e-6 * want[j]) << "type " << int(type) << " j " << j;
      }
    }
  }
  // The llama3 and yarn cases really have unscaled, divided and blended frequencies at head_dim
  // 128.
  for (auto type : {RopeScalingType::Llama3, RopeScalingType::Yarn}) {
    const ModelConfig c = rope_config(type, 128);
    ModelConfig unscaled = c;
    unscaled.rope_scaling.type = RopeScalingType::None;
    const std::vector<double> plain = testing::reference_inv_freq(unscaled);
    const std::vector<double> scaled = testing::reference_inv_freq(c);
    int same = 0, divided = 0, blended = 0;
    for (size_t j = 0; j < plain.size(); ++j) {
      if (scaled[j] == plain[j])
        ++same;
      else if (std::abs(scaled[j] - plain[j] / c.rope_scaling.factor) < 1e-12 * plain[j])
        ++divided;
      else
        ++blended;
    }
    EXPECT_GT(same, 0) << int(type);
    EXPECT_GT(divided, 0) << int(type);
    EXPECT_GT(blended, 0) << int(type);
  }
}

TEST(Rope, RotatesLikeDirectFormula) {
  CpuBackend cpu(2);
  std::mt19937 rng(4);
  for (auto type : {RopeScalingType::None, RopeScalingType::Linear, RopeScalingType::Llama3}) {
    for (int hd : {16, 64}) {
      const ModelConfig c = rope_config(type, hd);
      const std::vector<float> inv = rope_inv_freq(c);
      const std::vector<double> inv_d = testing::reference_inv_freq(c);
      const int heads = 3, m = 6, pos = 37;
      std::vector<float> x = random_vec(static_cast<size_t>(m) * heads * hd, rng);
      std::vector<double> want(x.size()), scale(x.size(), 1.0);
      for (int i = 0; i < m; ++i)
        for (int h = 0; h < heads; ++h)
          for (int j = 0; j < hd / 2; ++j) {
            const size_t a = (static_cast<size_t>(i) * heads + h) * hd + j, b = a + hd / 2;
            const double angle = (pos + i) * inv_d[j];
            want[a] = x[a] * std::cos(angle) - x[b] * std::sin(angle);
            want[b] = x[b] * std::cos(angle) + x[a] * std::sin(angle);
          }
      cpu.rope(x.data(), m, heads, hd, pos, inv.data());
      // Angles reach ~42 rad and are computed in f32 (as HF does): ~1e-5 absolute.
      expect_close(x, want, scale, 0.0, 3e-5, "rope type " + std::to_string(int(type)));
    }
  }
  // Linear scaling by f == no scaling at positions divided by f.
  ModelConfig lin = rope_config(RopeScalingType::Linear, 16);
  ModelConfig none = rope_config(RopeScalingType::None, 16);
  std::vector<float> a = random_vec(16, rng), b = a;
  cpu.rope(a.data(), 1, 1, 16, 20, rope_inv_freq(lin).data());
  cpu.rope(b.data(), 1, 1, 16, 5, rope_inv_freq(none).data());
  for (int i = 0; i < 16; ++i) EXPECT_NEAR(a[i], b[i], 1e-5);
}

// The fused ops' defaults (Backend::add_rmsnorm, rope_qk, rope_qk_store_kv, store_kv_row_pair,
// which the CPU backend does not override) give exactly the results of the separate calls they
// stand for.
TEST(Ops, FusedDefaultsEqualSeparateCalls) {
  CpuBackend cpu(2);
  std::mt19937 rng(7);
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (int d : {7, 1000, 4096}) {
      for (int m : {1, 3, 16}) {
        TinyModel store;
        WeightView g = store.make("g", 1, d, dtype, rng, 0.3f, 1.0f);
        const std::vector<float> h0 = random_vec(static_cast<size_t>(m) * d, rng, 2.0f);
        const std::vector<float> x = random_vec(h0.size(), rng, 0.5f);
        std::vector<float> h_want = h0, out_want(h0.size(), NAN);
        cpu.add(h_want.data(), x.data(), static_cast<int64_t>(m) * d);
        cpu.rmsnorm(h_want.data(), g, m, 1e-5f, out_want.data());
        std::vector<float> h = h0, out(h0.size(), NAN);
        cpu.add_rmsnorm(h.data(), x.data(), g, m, 1e-5f, out.data());
        const std::string tag =
            std::string(dtype_name(dtype)) + " d=" + std::to_string(d) + " m=" + std::to_string(m);
        EXPECT_EQ(h, h_want) << tag;
        EXPECT_EQ(out, out_want) << tag;
      }
    }
  }
  for (int hd : {64, 128}) {
    const std::vector<float> inv = rope_inv_freq(rope_config(RopeScalingType::Llama3, hd));
    for (int group : {1, 4}) {
      const int heads = 8, kv_heads = heads / group;
      for (int m : {1, 3, 16}) {
        for (int pos : {0, 1000}) {
          const std::vector<float> q0 = random_vec(static_cast<size_t>(m) * heads * hd, rng);
          const std::vector<float> k0 = random_vec(static_cast<size_t>(m) * kv_heads * hd, rng);
          std::vector<float> q_want = q0, k_want = k0, q = q0, k = k0;
          cpu.rope(q_want.data(), m, heads, hd, pos, inv.data());
          cpu.rope(k_want.data(), m, kv_heads, hd, pos, inv.data());
          cpu.rope_qk(q.data(), k.data(), m, heads, kv_heads, hd, pos, inv.data());
          const std::string tag = "rope_qk hd=" + std::to_string(hd) +
                                  " group=" + std::to_string(group) + " m=" + std::to_string(m);
          EXPECT_EQ(q, q_want) << tag;
          EXPECT_EQ(k, k_want) << tag;
          // rope_qk_store_kv: the same rotation, and the rows as store_kv_row_pair writes them.
          const size_t n = k0.size();
          const std::vector<float> v = random_vec(n, rng);
          std::vector<uint16_t> k16_want(n), v16_want(n), k16(n, 0x7e01), v16(n, 0x7e01);
          cpu.store_kv_row_pair(k16_want.data(), v16_want.data(), DType::F16, k_want.data(),
                                v.data(), n);
          std::vector<float> q2 = q0, k2 = k0;
          const RopeQK rope{q2.data(), heads, kv_heads, hd, inv.data()};
          cpu.rope_qk_store_kv(rope, m, pos, k2.data(), v.data(), k16.data(), v16.data(),
                               DType::F16);
          EXPECT_EQ(q2, q_want) << tag;
          EXPECT_EQ(k2, k_want) << tag;
          EXPECT_EQ(k16, k16_want) << tag;
          EXPECT_EQ(v16, v16_want) << tag;
        }
      }
    }
  }
  for (size_t n : {size_t{1}, size_t{1001}, size_t{4096}}) {
    std::vector<float> k = random_vec(n, rng, 1e4f), v = random_vec(n, rng, 3.0f);
    k[0] = 1e6f;  // saturates in f16
    std::vector<uint16_t> k16_want(n), v16_want(n), k16(n, 0x7e01), v16(n, 0x7e01);
    cpu.store_kv_rows(k16_want.data(), DType::F16, k.data(), n);
    cpu.store_kv_rows(v16_want.data(), DType::F16, v.data(), n);
    cpu.store_kv_row_pair(k16.data(), v16.data(), DType::F16, k.data(), v.data(), n);
    EXPECT_EQ(k16, k16_want) << "f16 n=" << n;
    EXPECT_EQ(v16, v16_want) << "f16 n=" << n;
    std::vector<float> k32(n, NAN), v32(n, NAN);
    cpu.store_kv_row_pair(k32.data(), v32.data(), DType::F32, k.data(), v.data(), n);
    EXPECT_EQ(k32, k) << "f32 n=" << n;
    EXPECT_EQ(v32, v) << "f32 n=" << n;
  }
}

// softmax(q k^T * scale) v over positions [0, pos + i] for query row i.
std::vector<double> reference_attention(const std::vector<float>& q, int m, int pos,
                                        const AttentionShape& s, const std::vector<float>& k,
                                        const std::vector<float>& v, int64_t stride) {
  const int hd = s.head_dim, group = s.num_heads / s.num_kv_heads;
  std::vector<double> out(static_cast<size_t>(m) * s.num_heads * hd, 0.0);
  for (int i = 0; i < m; ++i)
    for (int h = 0; h < s.num_heads; ++h) {
      const int kvh = h / group, len = pos + i + 1;
      std::vector<double> p(len);
      double mx = -1e300, sum = 0;
      for (int t = 0; t < len; ++t) {
        double dot = 0;
        for (int c = 0; c < hd; ++c)
          dot += double(q[(i * s.num_heads + h) * hd + c]) * k[t * stride + kvh * hd + c];
        p[t] = dot * s.scale;
        mx = std::max(mx, p[t]);
      }
      for (double& e : p) sum += (e = std::exp(e - mx));
      for (int t = 0; t < len; ++t)
        for (int c = 0; c < hd; ++c)
          out[(i * s.num_heads + h) * hd + c] += p[t] / sum * v[t * stride + kvh * hd + c];
    }
  return out;
}

TEST(Attention, MatchesNaiveSoftmaxWithGqaAndCausalRows) {
  std::mt19937 rng(5);
  // Thread counts change how query-head groups are split into tasks.
  for (int threads : {2, 5})
    for (int ratio : {1, 2, 3, 4}) {
      CpuBackend cpu(threads);
      for (int hd : {16, 64}) {
        for (auto [m, pos] : {std::pair{1, 0}, {1, 40}, {7, 0}, {5, 23}, {16, 3}}) {
          AttentionShape s{2 * ratio, 2, hd, static_cast<float>(1.0 / std::sqrt(double(hd)))};
          const int len = pos + m;
          const int64_t stride = s.num_kv_heads * hd + 8;  // padded rows: the view's stride is used
          const std::vector<float> q = random_vec(static_cast<size_t>(m) * s.num_heads * hd, rng);
          const std::vector<float> k = random_vec(len * stride, rng, 2.0f);
          const std::vector<float> v = random_vec(len * stride, rng);
          const KvView view{k.data(), v.data(), stride, len};
          std::vector<float> out(q.size(), NAN);
          cpu.attention(q.data(), m, pos, s, view, out.data());
          const std::vector<double> want = reference_attention(q, m, pos, s, k, v, stride);
          expect_close(out, want, std::vector<double>(want.size(), 1.0), 0.0, 2e-6,
                       "attention ratio " + std::to_string(ratio) + " m " + std::to_string(m) +
                           " pos " + std::to_string(pos));
        }
      }
    }
}

TEST(Attention, ExtraCachedRowsAreIgnored) {
  // Rows of the view past pos + m (stale rows after a rollback) must not be read.
  CpuBackend cpu(2);
  std::mt19937 rng(6);
  AttentionShape s{4, 2, 16, 0.25f};
  const int m = 3, pos = 10, len = 20;
  const int64_t stride = 32;
  const std::vector<float> q = random_vec(m * 64, rng);
  std::vector<float> k = random_vec(len * stride, rng), v = random_vec(len * stride, rng);
  std::vector<float> out1(q.size()), out2(q.size());
  cpu.attention(q.data(), m, pos, s, KvView{k.data(), v.data(), stride, len}, out1.data());
  for (int t = pos + m; t < len; ++t)
    for (int c = 0; c < stride; ++c) k[t * stride + c] = v[t * stride + c] = 1e6f;
  cpu.attention(q.data(), m, pos, s, KvView{k.data(), v.data(), stride, len}, out2.data());
  EXPECT_EQ(out1, out2);
}

}  // namespace
}  // namespace qs
