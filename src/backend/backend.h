// The op-level interface the forward pass is written against. The CPU backend (backend/cpu/) is
// the executable specification: every other backend's ops are tested against it.
//
// Conventions: activations are f32, row-major, one row per token; `m` is the number of rows
// (tokens) of a call. Float pointers point into memory the backend can read/write (host memory
// for the CPU; a device backend hands out its own through alloc()). Weights are WeightViews in
// their file dtype (F32/F16/BF16); ops convert as they read and accumulate in f32.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "core/argmax.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/sampling.h"
#include "model/weights.h"
#include "quant/weight_quant.h"

namespace qs {

// The quantized history of one layer in the hierarchical format (DESIGN.md §2, docs/kv-format.md):
// backend memory laid out as kv/quantized_planes.h describes, pointers already offset to this
// layer.
struct QuantizedKvSegment {
  const uint8_t* key_upper = nullptr;     // [n_kv_heads, capacity, head_dim/2] U codes
  const uint8_t* key_lower = nullptr;     // [n_kv_heads, capacity, head_dim/2] L+8 codes
  const uint8_t* value_upper = nullptr;   // [n_kv_heads, capacity, head_dim/2] U codes
  const uint8_t* value_lower = nullptr;   // [n_kv_heads, capacity, head_dim/2] L+8 codes
  const uint16_t* key_scale = nullptr;    // [n_kv_heads, capacity/G, head_dim] fp16
  const uint16_t* key_min = nullptr;      // [n_kv_heads, capacity/G, head_dim] fp16
  const uint16_t* value_scale = nullptr;  // [n_kv_heads, capacity, head_dim/Gv] fp16
  const uint16_t* value_min = nullptr;    // [n_kv_heads, capacity, head_dim/Gv] fp16
  int64_t capacity = 0;                   // tokens per kv head in the arrays (multiple of G)
  int group_size = 0;                     // G: key group and flush granularity
  int value_group_size = 0;               // Gv: channels per value group
  bool int8 = true;  // target view (both planes); false: draft view, never reads a lower byte
};

// The writable twin of QuantizedKvSegment: where the flush stores one layer's groups (same
// layout, pointers offset to the layer).
struct QuantizedKvPlanesOut {
  uint8_t* key_upper = nullptr;     // [n_kv_heads, capacity, head_dim/2]
  uint8_t* key_lower = nullptr;     // [n_kv_heads, capacity, head_dim/2]
  uint8_t* value_upper = nullptr;   // [n_kv_heads, capacity, head_dim/2]
  uint8_t* value_lower = nullptr;   // [n_kv_heads, capacity, head_dim/2]
  uint16_t* key_scale = nullptr;    // [n_kv_heads, capacity/G, head_dim] fp16
  uint16_t* key_min = nullptr;      // [n_kv_heads, capacity/G, head_dim] fp16
  uint16_t* value_scale = nullptr;  // [n_kv_heads, capacity, head_dim/Gv] fp16
  uint16_t* value_min = nullptr;    // [n_kv_heads, capacity, head_dim/Gv] fp16
  int64_t capacity = 0;
  int group_size = 0;
  int value_group_size = 0;  // resolved (never 0)
};

// The per-query quantization boundary: a query at absolute position t reads [0, b(t)) from the
// quantized segment and [b(t), t] in full precision, b(t) = G*(floor(t/G) - 1) for t >= 2G, else
// 0. This is DESIGN §3's n_q of a cache holding t tokens.
inline int quant_boundary(int t, int group_size) {
  return t >= 2 * group_size ? group_size * (t / group_size - 1) : 0;
}

// Bytes of K/V an attention call read for its last query (the longest; every query of a call
// shares the history, so this is what a fused kernel streams), summed over kv heads.
struct KvReadBytes {
  int64_t upper = 0;  // key + value upper codes
  int64_t lower = 0;  // key + value lower codes (0 for the draft view)
  int64_t meta = 0;   // key and value scale/min
  int64_t fp = 0;     // full-precision rows (f32 or f16: their element size)
};

// A sparse-KV draft's subset of one layer's full-precision history: kv head h reads the
// positions positions[h * count, (h + 1) * count) (ascending, each < dense_from) and then every
// position in [dense_from, t] for a query at t. Only without a quantized segment.
struct KvSelection {
  const int32_t* positions = nullptr;  // [num_kv_heads, count] absolute positions
  int count = 0;
  int dense_from = 0;
};

// One layer's keys and values as attention reads them: a full-precision segment, optionally
// preceded by a quantized segment. Without `quantized`, positions [0, length) are all full
// precision (the plain cache). With it, query t reads [0, quant_boundary(t, G)) through the
// quantized view and [quant_boundary(t, G), t] from the full-precision rows.
//
// The full-precision rows are f32 or f16 (`row_dtype`, the cache's KvCacheConfig::row_dtype):
// every reader converts f16 to f32 on load and computes in f32, so a view of f16 rows gives the
// same results as a view of f32 rows holding the same (f16-representable) values.
// One linear layer of a matmul_group call: dense weights, or 4-bit weights when w4 is set; bias
// nullptr or empty for none; y: [m, rows].
struct LinearOp {
  const WeightView* w = nullptr;
  const QuantizedWeight4* w4 = nullptr;
  const WeightView* bias = nullptr;
  float* y = nullptr;

