// The GPU's read-only bandwidth ceiling per load mechanism (read_ceiling.cu).
#pragma once

#include <cuda_runtime.h>

#include <functional>

namespace qs::bench {

// summary(section, what, ms per call, bytes read per call): one line per measurement.
using SummaryFn = std::function<void(const char*, const char*, double, double)>;

void bench_read_ceiling(cudaStream_t stream, const SummaryFn& summary);

}  // namespace qs::bench
