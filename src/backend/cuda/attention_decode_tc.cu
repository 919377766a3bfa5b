// Tensor-core split-KV flash-decoding over f16 KV rows, at about f32 accuracy.
//
// Why. The CUDA-core decode kernel (attention.cu) spends ~2 instructions per K/V element per
// query vector: enough for one query (MHA decode) but a GQA group of 4-8 query heads per kv head
// makes it instruction-bound at 25-32% of the H200's bandwidth. Here a warp multiplies 16 query
// vectors by 16 keys per mma.sync m16n8k16, so the instruction count no longer grows with the
// group, and cp.async keeps two stages of each warp's rows in flight.
//
// Operands (as in attention_prefill_tc.cu, whose scaling argument this follows). K and V are f16
// already: exact MMA operands. Q (f32) is split into hi = f16(x) and lo = f16(x - hi), each row
// scaled first by the power of two 2^fq that puts its largest |q * scale_log2| in [2^13, 2^14)
// (hi cannot overflow, lo stays normal for the large elements); the scores are multiplied by
// 2^-fq after the MMAs (exact). P = exp2(s - max) is formed as 2^12 P (the exponent's offset),
// so that its lo part stays a normal f16 down to P ~ 2^-15; O and the sum l carry the same 2^12,
// which cancels in O / l (and in the combine, whose partials all come from this kernel). Every
// product is two MMAs (lo, then hi) into an f32 accumulator.
//
// Layout. A block of 4 warps owns one tile of 16 query vectors (the MMA rows: row j is query
// vector q0 + j of the kv head, as in attention.cu) and one KV split; warp w takes the split's
// 16-token stages w, w + 4, ... and keeps its own online-softmax state; the block merges the 4
// states at the end. Lane (r = lane / 4, c = lane % 4):
//  - S = Q K^T (A = Q: rows = query vectors; B = K^T: k = channels, n = tokens). The MMA's k index
//    may map to any channel as long as Q and K agree: k-step s = 2e + h takes channels
//    32e + 8c + 4h + [0, 4) for the lane's k slots, so a lane loads channels [32e + 8c, +8) of its
//    key (token r of each 8-token n-tile) as one 16-byte piece, a quad 64 contiguous bytes.
//  - O = P V (A = P: the S accumulators of the stage's two n-tiles are exactly P's A fragment; B =
//    V: k = tokens, n = channels). The lane needs the pairs of tokens 2c, 2c + 1 (and + 8) at one
//    channel: it loads those 4 tokens' channels [64e + 8r, +8) (16 bytes each) and pairs the
//    halves with one byte permute per 2 elements; n-tile 8e + x is channel 64e + 8n + x.
//  - The pipeline is per warp (no block barrier). Shared memory holds, per stage, 16-byte pieces
//    in the order the lanes' fragments read them (piece p of lane l at slot [p][kslot / vslot]).
//    The loads do not fetch the pieces a lane needs: 16-byte accesses are served a quarter warp
//    at a time, and L2 sees one request per 128-byte line a quarter warp touches. Fetching the
//    fragments' own pieces (K: 2 keys x 64 bytes per quarter warp, V: 4 tokens x 32 bytes) made
//    4.5 requests per line (ncu: the kernel bound by L2 throughput at 88% with DRAM at 62%, and
//    its loads alone, bench_ops read, at 3.5 TB/s where plain streaming reaches 4.5). Instead an
//    instruction fetches whole K and V rows (HD / 8 lanes per row, a quarter warp = one line)
//    and each piece lands in the slot of the lane that needs it. Lanes thus read pieces other
//    lanes copied: a __syncwarp after the wait makes them visible, and one before a stage is
//    refilled keeps a lane from overwriting pieces another lane has not read yet.
// Masking only in the stages that reach past the split's end or into the candidate rows.
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/attention_decode_tc.h"
#include "backend/cuda/attention_state.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/env_switch.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/mma.cuh"

