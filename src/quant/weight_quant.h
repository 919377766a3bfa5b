// 4-bit group-wise weights for the draft path (DESIGN.md §1): asymmetric, groups of 128 along
// in_features within each output row, fp16 scale and min per group, two codes per byte.
//
// Per group: scale/min from quant/quant4.h (min rounded down, scale rounded up, so the group never
// clamps), code U = round(clamp((w - min)/scale, 0, 15)), w4 = U*scale + min, hence
// |w - w4| <= scale/2 (+ f32 rounding). When in_features is not a multiple of the group size the
// last group of each row is shorter (in_features % group_size columns); nothing is padded except
// the high nibble of a row's last byte when in_features is odd.
//
// This is the reference (CPU) layout; a GPU backend may repack it at load time.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace qs {

class ThreadPool;

inline constexpr int kWeightQuantGroup = 128;

struct QuantizedWeight4 {
  int64_t rows = 0;                    // out_features
  int64_t cols = 0;                    // in_features
  int group_size = kWeightQuantGroup;  // columns per group (the last one may be shorter)
  int64_t groups_per_row = 0;          // ceil(cols / group_size)
  int64_t row_bytes = 0;               // ceil(cols / 2)
  std::vector<uint8_t> codes;          // [rows, row_bytes] packed; column c in nibble c of its row
  std::vector<uint16_t> scale;         // [rows, groups_per_row] fp16
  std::vector<uint16_t> min;           // [rows, groups_per_row] fp16
  std::string name;                    // for messages

  // Bytes a full read of the weight moves: codes plus metadata.
  int64_t bytes() const {
    return static_cast<int64_t>(codes.size() + 2 * scale.size() + 2 * min.size());
  }
};

// Quantize a row-major [rows, cols] weight in F32, F16 or BF16 (y = x W^T convention: a row is
// one output feature). `name` only labels error messages. Errors: unsupported dtype, empty shape,
// group_size < 1. `pool` (optional) spreads rows over threads; the result does not depend on it.
Result<QuantizedWeight4> quantize_weight4(const void* data, DType dtype, int64_t rows, int64_t cols,
                                          int group_size = kWeightQuantGroup,
                                          std::string_view name = {}, ThreadPool* pool = nullptr);

// out: [w.cols] f32, the dequantized row `row`.
void dequantize_weight4_row(const QuantizedWeight4& w, int64_t row, float* out);

// Reference matmul y[i, n] = sum_c x[i, c] * dequant(W)[n, c], accumulated in f32.
// x: [m, w.cols]; y: [m, w.rows], must not alias x.
void matmul_weight4(const float* x, int64_t m, const QuantizedWeight4& w, float* y,
                    ThreadPool* pool = nullptr);

}  // namespace qs
