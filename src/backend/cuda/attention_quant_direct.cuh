// The register-direct tensor-core path of attention_quant.cu (included there, after its device
// helpers): head_dim 128, one value group per token (Gv = head_dim), key groups of whole 32-token
// sub-chunks. Same arithmetic as MmaPath (centred codes, queries folded with the key group's step
// and split into f16 hi + lo, p * value step split likewise, q . min and p . min in f32), but the
// code fragments come straight from global memory into registers, each sub-chunk just before
// use, instead of through a cp.async ring in shared memory and ldmatrix. ncu on the ring version
// (2026-11-29, Llama-2-7B shape, 32K, draft): 47 warp instructions per (token, kv head),
// issue-latency-bound with 41-66 KB of shared memory per 2-warp block (6-10 warps per SM). Here
// every warp runs on its own (no block barrier in the loop), the block needs shared memory only for
// the queries and the states, and the same draft call executes 36 instructions per (token, kv head)
// (37.5 M instead of 49.1 M; 93 vs 118 us, docs/perf.md). Session 7 cut the loop to 903 SASS
// instructions per 32-token sub-chunk (INT4 view; 1195 before: docs/cuda.md, "Instructions per
// sub-chunk").
//
// Fragment maps (lane = (r, c) = (lane / 4, lane % 4)); the order of channels inside a dot product
// is free as long as both operands agree:
//  - keys, S^T = K Q'^T, m-tile = 16 tokens (rows r, r + 8), k-step ks = 2w + h (w, h < 4, 2):
//    the lane loads 16 bytes of each of its two token rows at byte 16c (channels [32c, 32c + 32)),
//    k-slots 2c, 2c+1, 2c+8, 2c+9 are channels 32c + 8w + 4h + {0, 2, 1, 3} (INT8) or
//    32c + 8w + 2h + {0, 4, 1, 5} (INT4, int4_key_frags: the nibbles of word w as they lie);
//  - values, O^T += V^T P^T, m-tile u < 8 (rows r, r + 8 are channels 16r + 8(u / 4) + 2(u % 4)
//    and that + 1), k-step = 16 tokens (k-slots 2c, 2c+1, 2c+8, 2c+9 in natural order): the lane
//    loads 8 bytes (channels [16r, 16r + 16)) of each of its four tokens.
#pragma once

namespace direct_path {

constexpr int kHD = 128;
constexpr int kTok = 32;  // tokens per sub-chunk (two 16-token steps)

// One sub-chunk's codes and value metadata as this lane needs them.
template <bool INT8>
struct Chunk {
  uint4 ku[2][2];  // keys: [step][row r / r + 8], 16 bytes at 16c
  uint4 kl[INT8 ? 2 : 1][2];
  uint2 vu[2][4];  // values: [step][token 2c, 2c+1, 2c+8, 2c+9], 8 bytes at 8r
  uint2 vl[INT8 ? 2 : 1][4];
  uint16_t vs[2][2];  // value scale / min (fp16) of tokens 16 st + 8 jb + r
  uint16_t vm[2][2];
};

// Pointers of one kv head (token 0).
struct Head {
  const uint8_t* ku;
  const uint8_t* kl;
  const uint8_t* vu;
  const uint8_t* vl;
  const uint16_t* vs;
  const uint16_t* vm;
};

// This lane's byte offsets from the kv head's planes in the current sub-chunk (Chunk's fragment
// maps): keys at token row r, byte 16c; values at token 2c, byte 8r; value scale / min at token
// r. 32-bit offsets from warp-uniform bases keep the addresses in few registers, every load of a
// sub-chunk is offset + immediate, and the next sub-chunk is three adds away.
struct LanePtrs {
  uint32_t k;  // bytes into ku / kl
  uint32_t v;  // bytes into vu / vl
  uint32_t m;  // elements into vs / vm

  __device__ static LanePtrs at(int t_sub) {
    const int lane = threadIdx.x & 31, r = lane >> 2, c = lane & 3;
    constexpr int RB = kHD / 2;
    return {static_cast<uint32_t>((t_sub + r) * RB + 16 * c),
            static_cast<uint32_t>((t_sub + 2 * c) * RB + 8 * r), static_cast<uint32_t>(t_sub + r)};
  }

  // The same lane's offsets one sub-chunk further on.
  __device__ void advance() {
    k += kTok * (kHD / 2);
    v += kTok * (kHD / 2);
    m += kTok;
  }
};

// The key codes of 16-token step st of the sub-chunk at lp.
template <bool INT8>
__device__ __forceinline__ void load_keys(const Head& hd, const LanePtrs& lp, int st,
                                          Chunk<INT8>& ch) {
  constexpr int RB = kHD / 2;
  // Pointer first, then the immediate (a 32-bit sum could wrap: no folding into the load).
  const uint8_t* ku = hd.ku + lp.k;
  [[maybe_unused]] const uint8_t* kl = INT8 ? hd.kl + lp.k : nullptr;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int off = (16 * st + 8 * j) * RB;
    ch.ku[st][j] = load_stream_16(reinterpret_cast<const uint4*>(ku + off));
    if constexpr (INT8) ch.kl[st][j] = load_stream_16(reinterpret_cast<const uint4*>(kl + off));
  }
}

// The value codes and value scale / min of 16-token step st of the sub-chunk at lp.
template <bool INT8>
__device__ __forceinline__ void load_values(const Head& hd, const LanePtrs& lp, int st,
                                            Chunk<INT8>& ch) {
  constexpr int RB = kHD / 2;
  const uint8_t* vu = hd.vu + lp.v;
  [[maybe_unused]] const uint8_t* vl = INT8 ? hd.vl + lp.v : nullptr;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int off = (16 * st + (i & 1) + 8 * (i >> 1)) * RB;
    ch.vu[st][i] = __ldg(reinterpret_cast<const uint2*>(vu + off));
    if constexpr (INT8) ch.vl[st][i] = __ldg(reinterpret_cast<const uint2*>(vl + off));
  }
  const uint16_t* vs = hd.vs + lp.m;
  const uint16_t* vm = hd.vm + lp.m;
#pragma unroll
  for (int jb = 0; jb < 2; ++jb) {
    ch.vs[st][jb] = __ldg(vs + 16 * st + 8 * jb);
    ch.vm[st][jb] = __ldg(vm + 16 * st + 8 * jb);
  }
}

