// Causal GQA attention over a full-precision KV view (f32 or f16 rows: T = float or __half, f16
// converted to f32 on load, all arithmetic in f32): split-KV flash-decoding for few query rows, a
// flash-attention prefill kernel for many, and the combine step that merges split partials.
//
// Every kernel keeps the online-softmax state {o (unnormalized), m (max score), l (sum of
// exp)} per query vector, scores in base-2 units (q is pre-scaled by scale * log2(e), so
// exp(s - max) becomes exp2). Two states merge as m = max(m1, m2),
// l = l1 2^(m1-m) + l2 2^(m2-m), o = o1 2^(m1-m) + o2 2^(m2-m); a state that saw only masked
// positions has m = -inf and weight 0. The full score matrix is never materialized.
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <type_traits>

#include "backend/cuda/attention_state.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/mma.cuh"

namespace qs::cuda {

namespace {

constexpr float kNegInf = -INFINITY;

// ---- decode kernel --------------------------------------------------------------------------

constexpr int kDecodeWarps = 4;
constexpr int kDecodeThreads = kDecodeWarps * 32;
constexpr int kDecodeUnroll = 4;  // positions per lane group per step (loads in flight)

// Elements of a position's K (and V) row per lane. Narrow: 4 up to head_dim 64, head_dim / 32
// above; f16 rows are then read 8 bytes at a time. Wide (f16 rows whose stride and base keep
// every row 16-byte aligned): at least 8 f16 per lane, read 16 bytes at a time, as many bytes in
// flight per lane as the f32 kernel.
template <int HD, bool WIDE>
constexpr int decode_vec() {
  const int narrow = HD >= 128 ? HD / 32 : 4;
  return WIDE && narrow < 8 ? 8 : narrow;
}

template <int HD, bool WIDE = false>
struct DecodeLayout {
  static constexpr int kVec = decode_vec<HD, WIDE>();      // elements per lane
  static constexpr int kLanes = HD / kVec;                 // lanes per position: 8, 16 or 32
  static constexpr int kGroups = kDecodeThreads / kLanes;  // positions read side by side
};

// kVec consecutive elements of a read-only K/V row as f32: 16-byte loads for f32 and for wide
// f16 rows, 8-byte loads for narrow f16 rows (rows only 8-byte aligned).
template <int kVec, bool WIDE, typename T>
__device__ __forceinline__ void load_row_part(const T* p, float (&r)[kVec]) {
  if constexpr (std::is_same_v<T, __half> && WIDE) {
    static_assert(kVec % 8 == 0);
#pragma unroll
    for (int e = 0; e < kVec / 8; ++e) {
      const uint4 u = __ldg(reinterpret_cast<const uint4*>(p) + e);
      const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 f = f16x2_bits_to_float2(w[i]);
        r[8 * e + 2 * i] = f.x;
        r[8 * e + 2 * i + 1] = f.y;
      }
    }
  } else {
#pragma unroll
    for (int e = 0; e < kVec / 4; ++e) {
      const float4 f = load4_kv(p + 4 * e);
      r[4 * e] = f.x, r[4 * e + 1] = f.y, r[4 * e + 2] = f.z, r[4 * e + 3] = f.w;
    }
  }
}

template <int HD, int QMAX, bool WIDE>
constexpr size_t decode_smem_bytes() {
  using L = DecodeLayout<HD, WIDE>;
  // q tile [QMAX][HD] + per-group states o [kGroups][QMAX][HD] and (m, l) [kGroups][QMAX][2].
  return sizeof(float) *
         (size_t{QMAX} * HD + size_t{L::kGroups} * QMAX * HD + size_t{L::kGroups} * QMAX * 2);
}

template <int HD, int QMAX, typename T, bool WIDE>
__global__ void __launch_bounds__(kDecodeThreads) attention_decode_kernel(AttentionArgs a) {
  pdl_begin();
  using L = DecodeLayout<HD, WIDE>;
  constexpr int kVec = L::kVec, kLanes = L::kLanes, kGroups = L::kGroups;
  extern __shared__ float4 smem4[];
  float* q_s = reinterpret_cast<float*>(smem4);  // [QMAX][HD]
  float* o_s = q_s + QMAX * HD;                  // [kGroups][QMAX][HD]
  float* ml_s = o_s + kGroups * QMAX * HD;       // [kGroups][QMAX][2]

  const int group = a.num_heads / a.num_kv_heads;
  const int kvh = blockIdx.z;
  const int split = blockIdx.y;
  const int q0 = blockIdx.x * QMAX;  // first query vector (of group * m) of this tile
  const int nq = min(QMAX, group * a.m - q0);
  const int64_t q_row_len = static_cast<int64_t>(a.num_heads) * HD;

  for (int e = threadIdx.x; e < QMAX * HD; e += kDecodeThreads) {
    const int j = e / HD, d = e % HD;
    float v = 0.0f;
    if (j < nq) {
      const int qv = q0 + j;
      const int row = qv / group, head = kvh * group + qv % group;
      v = a.q[row * q_row_len + static_cast<int64_t>(head) * HD + d] * a.scale_log2;
    }
    q_s[e] = v;
  }
  __syncthreads();

  const int lane = threadIdx.x % 32;
  const int gl = lane % kLanes;  // lane within the group: dims [gl * kVec, +kVec)
  const int gid = threadIdx.x / kLanes;
  // Indices into the kv head's sequence: position i, or with a selection its i-th entry.
  const int t_begin = split * a.split_len;
  const int t_end = min(a.seq_len(), t_begin + a.split_len);
  const int32_t* sel = a.sel_positions + static_cast<int64_t>(kvh) * a.sel_count;

  int last_visible[QMAX];  // query vector j sees positions [0, pos + row]
  float m_run[QMAX], l_run[QMAX], o[QMAX][kVec];
#pragma unroll
  for (int j = 0; j < QMAX; ++j) {
    last_visible[j] = a.pos + (q0 + j) / group;
    m_run[j] = kNegInf;
    l_run[j] = 0.0f;
#pragma unroll
    for (int e = 0; e < kVec; ++e) o[j][e] = 0.0f;
  }

  const T* k_base = static_cast<const T*>(a.k) + static_cast<int64_t>(kvh) * HD + gl * kVec;
  const T* v_base = static_cast<const T*>(a.v) + static_cast<int64_t>(kvh) * HD + gl * kVec;
  // The step loop is uniform across the block (shuffles below need whole warps).
  for (int t_step = t_begin; t_step < t_end; t_step += kGroups * kDecodeUnroll) {
    float kr[kDecodeUnroll][kVec], vr[kDecodeUnroll][kVec];
    int tpos[kDecodeUnroll];  // the position of each row (masking)
#pragma unroll
    for (int u = 0; u < kDecodeUnroll; ++u) {
      const int i = t_step + u * kGroups + gid;
      const int t = !a.selected            ? i
                    : i < a.sel_count      ? __ldg(sel + i)
                                           : a.sel_dense_from + (i - a.sel_count);
      tpos[u] = i < t_end ? t : INT_MAX;
      if (i < t_end) {
        load_row_part<kVec, WIDE>(k_base + t * a.row_stride, kr[u]);
        load_row_part<kVec, WIDE>(v_base + t * a.row_stride, vr[u]);
      } else {
#pragma unroll
        for (int e = 0; e < kVec; ++e) kr[u][e] = vr[u][e] = 0.0f;
      }
    }
#pragma unroll
    for (int j = 0; j < QMAX; ++j) {
      if (j >= nq) break;  // uniform
      const float4* qp = reinterpret_cast<const float4*>(q_s + j * HD + gl * kVec);
      float s[kDecodeUnroll];
#pragma unroll
      for (int u = 0; u < kDecodeUnroll; ++u) s[u] = 0.0f;
#pragma unroll
      for (int e = 0; e < kVec / 4; ++e) {
        const float4 q4 = qp[e];
#pragma unroll
        for (int u = 0; u < kDecodeUnroll; ++u) {
          s[u] += q4.x * kr[u][4 * e] + q4.y * kr[u][4 * e + 1] + q4.z * kr[u][4 * e + 2] +
                  q4.w * kr[u][4 * e + 3];
        }
      }
#pragma unroll
      for (int off = kLanes / 2; off > 0; off >>= 1) {
#pragma unroll
        for (int u = 0; u < kDecodeUnroll; ++u) s[u] += __shfl_xor_sync(kFullMask, s[u], off);
      }
      float step_max = kNegInf;
#pragma unroll
      for (int u = 0; u < kDecodeUnroll; ++u) {
        if (tpos[u] > last_visible[j]) s[u] = kNegInf;  // past the end: INT_MAX
        step_max = fmaxf(step_max, s[u]);
      }
      const float m_new = fmaxf(m_run[j], step_max);
      if (m_new == kNegInf) continue;  // nothing visible yet for this group
      const float corr = exp2f(m_run[j] - m_new);
      float p[kDecodeUnroll], p_sum = 0.0f;
#pragma unroll
      for (int u = 0; u < kDecodeUnroll; ++u) {
        p[u] = exp2f(s[u] - m_new);
        p_sum += p[u];
      }
      l_run[j] = l_run[j] * corr + p_sum;
      m_run[j] = m_new;
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        float acc = o[j][e] * corr;
#pragma unroll
        for (int u = 0; u < kDecodeUnroll; ++u) acc += p[u] * vr[u][e];
        o[j][e] = acc;
      }
    }
  }

