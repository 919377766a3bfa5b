// Tensor-core flash-attention prefill (flash-attention-2 style) at about f32 accuracy.
//
// Operands. mma.sync m16n8k16 takes f16 inputs; every f32 operand x is split into hi = f16(x)
// and lo = f16(x - hi), and each product runs as three MMAs into one f32 accumulator:
// lo*hi + hi*lo + hi*hi (lo*lo, ~2^-22 relative, is dropped). f16 rather than bf16 because
// hi + lo then carries 22 significant bits (bf16: 16, ~1.5e-5 relative per product, too coarse
// for the f32 tests), at the price of f16's narrow exponent range; powers of two keep every
// operand inside it, so lo stays a normal f16 for all but the smallest elements of a group:
//  - Q: each query row is scaled by 2^fq so that its largest |q * scale_log2| lies in
//    [2^13, 2^14) (hi never overflows, lo of the large elements stays normal).
//  - K and V: a conversion pass splits the rows (f32, or f16 converted to f32 on load) into
//    hi/lo planes in tiles of 64 keys per kv head; a tile's K (resp. V) is scaled by 2^ek (2^ev)
//    that puts its largest |k| (|v|) in [2^13, 2^14). Exponents are clamped to [-30, 30]
//    (|x| < 2^44 stays finite; tiles below 2^-17 keep absolute accuracy only).
//  - Scores: the S accumulator holds 2^(fq + ek) S; one multiply by 2^-(fq + ek) per element
//    restores base-2 scores exactly.
//  - P = exp2(s - max) in [0, 1] is scaled by 2^12 before splitting (lo normal for p >= 2^-15).
//    The O accumulator is kept in units of 2^(12 + ev) of the current tile: when the next tile
//    has another ev, the online-softmax rescale of O (by corr) also takes 2^(ev_new - ev_old),
//    so the change costs nothing. The end divides by 2^(12 + ev_last) (exact).
//
// Kernel. A block of 8 warps owns 128 query rows of one query head (16 rows per warp, Q hi/lo
// fragments in registers) and one KV split; it streams 64-key tiles of the hi/lo planes through
// shared memory with cp.async double buffering (row pitch head_dim + 8 halves: the 8 rows of an
// ldmatrix hit 8 distinct 16-byte bank groups). S = Q K^T: K planes via ldmatrix (keys are the
// B operand's n, dims its k, which is K's row-major layout). Online softmax in f32 on the S
// fragments (a quad of lanes shares a row). O += P V: the S accumulator layout is the A-fragment
// layout of P, so P never leaves registers; V planes via ldmatrix.trans. Causal and split
// masking only in tiles that need it. GQA-native: K/V of kv head head / group, never repeated.
// Query tiles run latest first (the longest causal ranges start first).
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/attention_prefill_tc.h"
#include "backend/cuda/attention_prefill_wgmma.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/env_switch.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/prefill_q.cuh"

