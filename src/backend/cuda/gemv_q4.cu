// The draft path's matmul over 4-bit group-wise weights (quant/weight_quant.h) for m <= 16 rows:
// y = x W4^T (+ bias), bandwidth-bound on the packed codes, which are read exactly once for all
// rows.
//
// Per output row n and group j of 128 columns, W4[n][c] = U[n][c] * s[n][j] + mn[n][j], so
//   y[t][n] = sum_j ( s[n][j] * sum_{c in j} U[n][c] x[t][c]  +  mn[n][j] * sum_{c in j} x[t][c] ).
// The inner sums run on tensor cores: the centred codes U - 8 (-8..7) are exact bf16 values
// (A operand), each f32 activation is split into hi = bf16(x) and lo = bf16(x - hi) (B operand,
// two MMAs, as the bf16 GEMV of gemv.cu), and the products are exact in the f32 accumulator. The
// group sum is then scaled in f32 and the min term, (mn + 8 s) * sum(x), added from the f32 sum
// of x over the group, so the result has the CPU reference's f32 accuracy: only the hi/lo pair's
// representation error (at most 2^-16 of x) remains, and it multiplies the centred codes, whose
// magnitude is about half that of the raw ones.
//
// Tiled layout (repacked at upload, see repack_q4_kernel): a warp owns RT tiles of 16 rows and a
// contiguous range of groups. For one (tile, group) its lanes read 1024 contiguous bytes (two
// 512-byte runs, 16 bytes per lane) and 64 bytes of metadata. Lane (g = lane/4, c = lane%4)
// holds the 32 codes of row g and of row g + 8 that its MMA fragments need: for k16 step k
// (0..7) the actual columns 16k + 4c + {0, 1, 2, 3}, which play the MMA's logical columns
// {2c, 2c+1, 2c+8, 2c+9}. The same lane loads x[token g][16k + 4c .. +3] as one float4 for the
// B fragment, so no shuffle or shared-memory staging is needed (the order of the columns inside
// a dot product is free as long as A and B agree). Within a lane's 16 bytes, 32-bit word w holds
// steps 2w and 2w+1 so that one mask-and-or per register makes two bf16 codes:
//   nibble position (e & 1) * 4 + (k & 1) * 2 + (e >> 1) holds column 16k + 4c + e.
// The warps of a block split the groups and are summed in shared memory; the bias is added in
// that epilogue. The codes reach the registers either directly (one group loaded ahead) or through
// a per-warp cp.async ring in shared memory (Q4GemvTuning::stages).
//
// gemv_q4_wide_kernel: the same arithmetic with the bf16 GEMV's memory access pattern (16 loads
// of 16 bytes in flight per lane); measured slower than expected, not the default. A CUDA-core
// kernel reads the same layout and dequantizes with integer/float bit tricks instead
// (gemv_q4_cc_kernel): the default for 2 <= m <= 4 (kQ4AutoKernel, quant_ops.h).
//
// gemv_q4_persist_kernel (m = 1, the draft step): the tensor-core arithmetic in a persistent grid
// with the activation's B fragments staged once per block in shared memory.
// gemv_q4_persist_sub_kernel (the default for m = 1): the same grid with the codes read as f16
// subnormals and the activation's hi and lo parts as two token columns of one MMA.
// gemv_q4_persist_pair_kernel: the same arithmetic with two tiles per ring stage.
//
// Weights whose group size is not 128 keep the reference layout and run a plain FMA kernel
// (correctness only; the draft weights use 128).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/env_switch.h"
#include "backend/cuda/gemv_norm.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/quant_ops.h"
#include "backend/cuda/rope_row.cuh"
#include "backend/cuda/rope_tiles.h"

namespace qs::cuda {

namespace {

constexpr int kMaxRows = 16;                        // rows of x per launch
constexpr int kQ4MaxWarps = 8;                      // warps per block splitting K
constexpr int kStepsPerGroup = kQ4TiledGroup / 16;  // k16 MMA steps per group
constexpr int kPiecesPerTileGroup = 64;             // 16-byte pieces per (tile, group): 2 x 32
constexpr int kMetaPerTileGroup = 8;                // 8-byte meta entries per (tile, group)

// QS_Q4_STAGES=1|4 and QS_Q4_KERNEL=1..10 start the process with that Q4GemvTuning::stages /
// kernel (end-to-end A/B runs of the code paths without a rebuild); anything else is ignored with
// a warning.
Q4GemvTuning g_q4_tuning = [] {
  Q4GemvTuning t;
  const char* v = std::getenv("QS_Q4_STAGES");
  if (v != nullptr) {
    if (std::strcmp(v, "1") == 0 || std::strcmp(v, "4") == 0) {
      t.stages = v[0] - '0';
    } else {
      std::fprintf(stderr, "quantspec: ignoring QS_Q4_STAGES=%s (expected 1 or 4)\n", v);
    }
  }
  t.kernel = env_int("QS_Q4_KERNEL", 1, kQ4LastKernel, t.kernel);
  t.qkv_rows = env_flag("QS_Q4_QKV_ROWS", true);
  return t;
}();

// ---- device helpers ---------------------------------------------------------------------------

// bf16x2 of n - 8 for the nibbles n at bits [0, 4) and [16, 20) of v: 128 + n by bit pattern
// (bf16 0x4300 = 128, whose ulp is 1), then 136 subtracted (bf16 0xc308 = -136; exact).
// The mask-and-or is one lop3 (ptxas splits the C expression into two LOP3s, each taking one
// immediate; here it keeps one constant in a register).
__device__ __forceinline__ uint32_t nibbles_to_bf16x2(uint32_t v) {
  uint32_t biased;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(biased) : "r"(v), "n"(0x000f000f), "n"(0x43004300));
  uint32_t r;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(biased), "r"(0x3f803f80u), "r"(0xc308c308u));
  return r;
}

// bf16x2 of 128 + n for the nibbles n at bits [0, 4) and [16, 20) of v: the first half of
// nibbles_to_bf16x2 alone (one lop3). The bias of 136 against the centred codes is taken out of the
// group's sum afterwards (gemv_q4_persist_kernel with BIASED).
__device__ __forceinline__ uint32_t nibbles_to_biased_bf16x2(uint32_t v) {
  uint32_t biased;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(biased) : "r"(v), "n"(0x000f000f), "n"(0x43004300));
  return biased;
}

__device__ __forceinline__ uint32_t bf16x2_bits(__nv_bfloat162 v) {
  return *reinterpret_cast<uint32_t*>(&v);
}

// (a, b) -> hi = bf16x2(a, b) and lo = bf16x2(a - hi.x, b - hi.y); a in the low half.
__device__ __forceinline__ void split_pair(float a, float b, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  const float2 hf = __bfloat1622float2(h);
  hi = bf16x2_bits(h);
  lo = bf16x2_bits(__floats2bfloat162_rn(__fsub_rn(a, hf.x), __fsub_rn(b, hf.y)));
}

// D += A(16x16, row) * B(16x8, col), bf16 inputs, f32 accumulate.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                               uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// x[token][col .. col+3] (zeros past m or K). VEC: x 16-byte aligned and K % 4 == 0, so the
// float4 is entirely inside or entirely outside the row.
template <bool VEC>
__device__ __forceinline__ float4 load_x4(const float* __restrict__ x, int token, int m, int64_t K,
                                          int64_t col) {
  float4 r = make_float4(0.f, 0.f, 0.f, 0.f);
  if (token >= m) return r;
  const float* p = x + token * K + col;
  if constexpr (VEC) {
    if (col < K) r = __ldg(reinterpret_cast<const float4*>(p));
  } else {
    if (col < K) r.x = __ldg(p);
    if (col + 1 < K) r.y = __ldg(p + 1);
    if (col + 2 < K) r.z = __ldg(p + 2);
    if (col + 3 < K) r.w = __ldg(p + 3);
  }
  return r;
}

// One (tile, group)'s codes (this lane's two 16-byte pieces) and metadata (8 bytes: half2
// (scale, min) of row g, then of row g + 8); zeros for a tile past the matrix.
template <int RT>
__device__ __forceinline__ void load_group(const uint4* __restrict__ codes,
                                           const uint2* __restrict__ meta, int64_t tile0,
                                           int64_t tiles, int64_t groups, int64_t grp, int lane,
                                           uint4 (&w)[RT][2], uint2 (&mm)[RT]) {
#pragma unroll
  for (int rt = 0; rt < RT; ++rt) {
    const int64_t tile = tile0 + rt;
    if (tile < tiles) {
      const int64_t tg = tile * groups + grp;
      const uint4* p = codes + tg * kPiecesPerTileGroup + lane;
      w[rt][0] = load_stream_16(p);
      w[rt][1] = load_stream_16(p + 32);
      mm[rt] = __ldg(meta + tg * kMetaPerTileGroup + (lane >> 2));
    } else {
      w[rt][0] = w[rt][1] = make_uint4(0, 0, 0, 0);
      mm[rt] = make_uint2(0, 0);
    }
  }
}

__device__ __forceinline__ float2 half2_bits_to_float2(uint32_t v) {
  return __half22float2(*reinterpret_cast<const __half2*>(&v));
}
// The two bf16 of a pair (low half first) as floats (exact).
__device__ __forceinline__ float2 bf16x2_pair_to_float2(uint32_t v) {
  return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
}

// The codes of one (tile, group) with the kernel's register prefetch, or copied into this lane's
// slots of a shared-memory ring with cp.async (each lane copies and later reads only its own
// 16-byte pieces and 8-byte meta entry, so a lane's cp.async.wait_group is all the
// synchronization needed). A tile past the matrix reads as zeros (src-size 0).
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(gmem),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_8(void* smem, const void* gmem, bool valid) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(dst), "l"(gmem),
               "r"(valid ? 8 : 0)
               : "memory");
}

// A warp's slots of the ring, per stage and tile: 64 code pieces (piece p of lane l at
// p * 32 + l) and 32 meta entries.
template <int RT>
__device__ __forceinline__ void issue_group(uint4* ring_codes, uint2* ring_meta, int stage,
                                            const uint4* __restrict__ codes,
                                            const uint2* __restrict__ meta, int64_t tile0,
                                            int64_t tiles, int64_t groups, int64_t grp, int lane) {
#pragma unroll
  for (int rt = 0; rt < RT; ++rt) {
    const bool valid = tile0 + rt < tiles;
    const int64_t tg = valid ? (tile0 + rt) * groups + grp : 0;
    const uint4* src = codes + tg * kPiecesPerTileGroup + lane;
    uint4* dst = ring_codes + (stage * RT + rt) * kPiecesPerTileGroup + lane;
    cp_async_16(dst, src, valid);
    cp_async_16(dst + 32, src + 32, valid);
    cp_async_8(ring_meta + (stage * RT + rt) * 32 + lane,
               meta + tg * kMetaPerTileGroup + (lane >> 2), valid);
  }
}

// A warp streams groups [grp_begin, grp_end) of its RT tiles through its slots of a STAGES-deep
// cp.async ring in shared memory (`smem`: [warps][STAGES][RT][64] code pieces, then
// [warps][STAGES][RT][32] meta entries), STAGES - 1 groups in flight while one is used:
// use(grp, cw, cm) gets each group's codes and metadata in registers. The first STAGES - 1 groups
// are issued before started() runs (the CUDA-core kernel's pdl_begin(): the weights do not
// depend on the previous kernel). Commit groups are counted per lane: one per prologue stage and
// per iteration (possibly empty), so "all but the newest STAGES - 1 complete" means the current
// group has landed. Nothing is left in flight into shared memory at return.
template <int RT, int STAGES, class Started, class Use>
__device__ __forceinline__ void stream_groups(uint4* smem, int warp, int num_warps,
                                              const uint4* __restrict__ codes,
                                              const uint2* __restrict__ meta, int64_t tile0,
                                              int64_t tiles, int64_t groups, int64_t grp_begin,
                                              int64_t grp_end, int lane, Started started, Use use) {
  uint4* ring_codes = smem + warp * (STAGES * RT * kPiecesPerTileGroup);
  uint2* ring_meta =
      reinterpret_cast<uint2*>(smem + num_warps * STAGES * RT * kPiecesPerTileGroup) +
      warp * (STAGES * RT * 32);
#pragma unroll
  for (int st = 0; st < STAGES - 1; ++st) {
    if (grp_begin + st < grp_end) {
      issue_group<RT>(ring_codes, ring_meta, st, codes, meta, tile0, tiles, groups, grp_begin + st,
                      lane);
    }
    cp_async_commit();
  }
  started();
  int stage = 0;
  for (int64_t grp = grp_begin; grp < grp_end; ++grp) {
    // The slot refilled here was read (into registers) in the previous iteration.
    const int64_t ahead = grp + STAGES - 1;
    if (ahead < grp_end) {
      const int fill = stage == 0 ? STAGES - 1 : stage - 1;
      issue_group<RT>(ring_codes, ring_meta, fill, codes, meta, tile0, tiles, groups, ahead, lane);
    }
    cp_async_commit();
    cp_async_wait<STAGES - 1>();
    uint4 cw[RT][2];
    uint2 cm[RT];
#pragma unroll
    for (int rt = 0; rt < RT; ++rt) {
      const uint4* src = ring_codes + (stage * RT + rt) * kPiecesPerTileGroup + lane;
      cw[rt][0] = src[0];
      cw[rt][1] = src[32];
      cm[rt] = ring_meta[(stage * RT + rt) * 32 + lane];
    }
    use(grp, cw, cm);
    stage = stage + 1 == STAGES ? 0 : stage + 1;
  }
  cp_async_wait<0>();
}

