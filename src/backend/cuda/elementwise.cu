// Embedding, RMSNorm, RoPE, SwiGLU, add, bias rows, activation splitting, f16 KV row stores and
// the fused ops (add + RMSNorm, RoPE of q and k, a K/V row pair's stores): one thread per element
// (or a block per row), memory-bound.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/norm_row.cuh"
#include "backend/cuda/rope_row.cuh"

namespace qs::cuda {

namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n, int threads = kThreads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<int>(std::min<int64_t>(std::max<int64_t>(b, 1), 1 << 20));
}

// ---- kernels --------------------------------------------------------------------------------

template <typename T>
__global__ void embedding_kernel(const T* table, int64_t cols, const int32_t* ids_device,
                                 InlineIds inline_ids, int m, float* out) {
  pdl_begin();
  // Token rows strided over grid.y (at most 65535 blocks): a whole prompt in one launch.
  for (int i = blockIdx.y; i < m; i += gridDim.y) {
    const int64_t id = ids_device ? ids_device[i] : inline_ids.ids[i];
    const T* src = table + id * cols;
    float* dst = out + static_cast<int64_t>(i) * cols;
    for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < cols;
         j += int64_t(gridDim.x) * blockDim.x) {
      dst[j] = to_float(src[j]);
    }
  }
}

// A block per row: out = RMSNorm of x's row, or with ADD of h's row after h += x (each thread
// stores its sums h[j] + x[j] and squares them in the order it squares x's elements without ADD,
// so the same block size gives add-then-RMSNorm's bits; read back from its own stores where the
// row takes several chunks). The sum of squares is accumulated in double, as the CPU reference
// does, so the reduction order does not matter. out aliases neither h nor x with ADD; without
// it out may be x (h unused).
template <bool ADD>
__global__ void __launch_bounds__(1024)
    rmsnorm_kernel(float* h, const float* x, const void* weight, DType weight_dtype, int64_t d,
                   float eps, float* out) {
  float w[kNormPer];
  load_weight_chunk(weight, weight_dtype, 0, d, w);  // weights: not written by any kernel
  pdl_begin();
  __shared__ double warp_sums[32];
  const int64_t row = blockIdx.x;
  const float* xr = x + row * d;
  normalize_row<false, ADD>(ADD ? h + row * d : xr, xr, weight, weight_dtype, d, eps, w, warp_sums,
                            out + row * d);
}

// Rotates pair idx (of [m, num_heads, head_dim / 2]) of x. The angle is the f32 product (HF),
// cos/sin are evaluated in double and rounded, matching the CPU reference's correctly rounded f32
// values.
// Returns the pair's first element's offset in x (the second is head_dim / 2 further).
__device__ __forceinline__ int64_t rope_pair(float* x, int64_t idx, int num_heads, int head_dim,
                                             int pos, const RopeFreqs& freqs) {
  const int half = head_dim / 2;
  const int j = static_cast<int>(idx % half);
  const int64_t row_head = idx / half;  // row * num_heads + head
  const int i = static_cast<int>(row_head / num_heads);
  float* xh = x + row_head * head_dim;
  const float2 r = rope_rotate(xh[j], xh[j + half], static_cast<float>(pos + i), freqs.inv_freq[j]);
  xh[j] = r.x;
  xh[j + half] = r.y;
  return row_head * head_dim + j;
}

// A thread per (row, head, pair).
__global__ void rope_kernel(float* x, int m, int num_heads, int head_dim, int pos,
                            RopeFreqs freqs) {
  pdl_begin();
  const int64_t total = static_cast<int64_t>(m) * num_heads * (head_dim / 2);
  const int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (idx >= total) return;
  rope_pair(x, idx, num_heads, head_dim, pos, freqs);
}

