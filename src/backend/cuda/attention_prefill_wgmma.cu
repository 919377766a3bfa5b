// Hopper (sm_90a) flash-attention prefill on wgmma over f16 K/V rows: the DIRECT path of
// attention_prefill_tc.cu (f16 rows read in place, no conversion pass) with warpgroup MMAs
// instead of mma.sync, FA3-style but without warp specialization. The arithmetic is the mma.sync
// kernel's (see attention_prefill_tc.cu's header comment):
//  - Q: each query row times scale_log2 is scaled by 2^fq so its largest |q| lies in
//    [2^13, 2^14), then rounded to f16 (EXACT: also its f16 remainder, a second MMA).
//  - S = Q K^T accumulates in f32 and is multiplied by 2^-fq per row (exact).
//  - P = exp2(s - max) in [0, 1] is scaled by 2^12 (computed as exp2(s - (max - 12))) and
//    rounded to f16 (EXACT: plus remainder); O and the row sums are kept in units of 2^-12 (the
//    same rounding as the mma.sync kernel's p * 2^12 up to one f32 rounding of the exponent).
//    K and V rows are f16 already.
//
// Block: 256 threads = 2 warpgroups, 128 query rows of one query head (warpgroup w: rows
// [64 w, 64 w + 64), its warp v: [64 w + 16 v, +16)), one KV split; grid and partial states as
// attention_prefill_tc_kernel, so plan_splits and the combine are shared.
// Per key tile of 128 keys (K and V tiles loaded two tiles ahead into shared-memory slots with
// cp.async by all threads, one block barrier per tile; the two warpgroups in ping-pong, below):
//  - S (64 x 128 per warpgroup) = wgmma m64n128k16 x HD/16, Q as the register A operand (its
//    fragments: mma.sync m16n8k16's A layout per warp), K as B from shared memory, K-major.
//  - online softmax on the accumulator fragments (lane: rows g = lane / 4 and g + 8 of its warp's
//    16, columns 8 j + 2 (lane % 4) + {0, 1}; a row's 128 keys live in a quad of lanes).
//  - O (64 x HD) += P V: wgmma m64nHDk16 x 8, P as the register A operand (the S accumulator
//    layout of keys 16 kk..16 kk + 15 is the A fragment of k-step kk), V as B, MN-major
//    (dims contiguous; the transpose bit of the instruction).
// Shared memory layout of a K or V tile: dims in blocks of 64 (one 128-byte row per key and
// block), block b at b * 128 keys * 128 bytes, key row t at 128 t inside it; the 128-byte swizzle
// (the 16-byte chunk c of row t stored at chunk c ^ (t % 8)), tiles 1024-byte aligned so that the
// swizzle, a function of address bits [4, 10), matches the rows. Descriptors (PTX "matrix
// descriptor"): start >> 4, leading byte offset >> 4 at bit 16, stride byte offset >> 4 at bit
// 32, swizzle mode 1 (128 B) at bit 62. K (K-major): stride offset 1024 (the next 8 keys), leading
// offset unused (1), k-step ks starts at block ks / 4, byte 32 (ks % 4). V (MN-major): leading
// offset = the next 64 dims (one block, 16 KB), stride offset 1024 (the next 8 keys), k-step kk
// starts at key row 16 kk.
#include <cuda.h>  // CUtensorMap and its encoder's signature (called through the runtime)
#include <cuda_fp16.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend/cuda/attention_prefill_wgmma.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/prefill_q.cuh"