// acc += this lane's share of the (RT tiles x NT token tiles) products with group `grp`, from
// the group's codes cw (pieces for rows g, g + 8) and metadata cm.
template <int RT, int NT, bool VEC_X>
__device__ __forceinline__ void accumulate_group(const float* __restrict__ x, int m, int64_t K,
                                                 int64_t grp, int lane, const uint4 (&cw)[RT][2],
                                                 const uint2 (&cm)[RT], float (&acc)[RT][NT][4]) {
  const int g = lane >> 2, c = lane & 3;
  float gacc[RT][NT][4];
#pragma unroll
  for (int rt = 0; rt < RT; ++rt) {
#pragma unroll
    for (int tt = 0; tt < NT; ++tt) {
      gacc[rt][tt][0] = gacc[rt][tt][1] = gacc[rt][tt][2] = gacc[rt][tt][3] = 0.f;
    }
  }
  float xsum[NT];
#pragma unroll
  for (int tt = 0; tt < NT; ++tt) xsum[tt] = 0.f;
  const int64_t col0 = grp * kQ4TiledGroup + 4 * c;
#pragma unroll
  for (int k = 0; k < kStepsPerGroup; ++k) {
    uint32_t bh0[NT], bh1[NT], bl0[NT], bl1[NT];
#pragma unroll
    for (int tt = 0; tt < NT; ++tt) {
      const float4 xv = load_x4<VEC_X>(x, tt * 8 + g, m, K, col0 + 16 * k);
      xsum[tt] += (xv.x + xv.y) + (xv.z + xv.w);
      split_pair(xv.x, xv.y, bh0[tt], bl0[tt]);
      split_pair(xv.z, xv.w, bh1[tt], bl1[tt]);
    }
#pragma unroll
    for (int rt = 0; rt < RT; ++rt) {
      const int shift = (k & 1) * 8;
      const uint32_t w0 = word_of(cw[rt][0], k / 2) >> shift;  // row g
      const uint32_t w1 = word_of(cw[rt][1], k / 2) >> shift;  // row g + 8
      const uint32_t a0 = nibbles_to_bf16x2(w0);               // row g, logical k 2c, 2c+1
      const uint32_t a1 = nibbles_to_bf16x2(w1);               // row g+8, 2c, 2c+1
      const uint32_t a2 = nibbles_to_bf16x2(w0 >> 4);          // row g, 2c+8, 2c+9
      const uint32_t a3 = nibbles_to_bf16x2(w1 >> 4);          // row g+8, 2c+8, 2c+9
#pragma unroll
      for (int tt = 0; tt < NT; ++tt) {
        mma_bf16_16816(gacc[rt][tt], a0, a1, a2, a3, bh0[tt], bh1[tt]);
        mma_bf16_16816(gacc[rt][tt], a0, a1, a2, a3, bl0[tt], bl1[tt]);
      }
    }
  }
  // The group's sum of x per token: the 4 lanes of token g, then the tokens 2c and 2c + 1 of
  // this lane's C fragment (held by lanes 8c and 8c + 4).
  float xs_a[NT], xs_b[NT];
#pragma unroll
  for (int tt = 0; tt < NT; ++tt) {
    float v = xsum[tt];
    v += __shfl_xor_sync(kFullMask, v, 1);
    v += __shfl_xor_sync(kFullMask, v, 2);
    xs_a[tt] = __shfl_sync(kFullMask, v, 8 * c);
    xs_b[tt] = __shfl_sync(kFullMask, v, 8 * c + 4);
  }
  // C fragment element r: row g + 8 * (r / 2), token 2c + (r % 2) of the token tile.
  // W4 = U*s + mn = (U - 8)*s + (mn + 8s); 8s is exact, so mn + 8s rounds once.
#pragma unroll
  for (int rt = 0; rt < RT; ++rt) {
    const float2 p0 = half2_bits_to_float2(cm[rt].x);  // (scale, min) of row g
    const float2 p1 = half2_bits_to_float2(cm[rt].y);  // of row g + 8
    const float c0 = fmaf(8.0f, p0.x, p0.y), c1 = fmaf(8.0f, p1.x, p1.y);
#pragma unroll
    for (int tt = 0; tt < NT; ++tt) {
      float* a = acc[rt][tt];
      const float* ga = gacc[rt][tt];
      a[0] = fmaf(c0, xs_a[tt], fmaf(p0.x, ga[0], a[0]));
      a[1] = fmaf(c0, xs_b[tt], fmaf(p0.x, ga[1], a[1]));
      a[2] = fmaf(c1, xs_a[tt], fmaf(p1.x, ga[2], a[2]));
      a[3] = fmaf(c1, xs_b[tt], fmaf(p1.x, ga[3], a[3]));
    }
  }
}

// ---- kernels ------------------------------------------------------------------------------------

// The epilogue of the tensor-core kernels: every warp stores its C fragments into `partial`
// ([warps][RT][NT][32 lanes][4] floats of shared memory), then the block sums them over warps and
// writes y (+ bias). C fragment element r of lane l: row (l >> 2) + 8 * (r >> 1) of tile rt,
// token 2 * (l & 3) + (r & 1) of token tile tt.
template <int RT, int NT>
__device__ __forceinline__ void sum_warps_and_store(float* partial, const float (&acc)[RT][NT][4],
                                                    int warp, int lane, int num_warps,
                                                    int64_t tile0, int64_t N, int m,
                                                    const DeviceBias& bias, float* __restrict__ y) {
#pragma unroll
  for (int rt = 0; rt < RT; ++rt) {
#pragma unroll
    for (int tt = 0; tt < NT; ++tt) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        partial[(((warp * RT + rt) * NT + tt) * 32 + lane) * 4 + r] = acc[rt][tt][r];
      }
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < RT * NT * 128; e += blockDim.x) {
    const int rt = e / (NT * 128), tt = (e / 128) % NT, l = (e / 4) % 32, r = e % 4;
    float sum = 0.0f;
    for (int wi = 0; wi < num_warps; ++wi) sum += partial[wi * (RT * NT * 128) + e];
    const int64_t row = (tile0 + rt) * 16 + (l >> 2) + 8 * (r >> 1);
    const int token = tt * 8 + 2 * (l & 3) + (r & 1);
    if (row < N && token < m) {
      if (bias.data) sum += load_as_float(bias.data, bias.dtype, row);
      y[token * N + row] = sum;
    }
  }
}

// Block: (warps x 32) threads, RT tiles of 16 rows; NT tiles of 8 tokens (m <= 8 * NT).
// x: [m, K] f32; codes/meta: the tiled layout; y: [m, N] f32.
// STAGES == 0: the codes go through registers; with RT <= 2 the next group's are loaded while
// the current one is computed (with RT = 4 the registers go to the wider tile instead).
// STAGES > 0: a ring of STAGES groups per warp in dynamic shared memory filled by cp.async,
// STAGES - 1 groups in flight while one is computed, no registers held for them.
// Dynamic shared memory (q4_smem_bytes): the ring, warps * STAGES * RT * (1024 + 256) bytes,
// which the cross-warp sum of the epilogue reuses; warps * RT * NT * 512 bytes for STAGES == 0.
template <int RT, int NT, bool VEC_X, int STAGES>
__global__ void __launch_bounds__(kQ4MaxWarps * 32, 2)
    gemv_q4_tiled_kernel(const float* __restrict__ x, int m, int64_t K,
                         const uint4* __restrict__ codes, const uint2* __restrict__ meta, int64_t N,
                         int64_t tiles, int64_t groups, DeviceBias bias, float* __restrict__ y) {
  pdl_begin();
  extern __shared__ uint4 q4_smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int num_warps = blockDim.x / 32;
  const int64_t tile0 = static_cast<int64_t>(blockIdx.x) * RT;
  const int64_t grp_begin = groups * warp / num_warps;
  const int64_t grp_end = groups * (warp + 1) / num_warps;

  float acc[RT][NT][4];
#pragma unroll
  for (int rt = 0; rt < RT; ++rt) {
#pragma unroll
    for (int tt = 0; tt < NT; ++tt) {
      acc[rt][tt][0] = acc[rt][tt][1] = acc[rt][tt][2] = acc[rt][tt][3] = 0.f;
    }
  }

  if constexpr (STAGES == 0) {
    uint4 cw[RT][2];
    uint2 cm[RT];
    constexpr bool kPrefetch = RT <= 2;
    if (kPrefetch && grp_begin < grp_end) {
      load_group<RT>(codes, meta, tile0, tiles, groups, grp_begin, lane, cw, cm);
    }
    for (int64_t grp = grp_begin; grp < grp_end; ++grp) {
      uint4 nw[RT][2];
      uint2 nm[RT];
      const bool has_next = grp + 1 < grp_end;
      if constexpr (kPrefetch) {
        if (has_next) load_group<RT>(codes, meta, tile0, tiles, groups, grp + 1, lane, nw, nm);
      } else {
        load_group<RT>(codes, meta, tile0, tiles, groups, grp, lane, cw, cm);
      }
      accumulate_group<RT, NT, VEC_X>(x, m, K, grp, lane, cw, cm, acc);
      if constexpr (kPrefetch) {
        if (has_next) {
#pragma unroll
          for (int rt = 0; rt < RT; ++rt) {
            cw[rt][0] = nw[rt][0];
            cw[rt][1] = nw[rt][1];
            cm[rt] = nm[rt];
          }
        }
      }
    }
  } else {
    stream_groups<RT, STAGES>(
        q4_smem, warp, num_warps, codes, meta, tile0, tiles, groups, grp_begin, grp_end, lane,
        [] {},
        [&](int64_t grp, const uint4(&ring_cw)[RT][2], const uint2(&ring_cm)[RT]) {
          accumulate_group<RT, NT, VEC_X>(x, m, K, grp, lane, ring_cw, ring_cm, acc);
        });
  }

  // Cross-warp sum: per warp its C fragments, [warps][RT][NT][32 lanes][4] floats (over the
  // ring, once every warp is done with it).
  float* partial = reinterpret_cast<float*>(q4_smem);
  if constexpr (STAGES > 0) __syncthreads();
  sum_warps_and_store<RT, NT>(partial, acc, warp, lane, num_warps, tile0, N, m, bias, y);
}

// ---- wide kernel (tensor cores, many bytes in flight) -------------------------------------------
//
// The tensor-core arithmetic of accumulate_group with the memory access pattern of the bf16
// GEMV (gemv.cu): a warp owns RT tiles and a contiguous range of groups that it walks in batches
// of U = kWideBatch / RT groups, and every lane issues all U x RT x 2 16-byte code loads of a
// batch (256 bytes, as many as the bf16 kernel's 8 x 2) before it uses any. The loads are
// unconditional from valid addresses: a tile past the matrix reads the last tile (its rows are
// >= N and never stored) and a group past the warp's range reads the batch's first group (not
// computed). Warps split the groups in whole batches; with one warp per block the epilogue
// writes straight from the C fragments, otherwise the warps are summed in shared memory
// (warps * RT * NT * 512 bytes of dynamic shared memory). Up to 255 registers (about 135-210
// used, no spills): the 64 registers of codes in flight come on top of the MMA path's own.
constexpr int kWideBatch = 8;  // (tile, group) pairs per lane per batch: 16 loads in flight

template <int RT, int NT, bool VEC_X>
__global__ void __launch_bounds__(kQ4MaxWarps * 32, 1)
    gemv_q4_wide_kernel(const float* __restrict__ x, int m, int64_t K,
                        const uint4* __restrict__ codes, const uint2* __restrict__ meta, int64_t N,
                        int64_t tiles, int64_t groups, DeviceBias bias, float* __restrict__ y) {
  pdl_begin();
  static_assert(kWideBatch % RT == 0, "a batch holds whole groups of the warp's tiles");
  constexpr int U = kWideBatch / RT;
  extern __shared__ float wide_partial[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int num_warps = blockDim.x / 32;
  const int64_t tile0 = static_cast<int64_t>(blockIdx.x) * RT;
  const int64_t steps = (groups + U - 1) / U;
  const int64_t grp_begin = steps * warp / num_warps * U;
  const int64_t grp_end = min(groups, steps * (warp + 1) / num_warps * U);

  // Tile rt of the block is tile min(rt, last) (one base and a stride, few registers).
  const int last = static_cast<int>(min(static_cast<int64_t>(RT - 1), tiles - 1 - tile0));
  const uint4* tcodes = codes + tile0 * groups * kPiecesPerTileGroup + lane;
  const uint2* tmeta = meta + tile0 * groups * kMetaPerTileGroup + (lane >> 2);

  float acc[RT][NT][4];
#pragma unroll
  for (int rt = 0; rt < RT; ++rt) {
#pragma unroll
    for (int tt = 0; tt < NT; ++tt) {
      acc[rt][tt][0] = acc[rt][tt][1] = acc[rt][tt][2] = acc[rt][tt][3] = 0.f;
    }
  }

  for (int64_t grp0 = grp_begin; grp0 < grp_end; grp0 += U) {
    uint4 cw[U][RT][2];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t grp = grp0 + u < grp_end ? grp0 + u : grp0;
#pragma unroll
      for (int rt = 0; rt < RT; ++rt) {
        const uint4* p = tcodes + (min(rt, last) * groups + grp) * kPiecesPerTileGroup;
        cw[u][rt][0] = load_stream_16(p);
        cw[u][rt][1] = load_stream_16(p + 32);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (grp0 + u < grp_end) {  // warp-uniform
        // The metadata is first needed after the group's MMAs, which hide its latency.
        uint2 cm[RT];
#pragma unroll
        for (int rt = 0; rt < RT; ++rt) {
          cm[rt] = __ldg(tmeta + (min(rt, last) * groups + grp0 + u) * kMetaPerTileGroup);
        }
        accumulate_group<RT, NT, VEC_X>(x, m, K, grp0 + u, lane, cw[u], cm, acc);
      }
    }
  }

  // C fragment element r of lane: row g + 8 * (r / 2) of tile rt, token 2c + (r % 2) of tile tt.
  if (num_warps == 1) {
    const int g = lane >> 2, c = lane & 3;
#pragma unroll
    for (int rt = 0; rt < RT; ++rt) {
#pragma unroll
      for (int tt = 0; tt < NT; ++tt) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int64_t row = (tile0 + rt) * 16 + g + 8 * (r >> 1);
          const int token = tt * 8 + 2 * c + (r & 1);
          if (row < N && token < m) {
            float sum = acc[rt][tt][r];
            if (bias.data) sum += load_as_float(bias.data, bias.dtype, row);
            y[token * N + row] = sum;
          }
        }
      }
    }
    return;
  }
  sum_warps_and_store<RT, NT>(wide_partial, acc, warp, lane, num_warps, tile0, N, m, bias, y);
}

// ---- CUDA-core kernel (few rows of x)
// ------------------------------------------------------------
//
// The same tiled layout, no tensor cores: per code one LOP3, one FADD and one FFMA per row of x,
// cheaper per byte than the MMA path's fragments at m = 1 and all in f32. A block owns RT
// consecutive 16-row tiles (1, 2 or 4; cc_row_tiles picks 1 or 2); its warps split the groups;
// a lane keeps its two pieces of every tile (rows g, g + 8, the 32 columns 16k + 4c + e of the
// group) and dots them with x straight from global memory (L1-resident). The activation work
// (loads, power-of-two scaling, the group sum of x) is done once per group and shared by the 2 RT
// rows: with one tile it cost more instructions than the codes themselves (ncu, 2026-11-29: 7
// instructions per code, 49% of issue slots busy at 25% of DRAM bandwidth, 3.4 active warps per
// scheduler). Two tiles gained 14%, not 2x: the kernel is latency-bound as much as issue-bound.
// Each batch issues the 16-byte loads of BATCH groups of every tile before any is used, so a
// warp has ~4 KiB of codes in flight.
//
// Dequantization without conversions: a nibble at bits [4q, 4q + 4) (q <= 4) OR-ed into the
// float 2^23 gives 2^23 + n * 16^q exactly; subtracting 2^23 leaves n * 16^q, which multiplies
// x * 16^-q (exact: a power of two, computed once per column and shared by both rows). Positions
// 5..7 of a word are read from the word shifted right by 12 (positions 2..4 there). The product
// n * x is exact in the FFMA, so the group dot sum(U x) has f32 accuracy; the group's scale and
// min are applied once per group (s * dot + min * sum(x)), as the tensor-core path does.
constexpr int kCcMaxWarps = 8;
constexpr int kCcMaxRows = 8;  // rows of x of the CUDA-core kernel

// The float n * 16^q for the nibble n at bits [4q, 4q + 4) of v, q <= 4.
template <int Q>
__device__ __forceinline__ float nibble_scaled(uint32_t v) {
  static_assert(Q >= 0 && Q <= 4, "the nibble must lie inside the f32 mantissa");
  return __uint_as_float((v & (0xfu << (4 * Q))) | 0x4b000000u) - 8388608.0f;
}

// dot[0/1] += the products of one 32-bit word of codes (steps 2q, 2q + 1: 8 columns) with the
// scaled activations xs (see gemv_q4_cc_kernel for their order); two chains for latency.
__device__ __forceinline__ void dot_word(uint32_t v, const float (&xs)[8], float (&dot)[2]) {
  const uint32_t v2 = v >> 12;
  dot[0] = fmaf(nibble_scaled<0>(v), xs[0], dot[0]);
  dot[1] = fmaf(nibble_scaled<1>(v), xs[1], dot[1]);
  dot[0] = fmaf(nibble_scaled<2>(v), xs[2], dot[0]);
  dot[1] = fmaf(nibble_scaled<3>(v), xs[3], dot[1]);
  dot[0] = fmaf(nibble_scaled<4>(v), xs[4], dot[0]);
  dot[1] = fmaf(nibble_scaled<2>(v2), xs[5], dot[1]);
  dot[0] = fmaf(nibble_scaled<3>(v2), xs[6], dot[0]);
  dot[1] = fmaf(nibble_scaled<4>(v2), xs[7], dot[1]);
}

