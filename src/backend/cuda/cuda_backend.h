// The CUDA backend: every op of backend.h as kernels queued on one CUDA stream, in the order
// they are called; the host waits only in to_host() and synchronize(). Activations are f32 device
// memory, the KV view's full-precision rows f32 or f16 (read as f32); weights are uploaded once in
// their file dtype (F32/F16/BF16) and found again by their host address. docs/cuda.md describes
// the kernels and their choices.
//
// This header needs no CUDA headers: the stream is handed out as an opaque pointer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "core/error.h"
#include "model/config.h"

namespace qs {

namespace cuda {
struct NormIn;  // cuda_ops.h
}  // namespace cuda

struct CudaBackendOptions {
  int device = 0;  // CUDA device ordinal
  // Prefill arithmetic (m > kGemvMaxRows rows) on tensor cores. true: each f32 activation is
  // split into a high and a low bf16/f16 part, two GEMMs, and the tensor-core attention runs
  // three MMAs per product on f16 hi/lo operands (about f32 accuracy, the CPU reference's).
  // false: activations rounded to the weight dtype, one GEMM (HF's bf16 arithmetic), and one
  // MMA per attention product on f16 operands (2^-11 relative per operand, power-of-two scaled).
  bool exact_prefill = true;
  // The draft (INT4) view of the quantized attention: false: f16 operands alone (one MMA per
  // product); true: f16 hi + lo (f32-level, as the INT8 view). QuantAttentionArgs::exact_draft.
  bool exact_draft_attention = false;
  // The target (INT8) view of the quantized attention, which AR INT8 reads too: false: f16 hi +
  // lo (f32-level, the CPU reference's; the conformance tests' backends); true: f16 operands
  // alone on the register-direct path (errors up to ~2e-3 of the output, ~20x below the view's
  // own; the engine's default, --target-attention f16). QuantAttentionArgs::f16_int8.
  bool f16_target_attention = false;
};

// Whether a CUDA device is present and usable (GPU tests skip without one).
bool cuda_device_available();
// CUDA devices present (0 without a driver or device).
int cuda_device_count();

class CudaBackend final : public Backend {
 public:
  // Errors: no CUDA device, or the ordinal is out of range.
  static Result<std::unique_ptr<CudaBackend>> create(const CudaBackendOptions& options = {});
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  // The model shapes the kernels support (head_dim 32/64/128/256); errors name the field.
  static Status check_supported(const ModelConfig& cfg);

  const char* name() const override { return "cuda"; }
  const CudaBackendOptions& options() const;
  std::string description() const override;
  int64_t memory_in_use() const override;

  std::unique_ptr<Buffer> alloc(size_t n) override;
  std::unique_ptr<Buffer> try_alloc(size_t n) override;
  void to_host(const float* src, float* dst_host, size_t n) override;
  // On the GPU (only the ids come back); with QS_CUDA_ARGMAX=0 the rows are copied back and
  // argmax'ed on the host.
  void argmax_rows(const float* x, int rows, int n, int32_t* out_host) override;
  void sample_rows(const float* logits, int rows, int n, const SamplingParams& params,
                   const double* u_host, float* probs, int32_t* out_host) override;
  SpecVerdict speculative_verdict(const float* target_logits, float* draft_probs, int gamma, int n,
                                  const SamplingParams& params, const int32_t* candidates_host,
                                  const double* u_host, bool residual) override;
  // The forms above are these, their results then copied back (QS_CUDA_SAMPLE=0: the logits
  // copied back and sampled on the host, the results copied in).
  void sample_rows_into(const float* logits, int rows, int n, const SamplingParams& params,
                        const double* u_host, float* probs, int32_t* out) override;
  void speculative_verdict_into(const float* target_logits, float* draft_probs, int gamma, int n,
                                const SamplingParams& params, const int32_t* candidates,
                                const double* u_host, bool residual, int32_t* out) override;
  // Token ids in device memory: the copies are ordered on the backend's stream, ids_to_host waits
  // for it; argmax_rows_into always on the GPU (QS_CUDA_ARGMAX concerns argmax_rows).
  std::unique_ptr<IdBuffer> alloc_ids(size_t n) override;
  void ids_from_host(const int32_t* src_host, int32_t* dst, size_t n) override;
  void ids_to_host(const int32_t* src, int32_t* dst_host, size_t n) override;
  void embedding_of_ids(const WeightView& table, const int32_t* ids, int m, float* out) override;
  void argmax_rows_into(const float* x, int rows, int n, int32_t* out) override;
  // CUDA events on the backend's stream.
  std::unique_ptr<TimeMarks> make_time_marks(int slots) override;
  void from_host(const float* src_host, float* dst, size_t n) override;
  void copy(float* dst, const float* src, size_t n) override;
  void copy_bytes(void* dst, const void* src, size_t bytes) override;
  // One cudaMemcpy2DAsync (QS_FLUSH_LAYERS=0: one copy per row block, as before).
  void copy_bytes_strided(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                          size_t bytes, int count) override;
  // F16: a conversion kernel (cuda_ops.h launch_store_f16), bit-identical to the CPU's.
  void store_kv_rows(void* dst, DType dst_dtype, const float* src, size_t n) override;
  // F16: both row ranges in one kernel (launch_store_f16_pair); F32: two copies.
  void store_kv_row_pair(void* k_dst, void* v_dst, DType dst_dtype, const float* k, const float* v,
                         size_t n) override;
  void prepare_weights(const ModelWeights& weights) override;
  void prepare_weights4(const std::vector<const QuantizedWeight4*>& w) override;
  void forget_weights4(const std::vector<const QuantizedWeight4*>& w) override;
  void bind_thread() override;
  void profile_region(bool begin) override;

