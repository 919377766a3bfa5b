// The decode GEMVs' fused epilogues on CUDA against the same backend's separate launches; the
// contract is the same bits.
//
// Backend::linear_add_rmsnorm (gemv_norm.cuh: the products added into h where the GEMV would
// store them, the last block normalizing). Fused: one row (bf16 / f16 weights on the ring kernel,
// its 4 and 6 stages; 4-bit weights on the persistent kernel); the other cases (several rows, f32
// weights) take the separate launches and must give the same. Every case runs on one backend in
// sequence, so a block counter left non-zero by one launch would leave the next one's output
// unwritten (poisoned).
//
// Backend::gate_up_swiglu (tiles of 8 gate and the same 8 up rows that store their SwiGLU, or
// each block takes a gate tile, then the same rows' up tile: the tunings' swiglu_mixed). Fused:
// bf16 / f16 weights at m = 1..16, 4-bit weights at m = 1; the rest falls back.
//
// Backend::linear_add_rmsnorm_deferred and its consumers (the draft's norm applied on load by the
// next 4-bit launch): within a bound of the materialized chain, not bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/quant_ops.h"
#include "cuda_test_util.h"
#include "quant/weight_quant.h"

namespace qs {
namespace {

using testing::CudaOpsTest;
using testing::DeviceArray;
using testing::HostWeight;
using testing::random_normal;

constexpr float kEps = 1e-5f;

// Runs body(tag) under each 4-bit kernel for m = 1 worth covering: the automatic one and the
// pair kernel (Q4GemvTuning::kernel 10), restoring the tuning after.
template <class Body>
void for_each_q4_kernel(Body body) {
  const cuda::Q4GemvTuning saved = cuda::q4_gemv_tuning();
  for (int kernel : {0, cuda::kQ4PairKernel}) {
    cuda::Q4GemvTuning t = saved;
    t.kernel = kernel;
    cuda::set_q4_gemv_tuning(t);
    body("kernel " + std::to_string(kernel) + " ");
  }
  cuda::set_q4_gemv_tuning(saved);
}

// Runs op both ways from the same h and compares; `tag` names the case.
void expect_fused_equals_separate(CudaBackend& gpu, const LinearOp& op, int64_t d, int m,
                                  const WeightView& norm, uint64_t seed, const std::string& tag) {
  const int64_t k = op.w4 != nullptr ? op.w4->cols : op.w->cols;
  const std::vector<float> x = random_normal(static_cast<size_t>(m * k), seed);
  const std::vector<float> h0 = random_normal(static_cast<size_t>(m * d), seed + 1, 2.0f);
  const DeviceArray xd(gpu, x);

  DeviceArray y(gpu, m * d), h_sep(gpu, h0), out_sep(gpu, m * d);
  if (op.w4 != nullptr) {
    gpu.matmul_q4(xd.data(), m, *op.w4, op.bias, y.data());
  } else {
    gpu.matmul(xd.data(), m, *op.w, op.bias, y.data());
  }
  gpu.add_rmsnorm(h_sep.data(), y.data(), norm, m, kEps, out_sep.data());

  DeviceArray scratch(gpu, m * d), h(gpu, h0), out(gpu, m * d);
  out.poison();
  LinearOp fused = op;
  fused.y = scratch.data();
  gpu.linear_add_rmsnorm(xd.data(), m, fused, h.data(), norm, kEps, out.data());
  EXPECT_EQ(h.to_host(), h_sep.to_host()) << tag;
  EXPECT_EQ(out.to_host(), out_sep.to_host()) << tag;
}

TEST_F(CudaOpsTest, LinearAddRmsNormMatchesSeparateOps) {
  struct Shape {
    int64_t d, k;
  };
  // {4096, 4096}: a 7B/8B o_proj; {1000, 520}: a partial last tile, K not a whole ring stage;
  // {33808, 64}: past 16 tiles per SM (6 ring stages), a row longer than one norm chunk.
  const Shape shapes[] = {{4096, 4096}, {1000, 520}, {33808, 64}};
  uint64_t seed = 1;
  for (DType dt : {DType::BF16, DType::F16, DType::F32}) {
    for (const Shape& s : shapes) {
      HostWeight w(random_normal(static_cast<size_t>(s.d * s.k), 10 + s.d, 0.05f), dt, s.d, s.k,
                   "w");
      HostWeight b(random_normal(static_cast<size_t>(s.d), 20 + s.d, 0.5f), dt, 1, s.d, "b");
      HostWeight norm(random_normal(static_cast<size_t>(s.d), 30 + s.d, 0.3f, 1.0f), dt, 1, s.d,
                      "norm");
      for (int m : {1, 4, 9, 16, 17}) {
        for (bool bias : {false, true}) {
          const LinearOp op{&w.view, nullptr, bias ? &b.view : nullptr, nullptr};
          expect_fused_equals_separate(gpu(), op, s.d, m, norm.view, ++seed,
                                       std::string(dtype_name(dt)) + " d=" + std::to_string(s.d) +
                                           " k=" + std::to_string(s.k) + " m=" + std::to_string(m) +
                                           (bias ? " +bias" : ""));
        }
      }
      gpu().release_weights();
    }
  }
}

TEST_F(CudaOpsTest, LinearAddRmsNormQ4MatchesSeparateOps) {
  struct Shape {
    int64_t d, k;
  };
  // An o_proj, a down_proj (K = 11008: 86 groups over 16 warps), a partial last tile and an odd
  // tile count (63 tiles: the pair kernel's last pair has one).
  const Shape shapes[] = {{4096, 4096}, {2048, 11008}, {1000, 1024}, {1000, 512}};
  for_each_q4_kernel([&](const std::string& kernel) {
    uint64_t seed = 100;
    for (const Shape& s : shapes) {
      std::vector<float> wv = random_normal(static_cast<size_t>(s.d * s.k), 40 + s.d, 0.05f);
      auto q = quantize_weight4(wv.data(), DType::F32, s.d, s.k, 128, "w4");
      ASSERT_TRUE(q.ok());
      const QuantizedWeight4 w4 = std::move(q).value();
      HostWeight norm(random_normal(static_cast<size_t>(s.d), 50 + s.d, 0.3f, 1.0f), DType::BF16, 1,
                      s.d, "norm");
      for (int m : {1, 2}) {
        const LinearOp op{nullptr, &w4, nullptr, nullptr};
        expect_fused_equals_separate(gpu(), op, s.d, m, norm.view, ++seed,
                                     kernel + "q4 d=" + std::to_string(s.d) +
                                         " k=" + std::to_string(s.k) + " m=" + std::to_string(m));
      }
      gpu().release_weights();
    }
  });
}

// gate_up_swiglu both ways from the same x; gate / up: {w, w4, bias} (y set here).
void expect_swiglu_equals_separate(CudaBackend& gpu, LinearOp gate, LinearOp up, int64_t n,
                                   int64_t k, int m, uint64_t seed, const std::string& tag) {
  const std::vector<float> x = random_normal(static_cast<size_t>(m * k), seed);
  const DeviceArray xd(gpu, x);
  DeviceArray g(gpu, m * n), u(gpu, m * n), want(gpu, m * n);
  gate.y = g.data();
  up.y = u.data();
  const LinearOp ops[2] = {gate, up};
  gpu.matmul_group(xd.data(), m, ops, 2);
  gpu.swiglu(g.data(), u.data(), m * n, want.data());

  DeviceArray g2(gpu, m * n), u2(gpu, m * n), out(gpu, m * n);
  out.poison();
  gate.y = g2.data();
  up.y = u2.data();
  gpu.gate_up_swiglu(xd.data(), m, gate, up, out.data());
  EXPECT_EQ(out.to_host(), want.to_host()) << tag;
  // In place into gate.y, as the model calls it.
  gpu.gate_up_swiglu(xd.data(), m, gate, up, g2.data());
  EXPECT_EQ(g2.to_host(), want.to_host()) << tag << " (in place)";
}

struct SwigluShape {
  int64_t n, k;
};

// expect_swiglu_equals_separate for every shape, dtype, m in {1, 4, 9, 16, 17}, with and without
// biases.
void swiglu_sweep(CudaBackend& gpu, const std::vector<SwigluShape>& shapes,
                  const std::vector<DType>& dtypes, uint64_t seed, const std::string& tag) {
  for (DType dt : dtypes) {
    for (const SwigluShape& s : shapes) {
      HostWeight wg(random_normal(static_cast<size_t>(s.n * s.k), 60 + s.n, 0.05f), dt, s.n, s.k,
                    "gate");
      HostWeight wu(random_normal(static_cast<size_t>(s.n * s.k), 70 + s.n, 0.05f), dt, s.n, s.k,
                    "up");
      HostWeight bg(random_normal(static_cast<size_t>(s.n), 80 + s.n, 0.5f), dt, 1, s.n, "bg");
      HostWeight bu(random_normal(static_cast<size_t>(s.n), 90 + s.n, 0.5f), dt, 1, s.n, "bu");
      for (int m : {1, 4, 9, 16, 17}) {
        for (bool bias : {false, true}) {
          const LinearOp gate{&wg.view, nullptr, bias ? &bg.view : nullptr, nullptr};
          const LinearOp up{&wu.view, nullptr, bias ? &bu.view : nullptr, nullptr};
          expect_swiglu_equals_separate(gpu, gate, up, s.n, s.k, m, ++seed,
                                        tag + dtype_name(dt) + " n=" + std::to_string(s.n) +
                                            " k=" + std::to_string(s.k) +
                                            " m=" + std::to_string(m) + (bias ? " +bias" : ""));
        }
      }
      gpu.release_weights();
    }
  }
}

// The ring kernel's paired walk (GemvTuning::swiglu_mixed off: QS_SWIGLU_MIXED=0).
TEST_F(CudaOpsTest, GateUpSwigluMatchesSeparateOps) {
  const cuda::GemvTuning saved = cuda::gemv_tuning();
  cuda::GemvTuning t = saved;
  t.swiglu_mixed = false;
  cuda::set_gemv_tuning(t);
  // {11008, 4096}: Llama-2-7B; {1000, 520}: a partial last tile, K not a whole ring stage;
  // {17000, 64}: 2126 tiles in all (past 16 per SM: 6 ring stages), an odd pair count per block.
  swiglu_sweep(gpu(), {{11008, 4096}, {1000, 520}, {17000, 64}},
               {DType::BF16, DType::F16, DType::F32}, 500, "");
  cuda::set_gemv_tuning(saved);
}

// The ring kernel's mixed tiles (GemvTuning::swiglu_mixed, the default: 8 gate rows and the same
// 8 up rows per tile): the same bits. {1003, 520}: a last tile of 3 rows; {17000, 64}: 2125 tiles
// (6 stages).
TEST_F(CudaOpsTest, GateUpSwigluMixedTilesMatchSeparateOps) {
  const cuda::GemvTuning saved = cuda::gemv_tuning();
  cuda::GemvTuning t = saved;
  t.swiglu_mixed = true;
  cuda::set_gemv_tuning(t);
  swiglu_sweep(gpu(), {{11008, 4096}, {1003, 520}, {17000, 64}, {14336, 4096}},
               {DType::BF16, DType::F16}, 550, "mixed ");
  cuda::set_gemv_tuning(saved);
}

// The 4-bit form at m = 1 (the persistent kernel) and 2 (the separate launches).
void swiglu_q4_sweep(CudaBackend& gpu, uint64_t seed, const std::string& tag) {
  // {1000, 1024}: a last 16-row tile of 8 rows; {300, 11008}: of 12 rows (a last 8-row tile of 4).
  const SwigluShape shapes[] = {{11008, 4096}, {1000, 1024}, {300, 11008}};
  for (const SwigluShape& s : shapes) {
    std::vector<float> a = random_normal(static_cast<size_t>(s.n * s.k), 100 + s.n, 0.05f);
    std::vector<float> b = random_normal(static_cast<size_t>(s.n * s.k), 110 + s.n, 0.05f);
    auto qa = quantize_weight4(a.data(), DType::F32, s.n, s.k, 128, "gate4");
    auto qb = quantize_weight4(b.data(), DType::F32, s.n, s.k, 128, "up4");
    ASSERT_TRUE(qa.ok() && qb.ok());
    const QuantizedWeight4 wg = std::move(qa).value(), wu = std::move(qb).value();
    for (int m : {1, 2}) {
      const LinearOp gate{nullptr, &wg, nullptr, nullptr}, up{nullptr, &wu, nullptr, nullptr};
      expect_swiglu_equals_separate(gpu, gate, up, s.n, s.k, m, ++seed,
                                    tag + "q4 n=" + std::to_string(s.n) +
                                        " k=" + std::to_string(s.k) + " m=" + std::to_string(m));
    }
    gpu.release_weights();
  }
}

TEST_F(CudaOpsTest, GateUpSwigluQ4MatchesSeparateOps) {
  for_each_q4_kernel([&](const std::string& kernel) { swiglu_q4_sweep(gpu(), 600, kernel); });
}

// Backend::linear_add_rmsnorm_deferred and its consumers (the draft's norms: a 4-bit producer at
// m = 1 leaves per-block sums of squares, the next 4-bit launch normalizes on load) against the
// materialized chain: h bit for bit, the consumers' outputs within the f32 rounding of moving
// 1 / rms from each input to each sum (1e-5; a wrong or missing norm is O(1)), and a dense
// consumer (not deferrable) bit for bit through the fallback's rmsnorm. A producer at m = 2 must
// not defer. Under the current 4-bit tuning; `kernel` prefixes the failure messages.
void deferred_norm_chain(CudaBackend& gpu, const std::string& kernel) {
  const int64_t d = 4096, k_in = 4096, n_mlp = 1024;
  auto q4 = [](int64_t rows, int64_t cols, uint64_t seed) {
    std::vector<float> wv = random_normal(static_cast<size_t>(rows * cols), seed, 0.05f);
    auto q = quantize_weight4(wv.data(), DType::F32, rows, cols, 128, "w4");
    EXPECT_TRUE(q.ok());
    return std::move(q).value();
  };
  const QuantizedWeight4 wo = q4(d, k_in, 300), wq = q4(d, d, 301), wk = q4(1024, d, 302),
                         wv = q4(1024, d, 303), wg = q4(n_mlp, d, 304), wu = q4(n_mlp, d, 305);
  HostWeight bq(random_normal(static_cast<size_t>(d), 306, 0.5f), DType::F32, 1, d, "bq");
  HostWeight dense(random_normal(static_cast<size_t>(256 * d), 307, 0.05f), DType::BF16, 256, d,
                   "dense");
  for (DType norm_dt : {DType::BF16, DType::F32}) {
    HostWeight norm(random_normal(static_cast<size_t>(d), 310, 0.3f, 1.0f), norm_dt, 1, d, "norm");
    const std::string tag = kernel + "norm " + dtype_name(norm_dt);
    for (int m : {1, 2}) {
      const std::vector<float> x = random_normal(static_cast<size_t>(m * k_in), 311 + m);
      const std::vector<float> h0 = random_normal(static_cast<size_t>(m * d), 313 + m, 2.0f);
      const DeviceArray xd(gpu, x);
      DeviceArray scratch(gpu, m * d), h_ref(gpu, h0), out_ref(gpu, m * d);
      gpu.linear_add_rmsnorm(xd.data(), m, LinearOp{nullptr, &wo, nullptr, scratch.data()},
                             h_ref.data(), norm.view, kEps, out_ref.data());
      DeviceArray h(gpu, h0), out(gpu, m * d);
      out.poison();
      PendingNorm pn{h.data(), &norm.view, kEps, out.data(), false};
      gpu.linear_add_rmsnorm_deferred(xd.data(), m, LinearOp{nullptr, &wo, nullptr, scratch.data()},
                                      pn);
      EXPECT_EQ(pn.deferred, m == 1) << tag << " m=" << m;
      EXPECT_EQ(h.to_host(), h_ref.to_host()) << tag << " m=" << m;
      // q / k / v (a bias on q) and gate / up with their SwiGLU, read both ways.
      auto qkv = [&](std::vector<DeviceArray>& ys) {
        return std::vector<LinearOp>{{nullptr, &wq, &bq.view, ys[0].data()},
                                     {nullptr, &wk, nullptr, ys[1].data()},
                                     {nullptr, &wv, nullptr, ys[2].data()}};
      };
      std::vector<DeviceArray> want, got;
      for (int64_t rows : {d, int64_t{1024}, int64_t{1024}}) {
        want.emplace_back(gpu, m * rows);
        got.emplace_back(gpu, m * rows);
      }
      gpu.matmul_group(out_ref.data(), m, qkv(want).data(), 3);
      gpu.matmul_group_normed(pn, m, qkv(got).data(), 3);
      for (int i = 0; i < 3; ++i) {
        EXPECT_LT(testing::rel_error(got[i].to_host(), want[i].to_host()), 1e-5)
            << tag << " m=" << m << " qkv " << i;
      }
      DeviceArray g(gpu, m * n_mlp), u(gpu, m * n_mlp), mlp_want(gpu, m * n_mlp),
          mlp_got(gpu, m * n_mlp);
      gpu.gate_up_swiglu(out_ref.data(), m, LinearOp{nullptr, &wg, nullptr, g.data()},
                         LinearOp{nullptr, &wu, nullptr, u.data()}, mlp_want.data());
      mlp_got.poison();
      gpu.gate_up_swiglu_normed(pn, m, LinearOp{nullptr, &wg, nullptr, g.data()},
                                LinearOp{nullptr, &wu, nullptr, u.data()}, mlp_got.data());
      EXPECT_LT(testing::rel_error(mlp_got.to_host(), mlp_want.to_host()), 1e-5)
          << tag << " m=" << m << " gate/up";
      // A dense consumer: the fallback normalizes h into out first.
      DeviceArray yd_want(gpu, m * 256), yd_got(gpu, m * 256);
      gpu.matmul(out_ref.data(), m, dense.view, nullptr, yd_want.data());
      const LinearOp dense_op{&dense.view, nullptr, nullptr, yd_got.data()};
      gpu.matmul_group_normed(pn, m, &dense_op, 1);
      EXPECT_EQ(yd_got.to_host(), yd_want.to_host()) << tag << " m=" << m << " dense";
      EXPECT_EQ(out.to_host(), out_ref.to_host()) << tag << " m=" << m << " materialized";
    }
    gpu.release_weights();
  }
}

// The chain above under the automatic 4-bit kernel and the pair kernel.
TEST_F(CudaOpsTest, DeferredNormMatchesTheMaterializedChain) {
  for_each_q4_kernel([&](const std::string& kernel) { deferred_norm_chain(gpu(), kernel); });
}

// The first index where two float vectors differ in bits (NaN-poisoned outputs included; f16
// rows packed into floats compare as bit patterns); -1 if none; with different sizes, the
// smaller size. An index keeps a failure's message short.
int64_t first_bit_difference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return static_cast<int64_t>(std::min(a.size(), b.size()));
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return static_cast<int64_t>(i);
  }
  return -1;
}