// A whole sub-chunk (both steps, keys then values of each).
template <bool INT8>
__device__ __forceinline__ void load_chunk(const Head& hd, const LanePtrs& lp, Chunk<INT8>& ch) {
#pragma unroll
  for (int st = 0; st < 2; ++st) {
    load_keys<INT8>(hd, lp, st, ch);
    load_values<INT8>(hd, lp, st, ch);
  }
}

// ---- the per-warp cp.async ring (kRing) ----
// Without it every sub-chunk's loads are issued just before use and each warp waits a DRAM round
// trip per sub-chunk (ncu: long-scoreboard stalls, 0.47 instructions issued per scheduler per
// cycle). With it a warp copies its sub-chunks into its own two shared-memory slots, two ahead:
// once a slot's fragments are in registers the slot takes the sub-chunk after next. No block
// barrier (each warp's slots are its own). A slot: the planes' code rows (ku, vu[, kl, vl]; 64 B
// per token), the 32 value scales and the 32 value mins (fp16), and where the sub-chunk starts a
// key group (or the warp's range) that group's key scales and mins, read by the fold: no load in
// the loop waits on global memory.
template <bool INT8>
struct RingSlot {
  static constexpr int kRowBytes = kHD / 2;
  static constexpr int kPlaneBytes = kTok * kRowBytes;
  static constexpr int kPlanes = INT8 ? 4 : 2;
  static constexpr int kMetaBytes = kTok * 2;
  static constexpr int kKeyMeta = kPlanes * kPlaneBytes + 2 * kMetaBytes;  // scales, then mins
  static constexpr int kBytes = kKeyMeta + 2 * kHD * 2;
};
// A ring with several tiles per warp is refilled in key and value halves, one slot per warp, and
// the full-precision rows run after the loop with their states in the rings' memory
// (quant_split_direct; the host's block_smem lays the block out by the same rule).
constexpr bool ring_halves(bool ring, int tiles) {
  return ring && tiles > 1;
}

// Slots per warp of a ring: two with one tile per warp; one with several (ring_halves).
constexpr int ring_slots(int tiles) {
  return tiles > 1 ? 1 : 2;
}

template <bool INT8>
constexpr int ring_bytes_per_warp(int tiles) {
  return ring_slots(tiles) * RingSlot<INT8>::kBytes;
}

// The parts of a sub-chunk a ring copy or read takes: the key planes (and the key group's
// metadata), the value planes and the value scales / mins, or both.
enum RingPart : int { kRingKeys = 1, kRingValues = 2, kRingBoth = 3 };

// Where byte b of token row t (t < 32) of a plane lies in a slot: rows 4..7 of every 8 swap their
// pairs and the 16-byte pieces of rows 2, 3 (mod 4) swap their halves, so that the value reads (a
// half warp: 4 tokens two rows apart x 32 bytes) hit 32 distinct banks; the key reads (a quarter
// warp: two adjacent rows, 128 bytes) stay within one 128-byte line.
__device__ __forceinline__ int ring_swizzle(int t, int b) {
  const int row = t ^ ((t >> 2) & 1);
  const int piece = (b >> 4) ^ (((t >> 1) & 1) << 1);
  return row * RingSlot<false>::kRowBytes + piece * 16 + (b & 15);
}

// This lane's constant byte offsets in a slot (Chunk's fragment maps; the sub-chunk's step and
// row block add immediates): keys at row r, byte 16c; values at token 2c (+1 for the odd tokens),
// byte 8r; value scale / min at token r; and its cp.async pieces (row lane / 4, piece lane % 4).
struct RingLane {
  int k, v_even, v_odd, m, copy;

  __device__ static RingLane make() {
    const int lane = threadIdx.x & 31, r = lane >> 2, c = lane & 3;
    return {ring_swizzle(r, 16 * c), ring_swizzle(2 * c, 8 * r), ring_swizzle(2 * c + 1, 8 * r),
            2 * r, ring_swizzle(lane >> 2, 16 * (lane & 3))};
  }
};

// Issues the copy of a key group's scales and mins (ks, km) into the slot of the sub-chunk that
// starts it: 16 x 16 bytes of scales, then of mins.
template <bool INT8>
__device__ __forceinline__ void ring_copy_key_meta(unsigned char* slot, const uint16_t* ks,
                                                   const uint16_t* km) {
  const int lane = threadIdx.x & 31;
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(slot));
  cp_async16(dst + RingSlot<INT8>::kKeyMeta + 16 * lane,
             lane < 16 ? ks + 8 * lane : km + 8 * (lane - 16));
}

// This lane's cp.async sources of the INT4 view's ring copies, kept from copy to copy: its
// 16-byte piece (row lane / 4, piece lane % 4 of every 8 rows) of each plane as 32-bit byte
// offsets from the kv head's planes (LanePtrs' reason) and, lanes < 8, the value scales (lanes
// 0-3) or mins (4-7); each part's advance by a sub-chunk as it is copied. The one-query draft's
// loop then takes 36 instead of 55 instructions per sub-chunk for its copies. The INT8 view
// (short of registers at 192) forms them from the sub-chunk's position at each copy: kept there,
// its loop recomputed RingLane and ran slower (docs/perf.md, session 29).
struct RingSource {
  uint32_t k, v;
  const uint16_t* meta;

  __device__ static RingSource at(const Head& hd, int t_sub) {
    const int lane = threadIdx.x & 31;
    const uint32_t off = static_cast<uint32_t>(t_sub * (kHD / 2) + 16 * lane);
    return {off, off, (lane < 4 ? hd.vs : hd.vm) + t_sub + 8 * (lane & 3)};
  }
};

// Issues the copy of part `kPart` of the sub-chunk at token t_sub into `slot` (the caller commits
// the group), the keys with the key group's scales and mins at ks / km unless they are null.
// INT4: from `src` (advanced past the part; t_sub unused).
template <bool INT8, int kPart = kRingBoth>
__device__ __forceinline__ void ring_copy(const Head& hd, RingSource& src, int t_sub,
                                          unsigned char* slot, const RingLane& rl,
                                          const uint16_t* ks, const uint16_t* km) {
  using S = RingSlot<INT8>;
  const int lane = threadIdx.x & 31;
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(slot));
  const uint8_t* planes[4] = {hd.ku, hd.vu, hd.kl, hd.vl};  // even: keys, odd: values
  const int64_t pos = static_cast<int64_t>(t_sub) * S::kRowBytes + 16 * lane;  // INT8
