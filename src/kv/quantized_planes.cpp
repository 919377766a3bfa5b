#include "kv/quantized_planes.h"

#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <utility>

namespace qs {

namespace {

constexpr int kMinGroupSize = 8;
constexpr int kMaxGroupSize = 256;
constexpr int64_t kFp16Bytes = 2;

bool is_power_of_two(int64_t x) {
  return x > 0 && (x & (x - 1)) == 0;
}

std::string str(int64_t x) {
  return std::to_string(x);
}

std::string gib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f", static_cast<double>(bytes) / (1 << 30));
  return buf;
}

}  // namespace

Status KvPlanesShape::validate() const {
  if (n_layers <= 0) {
    return make_error("KV planes: n_layers must be positive, got " + str(n_layers));
  }
  if (n_kv_heads <= 0) {
    return make_error("KV planes: n_kv_heads must be positive, got " + str(n_kv_heads));
  }
  if (head_dim <= 0 || head_dim % 2 != 0) {
    return make_error("KV planes: head_dim must be a positive even number, got " + str(head_dim));
  }
  if (!is_power_of_two(group_size) || group_size < kMinGroupSize || group_size > kMaxGroupSize) {
    return make_error("KV planes: the key group size G must be a power of two in [" +
                      str(kMinGroupSize) + ", " + str(kMaxGroupSize) + "], got " + str(group_size));
  }
  if (value_group_size < 0 || (value_group_size > 0 && head_dim % value_group_size != 0)) {
    return make_error("KV planes: the value group size Gv must divide head_dim " + str(head_dim) +
                      " (or be 0 for head_dim), got " + str(value_group_size));
  }
  if (capacity < 0 || capacity % group_size != 0) {
    return make_error("KV planes: the quantized capacity must be a multiple of G = " +
                      str(group_size) + " tokens, got " + str(capacity));
  }
  // Keeps every offset and size far from int64 overflow; allocation failures are reported by
  // QuantizedPlanes::create.
  const double total = 2.0 * n_layers * n_kv_heads * static_cast<double>(capacity) * head_dim;
  if (total > 0x1p50) {
    return make_error("KV planes: " + str(capacity) + " quantized tokens x " + str(n_layers) +
                      " layers x " + str(static_cast<int64_t>(n_kv_heads) * head_dim) +
                      " channels is too large");
  }
  return Status();
}

double kv_read_bytes_per_token(const KvPlanesShape& shape, KvQuantView view) {
  QS_CHECK(shape.group_size > 0);
  const double kv_dim = shape.kv_dim();
  const double planes = view == KvQuantView::kDraftInt4 ? 1.0 : 2.0;
  const double codes = planes * 2.0 * kv_dim / 2.0;  // K and V, half a byte per code per plane
  const double key_meta = 2.0 * kFp16Bytes * kv_dim / shape.group_size;
  const double value_meta = 2.0 * kFp16Bytes * shape.n_kv_heads * shape.value_groups();
  return codes + key_meta + value_meta;
}

double fp16_kv_bytes_per_token(int n_kv_heads, int head_dim) {
  return 2.0 * kFp16Bytes * n_kv_heads * head_dim;
}