  void embedding(const WeightView& table, const int32_t* ids, int m, float* out) override;
  void rmsnorm(const float* x, const WeightView& weight, int m, float eps, float* out) override;
  void matmul(const float* x, int m, const WeightView& w, const WeightView* bias,
              float* y) override;
  void rope(float* x, int m, int num_heads, int head_dim, int pos, const float* inv_freq) override;
  void attention(const float* q, int m, int pos, const AttentionShape& shape, const KvView& kv,
                 float* out) override;
  void swiglu(const float* gate, const float* up, int64_t n, float* out) override;
  void add(float* y, const float* x, int64_t n) override;
  // One launch each (launch_add_rmsnorm, launch_rope_qk), bit-identical to the separate ops.
  void add_rmsnorm(float* h, const float* x, const WeightView& weight, int m, float eps,
                   float* out) override;
  void rope_qk(float* q, float* k, int m, int num_heads, int num_kv_heads, int head_dim, int pos,
               const float* inv_freq) override;
  // One launch (launch_rope_qk_store_kv), bit-identical to rope_qk then store_kv_row_pair;
  // QS_FUSE_ROPE_STORE=0 makes it those two launches.
  void rope_qk_store_kv(const RopeQK& rope, int m, int pos, float* k, const float* v, void* k_dst,
                        void* v_dst, DType dst_dtype) override;
  // 4-bit draft weights: uploaded (repacked for the kernel) on first use, found again by the
  // address of their host codes; m <= kGemvMaxRows per launch (larger m in slices of 16 rows).
  void matmul_group(const float* x, int m, const LinearOp* ops, int count) override;
  void matmul_q4(const float* x, int m, const QuantizedWeight4& w, const WeightView* bias,
                 float* y) override;
  // The GEMV and the add + RMSNorm in one launch for one row (a decode or draft step) where the
  // decode GEMVs' persistent kernels run (launch_gemv_norm, launch_gemv_q4_norm); the separate
  // launches otherwise (several rows: slower fused, cuda_backend.cu), or with QS_FUSE_NORM=0.
  // op.y is not written when fused.
  void linear_add_rmsnorm(const float* x, int m, const LinearOp& op, float* h,
                          const WeightView& weight, float eps, float* out) override;
  // The gate / up GEMVs with the SwiGLU in their epilogue, one launch (launch_gemv_swiglu,
  // launch_gemv_q4_swiglu: bf16/f16 weights at m <= 16, 4-bit at m = 1); the separate launches
  // otherwise, or with QS_FUSE_SWIGLU=0. Bit-identical either way; up.y is not written when fused.
  void gate_up_swiglu(const float* x, int m, const LinearOp& gate, const LinearOp& up,
                      float* out) override;
  // The draft's norms deferred (one row, 4-bit op on the persistent kernel; QS_DEFER_NORM=0
  // turns it off): the producing launch adds into h and leaves per-block sums of squares
  // (GemvNorm::sumsq, the record), the next 4-bit launch stages h * weight and scales its sums
  // by 1 / rms (NormIn), so no block waits for the others to normalize h. Consumers the
  // persistent kernel cannot run normalize h first (rmsnorm) and run as usual.
  void linear_add_rmsnorm_deferred(const float* x, int m, const LinearOp& op,
                                   PendingNorm& pn) override;
  void matmul_group_normed(const PendingNorm& pn, int m, const LinearOp* ops, int count) override;
  void gate_up_swiglu_normed(const PendingNorm& pn, int m, const LinearOp& gate, const LinearOp& up,
                             float* out) override;
  // With GemvTuning::qkv_rows (bf16 / f16) or Q4GemvTuning::qkv_rows (4-bit) the next q / k / v
  // launch also rotates and stores the rows (matmul_group_from). Otherwise the calls.
  void output_and_mlp(const float* x, int m, const LinearOp& o, PendingNorm& mid,
                      const LinearOp& gate, const LinearOp& up, float* act, const LinearOp& down,
                      PendingNorm& next, const LinearOp* next_ops, int next_count,
                      const KvRowStore* next_rows) override;
  using Backend::quantize_kv;  // the f32 overload
  void quantize_kv(const void* k_rows, const void* v_rows, DType row_dtype, int64_t row_stride,
                   int num_kv_heads, int head_dim, int64_t first_group, int n_groups,
                   const QuantizedKvPlanesOut& dst) override;
  // One launch for every layer (QS_FLUSH_LAYERS=0: one quantize_kv launch per layer).
  void quantize_kv_layers(const void* k_rows, const void* v_rows, DType row_dtype,
                          int64_t row_stride, int64_t layer_stride, int n_layers, int num_kv_heads,
                          int head_dim, int64_t first_group, int n_groups,
                          const QuantizedKvPlanesOut* dst) override;
  void fill_zero(void* dst, size_t bytes) override;
  // cuda::launch_snapkv_scores (snapkv.cu): f32 arithmetic, equal to the reference to rounding.
  void snapkv_scores(const float* q, int window, const void* k_rows, DType row_dtype,
                     int64_t row_stride, const AttentionShape& shape, int prompt_len, int past,
                     float* scores) override;

