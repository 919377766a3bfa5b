// Unicode data for normalization and word-character tests (generated: unicode_tables.cpp).
#pragma once

#include <cstdint>

namespace qs::unicode_tables {

struct CodePointRun {
  char32_t first;
  char32_t last;
  uint8_t value;
};

struct Decomposition {
  char32_t code_point;
  uint16_t offset;  // into the matching *Data array
  uint8_t length;   // code points
};

struct Composition {
  char32_t first;
  char32_t second;
  char32_t composite;
};

extern const char* const kUnicodeVersion;
extern const CodePointRun kCombiningClassRuns[];
extern const int kCombiningClassRunsSize;
extern const CodePointRun kWordCharRuns[];
extern const int kWordCharRunsSize;
extern const Decomposition kCanonicalDecompositions[];
extern const int kCanonicalDecompositionsSize;
extern const char32_t kCanonicalDecompositionsData[];
extern const Decomposition kCompatDecompositions[];
extern const int kCompatDecompositionsSize;
extern const char32_t kCompatDecompositionsData[];
extern const Composition kCompositions[];
extern const int kCompositionsSize;

}  // namespace qs::unicode_tables
