#include "engine/json_pattern.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <limits>
#include <map>
#include <numeric>
#include <set>

#include "model/tokenizer/unicode.h"

namespace qs {

namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr int kMaxRepeat = 1000;  // {n,m} counts
constexpr size_t kMaxNfaStates = 200000;

// A set of code points: sorted, disjoint, non-adjacent inclusive ranges.
using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

Ranges normalized(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (const auto& [lo, hi] : r) {
    if (!out.empty() && lo <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, hi);
    } else {
      out.emplace_back(lo, hi);
    }
  }
  return out;
}

Ranges complement(const Ranges& r) {
  Ranges out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : r) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.emplace_back(next, kMaxCodePoint);
  return out;
}

// What a JSON string can carry as the model writes it: no surrogates, and of the control
// characters only those with a short escape (\b \t \n \f \r).
const Ranges& expressible() {
  static const Ranges r = {{0x08, 0x0A}, {0x0C, 0x0D}, {0x20, 0xD7FF}, {0xE000, kMaxCodePoint}};
  return r;
}

Ranges intersect(const Ranges& a, const Ranges& b) {
  Ranges out;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const uint32_t lo = std::max(a[i].first, b[j].first);
    const uint32_t hi = std::min(a[i].second, b[j].second);
    if (lo <= hi) out.emplace_back(lo, hi);
    (a[i].second < b[j].second ? i : j)++;
  }
  return out;
}