  // Merge the groups' states.
#pragma unroll
  for (int j = 0; j < QMAX; ++j) {
#pragma unroll
    for (int e = 0; e < kVec; ++e) o_s[(gid * QMAX + j) * HD + gl * kVec + e] = o[j][e];
    if (gl == 0) {
      ml_s[(gid * QMAX + j) * 2] = m_run[j];
      ml_s[(gid * QMAX + j) * 2 + 1] = l_run[j];
    }
  }
  __syncthreads();
  write_merged_states<HD, kGroups>(a, o_s, ml_s, QMAX, nq, q0, kvh, split, kDecodeThreads);
}

// ---- prefill kernel -------------------------------------------------------------------------

constexpr int kPrefillThreads = 128;  // 16 x 8: ty picks query rows, tx picks keys / dims
constexpr int kPrefillKeys = 32;      // keys per tile

template <int HD>
struct PrefillLayout {
  static constexpr int kRows = HD <= 128 ? 4 : 2;  // query rows per thread
  static constexpr int kTileRows = 16 * kRows;     // query rows per block
  static constexpr int kStride = HD + 4;           // padded smem row: conflict-free float4
  static constexpr int kChunks = HD / 32;          // float4 output chunks per thread
};

template <int HD>
constexpr size_t prefill_smem_bytes() {
  using L = PrefillLayout<HD>;
  return sizeof(float) * size_t{L::kTileRows + 2 * kPrefillKeys} * L::kStride;
}

