// The quantized-format ops on CUDA against the CPU backend:
//  - quantize_kv (the flush into the hierarchical INT8/INT4 planes): every byte of codes and fp16
//    metadata identical, over G, Gv, head_dim, kv heads, group counts, first groups, padded and
//    unaligned row strides, and inputs built to hit the corner cases of the format (constant
//    groups, +-0, NaN, +-inf, values beyond the fp16 range, f32 subnormals, rounding ties of the
//    codes, every fp16 value and its f32 neighbours for the directed rounding of min and scale);
//  - matmul_q4 (the draft's 4-bit weights): m = 1..16 and beyond, short last groups, odd column
//    counts, biases, unaligned activations, every kernel variant, other group sizes.
//
// matmul_q4 tolerance (relative Frobenius error against the CPU's f32 result): the tensor-core
// kernel carries each activation as a bf16 hi + lo pair (error <= 2^-17 of x) multiplying the
// centred codes (U - 8) * s, so the error is a few 1e-6 of the result; held to 2e-5 like the bf16
// GEMV. The CUDA-core kernel (exact f32 products, group terms s * sum(U x) + min * sum(x)) is held
// to the same bound. The kernel for other group sizes is plain f32: 2e-6.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/quant_ops.h"
#include "core/dtype.h"
#include "cuda_test_util.h"
#include "quant/weight_quant.h"

namespace qs {
namespace {

using testing::CudaOpsTest;
using testing::DeviceArray;
using testing::DeviceBytes;
using testing::HostWeight;
using testing::random_normal;
using testing::rel_error;

// ---- helpers ------------------------------------------------------------------------------------

// Deterministic generator (splitmix64).
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed * 0x9E3779B97F4A7C15ull + 0x1234567ull) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }
  int below(int n) { return static_cast<int>(next() % static_cast<uint64_t>(n)); }
  float normal() {
    const double u1 = uniform() + 1e-300, u2 = uniform();
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }

 private:
  uint64_t state_;
};

// ---- quantize_kv --------------------------------------------------------------------------------

struct KvCase {
  int heads, head_dim, G, Gv;
  int64_t first_group;
  int n_groups;
  int64_t stride_pad;  // row_stride = heads * head_dim + stride_pad
};

std::string describe(const KvCase& c) {
  return "heads=" + std::to_string(c.heads) + " hd=" + std::to_string(c.head_dim) +
         " G=" + std::to_string(c.G) + " Gv=" + std::to_string(c.Gv) +
         " first_group=" + std::to_string(c.first_group) +
         " n_groups=" + std::to_string(c.n_groups) + " stride_pad=" + std::to_string(c.stride_pad);
}

// The eight arrays of one layer, as bytes; a capacity of first_group + n_groups + 1 groups, so
// the kernel's writes must land in the right groups and leave the rest (poison) alone.
struct PlaneBytes {
  static constexpr int kArrays = 8;
  static constexpr const char* kNames[kArrays] = {"key_upper",   "key_lower", "value_upper",
                                                  "value_lower", "key_scale", "key_min",
                                                  "value_scale", "value_min"};
  std::vector<uint8_t> a[kArrays];

  PlaneBytes(const KvCase& c, int64_t capacity) {
    const int64_t codes = int64_t{c.heads} * capacity * (c.head_dim / 2);
    const int64_t kmeta = int64_t{c.heads} * (capacity / c.G) * c.head_dim * 2;
    const int64_t vmeta = int64_t{c.heads} * capacity * (c.head_dim / c.Gv) * 2;
    const int64_t sizes[kArrays] = {codes, codes, codes, codes, kmeta, kmeta, vmeta, vmeta};
    for (int i = 0; i < kArrays; ++i) a[i].assign(static_cast<size_t>(sizes[i]), 0xA5);
  }
};

QuantizedKvPlanesOut planes_out(uint8_t* const (&p)[PlaneBytes::kArrays], const KvCase& c,
                                int64_t capacity) {
  QuantizedKvPlanesOut o;
  o.key_upper = p[0];
  o.key_lower = p[1];
  o.value_upper = p[2];
  o.value_lower = p[3];
  o.key_scale = reinterpret_cast<uint16_t*>(p[4]);
  o.key_min = reinterpret_cast<uint16_t*>(p[5]);
  o.value_scale = reinterpret_cast<uint16_t*>(p[6]);
  o.value_min = reinterpret_cast<uint16_t*>(p[7]);
  o.capacity = capacity;
  o.group_size = c.G;
  o.value_group_size = c.Gv;
  return o;
}

// One group of n values of a kind picked at random: the corner cases of the format.
std::vector<float> group_values(Rng& rng, int n) {
  std::vector<float> v(static_cast<size_t>(n));
  const int kind = rng.below(10);
  switch (kind) {
    case 0:
    case 1:
    case 2: {  // normal, random centre and spread; now and then a NaN
      const float sd = static_cast<float>(std::pow(10.0, rng.uniform() * 4.0 - 3.0));
      const float mean = sd * 4.0f * static_cast<float>(rng.uniform() - 0.5);
      for (float& x : v) x = mean + sd * rng.normal();
      if (rng.below(8) == 0) v[rng.below(n)] = std::numeric_limits<float>::quiet_NaN();
      break;
    }
    case 3: {  // constant: an fp16 value (exact reconstruction) or not
      float x = rng.normal() * static_cast<float>(std::pow(10.0, rng.uniform() * 6.0 - 3.0));
      if (rng.below(2) == 0) x = f16_to_f32(f32_to_f16(x));
      for (float& y : v) y = x;
      break;
    }
    case 4: {  // +0 and -0 (their fp16 bits differ: the first one in scan order must win)
      for (float& x : v) x = rng.below(2) ? 0.0f : -0.0f;
      if (rng.below(4) == 0) v[rng.below(n)] = 1e-3f * rng.normal();
      break;
    }
    case 5: {  // beyond the fp16 range, sometimes infinite
      for (float& x : v) {
        x = (rng.below(2) ? 1.0f : -1.0f) *
            static_cast<float>(std::pow(10.0, 3.0 + 3.0 * rng.uniform()));
      }
      if (rng.below(4) == 0) {
        v[rng.below(n)] = (rng.below(2) ? 1.0f : -1.0f) * std::numeric_limits<float>::infinity();
      }
      break;
    }
    case 6: {  // tiny, f32 subnormals included
      for (float& x : v) {
        x = (rng.below(2) ? 1.0f : -1.0f) *
            static_cast<float>(std::pow(10.0, -42.0 + 38.0 * rng.uniform()));
      }
      break;
    }
    case 7: {  // min 0, max 15: scale 1, and ties of both codes (U + 0.5, residuals of +-s/32)
      for (float& x : v) {
        const int u = rng.below(16);
        const int half_steps = rng.below(33) - 16;  // residual in units of s/32
        x = std::fmin(std::fmax(static_cast<float>(u) + half_steps / 32.0f, 0.0f), 15.0f);
        if (rng.below(4) == 0) x = static_cast<float>(u) + 0.5f;
      }
      v[rng.below(n)] = 0.0f;
      v[rng.below(n)] = 15.0f;
      break;
    }
    case 8: {  // a narrow range far from zero (min rounding dominates)
      const float base = static_cast<float>(1000.0 + 1000.0 * rng.uniform());
      for (float& x : v) x = base + 0.01f * static_cast<float>(rng.uniform());
      break;
    }
    default: {  // wide normal around zero
      for (float& x : v) x = rng.normal();
      break;
    }
  }
  return v;
}

