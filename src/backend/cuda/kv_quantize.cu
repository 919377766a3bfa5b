// The flush of DESIGN §3 on the device: f32 or f16 K/V rows -> the hierarchical INT8/INT4 planes
// (docs/kv-format.md), bit-identical to the CPU reference (quant/kv_quant.h, quant/quant4.h) on
// the same rows as f32 (f16 rows are converted exactly on load; everything after is unchanged).
//
// A block owns one part of one (key group, kv head): G tokens x head_dim channels of K and of V
// split into gridDim.z parts (key channel pairs and value tokens; more blocks for small flushes,
// the same per-channel and per-token arithmetic, hence the same bits).
//  - Keys (per channel over the G tokens): a thread owns a channel pair (2p, 2p+1) and a slice of
//    TPT consecutive tokens, which it keeps in registers. Slices meet in shared memory; every
//    thread of a pair combines the slices' (min, max) in slice order, derives the group's
//    parameters and encodes its own slice, writing one byte per token (both channels' codes).
//  - Values (per token over groups of Gv channels): a lane owns CPL consecutive channels of one
//    token; the Gv / CPL lanes of a value group combine their (min, max) with xor shuffles.
//
// Exactness (what makes the bits equal to the CPU's):
//  - min/max: the CPU scans in order with strict comparisons, so among equal candidates the
//    FIRST one wins; this only matters for -0 vs +0, whose fp16 bits differ. Every partial
//    result here covers a contiguous run of positions, and two runs are combined as
//    "later wins only if strictly smaller (larger)", which is exactly the sequential scan.
//    NaN never wins a comparison, as in the CPU's scan.
//  - arithmetic: IEEE f32 with explicit round-to-nearest intrinsics (__fsub_rn, __fdiv_rn, ...)
//    so that nvcc cannot contract anything into an FMA; codes are rounded half-to-even (rintf);
//    clamps are fminf(fmaxf()), which map NaN to the lower bound like std::fmin/std::fmax.
//  - fp16: min rounded toward -inf and scale toward +inf exactly as quant4.cpp does it
//    (round-to-nearest-even conversion, then one fp16 step if it landed on the wrong side).
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/quant_ops.h"

