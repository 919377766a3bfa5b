// Board power and SM clock while the GPU does nothing but stream reads from HBM: the reference
// for a decode kernel's power at the same bytes per second (docs/perf.md, session 28: 4.37 TB/s
// at ~545 W and 1980 MHz, while the 128K decode steps run at the 700 W cap with the SM clock
// lowered). Not part of the build: compiled and run on the GPU machine by power_sample.sh.
//
//   nvcc -O3 -arch=sm_90 -o /tmp/read_power tools/gpu/read_power.cu && /tmp/read_power 5000
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

// Every 16-byte piece of p once, through the non-coherent path; the xor keeps the loads live.
__global__ void read_all(const uint4* __restrict__ p, size_t n, unsigned* sink) {
  unsigned acc = 0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p + i));
    acc ^= v.x ^ v.w;
  }
  if (acc == 0x12345678u) *sink = acc;
}

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 1000;
  const size_t bytes = size_t{8} << 30, n = bytes / 16;
  uint4* p = nullptr;
  unsigned* sink = nullptr;
  if (reps < 1 || cudaMalloc(&p, bytes) != cudaSuccess || cudaMalloc(&sink, 4) != cudaSuccess) {
    std::fprintf(stderr, "usage: read_power REPS (>= 1); needs 8 GiB of device memory\n");
    return 1;
  }
  cudaMemset(p, 1, bytes);
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaEventRecord(a);
  for (int r = 0; r < reps; ++r) read_all<<<sms * 8, 512>>>(p, n, sink);
  cudaEventRecord(b);
  cudaEventSynchronize(b);
  float ms = 0.0f;
  cudaEventElapsedTime(&ms, a, b);
  std::printf("%d reads of 8 GiB: %.3f ms each, %.0f GB/s\n", reps, ms / reps,
              bytes / (ms / reps) / 1e6);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
