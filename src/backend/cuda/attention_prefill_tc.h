// Tensor-core flash-attention prefill (attention_prefill_tc.cu): the same function as
// launch_attention_prefill (cuda_ops.h) for head_dim 64 and 128, on mma.sync m16n8k16 with f16
// hi + lo operand halves and f32 accumulation (about f32 accuracy).
//
// Two launches per call: a conversion pass turns the K/V rows [0, pos + m) (f32, or f16 read as
// f32) into f16 hi/lo planes in 64-key tiles, each tile scaled by its own power of two
// (caller-provided scratch), and the attention kernel streams those tiles through shared memory.
// Query tiles, splits and the partial-state format are the old kernel's (AttentionArgs), so
// launch_attention_combine merges split partials unchanged.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "backend/cuda/cuda_ops.h"

namespace qs::cuda {

// Process-wide choice between this kernel and the f32 CUDA-core prefill kernel (tests and
// benchmarks compare both; both compute the same function and are tested).
struct PrefillAttentionTuning {
  bool tensor_cores = true;  // false: attention_prefill_kernel (attention.cu) for every shape
  // Over f16 rows, read the rows themselves instead of converted planes: no conversion pass
  // (whose traffic grows with context^2 / chunk over a prompt), no scratch (4 GiB for Llama-2-7B
  // at 128K), and the exact path drops the products with the rows' lo halves (zeros): two MMAs
  // per product instead of three. The same results; measured faster (session 16: exact 1.43x,
  // fast 1.17x at 128K). Default; QS_PREFILL_DIRECT=0 turns it off (A/B runs).
  bool direct_f16 = true;
  // On the direct path, the Hopper wgmma kernel (attention_prefill_wgmma.h) where it is available
  // (an sm_90a build on an sm_90 device) and supports the call (head_dim 64/128); elsewhere the
  // mma.sync kernel. Same results to f32 rounding (tests), measured 1.6-1.9x faster (session 17:
  // fast 452 vs 239 TFLOP/s at 128K). Default; QS_PREFILL_WGMMA=0 turns it off (A/B runs).
  bool wgmma = true;
  // The wgmma kernel's warp-specialized variant on the fast path (a TMA producer warpgroup and
  // mbarriers per slot instead of every thread's cp.async and a block barrier per tile; the same
  // results bit for bit), measured 1.10-1.12x faster (session 20: 580 vs 519 TFLOP/s at 128K).
  // Default; QS_PREFILL_WS=0 turns it off (A/B runs).
  bool wgmma_ws = true;
};
void set_prefill_attention_tuning(const PrefillAttentionTuning& tuning);
PrefillAttentionTuning prefill_attention_tuning();

// Whether launch_attention_prefill_tc handles this call (head_dim 64 or 128).
bool attention_prefill_tc_supported(const AttentionArgs& a);
// Query tiles of the tensor-core kernel (the grid's x): 128 query rows each.
int attention_prefill_tc_query_tiles(const AttentionArgs& a);
// Device scratch launch_attention_prefill_tc needs: K/V hi/lo planes of keys [0, pos + m) (as
// many bytes as f32 K and V rows, whatever the row type) plus one exponent pair per tile; 0 where
// the direct path runs (direct_f16 with f16 rows).
size_t attention_prefill_tc_scratch_bytes(const AttentionArgs& a);
// Causal GQA prefill attention; a.num_splits / a.split_len / partials as planned by the caller
// (the combine is launched here when num_splits > 1). scratch: >= the bytes above, 16-aligned.
// exact = false: one MMA per product on the f16 hi parts only (the lo planes are neither loaded
// nor multiplied): ~3x fewer MMAs, f16-operand accuracy (CudaBackendOptions::exact_prefill).
void launch_attention_prefill_tc(const AttentionArgs& a, void* scratch, cudaStream_t stream,
                                 bool exact = true);

}  // namespace qs::cuda