  // Output features (the weight's rows).
  int64_t rows() const { return w4 != nullptr ? w4->rows : w->rows; }
};

// The input rows of the matmuls after a residual add: norm(h) over m rows of h ([m, d], d =
// weight->numel()), materialized in `out` unless the producer deferred it
// (Backend::linear_add_rmsnorm_deferred).
struct PendingNorm {
  float* h = nullptr;
  const WeightView* weight = nullptr;
  float eps = 0.0f;
  float* out = nullptr;          // aliases neither h nor the producer's input
  bool deferred = false;         // out not written: the consumers read h and the backend's record
  const void* record = nullptr;  // what the producer left for the consumers (backend-defined)
};

// RoPE of one layer's step for Backend::rope_qk_store_kv: the query rows q ([m, num_heads *
// head_dim]) and rope_qk's other arguments but the positions.
struct RopeQK {
  float* q = nullptr;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  const float* inv_freq = nullptr;  // host [head_dim / 2]
};

// The new K/V rows of one layer's step as KvCache::write_with_rope stores them: rope_qk_store_kv's
// arguments but the keys and values (Backend::output_and_mlp).
struct KvRowStore {
  RopeQK rope;
  int pos = 0;
  void* k_dst = nullptr;
  void* v_dst = nullptr;
  DType dtype = DType::F32;
};

struct KvView {
  const void* k = nullptr;  // [length - fp_base, row_stride] of row_dtype, row r = position
                            // fp_base + r, post-RoPE
  const void* v = nullptr;  // [length - fp_base, row_stride] of row_dtype
  int64_t row_stride = 0;   // elements between consecutive positions (>= kv_dim)
  int length = 0;           // positions readable (end of the full-precision rows)
  int fp_base = 0;          // absolute position of row 0 of k/v; <= every query's boundary
  const QuantizedKvSegment* quantized = nullptr;  // nullptr: no quantized history
  KvReadBytes* read_bytes = nullptr;              // when set, the call adds its reads to it
  const KvSelection* selection = nullptr;         // nullptr: every position (sparse drafts)
  DType row_dtype = DType::F32;                   // of k and v: F32 or F16

  // Bytes of one element of the rows (4 or 2).
  int64_t row_elem_bytes() const { return static_cast<int64_t>(dtype_size(row_dtype)); }
  // The rows as their type (a QS_CHECK failure for the other type).
  const float* k_f32() const {
    QS_CHECK(row_dtype == DType::F32);
    return static_cast<const float*>(k);
  }
  const float* v_f32() const {
    QS_CHECK(row_dtype == DType::F32);
    return static_cast<const float*>(v);
  }
  const uint16_t* k_f16() const {
    QS_CHECK(row_dtype == DType::F16);
    return static_cast<const uint16_t*>(k);
  }
  const uint16_t* v_f16() const {
    QS_CHECK(row_dtype == DType::F16);
    return static_cast<const uint16_t*>(v);
  }
};

// Whether full-precision KV rows may have this type (F32, F16).
inline bool kv_row_dtype_supported(DType t) {
  return t == DType::F32 || t == DType::F16;
}

struct AttentionShape {
  int num_heads = 0;  // query heads; query head h reads kv head h / (num_heads / num_kv_heads)
  int num_kv_heads = 0;
  int head_dim = 0;
  float scale = 0.0f;  // softmax scale, 1/sqrt(head_dim) for Llama
};

// A block of backend memory holding `size` elements of T.
template <typename T>
class BackendArray {
 public:
  virtual ~BackendArray() = default;
  T* data() const { return data_; }
  size_t size() const { return size_; }