// K and V rows [rows, stride] for a case; columns past heads * head_dim hold NaN (never read).
void make_kv_rows(const KvCase& c, uint64_t seed, std::vector<float>& k, std::vector<float>& v) {
  const int64_t kv_dim = int64_t{c.heads} * c.head_dim, stride = kv_dim + c.stride_pad;
  const int64_t rows = int64_t{c.n_groups} * c.G;
  k.assign(static_cast<size_t>(rows * stride), std::numeric_limits<float>::quiet_NaN());
  v = k;
  Rng rng(seed);
  for (int64_t gi = 0; gi < c.n_groups; ++gi) {  // keys: per channel over the G tokens
    for (int64_t col = 0; col < kv_dim; ++col) {
      const std::vector<float> vals = group_values(rng, c.G);
      for (int t = 0; t < c.G; ++t) k[static_cast<size_t>((gi * c.G + t) * stride + col)] = vals[t];
    }
  }
  for (int64_t t = 0; t < rows; ++t) {  // values: per token over groups of Gv channels
    for (int64_t col = 0; col < kv_dim; col += c.Gv) {
      const std::vector<float> vals = group_values(rng, c.Gv);
      std::memcpy(&v[static_cast<size_t>(t * stride + col)], vals.data(), sizeof(float) * c.Gv);
    }
  }
}

// Runs both backends on the same rows and compares every byte of the eight arrays.
void expect_kv_identical(CudaBackend& gpu, CpuBackend& cpu, const KvCase& c,
                         const std::vector<float>& k, const std::vector<float>& v) {
  const int64_t capacity = (c.first_group + c.n_groups + 1) * c.G;
  const int64_t stride = int64_t{c.heads} * c.head_dim + c.stride_pad;
  PlaneBytes want(c, capacity);
  uint8_t* host_ptrs[PlaneBytes::kArrays];
  for (int i = 0; i < PlaneBytes::kArrays; ++i) host_ptrs[i] = want.a[i].data();
  cpu.quantize_kv(k.data(), v.data(), stride, c.heads, c.head_dim, c.first_group, c.n_groups,
                  planes_out(host_ptrs, c, capacity));

  const PlaneBytes poison(c, capacity);
  std::vector<std::unique_ptr<DeviceBytes>> dev;
  uint8_t* dev_ptrs[PlaneBytes::kArrays];
  for (int i = 0; i < PlaneBytes::kArrays; ++i) {
    dev.push_back(std::make_unique<DeviceBytes>(gpu, poison.a[i]));
    dev_ptrs[i] = dev.back()->data();
  }
  DeviceArray kd(gpu, k), vd(gpu, v);
  gpu.quantize_kv(kd.data(), vd.data(), stride, c.heads, c.head_dim, c.first_group, c.n_groups,
                  planes_out(dev_ptrs, c, capacity));
  for (int i = 0; i < PlaneBytes::kArrays; ++i) {
    const std::vector<uint8_t> got = dev[i]->to_host();
    ASSERT_EQ(got.size(), want.a[i].size());
    size_t bad = 0, first = 0;
    for (size_t j = 0; j < got.size(); ++j) {
      if (got[j] != want.a[i][j]) {
        if (bad++ == 0) first = j;
      }
    }
    EXPECT_EQ(bad, 0u) << describe(c) << ": " << PlaneBytes::kNames[i] << " differs in " << bad
                       << " bytes, first at byte " << first << " (gpu " << int(got[first])
                       << ", cpu " << int(want.a[i][first]) << ")";
  }
}

void run_kv_case(CudaBackend& gpu, CpuBackend& cpu, const KvCase& c, uint64_t seed) {
  std::vector<float> k, v;
  make_kv_rows(c, seed, k, v);
  expect_kv_identical(gpu, cpu, c, k, v);
}

TEST_F(CudaOpsTest, QuantizeKvIsBitIdenticalToTheCpu) {
  int cases = 0;
  for (int G : {32, 64, 128}) {
    for (int hd : {64, 128}) {
      for (int Gv : {hd, 32}) {
        for (int heads : {1, 8, 32}) {
          // The flush (one group, plain stride) and a prefill history (many groups from a first
          // group > 0, padded stride: aligned for vector loads, or odd for scalar loads).
          const int many = heads == 32 ? 3 : heads == 8 ? 7 : 17;
          const KvCase flush{heads, hd, G, Gv, 0, 1, 0};
          const KvCase history{heads, hd, G, Gv, 1 + cases % 3, many, cases % 2 ? 3 : 4};
          run_kv_case(gpu(), cpu(), flush, 1000 + cases);
          run_kv_case(gpu(), cpu(), history, 2000 + cases);
          if (HasFailure()) return;
          ++cases;
        }
      }
    }
  }
  std::printf("[ quantize_kv ] %d shapes x 2 (flush, history): bit-identical\n", cases);
}

