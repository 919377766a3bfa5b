// Skinny GEMM for decode and verification (m <= 16 rows): y = x W^T (+ bias), bandwidth-bound
// on W, which is read exactly once for all rows.
//
// Tensor-core path (F16/BF16 W): a warp owns 16 output features (W rows) and a contiguous range
// of K; each lane streams 16 bytes of two W rows per 32-wide K chunk and feeds them to
// mma.m16n8k16 as the A fragment. The order of k inside a dot product is free, so k is permuted
// consistently in A and B: the lane holding W[r][k..k+7] also holds x[token][k..k+7], and no
// shuffle or shared-memory staging is needed. Activations are f32; each is split into
// hi = round(x) and lo = round(x - hi) in W's dtype, and both halves are multiplied (two MMAs),
// so the result has the f32 reference's accuracy (products of 16-bit values are exact in the f32
// accumulator). The warps of a block split K and are summed through shared memory.
//
// Two kernels read W that way. The default, gemv_ring_kernel, is persistent (a block per SM
// walking 16-row tiles) and streams W through a per-warp cp.async ring of whole 128-byte lines
// (GemvTuning::ring_stages); gemv_mma_kernel (a block per tile, loads straight into registers,
// asking L2 for whole 256-byte segments: GemvTuning::l2_prefetch) is the tested alternative.
// End to end the ring made an AR fp16 decode step 4-7% faster (docs/perf.md, session 11).
//
// Coalesced FMA path (optional, GemvTuning::coalesced_max_rows): m <= 4, two W rows per warp
// read as 512-byte runs. Measured slower than the tensor-core path except on LM heads; kept as a
// tested variant for the benchmark.
//
// FMA path (F32 W, K % 8 != 0, unaligned operands): a warp per output feature, lanes over K.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/env_switch.h"
#include "backend/cuda/gemv_norm.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/rope_row.cuh"
#include "backend/cuda/rope_tiles.h"

namespace qs::cuda {

namespace {

constexpr int kMaxGemvRows = 16;
constexpr int kMaxWarps = 16;  // warps per block splitting K
constexpr int kChunkK = 32;    // K per warp step (two k16 MMAs)

// ---- kernels --------------------------------------------------------------------------------

template <typename T>
__device__ __forceinline__ uint32_t pack2(float a, float b);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float a, float b) {
  __nv_bfloat162 v = __floats2bfloat162_rn(a, b);  // .x = a in the low half
  return *reinterpret_cast<uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float a, float b) {
  __half2 v = __floats2half2_rn(a, b);
  return *reinterpret_cast<uint32_t*>(&v);
}

template <typename T>
__device__ __forceinline__ float round_trip(float v);
template <>
__device__ __forceinline__ float round_trip<__nv_bfloat16>(float v) {
  return __bfloat162float(__float2bfloat16_rn(v));
}
template <>
__device__ __forceinline__ float round_trip<__half>(float v) {
  return __half2float(__float2half_rn(v));
}

// D += A(16x16, row) * B(16x8, col), f32 accumulate.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1);
template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4],
                                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma_16816<__half>(float (&d)[4], const uint32_t (&a)[4],
                                                  uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void unpack8(const uint4& v, __nv_bfloat16, float (&f)[8]) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(words[i] << 16);
    f[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}
__device__ __forceinline__ void unpack8(const uint4& v, __half, float (&f)[8]) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 p = __half22float2(*reinterpret_cast<const __half2*>(&words[i]));
    f[2 * i] = p.x;
    f[2 * i + 1] = p.y;
  }
}

// One 32-wide K chunk of a warp's 16 W rows into its C fragments: wa / wb are the lane's 16 bytes
// of rows g and g + 8 at k .. k + 7 (zeros where invalid), times x[token][k .. k + 7] for the
// tokens t * 8 + g of each tile (ok: k is inside K).
// XS: x lies in shared memory (a deferred norm's staged input, ring_walk's NIN), read with plain
// loads.
template <typename T, int NT, bool XS = false>
__device__ __forceinline__ void mma_chunk(float (&acc)[NT][4], const uint4& wa, const uint4& wb,
                                          const float* __restrict__ x, int m, int64_t K, int64_t k,
                                          bool ok, int g) {
  const uint32_t a_lo[4] = {wa.x, wb.x, wa.y, wb.y};  // k .. k+3
  const uint32_t a_hi[4] = {wa.z, wb.z, wa.w, wb.w};  // k+4 .. k+7
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const int token = t * 8 + g;
    float4 x0 = make_float4(0.f, 0.f, 0.f, 0.f), x1 = x0;
    if (ok && token < m) {
      const float4* xp = reinterpret_cast<const float4*>(x + token * K + k);
      x0 = XS ? xp[0] : __ldg(xp);
      x1 = XS ? xp[1] : __ldg(xp + 1);
    }
    const float xs[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
    float hi[8], lo[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      hi[e] = round_trip<T>(xs[e]);
      lo[e] = xs[e] - hi[e];
    }
    mma_16816<T>(acc[t], a_lo, pack2<T>(hi[0], hi[1]), pack2<T>(hi[2], hi[3]));
    mma_16816<T>(acc[t], a_lo, pack2<T>(lo[0], lo[1]), pack2<T>(lo[2], lo[3]));
    mma_16816<T>(acc[t], a_hi, pack2<T>(hi[4], hi[5]), pack2<T>(hi[6], hi[7]));
    mma_16816<T>(acc[t], a_hi, pack2<T>(lo[4], lo[5]), pack2<T>(lo[6], lo[7]));
  }
}

// The block's sum of its warps' C fragments (partial: [warps][NT][32 lanes][4] floats) for the
// 16 W rows from n0, plus the bias, into y (or added into norm.h: gemv_norm.cuh). C fragment
// element r of lane l: W row l / 4 + 8 (r / 2), token 2 (l % 4) + r % 2 of the tile of 8 tokens.
// gate_sums (a paired launch, find_tile): [NT * 128] floats of shared memory where member 0 (the
// gate tile) leaves its sums and member 1 (the up tile) stores swiglu_of(gate, up) into y; each
// thread reads back only what it wrote.
// sq (a deferred norm's producer, norm.sumsq): gemv_store_deferred instead of gemv_store.
template <int NT>
__device__ __forceinline__ void store_tile_sums(const float* partial, int num_warps, int64_t n0,
                                                int64_t N, int m, const DeviceBias& bias, float* y,
                                                const GemvNorm& norm = {},
                                                float* gate_sums = nullptr, int member = 0,
                                                double* sq = nullptr) {
  for (int e = threadIdx.x; e < NT * 128; e += blockDim.x) {
    const int t = e / 128, l = (e / 4) % 32, r = e % 4;
    float sum = 0.0f;
    for (int wi = 0; wi < num_warps; ++wi) sum += partial[wi * NT * 128 + e];
    const int64_t row = n0 + (l >> 2) + 8 * (r >> 1);
    const int token = t * 8 + 2 * (l & 3) + (r & 1);
    if (row < N && token < m) {
      if (bias.data) sum += load_as_float(bias.data, bias.dtype, row);
      if (gate_sums != nullptr) {
        if (member == 0) {
          gate_sums[e] = sum;
          continue;
        }
        sum = swiglu_of(gate_sums[e], sum);
      }
      if (sq != nullptr) {
        gemv_store_deferred(norm, token * N + row, sum, *sq);
      } else {
        gemv_store(norm, y, token * N + row, sum);
      }
    }
  }
}

