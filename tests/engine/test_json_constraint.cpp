// JSON mode: JsonState recognizes exactly the prefixes of one JSON object (checked byte by byte
// and against nlohmann's parser), JsonConstraint's trie walk allows exactly the tokens whose bytes
// the state takes (against a token-by-token check over real vocabularies), and
// Tokenizer::token_bytes spells each token's bytes.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "engine/json_constraint.h"
#include "model/tokenizer/tokenizer.h"

#ifndef QS_SOURCE_DIR
#error "QS_SOURCE_DIR must be defined"
#endif

namespace qs {
namespace {

// Whether all of `text` is taken, and then whether it is complete.
struct Verdict {
  size_t taken = 0;  // bytes taken before the first refused one
  bool complete = false;
};

Verdict run(std::string_view text) {
  JsonState s;
  Verdict v;
  for (char c : text) {
    if (!s.advance(static_cast<uint8_t>(c))) return v;
    ++v.taken;
  }
  v.complete = s.complete();
  return v;
}

const std::vector<std::string> kValid = {
    "{}",
    " \n{ }",
    "{\"a\":1}",
    "{\"a\": -0.5e+10, \"b\": [true, false, null, 0, 12, 3.25, -1E-2], \"c\": {}}",
    "{\"k\": \"esc \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u00e9 \\uABCD\"}",
    "{\"utf8\": \"\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xed\x9f\xbf \xe0\xa0\x80\"}",
    "{\"nested\": [[[]], [{}], {\"x\": [1, {\"y\": \"z\"}]}]}",
    "{\r\n  \"pretty\": [\r\n    1,\r\n    2\r\n  ]\r\n}",
};

TEST(JsonState, TakesWholeObjectsAndCompletesOnlyAtTheirEnd) {
  for (const std::string& doc : kValid) {
    JsonState s;
    for (size_t i = 0; i < doc.size(); ++i) {
      ASSERT_FALSE(s.complete()) << doc << " complete after " << i << " bytes";
      ASSERT_TRUE(s.advance(static_cast<uint8_t>(doc[i]))) << doc << " refused byte " << i;
    }
    EXPECT_TRUE(s.complete()) << doc;
    EXPECT_TRUE(nlohmann::json::accept(doc)) << doc;
  }
}

TEST(JsonState, RefusesAtTheFirstImpossibleByte) {
  struct Case {
    std::string text;
    size_t taken;
  };
  const std::vector<Case> cases = {
      {"[]", 0},                            // the top level is an object
      {"\"s\"", 0},                         //
      {"{a", 1},                            // keys are strings
      {"{\"a\" 1}", 5},                     // a colon after a key
      {"{\"a\":01}", 6},                    // no leading zeros
      {"{\"a\":1.}", 7},                    // a fraction has digits
      {"{\"a\":1e}", 7},                    //
      {"{\"a\":-}", 6},                     //
      {"{\"a\":tru}", 8},                   //
      {"{\"a\":nul1}", 8},                  //
      {"{\"a\":\"\x01\"}", 6},              // control characters are escaped
      {"{\"a\":\"\\x\"}", 7},               // an unknown escape
      {"{\"a\":\"\\u12G4\"}", 10},          // four hex digits
      {"{\"a\":\"\xc0\x80\"}", 6},          // an overlong lead byte
      {"{\"a\":\"\xe0\x80\x80\"}", 7},      // an overlong three-byte form
      {"{\"a\":\"\xed\xa0\x80\"}", 7},      // a surrogate
      {"{\"a\":\"\xf4\x90\x80\x80\"}", 7},  // past U+10FFFF
      {"{\"a\":\"\xf5\"}", 6},              //
      {"{\"a\":\"\xc3\"}", 7},              // a sequence cut short
      {"{}}", 2},                           // nothing after the object
      {"{} ", 2},                           // not even whitespace
      {"{\"a\":[1,]}", 8},                  // no trailing comma
      {"{,}", 1},                           //
      {"{\"a\":[}", 6},                     // closers match their openers
      {"{\"a\":{]", 6},                     //
      {"{\"a\":1,}", 7},                    //
  };
  for (const Case& c : cases) {
    const Verdict v = run(c.text);
    EXPECT_EQ(v.taken, c.taken) << c.text;
    EXPECT_FALSE(v.complete) << c.text;
  }
}

TEST(JsonState, BoundsWhitespaceRunsAndNesting) {
  const std::string ws(kJsonMaxWhitespace, ' ');
  EXPECT_TRUE(run("{" + ws + "}").complete);
  EXPECT_EQ(run("{" + ws + " }").taken, 1u + kJsonMaxWhitespace);
  EXPECT_TRUE(run("{" + ws + "\"a\"" + ws + ":" + ws + "1" + ws + "}").complete);  // per run
  // The object itself is depth 1: kJsonMaxDepth - 1 arrays fit inside it, one more does not.
  const int arrays = kJsonMaxDepth - 1;
  const std::string deep = "{\"a\":" + std::string(arrays, '[') + std::string(arrays, ']') + "}";
  EXPECT_TRUE(run(deep).complete);
  EXPECT_EQ(run("{\"a\":" + std::string(arrays + 1, '[')).taken, 5u + arrays);
}

// Against nlohmann's parser on mutations of the valid documents: a whole text is complete exactly
// when it is one JSON object (texts outside the two bounds, with trailing whitespace, or with
// \u escapes, whose surrogate pairing nlohmann checks and the grammar does not, are skipped).
TEST(JsonState, AgreesWithAParserOnMutatedDocuments) {
  std::mt19937 rng(5);
  const std::string alphabet = "{}[]\":,-+.0123456789eEtrufalsn\\ \n\xc3\xa9\x80\x01ax";
  int checked = 0, objects = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    std::string t = kValid[rng() % kValid.size()];
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits && !t.empty(); ++e) {
      const size_t at = rng() % t.size();
      const char c = alphabet[rng() % alphabet.size()];
      switch (rng() % 3) {
        case 0:
          t[at] = c;
          break;
        case 1:
          t.insert(t.begin() + static_cast<std::ptrdiff_t>(at), c);
          break;
        default:
          t.erase(at, 1);
          break;
      }
    }
    if (t.empty() || t.find("\\u") != std::string::npos) continue;
    const char last = t.back();
    if (last == ' ' || last == '\n' || last == '\r' || last == '\t') continue;
    bool parser = false;
    try {
      parser = nlohmann::json::parse(t).is_object();
    } catch (const nlohmann::json::out_of_range&) {
      continue;  // a number past a double's range: JSON's grammar has no bound
    } catch (const nlohmann::json::exception&) {
    }
    EXPECT_EQ(run(t).complete, parser) << nlohmann::json(t).dump(-1, ' ', true);
    ++checked;
    objects += parser;
  }
  EXPECT_GT(checked, 15000);
  EXPECT_GT(objects, 500);  // both verdicts are common
}