// The other shapes the kernel accepts: small and large G, head_dim 32 and 256 (the 1024-thread
// and 8-channel-per-lane variants), value groups below 32, large launches (no small-flush
// split).
TEST_F(CudaOpsTest, QuantizeKvOtherSupportedShapes) {
  const KvCase cases[] = {
      {2, 32, 8, 32, 3, 5, 0},     {3, 32, 16, 32, 0, 4, 1},    {4, 32, 32, 16, 2, 3, 0},
      {2, 64, 256, 64, 1, 2, 4},   {2, 128, 256, 128, 0, 2, 2}, {2, 256, 128, 256, 1, 2, 0},
      {1, 256, 256, 256, 0, 2, 4}, {2, 256, 256, 32, 1, 1, 3},  {3, 128, 64, 8, 0, 3, 4},
      {2, 64, 32, 4, 2, 2, 1},     {5, 128, 128, 64, 0, 2, 0},
      // Launches of >= 128 blocks: 16-token key slices, split in 2 parts or not split.
      {8, 128, 128, 128, 1, 20, 4}, {16, 128, 64, 32, 0, 20, 0},
  };
  uint64_t seed = 3000;
  for (const KvCase& c : cases) {
    run_kv_case(gpu(), cpu(), c, seed++);
    if (HasFailure()) return;
  }
}

// The directed fp16 rounding of min (down) and scale (up) on every fp16 value, its f32
// neighbours and the midpoints between fp16 values (the ties of the nearest rounding the
// directed rounding starts from), plus values around the fp16 limit: key channels alternate
// between a constant group (min = round_down(x)) and a group {0, x, x, ...} (scale =
// round_up(x / 15) for x > 0), and the value rows see the same numbers in groups of 32.
TEST_F(CudaOpsTest, QuantizeKvDirectedFp16RoundingOfEveryHalf) {
  std::vector<float> xs;
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float x = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(x)) continue;
    xs.push_back(x);
    xs.push_back(std::nextafter(x, std::numeric_limits<float>::infinity()));
    xs.push_back(std::nextafter(x, -std::numeric_limits<float>::infinity()));
    const uint16_t next = static_cast<uint16_t>(h + 1);
    const float y = f16_to_f32(next);
    if ((h & 0x7fffu) < 0x7bffu && std::isfinite(y)) xs.push_back(0.5f * x + 0.5f * y);
  }
  for (float x : {65504.0f, 65519.0f, 65520.0f, 65536.0f, 1e6f, 1e-30f, 1e-40f, 1.4e-45f}) {
    xs.push_back(x);
    xs.push_back(-x);
  }
  const KvCase c{1, 128, 8, 32, 0, 0, 0};
  KvCase run = c;
  run.n_groups = static_cast<int>((xs.size() + c.head_dim - 1) / c.head_dim);
  const int64_t kv_dim = c.head_dim, rows = int64_t{run.n_groups} * c.G;
  std::vector<float> k(static_cast<size_t>(rows * kv_dim)), v(k.size());
  for (int64_t gi = 0; gi < run.n_groups; ++gi) {
    for (int64_t d = 0; d < kv_dim; ++d) {
      const float x = xs[static_cast<size_t>((gi * kv_dim + d) % xs.size())];
      for (int t = 0; t < c.G; ++t) {
        k[static_cast<size_t>((gi * c.G + t) * kv_dim + d)] = (d % 2 == 1 && t == 0) ? 0.0f : x;
      }
    }
  }
  for (size_t i = 0; i < v.size(); ++i) v[i] = xs[(i * 7) % xs.size()];
  expect_kv_identical(gpu(), cpu(), run, k, v);
  std::printf("[ quantize_kv ] %zu special values: bit-identical\n", xs.size());
}

TEST_F(CudaOpsTest, QuantizeKvOfNoGroupsWritesNothing) {
  const KvCase c{2, 64, 32, 64, 1, 0, 0};
  expect_kv_identical(gpu(), cpu(), c, std::vector<float>(1), std::vector<float>(1));
}

