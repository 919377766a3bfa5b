// The 4-bit layer chain's pair walk (gemv_q4.cu, gemv_q4_chain_kernel): which two 16-row tiles of
// a phase's launch meet in a pair, and where a launch tile sits among the launch's matrices.
// Plain C++ for the host and the device, so that the CPU tests check the mapping
// (tests/quant/chain_map_test.cpp) without a GPU.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define QS_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define QS_HOST_DEVICE inline
#endif

namespace qs::cuda {

constexpr int kChainSegments = 3;  // matrices per phase at most (kMaxGemvSegments)

// A phase's launch: up to kChainSegments matrices whose cumulative tile counts are tile_end
// (entries past the last matrix repeat the total). Pair p is tiles 2p and 2p + 1 of the launch (a
// pair may straddle two matrices; the last one may lack its second tile), or with swiglu gate
// tile p (matrix 0) and up tile p (matrix 1). With RoPE (rope_pairs[0] + rope_pairs[1] > 0: the
// q/k/v phase of QS_Q4_CHAIN=2), the first rope_pairs[0] pairs are q's and the next rope_pairs[1]
// k's, each joining tile j and tile j + tiles_per_head / 2 of a head (the rows d and
// d + head_dim / 2 that rotate together), then v's pairs as above.
struct ChainPairMap {
  int64_t tile_end[kChainSegments];
  int swiglu;
  int64_t rope_pairs[2];
  int tiles_per_head;
};

// Pairs of the launch.
QS_HOST_DEVICE int64_t chain_pair_count(const ChainPairMap& w) {
  const int64_t tiles = w.tile_end[kChainSegments - 1];
  return w.swiglu ? tiles / 2 : (tiles + 1) / 2;
}

// The launch tiles (a, b) of pair `pair` (b == a where it has none).
QS_HOST_DEVICE void chain_pair_tiles(const ChainPairMap& w, int64_t pair, int64_t& ta, int64_t& tb,
                                     bool& has_b) {
  const int64_t rope = w.rope_pairs[0] + w.rope_pairs[1];
  if (w.swiglu) {
    ta = pair, tb = w.tile_end[0] + pair, has_b = true;
  } else if (pair < rope) {
    const bool k = pair >= w.rope_pairs[0];
    const int64_t p = k ? pair - w.rope_pairs[0] : pair;
    const int half = w.tiles_per_head / 2;
    ta = (k ? w.tile_end[0] : 0) + (p / half) * w.tiles_per_head + p % half;
    tb = ta + half, has_b = true;
  } else {
    const int64_t first = rope > 0 ? w.tile_end[1] : 0;  // v's tiles follow q's and k's
    ta = first + 2 * (pair - rope);
    has_b = ta + 1 < w.tile_end[kChainSegments - 1];
    tb = has_b ? ta + 1 : ta;
  }
}

// Launch tile t: its matrix, and (local) its tile there.
QS_HOST_DEVICE int chain_tile_segment(const ChainPairMap& w, int64_t t, int64_t& local) {
  static_assert(kChainSegments == 3, "two boundaries");
  const int si = (t >= w.tile_end[0]) + (t >= w.tile_end[1]);
  local = t - (si == 0 ? 0 : w.tile_end[si - 1]);
  return si;
}

}  // namespace qs::cuda