// The same for a mixed gate / up tile (gemv_ring_kernel<..., MIXED>): tile rows 0-7 are gate
// rows n0 .. n0 + 7 and rows 8-15 the up rows of the same index, so lane l's elements r and
// r + 2 are the gate and up sums of one output, and y (= swiglu_of(gate, up), [m, N]) is stored
// without shared memory between tiles. The warps' sums in the order of store_tile_sums: the bits
// of the separate matmuls and swiglu.
template <int NT>
__device__ __forceinline__ void store_tile_swiglu(const float* partial, int num_warps, int64_t n0,
                                                  int64_t N, int m, const DeviceBias& gate_bias,
                                                  const DeviceBias& up_bias, float* y) {
  for (int i = threadIdx.x; i < NT * 64; i += blockDim.x) {
    const int t = i / 64, l = (i / 2) % 32, r = i % 2;
    const int e = t * 128 + l * 4 + r;
    float gate = 0.0f, up = 0.0f;
    for (int wi = 0; wi < num_warps; ++wi) {
      gate += partial[wi * NT * 128 + e];
      up += partial[wi * NT * 128 + e + 2];
    }
    const int64_t row = n0 + (l >> 2);
    const int token = t * 8 + 2 * (l & 3) + r;
    if (row < N && token < m) {
      if (gate_bias.data) gate += load_as_float(gate_bias.data, gate_bias.dtype, row);
      if (up_bias.data) up += load_as_float(up_bias.data, up_bias.dtype, row);
      y[token * N + row] = swiglu_of(gate, up);
    }
  }
}

// The matrices of one launch (launch_gemv_group; one segment for launch_gemv): blocks
// [block_end[i - 1], block_end[i]) compute matrix i.
template <typename T>
struct MmaSegments {
  const T* w[kMaxGemvSegments];
  int64_t N[kMaxGemvSegments];
  DeviceBias bias[kMaxGemvSegments];
  float* y[kMaxGemvSegments];
  int64_t block_end[kMaxGemvSegments];
  int count;
  bool swiglu;  // gate (segment 0) / up (1) paired, y[0] = their SwiGLU (find_tile)
};

// Block: (warps x 32) threads, 16 output features of one segment; NT tiles of 8 tokens
// (m <= 8 * NT). x: [m, K] f32; w: [N, K]; y: [m, N] f32.
template <typename T, int NT, int UNROLL, bool L2HINT>
__global__ void __launch_bounds__(kMaxWarps * 32, UNROLL >= 8 ? 1 : 2)
    gemv_mma_kernel(const float* __restrict__ x, int m, int64_t K, const MmaSegments<T> segs) {
  __shared__ float partial[kMaxWarps][NT][32][4];  // per warp: its C fragments
  int64_t block;
  const int si = find_segment(segs, block);
  const T* __restrict__ w = pick(segs.w, si);
  const int64_t N = pick(segs.N, si);
  const DeviceBias bias = pick(segs.bias, si);
  float* __restrict__ y = pick(segs.y, si);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int num_warps = blockDim.x / 32;
  const int g = lane >> 2;  // fragment row group: W rows g, g + 8; token column g
  const int c = lane & 3;   // thread in group: k offset 8c inside a chunk
  const int64_t n0 = block * 16;
  const bool row0_ok = n0 + g < N, row1_ok = n0 + g + 8 < N;
  const T* w0 = w + (n0 + g) * K;
  const T* w1 = w + (n0 + g + 8) * K;

  // Warps split K in whole steps of UNROLL chunks (aligned runs of W per step).
  const int64_t chunks = (K + kChunkK - 1) / kChunkK;
  const int64_t steps = (chunks + UNROLL - 1) / UNROLL;
  const int64_t chunk_begin = steps * warp / num_warps * UNROLL;
  const int64_t chunk_end = min(chunks, steps * (warp + 1) / num_warps * UNROLL);
  // The weights do not depend on the previous kernel: the first two steps of each of the 16 rows
  // go to L2 while it finishes (launch.cuh).
  if (lane < 16 && n0 + lane < N && chunk_begin < chunk_end) {
    const int64_t k0 = chunk_begin * kChunkK;
    const int64_t k1 = min(K, min(chunk_end, chunk_begin + 2 * UNROLL) * kChunkK);
    prefetch_l2(w + (n0 + lane) * K + k0, static_cast<uint32_t>((k1 - k0) * sizeof(T)));
  }
  pdl_begin();

  float acc[NT][4];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;

  for (int64_t ch = chunk_begin; ch < chunk_end; ch += UNROLL) {
    uint4 wa[UNROLL], wb[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      // Loads are unconditional (from a valid address, zeroed after) so that no branch keeps
      // them from being in flight together.
      const int64_t k = (ch + u) * kChunkK + 8 * c;
      const bool ok = ch + u < chunk_end && k < K;
      wa[u] = load_weights_16<L2HINT>(ok && row0_ok ? w0 + k : w);
      wb[u] = load_weights_16<L2HINT>(ok && row1_ok ? w1 + k : w);
      if (!(ok && row0_ok)) wa[u] = make_uint4(0, 0, 0, 0);
      if (!(ok && row1_ok)) wb[u] = make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int64_t k = (ch + u) * kChunkK + 8 * c;
      mma_chunk<T, NT>(acc, wa[u], wb[u], x, m, K, k, ch + u < chunk_end && k < K, g);
    }
  }

#pragma unroll
  for (int t = 0; t < NT; ++t) {
#pragma unroll
    for (int r = 0; r < 4; ++r) partial[warp][t][lane][r] = acc[t][r];
  }
  __syncthreads();
  store_tile_sums<NT>(&partial[0][0][0][0], num_warps, n0, N, m, bias, y);
}

// Persistent ring kernel: one block of up to kRingMaxWarps warps per SM walks the 16-row tiles
// blockIdx.x, + gridDim.x, ... (balanced to within one tile per SM), its warps splitting each
// tile's K as in gemv_mma_kernel. Each warp streams its (tile, 64-wide K chunk) stages through a
// STAGES-deep cp.async ring in shared memory that runs on across tiles, so a warp's loads never
// drain between tiles or wait for a block to be scheduled. Every cp.async instruction of a
// quarter warp copies one whole 128-byte line (16 rows x 64 k per stage = 4 instructions), and
// each 16-byte piece lands in the slot of the lane whose A fragment holds it, so the reads are
// one conflict-free 16-byte ld.shared per fragment half (the order of k inside a dot product
// is free, as above). After each tile the warps' C fragments meet in a double-buffered
// shared-memory partial (one __syncthreads per tile). With norm.h set (one segment) the sums go
// into the residual stream and the last block normalizes it (gemv_norm.cuh).
// MIXED (a gate / up launch, segs.swiglu; the default, QS_SWIGLU_MIXED=0 pairs the tiles as
// below): tile q is 8 gate rows and the 8 up
// rows of the same index (rows 8q .. 8q + 7 of each), the SwiGLU is formed in the tile's own
// epilogue, and `tiles` counts these ceil(N / 8) tiles. Against the paired walk (a gate tile,
// then the up tile, find_tile) a block's share is one 16-row tile finer: Llama-2-7B's 688 pairs
// put 6 pairs on 28 SMs and 5 on the rest (87% of an even split), its 1376 mixed tiles 11 or 10.
constexpr int kRingMaxWarps = 16;
constexpr int kRingChunkK = 64;                        // K per stage: one line per W row
constexpr int kRingStageBytes = 16 * kRingChunkK * 2;  // 16 rows x 128 bytes