// A commit's flush of every layer in one launch (cuda::launch_quantize_kv_layers, the CUDA
// backend's quantize_kv_layers, unless QS_FLUSH_LAYERS=0): layer l's rows at l * layer_stride
// elements (a KV cache's buffer rows), its planes at l times one stride per array (QuantizedPlanes'
// layout). Every byte equals one launch_quantize_kv per layer, f32 and f16 rows; planes at
// non-uniform strides are declined (false, nothing written).
TEST_F(CudaOpsTest, QuantizeKvLayersEqualsOneCallPerLayer) {
  const KvCase cases[] = {
      {4, 64, 32, 64, 2, 1, 0}, {8, 128, 128, 32, 1, 3, 4}, {2, 128, 64, 128, 0, 2, 0}};
  const int layers = 5;
  uint64_t seed = 7000;
  for (const KvCase& c : cases) {
    for (const bool f16 : {false, true}) {
      const int64_t capacity = (c.first_group + c.n_groups + 1) * c.G;
      const int64_t stride = int64_t{c.heads} * c.head_dim + c.stride_pad;
      const int64_t rows = int64_t{c.n_groups} * c.G, layer_rows = rows + 24;  // buffer rows
      std::vector<float> all_k, all_v;
      for (int l = 0; l < layers; ++l) {
        std::vector<float> k, v;
        make_kv_rows(c, seed++, k, v);
        k.resize(static_cast<size_t>(layer_rows * stride), 0.0f);
        v.resize(k.size(), 0.0f);
        all_k.insert(all_k.end(), k.begin(), k.end());
        all_v.insert(all_v.end(), v.begin(), v.end());
      }
      const DType dtype = f16 ? DType::F16 : DType::F32;
      std::vector<uint16_t> k16(all_k.size()), v16(all_v.size());
      for (size_t i = 0; i < all_k.size(); ++i) {
        k16[i] = f32_to_f16(all_k[i]);
        v16[i] = f32_to_f16(all_v[i]);
      }
      const DeviceBytes kd = f16 ? DeviceBytes(gpu(), k16) : DeviceBytes(gpu(), all_k);
      const DeviceBytes vd = f16 ? DeviceBytes(gpu(), v16) : DeviceBytes(gpu(), all_v);
      const PlaneBytes one(c, capacity);
      std::vector<uint8_t> layered[PlaneBytes::kArrays];
      for (int i = 0; i < PlaneBytes::kArrays; ++i) {
        for (int l = 0; l < layers; ++l) {
          layered[i].insert(layered[i].end(), one.a[i].begin(), one.a[i].end());
        }
      }
      std::vector<std::unique_ptr<DeviceBytes>> want, got;
      for (int i = 0; i < PlaneBytes::kArrays; ++i) {
        want.push_back(std::make_unique<DeviceBytes>(gpu(), layered[i]));
        got.push_back(std::make_unique<DeviceBytes>(gpu(), layered[i]));
      }
      auto layer_out = [&](std::vector<std::unique_ptr<DeviceBytes>>& arrays, int l) {
        uint8_t* p[PlaneBytes::kArrays];
        for (int i = 0; i < PlaneBytes::kArrays; ++i)
          p[i] = arrays[i]->data() + l * one.a[i].size();
        return planes_out(p, c, capacity);
      };
      const auto stream = static_cast<cudaStream_t>(gpu().stream());
      const size_t step = static_cast<size_t>(layer_rows * stride) * dtype_size(dtype);
      std::vector<QuantizedKvPlanesOut> dst;
      for (int l = 0; l < layers; ++l) {
        cuda::launch_quantize_kv(kd.data() + l * step, vd.data() + l * step, dtype, stride, c.heads,
                                 c.head_dim, c.first_group, c.n_groups, layer_out(want, l), stream);
        dst.push_back(layer_out(got, l));
      }
      ASSERT_TRUE(cuda::launch_quantize_kv_layers(kd.data(), vd.data(), dtype, stride,
                                                  layer_rows * stride, layers, c.heads, c.head_dim,
                                                  c.first_group, c.n_groups, dst.data(), stream));
      for (int i = 0; i < PlaneBytes::kArrays; ++i) {
        EXPECT_EQ(got[i]->to_host(), want[i]->to_host())
            << describe(c) << (f16 ? " f16" : " f32") << ": " << PlaneBytes::kNames[i];
      }
      if (HasFailure()) return;
      std::swap(dst[1], dst[2]);  // not one stride: declined
      EXPECT_FALSE(cuda::launch_quantize_kv_layers(kd.data(), vd.data(), dtype, stride,
                                                   layer_rows * stride, layers, c.heads, c.head_dim,
                                                   c.first_group, c.n_groups, dst.data(), stream));
    }
  }
}

TEST_F(CudaOpsTest, FillZeroClearsExactlyTheRange) {
  std::vector<uint8_t> host(1000, 0x7E);
  DeviceBytes d(gpu(), host);
  gpu().fill_zero(d.data() + 3, 601);
  const std::vector<uint8_t> got = d.to_host();
  for (size_t i = 0; i < host.size(); ++i) {
    ASSERT_EQ(got[i], (i >= 3 && i < 604) ? 0 : 0x7E) << "byte " << i;
  }
}

// ---- matmul_q4 ----------------------------------------------------------------------------------

constexpr double kQ4Tolerance = 2e-5;       // tensor-core kernel (group 128)
constexpr double kQ4PlainTolerance = 2e-6;  // plain kernel (other group sizes)

// A 4-bit weight of random values; rows get different offsets so that the min term matters.
QuantizedWeight4 make_q4(int64_t rows, int64_t cols, uint64_t seed, int group = 128) {
  std::vector<float> w = random_normal(static_cast<size_t>(rows * cols), seed, 0.05f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) w[static_cast<size_t>(r * cols + c)] += 0.02f * (r % 5 - 2);
  }
  auto q = quantize_weight4(w.data(), DType::F32, rows, cols, group, "w4");
  EXPECT_TRUE(q.ok());
  return std::move(q).value();
}

std::string describe(const QuantizedWeight4& w, int m, bool bias) {
  return "rows=" + std::to_string(w.rows) + " cols=" + std::to_string(w.cols) +
         " group=" + std::to_string(w.group_size) + " m=" + std::to_string(m) +
         (bias ? " +bias" : "");
}

// Relative error of the GPU's y = x W4^T (+ bias) against the CPU's; x placed `x_offset` floats
// into its buffer (1: not 16-byte aligned). The caller releases the weights.
double run_q4(CudaBackend& gpu, CpuBackend& cpu, const QuantizedWeight4& w, int m,
              const WeightView* bias, uint64_t seed, int x_offset = 0) {
  const std::vector<float> x = random_normal(static_cast<size_t>(m * w.cols), seed);
  std::vector<float> want(static_cast<size_t>(m * w.rows));
  cpu.matmul_q4(x.data(), m, w, bias, want.data());
  DeviceArray xd(gpu, x.size() + x_offset), y(gpu, want.size());
  gpu.from_host(x.data(), xd.data() + x_offset, x.size());
  y.poison();
  gpu.matmul_q4(xd.data() + x_offset, m, w, bias, y.data());
  return rel_error(y.to_host(), want);
}

TEST_F(CudaOpsTest, MatmulQ4EveryRowCount) {
  // 1000 columns: 7 full groups and a short one of 104; 300 rows: a partial last 16-row tile.
  const QuantizedWeight4 w = make_q4(300, 1000, 10);
  HostWeight b32(random_normal(300, 11), DType::F32, 1, 300, "b");
  HostWeight b16(random_normal(300, 12), DType::BF16, 1, 300, "b");
  double worst = 0;
  for (int m : {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 40}) {
    const WeightView* bias = m % 3 == 0 ? &b32.view : m % 3 == 1 ? &b16.view : nullptr;
    const double err = run_q4(gpu(), cpu(), w, m, bias, 20 + m);
    EXPECT_LT(err, kQ4Tolerance) << describe(w, m, bias != nullptr);
    worst = std::max(worst, err);
  }
  std::printf("[ max rel error ] matmul_q4 300x1000, m = 1..17, 40: %.3g\n", worst);
}