 protected:
  T* data_ = nullptr;
  size_t size_ = 0;
};

// A BackendArray in host memory (the CPU backend's memory; host-side storage elsewhere).
template <typename T>
class HostArray final : public BackendArray<T> {
 public:
  explicit HostArray(size_t n) : storage_(new T[n]) {  // uninitialized on purpose
    this->data_ = storage_.get();
    this->size_ = n;
  }

 private:
  std::unique_ptr<T[]> storage_;
};

// Activations, logits, KV planes: f32 elements.
using Buffer = BackendArray<float>;
using HostBuffer = HostArray<float>;
// Token ids (int32): a decoder's ids kept where the logits are, so that one forward's argmax
// feeds the next forward without the host (Backend::alloc_ids).
using IdBuffer = BackendArray<int32_t>;
using HostIdBuffer = HostArray<int32_t>;

// Points in a backend's queue of work and the time between them as the work ran (CUDA: events):
// phases queued without waiting for each (a speculative round's chained draft steps) timed
// apart. A host-memory backend's work is done when its call returns: its marks are host clock
// readings.
class TimeMarks {
 public:
  virtual ~TimeMarks() = default;
  // Mark `slot` (in [0, slots)) at the end of the work queued so far.
  virtual void record(int slot) = 0;
  // Seconds from mark `from` to mark `to`, both recorded; waits until `to` is reached.
  virtual double seconds(int from, int to) = 0;
};

class HostTimeMarks final : public TimeMarks {
 public:
  explicit HostTimeMarks(int slots) : t_(static_cast<size_t>(slots)) {}
  void record(int slot) override { t_.at(static_cast<size_t>(slot)) = Clock::now(); }
  double seconds(int from, int to) override {
    return std::chrono::duration<double>(t_.at(static_cast<size_t>(to)) -
                                         t_.at(static_cast<size_t>(from)))
        .count();
  }

 private:
  using Clock = std::chrono::steady_clock;
  std::vector<Clock::time_point> t_;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  // The hardware in words, for reports (e.g. "NVIDIA H200, driver 13.0, 139.8 GiB").
  virtual std::string description() const { return name(); }
  // Bytes of device memory in use now (the whole device), or -1 where it is not measured (host
  // memory).
  virtual int64_t memory_in_use() const { return -1; }
  // Bytes that could still be allocated now, or -1 where not known. Large caches check it first:
  // past it a host allocation still succeeds (Linux overcommits) and the process is killed once
  // the memory is touched.
  virtual int64_t memory_available() const { return -1; }

  // Memory for activations (contents undefined), and the copy back to the host.
  virtual std::unique_ptr<Buffer> alloc(size_t n) = 0;
  // The same, but nullptr when the memory cannot be had (large caches report it as an error).
  virtual std::unique_ptr<Buffer> try_alloc(size_t n) {
    try {
      return alloc(n);
    } catch (const std::bad_alloc&) {
      return nullptr;
    }
  }
  virtual void to_host(const float* src, float* dst_host, size_t n) = 0;

  // out[i, :] = table[ids[i], :]. ids: host [m], each in [0, table.rows); out: [m, table.cols].
  virtual void embedding(const WeightView& table, const int32_t* ids, int m, float* out) = 0;

  // out[i, :] = x[i, :] / sqrt(mean(x[i, :]^2) + eps) * weight. x, out: [m, weight.cols];
  // out may alias x.
  virtual void rmsnorm(const float* x, const WeightView& weight, int m, float eps, float* out) = 0;

  // y = x W^T (+ bias). x: [m, w.cols]; W: [w.rows, w.cols]; bias: [1, w.rows] or nullptr /
  // empty; y: [m, w.rows], must not alias x.
  virtual void matmul(const float* x, int m, const WeightView& w, const WeightView* bias,
                      float* y) = 0;

  // Rotary embedding in place, HF "rotate_half" convention: for each head, the pair
  // (x[j], x[j + head_dim/2]) is rotated by angle (pos + i) * inv_freq[j] (angle in f32).
  // x: [m, num_heads * head_dim] for positions [pos, pos + m); inv_freq: host [head_dim / 2].
  virtual void rope(float* x, int m, int num_heads, int head_dim, int pos,
                    const float* inv_freq) = 0;

