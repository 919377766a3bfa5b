// The KV cache of one sequence in every mode (DESIGN.md §2-§3, docs/quantspec.md): one object,
// three views.
//
//   fp        never quantizes: the full-precision buffer holds every position (AR "fp16 KV").
//   int8/int4 AR over the target (INT8) or draft (INT4) view of the quantized history.
//   quantspec the draft reads the INT4 view, the target the INT8 view of the same planes.
//
// State: n = committed positions (target-verified K/V). In the quantized modes the planes hold
// the complete committed groups [0, n_planes), n_planes = G*floor(n/G), each quantized once, as
// soon as its G rows are committed (the flush); only a prompt cache's truncate() below them makes
// groups uncommitted, to be quantized again from the rows written next. The full-precision
// buffer holds rows [fp_base, fp_end): fp_base = b(n) (backend.h quant_boundary) after a commit,
// or lower while keep_rows_from keeps rows, and the rows past n are the speculative ones (draft
// K/V, then the target's overwrite). Rows [fp_base, n_planes) exist in both forms. Rejection is
// only a length change: the planes are never touched by it.
//
// The full-precision rows (the whole fp cache, the quantized modes' buffer) are f32 or f16
// (KvCacheConfig::row_dtype): new rows are stored through Backend::store_kv_row_pair (f16: rounded
// to nearest even, saturating at +-65504) and every reader converts them back to f32.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "backend/backend.h"
#include "core/error.h"
#include "kv/quantized_planes.h"

namespace qs {

enum class KvMode : uint8_t { kFp, kInt8, kInt4, kQuantSpec };
const char* kv_mode_name(KvMode mode);

struct KvCacheConfig {
  KvMode mode = KvMode::kFp;
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int group_size = 128;      // G (quantized modes)
  int value_group_size = 0;  // Gv; 0: head_dim
  int max_gamma = 0;         // speculative rows past n the buffer must take (quantspec: gamma)
  int capacity = 0;          // positions
  // Element type of the full-precision rows: F32 (the exact reference) or F16 (half the bytes).
  DType row_dtype = DType::F32;

  // User-facing checks: G in {power of two, 8..256}, Gv dividing head_dim and >= 32 (or equal to
  // head_dim), max_gamma < G, row_dtype F32 or F16.
  Status validate() const;
};

// Memory: the buffer and the planes live in the backend's memory (device memory for a GPU
// backend) and are written only through the backend (store_kv_row_pair, copy_bytes, quantize_kv),
// so one cache serves every backend.
class KvCache {
 public:
  KvCache() = default;
  // `backend` must outlive the cache. Errors: an invalid config, or memory that cannot be had.
  static Result<KvCache> create(const KvCacheConfig& config, Backend& backend);
  KvCache(KvCache&&) = default;
  KvCache& operator=(KvCache&&) = default;

  const KvCacheConfig& config() const { return cfg_; }
  KvMode mode() const { return cfg_.mode; }
  bool quantized() const { return cfg_.mode != KvMode::kFp; }
  int capacity() const { return cfg_.capacity; }
  int kv_dim() const { return cfg_.num_kv_heads * cfg_.head_dim; }
  int group_size() const { return cfg_.group_size; }
  DType row_dtype() const { return cfg_.row_dtype; }
  int length() const { return n_; }            // committed positions
  int written_end() const { return fp_end_; }  // rows [fp_base, fp_end) hold K/V
  int fp_base() const { return fp_base_; }
  int planes_length() const { return n_planes_; }  // complete groups quantized in every layer
  int flushes() const { return flushes_; }         // groups quantized so far (per layer)
  // Memory held now: the planes (allocated for the whole capacity) plus the buffer.
  size_t bytes() const;
  const QuantizedPlanes* planes() const { return planes_ ? &*planes_ : nullptr; }