const Ranges kDigit = {{'0', '9'}};
const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const Ranges kSpace = {{0x09, 0x0D},     {0x20, 0x20},     {0xA0, 0xA0},     {0x1680, 0x1680},
                       {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F},
                       {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
const Ranges kLineEnds = {{0x0A, 0x0A}, {0x0D, 0x0D}, {0x2028, 0x2029}};

// The UTF-8 of the code points [lo, hi] (no surrogates in it) as sequences of byte ranges, each
// position's bytes any of its range.
using ByteSeq = std::vector<std::pair<uint8_t, uint8_t>>;
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<ByteSeq>& out) {
  if (lo > hi) return;
  for (uint32_t bound : {0x7Fu, 0x7FFu, 0xFFFFu}) {  // one encoded length at a time
    if (lo <= bound && bound < hi) {
      utf8_sequences(lo, bound, out);
      utf8_sequences(bound + 1, hi, out);
      return;
    }
  }
  const int n = static_cast<int>(unicode::to_utf8(lo).size());
  // Split until every byte after the first differing one spans its whole continuation range.
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_sequences(lo, lo | m, out);
        utf8_sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_sequences(lo, (hi & ~m) - 1, out);
        utf8_sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  const std::string a = unicode::to_utf8(lo), b = unicode::to_utf8(hi);
  ByteSeq seq;
  for (size_t i = 0; i < a.size(); ++i) {
    seq.emplace_back(static_cast<uint8_t>(a[i]), static_cast<uint8_t>(b[i]));
  }
  out.push_back(std::move(seq));
}

// The pattern's syntax tree.
struct Node {
  enum class Kind { kSet, kConcat, kAlt, kRepeat } kind = Kind::kConcat;
  Ranges set;
  std::vector<int> kids;
  int min = 0, max = 0;  // kRepeat; max -1: no bound
};

class Parser {
 public:
  explicit Parser(std::vector<uint32_t> text) : s_(std::move(text)) {}

  Result<int> parse(bool* anchored_start, bool* anchored_end) {
    size_t end = s_.size();
    *anchored_start = !s_.empty() && s_[0] == '^';
    size_t backslashes = 0;  // right before a final '$': an odd count escapes it
    while (end >= backslashes + 2 && s_[end - 2 - backslashes] == '\\') ++backslashes;
    *anchored_end = end > (*anchored_start ? 1u : 0u) && s_[end - 1] == '$' && backslashes % 2 == 0;
    if (*anchored_end) --end;
    s_.resize(end);
    pos_ = *anchored_start ? 1 : 0;
    QS_ASSIGN_OR_RETURN(const int root, alternation());
    if (pos_ < s_.size()) return error("unbalanced ')'");
    if ((*anchored_start || *anchored_end) &&
        nodes_[static_cast<size_t>(root)].kind == Node::Kind::kAlt) {
      return error("^ or $ around a top-level | is not supported (group it: ^(a|b)$)");
    }
    return root;
  }

  std::vector<Node>& nodes() { return nodes_; }
  int add(Node n) {
    nodes_.push_back(std::move(n));
    return static_cast<int>(nodes_.size()) - 1;
  }
  int set(Ranges r) {
    Node n;
    n.kind = Node::Kind::kSet;
    n.set = normalized(std::move(r));
    return add(std::move(n));
  }

 private:
  Error error(const std::string& what) const {
    return make_error(fmt::format("pattern: {} (at character {})", what, pos_ + 1));
  }
  bool more() const { return pos_ < s_.size(); }
  uint32_t peek() const { return s_[pos_]; }

  Result<int> alternation() {
    std::vector<int> kids;
    QS_ASSIGN_OR_RETURN(const int first, sequence());
    kids.push_back(first);
    while (more() && peek() == '|') {
      ++pos_;
      QS_ASSIGN_OR_RETURN(const int next, sequence());
      kids.push_back(next);
    }
    if (kids.size() == 1) return kids[0];
    Node n;
    n.kind = Node::Kind::kAlt;
    n.kids = std::move(kids);
    return add(std::move(n));
  }

  Result<int> sequence() {
    Node n;
    while (more() && peek() != '|' && peek() != ')') {
      QS_ASSIGN_OR_RETURN(const int r, repeated());
      n.kids.push_back(r);
    }
    return add(std::move(n));
  }

  // {n}, {n,} or {n,m} at pos_ (past it on success); false (pos_ unchanged): a literal '{'.
  bool braces(int* lo, int* hi) {
    size_t p = pos_ + 1;
    auto number = [&](int* out) {
      const size_t from = p;
      int64_t v = 0;
      while (p < s_.size() && s_[p] >= '0' && s_[p] <= '9') {
        v = std::min<int64_t>(v * 10 + (s_[p] - '0'), 1 << 20);
        ++p;
      }
      *out = static_cast<int>(v);
      return p > from;
    };
    if (!number(lo)) return false;
    *hi = *lo;
    if (p < s_.size() && s_[p] == ',') {
      ++p;
      if (!number(hi)) *hi = -1;
    }
    if (p >= s_.size() || s_[p] != '}') return false;
    pos_ = p + 1;
    return true;
  }

  Result<int> repeated() {
    QS_ASSIGN_OR_RETURN(int atom_id, atom());
    while (more()) {
      int lo = 0, hi = 0;
      const uint32_t c = peek();
      if (c == '*' || c == '+' || c == '?') {
        ++pos_;
        lo = c == '+' ? 1 : 0;
        hi = c == '?' ? 1 : -1;
      } else if (c != '{' || !braces(&lo, &hi)) {
        break;
      }
      if (hi >= 0 && hi < lo) return error("a {n,m} with m < n");
      if (lo > kMaxRepeat || hi > kMaxRepeat) {
        return error(fmt::format("a repetition count above {}", kMaxRepeat));
      }
      if (more() && peek() == '?') ++pos_;  // lazy: the same strings match
      if (more() && (peek() == '*' || peek() == '+' || peek() == '?')) {
        return error("nothing to repeat");
      }
      Node n;
      n.kind = Node::Kind::kRepeat;
      n.kids = {atom_id};
      n.min = lo;
      n.max = hi;
      atom_id = add(std::move(n));
    }
    return atom_id;
  }

  Result<int> atom() {
    const uint32_t c = s_[pos_++];
    switch (c) {
      case '(': {
        if (more() && peek() == '?') {
          ++pos_;
          if (more() && peek() == ':') {
            ++pos_;
          } else if (more() && peek() == '<' && pos_ + 1 < s_.size() && s_[pos_ + 1] != '=' &&
                     s_[pos_ + 1] != '!') {
            while (more() && peek() != '>') ++pos_;  // a named group
            if (!more()) return error("an unterminated group name");
            ++pos_;
          } else {
            return error(
                "lookahead and lookbehind are not supported (but a lookahead right after a leading "
                "^)");
          }
        }
        QS_ASSIGN_OR_RETURN(const int inner, alternation());
        if (!more() || peek() != ')') return error("a missing ')'");
        ++pos_;
        return inner;
      }
      case ')':
        return error("unbalanced ')'");
      case '[':
        return char_class();
      case '.':
        return set(complement(kLineEnds));
      case '\\': {
        Ranges r;
        QS_TRY(escape(false, &r));
        return set(std::move(r));
      }
      case '^':
      case '$':
        return error("^ and $ are supported only as the pattern's first and last character");
      case '*':
      case '+':
      case '?':
        return error("nothing to repeat");
      default:
        return set({{c, c}});
    }
  }

  Status hex(int digits, uint32_t* out) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      if (!more()) return error("a short hex escape");
      const uint32_t d = peek();
      const int x = d >= '0' && d <= '9'   ? static_cast<int>(d - '0')
                    : d >= 'a' && d <= 'f' ? static_cast<int>(d - 'a' + 10)
                    : d >= 'A' && d <= 'F' ? static_cast<int>(d - 'A' + 10)
                                           : -1;
      if (x < 0) return error("a bad hex escape");
      v = v * 16 + static_cast<uint32_t>(x);
      ++pos_;
    }
    *out = v;
    return Status::ok_status();
  }

  // After a backslash: the characters the escape stands for.
  Status escape(bool in_class, Ranges* out) {
    if (!more()) return error("a pattern ending in a backslash");
    const uint32_t c = s_[pos_++];
    auto one = [&](uint32_t x) {
      out->emplace_back(x, x);
      return Status::ok_status();
    };
    switch (c) {
      case 'd':
      case 'D':
      case 'w':
      case 'W':
      case 's':
      case 'S': {
        const Ranges& base = c == 'd' || c == 'D' ? kDigit : c == 'w' || c == 'W' ? kWord : kSpace;
        const Ranges r = (c >= 'a') ? base : complement(base);
        out->insert(out->end(), r.begin(), r.end());
        return Status::ok_status();
      }
      case 'n':
        return one('\n');
      case 't':
        return one('\t');
      case 'r':
        return one('\r');
      case 'f':
        return one('\f');
      case 'v':
        return one('\v');
      case '0':
        return one(0);
      case 'b':
        if (in_class) return one('\b');
        return error("\\b (a word boundary) is not supported");
      case 'x': {
        uint32_t v = 0;
        QS_TRY(hex(2, &v));
        return one(v);
      }
      case 'u': {
        uint32_t v = 0;
        if (more() && peek() == '{') {
          ++pos_;
          const size_t from = pos_;
          while (more() && peek() != '}') ++pos_;
          if (!more() || pos_ == from || pos_ - from > 6) return error("a bad \\u{...} escape");
          const size_t end = pos_;
          pos_ = from;
          QS_TRY(hex(static_cast<int>(end - from), &v));
          ++pos_;
        } else {
          QS_TRY(hex(4, &v));
        }
        if (v > kMaxCodePoint) return error("a code point past U+10FFFF");
        return one(v);
      }
      default:
        break;
    }
    if (c >= '1' && c <= '9') return error("backreferences are not supported");
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
      return error(fmt::format("the escape \\{} is not supported", static_cast<char>(c)));
    }
    return one(c);  // escaped punctuation (or any other character) is itself
  }

  Result<int> char_class() {
    Ranges r;
    const bool negated = more() && peek() == '^';
    if (negated) ++pos_;
    while (true) {  // "[]" matches nothing, "[^]" any character, as in ECMAScript
      if (!more()) return error("a missing ']'");
      if (peek() == ']') {
        ++pos_;
        break;
      }
      // One class atom: a character, or a set (\d ...) that cannot be a range's end.
      auto class_atom = [&](Ranges* into, bool* single, uint32_t* value) -> Status {
        const uint32_t c = s_[pos_++];
        Ranges got;
        if (c == '\\') {
          QS_TRY(escape(true, &got));
        } else {
          got.emplace_back(c, c);
        }
        *single = got.size() == 1 && got[0].first == got[0].second;
        *value = got.empty() ? 0 : got[0].first;
        into->insert(into->end(), got.begin(), got.end());
        return Status::ok_status();
      };
      Ranges left;
      bool single = false;
      uint32_t lo = 0;
      QS_TRY(class_atom(&left, &single, &lo));
      if (pos_ + 1 < s_.size() && peek() == '-' && s_[pos_ + 1] != ']') {
        ++pos_;
        Ranges right;
        bool single_right = false;
        uint32_t hi = 0;
        QS_TRY(class_atom(&right, &single_right, &hi));
        if (!single || !single_right) return error("a class range with a set at an end");
        if (hi < lo) return error("a class range out of order");
        r.emplace_back(lo, hi);
      } else {
        r.insert(r.end(), left.begin(), left.end());
      }
    }
    r = normalized(std::move(r));
    return set(negated ? complement(r) : r);
  }

  std::vector<uint32_t> s_;
  size_t pos_ = 0;
  std::vector<Node> nodes_;
};