// acc[r][h][t] += row (16 r + g + 8 h)'s share of group `grp` (this lane's 32 columns) times
// x[t], from the lane's pieces p[r][h] of tile r and metadata mm[r]: the activations (loads,
// power-of-two scaling, group sum) are prepared once and shared by the 2 RT rows.
template <int M, int RT, bool VEC_X>
__device__ __forceinline__ void cc_group(const float* __restrict__ x, int64_t K, int64_t grp, int c,
                                         const uint4 (&p)[RT][2], const uint2 (&mm)[RT],
                                         float (&acc)[RT][2][M]) {
  float dot[RT][2][M][2], xsum[M];
#pragma unroll
  for (int t = 0; t < M; ++t) {
#pragma unroll
    for (int r = 0; r < RT; ++r) {
      dot[r][0][t][0] = dot[r][0][t][1] = dot[r][1][t][0] = dot[r][1][t][1] = 0.0f;
    }
    xsum[t] = 0.0f;
  }
  const int64_t col0 = grp * kQ4TiledGroup + 4 * c;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
#pragma unroll
    for (int t = 0; t < M; ++t) {
      // Step 2q: columns col0 + 32q + e (nibble positions 0, 4, 1, 5 for e = 0..3); step 2q + 1:
      // col0 + 32q + 16 + e (positions 2, 6, 3, 7).
      const float4 a = load_x4<VEC_X>(x, t, M, K, col0 + 32 * q);
      const float4 b = load_x4<VEC_X>(x, t, M, K, col0 + 32 * q + 16);
      xsum[t] += ((a.x + a.y) + (a.z + a.w)) + ((b.x + b.y) + (b.z + b.w));
      const float xs[8] = {
          a.x,           a.z * 0x1p-4f,  b.x * 0x1p-8f, b.z * 0x1p-12f, a.y * 0x1p-16f,
          a.w * 0x1p-8f, b.y * 0x1p-12f, b.w * 0x1p-16f};
#pragma unroll
      for (int r = 0; r < RT; ++r) {
        dot_word(word_of(p[r][0], q), xs, dot[r][0][t]);
        dot_word(word_of(p[r][1], q), xs, dot[r][1][t]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < RT; ++r) {
    const float2 sm0 = half2_bits_to_float2(mm[r].x);  // (scale, min) of row g
    const float2 sm1 = half2_bits_to_float2(mm[r].y);  // of row g + 8
#pragma unroll
    for (int t = 0; t < M; ++t) {
      acc[r][0][t] =
          fmaf(sm0.x, dot[r][0][t][0] + dot[r][0][t][1], fmaf(sm0.y, xsum[t], acc[r][0][t]));
      acc[r][1][t] =
          fmaf(sm1.x, dot[r][1][t][0] + dot[r][1][t][1], fmaf(sm1.y, xsum[t], acc[r][1][t]));
    }
  }
}

// Block: (warps x 32) threads, RT consecutive 16-row tiles from blockIdx.x * RT; exactly M rows
// of x. x: [M, K] f32; codes/meta: the tiled layout; y: [M, N] f32. BATCH groups are loaded per
// step. Tiles past the matrix re-read the block's first tile (a valid address) and are not
// stored.
// The matrices of one launch (launch_gemv_q4_group; one for launch_gemv_q4), all with the same
// cols: blocks [block_end[i - 1], block_end[i]) compute matrix i.
struct CcSegments {
  const uint4* codes[kMaxGemvSegments];
  const uint2* meta[kMaxGemvSegments];
  int64_t N[kMaxGemvSegments];
  int64_t tiles[kMaxGemvSegments];
  DeviceBias bias[kMaxGemvSegments];
  float* y[kMaxGemvSegments];
  int64_t block_end[kMaxGemvSegments];
  int count;
  bool swiglu;  // the persistent kernels: gate (0) / up (1) paired, y[0] = their SwiGLU (find_tile)
};

//
// STAGES == 0: the codes of BATCH groups go into registers, all issued before any is used.
// STAGES > 0: a ring of STAGES groups per warp in dynamic shared memory (cc_ring_bytes), filled
// by cp.async with STAGES - 1 groups in flight while one is computed, as the tensor-core
// kernel's ring; its first groups are issued before pdl_begin() (the weights do not depend on
// the previous kernel), so they stream in while that kernel finishes.
template <int M, int RT, int BATCH, bool VEC_X, int STAGES>
__global__ void __launch_bounds__(kCcMaxWarps * 32, RT >= 4 ? 1 : 2)
    gemv_q4_cc_kernel(const float* __restrict__ x, int64_t K, int64_t groups,
                      const CcSegments segs) {
  __shared__ float partial[kCcMaxWarps][16 * RT][M];  // per warp: the tiles' row sums
  extern __shared__ uint4 cc_ring[];
  int64_t block;
  const int si = find_segment(segs, block);
  const uint4* __restrict__ codes = pick(segs.codes, si);
  const uint2* __restrict__ meta = pick(segs.meta, si);
  const int64_t N = pick(segs.N, si), tiles = pick(segs.tiles, si);
  const DeviceBias bias = pick(segs.bias, si);
  float* __restrict__ y = pick(segs.y, si);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int num_warps = blockDim.x / 32;
  const int g = lane >> 2, c = lane & 3;
  const int64_t tile0 = block * RT;
  const int64_t grp_begin = groups * warp / num_warps;
  const int64_t grp_end = groups * (warp + 1) / num_warps;
  float acc[RT][2][M];
#pragma unroll
  for (int r = 0; r < RT; ++r) {
#pragma unroll
    for (int t = 0; t < M; ++t) acc[r][0][t] = acc[r][1][t] = 0.0f;
  }

  if constexpr (STAGES > 0) {
    stream_groups<RT, STAGES>(
        cc_ring, warp, num_warps, codes, meta, tile0, tiles, groups, grp_begin, grp_end, lane,
        [] { pdl_begin(); },
        [&](int64_t grp, const uint4(&p)[RT][2], const uint2(&mm)[RT]) {
          cc_group<M, RT, VEC_X>(x, K, grp, c, p, mm, acc);
        });
  } else {
    const uint4* tcodes[RT];
    const uint2* tmeta[RT];
#pragma unroll
    for (int r = 0; r < RT; ++r) {
      const int64_t tile = tile0 + r < tiles ? tile0 + r : tile0;
      tcodes[r] = codes + tile * groups * kPiecesPerTileGroup + lane;
      tmeta[r] = meta + tile * groups * kMetaPerTileGroup + g;
      // The weights do not depend on the previous kernel: the first batches' codes go to L2
      // while it finishes (launch.cuh).
      if (lane == 0 && tile0 + r < tiles) {
        const int64_t n = min(grp_end - grp_begin, int64_t{2 * BATCH}) * kPiecesPerTileGroup;
        if (n > 0) prefetch_l2(tcodes[r] + grp_begin * kPiecesPerTileGroup, uint32_t(n * 16));
      }
    }
    pdl_begin();

    for (int64_t grp0 = grp_begin; grp0 < grp_end; grp0 += BATCH) {
      uint4 p[BATCH][RT][2];
      uint2 mm[BATCH][RT];
      // Every load of the batch is issued before any is used; groups past the warp's range read
      // its first group again (a valid address) and are skipped below.
#pragma unroll
      for (int u = 0; u < BATCH; ++u) {
        const int64_t grp = grp0 + u < grp_end ? grp0 + u : grp_begin;
#pragma unroll
        for (int r = 0; r < RT; ++r) {
          p[u][r][0] = load_stream_16(tcodes[r] + grp * kPiecesPerTileGroup);
          p[u][r][1] = load_stream_16(tcodes[r] + grp * kPiecesPerTileGroup + 32);
          mm[u][r] = __ldg(tmeta[r] + grp * kMetaPerTileGroup);
        }
      }
#pragma unroll
      for (int u = 0; u < BATCH; ++u) {
        if (grp0 + u < grp_end) {  // warp-uniform
          cc_group<M, RT, VEC_X>(x, K, grp0 + u, c, p[u], mm[u], acc);
        }
      }
    }
  }

  // Rows g and g + 8 of each tile: the 4 lanes of a row hold disjoint columns.
#pragma unroll
  for (int r = 0; r < RT; ++r) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int t = 0; t < M; ++t) {
        float v = acc[r][h][t];
        v += __shfl_xor_sync(kFullMask, v, 1);
        v += __shfl_xor_sync(kFullMask, v, 2);
        if (c == 0) partial[warp][16 * r + g + 8 * h][t] = v;
      }
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < 16 * RT * M; e += blockDim.x) {
    const int row_in_block = e / M, t = e % M;
    float sum = 0.0f;
    for (int wi = 0; wi < num_warps; ++wi) sum += partial[wi][row_in_block][t];
    const int64_t row = tile0 * 16 + row_in_block;
    if (row < N) {
      if (bias.data) sum += load_as_float(bias.data, bias.dtype, row);
      y[t * N + row] = sum;
    }
  }
}

// ---- persistent tensor-core kernel for one row of x (Q4GemvTuning::kernel 5) ------------------
//
// The draft step's GEMV (m = 1) as a persistent grid, like gemv.cu's ring kernel: a block of up
// to kPMaxWarps warps per SM walks the 16-row tiles blockIdx.x, + gridDim.x, ... of every matrix
// of the launch; its warps split each tile's groups, and each warp streams its (tile, group)
// stages (1024 code bytes + 64 metadata bytes, whole lines per quarter warp) through a
// kPStages-deep cp.async ring that runs on across tiles, so its loads never drain between tiles
// and the first stages stream in before pdl_begin(). The activation is split into bf16 hi/lo B
// fragments once per block, into shared memory, with its group sums: a k16 step then costs its
// lane one 16-byte ld.shared for x besides the codes' conversion and two MMAs (the per-step
// load, split and packing of accumulate_group are paid once per column per block, not per warp
// and tile). Only token 0's fragments exist: lanes of other token columns multiply zeros.
constexpr int kPMaxWarps = 16;
constexpr int kPStages = 6;
constexpr int kPStageVecs = kPiecesPerTileGroup + 16;  // uint4s per stage: codes, then 32 meta

// BIASED: a second per-group sum (of the activation's bf16 hi + lo pairs).
size_t persist_smem_bytes(int warps, int64_t groups, bool biased) {
  const size_t sums = (biased ? 2 : 1) * ((size_t(groups) + 3) & ~size_t{3});
  return sizeof(uint4) * (size_t(warps) * kPStages * kPStageVecs + size_t(groups) * 32 + 4) +
         sizeof(float) * (2 * size_t(warps) * 64 + sums);
}

// The fetch side of the persistent kernels: each call copies the next stage of this warp's
// (tile, group) sequence (its groups [grp_begin, grp_begin + my_groups) of the tiles
// blockIdx.x, + gridDim.x, ...) into its ring slot and commits a cp.async group (RingCursor).
template <class Index>
struct PersistFetch {
  RingCursor<kPStages, Index> cursor;
  const CcSegments& segs;
  uint4* ring;
  int64_t groups, grp_begin;
  int lane;
  const uint4* codes = nullptr;
  const uint2* meta = nullptr;

  __device__ PersistFetch(const CcSegments& s, uint4* ring_, int64_t groups_, int64_t grp_begin_,
                          Index my_tiles, Index my_groups, int lane_)
      : cursor(my_tiles, my_groups),
        segs(s),
        ring(ring_),
        groups(groups_),
        grp_begin(grp_begin_),
        lane(lane_) {}

  __device__ __forceinline__ void operator()() {
    cursor.next(
        [&](int64_t tile) {
          int64_t local;
          const int si = find_tile(segs, tile, local);
          const int64_t tg = local * groups + grp_begin;
          codes = pick(segs.codes, si) + tg * kPiecesPerTileGroup + lane;
          meta = pick(segs.meta, si) + tg * kMetaPerTileGroup + (lane >> 2);
        },
        [&](int slot) {
          uint4* dst = ring + slot * kPStageVecs;
          cp_async_16(dst + lane, codes, true);
          cp_async_16(dst + 32 + lane, codes + 32, true);
          cp_async_8(reinterpret_cast<uint2*>(dst + kPiecesPerTileGroup) + lane, meta, true);
          codes += kPiecesPerTileGroup, meta += kMetaPerTileGroup;
        });
  }
};

// Row `row` of segment si's sum plus that matrix's bias.
__device__ __forceinline__ float with_bias(const CcSegments& segs, int si, int64_t row, float sum) {
  const DeviceBias bias = pick(segs.bias, si);
  if (bias.data) sum += load_as_float(bias.data, bias.dtype, row);
  return sum;
}

// A persistent kernel's finished row sum: added into h with a deferred norm (its square into
// sq), else stored (gemv_store: into y, or added into h for a fused norm).
__device__ __forceinline__ void persist_store_row(const GemvNorm& norm, float* y, int64_t row,
                                                  float sum, double& sq) {
  if (norm.sumsq != nullptr) {
    gemv_store_deferred(norm, row, sum, sq);
  } else {
    gemv_store(norm, y, row, sum);
  }
}

// The end of a persistent kernel's tile: every lane's sums {row g, row g + 8} (token 0, lanes of
// c = 0) go to `part` ([warps][32] float2, double-buffered by the caller across tiles), and
// threads 0..15 add the warps' sums of row r, add the bias and store (a paired launch: a gate
// tile's sum stays in gate_keep, the up tile's stores swiglu_of(gate_keep, sum) into y[0]).
// `scale` multiplies each row's sum before the bias (the 1 / rms of a NormIn input, else 1); with
// a deferred norm each stored h value's square is added to `sq`.
__device__ __forceinline__ void persist_store_tile(const CcSegments& segs, float* part, int warp,
                                                   int lane, int num_warps, int64_t tile,
                                                   float acc0, float acc2, const GemvNorm& norm,
                                                   float& gate_keep, float scale, double& sq) {
  reinterpret_cast<float2*>(part)[warp * 32 + lane] = make_float2(acc0, acc2);
  __syncthreads();
  if (threadIdx.x < 16) {  // row r of the tile: lane 4 (r % 8), element r / 8
    const int r = threadIdx.x;
    float sum = 0.0f;
    for (int wi = 0; wi < num_warps; ++wi) sum += part[(wi * 32 + (r & 7) * 4) * 2 + (r >> 3)];
    sum *= scale;
    int64_t local;
    const int si = find_tile(segs, tile, local);
    const int64_t row = local * 16 + r;
    if (row < pick(segs.N, si)) {
      sum = with_bias(segs, si, row, sum);
      if (norm.sumsq != nullptr) {
        const float v = norm.h[row] + sum;
        norm.h[row] = v;
        sq += static_cast<double>(v * v);
      } else if (!segs.swiglu) {
        gemv_store(norm, pick(segs.y, si), row, sum);
      } else if (si == 0) {
        gate_keep = sum;
      } else {
        segs.y[0][row] = swiglu_of(gate_keep, sum);
      }
    }
  }
}

// A persistent kernel's fused norm after its last tile: the last block's (gemv_norm_finish;
// partial: >= 512 bytes of shared memory) or the deferred partial sums.
__device__ __forceinline__ void persist_norm_end(const GemvNorm& norm, float* partial, double sq) {
  if (norm.h == nullptr) return;
  if (norm.sumsq != nullptr) {
    gemv_norm_defer_finish(norm, sq);
  } else {
    gemv_norm_finish(norm, partial);
  }
}

