// Row kernels of the CPU attention (attention.cpp, internal to backend/cpu). Each gives a query
// one fixed order of arithmetic whatever surrounds it: a score depends only on the query and its
// key row, a softmax only on its score row, an output channel only on its rows in ascending
// order. A query's result therefore does not depend on how many queries share a call, how the
// calls are split into tasks or where their chunks of rows start (a verification block gives
// the same outputs as one decoding step per query).
#pragma once

#include <cstdint>

namespace qs::cpu {

// out[r] = sum_c w[c] * rows[r * stride + c] over c < n_ch, for r < n. Vector lanes run across
// the channels; kLanes rows at a time have their lanes summed together (vsum_lanes).
void dot_rows(const float* w, const float* rows, int64_t stride, int n_ch, int n, float* out);

// s[0, n) = softmax(s[0, n)) in place, n >= 1 (vexp; the sum accumulates lane t % kLanes).
void softmax_row(float* s, int n);

// acc[c] += sum_r coef[r] * rows[r * stride + c] over r < n in ascending order, for c < n_ch.
void axpy_rows(const float* coef, const float* rows, int64_t stride, int n, float* acc, int n_ch);

// axpy_rows for nq queries over the same rows (coef[q], acc[q]), each row's vectors loaded once
// for up to kAxpyQueries of them: the arithmetic of every acc[q][c] is axpy_rows', so the result
// is bit for bit that of nq axpy_rows calls.
constexpr int kAxpyQueries = 4;
void axpy_rows_multi(const float* const* coef, const float* rows, int64_t stride, int n,
                     float* const* acc, int n_ch, int nq);

}  // namespace qs::cpu