// rope_kernel over q's pairs, then k's, in one grid (a thread per pair of either).
__global__ void rope_qk_kernel(float* q, float* k, int m, int num_heads, int num_kv_heads,
                               int head_dim, int pos, RopeFreqs freqs) {
  pdl_begin();
  const int half = head_dim / 2;
  const int64_t q_total = static_cast<int64_t>(m) * num_heads * half;
  const int64_t total = q_total + static_cast<int64_t>(m) * num_kv_heads * half;
  const int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (idx >= total) return;
  if (idx < q_total) {
    rope_pair(q, idx, num_heads, head_dim, pos, freqs);
  } else {
    rope_pair(k, idx - q_total, num_kv_heads, head_dim, pos, freqs);
  }
}

__global__ void swiglu_kernel(const float* gate, const float* up, int64_t n, float* out) {
  pdl_begin();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    out[i] = swiglu_of(gate[i], up[i]);
  }
}

__global__ void add_kernel(float* y, const float* x, int64_t n) {
  pdl_begin();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    y[i] += x[i];
  }
}

__global__ void add4_kernel(float4* y, const float4* x, int64_t n4) {
  pdl_begin();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n4;
       i += int64_t(gridDim.x) * blockDim.x) {
    float4 a = y[i];
    const float4 b = x[i];
    a.x += b.x;
    a.y += b.y;
    a.z += b.z;
    a.w += b.w;
    y[i] = a;
  }
}

__global__ void add_bias_rows_kernel(float* y, int64_t total, int64_t n, const void* bias,
                                     DType bias_dtype) {
  pdl_begin();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    y[i] += load_as_float(bias, bias_dtype, i % n);
  }
}

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

template <typename T>
__global__ void split_kernel(const float* x, int64_t n, T* hi, T* lo) {
  pdl_begin();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float v = x[i];
    const T h = from_float<T>(v);
    hi[i] = h;
    if (lo) lo[i] = from_float<T>(v - to_float(h));
  }
}

// One or two row ranges of the same length n (blockIdx.y 0: src0 -> dst0, 1: src1 -> dst1; a
// single store launches one row of blocks), so that a K/V row pair is one launch.
__global__ void store_f16_kernel(const float* __restrict__ src0, const float* __restrict__ src1,
                                 int64_t n, __half* __restrict__ dst0, __half* __restrict__ dst1) {
  pdl_begin();
  const float* __restrict__ src = blockIdx.y == 0 ? src0 : src1;
  __half* __restrict__ dst = blockIdx.y == 0 ? dst0 : dst1;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    dst[i] = to_f16_sat(src[i]);
  }
}

// The same, four values per thread: a 16-byte load, an 8-byte store.
__global__ void store_f16x4_kernel(const float4* __restrict__ src0, const float4* __restrict__ src1,
                                   int64_t n4, __half2* __restrict__ dst0,
                                   __half2* __restrict__ dst1) {
  pdl_begin();
  const float4* __restrict__ src = blockIdx.y == 0 ? src0 : src1;
  __half2* __restrict__ dst = blockIdx.y == 0 ? dst0 : dst1;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n4;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float4 v = src[i];
    dst[2 * i] = __halves2half2(to_f16_sat(v.x), to_f16_sat(v.y));
    dst[2 * i + 1] = __halves2half2(to_f16_sat(v.z), to_f16_sat(v.w));
  }
}