// Thompson's construction: states with empty moves and byte-range moves.
struct Nfa {
  struct Edge {
    uint8_t lo, hi;
    int to;
  };
  std::vector<std::vector<int>> eps;
  std::vector<std::vector<Edge>> edges;

  int state() {
    eps.emplace_back();
    edges.emplace_back();
    return static_cast<int>(eps.size()) - 1;
  }
};

class NfaBuilder {
 public:
  NfaBuilder(const std::vector<Node>& nodes, Nfa& nfa) : nodes_(nodes), nfa_(nfa) {}

  // The fragment of node `id` from state `from`: the state it ends in.
  Result<int> build(int id, int from) {
    if (nfa_.eps.size() > kMaxNfaStates) return make_error("pattern: the pattern is too large");
    const Node& n = nodes_[static_cast<size_t>(id)];
    switch (n.kind) {
      case Node::Kind::kSet: {
        const int to = nfa_.state();
        std::vector<ByteSeq> seqs;
        for (const auto& [lo, hi] : intersect(n.set, expressible())) utf8_sequences(lo, hi, seqs);
        for (const ByteSeq& seq : seqs) {
          int at = from;
          for (size_t i = 0; i < seq.size(); ++i) {
            const int next = i + 1 == seq.size() ? to : nfa_.state();
            nfa_.edges[static_cast<size_t>(at)].push_back({seq[i].first, seq[i].second, next});
            at = next;
          }
        }
        return to;
      }
      case Node::Kind::kConcat: {
        int at = from;
        for (int kid : n.kids) {
          QS_ASSIGN_OR_RETURN(at, build(kid, at));
        }
        return at;
      }
      case Node::Kind::kAlt: {
        const int to = nfa_.state();
        for (int kid : n.kids) {
          const int start = nfa_.state();
          nfa_.eps[static_cast<size_t>(from)].push_back(start);
          QS_ASSIGN_OR_RETURN(const int end, build(kid, start));
          nfa_.eps[static_cast<size_t>(end)].push_back(to);
        }
        return to;
      }
      case Node::Kind::kRepeat: {
        int at = from;
        for (int i = 0; i < n.min; ++i) {
          QS_ASSIGN_OR_RETURN(at, build(n.kids[0], at));
        }
        if (n.max < 0) {  // a loop: at -> kid -> at
          const int loop = nfa_.state();
          nfa_.eps[static_cast<size_t>(at)].push_back(loop);
          QS_ASSIGN_OR_RETURN(const int end, build(n.kids[0], loop));
          nfa_.eps[static_cast<size_t>(end)].push_back(loop);
          return loop;
        }
        const int to = nfa_.state();
        for (int i = n.min; i < n.max; ++i) {  // each optional copy may be skipped to the end
          nfa_.eps[static_cast<size_t>(at)].push_back(to);
          QS_ASSIGN_OR_RETURN(at, build(n.kids[0], at));
        }
        nfa_.eps[static_cast<size_t>(at)].push_back(to);
        return to;
      }
    }
    return from;
  }

