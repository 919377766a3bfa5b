// Hopper wgmma flash-attention prefill (attention_prefill_wgmma.cu): the direct path of the
// tensor-core prefill (f16 K/V rows read in place; attention_prefill_tc.h) on warpgroup MMAs
// (wgmma.mma_async, sm_90a) instead of mma.sync. The same function, arithmetic and grid as
// attention_prefill_tc_kernel's DIRECT path (fast: one f16 MMA per product; exact: two, with the
// f16 remainders of Q and P), the same split partials (launch_attention_combine merges them).
// The default where available: PrefillAttentionTuning::wgmma (QS_PREFILL_WGMMA=0 turns it off);
// launch_attention_prefill_tc routes supported calls here.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_ops.h"

namespace qs::cuda {

// Whether this binary holds the sm_90a kernel and the current device runs it (compute
// capability 9.0). Probed once per device (a one-thread kernel; synchronizes once).
bool attention_prefill_wgmma_available();
// Whether launch_attention_prefill_wgmma handles this call: available, head_dim 64 or 128, f16
// rows with a row stride of a multiple of 8 elements and 16-byte aligned k and v, no selection,
// and a device that grants the kernel's shared memory (225 KB at head_dim 128).
bool attention_prefill_wgmma_supported(const AttentionArgs& a, bool exact);
// Causal GQA prefill attention over f16 rows; a.num_splits / a.split_len / partials as planned by
// the caller, who also launches the combine when num_splits > 1. exact as in
// launch_attention_prefill_tc. warp_specialized (the fast path only; PrefillAttentionTuning::
// wgmma_ws): the variant whose K/V tiles a producer warpgroup streams with TMA into slots
// handed over through mbarriers, instead of every thread copying them with cp.async between
// block barriers; the same arithmetic in the same order (bit-identical results). It falls back
// to the other variant where the driver cannot encode the tensor maps.
void launch_attention_prefill_wgmma(const AttentionArgs& a, cudaStream_t stream, bool exact,
                                    bool warp_specialized = false);
// Launches of the wgmma kernel so far in this process, and of its warp-specialized variant
// (tests assert which path ran).
int64_t attention_prefill_wgmma_launches();
int64_t attention_prefill_wgmma_ws_launches();

}  // namespace qs::cuda