namespace qs::cuda {

namespace {

constexpr float kNegInf = -INFINITY;
constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kTok = 16;    // tokens per warp per stage (one P V k-step)
constexpr int kStages = 3;  // per-warp cp.async pipeline depth
constexpr int kRows = 16;   // query vectors per block (MMA rows)
constexpr int kTargetExp = 13;
constexpr int kExpClamp = 30;
constexpr float kPExp = 12.0f;  // P is formed as 2^12 P

// QS_DECODE_TC=0 starts the process with the CUDA-core decode kernel, QS_DECODE_TC_T=0 without
// the transposed tensor-core kernel (end-to-end A/B runs).
DecodeAttentionTuning g_tuning = [] {
  DecodeAttentionTuning t;
  t.tensor_cores = env_flag("QS_DECODE_TC", t.tensor_cores);
  t.transposed = env_flag("QS_DECODE_TC_T", t.transposed);
  return t;
}();

template <int HD>
struct TcLayout {
  static constexpr int kKLoads = HD / 32;                    // 16-byte K pieces per key per lane
  static constexpr int kLanesPerKey = HD / 8;                // K/V row fetch: 16 bytes per lane
  static constexpr int kKeysPerLoad = 32 / kLanesPerKey;     // whole rows per instruction
  static constexpr int kKSteps = HD / 16;                    // S k-steps
  static constexpr int kVLoads = HD / 64;                    // 16-byte V pieces per token per lane
  static constexpr int kNTiles = HD / 8;                     // O n-tiles
  static constexpr int kChunks = 2 * kKLoads + 4 * kVLoads;  // pieces per lane per stage
  static constexpr int kStageBytes = kChunks * 32 * 16;      // per warp
  static constexpr int kPipeBytes = kWarps * kStages * kStageBytes;
  static constexpr int kQFragBytes = kKSteps * 2 * 32 * 16;  // hi + lo fragments
  // The merge's rows of O are padded by 2 floats: a warp's fragment stores (rows r at a stride,
  // channels 16c + x) then hit 16 banks instead of 2.
  static constexpr int kOPitch = HD + 2;
  static constexpr int kMergeBytes = kWarps * kRows * kOPitch * 4 + kWarps * kRows * 2 * 4;
  static_assert(kMergeBytes <= kPipeBytes, "the merge reuses the pipeline buffers");
  static constexpr size_t kSmem = size_t{kPipeBytes} + kQFragBytes + 2 * kRows * sizeof(float);
};

// The 16-byte slot (0..31) of K piece e of lane (r, c): lane order with r's low bit flipped for
// odd e, so that both the fragment reads (a quarter warp: r in {2p, 2p + 1}, c in 0..3, one e)
// and the copies' writes (a quarter warp: one key, c in 0..3, e in {2p', 2p' + 1}) hit 8
// distinct 16-byte bank groups.
__device__ __forceinline__ int kslot(int r, int c, int e) {
  return 4 * (r ^ (e & 1)) + c;
}

// The 16-byte slot (0..31) of a V piece of lane (r, c): the reads (a quarter warp: r in
// {2p, 2p + 1}, c in 0..3) and the copies' writes (a quarter warp: one token, so one c, and
// r in 0..7) both hit 8 distinct 16-byte bank groups, (r + 2c) % 8.
__device__ __forceinline__ int vslot(int r, int c) {
  return 8 * c + ((r + 2 * c) & 7);
}

__device__ __forceinline__ uint4 lds16(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// The power of two that puts amax (>= 0) in [2^13, 2^14), as an exponent; 0 for 0 or non-finite.
__device__ __forceinline__ int row_exponent(float amax) {
  if (!(amax > 0.0f) || !(amax < INFINITY)) return 0;
  int ex = 0;
  frexpf(amax, &ex);  // amax in [2^(ex-1), 2^ex)
  return max(-kExpClamp, min(kExpClamp, kTargetExp + 1 - ex));
}

// Stage k of a warp's n (its stages start at first, step apart) in a kStages-deep per-warp
// cp.async pipeline: the slot read kStages - 1 stages ago takes stage k + kStages - 1 (issue(i0,
// slot) copies one), then stage k's pieces are waited for.
template <class Issue>
__device__ __forceinline__ void pipeline_step(int k, int n, int first, int step, int next_slot,
                                              Issue& issue) {
  __syncwarp();  // every lane has read the stage that next_slot held
  if (k + kStages - 1 < n) issue(first + (k + kStages - 1) * step, next_slot);
  cp_async_commit();
  cp_async_wait<kStages - 1>();
  __syncwarp();  // every lane's pieces of this stage have landed
}

// SEL: a sparse draft's KV selection (AttentionArgs::selected): index i of the kv head's sequence
// is position sel_positions[i] below sel_count, then the dense tail.
template <int HD, bool SEL>
__global__ void __launch_bounds__(kThreads, kDecodeTcBlocksPerSm)
    attention_decode_tc_kernel(AttentionArgs a) {
  pdl_begin();
  using L = TcLayout<HD>;
  extern __shared__ __align__(16) unsigned char smem[];
  unsigned char* pipe = smem;
  uint4* qf_s = reinterpret_cast<uint4*>(smem + L::kPipeBytes);  // [kKSteps][hi, lo][32 lanes]
  float* qmul_s = reinterpret_cast<float*>(smem + L::kPipeBytes + L::kQFragBytes);  // 2^fq
  float* qinv_s = qmul_s + kRows;                                                   // 2^-fq

  const int group = a.num_heads / a.num_kv_heads;
  const int kvh = blockIdx.z;
  const int split = blockIdx.y;
  const int q0 = blockIdx.x * kRows;
  const int nq = min(kRows, group * a.m - q0);
  const int64_t q_row_len = static_cast<int64_t>(a.num_heads) * HD;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r = lane / 4, c = lane % 4;

  auto q_at = [&](int row, int d) -> float {  // scale_log2 * q of the tile's row (0 past nq)
    if (row >= nq) return 0.0f;
    const int qv = q0 + row;
    const int head = kvh * group + qv % group;
    return a.q[(qv / group) * q_row_len + static_cast<int64_t>(head) * HD + d] * a.scale_log2;
  };

  const int seq = a.seq_len();
  const int t_begin = split * a.split_len;
  const int t_end = min(seq, t_begin + a.split_len);
  const int all_visible_end = seq - a.m + 1;  // indices below are visible to every query row
  const __half* k_base = static_cast<const __half*>(a.k) + static_cast<int64_t>(kvh) * HD;
  const __half* v_base = static_cast<const __half*>(a.v) + static_cast<int64_t>(kvh) * HD;
  const int32_t* sel = a.sel_positions + static_cast<int64_t>(kvh) * a.sel_count;
  auto position = [&](int i) -> int {  // the position of sequence index i
    if constexpr (SEL) {
      return i < a.sel_count ? __ldg(sel + i) : a.sel_dense_from + (i - a.sel_count);
    } else {
      return i;
    }
  };
  const uint32_t warp_pipe = smem_u32(pipe) + warp * kStages * L::kStageBytes;
  // This lane's K/V row fetches: chunk kq (16 bytes) of row kq_key (+ kKeysPerLoad per
  // instruction); for K that is piece (key / 8) * kKLoads + kq / 4 of lane (key % 8, kq % 4).
  const int kq = lane % L::kLanesPerKey, kq_key = lane / L::kLanesPerKey;
  // This lane's K fragment slots (16 bytes each) for even and odd e.
  const uint32_t kslot_even = kslot(r, c, 0) * 16, kslot_odd = kslot(r, c, 1) * 16;
  const int64_t key_step = static_cast<int64_t>(L::kKeysPerLoad) * a.row_stride;
  // Where fetch u lands: key u * kKeysPerLoad + kq_key (an even multiple plus a lane offset below
  // kKeysPerLoad, so kslot's flip of r's low bit touches only the lane part) is key % 8 = r' of
  // piece (key / 8) * kKLoads + kq / 4, at slot kslot(r', kq % 4, kq / 4): a lane byte offset
  // plus a compile-time one.
  const uint32_t kdst_lane = (kq / 4) * 512 + kslot(kq_key, kq % 4, kq / 4) * 16;
  auto kdst_step = [](int u) -> uint32_t {
    const int key0 = u * L::kKeysPerLoad;
    return (key0 / 8) * L::kKLoads * 512 + 4 * (key0 % 8) * 16;
  };
  // Where this lane's fetch of V token t (of the stage) lands: chunk kq holds channels
  // [8 kq, +8) = [64e + 8r', +8) that lane (r', c') = (kq % 8, (t % 8) / 2) reads as piece
  // 2 kKLoads + (2 (t / 8) + t % 2) kVLoads + e, at slot vslot(r', c').
  auto vdst = [kq](int t) -> uint32_t {
    const int piece = 2 * L::kKLoads + (2 * (t / 8) + t % 2) * L::kVLoads + kq / 8;
    return piece * 512 + vslot(kq % 8, (t % 8) / 2) * 16;
  };
  const uint32_t vslot_lane = vslot(r, c) * 16;  // this lane's V fragment slot

  // Whole rows of one matrix (K or V): fetch u is row u * kKeysPerLoad + kq_key of the stage,
  // chunk kq, to byte offset dst_of(u) of the stage.
  auto fetch_rows = [&](const __half* base, int i0, uint32_t dst, auto dst_of) {
    if (!SEL && i0 + kTok <= t_end) {  // (warp-uniform) rows at a fixed stride, all present
      const __half* src = base + static_cast<int64_t>(i0 + kq_key) * a.row_stride + 8 * kq;
#pragma unroll
      for (int u = 0; u < kTok / L::kKeysPerLoad; ++u, src += key_step) {
        cp_async16(dst + dst_of(u), src);
      }
    } else {
#pragma unroll
      for (int u = 0; u < kTok / L::kKeysPerLoad; ++u) {
        const int t = i0 + u * L::kKeysPerLoad + kq_key;
        const bool ok = t < t_end;
        const __half* src =
            base + static_cast<int64_t>(position(ok ? t : t_begin)) * a.row_stride + 8 * kq;
        cp_async16_zfill(dst + dst_of(u), src, ok ? 16 : 0);
      }
    }
  };
  // Stage i0 into pipeline slot `slot`: K pieces first (key j * 8 + r, piece j * kKLoads + e),
  // then V (token 2c + d + 8h, piece 2 kKLoads + (2h + d) kVLoads + e).
  auto issue = [&](int i0, int slot) {
    const uint32_t dst = warp_pipe + slot * L::kStageBytes;
    fetch_rows(k_base, i0, dst, [&](int u) { return kdst_lane + kdst_step(u); });
    fetch_rows(v_base, i0, dst, [&](int u) { return vdst(u * L::kKeysPerLoad + kq_key); });
  };

  // The first stages go out before the queries are prepared (they do not depend on them).
  const int step = kWarps * kTok;
  const int first = t_begin + warp * kTok;
  const int n = first < t_end ? (t_end - first + step - 1) / step : 0;
#pragma unroll
  for (int p = 0; p < kStages - 1; ++p) {
    if (p < n) issue(first + p * step, p);
    cp_async_commit();
  }
  // Per-row exponents: warp w scans rows 4w .. 4w + 3.
  constexpr int kScanRows = kRows / kWarps;
  float amax[kScanRows];
#pragma unroll
  for (int i = 0; i < kScanRows; ++i) {  // all loads first, then the reductions
    amax[i] = 0.0f;
#pragma unroll
    for (int d = lane; d < HD; d += 32)
      amax[i] = fmaxf(amax[i], fabsf(q_at(warp * kScanRows + i, d)));
  }
#pragma unroll
  for (int i = 0; i < kScanRows; ++i) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      amax[i] = fmaxf(amax[i], __shfl_xor_sync(kFullMask, amax[i], off));
    }
    if (lane == 0) {
      const int fq = row_exponent(amax[i]);
      qmul_s[warp * kScanRows + i] = exp2i(fq);
      qinv_s[warp * kScanRows + i] = exp2i(-fq);
    }
  }
  __syncthreads();
  // Q fragments of every k-step, hi and lo, in lane order (all warps use the same ones).
  for (int idx = threadIdx.x; idx < L::kKSteps * 32; idx += kThreads) {
    const int ks = idx / 32, fl = idx % 32, fr = fl / 4, fc = fl % 4;
    const int ch_base = 32 * (ks / 2) + 8 * fc + 4 * (ks % 2);
    uint32_t hi[4], lo[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // a0a1: row fr, a2a3: row fr + 8; a4..a7: channels + 2
      const int row = fr + 8 * (i & 1), ch = ch_base + 2 * (i >> 1);
      const float mul = qmul_s[row];
      split_f16x2(q_at(row, ch) * mul, q_at(row, ch + 1) * mul, hi[i], lo[i]);
    }
    qf_s[(ks * 2) * 32 + fl] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
    qf_s[(ks * 2 + 1) * 32 + fl] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
  }
  __syncthreads();
  uint32_t qhi[L::kKSteps][4], qlo[L::kKSteps][4];
#pragma unroll
  for (int ks = 0; ks < L::kKSteps; ++ks) {
    const uint4 h = qf_s[(ks * 2) * 32 + lane], l = qf_s[(ks * 2 + 1) * 32 + lane];
    qhi[ks][0] = h.x, qhi[ks][1] = h.y, qhi[ks][2] = h.z, qhi[ks][3] = h.w;
    qlo[ks][0] = l.x, qlo[ks][1] = l.y, qlo[ks][2] = l.z, qlo[ks][3] = l.w;
  }
  const float inv_lo = qinv_s[r], inv_hi = qinv_s[r + 8];  // rows r and r + 8
  const int last_lo = a.pos + (q0 + r) / group, last_hi = a.pos + (q0 + r + 8) / group;