  // Causal attention of m queries at absolute positions [pos, pos + m): query i attends to
  // positions [0, pos + i] of `kv` (so kv.length >= pos + m). q, out: [m, num_heads * head_dim];
  // out must not alias q.
  virtual void attention(const float* q, int m, int pos, const AttentionShape& shape,
                         const KvView& kv, float* out) = 0;

  // out = silu(gate) * up, elementwise over n floats; out may alias gate or up.
  virtual void swiglu(const float* gate, const float* up, int64_t n, float* out) = 0;

  // y += x, elementwise over n floats.
  virtual void add(float* y, const float* x, int64_t n) = 0;

  // y = x W4^T (+ bias) with W4 the 4-bit group-wise draft weight of quant/weight_quant.h
  // (DESIGN §1). Same shapes as matmul. Backends without it abort.
  virtual void matmul_q4(const float* x, int m, const QuantizedWeight4& w, const WeightView* bias,
                         float* y) {
    (void)x, (void)m, (void)w, (void)bias, (void)y;
    QS_CHECK_MSG(false, "matmul_q4: not implemented by this backend");
  }

  // Several linear layers of the same input (q/k/v, gate/up): ops[i].y = x W_i^T (+ bias), W_i
  // dense (ops[i].w) or 4-bit (ops[i].w4 when set), as one matmul / matmul_q4 call each would
  // compute them (up to summation order). Backends may run them as one launch.
  virtual void matmul_group(const float* x, int m, const LinearOp* ops, int count) {
    for (int i = 0; i < count; ++i) {
      const LinearOp& op = ops[i];
      if (op.w4 != nullptr) {
        matmul_q4(x, m, *op.w4, op.bias, op.y);
      } else {
        matmul(x, m, *op.w, op.bias, op.y);
      }
    }
  }

  // Fused ops (add_rmsnorm, rope_qk, rope_qk_store_kv, and store_kv_row_pair below): each default
  // is the sequence of ops it names, so a backend that does not override one gives exactly the
  // results of the separate calls; an override must give them too (bit-identical), in fewer
  // launches.

  // The residual add and the next norm: h += x over [m, d], d = weight.numel() (the norm weight
  // is a vector), then out = rmsnorm(h) over the m rows: add(h, x, m * d) followed by
  // rmsnorm(h, weight, m, eps, out). out must alias neither h nor x.
  virtual void add_rmsnorm(float* h, const float* x, const WeightView& weight, int m, float eps,
                           float* out) {
    add(h, x, static_cast<int64_t>(m) * weight.numel());
    rmsnorm(h, weight, m, eps, out);
  }

  // The MLP's gate and up projections and their SwiGLU: matmul_group(x, m, {gate, up}) then
  // swiglu(gate.y, up.y, m * n, out) with n the projections' rows (equal). gate.y and up.y are
  // scratch: their contents afterwards are unspecified (out may be gate.y).
  virtual void gate_up_swiglu(const float* x, int m, const LinearOp& gate, const LinearOp& up,
                              float* out) {
    const LinearOp ops[2] = {gate, up};
    matmul_group(x, m, ops, 2);
    swiglu(gate.y, up.y, static_cast<int64_t>(m) * gate.rows(), out);
  }

  // A linear layer whose output goes into the residual stream, and the next norm:
  // op.y = x W^T (+ bias) as matmul / matmul_q4 computes it (W = op.w, or the 4-bit op.w4 when
  // set), then add_rmsnorm(h, op.y, weight, m, eps, out). op.y is scratch ([m, d]): its contents
  // afterwards are unspecified (a backend may add the products into h without storing them).
  virtual void linear_add_rmsnorm(const float* x, int m, const LinearOp& op, float* h,
                                  const WeightView& weight, float eps, float* out) {
    matmul_group(x, m, &op, 1);
    add_rmsnorm(h, op.y, weight, m, eps, out);
  }

