// Tensor-core flash-decoding over f16 KV rows (attention_decode_tc.cu): the default decode
// kernel for f16 rows of head_dim 64/128 (every Llama-family model), at about f32 accuracy.
#pragma once

#include "backend/cuda/cuda_ops.h"

namespace qs::cuda {

// Process-wide choice between this kernel and the CUDA-core decode kernel (attention.cu) for the
// calls both handle (tests and benchmarks compare both; both compute the same function).
struct DecodeAttentionTuning {
  bool tensor_cores = true;  // false: attention_decode_kernel for every call
  // A sparse draft's KV selection on tensor cores too (false: selections on the CUDA-core kernel).
  bool selection = true;
  // Resident blocks per SM: 2 (three 8 KB stages per warp, up to 255 registers) or 3 (two stages,
  // registers capped at 168: 50% more warps to hide the loop's latency, ncu: 1.95 active warps
  // per scheduler, 0.18 instructions issued per cycle).
  int blocks_per_sm = 2;
};
void set_decode_attention_tuning(const DecodeAttentionTuning& tuning);
DecodeAttentionTuning decode_attention_tuning();

// Whether launch_attention_decode_tc handles this call: f16 rows with every row 16-byte aligned
// (row stride a multiple of 8 elements, k and v 16-byte aligned), head_dim 64 or 128, m <= 16, no
// KV selection unless DecodeAttentionTuning::selection.
bool attention_decode_tc_supported(const AttentionArgs& a);
// Query tiles (the grid's x): 16 query vectors of one kv head each.
int attention_decode_tc_query_tiles(const AttentionArgs& a);
// Blocks of the kernel resident per SM (DecodeAttentionTuning::blocks_per_sm): the split planner
// fills one wave.
int attention_decode_tc_blocks_per_sm();
// Split-KV flash-decoding; a.num_splits / a.split_len / partials as planned by the caller (the
// combine is launched here when num_splits > 1).
void launch_attention_decode_tc(const AttentionArgs& a, cudaStream_t stream);

}  // namespace qs::cuda