// A layer test's vectors: the biases of o, q (f32) and k (bf16), both norms' weights (the
// next one's in next_norm_dtype) and RoPE's inverse frequencies (theta 500000), from seed + 7.
struct LayerVectors {
  HostWeight bo, bq, bk, mlp_norm, next_norm;
  std::vector<float> inv_freq;

  LayerVectors(int64_t d, int64_t kv, int head_dim, uint64_t seed, DType next_norm_dtype)
      : bo(random_normal(static_cast<size_t>(d), seed + 7, 0.5f), DType::F32, 1, d, "bo"),
        bq(random_normal(static_cast<size_t>(d), seed + 8, 0.5f), DType::F32, 1, d, "bq"),
        bk(random_normal(static_cast<size_t>(kv), seed + 9, 0.5f), DType::BF16, 1, kv, "bk"),
        mlp_norm(random_normal(static_cast<size_t>(d), seed + 10, 0.3f, 1.0f), DType::BF16, 1, d,
                 "mlp_norm"),
        next_norm(random_normal(static_cast<size_t>(d), seed + 11, 0.3f, 1.0f), next_norm_dtype, 1,
                  d, "next_norm"),
        inv_freq(static_cast<size_t>(head_dim / 2)) {
    for (int i = 0; i < head_dim / 2; ++i) {
      inv_freq[i] = static_cast<float>(1.0 / std::pow(500000.0, 2.0 * i / head_dim));
    }
  }
};

