// Backend::snapkv_scores on the device: SnapKV's observation scores of one layer (the window's
// causal softmax over the prompt's keys, summed per candidate key), f32 CUDA-core arithmetic.
// Not bandwidth-critical (once per prompt, about two passes over one layer's keys), so the design
// is the plain one:
//  1. partials: a block per (chunk of kKeys keys, kv head) holds its keys in shared memory and
//     runs over the head's query vectors in tiles of kQueryTile; per query vector it writes the
//     (max, sum of exp) of its visible scores in the chunk;
//  2. merge: per query vector, the chunks' partials into (max, 1 / sum);
//  3. scores: a block per (chunk of candidate keys, kv head) recomputes the same scores (same
//     code) and sums exp(s - max) / sum over the query vectors that see each key.
// Every sum has a fixed order, so the results do not depend on scheduling.
#include <cuda_fp16.h>

#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/launch.cuh"

namespace qs::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kKeys = 64;                             // keys per block: a lane owns 2
constexpr int kQueriesPerWarp = 2;                    // query vectors of a tile per warp
constexpr int kQueryTile = kWarps * kQueriesPerWarp;  // query vectors per tile
template <int HD>
constexpr int kKeyPitch = HD + 4;  // floats per key row in shared memory: the float4 reads of a
                                   // quarter warp (8 lanes, 8 rows) fall on distinct banks

template <int HD>
constexpr size_t smem_bytes() {
  return sizeof(float) * (static_cast<size_t>(kKeys) * kKeyPitch<HD> + kQueryTile * HD);
}

__device__ __forceinline__ int group_size(const SnapKvScoresArgs& a) {
  return a.num_heads / a.num_kv_heads;
}

// The window row of query vector j (j = g * window + i: group member g, row i; the CPU's
// order). It sees the keys [0, q0 + i], q0 = prompt_len - window.
__device__ __forceinline__ int last_visible(const SnapKvScoresArgs& a, int j) {
  return a.prompt_len - a.window + j % a.window;
}

// Keys [first, first + kKeys) of kv head h as f32 into k_s ([kKeys][kKeyPitch]); rows at or past
// `end` are zero (never counted: the callers mask them).
template <int HD, typename T>
__device__ void load_keys(const SnapKvScoresArgs& a, int h, int first, int end, float* k_s) {
  constexpr int kVecs = HD / 4;
  const T* k = static_cast<const T*>(a.k) + static_cast<int64_t>(h) * HD;
  for (int v = threadIdx.x; v < kKeys * kVecs; v += kThreads) {
    const int r = v / kVecs, c = (v % kVecs) * 4;
    const int t = first + r;
    const float4 x = t < end ? load4_kv(k + t * a.row_stride + c) : make_float4(0, 0, 0, 0);
    *reinterpret_cast<float4*>(k_s + r * kKeyPitch<HD> + c) = x;
  }
}

// Query vectors [j0, j0 + kQueryTile) of kv head h into q_s ([kQueryTile][HD]); vectors past
// the group's (group * window) are zero.
template <int HD>
__device__ void load_queries(const SnapKvScoresArgs& a, int h, int j0, float* q_s) {
  constexpr int kVecs = HD / 4;
  const int group = group_size(a), nq = group * a.window;
  for (int v = threadIdx.x; v < kQueryTile * kVecs; v += kThreads) {
    const int r = v / kVecs, c = (v % kVecs) * 4;
    const int j = j0 + r;
    float4 x = make_float4(0, 0, 0, 0);
    if (j < nq) {
      const int g = j / a.window, i = j % a.window;
      const int64_t head = static_cast<int64_t>(i) * a.num_heads + h * group + g;
      x = __ldg(reinterpret_cast<const float4*>(a.q + head * HD + c));
    }
    *reinterpret_cast<float4*>(q_s + r * HD + c) = x;
  }
}

