// Launchers of the quantized-format kernels of the CUDA backend (internal header, like
// cuda_ops.h): the hierarchical KV quantizer (kv_quantize.cu) and the 4-bit draft-weight GEMV
// (gemv_q4.cu). All pointers are device pointers unless named *_host; every launch is queued on
// `stream`. docs/cuda.md describes the kernels.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <unordered_map>

#include "backend/backend.h"
#include "backend/cuda/cuda_ops.h"
#include "quant/weight_quant.h"

namespace qs::cuda {

// ---- kv_quantize.cu -------------------------------------------------------------------------

// Backend::quantize_kv on the device: key groups [first_group, first_group + n_groups) of every
// kv head of one layer into `dst` (device arrays, the layout of docs/kv-format.md). k_rows,
// v_rows: [n_groups * G, row_stride] of row_dtype (F32, or F16 converted exactly on load;
// row_stride in elements). Codes and fp16 metadata are bit-identical to quant/kv_quant.h on the
// rows as f32 (same operation order, IEEE division, round-half-to-even, directed fp16 rounding of
// min/scale, first-wins min/max as the CPU's sequential scan). Supported: head_dim
// 32/64/128/256, G a power of two in [8, 256], Gv a power of two >= 8 dividing head_dim
// (QS_CHECK otherwise). n_groups == 0 launches nothing.
void launch_quantize_kv(const void* k_rows, const void* v_rows, DType row_dtype, int64_t row_stride,
                        int num_kv_heads, int head_dim, int64_t first_group, int n_groups,
                        const QuantizedKvPlanesOut& dst, cudaStream_t stream);
// launch_quantize_kv for n_layers layers in one launch (Backend::quantize_kv_layers): layer l's
// rows at k_rows / v_rows + l * layer_stride elements, its planes dst[l]. Returns false, launching
// nothing, unless the planes of every layer are dst[0]'s arrays at one stride per array kind
// (QuantizedPlanes' layout) and kv heads x layers <= 65535; the same bits as one call per layer.
bool launch_quantize_kv_layers(const void* k_rows, const void* v_rows, DType row_dtype,
                               int64_t row_stride, int64_t layer_stride, int n_layers,
                               int num_kv_heads, int head_dim, int64_t first_group, int n_groups,
                               const QuantizedKvPlanesOut* dst, cudaStream_t stream);

// The quantized view of positions [t0, t1) of one layer's segment (seg.int8: the INT8 view, else
// the INT4 one) written out as full-precision rows: row t of every kv head at k_rows / v_rows +
// t * row_stride elements (the buffer's [position][kv_dim] layout), F32 (the view's values
// exactly: docs/kv-format.md's x8 / x4) or F16 (those values rounded to nearest even,
// saturating). For the prefill attention over a quantized history (CudaBackend::attention).
void launch_dequantize_kv_rows(const QuantizedKvSegment& seg, int num_kv_heads, int head_dim,
                               int t0, int t1, DType row_dtype, void* k_rows, void* v_rows,
                               int64_t row_stride, cudaStream_t stream);

// ---- gemv_q4.cu -----------------------------------------------------------------------------

// Columns per group of the tiled (fast) layout; weights with another group size keep the
// reference layout and run a plain kernel.
constexpr int kQ4TiledGroup = 128;

// A QuantizedWeight4 resident on the device. Tiled layout (group_size == 128), repacked at
// upload for the tensor-core GEMV (gemv_q4.cu explains the order):
//   codes: [row_tiles][groups][2 pieces][32 lanes] 16-byte pieces (1024 bytes per 16 rows x 128
//          columns); rows past `rows` and columns past `cols` hold code 0;
//   meta:  [row_tiles][groups][8] 8-byte entries: entry g = half2 (scale, min) of the tile's
//          row g, then half2 (scale, min) of its row g + 8 (zeros past `rows`).
// Reference layout (any other group size): the QuantizedWeight4 arrays copied as they are:
//   codes [rows, row_bytes], scale and min [rows, groups] fp16 (scale then min in `meta`).
struct DeviceWeight4 {
  const uint8_t* codes = nullptr;
  const uint16_t* meta = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int group_size = 0;
  int64_t groups = 0;     // ceil(cols / group_size)
  int64_t row_bytes = 0;  // reference layout: bytes per row of codes
  bool tiled = false;
  size_t bytes = 0;  // device bytes held (codes + meta)
};

// Upload cache of QuantizedWeight4s, keyed by the host address of their codes (stable while the
// weight lives, also across moves of the struct). Like the WeightView cache of cuda_backend.cu it
// assumes host weights neither change nor move while cached: release() before freeing them.
class Weight4Cache {
 public:
  Weight4Cache() = default;
  Weight4Cache(const Weight4Cache&) = delete;
  Weight4Cache& operator=(const Weight4Cache&) = delete;
  ~Weight4Cache();

