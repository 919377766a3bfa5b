// Which weight rows a q/k/v launch with a RoPE epilogue computes together, so that each
// rotation's two rows (d and d + head_dim / 2 of a head) meet in one tile's epilogue. Plain C++
// for the host and the device, so that a CPU test checks the maps (tests/quant/rope_tiles_test.cpp)
// without a GPU.
#pragma once

#include <cstdint>

#include "backend/cuda/host_device.h"

namespace qs::cuda {

// The bf16 ring kernel (gemv_ring_rope_kernel): RoPE tile `local` of a q or k matrix with heads
// of hd rows (hd % 16 == 0) is rows r .. r + 7 of a head's first half (its rows 0-7) and the same
// rows of the second half (rows 8-15); this is r. A head's hd / 16 tiles take its first half 8
// rows at a time.
QS_HOST_DEVICE int64_t rope_tile_row(int64_t local, int hd) {
  const int per_head = hd / 16;
  return local / per_head * hd + local % per_head * 8;
}

// The 4-bit pair kernel (gemv_q4_pair_rope_kernel; hd % 32 == 0): its first q_pairs pairs join,
// within one head of q, 16-row tiles j and j + tiles_per_head / 2, the next k_pairs the same within
// k's heads, then v's v_tiles tiles pair as usual (2p, 2p + 1).
struct RopePairs {
  int tiles_per_head;
  int64_t q_pairs, k_pairs, v_tiles;
};

QS_HOST_DEVICE int64_t rope_pair_count(const RopePairs& rp) {
  return rp.q_pairs + rp.k_pairs + (rp.v_tiles + 1) / 2;
}

// Tile t (0 or 1) of pair p: its matrix si (0 q, 1 k, 2 v) and its tile there; false for the
// missing second tile of v's last pair.
QS_HOST_DEVICE bool rope_pair_tile(const RopePairs& rp, int64_t p, int t, int& si, int64_t& local) {
  if (p < rp.q_pairs + rp.k_pairs) {
    const bool k = p >= rp.q_pairs;
    const int64_t pk = k ? p - rp.q_pairs : p;
    const int half = rp.tiles_per_head / 2;
    si = k ? 1 : 0;
    local = pk / half * rp.tiles_per_head + pk % half + t * half;
    return true;
  }
  const int64_t vt = 2 * (p - rp.q_pairs - rp.k_pairs) + t;
  si = 2, local = vt;
  return vt < rp.v_tiles;
}

}  // namespace qs::cuda
