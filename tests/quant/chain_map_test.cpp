// The bf16 layer chain's ring fill order (backend/cuda/chain_map.h, ChainCursor), checked on the
// CPU.
#include "backend/cuda/chain_map.h"

#include <gtest/gtest.h>

#include <vector>

namespace qs::cuda {
namespace {

// The chain's ring (ChainCursor) is filled in the order its compute side takes the stages
// (gemv.cu: ring_chain_phase / ring_tile: per phase the block's tiles block + k grid, per tile the
// warp's 64-wide chunks of K), one slot after another, so that the stage a warp computes is the
// one it waited for; past the last stage every call is empty.
TEST(ChainMap, TheRingIsFilledInTheOrderTheWalkTakesIt) {
  struct Stage {
    int phase;
    int64_t item, unit;
    bool operator==(const Stage& o) const {
      return phase == o.phase && item == o.item && unit == o.unit;
    }
  };
  struct Config {
    std::vector<ChainPhaseShape> phases;
    int grid, num_warps;
  };
  const Config configs[] = {
      // Phases of (tiles, 64-wide chunks of K); gate / up as mixed tiles of 8 + 8 rows:
      // Llama-2-7B, Llama-3.1-8B (132 SMs, 16 warps), the same on a small grid, and K = 384
      // (6 warps).
      {{{256, 64}, {1376, 64}, {256, 172}, {768, 64}}, 132, 16},
      {{{256, 64}, {1792, 64}, {256, 224}, {384, 64}}, 132, 16},
      {{{256, 64}, {1792, 64}, {256, 224}, {384, 64}}, 7, 16},
      {{{24, 6}, {128, 6}, {24, 16}, {40, 6}}, 132, 6},
  };
  for (const Config& cfg : configs) {
    const int phases = static_cast<int>(cfg.phases.size());
    for (int block : {0, 1, 5, cfg.grid - 1}) {
      for (int warp : {0, cfg.num_warps / 2, cfg.num_warps - 1}) {
        std::vector<Stage> walk;  // the compute side's order
        for (int p = 0; p < phases; ++p) {
          const ChainPhaseShape& w = cfg.phases[static_cast<size_t>(p)];
          const int64_t first = w.units * warp / cfg.num_warps;
          const int64_t my_units = w.units * (warp + 1) / cfg.num_warps - first;
          const int64_t my_items = block < w.items ? (w.items - 1 - block) / cfg.grid + 1 : 0;
          for (int64_t ij = 0; ij < my_items; ++ij) {
            for (int64_t ui = 0; ui < my_units; ++ui) {
              walk.push_back({p, block + ij * cfg.grid, first + ui});
            }
          }
        }
        ChainCursor cursor(phases, block, cfg.grid, warp, cfg.num_warps);
        std::vector<Stage> fills;
        int64_t unit = 0;
        for (size_t i = 0; i < walk.size() + 8; ++i) {
          int slot = -1;
          bool entered = false;
          if (!cursor.next([&](int p) { return cfg.phases[size_t(p)]; }, slot, entered)) {
            continue;
          }
          unit = entered ? cursor.unit_begin : unit + 1;
          EXPECT_EQ(slot, static_cast<int>(fills.size() % kChainRingStages));
          fills.push_back({cursor.phase, cursor.item, unit});
        }
        EXPECT_EQ(fills.size(), walk.size()) << "block " << block << " warp " << warp;
        EXPECT_TRUE(fills == walk) << "block " << block << " warp " << warp;
      }
    }
  }
}

}  // namespace
}  // namespace qs::cuda
