// The draft path's matmul over 4-bit group-wise weights (quant/weight_quant.h), threaded over
// output rows. Decode and verification sizes (m <= 8) read each packed row once for all m rows
// of x, the codes widened to f32 in registers; larger m expands each row into a small f32
// scratch and dots it with every x row.
#include <algorithm>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/simd.h"
#include "core/dtype.h"
#include "core/error.h"
#include "quant/quant4.h"

namespace qs {

namespace {

// Rows of x up to which the grouped kernel below is used (decode and verification sizes).
constexpr int kQ4FastRows = 8;

// How far ahead of the group being summed its row's codes are asked of the cache (bytes; the
// following rows when the row ends sooner). Without it one thread waits on every line: on a
// 2-core Xeon VM a 4096 x 1536 matmul at m = 1 streamed from memory took 2x its cached time
// (bench_cpu_kernels; docs/perf.md "Session 56").
constexpr int64_t kQ4PrefetchBytes = 2048;

// Weight row n against M activation rows (xe / xo: each row's even / odd columns, [M, half];
// xsum: its per-group sums, [M, groups]): W4 x = sum_g s_g * (U_g . x_g) + min_g * sum(x_g). Per
// group the codes' dot with x stays in vector lanes (low and high nibbles in two accumulators)
// and is scaled into the output's vector accumulator; the min terms and any bytes past the last
// whole vector add up in a scalar; one horizontal sum per output at the end.
template <int M>
void q4_row(const QuantizedWeight4& w, int64_t n, const float* xe, const float* xo,
            const float* xsum, int64_t half, float* y) {
  const int64_t groups = w.groups_per_row, k = w.cols;
  const uint8_t* codes = w.codes.data() + n * w.row_bytes;
  const uint8_t* codes_end = w.codes.data() + w.codes.size();
  float rest[M] = {};
#if QS_CPU_SIMD
  using cpu::VecF;
  VecF acc[M];
  for (int i = 0; i < M; ++i) acc[i] = cpu::vzero();
#endif
  for (int64_t g = 0; g < groups; ++g) {
    const float sc = cpu::f16_to_f32_one(w.scale[n * groups + g]);
    const float mn = cpu::f16_to_f32_one(w.min[n * groups + g]);
    const int64_t j0 = g * w.group_size / 2;
    const int64_t nj = (std::min<int64_t>((g + 1) * w.group_size, k) - 2 * j0) / 2;
    const uint8_t* b = codes + j0;
    for (int64_t p = 0; p < nj; p += 64) {
      if (codes_end - b > p + kQ4PrefetchBytes) __builtin_prefetch(b + p + kQ4PrefetchBytes);
    }
    int64_t j = 0;
#if QS_CPU_SIMD
    VecF lo_acc[M], hi_acc[M];
    for (int i = 0; i < M; ++i) lo_acc[i] = hi_acc[i] = cpu::vzero();
    for (; j + cpu::kLanes <= nj; j += cpu::kLanes) {
      VecF lo, hi;
      cpu::load_nibbles(b + j, &lo, &hi);
      for (int i = 0; i < M; ++i) {
        lo_acc[i] = cpu::vfmadd(lo, cpu::vload(xe + i * half + j0 + j), lo_acc[i]);
        hi_acc[i] = cpu::vfmadd(hi, cpu::vload(xo + i * half + j0 + j), hi_acc[i]);
      }
    }
    for (int i = 0; i < M; ++i) {
      acc[i] = cpu::vfmadd(cpu::vset1(sc), cpu::vadd(lo_acc[i], hi_acc[i]), acc[i]);
    }
#endif
    for (int i = 0; i < M; ++i) {
      float tail = 0.0f;
      for (int64_t jj = j; jj < nj; ++jj) {
        tail += float(b[jj] & 0x0f) * xe[i * half + j0 + jj] +
                float(b[jj] >> 4) * xo[i * half + j0 + jj];
      }
      rest[i] += sc * tail + mn * xsum[i * groups + g];
    }
  }
  for (int i = 0; i < M; ++i) {
#if QS_CPU_SIMD
    rest[i] += cpu::vsum(acc[i]);
#endif
    y[i * w.rows + n] = rest[i];
  }
}

using Q4RowFn = void (*)(const QuantizedWeight4&, int64_t, const float*, const float*, const float*,
                         int64_t, float*);

Q4RowFn q4_row_for(int m) {
  switch (m) {
    case 1:
      return q4_row<1>;
    case 2:
      return q4_row<2>;
    case 3:
      return q4_row<3>;
    case 4:
      return q4_row<4>;
    case 5:
      return q4_row<5>;
    case 6:
      return q4_row<6>;
    case 7:
      return q4_row<7>;
    case 8:
      return q4_row<8>;
  }
  QS_CHECK_MSG(false, "matmul_q4: the grouped kernel takes 1..8 rows");
  return nullptr;
}

}  // namespace

void CpuBackend::matmul_q4(const float* x, int m, const QuantizedWeight4& w, const WeightView* bias,
                           float* y) {
  QS_CHECK(m >= 1 && w.rows > 0 && w.cols > 0);
  const int64_t k = w.cols, n_out = w.rows;
  if (m <= kQ4FastRows && k % 2 == 0 && w.group_size % 2 == 0) {
    // Per group: W4 x = s * sum(U x) + min * sum(x). x is split into even / odd columns (the low
    // / high nibbles) and summed per group once per call.
    const int64_t half = k / 2, groups = w.groups_per_row;
    std::vector<float> xe(size_t(m) * half), xo(size_t(m) * half), xsum(size_t(m) * groups);
    for (int i = 0; i < m; ++i) {
      for (int64_t j = 0; j < half; ++j) {
        xe[i * half + j] = x[i * k + 2 * j];
        xo[i * half + j] = x[i * k + 2 * j + 1];
      }
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t c1 = std::min<int64_t>((g + 1) * w.group_size, k);
        float sum = 0.0f;
        for (int64_t c = g * w.group_size; c < c1; ++c) sum += x[i * k + c];
        xsum[i * groups + g] = sum;
      }
    }
    const Q4RowFn row_fn = q4_row_for(m);
    pool_.parallel_for(
        n_out,
        [&](int64_t begin, int64_t end) {
          for (int64_t n = begin; n < end; ++n) {
            row_fn(w, n, xe.data(), xo.data(), xsum.data(), half, y);
          }
        },
        static_cast<int64_t>(pool_.num_threads()) * 4);
  } else {
    // Any m: expand each packed row into a small scratch and dot it with every x row.
    pool_.parallel_for(
        n_out,
        [&](int64_t begin, int64_t end) {
          thread_local std::vector<float> row;  // [k] f32, one dequantized weight row
          row.resize(static_cast<size_t>(k));
          for (int64_t n = begin; n < end; ++n) {
            const uint8_t* codes = w.codes.data() + n * w.row_bytes;
            for (int64_t g = 0; g < w.groups_per_row; ++g) {
              const float s = f16_to_f32(w.scale[n * w.groups_per_row + g]);
              const float mn = f16_to_f32(w.min[n * w.groups_per_row + g]);
              const int64_t c0 = g * w.group_size;
              const int64_t c1 = std::min<int64_t>(c0 + w.group_size, k);
              int64_t c = c0;
              if ((c0 & 1) == 0) {
                // Whole bytes: the loop the compiler vectorizes.
                const int64_t pairs = (c1 - c0) / 2;
                const uint8_t* b = codes + (c0 >> 1);
                float* out = row.data() + c0;
                for (int64_t j = 0; j < pairs; ++j) {
                  out[2 * j] = static_cast<float>(b[j] & 0x0f) * s + mn;
                  out[2 * j + 1] = static_cast<float>(b[j] >> 4) * s + mn;
                }
                c += 2 * pairs;
              }
              for (; c < c1; ++c) row[c] = quant4_decode(get_nibble(codes, c), s, mn);
            }
            for (int i = 0; i < m; ++i) y[i * n_out + n] = cpu::dot_f32(x + i * k, row.data(), k);
          }
        },
        static_cast<int64_t>(pool_.num_threads()) * 4);
  }
  if (bias != nullptr && !bias->empty()) {
    QS_CHECK_MSG(bias->numel() == n_out, "bias " + bias->name + " does not match " + w.name);
    std::vector<float> b(static_cast<size_t>(n_out));
    to_f32(bias->dtype, bias->data, b.data(), b.size());
    for (int i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n_out; ++j) y[i * n_out + j] += b[j];
    }
  }
}

}  // namespace qs