// rope_qk_kernel and the K/V row store in one grid: a thread per pair of q (rotated), per pair
// of k (rotated, then both elements stored) and per two elements of v (stored). Each stored
// value is the rotated f32 that rope_qk leaves in k, so the rows are those of the two launches.
template <bool F16>
__global__ void rope_qk_store_kv_kernel(float* q, float* k, const float* __restrict__ v, int m,
                                        int num_heads, int num_kv_heads, int head_dim, int pos,
                                        RopeFreqs freqs, void* __restrict__ k_dst,
                                        void* __restrict__ v_dst) {
  pdl_begin();
  const int half = head_dim / 2;
  const int64_t q_pairs = static_cast<int64_t>(m) * num_heads * half;
  const int64_t kv_pairs = static_cast<int64_t>(m) * num_kv_heads * half;  // of k, and of v
  int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (idx < q_pairs) {
    rope_pair(q, idx, num_heads, head_dim, pos, freqs);
    return;
  }
  idx -= q_pairs;
  if (idx < kv_pairs) {
    const int64_t i = rope_pair(k, idx, num_kv_heads, head_dim, pos, freqs);
    store_row_value<F16>(k_dst, i, k[i]);
    store_row_value<F16>(k_dst, i + half, k[i + half]);
  } else if (idx < 2 * kv_pairs) {
    const int64_t i = 2 * (idx - kv_pairs);
    store_row_value<F16>(v_dst, i, v[i]);
    store_row_value<F16>(v_dst, i + 1, v[i + 1]);
  }
}

// Each row's argmax (core/argmax.h: the lowest index among ties, NaN never wins; a NaN at index 0
// gives 0): one block per row, every thread the best (value, index) of a strided part, then a
// shuffle and shared-memory reduction with the same order.
constexpr int kArgmaxThreads = 1024;

__device__ __forceinline__ bool better(float v, int i, float bv, int bi) {
  return v > bv || (v == bv && i < bi);  // NaN v: false
}

__global__ void __launch_bounds__(kArgmaxThreads)
    argmax_rows_kernel(const float* __restrict__ x, int n, int32_t* __restrict__ out) {
  pdl_begin();
  const float* row = x + static_cast<int64_t>(blockIdx.x) * n;
  float bv = -INFINITY;
  int bi = INT_MAX;
  for (int i = threadIdx.x; i < n; i += kArgmaxThreads) {
    const float v = row[i];
    if (better(v, i, bv, bi)) bv = v, bi = i;
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_xor_sync(kFullMask, bv, off);
    const int oi = __shfl_xor_sync(kFullMask, bi, off);
    if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
  }
  __shared__ float wv[kArgmaxThreads / 32];
  __shared__ int wi[kArgmaxThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) wv[warp] = bv, wi[warp] = bi;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kArgmaxThreads / 32; ++w) {
      if (better(wv[w], wi[w], bv, bi)) bv = wv[w], bi = wi[w];
    }
    // Every value NaN (bi unset), or a NaN at index 0 (nothing beats it on the host): 0.
    out[blockIdx.x] = bi == INT_MAX || isnan(row[0]) ? 0 : bi;
  }
}

}  // namespace

// ---- launchers ------------------------------------------------------------------------------

void launch_argmax_rows(const float* x, int rows, int n, int32_t* out, cudaStream_t stream) {
  QS_CHECK(rows >= 1 && n >= 1);
  launch(argmax_rows_kernel, static_cast<unsigned>(rows), kArgmaxThreads, 0, stream, x, n, out);
  CUDA_CHECK_LAUNCH(stream);
}

void launch_embedding(const DeviceMatrix& table, const int32_t* ids_device,
                      const InlineIds& inline_ids, int m, float* out, cudaStream_t stream) {
  QS_CHECK(m >= 1);
  QS_CHECK(ids_device != nullptr || m <= kMaxInlineIds);
  const dim3 grid(
      static_cast<unsigned>(std::min<int64_t>((table.cols + kThreads - 1) / kThreads, 64)),
      static_cast<unsigned>(std::min(m, 65535)));
  switch (table.dtype) {
    case DType::F32:
      launch(embedding_kernel<float>, grid, kThreads, 0, stream,
             static_cast<const float*>(table.data), table.cols, ids_device, inline_ids, m, out);
      break;
    case DType::F16:
      launch(embedding_kernel<__half>, grid, kThreads, 0, stream,
             static_cast<const __half*>(table.data), table.cols, ids_device, inline_ids, m, out);
      break;
    case DType::BF16:
      launch(embedding_kernel<__nv_bfloat16>, grid, kThreads, 0, stream,
             static_cast<const __nv_bfloat16*>(table.data), table.cols, ids_device, inline_ids, m,
             out);
      break;
    default:
      QS_CHECK_MSG(false, "embedding: unsupported table dtype");
  }
  CUDA_CHECK_LAUNCH(stream);
}