  float o[L::kNTiles][4];
#pragma unroll
  for (int i = 0; i < L::kNTiles; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m_lo = kNegInf, m_hi = kNegInf, l_lo = 0.0f, l_hi = 0.0f;

  int slot = 0, next_slot = kStages - 1;
  for (int k = 0; k < n; ++k) {
    pipeline_step(k, n, first, step, next_slot, issue);
    const int i0 = first + k * step;
    const uint32_t src = warp_pipe + slot * L::kStageBytes;

    // Four independent accumulator chains (n-tile x lo/hi), summed at the end.
    float s[2][4], s_lo[2][4];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int x = 0; x < 4; ++x) s[j][x] = s_lo[j][x] = 0.0f;
    }
#pragma unroll
    for (int e = 0; e < L::kKLoads; ++e) {
      const uint32_t ks = (e & 1) ? kslot_odd : kslot_even;
      const uint4 k0 = lds16(src + e * 512 + ks), k1 = lds16(src + (L::kKLoads + e) * 512 + ks);
      mma_f16(s_lo[0], qlo[2 * e], k0.x, k0.y);
      mma_f16(s_lo[1], qlo[2 * e], k1.x, k1.y);
      mma_f16(s[0], qhi[2 * e], k0.x, k0.y);
      mma_f16(s[1], qhi[2 * e], k1.x, k1.y);
      mma_f16(s_lo[0], qlo[2 * e + 1], k0.z, k0.w);
      mma_f16(s_lo[1], qlo[2 * e + 1], k1.z, k1.w);
      mma_f16(s[0], qhi[2 * e + 1], k0.z, k0.w);
      mma_f16(s[1], qhi[2 * e + 1], k1.z, k1.w);
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      s[j][0] = (s[j][0] + s_lo[j][0]) * inv_lo, s[j][1] = (s[j][1] + s_lo[j][1]) * inv_lo;
      s[j][2] = (s[j][2] + s_lo[j][2]) * inv_hi, s[j][3] = (s[j][3] + s_lo[j][3]) * inv_hi;
    }
    if (i0 + kTok > t_end || i0 + kTok > all_visible_end) {  // warp-uniform
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int x = 0; x < 4; ++x) {
          const int t = i0 + 8 * j + 2 * c + (x & 1);
          int p = t;
          if constexpr (SEL) p = t < t_end ? position(t) : 0;
          if (t >= t_end || p > (x < 2 ? last_lo : last_hi)) s[j][x] = kNegInf;
        }
      }
    }
    // Online softmax (rows r and r + 8; a quad holds a row's 16 scores).
    float mx_lo = fmaxf(fmaxf(s[0][0], s[0][1]), fmaxf(s[1][0], s[1][1]));
    float mx_hi = fmaxf(fmaxf(s[0][2], s[0][3]), fmaxf(s[1][2], s[1][3]));
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {
      mx_lo = fmaxf(mx_lo, __shfl_xor_sync(kFullMask, mx_lo, off));
      mx_hi = fmaxf(mx_hi, __shfl_xor_sync(kFullMask, mx_hi, off));
    }
    const float mn_lo = fmaxf(m_lo, mx_lo), mn_hi = fmaxf(m_hi, mx_hi);
    if (__any_sync(kFullMask, mn_lo != m_lo || mn_hi != m_hi)) {
      // (-inf - -inf would be NaN: a row whose max did not change keeps its scale.)
      const float corr_lo = mn_lo == m_lo ? 1.0f : exp2_ftz(m_lo - mn_lo);
      const float corr_hi = mn_hi == m_hi ? 1.0f : exp2_ftz(m_hi - mn_hi);
      l_lo *= corr_lo, l_hi *= corr_hi;
#pragma unroll
      for (int i = 0; i < L::kNTiles; ++i) {
        o[i][0] *= corr_lo, o[i][1] *= corr_lo, o[i][2] *= corr_hi, o[i][3] *= corr_hi;
      }
      m_lo = mn_lo, m_hi = mn_hi;
    }
    // 2^12 P; a row that has seen only masked scores keeps m = -inf and P = 0.
    const float sub_lo = (m_lo == kNegInf ? 0.0f : m_lo) - kPExp;
    const float sub_hi = (m_hi == kNegInf ? 0.0f : m_hi) - kPExp;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      s[j][0] = exp2_ftz(s[j][0] - sub_lo), s[j][1] = exp2_ftz(s[j][1] - sub_lo);
      s[j][2] = exp2_ftz(s[j][2] - sub_hi), s[j][3] = exp2_ftz(s[j][3] - sub_hi);
      l_lo += s[j][0] + s[j][1];
      l_hi += s[j][2] + s[j][3];
    }
    uint32_t p_hi[4], p_lo[4];  // A fragment: (row r, keys 2c..), (r + 8, ..), then keys + 8
    split_f16x2(s[0][0], s[0][1], p_hi[0], p_lo[0]);
    split_f16x2(s[0][2], s[0][3], p_hi[1], p_lo[1]);
    split_f16x2(s[1][0], s[1][1], p_hi[2], p_lo[2]);
    split_f16x2(s[1][2], s[1][3], p_hi[3], p_lo[3]);
