// The end of a split-KV decode block (attention.cu, attention_decode_tc.cu): the online-softmax
// states of the block's PARTS parts (lane groups or warps over different positions) merged per
// query vector and written out.
#pragma once

#include <cmath>
#include <cstdint>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/mma.cuh"

namespace qs::cuda {

// o_s [PARTS][rows][PITCH >= HD] (unnormalized o), ml_s [PARTS][rows][2] (max score, sum), in
// shared memory; row j < nq is query vector q0 + j of kv head kvh (query head kvh * group + (q0 +
// j) % group of query row (q0 + j) / group). Writes out (a.num_splits == 1) or split `split`'s
// partials; the block's `threads` threads share the work.
template <int HD, int PARTS, int PITCH = HD>
__device__ __forceinline__ void write_merged_states(const AttentionArgs& a, const float* o_s,
                                                    const float* ml_s, int rows, int nq, int q0,
                                                    int kvh, int split, int threads) {
  const int group = a.num_heads / a.num_kv_heads;
  const int64_t num_qv = static_cast<int64_t>(a.m) * a.num_heads;
  for (int e = threadIdx.x; e < nq * HD; e += threads) {
    const int j = e / HD, d = e % HD;
    float m_tot = -INFINITY;
    for (int p = 0; p < PARTS; ++p) m_tot = fmaxf(m_tot, ml_s[(p * rows + j) * 2]);
    float l_tot = 0.0f, o_tot = 0.0f;
    for (int p = 0; p < PARTS; ++p) {
      const float wgt = merge_weight(ml_s[(p * rows + j) * 2], m_tot);
      l_tot += wgt * ml_s[(p * rows + j) * 2 + 1];
      o_tot += wgt * o_s[(p * rows + j) * PITCH + d];
    }
    const int qv = q0 + j;
    const int64_t qi = static_cast<int64_t>(qv / group) * a.num_heads + kvh * group + qv % group;
    if (a.num_splits == 1) {
      a.out[qi * HD + d] = o_tot / l_tot;
    } else {
      const int64_t slot = static_cast<int64_t>(split) * num_qv + qi;
      a.partial_o[slot * HD + d] = o_tot;
      if (d == 0) {
        a.partial_ml[slot * 2] = m_tot;
        a.partial_ml[slot * 2 + 1] = l_tot;
      }
    }
  }
}

}  // namespace qs::cuda
