// The 4-bit layer chain's pair walk (backend/cuda/chain_map.h), checked on the CPU: every tile of
// a phase's launch lands in exactly one pair; plain launches pair tiles 2p and 2p + 1 as kernel
// 10 does (so a chain phase computes every row as that launch), gate / up pairs join the same
// tile of both matrices, and RoPE pairs join, within one head of q or of k, the tiles holding
// the rows d and d + head_dim / 2.
#include "backend/cuda/chain_map.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace qs::cuda {
namespace {

// A launch over matrices of these tile counts (at most three).
ChainPairMap plain_map(const std::vector<int64_t>& tiles) {
  ChainPairMap w{};
  int64_t end = 0;
  for (int i = 0; i < kChainSegments; ++i) {
    if (i < static_cast<int>(tiles.size())) end += tiles[i];
    w.tile_end[i] = end;
  }
  return w;
}

// Each tile of the launch is visited once by the pairs; returns the visits per tile.
std::vector<int> visits(const ChainPairMap& w) {
  std::vector<int> seen(static_cast<size_t>(w.tile_end[kChainSegments - 1]), 0);
  for (int64_t p = 0; p < chain_pair_count(w); ++p) {
    int64_t ta, tb;
    bool has_b;
    chain_pair_tiles(w, p, ta, tb, has_b);
    EXPECT_TRUE(ta >= 0 && ta < static_cast<int64_t>(seen.size())) << "pair " << p;
    if (ta < 0 || ta >= static_cast<int64_t>(seen.size())) continue;
    ++seen[static_cast<size_t>(ta)];
    if (has_b) {
      EXPECT_TRUE(tb >= 0 && tb < static_cast<int64_t>(seen.size())) << "pair " << p;
      if (tb >= 0 && tb < static_cast<int64_t>(seen.size())) ++seen[static_cast<size_t>(tb)];
    } else {
      EXPECT_EQ(tb, ta) << "pair " << p << ": a missing tile b reads tile a's address";
    }
  }
  return seen;
}

void expect_each_tile_once(const ChainPairMap& w, const std::string& tag) {
  const std::vector<int> seen = visits(w);
  for (size_t t = 0; t < seen.size(); ++t) EXPECT_EQ(seen[t], 1) << tag << " tile " << t;
}

TEST(ChainMap, PlainLaunchesPairTilesAsKernel10) {
  for (const std::vector<int64_t>& tiles :
       std::vector<std::vector<int64_t>>{{1}, {2}, {7}, {256}, {131, 33, 33}, {256, 64, 64},
                                         {3, 1, 5}, {128, 0, 0}}) {
    const ChainPairMap w = plain_map(tiles);
    std::string tag = "tiles";
    for (int64_t t : tiles) {
      tag += ' ';
      tag += std::to_string(t);
    }
    EXPECT_EQ(chain_pair_count(w), (w.tile_end[2] + 1) / 2) << tag;
    for (int64_t p = 0; p < chain_pair_count(w); ++p) {
      int64_t ta, tb;
      bool has_b;
      chain_pair_tiles(w, p, ta, tb, has_b);
      EXPECT_EQ(ta, 2 * p) << tag;
      EXPECT_EQ(has_b, 2 * p + 1 < w.tile_end[2]) << tag;
      if (has_b) {
        EXPECT_EQ(tb, 2 * p + 1) << tag;
      }
    }
    expect_each_tile_once(w, tag);
    // The segment of every tile: the matrix whose cumulative range holds it.
    int64_t start = 0;
    for (size_t i = 0; i < tiles.size(); ++i) {
      for (int64_t t = start; t < start + tiles[i]; ++t) {
        int64_t local = -1;
        EXPECT_EQ(chain_tile_segment(w, t, local), static_cast<int>(i)) << tag << " tile " << t;
        EXPECT_EQ(local, t - start) << tag << " tile " << t;
      }
      start += tiles[i];
    }
  }
}

TEST(ChainMap, GateUpPairsJoinTheSameTileOfBothMatrices) {
  for (int64_t tiles : {1, 7, 688, 896}) {
    ChainPairMap w = plain_map({tiles, tiles});
    w.swiglu = 1;
    EXPECT_EQ(chain_pair_count(w), tiles);
    for (int64_t p = 0; p < tiles; ++p) {
      int64_t ta, tb, la, lb;
      bool has_b;
      chain_pair_tiles(w, p, ta, tb, has_b);
      EXPECT_TRUE(has_b);
      EXPECT_EQ(chain_tile_segment(w, ta, la), 0);
      EXPECT_EQ(chain_tile_segment(w, tb, lb), 1);
      EXPECT_EQ(la, p);
      EXPECT_EQ(lb, p);
    }
    expect_each_tile_once(w, "gate/up " + std::to_string(tiles));
  }
}

TEST(ChainMap, RopePairsJoinTheRowsThatRotateTogether) {
  struct Shape {
    int heads, kv_heads, head_dim;
    int64_t v_rows;
  };
  // Llama-2-7B, Llama-3.1-8B, head_dim 64 and 256, a v with a partial last tile (not a model's).
  for (const Shape& s : {Shape{32, 32, 128, 4096}, Shape{32, 8, 128, 1024}, Shape{16, 4, 64, 256},
                         Shape{8, 2, 256, 512}, Shape{4, 1, 128, 136}}) {
    const int tph = s.head_dim / 16;
    const int64_t q_tiles = int64_t{s.heads} * tph, k_tiles = int64_t{s.kv_heads} * tph;
    ChainPairMap w = plain_map({q_tiles, k_tiles, (s.v_rows + 15) / 16});
    w.rope_pairs[0] = q_tiles / 2;
    w.rope_pairs[1] = k_tiles / 2;
    w.tiles_per_head = tph;
    std::string tag = std::to_string(s.heads);
    tag += " heads of ";
    tag += std::to_string(s.head_dim);
    for (int64_t p = 0; p < w.rope_pairs[0] + w.rope_pairs[1]; ++p) {
      int64_t ta, tb, la, lb;
      bool has_b;
      chain_pair_tiles(w, p, ta, tb, has_b);
      ASSERT_TRUE(has_b) << tag;
      const int sa = chain_tile_segment(w, ta, la), sb = chain_tile_segment(w, tb, lb);
      EXPECT_EQ(sa, p < w.rope_pairs[0] ? 0 : 1) << tag << " pair " << p;
      EXPECT_EQ(sb, sa) << tag << " pair " << p;
      // Row r of tile a is row d = 16 la + r of its matrix; tile b's row r is d + head_dim / 2 in
      // the same head.
      const int64_t da = 16 * la, db = 16 * lb;
      EXPECT_EQ(da / s.head_dim, db / s.head_dim) << tag << " pair " << p;
      EXPECT_LT(da % s.head_dim, s.head_dim / 2) << tag << " pair " << p;
      EXPECT_EQ(db - da, s.head_dim / 2) << tag << " pair " << p;
    }
    for (int64_t p = w.rope_pairs[0] + w.rope_pairs[1]; p < chain_pair_count(w); ++p) {
      int64_t ta, tb, la;
      bool has_b;
      chain_pair_tiles(w, p, ta, tb, has_b);
      EXPECT_EQ(chain_tile_segment(w, ta, la), 2) << tag << " pair " << p;  // v's, in order
    }
    expect_each_tile_once(w, tag);
  }
}

// A chain's ring (ChainCursor) is filled in the order its compute side takes the stages
// (gemv_q4.cu: chain_phase_run / pair_walk, per phase the block's pairs block + k grid, per pair
// the warp's groups; gemv.cu: ring_chain_phase / ring_tile, the same over tiles and 64-wide
// chunks), one slot after another, so that the stage a warp computes is the one it waited for;
// past the last stage every call is empty.
TEST(ChainMap, TheRingIsFilledInTheOrderTheWalkTakesIt) {
  struct Stage {
    int phase;
    int64_t item, unit;
    bool operator==(const Stage& o) const {
      return phase == o.phase && item == o.item && unit == o.unit;
    }
  };
  auto pairs = [](const std::vector<int64_t>& tiles, bool swiglu, int64_t groups) {
    ChainPairMap w = plain_map(tiles);
    w.swiglu = swiglu ? 1 : 0;
    w.groups = groups;
    return chain_pair_shape(w);
  };
  struct Config {
    std::vector<ChainPhaseShape> phases;
    int grid, num_warps;
  };
  ChainPairMap qkv8b = plain_map({256, 64, 64});
  qkv8b.groups = 32;
  qkv8b.rope_pairs[0] = 128, qkv8b.rope_pairs[1] = 32, qkv8b.tiles_per_head = 8;
  const Config configs[] = {
      // 4-bit, Llama-2-7B: o, gate/up, down, q/k/v (132 SMs, 16 warps).
      {{pairs({256}, false, 32), pairs({688, 688}, true, 32), pairs({256}, false, 86),
        pairs({256, 256, 256}, false, 32)},
       132,
       16},
      // 4-bit, Llama-3.1-8B with the RoPE pairs, three phases only, a small grid.
      {{pairs({256}, false, 32), pairs({896, 896}, true, 32), pairs({256}, false, 112),
        chain_pair_shape(qkv8b)},
       132,
       16},
      {{pairs({256}, false, 32), pairs({896, 896}, true, 32), pairs({256}, false, 112)}, 7, 16},
      // 4-bit, the bundled model: 3 groups of K = 384, so 3 warps; 8 groups of the MLP.
      {{pairs({24}, false, 3), pairs({64, 64}, true, 3), pairs({24}, false, 8),
        pairs({24, 8, 8}, false, 3)},
       132,
       3},
      // bf16 (tiles, 64-wide chunks; gate / up as mixed tiles of 8 + 8 rows): Llama-2-7B,
      // Llama-3.1-8B, and K = 384 (6 warps).
      {{{256, 64}, {1376, 64}, {256, 172}, {768, 64}}, 132, 16},
      {{{256, 64}, {1792, 64}, {256, 224}, {384, 64}}, 132, 16},
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