namespace qs::cuda {

namespace {

constexpr float kF16Max = 65504.0f;  // = kF16MaxFinite of quant4.h
constexpr float kMaxCode = 15.0f;    // = kQuant4MaxCode
constexpr uint32_t kLowerBias = 8;   // = kKvLowerBias
constexpr int kMaxThreads = 1024;

// ---- the scalar rules of quant4.h / kv_quant.h ------------------------------------------------

__device__ __forceinline__ float f16_bits_to_f32(uint16_t h) {
  return __half2float(__ushort_as_half(h));
}

// Round-to-nearest-even, like core/dtype.h's f32_to_f16 (identical on the finite, clamped
// values it is used on here).
__device__ __forceinline__ uint16_t f32_to_f16_bits(float x) {
  return __half_as_ushort(__float2half_rn(x));
}

__device__ __forceinline__ float clamp_to_f16_range(float x) {
  return fminf(fmaxf(x, -kF16Max), kF16Max);
}

__device__ __forceinline__ uint16_t f16_next_down(uint16_t h) {
  if ((h & 0x7fffu) == 0) return 0x8001u;  // +-0 -> -2^-24
  return (h & 0x8000u) ? static_cast<uint16_t>(h + 1) : static_cast<uint16_t>(h - 1);
}

__device__ __forceinline__ uint16_t f16_next_up(uint16_t h) {
  if ((h & 0x7fffu) == 0) return 0x0001u;  // +-0 -> +2^-24
  return (h & 0x8000u) ? static_cast<uint16_t>(h - 1) : static_cast<uint16_t>(h + 1);
}

__device__ __forceinline__ uint16_t f32_to_f16_round_down(float x) {
  x = clamp_to_f16_range(x);
  uint16_t h = f32_to_f16_bits(x);
  if (f16_bits_to_f32(h) > x) h = f16_next_down(h);
  return h;
}

__device__ __forceinline__ uint16_t f32_to_f16_round_up(float x) {
  x = clamp_to_f16_range(x);
  uint16_t h = f32_to_f16_bits(x);
  if (f16_bits_to_f32(h) < x) h = f16_next_up(h);
  return h;
}

struct Params {
  uint16_t scale;  // fp16 bits
  uint16_t min;    // fp16 bits
};

// choose_quant4_params of quant4.cpp.
__device__ __forceinline__ Params choose_params(float lo, float hi) {
  if (!(lo <= hi)) lo = hi = 0.0f;
  lo = clamp_to_f16_range(lo);
  hi = clamp_to_f16_range(hi);
  Params p;
  p.min = f32_to_f16_round_down(lo);
  const float span = __fsub_rn(hi, f16_bits_to_f32(p.min));
  p.scale = f32_to_f16_round_up(__fdiv_rn(span, kMaxCode));
  return p;
}

// kv_encode of kv_quant.h: upper code U and stored lower code L + 8 of x, from the decoded
// stored scale s and min mn.
__device__ __forceinline__ void encode(float x, float s, float mn, uint32_t& upper,
                                       uint32_t& lower) {
  if (s == 0.0f) {
    upper = 0;
    lower = kLowerBias;
    return;
  }
  const float t = fminf(fmaxf(__fdiv_rn(__fsub_rn(x, mn), s), 0.0f), kMaxCode);
  const float u = rintf(t);
  const float x4 = __fadd_rn(__fmul_rn(u, s), mn);  // U*s is exact: one rounding
  const float r = __fsub_rn(x, x4);
  const float l = fminf(fmaxf(__fdiv_rn(r, __fmul_rn(s, 0.0625f)), -8.0f), 7.0f);
  upper = static_cast<uint32_t>(static_cast<int>(u));
  lower = static_cast<uint32_t>(static_cast<int>(rintf(l)) + static_cast<int>(kLowerBias));
}

// The sequential scan's update (group_range of quant4.cpp): strict comparisons, NaN skipped.
__device__ __forceinline__ void scan(float v, float& lo, float& hi) {
  if (v < lo) lo = v;
  if (v > hi) hi = v;
}

// Combines the (lo, hi) of an earlier run with those of the run right after it.
__device__ __forceinline__ void combine_in_order(float& lo, float& hi, float later_lo,
                                                 float later_hi) {
  if (later_lo < lo) lo = later_lo;
  if (later_hi > hi) hi = later_hi;
}

// ---- kernel ----------------------------------------------------------------------------------

struct QuantizeKvArgs {
  const void* k = nullptr;  // row 0 = first token of the call's first group
  const void* v = nullptr;
  int64_t row_stride = 0;  // elements
  int head_dim = 0;
  int group_size = 0;        // G
  int value_group_size = 0;  // Gv
  int64_t first_group = 0;
  int64_t capacity = 0;  // tokens per kv head in the arrays
  uint8_t* key_upper = nullptr;
  uint8_t* key_lower = nullptr;
  uint8_t* value_upper = nullptr;
  uint8_t* value_lower = nullptr;
  uint16_t* key_scale = nullptr;
  uint16_t* key_min = nullptr;
  uint16_t* value_scale = nullptr;
  uint16_t* value_min = nullptr;
  bool k_vec2 = false;  // 2-element loads of K are aligned
  bool v_vec4 = false;  // 4-element loads of V are aligned
};

// One, two (aligned to 2 elements) or four (aligned to 4) consecutive row elements as f32: the
// row type T is float, or __half converted exactly.
__device__ __forceinline__ float load1(const float* p) {
  return *p;
}
__device__ __forceinline__ float load1(const __half* p) {
  return __half2float(*p);
}
__device__ __forceinline__ float2 load2(const float* p) {
  return *reinterpret_cast<const float2*>(p);
}
__device__ __forceinline__ float2 load2(const __half* p) {
  return __half22float2(*reinterpret_cast<const __half2*>(p));
}
__device__ __forceinline__ float4 load4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}
__device__ __forceinline__ float4 load4(const __half* p) {
  const uint2 u = *reinterpret_cast<const uint2*>(p);
  const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&u.x));
  const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&u.y));
  return make_float4(a.x, a.y, b.x, b.y);
}