namespace qs::cuda {

namespace {

constexpr int kThreads = 256;  // 2 warpgroups
// The warp-specialized variant (fast path only): a third warpgroup whose one thread streams the
// K and V tiles with TMA, the consumers' per-tile copies and block barrier replaced by mbarriers
// per slot (below, "Warp specialization").
constexpr int kWsThreads = 384;
constexpr int kWsProducerRegs = 24;  // setmaxnreg: 24 x 128 + 240 x 256 = 168 x 384
constexpr int kWsConsumerRegs = 240;
constexpr int kRows = 128;     // query rows per block (64 per warpgroup)
constexpr int kKeys = 128;     // keys per K/V tile
// Tiles loaded ahead of the one computed, and shared-memory slots for K and V tiles: tile i uses
// K slot i % kKSlots and V slot i % kVSlots. In iteration i the leader still reads V of tile
// i - 1 (its O += P V is waited for with the next S) and the follower computes O += P V of tile
// i - 1, while tiles i + 1..i + kAhead are in flight: K of tile i - 1 is free, V is not.
constexpr int kAhead = 2;
constexpr int kKSlots = kAhead + 1;
constexpr int kVSlots = kAhead + 2;
constexpr int kRowBytes = 128;    // one swizzled row: 64 f16
constexpr int kAtomBytes = 1024;  // 8 rows: one swizzle pattern
// How the softmax of a tile masks keys (outside the split, after a row's position).
constexpr int kMaskNone = 0, kMaskAll = 1, kMaskByTile = 2;
using MaskNone = std::integral_constant<int, kMaskNone>;
using MaskAll = std::integral_constant<int, kMaskAll>;
using MaskByTile = std::integral_constant<int, kMaskByTile>;

template <int HD>
struct WgLayout {
  static constexpr int kBlockBytes = kKeys * kRowBytes;      // 64 dims of a tile
  static constexpr int kMatBytes = (HD / 64) * kBlockBytes;  // a K or a V tile (the V slots
                                                             // follow the K slots)
  static constexpr size_t kSmemBytes =
      size_t{kKSlots + kVSlots} * kMatBytes + kAtomBytes;  // + alignment
  // The warp-specialized variant's mbarriers after the slots: full and empty per K slot, then
  // per V slot (8 bytes each).
  static constexpr size_t kBarrierOffset = size_t{kKSlots + kVSlots} * kMatBytes;
  static constexpr size_t kWsSmemBytes = kSmemBytes + 2 * (kKSlots + kVSlots) * 8;
  static_assert(kWsSmemBytes <= 227 * 1024, "more shared memory than a block may have");
};

// The K and V rows as TMA tensor maps (the warp-specialized variant; unused otherwise): 3-D,
// {dim, kv head, key} with strides {2 HD, 2 row_stride} bytes and kv_end keys (the rest read as
// zeros), a box of {64 dims, 1 head, 128 keys} stored with the 128-byte swizzle, i.e. one 64-dim
// block of a tile in the layout of the header comment.
struct TmaMaps {
  CUtensorMap k, v;
};

std::atomic<int64_t> g_ws_launches{0};

std::atomic<int64_t> g_launches{0};

// The sm_90a kernel ran (probe_kernel writes 1 only from an sm_90a image).
__global__ void probe_kernel(int* built) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  *built = 1;
#else
  *built = 0;
#endif
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

constexpr float kNegInf = -INFINITY;
constexpr int kPExp = 12;  // P is rounded as p * 2^12
// The fast path's warpgroups in ping-pong (below); false: both run the leader's loop (A/B runs).
constexpr bool kPingPong = true;

// Byte offset of 16-byte chunk c (dims 8 c..8 c + 7) of key row t in a K or V tile (the layout
// in the header comment).
__device__ __forceinline__ uint32_t tile_offset(int t, int c) {
  return (c / 8) * (kKeys * kRowBytes) + t * kRowBytes + (((c % 8) ^ (t % 8)) << 4);
}

// A shared-memory matrix descriptor with the 128-byte swizzle.
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr, uint32_t leading_bytes,
                                               uint32_t stride_bytes) {
  return static_cast<uint64_t>((addr & 0x3FFFFu) >> 4) |
         (static_cast<uint64_t>(leading_bytes >> 4) << 16) |
         (static_cast<uint64_t>(stride_bytes >> 4) << 32) | (uint64_t{1} << 62);
}
// desc moved on by `bytes` (a multiple of 16) through its low word alone: the start address
// field is the low 14 bits and shared addresses stay below 2^18, so the sum never carries out of
// it (one uniform add per wgmma instead of rebuilding the descriptor: ~5 instructions).
__device__ __forceinline__ uint64_t desc_plus(uint64_t desc, uint32_t bytes) {
  const uint32_t lo = static_cast<uint32_t>(desc) + (bytes >> 4);
  return (desc & 0xFFFFFFFF00000000ull) | lo;
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// A barrier of the whole block that the warpgroups reach from different code (one loop per role):
// the non-.aligned form (__syncthreads is the .aligned bar.sync 0, which requires every thread
// of the block at the same instruction).
__device__ __forceinline__ void block_barrier() {
  asm volatile("barrier.sync 0;\n" ::: "memory");
}
// cp.async wrote through the generic proxy; wgmma reads through the async proxy.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// mbarriers (shared::cta, 8 bytes) and TMA for the warp-specialized variant.
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// The producer's arrival, announcing the bytes its copies will complete on the barrier.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
// Until the phase of parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (done == 0);
}
// Box {c0, c1, c2} of the tensor map into shared memory at dst, completing on bar.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                            int c2, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
      "%3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
// Keeps the compiler from moving accesses of registers that wgmma reads or writes
// asynchronously (accumulators, register A fragments) across the wgmma fences and waits.
template <int N>
__device__ __forceinline__ void fence_registers(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_registers(uint32_t (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
  }
}

// d (this warpgroup's 64 x N f32 accumulator fragment) = A B (+ d with ACCUMULATE), m64nNk16:
// A = a (registers, f16 pairs), B = the f16 matrix at desc_b (K-major, or MN-major with TRANS_B).
// Without ACCUMULATE d is an output only (scale-d = 0), so its old values are dead before.
// Operand lists: QS_WG_D<n>(C) is C(d[0]), .., C(d[n - 1]) for the accumulator constraint C
// ("+f" accumulating, "=f" not), QS_WG_STR<n> the matching "%0, .., %<n-1>".
#define QS_WG_ACC(x) "+f"(x)
#define QS_WG_OUT(x) "=f"(x)
#define QS_WG_D8(C, i) \
  C(d[i]), C(d[i + 1]), C(d[i + 2]), C(d[i + 3]), C(d[i + 4]), C(d[i + 5]), C(d[i + 6]), C(d[i + 7])
#define QS_WG_D32(C) QS_WG_D8(C, 0), QS_WG_D8(C, 8), QS_WG_D8(C, 16), QS_WG_D8(C, 24)
#define QS_WG_D64(C) \
  QS_WG_D32(C), QS_WG_D8(C, 32), QS_WG_D8(C, 40), QS_WG_D8(C, 48), QS_WG_D8(C, 56)
#define QS_WG_STR32                                                                            \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define QS_WG_STR64                                                               \
  QS_WG_STR32                                                                     \
  ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, " \
  "%47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
// After the accumulators: A (4 registers), desc_b, scale-d (as a predicate), the transpose bit.
#define QS_WG_IN(scale_d) \
  "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TRANS_B ? 1 : 0)
#define QS_WG_N128                                                    \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                        \
  "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {" QS_WG_STR64 \
  "}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
#define QS_WG_N64                                                    \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                       \
  "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {" QS_WG_STR32 \
  "}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
template <int N, bool TRANS_B, bool ACCUMULATE>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4],
                                         uint64_t desc_b) {
  static_assert(N == 128 || N == 64, "wgmma_rs: N is 64 or 128");
  if constexpr (N == 128 && ACCUMULATE) {
    asm volatile(QS_WG_N128 : QS_WG_D64(QS_WG_ACC) : QS_WG_IN(1u));
  } else if constexpr (N == 128) {
    asm volatile(QS_WG_N128 : QS_WG_D64(QS_WG_OUT) : QS_WG_IN(0u));
  } else if constexpr (ACCUMULATE) {
    asm volatile(QS_WG_N64 : QS_WG_D32(QS_WG_ACC) : QS_WG_IN(1u));
  } else {
    asm volatile(QS_WG_N64 : QS_WG_D32(QS_WG_OUT) : QS_WG_IN(0u));
  }
}
#undef QS_WG_ACC
#undef QS_WG_OUT
#undef QS_WG_D8
#undef QS_WG_D32
#undef QS_WG_D64
#undef QS_WG_STR32
#undef QS_WG_STR64
#undef QS_WG_IN
#undef QS_WG_N128
#undef QS_WG_N64

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// The keys of a block (query rows [r0, r0 + rows) of the chunk, split `split`): [t_begin, t_end),
// the causal end of its last row cut to the split, in n_tiles tiles from tile kt_first.
struct KeyRange {
  int t_begin, t_end, kt_first, n_tiles;
};
__device__ __forceinline__ KeyRange key_range(const AttentionArgs& a, int r0, int rows, int split) {
  KeyRange k;
  k.t_begin = split * a.split_len;
  k.t_end = min(a.pos + r0 + rows, k.t_begin + a.split_len);
  k.kt_first = k.t_begin / kKeys;
  k.n_tiles = k.t_end > k.t_begin ? (k.t_end - 1) / kKeys + 1 - k.kt_first : 0;
  return k;
}