// The scaled scores of the warp's query vectors (tile rows warp * kQueriesPerWarp + qq) against
// the lane's keys (chunk rows lane and lane + 32). Passes 1 and 3 both call it on the same
// shared data: pass 3 recomputes, with the same arithmetic, the scores pass 1 normalized.
template <int HD>
__device__ __forceinline__ void tile_scores(const float* k_s, const float* q_s, float scale,
                                            float (&s)[kQueriesPerWarp][2]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float* k0 = k_s + lane * kKeyPitch<HD>;
  const float* k1 = k_s + (lane + 32) * kKeyPitch<HD>;
  const float* q = q_s + warp * kQueriesPerWarp * HD;
#pragma unroll
  for (int qq = 0; qq < kQueriesPerWarp; ++qq) s[qq][0] = s[qq][1] = 0.0f;
#pragma unroll 8
  for (int d = 0; d < HD; d += 4) {
    const float4 a = *reinterpret_cast<const float4*>(k0 + d);
    const float4 b = *reinterpret_cast<const float4*>(k1 + d);
#pragma unroll
    for (int qq = 0; qq < kQueriesPerWarp; ++qq) {
      const float4 x = *reinterpret_cast<const float4*>(q + qq * HD + d);  // a broadcast
      s[qq][0] += x.x * a.x + x.y * a.y + x.z * a.z + x.w * a.w;
      s[qq][1] += x.x * b.x + x.y * b.y + x.z * b.z + x.w * b.w;
    }
  }
  // An explicit rounding: no FMA may fold the scale into a later subtraction in one pass only.
#pragma unroll
  for (int qq = 0; qq < kQueriesPerWarp; ++qq) {
    s[qq][0] = __fmul_rn(s[qq][0], scale);
    s[qq][1] = __fmul_rn(s[qq][1], scale);
  }
}

// Keys [first, first + kKeys) of kv head h (rows at or past k_end zero) in k_s against every
// query vector of the head, a tile of them in q_s at a time: fn(j, s0, s1, last) for each of this
// warp's query vectors j (warp-uniform), with s0 / s1 the scaled scores of the lane's keys
// first + lane and first + lane + 32 and `last` the last key j sees. Passes 1 and 3 run it on the
// same data, so pass 3 recomputes exactly the scores pass 1 normalized.
template <int HD, typename T, class Fn>
__device__ __forceinline__ void for_each_query_scores(const SnapKvScoresArgs& a, int h, int first,
                                                      int k_end, float* k_s, float* q_s,
                                                      const Fn& fn) {
  const int warp = threadIdx.x / 32;
  const int nq = group_size(a) * a.window;
  load_keys<HD, T>(a, h, first, k_end, k_s);
  for (int j0 = 0; j0 < nq; j0 += kQueryTile) {
    __syncthreads();  // the previous tile's reads of q_s are done
    load_queries<HD>(a, h, j0, q_s);
    __syncthreads();
    float s[kQueriesPerWarp][2];
    tile_scores<HD>(k_s, q_s, a.scale, s);
#pragma unroll
    for (int qq = 0; qq < kQueriesPerWarp; ++qq) {
      const int j = j0 + warp * kQueriesPerWarp + qq;  // warp-uniform
      if (j < nq) fn(j, s[qq][0], s[qq][1], last_visible(a, j));
    }
  }
}

// Pass 1. Block (chunk blockIdx.x of the prompt's keys, kv head blockIdx.y). partial: [kv heads,
// group * window, chunks] (max, sum of exp(s - max)) over the chunk's keys the query vector
// sees; (-inf, 0) for none.
template <int HD, typename T>
__global__ void __launch_bounds__(kThreads)
    snapkv_partials_kernel(const SnapKvScoresArgs a, float2* partial) {
  pdl_begin();
  extern __shared__ float4 smem4[];
  float* k_s = reinterpret_cast<float*>(smem4);
  float* q_s = k_s + kKeys * kKeyPitch<HD>;
  const int h = blockIdx.y, chunk = blockIdx.x, chunks = gridDim.x;
  const int first = chunk * kKeys;
  const int lane = threadIdx.x % 32;
  const int nq = group_size(a) * a.window;
  for_each_query_scores<HD, T>(
      a, h, first, a.prompt_len, k_s, q_s, [&](int j, float s0, float s1, int last) {
        s0 = first + lane <= last ? s0 : -INFINITY;
        s1 = first + lane + 32 <= last ? s1 : -INFINITY;
        const float m = warp_max(fmaxf(s0, s1));
        // m is warp-uniform; -inf: the query sees no key of this chunk.
        const float l = m == -INFINITY ? 0.0f : warp_sum(expf(s0 - m) + expf(s1 - m));
        if (lane == 0) {
          partial[(static_cast<int64_t>(h) * nq + j) * chunks + chunk] = make_float2(m, l);
        }
      });
}