// Random 4-bit weights (group 128) of rows x cols from seed.
QuantizedWeight4 random_q4(int64_t rows, int64_t cols, uint64_t seed) {
  std::vector<float> wv = random_normal(static_cast<size_t>(rows * cols), seed, 0.05f);
  auto q = quantize_weight4(wv.data(), DType::F32, rows, cols, 128, "w4");
  EXPECT_TRUE(q.ok());
  return std::move(q).value();
}

// A draft layer's 4-bit o, gate, up, down and next q, k, v (kv = d / 4 rows) and its vectors.
struct Q4Layer {
  int64_t d, ffn, kv;
  int head_dim;
  QuantizedWeight4 wo, wg, wu, wd, wq, wk, wv;
  LayerVectors vec;

  Q4Layer(int64_t d_, int64_t ffn_, int head_dim_, uint64_t seed)
      : d(d_),
        ffn(ffn_),
        kv(d_ / 4),
        head_dim(head_dim_),
        wo(random_q4(d_, d_, seed)),
        wg(random_q4(ffn_, d_, seed + 1)),
        wu(random_q4(ffn_, d_, seed + 2)),
        wd(random_q4(d_, ffn_, seed + 3)),
        wq(random_q4(d_, d_, seed + 4)),
        wk(random_q4(d_ / 4, d_, seed + 5)),
        wv(random_q4(d_ / 4, d_, seed + 6)),
        vec(d_, d_ / 4, head_dim_, seed, DType::BF16) {}

