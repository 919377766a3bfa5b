#include "quant/weight_quant.h"

#include <algorithm>
#include <functional>
#include <string>

#include "core/thread_pool.h"
#include "quant/quant4.h"

namespace qs {

namespace {

std::string label(std::string_view name) {
  return name.empty() ? std::string("weight") : "weight '" + std::string(name) + "'";
}

void for_rows(int64_t n, ThreadPool* pool, const std::function<void(int64_t, int64_t)>& fn) {
  if (pool && n > 1) {
    pool->parallel_for(n, fn);
  } else {
    fn(0, n);
  }
}

}  // namespace

Result<QuantizedWeight4> quantize_weight4(const void* data, DType dtype, int64_t rows, int64_t cols,
                                          int group_size, std::string_view name, ThreadPool* pool) {
  if (dtype != DType::F32 && dtype != DType::F16 && dtype != DType::BF16) {
    return make_error(label(name) + ": cannot quantize dtype " + dtype_name(dtype) +
                      " to 4 bits (expected F32, F16 or BF16)");
  }
  if (rows <= 0 || cols <= 0) {
    return make_error(label(name) + ": cannot quantize an empty weight of shape [" +
                      std::to_string(rows) + ", " + std::to_string(cols) + "]");
  }
  if (group_size < 1) {
    return make_error(label(name) + ": 4-bit group size must be at least 1, got " +
                      std::to_string(group_size));
  }
  QS_CHECK(data != nullptr);

  QuantizedWeight4 w;
  w.rows = rows;
  w.cols = cols;
  w.group_size = group_size;
  w.groups_per_row = (cols + group_size - 1) / group_size;
  w.row_bytes = (cols + 1) / 2;
  w.codes.assign(static_cast<size_t>(rows * w.row_bytes), 0);
  w.scale.assign(static_cast<size_t>(rows * w.groups_per_row), 0);
  w.min.assign(static_cast<size_t>(rows * w.groups_per_row), 0);
  w.name = std::string(name);

  const size_t elem_bytes = dtype_size(dtype);
  for_rows(rows, pool, [&](int64_t row_begin, int64_t row_end) {
    std::vector<float> row_f32(static_cast<size_t>(cols));  // (cols) f32 scratch
    for (int64_t r = row_begin; r < row_end; ++r) {
      const auto* src =
          static_cast<const uint8_t*>(data) + static_cast<size_t>(r * cols) * elem_bytes;
      to_f32(dtype, src, row_f32.data(), static_cast<size_t>(cols));
      uint8_t* row_codes = w.codes.data() + r * w.row_bytes;
      for (int64_t g = 0; g < w.groups_per_row; ++g) {
        const int64_t c0 = g * group_size;
        const int64_t n = std::min<int64_t>(group_size, cols - c0);
        float lo, hi;
        group_range(row_f32.data() + c0, n, 1, &lo, &hi);
        Quant4Params p = choose_quant4_params(lo, hi);
        w.scale[r * w.groups_per_row + g] = p.scale;
        w.min[r * w.groups_per_row + g] = p.min;
        const float s = f16_to_f32(p.scale);
        const float mn = f16_to_f32(p.min);
        for (int64_t c = c0; c < c0 + n; ++c) {
          set_nibble(row_codes, c, quant4_encode(row_f32[c], s, mn));
        }
      }
    }
  });
  return w;
}

void dequantize_weight4_row(const QuantizedWeight4& w, int64_t row, float* out) {
  QS_CHECK(row >= 0 && row < w.rows);
  const uint8_t* row_codes = w.codes.data() + row * w.row_bytes;
  for (int64_t g = 0; g < w.groups_per_row; ++g) {
    const float s = f16_to_f32(w.scale[row * w.groups_per_row + g]);
    const float mn = f16_to_f32(w.min[row * w.groups_per_row + g]);
    const int64_t c_end = std::min<int64_t>((g + 1) * w.group_size, w.cols);
    for (int64_t c = g * w.group_size; c < c_end; ++c) {
      out[c] = quant4_decode(get_nibble(row_codes, c), s, mn);
    }
  }
}

void matmul_weight4(const float* x, int64_t m, const QuantizedWeight4& w, float* y,
                    ThreadPool* pool) {
  QS_CHECK(m >= 0 && x != nullptr && y != nullptr);
  const int64_t k = w.cols;
  const int64_t n_out = w.rows;
  for_rows(n_out, pool, [&](int64_t n_begin, int64_t n_end) {
    std::vector<float> w_row(static_cast<size_t>(k));  // (k) f32, one dequantized row of W
    for (int64_t n = n_begin; n < n_end; ++n) {
      dequantize_weight4_row(w, n, w_row.data());
      for (int64_t i = 0; i < m; ++i) {
        const float* xi = x + i * k;
        float acc = 0.0f;
        for (int64_t c = 0; c < k; ++c) acc += xi[c] * w_row[c];
        y[i * n_out + n] = acc;
      }
    }
  });
}

}  // namespace qs
