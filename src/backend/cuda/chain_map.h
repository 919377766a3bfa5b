// The layer chains' walks: for the 4-bit chain (gemv_q4.cu, gemv_q4_chain_kernel) which two
// 16-row tiles of a phase's launch meet in a pair and where a launch tile sits among the launch's
// matrices; for both chains (and the bf16 one, gemv.cu) the order in which a warp fills its ring
// across the phases. Plain C++ for the host and the device, so that the CPU tests check them
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
  int64_t groups;  // 128-column groups of the launch's K (the warps split them)
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

// Stages of a warp's cp.async ring in the chains (kernel 10's kPairStages; the bf16 ring
// kernel's 4).
constexpr int kChainRingStages = 4;

// What a chain's fetch needs of a phase: its work items (pairs of 4-bit tiles, or bf16 tiles)
// and the stages of K per item that the warps split (128-column groups, or 64-wide chunks).
struct ChainPhaseShape {
  int64_t items;
  int64_t units;
};

// The 4-bit chain's phase shape of a ChainPairMap.
QS_HOST_DEVICE ChainPhaseShape chain_pair_shape(const ChainPairMap& w) {
  return {chain_pair_count(w), w.groups};
}

// The order in which a warp of a chain fills its ring (ChainFetch in gemv_q4.cu, RingChainFetch in
// gemv.cu): phase by phase, this block's items block, block + grid, ..., and for each item this
// warp's units [unit_begin, unit_begin + per_item) of the phase's K; each next() is one stage in
// the next slot. The kernels' compute sides take the stages in the same order (chain_phase_run
// with pair_walk; ring_chain_phase with ring_walk).
struct ChainCursor {
  int phases, block, grid, warp, num_warps;
  int phase = -1, remaining = 0, per_item = 0, left = 0, slot = 0;
  int64_t item = 0, next_item = 0, unit_begin = 0;

  QS_HOST_DEVICE ChainCursor(int phases_, int block_, int grid_, int warp_, int num_warps_)
      : phases(phases_), block(block_), grid(grid_), warp(warp_), num_warps(num_warps_) {}

  // The next stage: false past the last one. Else fill_slot is the ring slot it fills and
  // `entered` says whether it starts an item (then `item` of `phase`, from unit unit_begin).
  // shape_of(p): phase p's ChainPhaseShape.
  template <class ShapeOf>
  QS_HOST_DEVICE bool next(ShapeOf shape_of, int& fill_slot, bool& entered) {
    while (remaining == 0 && phase + 1 < phases) {
      const ChainPhaseShape w = shape_of(++phase);
      unit_begin = w.units * warp / num_warps;
      per_item = static_cast<int>(w.units * (warp + 1) / num_warps - unit_begin);
      const int64_t mine = block < w.items ? (w.items - 1 - block) / grid + 1 : 0;
      remaining = static_cast<int>(mine) * per_item;
      left = 0;
      next_item = block;
    }
    if (remaining == 0) return false;
    entered = left == 0;
    if (entered) {
      item = next_item;
      next_item += grid;
      left = per_item;
    }
    fill_slot = slot;
    --left, --remaining;
    slot = slot + 1 == kChainRingStages ? 0 : slot + 1;
    return true;
  }
};

}  // namespace qs::cuda
