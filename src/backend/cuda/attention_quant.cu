// Attention over the hierarchical quantized KV cache: one split-KV kernel whose blocks each read a
// range of the quantized history and a share of the full-precision rows of one kv head (for all
// query heads of it), then attention.cu's combine merges the splits. Semantics:
// attention_quant.h; design and measurements: docs/cuda.md ("Quantized-KV attention").
//
// Conventions as attention.cu: scores in base-2 units (q pre-scaled by scale * log2 e), an
// online-softmax state {o unnormalized, m = max score, l = sum of 2^(s - m)} per query vector;
// a state that saw no visible position has m = -inf and weight 0 in every merge.
//
// Tensor-core path (quantized history, head_dim 64/128, G and Gv multiples of 32). A warp owns 8
// query vectors and a contiguous token range, processed 32 tokens (a sub-chunk) per pipeline stage:
// cp.async copies the sub-chunk's code rows (16-byte pieces, every plane the view reads) and
// metadata into shared memory, ldmatrix reads them back in mma fragment order.
//  - Scores S^T = K Q'^T on mma.m16n8k16 (A = 16 tokens x 16 channels of codes, B = 16 channels
//    x 8 queries): codes are small integers, exact in f16; Q' = q * step of the key group
//    (step = s or s/16), folded once per key group, split into f16 hi + lo halves after scaling
//    each query by a power of two 2^F that puts its largest |Q'| in [2^13, 2^14): hi + lo carry
//    ~22 significant bits, so the scores keep f32 accuracy. q . min (the other half of
//    q . (code * step + min)) is added in f32.
//  - Values O^T += V^T P^T (A = 16 channels x 16 tokens of codes via ldmatrix.trans, B = 16
//    tokens x 8 queries): B = p * step_v(token, value group), hi + lo, scaled by a power of two
//    2^E that only decreases (O is rescaled together with the softmax correction), moved from
//    the score fragment layout to the B layout by movmatrix; sum p * min per value group in f32.
//  - A code byte becomes f16 without a conversion instruction: prmt puts it into the mantissa of
//    1024 (0x6400 | b is exactly 1024 + b) and one f16x2 subtraction removes 1024 + 8 (INT4) or
//    1024 + 128 (INT8, where the byte is 16U + (L + 8)): the codes are centred on the middle of
//    their grid and the min replaced by the grid's midpoint (min + 8 s, min + 7.5 s), so the
//    product and the min terms do not cancel (MmaPath::kCenter). INT4 keys (and values on the
//    direct path) skip the byte unpacking: lop3 puts a nibble straight into that mantissa
//    (int4_low_nibbles_f16x2 / int4_high_nibbles_f16x2).
// CUDA-core path (the full-precision rows always; the quantized history for head_dim 32/256,
// G or Gv not a multiple of 32, or with the tensor cores switched off): a warp owns 8 query
// vectors (4 for head_dim 256), a lane head_dim/32 channels, 8 rows per step (4 quantized); the 8
// partial dot products of a row are reduced by a transposing butterfly (9 shuffles; each lane ends
// with one query's score).
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <type_traits>
#include <vector>

#include "backend/cuda/attention_quant.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/env_switch.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/mma.cuh"
#include "core/error.h"

namespace qs::cuda {

namespace {

constexpr float kNegInf = -INFINITY;
constexpr int kSubTokens = 32;  // quantized tokens per warp per pipeline stage
constexpr int kMaxTiles = 8;    // query tiles (warps) per block
constexpr int kMaxThreads = 32 * kMaxTiles;
constexpr int kQuantRowUnroll = 4;  // quantized rows per step of the CUDA-core path
// Full-precision rows per step of the CUDA-core path (loads in flight; registers for head_dim 256).
template <int HD>
constexpr int fp_row_unroll() {
  return HD <= 128 ? 8 : 4;
}
constexpr int kFpRowsPerWarp = 16;  // full-precision rows per warp a split aims at (2 steps)
constexpr int kQPad = 4;            // floats of padding per query row in shared memory

// Registers per thread: left alone, ptxas gives the tensor-core kernels 255, so a block of 5
// query tiles (GQA 4 at m = 9) fits once per SM; 192 fits two (spill-free but a word or two).
// __maxnreg__ needs nvcc 12.4; it excludes __launch_bounds__.
#if defined(__CUDACC_VER_MAJOR__) && \
    (__CUDACC_VER_MAJOR__ > 12 || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ >= 4))
#define QS_QUANT_ATTENTION_BOUNDS __maxnreg__(192)
// The register-direct kernels take their cap as a template parameter (QuantAttentionTuning::
// direct_regs): 168 fits 6 blocks of 2 warps per SM, 192 fits 4.
#define QS_QUANT_DIRECT_BOUNDS(regs) __maxnreg__(regs)
#else
#define QS_QUANT_ATTENTION_BOUNDS __launch_bounds__(kMaxThreads)
#define QS_QUANT_DIRECT_BOUNDS(regs) __launch_bounds__(kMaxThreads)
#endif

// Bytes of one warp's sub-chunk in a pipeline stage: code tiles [32 tokens][head_dim/2] of every
// plane read (keys then values), the key group's scale/min [head_dim] and the tokens' value
// scale/min [32][ng] (fp16). Every part is a multiple of 128 bytes.
constexpr int mma_sub_bytes(int head_dim, bool int8, int ng) {
  return 2 * (int8 ? 2 : 1) * kSubTokens * head_dim / 2 + 4 * head_dim + 4 * kSubTokens * ng;
}

// Everything the kernel reads (by value).
struct Params {
  QuantAttentionArgs a;
  int group;         // query heads per kv head
  int nq;            // query vectors per kv head: group * m
  int tiles;         // query tiles per block (QT)
  int slices;        // warps per query tile (TS), each on its own part of the split
  int fp_split_len;  // split x: full-precision rows [fp_begin + x * len, +len), below fp_end
  int fp_begin;
  int fp_end;
  int q_split_len;  // split x: quantized positions [x * len, +len), below q_end
  int q_end;
  int q_smem_bytes;   // the query tile; the pipeline stages and the merge buffer follow
  int stage_bytes;    // slices * chunk * mma_sub_bytes (tensor-core path), else 0
  int chunk;          // sub-chunks per slice per pipeline stage (tensor-core path)
  int stages;         // pipeline stages, 2..kQuantAttentionMaxStages (tensor-core path)
  int ring_offset;    // direct path with its per-warp ring: where the warps' rings start
  float* partial_o;   // [splits, m * num_heads, head_dim]
  float* partial_ml;  // [splits, m * num_heads, 2]
  unsigned long long* timeline;  // QuantAttentionTuning::timeline, or null
};

// Positions [begin, end) (empty when end <= begin).
struct PosRange {
  int begin;
  int end;
};
// This block's split (blockIdx.x): its full-precision rows and its quantized positions.
__device__ __forceinline__ PosRange split_fp_rows(const Params& p) {
  const int begin = p.fp_begin + blockIdx.x * p.fp_split_len;
  return {begin, min(p.fp_end, begin + p.fp_split_len)};
}
__device__ __forceinline__ PosRange split_quantized(const Params& p) {
  const int begin = blockIdx.x * p.q_split_len;
  return {begin, min(p.q_end, begin + p.q_split_len)};
}
// Token slice ts's contiguous part of the split's quantized positions (direct path).
__device__ __forceinline__ PosRange slice_quantized(const Params& p, PosRange split, int ts) {
  const int len = p.q_split_len / p.slices;
  const int b = split.begin + ts * len;
  return {b, min(split.end, b + len)};
}

// Diagnostics: the end of phase `i` of this block (kQuantTimelineSlots), by thread 0.
__device__ __forceinline__ void timeline_stamp(const Params& p, int i) {
  if (p.timeline == nullptr || threadIdx.x != 0) return;
  const int64_t block =
      (static_cast<int64_t>(blockIdx.z) * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
  unsigned long long* slots = p.timeline + block * kQuantTimelineSlots;
  slots[2 + i] = clock64();
  if (i == 0 || i == 6) {
    unsigned long long ns;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
    slots[i == 0 ? 0 : 1] = ns;
  }
  if (i == 0) {
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    slots[9] = sm;
  }
}

// ---- device helpers -------------------------------------------------------------------------

__device__ __forceinline__ int quant_boundary_dev(int t, int G) {
  return t >= 2 * G ? G * (t / G - 1) : 0;
}

// cp_async_wait<n> for a runtime n in [0, kQuantAttentionMaxStages - 2] (the pipeline depth is a
// plan parameter; wait_group takes an immediate).
__device__ __forceinline__ void cp_async_wait_n(int n) {
  static_assert(kQuantAttentionMaxStages - 2 <= 4, "cases below");
  switch (n) {
    case 0:
      cp_async_wait<0>();
      break;
    case 1:
      cp_async_wait<1>();
      break;
    case 2:
      cp_async_wait<2>();
      break;
    case 3:
      cp_async_wait<3>();
      break;
    default:
      cp_async_wait<4>();
      break;
  }
}

// Four 8x8 b16 matrices; lane i supplies the row address of row i % 8 of matrix i / 8.
template <bool kTrans>
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t (&d)[4]) {
  if constexpr (kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(addr)
                 : "memory");
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(addr)
                 : "memory");
  }
}

// The 8x8 b16 matrix whose row lane/4, columns 2(lane%4) and +1 this lane holds, transposed.
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// {a, b} as an f16x2 MMA operand: kLo, split into hi + lo (split_f16x2); else hi = f16(a, b)
// alone (the draft view's f16-operand path), lo left untouched.
template <bool kLo>
__device__ __forceinline__ void f16x2_operand(float a, float b, uint32_t& hi, uint32_t& lo) {
  if constexpr (kLo) {
    split_f16x2(a, b, hi, lo);
  } else {
    const __half2 h = __floats2half2_rn(a, b);
    hi = *reinterpret_cast<const uint32_t*>(&h);
  }
}

// The high bytes of the f16 1024 (0x64) four times, in constant memory: ptxas cannot fold it, so
// a byte permute takes its selector as the immediate and this word from the constant bank (with
// both as literals it kept selectors in registers and, short of registers, re-created them
// before most uses: ~25 moves per sub-chunk in the draft kernel).
__constant__ uint32_t kF16OneKiBytes = 0x64646464u;

// Two code bytes of `bytes` (picked by a prmt selector that interleaves them with 0x64) as the
// f16x2 {byte, byte} - bias: exact small integers.
__device__ __forceinline__ uint32_t codes_to_f16x2(uint32_t bytes, uint32_t sel, uint32_t bias) {
  const uint32_t h = __byte_perm(bytes, kF16OneKiBytes, sel);
  uint32_t r;
  asm("sub.rn.f16x2 %0, %1, %2;\n" : "=r"(r) : "r"(h), "r"(bias));
  return r;
}

// 1024 in both f16 halves, from the constant bank (as kF16OneKiBytes: no register, no literal).
__constant__ uint32_t kF16OneKiHalves = 0x64006400u;

// INT4 codes straight from packed nibbles (no byte unpacking): the nibbles at bits 0 and 16 of x
// (low) or at bits 4 and 20 (high) as the f16x2 {code - 8, code' - 8}. The nibble goes into the
// mantissa of 1024 (1024 + n, or 1024 + 16 n for a high nibble, exact), then one f16x2 subtract
// (- 1032) or fused multiply-add (/ 16 - 72) centres it: 2 instructions per 2 codes.
__device__ __forceinline__ uint32_t int4_low_nibbles_f16x2(uint32_t x) {
  const uint32_t h = (x & 0x000F000Fu) | kF16OneKiHalves;
  uint32_t r;
  asm("sub.rn.f16x2 %0, %1, %2;\n" : "=r"(r) : "r"(h), "r"(0x64086408u));
  return r;
}
__device__ __forceinline__ uint32_t int4_high_nibbles_f16x2(uint32_t x) {
  const uint32_t h = (x & 0x00F000F0u) | kF16OneKiHalves;
  uint32_t r;  // 0x2C00 = 1/16, 0xD480 = -72
  asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(r) : "r"(h), "r"(0x2C002C00u), "r"(0xD480D480u));
  return r;
}

// The same nibbles as f16 subnormals, one lop3 per two codes (the draft view's f16-operand path on
// the register-direct kernel, DirectPath::kSub): the low nibbles at bits 0 and 16 of x are
// {n, n'} * 2^-24, the high nibbles at bits 4 and 20 {16 n, 16 n'} * 2^-24, exactly (the tensor
// cores take subnormal f16 operands). Not centred: the caller undoes the 2^-24 (and the high
// nibbles' 16) in f32 and adds the min in f32.
__device__ __forceinline__ uint32_t int4_low_nibbles_sub(uint32_t x) {
  return x & 0x000F000Fu;
}
__device__ __forceinline__ uint32_t int4_high_nibbles_sub(uint32_t x) {
  return x & 0x00F000F0u;
}

