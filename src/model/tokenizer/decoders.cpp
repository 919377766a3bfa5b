// Decoders: Sequence, ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace.
#include "model/tokenizer/components.h"
#include "model/tokenizer/json_util.h"
#include "model/tokenizer/unicode.h"

namespace qs::tok {

namespace {

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts)
      : parts_(std::move(parts)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& p : parts_) p->decode_chain(tokens);
  }
  void decode_chain_bytes(std::vector<std::string>& tokens) const override {
    for (const auto& p : parts_) p->decode_chain_bytes(tokens);
  }
  bool has_byte_fallback() const override {
    for (const auto& p : parts_) {
      if (p->has_byte_fallback()) return true;
    }
    return false;
  }
  bool strips_trailing() const override {
    for (const auto& p : parts_) {
      if (p->strips_trailing()) return true;
    }
    return false;
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

// Characters -> bytes through the GPT-2 map (a token with an unmapped character keeps its own
// UTF-8 bytes), everything joined, then lossy UTF-8.
class ByteLevelDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    decode(tokens);
    tokens[0] = unicode::utf8_lossy(tokens[0]);
  }
  void decode_chain_bytes(std::vector<std::string>& tokens) const override { decode(tokens); }

 private:
  // The joined bytes as one token.
  static void decode(std::vector<std::string>& tokens) {
    std::string bytes;
    std::string token_bytes;
    for (const auto& t : tokens) {
      token_bytes.clear();
      bool mapped = true;
      for (size_t pos = 0; pos < t.size();) {
        int len = 0;
        const int b = unicode_to_byte(unicode::decode_utf8(t, pos, &len));
        if (b < 0) {
          mapped = false;
          break;
        }
        token_bytes.push_back(static_cast<char>(b));
        pos += len;
      }
      bytes += mapped ? token_bytes : t;
    }
    tokens.assign(1, std::move(bytes));
  }
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) {
      const auto matches = pattern_.find_all(t);
      if (matches.empty()) continue;
      std::string out;
      size_t prev = 0;
      for (const auto& [begin, end] : matches) {
        out.append(t, prev, begin - prev);
        out += content_;
        prev = end;
      }
      out.append(t, prev, std::string::npos);
      t = std::move(out);
    }
  }

 private:
  Pattern pattern_;
  std::string content_;
};

// Runs of "<0xXX>" tokens become their bytes when those form valid UTF-8, else one U+FFFD per
// byte token.
class ByteFallbackDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string run;
    size_t run_tokens = 0;
    auto flush = [&] {
      if (run_tokens == 0) return;
      if (unicode::is_valid_utf8(run)) {
        out.push_back(run);
      } else {
        for (size_t i = 0; i < run_tokens; ++i) out.push_back(unicode::to_utf8(0xFFFD));
      }
      run.clear();
      run_tokens = 0;
    };
    for (auto& t : tokens) {
      const int byte = parse_byte_token(t);
      if (byte >= 0) {
        run.push_back(static_cast<char>(byte));
        ++run_tokens;
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens = std::move(out);
  }
  bool has_byte_fallback() const override { return true; }

  static int parse_byte_token(const std::string& t) {
    if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
    int value = 0;
    for (int i = 3; i < 5; ++i) {
      const char c = t[i];
      int digit;
      if (c >= '0' && c <= '9') {
        digit = c - '0';
      } else if (c >= 'a' && c <= 'f') {
        digit = c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        digit = c - 'A' + 10;
      } else {
        return -1;
      }
      value = value * 16 + digit;
    }
    return value;
  }
};

class FuseDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string joined;
    for (const auto& t : tokens) joined += t;
    tokens.assign(1, std::move(joined));
  }
};

// Per token: drop up to `start` leading and `stop` trailing `content` characters.
class StripDecoder final : public Decoder {
 public:
  StripDecoder(char32_t content, size_t start, size_t stop)
      : content_(content), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) {
      std::vector<std::pair<size_t, size_t>> chars;  // (byte offset, length)
      for (size_t pos = 0; pos < t.size();) {
        int len = 0;
        unicode::decode_utf8(t, pos, &len);
        chars.emplace_back(pos, len);
        pos += len;
      }
      auto char_at = [&](size_t i) {
        int len = 0;
        return unicode::decode_utf8(t, chars[i].first, &len);
      };
      size_t start_cut = 0;
      for (size_t i = 0; i < start_ && i < chars.size(); ++i) {
        if (char_at(i) != content_) break;
        start_cut = i + 1;
      }
      size_t stop_cut = chars.size();
      for (size_t i = 0; i < stop_ && i < chars.size() - start_cut; ++i) {
        const size_t index = chars.size() - i - 1;
        if (char_at(index) != content_) break;
        stop_cut = index;
      }
      const size_t begin = start_cut < chars.size() ? chars[start_cut].first : t.size();
      const size_t end = stop_cut < chars.size() ? chars[stop_cut].first : t.size();
      t = t.substr(begin, end > begin ? end - begin : 0);
    }
  }
  bool strips_trailing() const override { return stop_ > 0; }

 private:
  char32_t content_;
  size_t start_, stop_;
};

