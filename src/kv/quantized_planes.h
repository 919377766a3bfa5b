// Storage for the quantized history of one sequence (DESIGN.md §2-3, docs/kv-format.md): per
// layer, the upper and lower 4-bit code planes of keys and values and their fp16 scale/min, for a
// capacity of C tokens. This class only stores, quantizes and dequantizes; the lengths (n, n_q),
// the full-precision buffer, flushing and rollback belong to the cache state that drives it.
//
// Layout (head-major so that one kv head's history is one contiguous stream per plane):
//   key_upper, key_lower, value_upper, value_lower   u8   [n_layers, n_kv_heads, C, head_dim/2]
//   key_scale, key_min                               fp16 [n_layers, n_kv_heads, C/G, head_dim]
//   value_scale, value_min                           fp16 [n_layers, n_kv_heads, C, head_dim/Gv]
// Codes of channels 2i and 2i+1 of a token share byte i of its row, 2i in the low nibble.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "quant/kv_quant.h"

namespace qs {

struct KvPlanesShape {
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;          // even
  int group_size = 128;      // G: tokens per key group, also the flush granularity
  int value_group_size = 0;  // Gv: channels per value group, divides head_dim; 0 means head_dim
  int64_t capacity = 0;      // C: tokens, a multiple of G

  // User-facing checks (the sizes come from the model and the command line).
  Status validate() const;

  int kv_dim() const { return n_kv_heads * head_dim; }
  int value_group_channels() const { return value_group_size > 0 ? value_group_size : head_dim; }
  int value_groups() const { return head_dim / value_group_channels(); }  // per token and head
  int64_t key_groups() const { return capacity / group_size; }            // per layer and head
  int64_t code_row_bytes() const { return head_dim / 2; }                 // per token, head, plane

  // Index formulas shared by every backend. Bytes into any of the four code planes:
  int64_t code_offset(int layer, int kv_head, int64_t token) const {
    return ((static_cast<int64_t>(layer) * n_kv_heads + kv_head) * capacity + token) *
           code_row_bytes();
  }
  // fp16 elements into key_scale / key_min; channel d is at + d.
  int64_t key_meta_offset(int layer, int kv_head, int64_t key_group) const {
    return ((static_cast<int64_t>(layer) * n_kv_heads + kv_head) * key_groups() + key_group) *
           head_dim;
  }
  // fp16 elements into value_scale / value_min; value group g (channels [g*Gv, (g+1)*Gv)) at + g.
  int64_t value_meta_offset(int layer, int kv_head, int64_t token) const {
    return ((static_cast<int64_t>(layer) * n_kv_heads + kv_head) * capacity + token) *
           value_groups();
  }

  int64_t code_plane_bytes() const { return n_layers * code_offset(0, n_kv_heads, 0); }
  int64_t key_meta_elems() const { return n_layers * key_meta_offset(0, n_kv_heads, 0); }
  int64_t value_meta_elems() const { return n_layers * value_meta_offset(0, n_kv_heads, 0); }
  // Everything resident: 4 code planes + 4 metadata arrays.
  int64_t total_bytes() const {
    return 4 * code_plane_bytes() + 2 * 2 * key_meta_elems() + 2 * 2 * value_meta_elems();
  }
};

// Bytes one decode step reads per cached token per layer (all kv heads), key metadata amortized
// over its group of G tokens. The draft (INT4) view reads the upper planes and all metadata; the
// target (INT8) view reads both planes and the same metadata.
double kv_read_bytes_per_token(const KvPlanesShape& shape, KvQuantView view);
// The same for an fp16 cache (K and V, no metadata).
double fp16_kv_bytes_per_token(int n_kv_heads, int head_dim);

// Bytes a sequence of reads touched, by array. Reads only add to it; one per thread if threaded.
struct KvReadStats {
  int64_t upper_bytes = 0;       // key_upper + value_upper
  int64_t lower_bytes = 0;       // key_lower + value_lower (0 for the draft view)
  int64_t key_meta_bytes = 0;    // key_scale + key_min, once per key group a read touches
  int64_t value_meta_bytes = 0;  // value_scale + value_min
  int64_t total() const { return upper_bytes + lower_bytes + key_meta_bytes + value_meta_bytes; }
};

enum class KvCodePlane : uint8_t { kKeyUpper, kKeyLower, kValueUpper, kValueLower };
enum class KvMetaArray : uint8_t { kKeyScale, kKeyMin, kValueScale, kValueMin };

class QuantizedPlanes {
 public:
  // Validates the shape and allocates zeroed storage (an all-zero group dequantizes to 0) in
  // `backend`'s memory, or in host memory when backend is null. Errors: an invalid shape, or
  // storage that cannot be allocated.
  static Result<QuantizedPlanes> create(const KvPlanesShape& shape, Backend* backend = nullptr);