#pragma unroll
  for (int pl = 0; pl < S::kPlanes; ++pl) {
    const bool keys = pl % 2 == 0;
    if (!(kPart & (keys ? kRingKeys : kRingValues))) continue;
    const uint8_t* from = planes[pl] + (INT8 ? pos : keys ? src.k : src.v);
#pragma unroll
    for (int i = 0; i < S::kPlaneBytes / 512; ++i) {  // 8 rows = 512 bytes per warp instruction
      cp_async16(dst + pl * S::kPlaneBytes + i * 512 + rl.copy, from + i * 512);
    }
  }
  if ((kPart & kRingValues) && lane < 8) {  // 4 x 16 bytes of scales, then of mins
    const uint16_t* meta = INT8 ? (lane < 4 ? hd.vs : hd.vm) + t_sub + 8 * (lane & 3) : src.meta;
    cp_async16(dst + S::kPlanes * S::kPlaneBytes + 16 * lane, meta);
  }
  if ((kPart & kRingKeys) && ks != nullptr) ring_copy_key_meta<INT8>(slot, ks, km);
  if constexpr (!INT8) {
    if constexpr (kPart & kRingKeys) src.k += S::kPlaneBytes;
    if constexpr (kPart & kRingValues) {
      src.v += S::kPlaneBytes;
      src.meta += kTok;
    }
  }
}

// Part `kPart` of the sub-chunk in `slot` as this lane's fragments (what load_keys /
// load_values read from global memory).
template <bool INT8, int kPart = kRingBoth>
__device__ __forceinline__ void ring_read(const unsigned char* slot, const RingLane& rl,
                                          Chunk<INT8>& ch) {
  using S = RingSlot<INT8>;
  constexpr int RB = S::kRowBytes, PB = S::kPlaneBytes;
#pragma unroll
  for (int st = 0; st < 2; ++st) {
    if constexpr (kPart & kRingKeys) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int off = rl.k + (16 * st + 8 * j) * RB;
        ch.ku[st][j] = *reinterpret_cast<const uint4*>(slot + off);
        if constexpr (INT8) ch.kl[st][j] = *reinterpret_cast<const uint4*>(slot + 2 * PB + off);
      }
    }
    if constexpr (kPart & kRingValues) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int off = (i & 1 ? rl.v_odd : rl.v_even) + (16 * st + 8 * (i >> 1)) * RB;
        ch.vu[st][i] = *reinterpret_cast<const uint2*>(slot + PB + off);
        if constexpr (INT8) ch.vl[st][i] = *reinterpret_cast<const uint2*>(slot + 3 * PB + off);
      }
      const uint16_t* meta = reinterpret_cast<const uint16_t*>(slot + S::kPlanes * PB + rl.m);
#pragma unroll
      for (int jb = 0; jb < 2; ++jb) {
        ch.vs[st][jb] = meta[16 * st + 8 * jb];
        ch.vm[st][jb] = meta[kTok + 16 * st + 8 * jb];
      }
    }
  }
}

// The sub-chunks of a warp's range [b, e) that fold the queries with a new key group (the first,
// then each that starts a group) and that group's key scales / mins: the loop and the ring's
// copies (which carry the metadata along) walk the same schedule.
struct KeyGroups {
  int next = 0;   // the next sub-chunk that folds
  int first_gap;  // sub-chunks from b to the next group
  int step;       // sub-chunks per group
  const uint16_t* ks;
  const uint16_t* km;

  __device__ KeyGroups(const uint16_t* k_scale, const uint16_t* k_min, int b, int G)
      : first_gap((G - b % G) / kTok),
        step(G / kTok),
        ks(k_scale + static_cast<int64_t>(b / G) * kHD),
        km(k_min + static_cast<int64_t>(b / G) * kHD) {}

  __device__ bool folds(int j) const { return j == next; }
  // After sub-chunk j (which folded): the next group.
  __device__ void advance(int j) {
    ks += kHD;
    km += kHD;
    next = j == 0 ? first_gap : j + step;
  }
};

__device__ __forceinline__ uint32_t word_at(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}
__device__ __forceinline__ uint32_t word_at(const uint2& v, int i) {
  return i == 0 ? v.x : v.y;
}

// The online-softmax state of a warp's tile (8 query vectors x head_dim 128) in the O^T
// fragment layout: o[u][i] is channel ch(u) + (i >> 1) of query 2c + (i & 1), with ch(u) =
// 16r + 8 (u / 4) + 2 (u % 4), covering channels 16r .. 16r + 15.
struct DirectTile {
  float o[8][4];
  float m_run[2], l_part[2], acc_min[2];  // of queries 2c, 2c+1 (l and min: this lane's share)
  int bq[2];  // quantized positions [0, bq) visible to queries 2c, 2c+1

  __device__ void init_tile(int b0, int b1) {
#pragma unroll
    for (int u = 0; u < 8; ++u) {
#pragma unroll
      for (int i = 0; i < 4; ++i) o[u][i] = 0.0f;
    }
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      m_run[k] = kNegInf;
      l_part[k] = 0.0f;
      acc_min[k] = 0.0f;
    }
    bq[0] = b0;
    bq[1] = b1;
  }

  // o_s: [8][HD], ml_s: [8][2] of this warp's tile; O^T = o * scale + the min term, rows r + 8
  // (the odd channels) at scale_odd. kEven (kEvenCols): column 2c is query c (row c), the odd
  // columns are not stored.
  template <bool kEven = false>
  __device__ void store_tile(float* o_s, float* ml_s, float scale, float scale_odd) {
    const int lane = threadIdx.x & 31, r = lane >> 2, c = lane & 3;
#pragma unroll
    for (int k = 0; k < (kEven ? 1 : 2); ++k) {
#pragma unroll
      for (int off = 4; off < 32; off *= 2) {
        l_part[k] += __shfl_xor_sync(kFullMask, l_part[k], off);
        acc_min[k] += __shfl_xor_sync(kFullMask, acc_min[k], off);
      }
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int ch = 16 * r + 8 * (u >> 2) + 2 * (u & 3);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if (kEven && (i & 1)) continue;
        const int q = kEven ? c : 2 * c + (i & 1);
        o_s[q * kHD + ch + (i >> 1)] = o[u][i] * (i >> 1 ? scale_odd : scale) + acc_min[i & 1];
      }
    }
    if (r == 0) {
#pragma unroll
      for (int k = 0; k < (kEven ? 1 : 2); ++k) {
        const int q = kEven ? c : 2 * c + k;
        ml_s[2 * q] = m_run[k];
        ml_s[2 * q + 1] = l_part[k];
      }
    }
  }
};