namespace {
// Threads of a row's block in rmsnorm_kernel and add_rmsnorm_kernel (the same for both: the block
// size fixes the reduction order).
int rmsnorm_threads(int64_t d) {
  return d >= 4096 ? 1024 : (d >= 1024 ? 512 : 128);
}
}  // namespace

void launch_rmsnorm(const float* x, const void* weight, DType weight_dtype, int64_t d, int m,
                    float eps, float* out, cudaStream_t stream) {
  QS_CHECK(m >= 1 && d >= 1);
  launch(rmsnorm_kernel<false>, m, rmsnorm_threads(d), 0, stream, static_cast<float*>(nullptr), x,
         weight, weight_dtype, d, eps, out);
  CUDA_CHECK_LAUNCH(stream);
}

void launch_add_rmsnorm(float* h, const float* x, const void* weight, DType weight_dtype, int64_t d,
                        int m, float eps, float* out, cudaStream_t stream) {
  QS_CHECK(m >= 1 && d >= 1);
  launch(rmsnorm_kernel<true>, m, rmsnorm_threads(d), 0, stream, h, x, weight, weight_dtype, d, eps,
         out);
  CUDA_CHECK_LAUNCH(stream);
}

void launch_rope(float* x, int m, int num_heads, int head_dim, int pos, const RopeFreqs& freqs,
                 cudaStream_t stream) {
  QS_CHECK(head_dim % 2 == 0 && head_dim / 2 <= kMaxRopePairs);
  QS_CHECK(m >= 1 && num_heads >= 1 && pos >= 0);
  const int64_t total = static_cast<int64_t>(m) * num_heads * (head_dim / 2);
  launch(rope_kernel, blocks_for(total), kThreads, 0, stream, x, m, num_heads, head_dim, pos,
         freqs);
  CUDA_CHECK_LAUNCH(stream);
}

void launch_rope_qk(float* q, float* k, int m, int num_heads, int num_kv_heads, int head_dim,
                    int pos, const RopeFreqs& freqs, cudaStream_t stream) {
  QS_CHECK(head_dim % 2 == 0 && head_dim / 2 <= kMaxRopePairs);
  QS_CHECK(m >= 1 && num_heads >= 1 && num_kv_heads >= 1 && pos >= 0);
  const int64_t total = static_cast<int64_t>(m) * (num_heads + num_kv_heads) * (head_dim / 2);
  launch(rope_qk_kernel, blocks_for(total), kThreads, 0, stream, q, k, m, num_heads, num_kv_heads,
         head_dim, pos, freqs);
  CUDA_CHECK_LAUNCH(stream);
}

void launch_rope_qk_store_kv(float* q, float* k, const float* v, int m, int num_heads,
                             int num_kv_heads, int head_dim, int pos, const RopeFreqs& freqs,
                             void* k_dst, void* v_dst, bool f16, cudaStream_t stream) {
  QS_CHECK(head_dim % 2 == 0 && head_dim / 2 <= kMaxRopePairs);
  QS_CHECK(m >= 1 && num_heads >= 1 && num_kv_heads >= 1 && pos >= 0);
  const int64_t total = static_cast<int64_t>(m) * (num_heads + 2 * num_kv_heads) * (head_dim / 2);
  launch(f16 ? rope_qk_store_kv_kernel<true> : rope_qk_store_kv_kernel<false>, blocks_for(total),
         kThreads, 0, stream, q, k, v, m, num_heads, num_kv_heads, head_dim, pos, freqs, k_dst,
         v_dst);
  CUDA_CHECK_LAUNCH(stream);
}

