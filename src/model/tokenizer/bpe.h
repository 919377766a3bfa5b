// The BPE model of tokenizer.json: vocabulary, ranked merges, byte fallback, unk fusing and
// Llama-3's ignore_merges. Words are merged with a priority queue (lowest rank, then leftmost),
// exactly as HF's Word::merge_all, so the ids are identical.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/error.h"

namespace qs::tok {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringIdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  static Result<BpeModel> parse(const nlohmann::json& model);

  // Appends the ids of one pre-token (non-empty, valid UTF-8).
  void tokenize(std::string_view word, std::vector<int32_t>& out) const;

  int32_t token_to_id(std::string_view token) const;  // -1 if absent
  // Vocabulary strings by id ("" for ids the vocabulary skips); size = max id + 1.
  const std::vector<std::string>& pieces() const { return pieces_; }

  BpeModel() = default;
  BpeModel(BpeModel&& other) noexcept;
  BpeModel& operator=(BpeModel&& other) noexcept;

 private:
  struct MergeTarget {
    int32_t rank;
    int32_t new_id;
  };
  void tokenize_piece(std::string_view word, std::vector<int32_t>& out) const;  // cached
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;

  StringIdMap vocab_;
  std::vector<std::string> pieces_;
  std::unordered_map<uint64_t, MergeTarget> merges_;  // key: (left id << 32) | right id
  int32_t unk_id_ = -1;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  std::array<int32_t, 256> byte_ids_{};  // ids of "<0xXX>", -1 where missing
  // True when no token holds "▁" after another character except "▁": then no merge crosses a
  // boundary "x|▁" (x != ▁), and long SentencePiece-style words (no pre-tokenizer) are merged
  // piece by piece, which gives the same ids much faster.
  bool split_before_metaspace_ = false;

  // Results for short words; bounded by clearing (HF caches words < 256 bytes too).
  static constexpr size_t kCacheMaxWordBytes = 256;
  static constexpr size_t kCacheMaxEntries = 1 << 16;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace qs::tok