// Block (group blockIdx.x of the call, kv head blockIdx.y, part blockIdx.z of gridDim.z: key
// channel pairs [z, z + 1) * pairs / parts and value tokens [z, z + 1) * G / parts);
// blockDim.x = max(32, head_dim/2 / parts * G/TPT). Dynamic shared memory: G/TPT * head_dim
// float2.
// TPT: tokens per key slice (<= G); CPL: value channels per lane (Gv/CPL <= 32 lanes a group);
// T: the row type (float or __half).
template <int TPT, int CPL, typename T>
__device__ __forceinline__ void quantize_kv_block(const QuantizeKvArgs& a, int h) {
  pdl_begin();
  extern __shared__ float2 slice_range[];  // [G / TPT][head_dim]: (lo, hi) per slice, channel
  const int hd = a.head_dim, G = a.group_size;
  const int64_t group = a.first_group + blockIdx.x;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * G;  // first row of k/v
  const int64_t row_bytes = hd / 2;
  // Code byte of (h, token 0 of the group, channel 0), in every code plane.
  const int64_t code0 = (static_cast<int64_t>(h) * a.capacity + group * G) * row_bytes;
  const int tid = threadIdx.x;

  // ---- keys: thread (pair p of this part, slice s) ----
  const int parts = gridDim.z, part = blockIdx.z;
  const int part_pairs = hd / 2 / parts, slices = G / TPT;
  const bool key_thread = tid < part_pairs * slices;
  const int p = part * part_pairs + tid % part_pairs, s = tid / part_pairs;
  float ev[TPT], od[TPT];  // channel 2p / 2p+1 of the slice's tokens
  if (key_thread) {
    const T* k = static_cast<const T*>(a.k) +
                 (row0 + static_cast<int64_t>(s) * TPT) * a.row_stride +
                 static_cast<int64_t>(h) * hd + 2 * p;
#pragma unroll
    for (int i = 0; i < TPT; ++i) {
      const T* r = k + i * a.row_stride;
      if (a.k_vec2) {
        const float2 t = load2(r);
        ev[i] = t.x;
        od[i] = t.y;
      } else {
        ev[i] = load1(r);
        od[i] = load1(r + 1);
      }
    }
    float lo0 = INFINITY, hi0 = -INFINITY, lo1 = INFINITY, hi1 = -INFINITY;
#pragma unroll
    for (int i = 0; i < TPT; ++i) {
      scan(ev[i], lo0, hi0);
      scan(od[i], lo1, hi1);
    }
    slice_range[s * hd + 2 * p] = make_float2(lo0, hi0);
    slice_range[s * hd + 2 * p + 1] = make_float2(lo1, hi1);
  }
  __syncthreads();
  if (key_thread) {
    float2 r0 = slice_range[2 * p], r1 = slice_range[2 * p + 1];
    for (int sl = 1; sl < slices; ++sl) {
      const float2 q0 = slice_range[sl * hd + 2 * p], q1 = slice_range[sl * hd + 2 * p + 1];
      combine_in_order(r0.x, r0.y, q0.x, q0.y);
      combine_in_order(r1.x, r1.y, q1.x, q1.y);
    }
    const Params p0 = choose_params(r0.x, r0.y), p1 = choose_params(r1.x, r1.y);
    if (s == 0) {
      const int64_t meta = (static_cast<int64_t>(h) * (a.capacity / G) + group) * hd + 2 * p;
      a.key_scale[meta] = p0.scale;
      a.key_min[meta] = p0.min;
      a.key_scale[meta + 1] = p1.scale;
      a.key_min[meta + 1] = p1.min;
    }
    const float s0 = f16_bits_to_f32(p0.scale), m0 = f16_bits_to_f32(p0.min);
    const float s1 = f16_bits_to_f32(p1.scale), m1 = f16_bits_to_f32(p1.min);
#pragma unroll
    for (int i = 0; i < TPT; ++i) {
      uint32_t u0, l0, u1, l1;
      encode(ev[i], s0, m0, u0, l0);
      encode(od[i], s1, m1, u1, l1);
      const int64_t off = code0 + (static_cast<int64_t>(s) * TPT + i) * row_bytes + p;
      a.key_upper[off] = static_cast<uint8_t>(u0 | (u1 << 4));
      a.key_lower[off] = static_cast<uint8_t>(l0 | (l1 << 4));
    }
  }

  // ---- values: item i = (token, lane of the row), CPL channels each ----
  const int lanes_per_row = hd / CPL;
  const int lanes_per_group = a.value_group_size / CPL;  // power of two <= 32
  const int value_groups = hd / a.value_group_size;
  // This part's items: whole tokens, so the value groups (aligned runs of lanes_per_group items,
  // which divides lanes_per_row) start at multiples of lanes_per_group of the local index too.
  const int total = G / parts * lanes_per_row;
  const int item0 = part * total;
  // blockDim.x >= head_dim/2/parts * G/TPT, hence kIters * blockDim.x >= total.
  constexpr int kIters = 2 * TPT / CPL;
  const T* vbase = static_cast<const T*>(a.v) + row0 * a.row_stride + static_cast<int64_t>(h) * hd;
  float vals[kIters][CPL];
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int i = it * blockDim.x + tid;
#pragma unroll
    for (int c = 0; c < CPL; ++c) vals[it][c] = 0.0f;
    if (i < total) {
      const int token = (item0 + i) / lanes_per_row, d0 = (i % lanes_per_row) * CPL;
      const T* r = vbase + static_cast<int64_t>(token) * a.row_stride + d0;
      if (a.v_vec4) {
#pragma unroll
        for (int c = 0; c < CPL; c += 4) {
          const float4 t = load4(r + c);
          vals[it][c] = t.x;
          vals[it][c + 1] = t.y;
          vals[it][c + 2] = t.z;
          vals[it][c + 3] = t.w;
        }
      } else {
#pragma unroll
        for (int c = 0; c < CPL; ++c) vals[it][c] = load1(r + c);
      }
    }
  }
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int i = it * blockDim.x + tid;  // lane of the warp == i % 32 (blockDim.x % 32 == 0)
    float lo = INFINITY, hi = -INFINITY;