namespace qs::cuda {

namespace {

constexpr float kNegInf = -INFINITY;
constexpr int kTcKeys = 64;                // keys per K/V tile (and per conversion tile)
constexpr int kTcWarps = 8;                // 16 query rows each
constexpr int kTcThreads = kTcWarps * 32;  // attention kernel
constexpr int kTcRows = kTcWarps * 16;     // query rows per block
constexpr int kKeyTiles = kTcKeys / 8;     // S n-tiles per warp
constexpr int kPlanes = 4;                 // K hi, K lo, V hi, V lo
constexpr int kConvThreads = 256;          // conversion kernel
constexpr int kPExp = 12;                  // P is split as p * 2^12
constexpr float kPScale = 4096.0f;

// QS_PREFILL_DIRECT=0|1 starts the process without / with PrefillAttentionTuning::direct_f16
// (end-to-end A/B runs without a rebuild); QS_PREFILL_WGMMA and QS_PREFILL_WS likewise for
// wgmma and wgmma_ws (all three on by default).
PrefillAttentionTuning g_tuning = [] {
  PrefillAttentionTuning t;
  t.direct_f16 = env_flag("QS_PREFILL_DIRECT", t.direct_f16);
  t.wgmma = env_flag("QS_PREFILL_WGMMA", t.wgmma);
  t.wgmma_ws = env_flag("QS_PREFILL_WS", t.wgmma_ws);
  return t;
}();

__device__ __forceinline__ float max_abs4(float4 v) {
  return fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
}

// ---- conversion kernel ----------------------------------------------------------------------

// Where the planes of (kv head, tile) start: 4 planes of [64 keys][HD] halves, in kPlanes order.
template <int HD>
__host__ __device__ __forceinline__ int64_t chunk_offset(int kvh, int tile, int num_tiles) {
  return (static_cast<int64_t>(kvh) * num_tiles + tile) * kPlanes * kTcKeys * HD;
}

// Grid: x = tile of 64 keys, y = kv head. Keys at or past kv_end become zeros (finite V rows
// for the masked keys of the last tile). exps[kvh * num_tiles + tile] = {ek, ev}. T: the row
// type (float or __half; f16 rows are converted to f32 first, then split like f32 rows).
template <int HD, typename T>
__global__ void __launch_bounds__(kConvThreads)
    prefill_tc_convert_kernel(const T* __restrict__ k, const T* __restrict__ v, int64_t row_stride,
                              int kv_end, int num_tiles, __half* __restrict__ planes,
                              int2* __restrict__ exps) {
  pdl_begin();
  constexpr int kC4 = HD / 4;                         // float4 per row
  constexpr int kPer = kTcKeys * kC4 / kConvThreads;  // float4 per thread and plane
  static_assert(kTcKeys * kC4 % kConvThreads == 0, "tile must split evenly over threads");
  __shared__ float red[2][kConvThreads / 32];
  const int tile = blockIdx.x, kvh = blockIdx.y;
  const T* k_head = k + static_cast<int64_t>(kvh) * HD;
  const T* v_head = v + static_cast<int64_t>(kvh) * HD;

  float4 kr[kPer], vr[kPer];
  float kmax = 0.0f, vmax = 0.0f;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int e = threadIdx.x + j * kConvThreads;
    const int r = e / kC4, c4 = e % kC4;
    const int t = tile * kTcKeys + r;
    kr[j] = vr[j] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (t < kv_end) {
      const int64_t off = t * row_stride + 4 * c4;
      kr[j] = load4_kv(k_head + off);
      vr[j] = load4_kv(v_head + off);
    }
    kmax = fmaxf(kmax, max_abs4(kr[j]));
    vmax = fmaxf(vmax, max_abs4(vr[j]));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    kmax = fmaxf(kmax, __shfl_xor_sync(kFullMask, kmax, o));
    vmax = fmaxf(vmax, __shfl_xor_sync(kFullMask, vmax, o));
  }
  if (threadIdx.x % 32 == 0) {
    red[0][threadIdx.x / 32] = kmax;
    red[1][threadIdx.x / 32] = vmax;
  }
  __syncthreads();
  kmax = vmax = 0.0f;
#pragma unroll
  for (int w = 0; w < kConvThreads / 32; ++w) {
    kmax = fmaxf(kmax, red[0][w]);
    vmax = fmaxf(vmax, red[1][w]);
  }
  const int ek = scale_exponent(kmax), ev = scale_exponent(vmax);
  const float fk = exp2i(ek), fv = exp2i(ev);

  __half* chunk = planes + chunk_offset<HD>(kvh, tile, num_tiles);
  constexpr int kPlane = kTcKeys * HD;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int e = threadIdx.x + j * kConvThreads;
    const int idx = (e / kC4) * HD + 4 * (e % kC4);
    uint2 hi, lo;
    split_f16x2(kr[j].x * fk, kr[j].y * fk, hi.x, lo.x);
    split_f16x2(kr[j].z * fk, kr[j].w * fk, hi.y, lo.y);
    *reinterpret_cast<uint2*>(chunk + idx) = hi;
    *reinterpret_cast<uint2*>(chunk + kPlane + idx) = lo;
    split_f16x2(vr[j].x * fv, vr[j].y * fv, hi.x, lo.x);
    split_f16x2(vr[j].z * fv, vr[j].w * fv, hi.y, lo.y);
    *reinterpret_cast<uint2*>(chunk + 2 * kPlane + idx) = hi;
    *reinterpret_cast<uint2*>(chunk + 3 * kPlane + idx) = lo;
  }
  if (threadIdx.x == 0) exps[static_cast<int64_t>(kvh) * num_tiles + tile] = make_int2(ek, ev);
}

// ---- attention kernel -----------------------------------------------------------------------

