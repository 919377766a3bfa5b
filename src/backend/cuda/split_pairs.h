// Paired splits of the quantized-KV attention (QuantAttentionPlan::pair_pieces): two kv heads
// share 2S - 1 blocks, so that a launch can fill every resident-block slot of the GPU where the
// plain grid (S - 1 splits per head, one head per grid row) leaves some empty: Llama-2-7B's 32 kv
// heads on 132 SMs x 4 blocks hold 16 splits each (512 blocks) and leave 16 of the 528 slots
// empty, while 16 pairs x 33 blocks fill them all. Each head is cut into S pieces; block S - 1 of
// a pair takes the last piece of the pair's first head and the first piece of its second, both
// short, so that every block reads about 2 / (2S - 1) of a head's history. Pure arithmetic,
// checked on the CPU (tests/quant/split_pairs_test.cpp).
#pragma once

#include "backend/cuda/host_device.h"

namespace qs::cuda {

// One piece of a paired block: head 0 or 1 of the block's pair, the head's piece (its split, the
// partials' index: 0..S-1), and the piece's quantized positions [begin, end).
struct PairPiece {
  int head;
  int split;
  int begin;
  int end;
};

// Blocks per pair of heads for S pieces per head.
QS_HOST_DEVICE int pair_blocks(int pieces) {
  return 2 * pieces - 1;
}

// Pieces block b of a pair takes: two for the middle block, else one.
QS_HOST_DEVICE int pair_piece_count(int pieces, int b) {
  return b == pieces - 1 ? 2 : 1;
}

// The length of a full piece (a multiple of `unit`) for S pieces per head over q_end quantized
// positions, or 0 where the pieces cannot be cut (q_end not a multiple of unit, or too short for
// the middle block's two pieces to stay non-negative).
QS_HOST_DEVICE int pair_piece_len(int pieces, int q_end, int unit) {
  if (pieces < 2 || unit < 1 || q_end <= 0 || q_end % unit != 0) return 0;
  const long long blocks = pair_blocks(pieces);
  const long long per_block = (2LL * q_end + blocks - 1) / blocks;
  const long long len = (per_block + unit - 1) / unit * unit;
  return (pieces - 1) * len <= q_end ? static_cast<int>(len) : 0;
}

// Piece i (< pair_piece_count) of block b: the first head's pieces 0..S-2 are full from its
// start, its piece S-1 is the rest; the second head mirrors it (piece 0 the short one, the rest
// full up to its end).
QS_HOST_DEVICE PairPiece pair_piece(int pieces, int len, int q_end, int b, int i) {
  const int head = b < pieces - 1 ? 0 : b > pieces - 1 ? 1 : i;
  if (head == 0) {
    const int begin = b * len;
    return {0, b, begin, b == pieces - 1 ? q_end : begin + len};
  }
  const int split = b - (pieces - 1);
  const int end = q_end - (pieces - 1 - split) * len;
  return {1, split, split == 0 ? 0 : end - len, end};
}

}  // namespace qs::cuda