 private:
  const std::vector<Node>& nodes_;
  Nfa& nfa_;
};

}  // namespace

// Subset construction over byte classes, then every state that cannot reach a match dropped.
class JsonPatternBuilder {
 public:
  static Result<JsonPattern> determinize(const Nfa& nfa, int start, int accept) {
    JsonPattern p;
    // Byte classes: bytes no edge tells apart share one.
    std::vector<bool> cut(257, false);
    cut[0] = cut[0x80] = cut[0xC0] = true;  // continuation bytes apart from the others
    for (const auto& edges : nfa.edges) {
      for (const Nfa::Edge& e : edges) cut[e.lo] = cut[e.hi + 1] = true;
    }
    std::vector<uint8_t> representative;
    int cls = -1;
    for (int b = 0; b < 256; ++b) {
      if (cut[static_cast<size_t>(b)]) {
        ++cls;
        representative.push_back(static_cast<uint8_t>(b));
      }
      p.classes_[static_cast<size_t>(b)] = static_cast<uint8_t>(cls);
    }
    p.num_classes_ = representative.size();
    p.starts_.clear();
    for (uint8_t b : representative) p.starts_.push_back(b < 0x80 || b >= 0xC0);

    auto closure = [&](std::vector<int> set) {
      std::vector<bool> seen(nfa.eps.size(), false);
      for (int s : set) seen[static_cast<size_t>(s)] = true;
      for (size_t i = 0; i < set.size(); ++i) {
        for (int t : nfa.eps[static_cast<size_t>(set[i])]) {
          if (!seen[static_cast<size_t>(t)]) {
            seen[static_cast<size_t>(t)] = true;
            set.push_back(t);
          }
        }
      }
      std::sort(set.begin(), set.end());
      return set;
    };
    std::map<std::vector<int>, int32_t> ids;
    std::vector<std::vector<int>> sets = {closure({start})};
    ids[sets[0]] = 0;
    std::vector<int32_t> table;
    std::vector<bool> accepting;
    for (size_t d = 0; d < sets.size(); ++d) {
      accepting.push_back(std::binary_search(sets[d].begin(), sets[d].end(), accept));
      for (uint8_t b : representative) {
        std::vector<int> moved;
        for (int s : sets[d]) {
          for (const Nfa::Edge& e : nfa.edges[static_cast<size_t>(s)]) {
            if (b >= e.lo && b <= e.hi) moved.push_back(e.to);
          }
        }
        if (moved.empty()) {
          table.push_back(-1);
          continue;
        }
        std::vector<int> next = closure(std::move(moved));
        auto [it, added] = ids.emplace(next, static_cast<int32_t>(sets.size()));
        if (added) {
          if (sets.size() >= static_cast<size_t>(kMaxPatternStates)) {
            return make_error(fmt::format(
                "pattern: the pattern needs more than {} automaton states", kMaxPatternStates));
          }
          sets.push_back(std::move(next));
        }
        table.push_back(it->second);
      }
    }
    return finish(std::move(p), std::move(table), std::move(accepting));
  }