template <int HD>
struct TcLayout {
  static constexpr int kLds = HD + 8;  // halves per smem row (16-byte pad)
  static constexpr int kPlaneHalves = kTcKeys * kLds;
  static constexpr int kStageHalves = kPlanes * kPlaneHalves;
  static constexpr size_t kSmemBytes = size_t{2} * kStageHalves * sizeof(__half);
  static constexpr int kKSteps = HD / 16;   // k-steps of Q K^T
  static constexpr int kDimTiles = HD / 8;  // n-tiles of P V
};

// Grid: x = query tile (reversed), y = query head, z = KV split. Warp w owns block rows
// [16 w, 16 w + 16); lane (g = lane / 4, t = lane % 4) holds rows 16 w + g and + 8 of every
// fragment (m16n8k16 layouts: A a0 (g, 2t..), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..);
// B b0 (k 2t.., n g), b1 (k 2t+8.., n g); C c0 c1 (g, 2t..), c2 c3 (g+8, 2t..)).
// DIRECT (f16 rows, PrefillAttentionTuning::direct_f16): the K/V tiles come straight from the
// rows (keys past pos + m as zeros) with ek = ev = 0 instead of from the conversion pass's
// planes. An f16 row is its own hi half with a zero lo half, and the planes' power-of-two tile
// scale changes neither the products nor, once undone, the scores and O; so the exact path drops
// its K lo and V lo products (zeros) and both paths give the converted results (test
// F16RowsPrefillDirectEqualsConverted).
template <int HD, bool EXACT, bool DIRECT>
__global__ void __launch_bounds__(kTcThreads, 1)
    attention_prefill_tc_kernel(AttentionArgs a, const __half* __restrict__ planes,
                                const int2* __restrict__ exps, int num_tiles) {
  pdl_begin();
  using L = TcLayout<HD>;
  constexpr int KS = L::kKSteps, DT = L::kDimTiles, LDS = L::kLds;
  extern __shared__ float4 smem4[];
  __half* smem = reinterpret_cast<__half*>(smem4);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
  const int r0 = (gridDim.x - 1 - blockIdx.x) * kTcRows;
  const int rows = min(kTcRows, a.m - r0);
  const int head = blockIdx.y;
  const int kvh = head / (a.num_heads / a.num_kv_heads);
  const int split = blockIdx.z;
  const int row_a = 16 * warp + g, row_b = row_a + 8;  // block rows of this lane

  // Q fragments: q * scale_log2 * 2^fq (fq per row), split into hi/lo (prefill_q.cuh).
  uint32_t qhi[KS][4], qlo[KS][4];
  int q_exp[2];
  load_q_fragments<HD, true>(a, r0, rows, head, row_a, t4, qhi, qlo, q_exp);

  // Keys of this block: [t_begin, t_end), the causal end of its last row cut to the split.
  const int t_begin = split * a.split_len;
  const int t_end = min(a.pos + r0 + rows, t_begin + a.split_len);
  const int kt_first = t_begin / kTcKeys;
  const int kt_end = t_end > t_begin ? (t_end - 1) / kTcKeys + 1 : kt_first;
  const int qpos_a = a.pos + r0 + row_a, qpos_b = qpos_a + 8;
  const int qpos_min = a.pos + r0;  // the block's first row: keys <= this are visible to all

  float o[DT][4];
#pragma unroll
  for (int d = 0; d < DT; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
  float m_run[2] = {kNegInf, kNegInf};
  float l_run[2] = {0.0f, 0.0f};  // this lane's share of the row sums (its keys)
  int ev_prev = 0;                // O is kept in units of 2^(kPExp + ev_prev)

  auto load_tile = [&](int kt, int stage) {
    __half* dst = smem + stage * L::kStageHalves;
    constexpr int kRowPieces = HD / 8;  // 16-byte pieces per row
    constexpr int kPieces = kPlanes * kTcKeys * kRowPieces;
    static_assert(kPieces % kTcThreads == 0, "pieces must split evenly over threads");
    if constexpr (DIRECT) {
      const int kv_end = a.pos + a.m;
      const __half* k_rows = static_cast<const __half*>(a.k) + static_cast<int64_t>(kvh) * HD;
      const __half* v_rows = static_cast<const __half*>(a.v) + static_cast<int64_t>(kvh) * HD;
#pragma unroll
      for (int i = tid; i < kPieces / 2; i += kTcThreads) {  // K hi, then V hi
        const int row = i / kRowPieces, c = i % kRowPieces;  // row over the 2 planes
        const int key = kt * kTcKeys + row % kTcKeys;
        const bool valid = key < kv_end;
        const int64_t off = static_cast<int64_t>(valid ? key : 0) * a.row_stride + 8 * c;
        const int plane = row / kTcKeys == 0 ? 0 : 2;  // the hi planes' slots
        cp_async16_zfill(smem_u32(dst + (plane * kTcKeys + row % kTcKeys) * LDS + 8 * c),
                         (plane == 0 ? k_rows : v_rows) + off, valid ? 16 : 0);
      }
    } else {
      const __half* chunk = planes + chunk_offset<HD>(kvh, kt, num_tiles);
#pragma unroll
      for (int i = tid; i < kPieces; i += kTcThreads) {
        const int row = i / kRowPieces, c = i % kRowPieces;  // row over the 4 stacked planes
        if (!EXACT && (row / kTcKeys) % 2 == 1) continue;    // a lo plane: not read
        cp_async16(smem_u32(dst + row * LDS + 8 * c), chunk + row * HD + 8 * c);
      }
    }
    cp_async_commit();
  };

  if (kt_first < kt_end) load_tile(kt_first, 0);
  for (int kt = kt_first; kt < kt_end; ++kt) {
    const int stage = (kt - kt_first) & 1;
    if (kt + 1 < kt_end) {
      load_tile(kt + 1, stage ^ 1);  // its stage was released by the last __syncthreads
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // tile kt is in shared memory for every thread
    const __half* kh_s = smem + stage * L::kStageHalves;
    const __half* kl_s = kh_s + L::kPlaneHalves;
    const __half* vh_s = kh_s + 2 * L::kPlaneHalves;
    const __half* vl_s = kh_s + 3 * L::kPlaneHalves;
    const int2 ex =
        DIRECT ? make_int2(0, 0) : __ldg(exps + static_cast<int64_t>(kvh) * num_tiles + kt);

    // S = Q K^T for 16 rows x 64 keys. ldmatrix x4 matrices: (keys +0..7, dims +0..7),
    // (+0..7, +8..15), (+8..15, +0..7), (+8..15, +8..15) = b0, b1 of n-tile 2np, then 2np + 1.
    float s[kKeyTiles][4];
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
    const int k_lane_off = ((lane & 7) + ((lane >> 4) << 3)) * LDS + ((lane >> 3) & 1) * 8;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
#pragma unroll
      for (int np = 0; np < kKeyTiles / 2; ++np) {
        const int off = 16 * np * LDS + 16 * ks + k_lane_off;
        uint32_t bh[4];
        ldmatrix_x4(bh, kh_s + off);
        if constexpr (EXACT) {
          uint32_t bl[4];
          if constexpr (!DIRECT) ldmatrix_x4(bl, kl_s + off);
          mma_f16(s[2 * np], qlo[ks], bh[0], bh[1]);
          if constexpr (!DIRECT) mma_f16(s[2 * np], qhi[ks], bl[0], bl[1]);
          mma_f16(s[2 * np + 1], qlo[ks], bh[2], bh[3]);
          if constexpr (!DIRECT) mma_f16(s[2 * np + 1], qhi[ks], bl[2], bl[3]);
        }
        mma_f16(s[2 * np], qhi[ks], bh[0], bh[1]);
        mma_f16(s[2 * np + 1], qhi[ks], bh[2], bh[3]);
      }
    }

    // Online softmax on rows a (c0, c1) and b (c2, c3); a row's 64 keys live in its quad.
    const float f_a = exp2i(-(q_exp[0] + ex.x)), f_b = exp2i(-(q_exp[1] + ex.x));
    const int key0 = kt * kTcKeys;
    const bool need_mask =
        key0 < t_begin || key0 + kTcKeys > t_end || key0 + kTcKeys - 1 > qpos_min;
    float mx_a = kNegInf, mx_b = kNegInf;
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float val = s[n][e] * (e < 2 ? f_a : f_b);
        if (need_mask) {
          const int key = key0 + 8 * n + 2 * t4 + (e & 1);
          if (key < t_begin || key >= t_end || key > (e < 2 ? qpos_a : qpos_b)) val = kNegInf;
        }
        s[n][e] = val;
        if (e < 2) {
          mx_a = fmaxf(mx_a, val);
        } else {
          mx_b = fmaxf(mx_b, val);
        }
      }
    }
    mx_a = fmaxf(mx_a, __shfl_xor_sync(kFullMask, mx_a, 1));
    mx_a = fmaxf(mx_a, __shfl_xor_sync(kFullMask, mx_a, 2));
    mx_b = fmaxf(mx_b, __shfl_xor_sync(kFullMask, mx_b, 1));
    mx_b = fmaxf(mx_b, __shfl_xor_sync(kFullMask, mx_b, 2));
    const float mnew_a = fmaxf(m_run[0], mx_a), mnew_b = fmaxf(m_run[1], mx_b);
    // A row with nothing visible yet keeps m = -inf; subtracting 0 keeps its p = 0 (no NaN).
    const float muse_a = mnew_a == kNegInf ? 0.0f : mnew_a;
    const float muse_b = mnew_b == kNegInf ? 0.0f : mnew_b;
    const float corr_a = exp2f(m_run[0] - muse_a), corr_b = exp2f(m_run[1] - muse_b);
    m_run[0] = mnew_a;
    m_run[1] = mnew_b;
    float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n) {
      s[n][0] = exp2f(s[n][0] - muse_a);
      s[n][1] = exp2f(s[n][1] - muse_a);
      s[n][2] = exp2f(s[n][2] - muse_b);
      s[n][3] = exp2f(s[n][3] - muse_b);
      sum_a += s[n][0] + s[n][1];
      sum_b += s[n][2] + s[n][3];
    }
    l_run[0] = l_run[0] * corr_a + sum_a;
    l_run[1] = l_run[1] * corr_b + sum_b;
    const float unit = exp2i(ex.y - ev_prev);  // O changes units to this tile's V scale
    ev_prev = ex.y;
    const float oc_a = corr_a * unit, oc_b = corr_b * unit;