// Four bytes of packed codes (byte i: channel 2i in the low nibble, 2i+1 in the high nibble; for
// INT8 the same bytes of both planes) as the full codes of the even channels (byte i = channel 2i)
// and of the odd channels: U (INT4) or 16U + (L + 8) (INT8).
template <bool INT8>
__device__ __forceinline__ void codes_even_odd(uint32_t up, uint32_t lo, uint32_t& even,
                                               uint32_t& odd) {
  if constexpr (INT8) {
    even = ((up << 4) & 0xF0F0F0F0u) | (lo & 0x0F0F0F0Fu);
    odd = (up & 0xF0F0F0F0u) | ((lo >> 4) & 0x0F0F0F0Fu);
  } else {
    (void)lo;
    even = up & 0x0F0F0F0Fu;
    odd = (up >> 4) & 0x0F0F0F0Fu;
  }
}

// The A fragment of k-step h (0, 1) of an 8-channel key block: the even / odd channel codes
// (codes_even_odd) of token rows r and r + 8, centred by `bias`.
__device__ __forceinline__ void key_frags(const uint32_t (&ev)[2], const uint32_t (&od)[2], int h,
                                          uint32_t bias, uint32_t (&a)[4]) {
  const uint32_t sel = h ? 0x4342u : 0x4140u;
  a[0] = codes_to_f16x2(ev[0], sel, bias);
  a[1] = codes_to_f16x2(ev[1], sel, bias);
  a[2] = codes_to_f16x2(od[0], sel, bias);
  a[3] = codes_to_f16x2(od[1], sel, bias);
}

// The A fragment of k-step h of an 8-channel INT4 key block, straight from the code words of
// token rows r and r + 8: k-slots 2c, 2c+1, 2c+8, 2c+9 are the block's channels 2h, 2h + 4,
// 2h + 1, 2h + 5 (the queries are folded in the same order: fold_query_block<.., true>).
// kSub: as subnormals (int4_low_nibbles_sub), k-slots 2c+8, 2c+9 (the high nibbles) at 16x.
template <bool kSub = false>
__device__ __forceinline__ void int4_key_frags(const uint32_t (&up)[2], int h, uint32_t (&a)[4]) {
  const uint32_t x0 = h ? up[0] >> 8 : up[0], x1 = h ? up[1] >> 8 : up[1];
  if constexpr (kSub) {
    a[0] = int4_low_nibbles_sub(x0);
    a[1] = int4_low_nibbles_sub(x1);
    a[2] = int4_high_nibbles_sub(x0);
    a[3] = int4_high_nibbles_sub(x1);
  } else {
    a[0] = int4_low_nibbles_f16x2(x0);
    a[1] = int4_low_nibbles_f16x2(x1);
    a[2] = int4_high_nibbles_f16x2(x0);
    a[3] = int4_high_nibbles_f16x2(x1);
  }
}

// One 8-channel block of S^T = K Q'^T on tensor cores for NT query tiles (the ring and
// register-direct paths): the code words of token rows r and r + 8 (upper plane; INT8: and
// lower), unpacked once (INT8: as even / odd channel codes centred by `bias`; INT4:
// int4_key_frags), against each tile's f16 hi and lo B fragments of k-steps h = 0, 1 of the
// block (frags(t, h, hi, lo)); tile t's products accumulate into acc_hi[t] / acc_lo[t] (kLo
// false: hi only, acc_lo untouched). kSub (INT4, kLo false): the codes as subnormals
// (int4_key_frags<true>).
template <bool INT8, bool kLo, int NT, class Frags, bool kSub = false>
__device__ __forceinline__ void score_block_tiles(const uint32_t (&up)[2], const uint32_t (&lo)[2],
                                                  const Frags& frags, uint32_t bias,
                                                  float (&acc_hi)[NT][4], float (&acc_lo)[NT][4]) {
  uint32_t ev[2], od[2];
  if constexpr (INT8) {
#pragma unroll
    for (int j = 0; j < 2; ++j) codes_even_odd<INT8>(up[j], lo[j], ev[j], od[j]);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    uint32_t a[4];
    if constexpr (INT8) {
      key_frags(ev, od, h, bias, a);
    } else {
      int4_key_frags<kSub>(up, h, a);
    }
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      uint32_t b_hi[2], b_lo[2];
      frags(t, h, b_hi, b_lo);
      mma_f16(acc_hi[t], a[0], a[1], a[2], a[3], b_hi[0], b_hi[1]);
      if constexpr (kLo) mma_f16(acc_lo[t], a[0], a[1], a[2], a[3], b_lo[0], b_lo[1]);
    }
  }
}

// The same for one tile whose fragments are in registers (b_hi[h], b_lo[h]).
template <bool INT8, bool kLo = true>
__device__ __forceinline__ void score_block(const uint32_t (&up)[2], const uint32_t (&lo)[2],
                                            const uint32_t (&b_hi)[2][2],
                                            const uint32_t (&b_lo)[2][2], uint32_t bias,
                                            float (&acc_hi)[4], float (&acc_lo)[4]) {
  auto frags = [&](int, int h, uint32_t(&hi)[2], uint32_t(&lo_)[2]) {
    hi[0] = b_hi[h][0], hi[1] = b_hi[h][1];
    if constexpr (kLo) lo_[0] = b_lo[h][0], lo_[1] = b_lo[h][1];
  };
  score_block_tiles<INT8, kLo, 1>(up, lo, frags, bias, reinterpret_cast<float(&)[1][4]>(acc_hi),
                                  reinterpret_cast<float(&)[1][4]>(acc_lo));
}

// Full sum over the warp of v[j] for the query j = lane / (32 / N) of this lane: a butterfly that
// halves the values a lane carries at each of its first log2(N) steps (N = 4, 8 or 16). The
// halving steps recurse on compile-time sizes, so that every index stays constant (a loop over a
// runtime n put v in local memory at N = 16).
template <int N, int kOff = 16>
__device__ __forceinline__ float transpose_reduce(float (&v)[N]) {
  if constexpr (N == 1) {
#pragma unroll
    for (int off = kOff; off > 0; off /= 2) v[0] += __shfl_xor_sync(kFullMask, v[0], off);
    return v[0];
  } else {
    const bool upper = ((threadIdx.x & 31) & kOff) != 0;
    float h[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      const float a = v[i], b = v[N / 2 + i];
      h[i] = (upper ? b : a) + __shfl_xor_sync(kFullMask, upper ? a : b, kOff);
    }
    return transpose_reduce<N / 2, kOff / 2>(h);
  }
}

// The 4-bit codes of this lane's C channels [lane*C, +C) in a packed row, code c in bits 4c.
template <int C>
__device__ __forceinline__ uint32_t lane_codes(const uint8_t* row, int lane) {
  if constexpr (C == 1) {
    return (static_cast<uint32_t>(__ldg(row + (lane >> 1))) >> ((lane & 1) * 4)) & 0xFu;
  } else if constexpr (C == 2) {
    return __ldg(row + lane);
  } else if constexpr (C == 4) {
    return __ldg(reinterpret_cast<const uint16_t*>(row) + lane);
  } else {
    static_assert(C == 8, "head_dim 32..256");
    return __ldg(reinterpret_cast<const uint32_t*>(row) + lane);
  }
}

// The same for f16 values (full-precision KV rows stored as f16), converted exactly.
template <int N>
__device__ __forceinline__ void load_f16(const __half* p, float (&x)[N]) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {
      const float4 f = load4_kv(p + 4 * i);
      x[4 * i] = f.x, x[4 * i + 1] = f.y, x[4 * i + 2] = f.z, x[4 * i + 3] = f.w;
    }
  } else if constexpr (N == 2) {
    const float2 f = __half22float2(__ldg(reinterpret_cast<const __half2*>(p)));
    x[0] = f.x, x[1] = f.y;
  } else {
    x[0] = __half2float(__ldg(p));
  }
}

__device__ __forceinline__ float fp16_at(const uint16_t* p, int64_t i) {
  return __half2float(__ushort_as_half(__ldg(p + i)));
}

// ---- CUDA-core path -------------------------------------------------------------------------

// Full-precision rows of one kv head: this lane's channels of position t, as f32 (f16 rows
// converted on load; the branch is uniform over the grid).
template <int HD>
struct FpRows {
  static constexpr int kC = HD / 32;
  const void* k;  // at kv head, lane channels, position fp_base (elements of the row type)
  const void* v;
  int64_t stride;  // elements
  int base;
  bool f16;  // rows of f16, else f32

  __device__ void load(int t, float (&kx)[kC], float (&vx)[kC]) const {
    const int64_t off = static_cast<int64_t>(t - base) * stride;
    if (f16) {
      load_f16<kC>(static_cast<const __half*>(k) + off, kx);
      load_f16<kC>(static_cast<const __half*>(v) + off, vx);
    } else {
      load_f32<kC>(static_cast<const float*>(k) + off, kx);
      load_f32<kC>(static_cast<const float*>(v) + off, vx);
    }
  }
};

// Quantized rows of one kv head, dequantized as the CPU reference does (kv_quant.h: the products
// are exact, so the values are bit-identical with or without FMA).
template <int HD, bool INT8>
struct QuantRows {
  static constexpr int kC = HD / 32;
  const uint8_t* ku;  // planes at kv head, token 0
  const uint8_t* kl;
  const uint8_t* vu;
  const uint8_t* vl;
  const uint16_t* ks;  // key scale/min at kv head, group 0
  const uint16_t* km;
  const uint16_t* vs;  // value scale/min at kv head, token 0
  const uint16_t* vm;
  int G;
  int gv;  // channels per value group
  int ng;  // value groups per token

  __device__ void load(int t, float (&kx)[kC], float (&vx)[kC]) const {
    const int lane = threadIdx.x & 31;
    const int64_t row = static_cast<int64_t>(t) * (HD / 2);
    const uint32_t k_up = lane_codes<kC>(ku + row, lane);
    const uint32_t v_up = lane_codes<kC>(vu + row, lane);
    uint32_t k_lo = 0, v_lo = 0;
    if constexpr (INT8) {
      k_lo = lane_codes<kC>(kl + row, lane);
      v_lo = lane_codes<kC>(vl + row, lane);
    }
    const int64_t kmeta = static_cast<int64_t>(t / G) * HD;
    const int64_t vmeta = static_cast<int64_t>(t) * ng;
#pragma unroll
    for (int c = 0; c < kC; ++c) {
      const int d = (threadIdx.x & 31) * kC + c;
      const int g = d / gv;
      const float k_s = fp16_at(ks, kmeta + d), k_m = fp16_at(km, kmeta + d);
      const float v_s = fp16_at(vs, vmeta + g), v_m = fp16_at(vm, vmeta + g);
      const int ku_c = (k_up >> (4 * c)) & 0xF, vu_c = (v_up >> (4 * c)) & 0xF;
      if constexpr (INT8) {
        const int kq = 16 * ku_c + static_cast<int>((k_lo >> (4 * c)) & 0xF) - 8;
        const int vq = 16 * vu_c + static_cast<int>((v_lo >> (4 * c)) & 0xF) - 8;
        kx[c] = static_cast<float>(kq) * (k_s * 0.0625f) + k_m;
        vx[c] = static_cast<float>(vq) * (v_s * 0.0625f) + v_m;
      } else {
        kx[c] = static_cast<float>(ku_c) * k_s + k_m;
        vx[c] = static_cast<float>(vu_c) * v_s + v_m;
      }
    }
  }
};

// A warp's online-softmax state over QW query vectors; lane holds channels [lane*kC, +kC) of
// every query and the (m, l) of query lane / kLanesPerQuery, whose visible positions are
// [lo, hi].
template <int HD, int QW>
struct RowPath {
  static constexpr int kC = HD / 32;
  static constexpr int kLanesPerQuery = 32 / QW;
  static constexpr int kQStride = HD + kQPad;

  float qr[QW][kC];
  float o[QW][kC];
  float m_run;
  float l_run;
  int lo;
  int hi;

