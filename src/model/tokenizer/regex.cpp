#include "model/tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <mutex>

namespace qs {

namespace {

// Unicode White_Space, written for use inside a character class.
constexpr const char* kWhiteSpaceClassBody =
    "\\x{9}-\\x{d}\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}"
    "\\x{202f}\\x{205f}\\x{3000}";

}  // namespace

std::string translate_pattern(const std::string& pattern) {
  std::string out;
  out.reserve(pattern.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char n = pattern[i + 1];
      if (n == 's') {
        out += in_class ? std::string(kWhiteSpaceClassBody)
                        : "[" + std::string(kWhiteSpaceClassBody) + "]";
        ++i;
        continue;
      }
      if (n == 'S' && !in_class) {
        out += "[^" + std::string(kWhiteSpaceClassBody) + "]";
        ++i;
        continue;
      }
      // `\S` inside a class has no class-body equivalent; PCRE2's own is close enough.
      out += c;
      out += n;
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

struct Regex::Compiled {
  pcre2_code* code = nullptr;
  bool jit = false;
  // Match data is per call site; a small pool keeps find_all thread-safe without allocation.
  mutable std::mutex pool_mutex;
  mutable std::vector<pcre2_match_data*> pool;

  ~Compiled() {
    for (auto* md : pool) pcre2_match_data_free(md);
    if (code) pcre2_code_free(code);
  }
  pcre2_match_data* acquire() const {
    {
      std::lock_guard<std::mutex> lock(pool_mutex);
      if (!pool.empty()) {
        auto* md = pool.back();
        pool.pop_back();
        return md;
      }
    }
    return pcre2_match_data_create_from_pattern(code, nullptr);
  }
  void release(pcre2_match_data* md) const {
    std::lock_guard<std::mutex> lock(pool_mutex);
    pool.push_back(md);
  }
};

Regex::Regex(std::unique_ptr<Compiled> compiled) : compiled_(std::move(compiled)) {}
Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;
Regex::~Regex() = default;

Result<Regex> Regex::compile(const std::string& pattern) {
  const std::string translated = translate_pattern(pattern);
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                    PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
  if (!code) {
    PCRE2_UCHAR buffer[256];
    pcre2_get_error_message(error_code, buffer, sizeof(buffer));
    return make_error("invalid regex '" + pattern + "': " + reinterpret_cast<const char*>(buffer) +
                      " at offset " + std::to_string(error_offset));
  }
  auto compiled = std::make_unique<Compiled>();
  compiled->code = code;
  compiled->jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return Regex(std::move(compiled));
}

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> matches;
  pcre2_match_data* md = compiled_->acquire();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  while (start <= text.size()) {
    // Input is validated once by the caller, so skip PCRE2's per-call UTF check.
    int rc = compiled_->jit ? pcre2_jit_match(compiled_->code, subject, text.size(), start,
                                              PCRE2_NO_UTF_CHECK, md, nullptr)
                            : PCRE2_ERROR_JIT_STACKLIMIT;
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
      // No JIT, or its stack ran out: the interpreter keeps its frames on the heap.
      rc = pcre2_match(compiled_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, md,
                       nullptr);
    }
    if (rc < 0) break;  // no more matches (or a match limit: the rest stays unmatched)
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(md);
    const size_t begin = ovector[0], end = ovector[1];
    if (end > begin) {
      matches.emplace_back(begin, end);
      start = end;
    } else {
      // Empty match: step over one character.
      if (begin >= text.size()) break;
      start = begin + 1;
      while (start < text.size() && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) ++start;
    }
  }
  compiled_->release(md);
  return matches;
}

}  // namespace qs
