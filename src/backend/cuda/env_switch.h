// Process-wide switches read from the environment (end-to-end A/B runs of kernel variants
// without a rebuild): one parser for every QS_* switch of the CUDA backend.
#pragma once

#include <cstdio>
#include <cstdlib>

namespace qs::cuda {

// Unset -> fallback; an integer in [lo, hi] -> it; anything else -> a warning on stderr naming
// the variable, and the fallback.
inline int env_int(const char* name, int lo, int hi, int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr) return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (end != v && *end == '\0' && x >= lo && x <= hi) return static_cast<int>(x);
  std::fprintf(stderr, "quantspec: ignoring %s=%s (expected an integer in [%d, %d])\n", name, v, lo,
               hi);
  return fallback;
}

// An on / off switch: 0 or 1, `otherwise` when unset (or, with a warning, anything else).
inline bool env_flag(const char* name, bool otherwise) {
  return env_int(name, 0, 1, otherwise ? 1 : 0) != 0;
}

}  // namespace qs::cuda
