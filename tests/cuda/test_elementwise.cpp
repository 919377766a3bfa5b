// Embedding, RMSNorm, RoPE, SwiGLU, add and the fused ops on CUDA against the CPU backend.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cuda/cuda_ops.h"
#include "backend/rope_freq.h"
#include "core/argmax.h"
#include "cuda_test_util.h"

namespace qs {
namespace {

using testing::CudaOpsTest;
using testing::DeviceArray;
using testing::HostWeight;
using testing::random_normal;
using testing::rel_error;

constexpr DType kDtypes[] = {DType::F32, DType::F16, DType::BF16};

TEST_F(CudaOpsTest, EmbeddingMatchesCpuExactly) {
  for (DType dt : kDtypes) {
    const int64_t vocab = 1000, d = 136;
    HostWeight table(random_normal(vocab * d, 1), dt, vocab, d, "embed");
    for (int m : {1, 7, 64, 65, 300, 70001}) {  // 64: the most inline ids; 70001: > 65535 blocks
      std::vector<int32_t> ids(m);
      for (int i = 0; i < m; ++i) ids[i] = static_cast<int32_t>((i * 7919 + 13) % vocab);
      ids[0] = static_cast<int32_t>(vocab - 1);
      std::vector<float> want(m * d);
      cpu().embedding(table.view, ids.data(), m, want.data());
      DeviceArray out(gpu(), m * d);
      out.poison();
      gpu().embedding(table.view, ids.data(), m, out.data());
      EXPECT_EQ(out.to_host(), want) << dtype_name(dt) << " m=" << m;
    }
    gpu().release_weights();  // the host table dies here; its address may be reused
  }
}

TEST_F(CudaOpsTest, RmsNormMatchesCpu) {
  for (DType dt : kDtypes) {
    for (int64_t d : {64, 4096, 5003, 20000}) {  // 20000: three chunks per thread
      for (int m : {1, 3, 33}) {
        HostWeight w(random_normal(d, 2, 0.3f, 1.0f), dt, 1, d, "norm");
        const std::vector<float> x = random_normal(m * d, 3 + d + m, 2.0f);
        std::vector<float> want(m * d);
        cpu().rmsnorm(x.data(), w.view, m, 1e-5f, want.data());
        DeviceArray xd(gpu(), x), out(gpu(), m * d);
        out.poison();
        gpu().rmsnorm(xd.data(), w.view, m, 1e-5f, out.data());
        EXPECT_LT(rel_error(out.to_host(), want), 1e-6) << dtype_name(dt) << " d=" << d;
        gpu().rmsnorm(xd.data(), w.view, m, 1e-5f, xd.data());  // in place
        EXPECT_LT(rel_error(xd.to_host(), want), 1e-6) << "in place, d=" << d;
        gpu().release_weights();
      }
    }
  }
}

// A config with Llama-3's rope scaling (the rope tests set head_dim).
ModelConfig llama3_rope_config() {
  ModelConfig cfg;
  cfg.rope_theta = 500000.0f;
  cfg.rope_scaling.type = RopeScalingType::Llama3;
  cfg.rope_scaling.factor = 8.0f;
  cfg.rope_scaling.low_freq_factor = 1.0f;
  cfg.rope_scaling.high_freq_factor = 4.0f;
  cfg.rope_scaling.original_max_position_embeddings = 8192;
  return cfg;
}

TEST_F(CudaOpsTest, RopeMatchesCpu) {
  ModelConfig cfg = llama3_rope_config();
  for (int head_dim : {32, 64, 128, 256}) {
    cfg.head_dim = head_dim;
    const std::vector<float> inv_freq = rope_inv_freq(cfg);
    for (int pos : {0, 1000, 131000}) {
      for (int m : {1, 17}) {
        const int heads = 3;
        const std::vector<float> x = random_normal(size_t(m) * heads * head_dim, pos + m);
        std::vector<float> want = x;
        cpu().rope(want.data(), m, heads, head_dim, pos, inv_freq.data());
        DeviceArray xd(gpu(), x);
        gpu().rope(xd.data(), m, heads, head_dim, pos, inv_freq.data());
        EXPECT_LT(rel_error(xd.to_host(), want), 1e-6)
            << "head_dim=" << head_dim << " pos=" << pos << " m=" << m;
      }
    }
  }
}

TEST_F(CudaOpsTest, SwigluAndAddMatchCpu) {
  for (int64_t n : {1, 1023, 100000}) {
    const std::vector<float> g = random_normal(n, 10 + n, 3.0f), u = random_normal(n, 20 + n);
    std::vector<float> want(n);
    cpu().swiglu(g.data(), u.data(), n, want.data());
    DeviceArray gd(gpu(), g), ud(gpu(), u), out(gpu(), n);
    out.poison();
    gpu().swiglu(gd.data(), ud.data(), n, out.data());
    EXPECT_LT(rel_error(out.to_host(), want), 1e-6) << "swiglu n=" << n;
    gpu().swiglu(gd.data(), ud.data(), n, gd.data());  // aliasing gate
    EXPECT_LT(rel_error(gd.to_host(), want), 1e-6) << "swiglu in place n=" << n;

    std::vector<float> y = g;
    cpu().add(y.data(), u.data(), n);
    DeviceArray yd(gpu(), g);
    gpu().add(yd.data(), ud.data(), n);
    EXPECT_EQ(yd.to_host(), y) << "add n=" << n;
  }
  // Unaligned pointers and a length that is not a multiple of 4 take the scalar path.
  const int64_t n = 1001;
  const std::vector<float> a = random_normal(n + 1, 30), b = random_normal(n + 1, 31);
  std::vector<float> want(a.begin() + 1, a.end());
  for (int64_t i = 0; i < n; ++i) want[i] += b[i + 1];
  DeviceArray ad(gpu(), a), bd(gpu(), b);
  gpu().add(ad.data() + 1, bd.data() + 1, n);
  const std::vector<float> got = ad.to_host();
  EXPECT_EQ(std::vector<float>(got.begin() + 1, got.end()), want);
}

// ---- fused ops (Backend::add_rmsnorm, rope_qk, store_kv_row_pair) ----------------------------
// Each fused launch against the same backend's separate ops (bit-identical: the override must
// give exactly what the default composition gives on the GPU) and against the CPU backend's
// default composition: bit-identical where the arithmetic is the same by construction (the
// residual sums, the f16 stores), else the separate ops' bounds above (RoPE's products may be
// contracted to FMAs differently by nvcc and the host compiler).

TEST_F(CudaOpsTest, AddRmsNormMatchesAddThenRmsNorm) {
  int differing_from_cpu = 0;
  for (DType dt : kDtypes) {
    for (int64_t d : {1000, 4096, 5003, 20000}) {
      for (int m : {1, 3, 16}) {
        HostWeight w(random_normal(d, 50 + d, 0.3f, 1.0f), dt, 1, d, "norm");
        const std::vector<float> h0 = random_normal(m * d, 60 + d + m, 2.0f);
        const std::vector<float> x = random_normal(m * d, 70 + d + m, 0.5f);
        std::vector<float> h_cpu = h0, out_cpu(m * d);
        cpu().add_rmsnorm(h_cpu.data(), x.data(), w.view, m, 1e-5f, out_cpu.data());

        const DeviceArray xd(gpu(), x);
        DeviceArray h_sep(gpu(), h0), out_sep(gpu(), m * d);
        gpu().add(h_sep.data(), xd.data(), m * d);
        gpu().rmsnorm(h_sep.data(), w.view, m, 1e-5f, out_sep.data());
        DeviceArray hd(gpu(), h0), out(gpu(), m * d);
        out.poison();
        gpu().add_rmsnorm(hd.data(), xd.data(), w.view, m, 1e-5f, out.data());

        const std::string tag =
            std::string(dtype_name(dt)) + " d=" + std::to_string(d) + " m=" + std::to_string(m);
        const std::vector<float> got_h = hd.to_host(), got = out.to_host();
        EXPECT_EQ(got_h, h_sep.to_host()) << tag;
        EXPECT_EQ(got, out_sep.to_host()) << tag;
        EXPECT_EQ(got_h, h_cpu) << tag;
        EXPECT_LT(rel_error(got, out_cpu), 1e-6) << tag;
        for (size_t i = 0; i < got.size(); ++i) differing_from_cpu += got[i] != out_cpu[i];
        gpu().release_weights();
      }
    }
  }
  std::printf("[ add_rmsnorm ] outputs differing from the CPU's bits: %d\n", differing_from_cpu);
}

TEST_F(CudaOpsTest, RopeQkMatchesTwoRopes) {
  ModelConfig cfg = llama3_rope_config();
  for (int head_dim : {64, 128}) {
    cfg.head_dim = head_dim;
    const std::vector<float> inv_freq = rope_inv_freq(cfg);
    for (int group : {1, 4}) {
      const int heads = 32, kv_heads = heads / group;
      for (int m : {1, 3, 16}) {
        for (int pos : {0, 1000, 131000}) {
          const size_t nq = size_t(m) * heads * head_dim, nk = size_t(m) * kv_heads * head_dim;
          const std::vector<float> q0 = random_normal(nq, 80 + pos + m + group);
          const std::vector<float> k0 = random_normal(nk, 90 + pos + m + group);
          std::vector<float> q_cpu = q0, k_cpu = k0;
          cpu().rope_qk(q_cpu.data(), k_cpu.data(), m, heads, kv_heads, head_dim, pos,
                        inv_freq.data());

          DeviceArray q_sep(gpu(), q0), k_sep(gpu(), k0), qd(gpu(), q0), kd(gpu(), k0);
          gpu().rope(q_sep.data(), m, heads, head_dim, pos, inv_freq.data());
          gpu().rope(k_sep.data(), m, kv_heads, head_dim, pos, inv_freq.data());
          gpu().rope_qk(qd.data(), kd.data(), m, heads, kv_heads, head_dim, pos, inv_freq.data());

          const std::string tag = "head_dim=" + std::to_string(head_dim) +
                                  " group=" + std::to_string(group) + " m=" + std::to_string(m) +
                                  " pos=" + std::to_string(pos);
          const std::vector<float> got_q = qd.to_host(), got_k = kd.to_host();
          EXPECT_EQ(got_q, q_sep.to_host()) << tag;
          EXPECT_EQ(got_k, k_sep.to_host()) << tag;
          EXPECT_LT(rel_error(got_q, q_cpu), 1e-6) << tag;
          EXPECT_LT(rel_error(got_k, k_cpu), 1e-6) << tag;
        }
      }
    }
  }
}

// The fused RoPE + row store against rope_qk then store_kv_row_pair on the GPU (bit-identical,
// both row dtypes) and against the CPU's composition (f16 rows of the CPU-rotated keys).
TEST_F(CudaOpsTest, RopeQkStoreKvMatchesRopeThenStore) {
  ModelConfig cfg = llama3_rope_config();
  int rows_differing_from_cpu = 0;
  for (int head_dim : {64, 128}) {
    cfg.head_dim = head_dim;
    const std::vector<float> inv_freq = rope_inv_freq(cfg);
    for (int group : {1, 4}) {
      const int heads = 32, kv_heads = heads / group;
      for (int m : {1, 5, 16}) {
        for (int pos : {0, 131000}) {
          for (DType dt : {DType::F16, DType::F32}) {
            const size_t nq = size_t(m) * heads * head_dim, nk = size_t(m) * kv_heads * head_dim;
            const std::vector<float> q0 = random_normal(nq, 110 + pos + m + group);
            const std::vector<float> k0 = random_normal(nk, 120 + pos + m + group, 300.0f);
            const std::vector<float> v = random_normal(nk, 130 + pos + m + group, 3e4f);
            const std::string tag = "head_dim=" + std::to_string(head_dim) +
                                    " group=" + std::to_string(group) + " m=" + std::to_string(m) +
                                    " pos=" + std::to_string(pos) + " " + dtype_name(dt);
            const size_t esz = dt == DType::F16 ? 2 : 4;
            const std::vector<uint8_t> poison((nk + 8) * esz, 0x7e);
            const DeviceArray vd(gpu(), v);
            // Separate: rope_qk, then store_kv_row_pair.
            DeviceArray q_sep(gpu(), q0), k_sep(gpu(), k0);
            testing::DeviceBytes kr_sep(gpu(), poison), vr_sep(gpu(), poison);
            gpu().rope_qk(q_sep.data(), k_sep.data(), m, heads, kv_heads, head_dim, pos,
                          inv_freq.data());
            gpu().store_kv_row_pair(kr_sep.as<uint8_t>() + 4 * esz, vr_sep.as<uint8_t>() + 4 * esz,
                                    dt, k_sep.data(), vd.data(), nk);
            // Fused.
            DeviceArray qd(gpu(), q0), kd(gpu(), k0);
            testing::DeviceBytes kr(gpu(), poison), vr(gpu(), poison);
            const RopeQK rope{qd.data(), heads, kv_heads, head_dim, inv_freq.data()};
            gpu().rope_qk_store_kv(rope, m, pos, kd.data(), vd.data(), kr.as<uint8_t>() + 4 * esz,
                                   vr.as<uint8_t>() + 4 * esz, dt);
            EXPECT_EQ(qd.to_host(), q_sep.to_host()) << tag;
            EXPECT_EQ(kd.to_host(), k_sep.to_host()) << tag;
            const std::vector<uint8_t> got_k = kr.to_host(), got_v = vr.to_host();
            EXPECT_EQ(got_k, kr_sep.to_host()) << tag;  // the poison around the rows included
            EXPECT_EQ(got_v, vr_sep.to_host()) << tag;
            // The CPU: the same composition on its own rotation.
            std::vector<float> q_cpu = q0, k_cpu = k0;
            std::vector<uint8_t> kr_cpu(poison), vr_cpu(poison);
            const RopeQK rope_cpu{q_cpu.data(), heads, kv_heads, head_dim, inv_freq.data()};
            cpu().rope_qk_store_kv(rope_cpu, m, pos, k_cpu.data(), v.data(),
                                   kr_cpu.data() + 4 * esz, vr_cpu.data() + 4 * esz, dt);
            EXPECT_LT(rel_error(qd.to_host(), q_cpu), 1e-6) << tag;
            EXPECT_LT(rel_error(kd.to_host(), k_cpu), 1e-6) << tag;
            EXPECT_EQ(got_v, vr_cpu) << tag;
            rows_differing_from_cpu += got_k != kr_cpu;
            gpu().release_weights();
          }
        }
      }
    }
  }
  std::printf("[ rope_qk_store_kv ] key row sets differing from the CPU's bits: %d of 48\n",
              rows_differing_from_cpu);
}

TEST_F(CudaOpsTest, StoreKvRowPairMatchesTwoStores) {
  // Wide magnitudes, ties, subnormals, beyond-range values, signed zeros and inf (NaN payloads
  // may differ from the host's: F16RowsStoreKvRowsMatchesTheCpuBits covers NaN).
  std::vector<float> src = random_normal(2 * 5003 + 16, 100);
  for (size_t i = 0; i < src.size(); ++i) {
    const int kind = static_cast<int>(i % 11);
    if (kind == 1) src[i] *= 1e5f;
    if (kind == 2) src[i] *= 1e-6f;
    if (kind == 3) src[i] = 1.0f + float(i % 7) * 0x1p-11f;
    if (kind == 4) src[i] = (i % 2 ? -1.0f : 1.0f) * (65504.0f + float(i % 40));
    if (kind == 5) src[i] = i % 2 ? -0.0f : 0.0f;
    if (kind == 6 && i % 3 == 0) src[i] = (i % 2 ? -1.0f : 1.0f) * INFINITY;
  }
  const DeviceArray src_dev(gpu(), src);
  const size_t v_base = 5008;  // the value rows' source: 16-byte aligned
  constexpr uint16_t kPoison = 0x7e01;
  // {n, key source offset, value source offset, key dst offset, value dst offset}: aligned with
  // n % 4 == 0 (the vector kernel, also at aligned offsets), odd n, one misaligned pointer of the
  // four (scalar kernel for both).
  const std::tuple<int, int, int, int, int> cases[] = {
      {4096, 0, 0, 0, 0}, {1024, 4, 8, 4, 12}, {5003, 0, 0, 0, 0}, {1, 0, 0, 0, 0},
      {1000, 1, 0, 0, 0}, {1000, 0, 3, 0, 0},  {1000, 0, 0, 1, 0}, {1000, 0, 0, 0, 2}};
  for (auto [n, ks, vs, kdo, vdo] : cases) {
    const std::string tag = "n=" + std::to_string(n) + " offsets " + std::to_string(ks) + "," +
                            std::to_string(vs) + "," + std::to_string(kdo) + "," +
                            std::to_string(vdo);
    const float* k_host = src.data() + ks;
    const float* v_host = src.data() + v_base + vs;
    const size_t len = size_t(n) + 16;
    std::vector<uint16_t> k_cpu(len, kPoison), v_cpu(len, kPoison);
    cpu().store_kv_row_pair(k_cpu.data() + kdo, v_cpu.data() + vdo, DType::F16, k_host, v_host,
                            size_t(n));
    const std::vector<uint16_t> poison(len, kPoison);
    testing::DeviceBytes k_sep(gpu(), poison), v_sep(gpu(), poison);
    testing::DeviceBytes kd(gpu(), poison), vd(gpu(), poison);
    const float* k_src = src_dev.data() + ks;
    const float* v_src = src_dev.data() + v_base + vs;
    gpu().store_kv_rows(k_sep.as<uint16_t>() + kdo, DType::F16, k_src, size_t(n));
    gpu().store_kv_rows(v_sep.as<uint16_t>() + vdo, DType::F16, v_src, size_t(n));
    gpu().store_kv_row_pair(kd.as<uint16_t>() + kdo, vd.as<uint16_t>() + vdo, DType::F16, k_src,
                            v_src, size_t(n));
    auto bits = [](const testing::DeviceBytes& b) {
      const std::vector<uint8_t> bytes = b.to_host();
      std::vector<uint16_t> out(bytes.size() / 2);
      std::memcpy(out.data(), bytes.data(), out.size() * 2);
      return out;
    };
    const std::vector<uint16_t> got_k = bits(kd), got_v = bits(vd);
    EXPECT_EQ(got_k, bits(k_sep)) << tag;
    EXPECT_EQ(got_v, bits(v_sep)) << tag;
    EXPECT_EQ(got_k, k_cpu) << tag;  // the poison around the rows included: untouched
    EXPECT_EQ(got_v, v_cpu) << tag;
  }
  // F32 rows: copies.
  const size_t n = 1001;
  DeviceArray k32(gpu(), n), v32(gpu(), n);
  gpu().store_kv_row_pair(k32.data(), v32.data(), DType::F32, src_dev.data() + 1,
                          src_dev.data() + v_base, n);
  EXPECT_EQ(k32.to_host(), std::vector<float>(src.begin() + 1, src.begin() + 1 + n));
  EXPECT_EQ(v32.to_host(), std::vector<float>(src.begin() + v_base, src.begin() + v_base + n));
}

// The GPU argmax (cuda::launch_argmax_rows, Backend::argmax_rows unless QS_CUDA_ARGMAX=0) against
// the host's definition: lengths around the block's 1024 threads and the Llama-3 vocabulary, 1..16
// rows, ties (small integers), NaN (also at index 0), +-inf, all -inf, all NaN; and
// CudaBackend::argmax_rows itself (whichever path the process runs).
TEST_F(CudaOpsTest, ArgmaxRowsMatchesTheHost) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  uint64_t seed = 90;
  for (int n : {1, 5, 1023, 1024, 1025, 32000, 128256}) {
    for (int rows : {1, 4, 16}) {
      std::vector<float> x = random_normal(size_t(rows) * n, ++seed);
      for (int r = 0; r < rows; ++r) {
        float* row = x.data() + size_t(r) * n;
        switch (r % 6) {
          case 1:  // ties: small integers, the maximum several times
            for (int i = 0; i < n; ++i) row[i] = std::round(row[i] * 2.0f);
            break;
          case 2:
            row[0] = nan;
            break;
          case 3:
            row[n / 2] = nan, row[n - 1] = inf, row[0] = -inf;
            break;
          case 4:
            for (int i = 0; i < n; ++i) row[i] = -inf;
            break;
          case 5:
            for (int i = 0; i < n; ++i) row[i] = i % 3 ? nan : row[i];
            break;
          default:
            break;
        }
      }
      if (rows == 16) {  // one row of NaN only
        for (int i = 0; i < n; ++i) x[size_t(15) * n + i] = nan;
      }
      DeviceArray xd(gpu(), x);
      testing::DeviceBytes out(gpu(), std::vector<uint16_t>(size_t(rows) * 2, 0));
      cuda::launch_argmax_rows(xd.data(), rows, n, out.as<int32_t>(),
                               static_cast<cudaStream_t>(gpu().stream()));
      std::vector<int32_t> got(rows, -1), via_backend(rows, -1);
      const std::vector<uint8_t> bytes = out.to_host();
      std::memcpy(got.data(), bytes.data(), sizeof(int32_t) * rows);
      gpu().argmax_rows(xd.data(), rows, n, via_backend.data());
      for (int r = 0; r < rows; ++r) {
        const int32_t want = argmax(x.data() + size_t(r) * n, n);
        EXPECT_EQ(got[r], want) << "n=" << n << " row " << r;
        EXPECT_EQ(via_backend[r], want) << "n=" << n << " row " << r << " (backend)";
      }
    }
  }
}

TEST_F(CudaOpsTest, CopyAndHostTransfersRoundTrip) {
  const std::vector<float> x = random_normal(12345, 40);
  DeviceArray a(gpu(), x), b(gpu(), x.size());
  gpu().copy(b.data(), a.data(), x.size());
  EXPECT_EQ(b.to_host(), x);
}

TEST(CudaSplitHeuristic, SplitsOnlyWhenBlocksAreFew) {
  // Many blocks already: no split.
  EXPECT_EQ(attention_num_splits(1 << 20, 10000, 132, 256), 1);
  // One block per kv head, long context: splits up to the block target.
  const int s = attention_num_splits(32768, 32, 132, 256);
  EXPECT_GT(s, 1);
  EXPECT_GE(s * 32, 132 * 2);
  // Never below the minimum split length, never above the cap, never 0.
  EXPECT_EQ(attention_num_splits(100, 1, 132, 256), 1);
  EXPECT_LE(attention_num_splits(1000, 1, 132, 256), 4);
  EXPECT_EQ(attention_num_splits(1 << 22, 1, 132, 7), 7);
  EXPECT_GE(attention_num_splits(1, 1, 1, 1), 1);
}

TEST(CudaSplitHeuristic, OneWaveRoundsDown) {
  // 264 slots (132 SMs x 2), 32 kv heads: 8 splits (256 blocks), not 9 (a second wave of 24).
  EXPECT_EQ(attention_num_splits_one_wave(32768, 32, 264, 256), 8);
  EXPECT_EQ(attention_num_splits_one_wave(32768, 8, 264, 256), 33);
  // More base blocks than slots, short contexts, the cap: at least 1, at most the cap.
  EXPECT_EQ(attention_num_splits_one_wave(32768, 1000, 264, 256), 1);
  EXPECT_EQ(attention_num_splits_one_wave(1000, 8, 264, 256), 4);
  EXPECT_EQ(attention_num_splits_one_wave(1 << 22, 1, 264, 7), 7);
  EXPECT_EQ(attention_num_splits_one_wave(1, 1, 1, 1), 1);
}

}  // namespace
}  // namespace qs
