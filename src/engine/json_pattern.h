// A JSON Schema "pattern" (an ECMA-262 regular expression; it matches anywhere in the string
// unless it is anchored with ^ and $) as a deterministic automaton over the bytes of a string's
// value, for JsonRecognizer: each state says whether the text so far can still become a string
// the pattern matches, so that no text it lets a model start is a dead end.
//
// The subset: literal characters (UTF-8), ., classes [...] and [^...] with ranges, \d \w \s and
// their negations, escapes (\n \t \r \f \v \0 \xHH \uHHHH \u{H...} and escaped punctuation),
// groups (...), (?:...) and (?<name>...), alternation |, quantifiers * + ? {n} {n,} {n,m} (lazy
// forms too: the same strings match), ^ as the pattern's first character and $ as its last.
// Refused with an error naming them: anchors elsewhere, backreferences, lookaround, \b, \p{...},
// and automata past kMaxPatternStates states.
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

class JsonPattern {
 public:
  static Result<JsonPattern> compile(std::string_view regex);

  int32_t start() const { return 0; }
  // The state after `byte`; -1 when no matched string starts with the text so far and it.
  int32_t next(int32_t state, uint8_t byte) const {
    return table_[static_cast<size_t>(state) * num_classes_ + classes_[byte]];
  }
  // The text so far is a string the pattern matches.
  bool accepts(int32_t state) const { return accept_[static_cast<size_t>(state)]; }
  // Some string matches (the start state is live).
  bool satisfiable() const { return !accept_.empty(); }
  // A whole string's bytes match.
  bool matches(std::string_view text) const;
  size_t states() const { return accept_.size(); }

 private:
  std::vector<uint8_t> classes_ = std::vector<uint8_t>(256, 0);  // byte -> its class
  size_t num_classes_ = 1;
  std::vector<int32_t> table_;  // state * num_classes_ + class -> state or -1
  std::vector<bool> accept_;    // empty: nothing matches
  friend class JsonPatternBuilder;
};

}  // namespace qs