class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool prepend)
      : replacement_(std::move(replacement)), prepend_(prepend) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      const std::string& t = tokens[i];
      // The first token loses its replacement characters (the prepended space).
      const std::string space = (i == 0 && prepend_) ? "" : " ";
      size_t prev = 0;
      for (size_t pos = t.find(replacement_); pos != std::string::npos;
           pos = t.find(replacement_, prev)) {
        out.append(t, prev, pos - prev);
        out += space;
        prev = pos + replacement_.size();
      }
      out.append(t, prev, std::string::npos);
      tokens[i] = std::move(out);
    }
  }

 private:
  std::string replacement_;
  bool prepend_;
};

Result<char32_t> single_char(const Json& j, const char* key, const std::string& where) {
  QS_ASSIGN_OR_RETURN(std::string s, get_string(j, key, where));
  if (s.empty() || !unicode::is_valid_utf8(s)) {
    return make_error(where + ": field '" + key + "' must be one character");
  }
  int len = 0;
  const char32_t cp = unicode::decode_utf8(s, 0, &len);
  if (static_cast<size_t>(len) != s.size()) {
    return make_error(where + ": field '" + key + "' must be one character");
  }
  return cp;
}

}  // namespace

Result<std::unique_ptr<Decoder>> parse_decoder(const Json& j) {
  QS_ASSIGN_OR_RETURN(std::string type, get_type(j, "decoder"));
  const std::string where = "tokenizer.json: decoder " + type;
  if (type == "Sequence") {
    auto it = j.find("decoders");
    if (it == j.end() || !it->is_array()) {
      return make_error(where + ": field 'decoders' must be an array");
    }
    std::vector<std::unique_ptr<Decoder>> parts;
    for (const auto& sub : *it) {
      QS_ASSIGN_OR_RETURN(auto part, parse_decoder(sub));
      parts.push_back(std::move(part));
    }
    return std::unique_ptr<Decoder>(new SequenceDecoder(std::move(parts)));
  }
  if (type == "ByteLevel") return std::unique_ptr<Decoder>(new ByteLevelDecoder());
  if (type == "Replace") {
    auto it = j.find("pattern");
    if (it == j.end()) return make_error(where + ": missing field 'pattern'");
    QS_ASSIGN_OR_RETURN(Pattern pattern, Pattern::parse(*it, where));
    QS_ASSIGN_OR_RETURN(std::string content, get_string(j, "content", where));
    return std::unique_ptr<Decoder>(new ReplaceDecoder(std::move(pattern), content));
  }
  if (type == "ByteFallback") return std::unique_ptr<Decoder>(new ByteFallbackDecoder());
  if (type == "Fuse") return std::unique_ptr<Decoder>(new FuseDecoder());
  if (type == "Strip") {
    QS_ASSIGN_OR_RETURN(char32_t content, single_char(j, "content", where));
    QS_ASSIGN_OR_RETURN(int64_t start, get_int(j, "start", where));
    QS_ASSIGN_OR_RETURN(int64_t stop, get_int(j, "stop", where));
    if (start < 0 || stop < 0) return make_error(where + ": start/stop must be >= 0");
    return std::unique_ptr<Decoder>(new StripDecoder(content, start, stop));
  }
  if (type == "Metaspace") {
    QS_ASSIGN_OR_RETURN(std::string replacement, get_string(j, "replacement", where));
    bool prepend = true;
    if (auto it = j.find("prepend_scheme"); it != j.end() && it->is_string()) {
      prepend = it->get<std::string>() != "never";
    } else {
      QS_ASSIGN_OR_RETURN(prepend, get_bool(j, "add_prefix_space", true, where));
    }
    return std::unique_ptr<Decoder>(new MetaspaceDecoder(std::move(replacement), prepend));
  }
  return make_error("tokenizer.json: unsupported decoder type '" + type +
                    "' (supported: Sequence, ByteLevel, Replace, ByteFallback, Fuse, Strip, "
                    "Metaspace)");
}

}  // namespace qs::tok