// GemvTuning::ring_stages = 0 runs 6 stages for grids of at least this many tiles per SM (LM
// heads), 4 otherwise. H200, m = 1 (bench_ops tune, us): 8B lm_head 314.5 (4) / 262.0 (6);
// 8B gate/up 32.6 / 32.0; 7B q/o 12.5 / 13.6; 7B down 26.1 / 28.4.
constexpr int kRingDeepTilesPerSm = 16;

// Warps of a ring block: one per 64-wide chunk of K, at most kRingMaxWarps.
int ring_warps(int64_t K) {
  return static_cast<int>(std::min<int64_t>(kRingMaxWarps, (K + kRingChunkK - 1) / kRingChunkK));
}

// The rings, the double-buffered partial sums, a paired launch's gate sums.
__host__ __device__ size_t ring_smem_bytes(int warps, int stages, int nt) {
  return size_t(warps) * stages * kRingStageBytes +
         (2 * size_t(warps) + 1) * nt * 128 * sizeof(float);
}

// gemv_ring_rope_kernel's: the ring's, then the cos and sin of a head's hd / 2 rotations.
size_t ring_rope_smem_bytes(int warps, int stages, int hd) {
  return ring_smem_bytes(warps, stages, 1) + size_t(hd / 2) * sizeof(float2);
}

// Byte offset inside a stage of piece p (k = 8p .. 8p + 7 of the chunk) of tile row r: slot
// idx = (32-wide half p / 4) * 2 + (r >= 8) of reader lane (r % 8) * 4 + p % 4, the lane index
// XORed with 4 in the second half so that a quarter warp's eight pieces of one row (written
// together) and a quarter warp's eight reads (of one slot) both cover every bank once.
__device__ __forceinline__ uint32_t ring_offset(int r, int p) {
  const int lane = (r & 7) * 4 + (p & 3);
  return (((p >> 2) * 2 + (r >> 3)) * 32 + (lane ^ ((p >> 2) * 4))) * 16;
}

// One tile of a ring walk: the warp's my_chunks stages of it from the ring (each consumed slot
// refilled by fetch(), which runs ahead by STAGES - 1 stages), from K offset k (chunk_begin * 64
// + 8c), summed into its C fragments, which go to `part` ([warps][NT][32][4]: one buffer of the
// caller's double-buffered partial), then a block barrier; the caller stores the tile from part.
template <typename T, int NT, int STAGES, bool XS, class Fetch>
__device__ __forceinline__ void ring_tile(Fetch& fetch, const unsigned char* ring, int& slot,
                                          float* part, const float* x, int m, int64_t K, int64_t k,
                                          int64_t my_chunks, int warp, int lane, int g) {
  float acc[NT][4];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;
  for (int64_t ci = 0; ci < my_chunks; ++ci, k += kRingChunkK) {
    __syncwarp();  // every lane has read the slot that this fetch refills
    fetch();
    cp_async_wait<STAGES - 1>();
    __syncwarp();  // every lane's pieces of this stage have landed
    const unsigned char* stage = ring + slot * kRingStageBytes;
    slot = slot + 1 == STAGES ? 0 : slot + 1;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int pos = (lane ^ (half * 4)) * 16;
      const uint4 wa = *reinterpret_cast<const uint4*>(stage + (half * 2) * 512 + pos);
      const uint4 wb = *reinterpret_cast<const uint4*>(stage + (half * 2 + 1) * 512 + pos);
      mma_chunk<T, NT, XS>(acc, wa, wb, x, m, K, k + half * 32, k + half * 32 < K, g);
    }
  }
  part += size_t(warp) * NT * 128;
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    *reinterpret_cast<float4*>(part + t * 128 + lane * 4) =
        make_float4(acc[t][0], acc[t][1], acc[t][2], acc[t][3]);
  }
  __syncthreads();
}

// A q/k/v tile's epilogue at m = 1 with RoPE and the K/V rows. The warps' sums
// in store_tile_sums' order, plus the bias. A q or k tile (si 0, 1; rope_tile_row) holds the two
// halves of 8 rotations: lane 4i's elements 0 and 2 (rows i and i + 8 of the tile, token 0) are
// rotation i's pair, rotated as rope_qk_store_kv does (its cos and sin from the block's table,
// fill_rope_table) and stored to y (k's also to the K row). A v tile is stored as
// store_tile_sums stores it, and to the V row.
template <typename T>
__device__ __forceinline__ void store_tile_rope_rows(const float* partial, int num_warps,
                                                     const MmaSegments<T>& segs, int si,
                                                     int64_t local, int hd,
                                                     const KvRowEpilogue& rows,
                                                     const float2* rope_cs) {
  float* y = pick(segs.y, si);
  const DeviceBias bias = pick(segs.bias, si);
  const auto sum_of = [&](int e, int64_t row) {
    float sum = 0.0f;
    for (int wi = 0; wi < num_warps; ++wi) sum += partial[wi * 128 + e];
    if (bias.data) sum += load_as_float(bias.data, bias.dtype, row);
    return sum;
  };
  const auto store_row = [&](void* dst, int64_t row, float v) {
    if (rows.f16) {
      store_row_value<true>(dst, row, v);
    } else {
      store_row_value<false>(dst, row, v);
    }
  };
  const int i = threadIdx.x;  // rotation i of a q / k tile, row i and i + 8 of a v tile
  if (i >= 8) return;
  if (si == 2) {
    for (int r = 0; r < 4; r += 2) {
      const int64_t row = local * 16 + i + 8 * (r >> 1);
      if (row >= pick(segs.N, si)) continue;
      const float v = sum_of(i * 16 + r, row);
      y[row] = v;
      store_row(rows.v_dst, row, v);
    }
    return;
  }
  const int64_t row = rope_tile_row(local, hd) + i, partner = row + hd / 2;
  const float a = sum_of(i * 16, row), b = sum_of(i * 16 + 2, partner);
  const float2 rot = rope_apply(a, b, rope_cs[row % hd]);
  y[row] = rot.x;
  y[partner] = rot.y;
  if (si == 1) {
    store_row(rows.k_dst, row, rot.x);
    store_row(rows.k_dst, partner, rot.y);
  }
}

// A deferred norm's staged input (ring_walk's NIN, m = 1): norm(h) over K, after the ring's own
// bytes (and a RoPE launch's table); each warp stages the columns it multiplies, at most
// kNinPerLane per lane.
constexpr int kNinPerLane = 16;
__host__ __device__ inline size_t nin_smem_bytes(int64_t K) {
  return (size_t(K) * sizeof(float) + 15) / 16 * 16;
}

