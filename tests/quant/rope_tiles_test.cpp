// The q/k/v launches' RoPE tile maps (backend/cuda/rope_tiles.h), checked on the CPU: every row of
// q and k lands in exactly one tile (or pair), next to the row it rotates with (d and d +
// head_dim / 2 of the same head), and v's tiles pair as in a plain launch.
#include "backend/cuda/rope_tiles.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace qs::cuda {
namespace {

// gemv_ring_rope_kernel's tiles of a q or k matrix: tile rows i (0-7) and i + 8 hold one
// rotation's pair, rows r and r + hd / 2 of one head with r in its first half.
TEST(RopeTiles, RingTilesHoldEachRotationOnce) {
  for (int hd : {64, 80, 96, 128, 256}) {
    for (int heads : {1, 4, 8, 32}) {
      const int64_t rows = int64_t{heads} * hd;
      const std::string tag = "hd " + std::to_string(hd) + " heads " + std::to_string(heads);
      std::vector<int> seen(static_cast<size_t>(rows), 0);
      for (int64_t local = 0; local < rows / 16; ++local) {
        const int64_t r0 = rope_tile_row(local, hd);
        for (int i = 0; i < 8; ++i) {
          const int64_t a = r0 + i, b = a + hd / 2;
          ASSERT_LT(b, rows) << tag;
          EXPECT_LT(a % hd, hd / 2) << tag << " tile " << local;  // a in the first half
          EXPECT_EQ(a / hd, b / hd) << tag << " tile " << local;  // one head
          ++seen[static_cast<size_t>(a)];
          ++seen[static_cast<size_t>(b)];
        }
      }
      for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(seen[size_t(r)], 1) << tag << " row " << r;
    }
  }
}

// gemv_q4_pair_rope_kernel's pairs: each q and k pair joins tiles j and j + tiles_per_head / 2
// of one head (16-row tiles whose rows rotate together, row by row), every tile of q, k and v is
// in exactly one pair, and v's pairs are tiles 2p, 2p + 1 (the last one alone for an odd count).
TEST(RopeTiles, PairsJoinTheTilesThatRotateTogether) {
  struct Shape {
    int hd, q_heads, kv_heads;
    int64_t v_rows;
  };
  const Shape shapes[] = {{128, 32, 32, 4096},
                          {128, 32, 8, 1024},
                          {64, 16, 4, 256},
                          {256, 8, 1, 256},
                          {64, 4, 1, 48}};  // the last: 3 v tiles
  for (const Shape& s : shapes) {
    const int tph = s.hd / 16;
    const int64_t q_tiles = int64_t{s.q_heads} * tph, k_tiles = int64_t{s.kv_heads} * tph;
    const RopePairs rp{tph, q_tiles / 2, k_tiles / 2, (s.v_rows + 15) / 16};
    const std::string tag = "hd " + std::to_string(s.hd) + " q heads " + std::to_string(s.q_heads) +
                            " kv heads " + std::to_string(s.kv_heads);
    std::vector<int> seen[3] = {std::vector<int>(size_t(q_tiles), 0),
                                std::vector<int>(size_t(k_tiles), 0),
                                std::vector<int>(size_t(rp.v_tiles), 0)};
    for (int64_t p = 0; p < rope_pair_count(rp); ++p) {
      int sa, sb;
      int64_t a, b;
      ASSERT_TRUE(rope_pair_tile(rp, p, 0, sa, a)) << tag << " pair " << p;
      const bool has_b = rope_pair_tile(rp, p, 1, sb, b);
      ++seen[sa][size_t(a)];
      if (sa < 2) {
        ASSERT_TRUE(has_b) << tag << " pair " << p;
        EXPECT_EQ(sb, sa) << tag << " pair " << p;
        EXPECT_EQ(b, a + tph / 2) << tag << " pair " << p;    // rows d + hd / 2, row by row
        EXPECT_EQ(a / tph, b / tph) << tag << " pair " << p;  // one head
        EXPECT_LT(a % tph, tph / 2) << tag << " pair " << p;  // a in the first half
        ++seen[sb][size_t(b)];
        continue;
      }
      EXPECT_EQ(a % 2, 0) << tag << " pair " << p;  // v: 2p, 2p + 1
      EXPECT_EQ(has_b, a + 1 < rp.v_tiles) << tag << " pair " << p;
      if (has_b) {
        EXPECT_EQ(sb, 2);
        EXPECT_EQ(b, a + 1);
        ++seen[2][size_t(b)];
      }
    }
    for (int si = 0; si < 3; ++si) {
      for (size_t t = 0; t < seen[si].size(); ++t) {
        EXPECT_EQ(seen[si][t], 1) << tag << " matrix " << si << " tile " << t;
      }
    }
  }
}

}  // namespace
}  // namespace qs::cuda
