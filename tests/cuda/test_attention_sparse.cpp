// The sparse-KV draft's attention on CUDA (KvSelection: per kv head, selected prompt positions
// then a dense tail) against the CPU reference: the decode kernel with its split-KV over the
// selected sequence, GQA 1/4, head_dim 64/128, 1..16 query rows, forced splits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/attention_decode_tc.h"
#include "core/dtype.h"
#include "cuda_test_util.h"

namespace qs {
namespace {

using testing::CudaOpsTest;
using testing::DeviceArray;
using testing::random_normal;
using testing::rel_error;

struct SparseCase {
  int len;         // positions in the cache (the queries are the last m)
  int m;           // query rows
  int heads, kv_heads, head_dim;
  int count;       // selected positions per kv head, each < dense_from
  int dense_from;  // start of the dense tail (<= len - m)
  int splits;      // 0: the heuristic
};

std::string describe(const SparseCase& c) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "len=%d m=%d heads=%d/%d hd=%d count=%d dense_from=%d splits=%d",
                c.len, c.m, c.heads, c.kv_heads, c.head_dim, c.count, c.dense_from, c.splits);
  return buf;
}

// rows: F32, or F16 (the KV cache's rows on CUDA: both decode kernels, see the test below).
double run(CudaBackend& gpu, CpuBackend& cpu, const SparseCase& c, uint64_t seed,
           DType rows = DType::F32) {
  const int kvd = c.kv_heads * c.head_dim, qd = c.heads * c.head_dim;
  const int pos = c.len - c.m;
  const std::vector<float> q = random_normal(static_cast<size_t>(c.m) * qd, seed);
  const std::vector<float> k = random_normal(static_cast<size_t>(c.len) * kvd, seed + 1);
  const std::vector<float> v = random_normal(static_cast<size_t>(c.len) * kvd, seed + 2);
  // Per kv head: `count` distinct ascending positions in [0, dense_from).
  std::vector<int32_t> positions;
  std::mt19937 rng(static_cast<uint32_t>(seed));
  for (int h = 0; h < c.kv_heads; ++h) {
    std::vector<int32_t> all(c.dense_from);
    for (int i = 0; i < c.dense_from; ++i) all[i] = i;
    std::shuffle(all.begin(), all.end(), rng);
    all.resize(c.count);
    std::sort(all.begin(), all.end());
    positions.insert(positions.end(), all.begin(), all.end());
  }
  const AttentionShape shape{c.heads, c.kv_heads, c.head_dim,
                             1.0f / std::sqrt(static_cast<float>(c.head_dim))};
  const bool f16 = rows == DType::F16;
  std::vector<uint16_t> k16(f16 ? k.size() : 1), v16(f16 ? v.size() : 1);  // 1: unused
  if (f16) {
    for (size_t i = 0; i < k.size(); ++i)
      k16[i] = f32_to_f16_sat(k[i]), v16[i] = f32_to_f16_sat(v[i]);
  }
  KvSelection host_sel{positions.data(), c.count, c.dense_from};
  KvView host_view =
      f16 ? KvView{k16.data(), v16.data(), kvd, c.len} : KvView{k.data(), v.data(), kvd, c.len};
  host_view.row_dtype = rows;
  host_view.selection = &host_sel;
  KvReadBytes cpu_bytes, gpu_bytes;
  host_view.read_bytes = &cpu_bytes;
  std::vector<float> want(q.size());
  cpu.attention(q.data(), c.m, pos, shape, host_view, want.data());

  DeviceArray dq(gpu, q), dk(gpu, k), dv(gpu, v), dout(gpu, q.size());
  testing::DeviceBytes dk16(gpu, k16), dv16(gpu, v16);
  dout.poison();
  std::vector<float> pos_as_float(positions.size());
  std::memcpy(pos_as_float.data(), positions.data(), positions.size() * sizeof(float));
  DeviceArray dpos(gpu, pos_as_float.empty() ? std::vector<float>(1) : pos_as_float);
  KvSelection dev_sel{reinterpret_cast<const int32_t*>(dpos.data()), c.count, c.dense_from};
  KvView dev_view = f16 ? KvView{dk16.as<const uint16_t>(), dv16.as<const uint16_t>(), kvd, c.len}
                        : KvView{dk.data(), dv.data(), kvd, c.len};
  dev_view.row_dtype = rows;
  dev_view.selection = &dev_sel;
  dev_view.read_bytes = &gpu_bytes;
  if (c.splits > 0) {
    gpu.attention_decode(dq.data(), c.m, pos, shape, dev_view, dout.data(), c.splits);
  } else {
    gpu.attention(dq.data(), c.m, pos, shape, dev_view, dout.data());
  }
  EXPECT_EQ(gpu_bytes.fp, cpu_bytes.fp) << describe(c);
  const double err = rel_error(dout.to_host(), want);
  EXPECT_LT(err, 1e-5) << describe(c);  // f32 summation order (dense decode: up to 1e-5)
  return err;
}

TEST_F(CudaOpsTest, SparseSelectionAttentionMatchesCpu) {
  double worst = 0;
  uint64_t seed = 900;
  for (int hd : {64, 128}) {
    for (int kv_heads : {8, 2}) {
      const int heads = 8;  // GQA 1 (8 kv heads) and 4 (2 kv heads)
      for (int m : {1, 5, 16}) {
        for (int len : {40, 1000, 5003}) {
          const int dense_from = len - m - std::min(len / 8, 64);
          for (int count : {0, 1, dense_from / 4, dense_from}) {
            worst = std::max(
                worst, run(gpu(), cpu(), {len, m, heads, kv_heads, hd, count, dense_from, 0},
                           ++seed));
          }
        }
      }
    }
  }
  // Split boundaries inside the selected part, at its end and in the dense tail.
  for (int splits : {1, 2, 3, 7, 64}) {
    worst = std::max(worst, run(gpu(), cpu(), {3000, 1, 32, 8, 128, 700, 2900, splits}, ++seed));
  }
  std::printf("[ max rel error ] sparse selection attention: %.3g\n", worst);
}

// The same selections over f16 rows on both decode kernels: the CUDA-core one and the tensor-core
// one (DecodeAttentionTuning::selection).
TEST_F(CudaOpsTest, SparseSelectionAttentionF16Rows) {
  const cuda::DecodeAttentionTuning saved = cuda::decode_attention_tuning();
  for (bool tc : {false, true}) {
    cuda::set_decode_attention_tuning({tc, tc});
    double worst = 0;
    uint64_t seed = 1900;
    for (int hd : {64, 128}) {
      for (int kv_heads : {8, 2}) {
        for (int m : {1, 5, 16}) {
          for (int len : {40, 1000, 5003}) {
            const int dense_from = len - m - std::min(len / 8, 64);
            for (int count : {0, 1, dense_from / 4, dense_from}) {
              worst =
                  std::max(worst, run(gpu(), cpu(), {len, m, 8, kv_heads, hd, count, dense_from, 0},
                                      ++seed, DType::F16));
            }
          }
        }
      }
    }
    for (int splits : {1, 2, 3, 7, 64}) {
      worst = std::max(
          worst, run(gpu(), cpu(), {3000, 1, 32, 8, 128, 700, 2900, splits}, ++seed, DType::F16));
    }
    std::printf("[ max rel error ] sparse selection attention, f16 rows, %s: %.3g\n",
                tc ? "tensor cores" : "CUDA cores", worst);
  }
  cuda::set_decode_attention_tuning(saved);
}

}  // namespace
}  // namespace qs