#pragma unroll
    for (int e = 0; e < L::kVLoads; ++e) {
      uint4 v[4];  // tokens 2c, 2c + 1, 2c + 8, 2c + 9
#pragma unroll
      for (int tv = 0; tv < 4; ++tv)
        v[tv] = lds16(src + (2 * L::kKLoads + tv * L::kVLoads + e) * 512 + vslot_lane);
#pragma unroll
      for (int x = 0; x < 8; ++x) {
        const uint32_t sel = (x & 1) ? 0x7632u : 0x5410u;
        const uint32_t b0 = __byte_perm(word(v[0], x / 2), word(v[1], x / 2), sel);
        const uint32_t b1 = __byte_perm(word(v[2], x / 2), word(v[3], x / 2), sel);
        mma_f16(o[8 * e + x], p_lo, b0, b1);
        mma_f16(o[8 * e + x], p_hi, b0, b1);
      }
    }
    slot = slot + 1 == kStages ? 0 : slot + 1;
    next_slot = next_slot + 1 == kStages ? 0 : next_slot + 1;
  }
  cp_async_wait<0>();

  // Each warp's state to shared memory (over the pipeline buffers), then the block's merge.
#pragma unroll
  for (int off = 1; off <= 2; off <<= 1) {
    l_lo += __shfl_xor_sync(kFullMask, l_lo, off);
    l_hi += __shfl_xor_sync(kFullMask, l_hi, off);
  }
  __syncthreads();
  float* o_s = reinterpret_cast<float*>(pipe);      // [kWarps][kRows][kOPitch]
  float* ml_s = o_s + kWarps * kRows * L::kOPitch;  // [kWarps][kRows][2]