// The ring kernel's body. ROPE (gemv_ring_rope_kernel: q, k, v at m = 1 with rows): the q and k
// segments walk RoPE tiles (rope_tile_row, copied as a mixed tile's two halves) and every tile
// ends in store_tile_rope_rows. NIN (m = 1; a mixed gate / up or a RoPE launch): x is the
// residual stream h of a deferred norm (nin, GemvNorm::sumsq). Each warp forms 1 / rms from the
// producer's partial sums (norm_in_scale) and stages the columns it multiplies as the
// materialized norm writes them (store_normed: weight * (h * 1 / rms); the weight loaded before
// the PDL wait) in shared memory, which the walk then reads as x: the same bits as the norm's
// rows wherever the two orders of the double sum of squares give the same float variance. A
// plain walk in the kDeferOut form (o, down; norm.sumsq set) is the producer: it leaves its
// block's sum of the squares of the h values it wrote (gemv_norm_defer_block) instead of
// normalizing. Both forms are their own kernels, so the others compile as before.
enum RingNorm : int { kNormAsGiven = 0, kNormIn = 1, kDeferOut = 2 };

template <typename T, int NT, int STAGES, bool MIXED, bool ROPE, int NORM = kNormAsGiven>
__device__ __forceinline__ void ring_walk(const float* __restrict__ x, int m, int64_t K,
                                          const MmaSegments<T>& segs, int64_t tiles,
                                          const GemvNorm& norm, const KvRowEpilogue* rows,
                                          const NormIn& nin = {}) {
  constexpr bool NIN = NORM == kNormIn;
  static_assert(!NIN || (NT == 1 && (MIXED || ROPE)), "a deferred norm's consumer at m = 1");
  static_assert(NORM != kDeferOut || (NT == 1 && !MIXED && !ROPE), "a deferred norm's producer");
  extern __shared__ __align__(16) unsigned char ring_smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int num_warps = blockDim.x / 32;
  const int g = lane >> 2, c = lane & 3;  // as in gemv_mma_kernel
  unsigned char* ring = ring_smem + size_t(warp) * STAGES * kRingStageBytes;
  float* partial =
      reinterpret_cast<float*>(ring_smem + size_t(num_warps) * STAGES * kRingStageBytes);
  float* gate_sums = segs.swiglu && !MIXED ? partial + 2 * size_t(num_warps) * NT * 128 : nullptr;
  // ROPE: the rotations' cos and sin after the ring's own bytes (ring_rope_smem_bytes).
  float2* rope_cs = reinterpret_cast<float2*>(ring_smem + ring_smem_bytes(num_warps, STAGES, NT));

  const int64_t chunks = (K + kRingChunkK - 1) / kRingChunkK;
  const int64_t chunk_begin = chunks * warp / num_warps;
  const int64_t my_chunks = chunks * (warp + 1) / num_warps - chunk_begin;
  const int64_t my_tiles = MIXED ? block_items(tiles) : block_tiles(segs, tiles);

  // The fetch cursor. The writer's view: instruction j copies row 4j + lane / 8 of the tile,
  // piece lane % 8 of the chunk, from f_src + j * 4K.
  const int wq = lane >> 3, wp = lane & 7;
  uint32_t woff[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) woff[j] = ring_offset(4 * j + wq, wp);
  const uint32_t ring_base = smem_u32(ring);
  const T* const w_any = segs.w[0];
  RingCursor<STAGES> cursor(my_tiles, my_chunks);
  int64_t f_k = 0;
  const T* f_src = w_any;
  const T* f_up = w_any;  // MIXED (or a RoPE tile): the second half's rows (copies j = 2, 3)
  int f_rows = 0;
  bool rope_tile = false;
  auto enter = [&](int64_t tile) {
    if constexpr (MIXED) {
      f_k = chunk_begin * kRingChunkK + 8 * wp;
      f_src = segs.w[0] + (tile * 8 + wq) * K + f_k;
      f_up = segs.w[1] + (tile * 8 + wq) * K + f_k;
      f_rows = static_cast<int>(min(int64_t{8}, segs.N[0] - tile * 8));
    } else {
      int64_t local;
      const int si = find_tile(segs, tile, local);
      f_k = chunk_begin * kRingChunkK + 8 * wp;
      if constexpr (ROPE) rope_tile = si < 2;
      if (rope_tile) {
        f_src = pick(segs.w, si) + (rope_tile_row(local, rows->head_dim) + wq) * K + f_k;
        f_up = f_src + rows->head_dim / 2 * K;
        f_rows = 8;  // whole heads
      } else {
        f_src = pick(segs.w, si) + (local * 16 + wq) * K + f_k;
        f_rows = static_cast<int>(min(int64_t{16}, pick(segs.N, si) - local * 16));
      }
    }
  };
  auto copy = [&](int slot) {
    const uint32_t dst = ring_base + slot * kRingStageBytes;
    const bool k_ok = f_k < K;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (MIXED || rope_tile) {
        const bool ok = k_ok && 4 * (j & 1) + wq < f_rows;
        const T* src = (j < 2 ? f_src : f_up) + (j & 1) * 4 * K;
        cp_async16_zfill(dst + woff[j], ok ? src : w_any, ok ? 16 : 0);
      } else {
        const bool ok = k_ok && 4 * j + wq < f_rows;
        cp_async16_zfill(dst + woff[j], ok ? f_src + j * 4 * K : w_any, ok ? 16 : 0);
      }
    }
    f_src += kRingChunkK, f_k += kRingChunkK;
    if (MIXED || rope_tile) f_up += kRingChunkK;
  };
  auto fetch = [&] { cursor.next(enter, copy); };
  // The weights do not depend on the previous kernel: the first stages are in flight while it
  // finishes (launch.cuh).
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) fetch();
  if constexpr (ROPE) {
    fill_rope_table(rope_cs, rows->head_dim / 2, static_cast<float>(rows->pos),
                    rows->freqs.inv_freq);
  }
  // NIN: norm(h) [K]; this warp's columns [x_lo, x_hi), lane + 32 i of them in its slot i.
  float* xs = nullptr;
  [[maybe_unused]] const int64_t x_lo = chunk_begin * kRingChunkK,
                                 x_hi = min(K, x_lo + my_chunks * kRingChunkK);
  if constexpr (NIN) {
    xs = reinterpret_cast<float*>(ring_smem + ring_smem_bytes(num_warps, STAGES, NT) +
                                  (ROPE ? size_t(rows->head_dim / 2) * sizeof(float2) : 0));
    for (int64_t k = x_lo + lane; k < x_hi; k += 32) {
      xs[k] = load_as_float(nin.weight, nin.weight_dtype, k);  // not the previous kernel's
    }
  }
  pdl_begin();
  if constexpr (NIN) {
    float hv[kNinPerLane];
#pragma unroll
    for (int i = 0; i < kNinPerLane; ++i) {
      const int64_t k = x_lo + lane + 32 * i;
      // In flight with the partial sums' loads. Through L2 and in order after the wait (an asm
      // volatile load): a plain load of the __restrict__ x is an invariant ld.global.nc, which the
      // compiler hoisted above the wait (4 of 16, session 49), reading h before the producer's +=.
      hv[i] = k < x_hi ? __ldcg(x + k) : 0.0f;
    }
    const float inv_rms = norm_in_scale<true>(nin, K);
#pragma unroll
    for (int i = 0; i < kNinPerLane; ++i) {
      const int64_t k = x_lo + lane + 32 * i;
      if (k < x_hi) xs[k] = xs[k] * (hv[i] * inv_rms);  // store_normed's w * (v * inv_rms)
    }
    __syncwarp();  // the walk's lanes read columns that other lanes staged
  }
  const float* xin = NIN ? xs : x;
  double sq = 0.0;  // kDeferOut: this thread's sum of squares
  double* sq_out = NORM == kDeferOut ? &sq : nullptr;

  int slot = 0;
  for (int64_t tj = 0; tj < my_tiles; ++tj) {
    float* part = partial + size_t(tj & 1) * num_warps * NT * 128;  // double-buffered
    ring_tile<T, NT, STAGES, NIN>(fetch, ring, slot, part, xin, m, K,
                                  chunk_begin * kRingChunkK + 8 * c, my_chunks, warp, lane, g);
    if constexpr (MIXED) {
      store_tile_swiglu<NT>(part, num_warps, (blockIdx.x + tj * gridDim.x) * 8, segs.N[0], m,
                            segs.bias[0], segs.bias[1], segs.y[0]);
    } else {
      int64_t local;
      const int si = find_tile(segs, blockIdx.x + tj * gridDim.x, local);
      if constexpr (ROPE) {
        store_tile_rope_rows(part, num_warps, segs, si, local, rows->head_dim, *rows, rope_cs);
      } else {
        store_tile_sums<NT>(part, num_warps, local * 16, pick(segs.N, si), m, pick(segs.bias, si),
                            segs.swiglu ? segs.y[0] : pick(segs.y, si), norm, gate_sums, si,
                            sq_out);
      }
    }
  }
  cp_async_wait<0>();
  if constexpr (NORM == kDeferOut) {
    gemv_norm_defer_block(norm, sq, partial);
  } else {
    if (norm.h != nullptr) gemv_norm_finish(norm, partial);  // >= 1 KiB
  }
}

