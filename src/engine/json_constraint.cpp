#include "engine/json_constraint.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "model/tokenizer/tokenizer.h"

namespace qs {

namespace {

enum Mode : uint8_t {
  kValue,     // whitespace, a value of `node`
  kObjFirst,  // after '{': whitespace, a key, '}'
  kObjKey,    // after ',' in an object: whitespace, a key
  kColon,     // after a key: whitespace, ':' (node: the value's)
  kArrFirst,  // after '[': whitespace, a value, ']'
  kAfter,     // after a value in a container: whitespace, ',', the container's closer
  kString,    // in a string (aux: UTF-8 continuation bytes still due, and their first's range)
  kEscape,    // after a backslash in a string
  kHex,       // in a \u escape (aux: hex digits still due)
  kLiteral,   // in a literal trie (trie: the bytes matched so far)
  kNumStart,  // before a number's first byte (only while number_byte reads it)
  kMinus,     // a number's '-'
  kZero,      // a number's leading 0
  kInt,       // a number's integer digits after a leading 1-9
  kDot,       // the '.' of a fraction
  kFrac,      // fraction digits
  kExp,       // 'e' / 'E'
  kExpSign,   // the exponent's sign
  kExpInt,    // exponent digits
  kDone,      // the document is complete
};

// Modes between tokens of the grammar, where whitespace may come.
bool takes_whitespace(uint8_t mode) {
  return mode <= kAfter;
}

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

// A string's count after one more character: only bounds make it count, and without maxLength
// it stops at minLength (only reaching it matters, and the states then repeat); -1 past
// maxLength.
int counted(const JsonNode& string, int count) {
  if (string.max_length < 0) return std::min(count + 1, string.min_length);
  return count < string.max_length ? count + 1 : -1;
}

// The character a short escape's letter stands for (\" \\ \/ \b \f \n \r \t).
uint8_t escaped_byte(uint8_t letter) {
  switch (letter) {
    case 'b':
      return '\b';
    case 'f':
      return '\f';
    case 'n':
      return '\n';
    case 'r':
      return '\r';
    case 't':
      return '\t';
    default:
      return letter;
  }
}

// An array's items started, as its frame keeps them: without maxItems only whether minItems is
// reached and which prefix item is due matter, so the count stops past both (the states of an
// array's items then repeat).
int32_t saturate(const JsonNode& array, int32_t count) {
  const auto prefix = static_cast<int32_t>(array.prefix_items.size());
  return array.max_items < 0 ? std::min(count, std::max(array.min_items, prefix)) : count;
}

// The node of an array's item `index` (0 the first); -1: none may come there.
int32_t item_node(const JsonNode& array, int32_t index) {
  return index < static_cast<int32_t>(array.prefix_items.size())
             ? array.prefix_items[static_cast<size_t>(index)]
             : array.items;
}

}  // namespace

bool JsonState::operator==(const JsonState& o) const {
  return bytes() == o.bytes();
}

void JsonState::assign(const JsonState& o) {
  n = o.n;
  std::copy_n(o.threads.begin(), o.n, threads.begin());
}

std::string_view JsonState::bytes() const {
  return {reinterpret_cast<const char*>(threads.data()), n * sizeof(JsonThread)};
}

// The threads a byte leaves, without repeats; past kJsonMaxThreads later ones are dropped.
class JsonRecognizer::Sink {
 public:
  explicit Sink(JsonState& s) : s_(s) { s_.n = 0; }
  void add(const JsonThread& t) {
    for (int i = 0; i < s_.n; ++i) {
      if (s_.threads[static_cast<size_t>(i)] == t) return;
    }
    if (s_.n < kJsonMaxThreads) s_.threads[s_.n++] = t;
  }