// Pass 2. A warp per query vector (rows = kv heads * group * window): ml[row] = (max, 1 / sum)
// of its softmax, from its chunks' partials. Every query vector sees key 0, so the max is
// finite and the sum >= 1.
__global__ void __launch_bounds__(kThreads)
    snapkv_merge_kernel(const float2* partial, int rows, int chunks, float2* ml) {
  pdl_begin();
  const int row = blockIdx.x * kWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= rows) return;  // warp-uniform
  const float2* p = partial + static_cast<int64_t>(row) * chunks;
  float m = -INFINITY;
  for (int c = lane; c < chunks; c += 32) m = fmaxf(m, p[c].x);
  m = warp_max(m);
  float l = 0.0f;
  for (int c = lane; c < chunks; c += 32) {
    const float2 x = p[c];
    if (x.y > 0.0f) l += x.y * expf(x.x - m);
  }
  l = warp_sum(l);
  if (lane == 0) ml[row] = make_float2(m, 1.0f / l);
}

// Pass 3. Block (chunk blockIdx.x of the candidates [0, past), kv head blockIdx.y):
// scores[h * past + t] = sum over the query vectors j that see t of exp(s_jt - max_j) / sum_j.
template <int HD, typename T>
__global__ void __launch_bounds__(kThreads)
    snapkv_scores_kernel(const SnapKvScoresArgs a, const float2* ml) {
  pdl_begin();
  extern __shared__ float4 smem4[];
  float* k_s = reinterpret_cast<float*>(smem4);
  float* q_s = k_s + kKeys * kKeyPitch<HD>;
  const int h = blockIdx.y, first = blockIdx.x * kKeys;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int nq = group_size(a) * a.window;
  const float2* head_ml = ml + static_cast<int64_t>(h) * nq;
  float acc0 = 0.0f, acc1 = 0.0f;  // the lane's keys, over the warp's query vectors
  for_each_query_scores<HD, T>(a, h, first, a.past, k_s, q_s,
                               [&](int j, float s0, float s1, int last) {
                                 const float2 st = head_ml[j];
                                 if (first + lane <= last) acc0 += expf(s0 - st.x) * st.y;
                                 if (first + lane + 32 <= last) acc1 += expf(s1 - st.x) * st.y;
                               });
  // The warps' sums per key, added in warp order (q_s is free again: kWarps * kKeys floats fit
  // in kQueryTile * HD for HD >= 32).
  static_assert(kWarps * kKeys <= kQueryTile * 32);
  __syncthreads();
  float* warp_sums = q_s;  // [kWarps][kKeys]
  warp_sums[warp * kKeys + lane] = acc0;
  warp_sums[warp * kKeys + lane + 32] = acc1;
  __syncthreads();
  const int t = first + static_cast<int>(threadIdx.x);
  if (threadIdx.x < kKeys && t < a.past) {
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += warp_sums[w * kKeys + threadIdx.x];
    a.scores[static_cast<int64_t>(h) * a.past + t] = sum;
  }
}

int chunks_of(int keys) {
  return (keys + kKeys - 1) / kKeys;
}

int query_rows(const SnapKvScoresArgs& a) {
  return a.num_heads / a.num_kv_heads * a.window * a.num_kv_heads;
}

template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  QS_CHECK_MSG(bytes <= max_smem_per_block(),
               "snapkv_scores: the kernel's shared memory exceeds the device's");
  if (bytes > 48 * 1024) {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(bytes)));
  }
}