// CHAINS = 2 (Q4GemvTuning::kernel 6): even and odd k16 steps accumulate into
// separate C fragments, halving the chain of 16 dependent MMAs per group (bench_ops w4layer,
// 2026-12-02: 2-4% faster than one chain on every draft launch, e.g. 8B lm_head 117.8 -> 113.7 us).
//
// BIASED (kernel 7, the default since session 18: 1-3% faster per launch): the codes enter the MMAs
// as 128 + U (one lop3 per pair instead of lop3 + fma: the loop's 262 SASS instructions per group
// become 235), so the sum is G' = sum (128 + U) x~ over the activation's hi + lo pairs x~, and
//   y += s G' + mn sum x - 128 s sum x~   (= s sum U x~ + mn sum x, as the centred form).
// The 128 s term takes the sum of the pairs x~ (kept per group next to sum x), not of x, so the
// pairs' representation error (2^-17 of x) still multiplies U only; what is new is the f32
// rounding of G' (about 136 / 4.6 = 30x the centred sum's magnitude: ~2e-6 relative on random
// codes, below that representation error).
template <bool VEC_X, int CHAINS, bool BIASED>
__global__ void __launch_bounds__(kPMaxWarps * 32, 1)
    gemv_q4_persist_kernel(const float* __restrict__ x, int64_t K, int64_t groups,
                           const CcSegments segs, int64_t tiles, const GemvNorm norm,
                           const NormIn /*nin: kernels 8-10 only*/) {
  extern __shared__ uint4 p_smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int num_warps = blockDim.x / 32;
  const int g = lane >> 2, c = lane & 3;
  uint4* ring = p_smem + size_t(warp) * kPStages * kPStageVecs;
  uint4* xfrag = p_smem + size_t(num_warps) * kPStages * kPStageVecs;  // [groups * 8 steps][4]
  float* partial = reinterpret_cast<float*>(xfrag + groups * 32);      // [2][warps][32][2]
  float* xsum = partial + 2 * num_warps * 64;                          // [groups]
  float* xsum_pairs = xsum + ((groups + 3) & ~int64_t{3});             // [groups] if BIASED
  uint4* zeros = reinterpret_cast<uint4*>(BIASED ? xsum_pairs + ((groups + 3) & ~int64_t{3})
                                                 : xsum_pairs);  // [4]

  const int64_t grp_begin = groups * warp / num_warps;
  const int64_t my_groups = groups * (warp + 1) / num_warps - grp_begin;
  const int64_t my_tiles = block_tiles(segs, tiles);

  PersistFetch<int64_t> fetch(segs, ring, groups, grp_begin, my_tiles, my_groups, lane);
#pragma unroll
  for (int st = 0; st < kPStages - 1; ++st) fetch();
  pdl_begin();

  // x as B fragments: lane l of a warp holds columns 128 grp + 4l .. + 3 = k16 step 8 grp + l / 4
  // of thread-in-group l % 4 (accumulate_group's column order), as {hi0, hi1, lo0, lo1}.
  for (int64_t grp = warp; grp < groups; grp += num_warps) {
    const float4 v = load_x4<VEC_X>(x, 0, 1, K, grp * kQ4TiledGroup + 4 * lane);
    uint4 f;
    split_pair(v.x, v.y, f.x, f.z);
    split_pair(v.z, v.w, f.y, f.w);
    xfrag[grp * 32 + lane] = f;
    const float sum = warp_sum((v.x + v.y) + (v.z + v.w));
    if (lane == 0) xsum[grp] = sum;
    if constexpr (BIASED) {  // the pairs hi + lo as the MMAs see them (exact in f32)
      const float2 h = bf16x2_pair_to_float2(f.x), hl = bf16x2_pair_to_float2(f.z);
      const float2 h2 = bf16x2_pair_to_float2(f.y), hl2 = bf16x2_pair_to_float2(f.w);
      const float pairs =
          warp_sum(((h.x + hl.x) + (h.y + hl.y)) + ((h2.x + hl2.x) + (h2.y + hl2.y)));
      if (lane == 0) xsum_pairs[grp] = pairs;
    }
  }
  if (threadIdx.x < 4) zeros[threadIdx.x] = make_uint4(0, 0, 0, 0);
  __syncthreads();

  int slot = 0;
  float gate_keep = 0.0f;
  double sq = 0.0;
  for (int64_t tj = 0; tj < my_tiles; ++tj) {
    float acc0 = 0.0f, acc2 = 0.0f;  // token 0 of rows g and g + 8 (C elements 0 and 2)
    for (int64_t gi = 0; gi < my_groups; ++gi) {
      __syncwarp();  // every lane has read the slot that this fetch refills
      fetch();
      cp_async_wait<kPStages - 1>();
      __syncwarp();  // every lane's pieces of this stage have landed
      const uint4* st = ring + slot * kPStageVecs;
      slot = slot + 1 == kPStages ? 0 : slot + 1;
      const uint4 w0 = st[lane], w1 = st[32 + lane];  // rows g and g + 8
      const uint2 mm = reinterpret_cast<const uint2*>(st + kPiecesPerTileGroup)[lane];
      const int64_t grp = grp_begin + gi;
      // Lanes of other token columns read zeros (a broadcast), so that no load is predicated.
      const uint4* xf = g == 0 ? xfrag + grp * 32 + c : zeros + c;
      const int xstep = g == 0 ? 4 : 0;
      float chain[CHAINS][4] = {};
#pragma unroll
      for (int k = 0; k < kStepsPerGroup; ++k) {
        const int shift = (k & 1) * 8;
        const uint32_t u0 = word_of(w0, k / 2) >> shift, u1 = word_of(w1, k / 2) >> shift;
        uint32_t a0, a1, a2, a3;
        if constexpr (BIASED) {
          a0 = nibbles_to_biased_bf16x2(u0), a1 = nibbles_to_biased_bf16x2(u1);
          a2 = nibbles_to_biased_bf16x2(u0 >> 4), a3 = nibbles_to_biased_bf16x2(u1 >> 4);
        } else {
          a0 = nibbles_to_bf16x2(u0), a1 = nibbles_to_bf16x2(u1);
          a2 = nibbles_to_bf16x2(u0 >> 4), a3 = nibbles_to_bf16x2(u1 >> 4);
        }
        const uint4 b = xf[k * xstep];
        float(&d)[4] = chain[k % CHAINS];
        mma_bf16_16816(d, a0, a1, a2, a3, b.x, b.y);
        mma_bf16_16816(d, a0, a1, a2, a3, b.z, b.w);
      }
      float gacc[4] = {chain[0][0], chain[0][1], chain[0][2], chain[0][3]};
      if constexpr (CHAINS == 2) {
#pragma unroll
        for (int r = 0; r < 4; ++r) gacc[r] += chain[1][r];
      }
      const float xs = xsum[grp];
      const float2 p0 = half2_bits_to_float2(mm.x), p1 = half2_bits_to_float2(mm.y);
      if constexpr (BIASED) {  // W4 = (128 + U) s + mn - 128 s (the 128 s on the pairs' sum)
        const float xp = xsum_pairs[grp];
        acc0 = fmaf(-128.0f * p0.x, xp, fmaf(p0.y, xs, fmaf(p0.x, gacc[0], acc0)));
        acc2 = fmaf(-128.0f * p1.x, xp, fmaf(p1.y, xs, fmaf(p1.x, gacc[2], acc2)));
      } else {  // W4 = (U - 8) s + (mn + 8 s), as accumulate_group
        acc0 = fmaf(fmaf(8.0f, p0.x, p0.y), xs, fmaf(p0.x, gacc[0], acc0));
        acc2 = fmaf(fmaf(8.0f, p1.x, p1.y), xs, fmaf(p1.x, gacc[2], acc2));
      }
    }
    persist_store_tile(segs, partial + size_t(tj & 1) * num_warps * 64, warp, lane, num_warps,
                       blockIdx.x + tj * gridDim.x, acc0, acc2, norm, gate_keep, 1.0f, sq);
  }
  cp_async_wait<0>();
  persist_norm_end(norm, partial, sq);
}

// ---- the persistent kernel with subnormal codes (Q4GemvTuning::kernel 8, 9) -----------------
//
// Kernel 7's grid, ring and epilogue with half its tensor work and fewer instructions per code:
// - The activation's hi and lo parts are two token columns of the MMA's B (column 0 hi, column 1
//   lo, the other six zero), so a k16 step is one MMA where it was two; the group's sum is
//   D[:, 0] + D[:, 1] (lanes of c = 0 hold both).
// - The codes are read as f16 subnormals, as the draft attention's view does
//   (attention_quant_direct.cuh): bits [0, 4) of a half read as f16 are n * 2^-24 and bits [4, 8)
//   are 16 n * 2^-24, both exact, so one `and` makes a pair of codes and a byte's high nibble
//   needs no shift (kernel 7: a shift for three of every four pairs). The k slots of the high
//   nibbles (2c + 8, 2c + 9: B's second register) carry x / 16 to match. The codes are not
//   centred (U = 0..15).
// - f16 B needs range: each group's x is scaled by sc = 2^(13 - floor(log2 max |x|)), so that
//   max |x sc| lies in [2^13, 2^14) and hi + lo keep ~22 significant bits (split_f16x2; kernel 7's
//   bf16 pair kept 16).
// The MMAs then sum G = 2^-24 sc sum U x~ over the group, and with inv = 2^24 / sc (a power of
// two) each row gets
//   y += inv (s G + mn (sum x) / inv)  =  s sum U x~ + mn sum x      (W4 = U s + mn).
// CHAINS: MMA accumulator chains per group (2: even and odd k16 steps apart, as kernel 6).
constexpr int kSubZeroBytes = 512;  // per warp: B's zeros for lanes of token columns >= 2

size_t persist_sub_smem_bytes(int warps, int64_t groups) {
  return sizeof(uint4) * (size_t(warps) * kPStages * kPStageVecs + size_t(groups) * 32) +
         sizeof(float) * 2 * size_t(warps) * 64 + sizeof(float2) * ((size_t(groups) + 1) & ~1) +
         size_t(warps) * kSubZeroBytes;
}

// The subnormal kernels' activation (kernels 8-10): this warp's groups [grp_begin, grp_begin +
// my_groups) of x (times a NormIn's weight) as f16 B fragments in `xfrag`, with each group's
// {sum x / inv, inv} in `gscale`.
struct SubActivation {
  static constexpr int kBatch = 8;  // groups whose loads are in flight together
  const float* x;
  int64_t K;
  const NormIn& nin;
  uint4* xfrag;
  float2* gscale;
  int64_t grp_begin;
  int my_groups, lane;

  __device__ __forceinline__ float4 norm_weight(int64_t grp) const {
    const int64_t col = grp * kQ4TiledGroup + 4 * lane;
    float4 w;
    w.x = col < K ? load_as_float(nin.weight, nin.weight_dtype, col) : 0.0f;
    w.y = col + 1 < K ? load_as_float(nin.weight, nin.weight_dtype, col + 1) : 0.0f;
    w.z = col + 2 < K ? load_as_float(nin.weight, nin.weight_dtype, col + 2) : 0.0f;
    w.w = col + 3 < K ? load_as_float(nin.weight, nin.weight_dtype, col + 3) : 0.0f;
    return w;
  }

  // A NormIn input's weight does not depend on the previous kernel: its first batch of groups
  // is loaded before the wait (pdl_begin).
  __device__ __forceinline__ void preload_norm_weight(float4 (&wn)[kBatch]) const {
    if (nin.sumsq != nullptr) {
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        if (u < my_groups) wn[u] = norm_weight(grp_begin + u);
      }
    }
  }

  // x as B fragments: lane l of a warp holds columns 128 grp + 4l .. + 3 = k16 step l / 4 of
  // thread-in-group l % 4 (actual columns e = 0, 1 play k slots 2c, 2c + 1; e = 2, 3 the high
  // nibbles' slots 2c + 8, 2c + 9), as {hi(e0, e1), hi(e2, e3) / 16, lo(e0, e1), lo(e2, e3) / 16}:
  // as uint2, entry 2 (32 grp + 4 step + c) + h is column h's B register pair. Each warp stages
  // the groups it multiplies (the same for every tile), so no block barrier is needed.
  __device__ __forceinline__ void stage_group(int64_t grp, const float4& v) const {
    const float big = warp_max(fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
    // 2^(E - 127) <= max |x| < 2^(E - 126) for the biased exponent E of the group's max; E is
    // clamped so that sc and inv stay normal (groups of zeros or of subnormal x get sc = 2^127;
    // |x| >= 2^115, far beyond any activation, would overflow the f16 split).
    const int e = min(max(int(__float_as_uint(big) >> 23), 13), 242);
    const float sc = __uint_as_float(uint32_t(267 - e) << 23);    // 2^(140 - E)
    const float inv = __uint_as_float(uint32_t(e + 11) << 23);    // 2^24 / sc = 2^(E - 116)
    const float rinv = __uint_as_float(uint32_t(243 - e) << 23);  // 1 / inv
    uint4 f;
    split_f16x2(v.x * sc, v.y * sc, f.x, f.z);
    split_f16x2(v.z * (sc * 0.0625f), v.w * (sc * 0.0625f), f.y, f.w);
    xfrag[grp * 32 + lane] = make_uint4(f.x, f.y, f.z, f.w);
    const float sum = warp_sum((v.x + v.y) + (v.z + v.w));
    if (lane == 0) gscale[grp] = make_float2(sum * rinv, inv);
  }

  // The activation was written by the previous kernel: the loads of up to kBatch groups are in
  // flight together (one L2 round trip instead of one per group, on the launch's critical path),
  // then staged. A NormIn input stages h * weight (wn: preload_norm_weight's first batch); its
  // 1 / rms scales the sums.
  template <bool VEC_X>
  __device__ __forceinline__ void stage(const float4 (&wn)[kBatch]) const {
    for (int g0 = 0; g0 < my_groups; g0 += kBatch) {
      float4 v[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        if (g0 + u < my_groups) {
          v[u] = load_x4<VEC_X>(x, 0, 1, K, (grp_begin + g0 + u) * kQ4TiledGroup + 4 * lane);
        }
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        if (g0 + u < my_groups) {
          if (nin.sumsq != nullptr) {
            const float4 w = g0 == 0 ? wn[u] : norm_weight(grp_begin + g0 + u);
            v[u] = make_float4(v[u].x * w.x, v[u].y * w.y, v[u].z * w.z, v[u].w * w.w);
          }
          stage_group(grp_begin + g0 + u, v[u]);
        }
      }
    }
  }

  // The kernel's start once its ring's first stages are issued: the NormIn weight's first batch,
  // the wait for the previous kernel (pdl_begin), the staging.
  template <bool VEC_X>
  __device__ __forceinline__ void wait_and_stage() const {
    float4 wn[kBatch];
    preload_norm_weight(wn);
    pdl_begin();
    stage<VEC_X>(wn);
  }
};

// Where a lane reads its B registers of each step (a group's are 64 uint2s apart in xfrag): lanes
// of token columns 0 and 1 read their column's pair of each step (8 uint2s apart); the others
// read zeros (a broadcast from this warp's `zeros`, 64 uint2s, zeroed here) at the same
// offsets, so that no load is predicated.
__device__ __forceinline__ const uint2* sub_x_fragments(const uint4* xfrag, uint2* zeros, int g,
                                                        int c, int lane) {
  zeros[lane] = zeros[lane + 32] = make_uint2(0, 0);
  __syncwarp();
  return g < 2 ? reinterpret_cast<const uint2*>(xfrag) + 2 * c + g : zeros;
}

