// Small vector helpers shared by the CPU kernels (internal to backend/cpu). One vector type,
// VecF with kLanes f32 lanes: AVX-512 when compiled for it, else AVX2 + FMA + F16C, else none
// (QS_CPU_SIMD undefined: the kernels' scalar loops do all the work).
#pragma once

#include <cstdint>

#include "core/dtype.h"

#if defined(__AVX512F__)
#define QS_CPU_SIMD 1
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*() and trip -W[maybe-]uninitialized
// once inlined (GCC bug 105593); the warnings point into the header, so silence them there.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define QS_CPU_SIMD 1
#include <immintrin.h>
#endif

namespace qs::cpu {

// Scalar load of element i of a weight in dtype T, as f32.
template <DType T>
inline float load1(const void* p, int64_t i) {
  if constexpr (T == DType::F32) {
    return static_cast<const float*>(p)[i];
  } else if constexpr (T == DType::F16) {
    return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
  } else {
    static_assert(T == DType::BF16);
    return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
  }
}

#if defined(__AVX512F__)
constexpr int kLanes = 16;
using VecF = __m512;
inline VecF vzero() {
  return _mm512_setzero_ps();
}
inline VecF vset1(float a) {
  return _mm512_set1_ps(a);
}
inline VecF vload(const float* p) {
  return _mm512_loadu_ps(p);
}
inline void vstore(float* p, VecF v) {
  _mm512_storeu_ps(p, v);
}
inline VecF vfmadd(VecF a, VecF b, VecF c) {
  return _mm512_fmadd_ps(a, b, c);
}
inline VecF vadd(VecF a, VecF b) {
  return _mm512_add_ps(a, b);
}
inline float vsum(VecF v) {
  // Through memory rather than _mm512_reduce_add_ps, whose lane extracts trip the same GCC bug
  // outside the reach of the pragma above. Runs once per dot product.
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, v);
  const __m256 h = _mm256_add_ps(_mm256_load_ps(lanes), _mm256_load_ps(lanes + 8));
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline VecF vmul(VecF a, VecF b) {
  return _mm512_mul_ps(a, b);
}
inline VecF vsub(VecF a, VecF b) {
  return _mm512_sub_ps(a, b);
}
inline VecF vmax(VecF a, VecF b) {
  return _mm512_max_ps(a, b);
}
// Lane r = the sum of p[r]'s lanes: a tree of lane swaps that adds every vector's lanes in one
// order (lane i to lane i + 8, then + 4, + 2, + 1), whichever slot r the vector takes.
inline VecF vsum_lanes(const VecF (&p)[kLanes]) {
  VecF b[8], c[4], d[2];
  for (int i = 0; i < 8; ++i) {  // quads: [p2i.0 + p2i.2, p2i.1 + p2i.3, same of p2i+1]
    b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(p[2 * i], p[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(p[2 * i], p[2 * i + 1], 0xEE));
  }
  for (int i = 0; i < 4; ++i) {  // quad k: the four partial sums of p[4i + k]
    c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xDD));
  }
  for (int i = 0; i < 2; ++i) {  // quad k: two partial sums of p[8i + k], two of p[8i + 4 + k]
    d[i] = _mm512_add_ps(_mm512_shuffle_ps(c[2 * i], c[2 * i + 1], 0x44),
                         _mm512_shuffle_ps(c[2 * i], c[2 * i + 1], 0xEE));
  }
  // Lane 4k + j: the sum of p[k + 4j]; one permute puts it into lane k + 4j.
  const VecF e =
      _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], 0x88), _mm512_shuffle_ps(d[0], d[1], 0xDD));
  const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(idx, e);
}
inline VecF vmin(VecF a, VecF b) {
  return _mm512_min_ps(a, b);
}
inline VecF vfnmadd(VecF a, VecF b, VecF c) {  // c - a * b
  return _mm512_fnmadd_ps(a, b, c);
}
inline VecF vround(VecF a) {  // to the nearest integer
  return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
// 2^n for integral n in [-126, 127], n given as floats.
inline VecF vexp2i(VecF n) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
}
// y where x >= lo, else 0.
inline VecF vkeep_ge(VecF x, VecF lo, VecF y) {
  return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ), y);
}
// Whether some lane of x is above t.
inline bool vany_gt(VecF x, VecF t) {
  return _mm512_cmp_ps_mask(x, t, _CMP_GT_OQ) != 0;
}
// kLanes consecutive weight elements starting at element i, widened to f32 (unaligned).
template <DType T>
inline VecF vload_w(const void* p, int64_t i) {
  if constexpr (T == DType::F32) {
    return _mm512_loadu_ps(static_cast<const float*>(p) + i);
  } else {
    __m256i h =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(p) + i));
    if constexpr (T == DType::F16) {
      return _mm512_cvtph_ps(h);
    } else {
      static_assert(T == DType::BF16);
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
  }
}
#elif defined(QS_CPU_SIMD)
constexpr int kLanes = 8;
using VecF = __m256;
inline VecF vzero() {
  return _mm256_setzero_ps();
}
inline VecF vset1(float a) {
  return _mm256_set1_ps(a);
}
inline VecF vload(const float* p) {
  return _mm256_loadu_ps(p);
}
inline void vstore(float* p, VecF v) {
  _mm256_storeu_ps(p, v);
}
inline VecF vfmadd(VecF a, VecF b, VecF c) {
  return _mm256_fmadd_ps(a, b, c);
}
inline VecF vadd(VecF a, VecF b) {
  return _mm256_add_ps(a, b);
}
inline float vsum(VecF v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline VecF vmul(VecF a, VecF b) {
  return _mm256_mul_ps(a, b);
}
inline VecF vsub(VecF a, VecF b) {
  return _mm256_sub_ps(a, b);
}
inline VecF vmax(VecF a, VecF b) {
  return _mm256_max_ps(a, b);
}
// Lane r = the sum of p[r]'s lanes (lane i to lane i + 4, then + 2, + 1, for every vector).
inline VecF vsum_lanes(const VecF (&p)[kLanes]) {
  VecF b[4], c[2];
  for (int i = 0; i < 4; ++i) {  // halves: the four partial sums of p[2i], of p[2i + 1]
    b[i] = _mm256_add_ps(_mm256_permute2f128_ps(p[2 * i], p[2 * i + 1], 0x20),
                         _mm256_permute2f128_ps(p[2 * i], p[2 * i + 1], 0x31));
  }
  for (int i = 0; i < 2; ++i) {  // half k: two partial sums of p[4i + k], two of p[4i + 2 + k]
    c[i] = _mm256_add_ps(_mm256_shuffle_ps(b[2 * i], b[2 * i + 1], 0x44),
                         _mm256_shuffle_ps(b[2 * i], b[2 * i + 1], 0xEE));
  }
  // Lane 4k + j: the sum of p[k + 2j].
  const VecF e =
      _mm256_add_ps(_mm256_shuffle_ps(c[0], c[1], 0x88), _mm256_shuffle_ps(c[0], c[1], 0xDD));
  return _mm256_permutevar8x32_ps(e, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}
inline VecF vmin(VecF a, VecF b) {
  return _mm256_min_ps(a, b);
}
inline VecF vfnmadd(VecF a, VecF b, VecF c) {  // c - a * b
  return _mm256_fnmadd_ps(a, b, c);
}
inline VecF vround(VecF a) {  // to the nearest integer
  return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
// 2^n for integral n in [-126, 127], n given as floats.
inline VecF vexp2i(VecF n) {
  return _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}
// y where x >= lo, else 0.
inline VecF vkeep_ge(VecF x, VecF lo, VecF y) {
  return _mm256_and_ps(_mm256_cmp_ps(x, lo, _CMP_GE_OQ), y);
}
// Whether some lane of x is above t.
inline bool vany_gt(VecF x, VecF t) {
  return _mm256_movemask_ps(_mm256_cmp_ps(x, t, _CMP_GT_OQ)) != 0;
}
template <DType T>
inline VecF vload_w(const void* p, int64_t i) {
  if constexpr (T == DType::F32) {
    return _mm256_loadu_ps(static_cast<const float*>(p) + i);
  } else {
    __m128i h =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + i));
    if constexpr (T == DType::F16) {
      return _mm256_cvtph_ps(h);
    } else {
      static_assert(T == DType::BF16);
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
  }
}
#endif

#if QS_CPU_SIMD
// e^x to ~1 ulp: Cephes' expf (x = n ln 2 + r, a degree-5 polynomial in r, times 2^n); 0 below
// -87.33 (where e^x leaves the normal floats), x capped at 88.37.
inline VecF vexp(VecF x) {
  const VecF lo = vset1(-87.33654f);
  const VecF xc = vmin(vmax(x, lo), vset1(88.37626f));
  const VecF n = vround(vmul(xc, vset1(1.44269504088896341f)));
  VecF r = vfnmadd(n, vset1(0.693359375f), xc);
  r = vfnmadd(n, vset1(-2.12194440e-4f), r);
  VecF y = vset1(1.9875691500e-4f);
  y = vfmadd(y, r, vset1(1.3981999507e-3f));
  y = vfmadd(y, r, vset1(8.3334519073e-3f));
  y = vfmadd(y, r, vset1(4.1665795894e-2f));
  y = vfmadd(y, r, vset1(1.6666665459e-1f));
  y = vfmadd(y, r, vset1(5.0000001201e-1f));
  y = vfmadd(y, vmul(r, r), vadd(r, vset1(1.0f)));
  return vkeep_ge(x, lo, vmul(y, vexp2i(n)));
}
#endif

// Dot product of n f32 values, f32 accumulation in several lanes.
inline float dot_f32(const float* a, const float* b, int64_t n) {
  int64_t i = 0;
  float sum = 0.0f;
#if QS_CPU_SIMD
  VecF acc0 = vzero(), acc1 = vzero();
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    acc0 = vfmadd(vload(a + i), vload(b + i), acc0);
    acc1 = vfmadd(vload(a + i + kLanes), vload(b + i + kLanes), acc1);
  }
  for (; i + kLanes <= n; i += kLanes) acc0 = vfmadd(vload(a + i), vload(b + i), acc0);
  sum = vsum(vadd(acc0, acc1));
#endif
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// y[i] += a * x[i] over n f32 values.
inline void axpy_f32(float a, const float* x, float* y, int64_t n) {
  int64_t i = 0;
#if QS_CPU_SIMD
  const VecF av = vset1(a);
  for (; i + kLanes <= n; i += kLanes) vstore(y + i, vfmadd(av, vload(x + i), vload(y + i)));
#endif
  for (; i < n; ++i) y[i] += a * x[i];
}

// One f16 value as f32 (exact, as f16_to_f32) with the F16C conversion where there is one.
inline float f16_to_f32_one(uint16_t h) {
#if defined(QS_CPU_SIMD)
  return _cvtsh_ss(h);
#else
  return f16_to_f32(h);
#endif
}

// n f16 values as f32 (exact, as f16_to_f32), kLanes at a time with the F16C conversion.
inline void f16_to_f32_n(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(
        dst + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))));
  }