  // At or below this many rows matmul runs the bandwidth-bound skinny GEMM that reads the
  // weights once for all rows, and attention runs split-KV flash-decoding; above it, cuBLAS and
  // the flash-attention prefill kernel.
  static constexpr int kGemvMaxRows = 16;

  // The paths behind matmul and attention, callable directly so tests can check each at any m.
  void matmul_gemv(const float* x, int m, const WeightView& w, const WeightView* bias, float* y);
  void matmul_gemm(const float* x, int m, const WeightView& w, const WeightView* bias, float* y);
  // num_splits: 0 = the heuristic's choice (attention_num_splits), else forced (>= 1).
  void attention_decode(const float* q, int m, int pos, const AttentionShape& shape,
                        const KvView& kv, float* out, int num_splits = 0);
  void attention_prefill(const float* q, int m, int pos, const AttentionShape& shape,
                         const KvView& kv, float* out, int num_splits = 0);
  // m <= kGemvMaxRows queries over a view with a quantized segment: one call of the fused
  // decode kernels (attention_quant.cu).
  void attention_quant_slice(const float* q, int m, int pos, const AttentionShape& shape,
                             const KvView& kv, float* out);
  // m > kGemvMaxRows queries over a view with a quantized segment as the prefill attention
  // (QuantAttentionTuning::hybrid_prefill): the quantized positions the queries read are written
  // out as full-precision rows of the view's row type once per call (launch_dequantize_kv_rows),
  // after them the view's own rows, and the queries run in runs of one boundary b(t) (at most G
  // each; before each run the rows [b_prev, b) are replaced by their quantized view). A run of at
  // most kGemvMaxRows queries takes the quantized decode kernels.
  void attention_quantized_prefill(const float* q, int m, int pos, const AttentionShape& shape,
                                   const KvView& kv, float* out);

  // Waits for all queued work; aborts with the CUDA error if a kernel failed.
  void synchronize();
  // The cudaStream_t every op is queued on (for events and graph capture).
  void* stream() const;
  int num_sms() const;
  // Bytes of weights uploaded so far (4-bit draft weights included).
  size_t resident_weight_bytes() const;
  // Frees every uploaded weight copy (4-bit draft weights included). The upload cache is keyed
  // by the views' host addresses and assumes that host tensors neither change nor move while the
  // backend uses them; call this before freeing or reusing host memory that held weights (e.g.
  // when a model is unloaded).
  void release_weights();

 private:
  struct Impl;
  explicit CudaBackend(std::unique_ptr<Impl> impl);
  // matmul_group / gate_up_swiglu over x or, with pn (a deferred norm), over x = pn->h read as
  // norm(h) by the 4-bit persistent kernel; where no launch reads it that way, the norm is
  // materialized into pn->out first. With rows (ops: q, k, v) the q/k/v launch may also rotate
  // q and k and store the K/V rows (launch_gemv_qkv_rows with GemvTuning::qkv_rows; the draft's
  // 4-bit ones launch_gemv_q4_qkv_rows with Q4GemvTuning::qkv_rows): returns whether it did
  // (else the caller stores them).
  bool matmul_group_from(const float* x, int m, const LinearOp* ops, int count,
                         const PendingNorm* pn, const KvRowStore* rows = nullptr);
  // matmul_group_normed with rows as matmul_group_from takes them: returns whether the launch
  // stored them.
  bool matmul_group_normed_rows(const PendingNorm& pn, int m, const LinearOp* ops, int count,
                                const KvRowStore* rows);
  void gate_up_swiglu_from(const float* x, int m, const LinearOp& gate, const LinearOp& up,
                           float* out, const PendingNorm* pn);
  cuda::NormIn norm_in(const PendingNorm& pn);
  std::unique_ptr<Impl> impl_;
};

// How many KV splits a flash-decoding/prefill launch uses: enough blocks for about
// kTargetWavesBlocks per SM, each split at least kMinSplitLen positions, at most max_splits.
// `base_blocks` = blocks of the launch without splitting. Pure, so it is unit-tested.
int attention_num_splits(int64_t kv_len, int64_t base_blocks, int num_sms, int max_splits);
// For a kernel that keeps a fixed number of blocks resident per SM (`slots` = SMs x that number):
// as many splits as fit one wave of slots (rounded down: a second, nearly empty wave would cost a
// whole pass), each at least kMinSplitLen positions, at most max_splits, at least 1.
int attention_num_splits_one_wave(int64_t kv_len, int64_t base_blocks, int64_t slots,
                                  int max_splits);

}  // namespace qs
