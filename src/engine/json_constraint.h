// Constrained JSON output (OpenAI's response_format: json_object and json_schema): the tokens
// that keep the text generated so far a prefix of one JSON document that a schema accepts, as a
// mask over the vocabulary.
//
// JsonRecognizer follows the text byte by byte over a JsonGrammar (json_schema.h; JSON mode is
// the schema {"type": "object"}): a pushdown automaton whose open objects and arrays are frames
// interned in a pool, so that a state is a few small threads (one per reading of the text that
// an anyOf leaves open). JsonVocab holds the vocabulary's bytes in a trie; JsonConstraint finds
// every token a state can take by one walk of it, pruning a subtree at its first refused byte,
// and keeps the masks per state, since a generation meets few distinct states.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "engine/json_pattern.h"
#include "engine/json_schema.h"

namespace qs {

class Tokenizer;

// What a number may be (JsonNode's bounds and multipleOf), narrowed where it is an item of a
// unique array of integers.
struct NumberRule {
  JsonScaled minimum, maximum, multiple;
};

// Nesting beyond this many open objects / arrays is refused.
constexpr int kJsonMaxDepth = 64;
// Consecutive whitespace bytes beyond this are refused, so that a model cannot pad forever.
constexpr int kJsonMaxWhitespace = 48;
// Readings of the text followed at once (anyOf alternatives alive together); past this the later
// alternatives are not offered (the output stays valid, the choice narrower).
constexpr int kJsonMaxThreads = 64;

// One reading of the text: where in the grammar it is. Unused fields stay at their defaults, so
// that equal readings compare (and hash) equal byte for byte.
struct JsonThread {
  int64_t value = 0;   // a bounded number's integer digits so far (magnitude, clamped past the
                       // bounds)
  int32_t frame = -1;  // the innermost open container (JsonRecognizer's pool), -1: none
  int32_t node = -1;   // the value due (value, colon modes) or being read (scalars)
  int32_t trie = -1;   // position in a literal trie (a literal value, a key's name), -1: none
  uint16_t count = 0;  // characters of a string with length bounds; a bounded number's fraction
                       // digits (kJsonUnitDigits + 1: more)
  uint8_t mode = 0;    // where in the grammar (json_constraint.cpp's Mode)
  uint8_t aux = 0;     // the mode's counter: \u digits, UTF-8 bytes left; a number's sign (bit 0:
                       // -) and, bounded, a nonzero fraction digit past its first kJsonUnitDigits
                       // (bit 1)
  uint8_t ws = 0;      // consecutive whitespace bytes
  uint8_t key = 0;     // the string being read is an object's key
  uint16_t pattern = 0;  // a string's pattern automaton state + 1 (0: none)
  uint32_t frac = 0;  // a bounded number's first kJsonUnitDigits fraction digits, in units
  bool operator==(const JsonThread&) const = default;
};
static_assert(kMaxPatternStates < 65535, "JsonThread::pattern holds a state + 1 in 16 bits");
static_assert(sizeof(JsonThread) == 32,
              "no padding bytes: readings are compared and hashed as bytes");

struct JsonState {
  uint8_t n = 0;
  std::array<JsonThread, kJsonMaxThreads> threads{};
  bool operator==(const JsonState& o) const;
  std::string_view bytes() const;   // the live threads' bytes (a key)
  void assign(const JsonState& o);  // = o, copying its live threads only
};

class JsonRecognizer {
 public:
  explicit JsonRecognizer(JsonGrammar grammar);

  const JsonGrammar& grammar() const { return g_; }
  JsonState start() const;
  // Takes one more byte; false (and the state unchanged) if no accepted document starts with the
  // text so far followed by `c`.
  bool advance(JsonState& s, uint8_t c);
  bool advance(JsonState& s, std::string_view bytes);  // every byte, or false (s then undefined)
  // `to` = `from` after `c`; false if nothing is left.
  bool advance_into(const JsonState& from, uint8_t c, JsonState& to);
  // The text so far is a whole accepted document (it may end here).
  bool accepting(const JsonState& s) const;
  // ... and nothing can follow it.
  bool finished(const JsonState& s) const;
  // How long a run of printable ASCII but '"' and '\\' some reading takes whatever its bytes
  // (inside a string, up to its maxLength); 0: none.
  int plain_room(const JsonState& s) const;
  // The most bytes of text that loops and merge_alike answer for (a vocabulary's longest token),
  // with each pattern's alike states within them; until set, none are merged.
  void set_horizon(int bytes);
  // The byte groups (json_pattern.h) whose bytes all leave `s` as it is, as far as any text within
  // the horizon can tell: inside a string, the plain bytes (printable ASCII but '"' and '\\',
  // kPlainGroups) where they change nothing, or those that lead a pattern's automaton state to a
  // state alike to it (itself, until a horizon is set; with length bounds, only where the count
  // changes nothing: PatternLengths::idle).
  ByteGroups loops(const JsonState& s) const;
  // What a plain byte outside loops(s) does to `s` where that is simple (one reading, inside a
  // string no key trie tracks): kCounts: it only counts a character; kSteps: it counts and steps
  // the string's pattern (plain_pattern_step); kOther: step it.
  enum PlainStep : int8_t { kOther, kCounts, kSteps };
  PlainStep plain_step(const JsonState& s) const;
  // A string's thread after plain byte c where plain_step says kSteps; false if refused.
  bool plain_pattern_step(JsonThread& t, uint8_t c) const;
  size_t frames() const { return frames_.size(); }
  // States no text within the horizon tells apart made equal (a mask's key): the counts of the
  // strings in `s` with room for it past their minLength set to their minLength, and pattern
  // strings' automaton states set to the first state alike within it (JsonPattern::alike_within;
  // with length bounds, where the count changes nothing).
  void merge_alike(JsonState& s) const;