  // Strings a matches and b does (or, `without`, does not): their product automaton (the pairs
  // of states reachable together; without, b's side -1 once b can match no more), byte classes
  // refined to tell both patterns' apart.
  static Result<JsonPattern> combine(const JsonPattern& a, const JsonPattern& b, bool without) {
    JsonPattern p;
    if (!b.satisfiable()) return without ? a : p;
    if (!a.satisfiable()) return p;
    std::map<std::pair<uint8_t, uint8_t>, uint8_t> class_of;
    std::vector<uint8_t> representative;
    p.starts_.clear();
    for (int byte = 0; byte < 256; ++byte) {
      const auto key = std::make_pair(a.classes_[static_cast<size_t>(byte)],
                                      b.classes_[static_cast<size_t>(byte)]);
      auto [it, added] = class_of.emplace(key, static_cast<uint8_t>(representative.size()));
      if (added) {
        representative.push_back(static_cast<uint8_t>(byte));
        p.starts_.push_back(byte < 0x80 || byte >= 0xC0);
      }
      p.classes_[static_cast<size_t>(byte)] = it->second;
    }
    p.num_classes_ = representative.size();
    std::map<std::pair<int32_t, int32_t>, int32_t> ids = {{{0, 0}, 0}};
    std::vector<std::pair<int32_t, int32_t>> pairs = {{0, 0}};
    std::vector<int32_t> table;
    std::vector<bool> accepting;
    for (size_t d = 0; d < pairs.size(); ++d) {
      const auto [qa, qb] = pairs[d];
      const bool b_matches = qb >= 0 && b.accepts(qb);
      accepting.push_back(a.accepts(qa) && b_matches != without);
      for (uint8_t byte : representative) {
        const int32_t ta = a.next(qa, byte), tb = qb >= 0 ? b.next(qb, byte) : -1;
        if (ta < 0 || (tb < 0 && !without)) {
          table.push_back(-1);
          continue;
        }
        auto [it, added] = ids.emplace(std::make_pair(ta, tb), static_cast<int32_t>(pairs.size()));
        if (added) {
          if (pairs.size() >= static_cast<size_t>(kMaxPatternStates)) {
            return make_error(
                fmt::format("pattern: the patterns together need more than {} automaton states",
                            kMaxPatternStates));
          }
          pairs.emplace_back(ta, tb);
        }
        table.push_back(it->second);
      }
    }
    return finish(std::move(p), std::move(table), std::move(accepting));
  }

 private:
  // The states reachable from 0 (whose moves lead to live states or -1), those no text tells
  // apart merged (Hopcroft's partition refinement, with -1 as a sink state of its own); the start
  // stays 0.
  static void minimize(std::vector<int32_t>& table, std::vector<bool>& accepting, size_t k) {
    // Dense ids for the reachable states (0 first), the sink last.
    std::vector<int32_t> id(accepting.size(), -1);
    std::vector<int32_t> order = {0};
    id[0] = 0;
    for (size_t i = 0; i < order.size(); ++i) {
      for (size_t c = 0; c < k; ++c) {
        const int32_t t = table[static_cast<size_t>(order[i]) * k + c];
        if (t >= 0 && id[static_cast<size_t>(t)] < 0) {
          id[static_cast<size_t>(t)] = static_cast<int32_t>(order.size());
          order.push_back(t);
        }
      }
    }
    const size_t m = order.size() + 1, sink = m - 1;
    std::vector<int32_t> moves(m * k, static_cast<int32_t>(sink));
    for (size_t q = 0; q < order.size(); ++q) {
      for (size_t c = 0; c < k; ++c) {
        const int32_t t = table[static_cast<size_t>(order[q]) * k + c];
        if (t >= 0) moves[q * k + c] = id[static_cast<size_t>(t)];
      }
    }
    // Predecessors by (state, class), compressed: into[first[t * k + c] .. first[t * k + c + 1]).
    std::vector<int32_t> first(m * k + 1, 0), into(m * k);
    for (int32_t t : moves) ++first[static_cast<size_t>(t) * k + 1];  // counts, shifted below
    std::vector<int32_t> count_by(m * k, 0);
    for (size_t q = 0; q < m; ++q) {
      for (size_t c = 0; c < k; ++c) ++count_by[static_cast<size_t>(moves[q * k + c]) * k + c];
    }
    for (size_t i = 0; i < m * k; ++i) first[i + 1] = first[i] + count_by[i];
    std::vector<int32_t> fill(first.begin(), first.end() - 1);
    for (size_t q = 0; q < m; ++q) {
      for (size_t c = 0; c < k; ++c) {
        into[static_cast<size_t>(fill[static_cast<size_t>(moves[q * k + c]) * k + c]++)] =
            static_cast<int32_t>(q);
      }
    }
    // Blocks: the matches, the other live states, the sink; refined by each block in `work`.
    std::vector<std::vector<int32_t>> blocks(3);
    std::vector<int32_t> block_of(m);
    for (size_t q = 0; q < m; ++q) {
      const int32_t b = q == sink ? 2 : accepting[static_cast<size_t>(order[q])] ? 0 : 1;
      blocks[static_cast<size_t>(b)].push_back(static_cast<int32_t>(q));
      block_of[q] = b;
    }
    std::vector<int32_t> work;
    std::vector<bool> in_work;
    for (int32_t b = 0; b < 3; ++b) {
      work.push_back(b);
      in_work.push_back(true);
    }
    std::vector<bool> marked(m, false);
    std::vector<int32_t> hits(3, 0), touched;
    while (!work.empty()) {
      const std::vector<int32_t> splitter = blocks[static_cast<size_t>(work.back())];
      in_work[static_cast<size_t>(work.back())] = false;
      work.pop_back();
      for (size_t c = 0; c < k; ++c) {
        touched.clear();
        for (int32_t t : splitter) {
          const size_t at = static_cast<size_t>(t) * k + c;
          for (int32_t i = first[at]; i < first[at + 1]; ++i) {
            const auto q = static_cast<size_t>(into[static_cast<size_t>(i)]);
            if (marked[q]) continue;
            marked[q] = true;
            const auto b = static_cast<size_t>(block_of[q]);
            if (hits[b]++ == 0) touched.push_back(static_cast<int32_t>(b));
          }
        }
        for (int32_t b : touched) {
          std::vector<int32_t>& y = blocks[static_cast<size_t>(b)];
          if (static_cast<size_t>(hits[static_cast<size_t>(b)]) < y.size()) {
            const auto z = static_cast<int32_t>(blocks.size());
            std::vector<int32_t> in, out;
            for (int32_t q : y) (marked[static_cast<size_t>(q)] ? in : out).push_back(q);
            for (int32_t q : in) block_of[static_cast<size_t>(q)] = z;
            const bool smaller = in.size() < out.size();
            y = std::move(out);
            blocks.push_back(std::move(in));
            hits.push_back(0);
            in_work.push_back(false);
            // Both halves wait where the whole did; else the smaller suffices.
            const int32_t next = in_work[static_cast<size_t>(b)] || smaller ? z : b;
            if (!in_work[static_cast<size_t>(next)]) {
              work.push_back(next);
              in_work[static_cast<size_t>(next)] = true;
            }
          }
          hits[static_cast<size_t>(b)] = 0;
        }
        for (int32_t t : splitter) {
          const size_t at = static_cast<size_t>(t) * k + c;
          for (int32_t i = first[at]; i < first[at + 1]; ++i) {
            marked[static_cast<size_t>(into[static_cast<size_t>(i)])] = false;
          }
        }
      }
    }
    // The blocks as states, numbered as first met from the start's; the sink's is -1.
    std::vector<int32_t> number(blocks.size(), -1);
    std::vector<int32_t> reps;  // a state of each numbered block
    const auto sink_block = static_cast<size_t>(block_of[sink]);
    for (size_t q = 0; q < order.size(); ++q) {
      const auto b = static_cast<size_t>(block_of[q]);
      if (number[b] < 0) {
        number[b] = static_cast<int32_t>(reps.size());
        reps.push_back(static_cast<int32_t>(q));
      }
    }
    std::vector<int32_t> merged;
    std::vector<bool> matches;
    for (int32_t q : reps) {
      matches.push_back(accepting[static_cast<size_t>(order[static_cast<size_t>(q)])]);
      for (size_t c = 0; c < k; ++c) {
        const auto b = static_cast<size_t>(
            block_of[static_cast<size_t>(moves[static_cast<size_t>(q) * k + c])]);
        merged.push_back(b == sink_block ? -1 : number[b]);
      }
    }
    table = std::move(merged);
    accepting = std::move(matches);
  }