// Grid: x = tile of kTileRows query rows, y = query head, z = KV split. Thread (ty, tx) owns
// query rows ty + 16 i, keys tx + 8 j of each key tile and output dims 4 tx + 32 c (+0..3).
// K/V tiles are converted to f32 as they enter shared memory.
template <int HD, typename T>
__global__ void __launch_bounds__(kPrefillThreads) attention_prefill_kernel(AttentionArgs a) {
  pdl_begin();
  using L = PrefillLayout<HD>;
  constexpr int R = L::kRows, TR = L::kTileRows, LD = L::kStride, C = L::kChunks;
  constexpr int BK = kPrefillKeys;
  extern __shared__ float4 smem4[];
  float* q_s = reinterpret_cast<float*>(smem4);  // [TR][LD]
  float* k_s = q_s + TR * LD;                    // [BK][LD]
  float* v_s = k_s + BK * LD;                    // [BK][LD]

  const int head = blockIdx.y;
  const int kvh = head / (a.num_heads / a.num_kv_heads);
  const int split = blockIdx.z;
  const int r0 = blockIdx.x * TR;
  const int rows = min(TR, a.m - r0);
  const int tid = threadIdx.x, ty = tid / 8, tx = tid % 8;
  const int64_t q_row_len = static_cast<int64_t>(a.num_heads) * HD;

  for (int e = tid; e < TR * (HD / 4); e += kPrefillThreads) {
    const int r = e / (HD / 4), c4 = e % (HD / 4);
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (r < rows) {
      v = *reinterpret_cast<const float4*>(a.q + (r0 + r) * q_row_len +
                                           static_cast<int64_t>(head) * HD + 4 * c4);
      v.x *= a.scale_log2, v.y *= a.scale_log2, v.z *= a.scale_log2, v.w *= a.scale_log2;
    }
    *reinterpret_cast<float4*>(q_s + r * LD + 4 * c4) = v;
  }

  // Keys this tile can see: [0, pos + r0 + rows), cut to this split's range.
  const int t_begin = split * a.split_len;
  const int t_end = min(a.pos + r0 + rows, t_begin + a.split_len);

  float m_i[R], l_i[R];  // l_i: this thread's share of the row sum (its keys), reduced at the end
  float4 o[R][C];
#pragma unroll
  for (int i = 0; i < R; ++i) {
    m_i[i] = kNegInf;
    l_i[i] = 0.0f;
#pragma unroll
    for (int c = 0; c < C; ++c) o[i][c] = make_float4(0.f, 0.f, 0.f, 0.f);
  }

  const T* k_head = static_cast<const T*>(a.k) + static_cast<int64_t>(kvh) * HD;
  const T* v_head = static_cast<const T*>(a.v) + static_cast<int64_t>(kvh) * HD;
  for (int kt0 = t_begin; kt0 < t_end; kt0 += BK) {
    __syncthreads();  // the previous tile is consumed (and q_s is written on the first pass)
    for (int e = tid; e < BK * (HD / 4); e += kPrefillThreads) {
      const int r = e / (HD / 4), c4 = e % (HD / 4);
      float4 kv = make_float4(0.f, 0.f, 0.f, 0.f), vv = kv;
      if (kt0 + r < t_end) {
        const int64_t off = (kt0 + r) * a.row_stride + 4 * c4;
        kv = load4_kv(k_head + off);
        vv = load4_kv(v_head + off);
      }
      *reinterpret_cast<float4*>(k_s + r * LD + 4 * c4) = kv;
      *reinterpret_cast<float4*>(v_s + r * LD + 4 * c4) = vv;
    }
    __syncthreads();

    float s[R][4];
#pragma unroll
    for (int i = 0; i < R; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
#pragma unroll 4
    for (int d4 = 0; d4 < HD / 4; ++d4) {
      float4 qv[R], kv[4];
#pragma unroll
      for (int i = 0; i < R; ++i)
        qv[i] = *reinterpret_cast<const float4*>(q_s + (ty + 16 * i) * LD + 4 * d4);
#pragma unroll
      for (int j = 0; j < 4; ++j)
        kv[j] = *reinterpret_cast<const float4*>(k_s + (tx + 8 * j) * LD + 4 * d4);
#pragma unroll
      for (int i = 0; i < R; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          s[i][j] += qv[i].x * kv[j].x + qv[i].y * kv[j].y + qv[i].z * kv[j].z + qv[i].w * kv[j].w;
        }
      }
    }

    float p[R][4];
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int q_pos = a.pos + r0 + ty + 16 * i;
      float tile_max = kNegInf;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int t = kt0 + tx + 8 * j;
        if (t >= t_end || t > q_pos) s[i][j] = kNegInf;
        tile_max = fmaxf(tile_max, s[i][j]);
      }
      tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullMask, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullMask, tile_max, 2));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullMask, tile_max, 4));
      const float m_new = fmaxf(m_i[i], tile_max);
      if (m_new == kNegInf) {
        p[i][0] = p[i][1] = p[i][2] = p[i][3] = 0.0f;
        continue;
      }
      const float corr = exp2f(m_i[i] - m_new);
      m_i[i] = m_new;
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        p[i][j] = exp2f(s[i][j] - m_new);
        sum += p[i][j];
      }
      l_i[i] = l_i[i] * corr + sum;