#pragma unroll
    for (int d = 0; d < DT; ++d) {
      o[d][0] *= oc_a, o[d][1] *= oc_a;
      o[d][2] *= oc_b, o[d][3] *= oc_b;
    }

    // O += P V. P's A fragment of k-step kk (keys 16 kk..+15) is S n-tiles 2kk and 2kk + 1.
    // ldmatrix x4.trans matrices: (keys +0..7, dims +0..7), (+8..15, +0..7), (+0..7, +8..15),
    // (+8..15, +8..15) = b0, b1 of dim n-tile 2dp, then 2dp + 1.
    const int v_lane_off = ((lane & 7) + ((lane >> 3) & 1) * 8) * LDS + (lane >> 4) * 8;
#pragma unroll
    for (int kk = 0; kk < kKeyTiles / 2; ++kk) {
      uint32_t ph[4], pl[4];
      split_f16x2(s[2 * kk][0] * kPScale, s[2 * kk][1] * kPScale, ph[0], pl[0]);
      split_f16x2(s[2 * kk][2] * kPScale, s[2 * kk][3] * kPScale, ph[1], pl[1]);
      split_f16x2(s[2 * kk + 1][0] * kPScale, s[2 * kk + 1][1] * kPScale, ph[2], pl[2]);
      split_f16x2(s[2 * kk + 1][2] * kPScale, s[2 * kk + 1][3] * kPScale, ph[3], pl[3]);
#pragma unroll
      for (int dp = 0; dp < DT / 2; ++dp) {
        const int off = 16 * kk * LDS + 16 * dp + v_lane_off;
        uint32_t bh[4];
        ldmatrix_x4_trans(bh, vh_s + off);
        if constexpr (EXACT) {
          uint32_t bl[4];
          if constexpr (!DIRECT) ldmatrix_x4_trans(bl, vl_s + off);
          mma_f16(o[2 * dp], pl, bh[0], bh[1]);
          if constexpr (!DIRECT) mma_f16(o[2 * dp], ph, bl[0], bl[1]);
          mma_f16(o[2 * dp + 1], pl, bh[2], bh[3]);
          if constexpr (!DIRECT) mma_f16(o[2 * dp + 1], ph, bl[2], bl[3]);
        }
        mma_f16(o[2 * dp], ph, bh[0], bh[1]);
        mma_f16(o[2 * dp + 1], ph, bh[2], bh[3]);
      }
    }
    __syncthreads();  // every warp is done with this stage before it is refilled
  }

  // Row sums over the quad; O back to true units.
  const float to_true = exp2i(-(kPExp + ev_prev));
  const int64_t num_qv = static_cast<int64_t>(a.m) * a.num_heads;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = l_run[h];
    l += __shfl_xor_sync(kFullMask, l, 1);
    l += __shfl_xor_sync(kFullMask, l, 2);
    const int row = h == 0 ? row_a : row_b;
    if (row >= rows) continue;
    const int64_t qi = static_cast<int64_t>(r0 + row) * a.num_heads + head;
    if (a.num_splits == 1) {
      const float inv = to_true / l;
      float* dst = a.out + qi * HD + 2 * t4;
#pragma unroll
      for (int d = 0; d < DT; ++d) {
        *reinterpret_cast<float2*>(dst + 8 * d) =
            make_float2(o[d][2 * h] * inv, o[d][2 * h + 1] * inv);
      }
    } else {
      const int64_t slot = static_cast<int64_t>(split) * num_qv + qi;
      float* dst = a.partial_o + slot * HD + 2 * t4;
#pragma unroll
      for (int d = 0; d < DT; ++d) {
        *reinterpret_cast<float2*>(dst + 8 * d) =
            make_float2(o[d][2 * h] * to_true, o[d][2 * h + 1] * to_true);
      }
      if (t4 == 0) {
        a.partial_ml[slot * 2] = m_run[h];
        a.partial_ml[slot * 2 + 1] = l;
      }
    }
  }
}