  // p with its transitions and matches, its dead states (no match reachable) cut off, states no
  // text tells apart merged, and each state's loops found.
  static JsonPattern finish(JsonPattern p, std::vector<int32_t> table,
                            std::vector<bool> accepting) {
    // Live states: those that reach a match (a search back from the matches).
    const size_t n = accepting.size(), k = p.num_classes_;
    std::vector<std::vector<int32_t>> into(n);
    for (size_t s = 0; s < n; ++s) {
      for (size_t c = 0; c < k; ++c) {
        const int32_t t = table[s * k + c];
        if (t >= 0) into[static_cast<size_t>(t)].push_back(static_cast<int32_t>(s));
      }
    }
    std::vector<bool> live = accepting;
    std::vector<int32_t> todo;
    for (size_t s = 0; s < n; ++s) {
      if (live[s]) todo.push_back(static_cast<int32_t>(s));
    }
    while (!todo.empty()) {
      const int32_t t = todo.back();
      todo.pop_back();
      for (int32_t s : into[static_cast<size_t>(t)]) {
        if (!live[static_cast<size_t>(s)]) {
          live[static_cast<size_t>(s)] = true;
          todo.push_back(s);
        }
      }
    }
    if (!live[0]) return p;  // nothing matches
    for (int32_t& t : table) {
      if (t >= 0 && !live[static_cast<size_t>(t)]) t = -1;
    }
    minimize(table, accepting, k);
    const size_t states = accepting.size();
    p.table_ = std::move(table);
    p.accept_ = std::move(accepting);
    std::vector<int32_t> self(states);
    std::iota(self.begin(), self.end(), 0);
    p.loops_ = p.loops_among(self);
    return p;
  }
};

namespace {

// Where the group opening at regex[open] closes (skipping escapes and classes); npos: nowhere.
size_t group_end(std::string_view regex, size_t open) {
  int depth = 0;
  bool in_class = false;
  for (size_t i = open; i < regex.size(); ++i) {
    const char c = regex[i];
    if (c == '\\') {
      ++i;
    } else if (in_class) {
      in_class = c != ']';
    } else if (c == '[') {
      in_class = true;
    } else if (c == '(') {
      ++depth;
    } else if (c == ')' && --depth == 0) {
      return i;
    }
  }
  return std::string_view::npos;
}

}  // namespace