  // q_tile: [QW][kQStride] pre-scaled queries of this warp.
  __device__ void init(const float* q_tile, int lo_, int hi_) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int j = 0; j < QW; ++j) {
#pragma unroll
      for (int c = 0; c < kC; ++c) {
        qr[j][c] = q_tile[j * kQStride + lane * kC + c];
        o[j][c] = 0.0f;
      }
    }
    m_run = kNegInf;
    l_run = 0.0f;
    lo = lo_;
    hi = hi_;
  }

  // Positions [begin, end), this warp taking every `slices`-th one from begin + slice, U rows
  // (loads in flight) per step.
  template <int U, class Rows>
  __device__ void run(const Rows& rows, int begin, int end, int slice, int slices) {
    constexpr int kRowUnroll = U;
    for (int t0 = begin + slice; t0 < end; t0 += kRowUnroll * slices) {
      float kx[kRowUnroll][kC], vx[kRowUnroll][kC];
#pragma unroll
      for (int u = 0; u < kRowUnroll; ++u) {
        const int t = t0 + u * slices;
        if (t < end) {
          rows.load(t, kx[u], vx[u]);
        } else {
#pragma unroll
          for (int c = 0; c < kC; ++c) kx[u][c] = vx[u][c] = 0.0f;
        }
      }
      float sc[kRowUnroll];
      float cmax = kNegInf;
#pragma unroll
      for (int u = 0; u < kRowUnroll; ++u) {
        float part[QW];
#pragma unroll
        for (int j = 0; j < QW; ++j) {
          float s = 0.0f;
#pragma unroll
          for (int c = 0; c < kC; ++c) s = fmaf(qr[j][c], kx[u][c], s);
          part[j] = s;
        }
        sc[u] = transpose_reduce<QW>(part);
        const int t = t0 + u * slices;
        if (t >= end || t < lo || t > hi) sc[u] = kNegInf;
        cmax = fmaxf(cmax, sc[u]);
      }
      const float m_new = fmaxf(m_run, cmax);
      float corr = 1.0f, p[kRowUnroll], p_sum = 0.0f;
#pragma unroll
      for (int u = 0; u < kRowUnroll; ++u) p[u] = 0.0f;
      if (m_new != kNegInf) {
        corr = exp2f(m_run - m_new);
#pragma unroll
        for (int u = 0; u < kRowUnroll; ++u) {
          p[u] = exp2f(sc[u] - m_new);
          p_sum += p[u];
        }
      }
      l_run = l_run * corr + p_sum;
      m_run = m_new;
#pragma unroll
      for (int j = 0; j < QW; ++j) {
        const int src = j * kLanesPerQuery;
        const float cj = __shfl_sync(kFullMask, corr, src);
        float pj[kRowUnroll];
#pragma unroll
        for (int u = 0; u < kRowUnroll; ++u) pj[u] = __shfl_sync(kFullMask, p[u], src);
#pragma unroll
        for (int c = 0; c < kC; ++c) {
          float acc = o[j][c] * cj;
#pragma unroll
          for (int u = 0; u < kRowUnroll; ++u) acc = fmaf(pj[u], vx[u][c], acc);
          o[j][c] = acc;
        }
      }
    }
  }

  // o_s: [QW][HD], ml_s: [QW][2] of this warp's tile.
  __device__ void store(float* o_s, float* ml_s) const {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int j = 0; j < QW; ++j) {
#pragma unroll
      for (int c = 0; c < kC; ++c) o_s[j * HD + lane * kC + c] = o[j][c];
    }
    if (lane % kLanesPerQuery == 0) {
      const int j = lane / kLanesPerQuery;
      ml_s[2 * j] = m_run;
      ml_s[2 * j + 1] = l_run;
    }
  }
};

// ---- tensor-core path -----------------------------------------------------------------------

// Online softmax over a warp's 32-token sub-chunk in the S^T fragment layout: this lane's scores
// s[st][i], i = (token r | r + 8) x (query 2c | 2c + 1); the 8 lanes of a query column share its
// state. Updates the running max and sum, gives the weights p (2^(s - max)) and the factor corr
// by which every earlier contribution of the query is scaled. kCols 1: column 2c alone (the
// direct path's kOneCol and kEvenCols tiles); column 2c + 1 gets weights 0, factor 1 and keeps
// its state.
template <int kCols = 2>
__device__ __forceinline__ void online_softmax_sub(const float (&s)[2][4], float (&m_run)[2],
                                                   float (&l_part)[2], float (&corr)[2],
                                                   float (&p)[2][4]) {
  if constexpr (kCols == 1) {
    corr[1] = 1.0f;
    p[0][1] = p[0][3] = p[1][1] = p[1][3] = 0.0f;
  }
#pragma unroll
  for (int k = 0; k < kCols; ++k) {
    float mx = fmaxf(fmaxf(s[0][k], s[0][k + 2]), fmaxf(s[1][k], s[1][k + 2]));
    mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 4));
    mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 8));
    mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 16));
    const float m_new = fmaxf(m_run[k], mx);
    if (m_new == kNegInf) {
      corr[k] = 1.0f;
      p[0][k] = p[0][k + 2] = p[1][k] = p[1][k + 2] = 0.0f;
    } else {
      corr[k] = exp2_ftz(m_run[k] - m_new);
#pragma unroll
      for (int st = 0; st < 2; ++st) {
        p[st][k] = exp2_ftz(s[st][k] - m_new);
        p[st][k + 2] = exp2_ftz(s[st][k + 2] - m_new);
      }
    }
    m_run[k] = m_new;
    l_part[k] = l_part[k] * corr[k] + ((p[0][k] + p[0][k + 2]) + (p[1][k] + p[1][k + 2]));
  }
}

// Folding one query (this lane's share: NB blocks of 8 channels, block j at q_row + d0[j], with
// the key group's fp16 scale/min words sr[j]/mr[j] of the same channels) into the B fragments of
// S^T = K Q'^T: Q' = q * scale * step_mul, scaled by a power of two 2^F that puts the query's
// largest |Q'| in [2^13, 2^14), split into f16 hi + lo; block j, half h feeds k-step (j, h) with
// channels 4h + {0, 2} (b0) and 4h + {1, 3} (b1). q . (center * step + min) is summed in f32. The
// four lanes of a query (lanes 4r..4r+3) hold all of its channels; inv_f / qm receive 2^-F and
// that sum of queries 2c and 2c+1 (folded by lanes 8c and 8c + 4). kLo false: hi only (f16
// rounding of Q', the draft view's single-MMA path), the lo fragments are not written.
//
// In two passes, so that a caller short of registers holds one block's values at a time: the
// scale (fold_query_scale: returns 2^F), then each block's fragments (fold_query_block).
__device__ __forceinline__ float4 q_times_scale(const float* q, const uint32_t (&sw)[4], int half,
                                                float step_mul) {
  const float4 qv = *reinterpret_cast<const float4*>(q + 4 * half);
  const float2 s0 = __half22float2(*reinterpret_cast<const __half2*>(&sw[2 * half]));
  const float2 s1 = __half22float2(*reinterpret_cast<const __half2*>(&sw[2 * half + 1]));
  return make_float4(qv.x * (s0.x * step_mul), qv.y * (s0.y * step_mul), qv.z * (s1.x * step_mul),
                     qv.w * (s1.y * step_mul));
}

template <int NB>
__device__ __forceinline__ float fold_query_scale(const float* q_row, const int (&d0)[NB],
                                                  const uint4 (&sr)[NB], const uint4 (&mr)[NB],
                                                  float step_mul, float center, float (&inv_f)[2],
                                                  float (&qm)[2]) {
  const int c = threadIdx.x & 3;
  float amax = 0.0f, qmp = 0.0f;
#pragma unroll
  for (int j = 0; j < NB; ++j) {
    const float4 q0 = *reinterpret_cast<const float4*>(q_row + d0[j]);
    const float4 q1 = *reinterpret_cast<const float4*>(q_row + d0[j] + 4);
    const float qv[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
    const uint32_t sw[4] = {sr[j].x, sr[j].y, sr[j].z, sr[j].w};
    const uint32_t mw[4] = {mr[j].x, mr[j].y, mr[j].z, mr[j].w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 s2 = __half22float2(*reinterpret_cast<const __half2*>(&sw[i]));
      const float2 m2 = __half22float2(*reinterpret_cast<const __half2*>(&mw[i]));
      const float x0 = qv[2 * i] * (s2.x * step_mul), x1 = qv[2 * i + 1] * (s2.y * step_mul);
      qmp = fmaf(qv[2 * i], fmaf(center, s2.x * step_mul, m2.x), qmp);
      qmp = fmaf(qv[2 * i + 1], fmaf(center, s2.y * step_mul, m2.y), qmp);
      amax = fmaxf(amax, fmaxf(fabsf(x0), fabsf(x1)));
    }
  }
  amax = fmaxf(amax, __shfl_xor_sync(kFullMask, amax, 1));
  amax = fmaxf(amax, __shfl_xor_sync(kFullMask, amax, 2));
  qmp += __shfl_xor_sync(kFullMask, qmp, 1);
  qmp += __shfl_xor_sync(kFullMask, qmp, 2);
  const int f = amax > 0.0f ? max(-100, min(100, 13 - ilogbf(amax))) : 0;
  const float isf = exp2i(-f);
  inv_f[0] = __shfl_sync(kFullMask, isf, 8 * c);
  inv_f[1] = __shfl_sync(kFullMask, isf, 8 * c + 4);
  qm[0] = __shfl_sync(kFullMask, qmp, 8 * c);
  qm[1] = __shfl_sync(kFullMask, qmp, 8 * c + 4);
  return exp2i(f);
}

// Block j's fragments (q: its 8 channels, sr_j: their scale words, sf: fold_query_scale's 2^F).
// kInt4Map: the channel order of int4_key_frags (half h: b0 = channels 2h, 2h + 4, b1 = 2h + 1,
// 2h + 5) instead of key_frags' (b0 = 4h, 4h + 2, b1 = 4h + 1, 4h + 3). kSub (with kInt4Map):
// b1 at 1/16, against int4_key_frags<true>'s high nibbles at 16x.
template <bool kLo, bool kInt4Map, bool kSub = false>
__device__ __forceinline__ void fold_query_block(const float* q, const uint4& sr_j, float step_mul,
                                                 float sf, uint32_t (&hi)[2][2],
                                                 uint32_t (&lo)[2][2]) {
  const uint32_t sw[4] = {sr_j.x, sr_j.y, sr_j.z, sr_j.w};
  if constexpr (kInt4Map) {
    const float4 x0 = q_times_scale(q, sw, 0, step_mul), x1 = q_times_scale(q, sw, 1, step_mul);
    const float sf1 = kSub ? sf * 0.0625f : sf;
    f16x2_operand<kLo>(x0.x * sf, x1.x * sf, hi[0][0], lo[0][0]);
    f16x2_operand<kLo>(x0.y * sf1, x1.y * sf1, hi[0][1], lo[0][1]);
    f16x2_operand<kLo>(x0.z * sf, x1.z * sf, hi[1][0], lo[1][0]);
    f16x2_operand<kLo>(x0.w * sf1, x1.w * sf1, hi[1][1], lo[1][1]);
  } else {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float4 x = q_times_scale(q, sw, h, step_mul);
      f16x2_operand<kLo>(x.x * sf, x.z * sf, hi[h][0], lo[h][0]);
      f16x2_operand<kLo>(x.y * sf, x.w * sf, hi[h][1], lo[h][1]);
    }
  }
}

// kSub: for int4_key_frags<true> (pass center 0): b1 at 1/16 and inv_f times 2^24.
template <int NB, bool kLo, bool kInt4Map, bool kSub = false>
__device__ __forceinline__ void fold_query(const float* q_row, const int (&d0)[NB],
                                           const uint4 (&sr)[NB], const uint4 (&mr)[NB],
                                           float step_mul, float center,
                                           uint32_t (&bq_hi)[NB][2][2], uint32_t (&bq_lo)[NB][2][2],
                                           float (&inv_f)[2], float (&qm)[2]) {
  const float sf = fold_query_scale<NB>(q_row, d0, sr, mr, step_mul, center, inv_f, qm);
  if constexpr (kSub) {
    inv_f[0] *= 0x1p24f;
    inv_f[1] *= 0x1p24f;
  }
#pragma unroll
  for (int j = 0; j < NB; ++j) {
    fold_query_block<kLo, kInt4Map, kSub>(q_row + d0[j], sr[j], step_mul, sf, bq_hi[j], bq_lo[j]);
  }
}

// The scores of one 16-token step from the two MMA accumulators: s[i], i = (token r | r + 8) x
// (query 2c | 2c + 1), token = tok0 + 8 (i >> 1), -inf past each query's quantized boundary bq.
// kLo false: the hi accumulator alone.
template <bool kLo = true>
__device__ __forceinline__ void finish_scores(const float (&hi)[4], const float (&lo)[4], int tok0,
                                              const int (&bq)[2], const float (&inv_f)[2],
                                              const float (&qm)[2], float (&s)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int k = i & 1;
    const float acc = kLo ? hi[i] + lo[i] : hi[i];
    s[i] = tok0 + 8 * (i >> 1) < bq[k] ? acc * inv_f[k] + qm[k] : kNegInf;
  }
}

// The power-of-two scale 2^E of the value operand: the largest step (vmax, this lane's; reduced
// over the warp here) times 2^E stays below 2^14, and E never grows, so earlier contributions are
// only ever scaled down, exactly. Returns 2^E; fe = 2^(E_new - E_old) rescales the accumulators.
__device__ __forceinline__ float value_scale_step(float vmax, int& e_run, float& fe) {
  vmax = fmaxf(vmax, __shfl_xor_sync(kFullMask, vmax, 4));
  vmax = fmaxf(vmax, __shfl_xor_sync(kFullMask, vmax, 8));
  vmax = fmaxf(vmax, __shfl_xor_sync(kFullMask, vmax, 16));
  // vmax > 0 is a normal float (an f16 step times 1 or 1/16): ilogb is its exponent field - 127.
  const int e_step = vmax > 0.0f ? 140 - static_cast<int>(__float_as_uint(vmax) >> 23) : e_run;
  const int e_new = min(e_run, e_step);
  fe = exp2i(e_new - e_run);
  e_run = e_new;
  return exp2i(e_new);
}