// k16 step k of one tile's group in the subnormal kernels: the lane's codes of rows g (w0) and
// g + 8 (w1) as f16 subnormals times the activation's B registers b of the step, into chain
// k % CHAINS.
template <int CHAINS>
__device__ __forceinline__ void sub_step(float (&chain)[CHAINS][4], const uint4& w0,
                                         const uint4& w1, int k, const uint2 b) {
  const int shift = (k & 1) * 8;
  const uint32_t u0 = word_of(w0, k / 2) >> shift, u1 = word_of(w1, k / 2) >> shift;
  mma_f16(chain[k % CHAINS], u0 & 0x000f000fu, u1 & 0x000f000fu, u0 & 0x00f000f0u, u1 & 0x00f000f0u,
          b.x, b.y);
}

// One tile's group done (subnormal kernels): its chains summed, scaled by the rows' (scale,
// min) pairs mm and the group's *gs = {sum x / inv, inv} (gscale), into the rows' sums acc0
// (row g) and acc2 (row g + 8).
template <int CHAINS>
__device__ __forceinline__ void sub_group_end(const float (&chain)[CHAINS][4], const uint2& mm,
                                              const float2* gs_at, float& acc0, float& acc2) {
  float gacc0 = chain[0][0] + chain[0][1], gacc2 = chain[0][2] + chain[0][3];
  if constexpr (CHAINS == 2) {
    gacc0 += chain[1][0] + chain[1][1];
    gacc2 += chain[1][2] + chain[1][3];
  }
  const float2 gs = *gs_at;
  const float2 p0 = half2_bits_to_float2(mm.x), p1 = half2_bits_to_float2(mm.y);
  acc0 = fmaf(gs.y, fmaf(p0.x, gacc0, p0.y * gs.x), acc0);
  acc2 = fmaf(gs.y, fmaf(p1.x, gacc2, p1.y * gs.x), acc2);
}

template <bool VEC_X, int CHAINS>
__global__ void __launch_bounds__(kPMaxWarps * 32, 1)
    gemv_q4_persist_sub_kernel(const float* __restrict__ x, int64_t K, int64_t groups,
                               const CcSegments segs, int64_t tiles, const GemvNorm norm,
                               const NormIn nin) {
  extern __shared__ uint4 p_smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int num_warps = blockDim.x / 32;
  const int g = lane >> 2, c = lane & 3;
  uint4* ring = p_smem + size_t(warp) * kPStages * kPStageVecs;
  uint4* xfrag = p_smem + size_t(num_warps) * kPStages * kPStageVecs;        // [groups][32]
  float* partial = reinterpret_cast<float*>(xfrag + groups * 32);            // [2][warps][32][2]
  float2* gscale = reinterpret_cast<float2*>(partial + 2 * num_warps * 64);  // [groups]
  uint2* zeros = reinterpret_cast<uint2*>(gscale + ((groups + 1) & ~int64_t{1})) + warp * 64;

  const int64_t grp_begin = groups * warp / num_warps;
  const int my_groups = static_cast<int>(groups * (warp + 1) / num_warps - grp_begin);
  const int my_tiles = static_cast<int>(block_tiles(segs, tiles));

  PersistFetch<int> fetch(segs, ring, groups, grp_begin, my_tiles, my_groups, lane);
#pragma unroll
  for (int st = 0; st < kPStages - 1; ++st) fetch();
  SubActivation{x, K, nin, xfrag, gscale, grp_begin, my_groups, lane}.wait_and_stage<VEC_X>();
  // Only warp 0's threads store the rows (persist_store_tile): the other warps need no scale.
  const float scale = nin.sumsq != nullptr && warp == 0 ? norm_in_scale(nin, K) : 1.0f;
  const uint2* xbase = sub_x_fragments(xfrag, zeros, g, c, lane);
  const int xstride = g < 2 ? 64 : 0;  // uint2s per group
  int slot = 0;
  float gate_keep = 0.0f;
  double sq = 0.0;
  for (int tj = 0; tj < my_tiles; ++tj) {
    float acc0 = 0.0f, acc2 = 0.0f;  // rows g and g + 8 (lanes of c = 0)
    for (int gi = 0; gi < my_groups; ++gi) {
      __syncwarp();  // every lane has read the slot that this fetch refills
      fetch();
      cp_async_wait<kPStages - 1>();
      __syncwarp();  // every lane's pieces of this stage have landed
      const uint4* st = ring + slot * kPStageVecs;
      slot = slot + 1 == kPStages ? 0 : slot + 1;
      const uint4 w0 = st[lane], w1 = st[32 + lane];  // rows g and g + 8
      const uint2 mm = reinterpret_cast<const uint2*>(st + kPiecesPerTileGroup)[lane];
      const int64_t grp = grp_begin + gi;
      const uint2* xf = xbase + grp * xstride;
      float chain[CHAINS][4] = {};
#pragma unroll
      for (int k = 0; k < kStepsPerGroup; ++k) sub_step<CHAINS>(chain, w0, w1, k, xf[8 * k]);
      sub_group_end<CHAINS>(chain, mm, gscale + grp, acc0, acc2);
    }
    persist_store_tile(segs, partial + size_t(tj & 1) * num_warps * 64, warp, lane, num_warps,
                       blockIdx.x + int64_t{tj} * gridDim.x, acc0, acc2, norm, gate_keep, scale,
                       sq);
  }
  cp_async_wait<0>();
  persist_norm_end(norm, partial, sq);
}

// ---- the subnormal kernel over pairs of tiles (Q4GemvTuning::kernel 10) ---------------------
//
// Kernel 8's arithmetic with two 16-row tiles per ring stage: a warp's stage holds one group of
// both tiles of a pair (2048 code bytes, then both tiles' 64 metadata bytes, which lanes 0..15
// copy), each k16 step's activation registers (one ld.shared) feed both tiles' MMAs (two
// independent accumulator chains), and the block's barrier and cross-warp sum come once per
// pair. Against kernel 8 that halves the activation loads, ring waits and barriers per code and
// doubles the independent MMAs in flight per warp (ncu of kernel 8, session 34: latency-bound,
// 0.35 instructions issued per cycle per scheduler, no dominant stall). Every row's sum is
// formed in kernel 8's order, so y is the same bits.
// Pair p: tiles 2p and 2p + 1 of the launch (one past its end reads zeros and is not stored);
// a paired gate / up launch (segs.swiglu): gate tile p and up tile p, whose SwiGLU the pair's
// store forms. Four stages of 2176 bytes (three pairs' groups in flight, 6 KiB per warp, where
// kernel 8 has five single groups) keep 16 warps and the 8B shape's down projection (112 groups
// of activation fragments) inside 227 KiB.
constexpr int kPairStages = 4;
constexpr int kPairMetaVecs = 8;  // 16 uint2 entries: tile a's rows {g, g + 8}, then tile b's
constexpr int kPairStageVecs = 2 * kPiecesPerTileGroup + kPairMetaVecs;

__host__ __device__ size_t persist_pair_smem_bytes(int warps, int64_t groups) {
  return sizeof(uint4) * (size_t(warps) * kPairStages * kPairStageVecs + size_t(groups) * 32) +
         sizeof(float4) * 2 * size_t(warps) * 32 + sizeof(float2) * ((size_t(groups) + 1) & ~1) +
         size_t(warps) * kSubZeroBytes;
}

// Pairs of a launch over `tiles` tiles (both matrices' when paired).
__host__ __device__ __forceinline__ int64_t pair_count(int64_t tiles, bool swiglu) {
  return swiglu ? tiles / 2 : (tiles + 1) / 2;
}

// Tile t (0 or 1) of pair p: its segment and its tile there; false past the launch's tiles.
__device__ __forceinline__ bool pair_tile(const CcSegments& segs, int64_t tiles, int64_t p, int t,
                                          int& si, int64_t& local) {
  if (segs.swiglu) {
    si = t, local = p;
    return true;
  }
  if (2 * p + t >= tiles) return false;
  si = find_segment_at(segs, 2 * p + t, local);
  return true;
}

// Where a warp's copies of kernel 10's current pair come from: its two pieces of each tile and
// (lanes 0..15) one metadata entry, advanced by one group per copy.
struct PairSource {
  const uint4* codes[2] = {};
  const uint2* meta = nullptr;
  bool has_b = false;

  // Pair `pair` of a launch over `tiles` tiles, from group grp_begin: lanes 0..7 copy tile a's
  // metadata entry `lane`, lanes 8..15 tile b's entry lane - 8 (zeros for a missing tile b).
  // rp: a launch with the RoPE pairs (else null).
  __device__ __forceinline__ void enter(const CcSegments& segs, int64_t tiles, int64_t groups,
                                        int64_t grp_begin, int lane, int64_t pair,
                                        const RopePairs* rp) {
    int si[2];
    int64_t local[2];
    if (rp != nullptr) {
      rope_pair_tile(*rp, pair, 0, si[0], local[0]);
      has_b = rope_pair_tile(*rp, pair, 1, si[1], local[1]);
    } else {
      pair_tile(segs, tiles, pair, 0, si[0], local[0]);
      has_b = pair_tile(segs, tiles, pair, 1, si[1], local[1]);
    }
    if (!has_b) si[1] = si[0], local[1] = local[0];  // a valid address, read as zeros
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      codes[t] =
          pick(segs.codes, si[t]) + (local[t] * groups + grp_begin) * kPiecesPerTileGroup + lane;
    }
    // Lanes 0..15: the tile whose entry this lane copies (a select: an array indexed by lane
    // would live in local memory).
    const bool mb = lane & 8;
    meta = pick(segs.meta, mb ? si[1] : si[0]) +
           ((mb ? local[1] : local[0]) * groups + grp_begin) * kMetaPerTileGroup + (lane & 7);
  }

  // The next group of the pair into ring slot `slot` (cp.async, not committed).
  __device__ __forceinline__ void copy(uint4* ring, int slot, int lane) {
    uint4* dst = ring + slot * kPairStageVecs;
    cp_async_16(dst + lane, codes[0], true);
    cp_async_16(dst + 32 + lane, codes[0] + 32, true);
    cp_async_16(dst + 64 + lane, codes[1], has_b);
    cp_async_16(dst + 96 + lane, codes[1] + 32, has_b);
    if (lane < 16) {
      cp_async_8(reinterpret_cast<uint2*>(dst + 2 * kPiecesPerTileGroup) + lane, meta,
                 lane < 8 || has_b);
    }
    codes[0] += kPiecesPerTileGroup, codes[1] += kPiecesPerTileGroup;
    meta += kMetaPerTileGroup;
  }
};

// The fetch side of kernel 10: each call copies the next stage of this warp's (pair, group)
// sequence (its groups [grp_begin, grp_begin + my_groups) of the pairs blockIdx.x, + gridDim.x,
// ...) into its ring slot and commits a cp.async group (RingCursor).
struct PairFetch {
  RingCursor<kPairStages, int> cursor;
  const CcSegments& segs;
  uint4* ring;
  int64_t groups, grp_begin, tiles;
  int lane;
  const RopePairs* rp = nullptr;  // a launch with the RoPE pairs
  PairSource src;

  __device__ PairFetch(const CcSegments& s, uint4* ring_, int64_t groups_, int64_t grp_begin_,
                       int64_t tiles_, int my_pairs, int my_groups, int lane_)
      : cursor(my_pairs, my_groups),
        segs(s),
        ring(ring_),
        groups(groups_),
        grp_begin(grp_begin_),
        tiles(tiles_),
        lane(lane_) {}

  __device__ __forceinline__ void operator()() {
    cursor.next([&](int64_t pair) { src.enter(segs, tiles, groups, grp_begin, lane, pair, rp); },
                [&](int slot) { src.copy(ring, slot, lane); });
  }
};

// The end of kernel 10's pair: persist_store_tile for both tiles. part ([warps][32] float4,
// double-buffered by the caller across pairs) gets every lane's sums {tile a row g, row g + 8,
// tile b row g, row g + 8} (lanes of c = 0); thread t * 16 + r (t < 2, r < 16) sums row r of
// tile t over the warps in kernel 8's order and stores it; a paired launch's threads 0..15 sum
// row r of both (gate, up) and store the SwiGLU.
__device__ __forceinline__ void persist_store_pair(const CcSegments& segs, float4* part, int warp,
                                                   int lane, int num_warps, int64_t tiles,
                                                   int64_t pair, const float (&acc)[2][2],
                                                   const GemvNorm& norm, float scale, double& sq) {
  part[warp * 32 + lane] = make_float4(acc[0][0], acc[0][1], acc[1][0], acc[1][1]);
  __syncthreads();
  if (threadIdx.x >= (segs.swiglu ? 16 : 32)) return;
  const int r = threadIdx.x & 15;
  const float* sums = reinterpret_cast<const float*>(part);
  auto row_sum = [&](int t) {
    float sum = 0.0f;
    for (int wi = 0; wi < num_warps; ++wi)
      sum += sums[(wi * 32 + (r & 7) * 4) * 4 + t * 2 + (r >> 3)];
    return sum * scale;
  };
  if (segs.swiglu) {
    const int64_t row = pair * 16 + r;
    if (row < segs.N[0]) {
      const float gate = with_bias(segs, 0, row, row_sum(0));
      segs.y[0][row] = swiglu_of(gate, with_bias(segs, 1, row, row_sum(1)));
    }
    return;
  }
  const int t = threadIdx.x >> 4;
  int si;
  int64_t local;
  if (!pair_tile(segs, tiles, pair, t, si, local)) return;
  const int64_t row = local * 16 + r;
  if (row < pick(segs.N, si)) {
    persist_store_row(norm, pick(segs.y, si), row, with_bias(segs, si, row, row_sum(t)), sq);
  }
}

// persist_store_pair for a launch with the RoPE pairs and the K/V rows: threads t * 16 + r sum
// row r of the pair's tile t in the same order; for a q or k pair the two threads of a rotation
// (r and 16 + r) exchange their sums and each keeps its side of the rotation (rope_apply with the
// block's table of cos and sin, fill_rope_table); every row goes to q,
// k or v, and k's and v's also to the cache's row at rows.pos (rope_qk_store_kv's bits).
__device__ __forceinline__ void rope_store_pair(const CcSegments& segs, const RopePairs& rp,
                                                const KvRowEpilogue& rows, float4* part, int warp,
                                                int lane, int num_warps, int64_t pair,
                                                const float (&acc)[2][2], float scale,
                                                const float2* rope_cs) {
  part[warp * 32 + lane] = make_float4(acc[0][0], acc[0][1], acc[1][0], acc[1][1]);
  __syncthreads();
  if (threadIdx.x >= 32) return;
  const int r = threadIdx.x & 15, t = threadIdx.x >> 4;
  const float* sums = reinterpret_cast<const float*>(part);
  float sum = 0.0f;
  for (int wi = 0; wi < num_warps; ++wi)
    sum += sums[(wi * 32 + (r & 7) * 4) * 4 + t * 2 + (r >> 3)];
  sum *= scale;
  int si;
  int64_t local;
  const bool has = rope_pair_tile(rp, pair, t, si, local);
  const int64_t row = local * 16 + r;
  const bool valid = has && row < pick(segs.N, si);
  float v = valid ? with_bias(segs, si, row, sum) : 0.0f;
  if (pair < rp.q_pairs + rp.k_pairs) {  // the same for all 32 threads
    const float other = __shfl_xor_sync(0xffffffffu, v, 16);
    const int half = rows.head_dim / 2;
    const int j = static_cast<int>(row % rows.head_dim) - (t == 0 ? 0 : half);
    const float2 rot = rope_apply(t == 0 ? v : other, t == 0 ? other : v, rope_cs[j]);
    v = t == 0 ? rot.x : rot.y;
  }
  if (!valid) return;
  pick(segs.y, si)[row] = v;
  if (si == 0) return;  // q stays in its buffer
  void* dst = si == 1 ? rows.k_dst : rows.v_dst;
  if (rows.f16) {
    store_row_value<true>(dst, row, v);
  } else {
    store_row_value<false>(dst, row, v);
  }
}

