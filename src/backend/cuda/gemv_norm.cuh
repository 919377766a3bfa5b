// The decode GEMVs' fused residual add + RMSNorm (Backend::linear_add_rmsnorm; GemvNorm in
// cuda_ops.h): each output element of y = x W^T (+ bias) is added into the residual stream h
// where the plain GEMV would store it (h[i] += y[i], add_rmsnorm's add, bit for bit), and the
// block that finishes last normalizes h's m rows into out (add_rmsnorm's norm: the same row code
// as rmsnorm_kernel, norm_row.cuh). One launch instead of two; measured on the H200 the launch
// boundary this removes is worth ~1 us per norm (the decode trace of session 24 put the norm
// kernel's share at 4-5 us; most of it, the norm's own L2 round trips, stays in the last block),
// and with several rows the last block's rows one after another cost more than that
// (docs/perf.md, session 28): the backend fuses one row only.
#pragma once

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/norm_row.cuh"

namespace qs::cuda {

// Output element idx (token * N + row) of a GEMV whose tile sum (bias included) is `sum`.
__device__ __forceinline__ void gemv_store(const GemvNorm& norm, float* y, int64_t idx, float sum) {
  if (norm.h != nullptr) {
    norm.h[idx] += sum;
  } else {
    y[idx] = sum;
  }
}

// gemv_store for a deferred norm's producer (norm.sumsq set): h[idx] += sum, and the new value's
// square (add_squares' arithmetic) into the storing thread's sq.
__device__ __forceinline__ void gemv_store_deferred(const GemvNorm& norm, int64_t idx, float sum,
                                                    double& sq) {
  const float v = norm.h[idx] + sum;
  norm.h[idx] = v;
  sq += static_cast<double>(v * v);
}

// Shared memory gemv_norm_finish takes from the kernel's dynamic allocation (no static shared
// memory: the kernels' dynamic limits are the whole of the SM's opt-in size).
constexpr size_t kGemvNormScratchBytes = 33 * sizeof(double);

// Called by every thread of every block once its stores are done; scratch: kGemvNormScratchBytes
// of the block's shared memory (8-byte aligned) that no thread reads after the block's last
// barrier. The blocks count themselves in; the last one (it sees every other block's stores:
// fence, arrival, fence) resets the counter for the next launch and normalizes the rows, reading
// h through L2 (other SMs wrote it).
__device__ __forceinline__ void gemv_norm_finish(const GemvNorm& norm, void* scratch) {
  double* warp_sums = static_cast<double*>(scratch);  // [32]
  int& last = *reinterpret_cast<int*>(warp_sums + 32);
  __syncthreads();  // every thread of the block has stored (and is done with scratch)
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(norm.arrivals, 1u) == gridDim.x - 1;
    if (last) {
      *norm.arrivals = 0;  // read next by a later launch, after this grid completes
      __threadfence();
    }
  }
  __syncthreads();
  if (!last) return;
  for (int r = 0; r < norm.m; ++r) {
    float w[kNormPer];
    load_weight_chunk(norm.weight, norm.weight_dtype, 0, norm.d, w);
    normalize_row<true, false>(norm.h + static_cast<int64_t>(r) * norm.d, nullptr, norm.weight,
                               norm.weight_dtype, norm.d, norm.eps, w, warp_sums,
                               norm.out + static_cast<int64_t>(r) * norm.d);
  }
}

// Block 0 zeroes the deferred form's slots past the grid (the consumer sums all norm.parts).
__device__ __forceinline__ void gemv_norm_zero_spare_slots(const GemvNorm& norm) {
  if (blockIdx.x == 0) {
    for (int i = static_cast<int>(gridDim.x) + threadIdx.x; i < norm.parts; i += blockDim.x) {
      norm.sumsq[i] = 0.0;
    }
  }
}

// The deferred form's end (norm.sumsq set): `sq` is this thread's sum of the squares of the h
// values it wrote (threads of warp 0 store the tiles' rows; the others pass 0). Warp 0 sums them
// into the block's slot; block 0 zeroes the slots past the grid.
__device__ __forceinline__ void gemv_norm_defer_finish(const GemvNorm& norm, double sq) {
  if (threadIdx.x < 32) {
    sq = warp_sum(sq);
    if (threadIdx.x == 0) norm.sumsq[blockIdx.x] = sq;
  }
  gemv_norm_zero_spare_slots(norm);
}

// gemv_norm_defer_finish for a block whose storing threads span several warps (the bf16 ring
// walk's store_tile_sums): the threads' sums of squares over the block (block_sum) into the
// block's slot. scratch: kGemvNormScratchBytes of the block's shared memory that no thread reads
// after the block's last barrier.
__device__ __forceinline__ void gemv_norm_defer_block(const GemvNorm& norm, double sq,
                                                      void* scratch) {
  __syncthreads();  // every thread of the block has stored (and is done with scratch)
  const double s = block_sum(sq, static_cast<double*>(scratch));
  if (threadIdx.x == 0) norm.sumsq[blockIdx.x] = s;
  gemv_norm_zero_spare_slots(norm);
}

// The 1 / rms of a NormIn's row (every lane of the calling warp gets it): the partial sums in a
// fixed order (lanes over the slots, then the warp's butterfly), then rmsnorm's formula. L2: the
// sums were written earlier in this launch by other blocks, so they are read from L2.
template <bool L2 = false>
__device__ __forceinline__ float norm_in_scale(const NormIn& nin, int64_t d) {
  double s = 0.0;
  for (int i = threadIdx.x % 32; i < nin.parts; i += 32)
    s += L2 ? __ldcg(nin.sumsq + i) : nin.sumsq[i];
  return inv_rms_of(warp_sum(s), d, nin.eps);
}

}  // namespace qs::cuda