// Every byte prefix of the documents: the states a generation meets.
std::vector<JsonState> states_of_documents() {
  std::vector<JsonState> out;
  for (const std::string& doc : kValid) {
    JsonState s;
    out.push_back(s);
    for (char c : doc) {
      EXPECT_TRUE(s.advance(static_cast<uint8_t>(c)));
      out.push_back(s);
    }
  }
  return out;
}

class JsonVocab : public ::testing::TestWithParam<const char*> {
 protected:
  Tokenizer tokenizer = [] {
    auto t =
        Tokenizer::load(std::filesystem::path(QS_SOURCE_DIR) / "models/tokenizers" / GetParam());
    EXPECT_TRUE(t.ok()) << t.error().message;
    return std::move(t).value();
  }();
};

TEST_P(JsonVocab, TokenBytesSpellTheText) {
  const std::string text =
      "{\"k\": [1, -2.5e3], \"s\": \"caf\xc3\xa9 \xe2\x82\xac\xf0\x9f\x98\x80\"}";
  const std::vector<int32_t> ids = tokenizer.encode(text, false);
  std::string joined;
  for (int32_t id : ids) joined += tokenizer.token_bytes(id);
  // A SentencePiece-style vocabulary spells the text with its prefix space.
  EXPECT_TRUE(joined == text || joined == " " + text) << joined;
}

TEST_P(JsonVocab, TheTrieWalkAllowsExactlyTheTokensTheStateTakes) {
  const int vocab = tokenizer.vocab_size() + 3;  // logit rows past the tokenizer's: never allowed
  const std::vector<int32_t> eos = tokenizer.eos_ids();
  auto made = JsonConstraint::create(tokenizer, vocab, eos);
  ASSERT_TRUE(made.ok()) << made.error().message;
  JsonConstraint& json = **made;
  std::vector<bool> is_eos(static_cast<size_t>(vocab), false);
  for (int32_t id : eos) is_eos[static_cast<size_t>(id)] = true;
  int states = 0;
  for (const JsonState& s : states_of_documents()) {
    const std::vector<uint64_t> bits = json.allowed(s);  // a copy: the cache may move on
    int allowed = 0;
    for (int32_t id = 0; id < vocab; ++id) {
      const bool got = (bits[static_cast<size_t>(id) / 64] >> (id % 64)) & 1u;
      bool want = false;
      if (s.complete()) {
        want = is_eos[static_cast<size_t>(id)];
      } else if (id < tokenizer.vocab_size() && !tokenizer.is_special(id)) {
        const std::string b = tokenizer.token_bytes(id);
        JsonState t = s;
        want = !b.empty() && t.advance(b);
        JsonState u = s;
        EXPECT_EQ(json.advance(u, id), want) << "token " << id;
        if (want) {
          EXPECT_TRUE(u == t);
        }
      }
      ASSERT_EQ(got, want) << "token " << id << " '" << tokenizer.token_bytes(id) << "'";
      allowed += got;
    }
    EXPECT_GT(allowed, 0);
    ++states;
  }
  EXPECT_GT(states, 250);
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, JsonVocab, ::testing::Values("bytelevel", "spm"));

TEST(JsonConstraint, SmallVocabularies) {
  auto t = Tokenizer::load(std::filesystem::path(QS_SOURCE_DIR) / "models/tokenizers/bytelevel");
  ASSERT_TRUE(t.ok());
  std::vector<std::string> bytes{"{", "}", "\""};
  JsonConstraint small(bytes, {});
  JsonState s;
  EXPECT_TRUE(small.advance(s, 0));
  EXPECT_FALSE(small.advance(s, 0));  // "{{"
  EXPECT_TRUE(small.advance(s, 1));
  EXPECT_TRUE(s.complete());
  // A vocabulary of one token cannot spell every byte JSON needs.
  auto clipped = JsonConstraint::create(*t, 1, {});
  ASSERT_FALSE(clipped.ok());
  EXPECT_NE(clipped.error().message.find("no token for the single byte"), std::string::npos)
      << clipped.error().message;
}

}  // namespace
}  // namespace qs
