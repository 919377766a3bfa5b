// Kernel launches with programmatic dependent launch (PDL, sm_90): a decode step is ~500 short
// kernels in a row, and without PDL each one starts only after the previous one has drained
// (its tail and the next one's ramp leave the memory system idle for microseconds per launch).
// With the attribute set, the next kernel's blocks may start as soon as every block of the
// running kernel has passed pdl_begin(); they wait there (griddepcontrol.wait) until the previous
// grid has completed and its writes are visible. Work that does not depend on the previous
// kernel (prefetching weights into L2) goes before pdl_begin().
//
// Contract: every kernel launched through launch() calls pdl_begin() before it reads anything a
// previous kernel wrote or writes anything at all. Without the attribute (QS_CUDA_PDL=0, or
// set_pdl_enabled(false)) pdl_begin() is a no-op and launches are ordinary stream launches.
#pragma once

#include <cuda_runtime.h>

#include <mutex>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_ops.h"  // pdl_enabled

namespace qs::cuda {

template <typename... KernelArgs, typename... Args>
void launch(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
            Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

// The current device's opt-in shared memory per block (cached per device): kernels whose
// dynamic shared memory grows with the launch check it and fall back to a smaller variant.
inline size_t max_smem_per_block() {
  static std::mutex mu;
  static std::vector<std::pair<int, size_t>> cache;
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  for (const auto& e : cache) {
    if (e.first == dev) return e.second;
  }
  int bytes = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  cache.emplace_back(dev, static_cast<size_t>(bytes));
  return static_cast<size_t>(bytes);
}

#ifdef QS_KERNEL_TRACE
// The trace buffer (u64): [0] the records taken so far, then kTraceRecords records of {entry,
// release, blocks, threads} from word kTraceHeader. Every translation unit has its own copy of
// the device pointer (no relocatable device code); each registers a setter that the backend
// calls with the one buffer it allocates (CudaBackend::create), so the last backend created
// is traced.
constexpr unsigned long long kTraceRecords = 1 << 20;
constexpr int kTraceHeader = 4;
namespace {
__device__ unsigned long long* g_trace_buffer = nullptr;
void set_trace_buffer(unsigned long long* buffer) {
  CUDA_CHECK(cudaMemcpyToSymbol(g_trace_buffer, &buffer, sizeof(buffer)));
}
const bool g_trace_setter_registered = (register_trace_setter(&set_trace_buffer), true);
}  // namespace
#endif

// Lets the next kernel's blocks be scheduled, then waits for the previous kernel of the stream
// (its completion and memory). The trigger comes first: it only allows the next grid to be
// scheduled (once every block of this one has passed it), and that grid's own
// griddepcontrol.wait still returns only after this grid has completed, which implies that
// every earlier grid has; so the next kernel's blocks can be resident, their weights in flight,
// while this kernel still waits for its predecessor. A grid never waits for resources its
// successor holds: the successor is scheduled only once all of this grid's blocks are resident.
// QS_PDL_LATE_TRIGGER (a compile definition, for A/B runs) puts the trigger after the wait, as
// before session 23.
//
// QS_KERNEL_TRACE (a compile definition, diagnostics only: tools/gpu/kernel_trace.py): thread 0 of
// block 0 records %globaltimer when it reached pdl_begin and when the wait returned, with the
// launch shape (trace buffer below; the backend writes it out at its end). In a stream of
// dependent kernels the release of the next kernel follows the completion of this one, so the
// gaps between consecutive releases are each kernel's share of the step's critical path as the
// decode runs it (each record costs block 0's first warp one atomic round trip).
__device__ __forceinline__ void pdl_begin() {
#ifdef QS_KERNEL_TRACE
  unsigned long long entry = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(entry));
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#ifdef QS_PDL_LATE_TRIGGER
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#else
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
#endif
#ifdef QS_KERNEL_TRACE
  if (threadIdx.x + threadIdx.y + threadIdx.z == 0 && blockIdx.x + blockIdx.y + blockIdx.z == 0 &&
      g_trace_buffer != nullptr) {
    unsigned long long release = 0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(release));
    const unsigned long long i = atomicAdd(g_trace_buffer, 1ull);
    if (i < kTraceRecords) {
      unsigned long long* r = g_trace_buffer + kTraceHeader + 4 * i;
      r[0] = entry;
      r[1] = release;
      r[2] = gridDim.x * gridDim.y * gridDim.z;
      r[3] = blockDim.x * blockDim.y * blockDim.z;
    }
  }
#endif
}

// Asks L2 to fetch [p, p + bytes) (p and bytes multiples of 16); no effect on correctness.
__device__ __forceinline__ void prefetch_l2(const void* p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#endif
}

}  // namespace qs::cuda