#pragma unroll
      for (int c = 0; c < C; ++c) {
        o[i][c].x *= corr, o[i][c].y *= corr, o[i][c].z *= corr, o[i][c].w *= corr;
      }
    }

    // O += P V: the probability of key t for row i sits in lane (t % 8) of this row's 8 lanes.
    const int lane_base = (tid % 32) & ~7;
#pragma unroll
    for (int t = 0; t < BK; ++t) {
      float pt[R];
#pragma unroll
      for (int i = 0; i < R; ++i) pt[i] = __shfl_sync(kFullMask, p[i][t / 8], lane_base + t % 8);
#pragma unroll
      for (int c = 0; c < C; ++c) {
        const float4 v4 = *reinterpret_cast<const float4*>(v_s + t * LD + 4 * tx + 32 * c);
#pragma unroll
        for (int i = 0; i < R; ++i) {
          o[i][c].x += pt[i] * v4.x, o[i][c].y += pt[i] * v4.y;
          o[i][c].z += pt[i] * v4.z, o[i][c].w += pt[i] * v4.w;
        }
      }
    }
  }

  const int64_t num_qv = static_cast<int64_t>(a.m) * a.num_heads;
#pragma unroll
  for (int i = 0; i < R; ++i) {
    float l = l_i[i];
    l += __shfl_xor_sync(kFullMask, l, 1);
    l += __shfl_xor_sync(kFullMask, l, 2);
    l += __shfl_xor_sync(kFullMask, l, 4);
    const int r = ty + 16 * i;
    if (r >= rows) continue;
    const int64_t qi = static_cast<int64_t>(r0 + r) * a.num_heads + head;
    if (a.num_splits == 1) {
      const float inv = 1.0f / l;
#pragma unroll
      for (int c = 0; c < C; ++c) {
        const float4 v =
            make_float4(o[i][c].x * inv, o[i][c].y * inv, o[i][c].z * inv, o[i][c].w * inv);
        *reinterpret_cast<float4*>(a.out + qi * HD + 4 * tx + 32 * c) = v;
      }
    } else {
      const int64_t slot = static_cast<int64_t>(split) * num_qv + qi;
#pragma unroll
      for (int c = 0; c < C; ++c) {
        *reinterpret_cast<float4*>(a.partial_o + slot * HD + 4 * tx + 32 * c) = o[i][c];
      }
      if (tx == 0) {
        a.partial_ml[slot * 2] = m_i[i];
        a.partial_ml[slot * 2 + 1] = l;
      }
    }
  }
}

