#include "backend/cpu/cpu_backend.h"

#include <cblas.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/simd.h"
#include "core/error.h"

namespace qs {

namespace {

class HostBuffer final : public Buffer {
 public:
  explicit HostBuffer(size_t n) : storage_(new float[n]) {  // uninitialized on purpose
    data_ = storage_.get();
    size_ = n;
  }

 private:
  std::unique_ptr<float[]> storage_;
};

// Elementwise loops below this size are not worth waking the workers for.
constexpr int64_t kParallelElementwise = 1 << 16;

}  // namespace

CpuBackend::CpuBackend(int num_threads) : pool_(num_threads) {
  openblas_set_num_threads(1);
}

std::unique_ptr<Buffer> CpuBackend::alloc(size_t n) {
  return std::make_unique<HostBuffer>(n);
}

void CpuBackend::to_host(const float* src, float* dst_host, size_t n) {
  if (src != dst_host) std::memcpy(dst_host, src, n * sizeof(float));
}

void CpuBackend::embedding(const WeightView& table, const int32_t* ids, int m, float* out) {
  const int64_t d = table.cols;
  for (int i = 0; i < m; ++i) {
    QS_CHECK_MSG(ids[i] >= 0 && ids[i] < table.rows, "token id out of range of " + table.name);
    const size_t elem = dtype_size(table.dtype);
    to_f32(table.dtype, static_cast<const char*>(table.data) + ids[i] * d * elem, out + i * d,
           static_cast<size_t>(d));
  }
}

void CpuBackend::rmsnorm(const float* x, const WeightView& weight, int m, float eps, float* out) {
  const int64_t d = weight.cols;
  std::vector<float> w(static_cast<size_t>(d));
  to_f32(weight.dtype, weight.data, w.data(), static_cast<size_t>(d));
  pool_.parallel_for(m, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float* xi = x + i * d;
      float* yi = out + i * d;
      // HF: mean of the f32 squares; a double sum keeps the reduction order irrelevant.
      double sum_sq = 0.0;
      for (int64_t j = 0; j < d; ++j) sum_sq += static_cast<double>(xi[j] * xi[j]);
      float variance = static_cast<float>(sum_sq / static_cast<double>(d));
      float inv_rms = 1.0f / std::sqrt(variance + eps);
      for (int64_t j = 0; j < d; ++j) yi[j] = w[j] * (xi[j] * inv_rms);
    }
  });
}

void CpuBackend::rope(float* x, int m, int num_heads, int head_dim, int pos,
                      const float* inv_freq) {
  QS_CHECK(head_dim % 2 == 0);
  const int half = head_dim / 2;
  const int64_t row_len = static_cast<int64_t>(num_heads) * head_dim;
  pool_.parallel_for(m, [&](int64_t begin, int64_t end) {
    std::vector<float> cos_v(half), sin_v(half);
    for (int64_t i = begin; i < end; ++i) {
      // HF: freqs = inv_freq @ position (f32), then cos/sin of the f32 angle.
      const float p = static_cast<float>(pos + i);
      for (int j = 0; j < half; ++j) {
        const float angle = p * inv_freq[j];
        cos_v[j] = static_cast<float>(std::cos(static_cast<double>(angle)));
        sin_v[j] = static_cast<float>(std::sin(static_cast<double>(angle)));
      }
      float* row = x + i * row_len;
      for (int h = 0; h < num_heads; ++h) {
        float* xh = row + static_cast<int64_t>(h) * head_dim;
        for (int j = 0; j < half; ++j) {
          const float x0 = xh[j], x1 = xh[j + half];
          xh[j] = x0 * cos_v[j] - x1 * sin_v[j];
          xh[j + half] = x1 * cos_v[j] + x0 * sin_v[j];
        }
      }
    }
  });
}

void CpuBackend::swiglu(const float* gate, const float* up, int64_t n, float* out) {
  auto body = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float g = gate[i];
      out[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
  };
  if (n < kParallelElementwise) {
    body(0, n);
  } else {
    pool_.parallel_for(n, body);
  }
}

void CpuBackend::add(float* y, const float* x, int64_t n) {
  auto body = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) y[i] += x[i];
  };
  if (n < kParallelElementwise) {
    body(0, n);
  } else {
    pool_.parallel_for(n, body);
  }
}

}  // namespace qs