template <int HD, typename T>
void launch_passes(const SnapKvScoresArgs& a, float2* partial, float2* ml, cudaStream_t stream) {
  constexpr size_t smem = smem_bytes<HD>();
  const int chunks = chunks_of(a.prompt_len);
  const dim3 keys_grid(static_cast<unsigned>(chunks), static_cast<unsigned>(a.num_kv_heads));
  allow_smem(snapkv_partials_kernel<HD, T>, smem);
  launch(snapkv_partials_kernel<HD, T>, keys_grid, kThreads, smem, stream, a, partial);
  CUDA_CHECK_LAUNCH(stream);
  const int rows = query_rows(a);
  launch(snapkv_merge_kernel, dim3(static_cast<unsigned>((rows + kWarps - 1) / kWarps)), kThreads,
         0, stream, static_cast<const float2*>(partial), rows, chunks, ml);
  CUDA_CHECK_LAUNCH(stream);
  const dim3 past_grid(static_cast<unsigned>(chunks_of(a.past)),
                       static_cast<unsigned>(a.num_kv_heads));
  allow_smem(snapkv_scores_kernel<HD, T>, smem);
  launch(snapkv_scores_kernel<HD, T>, past_grid, kThreads, smem, stream, a,
         static_cast<const float2*>(ml));
  CUDA_CHECK_LAUNCH(stream);
}

template <int HD>
void launch_head_dim(const SnapKvScoresArgs& a, float2* partial, float2* ml, cudaStream_t stream) {
  if (a.k_dtype == DType::F16) {
    launch_passes<HD, __half>(a, partial, ml, stream);
  } else {
    launch_passes<HD, float>(a, partial, ml, stream);
  }
}

}  // namespace

size_t snapkv_scores_scratch_bytes(const SnapKvScoresArgs& a) {
  const size_t rows = static_cast<size_t>(query_rows(a));
  return sizeof(float2) * rows * (static_cast<size_t>(chunks_of(a.prompt_len)) + 1);
}

void launch_snapkv_scores(const SnapKvScoresArgs& a, void* scratch, cudaStream_t stream) {
  QS_CHECK(a.window >= 1 && a.window <= a.prompt_len && a.past >= 0 && a.past <= a.prompt_len);
  QS_CHECK(a.num_kv_heads >= 1 && a.num_kv_heads <= 65535 && a.num_heads % a.num_kv_heads == 0);
  QS_CHECK_MSG(a.head_dim == 32 || a.head_dim == 64 || a.head_dim == 128 || a.head_dim == 256,
               "snapkv_scores: the CUDA kernel supports head_dim 32, 64, 128 and 256");
  QS_CHECK_MSG(a.k_dtype == DType::F32 || a.k_dtype == DType::F16,
               "snapkv_scores: rows are F32 or F16");
  QS_CHECK(a.row_stride >= static_cast<int64_t>(a.num_kv_heads) * a.head_dim);
  // Keys and queries are read 4 elements at a time.
  QS_CHECK_MSG(a.row_stride % 4 == 0 &&
                   reinterpret_cast<uintptr_t>(a.k) % (4 * dtype_size(a.k_dtype)) == 0 &&
                   reinterpret_cast<uintptr_t>(a.q) % 16 == 0,
               "snapkv_scores: q and the key rows must be aligned to 4 elements");
  if (a.past == 0) return;
  QS_CHECK(a.q && a.k && a.scores && scratch);
  auto* partial = static_cast<float2*>(scratch);  // [rows, chunks]
  float2* ml = partial + static_cast<size_t>(query_rows(a)) * chunks_of(a.prompt_len);  // [rows]
  switch (a.head_dim) {
    case 32:
      launch_head_dim<32>(a, partial, ml, stream);
      break;
    case 64:
      launch_head_dim<64>(a, partial, ml, stream);
      break;
    case 128:
      launch_head_dim<128>(a, partial, ml, stream);
      break;
    default:
      launch_head_dim<256>(a, partial, ml, stream);
      break;
  }
}

}  // namespace qs::cuda
