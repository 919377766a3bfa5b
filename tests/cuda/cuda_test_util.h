// Helpers of the CUDA conformance tests: a shared backend pair (CPU reference + CUDA), random
// host data, device copies, host weights in any dtype, and error norms.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/attention_quant.h"
#include "backend/cuda/cuda_backend.h"
#include "core/dtype.h"

namespace qs::testing {

// One CUDA backend and one CPU backend for the whole test program (creating a CUDA context and
// a thread pool per test would dominate the run time). Tests skip without a GPU.
class CudaOpsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!cuda_device_available()) return;
    auto created = CudaBackend::create();
    ASSERT_TRUE(created.ok()) << created.error().message;
    cuda_ = std::move(created).value().release();
    cpu_ = new CpuBackend(0);
  }
  static void TearDownTestSuite() {
    delete cuda_;
    delete cpu_;
    cuda_ = nullptr;
    cpu_ = nullptr;
  }
  void SetUp() override {
    if (cuda_ == nullptr) GTEST_SKIP() << "no CUDA device";
  }
  // Host weights of a test die with it: forget their device copies.
  void TearDown() override {
    if (cuda_ != nullptr) cuda_->release_weights();
  }

  static CudaBackend& gpu() { return *cuda_; }
  static CpuBackend& cpu() { return *cpu_; }

 private:
  static inline CudaBackend* cuda_ = nullptr;
  static inline CpuBackend* cpu_ = nullptr;
};

// Seeded normal values (splitmix64 + Box-Muller: fast enough for 100M-value KV caches).
inline std::vector<float> random_normal(size_t n, uint64_t seed, float stddev = 1.0f,
                                        float mean = 0.0f) {
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
  auto next_uniform = [&state] {  // in (0, 1]
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (static_cast<double>(z >> 11) + 1.0) * (1.0 / 9007199254740992.0);
  };
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i += 2) {
    const double r = std::sqrt(-2.0 * std::log(next_uniform()));
    const double t = 6.283185307179586 * next_uniform();
    v[i] = static_cast<float>(mean + stddev * r * std::cos(t));
    if (i + 1 < n) v[i + 1] = static_cast<float>(mean + stddev * r * std::sin(t));
  }
  return v;
}

// K or V rows over many decades, for f16 rows: key magnitudes 10^[-2, 0.5] (scores stay within
// ~10, so that the f32 reference is well conditioned), value magnitudes 10^[-6, 4.8] (f16
// subnormals up to the f16 maximum), zero rows, a constant key channel (kv head 0, channel 1).
inline std::vector<float> wild_f16_rows(int len, int64_t stride, uint64_t seed, bool key) {
  std::vector<float> x = random_normal(size_t(len) * stride, seed);
  for (int t = 0; t < len; ++t) {
    const float mag = key ? std::pow(10.0f, -0.75f + 1.25f * std::sin(0.31f * float(t)))
                          : std::pow(10.0f, 0.6f - 5.4f * std::cos(0.17f * float(t)));
    for (int64_t i = 0; i < stride; ++i) {
      float& e = x[size_t(t * stride + i)];
      e = t % 97 == 50 ? 0.0f : std::clamp(e * mag, -65504.0f, 65504.0f);
    }
    if (!key && t % 61 == 3) x[size_t(t * stride)] = 65504.0f;
    if (key) x[size_t(t * stride + 1)] = 3.0f;
  }
  return x;
}

// Device memory holding a copy of host data (or n uninitialized floats).
class DeviceArray {
 public:
  DeviceArray(Backend& be, size_t n) : be_(&be), buf_(be.alloc(n)) {}
  DeviceArray(Backend& be, const std::vector<float>& host) : DeviceArray(be, host.size()) {
    be.from_host(host.data(), buf_->data(), host.size());
  }
  float* data() const { return buf_->data(); }
  size_t size() const { return buf_->size(); }
  std::vector<float> to_host() const {
    std::vector<float> h(buf_->size());
    be_->to_host(buf_->data(), h.data(), h.size());
    return h;
  }
  // Fills the device memory with NaN so that unwritten outputs fail the comparison.
  void poison() {
    std::vector<float> nan(buf_->size(), std::nanf(""));
    be_->from_host(nan.data(), buf_->data(), nan.size());
  }

