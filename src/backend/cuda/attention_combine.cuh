// The split-KV combine as the end of the split kernel itself (QuantAttentionTuning::last_combine,
// QS_QUANT_LAST_COMBINE=1; the f16 decode kernel's form: QS_ATTN_LAST_COMBINE=1): once a block has
// written its split's partials, it counts itself in on its (kv head, query group)'s arrival
// counter, and the last of the group's split blocks merges every split's partials of the group's
// query vectors into out. That replaces the combine launch (attention.cu's
// attention_combine_kernel) and its launch boundary by a tail on one block per group, with the
// combine kernel's arithmetic in the combine kernel's order, so out gets its bits.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "backend/cuda/mma.cuh"

namespace qs::cuda {

// attention_combine_kernel's warps: warp w sums the splits w, w + 8, ... in order, and the warps'
// sums are added in warp order.
constexpr int kCombineWarps = 8;

// Floats of shared memory before the staged o: a flag, (max, sum) of each of nq x splits
// partials, nq sums; a multiple of 4 (16-byte alignment).
__host__ __device__ constexpr int64_t last_combine_head_floats(int nq, int splits) {
  return (4 + 2 * int64_t{nq} * splits + nq + 3) / 4 * 4;
}

// Shared memory combine_as_last_split takes: the above, then every split's o of nq query vectors.
__host__ __device__ constexpr size_t last_combine_smem_bytes(int nq, int splits, int head_dim) {
  return sizeof(float) *
         static_cast<size_t>(last_combine_head_floats(nq, splits) + int64_t{nq} * splits * head_dim);
}

// Called by every thread of a split block after its stores of partial_o / partial_ml ([splits,
// num_qv, HD] / [splits, num_qv, 2]) for the query vectors qi_of(j), j < nq. `arrival`: the
// group's counter, zero before the launch; the last block re-arms it. smem: the block's shared
// memory, last_combine_smem_bytes(nq, splits, HD) of it, which no thread reads after this call
// starts. The protocol is gemv_norm_finish's: barrier, fence, count in; the last block reads
// the others' partials through L2.
template <int HD, class QiOf>
__device__ __forceinline__ void combine_as_last_split(const float* partial_o,
                                                      const float* partial_ml, float* out,
                                                      unsigned* arrival, int splits,
                                                      int64_t num_qv, int nq, QiOf qi_of,
                                                      float* smem) {
  int* last = reinterpret_cast<int*>(smem);
  __syncthreads();  // every thread of the block has stored its partials
  if (threadIdx.x == 0) {
    __threadfence();
    const bool is_last = atomicAdd(arrival, 1u) == static_cast<unsigned>(splits - 1);
    if (is_last) {
      *arrival = 0;  // read next by a later launch, after this grid completes
      __threadfence();
    }
    *last = is_last;
  }
  __syncthreads();
  if (*last == 0) return;

  float* ml = smem + 4;                 // [nq][splits][2]: (max, sum); the max becomes the weight
  float* l_tot = ml + 2 * nq * splits;  // [nq]
  float* o_s = smem + last_combine_head_floats(nq, splits);  // [nq][splits][HD]
  const int threads = blockDim.x;
  for (int e = threadIdx.x; e < nq * splits; e += threads) {
    const int j = e / splits, s = e % splits;
    const float2 v =
        __ldcg(reinterpret_cast<const float2*>(partial_ml + (s * num_qv + qi_of(j)) * 2));
    ml[2 * e] = v.x, ml[2 * e + 1] = v.y;
  }
  constexpr int kV4 = HD / 4;
  for (int e = threadIdx.x; e < nq * splits * kV4; e += threads) {
    const int js = e / kV4, d4 = e % kV4;  // js = j * splits + s
    const int j = js / splits, s = js % splits;
    reinterpret_cast<float4*>(o_s)[e] =
        __ldcg(reinterpret_cast<const float4*>(partial_o + (s * num_qv + qi_of(j)) * HD) + d4);
  }
  __syncthreads();
  // Per query vector: the maximum, each split's weight, and the sum as the combine forms it (its
  // warp w's fmaf chain over the splits w, w + 8, ..., then the warps' sums in order).
  for (int j = threadIdx.x; j < nq; j += threads) {
    float* mj = ml + 2 * j * splits;
    float m_tot = -INFINITY;
    for (int s = 0; s < splits; ++s) m_tot = fmaxf(m_tot, mj[2 * s]);
    float lw[kCombineWarps] = {};
    for (int s0 = 0; s0 < splits; s0 += kCombineWarps) {
#pragma unroll
      for (int w = 0; w < kCombineWarps; ++w) {
        if (s0 + w < splits) {
          const float wgt = merge_weight(mj[2 * (s0 + w)], m_tot);
          mj[2 * (s0 + w)] = wgt;
          lw[w] = fmaf(wgt, mj[2 * (s0 + w) + 1], lw[w]);
        }
      }
    }
    float l = 0.0f;
#pragma unroll
    for (int w = 0; w < kCombineWarps; ++w) l += lw[w];
    l_tot[j] = l;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < nq * HD; e += threads) {
    const int j = e / HD, d = e % HD;
    const float* wj = ml + 2 * j * splits;
    const float* oj = o_s + static_cast<int64_t>(j) * splits * HD + d;
    float o = 0.0f;
#pragma unroll
    for (int w = 0; w < kCombineWarps; ++w) {
      float acc = 0.0f;
      for (int s = w; s < splits; s += kCombineWarps) acc = fmaf(wj[2 * s], oj[s * HD], acc);
      o += acc;
    }
    out[qi_of(j) * HD + d] = o / l_tot[j];
  }
}

}  // namespace qs::cuda