template <typename T, int NT, int STAGES, bool MIXED, int NORM = kNormAsGiven>
__global__ void __launch_bounds__(kRingMaxWarps * 32, 1)
    gemv_ring_kernel(const float* __restrict__ x, int m, int64_t K, const MmaSegments<T> segs,
                     int64_t tiles, const GemvNorm norm, const NormIn nin) {
  ring_walk<T, NT, STAGES, MIXED, false, NORM>(x, m, K, segs, tiles, norm, nullptr, nin);
}

// The ring kernel over a layer's q, k and v at m = 1 that also rotates q and k and stores the
// K/V rows (launch_gemv_qkv_rows): the bits of launch_gemv_group then launch_rope_qk_store_kv.
template <typename T, int STAGES, int NORM = kNormAsGiven>
__global__ void __launch_bounds__(kRingMaxWarps * 32, 1)
    gemv_ring_rope_kernel(const float* __restrict__ x, int64_t K, const MmaSegments<T> segs,
                          int64_t tiles, const __grid_constant__ KvRowEpilogue rows,
                          const NormIn nin) {
  ring_walk<T, 1, STAGES, false, true, NORM>(x, 1, K, segs, tiles, GemvNorm{}, &rows, nin);
}

// Coalesced FMA kernel for a few rows (m <= M <= 4): a warp owns kCoalRows W rows and reads
// each as whole 512-byte runs (32 lanes x 16 bytes, kCoalUnroll runs in flight per row); the
// warps of a block split K and are summed in shared memory.
constexpr int kCoalRows = 2;
constexpr int kCoalUnroll = 4;
constexpr int kCoalMaxWarps = 8;

template <typename T, int M, bool L2HINT>
__global__ void __launch_bounds__(kCoalMaxWarps * 32)
    gemv_coalesced_kernel(const float* __restrict__ x, int m, int64_t K, const T* __restrict__ w,
                          int64_t N, DeviceBias bias, float* __restrict__ y) {
  pdl_begin();
  constexpr int R = kCoalRows, U = kCoalUnroll;
  __shared__ float partial[kCoalMaxWarps][M][R];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int num_warps = blockDim.x / 32;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * R;
  const int64_t pieces = K / 8;  // 16-byte pieces per row
  const int64_t steps = (pieces + 32 * U - 1) / (32 * U);
  const int64_t step_begin = steps * warp / num_warps;
  const int64_t step_end = steps * (warp + 1) / num_warps;

  float acc[M][R];
#pragma unroll
  for (int t = 0; t < M; ++t) {
#pragma unroll
    for (int r = 0; r < R; ++r) acc[t][r] = 0.0f;
  }
  for (int64_t st = step_begin; st < step_end; ++st) {
    uint4 wv[R][U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t piece = (st * U + u) * 32 + lane;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const bool ok = piece < pieces && n0 + r < N;
        wv[r][u] = load_weights_16<L2HINT>(ok ? w + (n0 + r) * K + piece * 8 : w);
        if (!ok) wv[r][u] = make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t piece = (st * U + u) * 32 + lane;
      if (piece >= pieces) break;
      float wf[R][8];
#pragma unroll
      for (int r = 0; r < R; ++r) unpack8(wv[r][u], T{}, wf[r]);
#pragma unroll
      for (int t = 0; t < M; ++t) {
        if (t >= m) break;
        const float4* xp = reinterpret_cast<const float4*>(x + t * K + piece * 8);
        const float4 x0 = __ldg(xp), x1 = __ldg(xp + 1);
        const float xs[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
        for (int r = 0; r < R; ++r) {
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[t][r] += wf[r][e] * xs[e];
        }
      }
    }
  }
#pragma unroll
  for (int t = 0; t < M; ++t) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float v = warp_sum(acc[t][r]);
      if (lane == 0) partial[warp][t][r] = v;
    }
  }
  __syncthreads();
  if (threadIdx.x < M * R) {
    const int t = threadIdx.x / R, r = threadIdx.x % R;
    const int64_t row = n0 + r;
    if (t < m && row < N) {
      float sum = 0.0f;
      for (int wi = 0; wi < num_warps; ++wi) sum += partial[wi][t][r];
      if (bias.data) sum += load_as_float(bias.data, bias.dtype, row);
      y[t * N + row] = sum;
    }
  }
}

// A warp per output feature; rows of x in chunks of kMaxGemvRows.
template <typename T>
__global__ void gemv_simt_kernel(const float* __restrict__ x, int m, int64_t K,
                                 const T* __restrict__ w, int64_t N, DeviceBias bias,
                                 float* __restrict__ y) {
  pdl_begin();
  const int lane = threadIdx.x % 32;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (n >= N) return;  // whole warp
  const T* wr = w + n * K;
  const float b = bias.data ? load_as_float(bias.data, bias.dtype, n) : 0.0f;
  for (int m0 = 0; m0 < m; m0 += kMaxGemvRows) {
    const int mc = min(kMaxGemvRows, m - m0);
    float acc[kMaxGemvRows];
#pragma unroll
    for (int i = 0; i < kMaxGemvRows; ++i) acc[i] = 0.0f;
    for (int64_t k = lane; k < K; k += 32) {
      const float wv = to_float(wr[k]);
#pragma unroll
      for (int i = 0; i < kMaxGemvRows; ++i) {
        if (i < mc) acc[i] += wv * x[(m0 + i) * K + k];
      }
    }
#pragma unroll
    for (int i = 0; i < kMaxGemvRows; ++i) {
      if (i < mc) {
        const float s = warp_sum(acc[i]);
        if (lane == 0) y[(m0 + i) * N + n] = s + b;
      }
    }
  }
}

// Launches that read a deferred norm's input (gemv_norm_in_launches).
std::atomic<uint64_t> g_norm_in_launches{0};