// kLo: the f16 hi + lo operand pair (f32-level accuracy); false (the single-MMA variant: the
// draft view's QuantAttentionTuning::draft_f16, the INT8 view's int8_f16): hi alone, bq_lo unused.
// NT: 8-query tiles per warp sharing one unpacking of every code (a verification block of more
// than 8 query vectors per kv head). Their folded queries' B fragments (32 words per lane per
// tile) then live in the warp's own shared-memory slice `frag_s` instead of registers, next to NT
// O^T tiles; each lane reads back only what it wrote. Fewer instructions than NT warps, but more
// registers per warp: which is faster depends on the warps per SM (auto_direct_tiles).
// kTC (TileCols, one tile): which query vectors the tile's columns hold. kOneCol: the tile's
// first query vector is its only one (an MHA draft step: one query per kv head): the second
// query column of every lane (2c + 1) is left out of the scores, the softmax, the min terms and
// the rescale (its weights are 0), ~50 of ~575 instructions per sub-chunk, and the whole warp
// folds the query (fold_one_query); query 2c's arithmetic is otherwise unchanged. kEvenCols: the
// same loop for up to 4 query vectors, query j in column 2j (fold_queries folds row r / 2).
template <bool INT8, bool kLo = true, int NT = 1, int kTC = kPairCols>
struct DirectPath {
  static constexpr int HD = kHD;
  static constexpr float kStepMul = INT8 ? 0.0625f : 1.0f;
  // The draft view's f16-operand path (INT4, hi alone) takes the codes as f16 subnormals, one lop3
  // per two codes (int4_low_nibbles_sub): not centred (the f32 accumulators' cancellation, ~2e-8
  // relative per position a warp reads, stays far below that view's f16 operands and its INT4
  // error), 2^-24 and the high nibbles' 16 undone in f32 (inv_f, store).
  static constexpr bool kSub = !INT8 && !kLo;
  static constexpr float kCenter = kSub ? 0.0f : INT8 ? 120.0f : 8.0f;  // as MmaPath: centred
  static constexpr uint32_t kBias = INT8 ? 0x64806480u : 0x64086408u;
  static constexpr int kQStride = HD + kQPad;
  static constexpr bool kSharedFrags = NT > 1;
  static constexpr bool kOne = kTC == kOneCol, kEven = kTC == kEvenCols;
  static_assert(kTC == kPairCols || NT == 1, "one or even columns: one tile");
  static constexpr int kCols = kTC == kPairCols ? 2 : 1;  // query columns per lane computed
  // uint2s of frag_s: [tile][block w][k-step h][hi | lo][lane].
  static constexpr int kFragUint2s = NT * 4 * 2 * 2 * 32;

  DirectTile tile[NT];
  // One tile: folded query r's B fragments in registers, k-step (w, h).
  uint32_t bq_hi[kSharedFrags ? 1 : 4][2][2], bq_lo[kSharedFrags ? 1 : 4][2][2];
  uint2* frag_s;                  // NT > 1: kFragUint2s, this warp's alone
  float inv_f[NT][2], qm[NT][2];  // 2^-F and q.mid of queries 2c, 2c+1 of each tile
  int e_run;                      // o is scaled by 2^e_run (the value steps: shared by the tiles)

  // bnd[t][k]: the quantized boundary of query 2c + k of tile t.
  // frags: NT > 1, kFragUint2s of shared memory.
  __device__ void init(const int (&bnd)[NT][2], uint2* frags) {
#pragma unroll
    for (int t = 0; t < NT; ++t) tile[t].init_tile(bnd[t][0], bnd[t][1]);
    e_run = 64;
    frag_s = frags;
  }

