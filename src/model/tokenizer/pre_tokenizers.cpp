// Pre-tokenizers: Sequence, Split, ByteLevel, Metaspace, Digits.
#include <array>

#include "model/tokenizer/components.h"
#include "model/tokenizer/json_util.h"
#include "model/tokenizer/unicode.h"

namespace qs::tok {

std::vector<Span> split_by_matches(size_t length, const std::vector<Span>& matches,
                                   SplitBehavior behavior, bool invert) {
  // The text as consecutive (span, is_match) pieces, as HF's Pattern::find_matches gives them.
  std::vector<std::pair<Span, bool>> pieces;
  size_t prev = 0;
  for (const auto& m : matches) {
    if (prev != m.first) pieces.push_back({{prev, m.first}, invert});
    pieces.push_back({m, !invert});
    prev = m.second;
  }
  if (prev != length) pieces.push_back({{prev, length}, invert});

  std::vector<Span> out;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const auto& [span, is_match] : pieces) {
        if (!is_match) out.push_back(span);
      }
      break;
    case SplitBehavior::kIsolated:
      for (const auto& [span, is_match] : pieces) out.push_back(span);
      break;
    case SplitBehavior::kContiguous: {
      bool previous_match = false;
      for (const auto& [span, is_match] : pieces) {
        if (is_match == previous_match && !out.empty()) {
          out.back().second = span.second;
        } else {
          out.push_back(span);
        }
        previous_match = is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const auto& [span, is_match] : pieces) {
        if (is_match && !previous_match && !out.empty()) {
          out.back().second = span.second;
        } else {
          out.push_back(span);
        }
        previous_match = is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool previous_match = false;
      for (auto it = pieces.rbegin(); it != pieces.rend(); ++it) {
        const auto& [span, is_match] = *it;
        if (is_match && !previous_match && !out.empty()) {
          out.back().first = span.first;
        } else {
          out.push_back(span);
        }
        previous_match = is_match;
      }
      std::reverse(out.begin(), out.end());
      break;
    }
  }
  std::erase_if(out, [](const Span& s) { return s.first == s.second; });
  return out;
}

namespace {

struct ByteLevelTables {
  std::array<std::string, 256> byte_to_char;
  std::array<int, 324> char_to_byte;  // every mapped code point is < 324

  ByteLevelTables() {
    char_to_byte.fill(-1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const char32_t cp = printable ? b : 256 + extra++;
      byte_to_char[b] = unicode::to_utf8(cp);
      char_to_byte[cp] = b;
    }
  }
};

const ByteLevelTables& byte_level_tables() {
  static const ByteLevelTables tables;
  return tables;
}

constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Splits every piece at the pattern's matches; sub-pieces keep `at_origin` only at offset 0.
void split_pieces(std::vector<PreToken>& pieces, const Pattern& pattern, SplitBehavior behavior,
                  bool invert) {
  std::vector<PreToken> out;
  out.reserve(pieces.size());
  for (auto& piece : pieces) {
    const auto spans =
        split_by_matches(piece.text.size(), pattern.find_all(piece.text), behavior, invert);
    for (const auto& [begin, end] : spans) {
      out.push_back({piece.text.substr(begin, end - begin), piece.at_origin && begin == 0});
    }
  }
  pieces = std::move(out);
}

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts)
      : parts_(std::move(parts)) {}
  void pre_tokenize(std::vector<PreToken>& pieces) const override {
    for (const auto& p : parts_) p->pre_tokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(Pattern pattern, SplitBehavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  void pre_tokenize(std::vector<PreToken>& pieces) const override {
    split_pieces(pieces, pattern_, behavior_, invert_);
  }

 private:
  Pattern pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::unique_ptr<Pattern> gpt2)
      : add_prefix_space_(add_prefix_space), gpt2_(std::move(gpt2)) {}
  void pre_tokenize(std::vector<PreToken>& pieces) const override {
    if (add_prefix_space_) {
      for (auto& piece : pieces) {
        if (!piece.text.empty() && piece.text[0] != ' ') piece.text = " " + piece.text;
      }
    }
    if (gpt2_) split_pieces(pieces, *gpt2_, SplitBehavior::kIsolated, false);
    const auto& tables = byte_level_tables();
    for (auto& piece : pieces) {
      std::string mapped;
      mapped.reserve(piece.text.size() * 2);
      for (char c : piece.text) mapped += tables.byte_to_char[static_cast<uint8_t>(c)];
      piece.text = std::move(mapped);
    }
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Pattern> gpt2_;  // null when use_regex is false
};

enum class PrependScheme { kAlways, kFirst, kNever };

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {}
  void pre_tokenize(std::vector<PreToken>& pieces) const override {
    for (auto& piece : pieces) {
      std::string text;
      text.reserve(piece.text.size() + replacement_.size());
      for (char c : piece.text) {
        if (c == ' ') {
          text += replacement_;
        } else {
          text += c;
        }
      }
      const bool starts = text.compare(0, replacement_.size(), replacement_) == 0;
      const bool prepend = !text.empty() && !starts &&
                           (scheme_ == PrependScheme::kAlways ||
                            (scheme_ == PrependScheme::kFirst && piece.at_origin));
      if (prepend) text.insert(0, replacement_);
      piece.text = std::move(text);
    }
    if (split_) {
      split_pieces(pieces, Pattern::literal(replacement_), SplitBehavior::kMergedWithNext, false);
    }
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
};

Result<SplitBehavior> parse_behavior(const Json& j, const std::string& where) {
  QS_ASSIGN_OR_RETURN(std::string name, get_string(j, "behavior", where));
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return make_error(where + ": unknown split behavior '" + name + "'");
}

std::unique_ptr<Pattern> compile_builtin(const char* pattern) {
  auto regex = Regex::compile(pattern);
  QS_CHECK_MSG(regex.ok(), "built-in regex does not compile");
  Json j = {{"Regex", pattern}};
  auto p = Pattern::parse(j, "built-in");
  QS_CHECK(p.ok());
  return std::make_unique<Pattern>(std::move(p).value());
}

}  // namespace