// QS_GEMV_RING=off|4|6 starts the process with GemvTuning::ring_stages -1 (gemv_mma_kernel), 4
// or 6 (end-to-end A/B runs of the two tensor-core kernels without a rebuild); anything else is
// ignored with a warning. QS_DENSE_DEFER_NORM=0: GemvTuning::defer_norm off.
GemvTuning g_tuning = [] {
  GemvTuning t;
  const char* v = std::getenv("QS_GEMV_RING");
  if (v != nullptr) {
    if (std::strcmp(v, "off") == 0) {
      t.ring_stages = -1;
    } else if (std::strcmp(v, "4") == 0 || std::strcmp(v, "6") == 0) {
      t.ring_stages = v[0] - '0';
    } else {
      std::fprintf(stderr, "quantspec: ignoring QS_GEMV_RING=%s (expected off, 4 or 6)\n", v);
    }
  }
  t.swiglu_mixed = env_flag("QS_SWIGLU_MIXED", true);
  t.qkv_rows = env_flag("QS_QKV_ROWS", true);
  t.defer_norm = env_flag("QS_DENSE_DEFER_NORM", true);
  return t;
}();

template <typename T>
MmaSegments<T> mma_segments(const GemvSegment* segs, int count) {
  MmaSegments<T> ms{};
  ms.count = count;
  int64_t blocks = 0;
  for (int i = 0; i < kMaxGemvSegments; ++i) {
    const GemvSegment& sg = segs[std::min(i, count - 1)];  // unused slots repeat the last
    if (i < count) blocks += (sg.w.rows + 15) / 16;
    ms.w[i] = static_cast<const T*>(sg.w.data);
    ms.N[i] = sg.w.rows;
    ms.bias[i] = sg.bias;
    ms.y[i] = sg.y;
    ms.block_end[i] = blocks;
  }
  return ms;
}

template <typename T, int NT, int UNROLL, bool L2HINT>
void launch_mma(const float* x, int m, const GemvSegment* segs, int count, int num_sms,
                cudaStream_t stream) {
  const MmaSegments<T> ms = mma_segments<T>(segs, count);
  const int64_t blocks = ms.block_end[kMaxGemvSegments - 1];
  const int64_t K = segs[0].w.cols;
  const int64_t steps = (K + kChunkK * UNROLL - 1) / (kChunkK * UNROLL);
  // Enough warps in flight to cover memory latency (~32 per SM), each with >= 2 steps.
  int warps = 1;
  while (warps < kMaxWarps && warps * blocks < int64_t{num_sms} * 32 && warps * 2 <= steps) {
    warps *= 2;
  }
  QS_CHECK(blocks <= 0x7fffffff);
  launch(gemv_mma_kernel<T, NT, UNROLL, L2HINT>, static_cast<unsigned>(blocks), warps * 32, 0,
         stream, x, m, K, ms);
  CUDA_CHECK_LAUNCH(stream);
}

// nin.sumsq (NT = 1, a mixed gate / up launch): x is a deferred norm's h (ring_walk's NIN).
template <typename T, int NT, int STAGES>
void launch_ring(const float* x, int m, const GemvSegment* segs, int count, int num_sms,
                 cudaStream_t stream, const GemvNorm& norm, bool swiglu, const NormIn& nin = {}) {
  MmaSegments<T> ms = mma_segments<T>(segs, count);
  ms.swiglu = swiglu;
  const bool mixed = swiglu && g_tuning.swiglu_mixed;
  const bool nin_on = nin.sumsq != nullptr, defer_out = norm.h != nullptr && norm.sumsq != nullptr;
  QS_CHECK(!nin_on || (NT == 1 && mixed));
  QS_CHECK(!defer_out || (NT == 1 && !swiglu));
  // Mixed: ceil(N / 8) tiles of 8 gate + 8 up rows; else 16-row tiles (paired: gate, up).
  const int64_t tiles = mixed ? (segs[0].w.rows + 7) / 8 : ms.block_end[kMaxGemvSegments - 1];
  const int64_t K = segs[0].w.cols;
  const int warps = ring_warps(K);
  // The deferred norm's forms at m = 1 only (NT = 1).
  constexpr int kIn = NT == 1 ? kNormIn : kNormAsGiven, kOut = NT == 1 ? kDeferOut : kNormAsGiven;
  auto* kernel = nin_on      ? gemv_ring_kernel<T, NT, STAGES, true, kIn>
                 : defer_out ? gemv_ring_kernel<T, NT, STAGES, false, kOut>
                 : mixed     ? gemv_ring_kernel<T, NT, STAGES, true>
                             : gemv_ring_kernel<T, NT, STAGES, false>;
  const int variant = nin_on ? 2 : defer_out ? 3 : mixed;
  static bool opted_in[4] = {};  // above 48 KiB, once per instantiation
  if (!opted_in[variant]) {
    const size_t most =
        nin_on ? max_smem_per_block()
               : std::min(ring_smem_bytes(kRingMaxWarps, STAGES, NT), max_smem_per_block());
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(most)));
    // QS_GEMV_CARVEOUT=P (0..100): the shared-memory share of the SM's L1 / shared storage the
    // driver should prefer for this kernel (what is left is L1, where x is re-read per tile).
    const int carveout = env_int("QS_GEMV_CARVEOUT", 0, 100, -1);
    if (carveout >= 0) {
      CUDA_CHECK(
          cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, carveout));
    }
    opted_in[variant] = true;
  }
  const int64_t grid = std::min<int64_t>(swiglu && !mixed ? tiles / 2 : tiles, num_sms);
  launch(kernel, static_cast<unsigned>(grid), warps * 32,
         ring_smem_bytes(warps, STAGES, NT) + (nin_on ? nin_smem_bytes(K) : 0), stream, x, m, K, ms,
         tiles, norm, nin);
  if (nin_on) ++g_norm_in_launches;
  CUDA_CHECK_LAUNCH(stream);
}

// The ring kernel's stages for these matrices (4 or 6), or 0 where it does not run (tuned off,
// or its shared memory does not fit).
template <int NT>
int ring_stages_for(const GemvSegment* segs, int count, int num_sms) {
  if (g_tuning.ring_stages < 0) return 0;
  int64_t rows = 0;
  for (int i = 0; i < count; ++i) rows += segs[i].w.rows;
  int stages = g_tuning.ring_stages;
  if (stages == 0) stages = (rows + 15) / 16 >= int64_t{kRingDeepTilesPerSm} * num_sms ? 6 : 4;
  // GPUs with less shared memory per block than the H200's 227 KiB (sm_80: 163 KiB) take
  // fewer stages, or the per-tile kernel.
  const int warps = ring_warps(segs[0].w.cols);
  const size_t smem_max = max_smem_per_block();
  if (stages == 6 && ring_smem_bytes(warps, 6, NT) > smem_max) stages = 4;
  return ring_smem_bytes(warps, stages, NT) <= smem_max ? stages : 0;
}

template <typename T, int NT>
void launch_ring_stages(int stages, const float* x, int m, const GemvSegment* segs, int count,
                        int num_sms, cudaStream_t stream, const GemvNorm& norm, bool swiglu = false,
                        const NormIn& nin = {}) {
  if (stages == 6) {
    return launch_ring<T, NT, 6>(x, m, segs, count, num_sms, stream, norm, swiglu, nin);
  }
  launch_ring<T, NT, 4>(x, m, segs, count, num_sms, stream, norm, swiglu, nin);
}