// A warp's place in kernel 10's block: its ring, the block's double-buffered partial sums, where
// it reads its B registers (sub_x_fragments; xstride uint2s per group) and the groups' scales.
struct PairWarp {
  const uint4* ring;
  float4* partial;
  const uint2* xbase;
  int xstride;
  const float2* gscale;
  int warp, lane, num_warps, g;
};

// Kernel 10's compute side over one launch's operands: this warp's pairs [0, my_pairs) of
// my_groups groups each from grp_begin, every stage taken from the ring in order (slot: the next
// one; `fetch` refills each slot once it is read, keeping kPairStages - 1 stages ahead), each
// pair's sums handed to store(part, pair, acc) (persist_store_pair; part: this pair's half of
// the block's double-buffered partial sums).
template <int CHAINS, class Fetch, class Store>
__device__ __forceinline__ void pair_walk(Fetch& fetch, const PairWarp& pw, int& slot,
                                          int64_t grp_begin, int my_pairs, int my_groups,
                                          Store&& store) {
  const int g = pw.g, lane = pw.lane;
  for (int pj = 0; pj < my_pairs; ++pj) {
    float acc[2][2] = {};  // [tile][row g, g + 8] (lanes of c = 0)
    for (int gi = 0; gi < my_groups; ++gi) {
      __syncwarp();  // every lane has read the slot that this fetch refills
      fetch();
      cp_async_wait<kPairStages - 1>();
      __syncwarp();  // every lane's copies of this stage have landed (lanes read others' meta)
      const uint4* st = pw.ring + slot * kPairStageVecs;
      slot = slot + 1 == kPairStages ? 0 : slot + 1;
      const uint4 w[2][2] = {{st[lane], st[32 + lane]}, {st[64 + lane], st[96 + lane]}};
      const uint2* mt = reinterpret_cast<const uint2*>(st + 2 * kPiecesPerTileGroup);
      const uint2 mm[2] = {mt[g], mt[8 + g]};
      const int64_t grp = grp_begin + gi;
      const uint2* xf = pw.xbase + grp * pw.xstride;
      float chain[2][CHAINS][4] = {};
#pragma unroll
      for (int k = 0; k < kStepsPerGroup; ++k) {
        const uint2 b = xf[8 * k];  // one load for both tiles
        sub_step<CHAINS>(chain[0], w[0][0], w[0][1], k, b);
        sub_step<CHAINS>(chain[1], w[1][0], w[1][1], k, b);
      }
      sub_group_end<CHAINS>(chain[0], mm[0], pw.gscale + grp, acc[0][0], acc[0][1]);
      sub_group_end<CHAINS>(chain[1], mm[1], pw.gscale + grp, acc[1][0], acc[1][1]);
    }
    store(pw.partial + size_t(pj & 1) * pw.num_warps * 32, blockIdx.x + int64_t{pj} * gridDim.x,
          acc);
  }
}

// Kernel 10's body. rp / rows (ROPE, gemv_q4_pair_rope_kernel): q, k, v with the RoPE pairs,
// ending in rope_store_pair.
template <bool VEC_X, int CHAINS, bool ROPE>
__device__ __forceinline__ void pair_kernel_body(const float* __restrict__ x, int64_t K,
                                                 int64_t groups, const CcSegments& segs,
                                                 int64_t tiles, const GemvNorm& norm,
                                                 const NormIn& nin, const RopePairs* rp,
                                                 const KvRowEpilogue* rows) {
  extern __shared__ uint4 p_smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int num_warps = blockDim.x / 32;
  const int g = lane >> 2, c = lane & 3;
  uint4* ring = p_smem + size_t(warp) * kPairStages * kPairStageVecs;
  uint4* xfrag = p_smem + size_t(num_warps) * kPairStages * kPairStageVecs;  // [groups][32]
  float4* partial = reinterpret_cast<float4*>(xfrag + groups * 32);          // [2][warps][32]
  float2* gscale = reinterpret_cast<float2*>(partial + 2 * num_warps * 32);  // [groups]
  uint2* zeros = reinterpret_cast<uint2*>(gscale + ((groups + 1) & ~int64_t{1})) + warp * 64;

  const int64_t grp_begin = groups * warp / num_warps;
  const int my_groups = static_cast<int>(groups * (warp + 1) / num_warps - grp_begin);
  const int my_pairs =
      static_cast<int>(block_items(ROPE ? rope_pair_count(*rp) : pair_count(tiles, segs.swiglu)));

  PairFetch fetch(segs, ring, groups, grp_begin, tiles, my_pairs, my_groups, lane);
  if constexpr (ROPE) fetch.rp = rp;
#pragma unroll
  for (int st = 0; st < kPairStages - 1; ++st) fetch();
  // ROPE: the rotations' cos and sin after the kernel's own bytes (gemv_q4_pair_rope_kernel).
  float2* rope_cs = reinterpret_cast<float2*>(reinterpret_cast<unsigned char*>(p_smem) +
                                              persist_pair_smem_bytes(num_warps, groups));
  if constexpr (ROPE) {
    fill_rope_table(rope_cs, rows->head_dim / 2, static_cast<float>(rows->pos),
                    rows->freqs.inv_freq);
  }
  SubActivation{x, K, nin, xfrag, gscale, grp_begin, my_groups, lane}.wait_and_stage<VEC_X>();
  // Only warp 0's threads store the rows (persist_store_pair): the other warps need no scale.
  const float scale = nin.sumsq != nullptr && warp == 0 ? norm_in_scale(nin, K) : 1.0f;
  const PairWarp pw{ring,           partial,   sub_x_fragments(xfrag, zeros, g, c, lane),
                    g < 2 ? 64 : 0, gscale,    warp,
                    lane,           num_warps, g};
  int slot = 0;
  double sq = 0.0;
  pair_walk<CHAINS>(
      fetch, pw, slot, grp_begin, my_pairs, my_groups,
      [&](float4* part, int64_t pair, const float(&acc)[2][2]) {
        if constexpr (ROPE) {
          rope_store_pair(segs, *rp, *rows, part, warp, lane, num_warps, pair, acc, scale, rope_cs);
        } else {
          persist_store_pair(segs, part, warp, lane, num_warps, tiles, pair, acc, norm, scale, sq);
        }
      });
  cp_async_wait<0>();
  persist_norm_end(norm, reinterpret_cast<float*>(partial), sq);
}

template <bool VEC_X, int CHAINS>
__global__ void __launch_bounds__(kPMaxWarps * 32, 1)
    gemv_q4_persist_pair_kernel(const float* __restrict__ x, int64_t K, int64_t groups,
                                const CcSegments segs, int64_t tiles, const GemvNorm norm,
                                const NormIn nin) {
  pair_kernel_body<VEC_X, CHAINS, false>(x, K, groups, segs, tiles, norm, nin, nullptr, nullptr);
}

// Kernel 10 over a layer's q, k and v that also rotates q and k and stores the K/V rows
// (launch_gemv_q4_qkv_rows): the bits of launch_gemv_q4_group_normed then
// launch_rope_qk_store_kv.
template <bool VEC_X, int CHAINS>
__global__ void __launch_bounds__(kPMaxWarps * 32, 1)
    gemv_q4_pair_rope_kernel(const float* __restrict__ x, int64_t K, int64_t groups,
                             const CcSegments segs, int64_t tiles, const NormIn nin,
                             const __grid_constant__ RopePairs rp,
                             const __grid_constant__ KvRowEpilogue rows) {
  pair_kernel_body<VEC_X, CHAINS, true>(x, K, groups, segs, tiles, GemvNorm{}, nin, &rp, &rows);
}

// Reference layout, any group size: a warp per output row, lanes over columns, the weight
// dequantized as the CPU does (w = U*s + mn, the product exact) and dotted in f32.
constexpr int kSimtWarps = 8;

__global__ void gemv_q4_simt_kernel(const float* __restrict__ x, int m, int64_t K,
                                    const uint8_t* __restrict__ codes, int64_t row_bytes,
                                    const uint16_t* __restrict__ scale,
                                    const uint16_t* __restrict__ mins, int64_t groups,
                                    int group_size, int64_t N, DeviceBias bias,
                                    float* __restrict__ y) {
  pdl_begin();
  const int lane = threadIdx.x % 32;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kSimtWarps + threadIdx.x / 32;
  if (n >= N) return;  // whole warp
  float acc[kMaxRows];
#pragma unroll
  for (int i = 0; i < kMaxRows; ++i) acc[i] = 0.0f;
  const uint8_t* row = codes + n * row_bytes;
  for (int64_t col = lane; col < K; col += 32) {
    const uint32_t b = row[col >> 1];
    const uint32_t u = (col & 1) ? (b >> 4) : (b & 0x0fu);
    const int64_t j = n * groups + col / group_size;
    const float s = __half2float(__ushort_as_half(scale[j]));
    const float mn = __half2float(__ushort_as_half(mins[j]));
    const float w = __fadd_rn(__fmul_rn(static_cast<float>(u), s), mn);
#pragma unroll
    for (int i = 0; i < kMaxRows; ++i) {
      if (i < m) acc[i] = fmaf(w, x[i * K + col], acc[i]);
    }
  }
  const float b = bias.data ? load_as_float(bias.data, bias.dtype, n) : 0.0f;
#pragma unroll
  for (int i = 0; i < kMaxRows; ++i) {
    if (i < m) {
      const float s = warp_sum(acc[i]);
      if (lane == 0) y[i * N + n] = s + b;
    }
  }
}

// Reference layout -> tiled layout; a thread per 16-byte output piece (and, for the lanes with
// c == 0 of piece 0, the meta entry of row pair g, g + 8).
__global__ void repack_q4_kernel(const uint8_t* __restrict__ raw, int64_t row_bytes,
                                 const uint16_t* __restrict__ scale,
                                 const uint16_t* __restrict__ mins, int64_t rows, int64_t cols,
                                 int64_t groups, int64_t tiles, uint4* __restrict__ out_codes,
                                 uint2* __restrict__ out_meta) {
  pdl_begin();
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= tiles * groups * kPiecesPerTileGroup) return;
  const int lane = static_cast<int>(idx % 32);
  const int piece = static_cast<int>((idx / 32) % 2);
  const int64_t tg = idx / kPiecesPerTileGroup;
  const int64_t tile = tg / groups, grp = tg % groups;
  const int g = lane >> 2, c = lane & 3;
  const int64_t row = tile * 16 + g + 8 * piece;
  uint32_t words[4] = {0, 0, 0, 0};
  if (row < rows) {
    for (int k = 0; k < kStepsPerGroup; ++k) {
      for (int e = 0; e < 4; ++e) {
        const int64_t col = grp * kQ4TiledGroup + 16 * k + 4 * c + e;
        if (col >= cols) continue;
        const uint32_t b = raw[row * row_bytes + (col >> 1)];
        const uint32_t u = (col & 1) ? (b >> 4) : (b & 0x0fu);
        const int pos = (e & 1) * 4 + (k & 1) * 2 + (e >> 1);
        words[k / 2] |= u << (4 * pos);
      }
    }
  }
  out_codes[idx] = make_uint4(words[0], words[1], words[2], words[3]);
  if (piece == 0 && c == 0) {
    uint32_t entry[2] = {0, 0};
    for (int half = 0; half < 2; ++half) {
      const int64_t r = tile * 16 + g + 8 * half;
      if (r < rows) {
        const int64_t j = r * groups + grp;
        entry[half] = static_cast<uint32_t>(scale[j]) | (static_cast<uint32_t>(mins[j]) << 16);
      }
    }
    out_meta[tg * kMetaPerTileGroup + g] = make_uint2(entry[0], entry[1]);
  }
}

// ---- launchers ----------------------------------------------------------------------------------

// One tiled launch's operands.
struct TiledLaunch {
  const float* x;
  int m;
  const DeviceWeight4* w;
  DeviceBias bias;
  float* y;
  int warps;
  cudaStream_t stream;
};

constexpr int kRingStages = 4;  // Q4GemvTuning::stages of the cp.async variant
constexpr size_t kRingBytesPerTile =
    kPiecesPerTileGroup * sizeof(uint4) + 32 * sizeof(uint2);  // per warp, stage and tile

// Dynamic shared memory of a tiled launch: the cp.async ring, or the epilogue's partial sums.
template <int RT, int NT, int STAGES>
constexpr size_t q4_smem_bytes(int warps) {
  const size_t ring = static_cast<size_t>(warps) * STAGES * RT * kRingBytesPerTile;
  const size_t sums = static_cast<size_t>(warps) * RT * NT * 32 * 4 * sizeof(float);
  return ring > sums ? ring : sums;
}

template <int RT, int NT, bool VEC_X, int STAGES>
void launch_tiled(const TiledLaunch& l) {
  const int64_t tiles = (l.w->rows + 15) / 16;
  const int64_t blocks = (tiles + RT - 1) / RT;
  QS_CHECK(blocks <= 0x7fffffff && l.warps >= 1 && l.warps <= kQ4MaxWarps);
  auto* kernel = gemv_q4_tiled_kernel<RT, NT, VEC_X, STAGES>;
  const size_t smem = q4_smem_bytes<RT, NT, STAGES>(l.warps);
  if constexpr (STAGES > 0) {
    // Above 48 KiB of dynamic shared memory a kernel must opt in (once per instantiation, for
    // its largest block).
    static const bool opted_in = [kernel] {
      const int most = static_cast<int>(q4_smem_bytes<RT, NT, STAGES>(kQ4MaxWarps));
      CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, most));
      return true;
    }();
    (void)opted_in;
  }
  launch(kernel, static_cast<unsigned>(blocks), l.warps * 32, smem, l.stream, l.x, l.m, l.w->cols,
         reinterpret_cast<const uint4*>(l.w->codes), reinterpret_cast<const uint2*>(l.w->meta),
         l.w->rows, tiles, l.w->groups, l.bias, l.y);
  CUDA_CHECK_LAUNCH(l.stream);
}

template <int NT, bool VEC_X, int STAGES>
void launch_tiled_rt(int rt, const TiledLaunch& l) {
  if (rt == 4 && NT == 1) {
    launch_tiled<4, 1, VEC_X, STAGES>(l);
  } else if (rt >= 2) {
    launch_tiled<2, NT, VEC_X, STAGES>(l);
  } else {
    launch_tiled<1, NT, VEC_X, STAGES>(l);
  }
}

template <int NT, bool VEC_X>
void launch_tiled_stages(int rt, int stages, const TiledLaunch& l) {
  if (stages > 0) {
    launch_tiled_rt<NT, VEC_X, kRingStages>(rt, l);
  } else {
    launch_tiled_rt<NT, VEC_X, 0>(rt, l);
  }
}

// Dynamic shared memory of the wide kernel: the epilogue's partial sums (none for one warp).
template <int RT, int NT>
constexpr size_t q4_wide_smem_bytes(int warps) {
  return warps > 1 ? static_cast<size_t>(warps) * RT * NT * 32 * 4 * sizeof(float) : 0;
}

