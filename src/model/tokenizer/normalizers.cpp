// Normalizers: Sequence, Prepend, Replace, NFC/NFD/NFKC/NFKD, Strip.
#include <algorithm>

#include "model/tokenizer/components.h"
#include "model/tokenizer/json_util.h"
#include "model/tokenizer/unicode.h"

namespace qs::tok {

// ---------------------------------------------------------------------------------------------
// Pattern (shared by Replace and Split)

Result<Pattern> Pattern::parse(const Json& j, const std::string& where) {
  if (!j.is_object()) return make_error(where + ": 'pattern' must be an object");
  if (auto it = j.find("String"); it != j.end() && it->is_string()) {
    return literal(it->get<std::string>());
  }
  if (auto it = j.find("Regex"); it != j.end() && it->is_string()) {
    auto regex = Regex::compile(it->get<std::string>());
    if (!regex.ok()) return make_error(where + ": " + regex.error().message);
    Pattern p;
    p.regex_ = std::make_shared<Regex>(std::move(regex).value());
    return p;
  }
  return make_error(where + ": 'pattern' must be {\"String\": ...} or {\"Regex\": ...}");
}

Pattern Pattern::literal(std::string text) {
  Pattern p;
  p.literal_ = std::move(text);
  return p;
}

std::vector<Span> Pattern::find_all(std::string_view text) const {
  if (regex_) return regex_->find_all(text);
  std::vector<Span> matches;
  if (literal_.empty()) return matches;
  for (size_t pos = text.find(literal_); pos != std::string_view::npos;
       pos = text.find(literal_, pos + literal_.size())) {
    matches.emplace_back(pos, pos + literal_.size());
  }
  return matches;
}

namespace {

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts)
      : parts_(std::move(parts)) {}
  void normalize(std::string& text) const override {
    for (const auto& p : parts_) p->normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void normalize(std::string& text) const override {
    if (!text.empty()) text.insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void normalize(std::string& text) const override {
    const auto matches = pattern_.find_all(text);
    if (matches.empty()) return;
    std::string out;
    out.reserve(text.size() + matches.size() * content_.size());
    size_t prev = 0;
    for (const auto& [begin, end] : matches) {
      out.append(text, prev, begin - prev);
      out += content_;
      prev = end;
    }
    out.append(text, prev, std::string::npos);
    text = std::move(out);
  }

 private:
  Pattern pattern_;
  std::string content_;
};

class UnicodeNormalizer final : public Normalizer {
 public:
  explicit UnicodeNormalizer(unicode::NormalForm form) : form_(form) {}
  void normalize(std::string& text) const override { text = unicode::normalize(text, form_); }

 private:
  unicode::NormalForm form_;
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& text) const override {
    size_t begin = 0, end = text.size();
    if (left_) {
      while (begin < end) {
        int len = 0;
        if (!unicode::is_white_space(unicode::decode_utf8(text, begin, &len))) break;
        begin += len;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
        int len = 0;
        if (!unicode::is_white_space(unicode::decode_utf8(text, start, &len))) break;
        end = start;
      }
    }
    text = text.substr(begin, end - begin);
  }

 private:
  bool left_, right_;
};

}  // namespace

Result<std::unique_ptr<Normalizer>> parse_normalizer(const Json& j) {
  QS_ASSIGN_OR_RETURN(std::string type, get_type(j, "normalizer"));
  const std::string where = "tokenizer.json: normalizer " + type;
  if (type == "Sequence") {
    auto it = j.find("normalizers");
    if (it == j.end() || !it->is_array()) {
      return make_error(where + ": field 'normalizers' must be an array");
    }
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (const auto& sub : *it) {
      QS_ASSIGN_OR_RETURN(auto part, parse_normalizer(sub));
      parts.push_back(std::move(part));
    }
    return std::unique_ptr<Normalizer>(new SequenceNormalizer(std::move(parts)));
  }
  if (type == "Prepend") {
    QS_ASSIGN_OR_RETURN(std::string prefix, get_string(j, "prepend", where));
    return std::unique_ptr<Normalizer>(new PrependNormalizer(std::move(prefix)));
  }
  if (type == "Replace") {
    auto it = j.find("pattern");
    if (it == j.end()) return make_error(where + ": missing field 'pattern'");
    QS_ASSIGN_OR_RETURN(Pattern pattern, Pattern::parse(*it, where));
    QS_ASSIGN_OR_RETURN(std::string content, get_string(j, "content", where));
    return std::unique_ptr<Normalizer>(new ReplaceNormalizer(std::move(pattern), content));
  }
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    const auto form = type == "NFC"    ? unicode::NormalForm::kNfc
                      : type == "NFD"  ? unicode::NormalForm::kNfd
                      : type == "NFKC" ? unicode::NormalForm::kNfkc
                                       : unicode::NormalForm::kNfkd;
    return std::unique_ptr<Normalizer>(new UnicodeNormalizer(form));
  }
  if (type == "Strip") {
    QS_ASSIGN_OR_RETURN(bool left, get_bool(j, "strip_left", true, where));
    QS_ASSIGN_OR_RETURN(bool right, get_bool(j, "strip_right", true, where));
    return std::unique_ptr<Normalizer>(new StripNormalizer(left, right));
  }
  return make_error("tokenizer.json: unsupported normalizer type '" + type +
                    "' (supported: Sequence, Prepend, Replace, NFC, NFD, NFKC, NFKD, Strip)");
}

}  // namespace qs::tok