TEST_F(CudaOpsTest, MatmulQ4OddAndShortShapes) {
  // Odd column counts (scalar activation loads, a half-used last byte), a single short group,
  // fewer rows than a tile, K % 4 == 0 without K % 128 == 0.
  const std::pair<int64_t, int64_t> shapes[] = {{37, 301}, {1, 128},  {16, 128}, {17, 129}, {5, 4},
                                                {33, 2},   {64, 260}, {3, 1},    {130, 387}};
  for (auto [rows, cols] : shapes) {
    const QuantizedWeight4 w = make_q4(rows, cols, 100 + rows + cols);
    HostWeight b(random_normal(rows, 7), DType::F32, 1, rows, "b");
    for (int m : {1, 5, 9, 16, 23}) {
      const bool with_bias = m % 2 == 1;
      const double err = run_q4(gpu(), cpu(), w, m, with_bias ? &b.view : nullptr, 200 + m);
      EXPECT_LT(err, kQ4Tolerance) << describe(w, m, with_bias);
    }
    gpu().release_weights();
  }
}

// A q/k/v-like group of three 4-bit matrices (300, 64 and 17 rows over `cols`) with an f32 bias
// on the first and a bf16 bias on the third; seeds seed .. seed + 4.
struct Q4Trio {
  QuantizedWeight4 ws[3];
  HostWeight b32, b16;
  const WeightView* biases[3];

  Q4Trio(int64_t cols, uint64_t seed)
      : ws{make_q4(300, cols, seed), make_q4(64, cols, seed + 1), make_q4(17, cols, seed + 2)},
        b32(random_normal(300, seed + 3), DType::F32, 1, 300, "b"),
        b16(random_normal(17, seed + 4), DType::BF16, 1, 17, "b"),
        biases{&b32.view, nullptr, &b16.view} {}
  Q4Trio(const Q4Trio&) = delete;  // biases point into it
  Q4Trio& operator=(const Q4Trio&) = delete;
};

// matmul_group over 4-bit weights: one launch of the CUDA-core kernel for q/k/v-like and
// gate/up-like groups (partial tiles, biases of two dtypes, RT 1 and 2 from the total tile
// count), and the per-matrix fallback for other row counts; each output against the CPU.
TEST_F(CudaOpsTest, MatmulQ4GroupMatchesCpu) {
  const Q4Trio trio(1000, 41);
  const QuantizedWeight4* ws = trio.ws;
  const WeightView* const* biases = trio.biases;
  const QuantizedWeight4 big[2] = {make_q4(4490, 512, 46), make_q4(4500, 512, 47)};
  const cuda::Q4GemvTuning saved = cuda::q4_gemv_tuning();
  double worst = 0;
  // The CUDA-core kernel's codes in registers / the cp.async ring; kernels 5-10: m = 1 on the
  // persistent kernels (one grid over the group's tiles; 10: pairs of tiles, straddling the
  // matrices where a matrix has an odd tile count).
  for (auto [stages, kernel] :
       {std::pair{1, 0}, {4, 0}, {0, 5}, {0, 6}, {0, 7}, {0, 8}, {0, 9}, {0, 10}}) {
    cuda::set_q4_gemv_tuning(cuda::Q4GemvTuning{0, 0, stages, kernel});
    for (int m : {1, 2, 3, 4, 5, 8, 9, 16}) {
      for (int count : {2, 3}) {
        for (bool wide : {false, true}) {  // wide: 281 + 282 tiles, 2 tiles per block
          const QuantizedWeight4* w = wide ? big : ws;
          const int64_t k = w[0].cols;
          const std::vector<float> x = random_normal(size_t(m) * k, 50 + m);
          DeviceArray xd(gpu(), x);
          std::vector<std::unique_ptr<DeviceArray>> ys;
          LinearOp ops[3];
          const int n = wide ? 2 : count;
          for (int i = 0; i < n; ++i) {
            ys.push_back(std::make_unique<DeviceArray>(gpu(), size_t(m) * w[i].rows));
            ys.back()->poison();
            ops[i] = {nullptr, &w[i], wide ? nullptr : biases[i], ys.back()->data()};
          }
          gpu().matmul_group(xd.data(), m, ops, n);
          for (int i = 0; i < n; ++i) {
            std::vector<float> want(size_t(m) * w[i].rows);
            cpu().matmul_q4(x.data(), m, w[i], ops[i].bias, want.data());
            const double err = rel_error(ys[i]->to_host(), want);
            EXPECT_LT(err, kQ4Tolerance)
                << describe(w[i], m, ops[i].bias != nullptr) << " op " << i << " of " << n
                << " stages=" << stages << " kernel=" << kernel;
            worst = std::max(worst, err);
          }
        }
      }
    }
  }
  cuda::set_q4_gemv_tuning(saved);
  gpu().release_weights();
  std::printf("[ max rel error ] matmul_q4 groups: %.3g\n", worst);
}

TEST_F(CudaOpsTest, MatmulQ4ModelShapes) {
  double worst = 0;
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{4096, 4096}, {1024, 4096}, {4096, 11008}}) {
    const QuantizedWeight4 w = make_q4(rows, cols, 300 + rows + cols);
    for (int m : {1, 5, 9, 16}) {
      const double err = run_q4(gpu(), cpu(), w, m, nullptr, 310 + m);
      EXPECT_LT(err, kQ4Tolerance) << describe(w, m, false);
      worst = std::max(worst, err);
    }
    gpu().release_weights();
  }
  std::printf("[ max rel error ] matmul_q4 Llama shapes, m = 1, 5, 9, 16: %.3g\n", worst);
}