#pragma unroll
    for (int c = 0; c < CPL; ++c) scan(vals[it][c], lo, hi);
    // Butterfly over the group's lanes: at step o a lane holds the range of its aligned run of
    // o lanes; the partner holds the adjacent run, the earlier one being the run whose lanes
    // have bit o clear. Every lane of the warp takes part (uniform trip count).
    for (int o = 1; o < lanes_per_group; o <<= 1) {
      const float olo = __shfl_xor_sync(0xffffffffu, lo, o);
      const float ohi = __shfl_xor_sync(0xffffffffu, hi, o);
      if (i & o) {  // mine is the later run
        float elo = olo, ehi = ohi;
        combine_in_order(elo, ehi, lo, hi);
        lo = elo;
        hi = ehi;
      } else {
        combine_in_order(lo, hi, olo, ohi);
      }
    }
    if (i < total) {
      const int token = (item0 + i) / lanes_per_row, d0 = (i % lanes_per_row) * CPL;
      const Params pr = choose_params(lo, hi);
      if ((i & (lanes_per_group - 1)) == 0) {
        const int64_t meta =
            (static_cast<int64_t>(h) * a.capacity + group * G + token) * value_groups +
            d0 / a.value_group_size;
        a.value_scale[meta] = pr.scale;
        a.value_min[meta] = pr.min;
      }
      const float sc = f16_bits_to_f32(pr.scale), mn = f16_bits_to_f32(pr.min);
      const int64_t off = code0 + static_cast<int64_t>(token) * row_bytes + d0 / 2;
#pragma unroll
      for (int c = 0; c < CPL; c += 2) {
        uint32_t u0, l0, u1, l1;
        encode(vals[it][c], sc, mn, u0, l0);
        encode(vals[it][c + 1], sc, mn, u1, l1);
        a.value_upper[off + c / 2] = static_cast<uint8_t>(u0 | (u1 << 4));
        a.value_lower[off + c / 2] = static_cast<uint8_t>(l0 | (l1 << 4));
      }
    }
  }
}

template <int TPT, int CPL, typename T>
__global__ void __launch_bounds__(kMaxThreads) quantize_kv_kernel(const QuantizeKvArgs a) {
  quantize_kv_block<TPT, CPL, T>(a, blockIdx.y);
}