 private:
  JsonState& s_;
};

size_t JsonRecognizer::FrameHash::operator()(const Frame& f) const {
  uint64_t h = static_cast<uint32_t>(f.parent);
  h = h * 0x9e3779b97f4a7c15ull ^ static_cast<uint32_t>(f.node);
  h = h * 0x9e3779b97f4a7c15ull ^ static_cast<uint32_t>(f.index);
  h = h * 0x9e3779b97f4a7c15ull ^ static_cast<uint32_t>(f.depth);
  h = h * 0x9e3779b97f4a7c15ull ^ static_cast<uint64_t>(f.last);
  return static_cast<size_t>(h * 0x9e3779b97f4a7c15ull ^ static_cast<uint32_t>(f.members));
}

JsonRecognizer::JsonRecognizer(JsonGrammar grammar) : g_(std::move(grammar)) {}

JsonState JsonRecognizer::start() const {
  JsonState s;
  s.n = 1;
  s.threads[0].mode = kValue;
  s.threads[0].node = g_.root();
  return s;
}

int32_t JsonRecognizer::intern(const Frame& f) {
  auto [it, added] = frame_ids_.try_emplace(f, static_cast<int32_t>(frames_.size()));
  if (added) frames_.push_back(f);
  return it->second;
}

bool JsonRecognizer::push(JsonThread& t, int32_t node) {
  const int32_t depth = t.frame < 0 ? 1 : frame(t.frame).depth + 1;
  if (depth > kJsonMaxDepth) return false;
  t.frame = intern(Frame{t.frame, node, 0, depth});
  return true;
}

void JsonRecognizer::set_index(JsonThread& t, int32_t index) {
  Frame f = frame(t.frame);
  f.index = index;
  t.frame = intern(f);
}

void JsonRecognizer::end_value(JsonThread t, uint8_t c, bool reread, Sink& out) {
  JsonThread after;  // only the open containers carry over
  after.frame = t.frame;
  after.mode = t.frame < 0 ? kDone : kAfter;
  if (reread) {
    step(after, c, out);  // the byte that ended a number or a literal comes after it
  } else {
    out.add(after);
  }
}

void JsonRecognizer::start_value(JsonThread t, int32_t id, uint8_t c, Sink& out) {
  using Kind = JsonNode::Kind;
  const JsonNode& n = g_.node(id);
  switch (n.kind) {
    case Kind::kUnion:
      for (int32_t alt : n.alternatives) start_value(t, alt, c, out);
      return;
    case Kind::kObject:
    case Kind::kArray:
      if (c != (n.kind == Kind::kObject ? '{' : '[') || !push(t, id)) return;
      t.mode = n.kind == Kind::kObject ? kObjFirst : kArrFirst;
      break;
    case Kind::kString:
      if (c != '"') return;
      t.mode = kString;
      t.node = id;
      t.pattern = n.pattern >= 0 ? static_cast<uint16_t>(g_.pattern(n.pattern).start() + 1) : 0;
      break;
    case Kind::kNumber:
    case Kind::kInteger:
      // (value, count, frac and aux are 0 here: a reading due a value carries only its frame and
      // node, as end_value and end_key leave it.)
      t.mode = kNumStart;
      t.node = id;
      return number_byte(t, c, out);
    case Kind::kLiterals:
      t.mode = kLiteral;
      t.node = id;
      return enter_trie(t, g_.child(n.trie, c), out);
  }
  out.add(t);
}

void JsonRecognizer::enter_trie(JsonThread t, int32_t next, Sink& out) {
  if (next < 0 || !unique_allows(t, next)) return;
  const JsonTrieNode& at = g_.trie(next);
  if (at.value >= 0 && at.edges.empty()) return end_literal(t, next, 0, false, out);  // the end
  t.trie = next;
  out.add(t);
}

bool JsonRecognizer::unique_allows(const JsonThread& t, int32_t next) const {
  if (t.frame < 0) return true;
  const Frame& f = frame(t.frame);
  const JsonNode& a = g_.node(f.node);
  if (!a.unique) return true;
  // The largest value this item (the f.index-th, saturated at minItems) may take.
  const auto values = std::ssize(g_.trie(g_.node(a.items).trie).below);
  const int64_t most = values - 1 - std::max(0, a.min_items - f.index);
  const std::vector<int32_t>& below = g_.trie(next).below;
  const auto it = std::upper_bound(below.begin(), below.end(), f.last);
  return it != below.end() && *it <= most;
}

void JsonRecognizer::keep_item(JsonThread& t, int64_t value) {
  if (t.frame < 0 || !g_.node(frame(t.frame).node).unique) return;
  Frame f = frame(t.frame);
  f.last = value;
  t.frame = intern(f);
}

void JsonRecognizer::end_literal(JsonThread t, int32_t at, uint8_t c, bool reread, Sink& out) {
  keep_item(t, g_.trie(at).value);
  end_value(t, c, reread, out);
}

std::pair<int32_t, int32_t> JsonRecognizer::next_properties(const Frame& f) const {
  const JsonNode& o = g_.node(f.node);
  const auto count = static_cast<int32_t>(o.properties.size());
  if (f.index >= count) return {1, 0};
  int32_t first = f.index, last = o.last_may[static_cast<size_t>(f.index)];
  if (o.max_properties >= 0) {
    while (first <= last &&
           f.members + 1 + o.required_from[static_cast<size_t>(first) + 1] > o.max_properties) {
      ++first;
    }
  }
  if (o.additional < 0) last = std::min(last, count + f.members - o.min_properties);
  return {first, last};
}

bool JsonRecognizer::other_key_fits(const Frame& f) const {
  const JsonNode& o = g_.node(f.node);
  return o.additional >= 0 &&
         (o.max_properties < 0 ||
          f.members + 1 + o.required_from[static_cast<size_t>(f.index)] <= o.max_properties);
}

bool JsonRecognizer::key_may_come(const Frame& f) const {
  const auto [first, last] = next_properties(f);
  return first <= last || other_key_fits(f);
}

void JsonRecognizer::start_key(JsonThread t, Sink& out) {
  const Frame& f = frame(t.frame);
  const JsonNode& o = g_.node(f.node);
  if (!key_may_come(f)) return;
  t.mode = kString;
  t.key = 1;
  t.trie = o.keys;  // -1 without properties
  out.add(t);
}

bool JsonRecognizer::key_byte(JsonThread& t, uint8_t c) const {
  const Frame& f = frame(t.frame);
  const JsonNode& o = g_.node(f.node);
  const int32_t next = t.trie >= 0 ? g_.child(t.trie, c) : -1;
  if (!other_key_fits(f)) {
    // Only the names of the properties that may come next.
    if (next < 0) return false;
    const std::vector<int32_t>& below = g_.trie(next).below;
    const auto [first, last] = next_properties(f);
    auto it = std::lower_bound(below.begin(), below.end(), first);
    if (it == below.end() || *it > last) return false;
  } else if (next < 0 && c == '\\' && o.keys >= 0) {
    return false;  // other keys are spelled without escapes, so none spells a listed name
  }
  t.trie = next;
  return true;
}

void JsonRecognizer::end_key(JsonThread t, Sink& out) {
  Frame f = frame(t.frame);
  const JsonNode& o = g_.node(f.node);
  const int32_t j = t.trie >= 0 ? g_.trie(t.trie).value : -1;
  if (j >= 0) {
    // A listed name: only in its turn (the properties come in their order, each once).
    const auto [first, last] = next_properties(f);
    if (j < first || j > last) return;
    f.index = j + 1;
    t.node = o.properties[static_cast<size_t>(j)].value;
  } else {
    if (!other_key_fits(f)) return;
    t.node = o.additional;
  }
  if (o.min_properties > 0 || o.max_properties >= 0) {  // counted as far as it tells states apart
    f.members = o.max_properties >= 0 ? f.members + 1 : std::min(f.members + 1, o.min_properties);
  }
  t.frame = intern(f);
  t.mode = kColon;
  t.key = 0;
  t.trie = -1;
  t.aux = 0;
  out.add(t);
}

bool JsonRecognizer::pattern_byte(JsonThread& t, uint8_t c) const {
  if (t.pattern == 0) return true;
  const JsonNode& n = g_.node(t.node);
  const int32_t next = g_.pattern(n.pattern).next(t.pattern - 1, c);
  // With length bounds, the characters so far (t.count, this one's included) must leave room
  // for a match of an allowed length.
  if (next < 0 || (n.lengths >= 0 && !g_.lengths(n.lengths).viable(next, t.count))) return false;
  t.pattern = static_cast<uint16_t>(next + 1);
  return true;
}

bool JsonRecognizer::pattern_escapes(const JsonThread& t) const {
  if (t.pattern == 0) return true;
  for (uint8_t letter : {'"', '\\', '/', 'b', 'f', 'n', 'r', 't'}) {
    JsonThread u = t;
    if (pattern_byte(u, escaped_byte(letter))) return true;
  }
  return false;
}

void JsonRecognizer::string_byte(JsonThread t, uint8_t c, Sink& out) {
  if ((t.aux & 3) != 0) {
    if (!continuation_ok(t.aux, c) || (t.key && !key_byte(t, c)) || !pattern_byte(t, c)) return;
    t.aux = static_cast<uint8_t>((t.aux & 3) - 1);  // later continuation bytes: any range
    out.add(t);
    return;
  }
  if (c == '"') {
    if (t.key) return end_key(t, out);
    const JsonNode& n = g_.node(t.node);
    if (t.count < n.min_length) return;
    if (t.pattern != 0 && !g_.pattern(n.pattern).accepts(t.pattern - 1)) return;
    return end_value(t, c, false, out);
  }
  if (c < 0x20) return;
  const uint8_t aux = c < 0x80 ? 0 : lead_aux(c);
  if (c >= 0x80 && aux == 0) return;
  if (t.key) {
    if (!key_byte(t, c)) return;
  } else {  // a character starts
    const int count = counted(g_.node(t.node), t.count);
    if (count < 0) return;
    t.count = static_cast<uint16_t>(count);
  }
  // An escape steps the pattern by the character it stands for, once its letter comes: a
  // backslash is taken only if some escape's character continues the pattern.
  if (c == '\\' ? !pattern_escapes(t) : !pattern_byte(t, c)) return;
  if (c == '\\') t.mode = kEscape;
  t.aux = aux;
  out.add(t);
}

namespace {

// A bounded number's integer magnitude past every finite bound (digits beyond it change nothing).
constexpr int64_t kClampedMagnitude = 2 * kJsonMaxBound;
constexpr uint8_t kNegative = 1;  // JsonThread::aux of a number
constexpr uint8_t kBeyond = 2;    // ... a nonzero fraction digit past the first kJsonUnitDigits

bool bounded(const JsonNode& n) {
  return (n.kind == JsonNode::Kind::kInteger || n.kind == JsonNode::Kind::kNumber) &&
         (n.minimum != -kJsonNoBound || n.maximum != kJsonNoBound);
}

// The magnitudes, in units, a rule's bounds allow a number of t's sign: [lo, hi].
struct Magnitudes {
  JsonScaled lo, hi;
};
Magnitudes magnitudes(const NumberRule& r, const JsonThread& t) {
  if (t.aux & kNegative) return {-r.maximum, -r.minimum};
  return {r.minimum, r.maximum};
}

JsonScaled whole_units(const JsonThread& t) {
  return JsonScaled{t.value} * kJsonUnit;
}

// Whether [a, b] (magnitudes in units, a >= 0) holds one that r allows a number of m's sign:
// within its bounds and, with multipleOf, a multiple of it.
bool holds_allowed(const NumberRule& r, const Magnitudes& m, JsonScaled a, JsonScaled b) {
  a = std::max(a, m.lo);
  b = std::min(b, m.hi);
  if (a > b) return false;
  return r.multiple == 0 || json_ceil_div(a, r.multiple) * r.multiple <= b;
}

// Whether a number that ends here is one r allows (bounds, multipleOf).
bool number_allowed(const NumberRule& r, const JsonThread& t) {
  const Magnitudes m = magnitudes(r, t);
  const JsonScaled v = whole_units(t) + (t.mode == kFrac ? t.frac : 0);
  // Digits past the first kJsonUnitDigits that are not all 0: strictly between v and v + 1, so
  // no multiple of a unit.
  if (t.mode == kFrac && (t.aux & kBeyond)) return r.multiple == 0 && v >= m.lo && v + 1 <= m.hi;
  return holds_allowed(r, m, v, v);
}

// Whether a bounded number read up to t (in t.mode) can still end as one n allows. What its
// magnitude can still become, in units: after integer digits P (kInt) P followed by j more digits
// and any fraction, [P 10^j, (P + 1) 10^j) for every j >= 0; after a leading 0 or the '.' only
// j = 0; after fraction digits F (k of them) [P.F, P.F + 10^-k). Bounds, multiples and those ends
// are whole units, so an interval that holds an allowed value holds one of at most
// kJsonUnitDigits fraction digits the text can still become.
bool number_viable(const NumberRule& r, const JsonThread& t) {
  const Magnitudes m = magnitudes(r, t);
  const JsonScaled whole = whole_units(t);
  switch (t.mode) {
    case kMinus:
      return holds_allowed(r, m, 0, m.hi);
    case kZero:
    case kDot:
      return holds_allowed(r, m, whole, whole + kJsonUnit - 1);
    case kInt:
      for (JsonScaled a = whole, b = whole + kJsonUnit; a <= m.hi; a *= 10, b *= 10) {
        if (holds_allowed(r, m, a, b - 1)) return true;
      }
      return false;
    case kFrac: {
      if (t.count > kJsonUnitDigits) return number_allowed(r, t);  // no new digit moves it
      JsonScaled width = 1;
      for (int i = t.count; i < kJsonUnitDigits; ++i) width *= 10;
      const JsonScaled v = whole + t.frac;
      return holds_allowed(r, m, v, v + width - 1);
    }
    default:
      return true;
  }
}

}  // namespace

NumberRule JsonRecognizer::number_rule(const JsonThread& t) const {
  const JsonNode& n = g_.node(t.node);
  NumberRule r{n.minimum, n.maximum, n.multiple};
  if (t.frame < 0) return r;
  const Frame& f = frame(t.frame);
  const JsonNode& a = g_.node(f.node);
  if (!a.unique) return r;
  // An item of a unique array of integers: past the last one, with room below the maximum for
  // the items minItems still asks after it.
  if (f.last != kNoItem) r.minimum = std::max(r.minimum, (JsonScaled{f.last} + 1) * kJsonUnit);
  r.maximum -= n.integer_step() * std::max(0, a.min_items - f.index);
  return r;
}

void JsonRecognizer::end_number(JsonThread t, uint8_t c, Sink& out) {
  keep_item(t, (t.aux & kNegative) ? -t.value : t.value);
  end_value(t, c, true, out);
}

bool JsonRecognizer::item_may_start(const JsonThread& t, int32_t item) const {
  const JsonNode& a = g_.node(frame(t.frame).node);
  if (!a.unique) return true;
  const JsonNode& n = g_.node(item);
  if (n.kind == JsonNode::Kind::kLiterals) return unique_allows(t, n.trie);
  JsonThread u = t;
  u.node = item;
  const NumberRule r = number_rule(u);
  return json_ceil_div(r.minimum, n.integer_step()) * n.integer_step() <= r.maximum;
}

void JsonRecognizer::number_byte(JsonThread t, uint8_t c, Sink& out) {
  const JsonNode& n = g_.node(t.node);
  const bool integer = n.kind == JsonNode::Kind::kInteger;
  const bool checked = bounded(n);  // then also no exponent: a decimal whose value is tracked
  const NumberRule rule = number_rule(t);
  // On to `mode`, where the number can still end as one the rule allows.
  auto to = [&](uint8_t mode) {
    t.mode = mode;
    if (!checked || number_viable(rule, t)) out.add(t);
  };
  // A digit of the integer part, into `mode` (kZero: a leading 0).
  auto integer_digit = [&](uint8_t mode) {
    if (checked) {
      const __int128 p = static_cast<__int128>(t.value) * 10 + (c - '0');
      t.value = static_cast<int64_t>(std::min<__int128>(p, kClampedMagnitude));
    }
    to(mode);
  };
  auto fraction_digit = [&] {
    if (checked) {
      if (t.count < kJsonUnitDigits) {
        uint32_t place = 1;
        for (int i = t.count + 1; i < kJsonUnitDigits; ++i) place *= 10;
        t.frac += static_cast<uint32_t>(c - '0') * place;
        ++t.count;
      } else {
        if (c != '0') t.aux |= kBeyond;
        t.count = kJsonUnitDigits + 1;
      }
    }
    to(kFrac);
  };
  const bool exponent = !checked && (c == 'e' || c == 'E');
  switch (t.mode) {
    case kNumStart:
      if (c == '-') {
        t.aux = kNegative;
        return to(kMinus);
      }
      [[fallthrough]];
    case kMinus:
      if (c == '0') return integer_digit(kZero);
      if (c >= '1' && c <= '9') integer_digit(kInt);
      return;
    case kZero:
    case kInt:
      if (t.mode == kInt && is_digit(c)) return integer_digit(kInt);
      if (!integer && c == '.') return to(kDot);
      if (!integer && exponent) return to(kExp);
      if (checked && !number_allowed(rule, t)) return;
      return end_number(t, c, out);
    case kDot:
      if (is_digit(c)) fraction_digit();
      return;
    case kFrac:
      if (is_digit(c)) return fraction_digit();
      if (exponent) return to(kExp);
      if (checked && !number_allowed(rule, t)) return;
      return end_value(t, c, true, out);
    case kExp:
      if (c == '+' || c == '-') return to(kExpSign);
      [[fallthrough]];
    case kExpSign:
      if (is_digit(c)) to(kExpInt);
      return;
    case kExpInt:
      if (is_digit(c)) return to(kExpInt);
      return end_value(t, c, true, out);
    default:
      return;
  }
}

void JsonRecognizer::literal_byte(JsonThread t, uint8_t c, Sink& out) {
  enter_trie(t, g_.child(t.trie, c), out);
  if (g_.trie(t.trie).value >= 0) end_literal(t, t.trie, c, true, out);  // it ended before `c`
}

void JsonRecognizer::close(JsonThread t, uint8_t c, Sink& out) {
  if (t.frame < 0) return;
  const Frame f = frame(t.frame);
  const JsonNode& n = g_.node(f.node);
  if (c == '}') {
    if (n.kind != JsonNode::Kind::kObject || f.index <= n.last_required ||
        f.members < n.min_properties) {
      return;
    }
  } else if (n.kind != JsonNode::Kind::kArray || f.index < n.min_items) {
    return;
  }
  t.frame = f.parent;
  end_value(t, c, false, out);
}

void JsonRecognizer::next_member(JsonThread t, Sink& out) {
  const Frame f = frame(t.frame);
  const JsonNode& n = g_.node(f.node);
  if (n.kind == JsonNode::Kind::kObject) {
    if (!key_may_come(f)) return;
    t.mode = kObjKey;
  } else {
    if (n.max_items >= 0 && f.index >= n.max_items) return;
    const int32_t item = item_node(n, f.index);
    if (item < 0) return;
    set_index(t, saturate(n, f.index + 1));
    if (!item_may_start(t, item)) return;  // no value left for a unique item
    t.mode = kValue;
    t.node = item;
  }
  out.add(t);
}

void JsonRecognizer::step(JsonThread t, uint8_t c, Sink& out) {
  if (is_ws(c) && takes_whitespace(t.mode)) {
    if (t.ws >= kJsonMaxWhitespace) return;
    ++t.ws;
    out.add(t);
    return;
  }
  t.ws = 0;
  auto to = [&](uint8_t mode) {
    t.mode = mode;
    out.add(t);
  };
  switch (t.mode) {
    case kValue: {
      const int32_t node = t.node;
      t.node = -1;
      return start_value(t, node, c, out);
    }
    case kObjFirst:
      if (c == '}') return close(t, c, out);
      [[fallthrough]];
    case kObjKey:
      if (c == '"') start_key(t, out);
      return;
    case kColon:
      if (c == ':') to(kValue);
      return;
    case kArrFirst: {
      if (c == ']') return close(t, c, out);
      const JsonNode& a = g_.node(frame(t.frame).node);
      if (a.max_items == 0 || item_node(a, 0) < 0) return;
      set_index(t, saturate(a, 1));
      return start_value(t, item_node(a, 0), c, out);
    }
    case kAfter:
      if (c == ',') return next_member(t, out);
      if (c == '}' || c == ']') return close(t, c, out);
      return;
    case kString:
      return string_byte(t, c, out);
    case kEscape:
      if (c != 'u' && c != '"' && c != '\\' && c != '/' && c != 'b' && c != 'f' && c != 'n' &&
          c != 'r' && c != 't') {
        return;
      }
      if (t.key && !key_byte(t, c)) return;
      if (t.pattern != 0) {  // no \u escapes where a pattern reads the characters
        if (c == 'u' || !pattern_byte(t, escaped_byte(c))) return;
      }
      t.aux = c == 'u' ? 4 : 0;
      return to(c == 'u' ? kHex : kString);
    case kHex:
      if (!is_hex(c) || (t.key && !key_byte(t, c))) return;
      --t.aux;
      return to(t.aux == 0 ? kString : kHex);
    case kLiteral:
      return literal_byte(t, c, out);
    case kMinus:
    case kZero:
    case kInt:
    case kDot:
    case kFrac:
    case kExp:
    case kExpSign:
    case kExpInt:
      return number_byte(t, c, out);
    default:
      return;  // kDone: nothing follows
  }
}

bool JsonRecognizer::advance_into(const JsonState& from, uint8_t c, JsonState& to) {
  QS_CHECK(&from != &to);
  Sink out(to);
  for (int i = 0; i < from.n; ++i) step(from.threads[static_cast<size_t>(i)], c, out);
  return to.n > 0;
}

bool JsonRecognizer::advance(JsonState& s, uint8_t c) {
  if (!advance_into(s, c, scratch_)) return false;
  s.assign(scratch_);
  return true;
}

bool JsonRecognizer::advance(JsonState& s, std::string_view bytes) {
  for (char c : bytes) {
    if (!advance(s, static_cast<uint8_t>(c))) return false;
  }
  return true;
}

bool JsonRecognizer::accepting(const JsonState& s) const {
  for (int i = 0; i < s.n; ++i) {
    const JsonThread& t = s.threads[static_cast<size_t>(i)];
    if (t.mode == kDone) return true;
    if (t.frame >= 0) continue;
    // A number or a literal at the top level ends with the text.
    if (t.mode == kZero || t.mode == kInt || t.mode == kFrac) {
      if (!bounded(g_.node(t.node)) || number_allowed(number_rule(t), t)) return true;
    }
    if (t.mode == kExpInt) return true;
    if (t.mode == kLiteral && g_.trie(t.trie).value >= 0) return true;
  }
  return false;
}

bool JsonRecognizer::finished(const JsonState& s) const {
  for (int i = 0; i < s.n; ++i) {
    if (s.threads[static_cast<size_t>(i)].mode != kDone) return false;
  }
  return s.n > 0;
}

namespace {

constexpr std::array<uint8_t, 256> group_table() {
  std::array<uint8_t, 256> t{};
  for (int b = 0; b < 256; ++b)
    t[static_cast<size_t>(b)] = static_cast<uint8_t>(byte_group(static_cast<uint8_t>(b)));
  return t;
}
constexpr std::array<uint8_t, 256> kGroup = group_table();

bool is_plain(uint8_t b) {
  return kGroup[b] != 0;
}
bool loops_on(ByteGroups loops, uint8_t b) {
  return (loops >> kGroup[b]) & 1u;
}

}  // namespace

ByteGroups JsonRecognizer::loops(const JsonState& s) const {
  if (s.n != 1) return 0;
  const JsonThread& t = s.threads[0];
  if (t.mode != kString || (t.aux & 3) != 0) return 0;
  if (t.key) {
    const bool other_keys = t.trie < 0 && other_key_fits(frame(t.frame));
    return other_keys ? kPlainGroups : 0;
  }
  const JsonNode& n = g_.node(t.node);
  if (t.pattern != 0) {  // (with length bounds, only where the count changes nothing)
    const bool counts = n.lengths >= 0 && !g_.lengths(n.lengths).idle(t.count, horizon_);
    if (counts) return 0;
    return alike_loops_.empty() ? g_.pattern(n.pattern).loops(t.pattern - 1)
                                : alike_loops_[static_cast<size_t>(n.pattern)][t.pattern - 1u];
  }
  return counted(n, t.count) == t.count ? kPlainGroups : 0;
}

JsonRecognizer::PlainStep JsonRecognizer::plain_step(const JsonState& s) const {
  if (s.n != 1) return kOther;
  const JsonThread& t = s.threads[0];
  if (t.mode != kString || (t.aux & 3) != 0 || t.key) return kOther;
  if (t.pattern != 0) return kSteps;
  return counted(g_.node(t.node), t.count) > t.count ? kCounts : kOther;
}

bool JsonRecognizer::plain_pattern_step(JsonThread& t, uint8_t c) const {
  const int count = counted(g_.node(t.node), t.count);
  if (count < 0) return false;
  t.count = static_cast<uint16_t>(count);
  return pattern_byte(t, c);
}

void JsonRecognizer::set_horizon(int bytes) {
  horizon_ = bytes;
  alike_.clear();
  alike_loops_.clear();
  for (size_t p = 0; p < g_.patterns(); ++p) {
    const JsonPattern& pattern = g_.pattern(static_cast<int32_t>(p));
    alike_.push_back(pattern.alike_within(bytes));
    alike_loops_.push_back(pattern.loops_among(alike_.back()));
  }
}

void JsonRecognizer::merge_alike(JsonState& s) const {
  for (int i = 0; i < s.n; ++i) {
    JsonThread& t = s.threads[static_cast<size_t>(i)];
    if (t.key || (t.mode != kString && t.mode != kEscape && t.mode != kHex)) continue;
    const JsonNode& n = g_.node(t.node);
    // A character that fits and a closing quote are both taken: as at minLength. (A pattern's
    // lengths also need room for its way to a match.)
    const bool idle =
        t.pattern != 0
            ? n.lengths >= 0 && g_.lengths(n.lengths).idle(t.count, horizon_)
            : n.max_length >= 0 && t.count >= n.min_length && t.count + horizon_ <= n.max_length;
    if (idle) t.count = static_cast<uint16_t>(n.min_length);
    if (t.pattern != 0 && (n.lengths < 0 || idle) && !alike_.empty()) {
      t.pattern = static_cast<uint16_t>(alike_[static_cast<size_t>(n.pattern)][t.pattern - 1u] + 1);
    }
  }
}

int JsonRecognizer::plain_room(const JsonState& s) const {
  constexpr int kAny = 1 << 30;
  int room = 0;
  for (int i = 0; i < s.n; ++i) {
    const JsonThread& t = s.threads[static_cast<size_t>(i)];
    if (t.mode != kString || (t.aux & 3) != 0 || t.pattern != 0) continue;
    if (t.key) {  // a key outside the listed names (only where other keys may come)
      if (other_key_fits(frame(t.frame))) room = kAny;
    } else {
      const int max = g_.node(t.node).max_length;
      room = std::max(room, max < 0 ? kAny : max - t.count);
    }
  }
  return room;
}

Result<std::shared_ptr<const JsonVocab>> JsonVocab::create(const Tokenizer& tokenizer, int vocab,
                                                           std::vector<int32_t> eos) {
  std::vector<std::string> bytes(static_cast<size_t>(vocab));
  const int n = std::min(vocab, tokenizer.vocab_size());
  for (int32_t id = 0; id < n; ++id) {
    if (!tokenizer.is_special(id)) bytes[static_cast<size_t>(id)] = tokenizer.token_bytes(id);
  }
  auto made = std::make_shared<const JsonVocab>(std::move(bytes), std::move(eos));
  // What every document needs to go on: the structure, numbers, literals, escapes, a space.
  const int missing = made->missing_byte("{}[]\":,-+.0123456789eEtrufalsn\\ ");
  if (missing >= 0) {
    return make_error(fmt::format("JSON mode: the vocabulary has no token for the single byte '{}'",
                                  static_cast<char>(missing)));
  }
  return made;
}

JsonVocab::JsonVocab(std::vector<std::string> token_bytes, std::vector<int32_t> eos)
    : vocab_(static_cast<int>(token_bytes.size())),
      bytes_(std::move(token_bytes)),
      is_eos_(bytes_.size(), false),
      single_(256, false) {
  for (int32_t id : eos) {
    if (id >= 0 && id < vocab_ && !is_eos_[static_cast<size_t>(id)]) {
      is_eos_[static_cast<size_t>(id)] = true;
      eos_.push_back(id);
    }
  }
  for (int32_t id : eos_) bytes_[static_cast<size_t>(id)].clear();  // no path in the trie
  for (const std::string& b : bytes_) {
    if (b.size() == 1) single_[static_cast<uint8_t>(b[0])] = true;
  }
  build_trie();
}

int JsonVocab::missing_byte(std::string_view needed) const {
  for (char c : needed) {
    if (!single_[static_cast<uint8_t>(c)]) return static_cast<uint8_t>(c);
  }
  return -1;
}

void JsonVocab::build_trie() {
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
      nodes_.push_back(Node{static_cast<uint8_t>(s[i]), static_cast<uint16_t>(i + 1), 0, 0,
                            static_cast<int32_t>(tokens_.size())});
    }
    tokens_.push_back(id);  // ends at path.back(), the newest node or (a repeat) the same one
    longest_ = std::max(longest_, static_cast<int>(s.size()));
    prev = s;
  }
  close_to(0);
  // A subtree's deepest node: its own depth or its children's subtrees' (each child is visited
  // once, as the next node after its elder sibling's subtree).
  for (size_t i = nodes_.size(); i-- > 0;) {
    Node& node = nodes_[i];
    node.deepest = node.depth;
    for (int32_t j = static_cast<int32_t>(i) + 1; j < node.end;
         j = nodes_[static_cast<size_t>(j)].end) {
      node.deepest = std::max(node.deepest, nodes_[static_cast<size_t>(j)].deepest);
    }
  }
  // Each subtree's bytes: its node's and its children's subtrees' (visited as above).
  subtree_groups_.assign(nodes_.size(), 0);
  for (size_t i = nodes_.size(); i-- > 0;) {
    ByteGroups& set = subtree_groups_[i];
    set = ByteGroups{1} << kGroup[nodes_[i].byte];
    for (int32_t j = static_cast<int32_t>(i) + 1; j < nodes_[i].end;
         j = nodes_[static_cast<size_t>(j)].end) {
      set |= subtree_groups_[static_cast<size_t>(j)];
    }
  }
}

