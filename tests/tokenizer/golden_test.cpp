// Exact equality with HF `tokenizers` on the committed corpus (goldens written by
// tools/tokenizer/make_goldens.py).
#include <gtest/gtest.h>

#include "test_util.h"

namespace qs {
namespace {

using test::Json;

// Compares one golden row; returns a description of the first difference, "" if equal.
std::string check_row(const Tokenizer& tok, const std::string& text, const Json& row) {
  const auto ids = tok.encode(text, false);
  const auto expected_ids = row["ids"].get<std::vector<int32_t>>();
  if (ids != expected_ids) {
    return "ids " + test::ids_to_string(ids) + " != " + test::ids_to_string(expected_ids);
  }
  const auto ids_special = tok.encode(text, true);
  const auto expected_special = row["ids_special"].get<std::vector<int32_t>>();
  if (ids_special != expected_special) {
    return "ids_special " + test::ids_to_string(ids_special) +
           " != " + test::ids_to_string(expected_special);
  }
  const auto decoded = tok.decode(ids_special, false);
  if (decoded != row["decoded"].get<std::string>()) {
    return "decoded " + test::brief(decoded) + " != " + test::brief(row["decoded"]);
  }
  const auto decoded_skip = tok.decode(ids_special, true);
  if (decoded_skip != row["decoded_skip"].get<std::string>()) {
    return "decoded_skip " + test::brief(decoded_skip) + " != " + test::brief(row["decoded_skip"]);
  }
  return "";
}

void expect_rows_match(const Tokenizer& tok, const std::vector<std::string>& texts,
                       const std::vector<Json>& rows, bool indexed) {
  int failures = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    const size_t index = indexed ? rows[r]["index"].get<size_t>() : r;
    ASSERT_LT(index, texts.size());
    const std::string diff = check_row(tok, texts[index], rows[r]);
    if (!diff.empty() && ++failures <= 5) {
      ADD_FAILURE() << "corpus line " << index << " " << test::brief(texts[index]) << ": " << diff;
    }
  }
  EXPECT_EQ(failures, 0) << "of " << rows.size() << " corpus strings";
}

class GoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTest, EncodeAndDecodeMatchHuggingFace) {
  const auto texts = test::corpus();
  ASSERT_GE(texts.size(), 600u);
  const auto rows =
      test::read_jsonl(test::source_path("tests/data/tokenizer/golden_" + GetParam() + ".jsonl"));
  ASSERT_EQ(rows.size(), texts.size());
  expect_rows_match(test::test_tokenizer(GetParam()), texts, rows, false);
}

TEST_P(GoldenTest, DecodeOfArbitraryIdsMatchesHuggingFace) {
  const auto& tok = test::test_tokenizer(GetParam());
  const auto rows = test::read_jsonl(
      test::source_path("tests/data/tokenizer/golden_decode_" + GetParam() + ".jsonl"));
  ASSERT_GT(rows.size(), 100u);
  int failures = 0;
  for (const auto& row : rows) {
    const auto ids = row["ids"].get<std::vector<int32_t>>();
    const auto decoded = tok.decode(ids, false);
    const auto decoded_skip = tok.decode(ids, true);
    if ((decoded != row["decoded"] || decoded_skip != row["decoded_skip"]) && ++failures <= 5) {
      ADD_FAILURE() << test::ids_to_string(ids) << ": got " << test::brief(decoded) << " / "
                    << test::brief(decoded_skip) << ", expected " << test::brief(row["decoded"])
                    << " / " << test::brief(row["decoded_skip"]);
    }
  }
  EXPECT_EQ(failures, 0);
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, GoldenTest, ::testing::Values("bytelevel", "spm"));

class VariantTest : public ::testing::TestWithParam<std::string> {};

TEST_P(VariantTest, EncodeAndDecodeMatchHuggingFace) {
  auto tok = Tokenizer::from_json(test::variant_json(GetParam()).dump());
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  const auto rows = test::read_jsonl(
      test::source_path("tests/data/tokenizer/golden_variant_" + GetParam() + ".jsonl"));
  ASSERT_GT(rows.size(), 500u);
  expect_rows_match(tok.value(), test::corpus(), rows, true);
}

INSTANTIATE_TEST_SUITE_P(Variants, VariantTest,
                         ::testing::Values("qwen2", "gpt2", "splits", "spm_first", "spm_always"));

TEST(TokenizerMetadata, ByteLevel) {
  const auto& tok = test::test_tokenizer("bytelevel");
  EXPECT_EQ(tok.vocab_size(), 2048);
  EXPECT_EQ(tok.id_to_piece(tok.bos_id()), "<|begin_of_text|>");
  const auto eos = tok.eos_ids();
  ASSERT_FALSE(eos.empty());
  EXPECT_EQ(tok.id_to_piece(eos[0]), "<|end_of_text|>");  // tokenizer_config.json first
  EXPECT_NE(std::find(eos.begin(), eos.end(), tok.encode("<|eot_id|>", false)[0]), eos.end());
  EXPECT_TRUE(tok.is_special(tok.bos_id()));
  const int32_t think = tok.encode("<think>", false).at(0);
  EXPECT_EQ(tok.id_to_piece(think), "<think>");
  EXPECT_FALSE(tok.is_special(think));
  EXPECT_EQ(tok.id_to_piece(-1), "");
  EXPECT_EQ(tok.id_to_piece(2048), "");
}

TEST(TokenizerMetadata, SentencePiece) {
  const auto& tok = test::test_tokenizer("spm");
  EXPECT_EQ(tok.vocab_size(), 2048);
  EXPECT_EQ(tok.bos_id(), 1);
  ASSERT_FALSE(tok.eos_ids().empty());
  EXPECT_EQ(tok.eos_ids()[0], 2);
  EXPECT_EQ(tok.id_to_piece(0), "<unk>");
  EXPECT_EQ(tok.id_to_piece(3), "<0x00>");
  EXPECT_EQ(tok.id_to_piece(258), "<0xFF>");
  EXPECT_TRUE(tok.is_special(1));
  EXPECT_FALSE(tok.is_special(3));
  EXPECT_EQ(tok.encode("", true), std::vector<int32_t>{1});
  EXPECT_TRUE(tok.encode("", false).empty());
}

TEST(TokenizerMetadata, FromJsonWithoutConfigTakesBosFromTemplate) {
  const std::string json = test::read_text(test::tokenizer_dir("spm") + "/tokenizer.json");
  auto tok = Tokenizer::from_json(json);
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->encode("hi", true).front(), 1);
}

}  // namespace
}  // namespace qs