  // Query r of every tile (q_warp: the warp's pre-scaled [8 NT][kQStride] rows) folded with the
  // key group's scale/min (global): block w holds channels 32c + 8w .. +7 (k-steps 2w, 2w + 1).
  // kShared: k_scale / k_min in shared memory (the ring's slot), else global.
  template <bool kShared = false>
  __device__ void fold_queries(const float* q_warp, const uint16_t* k_scale,
                               const uint16_t* k_min) {
    if constexpr (kOne) {
      fold_one_query<kShared>(q_warp, k_scale, k_min);
      return;
    }
    const int lane = threadIdx.x & 31, c = lane & 3;
    int d0[4];
    uint4 sr[4], mr[4];
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      d0[w] = 32 * c + 8 * w;
      const uint4* s4 = reinterpret_cast<const uint4*>(k_scale + d0[w]);
      const uint4* m4 = reinterpret_cast<const uint4*>(k_min + d0[w]);
      sr[w] = kShared ? *s4 : __ldg(s4);
      mr[w] = kShared ? *m4 : __ldg(m4);
    }
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const float* q_row = q_warp + (8 * t + (kEven ? lane >> 3 : lane >> 2)) * kQStride;
      if constexpr (kSharedFrags) {  // one block's fragments at a time
        const float sf = fold_query_scale<4>(q_row, d0, sr, mr, kStepMul, kCenter, inv_f[t], qm[t]);
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          uint32_t hi[2][2], lo[2][2];
          fold_query_block<kLo, !INT8>(q_row + d0[w], sr[w], kStepMul, sf, hi, lo);
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            uint2* f = frag_s + ((t * 4 + w) * 2 + h) * 64 + lane;
            f[0] = make_uint2(hi[h][0], hi[h][1]);
            if constexpr (kLo) f[32] = make_uint2(lo[h][0], lo[h][1]);
          }
        }
      } else {
        fold_query<4, kLo, !INT8, kSub>(q_row, d0, sr, mr, kStepMul, kCenter, bq_hi, bq_lo,
                                        inv_f[t], qm[t]);
      }
    }
  }

  // kOne: the tile's one query vector (row 0 of q_warp) folded by the whole warp instead of by
  // its four lanes (the other 28 folding the tile's empty rows). Lane l takes k-step h = l % 2 of
  // 8-channel block l / 2 (block w of lane (0, c) is block 4c + w): channels d = 8 (l / 2) + 2h,
  // d + 4 (its b0 word) and d + 1, d + 5 (b1), with fold_query_block's arithmetic; the warp
  // reduces the largest |Q'| and q . min, and lane (r, c) gathers the 16 words of its blocks from
  // lanes 8c + 2w + h. Every row r gets query 0's fragments (the columns 2c > 0 repeat it; their
  // results are not read). ~108 instructions per key group instead of ~310 (SASS); the same f16
  // fragments and 2^F as fold_query, q . min summed in another order (a tree over the warp).
  template <bool kShared>
  __device__ void fold_one_query(const float* q_row, const uint16_t* k_scale,
                                 const uint16_t* k_min) {
    static_assert(kOne && kSub, "the one-query fold: the draft view's f16 operands");
    const int lane = threadIdx.x & 31, c = lane & 3;
    const int d = 8 * (lane >> 1) + 2 * (lane & 1);
    auto half2_at = [&](const uint16_t* p) {
      const uint32_t w = kShared ? *reinterpret_cast<const uint32_t*>(p)
                                 : __ldg(reinterpret_cast<const unsigned int*>(p));
      return __half22float2(*reinterpret_cast<const __half2*>(&w));
    };
    const float2 q01 = *reinterpret_cast<const float2*>(q_row + d);
    const float2 q45 = *reinterpret_cast<const float2*>(q_row + d + 4);
    const float2 s01 = half2_at(k_scale + d), s45 = half2_at(k_scale + d + 4);
    const float2 m01 = half2_at(k_min + d), m45 = half2_at(k_min + d + 4);
    // Channels d, d + 4 | d + 1, d + 5.
    const float x[4] = {q01.x * (s01.x * kStepMul), q45.x * (s45.x * kStepMul),
                        q01.y * (s01.y * kStepMul), q45.y * (s45.y * kStepMul)};
    float amax = fmaxf(fmaxf(fabsf(x[0]), fabsf(x[1])), fmaxf(fabsf(x[2]), fabsf(x[3])));
    float qmp = fmaf(q01.x, m01.x, q01.y * m01.y) + fmaf(q45.x, m45.x, q45.y * m45.y);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      amax = fmaxf(amax, __shfl_xor_sync(kFullMask, amax, off));
      qmp += __shfl_xor_sync(kFullMask, qmp, off);
    }
    const int f = amax > 0.0f ? max(-100, min(100, 13 - ilogbf(amax))) : 0;
    const float sf = exp2i(f), sf1 = sf * 0.0625f;
    inv_f[0][0] = inv_f[0][1] = exp2i(-f) * 0x1p24f;
    qm[0][0] = qm[0][1] = qmp;
    uint32_t b[2], unused;
    f16x2_operand<false>(x[0] * sf, x[1] * sf, b[0], unused);
    f16x2_operand<false>(x[2] * sf1, x[3] * sf1, b[1], unused);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          bq_hi[w][h][i] = __shfl_sync(kFullMask, b[i], 8 * c + 2 * w + h);
        }
      }
    }
  }

  // Tile t's B fragments of k-step (w, h).
  __device__ __forceinline__ void query_frags(int t, int w, int h, uint32_t (&hi)[2],
                                              uint32_t (&lo)[2]) const {
    if constexpr (kSharedFrags) {
      const uint2* f = frag_s + ((t * 4 + w) * 2 + h) * 64 + (threadIdx.x & 31);
      const uint2 x = f[0];
      hi[0] = x.x, hi[1] = x.y;
      if constexpr (kLo) {
        const uint2 y = f[32];
        lo[0] = y.x, lo[1] = y.y;
      }
    } else {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        hi[i] = bq_hi[w][h][i];
        lo[i] = bq_lo[w][h][i];
      }
    }
  }

  // load_values(): loads ch's value part (a no-op if it is already there), called once the
  // scores are computed: with several tiles, the values then take the keys' registers.
  template <class LoadValues>
  __device__ void process(const Chunk<INT8>& ch, int t_sub, const LoadValues& load_values) {
    const int lane = threadIdx.x & 31, r = lane >> 2;

    // Scores: s[t][st][i], i = (token r | 8 + r) x (query 2c | 2c + 1) of tile t.
    float s[NT][2][4];
#pragma unroll
    for (int st = 0; st < 2; ++st) {
      float acc_hi[NT][4], acc_lo[NT][4];
#pragma unroll
      for (int t = 0; t < NT; ++t) {
#pragma unroll
        for (int i = 0; i < 4; ++i) acc_hi[t][i] = acc_lo[t][i] = 0.0f;
      }
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const uint32_t up[2] = {word_at(ch.ku[st][0], w), word_at(ch.ku[st][1], w)};
        const uint32_t lo[2] = {INT8 ? word_at(ch.kl[INT8 ? st : 0][0], w) : 0u,
                                INT8 ? word_at(ch.kl[INT8 ? st : 0][1], w) : 0u};
        auto frags = [&](int t, int h, uint32_t(&hi)[2], uint32_t(&lo_)[2]) {
          query_frags(t, w, h, hi, lo_);
        };
        score_block_tiles<INT8, kLo, NT, decltype(frags), kSub>(up, lo, frags, kBias, acc_hi,
                                                                acc_lo);
      }
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        finish_scores<kLo>(acc_hi[t], acc_lo[t], t_sub + 16 * st + r, tile[t].bq, inv_f[t], qm[t],
                           s[t][st]);
        if constexpr (kCols == 1) s[t][st][1] = s[t][st][3] = kNegInf;  // not computed (unused)
      }
    }

    load_values();
    float corr[NT][2], p[NT][2][4];
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      online_softmax_sub<kCols>(s[t], tile[t].m_run, tile[t].l_part, corr[t], p[t]);
      tile[t].acc_min[0] *= corr[t][0];
      if constexpr (kCols == 2) tile[t].acc_min[1] *= corr[t][1];
    }

    // Value steps of this lane's tokens 16 st + 8 jb + r; the min terms in f32.
    float vstep[2][2];
    float vmax = 0.0f;
