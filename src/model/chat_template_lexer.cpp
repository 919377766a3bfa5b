// Chat-template scanner and tag lexer.
#include "model/chat_template_lexer.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <limits>
#include <set>
#include <sstream>
#include <unordered_map>
#include <utility>

namespace qs::chat_template_internal {

// ------------------------------------------------------------------------------------------------
// Scanner: text / output / statement segments with Jinja's whitespace control applied
// (trim_blocks, lstrip_blocks, "-" and "+" modifiers, newline normalization).
// ------------------------------------------------------------------------------------------------

namespace {

struct RawTag {
  char kind;  // '{' output, '%' statement, '#' comment
  std::string inner;
  int line;
  bool strip_before = false;  // "{%-": remove all whitespace before the tag
  bool keep_before = false;   // "{%+": no lstrip_blocks
  bool strip_after = false;   // "-%}": remove all whitespace after the tag
  bool keep_after = false;    // "+%}": no trim_blocks
};

// Jinja lexes a newline-normalized source, without one trailing newline.
std::string normalize_source(std::string_view raw) {
  std::string s;
  s.reserve(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] == '\r') {
      s += '\n';
      if (i + 1 < raw.size() && raw[i + 1] == '\n') ++i;
    } else {
      s += raw[i];
    }
  }
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

// Index just past the end marker of a tag whose content starts at `p`, skipping quoted strings
// and balanced brackets (so `{{ {'a': {'b': 1}} }}` and `{{ "}}" }}` close at the right place).
size_t find_tag_close(const std::string& s, size_t p, const char* close, size_t* inner_end) {
  int depth = 0;
  char quote = 0;
  for (size_t i = p; i < s.size(); ++i) {
    const char c = s[i];
    if (quote) {
      if (c == '\\') {
        ++i;
      } else if (c == quote) {
        quote = 0;
      }
      continue;
    }
    if (c == '\'' || c == '"') {
      quote = c;
    } else if (depth == 0 && s.compare(i, 2, close) == 0) {
      *inner_end = i;
      return i + 2;
    } else if (c == '(' || c == '[' || c == '{') {
      ++depth;
    } else if ((c == ')' || c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return std::string::npos;
}

// Where `{% endraw %}` (with optional modifiers) starts at or after `from`; sets *end past it.
size_t find_endraw(const std::string& s, size_t from, RawTag* tag, size_t* end) {
  for (size_t p = s.find("{%", from); p != std::string::npos; p = s.find("{%", p + 2)) {
    size_t i = p + 2;
    bool strip_before = false;
    if (i < s.size() && (s[i] == '-' || s[i] == '+')) strip_before = s[i++] == '-';
    while (i < s.size() && is_ascii_space(s[i])) ++i;
    if (s.compare(i, 6, "endraw") != 0) continue;
    i += 6;
    while (i < s.size() && is_ascii_space(s[i])) ++i;
    bool strip_after = false, keep_after = false;
    if (i < s.size() && (s[i] == '-' || s[i] == '+')) {
      strip_after = s[i] == '-';
      keep_after = s[i] == '+';
      ++i;
    }
    if (s.compare(i, 2, "%}") != 0) continue;
    tag->kind = '%';
    tag->inner = "endraw";
    tag->strip_before = strip_before;
    tag->strip_after = strip_after;
    tag->keep_after = keep_after;
    *end = i + 2;
    return p;
  }
  return std::string::npos;
}

}  // namespace

std::vector<Segment> scan_template(std::string_view raw) {
  const std::string s = normalize_source(raw);
  std::vector<std::string> texts;  // texts[i] precedes tags[i]; one more text than tags
  std::vector<RawTag> tags;
  size_t pos = 0;
  int line = 1;
  auto count_lines = [&](size_t from, size_t to) {
    line += static_cast<int>(std::count(s.begin() + from, s.begin() + to, '\n'));
  };
  for (;;) {
    size_t t = pos;
    for (;;) {
      t = s.find('{', t);
      if (t == std::string::npos || t + 1 >= s.size()) {
        t = std::string::npos;
        break;
      }
      if (s[t + 1] == '{' || s[t + 1] == '%' || s[t + 1] == '#') break;
      ++t;
    }
    if (t == std::string::npos) {
      texts.push_back(s.substr(pos));
      break;
    }
    texts.push_back(s.substr(pos, t - pos));
    count_lines(pos, t);
    RawTag tag;
    tag.kind = s[t + 1];
    tag.line = line;
    size_t p = t + 2;
    if (p < s.size() && s[p] == '-') {
      tag.strip_before = true;
      ++p;
    } else if (p < s.size() && s[p] == '+') {
      tag.keep_before = true;
      ++p;
    }
    size_t inner_end = 0, end = 0;
    if (tag.kind == '#') {
      inner_end = s.find("#}", p);
      if (inner_end == std::string::npos) fail(tag.line, "unclosed comment '{#'");
      end = inner_end + 2;
    } else {
      end = find_tag_close(s, p, tag.kind == '{' ? "}}" : "%}", &inner_end);
      if (end == std::string::npos) {
        fail(tag.line, std::string("unclosed tag '") + (tag.kind == '{' ? "{{" : "{%") + "'");
      }
    }
    tag.inner = s.substr(p, inner_end - p);
    if (!tag.inner.empty() && tag.inner.back() == '-') {
      tag.strip_after = true;
      tag.inner.pop_back();
    } else if (!tag.inner.empty() && tag.inner.back() == '+' && tag.kind != '{') {
      tag.keep_after = true;
      tag.inner.pop_back();
    }
    count_lines(t, end);
    pos = end;
    // {% raw %}...{% endraw %}: the body is text, never parsed.
    const std::string stripped = py_strip(tag.inner, nullptr, true, true);
    if (tag.kind == '%' && stripped == "raw") {
      tags.push_back(tag);
      RawTag endraw;
      endraw.line = line;
      size_t endraw_end = 0;
      const size_t endraw_at = find_endraw(s, pos, &endraw, &endraw_end);
      if (endraw_at == std::string::npos) fail(tag.line, "'{% raw %}' without '{% endraw %}'");
      texts.push_back(s.substr(pos, endraw_at - pos));
      count_lines(pos, endraw_end);
      tags.push_back(endraw);
      pos = endraw_end;
      continue;
    }
    tags.push_back(std::move(tag));
  }

  // Whitespace control. Each text is shaped by the tag before it (its head) and after it (tail).
  for (size_t i = 0; i < texts.size(); ++i) {
    std::string& text = texts[i];
    bool line_starting = i == 0;
    if (i > 0) {
      const RawTag& prev = tags[i - 1];
      if (prev.strip_after) {
        size_t n = 0;
        while (n < text.size() && is_ascii_space(text[n])) ++n;
        line_starting = n > 0 && text[n - 1] == '\n';
        text.erase(0, n);
      } else if (prev.kind != '{' && !prev.keep_after && !text.empty() && text[0] == '\n') {
        text.erase(0, 1);  // trim_blocks
        line_starting = true;
      } else {
        line_starting = false;
      }
    }
    if (i < tags.size()) {
      const RawTag& next = tags[i];
      if (next.strip_before) {
        size_t n = text.size();
        while (n > 0 && is_ascii_space(text[n - 1])) --n;
        text.erase(n);
      } else if (next.kind != '{' && !next.keep_before) {  // lstrip_blocks
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if (l_pos > 0 || line_starting) {
          bool all_space = l_pos < text.size();
          for (size_t k = l_pos; k < text.size(); ++k)
            all_space = all_space && is_ascii_space(text[k]);
          if (all_space) text.erase(l_pos);
        }
      }
    }
  }

  std::vector<Segment> segments;
  for (size_t i = 0; i < texts.size(); ++i) {
    if (!texts[i].empty())
      segments.push_back({SegmentKind::kText, texts[i], i > 0 ? tags[i - 1].line : 1});
    if (i < tags.size() && tags[i].kind != '#') {
      segments.push_back({tags[i].kind == '{' ? SegmentKind::kOutput : SegmentKind::kStatement,
                          tags[i].inner, tags[i].line});
    }
  }
  return segments;
}

// ------------------------------------------------------------------------------------------------
// Tag lexer
// ------------------------------------------------------------------------------------------------

namespace {

// Python "unicode-escape" decoding of a Jinja string literal body.
std::string unescape_string(const std::string& body, int line) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i] != '\\' || i + 1 == body.size()) {
      out += body[i];
      continue;
    }
    const char e = body[++i];
    auto hex = [&](size_t digits) -> uint32_t {
      uint32_t v = 0;
      for (size_t k = 1; k <= digits; ++k) {
        if (i + k >= body.size()) fail(line, "truncated escape in string literal");
        const char h = body[i + k];
        v <<= 4;
        if (h >= '0' && h <= '9')
          v |= h - '0';
        else if (h >= 'a' && h <= 'f')
          v |= h - 'a' + 10;
        else if (h >= 'A' && h <= 'F')
          v |= h - 'A' + 10;
        else
          fail(line, "bad hex digit in string escape");
      }
      i += digits;
      return v;
    };
    switch (e) {
      case 'n':
        out += '\n';
        break;
      case 't':
        out += '\t';
        break;
      case 'r':
        out += '\r';
        break;
      case '\\':
        out += '\\';
        break;
      case '\'':
        out += '\'';
        break;
      case '"':
        out += '"';
        break;
      case 'a':
        out += '\a';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'v':
        out += '\v';
        break;
      case '\n':
        break;  // line continuation
      case 'x':
        append_utf8(out, hex(2));
        break;
      case 'u':
        append_utf8(out, hex(4));
        break;
      case 'U':
        append_utf8(out, hex(8));
        break;
      default:
        if (e >= '0' && e <= '7') {
          uint32_t v = e - '0';
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7';
               ++k) {
            v = v * 8 + (body[++i] - '0');
          }
          append_utf8(out, v);
        } else {
          out += '\\';
          out += e;
        }
    }
  }
  return out;
}

}  // namespace

