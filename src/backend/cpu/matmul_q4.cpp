// The draft path's matmul over 4-bit group-wise weights (quant/weight_quant.h): threaded over
// output rows; each worker expands one packed row into a small f32 scratch and dots it with the
// m activation rows, so the weight is streamed once at half a byte per element.
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

// sum_j lo(b_j) * xe[j] + hi(b_j) * xo[j] over j < n: the packed codes of one group against the
// even / odd columns of one activation row (deinterleaved once per call). Codes become f32 in
// registers; nothing is written back.
inline float q4_group_dot(const uint8_t* b, const float* xe, const float* xo, int64_t n) {
  float acc = 0.0f;
  int64_t j = 0;
#if defined(__AVX512F__)
  __m512 va = _mm512_setzero_ps();
  const __m512i mask = _mm512_set1_epi32(0x0f);
  for (; j + 16 <= n; j += 16) {
    const __m512i w =
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + j)));
    const __m512 lo = _mm512_cvtepi32_ps(_mm512_and_si512(w, mask));
    const __m512 hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(w, 4));
    va = _mm512_fmadd_ps(lo, _mm512_loadu_ps(xe + j), va);
    va = _mm512_fmadd_ps(hi, _mm512_loadu_ps(xo + j), va);
  }
  acc = _mm512_reduce_add_ps(va);
#elif defined(__AVX2__) && defined(__FMA__)
  __m256 va = _mm256_setzero_ps();
  const __m256i mask = _mm256_set1_epi32(0x0f);
  for (; j + 8 <= n; j += 8) {
    const __m256i w =
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + j)));
    const __m256 lo = _mm256_cvtepi32_ps(_mm256_and_si256(w, mask));
    const __m256 hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(w, 4));
    va = _mm256_fmadd_ps(lo, _mm256_loadu_ps(xe + j), va);
    va = _mm256_fmadd_ps(hi, _mm256_loadu_ps(xo + j), va);
  }
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(va), _mm256_extractf128_ps(va, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  acc = _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
#endif
  for (; j < n; ++j) acc += float(b[j] & 0x0f) * xe[j] + float(b[j] >> 4) * xo[j];
  return acc;
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
    pool_.parallel_for(
        n_out,
        [&](int64_t begin, int64_t end) {
          for (int64_t n = begin; n < end; ++n) {
            const uint8_t* codes = w.codes.data() + n * w.row_bytes;
            float acc[kQ4FastRows] = {};
            for (int64_t g = 0; g < groups; ++g) {
              const float sc = f16_to_f32(w.scale[n * groups + g]);
              const float mn = f16_to_f32(w.min[n * groups + g]);
              const int64_t j0 = g * w.group_size / 2;
              const int64_t nj = (std::min<int64_t>((g + 1) * w.group_size, k) - 2 * j0) / 2;
              for (int i = 0; i < m; ++i) {
                const float dot = q4_group_dot(codes + j0, xe.data() + i * half + j0,
                                               xo.data() + i * half + j0, nj);
                acc[i] += sc * dot + mn * xsum[i * groups + g];
              }
            }
            for (int i = 0; i < m; ++i) y[i * n_out + n] = acc[i];
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
