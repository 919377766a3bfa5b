// JsonPattern (a JSON Schema "pattern" as a byte automaton) against std::regex's ECMAScript
// grammar on many strings, its UTF-8 handling, and its refusals.
#include <gtest/gtest.h>

#include <random>
#include <regex>
#include <string>
#include <vector>

#include "engine/json_pattern.h"

namespace qs {
namespace {

JsonPattern compiled(const std::string& regex) {
  auto p = JsonPattern::compile(regex);
  EXPECT_TRUE(p.ok()) << regex << ": " << p.error().message;
  return std::move(p).value();
}

TEST(JsonPattern, MatchesAsEcmaScriptDoes) {
  const std::vector<std::string> patterns = {
      "^[a-d]+$", R"(^\d{3}-\d{2}$)", "ab|cd", "^(ab|cd)*$", "colou?r", "^[A-Z][a-z]{1,3}$",
      R"(^\w+@\w+\.com$)", "^[^abc]*$", "^a{2,}$", "^(a|b){0,3}c?$", "x$", "^y", "^$", R"(^\s*$)",
      R"(^[\d.-]+$)", "^[-a]+$", "^(?:a|bc)+d$", "^(?<n>ab)+$", "a.c", R"(^a\.b$)", "^[a-c]*?b+?$",
      R"(^\D\W$)", "^(a*)*b$", "^((a|b)(c|d)){2}$", "^a{0}b$", "^[x-z0-3]{2,4}$", R"(^\{\}$)",
      "(x|y)z$",
      // lookaheads after ^ (pydantic's Decimal)
      R"(^(?!^[-+.]*$)[+-]?0*\d*\.?\d*$)", R"(^(?=.*\d)(?!a)[a-z\d]+$)", "^(?=ab|c)[a-d]{2}$"};
  const std::string alphabet = "abcdrxyzAZ0139-@._{},\n ";
  std::mt19937 rng(7);
  std::vector<std::string> texts = {"",       "a",      "ab",  "abab",      "cdab", "color",
                                    "colour", "123-45", "Abc", "ab@cd.com", "aa",   "aab",
                                    "ccc",    "{}",     "a.b", "acbd",      "+1.5", "-.",
                                    "-0.50",  "+",      "1a",  "a1",        "ca"};
  for (int i = 0; i < 3000; ++i) {
    std::string t;
    const int n = static_cast<int>(rng() % 9);
    for (int k = 0; k < n; ++k) t += alphabet[rng() % alphabet.size()];
    texts.push_back(t);
  }
  for (const std::string& pattern : patterns) {
    const JsonPattern p = compiled(pattern);
    const std::regex re(pattern.find("(?<") != std::string::npos ? "^(ab)+$" : pattern,
                        std::regex::ECMAScript);
    int matched = 0;
    for (const std::string& t : texts) {
      const bool want = std::regex_search(t, re);
      ASSERT_EQ(p.matches(t), want) << pattern << " on '" << t << "'";
      matched += want;
    }
    EXPECT_GT(matched, 0) << pattern;
  }
}

// Every state reached by a byte the automaton takes can still reach a match: a model that
// follows it never meets a dead end.
TEST(JsonPattern, EveryStateItLeavesCanStillMatch) {
  for (const std::string pattern : {"^[a-c]{2,3}x$", R"(^\d+(\.\d{1,2})?$)", "^(ab|cd)*e$"}) {
    const JsonPattern p = compiled(pattern);
    std::vector<int32_t> todo = {p.start()};
    std::vector<bool> seen(p.states(), false);
    seen[0] = true;
    while (!todo.empty()) {
      const int32_t s = todo.back();
      todo.pop_back();
      // Breadth-first from s: a match is reachable.
      std::vector<int32_t> frontier = {s};
      std::vector<bool> met(p.states(), false);
      bool reaches = false;
      for (size_t i = 0; i < frontier.size() && !reaches; ++i) {
        reaches = p.accepts(frontier[i]);
        for (int b = 0; b < 256; ++b) {
          const int32_t t = p.next(frontier[i], static_cast<uint8_t>(b));
          if (t >= 0 && !met[static_cast<size_t>(t)]) {
            met[static_cast<size_t>(t)] = true;
            frontier.push_back(t);
          }
          if (t >= 0 && !seen[static_cast<size_t>(t)]) {
            seen[static_cast<size_t>(t)] = true;
            todo.push_back(t);
          }
        }
      }
      EXPECT_TRUE(reaches) << pattern << " state " << s;
    }
  }
}

// loops(state) names only groups all of whose bytes leave the state as it is (what lets a walk
// of the vocabulary take a subtree of them whole), and the groups that do.
TEST(JsonPattern, LoopsAreTheGroupsThatLeaveAStateAsItIs) {
  int looping = 0;
  for (const std::string pattern :
       {"^[a-z]+-\\d+$", "ok", "^[\\w.-]+@[a-z]+$", "^(ab)*$", "^[^\"]*x$", "^[a-y]+$", "^.*$"}) {
    const JsonPattern p = compiled(pattern);
    for (int32_t q = 0; q < static_cast<int32_t>(p.states()); ++q) {
      ByteGroups all_loop = kPlainGroups;  // the groups whose every byte loops at q
      for (int b = 0; b < 256; ++b) {
        if (p.next(q, static_cast<uint8_t>(b)) != q) {
          all_loop &= ~(ByteGroups{1} << byte_group(static_cast<uint8_t>(b)));
        }
      }
      EXPECT_EQ(p.loops(q), all_loop) << pattern << " state " << q;
      looping += p.loops(q) != 0;
    }
  }
  EXPECT_GE(looping, 7);
  // "ok" unanchored: past the match every plain byte loops; [a-y]: no letter group but 'z's.
  const JsonPattern ok = compiled("ok");
  EXPECT_EQ(ok.loops(ok.next(ok.next(ok.start(), 'o'), 'k')), kPlainGroups);
  const JsonPattern ay = compiled("^[a-y]+$");
  const ByteGroups letters = ay.loops(ay.next(ay.start(), 'a'));
  EXPECT_TRUE((letters >> byte_group('y')) & 1u);
  EXPECT_FALSE((letters >> byte_group('z')) & 1u);
  EXPECT_FALSE(letters & 1u);  // group 0 never
}

// States no text tells apart are one (fewer masks to walk, and a loop is a loop from its first
// byte): the fewest states that can tell apart what the pattern does.
TEST(JsonPattern, AutomataAreMinimal) {
  // "ok": before "o" / after "o" / past "ok", and 7 places inside a UTF-8 character before and
  // past the match.
  const std::vector<std::pair<std::string, size_t>> cases = {
      {"^[a-z]+$", 2},     {"ok", 17},        {"^(ab|cd)*$", 3},  {"^(a|b)*a(a|b){3}$", 16},
      {"^a{1000}$", 1001}, {"^(a+|a+b)$", 3}, {"^(?:x|y|z)+$", 2}};
  for (const auto& [regex, states] : cases) EXPECT_EQ(compiled(regex).states(), states) << regex;
}

// States that only a longer text tells apart are alike within a shorter one: a counter far from
// its bound is like the next position.
TEST(JsonPattern, StatesAlikeWithinAFewBytes) {
  const JsonPattern p = compiled("^a{10}$");
  ASSERT_EQ(p.states(), 11u);
  int32_t q = p.start();
  std::vector<int32_t> after = {q};  // after[k]: the state after k a's
  for (int k = 0; k < 10; ++k) after.push_back(q = p.next(q, 'a'));
  const std::vector<int32_t> alike = p.alike_within(3);
  // Within 3 bytes, 0..6 a's are alike (no match yet, all of "a" "aa" "aaa" live); 7..10 each
  // differ (a match 3, 2, 1, 0 bytes on).
  for (int k = 0; k <= 10; ++k) {
    const int32_t want =
        k <= 6 ? alike[static_cast<size_t>(after[0])] : after[static_cast<size_t>(k)];
    EXPECT_EQ(alike[static_cast<size_t>(after[static_cast<size_t>(k)])], want) << k;
  }
  // An 'a' leads from 0..5 a's to a state alike to where it left (so any run of them stays
  // alive within 3 bytes): a loop among alike states; from 6 on it does not.
  const std::vector<ByteGroups> loops = p.loops_among(alike);
  const ByteGroups a_group = ByteGroups{1} << byte_group('a');
  for (int k = 0; k <= 10; ++k) {
    EXPECT_EQ(loops[static_cast<size_t>(after[static_cast<size_t>(k)])] & a_group,
              k <= 5 ? a_group : 0u)
        << k;
  }
  EXPECT_EQ(p.loops(after[3]) & a_group, 0u);  // exactly, 'a' loops nowhere
  // Within enough bytes, every state of a minimal automaton is its own.
  const std::vector<int32_t> all = p.alike_within(100);
  for (size_t s = 0; s < all.size(); ++s) EXPECT_EQ(all[s], static_cast<int32_t>(s));
}

using PatternPair = std::pair<std::string, std::string>;

// intersect(a, b) (or, `without`, subtract(a, b)) on random strings: matches where a does and b
// does (does not); for `empty`'s pair it matches nothing.
void check_combined(const std::vector<PatternPair>& pairs, const PatternPair& empty, bool without) {
  auto combine = [&](const std::string& ra, const std::string& rb) {
    const JsonPattern a = compiled(ra), b = compiled(rb);
    return without ? JsonPattern::subtract(a, b) : JsonPattern::intersect(a, b);
  };
  const std::string alphabet = "abcxy0259";
  std::mt19937 rng(3);
  for (const auto& [ra, rb] : pairs) {
    const JsonPattern a = compiled(ra), b = compiled(rb);
    auto both = combine(ra, rb);
    ASSERT_TRUE(both.ok()) << both.error().message;
    int matched = 0;
    for (int i = 0; i < 4000; ++i) {
      std::string t;
      const int n = static_cast<int>(rng() % 7);
      for (int k = 0; k < n; ++k) t += alphabet[rng() % alphabet.size()];
      const bool want = a.matches(t) && b.matches(t) != without;
      ASSERT_EQ(both->matches(t), want)
          << ra << (without ? " - " : " & ") << rb << " on '" << t << "'";
      matched += want;
    }
    EXPECT_GT(matched, 0) << ra << (without ? " - " : " & ") << rb;
  }
  auto none = combine(empty.first, empty.second);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->satisfiable()) << empty.first << (without ? " - " : " & ") << empty.second;
}

TEST(JsonPattern, IntersectionMatchesWhatBothMatch) {
  check_combined(
      {{"^[a-c]+$", "b"}, {"^(ab)*$", "^a.{0,3}$"}, {"^\\d+$", "^[0-5]{2,4}$"}, {"x", "y"}},
      {"^a+$", "^b+$"}, false);
}

TEST(JsonPattern, DifferenceMatchesWhatOnlyTheFirstMatches) {
  check_combined(
      {{"^[a-c]+$", "b"}, {"^[a-z0-9]{1,5}$", "^(ab|x)$"}, {"^\\d+$", "0$"}, {"x", "[]"}},
      {"^a+$", "a"}, true);
}

TEST(JsonPattern, CharactersAreUtf8) {
  const JsonPattern one = compiled("^.$");
  EXPECT_TRUE(one.matches("\xe6\x97\xa5"));               // 日: one character, three bytes
  EXPECT_FALSE(one.matches("\xe6\x97\xa5\xe6\x9c\xac"));  // 日本
  EXPECT_TRUE(one.matches("\xf0\x9f\x98\x80"));           // U+1F600
  EXPECT_FALSE(one.matches("\n"));
  EXPECT_FALSE(one.matches("\xe6\x97"));                         // a cut character
  const JsonPattern greek = compiled("^[\xce\xb1-\xcf\x89]+$");  // [α-ω]+
  EXPECT_TRUE(greek.matches("\xce\xbb\xce\xbf"));                // λο
  EXPECT_FALSE(greek.matches("\xce\x91"));                       // Α
  EXPECT_TRUE(compiled(R"(^\u00e9\x41\u{1F600}$)")
                  .matches("\xc3\xa9"
                           "A"
                           "\xf0\x9f\x98\x80"));
  EXPECT_TRUE(compiled(R"(^[^a]$)").matches("\xc3\xa9"));
  // Only what a JSON string can carry: \x01 has no short escape, so nothing matches.
  EXPECT_FALSE(compiled(R"(^\x01$)").satisfiable());
  EXPECT_TRUE(compiled(R"(^\n\t$)").matches("\n\t"));
  EXPECT_FALSE(compiled("[]").satisfiable());
  EXPECT_TRUE(compiled("^[^]$").matches("\xc3\xa9"));
  // A '{' that does not start a count is itself (ECMAScript's Annex B; std::regex refuses it).
  EXPECT_TRUE(compiled("^a{,2}$").matches("a{,2}"));
  EXPECT_FALSE(compiled("^a{,2}$").matches("aa"));
}

// PatternLengths against brute force over a small alphabet: a prefix is viable exactly when some
// completion of an allowed length matches.
TEST(JsonPattern, LengthBoundsLeaveNoDeadEnd) {
  struct Case {
    std::string regex;
    int min, max;
  };
  const std::vector<Case> cases = {{"^(ab)+$", 0, 5},
                                   {"^[ab]*c[ab]*$", 3, 6},
                                   {"a", 4, -1},
                                   {"^[ab]{2,}$", 0, 3},
                                   {"^(a|bc)*$", 2, 5}};
  const std::string alphabet = "abc";
  auto all_strings = [&](int up_to) {
    std::vector<std::string> out = {""};
    for (size_t i = 0; i < out.size(); ++i) {
      if (static_cast<int>(out[i].size()) == up_to) continue;
      for (char ch : alphabet) out.push_back(out[i] + ch);
    }
    return out;
  };
  for (const Case& c : cases) {
    const JsonPattern p = compiled(c.regex);
    auto lengths = PatternLengths::build(p, c.min, c.max);
    ASSERT_TRUE(lengths.ok()) << lengths.error().message;
    const int longest = c.max >= 0 ? c.max : c.min + 3;
    const std::vector<std::string> texts = all_strings(longest);
    for (const std::string& prefix : texts) {
      // Without a bound above, the search's own bound must leave room for a completion.
      if (c.max < 0 && static_cast<int>(prefix.size()) > c.min) continue;
      int32_t state = p.start();
      for (char ch : prefix) {
        state = state < 0 ? -1 : p.next(state, static_cast<uint8_t>(ch));
      }
      if (state < 0) continue;
      bool want = false;
      for (const std::string& t : texts) {
        const int n = static_cast<int>(t.size());
        want = want || (t.compare(0, prefix.size(), prefix) == 0 && t.size() >= prefix.size() &&
                        n >= c.min && (c.max < 0 || n <= c.max) && p.matches(t));
      }
      EXPECT_EQ(lengths->viable(state, static_cast<int>(prefix.size())), want)
          << c.regex << " [" << c.min << ", " << c.max << "] after '" << prefix << "'";
    }
  }
}

TEST(JsonPattern, RefusesWhatItDoesNotFollow) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"(a", "a missing ')'"},
      {"a)", "unbalanced ')'"},
      {"a**", "nothing to repeat"},
      {"*a", "nothing to repeat"},
      {R"((a)\1)", "backreferences"},
      {"(?=a)", "lookahead"},
      {"(?<!a)b", "lookahead"},
      {R"(\bfoo)", "word boundary"},
      {R"(\p{L})", "\\p is not supported"},
      {"a^b", "first and last"},
      {"a$b", "first and last"},
      {"^a|b$", "top-level |"},
      {"a{3,2}", "m < n"},
      {"[z-a]", "out of order"},
      {R"([\d-z])", "a set at an end"},
      {"a{2000}", "above 1000"},
      {"[ab", "a missing ']'"},
      {R"(\)", "ending in a backslash"},
      {"(a{1,1000}){1,1000}", "too large"},
      {"(a|b)*a(a|b){12}", "automaton states"},
  };
  for (const auto& [regex, want] : cases) {
    auto p = JsonPattern::compile(regex);
    ASSERT_FALSE(p.ok()) << regex;
    EXPECT_NE(p.error().message.find(want), std::string::npos)
        << regex << ": " << p.error().message;
  }
}

}  // namespace
}  // namespace qs
