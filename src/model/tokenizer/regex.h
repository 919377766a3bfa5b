// PCRE2 wrapper for tokenizer.json patterns (which HF runs with Oniguruma).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.h"

namespace qs {

class Regex {
 public:
  // Compiles with PCRE2_UTF | PCRE2_UCP (JIT when available). `\s` / `\S` are rewritten to
  // Unicode White_Space, which is what Oniguruma matches (PCRE2's `\s` also takes U+180E).
  static Result<Regex> compile(const std::string& pattern);

  // Non-overlapping matches, left to right, as byte ranges [begin, end). Empty matches are
  // skipped. `text` must be valid UTF-8.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;

  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;
  ~Regex();

 private:
  struct Compiled;
  explicit Regex(std::unique_ptr<Compiled> compiled);
  std::unique_ptr<Compiled> compiled_;
};

// Oniguruma-style pattern -> PCRE2 pattern (exposed for tests).
std::string translate_pattern(const std::string& pattern);

}  // namespace qs