  // Backend::output_and_mlp of this layer from x and h0 (m rows) with the next q/k/v's K/V rows
  // (rows_dtype, position 131000) under the current tuning: h, act, q, k, v and the K/V rows
  // (kOutputNames).
  std::vector<std::vector<float>> output_and_mlp(CudaBackend& gpu, const DeviceArray& x,
                                                 const std::vector<float>& h0, int m,
                                                 DType rows_dtype) const {
    DeviceArray h(gpu, h0), x_rows(gpu, m * d), proj(gpu, m * d), g(gpu, m * ffn), u(gpu, m * ffn),
        act(gpu, m * ffn), q(gpu, m * d), k(gpu, m * kv), v(gpu, m * kv), k_rows(gpu, m * kv),
        v_rows(gpu, m * kv);
    for (DeviceArray* a : {&x_rows, &act, &q, &k, &v, &k_rows, &v_rows}) a->poison();
    PendingNorm mid{h.data(), &vec.mlp_norm.view, kEps, x_rows.data(), false};
    PendingNorm next{h.data(), &vec.next_norm.view, kEps, x_rows.data(), false};
    const LinearOp qkv[] = {{nullptr, &wq, &vec.bq.view, q.data()},
                            {nullptr, &wk, &vec.bk.view, k.data()},
                            {nullptr, &wv, nullptr, v.data()}};
    const KvRowStore rows{RopeQK{q.data(), static_cast<int>(d / head_dim),
                                 static_cast<int>(kv / head_dim), head_dim, vec.inv_freq.data()},
                          131000, k_rows.data(), v_rows.data(), rows_dtype};
    gpu.output_and_mlp(x.data(), m, LinearOp{nullptr, &wo, &vec.bo.view, proj.data()}, mid,
                       LinearOp{nullptr, &wg, nullptr, g.data()},
                       LinearOp{nullptr, &wu, nullptr, u.data()}, act.data(),
                       LinearOp{nullptr, &wd, nullptr, proj.data()}, next, qkv, 3, &rows);
    return {h.to_host(), act.to_host(),    q.to_host(),     k.to_host(),
            v.to_host(), k_rows.to_host(), v_rows.to_host()};
  }
  static constexpr const char* kOutputNames[7] = {"h", "SwiGLU rows", "q",     "k",
                                                  "v", "K rows",      "V rows"};
};

