#include "quant/kv_quant.h"

#include "core/dtype.h"
#include "core/error.h"

namespace qs {

namespace {

uint8_t pack_pair(uint8_t even, uint8_t odd) {
  return static_cast<uint8_t>(even | (odd << 4));
}

}  // namespace

void quantize_key_group(const float* k, int64_t k_row_stride, int group_size, int head_dim,
                        uint8_t* upper, uint8_t* lower, uint16_t* scale, uint16_t* min) {
  QS_CHECK(group_size > 0 && head_dim > 0 && head_dim % 2 == 0 && k_row_stride >= head_dim);
  for (int d = 0; d < head_dim; ++d) {
    float lo, hi;
    group_range(k + d, group_size, k_row_stride, &lo, &hi);
    Quant4Params p = choose_quant4_params(lo, hi);
    scale[d] = p.scale;
    min[d] = p.min;
  }
  const int row_bytes = head_dim / 2;
  for (int t = 0; t < group_size; ++t) {
    const float* row = k + t * k_row_stride;
    for (int d = 0; d < head_dim; d += 2) {
      KvCodes c0 = kv_encode(row[d], f16_to_f32(scale[d]), f16_to_f32(min[d]));
      KvCodes c1 = kv_encode(row[d + 1], f16_to_f32(scale[d + 1]), f16_to_f32(min[d + 1]));
      upper[t * row_bytes + d / 2] = pack_pair(c0.upper, c1.upper);
      lower[t * row_bytes + d / 2] = pack_pair(c0.lower, c1.lower);
    }
  }
}

void dequantize_key_row_int4(const uint8_t* upper, const uint16_t* scale, const uint16_t* min,
                             int head_dim, float* out) {
  for (int d = 0; d < head_dim; ++d) {
    out[d] = kv_decode_int4(get_nibble(upper, d), f16_to_f32(scale[d]), f16_to_f32(min[d]));
  }
}

void dequantize_key_row_int8(const uint8_t* upper, const uint8_t* lower, const uint16_t* scale,
                             const uint16_t* min, int head_dim, float* out) {
  for (int d = 0; d < head_dim; ++d) {
    out[d] = kv_decode_int8(get_nibble(upper, d), get_nibble(lower, d), f16_to_f32(scale[d]),
                            f16_to_f32(min[d]));
  }
}

void quantize_value_row(const float* v, int head_dim, int value_group_size, uint8_t* upper,
                        uint8_t* lower, uint16_t* scale, uint16_t* min) {
  QS_CHECK(head_dim > 0 && head_dim % 2 == 0 && value_group_size > 0 &&
           head_dim % value_group_size == 0);
  const int n_groups = head_dim / value_group_size;
  for (int g = 0; g < n_groups; ++g) {
    float lo, hi;
    group_range(v + g * value_group_size, value_group_size, 1, &lo, &hi);
    Quant4Params p = choose_quant4_params(lo, hi);
    scale[g] = p.scale;
    min[g] = p.min;
  }
  for (int d = 0; d < head_dim; d += 2) {
    const int g0 = d / value_group_size;
    const int g1 = (d + 1) / value_group_size;
    KvCodes c0 = kv_encode(v[d], f16_to_f32(scale[g0]), f16_to_f32(min[g0]));
    KvCodes c1 = kv_encode(v[d + 1], f16_to_f32(scale[g1]), f16_to_f32(min[g1]));
    upper[d / 2] = pack_pair(c0.upper, c1.upper);
    lower[d / 2] = pack_pair(c0.lower, c1.lower);
  }
}

void dequantize_value_row_int4(const uint8_t* upper, const uint16_t* scale, const uint16_t* min,
                               int head_dim, int value_group_size, float* out) {
  for (int d = 0; d < head_dim; ++d) {
    const int g = d / value_group_size;
    out[d] = kv_decode_int4(get_nibble(upper, d), f16_to_f32(scale[g]), f16_to_f32(min[g]));
  }
}

void dequantize_value_row_int8(const uint8_t* upper, const uint8_t* lower, const uint16_t* scale,
                               const uint16_t* min, int head_dim, int value_group_size,
                               float* out) {
  for (int d = 0; d < head_dim; ++d) {
    const int g = d / value_group_size;
    out[d] = kv_decode_int8(get_nibble(upper, d), get_nibble(lower, d), f16_to_f32(scale[g]),
                            f16_to_f32(min[g]));
  }
}

}  // namespace qs