std::vector<Token> lex_tag(const std::string& src, int line) {
  static const char* const kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                     "/",  "%",  "~",  "<",  ">",  "=",  "(", ")", "[",
                                     "]",  "{",  "}",  ",",  ".",  ":",  "|"};
  std::vector<Token> tokens;
  size_t i = 0;
  while (i < src.size()) {
    const char c = src[i];
    if (is_ascii_space(c)) {
      ++i;
      continue;
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < src.size() && (std::isalnum(static_cast<unsigned char>(src[j])) || src[j] == '_'))
        ++j;
      tokens.push_back({TokenType::kName, src.substr(i, j - i)});
      i = j;
      continue;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      bool is_float = false;
      auto digits = [&] {
        while (j < src.size() &&
               (std::isdigit(static_cast<unsigned char>(src[j])) || src[j] == '_'))
          ++j;
      };
      digits();
      if (j + 1 < src.size() && src[j] == '.' &&
          std::isdigit(static_cast<unsigned char>(src[j + 1]))) {
        is_float = true;
        ++j;
        digits();
      }
      if (j < src.size() && (src[j] == 'e' || src[j] == 'E')) {
        size_t k = j + 1;
        if (k < src.size() && (src[k] == '+' || src[k] == '-')) ++k;
        if (k < src.size() && std::isdigit(static_cast<unsigned char>(src[k]))) {
          is_float = true;
          j = k;
          digits();
        }
      }
      std::string lit = src.substr(i, j - i);
      lit.erase(std::remove(lit.begin(), lit.end(), '_'), lit.end());
      Token t{is_float ? TokenType::kFloat : TokenType::kInt, lit};
      if (is_float) {
        t.number = std::strtod(lit.c_str(), nullptr);
      } else {
        auto r = std::from_chars(lit.data(), lit.data() + lit.size(), t.integer);
        if (r.ec != std::errc()) fail(line, "integer literal out of range: " + lit);
      }
      tokens.push_back(std::move(t));
      i = j;
      continue;
    }
    if (c == '\'' || c == '"') {
      size_t j = i + 1;
      while (j < src.size() && src[j] != c) {
        if (src[j] == '\\') ++j;
        ++j;
      }
      if (j >= src.size()) fail(line, "unterminated string literal");
      tokens.push_back({TokenType::kString, unescape_string(src.substr(i + 1, j - i - 1), line)});
      i = j + 1;
      continue;
    }
    bool matched = false;
    for (const char* op : kOps) {
      const size_t n = std::char_traits<char>::length(op);
      if (src.compare(i, n, op) == 0) {
        tokens.push_back({TokenType::kOp, op});
        i += n;
        matched = true;
        break;
      }
    }
    if (!matched) fail(line, std::string("unexpected character '") + c + "'");
  }
  tokens.push_back({TokenType::kEnd, ""});
  return tokens;
}

}  // namespace qs::chat_template_internal
