#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/stop_matcher.h"

namespace qs {
namespace {

// Pushes the pieces; returns everything emitted (including flush() when no match).
std::string run(StopMatcher& m, const std::vector<std::string>& pieces) {
  std::string out;
  for (const auto& p : pieces) {
    out += m.push(p);
    if (m.stopped()) return out;
  }
  return out + m.flush();
}

TEST(StopMatcher, NoStopsPassesEverythingThrough) {
  StopMatcher m({});
  EXPECT_EQ(m.push("abc"), "abc");
  EXPECT_EQ(m.push(""), "");
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, StopSplitAcrossPieces) {
  StopMatcher m({"###"});
  EXPECT_EQ(m.push("hello #"), "hello ");  // "#" held back
  EXPECT_EQ(m.held(), "#");
  EXPECT_EQ(m.push("#"), "");
  EXPECT_EQ(m.push("# world"), "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.push("more"), "");
}

TEST(StopMatcher, PartialPrefixThatDoesNotCompleteIsReleased) {
  StopMatcher m({"</end>"});
  EXPECT_EQ(m.push("a </e"), "a ");
  EXPECT_EQ(m.push("x>"), "</ex>");
  EXPECT_FALSE(m.stopped());
  StopMatcher m2({"</end>"});
  EXPECT_EQ(run(m2, {"tail </en"}), "tail </en");  // released at the end
  EXPECT_FALSE(m2.stopped());
}

TEST(StopMatcher, EarliestOfMultipleStops) {
  StopMatcher m({"world", "lo w", "xyz"});
  EXPECT_EQ(run(m, {"hel", "lo wor", "ld"}), "hel");
  EXPECT_TRUE(m.stopped());
  StopMatcher m2({"BB", "AAAA"});
  // "AAA" is held as a possible "AAAA", which the next piece completes.
  EXPECT_EQ(run(m2, {"xAAA", "AB"}), "x");
}

TEST(StopMatcher, StopAtVeryStart) {
  StopMatcher m({"\n\n"});
  EXPECT_EQ(m.push("\n\nfoo"), "");
  EXPECT_TRUE(m.stopped());
}

TEST(StopMatcher, OverlappingPrefixHoldsLongestCandidate) {
  // "aab" is the stop; text "aaab": the match starts at index 1.
  StopMatcher m({"aab"});
  std::string out;
  for (char c : std::string("aaab")) out += m.push(std::string(1, c));
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(out, "a");
}

TEST(StopMatcher, MultiByteText) {
  StopMatcher m({"é!"});
  EXPECT_EQ(run(m, {"caf\xc3\xa9", " ok \xc3\xa9", "!x"}), "caf\xc3\xa9 ok ");
}

}  // namespace
}  // namespace qs
