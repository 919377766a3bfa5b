#include "model/tokenizer/unicode.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "model/tokenizer/unicode_tables.h"

namespace qs::unicode {

namespace ut = unicode_tables;

char32_t decode_utf8(std::string_view s, size_t pos, int* len) {
  const auto b0 = static_cast<uint8_t>(s[pos]);
  const int n = utf8_sequence_length(b0);
  QS_CHECK(pos + n <= s.size());
  *len = n;
  if (n == 1) return b0;
  char32_t cp = b0 & (0x7F >> n);
  for (int i = 1; i < n; ++i) cp = (cp << 6) | (static_cast<uint8_t>(s[pos + i]) & 0x3F);
  return cp;
}

int utf8_sequence_length(uint8_t lead) {
  if (lead < 0xC0) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return 4;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string to_utf8(char32_t cp) {
  std::string s;
  append_utf8(s, cp);
  return s;
}

namespace {

// Length of the valid UTF-8 sequence at bytes[pos], or 0 when invalid; *valid_prefix gets the
// number of bytes that form a valid (possibly truncated) prefix, which is what one U+FFFD
// replaces (Unicode's "maximal subpart").
int valid_sequence_at(std::string_view bytes, size_t pos, int* valid_prefix) {
  const auto b0 = static_cast<uint8_t>(bytes[pos]);
  if (b0 < 0x80) return 1;
  int need;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    *valid_prefix = 1;
    return 0;
  }
  int i = 1;
  for (; i < need; ++i) {
    if (pos + i >= bytes.size()) break;
    const auto b = static_cast<uint8_t>(bytes[pos + i]);
    const uint8_t l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
    if (b < l || b > h) break;
  }
  if (i == need) return need;
  *valid_prefix = i;
  return 0;
}

}  // namespace

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t pos = 0;
  while (pos < bytes.size()) {
    int prefix = 0;
    const int n = valid_sequence_at(bytes, pos, &prefix);
    if (n > 0) {
      out.append(bytes.substr(pos, n));
      pos += n;
    } else {
      append_utf8(out, kReplacementChar);
      pos += prefix;
    }
  }
  return out;
}

bool is_valid_utf8(std::string_view bytes) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    int prefix = 0;
    const int n = valid_sequence_at(bytes, pos, &prefix);
    if (n == 0) return false;
    pos += n;
  }
  return true;
}