template <int HD, bool EXACT, bool WS>
__global__ void __launch_bounds__(WS ? kWsThreads : kThreads, 1)
    attention_prefill_wgmma_kernel(AttentionArgs a, const __grid_constant__ TmaMaps maps) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(!(WS && EXACT), "the warp-specialized variant is the fast path's");
  pdl_begin();
  using L = WgLayout<HD>;
  constexpr int KS = HD / 16;                     // k-steps of Q K^T
  constexpr int kVBase = kKSlots * L::kMatBytes;  // the V slots
  constexpr int kSAcc = kKeys / 2;                // S accumulators per thread
  constexpr int kOAcc = HD / 2;                   // O accumulators per thread
  constexpr int kPSteps = kKeys / 16;
  extern __shared__ float4 smem4[];
  const uint32_t smem0 = (smem_u32(smem4) + (kAtomBytes - 1)) & ~uint32_t{kAtomBytes - 1};

  // The warpgroup and warp as warp-uniform values (a shuffle from lane 0): ptxas then sees the
  // branches on them as non-divergent and keeps the wgmma pipeline (else it serializes wgmmas).
  const int tid = threadIdx.x, lane = tid % 32;
  const int wg = __shfl_sync(kFullMask, tid / 128, 0);
  const int warp = __shfl_sync(kFullMask, (tid % 128) / 32, 0);
  const int g = lane / 4, t4 = lane % 4;
  const int r0 = (gridDim.x - 1 - blockIdx.x) * kRows;
  const int rows = min(kRows, a.m - r0);
  const int head = blockIdx.y;
  const int kvh = head / (a.num_heads / a.num_kv_heads);
  const int split = blockIdx.z;
  const int row_a = 64 * wg + 16 * warp + g, row_b = row_a + 8;  // block rows of this lane

  // Warp specialization: the mbarriers of the K slots (full, empty) and of the V slots. Tile i
  // fills K slot i % kKSlots and V slot i % kVSlots in their phase i / slots: "full" completes
  // when the producer's TMA bytes have landed, "empty" when each of the 8 consumer warps has
  // released the slot (its wgmmas reading it have completed). Warpgroup 2 is the producer: one
  // thread issues every tile's copies in order, waiting for a slot's "empty" before refilling it.
  const uint32_t bars = smem0 + static_cast<uint32_t>(L::kBarrierOffset);
  const uint32_t full_k = bars, empty_k = bars + 8 * kKSlots;
  const uint32_t full_v = bars + 16 * kKSlots, empty_v = full_v + 8 * kVSlots;
  if constexpr (WS) {
    if (tid == 0) {
      for (int i = 0; i < kKSlots; ++i) {
        mbar_init(full_k + 8 * i, 1);
        mbar_init(empty_k + 8 * i, 8);
      }
      for (int i = 0; i < kVSlots; ++i) {
        mbar_init(full_v + 8 * i, 1);
        mbar_init(empty_v + 8 * i, 8);
      }
      asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (wg == 2) {
      setmaxnreg_dec<kWsProducerRegs>();
      if (tid == 2 * 128) {
        const KeyRange kr = key_range(a, r0, rows, split);
        for (int i = 0; i < kr.n_tiles; ++i) {
          const int key0 = (kr.kt_first + i) * kKeys;
          const int ks = i % kKSlots, vs = i % kVSlots;
          if (i >= kKSlots) mbar_wait(empty_k + 8 * ks, (i / kKSlots + 1) & 1);
          mbar_arrive_expect_tx(full_k + 8 * ks, L::kMatBytes);
#pragma unroll
          for (int b = 0; b < HD / 64; ++b) {
            tma_load_3d(smem0 + ks * L::kMatBytes + b * L::kBlockBytes, &maps.k, 64 * b, kvh, key0,
                        full_k + 8 * ks);
          }
          if (i >= kVSlots) mbar_wait(empty_v + 8 * vs, (i / kVSlots + 1) & 1);
          mbar_arrive_expect_tx(full_v + 8 * vs, L::kMatBytes);
#pragma unroll
          for (int b = 0; b < HD / 64; ++b) {
            tma_load_3d(smem0 + kVBase + vs * L::kMatBytes + b * L::kBlockBytes, &maps.v, 64 * b,
                        kvh, key0, full_v + 8 * vs);
          }
        }
      }
      return;
    }
    setmaxnreg_inc<kWsConsumerRegs>();
  }

  // Q fragments (A layout of k-step ks, prefill_q.cuh): q * scale_log2 * 2^fq, fq per row; EXACT
  // also keeps the remainders.
  uint32_t qhi[KS][4], qlo[EXACT ? KS : 1][4];
  int q_exp[2];
  load_q_fragments<HD, EXACT>(a, r0, rows, head, row_a, t4, qhi, qlo, q_exp);
  fence_registers(qhi);
  if constexpr (EXACT) fence_registers(qlo);

  // Keys of this block: [t_begin, t_end), tiles kt_first .. kt_first + n_tiles - 1.
  const KeyRange kr = key_range(a, r0, rows, split);
  const int t_begin = kr.t_begin, t_end = kr.t_end, kt_first = kr.kt_first, n_tiles = kr.n_tiles;
  const int qpos_a = a.pos + r0 + row_a, qpos_b = qpos_a + 8;
  // This warpgroup's rows: [64 wg, min(64 wg + 64, rows)); none when m ends before them.
  const bool wg_rows = 64 * wg < rows;
  const int qpos_wg_first = a.pos + r0 + 64 * wg;  // keys <= this are visible to all its rows
  const int qpos_wg_last = a.pos + r0 + min(64 * wg + 64, rows) - 1;

  // Tiles: keys past pos + m as zeros (finite V for masked keys).
  const __half* k_rows = static_cast<const __half*>(a.k) + static_cast<int64_t>(kvh) * HD;
  const __half* v_rows = static_cast<const __half*>(a.v) + static_cast<int64_t>(kvh) * HD;
  const int kv_end = a.pos + a.m;
  // Thread tid copies the 16-byte chunk c_own of key rows t_own + r kRowStep (r < kPerMat) of
  // both tiles: the swizzle depends on the row through t % 8 only, so one shared offset and one
  // row pointer per matrix serve all r.
  constexpr int kRowChunks = HD / 8;
  constexpr int kRowStep = kThreads / kRowChunks;
  constexpr int kPerMat = kKeys / kRowStep;
  static_assert(kThreads % kRowChunks == 0 && kKeys % kRowStep == 0 && kRowStep % 8 == 0,
                "a tile must split evenly over threads");
  const int c_own = tid % kRowChunks, t_own = tid / kRowChunks;
  const uint32_t own_offset = tile_offset(t_own, c_own);
  const int64_t step = static_cast<int64_t>(kRowStep) * a.row_stride;
  // A tile inside [0, pos + m) (all but the last) copies without the per-row checks: ~56
  // instructions per thread instead of ~140.
  auto load_tile = [&](int i) {  // tile kt_first + i
    const uint32_t k_dst = smem0 + (i % kKSlots) * L::kMatBytes + own_offset;
    const uint32_t v_dst = smem0 + kVBase + (i % kVSlots) * L::kMatBytes + own_offset;
    const int key = (kt_first + i) * kKeys + t_own;
    const int64_t src = static_cast<int64_t>(key) * a.row_stride + 8 * c_own;
    if ((kt_first + i + 1) * kKeys <= kv_end) {
      const __half* k_src = k_rows + src;
      const __half* v_src = v_rows + src;
#pragma unroll
      for (int r = 0; r < kPerMat; ++r) {
        cp_async16(k_dst + r * kRowStep * kRowBytes, k_src + r * step);
        cp_async16(v_dst + r * kRowStep * kRowBytes, v_src + r * step);
      }
      return;
    }
#pragma unroll
    for (int r = 0; r < kPerMat; ++r) {
      const bool valid = key + r * kRowStep < kv_end;
      const int64_t off = valid ? src + r * step : 0;
      cp_async16_zfill(k_dst + r * kRowStep * kRowBytes, k_rows + off, valid ? 16 : 0);
      cp_async16_zfill(v_dst + r * kRowStep * kRowBytes, v_rows + off, valid ? 16 : 0);
    }
  };

  float o[kOAcc];
#pragma unroll
  for (int i = 0; i < kOAcc; ++i) o[i] = 0.0f;
  float m_run[2] = {kNegInf, kNegInf};
  float l_run[2] = {0.0f, 0.0f};  // this lane's share of the row sums (its keys)
  const float f_a = exp2i(-q_exp[0]), f_b = exp2i(-q_exp[1]);
  float s[kSAcc];                                       // S of one tile
  uint32_t ph[kPSteps][4], pl[EXACT ? kPSteps : 1][4];  // P of one tile (A fragments)

  // S = Q K^T of tile kt_first + i (K-major B: k-step ks = dims 16 ks.., in block ks / 4 at
  // byte 32 (ks % 4)). Issued only; the caller fences before and commits after.
  auto issue_s = [&](int i) {
    const uint64_t k_desc = sw128_desc(smem0 + (i % kKSlots) * L::kMatBytes, 16, kAtomBytes);
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      const uint64_t desc = desc_plus(k_desc, (ks / 4) * L::kBlockBytes + (ks % 4) * 32);
      if (ks == 0) {
        wgmma_rs<kKeys, false, false>(s, EXACT ? qlo[0] : qhi[0], desc);
      } else if constexpr (EXACT) {
        wgmma_rs<kKeys, false, true>(s, qlo[ks], desc);
      } else {
        wgmma_rs<kKeys, false, true>(s, qhi[ks], desc);
      }
      if constexpr (EXACT) wgmma_rs<kKeys, false, true>(s, qhi[ks], desc);
    }
  };

  // O += P V of tile kt_first + i (MN-major B: k-step kk = key rows 16 kk.., the next 64 dims
  // one block further). Issued only, after the fence; the caller commits.
  auto issue_pv = [&](int i) {
    const uint64_t v_desc =
        sw128_desc(smem0 + kVBase + (i % kVSlots) * L::kMatBytes, L::kBlockBytes, kAtomBytes);
    fence_registers(ph);
    if constexpr (EXACT) fence_registers(pl);
    fence_registers(o);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kPSteps; ++kk) {
      const uint64_t desc = desc_plus(v_desc, kk * 16 * kRowBytes);
      if constexpr (EXACT) wgmma_rs<HD, true, true>(o, pl[kk], desc);
      wgmma_rs<HD, true, true>(o, ph[kk], desc);
    }
  };

  // Online softmax of the tile at key0 (S in s, no wgmma in flight on s or o): updates m, l,
  // rescales O, and leaves P in ph (pl). Rows a (s[4 n], s[4 n + 1]) and b (s[4 n + 2],
  // s[4 n + 3]), keys key0 + 8 n + 2 t4 + {0, 1}. The scores are s * f (f = 2^-fq, exact),
  // folded into the maxima (max(s) f = max(s f)) and into the exponent's FMA (s f - m rounds
  // once, as s f is exact). exp2 without denormal results: a weight below 2^-126 is 0 after its
  // f16 rounding (p 2^12) and below the rounding of every row sum (>= 1).
  auto mask_key = [&](int key0, int n, int e) {
    const int key = key0 + 8 * n + 2 * t4 + (e & 1);
    if (key < t_begin || key >= t_end || key > (e < 2 ? qpos_a : qpos_b)) s[4 * n + e] = kNegInf;
  };
  // mask_mode (MaskNone / MaskAll / MaskByTile): MaskByTile decides per tile (the fast path);
  // the other two are for tiles known to need no mask / some (EXACT, whose loop is split by it).
  auto softmax = [&](int key0, auto mask_mode) {
    constexpr int kMask = decltype(mask_mode)::value;
    // Fast path: the mask in its own loop behind a (warp-uniform) branch; inside the maxima's
    // loop ptxas predicated it, and its ~300 instructions ran on every tile (960 per warp and
    // tile, ~660 without; ncu: issue slots 50% busy, tensor pipe 52%). EXACT may not branch
    // between its S and P V (this branch, or the fast path's conditional rescale below): ptxas
    // (CUDA 13.0) then gave P hi / lo the registers of Q hi / lo, which the next tile's S still
    // reads (session 17: ExactSweep 0.85 off on the H200; the PTX keeps them apart, so a
    // register allocation bug; in SASS the exact loop's S and P V wgmmas must not share A
    // registers: P lives in the S accumulators; tools/gpu/wgmma_q_registers.py checks the
    // object). Its leader loop runs in three ranges instead (masked first tile, unmasked tiles,
    // masked last tiles), each without a branch.
    const bool mask_tile =
        kMask == kMaskAll || (kMask == kMaskByTile && (key0 < t_begin || key0 + kKeys > t_end ||
                                                       key0 + kKeys - 1 > qpos_wg_first));
    if (mask_tile) {
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) mask_key(key0, n, e);
      }
    }
    float mx_a = kNegInf, mx_b = kNegInf;
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (e < 2) {
          mx_a = fmaxf(mx_a, s[4 * n + e]);
        } else {
          mx_b = fmaxf(mx_b, s[4 * n + e]);
        }
      }
    }
    mx_a = fmaxf(mx_a, __shfl_xor_sync(kFullMask, mx_a, 1));
    mx_a = fmaxf(mx_a, __shfl_xor_sync(kFullMask, mx_a, 2));
    mx_b = fmaxf(mx_b, __shfl_xor_sync(kFullMask, mx_b, 1));
    mx_b = fmaxf(mx_b, __shfl_xor_sync(kFullMask, mx_b, 2));
    const float mnew_a = fmaxf(m_run[0], mx_a * f_a), mnew_b = fmaxf(m_run[1], mx_b * f_b);
    // A row with nothing visible yet keeps m = -inf; subtracting 0 keeps its p = 0 (no NaN).
    const float muse_a = mnew_a == kNegInf ? 0.0f : mnew_a;
    const float muse_b = mnew_b == kNegInf ? 0.0f : mnew_b;
    const float corr_a = exp2f(m_run[0] - muse_a), corr_b = exp2f(m_run[1] - muse_b);
    m_run[0] = mnew_a;
    m_run[1] = mnew_b;
    // p 2^12 = 2^(s f - (m - 12)): the weights, the row sums and O in units of 2^-12.
    const float mp_a = kPExp - muse_a, mp_b = kPExp - muse_b;
    float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n) {
      s[4 * n] = exp2_ftz(fmaf(s[4 * n], f_a, mp_a));
      s[4 * n + 1] = exp2_ftz(fmaf(s[4 * n + 1], f_a, mp_a));
      s[4 * n + 2] = exp2_ftz(fmaf(s[4 * n + 2], f_b, mp_b));
      s[4 * n + 3] = exp2_ftz(fmaf(s[4 * n + 3], f_b, mp_b));
      sum_a += s[4 * n] + s[4 * n + 1];
      sum_b += s[4 * n + 2] + s[4 * n + 3];
    }
    l_run[0] = l_run[0] * corr_a + sum_a;
    l_run[1] = l_run[1] * corr_b + sum_b;
    // Fast path: rescale O only where a maximum of the warp's rows moved (corr = 1 otherwise,
    // and x * 1 is x): past the first tiles of a long prompt most tiles leave every maximum in
    // place. EXACT always rescales (no branch between its S and P V: see the mask above).
    if (EXACT || __any_sync(kFullMask, corr_a != 1.0f || corr_b != 1.0f)) {
#pragma unroll
      for (int d = 0; d < HD / 8; ++d) {
        o[4 * d] *= corr_a, o[4 * d + 1] *= corr_a;
        o[4 * d + 2] *= corr_b, o[4 * d + 3] *= corr_b;
      }
    }
    // P's A fragment of k-step kk (keys 16 kk..16 kk + 15): S n-tiles 2 kk and 2 kk + 1.
