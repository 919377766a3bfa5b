// Launchers of the CUDA kernels (one .cu file per op family: kernels first, then launchers).
// A launcher owns the grid math, checks its preconditions (QS_CHECK) and checks the launch.
// All pointers are device pointers unless named *_host; every launch is queued on `stream`.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace qs::cuda {

// A weight matrix resident in device memory, row-major {rows, cols}, in its file dtype.
struct DeviceMatrix {
  const void* data = nullptr;  // [rows, cols] F32/F16/BF16
  DType dtype = DType::F32;
  int64_t rows = 0;
  int64_t cols = 0;
};

// An optional per-output-column vector added to a result (a linear layer's bias).
struct DeviceBias {
  const void* data = nullptr;  // [n] F32/F16/BF16, or nullptr for none
  DType dtype = DType::F32;
};

// ---- elementwise.cu -------------------------------------------------------------------------

// Token ids passed by value in the kernel's parameters: a decode step needs no host-to-device
// copy (and stays capturable in a CUDA graph).
constexpr int kMaxInlineIds = 64;
struct InlineIds {
  int32_t ids[kMaxInlineIds];
};

// out[i, :] = f32(table[ids[i], :]); ids from `ids_device` [m] when not null, else inline.
void launch_embedding(const DeviceMatrix& table, const int32_t* ids_device,
                      const InlineIds& inline_ids, int m, float* out, cudaStream_t stream);

// out[i, :] = x[i, :] / sqrt(mean(x[i, :]^2) + eps) * weight; x, out: [m, d]; out may alias x.
void launch_rmsnorm(const float* x, const void* weight, DType weight_dtype, int64_t d, int m,
                    float eps, float* out, cudaStream_t stream);
// h += x over [m, d], then out = rmsnorm(h) as launch_rmsnorm computes it (Backend::add_rmsnorm),
// one block per row: the same bits as launch_add followed by launch_rmsnorm. out aliases neither
// h nor x.
void launch_add_rmsnorm(float* h, const float* x, const void* weight, DType weight_dtype, int64_t d,
                        int m, float eps, float* out, cudaStream_t stream);

// RoPE inverse frequencies by value (head_dim <= 2 * kMaxRopePairs).
constexpr int kMaxRopePairs = 128;
struct RopeFreqs {
  float inv_freq[kMaxRopePairs];  // [head_dim / 2]
};
// The RoPE and K/V row store of a q/k/v launch's epilogue (launch_gemv_qkv_rows): q and k
// rotated for position pos, the rotated k rows and the v rows stored at k_dst / v_dst (f16 or
// f32), as launch_rope_qk_store_kv does after the q/k/v launch. k_dst null: none.
struct KvRowEpilogue {
  RopeFreqs freqs{};
  int pos = 0;
  int head_dim = 0;
  void* k_dst = nullptr;
  void* v_dst = nullptr;
  int f16 = 0;  // the rows' dtype: 1 f16, 0 f32
};
// x: [m, num_heads * head_dim] rotated in place for positions [pos, pos + m), HF rotate_half.
void launch_rope(float* x, int m, int num_heads, int head_dim, int pos, const RopeFreqs& freqs,
                 cudaStream_t stream);
// launch_rope of q ([m, num_heads * head_dim]) and of k ([m, num_kv_heads * head_dim]) as one
// grid (Backend::rope_qk): the same bits as the two launches.
void launch_rope_qk(float* q, float* k, int m, int num_heads, int num_kv_heads, int head_dim,
                    int pos, const RopeFreqs& freqs, cudaStream_t stream);
// launch_rope_qk, then k's rows and v's ([m, num_kv_heads * head_dim] each) stored at k_dst /
// v_dst as f16 (launch_store_f16's rounding) or f32, in one grid (Backend::rope_qk_store_kv): the
// same bits as the separate launches. k keeps the rotated keys. No two of q, k, v, k_dst, v_dst
// may overlap.
void launch_rope_qk_store_kv(float* q, float* k, const float* v, int m, int num_heads,
                             int num_kv_heads, int head_dim, int pos, const RopeFreqs& freqs,
                             void* k_dst, void* v_dst, bool f16, cudaStream_t stream);