template <typename T, int NT>
void launch_mma_tuned(const float* x, int m, const GemvSegment* segs, int count, int num_sms,
                      cudaStream_t stream) {
  int64_t rows = 0;
  for (int i = 0; i < count; ++i) rows += segs[i].w.rows;
  if (const int stages = ring_stages_for<NT>(segs, count, num_sms); stages > 0) {
    return launch_ring_stages<T, NT>(stages, x, m, segs, count, num_sms, stream, GemvNorm{});
  }
  int unroll = g_tuning.mma_unroll;
  if (unroll == 0) unroll = (rows + 15) / 16 >= int64_t{num_sms} * 32 ? 8 : 4;
  if (unroll >= 8) {
    if (g_tuning.l2_prefetch) {
      launch_mma<T, NT, 8, true>(x, m, segs, count, num_sms, stream);
    } else {
      launch_mma<T, NT, 8, false>(x, m, segs, count, num_sms, stream);
    }
  } else {
    if (g_tuning.l2_prefetch) {
      launch_mma<T, NT, 4, true>(x, m, segs, count, num_sms, stream);
    } else {
      launch_mma<T, NT, 4, false>(x, m, segs, count, num_sms, stream);
    }
  }
}

template <typename T>
void launch_mma_rows(const float* x, int m, const GemvSegment* segs, int count, int num_sms,
                     cudaStream_t stream) {
  if (m <= 8) {
    launch_mma_tuned<T, 1>(x, m, segs, count, num_sms, stream);
  } else {
    launch_mma_tuned<T, 2>(x, m, segs, count, num_sms, stream);
  }
}

template <typename T, int M>
void launch_coalesced(const float* x, int m, const DeviceMatrix& w, const DeviceBias& bias,
                      float* y, int num_sms, cudaStream_t stream) {
  const int64_t blocks = (w.rows + kCoalRows - 1) / kCoalRows;
  const int64_t steps = (w.cols / 8 + 32 * kCoalUnroll - 1) / (32 * kCoalUnroll);
  int warps = 1;
  while (warps < kCoalMaxWarps && warps * blocks < int64_t{num_sms} * 32 && warps * 2 <= steps) {
    warps *= 2;
  }
  QS_CHECK(blocks <= 0x7fffffff);
  const unsigned grid = static_cast<unsigned>(blocks);
  if (g_tuning.l2_prefetch) {
    launch(gemv_coalesced_kernel<T, M, true>, grid, warps * 32, 0, stream, x, m, w.cols,
           static_cast<const T*>(w.data), w.rows, bias, y);
  } else {
    launch(gemv_coalesced_kernel<T, M, false>, grid, warps * 32, 0, stream, x, m, w.cols,
           static_cast<const T*>(w.data), w.rows, bias, y);
  }
  CUDA_CHECK_LAUNCH(stream);
}

template <typename T>
void launch_half(const float* x, int m, const DeviceMatrix& w, const DeviceBias& bias, float* y,
                 int num_sms, cudaStream_t stream) {
  if (m <= std::min(g_tuning.coalesced_max_rows, 4)) {
    if (m == 1) {
      launch_coalesced<T, 1>(x, m, w, bias, y, num_sms, stream);
    } else if (m == 2) {
      launch_coalesced<T, 2>(x, m, w, bias, y, num_sms, stream);
    } else {
      launch_coalesced<T, 4>(x, m, w, bias, y, num_sms, stream);
    }
  } else {
    const GemvSegment seg{w, bias, y};
    launch_mma_rows<T>(x, m, &seg, 1, num_sms, stream);
  }
}

}  // namespace

// ---- launchers ------------------------------------------------------------------------------

bool gemv_uses_tensor_cores(const float* x, const DeviceMatrix& w) {
  const bool half_type = w.dtype == DType::BF16 || w.dtype == DType::F16;
  const bool aligned =
      (reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(w.data)) % 16 == 0;
  return half_type && w.cols % 8 == 0 && aligned;
}

void launch_gemv_simt(const float* x, int m, const DeviceMatrix& w, const DeviceBias& bias,
                      float* y, cudaStream_t stream) {
  QS_CHECK(m >= 1 && w.rows >= 1 && w.cols >= 1);
  constexpr int kWarps = 8;
  const int64_t blocks = (w.rows + kWarps - 1) / kWarps;
  QS_CHECK(blocks <= 0x7fffffff);
  const unsigned grid = static_cast<unsigned>(blocks);
  switch (w.dtype) {
    case DType::F32:
      launch(gemv_simt_kernel<float>, grid, kWarps * 32, 0, stream, x, m, w.cols,
             static_cast<const float*>(w.data), w.rows, bias, y);
      break;
    case DType::F16:
      launch(gemv_simt_kernel<__half>, grid, kWarps * 32, 0, stream, x, m, w.cols,
             static_cast<const __half*>(w.data), w.rows, bias, y);
      break;
    case DType::BF16:
      launch(gemv_simt_kernel<__nv_bfloat16>, grid, kWarps * 32, 0, stream, x, m, w.cols,
             static_cast<const __nv_bfloat16*>(w.data), w.rows, bias, y);
      break;
    default:
      QS_CHECK_MSG(false, "gemv: unsupported weight dtype");
  }
  CUDA_CHECK_LAUNCH(stream);
}

bool gemv_group_supported(const float* x, int m, const GemvSegment* segs, int count) {
  if (count < 1 || count > kMaxGemvSegments || m < 1 || m > kMaxGemvRows) return false;
  if (m <= std::min(g_tuning.coalesced_max_rows, 4)) return false;  // that kernel is per matrix
  for (int i = 0; i < count; ++i) {
    const DeviceMatrix& w = segs[i].w;
    if (!gemv_uses_tensor_cores(x, w) || w.dtype != segs[0].w.dtype || w.cols != segs[0].w.cols) {
      return false;
    }
  }
  return true;
}

void launch_gemv_group(const float* x, int m, const GemvSegment* segs, int count, int num_sms,
                       cudaStream_t stream) {
  QS_CHECK(gemv_group_supported(x, m, segs, count));
  if (segs[0].w.dtype == DType::BF16) {
    launch_mma_rows<__nv_bfloat16>(x, m, segs, count, num_sms, stream);
  } else {
    launch_mma_rows<__half>(x, m, segs, count, num_sms, stream);
  }
}

// The ring kernel over these matrices with an epilogue (norm, or the gate / up pair's SwiGLU), or
// false where it does not run them (nothing launched).
// Whether a deferred norm's consumer (m = 1, ring_walk's NIN) runs: each warp's columns fit its
// lanes' staging and the staged input fits beside the launch's own `bytes` of shared memory.
bool nin_fits(int m, int64_t K, size_t bytes) {
  const int warps = ring_warps(K);
  const int64_t chunks = (K + kRingChunkK - 1) / kRingChunkK;
  const int64_t per_warp = (chunks + warps - 1) / warps * kRingChunkK;  // a warp's columns, most
  return m == 1 && per_warp <= 32 * kNinPerLane &&
         bytes + nin_smem_bytes(K) <= max_smem_per_block();
}

