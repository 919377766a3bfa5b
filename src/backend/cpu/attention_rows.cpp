#include "backend/cpu/attention_rows.h"

#include <algorithm>
#include <cmath>

#include "backend/cpu/simd.h"

namespace qs::cpu {

namespace {

// a * b + c in scalar code, fused where the CPU has FMA: the compiler may contract a * b + c in
// one loop and not in another copy of it, and a query's sums must not depend on which runs.
inline float madd(float a, float b, float c) {
#if defined(__FMA__)
  return std::fma(a, b, c);
#else
  return a * b + c;
#endif
}

// The rows one channel at a time (fewer channels than a vector, or no vectors).
void dot_rows_scalar(const float* w, const float* rows, int64_t stride, int n_ch, int n,
                     float* out) {
  for (int r = 0; r < n; ++r) {
    const float* row = rows + r * stride;
    float x = 0.0f;
    for (int c = 0; c < n_ch; ++c) x = madd(w[c], row[c], x);
    out[r] = x;
  }
}

#if QS_CPU_SIMD
// w's first NV vectors of channels (NV > 0: in registers) or all of its whole vectors (NV = 0:
// read from memory each time, any count).
template <int NV>
struct WVecs {
  VecF v[NV];
  WVecs(const float* w, int) {
    for (int b = 0; b < NV; ++b) v[b] = vload(w + b * kLanes);
  }
  int count() const { return NV; }
  // The dot product of one row with these vectors.
  VecF dot(const float* row) const {
    VecF a = vzero();
#pragma GCC unroll 8
    for (int b = 0; b < NV; ++b) a = vfmadd(v[b], vload(row + b * kLanes), a);
    return a;
  }
};
template <>
struct WVecs<0> {
  const float* w;
  int nv;
  WVecs(const float* w_, int nv_) : w(w_), nv(nv_) {}
  int count() const { return nv; }
  VecF dot(const float* row) const {
    VecF a = vzero();
    for (int b = 0; b < nv; ++b) a = vfmadd(vload(w + b * kLanes), vload(row + b * kLanes), a);
    return a;
  }
};

// kLanes rows' dot products with w's vectors; rows past n add nothing. Lane r of the result is
// row r's sum.
template <int NV>
inline VecF dot_batch(const WVecs<NV>& wv, const float* rows, int64_t stride, int n) {
  VecF part[kLanes];
  if (n == kLanes) {
#pragma GCC unroll 16
    for (int r = 0; r < kLanes; ++r) part[r] = wv.dot(rows + r * stride);
  } else {
    for (int r = 0; r < kLanes; ++r) part[r] = r < n ? wv.dot(rows + r * stride) : vzero();
  }
  return vsum_lanes(part);
}

// dot_rows over the whole vectors of channels, then the channels past them one by one.
template <int NV>
void dot_rows_nv(const float* w, const float* rows, int64_t stride, int n_ch, int n, float* out) {
  const WVecs<NV> wv(w, n_ch / kLanes);
  const int c_tail = wv.count() * kLanes;
  alignas(64) float sums[kLanes];
  for (int r0 = 0; r0 < n; r0 += kLanes) {
    const int nb = std::min(kLanes, n - r0);
    const float* batch = rows + r0 * stride;
    vstore(sums, dot_batch(wv, batch, stride, nb));
    for (int r = 0; r < nb; ++r) {
      float x = sums[r];
      for (int c = c_tail; c < n_ch; ++c) x = madd(w[c], batch[r * stride + c], x);
      out[r0 + r] = x;
    }
  }
}

// Channels [c0, c0 + NB kLanes) of each of NQ queries' acc[q], kept in registers over the n
// rows, one load per row vector for all of them (NB * NQ independent accumulators).
template <int NB, int NQ>
inline void axpy_block_multi(const float* const* coef, const float* rows, int64_t stride, int n,
                             float* const* acc, int c0) {
  VecF a[NQ][NB];
#pragma GCC unroll 4
  for (int q = 0; q < NQ; ++q) {
#pragma GCC unroll 8
    for (int b = 0; b < NB; ++b) a[q][b] = vload(acc[q] + c0 + b * kLanes);
  }
  for (int r = 0; r < n; ++r) {
    const float* row = rows + r * stride + c0;
    VecF x[NB];
#pragma GCC unroll 8
    for (int b = 0; b < NB; ++b) x[b] = vload(row + b * kLanes);
#pragma GCC unroll 4
    for (int q = 0; q < NQ; ++q) {
      const VecF c = vset1(coef[q][r]);
#pragma GCC unroll 8
      for (int b = 0; b < NB; ++b) a[q][b] = vfmadd(c, x[b], a[q][b]);
    }
  }
#pragma GCC unroll 4
  for (int q = 0; q < NQ; ++q) {
#pragma GCC unroll 8
    for (int b = 0; b < NB; ++b) vstore(acc[q] + c0 + b * kLanes, a[q][b]);
  }
}

// Every whole vector of channels of NQ queries; returns the first channel left.
template <int NQ>
int axpy_vectors_multi(const float* const* coef, const float* rows, int64_t stride, int n,
                       float* const* acc, int n_ch) {
  int c0 = 0;
  for (; c0 + 4 * kLanes <= n_ch; c0 += 4 * kLanes)
    axpy_block_multi<4, NQ>(coef, rows, stride, n, acc, c0);
  for (; c0 + kLanes <= n_ch; c0 += kLanes) axpy_block_multi<1, NQ>(coef, rows, stride, n, acc, c0);
  return c0;
}
#endif

// The channels [c0, n_ch) of one query, one at a time.
void axpy_channels(const float* coef, const float* rows, int64_t stride, int n, float* acc, int c0,
                   int n_ch) {
  for (; c0 < n_ch; ++c0) {
    float x = acc[c0];
    for (int r = 0; r < n; ++r) x = madd(coef[r], rows[r * stride + c0], x);
    acc[c0] = x;
  }
}

}  // namespace

void dot_rows(const float* w, const float* rows, int64_t stride, int n_ch, int n, float* out) {
#if QS_CPU_SIMD
  switch (n_ch / kLanes) {  // w in registers for head_dim 32 / 64 / 128 (/ 256 at 16 lanes)
    case 0:
      return dot_rows_scalar(w, rows, stride, n_ch, n, out);
    case 2:
      return dot_rows_nv<2>(w, rows, stride, n_ch, n, out);
    case 4:
      return dot_rows_nv<4>(w, rows, stride, n_ch, n, out);
    case 8:
      return dot_rows_nv<8>(w, rows, stride, n_ch, n, out);
    case 16:
      return dot_rows_nv<16>(w, rows, stride, n_ch, n, out);
    default:  // w read from memory, any number of vectors
      return dot_rows_nv<0>(w, rows, stride, n_ch, n, out);
  }
#else
  dot_rows_scalar(w, rows, stride, n_ch, n, out);
#endif
}

void softmax_row(float* s, int n) {
#if QS_CPU_SIMD
  const int nv = n / kLanes * kLanes, nt = n - nv;
  alignas(64) float tail[kLanes];
  for (int i = 0; i < kLanes; ++i) tail[i] = i < nt ? s[nv + i] : -INFINITY;
  VecF mxv = vload(tail);
  for (int i = 0; i < nv; i += kLanes) mxv = vmax(mxv, vload(s + i));
  alignas(64) float lanes[kLanes];
  vstore(lanes, mxv);
  const float mx = *std::max_element(lanes, lanes + kLanes);
  const VecF mv = vset1(mx);
  VecF sum = vzero();
  for (int i = 0; i < nv; i += kLanes) {
    const VecF e = vexp(vsub(vload(s + i), mv));
    vstore(s + i, e);
    sum = vadd(sum, e);
  }
  const VecF et = vexp(vsub(vload(tail), mv));  // the padding's -inf gives 0
  sum = vadd(sum, et);
  vstore(tail, et);
  const float inv = 1.0f / vsum(sum);
  const VecF iv = vset1(inv);
  for (int i = 0; i < nv; i += kLanes) vstore(s + i, vmul(vload(s + i), iv));
  for (int i = 0; i < nt; ++i) s[nv + i] = tail[i] * inv;
#else
  const float mx = *std::max_element(s, s + n);
  float sum = 0.0f;
  for (int i = 0; i < n; ++i) sum += (s[i] = std::exp(s[i] - mx));
  const float inv = 1.0f / sum;
  for (int i = 0; i < n; ++i) s[i] *= inv;
#endif
}

void axpy_rows(const float* coef, const float* rows, int64_t stride, int n, float* acc, int n_ch) {
  axpy_rows_multi(&coef, rows, stride, n, &acc, n_ch, 1);
}

void axpy_rows_multi(const float* const* coef, const float* rows, int64_t stride, int n,
                     float* const* acc, int n_ch, int nq) {
  for (int q0 = 0; q0 < nq; q0 += kAxpyQueries) {
    const int nb = std::min(kAxpyQueries, nq - q0);
    int c0 = 0;
#if QS_CPU_SIMD
    switch (nb) {
      case 1:
        c0 = axpy_vectors_multi<1>(coef + q0, rows, stride, n, acc + q0, n_ch);
        break;
      case 2:
        c0 = axpy_vectors_multi<2>(coef + q0, rows, stride, n, acc + q0, n_ch);
        break;
      case 3:
        c0 = axpy_vectors_multi<3>(coef + q0, rows, stride, n, acc + q0, n_ch);
        break;
      default:
        c0 = axpy_vectors_multi<4>(coef + q0, rows, stride, n, acc + q0, n_ch);
        break;
    }
#endif
    for (int q = q0; q < q0 + nb; ++q) axpy_channels(coef[q], rows, stride, n, acc[q], c0, n_ch);
  }
}

}  // namespace qs::cpu