 private:
  static constexpr int64_t kNoItem = std::numeric_limits<int64_t>::min();
  struct Frame {
    int32_t parent;  // -1: the outermost
    int32_t node;    // an object or array node
    int32_t index;   // objects: the next property that may come; arrays: the items started
    int32_t depth;
    // A unique array's last item (JsonNode::unique): its literal's value or its integer;
    // kNoItem: none yet.
    int64_t last = kNoItem;
    int32_t members = 0;  // an object's members so far, counted only with min/maxProperties
    bool operator==(const Frame&) const = default;
  };
  struct FrameHash {
    size_t operator()(const Frame& f) const;
  };
  class Sink;
  void step(JsonThread t, uint8_t c, Sink& out);
  void start_value(JsonThread t, int32_t node, uint8_t c, Sink& out);
  void start_key(JsonThread t, Sink& out);
  void next_member(JsonThread t, Sink& out);
  void close(JsonThread t, uint8_t c, Sink& out);
  void string_byte(JsonThread t, uint8_t c, Sink& out);
  // Steps a pattern string's automaton by c; false where no match can follow.
  bool pattern_byte(JsonThread& t, uint8_t c) const;
  // Some short escape's character continues t's pattern (or t has none).
  bool pattern_escapes(const JsonThread& t) const;
  void end_key(JsonThread t, Sink& out);
  bool key_byte(JsonThread& t, uint8_t c) const;
  // The listed properties that may come next in object frame f: [first, last] (first > last:
  // none), from f.index up to the first required one, each leaving room for the required ones
  // after it within maxProperties and enough after it for minProperties.
  std::pair<int32_t, int32_t> next_properties(const Frame& f) const;
  // Another key than the listed ones may come next in object frame f.
  bool other_key_fits(const Frame& f) const;
  bool key_may_come(const Frame& f) const;
  void literal_byte(JsonThread t, uint8_t c, Sink& out);
  // A number's byte (start_value's first one included): digits, sign, fraction, exponent.
  void number_byte(JsonThread t, uint8_t c, Sink& out);
  // Moves into literal trie node `next` (none: -1), ending the value where nothing can follow.
  void enter_trie(JsonThread t, int32_t next, Sink& out);
  // number_byte's rule for t: its node's, narrowed in a unique array of integers.
  NumberRule number_rule(const JsonThread& t) const;
  // A number ends before `c` (a unique array keeps its value), then end_value.
  void end_number(JsonThread t, uint8_t c, Sink& out);
  // Whether a unique array's next item (node `item`, its frame t's, index counted) has a value
  // left; true elsewhere.
  bool item_may_start(const JsonThread& t, int32_t item) const;
  // In a unique array, its frame keeps the item that ended (JsonNode::unique): a literal's
  // value, an integer.
  void keep_item(JsonThread& t, int64_t value);
  // The literal at trie node `at` ends (a unique array keeps its value), then end_value.
  void end_literal(JsonThread t, int32_t at, uint8_t c, bool reread, Sink& out);
  // Whether t may enter literal trie node `next`: only a value past the last one where t's
  // container is a unique array, leaving values enough for its minItems.
  bool unique_allows(const JsonThread& t, int32_t next) const;
  void end_value(JsonThread t, uint8_t c, bool reread, Sink& out);
  bool push(JsonThread& t, int32_t node);
  void set_index(JsonThread& t, int32_t index);
  const Frame& frame(int32_t id) const { return frames_[static_cast<size_t>(id)]; }
  int32_t intern(const Frame& f);