  // Makes rows [pos, pos + m) writable (grows the buffer: geometrically, straight to the capacity
  // beyond half of it). pos must lie in [n, written_end] (a bug otherwise). Errors: "context is
  // full ..." when pos + m exceeds the capacity; the backend has no memory for the larger buffer.
  // A caller that knows how many rows are coming (a prompt) asks for them at once: one allocation
  // instead of a chain of growths.
  Status prepare_write(int pos, int m);
  // Keeps the buffer at >= chunk + the steady rows until released (hold_rows(0)): a prefill that
  // commits every chunk (EngineOptions::prefill_kv = kQuantized) then needs no more (but kept
  // rows, keep_rows_from), and commit() does not give the rows back between chunks.
  // hold_rows(0) lets the next commit shrink it.
  Status hold_rows(int chunk);
  // Stores m rows of K and V ([m, kv_dim] f32 each, backend memory) as row_dtype at positions
  // [pos, pos + m) of `layer`'s buffer (every layer gets the same rows), after
  // prepare_write(pos, m). Rows past pos + m are dropped: written_end() becomes pos + m.
  void write(int layer, int pos, int m, const float* k, const float* v);
  // write() of keys before RoPE: rotates rope.q and k in place for positions [pos, pos + m), then
  // stores the rows (Backend::rope_qk_store_kv: one launch where the backend fuses them).
  void write_with_rope(int layer, int pos, int m, float* k, const float* v, const RopeQK& rope);
  // Where write() / write_with_rope() would store `layer`'s rows [pos, pos + m), with their checks
  // and counters (written_end() becomes pos + m), for a caller whose backend stores the rows
  // itself (Backend::output_and_mlp's next_rows).
  struct RowPair {
    void* k;
    void* v;
  };
  RowPair write_targets(int layer, int pos, int m) { return begin_write(layer, pos, m); }

  // Quantize `layer`'s groups below `end` (a multiple of G) that are not quantized yet, from the
  // buffer. Used by commit() and by a forward over committed-by-construction rows (evaluation).
  void quantize_below(int layer, int end);

  // Makes [0, n) committed (n_old <= n <= written_end), quantizes newly complete groups, drops
  // buffer rows below b(n) (below the kept position while keep_rows_from keeps rows) and gives
  // back a buffer a prefill grew.
  void commit(int n);
  // Whether the cache can cut back to the prefix [0, n) of the committed positions on its own
  // (truncate(n)): every n <= length() in the fp mode; in the quantized modes where the buffer
  // still holds the rows [b(n), n) that attention at n reads in full precision, b(n) >=
  // fp_base(): n >= planes_length(), and further down over rows keep_rows_from kept.
  bool can_truncate(int n) const;
  // Drops the committed positions [n, length()) (a prompt cache: the next prompt shares only
  // [0, n) with the sequence in the cache); can_truncate(n) must hold (a bug otherwise). A length
  // change: the planes' bytes are untouched; the groups at or above G*floor(n/G) are no longer
  // committed and are quantized again, from the rows then written, when they complete.
  void truncate(int n);
  // Empty cache (planes keep their memory; nothing of them is read until rewritten). Ends
  // keep_rows_from.
  void clear();
  // The prompt cache's kept rows (quantized modes; a no-op in the fp mode, which keeps every
  // row): from now on commits and a layer-major prefill drop no buffer row at or above `from`
  // while at most `max_rows` rows lie below the quantization boundary b(length()). Then
  // can_truncate(n) holds down to b(n) >= max(from, fp_base()), below the quantized groups.
  // Past max_rows, and when the buffer cannot grow for a write, the kept rows are dropped as
  // without this call (the cache never fails for them) and stay dropped until the next call.
  // Attention reads the same rows either way (query t: [b(t), t] in full precision).
  void keep_rows_from(int from, int max_rows);