Result<std::unique_ptr<JsonConstraint>> JsonConstraint::create(
    std::shared_ptr<const JsonVocab> vocab, JsonGrammar grammar) {
  const int missing = vocab->missing_byte(grammar.literal_bytes());
  if (missing >= 0) {
    return make_error(fmt::format(
        "json_schema: the vocabulary has no token for the single byte 0x{:02x} of a property name "
        "or an enum / const value",
        missing));
  }
  return std::make_unique<JsonConstraint>(std::move(vocab), std::move(grammar));
}

JsonConstraint::JsonConstraint(std::shared_ptr<const JsonVocab> vocab, JsonGrammar grammar)
    : vocab_(std::move(vocab)), rec_(std::move(grammar)) {
  size_t depth = 1;
  for (const JsonVocab::Node& node : vocab_->nodes()) depth = std::max<size_t>(depth, node.depth);
  states_.resize(depth + 1);
  reaches_.resize(depth + 1);
  rec_.set_horizon(vocab_->longest());
}

void JsonConstraint::reach(size_t depth) {
  const JsonState& s = states_[depth];
  Reach& r = reaches_[depth];
  r.room = rec_.plain_room(s);
  r.step = rec_.plain_step(s);
  r.loops = rec_.loops(s);
  r.takes = r.room > 0 || r.loops != 0;
}