#pragma unroll
    for (int kk = 0; kk < kPSteps; ++kk) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint32_t lo;
        split_f16x2(s[8 * kk + 2 * j], s[8 * kk + 2 * j + 1], ph[kk][j], lo);
        if constexpr (EXACT) pl[kk][j] = lo;
      }
    }
  };

  // The two warpgroups run out of phase (ping-pong): within an iteration the leader (warpgroup 0)
  // computes S of tile kt, its softmax, and issues O += P V (waited for with the next S; at once
  // with EXACT, for registers), while the follower first finishes the previous tile (softmax and
  // O += P V of tile kt - 1, whose S it computed last iteration), then issues S of tile kt and
  // waits for both. So one warpgroup's exponentials overlap the other's MMAs. Both read V of tile
  // kt - 1 in iteration kt (see kVSlots).
  // (Two loops, one per role, with the same barriers: ptxas then tracks each one's wgmma
  // pipeline; one loop with a branch per iteration would look to it as if the follower could
  // rescale O while the leader's O += P V is in flight, and it would serialize every wgmma.)
  // The warp-specialized variant (WS) runs the same loops with each slot waited for on its "full"
  // barrier instead of begin_tile, and released (lane 0 of each warp, after the wgmma_wait that
  // completed its last reader) on its "empty" one. Every warpgroup waits for and releases every
  // tile's K and V slots in order, also the tiles it does not compute, so that the barriers'
  // phases stay in step with the tiles.
  auto wait_k = [&](int i) { mbar_wait(full_k + 8 * (i % kKSlots), (i / kKSlots) & 1); };
  auto wait_v = [&](int i) { mbar_wait(full_v + 8 * (i % kVSlots), (i / kVSlots) & 1); };
  auto release_k = [&](int i) {
    if (lane == 0) mbar_arrive(empty_k + 8 * (i % kKSlots));
  };
  auto release_v = [&](int i) {
    if (lane == 0) mbar_arrive(empty_v + 8 * (i % kVSlots));
  };
  if constexpr (!WS) {
#pragma unroll
    for (int st = 0; st < kAhead; ++st) {
      if (st < n_tiles) load_tile(st);
      cp_async_commit();
    }
  }
  // Waits for tile it and loads tile it + kAhead (into the slots of tiles it - 1 (K), it - 2 (V)).
  auto begin_tile = [&](int it) {
    cp_async_wait<kAhead - 1>();  // this thread's pieces of tile it have landed
    fence_proxy_async_shared();
    // Tile it is complete, and every warpgroup has waited for its S of tile it - 1 and its
    // O += P V of tile it - 2 (the last readers of the slots refilled next).
    block_barrier();
    if (it + kAhead < n_tiles) load_tile(it + kAhead);
    cp_async_commit();
  };
  // EXACT: both warpgroups lead (the follower's extra live registers would serialize it).
  if (wg == 0 || EXACT || !kPingPong) {  // the leader
    int pv_tile = -1;                    // WS: the tile of this warpgroup's O += P V in flight
    auto lead = [&](int it, auto mask_mode) {
      if constexpr (WS) {
        wait_k(it);
      } else {
        begin_tile(it);
      }
      const int key0 = (kt_first + it) * kKeys;
      if (!wg_rows || key0 > qpos_wg_last) {  // no row of this warpgroup sees the tile
        wgmma_wait<0>();                      // the last O += P V, for the slot's refill
        fence_registers(o);
        if constexpr (WS) {
          if (pv_tile >= 0) release_v(pv_tile);
          pv_tile = -1;
          release_k(it);
          wait_v(it);
          release_v(it);
        }
        return;
      }
      wgmma_fence();
      issue_s(it);
      wgmma_commit();
      wgmma_wait<0>();  // S, and the previous tile's O += P V
      fence_registers(s);
      fence_registers(o);
      if constexpr (WS) {
        release_k(it);
        if (pv_tile >= 0) release_v(pv_tile);
      }
      softmax(key0, mask_mode);
      if constexpr (WS) wait_v(it);
      issue_pv(it);
      wgmma_commit();
      if constexpr (WS) pv_tile = it;
      if constexpr (EXACT) {
        // Q and P hi + lo leave too few registers to keep P live across the next S (ptxas would
        // serialize every wgmma): wait now.
        wgmma_wait<0>();
        fence_registers(o);
      }
    };
    if constexpr (EXACT) {
      // Tiles that need the mask: the first if the split starts inside it, and from the first
      // tile that reaches past the split's end or the warpgroup's first row on (monotone).
      const int first = kt_first * kKeys < t_begin ? 1 : 0;
      const int lim = min(t_end, qpos_wg_first + 1);  // keys below it are visible to every row
      const int plain_end = max(first, min(n_tiles, lim / kKeys - kt_first));
      int it = 0;
      for (; it < first; ++it) lead(it, MaskAll{});
      for (; it < plain_end; ++it) lead(it, MaskNone{});
      for (; it < n_tiles; ++it) lead(it, MaskAll{});
    } else {
      for (int it = 0; it < n_tiles; ++it) lead(it, MaskByTile{});
    }
  } else {  // the follower: s holds S of tile it - 1 while s_pending
    bool s_pending = false;
    for (int it = 0; it < n_tiles; ++it) {
      if constexpr (WS) {
        wait_k(it);
      } else {
        begin_tile(it);
      }
      if (s_pending) {
        softmax((kt_first + it - 1) * kKeys, MaskByTile{});
        if constexpr (WS) wait_v(it - 1);
        issue_pv(it - 1);
      } else if (WS && it > 0) {
        wait_v(it - 1);
      }
      const int key0 = (kt_first + it) * kKeys;
      s_pending = wg_rows && key0 <= qpos_wg_last;  // a row of this warpgroup sees the tile
      // S even of a tile none of its rows sees (then unused): s, carried to the next iteration,
      // must be defined by the wgmma on every path, or ptxas serializes the wgmmas.
      wgmma_fence();
      issue_s(it);
      wgmma_commit();
      wgmma_wait<0>();
      fence_registers(s);
      fence_registers(o);
      if constexpr (WS) {
        release_k(it);
        if (it > 0) release_v(it - 1);
      }
    }
    // The last tile. WS: its V wait inside the branch (outside it ptxas serializes the wgmmas,
    // C7515); the leader waits for every V tile, so all copies land before the block exits.
    if (s_pending) {
      if constexpr (WS) wait_v(n_tiles - 1);
      softmax((kt_first + n_tiles - 1) * kKeys, MaskByTile{});
      issue_pv(n_tiles - 1);
      wgmma_commit();
    }
  }
  wgmma_wait<0>();
  fence_registers(o);
  cp_async_wait<0>();  // no copy may still target shared memory when the block exits

  // Row sums over the quad; O and the sums back to true units (partials only).
  const float to_true = exp2i(-kPExp);
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
      const float inv = 1.0f / l;  // both in units of 2^-12
      float* dst = a.out + qi * HD + 2 * t4;
