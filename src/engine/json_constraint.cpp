#include "engine/json_constraint.h"

#include <fmt/format.h>

#include <algorithm>

#include "model/tokenizer/tokenizer.h"

namespace qs {

namespace {

enum Mode : uint8_t {
  kStart,     // before the object: whitespace, '{'
  kObjFirst,  // after '{': whitespace, a key, '}'
  kObjKey,    // after ',' in an object: whitespace, a key
  kColon,     // after a key: whitespace, ':'
  kValue,     // after ':' or ',' in an array: whitespace, a value
  kArrFirst,  // after '[': whitespace, a value, ']'
  kAfter,     // after a value in a container: whitespace, ',', the container's closer
  kString,    // in a string (aux: UTF-8 continuation bytes still due, and their first's range)
  kEscape,    // after a backslash in a string
  kHex,       // in a \u escape (aux: hex digits still due)
  kLiteral,   // in true / false / null (aux: literal * 8 + bytes matched)
  kMinus,     // a number's '-'
  kZero,      // a number's leading 0
  kInt,       // a number's integer digits after a leading 1-9
  kDot,       // the '.' of a fraction
  kFrac,      // fraction digits
  kExp,       // 'e' / 'E'
  kExpSign,   // the exponent's sign
  kExpInt,    // exponent digits
  kDone,      // the object is complete
};

constexpr const char* kLiterals[] = {"true", "false", "null"};

bool is_ws(uint8_t c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}
bool is_digit(uint8_t c) {
  return c >= '0' && c <= '9';
}
bool is_hex(uint8_t c) {
  return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

// A UTF-8 sequence's continuation bytes in a string: aux = bytes still due (1..3) + 4 * the
// range of the next one (RFC 3629: E0 needs A0..BF next, ED 80..9F, F0 90..BF, F4 80..8F).
enum Utf8Range : uint8_t { kAny, kE0, kED, kF0, kF4 };

bool continuation_ok(uint8_t aux, uint8_t c) {
  switch (aux >> 2) {
    case kE0:
      return c >= 0xA0 && c <= 0xBF;
    case kED:
      return c >= 0x80 && c <= 0x9F;
    case kF0:
      return c >= 0x90 && c <= 0xBF;
    case kF4:
      return c >= 0x80 && c <= 0x8F;
    default:
      return c >= 0x80 && c <= 0xBF;
  }
}

// The aux of a lead byte (0: not a lead byte of a multi-byte sequence).
uint8_t lead_aux(uint8_t c) {
  if (c >= 0xC2 && c <= 0xDF) return 1;
  if (c == 0xE0) return 2 + 4 * kE0;
  if (c == 0xED) return 2 + 4 * kED;
  if (c >= 0xE1 && c <= 0xEF) return 2;
  if (c == 0xF0) return 3 + 4 * kF0;
  if (c >= 0xF1 && c <= 0xF3) return 3;
  if (c == 0xF4) return 3 + 4 * kF4;
  return 0;
}

// Moves to `mode`: the byte is taken.
bool to(JsonState& s, Mode mode) {
  s.mode = mode;
  return true;
}

bool top_is_array(const JsonState& s) {
  return (s.stack >> (s.depth - 1)) & 1u;
}

bool push(JsonState& s, bool array) {
  if (s.depth >= kJsonMaxDepth) return false;
  if (array) {
    s.stack |= uint64_t{1} << s.depth;
  } else {
    s.stack &= ~(uint64_t{1} << s.depth);
  }
  ++s.depth;
  s.mode = array ? kArrFirst : kObjFirst;
  return true;
}

bool pop(JsonState& s, uint8_t closer) {
  if (s.depth == 0 || top_is_array(s) != (closer == ']')) return false;
  --s.depth;
  s.stack &= ~(uint64_t{1} << s.depth);
  s.mode = s.depth == 0 ? kDone : kAfter;
  return true;
}

// The first byte of a value.
bool start_value(JsonState& s, uint8_t c) {
  switch (c) {
    case '{':
      return push(s, false);
    case '[':
      return push(s, true);
    case '"':
      s.mode = kString;
      s.key = 0;
      s.aux = 0;
      return true;
    case '-':
      return to(s, kMinus);
    case '0':
      return to(s, kZero);
    case 't':
    case 'f':
    case 'n':
      s.mode = kLiteral;
      s.aux = static_cast<uint8_t>((c == 't' ? 0 : c == 'f' ? 1 : 2) * 8 + 1);
      return true;
    default:
      return c >= '1' && c <= '9' && to(s, kInt);
  }
}

bool in_string(JsonState& s, uint8_t c) {
  if ((s.aux & 3) != 0) {
    if (!continuation_ok(s.aux, c)) return false;
    s.aux = static_cast<uint8_t>((s.aux & 3) - 1);  // later continuation bytes: any range
    return true;
  }
  if (c == '"') {
    s.mode = s.key ? kColon : kAfter;
    s.key = 0;
    return true;
  }
  if (c == '\\') {
    s.mode = kEscape;
    return true;
  }
  if (c < 0x20) return false;
  if (c < 0x80) return true;
  s.aux = lead_aux(c);
  return s.aux != 0;
}

// A byte after a number's digits that ends it: the number is done, the byte is read after it.
bool end_number(JsonState& s, uint8_t c) {
  s.mode = kAfter;
  return s.advance(c);
}

bool step(JsonState& s, uint8_t c) {
  switch (s.mode) {
    case kStart:
      if (c != '{') return false;
      return push(s, false);
    case kObjFirst:
      if (c == '}') return pop(s, c);
      [[fallthrough]];
    case kObjKey:
      if (c != '"') return false;
      s.mode = kString;
      s.key = 1;
      s.aux = 0;
      return true;
    case kColon:
      if (c != ':') return false;
      s.mode = kValue;
      return true;
    case kArrFirst:
      if (c == ']') return pop(s, c);
      [[fallthrough]];
    case kValue:
      return start_value(s, c);
    case kAfter:
      if (c == ',') {
        s.mode = top_is_array(s) ? kValue : kObjKey;
        return true;
      }
      if (c == '}' || c == ']') return pop(s, c);
      return false;
    case kString:
      return in_string(s, c);
    case kEscape:
      if (c == 'u') {
        s.mode = kHex;
        s.aux = 4;
        return true;
      }
      if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' ||
          c == 't') {
        s.mode = kString;
        return true;
      }
      return false;
    case kHex:
      if (!is_hex(c)) return false;
      if (--s.aux == 0) s.mode = kString;
      return true;
    case kLiteral: {
      const char* lit = kLiterals[s.aux / 8];
      const int at = s.aux % 8;
      if (c != static_cast<uint8_t>(lit[at])) return false;
      if (lit[at + 1] == '\0') {
        s.mode = kAfter;
        s.aux = 0;
      } else {
        ++s.aux;
      }
      return true;
    }
    case kMinus:
      if (c == '0') return to(s, kZero);
      return c >= '1' && c <= '9' && to(s, kInt);
    case kZero:
    case kInt:
      if (s.mode == kInt && is_digit(c)) return true;
      if (c == '.') return to(s, kDot);
      if (c == 'e' || c == 'E') return to(s, kExp);
      return end_number(s, c);
    case kDot:
      return is_digit(c) && to(s, kFrac);
    case kFrac:
      if (is_digit(c)) return true;
      if (c == 'e' || c == 'E') return to(s, kExp);
      return end_number(s, c);
    case kExp:
      if (c == '+' || c == '-') return to(s, kExpSign);
      [[fallthrough]];
    case kExpSign:
      return is_digit(c) && to(s, kExpInt);
    case kExpInt:
      if (is_digit(c)) return true;
      return end_number(s, c);
    default:
      return false;  // kDone: nothing follows
  }
}

// Modes between tokens of the grammar, where whitespace may come.
bool takes_whitespace(uint8_t mode) {
  return mode <= kAfter;
}

}  // namespace

bool JsonState::advance(uint8_t c) {
  JsonState next = *this;
  if (is_ws(c) && takes_whitespace(mode)) {
    if (next.ws >= kJsonMaxWhitespace) return false;
    ++next.ws;
  } else {
    next.ws = 0;
    if (!step(next, c)) return false;
  }
  *this = next;
  return true;
}

bool JsonState::advance(std::string_view bytes) {
  for (char c : bytes) {
    if (!advance(static_cast<uint8_t>(c))) return false;
  }
  return true;
}

bool JsonState::complete() const {
  return mode == kDone;
}

Result<std::unique_ptr<JsonConstraint>> JsonConstraint::create(const Tokenizer& tokenizer,
                                                               int vocab,
                                                               std::vector<int32_t> eos) {
  std::vector<std::string> bytes(static_cast<size_t>(vocab));
  std::vector<bool> single(256, false);
  const int n = std::min(vocab, tokenizer.vocab_size());
  for (int32_t id = 0; id < n; ++id) {
    if (tokenizer.is_special(id)) continue;
    bytes[static_cast<size_t>(id)] = tokenizer.token_bytes(id);
    const std::string& b = bytes[static_cast<size_t>(id)];
    if (b.size() == 1) single[static_cast<uint8_t>(b[0])] = true;
  }
  // What every state needs to go on: the structure, numbers, literals, escapes, a space.
  for (char c : std::string_view("{}[]\":,-+.0123456789eEtrufalsn\\ ")) {
    if (!single[static_cast<uint8_t>(c)]) {
      return make_error(
          fmt::format("JSON mode: the vocabulary has no token for the single byte '{}'", c));
    }
  }
  return std::make_unique<JsonConstraint>(std::move(bytes), std::move(eos));
}

JsonConstraint::JsonConstraint(std::vector<std::string> token_bytes, std::vector<int32_t> eos)
    : vocab_(static_cast<int>(token_bytes.size())),
      bytes_(std::move(token_bytes)),
      is_eos_(bytes_.size(), false) {
  for (int32_t id : eos) {
    if (id >= 0 && id < vocab_ && !is_eos_[static_cast<size_t>(id)]) {
      is_eos_[static_cast<size_t>(id)] = true;
      eos_.push_back(id);
    }
  }
  for (int32_t id : eos_) bytes_[static_cast<size_t>(id)].clear();  // no path in the trie
  build_trie();
}

void JsonConstraint::build_trie() {
  std::vector<int32_t> order;
  for (int32_t id = 0; id < vocab_; ++id) {
    if (!bytes_[static_cast<size_t>(id)].empty()) order.push_back(id);
  }
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const std::string& x = bytes_[static_cast<size_t>(a)];
    const std::string& y = bytes_[static_cast<size_t>(b)];
    return x != y ? x < y : a < b;
  });
  // Sorted strings give the trie in preorder: a string's nodes past its common prefix with the
  // one before are new, and a node's subtree ends where a later string leaves its prefix.
  std::vector<int32_t> path;  // nodes of the previous string's bytes
  std::string prev;
  auto close_to = [&](size_t len) {
    while (path.size() > len) {
      nodes_[static_cast<size_t>(path.back())].end = static_cast<int32_t>(nodes_.size());
      path.pop_back();
    }
  };
  for (int32_t id : order) {
    const std::string& s = bytes_[static_cast<size_t>(id)];
    size_t common = 0;
    while (common < s.size() && common < prev.size() && s[common] == prev[common]) ++common;
    close_to(common);
    for (size_t i = common; i < s.size(); ++i) {
      path.push_back(static_cast<int32_t>(nodes_.size()));
      nodes_.push_back(Node{static_cast<uint8_t>(s[i]), static_cast<uint16_t>(i + 1), 0,
                            static_cast<int32_t>(tokens_.size())});
    }
    tokens_.push_back(id);  // ends at path.back(), the newest node or (a repeat) the same one
    prev = s;
  }
  close_to(0);
  plain_before_.assign(nodes_.size() + 1, 0);
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const uint8_t b = nodes_[i].byte;
    const bool plain = b >= 0x20 && b < 0x7F && b != '"' && b != '\\';
    plain_before_[i + 1] = plain_before_[i] + (plain ? 1 : 0);
  }
}