 private:
  Backend* be_;
  std::unique_ptr<Buffer> buf_;
};

// Raw bytes in backend memory (through the backend's float buffers, rounded up to whole floats
// plus one spare; the copies are memcpy, so any bit pattern survives).
class DeviceBytes {
 public:
  DeviceBytes(Backend& be, const void* host, size_t bytes)
      : be_(&be), bytes_(bytes), buf_(be.alloc((bytes + 3) / 4 + 1)) {
    std::vector<float> staging(buf_->size(), 0.0f);
    std::memcpy(staging.data(), host, bytes);
    be.from_host(staging.data(), buf_->data(), staging.size());
  }
  template <typename T>
  DeviceBytes(Backend& be, const std::vector<T>& host)
      : DeviceBytes(be, host.data(), host.size() * sizeof(T)) {}
  uint8_t* data() const { return reinterpret_cast<uint8_t*>(buf_->data()); }
  template <typename T>
  T* as() const {
    return reinterpret_cast<T*>(buf_->data());
  }
  std::vector<uint8_t> to_host() const {
    std::vector<float> staging(buf_->size());
    be_->to_host(buf_->data(), staging.data(), staging.size());
    std::vector<uint8_t> out(bytes_);
    std::memcpy(out.data(), staging.data(), bytes_);
    return out;
  }

 private:
  Backend* be_;
  size_t bytes_;
  std::unique_ptr<Buffer> buf_;
};

// A weight in host memory in `dtype`, from f32 values (rounded), and the values it holds.
struct HostWeight {
  std::vector<uint8_t> bytes;
  std::vector<float> values;  // what the stored dtype represents, as f32
  WeightView view;

  HostWeight(const std::vector<float>& src, DType dtype, int64_t rows, int64_t cols,
             std::string name = "test.weight") {
    const size_t n = src.size();
    bytes.resize(n * dtype_size(dtype));
    values.resize(n);
    for (size_t i = 0; i < n; ++i) {
      if (dtype == DType::F32) {
        reinterpret_cast<float*>(bytes.data())[i] = src[i];
        values[i] = src[i];
      } else if (dtype == DType::F16) {
        const uint16_t h = f32_to_f16(src[i]);
        reinterpret_cast<uint16_t*>(bytes.data())[i] = h;
        values[i] = f16_to_f32(h);
      } else {
        const uint16_t h = f32_to_bf16(src[i]);
        reinterpret_cast<uint16_t*>(bytes.data())[i] = h;
        values[i] = bf16_to_f32(h);
      }
    }
    view.data = bytes.data();
    view.dtype = dtype;
    view.rows = rows;
    view.cols = cols;
    view.name = std::move(name);
  }
};

// ||a - b|| / ||b|| (Frobenius); NaN anywhere makes it NaN, which fails any bound.
inline double rel_error(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0.0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double d = std::abs(static_cast<double>(a[i]) - b[i]);
    if (std::isnan(d)) return d;
    m = std::max(m, d);
  }
  return m;
}

// Elements whose bits differ (a bit-for-bit comparison: -0 vs 0 and NaN payloads count). The
// vectors have the same size.
inline size_t bitwise_differences(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  size_t n = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  }
  return n;
}

inline const char* dtype_label(DType t) {
  return dtype_name(t);
}