#pragma unroll
  for (int i = 0; i < L::kNTiles; ++i) {
    const int ch = 64 * (i / 8) + 16 * c + i % 8;  // n = 2c -> 64e + 8n + x; n = 2c + 1: + 8
    float* lo_row = o_s + (warp * kRows + r) * L::kOPitch;
    float* hi_row = o_s + (warp * kRows + r + 8) * L::kOPitch;
    lo_row[ch] = o[i][0], lo_row[ch + 8] = o[i][1];
    hi_row[ch] = o[i][2], hi_row[ch + 8] = o[i][3];
  }
  if (c == 0) {
    ml_s[(warp * kRows + r) * 2] = m_lo, ml_s[(warp * kRows + r) * 2 + 1] = l_lo;
    ml_s[(warp * kRows + r + 8) * 2] = m_hi, ml_s[(warp * kRows + r + 8) * 2 + 1] = l_hi;
  }
  __syncthreads();
  write_merged_states<HD, kWarps, L::kOPitch>(a, o_s, ml_s, kRows, nq, q0, kvh, split, kThreads);
}

// ---- the transposed kernel (DecodeAttentionTuning::transposed) -------------------------------
//
// For at most 8 query vectors per kv head (decode: MHA m <= 8, GQA groups of 4 at m <= 2 and of
// 8 at m = 1). S^T = K Q^T and O^T = V^T P^T: the keys and the values are the MMAs' A operand
// (16 tokens x 16 channels; 16 channels x 16 tokens) and the query vectors B's 8 columns, as in
// the quantized view's direct path (attention_quant_direct.cuh). Against the kernel above (16
// query rows as A, 15 of them empty in an MHA decode): half the MMAs, V^T's A fragments by one
// ldmatrix.trans per 16 channels instead of four 16-byte loads and eight byte permutes, the
// queries' fragments in 4 registers per k-step instead of 8, each lane's own (no shared memory,
// no block barrier before the loop). The same operands' arithmetic: Q split into f16 hi + lo at
// a per-vector power of two, P formed as 2^12 P and split likewise, two MMAs per product.
//
// Lane (r, c) = (lane / 4, lane % 4):
//  - S^T: k-step s = 2j + h takes channels 32j + 8c + 4h + [0, 4) for the lane's k slots (the
//    kernel above's map): A = 16 bytes of token r and of token r + 8 at channel 32j + 8c (one
//    load each feeds two k-steps), B = query vector r's channels (hi, then lo). C: S[token r,
//    r + 8][query 2c, 2c + 1].
//  - Online softmax per query column: the 16 tokens of query 2c + k are in the 8 lanes of one c
//    (shuffles over r).
//  - P^T as B (k = tokens, n = query vectors): lane (r, c) needs P[query r][tokens 2c, 2c + 1,
//    2c + 8, 2c + 9], held by lanes (2c, r / 2) and (2c + 1, r / 2) as f16 pairs of queries
//    (2 (r / 2), + 1): eight shuffles and four byte permutes per stage.
//  - O^T m-tile u (channels 16u .. 16u + 15): A = V^T by ldmatrix.x4.trans of the stage's V rows
//    (matrix i: tokens 8 (i / 2) .. + 7 at channels 16u + 8 (i % 2) .. + 7). C: O^T[channel 16u +
//    r (+ 8)][query 2c, 2c + 1].
// Shared memory per warp and stage: K rows then V rows, natural order, 16-byte chunks swizzled
// per token (K: chunk ^ 4 (t % 2), so that a quarter warp's reads of tokens r, r + 1 at the same
// chunks hit distinct banks; V: chunk ^ t % 8, so that ldmatrix's 8 rows of one chunk do). The
// copies fetch whole rows (a quarter warp = one 128-byte line), as above.
template <int HD>
struct TcTLayout {
  static constexpr int kRowBytes = HD * 2;
  static constexpr int kMatBytes = kTok * kRowBytes;  // one stage's K (or V) rows
  static constexpr int kStageBytes = 2 * kMatBytes;   // per warp
  static constexpr int kPipeBytes = kWarps * kStages * kStageBytes;
  static constexpr int kKLoads = HD / 32;  // 16-byte K chunks per token row per lane
  static constexpr int kKSteps = HD / 16;
  static constexpr int kMTiles = HD / 16;
  static constexpr int kLanesPerRow = HD / 8;  // row fetch: 16 bytes per lane
  static constexpr int kRowsPerLoad = 32 / kLanesPerRow;
  static constexpr int kCols = 8;         // query vectors per block (B's columns)
  static constexpr int kOPitch = HD + 4;  // merge rows: the fragment stores hit 32 banks
  static constexpr int kMergeBytes = kWarps * kCols * (kOPitch + 2) * 4;
  static_assert(kMergeBytes <= kPipeBytes, "the merge reuses the pipeline buffers");
  static_assert(kRowsPerLoad % 2 == 0, "a lane's fetched rows keep their parity");
  static constexpr size_t kSmem = size_t{kPipeBytes};
};