// One warp: 8 query vectors (tile columns), lane = (r, c) = (lane / 4, lane % 4) in mma terms.
// Fragment maps (channel offsets within a 16-byte unit u = 32 channels of a code row):
//  - key k-step (u, h): k-slots 2c, 2c+1, 2c+8, 2c+9 are channels 32u + 8c + 4h + {0, 2, 1, 3}
//    (INT8) or 32u + 8c + 2h + {0, 4, 1, 5} (INT4: int4_key_frags);
//  - value m-tile (u, p): rows r, r+8 are channels 32u + 4r + 2p and 32u + 4r + 2p + 1;
//  - tokens are in natural order in both products.
// kLo: the f16 hi + lo operand pair (f32-level accuracy); false: hi alone (the draft view's
// f16-operand variant, QuantAttentionTuning::draft_f16).
template <int HD, bool INT8, int NG, bool kLo = true>
struct MmaPath {
  static constexpr int R = HD / 32;               // 16-byte units per code row per plane
  static constexpr int RB = HD / 2;               // bytes per code row per plane
  static constexpr int KP = INT8 ? 2 : 1;         // planes per tensor
  static constexpr int kTile = kSubTokens * RB;   // one plane of a sub-chunk
  static constexpr int kKMeta = 2 * KP * kTile;   // key scale [HD], then min [HD]
  static constexpr int kVMeta = kKMeta + 4 * HD;  // value scale [32][NG], then min [32][NG]
  static constexpr int kBytes = kVMeta + 4 * kSubTokens * NG;
  static constexpr int kUnitsPerGroup = R / NG;  // code units (32 channels) per value group
  static constexpr int kQStride = HD + kQPad;
  static constexpr float kStepMul = INT8 ? 0.0625f : 1.0f;
  // Codes are centred: the f16 operands are code - kCenter (INT4: U - 8 in [-8, 7]; INT8:
  // 16U + L - 120 in [-128, 127]) and the group's min is replaced by its midpoint
  // min + kCenter * step. Uncentred, sum p * step * code and sum p * min are both ~|min| while
  // their sum (the output) is ~|min| / sqrt(positions): the cancellation turns f32 rounding into
  // a 1e-3 relative error at 32K positions.
  static constexpr float kCenter = INT8 ? 120.0f : 8.0f;
  static constexpr uint32_t kBias = INT8 ? 0x64806480u : 0x64086408u;  // f16x2 1152 / 1032
  static_assert(R == 2 || R == 4, "head_dim 64 or 128");
  static_assert(NG >= 1 && R % NG == 0, "value groups of 32, 64 or 128 channels");
  static_assert(mma_sub_bytes(HD, INT8, NG) == kBytes, "stage layout");

  uint32_t bq_hi[R][2][2], bq_lo[R][2][2];  // folded queries, k-step (u, h), {b0, b1}
  float inv_f[2], qm[2];                    // 2^-F and q.min of queries 2c, 2c+1
  float o[R][2][4];                         // O^T m-tiles (u, p), scaled by 2^E
  float m_run[2], l_part[2], acc_min[2][NG];
  int e_run;
  int bq[2];  // quantized positions [0, bq) visible to queries 2c, 2c+1

  // Row swizzle of the 16-byte units of a code tile: the 8 rows an ldmatrix reads hit 8
  // different bank groups.
  static __device__ __forceinline__ int swz(int tok) { return (tok / (8 / R)) % R; }

  __device__ void init(int b0, int b1) {
#pragma unroll
    for (int u = 0; u < R; ++u) {
#pragma unroll
      for (int p = 0; p < 2; ++p) {
#pragma unroll
        for (int i = 0; i < 4; ++i) o[u][p][i] = 0.0f;
      }
    }
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      m_run[k] = kNegInf;
      l_part[k] = 0.0f;
#pragma unroll
      for (int g = 0; g < NG; ++g) acc_min[k][g] = 0.0f;
    }
    e_run = 64;  // above any step's bound (<= 41): the first scaled step sets it
    bq[0] = b0;
    bq[1] = b1;
  }

  // Folds the query of column r (q_row: [HD] pre-scaled) with a key group's scale/min (shared
  // memory): block u holds channels 32u + 8c .. +7.
  __device__ void fold_queries(const float* q_row, const __half* k_scale, const __half* k_min) {
    const int c = threadIdx.x & 3;
    int d0[R];
    uint4 sr[R], mr[R];
#pragma unroll
    for (int u = 0; u < R; ++u) {
      d0[u] = 32 * u + 8 * c;
      sr[u] = *reinterpret_cast<const uint4*>(k_scale + d0[u]);
      mr[u] = *reinterpret_cast<const uint4*>(k_min + d0[u]);
    }
    fold_query<R, kLo, !INT8>(q_row, d0, sr, mr, kStepMul, kCenter, bq_hi, bq_lo, inv_f, qm);
  }

  // Code words of one plane tile for tokens [16 step, +16): w[j][u] = this lane's 32 bits of
  // 16-byte unit u of token 16 step + 8 j + (kTrans ? rows 2c, 2c+1 : row r).
  template <bool kTrans>
  static __device__ void load_words(uint32_t tile, int step, uint32_t (&w)[2][R]) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int x = 0; x < 2 * R / 4; ++x) {
      const int mi = 4 * x + (lane >> 3);
      const int j = mi / R, u = mi % R;
      const int tok = 16 * step + 8 * j + (lane & 7);
      uint32_t d[4];
      ldsm_x4<kTrans>(tile + tok * RB + 16 * (u ^ swz(tok)), d);
#pragma unroll
      for (int k = 0; k < 4; ++k) w[(4 * x + k) / R][(4 * x + k) % R] = d[k];
    }
  }

  // One sub-chunk (32 tokens from t_sub) in shared memory. q_row: this lane's column r query.
  __device__ void process(const unsigned char* sub, bool new_group, int t_sub, const float* q_row) {
    const int lane = threadIdx.x & 31, r = lane >> 2;
    if (new_group) {
      const __half* ksc = reinterpret_cast<const __half*>(sub + kKMeta);
      fold_queries(q_row, ksc, ksc + HD);
    }
    const uint32_t base = smem_u32(sub);

    // Scores of the 32 tokens: s[step][i], i = (token r | 8 + r) x (query 2c | 2c + 1).
    float s[2][4];
#pragma unroll
    for (int st = 0; st < 2; ++st) {
      uint32_t wu[2][R], wl[2][R];
      load_words<false>(base, st, wu);
      if constexpr (INT8) load_words<false>(base + kTile, st, wl);
      float acc_hi[4] = {0.0f, 0.0f, 0.0f, 0.0f}, acc_lo[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int u = 0; u < R; ++u) {
        const uint32_t up[2] = {wu[0][u], wu[1][u]};
        const uint32_t lo[2] = {INT8 ? wl[0][u] : 0u, INT8 ? wl[1][u] : 0u};
        score_block<INT8, kLo>(up, lo, bq_hi[u], bq_lo[u], kBias, acc_hi, acc_lo);
      }
      finish_scores<kLo>(acc_hi, acc_lo, t_sub + 16 * st + r, bq, inv_f, qm, s[st]);
    }

    float corr[2], p[2][4];
    online_softmax_sub(s, m_run, l_part, corr, p);

    // Value metadata of this lane's tokens 16 st + 8 jb + r.
    const __half* vsc = reinterpret_cast<const __half*>(sub + kVMeta);
    const __half* vmn = vsc + kSubTokens * NG;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
#pragma unroll
      for (int g = 0; g < NG; ++g) acc_min[k][g] *= corr[k];
    }
    float vstep[2][2][NG];
    float vmax = 0.0f;
#pragma unroll
    for (int st = 0; st < 2; ++st) {
#pragma unroll
      for (int jb = 0; jb < 2; ++jb) {
        const int tl = 16 * st + 8 * jb + r;
#pragma unroll
        for (int g = 0; g < NG; ++g) {
          vstep[st][jb][g] = __half2float(vsc[tl * NG + g]) * kStepMul;
          vmax = fmaxf(vmax, vstep[st][jb][g]);
          const float vm = fmaf(kCenter, vstep[st][jb][g], __half2float(vmn[tl * NG + g]));
#pragma unroll
          for (int k = 0; k < 2; ++k) acc_min[k][g] = fmaf(p[st][2 * jb + k], vm, acc_min[k][g]);
        }
      }
    }
    float fe;
    const float se = value_scale_step(vmax, e_run, fe);
    const float c0 = corr[0] * fe, c1 = corr[1] * fe;
#pragma unroll
    for (int u = 0; u < R; ++u) {
#pragma unroll
      for (int pp = 0; pp < 2; ++pp) {
        o[u][pp][0] *= c0;
        o[u][pp][1] *= c1;
        o[u][pp][2] *= c0;
        o[u][pp][3] *= c1;
      }
    }

    // O^T += V^T P^T, 16 tokens per k-step.
#pragma unroll
    for (int st = 0; st < 2; ++st) {
      uint32_t bh[NG][2];
      [[maybe_unused]] uint32_t bl[NG][2];
#pragma unroll
      for (int g = 0; g < NG; ++g) {
#pragma unroll
        for (int jb = 0; jb < 2; ++jb) {
          const float w = vstep[st][jb][g];
          uint32_t h, l;
          f16x2_operand<kLo>(p[st][2 * jb] * w * se, p[st][2 * jb + 1] * w * se, h, l);
          bh[g][jb] = movmatrix_trans(h);
          if constexpr (kLo) bl[g][jb] = movmatrix_trans(l);
        }
      }
      uint32_t wu[2][R], wl[2][R];
      load_words<true>(base + KP * kTile, st, wu);
      if constexpr (INT8) load_words<true>(base + (KP + 1) * kTile, st, wl);
#pragma unroll
      for (int u = 0; u < R; ++u) {
        uint32_t ev[2], od[2];
#pragma unroll
        for (int j = 0; j < 2; ++j)
          codes_even_odd<INT8>(wu[j][u], INT8 ? wl[j][u] : 0u, ev[j], od[j]);
        const int g = u / kUnitsPerGroup;
#pragma unroll
        for (int pp = 0; pp < 2; ++pp) {
          const uint32_t sel = pp ? 0x4341u : 0x4240u;
          const uint32_t a0 = codes_to_f16x2(ev[0], sel, kBias);
          const uint32_t a1 = codes_to_f16x2(od[0], sel, kBias);
          const uint32_t a2 = codes_to_f16x2(ev[1], sel, kBias);
          const uint32_t a3 = codes_to_f16x2(od[1], sel, kBias);
          mma_f16(o[u][pp], a0, a1, a2, a3, bh[g][0], bh[g][1]);
          if constexpr (kLo) mma_f16(o[u][pp], a0, a1, a2, a3, bl[g][0], bl[g][1]);
        }
      }
    }
  }

  // o_s: [8][HD], ml_s: [8][2] of this warp's tile.
  __device__ void store(float* o_s, float* ml_s) {
    const int lane = threadIdx.x & 31, r = lane >> 2, c = lane & 3;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
#pragma unroll
      for (int off = 4; off < 32; off *= 2) {
        l_part[k] += __shfl_xor_sync(kFullMask, l_part[k], off);
#pragma unroll
        for (int g = 0; g < NG; ++g)
          acc_min[k][g] += __shfl_xor_sync(kFullMask, acc_min[k][g], off);
      }
    }
    const float ie = exp2i(-e_run);
#pragma unroll
    for (int u = 0; u < R; ++u) {
      const int g = u / kUnitsPerGroup;
#pragma unroll
      for (int pp = 0; pp < 2; ++pp) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int ch = 32 * u + 4 * r + 2 * pp + (i >> 1);
          const int q = 2 * c + (i & 1);
          o_s[q * HD + ch] = o[u][pp][i] * ie + acc_min[i & 1][g];
        }
      }
    }
    if (r == 0) {
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        ml_s[2 * (2 * c + k)] = m_run[k];
        ml_s[2 * (2 * c + k) + 1] = l_part[k];
      }
    }
  }
};

template <bool INT8>
__device__ __forceinline__ const uint8_t* plane_ptr(const QuantizedKvSegment& s, int pl) {
  if constexpr (INT8) {
    return pl == 0 ? s.key_upper : pl == 1 ? s.key_lower : pl == 2 ? s.value_upper : s.value_lower;
  } else {
    return pl == 0 ? s.key_upper : s.value_upper;
  }
}