#pragma unroll
      for (int d = 0; d < HD / 8; ++d) {
        *reinterpret_cast<float2*>(dst + 8 * d) =
            make_float2(o[4 * d + 2 * h] * inv, o[4 * d + 2 * h + 1] * inv);
      }
    } else {
      const int64_t slot = static_cast<int64_t>(split) * num_qv + qi;
      float* dst = a.partial_o + slot * HD + 2 * t4;
#pragma unroll
      for (int d = 0; d < HD / 8; ++d) {
        *reinterpret_cast<float2*>(dst + 8 * d) =
            make_float2(o[4 * d + 2 * h] * to_true, o[4 * d + 2 * h + 1] * to_true);
      }
      if (t4 == 0) {
        a.partial_ml[slot * 2] = m_run[h];
        a.partial_ml[slot * 2 + 1] = l * to_true;
      }
    }
  }
#else
  (void)a;
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

// cuTensorMapEncodeTiled through the runtime's driver entry point (no link to libcuda); null
// where the driver does not provide it.
using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                   const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                   const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                   CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
EncodeTiledFn encode_tiled() {
  static const EncodeTiledFn fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return EncodeTiledFn{nullptr};
    }
    return reinterpret_cast<EncodeTiledFn>(p);
  }();
  return fn;
}