// out = silu(gate) * up over n floats; out may alias gate or up.
void launch_swiglu(const float* gate, const float* up, int64_t n, float* out, cudaStream_t stream);

// y += x over n floats.
void launch_add(float* y, const float* x, int64_t n, cudaStream_t stream);

// y[i, :] += bias over m rows of n floats.
void launch_add_bias_rows(float* y, int m, int64_t n, const DeviceBias& bias, cudaStream_t stream);

// x (f32, count values) -> hi = round(x) and lo = round(x - hi) in `dtype` (F16 or BF16), so
// hi + lo carries about 16 (bf16) or 22 (f16) significant bits of x. lo may be null (hi only).
void launch_split_activations(const float* x, int64_t count, DType dtype, void* hi, void* lo,
                              cudaStream_t stream);

// dst[i] = f16(src[i]) for n values (Backend::store_kv_rows with F16 rows): round to nearest
// even, finite values beyond +-65504 saturate to +-65504 (core/dtype.h f32_to_f16_sat); inf and
// NaN stay inf and NaN. src must not overlap dst.
void launch_store_f16(const float* src, int64_t n, void* dst, cudaStream_t stream);
// launch_store_f16(k, n, k_dst) and launch_store_f16(v, n, v_dst) as one launch
// (Backend::store_kv_row_pair with F16 rows): four values per thread when both pairs are aligned
// (16-byte sources, 8-byte destinations, n % 4 == 0), else one. No two ranges may overlap.
void launch_store_f16_pair(const float* k, const float* v, int64_t n, void* k_dst, void* v_dst,
                           cudaStream_t stream);

// out[r] = the argmax of row r of x ([rows, n] f32; Backend::argmax_rows' order: the lowest
// index among ties, NaN never wins, 0 for a NaN at index 0). out: device memory, rows ints.
void launch_argmax_rows(const float* x, int rows, int n, int32_t* out, cudaStream_t stream);

// ---- sampling.cu -----------------------------------------------------------------------------

// Backend::sample_rows / speculative_verdict on the GPU (core/sampling.h's rule; by value in the
// kernel parameters: the processing and up to kMaxSampleRows + 1 uniforms, ~2.1 KB of the 4 KB a
// launch may pass). 256: the largest key group G (quantized_planes.cpp), so every round
// (gamma <= G - 1) fits one launch.
constexpr int kMaxSampleRows = 256;
struct SampleSpec {
  float temperature, top_p, min_p;
  int top_k;
};
struct SampleDraws {
  double u[kMaxSampleRows + 1];
};
// probs[r, :] = token_probabilities(logits row r, n, spec) for r < rows <= kMaxSampleRows
// (device memory, [rows, n]); tokens (device, [rows], may be null: no draws) = sample_at(probs
// row r, draws.u[r]).
void launch_sample_rows(const float* logits, int rows, int n, const SampleSpec& spec,
                        const SampleDraws& draws, float* probs, int32_t* tokens,
                        cudaStream_t stream);
// speculative_verdict(p, q, gamma, n, candidates, draws.u, residual) with p [gamma + 1, n] from
// launch_sample_rows, q [gamma, n] and candidates [gamma]: out[0] = accepted, out[1] = token (all
// device memory).
void launch_speculative_verdict(const float* p, float* q, int gamma, int n,
                                const int32_t* candidates, const SampleDraws& draws, bool residual,
                                int32_t* out, cudaStream_t stream);

// ---- gemv.cu --------------------------------------------------------------------------------

// Programmatic dependent launch of every kernel (launch.cuh): on by default, QS_CUDA_PDL=0 in the
// environment turns it off; benchmarks and tests switch it per process.
bool pdl_enabled();
void set_pdl_enabled(bool on);

#ifdef QS_KERNEL_TRACE
// launch.cuh's trace buffer: each translation unit registers the setter of its device pointer.
void register_trace_setter(void (*set)(unsigned long long* buffer));
#endif

