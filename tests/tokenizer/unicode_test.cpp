// UTF-8 helpers and Unicode normalization (reference values from the Unicode standard).
#include "model/tokenizer/unicode.h"

#include <gtest/gtest.h>

#include "model/tokenizer/regex.h"

namespace qs {
namespace {

using unicode::NormalForm;

TEST(Utf8Lossy, ReplacesEachMaximalInvalidSubpart) {
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(unicode::utf8_lossy("abc"), "abc");
  EXPECT_EQ(unicode::utf8_lossy("\xE5\x8F"), r);  // truncated 3-byte sequence
  EXPECT_EQ(unicode::utf8_lossy("\xE5\x8F"
                                "A"),
            r + "A");
  EXPECT_EQ(unicode::utf8_lossy("\xE5\x8F\xAB"), "\xE5\x8F\xAB");
  EXPECT_EQ(unicode::utf8_lossy("\xED\xA0\x80"), r + r + r);  // surrogate: 3 subparts
  EXPECT_EQ(unicode::utf8_lossy("\xC0\x80"), r + r);          // overlong
  EXPECT_EQ(unicode::utf8_lossy("\xF0\x9F\x99"), r);
  EXPECT_EQ(unicode::utf8_lossy("\xF4\x90\x80\x80"), r + r + r + r);  // > U+10FFFF
}

TEST(Normalize, CanonicalAndCompatibilityForms) {
  // U+1E9B U+0323 is the standard's example of the four forms differing.
  const std::string s = "\u1E9B\u0323";
  EXPECT_EQ(unicode::normalize(s, NormalForm::kNfc), "\u1E9B\u0323");
  EXPECT_EQ(unicode::normalize(s, NormalForm::kNfd), "\u017F\u0323\u0307");
  EXPECT_EQ(unicode::normalize(s, NormalForm::kNfkc), "\u1E69");
  EXPECT_EQ(unicode::normalize(s, NormalForm::kNfkd), "s\u0323\u0307");
  EXPECT_EQ(unicode::normalize("e\u0301", NormalForm::kNfc), "\u00E9");
  EXPECT_EQ(unicode::normalize("\u00E9", NormalForm::kNfd), "e\u0301");
  EXPECT_EQ(unicode::normalize("\u212B", NormalForm::kNfc), "\u00C5");              // singleton
  EXPECT_EQ(unicode::normalize("\uD55C", NormalForm::kNfd), "\u1112\u1161\u11AB");  // Hangul
  EXPECT_EQ(unicode::normalize("\u1112\u1161\u11AB", NormalForm::kNfc), "\uD55C");
  EXPECT_EQ(unicode::normalize("a\u0301\u0323", NormalForm::kNfc), "\u1EA1\u0301");  // reorder
  EXPECT_EQ(unicode::normalize("\uFB01", NormalForm::kNfkc), "fi");
  EXPECT_EQ(unicode::normalize("\u0958", NormalForm::kNfc), "\u0915\u093C");  // exclusion
}

TEST(Regex, WhiteSpaceFollowsOnigurumaNotPcre) {
  auto re = Regex::compile(R"(\s+)");
  ASSERT_TRUE(re.ok());
  // U+180E is not White_Space; U+0085 and U+3000 are.
  EXPECT_TRUE(re->find_all("a\u180Eb").empty());
  EXPECT_EQ(re->find_all("a\u0085\u3000b").size(), 1u);
  auto negated = Regex::compile(R"([^\s\p{L}]+)");
  ASSERT_TRUE(negated.ok());
  EXPECT_EQ(negated->find_all("a \u180E b").size(), 1u);
}

TEST(Regex, InvalidPatternIsAnError) {
  auto re = Regex::compile("(a");
  ASSERT_FALSE(re.ok());
  EXPECT_NE(re.error().message.find("(a"), std::string::npos);
}

}  // namespace
}  // namespace qs