  // The device copy of `w`: uploaded (and repacked) on first use, queued on `stream`.
  // A cached entry whose shape no longer matches is replaced (the host memory was reused).
  const DeviceWeight4& resolve(const QuantizedWeight4& w, cudaStream_t stream);
  // Frees every device copy (waits for `stream` first).
  void release(cudaStream_t stream);
  // Frees the device copy of `w`, if any (the caller has waited for the ops that read it).
  void forget(const QuantizedWeight4& w);
  size_t bytes() const { return bytes_; }

 private:
  std::unordered_map<const void*, DeviceWeight4> map_;
  size_t bytes_ = 0;
};

// y = x W4^T (+ bias) for 1 <= m <= 16 rows; x: [m, w.cols] f32, y: [m, w.rows] f32, y must not
// alias x. Tiled weights: a CUDA-core GEMV (few rows) or a tensor-core skinny GEMM (two
// variants), all reading every weight byte once for all rows; reference layout: a plain FMA
// kernel.
void launch_gemv_q4(const float* x, int m, const DeviceWeight4& w, const DeviceBias& bias, float* y,
                    int num_sms, cudaStream_t stream);
// launch_gemv_q4 with the fused residual add + RMSNorm (GemvNorm, cuda_ops.h) when the
// persistent kernel runs these operands (m = 1, tiled weights that fit its shared memory) and
// returns true; otherwise launches nothing and returns false.
bool launch_gemv_q4_norm(const float* x, int m, const DeviceWeight4& w, const DeviceBias& bias,
                         const GemvNorm& norm, int num_sms, cudaStream_t stream);
// launch_gemv_swiglu (cuda_ops.h) for the draft's 4-bit gate and up (m = 1, the persistent
// kernel): out = silu(x Wg^T + bg) * (x Wu^T + bu), as launch_gemv_q4_group then launch_swiglu
// compute it. Returns false, launching nothing, where that kernel does not run them.
bool launch_gemv_q4_swiglu(const float* x, int m, const DeviceWeight4& gate,
                           const DeviceWeight4& up, const DeviceBias& gate_bias,
                           const DeviceBias& up_bias, float* out, int num_sms, cudaStream_t stream,
                           const NormIn& nin = NormIn{});
// launch_gemv_q4_group with its input read as norm(h) (x = h, `nin` set; m = 1, the persistent
// kernel). Returns false, launching nothing, where that kernel does not run these operands.
bool launch_gemv_q4_group_normed(const float* h, int m, const DeviceWeight4* const* ws,
                                 const DeviceBias* biases, float* const* ys, int count,
                                 const NormIn& nin, int num_sms, cudaStream_t stream);
// A draft layer's q, k and v (ws[0..2], tiled, heads of rows.head_dim rows, head_dim % 32 == 0)
// at one row from a deferred norm, as launch_gemv_q4_group_normed computes them, then q and k
// rotated and the K/V rows stored as launch_rope_qk_store_kv does, in one launch of kernel 10
// (its pairs join the two halves of a head's rotations). The same bits as those two launches.
// Returns false (nothing launched) unless Q4GemvTuning::qkv_rows is set, kernel 10 is the one
// chosen and it runs these operands.
bool launch_gemv_q4_qkv_rows(const float* h, const DeviceWeight4* const* ws,
                             const DeviceBias* biases, float* const* ys, const NormIn& nin,
                             const KvRowEpilogue& rows, int num_sms, cudaStream_t stream);
// Its launches so far in this process (tests check that a call took it).
uint64_t gemv_q4_qkv_rows_launches();

// Up to kMaxGemvSegments (cuda_ops.h) tiled matrices with the same cols and groups in one
// launch of the CUDA-core kernel (q/k/v, gate/up of the draft): y_i = x W_i^T + b_i. Supported
// when launch_gemv_q4 itself would run that kernel for m rows; otherwise one call per matrix.
bool gemv_q4_group_supported(int m, const DeviceWeight4* const* ws, int count);
void launch_gemv_q4_group(const float* x, int m, const DeviceWeight4* const* ws,
                          const DeviceBias* biases, float* const* ys, int count, int num_sms,
                          cudaStream_t stream);

// Process-wide tuning of launch_gemv_q4's tiled kernel (benchmarks compare the variants; every
// variant computes the same function and is tested). 0 = automatic.
struct Q4GemvTuning {
  // 16-row tiles per warp (tensor cores; 4 only for m <= 8) or per block (CUDA cores; 4 only
  // for m <= 2): 1, 2 or 4.
  int row_tiles = 0;
  int warps = 0;      // warps per block splitting K: 1..8
  // How the codes reach the registers: 0 = automatic (registers for the tensor-core kernels;
  // for the CUDA-core kernel see kQ4RingMinGroups); 1 = loaded into registers (tensor cores:
  // the next group while the current one is computed; CUDA cores: a batch of groups at a time);
  // 4 = a 4-group cp.async ring per warp in shared memory (3 groups ahead, no registers held; the
  // wide kernel ignores it).
  int stages = 0;
  // Which kernel: 0 = automatic (kQ4AutoKernel), 1 = tensor cores (the fields above), 2 = CUDA
  // cores for m <= 8 (tensor cores above; `warps` and row_tiles apply, stages does not),
  // 3 = the wide tensor-core kernel (16 loads in flight per lane; row_tiles and warps apply,
  // stages does not), 4 = CUDA cores for m <= kQ4CudaCoreAutoRows, tensor cores (1) above,
  // 5 = as 4 but m = 1 on the persistent tensor-core kernel (a block per SM, the activation's
  // fragments in shared memory, a cp.async ring per warp across tiles; no field applies),
  // 6 = as 5 with two MMA accumulator chains per warp, 7 = as 6 with the codes converted by one
  // instruction per pair (biased by 128, corrected per group), 8 = as 6 with the codes as f16
  // subnormals (no shift for half the nibbles) and the activation's hi and lo parts as two token
  // columns of one MMA (half the MMAs; the automatic choice), 9 = as 8 with one chain,
  // 10 = as 8 with two tiles per ring stage (each activation load feeds both tiles' MMAs, one
  // block barrier per two tiles; the same bits as 8).
  int kernel = 0;
  // The draft's q/k/v launch also rotates q and k and stores the K/V rows
  // (launch_gemv_q4_qkv_rows; CudaBackend::output_and_mlp). On
  // since session 45 (H100, the QuantSpec draft step: Llama-3.1-8B -1.5% at 32K, -1.9% at 128K;
  // Llama-2-7B -0.4% at 32K, -0.0 to -0.2% at 128K); QS_Q4_QKV_ROWS=0 launches the RoPE + store
  // apart.
  bool qkv_rows = true;
};
// The kernel that Q4GemvTuning::kernel = 0 runs (1..9 above), chosen from the H200 bench
// (docs/perf.md): the persistent kernel for m = 1, CUDA cores for m <= 4, tensor cores above.
// bench_ops w4layer (m = 1, us, CUDA-core default -> persistent): 7B q/k/v 16.4 -> 14.7, o 6.8
// -> 6.9, gate/up 29.1 -> 23.3, down 14.1 -> 13.5, lm_head 36.2 -> 32.6; 8B lm_head 131.5 ->
// 117.1; Llama-2-7B draft step at 32K 5.05 -> 4.59 ms. Two accumulator chains (6) then took
// 2-4% more off every launch (7B gate/up 23.3 -> 22.4, 8B lm_head 117.8 -> 113.7). The wide kernel
// (3) measured slower (7B gate/up m=1 22.9 us vs 18.0; 8B lm_head 150 vs 125-166 us) and made the
// draft step of the padded 7B shape 9.1 ms instead of 6.1 ms. Kernel 7 (one lop3 per code pair)
// took 1-3% more off every launch (session 18: 7B gate/up 22.3 -> 21.8, lm_head 31.4 -> 30.4; 8B
// lm_head 111.9 -> 108.7; Llama-2-7B 128K draft step 8.75 -> 8.69 ms) at a larger but bounded
// rounding error (persistent-kernel test 1.3e-5 against 2.9e-6, bound 2e-5). Kernel 8 (subnormal
// codes, hi / lo as token columns: half the MMAs) took 11-24% off every launch (session 22:
// 7B q/k/v 13.7 -> 11.5, gate/up 21.5 -> 17.4, down 12.9 -> 11.0, lm_head 30.0 -> 23.8; 8B lm_head
// 106.4 -> 81.5, 81% of 4.24 TB/s; Llama-2-7B 4K draft step 3.07 -> 2.76 ms); one chain (9) is
// 2-7% slower than two. Kernel 10 (two tiles per ring stage) then took 8-24% off every launch
// (session 36, H200, bench_ops w4layer: 7B q/k/v 11.9 -> 9.7 us, gate/up 18.5 -> 15.4, down 10.2
// -> 9.4, lm_head 25.1 -> 20.1; 8B gate/up 23.1 -> 18.3, lm_head 89.3 -> 69.4, 95% of 4.24 TB/s;
// one layer's 4-bit GEMVs as one launch 36.6 -> 29.3 us, 69% -> 87%), and the draft step at 32K
// 3.497 -> 3.320 ms (Llama-2-7B) and 2.996 -> 2.688 ms (Llama-3.1-8B).
constexpr int kQ4AutoKernel = 10;
// The pair kernel (Q4GemvTuning::kernel 10: two tiles per ring stage).
constexpr int kQ4PairKernel = 10;
// The highest Q4GemvTuning::kernel (the tuning check, QS_Q4_KERNEL and the persistent kernels'
// range read it; the persistent kernels are 5..kQ4LastKernel).
constexpr int kQ4LastKernel = kQ4PairKernel;
// Rows of x up to which kernel 4 is the CUDA-core kernel.
constexpr int kQ4CudaCoreAutoRows = 4;
// Q4GemvTuning::stages of the CUDA-core kernel when it is 0: the ring (4) for long rows (at least
// kQ4RingMinGroups groups) or many rows in one launch (at least kQ4RingMinRows), registers (1)
// otherwise. H200, one draft layer's launches (bench_ops w4layer, m = 1, us registers / ring):
// 7B down 16.7 / 14.3, lm_head 38.2 / 35.9, gate/up 29.1 / 28.6, q/k/v 16.4 / 22.5, o 6.8 / 7.5;
// 8B gate/up 34.1 / 32.1, down 20.7 / 17.8, lm_head 137.9 / 130.7, q/k/v 10.1 / 11.7.
constexpr int kQ4RingMinGroups = 64;
constexpr int64_t kQ4RingMinRows = 24576;
void set_q4_gemv_tuning(const Q4GemvTuning& tuning);
Q4GemvTuning q4_gemv_tuning();

}  // namespace qs::cuda