// A quantized split [begin, end) on tensor cores. Slice `ts` of the block's warps takes the
// contiguous positions [begin + ts * len, +len), len = q_split_len / slices; all warps run the
// same cp.async pipeline over the block's p.stages stages (every __syncthreads is reached by
// all). A stage holds p.chunk consecutive sub-chunks of every slice (sub-chunk j of slice sl at
// (sl * chunk + j % chunk) * kBytes), so a larger chunk puts more bytes in flight per barrier.
// `overlap()` runs once the first stages are in flight (the block's full-precision rows).
template <int HD, bool INT8, int NG, bool kF16, class Overlap>
__device__ __forceinline__ void quant_split_mma(const Params& p, int begin, int end, int kvh,
                                                int ts, int qv_warp, const float* q_warp,
                                                unsigned char* stages, float* o_mine,
                                                float* ml_mine, const Overlap& overlap) {
  static_assert(!(kF16 && INT8), "the INT8 view's f16-only operands: the direct path only");
  using M = MmaPath<HD, INT8, NG, !kF16>;
  const QuantAttentionArgs& a = p.a;
  const int lane = threadIdx.x & 31, c = lane & 3;
  const int G = a.seg.group_size;
  const int64_t C = a.seg.capacity;
  const int slice_len = p.q_split_len / p.slices;
  auto subs = [&](int sl) {
    const int b = begin + sl * slice_len, e = min(end, b + slice_len);
    return e > b ? (e - b) / kSubTokens : 0;
  };
  const int CH = p.chunk, S = p.stages;
  const int n_steps = (subs(0) + CH - 1) / CH;  // slice 0 has the most sub-chunks
  const int my_subs = subs(ts);
  const int nthreads = blockDim.x;

  // One stage: for every slice with a sub-chunk s, its code rows (contiguous in global memory:
  // 16-byte unit e of the sub-chunk is token e / R, unit e % R, stored swizzled), the key
  // group's scale/min where process() folds the queries again, and the tokens' value scale/min.
  const uint8_t* planes[2 * M::KP];
#pragma unroll
  for (int pl = 0; pl < 2 * M::KP; ++pl) planes[pl] = plane_ptr<INT8>(a.seg, pl) + kvh * C * M::RB;
  const uint16_t* k_scale = a.seg.key_scale + kvh * (C / G) * HD;
  const uint16_t* k_min = a.seg.key_min + kvh * (C / G) * HD;
  const uint16_t* v_scale = a.seg.value_scale + kvh * C * NG;
  const uint16_t* v_min = a.seg.value_min + kvh * C * NG;
  auto issue = [&](int s) {
    if (s >= n_steps) return;
    unsigned char* stage = stages + (s % S) * p.stage_bytes;
    for (int si = 0; si < p.slices * CH; ++si) {
      const int sl = si / CH, j = s * CH + si % CH;  // sub-chunk j of slice sl
      if (j >= subs(sl)) continue;
      const int t_sub = begin + sl * slice_len + j * kSubTokens;
      unsigned char* sub = stage + si * M::kBytes;
      for (int e = threadIdx.x; e < kSubTokens * M::R; e += nthreads) {
        const int tok = e / M::R, u = e % M::R;
        const int dst = tok * M::RB + 16 * (u ^ M::swz(tok));
        const int64_t src = static_cast<int64_t>(t_sub) * M::RB + 16 * e;
#pragma unroll
        for (int pl = 0; pl < 2 * M::KP; ++pl) {
          cp_async16(smem_u32(sub + pl * M::kTile + dst), planes[pl] + src);
        }
      }
      if (j == 0 || t_sub % G == 0) {
        for (int e = threadIdx.x; e < HD / 4; e += nthreads) {  // 2 arrays x HD/8 units
          const int arr = e / (HD / 8), unit = e % (HD / 8);
          cp_async16(smem_u32(sub + M::kKMeta + arr * 2 * HD + unit * 16),
                     (arr ? k_min : k_scale) + static_cast<int64_t>(t_sub / G) * HD + unit * 8);
        }
      }
      for (int e = threadIdx.x; e < 8 * NG; e += nthreads) {  // 2 arrays x 4 NG units
        const int arr = e / (4 * NG), unit = e % (4 * NG);
        cp_async16(smem_u32(sub + M::kVMeta + arr * 2 * kSubTokens * NG + unit * 16),
                   (arr ? v_min : v_scale) + static_cast<int64_t>(t_sub) * NG + unit * 8);
      }
    }
  };

  for (int s = 0; s < S - 1; ++s) {
    issue(s);
    cp_async_commit();
  }
  overlap();

  M w;
  {
    int b[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int qv = qv_warp + 2 * c + k;
      b[k] = qv < p.nq ? quant_boundary_dev(a.pos + qv / p.group, G) : 0;
    }
    w.init(b[0], b[1]);
  }
  const float* q_row = q_warp + (lane >> 2) * M::kQStride;
  for (int s = 0; s < n_steps; ++s) {
    // S - 1 + s groups committed (empty ones too): at most S - 2 pending = group s has landed.
    cp_async_wait_n(S - 2);
    __syncthreads();  // stage s landed for all threads; stage s - 1 is free again
    issue(s + S - 1);
    cp_async_commit();
    const unsigned char* stage = stages + (s % S) * p.stage_bytes + ts * CH * M::kBytes;
    for (int i = 0; i < CH; ++i) {
      const int j = s * CH + i;
      if (j >= my_subs) break;
      const int t_sub = begin + ts * slice_len + j * kSubTokens;
      w.process(stage + i * M::kBytes, j == 0 || t_sub % G == 0, t_sub, q_row);
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // the quantized states are stored over the stages
  w.store(o_mine, ml_mine);
}

#include "backend/cuda/attention_quant_direct.cuh"

// The merge's per-vector scratch: one weight per state (kind x slice, slices <= 2), max, sum.
constexpr int kMaxStates = 4;
constexpr int kMergeSlots = kMaxStates + 2;
static_assert(kMergeSlots <= 32 + kQPad, "the merge scratch fits in a query row (head_dim >= 32)");

// q_s[j][HD + kQPad] = query vector qv_block + j of kv head kvh, times scale_log2 (zeros past the
// last vector): 16-byte loads (check_args: q is 16-byte aligned), four per thread in flight
// before their stores.
template <int HD>
__device__ __forceinline__ void load_query_tile(const Params& p, int kvh, int qv_block,
                                                int block_qv, float* q_s) {
  constexpr int kQStride = HD + kQPad, kV4 = HD / 4, kU = 4;
  const QuantAttentionArgs& a = p.a;
  const int64_t q_row_len = static_cast<int64_t>(a.num_heads) * HD;
  const int n = block_qv * kV4;
  for (int e0 = threadIdx.x; e0 < n; e0 += kU * blockDim.x) {
    float4 x[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int e = e0 + u * blockDim.x;
      const int qv = qv_block + e / kV4;
      x[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (e < n && qv < p.nq) {
        const int row = qv / p.group, head = kvh * p.group + qv % p.group;
        const float* src = a.q + row * q_row_len + static_cast<int64_t>(head) * HD + (e % kV4) * 4;
        x[u] = *reinterpret_cast<const float4*>(src);
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int e = e0 + u * blockDim.x;
      if (e < n) {
        const float sc = a.scale_log2;
        *reinterpret_cast<float4*>(q_s + (e / kV4) * kQStride + (e % kV4) * 4) =
            make_float4(x[u].x * sc, x[u].y * sc, x[u].z * sc, x[u].w * sc);
      }
    }
  }
}

// Grid: x = split, y = kv head, z = query group (tiles * QW query vectors of the kv head).
// Split x reads the quantized positions [x * q_split_len, +q_split_len) below q_end and the
// full-precision rows [fp_begin + x * fp_split_len, +fp_split_len) below fp_end (either may be
// empty). Block: tiles * slices warps; warp (ts, qt) = (warp / tiles, warp % tiles) keeps one
// state per kind, merged at the end with the other slices' states.
// kDirect: the quantized part on the register-direct path (attention_quant_direct.cuh; head_dim
// 128, NG 1, tensor cores), QW / 8 tiles of 8 query vectors per warp.
template <int HD, bool INT8, int NG, bool kMma, int QW, bool kDirect, bool kF16 = false,
          bool kRegPrefetch = true, bool kRing = false, int kTC = kPairCols>
__device__ __forceinline__ void attention_quant_body(const Params& p) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int kQStride = HD + kQPad;
  const QuantAttentionArgs& a = p.a;
  const int kvh = blockIdx.y;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int qt = warp % p.tiles, ts = warp / p.tiles;
  const int block_qv = p.tiles * QW;
  const int qv_block = blockIdx.z * block_qv;
  const int G = a.seg.group_size;
  float* q_s = reinterpret_cast<float*>(smem);  // [block_qv][kQStride]
  // Then the pipeline stages, also the quantized states once the stages are consumed, then the
  // full-precision states. A state region: o [slices][block_qv][HD], (m, l) [slices][block_qv][2].
  unsigned char* stages = smem + p.q_smem_bytes;
  const int state_floats = p.slices * block_qv * (HD + 2);
  // The direct path's ring with several tiles per warp: the full-precision states run after the
  // loop, in the rings' memory (block_smem).
  constexpr bool kFpInRing = kDirect && direct_path::ring_halves(kRing, QW / 8);
  float* q_states = reinterpret_cast<float*>(stages);
  float* fp_states = reinterpret_cast<float*>(
      kFpInRing
          ? smem + p.ring_offset
          : stages + max(p.stages * p.stage_bytes, state_floats * static_cast<int>(sizeof(float))));
  const int n_states = 2 * p.slices;  // (kind, slice): fp slices, then quantized slices
  auto state_o = [&](int st) {
    float* base = st < p.slices ? fp_states : q_states;
    return base + (st % p.slices) * block_qv * HD;
  };
  auto state_ml = [&](int st) {
    float* base = st < p.slices ? fp_states : q_states;
    return base + p.slices * block_qv * HD + (st % p.slices) * block_qv * 2;
  };

  // The block's query vectors, pre-scaled to base-2 units; zeros past the last one. Four
  // 16-byte loads per thread in flight before their stores (one element per thread and
  // iteration was a chain of dependent L2 round trips: ~10 us for 24 query vectors).
  load_query_tile<HD>(p, kvh, qv_block, block_qv, q_s);
  __syncthreads();
  timeline_stamp(p, 2);

  const int qv_warp = qv_block + qt * QW;
  const float* q_warp = q_s + qt * QW * kQStride;
  auto state = [&](int kind, float*& o_w, float*& ml_w) {
    o_w = state_o(kind * p.slices + ts) + qt * QW * HD;
    ml_w = state_ml(kind * p.slices + ts) + qt * QW * 2;
  };
  // The CUDA-core path (RowPath) takes the warp's query vectors RQW at a time: its registers hold
  // RQW * HD / 32 floats each of queries and outputs.
  constexpr int RQW = QW < 8 ? QW : 8;
  static_assert(QW % RQW == 0);
  // The full-precision rows after the loop (kFpInRing), whose registers are dead by then: all the
  // warp's vectors in one pass.
  constexpr int kFpR = kFpInRing ? QW : RQW;
  // This lane's query in RowPath pass `sub`: valid, its position t and quantized boundary b(t).
  struct LaneQuery {
    bool valid;
    int t;
    int b;
  };
  // (R query vectors per pass: 32 / R lanes per vector.)
  auto lane_query = [&](int sub, int R) {
    const int qv = qv_warp + sub * R + lane / (32 / R);
    LaneQuery lq{qv < p.nq, a.pos, 0};
    if (lq.valid) {
      lq.t = a.pos + qv / p.group;
      lq.b = quant_boundary_dev(lq.t, G);
    }
    return lq;
  };

  // Full-precision part of a query at t: [b(t), t].
  auto fp_rows = [&]() {
    const auto [begin, end] = split_fp_rows(p);
    const int64_t off = static_cast<int64_t>(kvh) * HD + lane * (HD / 32);  // elements
    const bool f16 = a.kv_dtype == DType::F16;
    const int64_t off_bytes = off * (f16 ? 2 : 4);
    const FpRows<HD> rows{static_cast<const char*>(a.k) + off_bytes,
                          static_cast<const char*>(a.v) + off_bytes, a.row_stride, a.fp_base, f16};
    float *o_w, *ml_w;
    state(0, o_w, ml_w);
    // Passes of R vectors while any of the warp's vectors is valid (the merge reads no other).
    auto passes = [&](auto r_tag) {
      constexpr int R = decltype(r_tag)::value;
#pragma unroll 1
      for (int sub = 0; sub < QW / R && qv_warp + sub * R < p.nq; ++sub) {
        const LaneQuery lq = lane_query(sub, R);
        RowPath<HD, R> w;
        w.init(q_warp + sub * R * kQStride, lq.valid ? lq.b : 1, lq.valid ? lq.t : 0);
        w.template run<R <= 8 ? fp_row_unroll<HD>() : 2>(rows, begin, end, ts, p.slices);
        w.store(o_w + sub * R * HD, ml_w + sub * R * 2);
      }
    };
    // One vector per kv head (an MHA draft step): the whole warp on it, ~8x fewer instructions
    // than a pass of 8 mostly empty vectors.
    if (RQW > 1 && p.nq - qv_warp == 1) {
      passes(std::integral_constant<int, 1>{});
    } else {
      passes(std::integral_constant<int, kFpR>{});
    }
  };

  const auto [q_begin, q_end] = split_quantized(p);
  float *o_q, *ml_q;
  state(1, o_q, ml_q);
  if constexpr (kDirect && HD == direct_path::kHD && NG == 1) {
    unsigned char* ring =
        kRing ? smem + p.ring_offset + warp * direct_path::ring_bytes_per_warp<INT8>(QW / 8)
              : nullptr;
    direct_path::quant_split_direct<INT8, kF16, kRegPrefetch, QW / 8, kRing, kTC>(
        p, q_begin, q_end, kvh, ts, qv_warp, q_warp, o_q, ml_q, ring, fp_rows);
  } else if constexpr (kMma) {
    quant_split_mma<HD, INT8, NG, kF16>(p, q_begin, q_end, kvh, ts, qv_warp, q_warp, stages, o_q,
                                        ml_q, fp_rows);
  } else {
    fp_rows();
    // Quantized part of a query at t: [0, b(t)).
    static_assert(QW == RQW, "the CUDA-core path: one RowPath pass per warp");
    const LaneQuery lq = lane_query(0, RQW);
    RowPath<HD, QW> w;
    w.init(q_warp, lq.valid ? 0 : 1, lq.valid ? lq.b - 1 : 0);
    const int64_t C = a.seg.capacity;
    const int64_t codes = static_cast<int64_t>(kvh) * C * (HD / 2);
    const int gv = a.seg.value_group_size, ng = HD / gv;
    const QuantRows<HD, INT8> rows{a.seg.key_upper + codes,
                                   INT8 ? a.seg.key_lower + codes : nullptr,
                                   a.seg.value_upper + codes,
                                   INT8 ? a.seg.value_lower + codes : nullptr,
                                   a.seg.key_scale + static_cast<int64_t>(kvh) * (C / G) * HD,
                                   a.seg.key_min + static_cast<int64_t>(kvh) * (C / G) * HD,
                                   a.seg.value_scale + static_cast<int64_t>(kvh) * C * ng,
                                   a.seg.value_min + static_cast<int64_t>(kvh) * C * ng,
                                   G,
                                   gv,
                                   ng};
    w.template run<kQuantRowUnroll>(rows, q_begin, q_end, ts, p.slices);
    w.store(o_q, ml_q);
  }
  __syncthreads();
  timeline_stamp(p, 5);

  // Merge the states and write this split's partial state of every valid query vector: each
  // vector's weights once (thread per vector, over the consumed queries' memory), then 16 bytes
  // of o per thread (per element, the weights' exponentials and the states' maxima were
  // recomputed HD times: ~1 us per element and thread).
  float* w_s = q_s;  // [block_qv][kMergeSlots]: the states' weights, then the max and the sum
  for (int j = threadIdx.x; j < block_qv; j += blockDim.x) {
    if (qv_block + j >= p.nq) continue;
    float m_tot = kNegInf;
    for (int st = 0; st < n_states; ++st) m_tot = fmaxf(m_tot, state_ml(st)[2 * j]);
    float l_tot = 0.0f;
    for (int st = 0; st < n_states; ++st) {
      const float wgt = merge_weight(state_ml(st)[2 * j], m_tot);
      w_s[j * kMergeSlots + st] = wgt;
      l_tot += wgt * state_ml(st)[2 * j + 1];
    }
    w_s[j * kMergeSlots + kMaxStates] = m_tot;
    w_s[j * kMergeSlots + kMaxStates + 1] = l_tot;
  }
  __syncthreads();
  const int64_t num_qv = static_cast<int64_t>(a.m) * a.num_heads;
  constexpr int kV4 = HD / 4;
  for (int e = threadIdx.x; e < block_qv * kV4; e += blockDim.x) {
    const int j = e / kV4, d = (e % kV4) * 4;
    const int qv = qv_block + j;
    if (qv >= p.nq) continue;
    float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int st = 0; st < n_states; ++st) {
      const float wgt = w_s[j * kMergeSlots + st];
      const float4 x = *reinterpret_cast<const float4*>(state_o(st) + j * HD + d);
      o.x = fmaf(wgt, x.x, o.x), o.y = fmaf(wgt, x.y, o.y);
      o.z = fmaf(wgt, x.z, o.z), o.w = fmaf(wgt, x.w, o.w);
    }
    const int row = qv / p.group, head = kvh * p.group + qv % p.group;
    const int64_t slot =
        static_cast<int64_t>(blockIdx.x) * num_qv + static_cast<int64_t>(row) * a.num_heads + head;
    *reinterpret_cast<float4*>(p.partial_o + slot * HD + d) = o;
    if (d == 0) {
      p.partial_ml[slot * 2] = w_s[j * kMergeSlots + kMaxStates];
      p.partial_ml[slot * 2 + 1] = w_s[j * kMergeSlots + kMaxStates + 1];
    }
  }
  timeline_stamp(p, 6);
}

template <int HD, bool INT8, int NG, bool kMma, int QW, bool kF16 = false>
__global__ void QS_QUANT_ATTENTION_BOUNDS attention_quant_kernel(const Params p) {
  timeline_stamp(p, 0);
  pdl_begin();
  timeline_stamp(p, 1);
  attention_quant_body<HD, INT8, NG, kMma, QW, false, kF16>(p);
}

// kF16: the view's operands in f16 alone (QuantAttentionTuning::draft_f16 for the INT4 view,
// int8_f16 for the INT8 one); NT: 8-query tiles per warp; kRing: the per-warp cp.async ring
// (QuantAttentionTuning::direct_ring); kTC: the tile's query columns (TileCols: one
// query vector per kv head, QuantAttentionTuning::single_query; 2..4, even_columns).
template <bool INT8, int kRegs, bool kF16, bool kRegPrefetch = true, int NT = 1, bool kRing = false,
          int kTC = kPairCols>
__global__ void QS_QUANT_DIRECT_BOUNDS(kRegs) attention_quant_direct_kernel(const Params p) {
  timeline_stamp(p, 0);
  direct_path::prefetch_block_start<INT8>(p);
  pdl_begin();
  timeline_stamp(p, 1);
  attention_quant_body<direct_path::kHD, INT8, 1, true, 8 * NT, true, kF16, kRegPrefetch, kRing,
                       kTC>(p);
}

// ---- host side ------------------------------------------------------------------------------

// The f16-operand draft without register prefetch also at this cap: 8 two-warp blocks per SM
// instead of 6 at 168 (QuantAttentionTuning::direct_regs).
constexpr int kLightDraftRegs = 128;

// QuantAttentionTuning::direct_regs values (0: automatic; kLightDraftRegs: the light draft).
bool valid_direct_regs(int regs) {
  return regs == 0 || regs == kLightDraftRegs || regs == 168 || regs == 192;
}

std::mutex g_tuning_mu;
// End-to-end A/B runs without a rebuild: QS_DRAFT_REG_PREFETCH=0|1 starts the process without /
// with the f16 draft's register prefetch, QS_DIRECT_TILES=0|1|2 with that many 8-query tiles per
// warp on the direct INT8 path (0: automatic), QS_DIRECT_RING=0|1 without / with the direct
// path's per-warp cp.async ring, QS_DIRECT_REGS=0|128|168|192 with that register cap (0:
// automatic; 128: the f16-operand draft without register prefetch only), QS_INT8_F16=1 with the
// INT8 view's direct kernels on f16 operands alone, QS_GQA_TWO_TILES=0 with one tile per warp
// for more than 16 query vectors per kv head over any history, QS_QUANT_PREFILL=0 with the
// slices of 16 queries for longer blocks, QS_EVEN_COLUMNS=0|1 without / with the even-column
// draft kernel for 2..4 query vectors per kv head, QS_INT8_EVEN_COLUMNS=0|1 the INT8 view's for up
// to 4.
QuantAttentionTuning g_tuning = [] {
  QuantAttentionTuning t;
  t.draft_reg_prefetch = env_int("QS_DRAFT_REG_PREFETCH", 0, 1, t.draft_reg_prefetch) != 0;
  t.direct_tiles = env_int("QS_DIRECT_TILES", 0, kQuantAttentionMaxDirectTiles, t.direct_tiles);
  t.direct_ring = env_int("QS_DIRECT_RING", 0, 1, t.direct_ring);
  t.int8_f16 = env_flag("QS_INT8_F16", t.int8_f16);
  t.long_history_two_tiles = env_flag("QS_GQA_TWO_TILES", t.long_history_two_tiles);
  t.even_columns = env_flag("QS_EVEN_COLUMNS", t.even_columns);
  t.int8_even_columns = env_flag("QS_INT8_EVEN_COLUMNS", t.int8_even_columns);
  t.hybrid_prefill = env_flag("QS_QUANT_PREFILL", t.hybrid_prefill);
  const int regs = env_int("QS_DIRECT_REGS", 0, 192, t.direct_regs);
  if (valid_direct_regs(regs)) {
    t.direct_regs = regs;
  } else {
    std::fprintf(stderr, "quantspec: ignoring QS_DIRECT_REGS=%d (expected 0, 128, 168 or 192)\n",
                 regs);
  }
  return t;
}();

struct KernelChoice {
  const void* fn = nullptr;
  bool mma = false;
  bool direct = false;  // tensor cores, register-direct (no shared-memory stages)
  bool f16 = false;     // the view's operands in f16 alone (QuantAttentionPlan::f16_operands)
  int direct_tiles = 1;    // the direct path's 8-query tiles per warp
  bool ring = false;       // the direct path's per-warp cp.async ring
  int cols = kPairCols;    // its tile's query columns (TileCols)
  bool int8 = false;       // the view (the ring's slot size)
  int qw = 8;  // query vectors per warp
  int ng = 0;  // value groups (tensor-core kernels)
};

// Register cap of the direct kernels with two tiles per warp (the INT8 view only): two O^T tiles
// of 32 floats each, the folded queries in shared memory; no spill.
constexpr int kDirectRegsTwoTiles = 255;

// The one-tile direct kernel at register cap `regs`: 168 or 192, and for the f16-operand draft
// without register prefetch also kLightDraftRegs (more two-warp blocks per SM). cols
// (TileCols): the light draft's ring kernel at 192 registers (the MHA draft's
// default) in its one-query form (kOneCol); the even-column form (kEvenCols) of the light draft's
// ring kernel at 192 / 168 and of the INT8 view's one-tile ring kernel at 192; choose_for decides
// where they apply.
template <bool INT8, bool kF16, bool kRegPrefetch, bool kRing>
const void* direct_kernel_at(int regs, int cols) {
  constexpr bool kLight = !INT8 && kF16 && !kRegPrefetch;
  if constexpr (kLight && kRing) {
    if (cols == kOneCol) {
      QS_CHECK(regs == 192);
      return reinterpret_cast<const void*>(
          attention_quant_direct_kernel<INT8, 192, kF16, kRegPrefetch, 1, kRing, kOneCol>);
    }
    if (cols == kEvenCols) {
      QS_CHECK(regs == 192 || regs == 168);
      return regs == 192 ? reinterpret_cast<const void*>(
                               attention_quant_direct_kernel<INT8, 192, kF16, kRegPrefetch, 1,
                                                             kRing, kEvenCols>)
                         : reinterpret_cast<const void*>(
                               attention_quant_direct_kernel<INT8, 168, kF16, kRegPrefetch, 1,
                                                             kRing, kEvenCols>);
    }
  }
  if constexpr (INT8 && kRing) {
    if (cols == kEvenCols) {
      QS_CHECK(regs == 192);
      return reinterpret_cast<const void*>(
          attention_quant_direct_kernel<INT8, 192, kF16, kRegPrefetch, 1, kRing, kEvenCols>);
    }
  }
  QS_CHECK_MSG(cols == kPairCols,
               "quantized attention: the one-query kernel is the light draft's ring kernel, the "
               "even-column ones the ring kernels of the light draft and of the INT8 view");
  if constexpr (kLight) {
    if (regs == kLightDraftRegs) {
      return reinterpret_cast<const void*>(
          attention_quant_direct_kernel<INT8, kLightDraftRegs, kF16, kRegPrefetch, 1, kRing>);
    }
  }
  QS_CHECK_MSG(regs == 168 || regs == 192,
               "quantized attention: this direct kernel has register caps 168 and 192 only");
  return regs == 192 ? reinterpret_cast<const void*>(
                           attention_quant_direct_kernel<INT8, 192, kF16, kRegPrefetch, 1, kRing>)
                     : reinterpret_cast<const void*>(
                           attention_quant_direct_kernel<INT8, 168, kF16, kRegPrefetch, 1, kRing>);
}

template <bool INT8, bool kF16, bool kRegPrefetch>
const void* direct_kernel_fn(int regs, int tiles, bool ring, int cols) {
  if constexpr (INT8) {
    if (tiles == 2) {
      return ring ? reinterpret_cast<const void*>(
                        attention_quant_direct_kernel<true, kDirectRegsTwoTiles, kF16, true, 2,
                                                      true>)
                  : reinterpret_cast<const void*>(
                        attention_quant_direct_kernel<true, kDirectRegsTwoTiles, kF16, true, 2>);
    }
  }
  QS_CHECK_MSG(tiles == 1, "quantized attention: several tiles per warp need the INT8 view");
  if constexpr (INT8 || (kF16 && !kRegPrefetch)) {
    if (ring) return direct_kernel_at<INT8, kF16, false, true>(regs, cols);
  }
  QS_CHECK(!ring);
  return direct_kernel_at<INT8, kF16, kRegPrefetch, false>(regs, cols);
}

template <int HD, bool INT8, bool kF16>
const void* mma_kernel_fn(int ng) {
  if (ng == 1)
    return reinterpret_cast<const void*>(attention_quant_kernel<HD, INT8, 1, true, 8, kF16>);
  if (ng == 2)
    return reinterpret_cast<const void*>(attention_quant_kernel<HD, INT8, 2, true, 8, kF16>);
  if constexpr (HD == 128) {
    QS_CHECK(ng == 4);
    return reinterpret_cast<const void*>(attention_quant_kernel<HD, INT8, 4, true, 8, kF16>);
  }
  return nullptr;
}

// f16: the INT4 view's operands in f16 alone (this path keeps the INT8 view exact).
template <int HD, bool INT8>
KernelChoice mma_kernel(int ng, bool f16) {
  KernelChoice k;
  k.mma = true;
  k.qw = 8;
  k.ng = ng;
  k.f16 = !INT8 && f16;
  k.fn = k.f16 ? mma_kernel_fn<HD, false, true>(ng) : mma_kernel_fn<HD, INT8, false>(ng);
  QS_CHECK(k.fn != nullptr);
  return k;
}

template <int HD, bool INT8>
KernelChoice row_kernel() {
  constexpr int qw = HD >= 256 ? 4 : 8;  // registers: qw * HD / 32 floats each of q and o
  KernelChoice k;
  k.fn = reinterpret_cast<const void*>(attention_quant_kernel<HD, INT8, 0, false, qw>);
  k.qw = qw;
  return k;
}

// The tensor-core kernels need head_dim 64/128, value groups of whole 16-byte code units and key
// groups of whole sub-chunks; everything else runs on CUDA cores (e.g. G = 8 in the model tests).
// The register-direct variant covers head_dim 128 with one value group per token (the default).
// tiles: the direct path's 8-query tiles per warp (1 for the INT4 view). cols: the tile's query
// columns wanted (TileCols: kOneCol for a single query vector per kv head, kEvenCols
// for up to 4), taken where the kernel has that form (kOneCol: the f16 draft's ring kernel at 192
// registers; kEvenCols: that kernel at 192 or 168, the INT8 view's one-tile ring kernel at 192),
// else kPairCols. f16: the view's operands in f16 alone where the path has that form (the INT4
// view on every tensor-core path, the INT8 view on the direct one).
template <bool INT8>
KernelChoice choose_for(int hd, int G, int gv, bool tensor_cores, bool direct, int regs, bool f16,
                        bool reg_prefetch, int tiles, bool ring, int cols) {
  if (tensor_cores && direct && hd == 128 && gv == hd && G % kSubTokens == 0) {
    KernelChoice k;
    k.mma = k.direct = true;
    k.direct_tiles = INT8 ? tiles : 1;
    k.qw = 8 * k.direct_tiles;
    k.ng = 1;
    k.f16 = f16;
    // The ring: the INT8 view (one or two tiles) or the f16 draft without register prefetch.
    k.ring = ring && (INT8 || (k.f16 && !reg_prefetch));
    k.int8 = INT8;
    const bool light_ring = !INT8 && k.f16 && !reg_prefetch && k.ring;
    const bool int8_ring = INT8 && k.ring && k.direct_tiles == 1;
    const bool even = light_ring ? regs == 192 || regs == 168 : int8_ring && regs == 192;
    k.cols = cols == kOneCol && light_ring && regs == 192 ? kOneCol
             : cols == kEvenCols && even                  ? kEvenCols
                                                          : kPairCols;
    if constexpr (INT8) {
      k.fn = k.f16 ? direct_kernel_fn<true, true, true>(regs, k.direct_tiles, k.ring, k.cols)
                   : direct_kernel_fn<true, false, true>(regs, k.direct_tiles, k.ring, k.cols);
    } else {
      k.fn = !k.f16          ? direct_kernel_fn<false, false, true>(regs, 1, k.ring, kPairCols)
             : !reg_prefetch ? direct_kernel_fn<false, true, false>(regs, 1, k.ring, k.cols)
                             : direct_kernel_fn<false, true, true>(regs, 1, false, kPairCols);
    }
    return k;
  }
  if (tensor_cores && (hd == 64 || hd == 128) && gv % 32 == 0 && G % kSubTokens == 0) {
    return hd == 64 ? mma_kernel<64, INT8>(hd / gv, f16) : mma_kernel<128, INT8>(hd / gv, f16);
  }
  switch (hd) {
    case 32:
      return row_kernel<32, INT8>();
    case 64:
      return row_kernel<64, INT8>();
    case 128:
      return row_kernel<128, INT8>();
    case 256:
      return row_kernel<256, INT8>();
    default:
      QS_CHECK_MSG(false, "quantized attention: unsupported head_dim");
  }
  return {};
}

KernelChoice choose_kernel(const QuantAttentionArgs& a, bool tensor_cores, bool direct, int regs,
                           bool f16, bool reg_prefetch, int tiles, bool ring, int cols) {
  const QuantizedKvSegment& s = a.seg;
  return s.int8 ? choose_for<true>(a.head_dim, s.group_size, s.value_group_size, tensor_cores,
                                   direct, regs, f16, reg_prefetch, tiles, ring, cols)
                : choose_for<false>(a.head_dim, s.group_size, s.value_group_size, tensor_cores,
                                    direct, regs, f16, reg_prefetch, tiles, ring, cols);
}

// Resident blocks per SM of a kernel configuration (cached: the occupancy query is not free),
// after raising the kernel's dynamic shared memory limit when it needs more than 48 KiB.
int blocks_per_sm(const void* fn, int threads, size_t smem) {
  struct Entry {
    const void* fn;
    int threads;
    size_t smem;
    int blocks;
  };
  static std::mutex mu;
  static std::vector<Entry> cache;
  static std::vector<std::pair<const void*, size_t>> smem_limit;
  std::lock_guard<std::mutex> lock(mu);
  for (const Entry& e : cache) {
    if (e.fn == fn && e.threads == threads && e.smem == smem) return e.blocks;
  }
  auto it = std::find_if(smem_limit.begin(), smem_limit.end(),
                         [&](const auto& s) { return s.first == fn; });
  const size_t have = it == smem_limit.end() ? size_t{48} << 10 : it->second;
  if (smem > have) {
    CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(smem)));
    if (it == smem_limit.end()) {
      smem_limit.emplace_back(fn, smem);
    } else {
      it->second = smem;
    }
  }
  int blocks = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fn, threads, smem));
  cache.push_back({fn, threads, smem, blocks});
  return blocks;
}

