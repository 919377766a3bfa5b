// StreamDecoder: the pushes plus flush concatenate to decode(all ids), and no push returns a
// partial UTF-8 sequence.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "test_util.h"

namespace qs {
namespace {

struct StreamResult {
  std::string text;
  bool all_pieces_valid_utf8 = true;
  std::vector<std::string> pieces;
};

StreamResult stream(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip_special) {
  StreamDecoder decoder(tok, skip_special);
  StreamResult r;
  for (int32_t id : ids) {
    r.pieces.push_back(decoder.push(id));
    r.all_pieces_valid_utf8 = r.all_pieces_valid_utf8 && test::is_valid_utf8(r.pieces.back());
    r.text += r.pieces.back();
  }
  r.pieces.push_back(decoder.flush());
  r.all_pieces_valid_utf8 = r.all_pieces_valid_utf8 && test::is_valid_utf8(r.pieces.back());
  r.text += r.pieces.back();
  return r;
}

class StreamDecoderTest : public ::testing::TestWithParam<std::string> {};

TEST_P(StreamDecoderTest, ConcatenationEqualsDecodeOnCorpus) {
  const auto& tok = test::test_tokenizer(GetParam());
  int failures = 0;
  for (const auto& text : test::corpus()) {
    const auto ids = tok.encode(text, true);
    for (bool skip : {true, false}) {
      const auto r = stream(tok, ids, skip);
      const auto expected = tok.decode(ids, skip);
      if ((r.text != expected || !r.all_pieces_valid_utf8) && ++failures <= 5) {
        ADD_FAILURE() << test::brief(text) << " skip=" << skip << ": streamed "
                      << test::brief(r.text) << " expected " << test::brief(expected);
      }
    }
  }
  EXPECT_EQ(failures, 0);
}

TEST_P(StreamDecoderTest, ConcatenationEqualsDecodeOnRandomIds) {
  const auto& tok = test::test_tokenizer(GetParam());
  std::mt19937 rng(1234);
  const int32_t vocab = tok.vocab_size();
  std::vector<int32_t> byte_like;  // ids of byte pieces / single bytes, to stress UTF-8 joins
  for (int32_t id = 0; id < vocab; ++id) {
    const auto piece = tok.id_to_piece(id);
    if (piece.rfind("<0x", 0) == 0 || (piece.size() == 2 && (uint8_t)piece[0] >= 0xC2)) {
      byte_like.push_back(id);
    }
  }
  ASSERT_FALSE(byte_like.empty());
  int failures = 0;
  for (int trial = 0; trial < 400; ++trial) {
    std::vector<int32_t> ids(std::uniform_int_distribution<int>(1, 60)(rng));
    for (auto& id : ids) {
      const int kind = std::uniform_int_distribution<int>(0, 9)(rng);
      if (kind < 4) {
        id = byte_like[std::uniform_int_distribution<size_t>(0, byte_like.size() - 1)(rng)];
      } else if (kind == 4) {
        id = std::uniform_int_distribution<int32_t>(vocab - 8, vocab + 3)(rng);  // specials, OOR
      } else {
        id = std::uniform_int_distribution<int32_t>(0, vocab - 1)(rng);
      }
    }
    for (bool skip : {true, false}) {
      const auto r = stream(tok, ids, skip);
      const auto expected = tok.decode(ids, skip);
      if ((r.text != expected || !r.all_pieces_valid_utf8) && ++failures <= 5) {
        ADD_FAILURE() << test::ids_to_string(ids) << " skip=" << skip << ": streamed "
                      << test::brief(r.text) << " expected " << test::brief(expected);
      }
    }
  }
  EXPECT_EQ(failures, 0);
}

TEST_P(StreamDecoderTest, MultiByteCharactersAreNeverSplit) {
  const auto& tok = test::test_tokenizer(GetParam());
  const std::string text = "日本語のテキスト 🙂👩‍💻 naïve ελληνικά";
  const auto ids = tok.encode(text, false);
  ASSERT_GT(ids.size(), 10u);
  const auto r = stream(tok, ids, true);
  EXPECT_EQ(r.text, tok.decode(ids, true));
  EXPECT_TRUE(r.all_pieces_valid_utf8);
  // At least one push had to wait for the rest of a character.
  size_t empty_pushes = 0;
  for (size_t i = 0; i + 1 < r.pieces.size(); ++i) empty_pushes += r.pieces[i].empty();
  EXPECT_GT(empty_pushes, 0u);
}

TEST_P(StreamDecoderTest, LongStreamStaysCheap) {
  // 60k tokens: quadratic re-decoding would take minutes; the window keeps it linear.
  const auto& tok = test::test_tokenizer(GetParam());
  std::string text;
  for (int i = 0; i < 3000; ++i) text += "The cache is quantized, 日本 " + std::to_string(i) + ". ";
  const auto ids = tok.encode(text, true);
  ASSERT_GT(ids.size(), 50000u);
  const auto r = stream(tok, ids, true);
  EXPECT_EQ(r.text, tok.decode(ids, true));
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, StreamDecoderTest, ::testing::Values("bytelevel", "spm"));

// The variants use other decoders (Metaspace, no Strip) and pre-tokenizers.
class StreamDecoderVariantTest : public ::testing::TestWithParam<std::string> {};

TEST_P(StreamDecoderVariantTest, ConcatenationEqualsDecode) {
  auto tok = Tokenizer::from_json(test::variant_json(GetParam()).dump());
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  std::mt19937 rng(99);
  int failures = 0;
  const auto texts = test::corpus();
  for (size_t i = 0; i < texts.size(); ++i) {
    auto ids = tok->encode(texts[i], true);
    if (i % 3 == 0 && !ids.empty()) {  // and some random ids mixed in
      ids.insert(ids.begin() + rng() % ids.size(), rng() % tok->vocab_size());
    }
    for (bool skip : {true, false}) {
      const auto r = stream(tok.value(), ids, skip);
      const auto expected = tok->decode(ids, skip);
      if ((r.text != expected || !r.all_pieces_valid_utf8) && ++failures <= 5) {
        ADD_FAILURE() << test::brief(texts[i]) << " skip=" << skip << ": streamed "
                      << test::brief(r.text) << " expected " << test::brief(expected);
      }
    }
  }
  EXPECT_EQ(failures, 0);
}

INSTANTIATE_TEST_SUITE_P(Variants, StreamDecoderVariantTest,
                         ::testing::Values("qwen2", "gpt2", "splits", "spm_first", "spm_always"));

TEST(StreamDecoder, ByteFallbackPiecesWaitForTheWholeCharacter) {
  const auto& tok = test::test_tokenizer("spm");
  // "語" is not in the spm vocabulary: it becomes three byte pieces.
  const auto ids = tok.encode("語", false);
  ASSERT_EQ(tok.id_to_piece(ids.back()).rfind("<0x", 0), 0u) << test::ids_to_string(ids);
  StreamDecoder decoder(tok);
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto piece = decoder.push(ids[i]);
    EXPECT_TRUE(test::is_valid_utf8(piece));
    out += piece;
  }
  out += decoder.flush();
  EXPECT_EQ(out, tok.decode(ids, true));
  EXPECT_NE(out.find("語"), std::string::npos);
}

TEST(StreamDecoder, SkipsSpecialTokensWhenAsked) {
  const auto& tok = test::test_tokenizer("bytelevel");
  const auto ids = tok.encode("<|begin_of_text|>Hello<|eot_id|>", false);
  EXPECT_EQ(stream(tok, ids, true).text, "Hello");
  EXPECT_EQ(stream(tok, ids, false).text, "<|begin_of_text|>Hello<|eot_id|>");
}

// Tokenizer::token_text (the server's log-probability tokens): the text a token adds after other
// text, so a word-initial SentencePiece token keeps its space, which decode() of it alone drops.
TEST_P(StreamDecoderTest, TokenTextIsWhatTheTokenAddsMidText) {
  const auto& tok = test::test_tokenizer(GetParam());
  for (const auto& text : test::corpus()) {
    const auto ids = tok.encode(text, false);
    for (size_t i = 1; i < ids.size(); ++i) {
      const std::vector<int32_t> before(ids.begin(), ids.begin() + i);
      std::vector<int32_t> with = before;
      with.push_back(ids[i]);
      const std::string a = tok.decode(before), b = tok.decode(with);
      // Where the prefix's text is final (no incomplete character, no trailing strip), the
      // token's text is exactly what decoding it after the prefix adds.
      if (b.compare(0, a.size(), a) != 0 || a.find("\xEF\xBF\xBD") != std::string::npos) continue;
      if (tok.id_to_piece(ids[i]).rfind("<0x", 0) == 0 || !test::is_valid_utf8(b.substr(a.size())))
        continue;
      ASSERT_EQ(tok.token_text(ids[i]), b.substr(a.size()))
          << test::brief(text) << " token " << i << " " << tok.id_to_piece(ids[i]);
    }
  }
  EXPECT_EQ(tok.token_text(-1), "");
  EXPECT_EQ(tok.token_text(tok.vocab_size()), "");
}

TEST(TokenText, SentencePieceWordsKeepTheirSpaceAndBytePiecesAreReplacementCharacters) {
  const auto& tok = test::test_tokenizer("spm");
  const auto ids = tok.encode("Hello world", false);
  // The first piece of "world": "\u2581w..." (the Metaspace space marker).
  const auto word = std::find_if(ids.begin() + 1, ids.end(), [&](int32_t id) {
    return tok.id_to_piece(id).rfind("\xE2\x96\x81", 0) == 0;
  });
  ASSERT_NE(word, ids.end()) << test::ids_to_string(ids);
  const std::string piece = tok.id_to_piece(*word).substr(3);
  EXPECT_EQ(tok.decode({*word}), piece);  // alone: the start-of-text rule drops the space
  EXPECT_EQ(tok.token_text(*word), " " + piece);
  const auto bytes = tok.encode("語", false);  // three byte pieces
  ASSERT_EQ(tok.id_to_piece(bytes.back()).rfind("<0x", 0), 0u);
  EXPECT_EQ(tok.token_text(bytes.back()), "\xEF\xBF\xBD");
}

}  // namespace
}  // namespace qs