const std::string& byte_to_unicode(uint8_t byte) {
  return byte_level_tables().byte_to_char[byte];
}

int unicode_to_byte(char32_t cp) {
  return cp < 324 ? byte_level_tables().char_to_byte[cp] : -1;
}

Result<std::unique_ptr<PreTokenizer>> parse_pre_tokenizer(const Json& j) {
  QS_ASSIGN_OR_RETURN(std::string type, get_type(j, "pre_tokenizer"));
  const std::string where = "tokenizer.json: pre_tokenizer " + type;
  if (type == "Sequence") {
    auto it = j.find("pretokenizers");
    if (it == j.end() || !it->is_array()) {
      return make_error(where + ": field 'pretokenizers' must be an array");
    }
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    for (const auto& sub : *it) {
      QS_ASSIGN_OR_RETURN(auto part, parse_pre_tokenizer(sub));
      parts.push_back(std::move(part));
    }
    return std::unique_ptr<PreTokenizer>(new SequencePreTokenizer(std::move(parts)));
  }
  if (type == "Split") {
    auto it = j.find("pattern");
    if (it == j.end()) return make_error(where + ": missing field 'pattern'");
    QS_ASSIGN_OR_RETURN(Pattern pattern, Pattern::parse(*it, where));
    QS_ASSIGN_OR_RETURN(SplitBehavior behavior, parse_behavior(j, where));
    QS_ASSIGN_OR_RETURN(bool invert, get_bool(j, "invert", false, where));
    return std::unique_ptr<PreTokenizer>(
        new SplitPreTokenizer(std::move(pattern), behavior, invert));
  }
  if (type == "ByteLevel") {
    QS_ASSIGN_OR_RETURN(bool add_prefix_space, get_bool(j, "add_prefix_space", true, where));
    QS_ASSIGN_OR_RETURN(bool use_regex, get_bool(j, "use_regex", true, where));
    return std::unique_ptr<PreTokenizer>(new ByteLevelPreTokenizer(
        add_prefix_space, use_regex ? compile_builtin(kGpt2Pattern) : nullptr));
  }
  if (type == "Metaspace") {
    QS_ASSIGN_OR_RETURN(std::string replacement, get_string(j, "replacement", where));
    PrependScheme scheme = PrependScheme::kAlways;
    if (auto it = j.find("prepend_scheme"); it != j.end() && it->is_string()) {
      const auto name = it->get<std::string>();
      if (name == "always") {
        scheme = PrependScheme::kAlways;
      } else if (name == "first") {
        scheme = PrependScheme::kFirst;
      } else if (name == "never") {
        scheme = PrependScheme::kNever;
      } else {
        return make_error(where + ": unknown prepend_scheme '" + name + "'");
      }
    } else {
      // Files older than prepend_scheme only have add_prefix_space.
      QS_ASSIGN_OR_RETURN(bool add_prefix_space, get_bool(j, "add_prefix_space", true, where));
      scheme = add_prefix_space ? PrependScheme::kAlways : PrependScheme::kNever;
    }
    QS_ASSIGN_OR_RETURN(bool split, get_bool(j, "split", true, where));
    return std::unique_ptr<PreTokenizer>(
        new MetaspacePreTokenizer(std::move(replacement), scheme, split));
  }
  if (type == "Digits") {
    QS_ASSIGN_OR_RETURN(bool individual, get_bool(j, "individual_digits", false, where));
    // char::is_numeric is \p{N}; one match per character, then merged or not.
    return std::unique_ptr<PreTokenizer>(new SplitPreTokenizer(
        std::move(*compile_builtin(R"(\p{N})")),
        individual ? SplitBehavior::kIsolated : SplitBehavior::kContiguous, false));
  }
  return make_error("tokenizer.json: unsupported pre_tokenizer type '" + type +
                    "' (supported: Sequence, Split, ByteLevel, Metaspace, Digits)");
}

}  // namespace qs::tok