void check_args(const QuantAttentionArgs& a) {
  const QuantizedKvSegment& s = a.seg;
  QS_CHECK(a.m >= 1 && a.m <= kQuantAttentionMaxRows && a.pos >= 0);
  QS_CHECK(a.num_kv_heads >= 1 && a.num_heads % a.num_kv_heads == 0);
  QS_CHECK(a.num_kv_heads <= 65535);
  QS_CHECK_MSG(attention_head_dim_supported(a.head_dim),
               "quantized attention: unsupported head_dim");
  const int G = s.group_size;
  QS_CHECK_MSG(G > 0, "quantized attention: no key group size");
  QS_CHECK_MSG(s.value_group_size > 0 && a.head_dim % s.value_group_size == 0,
               "quantized attention: the value group size must divide head_dim");
  QS_CHECK(s.capacity >= 0 && s.capacity % G == 0);
  QS_CHECK_MSG(quant_boundary(a.pos + a.m - 1, G) <= s.capacity,
               "quantized attention: the queries' boundary is past the quantized capacity");
  QS_CHECK_MSG(a.fp_base >= 0 && a.fp_base <= quant_boundary(a.pos, G),
               "attention: full-precision rows start after the quantization boundary");
  QS_CHECK_MSG(a.kv_dtype == DType::F32 || a.kv_dtype == DType::F16,
               "quantized attention: full-precision rows are F32 or F16");
  QS_CHECK(a.row_stride >= static_cast<int64_t>(a.num_kv_heads) * a.head_dim);
  QS_CHECK_MSG(a.row_stride % 4 == 0,
               "quantized attention: KV row stride must be a multiple of 4 elements");
  // Full-precision rows are read at most 4 elements at a time: 16 bytes (f32), 8 bytes (f16).
  QS_CHECK_MSG((reinterpret_cast<uintptr_t>(a.k) | reinterpret_cast<uintptr_t>(a.v)) %
                       (4 * dtype_size(a.kv_dtype)) ==
                   0,
               "quantized attention: the full-precision rows must be aligned to 4 elements");
  QS_CHECK(s.key_upper && s.value_upper && s.key_scale && s.key_min && s.value_scale &&
           s.value_min);
  QS_CHECK_MSG(!s.int8 || (s.key_lower && s.value_lower),
               "quantized attention: the INT8 view needs both planes");
  uintptr_t bits =
      reinterpret_cast<uintptr_t>(a.q) | reinterpret_cast<uintptr_t>(a.out) |
      reinterpret_cast<uintptr_t>(s.key_upper) | reinterpret_cast<uintptr_t>(s.value_upper) |
      reinterpret_cast<uintptr_t>(s.key_scale) | reinterpret_cast<uintptr_t>(s.key_min) |
      reinterpret_cast<uintptr_t>(s.value_scale) | reinterpret_cast<uintptr_t>(s.value_min);
  if (s.int8) {
    bits |= reinterpret_cast<uintptr_t>(s.key_lower) | reinterpret_cast<uintptr_t>(s.value_lower);
  }
  QS_CHECK_MSG(bits % 16 == 0,
               "quantized attention: q, out and every plane/metadata array must be 16-byte "
               "aligned");
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// 8-query tiles per warp of the direct INT8 view for nq query vectors per kv head. Two when they
// hold all of them (9..16: MHA gamma 8..15, GQA-8 m = 2), else one. Measured (bench_ops quantkv,
// H200, 32K): MHA m = 9 168 us with 2 tiles vs 210 with 1 (one warp per token slice instead of
// two, 255 registers, no spill); GQA-4 m = 5 / 7 / 9 slower with 2 (128 / 147 / 187 vs 110 / 133
// / 165 us): the blocks per SM are register-bound either way (3 warps x 168 or 2 x 255 per kv
// head's codes) and fewer warps hide less latency. A 3-tile kernel (session 6) spilled ~240 bytes
// at 255 registers and was slower at every m: removed. Since session 37 more than 16 also take
// two over a long history (QuantAttentionTuning::long_history_two_tiles).
int auto_direct_tiles(int64_t nq, bool long_two) {
  return (nq > 8 && nq <= 16) || (nq > 16 && long_two) ? 2 : 1;
}

}  // namespace