// l.warps == 0: automatic. Warps per block are doubled while the whole grid stays resident in
// one wave (asked of the occupancy calculator once per instantiation: the register count
// decides) and every warp keeps at least one full batch of groups.
template <int RT, int NT, bool VEC_X>
void launch_wide(const TiledLaunch& l, int num_sms) {
  const int64_t tiles = (l.w->rows + 15) / 16;
  const int64_t blocks = (tiles + RT - 1) / RT;
  auto* kernel = gemv_q4_wide_kernel<RT, NT, VEC_X>;
  static_assert(q4_wide_smem_bytes<RT, NT>(kQ4MaxWarps) <= 48 * 1024, "no opt-in needed");
  int warps = l.warps;
  if (warps == 0) {
    static const std::array<int, 4> resident = [kernel] {  // blocks per SM of 1, 2, 4, 8 warps
      std::array<int, 4> r{};
      for (int i = 0; i < 4; ++i) {
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &r[i], kernel, 32 << i, q4_wide_smem_bytes<RT, NT>(1 << i)));
      }
      return r;
    }();
    constexpr int kGroupsPerBatch = kWideBatch / RT;
    const int64_t batches = (l.w->groups + kGroupsPerBatch - 1) / kGroupsPerBatch;
    warps = 1;
    for (int i = 1; i < 4 && 2 * warps <= batches && blocks <= int64_t{resident[i]} * num_sms;
         ++i) {
      warps *= 2;
    }
  }
  QS_CHECK(blocks <= 0x7fffffff && warps >= 1 && warps <= kQ4MaxWarps);
  launch(kernel, static_cast<unsigned>(blocks), warps * 32, q4_wide_smem_bytes<RT, NT>(warps),
         l.stream, l.x, l.m, l.w->cols, reinterpret_cast<const uint4*>(l.w->codes),
         reinterpret_cast<const uint2*>(l.w->meta), l.w->rows, tiles, l.w->groups, l.bias, l.y);
  CUDA_CHECK_LAUNCH(l.stream);
}

// rt: 1, 2 or 4 (4 only with NT == 1).
template <int NT, bool VEC_X>
void launch_wide_rt(int rt, const TiledLaunch& l, int num_sms) {
  if (rt == 4 && NT == 1) {
    launch_wide<4, 1, VEC_X>(l, num_sms);
  } else if (rt >= 2) {
    launch_wide<2, NT, VEC_X>(l, num_sms);
  } else {
    launch_wide<1, NT, VEC_X>(l, num_sms);
  }
}

// One CUDA-core launch over 1..kMaxGemvSegments matrices of the same cols and groups.
struct CcLaunch {
  const float* x;
  int m;
  const DeviceWeight4* w[kMaxGemvSegments];
  DeviceBias bias[kMaxGemvSegments];
  float* y[kMaxGemvSegments];
  int count;
  int warps;
  cudaStream_t stream;
};

// Dynamic shared memory of the CUDA-core kernel: its cp.async ring (none with registers).
constexpr size_t cc_ring_bytes(int warps, int rt, int stages) {
  return static_cast<size_t>(warps) * stages * rt * kRingBytesPerTile;
}

// The launch's matrices as kernel parameters, block_end counting blocks of rt tiles.
CcSegments cc_segments(const CcLaunch& l, int rt) {
  CcSegments segs{};
  segs.count = l.count;
  int64_t blocks = 0;
  for (int i = 0; i < kMaxGemvSegments; ++i) {
    const int j = std::min(i, l.count - 1);  // unused slots repeat the last
    const DeviceWeight4& w = *l.w[j];
    const int64_t tiles = (w.rows + 15) / 16;
    if (i < l.count) blocks += (tiles + rt - 1) / rt;
    segs.codes[i] = reinterpret_cast<const uint4*>(w.codes);
    segs.meta[i] = reinterpret_cast<const uint2*>(w.meta);
    segs.N[i] = w.rows;
    segs.tiles[i] = tiles;
    segs.bias[i] = l.bias[j];
    segs.y[i] = l.y[j];
    segs.block_end[i] = blocks;
  }
  return segs;
}

// The CUDA-core kernel for exactly M rows of x, RT tiles per block, STAGES as the kernel's.
template <int M, int RT, bool VEC_X, int STAGES>
void launch_cc(const CcLaunch& l) {
  // Groups loaded per step (8 registers per tile each): about 4 KiB of codes in flight per warp
  // within the register budget (128 per thread for RT <= 2, 255 for RT = 4).
  constexpr int kBatch = RT >= 4   ? (M == 1 ? 2 : 1)
                         : RT == 2 ? (M <= 2 ? 2 : 1)
                                   : (M <= 2 ? 4 : (M <= 4 ? 2 : 1));
  const CcSegments segs = cc_segments(l, RT);
  const int64_t blocks = segs.block_end[kMaxGemvSegments - 1];
  QS_CHECK(blocks <= 0x7fffffff && l.warps >= 1 && l.warps <= kCcMaxWarps);
  auto* kernel = gemv_q4_cc_kernel<M, RT, kBatch, VEC_X, STAGES>;
  const size_t smem = cc_ring_bytes(l.warps, RT, STAGES);
  if constexpr (STAGES > 0) {
    // Above 48 KiB of dynamic shared memory a kernel must opt in (once per instantiation, for
    // its largest block).
    static const bool opted_in = [kernel] {
      const int most = static_cast<int>(cc_ring_bytes(kCcMaxWarps, RT, STAGES));
      CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, most));
      return true;
    }();
    (void)opted_in;
  }
  launch(kernel, static_cast<unsigned>(blocks), l.warps * 32, smem, l.stream, l.x, l.w[0]->cols,
         l.w[0]->groups, segs);
  CUDA_CHECK_LAUNCH(l.stream);
}

// rt: 1, 2 or 4 (4 only for m <= 2 with registers; it runs as 2 otherwise).
template <int M, bool VEC_X, int STAGES>
void launch_cc_rt(int rt, const CcLaunch& l) {
  if constexpr (M <= 2 && STAGES == 0) {
    if (rt == 4) return launch_cc<M, 4, VEC_X, STAGES>(l);
  }
  if (rt >= 2) return launch_cc<M, 2, VEC_X, STAGES>(l);
  launch_cc<M, 1, VEC_X, STAGES>(l);
}

template <bool VEC_X, int STAGES>
void launch_cc_rows(int rt, const CcLaunch& l) {
  static_assert(kCcMaxRows == 8, "one instantiation per row count");
  switch (l.m) {
    case 1:
      return launch_cc_rt<1, VEC_X, STAGES>(rt, l);
    case 2:
      return launch_cc_rt<2, VEC_X, STAGES>(rt, l);
    case 3:
      return launch_cc_rt<3, VEC_X, STAGES>(rt, l);
    case 4:
      return launch_cc_rt<4, VEC_X, STAGES>(rt, l);
    case 5:
      return launch_cc_rt<5, VEC_X, STAGES>(rt, l);
    case 6:
      return launch_cc_rt<6, VEC_X, STAGES>(rt, l);
    case 7:
      return launch_cc_rt<7, VEC_X, STAGES>(rt, l);
    case 8:
      return launch_cc_rt<8, VEC_X, STAGES>(rt, l);
    default:
      QS_CHECK_MSG(false, "gemv_q4: the CUDA-core kernel takes m <= 8");
  }
}

// Tiles per block of the CUDA-core kernel: two tiles share each activation load, scaling and
// group sum between 4 rows per lane, when every SM still gets a block. Measured on the H200
// (bench_ops w4var, m = 1): 7B gate/up 15.6 us with 2 tiles vs 18.1 with 1 and 20.2 with 4 (172
// blocks of 4 tiles make a second, mostly empty wave at 1 block per SM); 8B lm_head 131 / 167 /
// 156 us. Four tiles stay a tuning option (Q4GemvTuning::row_tiles).
int cc_row_tiles(int64_t tiles, int num_sms) {
  return (tiles + 1) / 2 >= num_sms ? 2 : 1;
}

// Warps of the CUDA-core kernel splitting K, at most 8: with registers about 4 groups (4 KiB of
// codes) each; with the ring about 8, so that its pipeline has a stretch to stream.
int auto_cc_warps(int64_t groups, bool ring) {
  return static_cast<int>(std::clamp<int64_t>(groups / (ring ? 8 : 4), 1, kCcMaxWarps));
}

// The CUDA-core kernel over the launch's matrices, tiles per block and warps chosen from the
// first matrix's groups and all matrices' tiles.
void run_cc(CcLaunch l, int num_sms) {
  int64_t tiles = 0;
  for (int i = 0; i < l.count; ++i) tiles += (l.w[i]->rows + 15) / 16;
  const int64_t groups = l.w[0]->groups;
  int64_t rows = 0;
  for (int i = 0; i < l.count; ++i) rows += l.w[i]->rows;
  const int auto_stages = groups >= kQ4RingMinGroups || rows >= kQ4RingMinRows ? kRingStages : 1;
  const int stages = g_q4_tuning.stages != 0 ? g_q4_tuning.stages : auto_stages;
  const bool ring = stages == kRingStages;
  l.warps = g_q4_tuning.warps > 0 ? static_cast<int>(std::min<int64_t>(g_q4_tuning.warps, groups))
                                  : auto_cc_warps(groups, ring);
  const int rt = g_q4_tuning.row_tiles > 0 ? g_q4_tuning.row_tiles : cc_row_tiles(tiles, num_sms);
  const bool vec_x = reinterpret_cast<uintptr_t>(l.x) % 16 == 0 && l.w[0]->cols % 4 == 0;
  if (ring) {
    vec_x ? launch_cc_rows<true, kRingStages>(rt, l) : launch_cc_rows<false, kRingStages>(rt, l);
  } else {
    vec_x ? launch_cc_rows<true, 0>(rt, l) : launch_cc_rows<false, 0>(rt, l);
  }
}

// The persistent kernel (m = 1) over the launch's matrices: a block per SM (or per tile, for
// fewer tiles), a warp per group up to kPMaxWarps, with `norm` (gemv_norm.cuh) when it is set.
// Launches nothing and returns false when the activation's fragments and the rings do not fit in
// shared memory (groups > ~230).
bool try_persist(const CcLaunch& l, int num_sms, const GemvNorm& norm, bool swiglu = false,
                 const NormIn& nin = NormIn{}) {
  const int64_t groups = l.w[0]->groups;
  const int warps = static_cast<int>(std::clamp<int64_t>(groups, 1, kPMaxWarps));
  int kernel_choice = g_q4_tuning.kernel != 0 ? g_q4_tuning.kernel : kQ4AutoKernel;
  const size_t smem_max = max_smem_per_block();
  // The pair kernel's deeper stages need more shared memory: where they do not fit (K above
  // ~14.5K at 16 warps on the H200), kernel 8 runs instead.
  if (kernel_choice == kQ4PairKernel && persist_pair_smem_bytes(warps, groups) > smem_max) {
    kernel_choice = 8;
  }
  const bool sub = kernel_choice >= 8, pair = kernel_choice == kQ4PairKernel;
  if (nin.sumsq != nullptr && (!sub || l.m != 1)) return false;  // kernels 8-10 read a NormIn
  const size_t smem = pair  ? persist_pair_smem_bytes(warps, groups)
                      : sub ? persist_sub_smem_bytes(warps, groups)
                            : persist_smem_bytes(warps, groups, kernel_choice == 7);
  if (smem > smem_max) return false;
  CcSegments segs = cc_segments(l, 1);  // block_end: tiles
  segs.swiglu = swiglu;
  const int64_t tiles = segs.block_end[kMaxGemvSegments - 1];
  const bool vec_x = reinterpret_cast<uintptr_t>(l.x) % 16 == 0 && l.w[0]->cols % 4 == 0;
  const int variant = kernel_choice - 5;  // kernels 5..9
  using Kernel = void (*)(const float*, int64_t, int64_t, const CcSegments, int64_t, const GemvNorm,
                          const NormIn);
  constexpr int kVariants = 5;
  static_assert(kVariants == kQ4PairKernel - 5 && kQ4PairKernel == kQ4LastKernel,
                "one table entry per persistent kernel before the pair kernel");
  constexpr Kernel kKernels[2][kVariants] = {
      {gemv_q4_persist_kernel<false, 1, false>, gemv_q4_persist_kernel<false, 2, false>,
       gemv_q4_persist_kernel<false, 2, true>, gemv_q4_persist_sub_kernel<false, 2>,
       gemv_q4_persist_sub_kernel<false, 1>},
      {gemv_q4_persist_kernel<true, 1, false>, gemv_q4_persist_kernel<true, 2, false>,
       gemv_q4_persist_kernel<true, 2, true>, gemv_q4_persist_sub_kernel<true, 2>,
       gemv_q4_persist_sub_kernel<true, 1>}};
  constexpr Kernel kPairKernels[2] = {gemv_q4_persist_pair_kernel<false, 2>,
                                      gemv_q4_persist_pair_kernel<true, 2>};
  const Kernel kernel = pair ? kPairKernels[vec_x] : kKernels[vec_x][variant];
  static bool opted_in[2][kVariants + 1] = {};  // above 48 KiB: once per instantiation
  const int entry = pair ? kVariants : variant;
  if (!opted_in[vec_x][entry]) {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(smem_max)));
    opted_in[vec_x][entry] = true;
  }
  const int64_t items = pair ? pair_count(tiles, swiglu) : swiglu ? tiles / 2 : tiles;
  const int64_t grid = std::min<int64_t>(items, num_sms);
  launch(kernel, static_cast<unsigned>(grid), warps * 32, smem, l.stream, l.x, l.w[0]->cols, groups,
         segs, tiles, norm, nin);
  CUDA_CHECK_LAUNCH(l.stream);
  return true;
}

}  // namespace

namespace {

// The persistent kernel, or the CUDA-core kernel where it does not fit.
void run_persist(const CcLaunch& l, int num_sms) {
  if (!try_persist(l, num_sms, GemvNorm{})) run_cc(l, num_sms);
}

// Whether launch_gemv_q4 runs the persistent kernel for m rows.
bool uses_persist(int m) {
  const int kernel = g_q4_tuning.kernel != 0 ? g_q4_tuning.kernel : kQ4AutoKernel;
  return kernel >= 5 && kernel <= kQ4LastKernel && m == 1;
}

// Whether launch_gemv_q4 runs the CUDA-core kernel for m rows.
bool uses_cc(int m) {
  const int kernel = g_q4_tuning.kernel != 0 ? g_q4_tuning.kernel : kQ4AutoKernel;
  return m <= kCcMaxRows && (kernel == 2 || (kernel >= 4 && m <= kQ4CudaCoreAutoRows));
}

// Tiles of 16 rows per warp: wide tiles share each activation fragment between more weight
// rows (fewer instructions per code) but make fewer blocks; keep about a block per SM.
int auto_row_tiles(int64_t tiles, int num_sms) {
  if ((tiles + 3) / 4 >= 2 * int64_t{num_sms}) return 4;
  if ((tiles + 1) / 2 >= int64_t{num_sms} * 7 / 8) return 2;
  return 1;
}

// Warps splitting K: about 16 warps per SM in all, each with at least 2 groups.
int auto_warps(int64_t blocks, int64_t groups, int num_sms) {
  int warps = 1;
  while (warps < kQ4MaxWarps && warps * blocks < int64_t{num_sms} * 16 && warps * 2 <= groups) {
    warps *= 2;
  }
  return warps;
}

// Tiles per warp of the wide kernel: the widest (most rows sharing each activation fragment)
// that still gives every SM a block.
int wide_row_tiles(int64_t tiles, int nt, int num_sms) {
  if (nt == 1 && (tiles + 3) / 4 >= num_sms) return 4;
  if ((tiles + 1) / 2 >= num_sms) return 2;
  return 1;
}

void upload_async(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes > 0) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
}

void free_weight(DeviceWeight4& d) {
  if (d.codes) cudaFree(const_cast<uint8_t*>(d.codes));
  if (d.meta) cudaFree(const_cast<uint16_t*>(d.meta));
  d.codes = nullptr;
  d.meta = nullptr;
}

bool same_shape(const DeviceWeight4& d, const QuantizedWeight4& w) {
  return d.rows == w.rows && d.cols == w.cols && d.group_size == w.group_size;
}

}  // namespace