  // The same with the norm's rows left to the matmuls that read them, where a backend can: the
  // producer (linear_add_rmsnorm_deferred) adds op's output into pn.h and either writes
  // norm(h) to pn.out, as linear_add_rmsnorm (pn.deferred = false: the defaults), or leaves
  // pn.out unwritten and sets pn.deferred; the consumers (matmul_group_normed,
  // gate_up_swiglu_normed) then read norm(pn.h) however the backend recorded it. Without
  // deferral they are matmul_group / gate_up_swiglu on pn.out; with it, the same up to f32
  // rounding (the CUDA backend's 1 / rms multiplies each output's sum instead of each input:
  // within 1e-5 relative; it defers the draft's one-row 4-bit steps only).
  virtual void linear_add_rmsnorm_deferred(const float* x, int m, const LinearOp& op,
                                           PendingNorm& pn) {
    linear_add_rmsnorm(x, m, op, pn.h, *pn.weight, pn.eps, pn.out);
    pn.deferred = false;
  }
  virtual void matmul_group_normed(const PendingNorm& pn, int m, const LinearOp* ops, int count) {
    QS_CHECK(!pn.deferred);
    matmul_group(pn.out, m, ops, count);
  }
  virtual void gate_up_swiglu_normed(const PendingNorm& pn, int m, const LinearOp& gate,
                                     const LinearOp& up, float* out) {
    QS_CHECK(!pn.deferred);
    gate_up_swiglu(pn.out, m, gate, up, out);
  }

  // The rest of a layer after its attention, and the next layer's first ops, as one call for a
  // backend that runs them as one launch: linear_add_rmsnorm_deferred(x, m, o, mid),
  // gate_up_swiglu_normed(mid, m, gate, up, act), linear_add_rmsnorm_deferred(act, m, down,
  // next), then matmul_group_normed(next, m, next_ops, next_count) (none for next_count 0: the
  // model's q/k/v of the next layer) and, with next_rows (next_ops: q, k, v), rope_qk_store_kv
  // of their outputs (the next layer's KvCache::write_with_rope). mid and next normalize the same
  // residual stream (mid.h == next.h); o.y and down.y are scratch, as in linear_add_rmsnorm. A
  // fused backend leaves mid as consumed (deferred, its rows unspecified) and next as the
  // producer above would, with the same values up to the deferral's rounding.
  virtual void output_and_mlp(const float* x, int m, const LinearOp& o, PendingNorm& mid,
                              const LinearOp& gate, const LinearOp& up, float* act,
                              const LinearOp& down, PendingNorm& next, const LinearOp* next_ops,
                              int next_count, const KvRowStore* next_rows) {
    linear_add_rmsnorm_deferred(x, m, o, mid);
    gate_up_swiglu_normed(mid, m, gate, up, act);
    linear_add_rmsnorm_deferred(act, m, down, next);
    if (next_count > 0) matmul_group_normed(next, m, next_ops, next_count);
    if (next_rows != nullptr) store_next_rows(m, next_ops, next_count, *next_rows);
  }
  // output_and_mlp's last step: rope_qk_store_kv of next_ops' q, k and v outputs.
  void store_next_rows(int m, const LinearOp* next_ops, int next_count, const KvRowStore& rows) {
    QS_CHECK_MSG(next_count == 3, "output_and_mlp: the K/V rows need the q, k and v ops");
    rope_qk_store_kv(rows.rope, m, rows.pos, next_ops[1].y, next_ops[2].y, rows.k_dst, rows.v_dst,
                     rows.dtype);
  }

  // RoPE of a layer's queries and keys: rope(q, m, num_heads, ...) then rope(k, m, num_kv_heads,
  // ...) with the same positions and frequencies. q: [m, num_heads * head_dim], k: [m,
  // num_kv_heads * head_dim], distinct buffers.
  virtual void rope_qk(float* q, float* k, int m, int num_heads, int num_kv_heads, int head_dim,
                       int pos, const float* inv_freq) {
    rope(q, m, num_heads, head_dim, pos, inv_freq);
    rope(k, m, num_kv_heads, head_dim, pos, inv_freq);
  }

  // A layer's new rows at [pos, pos + m) rotated and stored: rope_qk(rope.q, k, m, ..., pos, ...)
  // then store_kv_row_pair(k_dst, v_dst, dst_dtype, k, v, m * num_kv_heads * head_dim). k keeps the
  // rotated keys, as after rope_qk.
  virtual void rope_qk_store_kv(const RopeQK& rope, int m, int pos, float* k, const float* v,
                                void* k_dst, void* v_dst, DType dst_dtype) {
    rope_qk(rope.q, k, m, rope.num_heads, rope.num_kv_heads, rope.head_dim, pos, rope.inv_freq);
    store_kv_row_pair(k_dst, v_dst, dst_dtype, k, v,
                      static_cast<size_t>(m) * rope.num_kv_heads * rope.head_dim);
  }