Result<QuantizedPlanes> QuantizedPlanes::create(const KvPlanesShape& shape, Backend* backend) {
  QS_TRY(shape.validate());
  KvPlanesShape resolved = shape;
  resolved.value_group_size = shape.value_group_channels();
  QuantizedPlanes p(resolved);
  if (const int64_t avail = backend ? backend->memory_available() : -1;
      avail >= 0 && resolved.total_bytes() > avail) {
    return make_error("KV planes: " + str(resolved.capacity) + " quantized tokens need " +
                      gib(resolved.total_bytes()) + " GiB but " + gib(avail) + " GiB of " +
                      backend->name() + " memory is available: use a smaller context (--ctx)");
  }
  const auto code_bytes = static_cast<size_t>(resolved.code_plane_bytes());
  const size_t meta_bytes[2] = {static_cast<size_t>(resolved.key_meta_elems()) * kFp16Bytes,
                                static_cast<size_t>(resolved.value_meta_elems()) * kFp16Bytes};
  for (int i = 0; i < 8; ++i) {
    const size_t bytes = i < 4 ? code_bytes : meta_bytes[(i - 4) / 2];
    const size_t floats = (bytes + sizeof(float) - 1) / sizeof(float);
    std::unique_ptr<Buffer> buf;
    if (backend) {
      buf = backend->try_alloc(floats);
    } else {
      try {
        buf = std::make_unique<HostBuffer>(floats);
      } catch (const std::bad_alloc&) {
      }
    }
    if (!buf) {
      return make_error("KV planes: cannot allocate " +
                        std::to_string(static_cast<double>(resolved.total_bytes()) / (1 << 30)) +
                        " GiB for " + str(resolved.capacity) + " quantized tokens" +
                        (backend ? std::string(" on ") + backend->name() : std::string()));
    }
    if (backend) {
      backend->fill_zero(buf->data(), bytes);
    } else {
      std::memset(buf->data(), 0, bytes);
    }
    if (i < 4) {
      p.codes_[i] = {reinterpret_cast<uint8_t*>(buf->data()), bytes};
    } else {
      p.meta_[i - 4] = {reinterpret_cast<uint16_t*>(buf->data()), bytes / kFp16Bytes};
    }
    p.storage_[i] = std::move(buf);
  }
  return p;
}

QuantizedKvSegment QuantizedPlanes::segment(int layer, KvQuantView view) const {
  const QuantizedKvPlanesOut p = layer_arrays(layer);
  const bool int8 = view == KvQuantView::kTargetInt8;
  QuantizedKvSegment seg;
  seg.key_upper = p.key_upper;
  seg.key_lower = int8 ? p.key_lower : nullptr;  // the draft view never reads a lower byte
  seg.value_upper = p.value_upper;
  seg.value_lower = int8 ? p.value_lower : nullptr;
  seg.key_scale = p.key_scale;
  seg.key_min = p.key_min;
  seg.value_scale = p.value_scale;
  seg.value_min = p.value_min;
  seg.capacity = p.capacity;
  seg.group_size = p.group_size;
  seg.value_group_size = p.value_group_size;
  seg.int8 = int8;
  return seg;
}

QuantizedKvPlanesOut QuantizedPlanes::output(int layer) {
  return layer_arrays(layer);
}

QuantizedKvPlanesOut QuantizedPlanes::layer_arrays(int layer) const {
  QS_CHECK(layer >= 0 && layer < shape_.n_layers);
  const int64_t codes = shape_.code_offset(layer, 0, 0);
  const int64_t kmeta = shape_.key_meta_offset(layer, 0, 0);
  const int64_t vmeta = shape_.value_meta_offset(layer, 0, 0);
  QuantizedKvPlanesOut out;
  out.key_upper = codes_[0].data() + codes;
  out.key_lower = codes_[1].data() + codes;
  out.value_upper = codes_[2].data() + codes;
  out.value_lower = codes_[3].data() + codes;
  out.key_scale = meta_[0].data() + kmeta;
  out.key_min = meta_[1].data() + kmeta;
  out.value_scale = meta_[2].data() + vmeta;
  out.value_min = meta_[3].data() + vmeta;
  out.capacity = shape_.capacity;
  out.group_size = shape_.group_size;
  out.value_group_size = shape_.value_group_size;
  return out;
}

void QuantizedPlanes::append_group(int layer, const float* k_rows, const float* v_rows,
                                   int64_t key_group, int64_t row_stride) {
  const KvPlanesShape& s = shape_;
  if (row_stride == 0) row_stride = s.kv_dim();
  QS_CHECK(layer >= 0 && layer < s.n_layers);
  QS_CHECK(key_group >= 0 && key_group < s.key_groups());
  QS_CHECK(k_rows != nullptr && v_rows != nullptr && row_stride >= s.kv_dim());
  const int64_t first_token = key_group * s.group_size;
  for (int h = 0; h < s.n_kv_heads; ++h) {
    const int64_t codes = s.code_offset(layer, h, first_token);
    const int64_t kmeta = s.key_meta_offset(layer, h, key_group);
    quantize_key_group(k_rows + h * s.head_dim, row_stride, s.group_size, s.head_dim,
                       codes_[0].data() + codes, codes_[1].data() + codes,
                       meta_[0].data() + kmeta, meta_[1].data() + kmeta);
    for (int i = 0; i < s.group_size; ++i) {
      const int64_t row_codes = s.code_offset(layer, h, first_token + i);
      const int64_t vmeta = s.value_meta_offset(layer, h, first_token + i);
      quantize_value_row(v_rows + i * row_stride + h * s.head_dim, s.head_dim, s.value_group_size,
                         codes_[2].data() + row_codes, codes_[3].data() + row_codes,
                         meta_[2].data() + vmeta, meta_[3].data() + vmeta);
    }
  }
}