#elif defined(QS_CPU_SIMD)
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(dst + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  }
#endif
  for (; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}

// ---- 4-bit KV codes (kv_quant.h) straight from the packed planes, without an f32 copy.
// n bytes of `upper` (and of `lower`, or nullptr for the INT4 view) hold the codes of channels
// 2j (low nibble) and 2j+1 (high nibble). The codes come centred, c = U - kCodeCenter4 (INT4)
// or 16U + L - 8 - kCodeCenter8 (INT8): a value is c * step + (min + center * step), and sums of
// p * step * c over long histories then stay small instead of cancelling against sum p * min
// (uncentred, f32 rounding of the two large sums cost ~1e-3 relative at 33K positions).
inline constexpr int kCodeCenter4 = 8;
inline constexpr int kCodeCenter8 = 128;

inline void code_pair(const uint8_t* upper, const uint8_t* lower, int64_t j, float* even,
                      float* odd) {
  if (lower) {
    *even = static_cast<float>(16 * (upper[j] & 0x0f) + (lower[j] & 0x0f) - 8 - kCodeCenter8);
    *odd = static_cast<float>(16 * (upper[j] >> 4) + (lower[j] >> 4) - 8 - kCodeCenter8);
  } else {
    *even = static_cast<float>((upper[j] & 0x0f) - kCodeCenter4);
    *odd = static_cast<float>((upper[j] >> 4) - kCodeCenter4);
  }
}