// Backend::output_and_mlp of a draft layer (4-bit, both norms deferred) with its next q/k/v and
// K/V rows, with Q4GemvTuning::qkv_rows (the q/k/v launch of kernel 10 rotates q and k and
// stores the rows: launch_gemv_q4_qkv_rows) against the separate q/k/v and RoPE + store
// launches, from the same h: h, the SwiGLU rows, q, k, v (biases on q and k) and the K/V rows
// (f32 and f16, at a position near 128K), bit for bit; the fused launch must have run at m = 1
// and not at m = 2. Shapes: Llama-like (heads of 128), heads of 64.
void q4_qkv_rows_case(CudaBackend& gpu, int64_t d, int64_t ffn, int head_dim, uint64_t seed) {
  const Q4Layer layer(d, ffn, head_dim, seed);
  const std::string tag = "d=" + std::to_string(d) + " head_dim=" + std::to_string(head_dim);
  for (int m : {1, 2}) {
    const std::vector<float> x = random_normal(static_cast<size_t>(m * d), seed + 12 + m);
    const std::vector<float> h0 = random_normal(static_cast<size_t>(m * d), seed + 14 + m, 2.0f);
    const DeviceArray xd(gpu, x);
    auto run = [&](bool fused, DType rows_dtype) {
      cuda::Q4GemvTuning t = cuda::q4_gemv_tuning();
      t.qkv_rows = fused;
      cuda::set_q4_gemv_tuning(t);
      const uint64_t launches = cuda::gemv_q4_qkv_rows_launches();
      auto outs = layer.output_and_mlp(gpu, xd, h0, m, rows_dtype);
      EXPECT_EQ(cuda::gemv_q4_qkv_rows_launches() - launches, fused && m == 1 ? 1u : 0u) << tag;
      return outs;
    };
    for (const DType rows_dtype : {DType::F32, DType::F16}) {
      const auto want = run(false, rows_dtype);
      const auto got = run(true, rows_dtype);
      const std::string at =
          tag + " m=" + std::to_string(m) + " " + dtype_name(rows_dtype) + " rows";
      for (int i = 0; i < 7; ++i) {
        EXPECT_EQ(first_bit_difference(got[i], want[i]), -1)
            << at << " " << Q4Layer::kOutputNames[i];
      }
    }
  }
  cuda::Q4GemvTuning t = cuda::q4_gemv_tuning();
  t.qkv_rows = false;
  cuda::set_q4_gemv_tuning(t);
  gpu.release_weights();
}