bool is_white_space(char32_t cp) {
  switch (cp) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

namespace {

const ut::CodePointRun* find_run(const ut::CodePointRun* runs, int n, char32_t cp) {
  const ut::CodePointRun* end = runs + n;
  const auto* it = std::upper_bound(
      runs, end, cp, [](char32_t c, const ut::CodePointRun& r) { return c < r.first; });
  if (it == runs) return nullptr;
  --it;
  return cp <= it->last ? it : nullptr;
}

int combining_class(char32_t cp) {
  if (cp < 0x300) return 0;
  const auto* run = find_run(ut::kCombiningClassRuns, ut::kCombiningClassRunsSize, cp);
  return run ? run->value : 0;
}

const ut::Decomposition* find_decomposition(const ut::Decomposition* table, int n, char32_t cp) {
  const ut::Decomposition* end = table + n;
  const auto* it = std::lower_bound(
      table, end, cp, [](const ut::Decomposition& d, char32_t c) { return d.code_point < c; });
  return it != end && it->code_point == cp ? it : nullptr;
}

constexpr char32_t kHangulSBase = 0xAC00, kHangulLBase = 0x1100, kHangulVBase = 0x1161,
                   kHangulTBase = 0x11A7;
constexpr int kHangulLCount = 19, kHangulVCount = 21, kHangulTCount = 28,
              kHangulNCount = kHangulVCount * kHangulTCount,
              kHangulSCount = kHangulLCount * kHangulNCount;

void decompose(char32_t cp, bool compat, std::vector<char32_t>& out) {
  if (cp >= kHangulSBase && cp < kHangulSBase + kHangulSCount) {
    const int s = static_cast<int>(cp - kHangulSBase);
    out.push_back(kHangulLBase + s / kHangulNCount);
    out.push_back(kHangulVBase + (s % kHangulNCount) / kHangulTCount);
    if (s % kHangulTCount != 0) out.push_back(kHangulTBase + s % kHangulTCount);
    return;
  }
  if (cp < 0xC0) {
    if (!compat || cp < 0xA0) {
      out.push_back(cp);
      return;
    }
  }
  if (compat) {
    if (const auto* d =
            find_decomposition(ut::kCompatDecompositions, ut::kCompatDecompositionsSize, cp)) {
      out.insert(out.end(), ut::kCompatDecompositionsData + d->offset,
                 ut::kCompatDecompositionsData + d->offset + d->length);
      return;
    }
  }
  if (const auto* d =
          find_decomposition(ut::kCanonicalDecompositions, ut::kCanonicalDecompositionsSize, cp)) {
    out.insert(out.end(), ut::kCanonicalDecompositionsData + d->offset,
               ut::kCanonicalDecompositionsData + d->offset + d->length);
    return;
  }
  out.push_back(cp);
}

char32_t compose_pair(char32_t a, char32_t b) {
  // Hangul LV and LVT.
  if (a >= kHangulLBase && a < kHangulLBase + kHangulLCount && b >= kHangulVBase &&
      b < kHangulVBase + kHangulVCount) {
    return kHangulSBase + ((a - kHangulLBase) * kHangulVCount + (b - kHangulVBase)) * kHangulTCount;
  }
  if (a >= kHangulSBase && a < kHangulSBase + kHangulSCount &&
      (a - kHangulSBase) % kHangulTCount == 0 && b > kHangulTBase &&
      b < kHangulTBase + kHangulTCount) {
    return a + (b - kHangulTBase);
  }
  const ut::Composition* end = ut::kCompositions + ut::kCompositionsSize;
  const auto* it = std::lower_bound(ut::kCompositions, end, std::make_pair(a, b),
                                    [](const ut::Composition& c, std::pair<char32_t, char32_t> k) {
                                      return std::make_pair(c.first, c.second) < k;
                                    });
  if (it != end && it->first == a && it->second == b) return it->composite;
  return 0;
}

}  // namespace

bool is_word_char(char32_t cp) {
  if (cp < 0x80) {
    return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') ||
           cp == '_';
  }
  return find_run(ut::kWordCharRuns, ut::kWordCharRunsSize, cp) != nullptr;
}

std::string normalize(std::string_view s, NormalForm form) {
  bool ascii = true;
  for (char c : s) ascii = ascii && static_cast<uint8_t>(c) < 0x80;
  if (ascii) return std::string(s);

  const bool compat = form == NormalForm::kNfkc || form == NormalForm::kNfkd;
  const bool compose = form == NormalForm::kNfc || form == NormalForm::kNfkc;
  std::vector<char32_t> cps;
  cps.reserve(s.size());
  for (size_t pos = 0; pos < s.size();) {
    int len = 0;
    decompose(decode_utf8(s, pos, &len), compat, cps);
    pos += len;
  }
  // Canonical ordering: stable sort of each run of non-starters by combining class.
  for (size_t i = 0; i < cps.size();) {
    if (combining_class(cps[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < cps.size() && combining_class(cps[j]) != 0) ++j;
    std::stable_sort(cps.begin() + i, cps.begin() + j, [](char32_t a, char32_t b) {
      return combining_class(a) < combining_class(b);
    });
    i = j;
  }
  if (compose && !cps.empty()) {
    // Canonical composition: each character composes with the last starter unless blocked by
    // an intervening character of the same or higher combining class.
    size_t starter = 0;
    bool have_starter = combining_class(cps[0]) == 0;
    int last_class = have_starter ? 0 : 256;
    size_t out = 1;
    for (size_t i = 1; i < cps.size(); ++i) {
      const char32_t c = cps[i];
      const int cls = combining_class(c);
      if (have_starter && (last_class < cls || (last_class == 0 && out == starter + 1))) {
        if (const char32_t composite = compose_pair(cps[starter], c)) {
          cps[starter] = composite;
          continue;
        }
      }
      if (cls == 0) {
        starter = out;
        have_starter = true;
      }
      last_class = cls;
      cps[out++] = c;
    }
    cps.resize(out);
  }
  std::string result;
  result.reserve(s.size());
  for (char32_t c : cps) append_utf8(result, c);
  return result;
}

const char* unicode_version() {
  return ut::kUnicodeVersion;
}

}  // namespace qs::unicode
