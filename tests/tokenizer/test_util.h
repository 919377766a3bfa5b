// Shared helpers for the tokenizer tests: committed data files and the test tokenizers.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "model/tokenizer/tokenizer.h"

namespace qs::test {

using Json = nlohmann::json;

inline std::string source_path(const std::string& relative) {
  return std::string(QS_SOURCE_DIR) + "/" + relative;
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::vector<Json> read_jsonl(const std::string& path) {
  std::vector<Json> rows;
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) rows.push_back(Json::parse(line));
  }
  return rows;
}

inline std::vector<std::string> corpus() {
  std::vector<std::string> texts;
  for (const auto& row : read_jsonl(source_path("tests/data/tokenizer/corpus.jsonl"))) {
    texts.push_back(row["text"].get<std::string>());
  }
  return texts;
}

inline std::string tokenizer_dir(const std::string& name) {
  return source_path("models/tokenizers/" + name);
}

// The committed test tokenizers, loaded once.
inline const Tokenizer& test_tokenizer(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto it = cache.find(name);
  if (it == cache.end()) {
    auto loaded = Tokenizer::load(tokenizer_dir(name));
    if (!loaded.ok()) ADD_FAILURE() << loaded.error().message;
    QS_CHECK(loaded.ok());
    it = cache.emplace(name, std::make_unique<Tokenizer>(std::move(loaded).value())).first;
  }
  return *it->second;
}

// A variant tokenizer.json from tests/data/tokenizer/variants.json: its base with top-level
// parts replaced ("model.<key>" replaces a model field).
inline Json variant_json(const std::string& name) {
  const Json variants = Json::parse(read_text(source_path("tests/data/tokenizer/variants.json")));
  const Json& variant = variants.at(name);
  Json j = Json::parse(
      read_text(tokenizer_dir(variant.at("base").get<std::string>()) + "/tokenizer.json"));
  for (const auto& [key, value] : variant.at("patch").items()) {
    if (key.rfind("model.", 0) == 0) {
      j["model"][key.substr(6)] = value;
    } else {
      j[key] = value;
    }
  }
  return j;
}

// A JSON-quoted, length-limited form of `text` for failure messages.
inline std::string brief(const std::string& text, size_t max_chars = 160) {
  std::string quoted = Json(text).dump(-1, ' ', false, Json::error_handler_t::replace);
  if (quoted.size() > max_chars) quoted = quoted.substr(0, max_chars) + "...";
  return quoted;
}

inline std::string ids_to_string(const std::vector<int32_t>& ids) {
  std::ostringstream s;
  s << "[";
  for (size_t i = 0; i < ids.size() && i < 40; ++i) s << (i ? "," : "") << ids[i];
  s << (ids.size() > 40 ? ",...]" : "]");
  return s.str();
}

inline bool is_valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (int k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

}  // namespace qs::test