// ---- launch helpers -------------------------------------------------------------------------

int num_key_tiles(const AttentionArgs& a) {
  return (a.pos + a.m + kTcKeys - 1) / kTcKeys;
}

// Whether a call takes the kernel's DIRECT path: f16 rows, 16-byte aligned rows.
bool direct_path(const AttentionArgs& a) {
  const uintptr_t bits = reinterpret_cast<uintptr_t>(a.k) | reinterpret_cast<uintptr_t>(a.v);
  return g_tuning.direct_f16 && a.kv_dtype == DType::F16 && a.row_stride % 8 == 0 && bits % 16 == 0;
}

size_t planes_bytes(const AttentionArgs& a) {
  return static_cast<size_t>(a.num_kv_heads) * num_key_tiles(a) * kPlanes * kTcKeys * a.head_dim *
         sizeof(__half);
}

void check_tc_args(const AttentionArgs& a, const void* scratch) {
  QS_CHECK(a.m >= 1 && a.pos >= 0);
  QS_CHECK_MSG(!a.selected, "attention_prefill_tc: a KV selection runs through the decode kernel");
  QS_CHECK(a.num_kv_heads >= 1 && a.num_heads % a.num_kv_heads == 0);
  QS_CHECK_MSG(attention_prefill_tc_supported(a), "attention_prefill_tc: unsupported head_dim");
  QS_CHECK(a.num_heads <= 65535 && a.num_kv_heads <= 65535);
  QS_CHECK_MSG(a.kv_dtype == DType::F32 || a.kv_dtype == DType::F16,
               "attention: KV rows are F32 or F16");
  QS_CHECK(a.row_stride >= static_cast<int64_t>(a.num_kv_heads) * a.head_dim);
  QS_CHECK_MSG(a.row_stride % 4 == 0, "attention: KV row stride must be a multiple of 4 elements");
  const uintptr_t bits = reinterpret_cast<uintptr_t>(a.q) | reinterpret_cast<uintptr_t>(a.out) |
                         reinterpret_cast<uintptr_t>(scratch);
  QS_CHECK_MSG(bits % 16 == 0, "attention: q, out and scratch must be 16-byte aligned");
  const uintptr_t kv_bits = reinterpret_cast<uintptr_t>(a.k) | reinterpret_cast<uintptr_t>(a.v);
  QS_CHECK_MSG(kv_bits % (4 * dtype_size(a.kv_dtype)) == 0,
               "attention: k and v must be aligned to 4 elements");
  QS_CHECK(a.num_splits >= 1 && a.num_splits <= 65535);
  QS_CHECK(a.split_len >= 1);
  QS_CHECK(static_cast<int64_t>(a.num_splits) * a.split_len >= a.pos + a.m);
  QS_CHECK(a.num_splits == 1 || (a.partial_o != nullptr && a.partial_ml != nullptr));
  QS_CHECK(a.pos + static_cast<int64_t>(a.m) + kTcKeys < (int64_t{1} << 31));
}

