// Device helpers of the tensor-core attention kernels (attention_quant.cu, attention_decode_tc.cu):
// cp.async into shared memory, mma.sync m16n8k16 with f16 operands, the f16 hi + lo split of an
// f32 pair, and the online-softmax exponentials.
#pragma once

#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

namespace qs::cuda {

// 2^e for an integer e in [-126, 127], exactly.
__device__ __forceinline__ float exp2i(int e) {
  return __int_as_float((e + 127) << 23);
}

// 2^x on the SFU without exp2f's rescaling of results below 2^-126 (flushed to 0: a softmax
// weight that small is below every sum's rounding); 2^-inf = 0.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// The weight 2^(m_part - m_total) of a partial online-softmax state, 0 for a state that saw no
// visible position (m_part = -inf).
__device__ __forceinline__ float merge_weight(float m_part, float m_total) {
  return m_part == -INFINITY ? 0.0f : exp2f(m_part - m_total);
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared (L2 only).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
// The same; src_bytes = 0 writes zeros (src is not read).
__device__ __forceinline__ void cp_async16_zfill(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// A warp's position in the stages it streams through a STAGES-deep cp.async ring in a persistent
// kernel: `per_item` stages for each of its items (the tiles blockIdx.x, + gridDim.x, ...),
// `remaining` in all. next(enter, copy) calls enter(item) when the next stage starts an item,
// then copy(slot) to issue the stage's cp.asyncs into ring slot `slot`, and commits a group (an
// empty one past the end, so that the consumer's wait count stays uniform). Index: the counters'
// type (32-bit where the kernel's item and stage counts fit: fewer instructions per stage).
template <int STAGES, class Index = int64_t>
struct RingCursor {
  Index remaining, per_item, item, left = 0;
  int slot = 0;

  __device__ RingCursor(Index items, Index per_item_)
      : remaining(items * per_item_), per_item(per_item_), item(blockIdx.x) {}

  template <class Enter, class Copy>
  __device__ __forceinline__ void next(Enter enter, Copy copy) {
    if (remaining > 0) {
      if (left == 0) {
        enter(item);
        left = per_item;
        item += gridDim.x;
      }
      copy(slot);
      --left, --remaining;
      slot = slot + 1 == STAGES ? 0 : slot + 1;
    }
    cp_async_commit();
  }
};

// d += A B, m16n8k16, f16 inputs, f32 accumulators.
__device__ __forceinline__ void mma_f16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                        uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
  mma_f16(d, a[0], a[1], a[2], a[3], b0, b1);
}

// Four 8x8 b16 matrices from shared memory; lane l gives the address of row l % 8 of matrix
// l / 8 (a 16-byte row). .trans: each lane gets its elements of the transposed matrices.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const __half* p) {
  ldmatrix_x4(r, smem_u32(p));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const __half* p) {
  ldmatrix_x4_trans(r, smem_u32(p));
}

// {a, b} (a in the low half) as f16 hi + lo: hi = f16(a), lo = f16(a - hi). For |a| < 2^14 and
// a not tiny, hi + lo has ~22 significant bits.
__device__ __forceinline__ void split_f16x2(float a, float b, uint32_t& hi, uint32_t& lo) {
  const __half2 h = __floats2half2_rn(a, b);
  const float2 hf = __half22float2(h);
  const __half2 l = __floats2half2_rn(a - hf.x, b - hf.y);
  hi = *reinterpret_cast<const uint32_t*>(&h);
  lo = *reinterpret_cast<const uint32_t*>(&l);
}

}  // namespace qs::cuda