  // Layer-major prefill of an empty quantized cache: the prompt's full-precision attention with
  // one layer's rows at a time instead of every layer's (Llama-2-7B at 128K: 2 instead of 64 GiB
  // of f16 rows next to the planes). begin_layer_prefill(n) gives layer 0 a scratch of n rows;
  // write() and view(layer) then act on the scratch of the layer in progress (rows [0, written),
  // full precision; the other layers are not touched). end_layer_prefill(layer), once its n rows
  // are written, quantizes its complete groups from the scratch, keeps its rows [b(n), n) (from
  // the kept position on, keep_rows_from) in the buffer and hands the scratch to the next layer.
  // After the last layer the cache holds exactly what commit(n) leaves after a chunk-major prefill
  // of the same rows (planes, rows, counters) and the scratch is freed; clear() abandons a
  // layer-major prefill.
  Status begin_layer_prefill(int n);
  void end_layer_prefill(int layer);
  bool in_layer_prefill() const { return lp_rows_ > 0; }

  // What attention reads for `layer`: buffer rows and, in the quantized modes with `view` set,
  // the quantized segment for that view. `segment` is the caller's storage for it.
  KvView view(int layer, std::optional<KvQuantView> quant_view, QuantizedKvSegment* segment) const;

 private:
  // Buffer capacity in rows, preserving [fp_base, fp_end). Error when the memory cannot be had.
  Status reserve_rows(int rows);
  // Buffer of exactly `rows` rows (>= the rows held), preserving [fp_base, fp_end); on an
  // allocation failure the error is returned and the buffer is unchanged, unless it held no rows
  // (then it was released before the allocation, and is empty).
  Status resize_rows(int rows);
  int steady_rows() const;  // buffer rows of steady decoding
  // quantize_below(l, end) for every layer: one Backend::quantize_kv_layers call when the layers
  // are quantized up to the same position (a commit's flush), else one call per layer.
  void quantize_layers_below(int end);
  // Moves rows [from, fp_end) of every layer to the start of the buffer.
  void shift_rows(int from);
  // Where the buffer starts once n positions are committed: b(n), or the kept position while
  // keep_rows_from's limit holds at n (ends keep_rows_from past it).
  int buffer_start(int n);
  // Ends keep_rows_from and drops the kept rows below b(n).
  void drop_kept_rows();
  // Element size of the rows, and where row `pos` of `layer` starts.
  size_t elem_bytes() const { return dtype_size(cfg_.row_dtype); }
  void* k_row(int layer, int pos) const;
  void* v_row(int layer, int pos) const;
  // The checks and counters of write(layer, pos, m, ...) and where its rows go.
  RowPair begin_write(int layer, int pos, int m);

  KvCacheConfig cfg_;
  Backend* backend_ = nullptr;
  std::optional<QuantizedPlanes> planes_;
  int n_ = 0;
  int n_planes_ = 0;
  int fp_base_ = 0;
  int fp_end_ = 0;
  int flushes_ = 0;
  std::unique_ptr<int[]> layer_quantized_;  // [num_layers] positions quantized per layer
  int buffer_rows_ = 0;                     // allocated rows per layer
  int held_rows_ = 0;                       // commit() keeps at least this many (hold_rows)
  int keep_from_ = -1;                      // keep_rows_from (-1: none)
  int keep_max_ = 0;
  // [num_layers, buffer_rows, kv_dim] of row_dtype (Buffer sizes count floats: rounded up).
  std::unique_ptr<Buffer> k_buf_;  // post-RoPE
  std::unique_ptr<Buffer> v_buf_;
  // Layer-major prefill (begin_layer_prefill): [lp_rows_, kv_dim] of row_dtype for the layer in
  // progress, rows [0, lp_end_) written.
  int lp_rows_ = 0;
  int lp_layer_ = 0;
  int lp_end_ = 0;
  int lp_base_ = 0;  // the buffer's first row after the prefill (buffer_start(lp_rows_))
  std::unique_ptr<Buffer> lp_k_;
  std::unique_ptr<Buffer> lp_v_;
  void* lp_row(const std::unique_ptr<Buffer>& b, int pos) const;
};

}  // namespace qs