__device__ __forceinline__ uint32_t ktile_chunk(int t, int chunk) {  // K's swizzle
  return static_cast<uint32_t>(chunk ^ ((t & 1) << 2));
}
__device__ __forceinline__ uint32_t vtile_chunk(int t, int chunk) {  // V's swizzle
  return static_cast<uint32_t>(chunk ^ (t & 7));
}

template <int HD>
__global__ void __launch_bounds__(kThreads, kDecodeTcBlocksPerSm)
    attention_decode_tct_kernel(AttentionArgs a) {
  using L = TcTLayout<HD>;
  extern __shared__ __align__(16) unsigned char smem[];
  const int group = a.num_heads / a.num_kv_heads;
  const int kvh = blockIdx.z;
  const int split = blockIdx.y;
  const int q0 = blockIdx.x * L::kCols;
  const int nq = min(L::kCols, group * a.m - q0);
  const int64_t q_row_len = static_cast<int64_t>(a.num_heads) * HD;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r = lane / 4, c = lane % 4;

  const int seq = a.seq_len();
  const int t_begin = split * a.split_len;
  const int t_end = min(seq, t_begin + a.split_len);
  const int all_visible_end = seq - a.m + 1;
  const __half* k_base = static_cast<const __half*>(a.k) + static_cast<int64_t>(kvh) * HD;
  const __half* v_base = static_cast<const __half*>(a.v) + static_cast<int64_t>(kvh) * HD;
  const uint32_t warp_pipe = smem_u32(smem) + warp * kStages * L::kStageBytes;

  // Row fetches: chunk kq of row u * kRowsPerLoad + kq_row of the stage, for each u.
  const int kq = lane % L::kLanesPerRow, kq_row = lane / L::kLanesPerRow;
  const int64_t rows_step = static_cast<int64_t>(L::kRowsPerLoad) * a.row_stride;
  auto fetch_rows = [&](const __half* base, int i0, uint32_t dst, auto dst_of) {
    if (i0 + kTok <= t_end) {  // (warp-uniform) all rows present
      const __half* src = base + static_cast<int64_t>(i0 + kq_row) * a.row_stride + 8 * kq;
#pragma unroll
      for (int u = 0; u < kTok / L::kRowsPerLoad; ++u, src += rows_step) {
        cp_async16(dst + dst_of(u * L::kRowsPerLoad + kq_row), src);
      }
    } else {
#pragma unroll
      for (int u = 0; u < kTok / L::kRowsPerLoad; ++u) {
        const int t = i0 + u * L::kRowsPerLoad + kq_row;
        const bool ok = t < t_end;
        const __half* src = base + static_cast<int64_t>(ok ? t : t_begin) * a.row_stride + 8 * kq;
        cp_async16_zfill(dst + dst_of(u * L::kRowsPerLoad + kq_row), src, ok ? 16 : 0);
      }
    }
  };
  auto issue = [&](int i0, int slot) {
    const uint32_t dst = warp_pipe + slot * L::kStageBytes;
    fetch_rows(k_base, i0, dst, [&](int t) { return t * L::kRowBytes + 16 * ktile_chunk(t, kq); });
    fetch_rows(v_base, i0, dst + L::kMatBytes,
               [&](int t) { return t * L::kRowBytes + 16 * vtile_chunk(t, kq); });
  };

  const int step = kWarps * kTok;
  const int first = t_begin + warp * kTok;
  const int n = first < t_end ? (t_end - first + step - 1) / step : 0;
  pdl_begin();  // the queries and the step's own rows come from the previous kernels
#pragma unroll
  for (int p = 0; p < kStages - 1; ++p) {
    if (p < n) issue(first + p * step, p);
    cp_async_commit();
  }

  // Query vector r's B fragments (each lane its own): k-step 2j + h holds channels 32j + 8c +
  // 4h + {0, 1} and + {2, 3}, scaled by 2^fq (its largest |q * scale_log2| in [2^13, 2^14)).
  float qv[L::kKLoads][8];
  float amax = 0.0f;
  {
    const bool valid = r < nq;
    const int qvec = q0 + r;
    const int head = kvh * group + qvec % group;
    const float* qrow = a.q + (valid ? (qvec / group) * q_row_len + int64_t{head} * HD : 0);
#pragma unroll
    for (int j = 0; j < L::kKLoads; ++j) {
      const float4* p = reinterpret_cast<const float4*>(qrow + 32 * j + 8 * c);
      const float4 x0 = valid ? p[0] : make_float4(0.f, 0.f, 0.f, 0.f);
      const float4 x1 = valid ? p[1] : make_float4(0.f, 0.f, 0.f, 0.f);
      const float xs[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        qv[j][e] = xs[e] * a.scale_log2;
        amax = fmaxf(amax, fabsf(qv[j][e]));
      }
    }
  }
  amax = fmaxf(amax, __shfl_xor_sync(kFullMask, amax, 1));
  amax = fmaxf(amax, __shfl_xor_sync(kFullMask, amax, 2));
  const int fq = row_exponent(amax);
  const float qmul = exp2i(fq);
  uint32_t qhi[L::kKSteps][2], qlo[L::kKSteps][2];
#pragma unroll
  for (int j = 0; j < L::kKLoads; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      split_f16x2(qv[j][4 * h] * qmul, qv[j][4 * h + 1] * qmul, qhi[2 * j + h][0],
                  qlo[2 * j + h][0]);
      split_f16x2(qv[j][4 * h + 2] * qmul, qv[j][4 * h + 3] * qmul, qhi[2 * j + h][1],
                  qlo[2 * j + h][1]);
    }
  }
  // 2^-fq of this lane's score columns (query vectors 2c, 2c + 1: lanes 8c and 8c + 4).
  const float qinv = exp2i(-fq);
  const float inv[2] = {__shfl_sync(kFullMask, qinv, 8 * c),
                        __shfl_sync(kFullMask, qinv, 8 * c + 4)};
  const int last[2] = {a.pos + (q0 + 2 * c) / group, a.pos + (q0 + 2 * c + 1) / group};

  // This lane's shared-memory offsets: its K chunks (token r; r + 8 adds 8 rows, same swizzle),
  // its ldmatrix row (matrix lane / 8: token 8 (lane / 16) + lane % 8, channel half (lane / 8) %
  // 2).
  const uint32_t k_off = r * L::kRowBytes;
  const int v_tok = 8 * (lane >> 4) + (lane & 7), v_half = (lane >> 3) & 1;
  const uint32_t v_off = L::kMatBytes + v_tok * L::kRowBytes;
  // P^T's sources: lanes (2c, r / 2) and (2c + 1, r / 2); the half that is query vector r.
  const int src0 = 8 * c + (r >> 1), src1 = src0 + 4;
  const uint32_t psel = (r & 1) ? 0x7632u : 0x5410u;

  float o[L::kMTiles][4];