// ---- combine kernel -------------------------------------------------------------------------

constexpr int kCombineThreads = 256;  // 8 warps per query vector

// One block per query vector qi (row * num_heads + head): out[qi] = sum_s w_s o_s / sum_s w_s l_s,
// w_s = 2^(m_s - max m). The warps take the splits round-robin, so the loads of 8+ splits are in
// flight at once (one thread per channel looping over the splits was a chain of dependent L2
// round trips, ~0.3 us per split on the H200), and the warps' sums meet in shared memory. A split
// that saw nothing has m = -inf, weight 0. Partials 16-byte aligned.
template <int HD>
__global__ void __launch_bounds__(kCombineThreads)
    attention_combine_kernel(const float* __restrict__ partial_o,
                             const float* __restrict__ partial_ml, int splits, int64_t num_qv,
                             float* __restrict__ out) {
  pdl_begin();
  constexpr int kWarps = kCombineThreads / 32;
  constexpr int kC = HD / 32;  // channels per lane
  __shared__ float red_m[kWarps];
  __shared__ float red_l[kWarps];
  __shared__ __align__(16) float red_o[kWarps][HD];
  const int64_t qi = blockIdx.x;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

  float mx = kNegInf;
  for (int s = threadIdx.x; s < splits; s += kCombineThreads) {
    mx = fmaxf(mx, __ldg(partial_ml + (s * num_qv + qi) * 2));
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, off));
  if (lane == 0) red_m[warp] = mx;
  __syncthreads();
  float m_tot = red_m[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) m_tot = fmaxf(m_tot, red_m[w]);

  float acc[kC], l_sum = 0.0f;
