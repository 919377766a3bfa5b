// The read-only bandwidth ceiling of the GPU, per load mechanism (bench_ops --sections read).
//
// Our decode kernels only read (KV rows, planes, weights): their "% of 4.24 TB/s" compares them
// with a copy, which reads and writes. What a kernel that only streams can reach, and whether the
// way bytes are requested matters (16-byte loads into registers, 16-byte cp.async into shared
// memory, or bulk copies of whole contiguous chunks by the copy engine completing on an
// mbarrier), is measured here on one large buffer (4 GiB, cold: each byte read once per call).
// Every kernel folds what it read into a checksum so that nothing is optimised away.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>

#include "backend/cuda/cuda_check.h"
#include "read_ceiling.h"

namespace qs::bench {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ uint32_t fold(uint4 v) {
  return v.x ^ v.y ^ v.z ^ v.w;
}

// ---- 16-byte loads into registers: U loads in flight per thread, grid-stride ------------------
template <int U>
__global__ void __launch_bounds__(kThreads)
    read_ldg_kernel(const uint4* __restrict__ p, size_t n16, uint32_t* out) {
  uint32_t acc = 0;
  const size_t stride = size_t(gridDim.x) * kThreads;
  for (size_t base = size_t(blockIdx.x) * kThreads * U + threadIdx.x; base < n16;
       base += stride * U) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const size_t i = base + size_t(u) * kThreads;
      if (i < n16) {
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w)
                     : "l"(p + i));
      } else {
        v[u] = make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= fold(v[u]);
  }
  if (acc == 0x9e3779b9u) out[0] = acc;  // almost never: keeps the loads alive
}

// ---- 16-byte cp.async into a per-warp shared-memory ring of S stages of 2 KB -----------------
template <int S>
__global__ void __launch_bounds__(kThreads)
    read_cp_async_kernel(const uint4* __restrict__ p, size_t n16, uint32_t* out) {
  constexpr int kPerStage = 4;  // 16-byte pieces per lane per stage (2 KB per warp)
  extern __shared__ uint4 ring[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint4* mine = ring + size_t(warp) * S * kPerStage * 32;
  const size_t warps_total = size_t(gridDim.x) * (kThreads / 32);
  const size_t chunk16 = kPerStage * 32;  // 16-byte pieces per stage
  const size_t chunks = n16 / chunk16;
  const size_t first = size_t(blockIdx.x) * (kThreads / 32) + warp;
  auto issue = [&](size_t chunk, int slot) {
    if (chunk < chunks) {
#pragma unroll
      for (int e = 0; e < kPerStage; ++e) {
        const uint32_t dst = static_cast<uint32_t>(
            __cvta_generic_to_shared(mine + (slot * kPerStage + e) * 32 + lane));
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst),
                     "l"(p + chunk * chunk16 + e * 32 + lane)
                     : "memory");
      }
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  };
  for (int s = 0; s < S - 1; ++s) issue(first + s * warps_total, s);
  uint32_t acc = 0;
  int slot = 0;
  for (size_t chunk = first; chunk < chunks; chunk += warps_total) {
    issue(chunk + (S - 1) * warps_total, (slot + S - 1) % S);
    asm volatile("cp.async.wait_group %0;\n" ::"n"(S - 1) : "memory");
#pragma unroll
    for (int e = 0; e < kPerStage; ++e) acc ^= fold(mine[(slot * kPerStage + e) * 32 + lane]);
    slot = slot + 1 == S ? 0 : slot + 1;
  }
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
  if (acc == 0x9e3779b9u) out[0] = acc;
}

// ---- bulk copies (cp.async.bulk, the copy engine) of CHUNK bytes into S stages per block -----
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared.b64 [%0], %1;" ::"r"(
                   static_cast<uint32_t>(__cvta_generic_to_shared(bar))),
               "r"(count)
               : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" ::"r"(
                   static_cast<uint32_t>(__cvta_generic_to_shared(bar))),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait_%=:\n"
      "mbarrier.try_wait.parity.shared.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n"
      "}\n" ::"r"(addr),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes,
                                          uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(static_cast<uint32_t>(__cvta_generic_to_shared(dst))),
      "l"(src), "r"(bytes), "r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar)))
      : "memory");
}

