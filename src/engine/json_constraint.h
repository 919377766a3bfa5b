// JSON mode (OpenAI's response_format {"type": "json_object"}): the tokens that keep the text
// generated so far a prefix of one JSON object (RFC 8259), as a mask over the vocabulary.
//
// JsonState recognizes the text byte by byte (a pushdown automaton: the open objects and arrays
// on a bit stack). JsonConstraint holds the vocabulary's bytes in a trie and finds every token
// the state can take by one walk of it, pruning a subtree at its first refused byte; the masks
// are kept per state, since a generation meets few distinct states.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/error.h"

namespace qs {

class Tokenizer;

// Nesting beyond this many open objects / arrays is refused.
constexpr int kJsonMaxDepth = 64;
// Consecutive whitespace bytes beyond this are refused, so that a model cannot pad forever.
constexpr int kJsonMaxWhitespace = 48;

struct JsonState {
  uint64_t stack = 0;  // bit d: the container at depth d is an array (0: an object)
  uint8_t depth = 0;   // open containers
  uint8_t mode = 0;    // where in the grammar (json_constraint.cpp's Mode)
  uint8_t aux = 0;     // the mode's counter: literal progress, \u digits, UTF-8 bytes left
  uint8_t ws = 0;      // consecutive whitespace bytes
  uint8_t key = 0;     // the string being read is an object's key
  bool operator==(const JsonState&) const = default;

  // Takes one more byte; false (and the state unchanged) if no JSON object starts with the text
  // so far followed by `c`.
  bool advance(uint8_t c);
  bool advance(std::string_view bytes);  // every byte, or false (the state then undefined)
  // The text so far is one whole JSON object (nothing may follow but the end).
  bool complete() const;
};

class JsonConstraint {
 public:
  // The vocabulary of `vocab` ids (the model's logit rows; ids the tokenizer does not have, and
  // special tokens, are never allowed), with `eos` the ids that may end a complete object. An
  // error names a byte that JSON needs and no single token spells.
  static Result<std::unique_ptr<JsonConstraint>> create(const Tokenizer& tokenizer, int vocab,
                                                        std::vector<int32_t> eos);
  // The same from each id's bytes (an id with none is never allowed).
  JsonConstraint(std::vector<std::string> token_bytes, std::vector<int32_t> eos);

  int vocab() const { return vocab_; }
  // Advances `s` over token `id`'s bytes; false if they do not continue the object. An
  // end-of-text id leaves the state as it is (allowed() says when one may come).
  bool advance(JsonState& s, int32_t id) const;
  // Bit id of word id / 64: token id is allowed after `s`. Once the object is complete only the
  // end-of-text ids are (every id if there are none: the engine stops at completion anyway); a
  // state no token can continue (not met with a vocabulary that create() accepts) allows the
  // end-of-text ids.
  const std::vector<uint64_t>& allowed(const JsonState& s);

 private:
  struct Node {
    uint8_t byte;
    uint16_t depth;       // 1 for the first byte of a token
    int32_t end;          // one past the last node of this node's subtree (preorder)
    int32_t first_token;  // tokens_[first_token .. next node's first_token) end here
  };
  struct Key {
    uint64_t a, b;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const { return k.a * 0x9e3779b97f4a7c15ull ^ k.b; }
  };
  static Key key_of(const JsonState& s);
  void build_trie();  // nodes_, tokens_, plain_before_ from bytes_
  std::vector<uint64_t> walk(const JsonState& s) const;
  // tokens_[first .. end): the tokens of the nodes [node, end) (a subtree: preorder).
  int32_t first_token_at(int32_t node) const;

  int vocab_ = 0;
  std::vector<std::string> bytes_;  // each id's bytes ("" for an excluded id)
  std::vector<bool> is_eos_;
  std::vector<int32_t> eos_;
  std::vector<Node> nodes_;  // the trie in preorder, without its root
  // plain_before_[i]: how many of nodes_[0, i) spell a byte a string takes as it is (printable
  // ASCII but '"' and '\\'); a subtree of nothing else is taken whole inside a string.
  std::vector<int32_t> plain_before_;
  std::vector<int32_t> tokens_;
  std::unordered_map<Key, std::vector<uint64_t>, KeyHash> cache_;
};

}  // namespace qs