// y = x W^T + bias for m <= 16 rows; x: [m, w.cols] f32, y: [m, w.rows] f32. Reads W once
// for all rows: tensor cores on split activations for F16/BF16 weights with cols % 8 == 0 and
// 16-byte aligned x and W; plain FMA loops otherwise (F32 weights, odd shapes).
void launch_gemv(const float* x, int m, const DeviceMatrix& w, const DeviceBias& bias, float* y,
                 int num_sms, cudaStream_t stream);
// Several matrices with the same cols read by one launch (q/k/v, gate/up): y_i = x W_i^T + b_i.
// One grid covers every matrix, so there is one launch ramp and tail instead of one per matrix.
constexpr int kMaxGemvSegments = 3;
struct GemvSegment {
  DeviceMatrix w;
  DeviceBias bias;
  float* y = nullptr;
};
// Whether launch_gemv_group takes these matrices (same F16/BF16 dtype and cols, the tensor-core
// path for each, 1..kMaxGemvSegments of them); otherwise call launch_gemv per matrix.
bool gemv_group_supported(const float* x, int m, const GemvSegment* segs, int count);
void launch_gemv_group(const float* x, int m, const GemvSegment* segs, int count, int num_sms,
                       cudaStream_t stream);

// A GEMV's output added into the residual stream and normalized (Backend::linear_add_rmsnorm):
// h += y over [m, d] (d = the matrix's rows), then out = rmsnorm(h) with `weight`, as
// launch_add_rmsnorm computes it, in the GEMV's own launch (gemv_norm.cuh: the last block to
// finish normalizes). y is not stored. arrivals: a device counter, zero before the launch and
// left zero after it (one per stream: launches that use it must not overlap).
struct GemvNorm {
  float* h = nullptr;  // null: a plain GEMV
  const void* weight = nullptr;
  DType weight_dtype = DType::F32;
  float eps = 0.0f;
  float* out = nullptr;  // aliases neither h nor x
  unsigned* arrivals = nullptr;
  int m = 0;
  int64_t d = 0;
  // Deferred (m = 1: the 4-bit persistent kernel, the bf16 / f16 ring kernel; out and arrivals
  // unused): h += y as above, and each block's sum of the squares of the h values it wrote goes
  // to sumsq[block] (slots past the grid zeroed), for the next launch to normalize its input on
  // load (NormIn).
  double* sumsq = nullptr;
  int parts = 0;  // sumsq's slots, >= the grid
};

// A GEMV input read as norm(h) (the deferred norm above, m = 1): the launch's x is h, the
// producer's partial sums of squares are in sumsq[0, parts), the norm's weight and eps as
// rmsnorm's. Each block stages h * weight and multiplies every output's sum by 1 / rms.
struct NormIn {
  const double* sumsq = nullptr;  // null: x as given
  int parts = 0;
  const void* weight = nullptr;
  DType weight_dtype = DType::F32;
  float eps = 0.0f;
};
// launch_gemv with `norm` when the persistent ring kernel runs these operands (F16/BF16 W on the
// tensor-core path, m <= 16, the ring enabled) and returns true; otherwise launches nothing and
// returns false (the caller runs launch_gemv and launch_add_rmsnorm).
bool launch_gemv_norm(const float* x, int m, const DeviceMatrix& w, const DeviceBias& bias,
                      const GemvNorm& norm, int num_sms, cudaStream_t stream);

// The gate and up projections and their SwiGLU (Backend::gate_up_swiglu): gate.y = silu(x
// Wg^T + bg) * (x Wu^T + bu), as launch_gemv_group followed by launch_swiglu computes it, in one
// launch of the persistent ring kernel (each block takes a gate tile, then the same rows' up
// tile, and stores their SwiGLU; up.y is not written). Returns false, launching nothing, where
// that kernel does not run these operands (gate and up of the same shape and dtype required).
// nin (m = 1): x is a deferred norm's h (NormIn); false where the ring kernel cannot read it.
bool launch_gemv_swiglu(const float* x, int m, const GemvSegment& gate, const GemvSegment& up,
                        int num_sms, cudaStream_t stream, const NormIn& nin = {});