#if QS_CPU_SIMD
// kLanes packed bytes (2 kLanes codes) as f32: lo = the low nibbles (even columns), hi = the high
// nibbles (odd columns).
inline void load_nibbles(const uint8_t* b, VecF* lo, VecF* hi) {
#if defined(__AVX512F__)
  const __m512i w = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b)));
  const __m512 codes = _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  *lo = _mm512_permutexvar_ps(w, codes);
  *hi = _mm512_permutexvar_ps(_mm512_srli_epi32(w, 4), codes);
#else
  const __m256i w = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b)));
  *lo = _mm256_cvtepi32_ps(_mm256_and_si256(w, _mm256_set1_epi32(0x0f)));
  *hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(w, 4));
#endif
}

// The centred codes of bytes j .. j + kLanes (code_pair's, kLanes at a time).
inline void load_codes(const uint8_t* upper, const uint8_t* lower, int64_t j, VecF* even,
                       VecF* odd) {
  if (!lower) {  // INT4: the nibbles as f32, centred (exact: small integers)
    load_nibbles(upper + j, even, odd);
    *even = vsub(*even, vset1(kCodeCenter4));
    *odd = vsub(*odd, vset1(kCodeCenter4));
    return;
  }
#if defined(__AVX512F__)
  const __m512i mask = _mm512_set1_epi32(0x0f);
  const __m512i u =
      _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(upper + j)));
  __m512i e = _mm512_and_si512(u, mask), o = _mm512_srli_epi32(u, 4);
  const __m512i l =
      _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(lower + j)));
  const __m512i bias = _mm512_set1_epi32(8 + kCodeCenter8);
  e = _mm512_sub_epi32(_mm512_add_epi32(_mm512_slli_epi32(e, 4), _mm512_and_si512(l, mask)), bias);
  o = _mm512_sub_epi32(_mm512_add_epi32(_mm512_slli_epi32(o, 4), _mm512_srli_epi32(l, 4)), bias);
  *even = _mm512_cvtepi32_ps(e);
  *odd = _mm512_cvtepi32_ps(o);
