// y = x W^T: the GEMV kernel for a few rows (decode, speculative verification) and the
// sgemm path for many rows (prefill).
#include <cblas.h>

#include <algorithm>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/simd.h"
#include "core/error.h"

namespace qs {

namespace {

// ---------------------------------------------------------------------------------------------
// GEMV: R weight rows against M activation rows at a time, the weight read once in its own dtype
// and widened to f32 in registers; M*R accumulators stay in registers.

template <DType T>
constexpr int64_t kWeightBytes = T == DType::F32 ? 4 : 2;
constexpr int64_t kLineBytes = 64;

template <DType T, int M, int R>
void gemv_block(const float* x, int64_t k, const void* w, int64_t row, float* y, int64_t n) {
  int64_t kk = 0;
  float sums[R][M] = {};
#if QS_CPU_SIMD
  using cpu::VecF;
  VecF acc[R][M];
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < M; ++i) acc[r][i] = cpu::vzero();
  // The next block's rows are asked for while this one runs: each row is a short stream (a few
  // KiB) that the hardware prefetcher finds only after its first misses. On a 2-core Xeon VM the
  // 4096 x 1536 bf16 matmul went from 590-630 to 480-490 us at m = 1 and from 780-860 to
  // 515-530 us at m = 5 (bench_cpu_kernels, two threads; docs/perf.md "Session 57").
  constexpr int64_t kVecBytes = cpu::kLanes * kWeightBytes<T>;  // weight bytes per iteration
  const bool prefetch_next = row + 2 * R <= n;
  const char* next =
      prefetch_next ? static_cast<const char*>(w) + (row + R) * k * kWeightBytes<T> : nullptr;
  for (; kk + cpu::kLanes <= k; kk += cpu::kLanes) {
    VecF wv[R];
    for (int r = 0; r < R; ++r) wv[r] = cpu::vload_w<T>(w, (row + r) * k + kk);
    if (prefetch_next && (kk * kWeightBytes<T>) % kLineBytes < kVecBytes) {  // once per line
      for (int r = 0; r < R; ++r) __builtin_prefetch(next + (r * k + kk) * kWeightBytes<T>);
    }
    for (int i = 0; i < M; ++i) {
      const VecF xv = cpu::vload(x + i * k + kk);
      for (int r = 0; r < R; ++r) acc[r][i] = cpu::vfmadd(wv[r], xv, acc[r][i]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < M; ++i) sums[r][i] = cpu::vsum(acc[r][i]);
#endif
  for (; kk < k; ++kk) {
    for (int r = 0; r < R; ++r) {
      const float wf = cpu::load1<T>(w, (row + r) * k + kk);
      for (int i = 0; i < M; ++i) sums[r][i] += wf * x[i * k + kk];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < M; ++i) y[i * n + row + r] = sums[r][i];
}

// Rows [begin, end) of the output, in blocks of R rows.
template <DType T, int M>
void gemv_range(const float* x, int64_t k, const void* w, int64_t begin, int64_t end, float* y,
                int64_t n) {
  // R * M accumulators + R weight vectors + one x vector within the vector registers (32 with
  // AVX-512, 16 with AVX2): each x vector loaded feeds R rows, so that at M = 5 (a verification
  // block of 4 drafted tokens) the loop is bound by its FMAs rather than its x loads.
#if defined(__AVX512F__)
  constexpr int R = std::clamp(24 / M, 1, 4);
#else
  constexpr int R = std::clamp(10 / M, 1, 4);
#endif
  int64_t row = begin;
  for (; row + R <= end; row += R) gemv_block<T, M, R>(x, k, w, row, y, n);
  for (; row < end; ++row) gemv_block<T, M, 1>(x, k, w, row, y, n);
}

using GemvRangeFn = void (*)(const float*, int64_t, const void*, int64_t, int64_t, float*, int64_t);

template <DType T>
GemvRangeFn gemv_for_rows(int m) {
  switch (m) {
    case 1:
      return gemv_range<T, 1>;
    case 2:
      return gemv_range<T, 2>;
    case 3:
      return gemv_range<T, 3>;
    case 4:
      return gemv_range<T, 4>;
    case 5:
      return gemv_range<T, 5>;
    case 6:
      return gemv_range<T, 6>;
    case 7:
      return gemv_range<T, 7>;
    case 8:
      return gemv_range<T, 8>;
  }
  QS_CHECK_MSG(false, "gemv supports 1..8 rows");
  return nullptr;
}

GemvRangeFn gemv_for(DType t, int m) {
  switch (t) {
    case DType::F32:
      return gemv_for_rows<DType::F32>(m);
    case DType::F16:
      return gemv_for_rows<DType::F16>(m);
    case DType::BF16:
      return gemv_for_rows<DType::BF16>(m);
    default:
      break;
  }
  QS_CHECK_MSG(false, std::string("matmul: unsupported weight dtype ") + dtype_name(t));
  return nullptr;
}

// ---------------------------------------------------------------------------------------------
// Weight rows -> f32 (the sgemm path's panels).

template <DType T>
void widen_rows(const void* w, int64_t first_elem, int64_t count, float* out) {
  int64_t i = 0;
#if QS_CPU_SIMD
  for (; i + cpu::kLanes <= count; i += cpu::kLanes) {
    cpu::vstore(out + i, cpu::vload_w<T>(w, first_elem + i));
  }
#endif
  for (; i < count; ++i) out[i] = cpu::load1<T>(w, first_elem + i);
}

void widen(DType t, const void* w, int64_t first_elem, int64_t count, float* out) {
  switch (t) {
    case DType::F32:
      return widen_rows<DType::F32>(w, first_elem, count, out);
    case DType::F16:
      return widen_rows<DType::F16>(w, first_elem, count, out);
    case DType::BF16:
      return widen_rows<DType::BF16>(w, first_elem, count, out);
    default:
      break;
  }
  QS_CHECK_MSG(false, std::string("matmul: unsupported weight dtype ") + dtype_name(t));
}

// Output rows per sgemm panel: a converted panel stays within ~2 MiB (cache-friendly), and is
// wide enough that re-packing x for each panel costs little next to the multiply.
int64_t panel_rows(int64_t k) {
  int64_t rows = (int64_t{1} << 19) / std::max<int64_t>(k, 1);
  rows = std::clamp<int64_t>(rows, 16, 256);
  return rows / 16 * 16;
}

}  // namespace

void CpuBackend::matmul_gemv(const float* x, int m, const WeightView& w, float* y) {
  QS_CHECK(m >= 1 && m <= kGemvMaxRows);
  const int64_t n = w.rows, k = w.cols;
  GemvRangeFn fn = gemv_for(w.dtype, m);
  // Several chunks per thread even out workers that start late.
  pool_.parallel_for(
      n, [&](int64_t begin, int64_t end) { fn(x, k, w.data, begin, end, y, n); },
      static_cast<int64_t>(pool_.num_threads()) * 4);
}

void CpuBackend::matmul_sgemm(const float* x, int m, const WeightView& w, float* y) {
  QS_CHECK(m >= 1);
  const int64_t n = w.rows, k = w.cols;
  const int64_t rows_per_panel = panel_rows(k);
  const int64_t num_panels = (n + rows_per_panel - 1) / rows_per_panel;
  pool_.parallel_for(
      num_panels,
      [&](int64_t p_begin, int64_t p_end) {
        thread_local std::vector<float> panel;  // [rows_per_panel, k] f32
        for (int64_t p = p_begin; p < p_end; ++p) {
          const int64_t row0 = p * rows_per_panel;
          const int64_t rows = std::min(rows_per_panel, n - row0);
          const float* b = nullptr;
          if (w.dtype == DType::F32) {
            b = static_cast<const float*>(w.data) + row0 * k;
          } else {
            panel.resize(static_cast<size_t>(rows_per_panel * k));
            widen(w.dtype, w.data, row0 * k, rows * k, panel.data());
            b = panel.data();
          }
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, static_cast<int>(rows),
                      static_cast<int>(k), 1.0f, x, static_cast<int>(k), b, static_cast<int>(k),
                      0.0f, y + row0, static_cast<int>(n));
        }
      },
      num_panels);
}

void CpuBackend::matmul(const float* x, int m, const WeightView& w, const WeightView* bias,
                        float* y) {
  QS_CHECK(!w.empty() && m >= 1);
  if (m <= kGemvMaxRows) {
    matmul_gemv(x, m, w, y);
  } else {
    matmul_sgemm(x, m, w, y);
  }
  if (bias != nullptr && !bias->empty()) {
    QS_CHECK_MSG(bias->numel() == w.rows, "bias " + bias->name + " does not match " + w.name);
    const int64_t n = w.rows;
    std::vector<float> b(static_cast<size_t>(n));
    widen(bias->dtype, bias->data, 0, n, b.data());
    for (int i = 0; i < m; ++i) {
      float* yi = y + i * n;
      for (int64_t j = 0; j < n; ++j) yi[j] += b[j];
    }
  }
}

}  // namespace qs
