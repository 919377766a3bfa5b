// The layer chain's walk (gemv.cu, gemv_ring_chain_kernel): the order in which a warp fills its
// ring across the phases. Plain C++ for the host and the device, so that a CPU test checks it
// (tests/quant/chain_map_test.cpp) without a GPU.
#pragma once

#include <cstdint>

#include "backend/cuda/host_device.h"

namespace qs::cuda {

// Stages of a warp's cp.async ring in the chain (the ring kernel's 4).
constexpr int kChainRingStages = 4;

// What the chain's fetch needs of a phase: its work items (16-row tiles, or mixed gate / up
// tiles) and the stages of K per item that the warps split (64-wide chunks).
struct ChainPhaseShape {
  int64_t items;
  int64_t units;
};

// The order in which a warp of the chain fills its ring (RingChainFetch in gemv.cu): phase by
// phase, this block's items block, block + grid, ..., and for each item this warp's units
// [unit_begin, unit_begin + per_item) of the phase's K; each next() is one stage in the next
// slot. The compute side (ring_chain_phase with ring_tile) takes the stages in the same order.
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