#pragma unroll
  for (int c = 0; c < kC; ++c) acc[c] = 0.0f;
#pragma unroll 4
  for (int s = warp; s < splits; s += kWarps) {
    const int64_t slot = s * num_qv + qi;
    const float2 ml = __ldg(reinterpret_cast<const float2*>(partial_ml + slot * 2));
    float x[kC];
    load_f32<kC>(partial_o + slot * HD + lane * kC, x);
    const float wgt = merge_weight(ml.x, m_tot);
    l_sum = fmaf(wgt, ml.y, l_sum);
#pragma unroll
    for (int c = 0; c < kC; ++c) acc[c] = fmaf(wgt, x[c], acc[c]);
  }
#pragma unroll
  for (int c = 0; c < kC; ++c) red_o[warp][lane * kC + c] = acc[c];
  if (lane == 0) red_l[warp] = l_sum;  // the same in every lane
  __syncthreads();
  for (int d = threadIdx.x; d < HD; d += kCombineThreads) {
    float o = 0.0f, l = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      o += red_o[w][d];
      l += red_l[w];
    }
    out[qi * HD + d] = o / l;
  }
}

template <int HD>
void combine_for_head_dim(const AttentionArgs& a, int64_t num_qv, cudaStream_t stream) {
  launch(attention_combine_kernel<HD>, static_cast<unsigned>(num_qv), kCombineThreads, 0, stream,
         a.partial_o, a.partial_ml, a.num_splits, num_qv, a.out);
  CUDA_CHECK_LAUNCH(stream);
}

// ---- launch helpers -------------------------------------------------------------------------

void check_args(const AttentionArgs& a) {
  QS_CHECK(a.m >= 1 && a.pos >= 0);
  QS_CHECK(a.num_kv_heads >= 1 && a.num_heads % a.num_kv_heads == 0);
  QS_CHECK_MSG(attention_head_dim_supported(a.head_dim), "attention: unsupported head_dim");
  QS_CHECK_MSG(a.kv_dtype == DType::F32 || a.kv_dtype == DType::F16,
               "attention: KV rows are F32 or F16");
  QS_CHECK(a.row_stride >= static_cast<int64_t>(a.num_kv_heads) * a.head_dim);
  QS_CHECK_MSG(a.row_stride % 4 == 0, "attention: KV row stride must be a multiple of 4 elements");
  const uintptr_t bits = reinterpret_cast<uintptr_t>(a.q) | reinterpret_cast<uintptr_t>(a.out);
  QS_CHECK_MSG(bits % 16 == 0, "attention: q and out must be 16-byte aligned");
  // K/V are read 4 elements at a time: 16 bytes (f32) or 8 bytes (f16).
  const uintptr_t kv_bits = reinterpret_cast<uintptr_t>(a.k) | reinterpret_cast<uintptr_t>(a.v);
  QS_CHECK_MSG(kv_bits % (4 * dtype_size(a.kv_dtype)) == 0,
               "attention: k and v must be aligned to 4 elements");
  QS_CHECK(a.num_splits >= 1 && a.num_splits <= 65535);
  QS_CHECK(a.split_len >= 1);
  QS_CHECK(static_cast<int64_t>(a.num_splits) * a.split_len >= a.seq_len());
  QS_CHECK(a.num_splits == 1 || (a.partial_o != nullptr && a.partial_ml != nullptr));
  QS_CHECK(!a.selected || (a.sel_count >= 0 && a.sel_dense_from >= 0 &&
                           a.sel_dense_from <= a.pos && (a.sel_count == 0 || a.sel_positions)));
}