#pragma unroll
    for (int st = 0; st < 2; ++st) {
#pragma unroll
      for (int jb = 0; jb < 2; ++jb) {
        vstep[st][jb] = __half2float(__ushort_as_half(ch.vs[st][jb])) * kStepMul;
        vmax = fmaxf(vmax, vstep[st][jb]);
        const float vmin = __half2float(__ushort_as_half(ch.vm[st][jb]));
        const float vmid = kSub ? vmin : fmaf(kCenter, vstep[st][jb], vmin);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
#pragma unroll
          for (int k = 0; k < kCols; ++k) {
            tile[t].acc_min[k] = fmaf(p[t][st][2 * jb + k], vmid, tile[t].acc_min[k]);
          }
        }
      }
    }
    float fe;
    const float se = value_scale_step(vmax, e_run, fe);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const float c0 = corr[t][0] * fe, c1 = corr[t][1] * fe;
      // Once the running maxima settle, most sub-chunks change no scale: skip the 32 products.
      if (__any_sync(kFullMask, c0 != 1.0f || (kCols == 2 && c1 != 1.0f))) {
#pragma unroll
        for (int u = 0; u < 8; ++u) {
          tile[t].o[u][0] *= c0;
          tile[t].o[u][2] *= c0;
          if constexpr (kCols == 2) {
            tile[t].o[u][1] *= c1;
            tile[t].o[u][3] *= c1;
          }
        }
      }
    }

    // O^T += V^T P^T, 16 tokens per k-step.
#pragma unroll
    for (int st = 0; st < 2; ++st) {
      uint32_t bh[NT][2];
      [[maybe_unused]] uint32_t bl[NT][2];
#pragma unroll
      for (int t = 0; t < NT; ++t) {
#pragma unroll
        for (int jb = 0; jb < 2; ++jb) {
          const float w = vstep[st][jb] * se;
          uint32_t h, l;
          f16x2_operand<kLo>(p[t][st][2 * jb] * w, kCols == 1 ? 0.0f : p[t][st][2 * jb + 1] * w, h,
                             l);
          bh[t][jb] = movmatrix_trans(h);
          if constexpr (kLo) bl[t][jb] = movmatrix_trans(l);
        }
      }
      auto mma_tiles = [&](int u, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3) {
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          mma_f16(tile[t].o[u], a0, a1, a2, a3, bh[t][0], bh[t][1]);
          if constexpr (kLo) mma_f16(tile[t].o[u], a0, a1, a2, a3, bl[t][0], bl[t][1]);
        }
      };
      if constexpr (!INT8) {
        // INT4 straight from the nibbles: bytes 2 half, 2 half + 1 of word wi of tokens (2c,
        // 2c+1) and (2c+8, 2c+9) side by side (x: [t0.b, t0.b+1, t1.b, t1.b+1]), so that the
        // low / high nibbles at bits 0 / 16 (4 / 20) of x and of x >> 8 are one channel of the
        // two tokens.
#pragma unroll
        for (int wi = 0; wi < 2; ++wi) {
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const uint32_t sel = half ? 0x7632u : 0x5410u;
            const uint32_t x01 =
                __byte_perm(word_at(ch.vu[st][0], wi), word_at(ch.vu[st][1], wi), sel);
            const uint32_t x89 =
                __byte_perm(word_at(ch.vu[st][2], wi), word_at(ch.vu[st][3], wi), sel);
#pragma unroll
            for (int bb = 0; bb < 2; ++bb) {
              const uint32_t y01 = bb ? x01 >> 8 : x01, y89 = bb ? x89 >> 8 : x89;
              if constexpr (kSub) {  // rows r + 8 (the high nibbles) at 16x
                mma_tiles(4 * wi + 2 * half + bb, int4_low_nibbles_sub(y01),
                          int4_high_nibbles_sub(y01), int4_low_nibbles_sub(y89),
                          int4_high_nibbles_sub(y89));
              } else {
                mma_tiles(4 * wi + 2 * half + bb, int4_low_nibbles_f16x2(y01),
                          int4_high_nibbles_f16x2(y01), int4_low_nibbles_f16x2(y89),
                          int4_high_nibbles_f16x2(y89));
              }
            }
          }
        }
      } else {
#pragma unroll
        for (int wi = 0; wi < 2; ++wi) {
          // Even / odd channel codes of tokens 2c, 2c+1, 2c+8, 2c+9 (word wi: channels 16r +
          // 8wi..).
          uint32_t ev[4], od[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            codes_even_odd<true>(word_at(ch.vu[st][i], wi), word_at(ch.vl[st][i], wi), ev[i],
                                 od[i]);
          }
#pragma unroll
          for (int half = 0; half < 2; ++half) {  // bytes {0, 1} or {2, 3} of each word
            const uint32_t pair_sel = half ? 0x7362u : 0x5140u;
            // [t0.b, t1.b, t0.b+1, t1.b+1] for tokens (2c, 2c+1) and (2c+8, 2c+9).
            const uint32_t e01 = __byte_perm(ev[0], ev[1], pair_sel);
            const uint32_t e89 = __byte_perm(ev[2], ev[3], pair_sel);
            const uint32_t o01 = __byte_perm(od[0], od[1], pair_sel);
            const uint32_t o89 = __byte_perm(od[2], od[3], pair_sel);
#pragma unroll
            for (int bb = 0; bb < 2; ++bb) {
              const int u = 4 * wi + 2 * half + bb;
              const uint32_t sel = bb ? 0x4342u : 0x4140u;
              // a0: row r (the channel), tokens 2c, 2c+1; a1: row r + 8 (channel + 1); a2, a3:
              // tokens 2c+8, 2c+9.
              const uint32_t a0 = codes_to_f16x2(e01, sel, kBias);
              const uint32_t a1 = codes_to_f16x2(o01, sel, kBias);
              const uint32_t a2 = codes_to_f16x2(e89, sel, kBias);
              const uint32_t a3 = codes_to_f16x2(o89, sel, kBias);
              mma_tiles(u, a0, a1, a2, a3);
            }
          }
        }
      }
    }
  }

  // o_s: [8 NT][HD], ml_s: [8 NT][2] of this warp. With shared fragments o_s is frag_s's memory:
  // every lane is done reading them first.
  __device__ void store(float* o_s, float* ml_s) {
    if constexpr (kSharedFrags) __syncwarp();
    const float scale = exp2i(kSub ? 24 - e_run : -e_run);
    const float scale_odd = kSub ? scale * 0.0625f : scale;
#pragma unroll
    for (int t = 0; t < NT; ++t)
      tile[t].template store_tile<kEven>(o_s + t * 8 * kHD, ml_s + t * 16, scale, scale_odd);
  }
};