#pragma unroll
  for (int u = 0; u < L::kMTiles; ++u) o[u][0] = o[u][1] = o[u][2] = o[u][3] = 0.0f;
  float m_run[2] = {kNegInf, kNegInf}, l_part[2] = {0.0f, 0.0f};

  int slot = 0, next_slot = kStages - 1;
  for (int k = 0; k < n; ++k) {
    pipeline_step(k, n, first, step, next_slot, issue);
    const int i0 = first + k * step;
    const uint32_t st = warp_pipe + slot * L::kStageBytes;

    // S^T: even and odd k-steps, hi and lo, in four accumulator chains.
    float sc[4][4] = {};
#pragma unroll
    for (int j = 0; j < L::kKLoads; ++j) {
      const uint32_t chunk = 16 * ktile_chunk(r, 4 * j + c);
      const uint4 k0 = lds16(st + k_off + chunk);
      const uint4 k1 = lds16(st + k_off + 8 * L::kRowBytes + chunk);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t a0 = word(k0, 2 * h), a1 = word(k1, 2 * h);
        const uint32_t a2 = word(k0, 2 * h + 1), a3 = word(k1, 2 * h + 1);
        mma_f16(sc[2 * h], a0, a1, a2, a3, qlo[2 * j + h][0], qlo[2 * j + h][1]);
        mma_f16(sc[2 * h + 1], a0, a1, a2, a3, qhi[2 * j + h][0], qhi[2 * j + h][1]);
      }
    }
    float s[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) s[i] = ((sc[0][i] + sc[2][i]) + (sc[1][i] + sc[3][i])) * inv[i & 1];
    if (i0 + kTok > t_end || i0 + kTok > all_visible_end) {  // warp-uniform
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int t = i0 + r + 8 * (i >> 1);
        if (t >= t_end || t > last[i & 1]) s[i] = kNegInf;
      }
    }
    // Online softmax of query vectors 2c, 2c + 1 (their 16 scores: the lanes of this c).
    float mx[2] = {fmaxf(s[0], s[2]), fmaxf(s[1], s[3])};
#pragma unroll
    for (int off = 4; off < 32; off <<= 1) {
      mx[0] = fmaxf(mx[0], __shfl_xor_sync(kFullMask, mx[0], off));
      mx[1] = fmaxf(mx[1], __shfl_xor_sync(kFullMask, mx[1], off));
    }
    const float mn[2] = {fmaxf(m_run[0], mx[0]), fmaxf(m_run[1], mx[1])};
    if (__any_sync(kFullMask, mn[0] != m_run[0] || mn[1] != m_run[1])) {
      float corr[2];
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        corr[q] = mn[q] == m_run[q] ? 1.0f : exp2_ftz(m_run[q] - mn[q]);
        l_part[q] *= corr[q];
        m_run[q] = mn[q];
      }
#pragma unroll
      for (int u = 0; u < L::kMTiles; ++u) {
        o[u][0] *= corr[0], o[u][1] *= corr[1], o[u][2] *= corr[0], o[u][3] *= corr[1];
      }
    }
    // 2^12 P; a column that has seen only masked scores keeps m = -inf and P = 0.
    const float sub[2] = {(m_run[0] == kNegInf ? 0.0f : m_run[0]) - kPExp,
                          (m_run[1] == kNegInf ? 0.0f : m_run[1]) - kPExp};
    float p[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      p[i] = exp2_ftz(s[i] - sub[i & 1]);
      l_part[i & 1] += p[i];
    }
    uint32_t ph_r, pl_r, ph_r8, pl_r8;  // tokens r and r + 8: (query 2c, 2c + 1) pairs
    split_f16x2(p[0], p[1], ph_r, pl_r);
    split_f16x2(p[2], p[3], ph_r8, pl_r8);
    auto gather = [&](uint32_t v) {  // (tokens 2c, 2c + 1 of v's row half) for query vector r
      return __byte_perm(__shfl_sync(kFullMask, v, src0), __shfl_sync(kFullMask, v, src1), psel);
    };
    const uint32_t bh0 = gather(ph_r), bh1 = gather(ph_r8);
    const uint32_t bl0 = gather(pl_r), bl1 = gather(pl_r8);
