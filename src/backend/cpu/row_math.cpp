#include "backend/cpu/row_math.h"

#include <algorithm>
#include <cmath>

#include "backend/cpu/simd.h"

namespace qs::cpu {

float row_max(const float* x, int64_t n) {
  int64_t i = 0;
  float mx = x[0];
#if QS_CPU_SIMD
  if (n >= kLanes) {
    VecF acc = vload(x);
    for (i = kLanes; i + kLanes <= n; i += kLanes) acc = vmax(acc, vload(x + i));
    float lanes[kLanes];
    vstore(lanes, acc);
    mx = *std::max_element(lanes, lanes + kLanes);
  }
#endif
  for (; i < n; ++i) mx = std::max(mx, x[i]);
  return mx;
}

double row_sum_exp(const float* x, int64_t n, float shift) {
  int64_t i = 0;
  double sum = 0.0;
#if QS_CPU_SIMD
  // Blocks of 8 vectors summed in f32 lanes (each term <= 1 after the shift by the row's max),
  // then added to the f64 total: ~1e-7 relative, like the scalar loop's f32 exponentials.
  constexpr int64_t kBlock = 8 * kLanes;
  const VecF s = vset1(shift);
  for (; i + kBlock <= n; i += kBlock) {
    VecF acc = vzero();
    for (int64_t j = 0; j < kBlock; j += kLanes) acc = vadd(acc, vexp(vsub(vload(x + i + j), s)));
    sum += static_cast<double>(vsum(acc));
  }
  for (; i + kLanes <= n; i += kLanes) sum += static_cast<double>(vsum(vexp(vsub(vload(x + i), s))));
#endif
  for (; i < n; ++i) sum += static_cast<double>(std::exp(x[i] - shift));
  return sum;
}

std::vector<int32_t> row_top_k(const float* x, int64_t n, int k) {
  std::vector<int32_t> kept;
  if (k <= 0) return kept;
  kept.reserve(static_cast<size_t>(k));
  // a before b: more likely (larger, or equal with the lower index).
  auto more_likely = [&](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); };
  // Index t against a full heap: it enters only if strictly larger than the least kept (every
  // kept index is lower than t, so an equal value loses the tie).
  auto consider = [&](int32_t t) {
    if (static_cast<int>(kept.size()) < k) {
      kept.push_back(t);
      std::push_heap(kept.begin(), kept.end(), more_likely);
    } else if (x[t] > x[kept.front()]) {
      std::pop_heap(kept.begin(), kept.end(), more_likely);
      kept.back() = t;
      std::push_heap(kept.begin(), kept.end(), more_likely);
    }
  };
  int64_t i = 0;
#if QS_CPU_SIMD
  for (; i + kLanes <= n; i += kLanes) {
    if (static_cast<int>(kept.size()) == k && !vany_gt(vload(x + i), vset1(x[kept.front()])))
      continue;
    for (int64_t j = i; j < i + kLanes; ++j) consider(static_cast<int32_t>(j));
  }
#endif
  for (; i < n; ++i) consider(static_cast<int32_t>(i));
  std::sort_heap(kept.begin(), kept.end(), more_likely);  // most likely first
  return kept;
}

}  // namespace qs::cpu