template <int S>
__global__ void __launch_bounds__(kThreads)
    read_bulk_kernel(const uint4* __restrict__ p, size_t n16, uint32_t chunk_bytes, uint32_t* out) {
  extern __shared__ __align__(128) unsigned char smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem);  // S mbarriers
  unsigned char* stages = smem + 128;
  const size_t chunk16 = chunk_bytes / 16;
  const size_t chunks = n16 / chunk16;
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) mbar_init(full + s, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  auto issue = [&](size_t chunk, int slot) {
    if (threadIdx.x == 0 && chunk < chunks) {
      mbar_expect_tx(full + slot, chunk_bytes);
      bulk_copy(stages + size_t(slot) * chunk_bytes, p + chunk * chunk16, chunk_bytes, full + slot);
    }
  };
  for (int s = 0; s < S; ++s) issue(blockIdx.x + size_t(s) * gridDim.x, s);
  uint32_t acc = 0;
  int slot = 0;
  uint32_t phase = 0;
  for (size_t chunk = blockIdx.x; chunk < chunks; chunk += gridDim.x) {
    mbar_wait(full + slot, phase);
    const uint4* st = reinterpret_cast<const uint4*>(stages + size_t(slot) * chunk_bytes);
    for (uint32_t i = threadIdx.x; i < chunk16; i += kThreads) acc ^= fold(st[i]);
    __syncthreads();  // every thread is done with the stage before it is refilled
    issue(chunk + size_t(S) * gridDim.x, slot);
    if (++slot == S) slot = 0, phase ^= 1;
  }
  if (acc == 0x9e3779b9u) out[0] = acc;
}

// ---- the f16 decode kernel's loads alone (attention_decode_tc.cu, head_dim 128) --------------
// Grid (1, splits, kv heads) of 4-warp blocks, 2 per SM; warp w streams the split's 16-token
// stages w, w + 4, ... through its own 3-stage ring of 8 KB: K and V as whole 256-byte rows (two
// per instruction, a quarter warp per 128-byte line); the
// "arithmetic" is one xor per 16 bytes. Rows of kv_heads * 128 f16 (row_stride16 16-byte units).
constexpr int kKvStages = 3;
__global__ void __launch_bounds__(128, 2)
    read_kv_rows_kernel(const uint4* __restrict__ k, const uint4* __restrict__ v,
                        int64_t row_stride16, int split_len, uint32_t* out) {
  extern __shared__ uint4 kv_ring[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint4* mine = kv_ring + size_t(warp) * kKvStages * 512;
  const int64_t head16 = int64_t(blockIdx.z) * 16;
  const int t_begin = blockIdx.y * split_len, t_end = t_begin + split_len;
  auto issue = [&](int i0, int slot) {
    if (i0 < t_end) {
      uint4* dst = mine + slot * 512;
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const int64_t t = i0 + 2 * u + lane / 16;
        const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst + u * 32 + lane));
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d),
                     "l"(k + t * row_stride16 + head16 + lane % 16)
                     : "memory");
      }
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const int64_t t = i0 + 2 * u + lane / 16;
        const uint32_t d =
            static_cast<uint32_t>(__cvta_generic_to_shared(dst + (8 + u) * 32 + lane));
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d),
                     "l"(v + t * row_stride16 + head16 + lane % 16)
                     : "memory");
      }
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  };
  const int step = 4 * 16;
  int i0 = t_begin + warp * 16;
  for (int st = 0; st < kKvStages - 1; ++st) issue(i0 + st * step, st);
  uint32_t acc = 0;
  int slot = 0;
  for (; i0 < t_end; i0 += step) {
    __syncwarp();
    issue(i0 + (kKvStages - 1) * step, (slot + kKvStages - 1) % kKvStages);
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kKvStages - 1) : "memory");
    __syncwarp();
#pragma unroll
    for (int pc = 0; pc < 16; ++pc) acc ^= fold(mine[(slot * 16 + pc) * 32 + lane]);
    slot = slot + 1 == kKvStages ? 0 : slot + 1;
  }
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
  if (acc == 0x9e3779b9u) out[0] = acc;
}

}  // namespace