// Every kernel variant the benchmark compares computes the same function.
TEST_F(CudaOpsTest, MatmulQ4EveryTuning) {
  const cuda::Q4GemvTuning saved = cuda::q4_gemv_tuning();
  const QuantizedWeight4 a = make_q4(300, 1000, 400), b = make_q4(130, 4096, 401);
  HostWeight bias(random_normal(300, 402), DType::F32, 1, 300, "b");
  for (int stages : {0, 4}) {
    for (int rt : {0, 1, 2, 4}) {
      for (int warps : {0, 1, 3, 8}) {
        cuda::set_q4_gemv_tuning(cuda::Q4GemvTuning{rt, warps, stages, /*kernel=*/1});
        for (const QuantizedWeight4* w : {&a, &b}) {
          for (int m : {1, 4, 8, 9, 16}) {
            const WeightView* bv = (w == &a && m % 2 == 1) ? &bias.view : nullptr;
            EXPECT_LT(run_q4(gpu(), cpu(), *w, m, bv, 410 + m), kQ4Tolerance)
                << describe(*w, m, bv != nullptr) << " row_tiles=" << rt << " warps=" << warps
                << " stages=" << stages;
          }
        }
      }
    }
  }
  cuda::set_q4_gemv_tuning(saved);
}

// The CUDA-core kernel (m <= 8) on every row count, tiles per block (1, 2, 4; 4 runs as 2 above
// m = 2 and with the ring), warp split, both ways the codes arrive (registers, the cp.async ring),
// odd shape (short last group, partial last tile and block, odd K: scalar activation loads), bias
// dtype and misaligned x; m > 8 falls back to the tensor cores under the same tuning.
TEST_F(CudaOpsTest, MatmulQ4CudaCoreKernel) {
  const cuda::Q4GemvTuning saved = cuda::q4_gemv_tuning();
  const QuantizedWeight4 a = make_q4(300, 1000, 800), b = make_q4(130, 4096, 801),
                         c = make_q4(37, 301, 802), d = make_q4(17, 129, 803);
  HostWeight b32(random_normal(300, 804), DType::F32, 1, 300, "b");
  HostWeight b16(random_normal(300, 805), DType::BF16, 1, 300, "b");
  double worst = 0;
  for (int stages : {1, 4}) {
    for (int rt : {0, 1, 2, 4}) {
      for (int warps : {0, 1, 3, 8}) {
        cuda::set_q4_gemv_tuning(cuda::Q4GemvTuning{rt, warps, stages, /*kernel=*/2});
        for (const QuantizedWeight4* w : {&a, &b, &c, &d}) {
          for (int m : {1, 2, 3, 4, 5, 6, 7, 8, 9}) {
            const WeightView* bv = w != &a      ? nullptr
                                   : m % 3 == 0 ? &b32.view
                                   : m % 3 == 1 ? &b16.view
                                                : nullptr;
            for (int x_offset : {0, 1}) {
              const double err = run_q4(gpu(), cpu(), *w, m, bv, 810 + m, x_offset);
              EXPECT_LT(err, kQ4Tolerance)
                  << describe(*w, m, bv != nullptr) << " row_tiles=" << rt << " warps=" << warps
                  << " stages=" << stages << " x_offset=" << x_offset;
              worst = std::max(worst, err);
            }
          }
        }
      }
    }
  }
  cuda::set_q4_gemv_tuning(saved);
  gpu().release_weights();
  std::printf("[ max rel error ] matmul_q4 CUDA-core kernel, m = 1..9: %.3g\n", worst);
}

// The persistent kernel (kernels 5-10, m = 1: one or two MMA accumulator chains, biased codes,
// subnormal codes with hi / lo as two token columns, two tiles per stage):
// fewer groups than warps (129 and 301 columns: 2 and 3
// groups), a short last group, partial last tiles, fewer tiles than SMs and many tiles per block
// (4500 rows: 282 tiles), Llama shapes (32, 86 and 112 groups: uneven group splits), both bias
// dtypes, misaligned x (scalar activation loads); m > 1 falls back to kernel 4's choice.
TEST_F(CudaOpsTest, MatmulQ4PersistentKernel) {
  const cuda::Q4GemvTuning saved = cuda::q4_gemv_tuning();
  const std::pair<int64_t, int64_t> shapes[] = {{300, 1000},   {130, 4096}, {37, 301},
                                                {17, 129},     {4500, 512}, {4096, 4096},
                                                {1024, 11008}, {512, 14336}};
  double worst = 0;
  for (int kernel : {5, 6, 7, 8, 9, 10}) {
    cuda::set_q4_gemv_tuning(cuda::Q4GemvTuning{0, 0, 0, kernel});
    int i = 0;
    for (auto [rows, cols] : shapes) {
      const QuantizedWeight4 w = make_q4(rows, cols, 1200 + rows + cols);
      HostWeight b(random_normal(rows, 1206 + i), i % 2 ? DType::BF16 : DType::F32, 1, rows, "b");
      for (int m : {1, 2, 5}) {
        for (int x_offset : {0, 1}) {
          const WeightView* bv = (i + m + x_offset) % 3 == 0 ? nullptr : &b.view;
          const double err = run_q4(gpu(), cpu(), w, m, bv, 1210 + m, x_offset);
          EXPECT_LT(err, kQ4Tolerance)
              << describe(w, m, bv != nullptr) << " x_offset=" << x_offset << " kernel=" << kernel;
          if (m == 1) worst = std::max(worst, err);
        }
      }
      gpu().release_weights();
      ++i;
    }
  }
  cuda::set_q4_gemv_tuning(saved);
  std::printf("[ max rel error ] matmul_q4 persistent kernel, m = 1: %.3g\n", worst);
}