// Before the previous kernel is awaited (PDL): asks L2 for what the block reads first, its
// full-precision rows and each slice's first sub-chunk (the view's code planes, value scales and
// mins, the key group's scales and mins), so that those DRAM round trips overlap the wait. No
// effect on the results: L2 is coherent, and the rows the previous kernel writes are read after
// the wait.
template <bool INT8>
__device__ __forceinline__ void prefetch_block_start(const Params& p) {
  const QuantAttentionArgs& a = p.a;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (warp % p.tiles != 0) return;  // one warp per slice
  const int ts = warp / p.tiles, kvh = blockIdx.y;
  auto fetch = [](const void* ptr, uint32_t bytes) {
    if ((reinterpret_cast<uintptr_t>(ptr) & 15) == 0) prefetch_l2(ptr, bytes);
  };
  if (ts == 0) {
    const auto [begin, end] = split_fp_rows(p);
    const int elem = a.kv_dtype == DType::F16 ? 2 : 4;
    for (int t = begin + lane; t < end; t += 32) {
      const int64_t off = (static_cast<int64_t>(t - a.fp_base) * a.row_stride + kvh * kHD) * elem;
      fetch(static_cast<const char*>(a.k) + off, kHD * elem);
      fetch(static_cast<const char*>(a.v) + off, kHD * elem);
    }
  }
  const auto [b, e] = slice_quantized(p, split_quantized(p), ts);
  if (b + kTok > e) return;
  const int G = a.seg.group_size;
  const int64_t C = a.seg.capacity;
  const int64_t codes = (static_cast<int64_t>(kvh) * C + b) * (kHD / 2);
  const int64_t vmeta = static_cast<int64_t>(kvh) * C + b;
  const int64_t kmeta = (static_cast<int64_t>(kvh) * (C / G) + b / G) * kHD;
  constexpr uint32_t kCodes = kTok * (kHD / 2), kMeta = kTok * 2, kKeyMeta = kHD * 2;
  // Lanes 0-3: the code planes (the lower ones for INT8 only); 4-7: value, then key metadata.
  if (lane < 4) {
    const uint8_t* plane = lane == 0   ? a.seg.key_upper
                           : lane == 1 ? a.seg.value_upper
                           : lane == 2 ? a.seg.key_lower
                                       : a.seg.value_lower;
    if (INT8 || lane < 2) fetch(plane + codes, kCodes);
  } else if (lane < 8) {
    const uint16_t* meta = lane == 4   ? a.seg.value_scale + vmeta
                           : lane == 5 ? a.seg.value_min + vmeta
                           : lane == 6 ? a.seg.key_scale + kmeta
                                       : a.seg.key_min + kmeta;
    fetch(meta, lane < 6 ? kMeta : kKeyMeta);
  }
}