TEST_F(CudaOpsTest, Q4QkvRowsEqualTheSeparateLaunches) {
  const cuda::Q4GemvTuning saved = cuda::q4_gemv_tuning();
  q4_qkv_rows_case(gpu(), 2048, 5504, 128, 400);
  q4_qkv_rows_case(gpu(), 1024, 2816, 64, 460);
  cuda::set_q4_gemv_tuning(saved);
}

// Backend::output_and_mlp of a bf16 / f16 layer (o, gate / up with its SwiGLU, down, the next
// layer's q/k/v with both norms deferred) under GemvTuning `got` against `want`, from the same h:
// h, both norms' rows (separate buffers here; the model shares one), the SwiGLU rows, q, k, v
// (rotated) and the K/V rows (f32 and f16, at a position near 128K), bit for bit. With qkv_rows
// (the q/k/v launch rotates q and k and stores the K/V rows in its epilogue) that launch must have
// run (its launch count) where there are rows at m = 1, and not at m > 1. With defer_norm (m = 1)
// both norms are deferred and their rows not written (not compared), and gate / up reads the MLP
// norm on load (the q/k/v launch the next one, where it has rows).
void dense_layer_case(CudaBackend& gpu, DType dt, int64_t d, int64_t ffn, int head_dim,
                      uint64_t seed, const cuda::GemvTuning& want_tuning,
                      const cuda::GemvTuning& got_tuning) {
  auto weight = [&](int64_t rows, int64_t cols, uint64_t s, const char* name) {
    return HostWeight(random_normal(static_cast<size_t>(rows * cols), s, 0.05f), dt, rows, cols,
                      name);
  };
  const int64_t kv = d % 512 == 0 ? d / 4 : d / 4 + 8;  // odd tile counts off the head sizes
  const HostWeight wo = weight(d, d, seed, "wo"), wg = weight(ffn, d, seed + 1, "wg"),
                   wu = weight(ffn, d, seed + 2, "wu"), wd = weight(d, ffn, seed + 3, "wd"),
                   wq = weight(d, d, seed + 4, "wq"), wk = weight(kv, d, seed + 5, "wk"),
                   wv = weight(kv, d, seed + 6, "wv");
  const LayerVectors vec(d, kv, head_dim, seed, DType::F32);
  const HostWeight &bo = vec.bo, &bq = vec.bq, &bk = vec.bk, &mlp_norm = vec.mlp_norm,
                   &next_norm = vec.next_norm;
  const std::vector<float>& inv_freq = vec.inv_freq;
  const std::string tag =
      std::string(dtype_name(dt)) + " d=" + std::to_string(d) + " ffn=" + std::to_string(ffn);
  const bool with_rows = kv % head_dim == 0;
  for (int m : {1, 2, 4}) {  // 4: a γ = 3 verification's rows
    const std::vector<float> x = random_normal(static_cast<size_t>(m * d), seed + 12 + m);
    const std::vector<float> h0 = random_normal(static_cast<size_t>(m * d), seed + 14 + m, 2.0f);
    const DeviceArray xd(gpu, x);
    struct Run {
      std::vector<float> h, mid_out, next_out, act, q, k, v, k_rows, v_rows;
    };
    auto run = [&](const cuda::GemvTuning& t, DType rows_dtype) {
      cuda::set_gemv_tuning(t);
      DeviceArray h(gpu, h0), mid_out(gpu, m * d), next_out(gpu, m * d), proj(gpu, m * d),
          g(gpu, m * ffn), u(gpu, m * ffn), act(gpu, m * ffn), q(gpu, m * d), k(gpu, m * kv),
          v(gpu, m * kv), k_rows(gpu, m * kv), v_rows(gpu, m * kv);
      for (DeviceArray* a : {&mid_out, &next_out, &act, &q, &k, &v, &k_rows, &v_rows}) a->poison();
      PendingNorm mid{h.data(), &mlp_norm.view, kEps, mid_out.data(), false};
      PendingNorm next{h.data(), &next_norm.view, 2 * kEps, next_out.data(), false};
      const LinearOp qkv[] = {{&wq.view, nullptr, &bq.view, q.data()},
                              {&wk.view, nullptr, &bk.view, k.data()},
                              {&wv.view, nullptr, nullptr, v.data()}};
      const KvRowStore rows{RopeQK{q.data(), static_cast<int>(d / head_dim),
                                   static_cast<int>(kv / head_dim), head_dim, inv_freq.data()},
                            131000, k_rows.data(), v_rows.data(), rows_dtype};
      const uint64_t qkv_launches = cuda::gemv_qkv_rows_launches();
      const uint64_t norm_in_launches = cuda::gemv_norm_in_launches();
      gpu.output_and_mlp(xd.data(), m, LinearOp{&wo.view, nullptr, &bo.view, proj.data()}, mid,
                         LinearOp{&wg.view, nullptr, nullptr, g.data()},
                         LinearOp{&wu.view, nullptr, nullptr, u.data()}, act.data(),
                         LinearOp{&wd.view, nullptr, nullptr, proj.data()}, next, qkv, 3,
                         with_rows ? &rows : nullptr);
      const bool fused_rows = t.qkv_rows && m == 1 && with_rows;
      EXPECT_EQ(cuda::gemv_qkv_rows_launches() - qkv_launches, fused_rows ? 1u : 0u) << tag;
      const bool defer = t.defer_norm && m == 1;
      EXPECT_EQ(mid.deferred, defer) << tag;
      EXPECT_EQ(next.deferred, defer) << tag;
      EXPECT_EQ(cuda::gemv_norm_in_launches() - norm_in_launches,
                defer ? (fused_rows ? 2u : 1u) : 0u)
          << tag;
      return Run{h.to_host(), mid_out.to_host(), next_out.to_host(), act.to_host(),   q.to_host(),
                 k.to_host(), v.to_host(),       k_rows.to_host(),   v_rows.to_host()};
    };
    for (const DType rows_dtype : {DType::F32, DType::F16}) {
      const Run want = run(want_tuning, rows_dtype);
      const Run got = run(got_tuning, rows_dtype);
      const std::string at =
          tag + " m=" + std::to_string(m) + " " + dtype_name(rows_dtype) + " rows";
      const bool deferred = (want_tuning.defer_norm || got_tuning.defer_norm) && m == 1;
      const std::vector<float> Run::*outs[] = {&Run::mid_out, &Run::next_out, &Run::act,
                                               &Run::h,       &Run::q,        &Run::k,
                                               &Run::v,       &Run::k_rows,   &Run::v_rows};
      const char* names[] = {"MLP norm", "next norm", "SwiGLU rows", "h",     "q",
                             "k",        "v",         "K rows",      "V rows"};
      for (int i = 0; i < 9; ++i) {
        if (i < 2 && deferred) continue;     // the norms' rows are not written
        if (i >= 7 && !with_rows) continue;  // no rows stored
        EXPECT_EQ(first_bit_difference(got.*outs[i], want.*outs[i]), -1) << at << " " << names[i];
      }
    }
  }
  gpu.release_weights();
}