// The subnormal-code kernels (8-10) scale each group's activation by its own power of two
// before the f16 hi / lo split: activations at scales from 2^-100 to 2^100, a group of
// zeros (exact zeros out), a group of f32 subnormals (finite, tiny outputs) and one large value
// among small ones. Each case is its own one-group activation, so every scale's error is
// measured on its own (a norm over several groups would hide the small ones).
TEST_F(CudaOpsTest, MatmulQ4PersistentKernelWideRangeActivations) {
  const cuda::Q4GemvTuning saved = cuda::q4_gemv_tuning();
  const int64_t rows = 64, cols = 128;
  const QuantizedWeight4 w = make_q4(rows, cols, 1290);
  const float scales[] = {1.0f, 0x1p-100f, 0x1p100f, 0x1p-20f, 0x1p40f, 0.0f};
  double worst = 0;
  for (int kernel : {7, 8, 9, 10}) {
    cuda::set_q4_gemv_tuning(cuda::Q4GemvTuning{0, 0, 0, kernel});
    for (size_t i = 0; i < std::size(scales) + 2; ++i) {
      std::vector<float> x = random_normal(cols, 1291 + i);
      if (i < std::size(scales)) {
        for (float& v : x) v *= scales[i];
      } else if (i == std::size(scales)) {  // f32 subnormals
        for (float& v : x) v *= 0x1p-140f;
      } else {  // one value 2^30 times the rest
        x[17] = 0x1p30f;
      }
      std::vector<float> want(rows);
      cpu().matmul_q4(x.data(), 1, w, nullptr, want.data());
      DeviceArray xd(gpu(), x), y(gpu(), rows);
      y.poison();
      gpu().matmul_q4(xd.data(), 1, w, nullptr, y.data());
      const std::vector<float> got = y.to_host();
      if (i + 1 == std::size(scales)) {  // zeros in, zeros out
        for (float v : got) EXPECT_EQ(v, 0.0f) << "kernel=" << kernel;
        continue;
      }
      if (i == std::size(scales)) {  // the CPU's own result is rounded to subnormals: finite, tiny
        EXPECT_LT(testing::max_abs_diff(got, want), 1e-35) << "kernel=" << kernel;
        continue;
      }
      const double err = rel_error(got, want);
      EXPECT_LT(err, kQ4Tolerance) << "case " << i << " kernel=" << kernel;
      worst = std::max(worst, err);
    }
    gpu().release_weights();
  }
  cuda::set_q4_gemv_tuning(saved);
  std::printf("[ max rel error ] matmul_q4 persistent kernel, wide-range x: %.3g\n", worst);
}

// The pair kernel (10) forms every row's sum in kernel 8's order: the same bits, for single
// matrices with odd tile counts (a pair's second tile past the end), fewer groups than warps,
// Llama shapes and both bias dtypes, and for groups of matrices whose pairs straddle two
// matrices (19 + 4 + 2 tiles). K = 18944 (148 groups: Qwen2-7B's down projection) does not fit
// the pair kernel's shared memory and runs kernel 8.
TEST_F(CudaOpsTest, MatmulQ4PairKernelEqualsKernel8) {
  const cuda::Q4GemvTuning saved = cuda::q4_gemv_tuning();
  auto with_kernel = [&](int kernel, auto run) {
    cuda::set_q4_gemv_tuning(cuda::Q4GemvTuning{0, 0, 0, kernel});
    run();
  };
  const std::pair<int64_t, int64_t> shapes[] = {{300, 1000}, {37, 301},    {17, 129},
                                                {4500, 512}, {4096, 4096}, {1024, 11008},
                                                {16, 128},   {512, 14336}, {256, 18944}};
  int i = 0;
  for (auto [rows, cols] : shapes) {
    const QuantizedWeight4 w = make_q4(rows, cols, 1400 + rows + cols);
    HostWeight b(random_normal(rows, 1401 + i), i % 2 ? DType::BF16 : DType::F32, 1, rows, "b");
    for (int x_offset : {0, 1}) {
      const std::vector<float> x = random_normal(size_t(cols), 1402 + i);
      DeviceArray xd(gpu(), x.size() + x_offset), y8(gpu(), rows), y10(gpu(), rows);
      gpu().from_host(x.data(), xd.data() + x_offset, x.size());
      const WeightView* bv = (i + x_offset) % 3 == 0 ? nullptr : &b.view;
      y10.poison();
      with_kernel(8, [&] { gpu().matmul_q4(xd.data() + x_offset, 1, w, bv, y8.data()); });
      with_kernel(10, [&] { gpu().matmul_q4(xd.data() + x_offset, 1, w, bv, y10.data()); });
      EXPECT_EQ(y10.to_host(), y8.to_host())
          << describe(w, 1, bv != nullptr) << " x_offset=" << x_offset;
    }
    gpu().release_weights();
    ++i;
  }
  const Q4Trio trio(1000, 1441);
  const QuantizedWeight4* ws = trio.ws;
  const WeightView* const* biases = trio.biases;
  const std::vector<float> x = random_normal(size_t(trio.ws[0].cols), 1446);
  DeviceArray xd(gpu(), x);
  for (int count : {1, 2, 3}) {
    std::vector<std::vector<float>> got[2];
    for (int k = 0; k < 2; ++k) {
      std::vector<std::unique_ptr<DeviceArray>> ys;
      LinearOp ops[3];
      for (int j = 0; j < count; ++j) {
        ys.push_back(std::make_unique<DeviceArray>(gpu(), ws[j].rows));
        ys.back()->poison();
        ops[j] = {nullptr, &ws[j], biases[j], ys.back()->data()};
      }
      with_kernel(k == 0 ? 8 : 10, [&] { gpu().matmul_group(xd.data(), 1, ops, count); });
      for (int j = 0; j < count; ++j) got[k].push_back(ys[j]->to_host());
    }
    for (int j = 0; j < count; ++j) {
      EXPECT_EQ(got[1][j], got[0][j]) << "group of " << count << ", matrix " << j;
    }
  }
  gpu().release_weights();
  cuda::set_q4_gemv_tuning(saved);
}

// Large K and N for the CUDA-core kernel: several load batches per warp, many blocks.
TEST_F(CudaOpsTest, MatmulQ4CudaCoreKernelModelShapes) {
  const cuda::Q4GemvTuning saved = cuda::q4_gemv_tuning();
  double worst = 0;
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{4096, 4096}, {1024, 11008}}) {
    const QuantizedWeight4 w = make_q4(rows, cols, 900 + rows + cols);
    for (int stages : {1, 4}) {
      cuda::set_q4_gemv_tuning(cuda::Q4GemvTuning{0, 0, stages, /*kernel=*/2});
      for (int m : {1, 2, 4, 5, 8}) {
        const double err = run_q4(gpu(), cpu(), w, m, nullptr, 910 + m);
        EXPECT_LT(err, kQ4Tolerance) << describe(w, m, false) << " stages=" << stages;
        worst = std::max(worst, err);
      }
    }
    gpu().release_weights();
  }
  cuda::set_q4_gemv_tuning(saved);
  std::printf("[ max rel error ] matmul_q4 CUDA-core kernel, Llama shapes: %.3g\n", worst);
}