  JsonGrammar g_;
  int horizon_ = 1 << 20;  // set_horizon's (the default: past any string's bound, merges none)
  std::vector<std::vector<int32_t>> alike_;           // by pattern: alike_within the horizon
  std::vector<std::vector<ByteGroups>> alike_loops_;  // by pattern: its loops_among(alike_)
  JsonState scratch_;  // advance's next state
  std::vector<Frame> frames_;
  std::unordered_map<Frame, int32_t, FrameHash> frame_ids_;
};

// The vocabulary's bytes as a trie stored in preorder (made once per tokenizer).
class JsonVocab {
 public:
  // The vocabulary of `vocab` ids (the model's logit rows; ids the tokenizer does not have, and
  // special tokens, are never allowed), with `eos` the ids that may end a whole document. An
  // error names a byte that JSON needs and no single token spells.
  static Result<std::shared_ptr<const JsonVocab>> create(const Tokenizer& tokenizer, int vocab,
                                                         std::vector<int32_t> eos);
  // The same from each id's bytes (an id with none is never allowed).
  JsonVocab(std::vector<std::string> token_bytes, std::vector<int32_t> eos);

  int vocab() const { return vocab_; }
  const std::string& bytes(int32_t id) const { return bytes_[static_cast<size_t>(id)]; }
  bool is_eos(int32_t id) const { return is_eos_[static_cast<size_t>(id)]; }
  const std::vector<int32_t>& eos() const { return eos_; }
  // A byte no single token spells, in `needed`; -1 if there is none.
  int missing_byte(std::string_view needed) const;

  struct Node {
    uint8_t byte;
    uint16_t depth;       // 1 for the first byte of a token
    uint16_t deepest;     // the largest depth in this node's subtree
    int32_t end;          // one past the last node of this node's subtree (preorder)
    int32_t first_token;  // tokens_[first_token .. next node's first_token) end here
  };
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  // tokens()[first .. end): the tokens of the nodes [node, end) (a subtree: preorder).
  int32_t first_token_at(int32_t node) const {
    return node < static_cast<int32_t>(nodes_.size())
               ? nodes_[static_cast<size_t>(node)].first_token
               : static_cast<int32_t>(tokens_.size());
  }
  // By node: the groups of the bytes its subtree's nodes spell.
  const std::vector<ByteGroups>& subtree_groups() const { return subtree_groups_; }
  int longest() const { return longest_; }  // the most bytes a token has

 private:
  void build_trie();  // nodes_, tokens_, subtree_groups_ from bytes_

  int vocab_ = 0;
  std::vector<std::string> bytes_;  // each id's bytes ("" for an excluded id)
  std::vector<bool> is_eos_;
  std::vector<int32_t> eos_;
  std::vector<bool> single_;  // single_[b]: some token is the byte b alone
  std::vector<Node> nodes_;   // the trie in preorder, without its root
  std::vector<ByteGroups> subtree_groups_;  // by node
  std::vector<int32_t> tokens_;
  int longest_ = 0;
};

class JsonConstraint {
 public:
  // An error names a byte the grammar needs that no single token spells.
  static Result<std::unique_ptr<JsonConstraint>> create(std::shared_ptr<const JsonVocab> vocab,
                                                        JsonGrammar grammar);
  JsonConstraint(std::shared_ptr<const JsonVocab> vocab, JsonGrammar grammar);

  int vocab() const { return vocab_->vocab(); }
  JsonRecognizer& recognizer() { return rec_; }
  JsonState start() const { return rec_.start(); }
  bool finished(const JsonState& s) const { return rec_.finished(s); }
  // Advances `s` over token `id`'s bytes; false if they do not continue the document. An
  // end-of-text id leaves the state as it is (allowed() says when one may come).
  bool advance(JsonState& s, int32_t id);
  // Bit id of word id / 64: token id is allowed after `s`. Where the document may end, the
  // end-of-text ids are too (once it is finished, only they are: every id if there are none, as
  // the engine stops there anyway); a state no token can continue (not met with a vocabulary
  // that create() accepts) allows the end-of-text ids.
  const std::vector<uint64_t>& allowed(const JsonState& s);

 private:
  std::vector<uint64_t> walk(const JsonState& s);

  std::shared_ptr<const JsonVocab> vocab_;
  JsonRecognizer rec_;
  std::unordered_map<std::string, std::vector<uint64_t>> cache_;
  // walk's states by depth, and what plain bytes do to them
  struct Reach {
    int room = 0;  // plain_room
    JsonRecognizer::PlainStep step = JsonRecognizer::kOther;
    ByteGroups loops = 0;
    bool takes = false;  // some subtree may be taken whole (room or loops)
  };
  void reach(size_t depth);  // reaches_[depth] from states_[depth]
  std::vector<JsonState> states_;
  std::vector<Reach> reaches_;
  JsonState token_state_;            // advance's state over a token's bytes
  JsonState key_state_;              // allowed's state with its counts merged
};

}  // namespace qs