// ---- Weight4Cache -------------------------------------------------------------------------------

Weight4Cache::~Weight4Cache() {
  for (auto& [key, d] : map_) free_weight(d);  // no checks: may run during teardown
}

const DeviceWeight4& Weight4Cache::resolve(const QuantizedWeight4& w, cudaStream_t stream) {
  QS_CHECK(w.rows > 0 && w.cols > 0 && w.group_size > 0);
  const int64_t groups = (w.cols + w.group_size - 1) / w.group_size;
  const int64_t row_bytes = (w.cols + 1) / 2;
  QS_CHECK_MSG(w.groups_per_row == groups && w.row_bytes == row_bytes &&
                   static_cast<int64_t>(w.codes.size()) == w.rows * row_bytes &&
                   static_cast<int64_t>(w.scale.size()) == w.rows * groups &&
                   static_cast<int64_t>(w.min.size()) == w.rows * groups,
               "matmul_q4: inconsistent QuantizedWeight4 " + w.name);
  const void* key = w.codes.data();
  auto it = map_.find(key);
  if (it != map_.end()) {
    if (same_shape(it->second, w)) return it->second;
    // Another weight at an address seen before: the old host memory was freed and reused.
    CUDA_CHECK(cudaStreamSynchronize(stream));
    bytes_ -= it->second.bytes;
    free_weight(it->second);
    map_.erase(it);
  }
  DeviceWeight4 d;
  d.rows = w.rows;
  d.cols = w.cols;
  d.group_size = w.group_size;
  d.groups = groups;
  d.row_bytes = row_bytes;
  d.tiled = w.group_size == kQ4TiledGroup;
  const size_t code_bytes = w.codes.size();
  const size_t meta_bytes = 2 * sizeof(uint16_t) * w.scale.size();
  if (!d.tiled) {
    void* codes = nullptr;
    void* meta = nullptr;
    CUDA_CHECK(cudaMalloc(&codes, code_bytes));
    CUDA_CHECK(cudaMalloc(&meta, meta_bytes));
    upload_async(codes, w.codes.data(), code_bytes, stream);
    upload_async(meta, w.scale.data(), meta_bytes / 2, stream);
    upload_async(static_cast<char*>(meta) + meta_bytes / 2, w.min.data(), meta_bytes / 2, stream);
    d.codes = static_cast<const uint8_t*>(codes);
    d.meta = static_cast<const uint16_t*>(meta);
    d.bytes = code_bytes + meta_bytes;
  } else {
    const int64_t tiles = (w.rows + 15) / 16;
    const int64_t pieces = tiles * groups * kPiecesPerTileGroup;
    const size_t tiled_code_bytes = sizeof(uint4) * static_cast<size_t>(pieces);
    const size_t tiled_meta_bytes =
        sizeof(uint2) * static_cast<size_t>(tiles * groups * kMetaPerTileGroup);
    void* codes = nullptr;
    void* meta = nullptr;
    CUDA_CHECK(cudaMalloc(&codes, tiled_code_bytes));
    CUDA_CHECK(cudaMalloc(&meta, tiled_meta_bytes));
    // The reference arrays in one temporary buffer: codes, then scale and min (256-B aligned).
    const size_t scale_at = (code_bytes + 255) & ~size_t{255};
    const size_t min_at = scale_at + meta_bytes / 2;
    void* staging = nullptr;
    CUDA_CHECK(cudaMalloc(&staging, min_at + meta_bytes / 2));
    char* st = static_cast<char*>(staging);
    upload_async(st, w.codes.data(), code_bytes, stream);
    upload_async(st + scale_at, w.scale.data(), meta_bytes / 2, stream);
    upload_async(st + min_at, w.min.data(), meta_bytes / 2, stream);
    constexpr int kThreads = 256;
    const int64_t blocks = (pieces + kThreads - 1) / kThreads;
    QS_CHECK(blocks <= 0x7fffffff);
    launch(repack_q4_kernel, static_cast<unsigned>(blocks), kThreads, 0, stream,
           reinterpret_cast<const uint8_t*>(st), row_bytes,
           reinterpret_cast<const uint16_t*>(st + scale_at),
           reinterpret_cast<const uint16_t*>(st + min_at), w.rows, w.cols, groups, tiles,
           static_cast<uint4*>(codes), static_cast<uint2*>(meta));
    CUDA_CHECK_LAUNCH(stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));  // the staging buffer is read by the repack
    CUDA_CHECK(cudaFree(staging));
    d.codes = static_cast<const uint8_t*>(codes);
    d.meta = static_cast<const uint16_t*>(meta);
    d.bytes = tiled_code_bytes + tiled_meta_bytes;
  }
  bytes_ += d.bytes;
  return map_.emplace(key, d).first->second;
}

void Weight4Cache::forget(const QuantizedWeight4& w) {
  auto it = map_.find(w.codes.data());
  if (it == map_.end()) return;
  bytes_ -= it->second.bytes;
  free_weight(it->second);
  map_.erase(it);
}

void Weight4Cache::release(cudaStream_t stream) {
  CUDA_CHECK(cudaStreamSynchronize(stream));
  for (auto& [key, d] : map_) {
    if (d.codes) CUDA_CHECK(cudaFree(const_cast<uint8_t*>(d.codes)));
    if (d.meta) CUDA_CHECK(cudaFree(const_cast<uint16_t*>(d.meta)));
  }
  map_.clear();
  bytes_ = 0;
}

// ---- launchers ----------------------------------------------------------------------------------

void set_q4_gemv_tuning(const Q4GemvTuning& tuning) {
  QS_CHECK(tuning.row_tiles == 0 || tuning.row_tiles == 1 || tuning.row_tiles == 2 ||
           tuning.row_tiles == 4);
  QS_CHECK(tuning.warps >= 0 && tuning.warps <= kQ4MaxWarps);
  QS_CHECK(tuning.stages == 0 || tuning.stages == 1 || tuning.stages == kRingStages);
  QS_CHECK(tuning.kernel >= 0 && tuning.kernel <= kQ4LastKernel);
  g_q4_tuning = tuning;
}

Q4GemvTuning q4_gemv_tuning() {
  return g_q4_tuning;
}

bool gemv_q4_group_supported(int m, const DeviceWeight4* const* ws, int count) {
  if (count < 1 || count > kMaxGemvSegments || m < 1 || !(uses_persist(m) || uses_cc(m))) {
    return false;
  }
  for (int i = 0; i < count; ++i) {
    const DeviceWeight4& w = *ws[i];
    if (!w.tiled || w.cols != ws[0]->cols || w.groups != ws[0]->groups ||
        w.group_size != ws[0]->group_size) {
      return false;
    }
  }
  return true;
}

void launch_gemv_q4_group(const float* x, int m, const DeviceWeight4* const* ws,
                          const DeviceBias* biases, float* const* ys, int count, int num_sms,
                          cudaStream_t stream) {
  QS_CHECK(gemv_q4_group_supported(m, ws, count));
  CcLaunch l{x, m, {}, {}, {}, count, 0, stream};
  for (int i = 0; i < count; ++i) {
    l.w[i] = ws[i];
    l.bias[i] = biases[i];
    l.y[i] = ys[i];
  }
  uses_persist(m) ? run_persist(l, num_sms) : run_cc(l, num_sms);
}

bool launch_gemv_q4_norm(const float* x, int m, const DeviceWeight4& w, const DeviceBias& bias,
                         const GemvNorm& norm, int num_sms, cudaStream_t stream) {
  QS_CHECK(norm.h != nullptr &&
           (norm.sumsq != nullptr ? m == 1 && norm.parts >= num_sms
                                  : norm.out != nullptr && norm.arrivals != nullptr));
  QS_CHECK(norm.m == m && norm.d == w.rows);
  if (!w.tiled || !uses_persist(m)) return false;
  return try_persist(CcLaunch{x, m, {&w}, {bias}, {nullptr}, 1, 0, stream}, num_sms, norm);
}

bool launch_gemv_q4_swiglu(const float* x, int m, const DeviceWeight4& gate,
                           const DeviceWeight4& up, const DeviceBias& gate_bias,
                           const DeviceBias& up_bias, float* out, int num_sms, cudaStream_t stream,
                           const NormIn& nin) {
  QS_CHECK(out != nullptr && gate.rows == up.rows);
  const DeviceWeight4* ws[2] = {&gate, &up};
  if (!uses_persist(m) || !gemv_q4_group_supported(m, ws, 2)) return false;
  return try_persist(
      CcLaunch{x, m, {&gate, &up}, {gate_bias, up_bias}, {out, nullptr}, 2, 0, stream}, num_sms,
      GemvNorm{}, true, nin);
}

namespace {
std::atomic<uint64_t> g_q4_qkv_rows_launches{0};
}  // namespace

bool launch_gemv_q4_qkv_rows(const float* h, const DeviceWeight4* const* ws,
                             const DeviceBias* biases, float* const* ys, const NormIn& nin,
                             const KvRowEpilogue& rows, int num_sms, cudaStream_t stream) {
  const int kernel_choice = g_q4_tuning.kernel != 0 ? g_q4_tuning.kernel : kQ4AutoKernel;
  const int hd = rows.head_dim;
  if (!g_q4_tuning.qkv_rows || kernel_choice != kQ4PairKernel || nin.sumsq == nullptr ||
      rows.k_dst == nullptr || rows.v_dst == nullptr || !gemv_q4_group_supported(1, ws, 3) ||
      hd <= 0 || hd % 32 != 0 || hd / 2 > kMaxRopePairs || ws[0]->rows % hd != 0 ||
      ws[1]->rows % hd != 0 || ws[2]->rows != ws[1]->rows) {
    return false;
  }
  const int64_t groups = ws[0]->groups;
  const int warps = static_cast<int>(std::clamp<int64_t>(groups, 1, kPMaxWarps));
  // The kernel's bytes, then the cos and sin of a head's hd / 2 rotations (fill_rope_table).
  const size_t smem = persist_pair_smem_bytes(warps, groups) + size_t(hd / 2) * sizeof(float2);
  const size_t smem_max = max_smem_per_block();
  if (smem > smem_max) return false;
  CcLaunch l{h, 1, {}, {}, {}, 3, 0, stream};
  for (int i = 0; i < 3; ++i) {
    l.w[i] = ws[i];
    l.bias[i] = biases[i];
    l.y[i] = ys[i];
  }
  const CcSegments segs = cc_segments(l, 1);  // block_end: tiles
  const int64_t tiles = segs.block_end[kMaxGemvSegments - 1];
  const RopePairs rp{hd / 16, ws[0]->rows / 32, ws[1]->rows / 32, (ws[2]->rows + 15) / 16};
  const bool vec_x = reinterpret_cast<uintptr_t>(h) % 16 == 0 && ws[0]->cols % 4 == 0;
  auto* kernel = vec_x ? gemv_q4_pair_rope_kernel<true, 2> : gemv_q4_pair_rope_kernel<false, 2>;
  static bool opted_in[2] = {};  // above 48 KiB: once per instantiation
  if (!opted_in[vec_x]) {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(smem_max)));
    opted_in[vec_x] = true;
  }
  const int64_t grid = std::min<int64_t>(rope_pair_count(rp), num_sms);
  launch(kernel, static_cast<unsigned>(grid), warps * 32, smem, stream, h, ws[0]->cols, groups,
         segs, tiles, nin, rp, rows);
  CUDA_CHECK_LAUNCH(stream);
  ++g_q4_qkv_rows_launches;
  return true;
}

uint64_t gemv_q4_qkv_rows_launches() {
  return g_q4_qkv_rows_launches.load();
}

bool launch_gemv_q4_group_normed(const float* h, int m, const DeviceWeight4* const* ws,
                                 const DeviceBias* biases, float* const* ys, int count,
                                 const NormIn& nin, int num_sms, cudaStream_t stream) {
  QS_CHECK(nin.sumsq != nullptr);
  if (!uses_persist(m) || !gemv_q4_group_supported(m, ws, count)) return false;
  CcLaunch l{h, m, {}, {}, {}, count, 0, stream};
  for (int i = 0; i < count; ++i) {
    l.w[i] = ws[i];
    l.bias[i] = biases[i];
    l.y[i] = ys[i];
  }
  return try_persist(l, num_sms, GemvNorm{}, false, nin);
}

void launch_gemv_q4(const float* x, int m, const DeviceWeight4& w, const DeviceBias& bias, float* y,
                    int num_sms, cudaStream_t stream) {
  QS_CHECK(m >= 1 && m <= kMaxRows && w.rows >= 1 && w.cols >= 1 && w.codes && w.meta);
  if (!w.tiled) {
    const int64_t blocks = (w.rows + kSimtWarps - 1) / kSimtWarps;
    QS_CHECK(blocks <= 0x7fffffff);
    const uint16_t* scale = w.meta;
    const uint16_t* mins = w.meta + w.rows * w.groups;
    launch(gemv_q4_simt_kernel, static_cast<unsigned>(blocks), kSimtWarps * 32, 0, stream, x, m,
           w.cols, w.codes, w.row_bytes, scale, mins, w.groups, w.group_size, w.rows, bias, y);
    CUDA_CHECK_LAUNCH(stream);
    return;
  }
  const bool vec_x = reinterpret_cast<uintptr_t>(x) % 16 == 0 && w.cols % 4 == 0;
  const int kernel = g_q4_tuning.kernel != 0 ? g_q4_tuning.kernel : kQ4AutoKernel;
  const int64_t tiles = (w.rows + 15) / 16;
  const int nt = m <= 8 ? 1 : 2;
  if (kernel == 3) {
    int rt = g_q4_tuning.row_tiles > 0 ? g_q4_tuning.row_tiles : wide_row_tiles(tiles, nt, num_sms);
    if (nt == 2 && rt == 4) rt = 2;  // registers: no 4 x 2 variant
    const TiledLaunch l{x, m, &w, bias, y, g_q4_tuning.warps, stream};  // 0: automatic
    if (nt == 1) {
      vec_x ? launch_wide_rt<1, true>(rt, l, num_sms) : launch_wide_rt<1, false>(rt, l, num_sms);
    } else {
      vec_x ? launch_wide_rt<2, true>(rt, l, num_sms) : launch_wide_rt<2, false>(rt, l, num_sms);
    }
    return;
  }
  if (uses_persist(m)) {
    run_persist(CcLaunch{x, m, {&w}, {bias}, {y}, 1, 0, stream}, num_sms);
    return;
  }
  if (uses_cc(m)) {
    run_cc(CcLaunch{x, m, {&w}, {bias}, {y}, 1, 0, stream}, num_sms);
    return;
  }
  int rt = g_q4_tuning.row_tiles > 0 ? g_q4_tuning.row_tiles : auto_row_tiles(tiles, num_sms);
  if (nt == 2 && rt == 4) rt = 2;  // registers: no 4 x 2 variant
  const int64_t blocks = (tiles + rt - 1) / rt;
  const int warps = g_q4_tuning.warps > 0
                        ? static_cast<int>(std::min<int64_t>(g_q4_tuning.warps, w.groups))
                        : auto_warps(blocks, w.groups, num_sms);
  const TiledLaunch l{x, m, &w, bias, y, warps, stream};
  const int stages = g_q4_tuning.stages == kRingStages ? kRingStages : 0;
  if (nt == 1) {
    if (vec_x) {
      launch_tiled_stages<1, true>(rt, stages, l);
    } else {
      launch_tiled_stages<1, false>(rt, stages, l);
    }
  } else {
    if (vec_x) {
      launch_tiled_stages<2, true>(rt, stages, l);
    } else {
      launch_tiled_stages<2, false>(rt, stages, l);
    }
  }
}

}  // namespace qs::cuda
