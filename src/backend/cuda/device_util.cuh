// Device-side helpers shared by the kernels: dtype conversion, warp reductions, cache-hinted
// loads.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace qs::cuda {

constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float to_float(float v) {
  return v;
}
__device__ __forceinline__ float to_float(__half v) {
  return __half2float(v);
}
__device__ __forceinline__ float to_float(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

// Element i of a vector whose dtype is known only at run time (norm weights, biases).
__device__ __forceinline__ float load_as_float(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::F16:
      return __half2float(static_cast<const __half*>(p)[i]);
    case DType::BF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default:
      return static_cast<const float*>(p)[i];
  }
}

// Two f16 values packed in a 32-bit word (the lower one first in memory) as f32.
__device__ __forceinline__ float2 f16x2_bits_to_float2(uint32_t bits) {
  return __half22float2(*reinterpret_cast<const __half2*>(&bits));
}

// Four consecutive elements of read-only KV rows as f32: one 16-byte load of f32, one 8-byte load
// of f16 (converted exactly). p must be aligned to 4 elements.
__device__ __forceinline__ float4 load4_kv(const float* p) {
  return __ldg(reinterpret_cast<const float4*>(p));
}
__device__ __forceinline__ float4 load4_kv(const __half* p) {
  const uint2 u = __ldg(reinterpret_cast<const uint2*>(p));
  const float2 a = f16x2_bits_to_float2(u.x), b = f16x2_bits_to_float2(u.y);
  return make_float4(a.x, a.y, b.x, b.y);
}

// N consecutive read-only floats (p aligned to min(N, 4) floats): float4 loads for N % 4 == 0, a
// float2 for N = 2, else one float.
template <int N>
__device__ __forceinline__ void load_f32(const float* p, float (&x)[N]) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {
      const float4 f = __ldg(reinterpret_cast<const float4*>(p) + i);
      x[4 * i] = f.x, x[4 * i + 1] = f.y, x[4 * i + 2] = f.z, x[4 * i + 3] = f.w;
    }
  } else if constexpr (N == 2) {
    const float2 f = __ldg(reinterpret_cast<const float2*>(p));
    x[0] = f.x, x[1] = f.y;
  } else {
    x[0] = __ldg(p);
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

// 16 bytes read once (weights): through the non-coherent path, not kept in L1.
__device__ __forceinline__ uint4 load_stream_16(const void* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

// The same, also asking L2 to fetch the whole 256-byte segment (longer DRAM bursts when a
// warp reads short pieces of many rows).
__device__ __forceinline__ uint4 load_stream_16_l2(const void* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

template <bool kL2Prefetch>
__device__ __forceinline__ uint4 load_weights_16(const void* p) {
  if constexpr (kL2Prefetch) {
    return load_stream_16_l2(p);
  } else {
    return load_stream_16(p);
  }
}

// Element i (< N) of a kernel-parameter array without a dynamic index (which would copy the
// parameters to local memory).
template <typename V, int N>
__device__ __forceinline__ V pick(const V (&a)[N], int i) {
  V r = a[0];
#pragma unroll
  for (int k = 1; k < N; ++k) {
    if (i == k) r = a[k];
  }
  return r;
}

// Grouped launches (several matrices in one grid): the segment holding work item `index`
// (segs.block_end: cumulative item counts; segs.count segments) and the item's index in it.
template <class Segs>
__device__ __forceinline__ int find_segment_at(const Segs& segs, int64_t index, int64_t& local) {
  constexpr int kN = sizeof(segs.block_end) / sizeof(segs.block_end[0]);
  local = index;
  int si = 0;
#pragma unroll
  for (int i = 0; i + 1 < kN; ++i) {
    if (i + 1 < segs.count && index >= segs.block_end[i]) si = i + 1;
  }
  if (si > 0) local -= pick(segs.block_end, si - 1);
  return si;
}

// Paired launches (gate / up with the SwiGLU in the epilogue, segs.swiglu): two segments of
// the same tile count P walked so that each block takes gate tile p and then up tile p, keeping
// the gate's sums for the up tile's store. Item q = blockIdx.x + k gridDim.x (a persistent
// block's k-th) is member k % 2 (0: gate, 1: up) of pair blockIdx.x + (k / 2) gridDim.x.
// Returns the segment; local: the tile in it.
template <class Segs>
__device__ __forceinline__ int find_tile(const Segs& segs, int64_t q, int64_t& local) {
  if (!segs.swiglu) return find_segment_at(segs, q, local);
  const int64_t k = q / gridDim.x;
  local = q % gridDim.x + (k / 2) * gridDim.x;
  return static_cast<int>(k & 1);
}

// Items blockIdx.x, + gridDim.x, ... below `items`: this block's share of a persistent walk.
__device__ __forceinline__ int64_t block_items(int64_t items) {
  const int64_t b = blockIdx.x;
  return b < items ? (items - 1 - b) / gridDim.x + 1 : 0;
}

// Items of this block in a persistent walk over `tiles` (both segments' when paired; unpaired,
// block_items(tiles)).
template <class Segs>
__device__ __forceinline__ int64_t block_tiles(const Segs& segs, int64_t tiles) {
  const int64_t b = blockIdx.x, items = segs.swiglu ? tiles / 2 : tiles;
  const int64_t mine = b < items ? (items - 1 - b) / gridDim.x + 1 : 0;
  return segs.swiglu ? 2 * mine : mine;
}

// SwiGLU of one element: silu(g) * u, as the separate kernel (launch_swiglu) computes it.
__device__ __forceinline__ float swiglu_of(float g, float u) {
  return g / (1.0f + expf(-g)) * u;
}

// The same for grids of one block per item: the segment holding blockIdx.x.
template <class Segs>
__device__ __forceinline__ int find_segment(const Segs& segs, int64_t& block) {
  return find_segment_at(segs, blockIdx.x, block);
}

}  // namespace qs::cuda
