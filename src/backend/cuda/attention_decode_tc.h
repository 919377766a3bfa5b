// Tensor-core flash-decoding over f16 KV rows (attention_decode_tc.cu): the default decode
// kernel for f16 rows of head_dim 64/128 (every Llama-family model), at about f32 accuracy.
#pragma once

#include "backend/backend.h"
#include "backend/cuda/cuda_ops.h"

namespace qs::cuda {

// The args of a backend.h attention call over a full-precision KvView (cuda_backend.cu; the
// splits are left to the caller's plan). Adds the call's bytes to kv.read_bytes when it is set.
AttentionArgs make_attention_args(const float* q, int m, int pos, const AttentionShape& shape,
                                  const KvView& kv, float* out);

// Process-wide choice between this kernel and the CUDA-core decode kernel (attention.cu) for the
// calls both handle (tests and benchmarks compare both; both compute the same function).
struct DecodeAttentionTuning {
  bool tensor_cores = true;  // false: attention_decode_kernel for every call
  // A sparse draft's KV selection on tensor cores too (false: selections on the CUDA-core kernel).
  bool selection = true;
  // The transposed kernel (keys and values as the MMAs' A operand, the query vectors as B's 8
  // columns: half the MMAs) for calls of at most 8 query vectors per kv head without a selection.
  // On by default since session 33 (H200, Llama-2-7B 128K: 588 -> 486 us per layer at m = 1, AR
  // fp16 23.42 -> 20.31 ms/token); QS_DECODE_TC_T=0 starts the process without it.
  bool transposed = true;
};
void set_decode_attention_tuning(const DecodeAttentionTuning& tuning);
DecodeAttentionTuning decode_attention_tuning();

// Whether launch_attention_decode_tc handles this call: f16 rows with every row 16-byte aligned
// (row stride a multiple of 8 elements, k and v 16-byte aligned), head_dim 64 or 128, m <= 16, no
// KV selection unless DecodeAttentionTuning::selection.
bool attention_decode_tc_supported(const AttentionArgs& a);
// Whether launch_attention_decode_tc runs the transposed kernel for this supported call
// (DecodeAttentionTuning::transposed, <= 8 query vectors per kv head, no selection).
bool attention_decode_tct_applies(const AttentionArgs& a);
// Query tiles (the grid's x): 16 query vectors of one kv head each (the transposed kernel: one
// tile of up to 8).
int attention_decode_tc_query_tiles(const AttentionArgs& a);
// Blocks of the kernel resident per SM (shared memory bound): the split planner fills one wave.
constexpr int kDecodeTcBlocksPerSm = 2;
// Split-KV flash-decoding; a.num_splits / a.split_len / partials as planned by the caller (the
// combine is launched here when num_splits > 1).
void launch_attention_decode_tc(const AttentionArgs& a, cudaStream_t stream);

}  // namespace qs::cuda
