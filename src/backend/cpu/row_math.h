// Reductions over one row of f32 values on the host, vectorized where the CPU backend's kernels
// are (simd.h): what a log-softmax needs (token_logprob, the server's and eval's scoring).
#pragma once

#include <cstdint>
#include <vector>

namespace qs::cpu {

// The largest of x[0..n) (n >= 1; NaN-free rows).
float row_max(const float* x, int64_t n);

// The sum over i of e^(x[i] - shift): f32 exponentials (~1 ulp; 0 where x[i] - shift < -87.3)
// summed in f64, in a fixed order (the same bits on every call for the same row).
double row_sum_exp(const float* x, int64_t n, float shift);

// The indices of the k largest of x[0..n) (k <= n), largest first, ties by the lower index:
// a heap of k, with the elements no larger than its least skipped a vector at a time.
std::vector<int32_t> row_top_k(const float* x, int64_t n, int k);

}  // namespace qs::cpu
