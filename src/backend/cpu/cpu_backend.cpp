#include "backend/cpu/cpu_backend.h"

#include <cblas.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "backend/cpu/simd.h"
#include "core/error.h"
#include "kv/sparse_select.h"
#include "quant/kv_quant.h"

namespace qs {

namespace {

// Elementwise loops below this size are not worth waking the workers for.
constexpr int64_t kParallelElementwise = 1 << 16;

}  // namespace

CpuBackend::CpuBackend(int num_threads) : pool_(num_threads) {
  openblas_set_num_threads(1);
}

std::unique_ptr<Buffer> CpuBackend::alloc(size_t n) {
  return std::make_unique<HostBuffer>(n);
}

int64_t CpuBackend::memory_available() const {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return -1;
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

namespace qs {

void CpuBackend::snapkv_scores(const float* q, int window, const void* k_rows, DType row_dtype,
                               int64_t row_stride, const AttentionShape& shape, int prompt_len,
                               int past, float* scores) {
  snapkv_scores_reference(q, window, k_rows, row_dtype, row_stride, shape, prompt_len, past, scores,
                          &pool_);
}

void CpuBackend::quantize_kv(const void* k_rows, const void* v_rows, DType row_dtype,
                             int64_t row_stride, int num_kv_heads, int head_dim,
                             int64_t first_group, int n_groups, const QuantizedKvPlanesOut& dst) {
  const int G = dst.group_size;
  QS_CHECK(G > 0 && dst.value_group_size > 0 && n_groups >= 0 && first_group >= 0);
  QS_CHECK((first_group + n_groups) * G <= dst.capacity);
  QS_CHECK(row_stride >= static_cast<int64_t>(num_kv_heads) * head_dim);
  QS_CHECK_MSG(kv_row_dtype_supported(row_dtype), "quantize_kv: rows are F32 or F16");
  const bool f16 = row_dtype == DType::F16;
  const int64_t row_bytes = head_dim / 2;
  const int64_t value_groups = head_dim / dst.value_group_size;
  const int64_t key_groups = dst.capacity / G;
  // One task per (kv head, group); each writes a disjoint slice of every array. F16 rows are
  // first converted (exactly) into f32 scratch [G, head_dim]: the quantizer then sees the same
  // f32 values as it would from f32 rows holding them.
  auto one = [&](int64_t task, std::vector<float>& k32, std::vector<float>& v32) {
    const int h = static_cast<int>(task / n_groups);
    const int64_t g = first_group + task % n_groups;
    const int64_t first_token = g * G;
    const int64_t off = (first_token - first_group * G) * row_stride + h * head_dim;
    const float* k;
    const float* v;
    int64_t stride = row_stride;
    if (f16) {
      k32.resize(static_cast<size_t>(G) * head_dim);
      v32.resize(static_cast<size_t>(G) * head_dim);
      const auto* k16 = static_cast<const uint16_t*>(k_rows) + off;
      const auto* v16 = static_cast<const uint16_t*>(v_rows) + off;
      for (int i = 0; i < G; ++i) {
        to_f32(DType::F16, k16 + i * row_stride, k32.data() + size_t(i) * head_dim, head_dim);
        to_f32(DType::F16, v16 + i * row_stride, v32.data() + size_t(i) * head_dim, head_dim);
      }
      k = k32.data();
      v = v32.data();
      stride = head_dim;
    } else {
      k = static_cast<const float*>(k_rows) + off;
      v = static_cast<const float*>(v_rows) + off;
    }
    const int64_t codes = (h * dst.capacity + first_token) * row_bytes;
    const int64_t kmeta = (h * key_groups + g) * head_dim;
    quantize_key_group(k, stride, G, head_dim, dst.key_upper + codes, dst.key_lower + codes,
                       dst.key_scale + kmeta, dst.key_min + kmeta);
    for (int i = 0; i < G; ++i) {
      const int64_t row_codes = codes + i * row_bytes;
      const int64_t vmeta = (h * dst.capacity + first_token + i) * value_groups;
      quantize_value_row(v + i * stride, head_dim, dst.value_group_size,
                         dst.value_upper + row_codes, dst.value_lower + row_codes,
                         dst.value_scale + vmeta, dst.value_min + vmeta);
    }
  };
  pool_.parallel_for(static_cast<int64_t>(num_kv_heads) * n_groups, [&](int64_t b, int64_t e) {
    std::vector<float> k32, v32;
    for (int64_t task = b; task < e; ++task) one(task, k32, v32);
  });
}

}  // namespace qs