Result<JsonPattern> JsonPattern::compile(std::string_view regex) {
  if (!unicode::is_valid_utf8(regex)) return make_error("pattern: not UTF-8");
  // A lookahead right after the leading ^ (as pydantic's Decimal pattern starts "^(?!^[-+.]*$)"):
  // the rest of the pattern with (?=A) and without (?!A) the strings A matches from the start.
  if (regex.starts_with("^(?=") || regex.starts_with("^(?!")) {
    const size_t close = group_end(regex, 1);
    if (close == std::string_view::npos) return make_error("pattern: a missing ')'");
    // The lookahead's own pattern, grouped: ^(?:A) or, where A ends with $, ^(?:A)$.
    std::string_view inner = regex.substr(4, close - 4);
    if (inner.starts_with('^')) inner.remove_prefix(1);
    size_t slashes = 0;  // backslashes before A's last character
    while (slashes + 1 < inner.size() && inner[inner.size() - 2 - slashes] == '\\') ++slashes;
    const bool to_end = inner.ends_with('$') && slashes % 2 == 0;
    if (to_end) inner.remove_suffix(1);
    std::string ahead_regex = "^(?:";
    ahead_regex += inner;
    ahead_regex += to_end ? ")$" : ")";
    std::string rest_regex = "^";
    rest_regex += regex.substr(close + 1);
    QS_ASSIGN_OR_RETURN(const JsonPattern rest, compile(rest_regex));
    QS_ASSIGN_OR_RETURN(const JsonPattern ahead, compile(ahead_regex));
    return regex[3] == '=' ? intersect(rest, ahead) : subtract(rest, ahead);
  }
  std::vector<uint32_t> text;
  for (size_t i = 0; i < regex.size();) {
    int len = 0;
    text.push_back(unicode::decode_utf8(regex, i, &len));
    i += static_cast<size_t>(len);
  }
  Parser parser(std::move(text));
  bool anchored_start = false, anchored_end = false;
  QS_ASSIGN_OR_RETURN(int root, parser.parse(&anchored_start, &anchored_end));
  // Unanchored ends: any text before and after the match.
  const Ranges everything = {{0, kMaxCodePoint}};
  auto any_text = [&] {
    Node r;
    r.kind = Node::Kind::kRepeat;
    r.kids = {parser.set(everything)};
    r.min = 0;
    r.max = -1;
    return parser.add(std::move(r));
  };
  Node whole;
  if (!anchored_start) whole.kids.push_back(any_text());
  whole.kids.push_back(root);
  if (!anchored_end) whole.kids.push_back(any_text());
  root = parser.add(std::move(whole));
  Nfa nfa;
  const int start = nfa.state();
  QS_ASSIGN_OR_RETURN(const int accept, NfaBuilder(parser.nodes(), nfa).build(root, start));
  return JsonPatternBuilder::determinize(nfa, start, accept);
}

Result<JsonPattern> JsonPattern::intersect(const JsonPattern& a, const JsonPattern& b) {
  return JsonPatternBuilder::combine(a, b, false);
}

Result<JsonPattern> JsonPattern::subtract(const JsonPattern& a, const JsonPattern& b) {
  return JsonPatternBuilder::combine(a, b, true);
}

Result<PatternLengths> PatternLengths::build(const JsonPattern& p, int min, int max) {
  PatternLengths t;
  t.min_ = min;
  t.max_ = max;
  t.states_ = p.states();
  if (!p.satisfiable()) return t;
  const int layers = (max >= 0 ? max : min) + 1;
  if (static_cast<size_t>(layers) * t.states_ > kMaxPatternLengthBits) {
    return make_error(
        fmt::format("pattern: a pattern of {} automaton states with a length bound "
                    "of {} is too large to follow",
                    t.states_, layers - 1));
  }
  // Each state's fewest characters to a match: a search back from the matches (0-1 breadth
  // first), a character's first byte costing one and continuation bytes none.
  std::vector<std::vector<std::pair<int32_t, int>>> into(t.states_);
  for (size_t q = 0; q < t.states_; ++q) {
    for (size_t c = 0; c < p.classes(); ++c) {
      const int32_t to = p.next_by_class(static_cast<int32_t>(q), c);
      if (to >= 0) {
        into[static_cast<size_t>(to)].emplace_back(static_cast<int32_t>(q),
                                                   p.starts_character(c) ? 1 : 0);
      }
    }
  }
  std::vector<int> need(t.states_, std::numeric_limits<int>::max());
  std::deque<int32_t> todo;
  for (size_t q = 0; q < t.states_; ++q) {
    if (p.accepts(static_cast<int32_t>(q))) {
      need[q] = 0;
      todo.push_back(static_cast<int32_t>(q));
    }
  }
  while (!todo.empty()) {
    const auto to = static_cast<size_t>(todo.front());
    todo.pop_front();
    for (const auto& [q, cost] : into[to]) {
      if (need[to] + cost < need[static_cast<size_t>(q)]) {
        need[static_cast<size_t>(q)] = need[to] + cost;
        cost == 0 ? todo.push_front(q) : todo.push_back(q);
      }
    }
  }
  for (int n : need) {
    if (n != std::numeric_limits<int>::max()) t.most_needed_ = std::max(t.most_needed_, n);
  }
  t.layers_ = static_cast<size_t>(layers);
  t.bits_.assign((t.layers_ * t.states_ + 63) / 64, 0);
  std::vector<bool> on(t.states_);
  auto set = [&](int layer, size_t q) {
    const size_t i = t.index(layer, static_cast<int32_t>(q));
    t.bits_[i / 64] |= uint64_t{1} << (i % 64);
  };
  for (int r = 0; r < layers; ++r) {
    // Seeds: layer 0 the matches (exactly 0 more) or every live state (at least 0); above, a
    // character's first byte into the layer below.
    for (size_t q = 0; q < t.states_; ++q) {
      bool seed = false;
      if (r == 0) {
        seed = max >= 0 ? p.accepts(static_cast<int32_t>(q)) : true;
      } else {
        for (size_t c = 0; c < p.classes() && !seed; ++c) {
          const int32_t to = p.next_by_class(static_cast<int32_t>(q), c);
          seed = to >= 0 && p.starts_character(c) && t.bit(r - 1, to);
        }
      }
      on[q] = seed;
    }
    // Then the states that reach those by continuation bytes (no character more).
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t q = 0; q < t.states_; ++q) {
        if (on[q]) continue;
        for (size_t c = 0; c < p.classes(); ++c) {
          const int32_t to = p.next_by_class(static_cast<int32_t>(q), c);
          if (to >= 0 && !p.starts_character(c) && on[static_cast<size_t>(to)]) {
            on[q] = changed = true;
            break;
          }
        }
      }
    }
    for (size_t q = 0; q < t.states_; ++q) {
      if (on[q]) set(r, q);
    }
  }
  return t;
}