// The dense layers the tests below run (Llama-like, mixed tiles off 16, odd tiles without rows, 8
// warps) with a GemvTuning switch off (want) and on (got); the tuning is restored after.
void dense_layer_cases(CudaBackend& gpu, bool cuda::GemvTuning::*flag) {
  const cuda::GemvTuning saved = cuda::gemv_tuning();
  cuda::GemvTuning off = saved, on = saved;
  off.*flag = false;
  on.*flag = true;
  dense_layer_case(gpu, DType::BF16, 2048, 5504, 128, 500, off, on);
  dense_layer_case(gpu, DType::F16, 2048, 3000, 128, 520, off, on);
  dense_layer_case(gpu, DType::BF16, 1032, 2824, 128, 540, off, on);
  dense_layer_case(gpu, DType::BF16, 512, 1376, 64, 560, off, on);
  cuda::set_gemv_tuning(saved);
}

// The q/k/v launch with its RoPE and K/V rows (GemvTuning::qkv_rows) against the separate
// ring-kernel launches (the q/k/v group, then rope_qk_store_kv).
TEST_F(CudaOpsTest, DenseQkvRowsEqualTheSeparateLaunches) {
  dense_layer_cases(gpu(), &cuda::GemvTuning::qkv_rows);
}

// A dense layer's norms deferred at m = 1 (GemvTuning::defer_norm: o and down leave their blocks'
// sums of squares, gate / up and the q/k/v launch with its rows normalize on load) against the
// norms materialized by the producing launch: h, the SwiGLU rows, q / k / v and the K/V rows bit
// for bit (the staged input is the norm's rows unless the two orders of the double sum of squares
// round to different float variances: ~1e-5 per norm for these widths; at m > 1 nothing is
// deferred).
TEST_F(CudaOpsTest, DenseDeferredNormMatchesTheMaterializedNorm) {
  dense_layer_cases(gpu(), &cuda::GemvTuning::defer_norm);
}

}  // namespace
}  // namespace qs
