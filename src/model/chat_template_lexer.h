// Chat-template scanner (source -> text / output / statement segments, with Jinja's whitespace
// control) and tag lexer (tag source -> tokens).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/chat_template_value.h"

namespace qs::chat_template_internal {

enum class SegmentKind { kText, kOutput, kStatement };

struct Segment {
  SegmentKind kind;
  std::string text;  // text, or the tag's inner source
  int line;
};

enum class TokenType { kName, kString, kInt, kFloat, kOp, kEnd };

struct Token {
  TokenType type;
  std::string text;  // name, operator, or the unescaped string
  int64_t integer = 0;
  double number = 0;
};

std::vector<Segment> scan_template(std::string_view raw);
std::vector<Token> lex_tag(const std::string& src, int line);

}  // namespace qs::chat_template_internal