// Where layer l's rows and planes are, relative to layer 0's (quantize_kv_layers_kernel).
struct KvLayerStrides {
  int num_kv_heads = 0;
  int64_t rows = 0;        // row elements
  int64_t codes = 0;       // bytes, every code plane
  int64_t key_meta = 0;    // key_scale / key_min elements
  int64_t value_meta = 0;  // value_scale / value_min elements
};

// quantize_kv_kernel for several layers: blockIdx.y = layer * num_kv_heads + kv head.
template <int TPT, int CPL, typename T>
__global__ void __launch_bounds__(kMaxThreads)
    quantize_kv_layers_kernel(const QuantizeKvArgs args, const KvLayerStrides st) {
  const int64_t layer = blockIdx.y / st.num_kv_heads;
  QuantizeKvArgs a = args;
  a.k = static_cast<const T*>(args.k) + layer * st.rows;
  a.v = static_cast<const T*>(args.v) + layer * st.rows;
  a.key_upper += layer * st.codes;
  a.key_lower += layer * st.codes;
  a.value_upper += layer * st.codes;
  a.value_lower += layer * st.codes;
  a.key_scale += layer * st.key_meta;
  a.key_min += layer * st.key_meta;
  a.value_scale += layer * st.value_meta;
  a.value_min += layer * st.value_meta;
  quantize_kv_block<TPT, CPL, T>(a, static_cast<int>(blockIdx.y % st.num_kv_heads));
}

bool is_pow2(int64_t v) {
  return v > 0 && (v & (v - 1)) == 0;
}

// Parts per (group, head): up to 8, while the launch has fewer than 256 blocks, each part keeps
// at least 8 key channel pairs and 8 value tokens.
int choose_parts(int head_dim, int G, int num_kv_heads, int n_groups) {
  int parts = 1;
  while (parts < 8 && static_cast<int64_t>(n_groups) * num_kv_heads * parts < 256 &&
         head_dim / 2 / (2 * parts) >= 8 && G / (2 * parts) >= 8) {
    parts *= 2;
  }
  return parts;
}

// `heads` (kv heads x layers) blocks per group and part; st.num_kv_heads > 0: the layers kernel.
template <int TPT, int CPL>
void launch_tpt_cpl(const QuantizeKvArgs& a, bool f16, int heads, int n_groups,
                    const KvLayerStrides& st, cudaStream_t stream) {
  const int slices = a.group_size / TPT;
  const int parts = choose_parts(a.head_dim, a.group_size, heads, n_groups);
  QS_CHECK((a.head_dim / 2) % parts == 0 && a.group_size % parts == 0);
  const int threads = std::max(32, a.head_dim / 2 / parts * slices);
  QS_CHECK(threads <= kMaxThreads && threads % 32 == 0);
  const size_t smem = sizeof(float2) * static_cast<size_t>(slices) * a.head_dim;
  const dim3 grid(static_cast<unsigned>(n_groups), static_cast<unsigned>(heads),
                  static_cast<unsigned>(parts));
  if (st.num_kv_heads > 0) {
    if (f16) {
      launch(quantize_kv_layers_kernel<TPT, CPL, __half>, grid, threads, smem, stream, a, st);
    } else {
      launch(quantize_kv_layers_kernel<TPT, CPL, float>, grid, threads, smem, stream, a, st);
    }
  } else if (f16) {
    launch(quantize_kv_kernel<TPT, CPL, __half>, grid, threads, smem, stream, a);
  } else {
    launch(quantize_kv_kernel<TPT, CPL, float>, grid, threads, smem, stream, a);
  }
  CUDA_CHECK_LAUNCH(stream);
}

template <int TPT>
void launch_tpt(const QuantizeKvArgs& a, bool f16, int heads, int n_groups,
                const KvLayerStrides& st, cudaStream_t stream) {
  if (a.value_group_size <= 128) {
    launch_tpt_cpl<TPT, 4>(a, f16, heads, n_groups, st, stream);
  } else {
    launch_tpt_cpl<TPT, 8>(a, f16, heads, n_groups, st, stream);
  }
}