void bench_read_ceiling(cudaStream_t s, const TimeFn& time, const SummaryFn& summary) {
  const size_t bytes = size_t{4} << 30;
  const size_t n16 = bytes / 16;
  void* buf = nullptr;
  uint32_t* out = nullptr;
  CUDA_CHECK(cudaMalloc(&buf, bytes));
  CUDA_CHECK(cudaMalloc(&out, 64));
  CUDA_CHECK(cudaMemset(buf, 0x5b, bytes));  // not zeros (METHOD.md)
  int sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const auto* p = static_cast<const uint4*>(buf);
  auto report = [&](const char* what, double ms) { summary(what, ms, double(bytes)); };

  for (int blocks_per_sm : {4, 8}) {
    const int grid = sms * blocks_per_sm;
    char label[96];
    std::snprintf(label, sizeof label, "ld.global 16B x4 in flight, %d blocks/SM", blocks_per_sm);
    report(label, time([&] { read_ldg_kernel<4><<<grid, kThreads, 0, s>>>(p, n16, out); }));
    std::snprintf(label, sizeof label, "ld.global 16B x8 in flight, %d blocks/SM", blocks_per_sm);
    report(label, time([&] { read_ldg_kernel<8><<<grid, kThreads, 0, s>>>(p, n16, out); }));
    CUDA_CHECK(cudaGetLastError());
  }
  for (int stages : {3, 6}) {
    const size_t smem = size_t(stages) * 2048 * (kThreads / 32);
    auto kernel = stages == 3 ? read_cp_async_kernel<3> : read_cp_async_kernel<6>;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(smem)));
    const int grid = sms * (stages == 3 ? 4 : 2);
    char label[96];
    std::snprintf(label, sizeof label, "cp.async 16B, %d stages x 2 KB per warp", stages);
    report(label, time([&] { kernel<<<grid, kThreads, smem, s>>>(p, n16, out); }));
    CUDA_CHECK(cudaGetLastError());
  }
  struct Bulk {
    uint32_t chunk;
    int stages, blocks_per_sm;
  };
  for (const Bulk b : {Bulk{4096, 4, 4}, Bulk{8192, 4, 2}, Bulk{16384, 2, 2}, Bulk{16384, 4, 1},
                       Bulk{32768, 3, 1}}) {
    const size_t smem = 128 + size_t(b.stages) * b.chunk;
    auto kernel = b.stages == 2   ? read_bulk_kernel<2>
                  : b.stages == 3 ? read_bulk_kernel<3>
                                  : read_bulk_kernel<4>;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(smem)));
    const int grid = sms * b.blocks_per_sm;
    char label[96];
    std::snprintf(label, sizeof label, "cp.async.bulk %u KB x %d stages, %d blocks/SM",
                  b.chunk / 1024, b.stages, b.blocks_per_sm);
    report(label, time([&] { kernel<<<grid, kThreads, smem, s>>>(p, n16, b.chunk, out); }));
    CUDA_CHECK(cudaGetLastError());
  }
  {
    // Llama-2-7B's f16 rows at 128K (32 kv heads of 128: 1 GiB of K and of V), split as the
    // decode kernel splits them (one wave of 2 blocks per SM).
    const int heads = 32, ctx = 131072, splits = std::max(1, 2 * sms / heads);
    const int64_t row_stride16 = heads * 128 * 2 / 16;
    const auto* kp = p;
    const auto* vp = p + size_t(ctx) * row_stride16;
    const size_t smem = size_t(4) * kKvStages * 512 * 16;
    CUDA_CHECK(cudaFuncSetAttribute(
        read_kv_rows_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    const int split_len = (ctx + splits - 1) / splits / 64 * 64;
    const dim3 grid(1, ctx / split_len, heads);
    const double ms = time(
        [&] { read_kv_rows_kernel<<<grid, 128, smem, s>>>(kp, vp, row_stride16, split_len, out); });
    CUDA_CHECK(cudaGetLastError());
    summary("decode-kernel loads only, llama2-7b f16 rows 128K", ms,
            double(grid.y) * split_len * heads * 256.0 * 2);
  }
  CUDA_CHECK(cudaFree(buf));
  CUDA_CHECK(cudaFree(out));
}

}  // namespace qs::bench