  // The flush of DESIGN §3 (docs/kv-format.md): quantizes key groups [first_group,
  // first_group + n_groups) of one layer, every kv head, into `dst`. k_rows, v_rows:
  // [n_groups * G, row_stride] backend memory of `row_dtype` (F32 or F16; row_stride in
  // elements), row i = position first_group * G + i, kv head h at columns [h * head_dim,
  // (h + 1) * head_dim), keys post-RoPE. Codes and fp16 metadata are bit-identical to
  // quant/kv_quant.h's quantize_key_group / quantize_value_row on the same rows as f32 (F16 rows
  // converted exactly).
  virtual void quantize_kv(const void* k_rows, const void* v_rows, DType row_dtype,
                           int64_t row_stride, int num_kv_heads, int head_dim, int64_t first_group,
                           int n_groups, const QuantizedKvPlanesOut& dst) {
    (void)k_rows, (void)v_rows, (void)row_dtype, (void)row_stride, (void)num_kv_heads;
    (void)head_dim, (void)first_group, (void)n_groups, (void)dst;
    QS_CHECK_MSG(false, "quantize_kv: not implemented by this backend");
  }
  // quantize_kv for n_layers layers at once (a commit's flush): layer l's rows start at
  // k_rows / v_rows + l * layer_stride elements, its planes are dst[l]. The same codes and
  // metadata as one call per layer; a backend may run them as one launch.
  virtual void quantize_kv_layers(const void* k_rows, const void* v_rows, DType row_dtype,
                                  int64_t row_stride, int64_t layer_stride, int n_layers,
                                  int num_kv_heads, int head_dim, int64_t first_group, int n_groups,
                                  const QuantizedKvPlanesOut* dst) {
    const int64_t step = layer_stride * static_cast<int64_t>(dtype_size(row_dtype));
    for (int l = 0; l < n_layers; ++l) {
      quantize_kv(static_cast<const char*>(k_rows) + l * step,
                  static_cast<const char*>(v_rows) + l * step, row_dtype, row_stride, num_kv_heads,
                  head_dim, first_group, n_groups, dst[l]);
    }
  }
  // The same over f32 rows (row_stride in floats). Derived backends bring it into scope with
  // `using Backend::quantize_kv;`.
  void quantize_kv(const float* k_rows, const float* v_rows, int64_t row_stride, int num_kv_heads,
                   int head_dim, int64_t first_group, int n_groups,
                   const QuantizedKvPlanesOut& dst) {
    quantize_kv(k_rows, v_rows, DType::F32, row_stride, num_kv_heads, head_dim, first_group,
                n_groups, dst);
  }

  // SnapKV's observation scores of one layer: the expensive half of the sparse draft's selection,
  // run where the KV lives (the host pools and ranks them: SparseDraftIndex). The `window` = w
  // queries of positions [q0, prompt_len), q0 = prompt_len - w, attend causally to the layer's
  // keys: for kv head h, query vector j = (group member g, window row i) of query head
  // h * group + g is softmaxed over the keys it sees, [0, q0 + i], and
  //   scores[h * past + t] = sum over the j that see t of softmax_j(t), for t in [0, past).
  // q: [w, num_heads * head_dim] f32, post-RoPE; k_rows: [prompt_len, row_stride] of row_dtype
  // (F32 or F16; row_stride in elements), row r = position r, kv head h at columns
  // [h * head_dim, (h + 1) * head_dim), post-RoPE; scores: [num_kv_heads, past] f32.
  // 1 <= w <= prompt_len, 0 <= past <= prompt_len. kv/sparse_select.h's
  // snapkv_scores_reference defines the results (f32 arithmetic: backends agree to rounding).
  virtual void snapkv_scores(const float* q, int window, const void* k_rows, DType row_dtype,
                             int64_t row_stride, const AttentionShape& shape, int prompt_len,
                             int past, float* scores) {
    (void)q, (void)window, (void)k_rows, (void)row_dtype, (void)row_stride, (void)shape;
    (void)prompt_len, (void)past, (void)scores;
    QS_CHECK_MSG(false, "snapkv_scores: not implemented by this backend");
  }

  // --- Additions for device backends. The defaults are right for a backend whose memory is
  // host memory (the CPU backend), so it need not override them.

  // Makes every tensor of `weights` resident in backend memory ahead of the first op (a device
  // backend uploads them once; later ops find them by the views' host addresses). Optional:
  // a device backend uploads a weight on its first use otherwise.
  virtual void prepare_weights(const ModelWeights& weights) { (void)weights; }