template <typename Kernel>
void set_smem(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024) {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(bytes)));
  }
}

template <int HD, int QMAX, typename T, bool WIDE>
void decode_with_type(const AttentionArgs& a, cudaStream_t stream) {
  constexpr size_t smem = decode_smem_bytes<HD, QMAX, WIDE>();
  static const bool configured = (set_smem(attention_decode_kernel<HD, QMAX, T, WIDE>, smem), true);
  (void)configured;
  const int group = a.num_heads / a.num_kv_heads;
  const int tiles = (group * a.m + QMAX - 1) / QMAX;
  const dim3 grid(tiles, a.num_splits, a.num_kv_heads);
  launch(attention_decode_kernel<HD, QMAX, T, WIDE>, grid, kDecodeThreads, smem, stream, a);
  CUDA_CHECK_LAUNCH(stream);
}

// f16 rows take the wide layout when every row is 16-byte aligned and the query tile is small
// enough for its registers (kVec 8 x QMAX accumulators per lane, as head_dim 256 at QMAX 8).
// Measured (bench_ops attn, H200, 32K, us): MHA m=1 179 wide vs 284 narrow, MHA m=8 765 vs 906,
// but GQA-8 m=1 (QMAX 8 from one row) 127 wide vs 115 narrow: the 185-register wide tile halves
// the blocks per SM of an instruction-bound kernel. So GQA tiles of more than 4 stay narrow.
bool decode_f16_wide(const AttentionArgs& a, int qmax) {
  const uintptr_t bits = reinterpret_cast<uintptr_t>(a.k) | reinterpret_cast<uintptr_t>(a.v);
  const bool mha = a.num_heads == a.num_kv_heads;
  return a.row_stride % 8 == 0 && bits % 16 == 0 && qmax <= (mha ? 8 : 4);
}

template <int HD, int QMAX>
void decode_with(const AttentionArgs& a, cudaStream_t stream) {
  if (a.kv_dtype == DType::F16) {
    if constexpr (QMAX <= 8 && HD >= 64) {
      if (decode_f16_wide(a, QMAX)) {
        decode_with_type<HD, QMAX, __half, true>(a, stream);
        return;
      }
    }
    decode_with_type<HD, QMAX, __half, false>(a, stream);
  } else {
    decode_with_type<HD, QMAX, float, false>(a, stream);
  }
}

template <int HD>
int decode_qmax(int q_per_kv_head) {
  const int cap = HD >= 256 ? 8 : 16;  // HD 256 at 16 queries would spill registers
  int q = 1;
  while (q < q_per_kv_head && q < cap) q *= 2;
  return q;
}

template <int HD>
void decode_for_head_dim(const AttentionArgs& a, cudaStream_t stream) {
  const int q_per_kv_head = (a.num_heads / a.num_kv_heads) * a.m;
  switch (decode_qmax<HD>(q_per_kv_head)) {
    case 1:
      decode_with<HD, 1>(a, stream);
      break;
    case 2:
      decode_with<HD, 2>(a, stream);
      break;
    case 4:
      decode_with<HD, 4>(a, stream);
      break;
    case 8:
      decode_with<HD, 8>(a, stream);
      break;
    default:
      if constexpr (HD < 256) decode_with<HD, 16>(a, stream);
      break;
  }
}

template <int HD, typename T>
void prefill_with_type(const AttentionArgs& a, cudaStream_t stream) {
  constexpr size_t smem = prefill_smem_bytes<HD>();
  static const bool configured = (set_smem(attention_prefill_kernel<HD, T>, smem), true);
  (void)configured;
  const int tiles = (a.m + PrefillLayout<HD>::kTileRows - 1) / PrefillLayout<HD>::kTileRows;
  QS_CHECK(a.num_heads <= 65535);
  const dim3 grid(tiles, a.num_heads, a.num_splits);
  launch(attention_prefill_kernel<HD, T>, grid, kPrefillThreads, smem, stream, a);
  CUDA_CHECK_LAUNCH(stream);
}