// ---- API ------------------------------------------------------------------------------------

void set_quant_attention_tuning(const QuantAttentionTuning& tuning) {
  QS_CHECK_MSG(valid_direct_regs(tuning.direct_regs),
               "quantized attention: direct_regs must be 0 (automatic), 128 (the f16-operand "
               "draft without register prefetch), 168 or 192");
  QS_CHECK_MSG(tuning.direct_tiles >= 0 && tuning.direct_tiles <= kQuantAttentionMaxDirectTiles,
               "quantized attention: direct_tiles must be 0 (automatic), 1 or 2");
  std::lock_guard<std::mutex> lock(g_tuning_mu);
  g_tuning = tuning;
}

QuantAttentionTuning quant_attention_tuning() {
  std::lock_guard<std::mutex> lock(g_tuning_mu);
  return g_tuning;
}

QuantAttentionArgs make_quant_attention_args(const float* q, int m, int pos,
                                             const AttentionShape& shape, const KvView& kv,
                                             float* out) {
  QS_CHECK(kv.quantized != nullptr);
  QS_CHECK_MSG(kv.selection == nullptr, "attention: a KV selection over a quantized history");
  QS_CHECK_MSG(kv.length >= pos + m, "attention: the KV view does not cover the queries");
  QuantAttentionArgs a;
  a.q = q;
  a.out = out;
  a.k = kv.k;
  a.v = kv.v;
  a.kv_dtype = kv.row_dtype;
  a.row_stride = kv.row_stride;
  a.fp_base = kv.fp_base;
  a.seg = *kv.quantized;
  a.m = m;
  a.pos = pos;
  a.num_heads = shape.num_heads;
  a.num_kv_heads = shape.num_kv_heads;
  a.head_dim = shape.head_dim;
  a.scale_log2 = static_cast<float>(static_cast<double>(shape.scale) * M_LOG2E);
  check_args(a);
  return a;
}

// The direct path's per-warp rings (after the states), or 0.
size_t ring_bytes(const KernelChoice& kc, int threads) {
  if (!kc.ring) return 0;
  const int per_warp = kc.int8 ? direct_path::ring_bytes_per_warp<true>(kc.direct_tiles)
                               : direct_path::ring_bytes_per_warp<false>(kc.direct_tiles);
  return static_cast<size_t>(threads / 32) * per_warp;
}

// A block's shared memory: the queries (q_bytes), the pipeline stages (stages_bytes) or the
// quantized states, the full-precision states, then the direct path's rings from ring_offset.
// With several tiles per warp the full-precision states live in the rings' memory (they are
// computed after the loop): Llama-3.1-8B verify, 42,752 instead of 59,392 bytes, four blocks
// per SM (the register limit at 255) instead of three.
struct BlockSmem {
  size_t ring_offset = 0;
  size_t bytes = 0;
};
BlockSmem block_smem(const KernelChoice& kc, int threads, size_t q_bytes, size_t stages_bytes,
                     size_t state_bytes) {
  const bool fp_in_ring = direct_path::ring_halves(kc.ring, kc.direct_tiles);
  const size_t before =
      q_bytes + std::max(stages_bytes, state_bytes) + (fp_in_ring ? 0 : state_bytes);
  if (!kc.ring) return {0, before};
  const size_t offset = (before + 127) / 128 * 128;
  const size_t rings = ring_bytes(kc, threads);
  return {offset, offset + (fp_in_ring ? std::max(rings, state_bytes) : rings)};
}