// The tensor map of K or V rows (TmaMaps); false if the driver refuses it.
bool encode_rows(CUtensorMap& map, const void* rows, const AttentionArgs& a) {
  const EncodeTiledFn encode = encode_tiled();
  if (encode == nullptr) return false;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(a.head_dim),
                              static_cast<cuuint64_t>(a.num_kv_heads),
                              static_cast<cuuint64_t>(a.pos) + static_cast<cuuint64_t>(a.m)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(a.head_dim) * 2,
                                 static_cast<cuuint64_t>(a.row_stride) * 2};
  const cuuint32_t box[3] = {64, 1, kKeys};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  return encode(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3, const_cast<void*>(rows), dims, strides,
                box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <int HD, bool EXACT, bool WS>
void launch_kernel(const AttentionArgs& a, const TmaMaps& maps, cudaStream_t stream) {
  constexpr size_t smem = WS ? WgLayout<HD>::kWsSmemBytes : WgLayout<HD>::kSmemBytes;
  auto* kernel = attention_prefill_wgmma_kernel<HD, EXACT, WS>;
  static const bool configured = [kernel] {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(smem)));
    return true;
  }();
  (void)configured;
  const dim3 grid((a.m + kRows - 1) / kRows, a.num_heads, a.num_splits);
  launch(kernel, grid, WS ? kWsThreads : kThreads, smem, stream, a, maps);
  CUDA_CHECK_LAUNCH(stream);
}

