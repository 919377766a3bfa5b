// Added tokens of tokenizer.json and how HF finds them in text: leftmost-longest matches over
// the raw text (tokens with normalized=false) and then over each normalized piece (normalized=
// true, matched by their normalized form), honouring single_word / lstrip / rstrip.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace qs::tok {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool special = false;
};

// A piece of text after added-token extraction: either plain text or one added token.
struct Segment {
  std::string text;
  int32_t token_id = -1;  // >= 0: an added token
  bool at_origin = false;
};

// Byte trie over patterns, answering "longest pattern starting at pos".
class TokenMatcher {
 public:
  void add(std::string_view pattern, int32_t token_index);
  bool empty() const { return nodes_.size() <= 1; }
  // Longest pattern at text[pos...]: returns token index and sets *length, or -1.
  int32_t longest_at(std::string_view text, size_t pos, size_t* length) const;

 private:
  struct Node {
    std::unordered_map<uint8_t, int32_t> children;
    int32_t token_index = -1;
  };
  std::vector<Node> nodes_ = std::vector<Node>(1);
};

// Splits `text` around the matches of `matcher` (indices into `tokens`), as HF's
// AddedVocabulary::find_matches. Segments inherit `at_origin` only at offset 0.
std::vector<Segment> split_on_added_tokens(const std::string& text, bool at_origin,
                                           const TokenMatcher& matcher,
                                           const std::vector<AddedToken>& tokens);

}  // namespace qs::tok