// The wide tensor-core kernel (kernel 3) on every tile width and warp split (3: uneven, some
// warps without a batch), row counts across both token-tile widths, shapes with a partial last
// block of tiles (300 rows: 19 tiles; 37 rows: fewer tiles than a block), partial last batches
// (8, 3 and 2 groups), odd K (scalar activation loads), both bias dtypes and misaligned x.
TEST_F(CudaOpsTest, MatmulQ4WideKernel) {
  const cuda::Q4GemvTuning saved = cuda::q4_gemv_tuning();
  const QuantizedWeight4 a = make_q4(300, 1000, 1000), b = make_q4(130, 4096, 1001),
                         c = make_q4(37, 301, 1002), d = make_q4(17, 129, 1003);
  HostWeight b32(random_normal(300, 1004), DType::F32, 1, 300, "b");
  HostWeight b16(random_normal(300, 1005), DType::BF16, 1, 300, "b");
  double worst = 0;
  for (int rt : {0, 1, 2, 4}) {
    for (int warps : {0, 1, 2, 3, 8}) {
      cuda::set_q4_gemv_tuning(cuda::Q4GemvTuning{rt, warps, 0, /*kernel=*/3});
      for (const QuantizedWeight4* w : {&a, &b, &c, &d}) {
        for (int m : {1, 2, 5, 8, 9, 16}) {
          const WeightView* bv =
              w != &a ? nullptr : m % 3 == 0 ? &b32.view : m % 3 == 1 ? &b16.view : nullptr;
          for (int x_offset : {0, 1}) {
            const double err = run_q4(gpu(), cpu(), *w, m, bv, 1010 + m, x_offset);
            EXPECT_LT(err, kQ4Tolerance) << describe(*w, m, bv != nullptr) << " row_tiles=" << rt
                                         << " warps=" << warps << " x_offset=" << x_offset;
            worst = std::max(worst, err);
          }
        }
      }
    }
  }
  cuda::set_q4_gemv_tuning(saved);
  gpu().release_weights();
  std::printf("[ max rel error ] matmul_q4 wide kernel, m = 1..16: %.3g\n", worst);
}

// The wide kernel's automatic launch on Llama shapes: 4 tiles per warp with several warps per
// block (gate/up 11008 x 4096), one tile per warp with a partial last batch (86 groups), few
// blocks (1024 rows).
TEST_F(CudaOpsTest, MatmulQ4WideKernelModelShapes) {
  const cuda::Q4GemvTuning saved = cuda::q4_gemv_tuning();
  cuda::set_q4_gemv_tuning(cuda::Q4GemvTuning{0, 0, 0, /*kernel=*/3});
  double worst = 0;
  for (auto [rows, cols] :
       {std::pair<int64_t, int64_t>{11008, 4096}, {4096, 11008}, {1024, 4096}}) {
    const QuantizedWeight4 w = make_q4(rows, cols, 1100 + rows + cols);
    for (int m : {1, 5, 16}) {
      const double err = run_q4(gpu(), cpu(), w, m, nullptr, 1110 + m);
      EXPECT_LT(err, kQ4Tolerance) << describe(w, m, false);
      worst = std::max(worst, err);
    }
    gpu().release_weights();
  }
  cuda::set_q4_gemv_tuning(saved);
  std::printf("[ max rel error ] matmul_q4 wide kernel, Llama shapes: %.3g\n", worst);
}

TEST_F(CudaOpsTest, MatmulQ4UnalignedActivations) {
  const QuantizedWeight4 w = make_q4(200, 1024, 500);
  for (int m : {1, 7, 12}) {
    EXPECT_LT(run_q4(gpu(), cpu(), w, m, nullptr, 510 + m, 1), kQ4Tolerance)
        << describe(w, m, false) << " x misaligned";
  }
}

TEST_F(CudaOpsTest, MatmulQ4OtherGroupSizesUseThePlainKernel) {
  for (int group : {64, 32, 100}) {
    const QuantizedWeight4 w = make_q4(70, 333, 600 + group, group);
    HostWeight b(random_normal(70, 601), DType::F16, 1, 70, "b");
    for (int m : {1, 7, 16, 20}) {
      const double err = run_q4(gpu(), cpu(), w, m, m % 2 ? nullptr : &b.view, 610 + m);
      EXPECT_LT(err, kQ4PlainTolerance) << describe(w, m, m % 2 == 0);
    }
    gpu().release_weights();
  }
}

// Uploaded once, found again by the host address of the codes (also after the struct moved),
// and dropped by release_weights().
TEST_F(CudaOpsTest, MatmulQ4UploadsEachWeightOnce) {
  gpu().release_weights();
  QuantizedWeight4 w = make_q4(64, 256, 700);
  const std::vector<float> x = random_normal(256, 701);
  DeviceArray xd(gpu(), x), y(gpu(), 64);
  gpu().matmul_q4(xd.data(), 1, w, nullptr, y.data());
  const size_t after_first = gpu().resident_weight_bytes();
  EXPECT_GE(after_first, size_t{64 * 128});
  const QuantizedWeight4 moved = std::move(w);
  gpu().matmul_q4(xd.data(), 1, moved, nullptr, y.data());
  EXPECT_EQ(gpu().resident_weight_bytes(), after_first);
  std::vector<float> want(64);
  cpu().matmul_q4(x.data(), 1, moved, nullptr, want.data());
  EXPECT_LT(rel_error(y.to_host(), want), kQ4Tolerance);
  gpu().release_weights();
  EXPECT_EQ(gpu().resident_weight_bytes(), 0u);
}

}  // namespace
}  // namespace qs