// A quantized split [begin, end) of kv head kvh for the warp's 8 NT query vectors: slice `ts` of
// the block's warps takes the contiguous positions [begin + ts * len, +len), len = q_split_len /
// slices (INT4 with kRegPrefetch: one sub-chunk ahead in registers). No barrier, no shared memory
// but the warp's own (NT > 1: the folded queries in o_mine until the state is stored there):
// `overlap()` (the full-precision rows) runs first (after the loop with several tiles and the
// ring, below).
// kRing: the sub-chunks stream through this warp's cp.async ring at `ring` (ring_bytes_per_warp)
// instead (no register prefetch). One tile: two slots, each sub-chunk copied whole two ahead.
// Several tiles (the values are read once the scores are done, registers): one slot refilled in
// halves, the next sub-chunk's keys once this one's are read, its values once these are; and the
// full-precision rows run after the loop (`overlap()` then writes its states over the block's
// rings: a block barrier first), so that the block's shared memory keeps four blocks per SM.
// kTC: DirectPath's TileCols form (which query vectors the warp's tile columns hold).
template <bool INT8, bool kF16, bool kRegPrefetch, int NT, bool kRing, int kTC, class Overlap>
__device__ __forceinline__ void quant_split_direct(const Params& p, int begin, int end, int kvh,
                                                   int ts, int qv_warp, const float* q_warp,
                                                   float* o_mine, float* ml_mine,
                                                   unsigned char* ring, const Overlap& overlap) {
  const QuantAttentionArgs& a = p.a;
  const int lane = threadIdx.x & 31, c = lane & 3;
  const int G = a.seg.group_size;
  const int64_t C = a.seg.capacity;
  const auto [b, e] = slice_quantized(p, {begin, end}, ts);
  const int n_subs = e > b ? (e - b) / kTok : 0;
  const int64_t codes = static_cast<int64_t>(kvh) * C * (kHD / 2);
  const Head head{a.seg.key_upper + codes,
                  INT8 ? a.seg.key_lower + codes : nullptr,
                  a.seg.value_upper + codes,
                  INT8 ? a.seg.value_lower + codes : nullptr,
                  a.seg.value_scale + static_cast<int64_t>(kvh) * C,
                  a.seg.value_min + static_cast<int64_t>(kvh) * C};
  const uint16_t* k_scale = a.seg.key_scale + static_cast<int64_t>(kvh) * (C / G) * kHD;
  const uint16_t* k_min = a.seg.key_min + static_cast<int64_t>(kvh) * (C / G) * kHD;

  // INT4: the next sub-chunk is loaded while this one is computed (2 x 40 registers); INT8 (twice
  // the codes) loads each sub-chunk just before use and relies on the other warps.
  constexpr bool kPrefetch = !INT8 && kRegPrefetch && !kRing;
  constexpr bool kHalves = ring_halves(kRing, NT);
  constexpr int kSlots = ring_slots(NT);
  const RingLane rl = kRing ? RingLane::make() : RingLane{};
  auto slot = [&](int j) { return ring + (j % kSlots) * RingSlot<INT8>::kBytes; };
  // The ring's copies carry the key metadata of the sub-chunks that fold (with the keys).
  KeyGroups copy_groups(k_scale, k_min, b, G);
  // Part kPart of sub-chunk j into slot(j), then commit (empty past the end).
  RingSource src = kRing && !INT8 ? RingSource::at(head, b) : RingSource{};
  auto copy_sub = [&](int j, auto part) {
    constexpr int kPart = decltype(part)::value;
    if (j < n_subs) {
      const bool fold = (kPart & kRingKeys) && copy_groups.folds(j);
      // The key group's metadata: INT8 inside ring_copy (as the kernel measured in session 28),
      // INT4 after it (5 fewer instructions per sub-chunk than selecting a null pointer).
      const bool meta_inside = INT8 && fold;
      ring_copy<INT8, kPart>(head, src, b + j * kTok, slot(j), rl,
                             meta_inside ? copy_groups.ks : nullptr,
                             meta_inside ? copy_groups.km : nullptr);
      if (!INT8 && fold) ring_copy_key_meta<INT8>(slot(j), copy_groups.ks, copy_groups.km);
      if (fold) copy_groups.advance(j);
    }
    cp_async_commit();
  };
  using Keys = std::integral_constant<int, kRingKeys>;
  using Values = std::integral_constant<int, kRingValues>;
  using Both = std::integral_constant<int, kRingBoth>;
  if constexpr (kHalves) {  // commit groups: keys of j, values of j, keys of j + 1, ...
    copy_sub(0, Keys{});
    copy_sub(0, Values{});
  } else if constexpr (kRing) {  // the first sub-chunks stream in while the fp rows run
#pragma unroll
    for (int j = 0; j < kSlots; ++j) copy_sub(j, Both{});
  }
  // The full-precision rows first: their registers (RowPath) are dead before the chunks' are live.
  if constexpr (!kHalves) overlap();
  timeline_stamp(p, 3);
  LanePtrs lp = LanePtrs::at(b);
  Chunk<INT8> cur;
  if (kPrefetch && n_subs > 0) load_chunk<INT8>(head, lp, cur);

  using Path = DirectPath<INT8, !kF16, NT, kTC>;
  static_assert(Path::kFragUint2s * 2 <= 8 * NT * kHD, "the fragments fit in the warp's state");
  Path w;
  {
    int bnd[NT][2];
#pragma unroll
    for (int t = 0; t < NT; ++t) {
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const int qv = qv_warp + 8 * t + (Path::kEven ? c : 2 * c + k);  // column 2c + k's
        bnd[t][k] = qv < p.nq ? quant_boundary_dev(a.pos + qv / p.group, G) : 0;
      }
    }
    w.init(bnd, reinterpret_cast<uint2*>(o_mine));
  }
  // The queries are folded with each key group's scale / min where the group starts (and at the
  // first sub-chunk); with the ring the slot holds them.
  KeyGroups groups(k_scale, k_min, b, G);
  for (int j = 0; j < n_subs; ++j) {
    const int t_sub = b + j * kTok;
    auto fold = [&] {
      if (groups.folds(j)) {
        if constexpr (kRing) {
          const auto* meta = reinterpret_cast<const uint16_t*>(slot(j) + RingSlot<INT8>::kKeyMeta);
          w.template fold_queries<true>(q_warp, meta, meta + kHD);
        } else {
          w.fold_queries(q_warp, groups.ks, groups.km);
        }
        groups.advance(j);
      }
    };
    // Several tiles: folded before the loads, so that its temporaries and the chunk's registers
    // are not live together; one tile: while the loads are in flight.
    // Several tiles also load the values only once the scores are done (registers).
    if constexpr (Path::kSharedFrags && !kRing) fold();
    Chunk<INT8> nxt;
    if constexpr (kHalves) {
      cp_async_wait<1>();  // the keys of j have landed (its values may be in flight)
      __syncwarp();
      fold();  // reads the key metadata from the slot
      ring_read<INT8, kRingKeys>(slot(j), rl, cur);
      __syncwarp();  // every lane is done with the keys' half: it takes the keys of j + 1
      copy_sub(j + 1, Keys{});
    } else if constexpr (kRing) {
      cp_async_wait<kSlots - 1>();  // sub-chunk j has landed (j + 1 may be in flight)
      __syncwarp();
      ring_read<INT8>(slot(j), rl, cur);
      fold();        // reads the key metadata from the slot
      __syncwarp();  // every lane is done with the slot: it takes sub-chunk j + kSlots
      copy_sub(j + kSlots, Both{});
    } else if (kPrefetch) {
      if (j + 1 < n_subs) {
        LanePtrs ln = lp;
        ln.advance();
        load_chunk<INT8>(head, ln, nxt);
      }
    } else if constexpr (Path::kSharedFrags) {
      load_keys<INT8>(head, lp, 0, cur);
      load_keys<INT8>(head, lp, 1, cur);
    } else {
      load_chunk<INT8>(head, lp, cur);
    }
    if constexpr (!Path::kSharedFrags && !kRing) fold();
    w.process(cur, t_sub, [&] {
      if constexpr (kHalves) {
        cp_async_wait<1>();  // the values of j have landed (the keys of j + 1 may be in flight)
        __syncwarp();
        ring_read<INT8, kRingValues>(slot(j), rl, cur);
        __syncwarp();  // every lane is done with the values' half: it takes the values of j + 1
        copy_sub(j + 1, Values{});
      } else if constexpr (Path::kSharedFrags) {
        load_values<INT8>(head, lp, 0, cur);
        load_values<INT8>(head, lp, 1, cur);
      }
    });
    if constexpr (kPrefetch) cur = nxt;
    lp.advance();
  }
  timeline_stamp(p, 4);
  w.store(o_mine, ml_mine);
  if constexpr (kHalves) {  // the full-precision rows' states take the block's rings
    cp_async_wait<0>();
    __syncthreads();
    overlap();
  }
}

}  // namespace direct_path
