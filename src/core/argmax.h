// The greedy decoders' argmax, shared by the sampler (host logits) and the backends' default
// Backend::argmax_rows.
#pragma once

#include <cstdint>

#include "core/error.h"

namespace qs {

// Index of the largest of x[0, n); the lowest index among ties. NaN never wins (nothing compares
// greater than a NaN at index 0: then 0).
inline int32_t argmax(const float* x, int n) {
  QS_CHECK(n > 0);
  int32_t best = 0;
  for (int32_t i = 1; i < n; ++i) {
    if (x[i] > x[best]) best = i;
  }
  return best;
}

}  // namespace qs