  // prepare_weights for 4-bit weights (a Model's draft weights, as they are made), so that the
  // first draft step does not pay their upload.
  virtual void prepare_weights4(const std::vector<const QuantizedWeight4*>& w) { (void)w; }

  // The 4-bit weights `w` are about to be freed (their owner, a Model's draft weights, goes or
  // replaces them): a device backend drops the copies it found by their host addresses, so that a
  // later weight allocated at one of those addresses is not taken for a stale copy of another.
  virtual void forget_weights4(const std::vector<const QuantizedWeight4*>& w) { (void)w; }

  // Makes this backend's device current on the calling thread (CUDA: cudaSetDevice), for a
  // thread other than the one that created it (tensor parallelism: one thread per rank runs
  // each rank's backend). No-op for a host-memory backend.
  virtual void bind_thread() {}

  // Brackets the stretch an external profiler records (CUDA: cudaProfilerStart/Stop, for
  // `ncu --profile-from-start off`; the engine brackets decoding when QS_PROFILE_DECODE is set).
  // No-op where there is nothing to profile.
  virtual void profile_region(bool begin) { (void)begin; }

  // The argmax of each of `rows` rows of n floats at x (backend memory; core/argmax.h: the lowest
  // index among ties, NaN never wins) into out_host[0, rows) (host memory), complete on return:
  // the greedy decoders' tokens, so that only the ids need to leave the backend.
  virtual void argmax_rows(const float* x, int rows, int n, int32_t* out_host) {
    for (int r = 0; r < rows; ++r) out_host[r] = argmax(x + static_cast<size_t>(r) * n, n);
  }

  // ---- Token ids in backend memory (a chained decoder: SpeculativeDecoder's greedy round) ----
  virtual std::unique_ptr<IdBuffer> alloc_ids(size_t n) {
    return std::make_unique<HostIdBuffer>(n);
  }
  // n ids from host memory into dst (backend memory), ordered before later work; src may be
  // reused on return.
  virtual void ids_from_host(const int32_t* src_host, int32_t* dst, size_t n) {
    std::memcpy(dst, src_host, n * sizeof(int32_t));
  }
  // n ids (backend memory) to host memory, after all work queued so far; complete on return.
  virtual void ids_to_host(const int32_t* src, int32_t* dst_host, size_t n) {
    std::memcpy(dst_host, src, n * sizeof(int32_t));
  }
  // embedding() with the ids in backend memory (not range-checked: a chain's ids are the argmax
  // of this vocabulary's logits, or were checked on their way in).
  virtual void embedding_of_ids(const WeightView& table, const int32_t* ids, int m, float* out) {
    embedding(table, ids, m, out);
  }
  // argmax_rows() into backend memory (out: [rows] ids) without waiting for it.
  virtual void argmax_rows_into(const float* x, int rows, int n, int32_t* out) {
    argmax_rows(x, rows, n, out);
  }
  // Timing of queued work (TimeMarks) with `slots` marks.
  virtual std::unique_ptr<TimeMarks> make_time_marks(int slots) {
    return std::make_unique<HostTimeMarks>(slots);
  }

  // Sampling where the logits are (core/sampling.h's rule, which these defaults run on the host
  // memory of the CPU backend): row r of `logits` ([rows, n], backend memory) becomes
  // token_probabilities(row, params), written to probs[r, :] when probs (backend memory,
  // [rows, n]) is non-null, and its token, sample_at(that distribution, u_host[r]), goes to
  // out_host[r] (host memory), complete on return. u_host: [rows] uniforms in [0, 1). A backend
  // may round differently from the host (summation order): its distributions agree to float
  // rounding and its tokens wherever u is not within rounding of a cumulative boundary.
  virtual void sample_rows(const float* logits, int rows, int n, const SamplingParams& params,
                           const double* u_host, float* probs, int32_t* out_host) {
    std::vector<float> row;
    for (int r = 0; r < rows; ++r) {
      token_probabilities(logits + static_cast<size_t>(r) * n, n, params, row);
      out_host[r] = sample_at(row.data(), n, u_host[r]);
      if (probs != nullptr)
        std::memcpy(probs + static_cast<size_t>(r) * n, row.data(), n * sizeof(float));
    }
  }

