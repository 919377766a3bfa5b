// A grid-wide barrier for persistent kernels whose blocks are all resident at once (the layer
// chain, gemv_ring_chain_kernel in gemv.cu), and the timelines it stamps for bench_ops chaintime.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_ops.h"

namespace qs::cuda {

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Thread 0 stamps slot i of this block's entry of a chain timeline (kChainTimelineSlots words per
// block, cuda_ops.h; null: no stamps). At i = 0 it also records the block's SM in the last slot.
__device__ __forceinline__ void timeline_stamp(unsigned long long* timeline, int i) {
  if (timeline == nullptr || threadIdx.x != 0) return;
  unsigned long long* entry = timeline + blockIdx.x * kChainTimelineSlots;
  entry[i] = global_ns();
  if (i == 0) {
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    entry[kChainTimelineSlots - 1] = sm;
  }
}

// Every block adds to *count, block 0 adds 2^31 - (gridDim.x - 1) and the others 1, so the word's
// top bit flips when the last block arrives and its low bits return to where they were (no reset
// between launches; one word serves every launch of a stream). The fences make each block's
// writes before the barrier visible to every block after it (readers of such data load from L2:
// ld.global.cg). A block that waits kBarrierTimeoutNs (the grid was not resident at once: the GPU
// shared with other work under MPS, say) traps, so the launch fails with an error instead of
// hanging the process.
constexpr uint64_t kBarrierTimeoutNs = 2'000'000'000;

__device__ __forceinline__ void grid_barrier(unsigned* count) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned add = blockIdx.x == 0 ? 0x80000000u - (gridDim.x - 1) : 1u;
    __threadfence();
    const unsigned before = atomicAdd(count, add);
    const uint64_t start = global_ns();
    unsigned now;
    for (unsigned spins = 1;; ++spins) {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(now) : "l"(count) : "memory");
      if (((before ^ now) & 0x80000000u) != 0) break;
      if (spins % 1024 == 0 && global_ns() - start > kBarrierTimeoutNs) __trap();
    }
    __threadfence();
  }
  __syncthreads();
}

}  // namespace qs::cuda