template <int HD, bool EXACT, bool DIRECT>
void launch_for_head_dim(const AttentionArgs& a, void* scratch, cudaStream_t stream) {
  const int num_tiles = num_key_tiles(a);
  auto* planes = static_cast<__half*>(scratch);
  auto* exps =
      DIRECT ? nullptr : reinterpret_cast<int2*>(static_cast<char*>(scratch) + planes_bytes(a));
  const dim3 conv_grid(num_tiles, a.num_kv_heads);
  if (DIRECT) {
    // no conversion: the kernel reads the f16 rows
  } else if (a.kv_dtype == DType::F16) {
    launch(prefill_tc_convert_kernel<HD, __half>, conv_grid, kConvThreads, 0, stream,
           static_cast<const __half*>(a.k), static_cast<const __half*>(a.v), a.row_stride,
           a.pos + a.m, num_tiles, planes, exps);
  } else {
    launch(prefill_tc_convert_kernel<HD, float>, conv_grid, kConvThreads, 0, stream,
           static_cast<const float*>(a.k), static_cast<const float*>(a.v), a.row_stride,
           a.pos + a.m, num_tiles, planes, exps);
  }
  if (!DIRECT) CUDA_CHECK_LAUNCH(stream);

  constexpr size_t smem = TcLayout<HD>::kSmemBytes;
  static const bool configured = [] {
    CUDA_CHECK(cudaFuncSetAttribute(attention_prefill_tc_kernel<HD, EXACT, DIRECT>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(smem)));
    return true;
  }();
  (void)configured;
  const dim3 grid(attention_prefill_tc_query_tiles(a), a.num_heads, a.num_splits);
  launch(attention_prefill_tc_kernel<HD, EXACT, DIRECT>, grid, kTcThreads, smem, stream, a, planes,
         exps, num_tiles);
  CUDA_CHECK_LAUNCH(stream);
}