// A layer's q, k and v (segs[0..2], heads of rows.head_dim rows, head_dim % 16 == 0) at one row
// as launch_gemv_group computes them, then q and k rotated and the K/V rows stored as
// launch_rope_qk_store_kv does, in one launch of the ring kernel (q and k on tiles that hold both
// halves of 8 rotations). The same bits as those two launches. Returns false (nothing launched)
// unless GemvTuning::qkv_rows is set (the default) and the ring kernel runs these operands.
bool launch_gemv_qkv_rows(const float* x, const GemvSegment* segs, const KvRowEpilogue& rows,
                          int num_sms, cudaStream_t stream, const NormIn& nin = {});
// Its launches so far in this process (tests check that a call took it).
uint64_t gemv_qkv_rows_launches();
// The bf16 / f16 ring launches so far that read a deferred norm's input (tests).
uint64_t gemv_norm_in_launches();

// Tuning of launch_gemv, process-wide (benchmarks and tests compare the variants; every
// variant computes the same function and is tested).
// Defaults: the fastest measured on the H200 (docs/perf.md).
struct GemvTuning {
  // 32-wide K chunks whose W loads a lane keeps in flight: 4 or 8; 0 = 8 for grids of more
  // than ~32 blocks per SM (LM heads), else 4.
  int mma_unroll = 0;
  bool l2_prefetch = true;     // W loads ask L2 for the whole 256-byte segment
  int coalesced_max_rows = 0;  // m <= this (<= 4) runs the coalesced FMA kernel; 0 = never
  // The persistent ring kernel (a block per SM, each warp streaming whole W lines through a
  // cp.async ring of 4 or 6 stages; 0 = automatic, kRingDeepTilesPerSm in gemv.cu) or, for -1,
  // gemv_mma_kernel (a block per 16 rows; mma_unroll applies to it only).
  int ring_stages = 0;
  // A gate / up launch with its SwiGLU on the ring kernel: tiles of 8 gate + the 8 up rows of the
  // same index (gemv.cu, MIXED) instead of a gate tile paired with its up tile. On since session
  // 34 (Llama-2-7B at 32K: AR fp16 -1.2%, verification -3.0%); QS_SWIGLU_MIXED=0 pairs the tiles.
  bool swiglu_mixed = true;
  // A layer's q/k/v launch at m = 1 also rotates q and k and stores the K/V rows
  // (launch_gemv_qkv_rows; CudaBackend::output_and_mlp). On since session 44 (H100, AR fp16 at
  // 32K: Llama-2-7B -0.6%, Llama-3.1-8B -1.0%); QS_QKV_ROWS=0 launches the RoPE + store apart.
  bool qkv_rows = true;
  // A bf16 / f16 layer's norms at m = 1 deferred as the 4-bit draft's are (CudaBackend::
  // linear_add_rmsnorm_deferred): o and down leave their blocks' sums of squares instead of the
  // last block normalizing (gemv_norm_finish), and gate / up and the next q/k/v (with its rows)
  // normalize their input on load (ring_walk's NIN). On since session 49 (H100, 32K, one run per
  // arm: Llama-2-7B AR fp16 -2.3%, AR INT8 -5.3%; Llama-3.1-8B -3.5%, -5.4%);
  // QS_DENSE_DEFER_NORM=0 has the last blocks normalize.
  bool defer_norm = true;
};
void set_gemv_tuning(const GemvTuning& tuning);
GemvTuning gemv_tuning();

// The FMA path alone, for any m (tests; the fallback above).
void launch_gemv_simt(const float* x, int m, const DeviceMatrix& w, const DeviceBias& bias,
                      float* y, cudaStream_t stream);
// Whether launch_gemv takes the tensor-core path for these operands.
bool gemv_uses_tensor_cores(const float* x, const DeviceMatrix& w);

// ---- attention.cu ---------------------------------------------------------------------------