bool launch_ring_epilogue(const float* x, int m, const GemvSegment* segs, int count,
                          const GemvNorm& norm, bool swiglu, int num_sms, cudaStream_t stream,
                          const NormIn& nin = {}) {
  if (!gemv_group_supported(x, m, segs, count)) return false;
  const bool two = m > 8;
  const int stages =
      two ? ring_stages_for<2>(segs, count, num_sms) : ring_stages_for<1>(segs, count, num_sms);
  if (stages == 0) return false;
  const int64_t K = segs[0].w.cols;
  if (nin.sumsq != nullptr && !(swiglu && g_tuning.swiglu_mixed &&
                                nin_fits(m, K, ring_smem_bytes(ring_warps(K), stages, 1)))) {
    return false;
  }
  if (segs[0].w.dtype == DType::BF16) {
    two ? launch_ring_stages<__nv_bfloat16, 2>(stages, x, m, segs, count, num_sms, stream, norm,
                                               swiglu)
        : launch_ring_stages<__nv_bfloat16, 1>(stages, x, m, segs, count, num_sms, stream, norm,
                                               swiglu, nin);
  } else {
    two ? launch_ring_stages<__half, 2>(stages, x, m, segs, count, num_sms, stream, norm, swiglu)
        : launch_ring_stages<__half, 1>(stages, x, m, segs, count, num_sms, stream, norm, swiglu,
                                        nin);
  }
  return true;
}

bool launch_gemv_norm(const float* x, int m, const DeviceMatrix& w, const DeviceBias& bias,
                      const GemvNorm& norm, int num_sms, cudaStream_t stream) {
  QS_CHECK(norm.h != nullptr);
  QS_CHECK(norm.sumsq != nullptr ? m == 1 && norm.parts >= num_sms
                                 : norm.out != nullptr && norm.arrivals != nullptr);
  QS_CHECK(norm.m == m && norm.d == w.rows);
  const GemvSegment seg{w, bias, nullptr};
  return launch_ring_epilogue(x, m, &seg, 1, norm, false, num_sms, stream);
}

bool launch_gemv_swiglu(const float* x, int m, const GemvSegment& gate, const GemvSegment& up,
                        int num_sms, cudaStream_t stream, const NormIn& nin) {
  QS_CHECK(gate.y != nullptr && gate.w.rows == up.w.rows);
  const GemvSegment segs[2] = {gate, up};
  return launch_ring_epilogue(x, m, segs, 2, GemvNorm{}, true, num_sms, stream, nin);
}

namespace {

// Whether q, k, v (segs[0..2]) are whole heads for a RoPE + row-store epilogue (rope_tile_row).
bool qkv_rows_fit(const GemvSegment* segs, const KvRowEpilogue& rows) {
  const int hd = rows.head_dim;
  return rows.k_dst != nullptr && rows.v_dst != nullptr && hd > 0 && hd % 16 == 0 &&
         hd / 2 <= kMaxRopePairs && segs[0].w.rows % hd == 0 && segs[1].w.rows % hd == 0 &&
         segs[2].w.rows == segs[1].w.rows;
}

std::atomic<uint64_t> g_qkv_rows_launches{0};

// nin.sumsq: x is a deferred norm's h (ring_walk's NIN).
template <typename T, int STAGES>
void launch_ring_rope(const float* x, const GemvSegment* segs, const KvRowEpilogue& rows,
                      int num_sms, cudaStream_t stream, const NormIn& nin) {
  const MmaSegments<T> ms = mma_segments<T>(segs, 3);
  const int64_t tiles = ms.block_end[kMaxGemvSegments - 1];
  const int64_t K = segs[0].w.cols;
  const int warps = ring_warps(K);
  const bool nin_on = nin.sumsq != nullptr;
  auto* kernel =
      nin_on ? gemv_ring_rope_kernel<T, STAGES, kNormIn> : gemv_ring_rope_kernel<T, STAGES>;
  static bool opted_in[2] = {};  // above 48 KiB, once per instantiation
  if (!opted_in[nin_on]) {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(max_smem_per_block())));
    opted_in[nin_on] = true;
  }
  launch(kernel, static_cast<unsigned>(std::min<int64_t>(tiles, num_sms)), warps * 32,
         ring_rope_smem_bytes(warps, STAGES, rows.head_dim) + (nin_on ? nin_smem_bytes(K) : 0),
         stream, x, K, ms, tiles, rows, nin);
  CUDA_CHECK_LAUNCH(stream);
  if (nin_on) ++g_norm_in_launches;
}

template <typename T>
void launch_ring_rope_stages(int stages, const float* x, const GemvSegment* segs,
                             const KvRowEpilogue& rows, int num_sms, cudaStream_t stream,
                             const NormIn& nin) {
  if (stages == 6) return launch_ring_rope<T, 6>(x, segs, rows, num_sms, stream, nin);
  launch_ring_rope<T, 4>(x, segs, rows, num_sms, stream, nin);
}
}  // namespace

bool launch_gemv_qkv_rows(const float* x, const GemvSegment* segs, const KvRowEpilogue& rows,
                          int num_sms, cudaStream_t stream, const NormIn& nin) {
  if (!g_tuning.qkv_rows || !gemv_group_supported(x, 1, segs, 3) || !qkv_rows_fit(segs, rows)) {
    return false;
  }
  const int stages = ring_stages_for<1>(segs, 3, num_sms);
  const int64_t K = segs[0].w.cols;
  const size_t rope_bytes = ring_rope_smem_bytes(ring_warps(K), stages, rows.head_dim);
  if (stages == 0 || rope_bytes > max_smem_per_block()) return false;
  if (nin.sumsq != nullptr && !nin_fits(1, K, rope_bytes)) return false;
  if (segs[0].w.dtype == DType::BF16) {
    launch_ring_rope_stages<__nv_bfloat16>(stages, x, segs, rows, num_sms, stream, nin);
  } else {
    launch_ring_rope_stages<__half>(stages, x, segs, rows, num_sms, stream, nin);
  }
  ++g_qkv_rows_launches;
  return true;
}

uint64_t gemv_qkv_rows_launches() {
  return g_qkv_rows_launches.load();
}

uint64_t gemv_norm_in_launches() {
  return g_norm_in_launches.load();
}

void set_gemv_tuning(const GemvTuning& tuning) {
  QS_CHECK(tuning.mma_unroll == 0 || tuning.mma_unroll == 4 || tuning.mma_unroll == 8);
  QS_CHECK(tuning.coalesced_max_rows >= 0 && tuning.coalesced_max_rows <= 4);
  QS_CHECK(tuning.ring_stages == -1 || tuning.ring_stages == 0 || tuning.ring_stages == 4 ||
           tuning.ring_stages == 6);
  g_tuning = tuning;
}

GemvTuning gemv_tuning() {
  return g_tuning;
}

void launch_gemv(const float* x, int m, const DeviceMatrix& w, const DeviceBias& bias, float* y,
                 int num_sms, cudaStream_t stream) {
  QS_CHECK(m >= 1 && m <= kMaxGemvRows);
  if (!gemv_uses_tensor_cores(x, w)) {
    launch_gemv_simt(x, m, w, bias, y, stream);
  } else if (w.dtype == DType::BF16) {
    launch_half<__nv_bfloat16>(x, m, w, bias, y, num_sms, stream);
  } else {
    launch_half<__half>(x, m, w, bias, y, num_sms, stream);
  }
}

}  // namespace qs::cuda