void launch_swiglu(const float* gate, const float* up, int64_t n, float* out, cudaStream_t stream) {
  if (n <= 0) return;
  launch(swiglu_kernel, blocks_for(n), kThreads, 0, stream, gate, up, n, out);
  CUDA_CHECK_LAUNCH(stream);
}

void launch_add(float* y, const float* x, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  const bool aligned = (reinterpret_cast<uintptr_t>(y) | reinterpret_cast<uintptr_t>(x)) % 16 == 0;
  if (aligned && n % 4 == 0) {
    launch(add4_kernel, blocks_for(n / 4), kThreads, 0, stream, reinterpret_cast<float4*>(y),
           reinterpret_cast<const float4*>(x), n / 4);
  } else {
    launch(add_kernel, blocks_for(n), kThreads, 0, stream, y, x, n);
  }
  CUDA_CHECK_LAUNCH(stream);
}

void launch_add_bias_rows(float* y, int m, int64_t n, const DeviceBias& bias, cudaStream_t stream) {
  if (bias.data == nullptr || m <= 0 || n <= 0) return;
  const int64_t total = static_cast<int64_t>(m) * n;
  launch(add_bias_rows_kernel, blocks_for(total), kThreads, 0, stream, y, total, n, bias.data,
         bias.dtype);
  CUDA_CHECK_LAUNCH(stream);
}

void launch_split_activations(const float* x, int64_t count, DType dtype, void* hi, void* lo,
                              cudaStream_t stream) {
  if (count <= 0) return;
  if (dtype == DType::BF16) {
    launch(split_kernel<__nv_bfloat16>, blocks_for(count), kThreads, 0, stream, x, count,
           static_cast<__nv_bfloat16*>(hi), static_cast<__nv_bfloat16*>(lo));
  } else {
    QS_CHECK(dtype == DType::F16);
    launch(split_kernel<__half>, blocks_for(count), kThreads, 0, stream, x, count,
           static_cast<__half*>(hi), static_cast<__half*>(lo));
  }
  CUDA_CHECK_LAUNCH(stream);
}

namespace {
// The vector store kernels' condition: 16-byte aligned f32 source, 8-byte aligned f16
// destination, whole float4s.
bool store_f16x4_ok(const float* src, int64_t n, const void* dst) {
  return reinterpret_cast<uintptr_t>(src) % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 8 == 0 &&
         n % 4 == 0;
}

// `pairs` (1 or 2) ranges in one launch: the vector kernel when every range allows it.
void store_f16_rows(const float* const (&src)[2], void* const (&dst)[2], int pairs, int64_t n,
                    cudaStream_t stream) {
  if (n <= 0) return;
  bool vec = true;
  for (int i = 0; i < pairs; ++i) vec = vec && store_f16x4_ok(src[i], n, dst[i]);
  if (vec) {
    const dim3 grid(static_cast<unsigned>(blocks_for(n / 4)), pairs);
    launch(store_f16x4_kernel, grid, kThreads, 0, stream, reinterpret_cast<const float4*>(src[0]),
           reinterpret_cast<const float4*>(src[1]), n / 4, static_cast<__half2*>(dst[0]),
           static_cast<__half2*>(dst[1]));
  } else {
    const dim3 grid(static_cast<unsigned>(blocks_for(n)), pairs);
    launch(store_f16_kernel, grid, kThreads, 0, stream, src[0], src[1], n,
           static_cast<__half*>(dst[0]), static_cast<__half*>(dst[1]));
  }
  CUDA_CHECK_LAUNCH(stream);
}
}  // namespace

void launch_store_f16(const float* src, int64_t n, void* dst, cudaStream_t stream) {
  store_f16_rows({src, src}, {dst, dst}, 1, n, stream);
}

void launch_store_f16_pair(const float* k, const float* v, int64_t n, void* k_dst, void* v_dst,
                           cudaStream_t stream) {
  store_f16_rows({k, v}, {k_dst, v_dst}, 2, n, stream);
}

}  // namespace qs::cuda