  // One speculative round's verdict where the logits are (core/sampling.h speculative_verdict):
  // p = token_probabilities of each of the gamma + 1 rows of target_logits ([gamma + 1, n],
  // backend memory), q = draft_probs ([gamma, n], backend memory, from sample_rows; row k may be
  // overwritten by the residual), candidates_host / u_host ([gamma] / [gamma + 1], host).
  virtual SpecVerdict speculative_verdict(const float* target_logits, float* draft_probs, int gamma,
                                          int n, const SamplingParams& params,
                                          const int32_t* candidates_host, const double* u_host,
                                          bool residual) {
    std::vector<float> row;
    auto p = [&](int r) {
      token_probabilities(target_logits + static_cast<size_t>(r) * n, n, params, row);
      return row.data();
    };
    return qs::speculative_verdict(p, draft_probs, gamma, n, candidates_host, u_host, residual);
  }
  // sample_rows() with the tokens into backend memory (out: [rows] ids) without waiting for
  // them (a chained sampling round: each draft token feeds the next step where it was drawn).
  virtual void sample_rows_into(const float* logits, int rows, int n, const SamplingParams& params,
                                const double* u_host, float* probs, int32_t* out) {
    sample_rows(logits, rows, n, params, u_host, probs, out);
  }
  // speculative_verdict() with the candidates in backend memory ([gamma] ids) and the verdict
  // into backend memory (out: [2] = accepted, token), without waiting for it.
  virtual void speculative_verdict_into(const float* target_logits, float* draft_probs, int gamma,
                                        int n, const SamplingParams& params,
                                        const int32_t* candidates, const double* u_host,
                                        bool residual, int32_t* out) {
    const SpecVerdict v = speculative_verdict(target_logits, draft_probs, gamma, n, params,
                                              candidates, u_host, residual);
    out[0] = v.accepted;
    out[1] = v.token;
  }

  // Copies n floats from host memory into backend memory (dst from alloc()).
  virtual void from_host(const float* src_host, float* dst, size_t n) {
    if (src_host != dst) std::memcpy(dst, src_host, n * sizeof(float));
  }

  // Sets `bytes` bytes of backend memory (from alloc()) to zero.
  virtual void fill_zero(void* dst, size_t bytes) { std::memset(dst, 0, bytes); }

  // Copies n floats within backend memory. The ranges must not overlap.
  virtual void copy(float* dst, const float* src, size_t n) {
    if (src != dst) std::memcpy(dst, src, n * sizeof(float));
  }

  // Copies `bytes` bytes within backend memory (KV rows of any type moving inside the cache).
  // The ranges must not overlap.
  virtual void copy_bytes(void* dst, const void* src, size_t bytes) {
    if (src != dst && bytes > 0) std::memcpy(dst, src, bytes);
  }
  // `count` copies of `bytes` bytes, copy i from src + i * src_pitch to dst + i * dst_pitch (one
  // layer's rows each). No destination range may overlap any source range.
  virtual void copy_bytes_strided(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                                  size_t bytes, int count) {
    for (int i = 0; i < count; ++i) {
      copy_bytes(static_cast<char*>(dst) + i * dst_pitch,
                 static_cast<const char*>(src) + i * src_pitch, bytes);
    }
  }

  // Stores n f32 values (backend memory) as `dst_dtype` into backend memory: F32 copies; F16
  // rounds to nearest even, and finite values beyond +-65504 saturate to +-65504 (never inf;
  // core/dtype.h f32_to_f16_sat). The new K/V rows of a cache. Ranges must not overlap.
  virtual void store_kv_rows(void* dst, DType dst_dtype, const float* src, size_t n) {
    QS_CHECK_MSG(kv_row_dtype_supported(dst_dtype), "store_kv_rows: rows are F32 or F16");
    if (dst_dtype == DType::F32) {
      copy(static_cast<float*>(dst), src, n);
      return;
    }
    auto* d = static_cast<uint16_t*>(dst);
    for (size_t i = 0; i < n; ++i) d[i] = f32_to_f16_sat(src[i]);
  }

  // A layer's new key and value rows: store_kv_rows(k_dst, dst_dtype, k, n) then
  // store_kv_rows(v_dst, dst_dtype, v, n). No two of the four ranges may overlap.
  virtual void store_kv_row_pair(void* k_dst, void* v_dst, DType dst_dtype, const float* k,
                                 const float* v, size_t n) {
    store_kv_rows(k_dst, dst_dtype, k, n);
    store_kv_rows(v_dst, dst_dtype, v, n);
  }
};

}  // namespace qs
