// The quantized-KV attention's paired splits (backend/cuda/split_pairs.h), checked on the CPU:
// each head's S pieces cover its quantized positions once, in order, on unit boundaries, and the
// 2S - 1 blocks of a pair read about the same number of positions.
#include "backend/cuda/split_pairs.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace qs::cuda {
namespace {

TEST(SplitPairs, EachHeadsPiecesCoverItOnceAndTheBlocksAreEven) {
  int cut = 0;
  for (int pieces : {2, 3, 9, 17, 33}) {
    for (int unit : {32, 64}) {
      for (int q_end : {64, 128, 4096, 16896, 32640, 130944, 131072}) {
        const std::string tag = "S " + std::to_string(pieces) + " unit " + std::to_string(unit) +
                                " q_end " + std::to_string(q_end);
        const int len = pair_piece_len(pieces, q_end, unit);
        if (len == 0) {
          // Not cut only where a short piece would be negative.
          const int even = (2 * q_end + pair_blocks(pieces) - 1) / pair_blocks(pieces);
          EXPECT_GT((pieces - 1) * ((even + unit - 1) / unit * unit), q_end) << tag;
          continue;
        }
        ++cut;
        EXPECT_EQ(len % unit, 0) << tag;
        std::vector<int> next(2, 0), count(2, 0);  // per head: where the next piece must start
        int longest = 0, shortest = 2 * q_end;
        for (int b = 0; b < pair_blocks(pieces); ++b) {
          int positions = 0;
          for (int i = 0; i < pair_piece_count(pieces, b); ++i) {
            const PairPiece pc = pair_piece(pieces, len, q_end, b, i);
            ASSERT_TRUE(pc.head == 0 || pc.head == 1) << tag;
            EXPECT_EQ(pc.split, count[pc.head]) << tag << " block " << b;
            EXPECT_EQ(pc.begin, next[pc.head]) << tag << " block " << b;
            EXPECT_LE(pc.begin, pc.end) << tag << " block " << b;
            EXPECT_EQ(pc.begin % unit, 0) << tag;
            EXPECT_EQ(pc.end % unit, 0) << tag;
            next[pc.head] = pc.end;
            ++count[pc.head];
            positions += pc.end - pc.begin;
          }
          longest = std::max(longest, positions);
          shortest = std::min(shortest, positions);
        }
        for (int h = 0; h < 2; ++h) {
          EXPECT_EQ(next[h], q_end) << tag << " head " << h;
          EXPECT_EQ(count[h], pieces) << tag << " head " << h;
        }
        // No block reads more than a full piece; the middle one at least a full piece less
        // two rounding units.
        EXPECT_EQ(longest, len) << tag;
        EXPECT_GE(pair_piece(pieces, len, q_end, pieces - 1, 0).end -
                      pair_piece(pieces, len, q_end, pieces - 1, 0).begin +
                      pair_piece(pieces, len, q_end, pieces - 1, 1).end -
                      pair_piece(pieces, len, q_end, pieces - 1, 1).begin,
                  len - 2 * unit * pieces)
            << tag;
      }
    }
  }
  EXPECT_GT(cut, 20);
}

TEST(SplitPairs, UncuttableHistories) {
  EXPECT_EQ(pair_piece_len(17, 0, 64), 0);
  EXPECT_EQ(pair_piece_len(17, 96, 64), 0);     // not a multiple of the unit
  EXPECT_EQ(pair_piece_len(17, 960, 64), 0);    // the short pieces would be negative
  EXPECT_EQ(pair_piece_len(17, 1024, 64), 64);  // the middle block's two pieces are empty
  EXPECT_EQ(pair_piece_len(1, 4096, 64), 0);
  // Llama-2-7B at 128K (G 128): 33 blocks of a pair, 7936 positions per full piece.
  EXPECT_EQ(pair_piece_len(17, 130944, 64), 7936);
}

}  // namespace
}  // namespace qs::cuda