std::vector<uint64_t> JsonConstraint::walk(const JsonState& s) {
  const int vocab = vocab_->vocab();
  std::vector<uint64_t> bits(static_cast<size_t>((vocab + 63) / 64), 0);
  // (Raw pointers: writes to the mask's words could otherwise alias the vocabulary's arrays.)
  uint64_t* words = bits.data();
  auto allow = [words](int32_t id) { words[id / 64] |= uint64_t{1} << (id % 64); };
  auto allow_eos = [&] {
    for (int32_t id : vocab_->eos()) allow(id);
  };
  if (rec_.finished(s)) {
    allow_eos();
    if (vocab_->eos().empty()) std::fill(bits.begin(), bits.end(), ~0ull);
    return bits;
  }
  bool any = false;
  if (rec_.accepting(s)) allow_eos();
  // states_[d]: the state after a node's first d bytes (states_[0] = s); a refused byte skips
  // the node's subtree.
  states_[0].assign(s);
  reach(0);
  const JsonVocab::Node* nodes = vocab_->nodes().data();
  const int32_t* tokens = vocab_->tokens().data();
  const ByteGroups* subtree = vocab_->subtree_groups().data();
  const auto n = static_cast<int32_t>(vocab_->nodes().size());
  const JsonVocab& trie = *vocab_;
  auto allow_tokens = [&](int32_t first, int32_t last) {
    for (int32_t t = first; t < last; ++t) allow(tokens[t]);
    any = any || last > first;
  };
  for (int32_t i = 0; i < n;) {
    const JsonVocab::Node& node = nodes[i];
    const size_t d = node.depth;
    const JsonState& parent = states_[d - 1];
    const Reach& from = reaches_[d - 1];
    // A subtree of bytes that leave the state as it is, or of plain bytes inside a string with
    // room for its longest token, is taken whole.
    if (from.takes && ((subtree[i] & ~from.loops) == 0 ||
                       (node.deepest - node.depth < from.room && (subtree[i] & 1u) == 0))) {
      allow_tokens(node.first_token, trie.first_token_at(node.end));
      i = node.end;
      continue;
    }
    if (loops_on(from.loops, node.byte)) {  // the byte changes nothing
      states_[d].assign(parent);
      reaches_[d] = from;
    } else if (from.step != JsonRecognizer::kOther && is_plain(node.byte)) {
      states_[d].assign(parent);
      JsonThread& t = states_[d].threads[0];
      if (from.step == JsonRecognizer::kCounts) {
        ++t.count;
      } else if (!rec_.plain_pattern_step(t, node.byte)) {
        i = node.end;
        continue;
      }
      reach(d);
    } else if (rec_.advance_into(parent, node.byte, states_[d])) {
      reach(d);
    } else {
      i = node.end;
      continue;
    }
    allow_tokens(node.first_token, trie.first_token_at(i + 1));
    ++i;
  }
  if (!any) allow_eos();
  return bits;
}

const std::vector<uint64_t>& JsonConstraint::allowed(const JsonState& s) {
  // A bounded string's characters are each a state of its own, but where every token fits they
  // all allow the same tokens: one mask serves them.
  key_state_.assign(s);
  rec_.merge_alike(key_state_);
  std::string key(key_state_.bytes());
  auto it = cache_.find(key);
  if (it != cache_.end()) return it->second;
  if (cache_.size() >= 1024) cache_.clear();  // ~16 KiB per mask at a 128K vocabulary
  return cache_.emplace(std::move(key), walk(key_state_)).first->second;
}

bool JsonConstraint::advance(JsonState& s, int32_t id) {
  if (id < 0 || id >= vocab_->vocab()) return false;
  if (vocab_->is_eos(id)) return true;
  const std::string& b = vocab_->bytes(id);
  if (b.empty()) return false;
  token_state_.assign(s);
  if (!rec_.advance(token_state_, b)) return false;
  s.assign(token_state_);
  return true;
}

}  // namespace qs
