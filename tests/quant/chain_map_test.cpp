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

}  // namespace
}  // namespace qs::cuda