#else
  const __m256i mask = _mm256_set1_epi32(0x0f);
  const __m256i u =
      _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(upper + j)));
  __m256i e = _mm256_and_si256(u, mask), o = _mm256_srli_epi32(u, 4);
  const __m256i l =
      _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(lower + j)));
  const __m256i bias = _mm256_set1_epi32(8 + kCodeCenter8);
  e = _mm256_sub_epi32(_mm256_add_epi32(_mm256_slli_epi32(e, 4), _mm256_and_si256(l, mask)), bias);
  o = _mm256_sub_epi32(_mm256_add_epi32(_mm256_slli_epi32(o, 4), _mm256_srli_epi32(l, 4)), bias);
  *even = _mm256_cvtepi32_ps(e);
  *odd = _mm256_cvtepi32_ps(o);
#endif
}
#endif

// The codes of one packed row (n bytes of `upper` and of `lower`, or nullptr for the INT4 view),
// centred, as f32: even[j] = code(2j), odd[j] = code(2j+1), j < n.
inline void decode_code_row(const uint8_t* upper, const uint8_t* lower, int64_t n, float* even,
                            float* odd) {
  int64_t j = 0;
#if QS_CPU_SIMD
  for (; j + kLanes <= n; j += kLanes) {
    VecF e, o;
    load_codes(upper, lower, j, &e, &o);
    vstore(even + j, e);
    vstore(odd + j, o);
  }
#endif
  for (; j < n; ++j) code_pair(upper, lower, j, even + j, odd + j);
}

}  // namespace qs::cpu
