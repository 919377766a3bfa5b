// A JSON Schema "pattern" (an ECMA-262 regular expression; it matches anywhere in the string
// unless it is anchored with ^ and $) as a deterministic automaton over the bytes of a string's
// value, for JsonRecognizer: each state says whether the text so far can still become a string
// the pattern matches, so that no text it lets a model start is a dead end.
//
// The subset: literal characters (UTF-8), ., classes [...] and [^...] with ranges, \d \w \s and
// their negations, escapes (\n \t \r \f \v \0 \xHH \uHHHH \u{H...} and escaped punctuation),
// groups (...), (?:...) and (?<name>...), alternation |, quantifiers * + ? {n} {n,} {n,m} (lazy
// forms too: the same strings match), ^ as the pattern's first character and $ as its last.
// Lookaheads right after the leading ^ (^(?!A)B, ^(?=A)B, as pydantic's Decimal pattern starts):
// B's strings that A does not / does match from the start (subtract / intersect).
// Refused with an error naming them: anchors elsewhere, backreferences, other lookaround, \b,
// \p{...}, and automata past kMaxPatternStates states.
//
// The bytes are those a JSON string can carry as the model writes them: UTF-8 characters, and the
// control characters JSON writes as \b \t \n \f \r (the recognizer steps the automaton by the
// byte an escape stands for); other control characters and unpaired surrogates are never
// produced.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace qs {

constexpr int kMaxPatternStates = 4096;

// Bytes in 64 groups: the unit in which a pattern state's loops and a vocabulary subtree's
// bytes are compared (JsonConstraint's walk takes a subtree whole where all its bytes leave the
// state as it is). Group 0 holds the bytes no JSON string takes as they are (controls, '"',
// '\\', DEL, non-ASCII); 1-63 printable ASCII: space, the digits, each letter, some
// punctuation singly, the rest of it. A set of groups is a ByteGroups, bit g for group g.
using ByteGroups = uint64_t;
constexpr int byte_group(uint8_t b) {
  constexpr std::string_view kSingly = "-_.,:/@+";
  if (b == ' ') return 1;
  if (b >= '0' && b <= '9') return 2;
  if (b >= 'a' && b <= 'z') return 3 + (b - 'a');
  if (b >= 'A' && b <= 'Z') return 29 + (b - 'A');
  const size_t at = kSingly.find(static_cast<char>(b));
  if (at != std::string_view::npos) return 55 + static_cast<int>(at);
  return b > 0x20 && b < 0x7F && b != '"' && b != '\\' ? 63 : 0;
}
inline constexpr ByteGroups kPlainGroups = ~ByteGroups{1};  // every group but 0

class JsonPattern {
 public:
  static Result<JsonPattern> compile(std::string_view regex);
  // The strings both match (an error past kMaxPatternStates states).
  static Result<JsonPattern> intersect(const JsonPattern& a, const JsonPattern& b);
  // The strings a matches and b does not.
  static Result<JsonPattern> subtract(const JsonPattern& a, const JsonPattern& b);

  int32_t start() const { return 0; }
  // The state after `byte`; -1 when no matched string starts with the text so far and it.
  int32_t next(int32_t state, uint8_t byte) const {
    return table_[static_cast<size_t>(state) * num_classes_ + classes_[byte]];
  }
  // The text so far is a string the pattern matches.
  bool accepts(int32_t state) const { return accept_[static_cast<size_t>(state)]; }
  // For each state, the first state no text of up to `chars` bytes tells apart from it (the same
  // texts lead from both to live states, and to matches): where only that much text follows,
  // the two are alike (a counting state far from its bound is like the next one).
  std::vector<int32_t> alike_within(int chars) const;
  // The groups (but 0) whose bytes all leave `state` as it is.
  ByteGroups loops(int32_t state) const { return loops_[static_cast<size_t>(state)]; }
  // By state: the groups (but 0) whose bytes all lead to a state alike to it (`alike`: a state's
  // class, as alike_within gives them). Within the text alike_within was given, such bytes
  // change nothing that text can tell: no string of them leads to a dead end.
  std::vector<ByteGroups> loops_among(const std::vector<int32_t>& alike) const;
  // Some string matches (the start state is live).
  bool satisfiable() const { return !accept_.empty(); }
  // A whole string's bytes match.
  bool matches(std::string_view text) const;
  size_t states() const { return accept_.size(); }
  // Bytes no transition tells apart share a class: the moves by class, and whether a class's
  // bytes start a character (not UTF-8 continuation bytes).
  size_t classes() const { return num_classes_; }
  int32_t next_by_class(int32_t state, size_t cls) const {
    return table_[static_cast<size_t>(state) * num_classes_ + cls];
  }
  bool starts_character(size_t cls) const { return starts_[cls]; }

 private:
  std::vector<uint8_t> classes_ = std::vector<uint8_t>(256, 0);  // byte -> its class
  size_t num_classes_ = 1;
  std::vector<bool> starts_ = {true};
  std::vector<int32_t> table_;  // state * num_classes_ + class -> state or -1
  std::vector<bool> accept_;    // empty: nothing matches
  std::vector<ByteGroups> loops_;  // by state
  friend class JsonPatternBuilder;
};

// A pattern string with length bounds (minLength / maxLength, in characters): which (state,
// characters so far) pairs can still end in a match of an allowed length, so that the bounds
// and the pattern together leave no dead end.
class PatternLengths {
 public:
  // max -1: none. An error when the table would pass kMaxPatternLengthBits.
  static Result<PatternLengths> build(const JsonPattern& p, int min, int max);
  bool viable(int32_t state, int count) const;
  bool satisfiable() const { return !bits_.empty() && viable(0, 0); }
  // Whether no text of up to `chars` more characters can meet the bounds from `count` on: past
  // min, and with room below max for those and the most characters any state needs to reach a
  // match (then every live state is viable, whatever the count).
  bool idle(int count, int chars) const {
    return count >= min_ && (max_ < 0 || count + chars + most_needed_ <= max_);
  }

 private:
  size_t index(int layer, int32_t state) const {
    return static_cast<size_t>(state) * layers_ + static_cast<size_t>(layer);
  }
  bool bit(int layer, int32_t state) const {
    const size_t i = index(layer, state);
    return (bits_[i / 64] >> (i % 64)) & 1u;
  }
  int min_ = 0, max_ = -1;
  int most_needed_ = 0;  // characters, over the live states, of their shortest way to a match
  size_t states_ = 0, layers_ = 0;
  // State q, layer r (q's layers together): with a bound above, some match from q has exactly r
  // more characters; without one, at least r (r up to min).
  std::vector<uint64_t> bits_;
};

constexpr size_t kMaxPatternLengthBits = size_t{1} << 24;

}  // namespace qs