QuantAttentionPlan plan_attention_quant(const QuantAttentionArgs& a, int num_sms) {
  check_args(a);
  QS_CHECK(num_sms >= 1);
  const QuantAttentionTuning tune = quant_attention_tuning();
  // The query tiling does not depend on the register cap (8 query vectors per warp on every
  // tensor-core path), so the kernel is chosen again once the tiles are known.
  // Operands in f16 alone: the INT4 (draft) view unless the call asks for it exact, the INT8 view
  // where the call or int8_f16 asks for it (both only where the chosen path has that form).
  const bool f16 = a.seg.int8 ? tune.int8_f16 || a.f16_int8 : tune.draft_f16 && !a.exact_draft;
  const int64_t nq = static_cast<int64_t>(a.num_heads / a.num_kv_heads) * a.m;
  const int hd = a.head_dim, G = a.seg.group_size;
  const int b_min = quant_boundary(a.pos, G), b_max = quant_boundary(a.pos + a.m - 1, G);
  // Two tiles per warp and the ring for many query vectors over a long history (the INT8 view:
  // only it has the two-tile kernels).
  const bool long_two = tune.long_history_two_tiles && tune.direct_tiles == 0 && a.seg.int8 &&
                        nq > 16 && b_max >= kLongHistoryTwoTiles;
  const int want_tiles =
      tune.direct_tiles > 0 ? tune.direct_tiles : auto_direct_tiles(nq, long_two);
  // The tile's query columns: one vector per kv head over the INT4 view (an MHA draft step), or up
  // to 4 (a GQA draft step; over the INT8 view also one: AR INT8, a short MHA verification).
  const int cols = nq == 1 && tune.single_query && !a.seg.int8 ? kOneCol
                   : nq <= 4 && (a.seg.int8 ? tune.int8_even_columns : tune.even_columns)
                       ? kEvenCols
                       : kPairCols;
  KernelChoice kc = choose_kernel(a, tune.tensor_cores, tune.direct, 192, f16,
                                  tune.draft_reg_prefetch, want_tiles, false, kPairCols);
  QuantAttentionPlan pl;
  pl.tensor_cores = kc.mma;
  pl.direct = kc.direct;
  pl.f16_operands = kc.f16;
  pl.draft_reg_prefetch = tune.draft_reg_prefetch;
  pl.timeline = tune.timeline;
  pl.direct_tiles = kc.direct_tiles;
  pl.queries_per_warp = kc.qw;
  const int64_t tiles = ceil_div(nq, kc.qw);
  pl.query_groups = static_cast<int>(ceil_div(tiles, kMaxTiles));
  QS_CHECK(pl.query_groups <= 65535);
  pl.query_tiles = static_cast<int>(ceil_div(tiles, pl.query_groups));
  // Register cap of the direct path, measured on the H200 (bench_ops quantkv, 32K): one query
  // tile (2-warp blocks: MHA m <= 8, GQA 4 at m = 1) runs faster at 192 (no spill; Llama-2-7B
  // draft 93 vs 101 us), several tiles at 168 (more blocks per SM; Llama-3.1-8B m = 5 / 9: 110 /
  // 165 us vs 119 / 207).
  // The f16-operand draft without the register prefetch (no spill at 168 either) ran faster at
  // 168 without the ring on the MHA shape until session 13's changes to the block's start and
  // merge; since then the ring at 192 is faster there too (session 14: the ring below).
  const bool light_draft = kc.direct && !kc.int8 && kc.f16 && !tune.draft_reg_prefetch;
  // kLightDraftRegs exists for the light draft alone: elsewhere it means the automatic cap.
  const bool forced_regs =
      tune.direct_regs != 0 && (tune.direct_regs != kLightDraftRegs || light_draft);
  pl.direct_regs = pl.direct_tiles == 2  ? kDirectRegsTwoTiles
                   : forced_regs         ? tune.direct_regs
                   : pl.query_tiles == 1 ? 192
                                         : 168;
  // The per-warp ring (kQuantAttentionDirectRing): automatic with one query tile per block
  // (several make blocks of 3-8 warps, each with its ring) and with two tiles per warp over a
  // long history.
  const bool want_ring =
      tune.direct_ring < 0 ? pl.query_tiles == 1 || long_two : tune.direct_ring == 1;
  kc = choose_kernel(a, tune.tensor_cores, tune.direct, pl.direct_regs, f16,
                     tune.draft_reg_prefetch, pl.direct_tiles, want_ring, cols);
  pl.token_slices = pl.query_tiles == 1 ? 2 : 1;
  pl.threads = 32 * pl.query_tiles * pl.token_slices;
  const size_t block_qv = static_cast<size_t>(pl.query_tiles) * kc.qw;
  const size_t q_bytes = (block_qv * (hd + kQPad) * sizeof(float) + 127) / 128 * 128;
  const size_t state_bytes = pl.token_slices * block_qv * (hd + 2) * sizeof(float);
  // Pipeline shape (tensor-core path): `chunk` sub-chunks per slice per stage, `stages` stages;
  // halved (chunk first) until the block fits the device's shared memory.
  pl.chunk = std::clamp(tune.chunk_subs > 0 ? tune.chunk_subs : kQuantAttentionDefaultChunk, 1,
                        kQuantAttentionMaxChunk);
  pl.stages = std::clamp(tune.stages > 0 ? tune.stages : kQuantAttentionDefaultStages, 2,
                         kQuantAttentionMaxStages);
  auto smem_for = [&](int chunk, int stages) {
    const size_t stage_bytes = kc.mma && !kc.direct
                                   ? static_cast<size_t>(pl.token_slices) * chunk *
                                         mma_sub_bytes(hd, a.seg.int8, kc.ng)
                                   : 0;
    return block_smem(kc, pl.threads, q_bytes, stages * stage_bytes, state_bytes).bytes;
  };
  const size_t smem_cap = max_smem_per_block();
  while (smem_for(pl.chunk, pl.stages) > smem_cap && (pl.chunk > 1 || pl.stages > 2)) {
    if (pl.chunk > 1) {
      pl.chunk /= 2;
    } else {
      --pl.stages;
    }
  }
  if (kc.ring && smem_for(pl.chunk, pl.stages) > smem_cap) {  // the rings do not fit: without
    kc = choose_kernel(a, tune.tensor_cores, tune.direct, pl.direct_regs, f16,
                       tune.draft_reg_prefetch, pl.direct_tiles, false, cols);
  }
  pl.direct_ring = kc.ring;
  pl.tile_cols = kc.cols;
  pl.smem_bytes = smem_for(pl.chunk, pl.stages);

  // One wave of blocks: `want` splits per (kv head, query group) share the quantized history;
  // each split also takes its share of the full-precision rows, at most kFpRowsPerWarp per warp
  // (those rows are latency-bound: a few steps, overlapped with the pipeline's first stages).
  const int64_t n_fp = static_cast<int64_t>(a.pos) + a.m - b_min;
  const int64_t base = static_cast<int64_t>(a.num_kv_heads) * pl.query_groups;
  const int64_t slots =
      static_cast<int64_t>(num_sms) * std::max(1, blocks_per_sm(kc.fn, pl.threads, pl.smem_bytes));
  const int64_t want = std::max<int64_t>(1, slots * std::max(1, tune.split_factor) / base);
  const int unit = kSubTokens * pl.token_slices;  // tensor-core sub-chunks of every slice
  const int64_t q_max = ceil_div(b_max, unit);    // splits with a non-empty quantized range
  int64_t splits =
      std::max(std::min(want, q_max), ceil_div(n_fp, int64_t{kFpRowsPerWarp} * pl.token_slices));
  if (tune.splits > 0) splits = tune.splits;
  splits = std::clamp<int64_t>(splits, 1, std::max(q_max, n_fp));
  pl.splits = static_cast<int>(splits);
  pl.fp_split_len = static_cast<int>(ceil_div(n_fp, splits));
  pl.q_split_len = b_max > 0 ? static_cast<int>(ceil_div(ceil_div(b_max, splits), unit) * unit) : 0;
  pl.partial_floats = splits * a.m * a.num_heads * (hd + 2);
  return pl;
}

void launch_attention_quant(const QuantAttentionArgs& a, const QuantAttentionPlan& plan,
                            float* partials, cudaStream_t stream) {
  check_args(a);
  const KernelChoice kc =
      choose_kernel(a, plan.tensor_cores, plan.direct, plan.direct_regs, plan.f16_operands,
                    plan.draft_reg_prefetch, plan.direct_tiles, plan.direct_ring, plan.tile_cols);
  QS_CHECK(kc.mma == plan.tensor_cores && kc.direct == plan.direct && kc.f16 == plan.f16_operands &&
           kc.qw == plan.queries_per_warp && kc.cols == plan.tile_cols);
  QS_CHECK(partials != nullptr && plan.threads <= kMaxThreads && plan.splits >= 1);
  QS_CHECK(2 * plan.token_slices <= kMaxStates);
  const int G = a.seg.group_size;
  const int hd = a.head_dim;
  const int64_t num_qv = static_cast<int64_t>(a.m) * a.num_heads;

  Params p{};
  p.a = a;
  p.group = a.num_heads / a.num_kv_heads;
  p.nq = p.group * a.m;
  p.tiles = plan.query_tiles;
  p.slices = plan.token_slices;
  p.fp_split_len = plan.fp_split_len;
  p.fp_begin = quant_boundary(a.pos, G);
  p.fp_end = a.pos + a.m;
  p.q_split_len = plan.q_split_len;
  p.q_end = quant_boundary(a.pos + a.m - 1, G);
  const size_t block_qv = static_cast<size_t>(plan.query_tiles) * kc.qw;
  p.q_smem_bytes = static_cast<int>((block_qv * (hd + kQPad) * sizeof(float) + 127) / 128 * 128);
  p.chunk = plan.chunk;
  p.stages = plan.stages;
  QS_CHECK(p.chunk >= 1 && p.chunk <= kQuantAttentionMaxChunk && p.stages >= 2 &&
           p.stages <= kQuantAttentionMaxStages);
  p.stage_bytes = kc.mma && !kc.direct
                      ? plan.token_slices * plan.chunk * mma_sub_bytes(hd, a.seg.int8, kc.ng)
                      : 0;
  p.partial_o = partials;
  p.partial_ml = partials + plan.splits * num_qv * hd;
  p.timeline = plan.timeline;
  QS_CHECK(p.tiles * kc.qw * static_cast<int64_t>(plan.query_groups) >= p.nq);
  QS_CHECK(p.fp_split_len >= 1 &&
           static_cast<int64_t>(plan.splits) * p.fp_split_len >= p.fp_end - p.fp_begin);
  QS_CHECK(p.q_end == 0 || (p.q_split_len > 0 && p.q_split_len % (kSubTokens * p.slices) == 0 &&
                            static_cast<int64_t>(plan.splits) * p.q_split_len >= p.q_end));
  QS_CHECK(!kc.mma || (p.q_end % kSubTokens == 0 && G % kSubTokens == 0));
  QS_CHECK(plan.partial_floats >= plan.splits * num_qv * (hd + 2));
  const size_t state_bytes = p.slices * block_qv * (hd + 2) * sizeof(float);
  const BlockSmem layout = block_smem(kc, plan.threads, p.q_smem_bytes,
                                      p.stages * static_cast<size_t>(p.stage_bytes), state_bytes);
  p.ring_offset = static_cast<int>(layout.ring_offset);
  QS_CHECK(plan.smem_bytes >= layout.bytes);

  blocks_per_sm(kc.fn, plan.threads, plan.smem_bytes);  // sets the shared memory limit
  const dim3 grid(static_cast<unsigned>(plan.splits), static_cast<unsigned>(a.num_kv_heads),
                  static_cast<unsigned>(plan.query_groups));
  launch(reinterpret_cast<void (*)(Params)>(kc.fn), grid, dim3(plan.threads), plan.smem_bytes,
         stream, p);
  CUDA_CHECK_LAUNCH(stream);

  AttentionArgs c;
  c.out = a.out;
  c.partial_o = p.partial_o;
  c.partial_ml = p.partial_ml;
  c.m = a.m;
  c.num_heads = a.num_heads;
  c.num_kv_heads = a.num_kv_heads;
  c.head_dim = hd;
  c.num_splits = plan.splits;
  launch_attention_combine(c, stream);
}

void add_quant_attention_read_bytes(int m, int pos, const AttentionShape& shape, const KvView& kv) {
  if (kv.read_bytes == nullptr) return;
  QS_CHECK(kv.quantized != nullptr);
  const QuantizedKvSegment& s = *kv.quantized;
  const int64_t hd = shape.head_dim, G = s.group_size, heads = shape.num_kv_heads;
  const int64_t t_last = static_cast<int64_t>(pos) + m - 1;
  const int64_t bq = quant_boundary(static_cast<int>(t_last), s.group_size);
  KvReadBytes& rb = *kv.read_bytes;
  const int64_t codes = heads * 2 * bq * (hd / 2);  // K and V rows of one plane
  rb.upper += codes;
  if (s.int8) rb.lower += codes;
  const int64_t key_groups = (bq + G - 1) / G;
  rb.meta += heads * (key_groups * 2 * 2 * hd + bq * 2 * 2 * (hd / s.value_group_size));
  rb.fp += heads * 2 * (t_last + 1 - bq) * hd * kv.row_elem_bytes();
}

}  // namespace qs::cuda