int32_t JsonConstraint::first_token_at(int32_t node) const {
  return node < static_cast<int32_t>(nodes_.size()) ? nodes_[static_cast<size_t>(node)].first_token
                                                    : static_cast<int32_t>(tokens_.size());
}

JsonConstraint::Key JsonConstraint::key_of(const JsonState& s) {
  return Key{s.stack, uint64_t{s.depth} | uint64_t{s.mode} << 8 | uint64_t{s.aux} << 16 |
                          uint64_t{s.ws} << 24 | uint64_t{s.key} << 32};
}

std::vector<uint64_t> JsonConstraint::walk(const JsonState& s) const {
  std::vector<uint64_t> bits(static_cast<size_t>((vocab_ + 63) / 64), 0);
  auto allow = [&bits](int32_t id) { bits[static_cast<size_t>(id) / 64] |= 1ull << (id % 64); };
  bool any = false;
  if (s.complete()) {
    for (int32_t id : eos_) allow(id);
    if (eos_.empty()) std::fill(bits.begin(), bits.end(), ~0ull);
    return bits;
  }
  // states[d]: the state after a node's first d bytes (states[0] = s); a refused byte skips the
  // node's subtree.
  std::vector<JsonState> states(1, s);
  const int32_t n = static_cast<int32_t>(nodes_.size());
  auto allow_tokens = [&](int32_t first, int32_t last) {
    for (int32_t t = first; t < last; ++t) allow(tokens_[static_cast<size_t>(t)]);
    any = any || last > first;
  };
  for (int32_t i = 0; i < n;) {
    const Node& node = nodes_[static_cast<size_t>(i)];
    const JsonState& parent = states[node.depth - 1u];
    // Inside a string between characters, a subtree of plain bytes is taken whole.
    if (parent.mode == kString && parent.aux == 0 &&
        plain_before_[static_cast<size_t>(node.end)] - plain_before_[static_cast<size_t>(i)] ==
            node.end - i) {
      allow_tokens(node.first_token, first_token_at(node.end));
      i = node.end;
      continue;
    }
    JsonState next = parent;
    if (!next.advance(node.byte)) {
      i = node.end;
      continue;
    }
    if (states.size() <= node.depth) states.resize(node.depth + 1u);
    states[node.depth] = next;
    allow_tokens(node.first_token, first_token_at(i + 1));
    ++i;
  }
  if (!any) {
    for (int32_t id : eos_) allow(id);
  }
  return bits;
}

const std::vector<uint64_t>& JsonConstraint::allowed(const JsonState& s) {
  const Key k = key_of(s);
  auto it = cache_.find(k);
  if (it != cache_.end()) return it->second;
  if (cache_.size() >= 1024) cache_.clear();  // ~16 KiB per mask at a 128K vocabulary
  return cache_.emplace(k, walk(s)).first->second;
}

bool JsonConstraint::advance(JsonState& s, int32_t id) const {
  if (id < 0 || id >= vocab_) return false;
  if (is_eos_[static_cast<size_t>(id)]) return true;
  const std::string& b = bytes_[static_cast<size_t>(id)];
  if (b.empty()) return false;
  JsonState next = s;
  if (!next.advance(b)) return false;
  s = next;
  return true;
}

}  // namespace qs
