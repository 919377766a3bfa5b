// Bad input gives a clear error (never a crash); invalid UTF-8 text is encoded as HF would
// encode its lossy conversion.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "model/tokenizer/unicode.h"
#include "test_util.h"

namespace qs {
namespace {

using test::Json;

std::string error_of(const Json& tokenizer_json, const std::string& config = "") {
  auto tok = Tokenizer::from_json(tokenizer_json.dump(), config);
  return tok.ok() ? std::string("<no error>") : tok.error().message;
}

Json base_json(const std::string& name) {
  return Json::parse(test::read_text(test::tokenizer_dir(name) + "/tokenizer.json"));
}

TEST(TokenizerErrors, MissingDirectory) {
  auto tok = Tokenizer::load(test::source_path("models/tokenizers/does-not-exist"));
  ASSERT_FALSE(tok.ok());
  EXPECT_NE(tok.error().message.find("tokenizer.json"), std::string::npos) << tok.error().message;
  EXPECT_NE(tok.error().message.find("not found"), std::string::npos) << tok.error().message;
}

TEST(TokenizerErrors, CorruptJson) {
  const std::string text = test::read_text(test::tokenizer_dir("spm") + "/tokenizer.json");
  for (size_t cut : {size_t{0}, size_t{1}, text.size() / 2, text.size() - 2}) {
    auto tok = Tokenizer::from_json(text.substr(0, cut));
    ASSERT_FALSE(tok.ok()) << "cut at " << cut;
    EXPECT_NE(tok.error().message.find("invalid JSON"), std::string::npos) << tok.error().message;
  }
  auto tok = Tokenizer::from_json("[1, 2, 3]");
  ASSERT_FALSE(tok.ok());
  auto bad_config = Tokenizer::from_json(text, "{\"bos_token\": ");
  ASSERT_FALSE(bad_config.ok());
  EXPECT_NE(bad_config.error().message.find("tokenizer_config.json"), std::string::npos);
}

TEST(TokenizerErrors, CorruptFileOnDisk) {
  const auto dir = std::filesystem::temp_directory_path() / "qs_tokenizer_corrupt_test";
  std::filesystem::create_directories(dir);
  {
    std::ofstream out(dir / "tokenizer.json");
    out << "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [";
  }
  auto tok = Tokenizer::load(dir);
  std::filesystem::remove_all(dir);
  ASSERT_FALSE(tok.ok());
  EXPECT_NE(tok.error().message.find("invalid JSON"), std::string::npos) << tok.error().message;
}

TEST(TokenizerErrors, UnknownComponentsAreNamed) {
  Json j = base_json("bytelevel");
  j["model"]["type"] = "Unigram";
  EXPECT_NE(error_of(j).find("'Unigram'"), std::string::npos) << error_of(j);

  j = base_json("bytelevel");
  j["pre_tokenizer"] = {{"type", "BertPreTokenizer"}};
  EXPECT_NE(error_of(j).find("pre_tokenizer type 'BertPreTokenizer'"), std::string::npos)
      << error_of(j);

  j = base_json("bytelevel");
  j["pre_tokenizer"]["pretokenizers"][1] = {{"type", "Whitespace"}};
  EXPECT_NE(error_of(j).find("'Whitespace'"), std::string::npos) << error_of(j);

  j = base_json("spm");
  j["normalizer"]["normalizers"][0] = {{"type", "Precompiled"}, {"precompiled_charsmap", ""}};
  EXPECT_NE(error_of(j).find("normalizer type 'Precompiled'"), std::string::npos) << error_of(j);

  j = base_json("spm");
  j["decoder"] = {{"type", "WordPiece"}, {"prefix", "##"}};
  EXPECT_NE(error_of(j).find("decoder type 'WordPiece'"), std::string::npos) << error_of(j);

  j = base_json("spm");
  j["post_processor"] = {{"type", "Mystery"}};
  EXPECT_NE(error_of(j).find("post_processor type 'Mystery'"), std::string::npos) << error_of(j);
}

TEST(TokenizerErrors, BadFields) {
  Json j = base_json("spm");
  j["model"]["merges"].push_back("nosuchtoken x");
  EXPECT_NE(error_of(j).find("not in the vocab"), std::string::npos) << error_of(j);

  j = base_json("spm");
  j["model"]["merges"][0] = 42;
  EXPECT_NE(error_of(j).find("merge #0"), std::string::npos) << error_of(j);

  j = base_json("spm");
  j["model"].erase("vocab");
  EXPECT_NE(error_of(j).find("'vocab'"), std::string::npos) << error_of(j);

  j = base_json("spm");
  j["model"]["unk_token"] = "<nope>";
  EXPECT_NE(error_of(j).find("unk_token"), std::string::npos) << error_of(j);

  j = base_json("bytelevel");
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  EXPECT_NE(error_of(j).find("invalid regex"), std::string::npos) << error_of(j);

  j = base_json("bytelevel");
  j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Sideways";
  EXPECT_NE(error_of(j).find("Sideways"), std::string::npos) << error_of(j);

  j = base_json("bytelevel");
  j["model"]["continuing_subword_prefix"] = "##";
  EXPECT_NE(error_of(j).find("continuing_subword_prefix"), std::string::npos) << error_of(j);

  j = base_json("bytelevel");
  j["added_tokens"][0].erase("id");
  EXPECT_NE(error_of(j).find("'id'"), std::string::npos) << error_of(j);

  EXPECT_NE(error_of(base_json("spm"), R"({"bos_token": "<nope>"})").find("bos_token '<nope>'"),
            std::string::npos);
  EXPECT_NE(error_of(base_json("spm"), R"({"eos_token": 7})").find("eos_token"), std::string::npos);
}

TEST(TokenizerErrors, ConfigTokenObjectsAndStrings) {
  auto tok = Tokenizer::from_json(base_json("spm").dump(),
                                  R"({"bos_token": {"content": "</s>"}, "eos_token": "<s>"})");
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  EXPECT_EQ(tok->bos_id(), 2);
  EXPECT_EQ(tok->eos_ids().at(0), 1);
}

TEST(TokenizerInput, InvalidUtf8IsEncodedAsItsLossyConversion) {
  std::mt19937 rng(7);
  const std::vector<std::string> fixed = {"\xFF",
                                          "\xC0\x80",
                                          "abc\xE5\x8F",
                                          "\xED\xA0\x80x",
                                          "\xF4\x90\x80\x80",
                                          "\x80\x80\x80",
                                          "ok\xF0\x9F\x99",
                                          std::string("nul\0byte", 8)};
  for (const char* name : {"bytelevel", "spm"}) {
    const auto& tok = test::test_tokenizer(name);
    auto check = [&](const std::string& bytes) {
      const auto ids = tok.encode(bytes, true);
      EXPECT_EQ(ids, tok.encode(unicode::utf8_lossy(bytes), true)) << name;
      EXPECT_TRUE(test::is_valid_utf8(tok.decode(ids, false)));
    };
    for (const auto& s : fixed) check(s);
    for (int trial = 0; trial < 300; ++trial) {
      std::string bytes(std::uniform_int_distribution<int>(0, 40)(rng), '\0');
      for (auto& c : bytes) c = static_cast<char>(std::uniform_int_distribution<int>(0, 255)(rng));
      check(bytes);
    }
  }
}

TEST(TokenizerInput, OutOfRangeIdsDecodeToNothing) {
  const auto& tok = test::test_tokenizer("bytelevel");
  const auto hello = tok.encode("Hello", false);
  std::vector<int32_t> ids = {-5, hello[0], 1 << 30, 2048};
  ids.insert(ids.end(), hello.begin() + 1, hello.end());
  EXPECT_EQ(tok.decode(ids), "Hello");
}

}  // namespace
}  // namespace qs