// One attention call (backend.h semantics) as the kernels see it. Query vector qi = row *
// num_heads + head; its output is out[qi * head_dim, +head_dim). K/V rows are f32 or f16
// (kv_dtype); the kernels convert f16 to f32 on load and compute in f32.
struct AttentionArgs {
  const float* q = nullptr;     // [m, num_heads * head_dim] f32
  const void* k = nullptr;      // [>= pos + m, row_stride] kv_dtype, post-RoPE; kv head h at
                                // h * head_dim
  const void* v = nullptr;      // [>= pos + m, row_stride] kv_dtype
  DType kv_dtype = DType::F32;  // of k and v: F32 or F16
  float* out = nullptr;         // [m, num_heads * head_dim] f32
  float* partial_o = nullptr;   // [num_splits, m * num_heads, head_dim] f32, unnormalized
  float* partial_ml = nullptr;  // [num_splits, m * num_heads, 2] f32: max score (log2 units), sum
  int64_t row_stride = 0;       // elements (of kv_dtype) between consecutive positions
  int m = 0;
  int pos = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  float scale_log2 = 0.0f;  // softmax scale * log2(e): scores are kept in base-2 units
  int num_splits = 1;       // > 1: write partials, then launch_attention_combine
  int split_len = 0;        // positions per split (of the selection's sequence when selected)
  // A sparse-KV draft's selection (backend.h KvSelection, decode kernel only): kv head h reads
  // positions sel_positions[h * sel_count + i], i < sel_count, then [sel_dense_from, pos + m).
  bool selected = false;                   // false: every position
  const int32_t* sel_positions = nullptr;  // device memory, [num_kv_heads, sel_count]
  int sel_count = 0;
  int sel_dense_from = 0;
  // Positions a query row's kv head sequence holds (the split range).
  __host__ __device__ int seq_len() const {
    return selected ? sel_count + (pos + m - sel_dense_from) : pos + m;
  }
};

bool attention_head_dim_supported(int head_dim);

// Flash-decoding for m <= 16 query rows: a block per (query tile, KV split, kv head) holds all
// query heads of one kv head, so each K/V row is read once per tile.
void launch_attention_decode(const AttentionArgs& a, cudaStream_t stream);
// Query tiles of the decode kernel for this call (the grid's x).
int attention_decode_query_tiles(const AttentionArgs& a);

// Flash-attention prefill: a block per (tile of query rows, query head, KV split).
void launch_attention_prefill(const AttentionArgs& a, cudaStream_t stream);
int attention_prefill_query_tiles(const AttentionArgs& a);

// Merges the num_splits partial states of every query vector into out.
void launch_attention_combine(const AttentionArgs& a, cudaStream_t stream);

// ---- snapkv.cu ------------------------------------------------------------------------------

// One Backend::snapkv_scores call (backend.h semantics) as the kernels see it.
struct SnapKvScoresArgs {
  const float* q = nullptr;    // [window, num_heads * head_dim] f32, post-RoPE; 16-byte aligned
  const void* k = nullptr;     // [prompt_len, row_stride] of k_dtype, post-RoPE; kv head h at
                               // h * head_dim; aligned to 4 elements
  DType k_dtype = DType::F32;  // F32 or F16
  int64_t row_stride = 0;      // elements between consecutive positions (a multiple of 4)
  float* scores = nullptr;     // [num_kv_heads, past] f32
  int window = 0;              // observation queries: positions [prompt_len - window, prompt_len)
  int prompt_len = 0;
  int past = 0;  // candidates [0, past)
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;  // 32, 64, 128 or 256
  float scale = 0.0f;
};

// Device scratch launch_snapkv_scores needs for `a` (the softmax partials of every query vector).
size_t snapkv_scores_scratch_bytes(const SnapKvScoresArgs& a);
// Three kernels (snapkv.cu): per-chunk softmax partials, their merge per query vector, the
// scores. f32 arithmetic (expf); the sums in a fixed order, so the results are deterministic.
// past == 0 launches nothing.
void launch_snapkv_scores(const SnapKvScoresArgs& a, void* scratch, cudaStream_t stream);

}  // namespace qs::cuda
