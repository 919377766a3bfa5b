// The GPU's read-only bandwidth ceiling per load mechanism (read_ceiling.cu).
#pragma once

#include <cuda_runtime.h>

#include <functional>

namespace qs::bench {

// time(launch): median ms per call of launch() (bench_ops' time_ms: warm-up, CUDA events).
using TimeFn = std::function<double(const std::function<void()>&)>;
// summary(what, ms per call, bytes read per call): one line per measurement.
using SummaryFn = std::function<void(const char*, double, double)>;

// The kernels are launched on `stream`, the stream `time` measures.
void bench_read_ceiling(cudaStream_t stream, const TimeFn& time, const SummaryFn& summary);

}  // namespace qs::bench