// Whether the current device runs the sm_90a image: an sm_90 device (wgmma as compiled for
// sm_90a runs on compute capability 9.0 only) and a binary built with it.
bool probe_device() {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  int major = 0, minor = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  if (major != 9 || minor != 0) return false;
  cudaFuncAttributes attr;
  if (cudaFuncGetAttributes(&attr, probe_kernel) != cudaSuccess) {
    (void)cudaGetLastError();  // no image for this device
    return false;
  }
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  int* built_dev = nullptr;
  CUDA_CHECK(cudaMalloc(&built_dev, sizeof(int)));
  probe_kernel<<<1, 1, 0, stream>>>(built_dev);
  CUDA_CHECK(cudaGetLastError());
  int built = 0;
  CUDA_CHECK(cudaMemcpyAsync(&built, built_dev, sizeof(int), cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  CUDA_CHECK(cudaStreamDestroy(stream));
  CUDA_CHECK(cudaFree(built_dev));
  return built == 1;
}

}  // namespace

// ---- launchers ------------------------------------------------------------------------------

bool attention_prefill_wgmma_available() {
  static std::mutex mu;
  static std::vector<std::pair<int, bool>> cache;  // per device
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  for (const auto& e : cache) {
    if (e.first == dev) return e.second;
  }
  const bool ok = probe_device();
  cache.emplace_back(dev, ok);
  return ok;
}

bool attention_prefill_wgmma_supported(const AttentionArgs& a, bool exact) {
  (void)exact;  // both paths
  const uintptr_t kv_bits = reinterpret_cast<uintptr_t>(a.k) | reinterpret_cast<uintptr_t>(a.v);
  if (!((a.head_dim == 64 || a.head_dim == 128) && a.kv_dtype == DType::F16 && !a.selected &&
        a.row_stride % 8 == 0 && kv_bits % 16 == 0 &&
        a.pos + static_cast<int64_t>(a.m) + kKeys < (int64_t{1} << 31) &&
        attention_prefill_wgmma_available())) {
    return false;
  }
  // The head_dim 128 variant takes 225 KB of shared memory (7 slots of 32 KB + the alignment
  // slack): a device (or a partition of one) that cannot opt in to that much falls back instead
  // of failing cudaFuncSetAttribute at the launch.
  const size_t smem = a.head_dim == 128 ? WgLayout<128>::kSmemBytes : WgLayout<64>::kSmemBytes;
  return smem <= max_smem_per_block();
}

int64_t attention_prefill_wgmma_launches() {
  return g_launches.load();
}

int64_t attention_prefill_wgmma_ws_launches() {
  return g_ws_launches.load();
}

void launch_attention_prefill_wgmma(const AttentionArgs& a, cudaStream_t stream, bool exact,
                                    bool warp_specialized) {
  QS_CHECK_MSG(attention_prefill_wgmma_supported(a, exact),
               "attention_prefill_wgmma: unsupported call (see attention_prefill_wgmma_supported)");
  QS_CHECK(a.m >= 1 && a.pos >= 0 && a.num_kv_heads >= 1 && a.num_heads % a.num_kv_heads == 0);
  QS_CHECK(a.num_heads <= 65535 && a.num_splits >= 1 && a.num_splits <= 65535);
  QS_CHECK(static_cast<int64_t>(a.num_splits) * a.split_len >= a.pos + a.m);
  QS_CHECK(a.num_splits == 1 || (a.partial_o != nullptr && a.partial_ml != nullptr));
  TmaMaps maps{};
  const bool ws =
      warp_specialized && !exact && encode_rows(maps.k, a.k, a) && encode_rows(maps.v, a.v, a);
  if (ws) {
    a.head_dim == 128 ? launch_kernel<128, false, true>(a, maps, stream)
                      : launch_kernel<64, false, true>(a, maps, stream);
    g_ws_launches.fetch_add(1);
  } else if (a.head_dim == 128) {
    exact ? launch_kernel<128, true, false>(a, maps, stream)
          : launch_kernel<128, false, false>(a, maps, stream);
  } else {
    exact ? launch_kernel<64, true, false>(a, maps, stream)
          : launch_kernel<64, false, false>(a, maps, stream);
  }
  g_launches.fetch_add(1);
}

}  // namespace qs::cuda