#pragma unroll
    for (int u = 0; u < L::kMTiles; ++u) {
      uint32_t va[4];
      ldmatrix_x4_trans(va, st + v_off + 16 * vtile_chunk(v_tok, 2 * u + v_half));
      mma_f16(o[u], va, bl0, bl1);
      mma_f16(o[u], va, bh0, bh1);
    }
    slot = slot + 1 == kStages ? 0 : slot + 1;
    next_slot = next_slot + 1 == kStages ? 0 : next_slot + 1;
  }
  cp_async_wait<0>();

  // Each warp's state to shared memory (over the pipeline buffers), then the block's merge.
#pragma unroll
  for (int q = 0; q < 2; ++q) {
#pragma unroll
    for (int off = 4; off < 32; off <<= 1) {
      l_part[q] += __shfl_xor_sync(kFullMask, l_part[q], off);
    }
  }
  __syncthreads();
  float* o_s = reinterpret_cast<float*>(smem);         // [kWarps][kCols][kOPitch]
  float* ml_s = o_s + kWarps * L::kCols * L::kOPitch;  // [kWarps][kCols][2]
#pragma unroll
  for (int u = 0; u < L::kMTiles; ++u) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int q = 2 * c + (i & 1), ch = 16 * u + r + 8 * (i >> 1);
      o_s[(warp * L::kCols + q) * L::kOPitch + ch] = o[u][i];
    }
  }
  if (r == 0) {
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      ml_s[(warp * L::kCols + 2 * c + q) * 2] = m_run[q];
      ml_s[(warp * L::kCols + 2 * c + q) * 2 + 1] = l_part[q];
    }
  }
  __syncthreads();
  write_merged_states<HD, kWarps, L::kOPitch>(a, o_s, ml_s, L::kCols, nq, q0, kvh, split, kThreads);
}

template <int HD>
void launch_tct(const AttentionArgs& a, cudaStream_t stream) {
  constexpr size_t smem = TcTLayout<HD>::kSmem;
  static const bool configured = [] {
    CUDA_CHECK(cudaFuncSetAttribute(attention_decode_tct_kernel<HD>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(smem)));
    return true;
  }();
  (void)configured;
  const dim3 grid(attention_decode_tc_query_tiles(a), a.num_splits, a.num_kv_heads);
  launch(attention_decode_tct_kernel<HD>, grid, kThreads, smem, stream, a);
  CUDA_CHECK_LAUNCH(stream);
}

template <int HD, bool SEL>
void launch_for_head_dim(const AttentionArgs& a, cudaStream_t stream) {
  constexpr size_t smem = TcLayout<HD>::kSmem;
  static const bool configured = [] {
    CUDA_CHECK(cudaFuncSetAttribute(attention_decode_tc_kernel<HD, SEL>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(smem)));
    return true;
  }();
  (void)configured;
  const dim3 grid(attention_decode_tc_query_tiles(a), a.num_splits, a.num_kv_heads);
  launch(attention_decode_tc_kernel<HD, SEL>, grid, kThreads, smem, stream, a);
  CUDA_CHECK_LAUNCH(stream);
}

template <int HD>
void launch_for_head_dim(const AttentionArgs& a, cudaStream_t stream) {
  if (a.selected) {
    launch_for_head_dim<HD, true>(a, stream);
  } else {
    launch_for_head_dim<HD, false>(a, stream);
  }
}

}  // namespace

void set_decode_attention_tuning(const DecodeAttentionTuning& tuning) {
  g_tuning = tuning;
}

DecodeAttentionTuning decode_attention_tuning() {
  return g_tuning;
}

bool attention_decode_tc_supported(const AttentionArgs& a) {
  const uintptr_t bits = reinterpret_cast<uintptr_t>(a.k) | reinterpret_cast<uintptr_t>(a.v);
  return a.kv_dtype == DType::F16 && (a.head_dim == 64 || a.head_dim == 128) &&
         (!a.selected || g_tuning.selection) && a.m >= 1 && a.m <= 16 && a.row_stride % 8 == 0 &&
         bits % 16 == 0;
}

bool attention_decode_tct_applies(const AttentionArgs& a) {
  return g_tuning.transposed && !a.selected && (a.num_heads / a.num_kv_heads) * a.m <= 8;
}

int attention_decode_tc_query_tiles(const AttentionArgs& a) {
  const int q_per_kv_head = (a.num_heads / a.num_kv_heads) * a.m;
  const int rows = attention_decode_tct_applies(a) ? TcTLayout<128>::kCols : kRows;
  return (q_per_kv_head + rows - 1) / rows;
}

void launch_attention_decode_tc(const AttentionArgs& a, cudaStream_t stream) {
  QS_CHECK_MSG(attention_decode_tc_supported(a), "attention_decode_tc: unsupported call");
  QS_CHECK(a.num_kv_heads >= 1 && a.num_heads % a.num_kv_heads == 0 && a.num_kv_heads <= 65535);
  QS_CHECK(a.num_splits >= 1 && a.num_splits <= 65535 && a.split_len >= 1);
  QS_CHECK(static_cast<int64_t>(a.num_splits) * a.split_len >= a.seq_len());
  QS_CHECK(a.num_splits == 1 || (a.partial_o != nullptr && a.partial_ml != nullptr));
  QS_CHECK(!a.selected || (a.sel_count >= 0 && a.sel_dense_from >= 0 && a.sel_dense_from <= a.pos &&
                           (a.sel_count == 0 || a.sel_positions)));
  const uintptr_t qo = reinterpret_cast<uintptr_t>(a.q) | reinterpret_cast<uintptr_t>(a.out);
  QS_CHECK_MSG(qo % 16 == 0, "attention: q and out must be 16-byte aligned");
  if (attention_decode_tct_applies(a)) {
    if (a.head_dim == 64) {
      launch_tct<64>(a, stream);
    } else {
      launch_tct<128>(a, stream);
    }
  } else if (a.head_dim == 64) {
    launch_for_head_dim<64>(a, stream);
  } else {
    launch_for_head_dim<128>(a, stream);
  }
  if (a.num_splits > 1) launch_attention_combine(a, stream);
}

}  // namespace qs::cuda