template <int HD>
void prefill_for_head_dim(const AttentionArgs& a, cudaStream_t stream) {
  if (a.kv_dtype == DType::F16) {
    prefill_with_type<HD, __half>(a, stream);
  } else {
    prefill_with_type<HD, float>(a, stream);
  }
}

}  // namespace

// ---- launchers ------------------------------------------------------------------------------

bool attention_head_dim_supported(int head_dim) {
  return head_dim == 32 || head_dim == 64 || head_dim == 128 || head_dim == 256;
}

int attention_decode_query_tiles(const AttentionArgs& a) {
  const int q_per_kv_head = (a.num_heads / a.num_kv_heads) * a.m;
  int qmax = 16;
  switch (a.head_dim) {
    case 32:
      qmax = decode_qmax<32>(q_per_kv_head);
      break;
    case 64:
      qmax = decode_qmax<64>(q_per_kv_head);
      break;
    case 128:
      qmax = decode_qmax<128>(q_per_kv_head);
      break;
    case 256:
      qmax = decode_qmax<256>(q_per_kv_head);
      break;
    default:
      QS_CHECK_MSG(false, "attention: unsupported head_dim");
  }
  return (q_per_kv_head + qmax - 1) / qmax;
}

int attention_prefill_query_tiles(const AttentionArgs& a) {
  const int tile_rows =
      a.head_dim <= 128 ? PrefillLayout<128>::kTileRows : PrefillLayout<256>::kTileRows;
  return (a.m + tile_rows - 1) / tile_rows;
}

void launch_attention_decode(const AttentionArgs& a, cudaStream_t stream) {
  check_args(a);
  QS_CHECK(a.m <= 16);
  QS_CHECK(a.num_kv_heads <= 65535);
  switch (a.head_dim) {
    case 32:
      decode_for_head_dim<32>(a, stream);
      break;
    case 64:
      decode_for_head_dim<64>(a, stream);
      break;
    case 128:
      decode_for_head_dim<128>(a, stream);
      break;
    case 256:
      decode_for_head_dim<256>(a, stream);
      break;
    default:
      QS_CHECK_MSG(false, "attention: unsupported head_dim");
  }
  if (a.num_splits > 1) launch_attention_combine(a, stream);
}

void launch_attention_prefill(const AttentionArgs& a, cudaStream_t stream) {
  QS_CHECK_MSG(!a.selected,
               "attention: a KV selection (sparse draft) runs through the decode kernel only");
  check_args(a);
  switch (a.head_dim) {
    case 32:
      prefill_for_head_dim<32>(a, stream);
      break;
    case 64:
      prefill_for_head_dim<64>(a, stream);
      break;
    case 128:
      prefill_for_head_dim<128>(a, stream);
      break;
    case 256:
      prefill_for_head_dim<256>(a, stream);
      break;
    default:
      QS_CHECK_MSG(false, "attention: unsupported head_dim");
  }
  if (a.num_splits > 1) launch_attention_combine(a, stream);
}

void launch_attention_combine(const AttentionArgs& a, cudaStream_t stream) {
  const int64_t num_qv = static_cast<int64_t>(a.m) * a.num_heads;
  QS_CHECK(num_qv >= 1 && num_qv <= 0x7fffffff && a.num_splits >= 1);
  const uintptr_t bits =
      reinterpret_cast<uintptr_t>(a.partial_o) | reinterpret_cast<uintptr_t>(a.partial_ml);
  QS_CHECK_MSG(bits % 16 == 0, "attention combine: partials must be 16-byte aligned");
  switch (a.head_dim) {
    case 32:
      combine_for_head_dim<32>(a, num_qv, stream);
      break;
    case 64:
      combine_for_head_dim<64>(a, num_qv, stream);
      break;
    case 128:
      combine_for_head_dim<128>(a, num_qv, stream);
      break;
    case 256:
      combine_for_head_dim<256>(a, num_qv, stream);
      break;
    default:
      QS_CHECK_MSG(false, "attention combine: unsupported head_dim");
  }
}

}  // namespace qs::cuda