template <int HD>
void launch_for_head_dim(const AttentionArgs& a, void* scratch, cudaStream_t stream, bool exact) {
  if (direct_path(a) && g_tuning.wgmma && attention_prefill_wgmma_supported(a, exact)) {
    launch_attention_prefill_wgmma(a, stream, exact, g_tuning.wgmma_ws);
  } else if (direct_path(a)) {
    exact ? launch_for_head_dim<HD, true, true>(a, scratch, stream)
          : launch_for_head_dim<HD, false, true>(a, scratch, stream);
  } else {
    exact ? launch_for_head_dim<HD, true, false>(a, scratch, stream)
          : launch_for_head_dim<HD, false, false>(a, scratch, stream);
  }
}

}  // namespace

// ---- launchers ------------------------------------------------------------------------------

void set_prefill_attention_tuning(const PrefillAttentionTuning& tuning) {
  g_tuning = tuning;
}

PrefillAttentionTuning prefill_attention_tuning() {
  return g_tuning;
}

bool attention_prefill_tc_supported(const AttentionArgs& a) {
  return a.head_dim == 64 || a.head_dim == 128;
}

int attention_prefill_tc_query_tiles(const AttentionArgs& a) {
  return (a.m + kTcRows - 1) / kTcRows;
}

size_t attention_prefill_tc_scratch_bytes(const AttentionArgs& a) {
  if (direct_path(a)) return 0;
  return planes_bytes(a) + static_cast<size_t>(a.num_kv_heads) * num_key_tiles(a) * sizeof(int2);
}

void launch_attention_prefill_tc(const AttentionArgs& a, void* scratch, cudaStream_t stream,
                                 bool exact) {
  check_tc_args(a, scratch);
  switch (a.head_dim) {
    case 64:
      launch_for_head_dim<64>(a, scratch, stream, exact);
      break;
    case 128:
      launch_for_head_dim<128>(a, scratch, stream, exact);
      break;
    default:
      QS_CHECK_MSG(false, "attention_prefill_tc: unsupported head_dim");
  }
  if (a.num_splits > 1) launch_attention_combine(a, stream);
}

}  // namespace qs::cuda