// launch_quantize_kv's checks and kernel arguments; false: nothing to launch (n_groups == 0).
bool quantize_kv_args(const void* k_rows, const void* v_rows, DType row_dtype, int64_t row_stride,
                      int num_kv_heads, int head_dim, int64_t first_group, int n_groups,
                      const QuantizedKvPlanesOut& dst, QuantizeKvArgs& a) {
  const int G = dst.group_size, Gv = dst.value_group_size;
  QS_CHECK(n_groups >= 0 && first_group >= 0 && num_kv_heads >= 1 && num_kv_heads <= 65535);
  QS_CHECK_MSG(head_dim == 32 || head_dim == 64 || head_dim == 128 || head_dim == 256,
               "quantize_kv: the CUDA kernel supports head_dim 32, 64, 128 and 256");
  QS_CHECK_MSG(is_pow2(G) && G >= 8 && G <= 256,
               "quantize_kv: the CUDA kernel supports key groups of 8..256 (a power of two)");
  QS_CHECK_MSG(
      is_pow2(Gv) && Gv >= 4 && Gv <= head_dim,
      "quantize_kv: the CUDA kernel supports value groups of 4..head_dim (a power of two)");
  QS_CHECK(dst.capacity % G == 0 && (first_group + n_groups) * G <= dst.capacity);
  QS_CHECK(row_stride >= static_cast<int64_t>(num_kv_heads) * head_dim);
  QS_CHECK_MSG(row_dtype == DType::F32 || row_dtype == DType::F16,
               "quantize_kv: rows are F32 or F16");
  if (n_groups == 0) return false;
  QS_CHECK(k_rows && v_rows && dst.key_upper && dst.key_lower && dst.value_upper &&
           dst.value_lower && dst.key_scale && dst.key_min && dst.value_scale && dst.value_min);
  a.k = k_rows;
  a.v = v_rows;
  a.row_stride = row_stride;
  a.head_dim = head_dim;
  a.group_size = G;
  a.value_group_size = Gv;
  a.first_group = first_group;
  a.capacity = dst.capacity;
  a.key_upper = dst.key_upper;
  a.key_lower = dst.key_lower;
  a.value_upper = dst.value_upper;
  a.value_lower = dst.value_lower;
  a.key_scale = dst.key_scale;
  a.key_min = dst.key_min;
  a.value_scale = dst.value_scale;
  a.value_min = dst.value_min;
  // Head offsets (h * head_dim) and channel offsets (2p, multiples of 4) keep the vector
  // alignment of the base pointer when the row stride does.
  const size_t esize = dtype_size(row_dtype);
  a.k_vec2 = reinterpret_cast<uintptr_t>(k_rows) % (2 * esize) == 0 && row_stride % 2 == 0;
  a.v_vec4 = reinterpret_cast<uintptr_t>(v_rows) % (4 * esize) == 0 && row_stride % 4 == 0;
  return true;
}

// Key slices of 16 tokens (32 floats in registers per thread); fewer when the group is smaller,
// more when the block would exceed 1024 threads (head_dim 256 with G 256). A small launch (a
// flush) takes slices of 8 tokens: twice the threads, half the serial work per thread. heads:
// kv heads x layers.
void dispatch_quantize_kv(const QuantizeKvArgs& a, bool f16, int heads, int n_groups,
                          const KvLayerStrides& st, cudaStream_t stream) {
  const int G = a.group_size, head_dim = a.head_dim;
  const bool small = static_cast<int64_t>(n_groups) * heads < 128;
  if (G < 16 || (small && head_dim / 2 * (G / 8) <= kMaxThreads)) {
    launch_tpt<8>(a, f16, heads, n_groups, st, stream);
  } else if (head_dim / 2 * (G / 16) <= kMaxThreads) {
    launch_tpt<16>(a, f16, heads, n_groups, st, stream);
  } else {
    launch_tpt<32>(a, f16, heads, n_groups, st, stream);
  }
}