void QuantizedPlanes::check_read(int layer, int kv_head, int64_t token_begin, int64_t n,
                                 const float* out) const {
  QS_CHECK(layer >= 0 && layer < shape_.n_layers);
  QS_CHECK(kv_head >= 0 && kv_head < shape_.n_kv_heads);
  QS_CHECK(token_begin >= 0 && n >= 0 && token_begin + n <= shape_.capacity);
  QS_CHECK(out != nullptr || n == 0);
}

void QuantizedPlanes::read_keys(int layer, int kv_head, int64_t token_begin, int64_t n,
                                KvQuantView view, float* out, KvReadStats* stats) const {
  check_read(layer, kv_head, token_begin, n, out);
  const KvPlanesShape& s = shape_;
  const bool int8 = view == KvQuantView::kTargetInt8;
  int64_t groups_touched = 0;
  int64_t last_group = -1;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = token_begin + i;
    const int64_t group = t / s.group_size;
    if (group != last_group) {
      ++groups_touched;
      last_group = group;
    }
    const int64_t codes = s.code_offset(layer, kv_head, t);
    const int64_t kmeta = s.key_meta_offset(layer, kv_head, group);
    float* row = out + i * s.head_dim;
    if (int8) {
      dequantize_key_row_int8(codes_[0].data() + codes, codes_[1].data() + codes,
                              meta_[0].data() + kmeta, meta_[1].data() + kmeta, s.head_dim, row);
    } else {
      dequantize_key_row_int4(codes_[0].data() + codes, meta_[0].data() + kmeta,
                              meta_[1].data() + kmeta, s.head_dim, row);
    }
  }
  if (stats) {
    stats->upper_bytes += n * s.code_row_bytes();
    if (int8) stats->lower_bytes += n * s.code_row_bytes();
    stats->key_meta_bytes += groups_touched * 2 * kFp16Bytes * s.head_dim;
  }
}

void QuantizedPlanes::read_values(int layer, int kv_head, int64_t token_begin, int64_t n,
                                  KvQuantView view, float* out, KvReadStats* stats) const {
  check_read(layer, kv_head, token_begin, n, out);
  const KvPlanesShape& s = shape_;
  const bool int8 = view == KvQuantView::kTargetInt8;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = token_begin + i;
    const int64_t codes = s.code_offset(layer, kv_head, t);
    const int64_t vmeta = s.value_meta_offset(layer, kv_head, t);
    float* row = out + i * s.head_dim;
    if (int8) {
      dequantize_value_row_int8(codes_[2].data() + codes, codes_[3].data() + codes,
                                meta_[2].data() + vmeta, meta_[3].data() + vmeta, s.head_dim,
                                s.value_group_size, row);
    } else {
      dequantize_value_row_int4(codes_[2].data() + codes, meta_[2].data() + vmeta,
                                meta_[3].data() + vmeta, s.head_dim, s.value_group_size, row);
    }
  }
  if (stats) {
    stats->upper_bytes += n * s.code_row_bytes();
    if (int8) stats->lower_bytes += n * s.code_row_bytes();
    stats->value_meta_bytes += n * 2 * kFp16Bytes * s.value_groups();
  }
}

std::span<const uint8_t> QuantizedPlanes::code_plane(KvCodePlane plane) const {
  return codes_[static_cast<int>(plane)];
}

std::span<uint8_t> QuantizedPlanes::code_plane(KvCodePlane plane) {
  return codes_[static_cast<int>(plane)];
}

std::span<const uint16_t> QuantizedPlanes::meta(KvMetaArray array) const {
  return meta_[static_cast<int>(array)];
}

std::span<uint16_t> QuantizedPlanes::meta(KvMetaArray array) {
  return meta_[static_cast<int>(array)];
}

}  // namespace qs