bool PatternLengths::viable(int32_t state, int count) const {
  if (max_ < 0) return bit(std::max(0, min_ - count), state);
  // Some layer in [min - count, max - count]: the state's bits a word at a time.
  const int lo = std::max(0, min_ - count), hi = max_ - count;
  if (hi < lo) return false;
  size_t i = index(lo, state);
  const size_t end = index(hi, state) + 1;
  while (i < end) {
    const size_t word = i / 64, shift = i % 64;
    const size_t take = std::min<size_t>(64 - shift, end - i);
    uint64_t bits = bits_[word] >> shift;
    if (take < 64) bits &= (uint64_t{1} << take) - 1;
    if (bits != 0) return true;
    i += take;
  }
  return false;
}

std::vector<int32_t> JsonPattern::alike_within(int chars) const {
  // Moore's refinement, one round per byte of text: states start apart by whether they match,
  // then by the classes their moves reach (-1: none), until `chars` rounds or nothing splits.
  const size_t n = states(), k = num_classes_;
  std::vector<int32_t> cls(n);
  for (size_t q = 0; q < n; ++q) cls[q] = accept_[q] ? 1 : 0;
  size_t count = std::set<int32_t>(cls.begin(), cls.end()).size();
  std::vector<int32_t> key(k + 1), next(n);
  for (int round = 0; round < chars; ++round) {
    std::map<std::vector<int32_t>, int32_t> ids;
    for (size_t q = 0; q < n; ++q) {
      key[0] = cls[q];
      for (size_t c = 0; c < k; ++c) {
        const int32_t t = table_[q * k + c];
        key[c + 1] = t < 0 ? -1 : cls[static_cast<size_t>(t)];
      }
      next[q] = ids.emplace(key, static_cast<int32_t>(ids.size())).first->second;
    }
    const bool stable = ids.size() == count;
    cls.swap(next);
    count = ids.size();
    if (stable) break;
  }
  std::vector<int32_t> first(count, -1), alike(n);
  for (size_t q = 0; q < n; ++q) {
    int32_t& f = first[static_cast<size_t>(cls[q])];
    if (f < 0) f = static_cast<int32_t>(q);
    alike[q] = f;
  }
  return alike;
}

std::vector<ByteGroups> JsonPattern::loops_among(const std::vector<int32_t>& alike) const {
  // The groups no byte of a class that leads elsewhere falls in.
  const size_t n = states(), k = num_classes_;
  std::vector<ByteGroups> class_groups(k, 0);
  for (int byte = 0; byte < 256; ++byte) {
    class_groups[classes_[static_cast<size_t>(byte)]] |= ByteGroups{1}
                                                         << byte_group(static_cast<uint8_t>(byte));
  }
  std::vector<ByteGroups> loops(n, kPlainGroups);
  for (size_t s = 0; s < n; ++s) {
    for (size_t c = 0; c < k; ++c) {
      const int32_t t = table_[s * k + c];
      if (t < 0 || alike[static_cast<size_t>(t)] != alike[s]) loops[s] &= ~class_groups[c];
    }
  }
  return loops;
}

bool JsonPattern::matches(std::string_view text) const {
  if (!satisfiable()) return false;
  int32_t s = start();
  for (char c : text) {
    s = next(s, static_cast<uint8_t>(c));
    if (s < 0) return false;
  }
  return accepts(s);
}

}  // namespace qs