// The draft (INT4) view on the tensor-core quantized attention runs with f16 operands alone by
// default (QuantAttentionTuning::draft_f16), and the INT8 view on the register-direct path where
// QuantAttentionTuning::int8_f16 is on: the folded query and the value weights are rounded to
// f16 (~2^-12 relative), far below either view's own quantization error (up to s/2 per element).
// Such calls are held to kF16OperandsTol against the exact view; a wrong fragment map, fold or
// weight is O(1).
constexpr double kF16OperandsTol = 1e-2;

// Whether gpu.attention(q, m, pos, shape, view, out) takes such a path under the current tuning
// and gpu's options (CudaBackendOptions::exact_draft_attention, f16_target_attention).
inline bool f16_operand_attention(const CudaBackend& gpu, const float* q, int m, int pos,
                                  const AttentionShape& shape, const KvView& view, float* out) {
  if (view.quantized == nullptr) return false;
  // Longer blocks run as slices of kQuantAttentionMaxRows queries, all on the same path.
  const int m0 = std::min(m, cuda::kQuantAttentionMaxRows);
  cuda::QuantAttentionArgs a = cuda::make_quant_attention_args(q, m0, pos, shape, view, out);
  a.exact_draft = gpu.options().exact_draft_attention;
  a.f16_int8 = gpu.options().f16_target_attention;
  return cuda::plan_attention_quant(a, 1).f16_operands;
}

// Rows as f16 bits and as the f32 values those bits hold (host), and device copies of both.
struct F16Kv {
  int len, kv_heads, head_dim;
  int64_t stride;
  std::vector<uint16_t> k16, v16;
  std::vector<float> k32, v32;
  std::unique_ptr<DeviceBytes> k16_dev, v16_dev;
  std::unique_ptr<DeviceArray> k32_dev, v32_dev;

  // kf, vf: the values before rounding (stride-padded rows).
  F16Kv(Backend& gpu, int len_, int kvh, int hd, int64_t pad, const std::vector<float>& kf,
        const std::vector<float>& vf)
      : len(len_), kv_heads(kvh), head_dim(hd), stride(int64_t{kvh} * hd + pad) {
    round(kf, k16, k32);
    round(vf, v16, v32);
    k16_dev = std::make_unique<DeviceBytes>(gpu, k16);
    v16_dev = std::make_unique<DeviceBytes>(gpu, v16);
    k32_dev = std::make_unique<DeviceArray>(gpu, k32);
    v32_dev = std::make_unique<DeviceArray>(gpu, v32);
  }
  F16Kv(Backend& gpu, int len_, int kvh, int hd, int64_t pad, uint64_t seed)
      : F16Kv(gpu, len_, kvh, hd, pad,
              random_normal(size_t(len_) * (int64_t{kvh} * hd + pad), seed),
              random_normal(size_t(len_) * (int64_t{kvh} * hd + pad), seed + 1)) {}

  static void round(const std::vector<float>& x, std::vector<uint16_t>& h, std::vector<float>& f) {
    h.resize(x.size());
    f.resize(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      h[i] = f32_to_f16_sat(x[i]);
      f[i] = f16_to_f32(h[i]);
    }
  }

  // Views of rows [fp_base, len) (row 0 = position fp_base): host f16 (CPU), device f16, device
  // f32 of the same values.
  KvView cpu_view(int fp_base = 0) const {
    KvView v{k16.data() + fp_base * stride, v16.data() + fp_base * stride, stride, len};
    v.row_dtype = DType::F16;
    v.fp_base = fp_base;
    return v;
  }
  KvView gpu_view(int fp_base = 0) const {
    KvView v{k16_dev->as<const uint16_t>() + fp_base * stride,
             v16_dev->as<const uint16_t>() + fp_base * stride, stride, len};
    v.row_dtype = DType::F16;
    v.fp_base = fp_base;
    return v;
  }
  KvView gpu_view_f32(int fp_base = 0) const {
    KvView v{k32_dev->data() + fp_base * stride, v32_dev->data() + fp_base * stride, stride, len};
    v.fp_base = fp_base;
    return v;
  }
};

}  // namespace qs::testing