// dst[l] - dst[0] for every array is l times one stride per kind (codes, key and value metadata),
// and the layers' shapes agree: the layers kernel can address them. Sets those strides.
bool uniform_layer_strides(const QuantizedKvPlanesOut* dst, int n_layers, KvLayerStrides& st) {
  const QuantizedKvPlanesOut& d0 = dst[0];
  if (n_layers < 2) return false;
  st.codes = dst[1].key_upper - d0.key_upper;
  st.key_meta = dst[1].key_scale - d0.key_scale;
  st.value_meta = dst[1].value_scale - d0.value_scale;
  for (int l = 1; l < n_layers; ++l) {
    const QuantizedKvPlanesOut& d = dst[l];
    const bool same =
        d.key_upper - d0.key_upper == l * st.codes && d.key_lower - d0.key_lower == l * st.codes &&
        d.value_upper - d0.value_upper == l * st.codes &&
        d.value_lower - d0.value_lower == l * st.codes &&
        d.key_scale - d0.key_scale == l * st.key_meta &&
        d.key_min - d0.key_min == l * st.key_meta &&
        d.value_scale - d0.value_scale == l * st.value_meta &&
        d.value_min - d0.value_min == l * st.value_meta && d.capacity == d0.capacity &&
        d.group_size == d0.group_size && d.value_group_size == d0.value_group_size;
    if (!same) return false;
  }
  return true;
}

}  // namespace

void launch_quantize_kv(const void* k_rows, const void* v_rows, DType row_dtype, int64_t row_stride,
                        int num_kv_heads, int head_dim, int64_t first_group, int n_groups,
                        const QuantizedKvPlanesOut& dst, cudaStream_t stream) {
  QuantizeKvArgs a;
  if (!quantize_kv_args(k_rows, v_rows, row_dtype, row_stride, num_kv_heads, head_dim, first_group,
                        n_groups, dst, a)) {
    return;
  }
  dispatch_quantize_kv(a, row_dtype == DType::F16, num_kv_heads, n_groups, KvLayerStrides{},
                       stream);
}

namespace {

// One thread per (token, kv head, channel pair): byte j of a code row holds channels 2j (low
// nibble) and 2j + 1 (high nibble); x4 = U*s + m, x8 = (16U + L)*(s/16) + m (L = stored - 8),
// docs/kv-format.md: the product is exact, only the addition rounds. Rows of F16 round to
// nearest even, saturating as every stored full-precision row (core/dtype.h f32_to_f16_sat).
template <bool kF16Rows>
__global__ void dequantize_kv_rows_kernel(const QuantizedKvSegment seg, int num_kv_heads,
                                          int head_dim, int t0, int n, void* k_rows, void* v_rows,
                                          int64_t row_stride) {
  pdl_begin();
  const int half = head_dim / 2;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<int64_t>(n) * num_kv_heads * half) return;
  const int j = static_cast<int>(idx % half);
  const int h = static_cast<int>((idx / half) % num_kv_heads);
  const int t = t0 + static_cast<int>(idx / (int64_t{half} * num_kv_heads));
  const int64_t code = (static_cast<int64_t>(h) * seg.capacity + t) * half + j;
  const int64_t key_meta =
      (static_cast<int64_t>(h) * (seg.capacity / seg.group_size) + t / seg.group_size) * head_dim +
      2 * j;
  const int vgroups = head_dim / seg.value_group_size;
  const int64_t value_meta = (static_cast<int64_t>(h) * seg.capacity + t) * vgroups;
  const int vg0 = (2 * j) / seg.value_group_size, vg1 = (2 * j + 1) / seg.value_group_size;
  auto decode = [&](const uint8_t* upper, const uint8_t* lower, float s0, float m0, float s1,
                    float m1, float& x0, float& x1) {
    const uint32_t u = upper[code];
    if (seg.int8) {
      const uint32_t l = lower[code];
      const float c0 = static_cast<float>(int(16 * (u & 15u) + (l & 15u)) - int(kLowerBias));
      const float c1 = static_cast<float>(int(16 * (u >> 4) + (l >> 4)) - int(kLowerBias));
      x0 = __fadd_rn(__fmul_rn(c0, s0 * 0.0625f), m0);
      x1 = __fadd_rn(__fmul_rn(c1, s1 * 0.0625f), m1);
    } else {
      x0 = __fadd_rn(__fmul_rn(static_cast<float>(u & 15u), s0), m0);
      x1 = __fadd_rn(__fmul_rn(static_cast<float>(u >> 4), s1), m1);
    }
  };
  float k0, k1, v0, v1;
  decode(seg.key_upper, seg.key_lower, f16_bits_to_f32(seg.key_scale[key_meta]),
         f16_bits_to_f32(seg.key_min[key_meta]), f16_bits_to_f32(seg.key_scale[key_meta + 1]),
         f16_bits_to_f32(seg.key_min[key_meta + 1]), k0, k1);
  decode(seg.value_upper, seg.value_lower, f16_bits_to_f32(seg.value_scale[value_meta + vg0]),
         f16_bits_to_f32(seg.value_min[value_meta + vg0]),
         f16_bits_to_f32(seg.value_scale[value_meta + vg1]),
         f16_bits_to_f32(seg.value_min[value_meta + vg1]), v0, v1);
  const int64_t at =
      static_cast<int64_t>(t) * row_stride + static_cast<int64_t>(h) * head_dim + 2 * j;
  if constexpr (kF16Rows) {
    auto sat = [](float x) {
      return __float2half_rn(isfinite(x) ? fminf(fmaxf(x, -kF16Max), kF16Max) : x);
    };
    __half* k = static_cast<__half*>(k_rows) + at;
    __half* v = static_cast<__half*>(v_rows) + at;
    k[0] = sat(k0), k[1] = sat(k1);
    v[0] = sat(v0), v[1] = sat(v1);
  } else {
    float* k = static_cast<float*>(k_rows) + at;
    float* v = static_cast<float*>(v_rows) + at;
    k[0] = k0, k[1] = k1;
    v[0] = v0, v[1] = v1;
  }
}

}  // namespace