  QuantizedPlanes(QuantizedPlanes&&) = default;
  QuantizedPlanes& operator=(QuantizedPlanes&&) = default;
  QuantizedPlanes(const QuantizedPlanes&) = delete;
  QuantizedPlanes& operator=(const QuantizedPlanes&) = delete;

  const KvPlanesShape& shape() const { return shape_; }

  // One layer's arrays as the backend's attention reads them (the int8 view has the lower
  // planes; the int4 view leaves them null) and as its quantize_kv writes them.
  QuantizedKvSegment segment(int layer, KvQuantView view) const;
  QuantizedKvPlanesOut output(int layer);

  // Host memory only (tests, the reference): the flush of DESIGN §3: quantize G committed full-precision rows of `layer` into key group
  // `key_group` (absolute positions [key_group*G, (key_group+1)*G)) of all four planes.
  // k_rows, v_rows: [G, row_stride] f32, row i = position key_group*G + i, keys post-RoPE, kv head
  // h at columns [h*head_dim, (h+1)*head_dim); row_stride >= kv_dim (0 means kv_dim).
  // Overwrites whatever the group held. Calls for different layers may run concurrently.
  void append_group(int layer, const float* k_rows, const float* v_rows, int64_t key_group,
                    int64_t row_stride = 0);

  // Host memory only: dequantize tokens [token_begin, token_begin + n) of one kv head: out [n, head_dim] f32.
  // kDraftInt4 reads no byte of the lower planes. `stats`, when given, accumulates bytes read.
  void read_keys(int layer, int kv_head, int64_t token_begin, int64_t n, KvQuantView view,
                 float* out, KvReadStats* stats = nullptr) const;
  void read_values(int layer, int kv_head, int64_t token_begin, int64_t n, KvQuantView view,
                   float* out, KvReadStats* stats = nullptr) const;

  // Raw arrays over all layers, indexed with the shape's offset functions (for a backend's
  // upload and for tests).
  std::span<const uint8_t> code_plane(KvCodePlane plane) const;
  std::span<uint8_t> code_plane(KvCodePlane plane);
  std::span<const uint16_t> meta(KvMetaArray array) const;
  std::span<uint16_t> meta(KvMetaArray array);

 private:
  explicit QuantizedPlanes(const KvPlanesShape& shape) : shape_(shape) {}
  void check_read(int layer, int kv_head, int64_t token_begin, int64_t n, const float* out) const;
  // Pointers to one layer's eight arrays (segment() and output() take their views from here).
  QuantizedKvPlanesOut layer_arrays(int layer) const;

  KvPlanesShape shape_;
  // The eight arrays (the layout above), each in its own buffer: the code planes in the order of
  // KvCodePlane, then the metadata in the order of KvMetaArray.
  std::unique_ptr<Buffer> storage_[8];
  std::span<uint8_t> codes_[4];
  std::span<uint16_t> meta_[4];
};

}  // namespace qs