void launch_dequantize_kv_rows(const QuantizedKvSegment& seg, int num_kv_heads, int head_dim,
                               int t0, int t1, DType row_dtype, void* k_rows, void* v_rows,
                               int64_t row_stride, cudaStream_t stream) {
  QS_CHECK(row_dtype == DType::F32 || row_dtype == DType::F16);
  QS_CHECK(head_dim % 2 == 0 && seg.group_size > 0 && seg.value_group_size > 0 &&
           head_dim % seg.value_group_size == 0);
  QS_CHECK(0 <= t0 && t0 <= t1 && t1 <= seg.capacity &&
           row_stride >= int64_t{num_kv_heads} * head_dim);
  QS_CHECK(!seg.int8 || (seg.key_lower != nullptr && seg.value_lower != nullptr));
  const int64_t threads = static_cast<int64_t>(t1 - t0) * num_kv_heads * (head_dim / 2);
  if (threads == 0) return;
  constexpr int kBlock = 256;
  const auto blocks = static_cast<unsigned>((threads + kBlock - 1) / kBlock);
  if (row_dtype == DType::F16) {
    launch(dequantize_kv_rows_kernel<true>, blocks, kBlock, 0, stream, seg, num_kv_heads, head_dim,
           t0, t1 - t0, k_rows, v_rows, row_stride);
  } else {
    launch(dequantize_kv_rows_kernel<false>, blocks, kBlock, 0, stream, seg, num_kv_heads, head_dim,
           t0, t1 - t0, k_rows, v_rows, row_stride);
  }
  CUDA_CHECK_LAUNCH(stream);
}

bool launch_quantize_kv_layers(const void* k_rows, const void* v_rows, DType row_dtype,
                               int64_t row_stride, int64_t layer_stride, int n_layers,
                               int num_kv_heads, int head_dim, int64_t first_group, int n_groups,
                               const QuantizedKvPlanesOut* dst, cudaStream_t stream) {
  KvLayerStrides st;
  if (!uniform_layer_strides(dst, n_layers, st) ||
      static_cast<int64_t>(num_kv_heads) * n_layers > 65535) {
    return false;
  }
  QuantizeKvArgs a;
  if (!quantize_kv_args(k_rows, v_rows, row_dtype, row_stride, num_kv_heads, head_dim, first_group,
                        n_groups, dst[0], a)) {
    return true;
  }
  st.num_kv_heads = num_kv_heads;
  st.rows = layer_stride;
  // Each layer's rows keep the vector alignment of layer 0's when the layer stride does.
  a.k_vec2 = a.k_vec2 && layer_stride % 2 == 0;
  a.v_vec4 = a.v_vec4 && layer_stride % 4 == 0;
  dispatch_quantize_kv(a, row_dtype == DType::F16, num_kv_heads * n_layers, n_groups, st, stream);
  return true;
}

}  // namespace qs::cuda
