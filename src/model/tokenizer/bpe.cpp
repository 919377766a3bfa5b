#include "model/tokenizer/bpe.h"

#include <cstdio>
#include <queue>

#include "model/tokenizer/json_util.h"
#include "model/tokenizer/unicode.h"

namespace qs::tok {

namespace {

constexpr std::string_view kMetaspace = "\xE2\x96\x81";  // U+2581

}  // namespace

BpeModel::BpeModel(BpeModel&& other) noexcept {
  *this = std::move(other);
}

BpeModel& BpeModel::operator=(BpeModel&& other) noexcept {
  vocab_ = std::move(other.vocab_);
  pieces_ = std::move(other.pieces_);
  merges_ = std::move(other.merges_);
  unk_id_ = other.unk_id_;
  byte_fallback_ = other.byte_fallback_;
  fuse_unk_ = other.fuse_unk_;
  ignore_merges_ = other.ignore_merges_;
  byte_ids_ = other.byte_ids_;
  split_before_metaspace_ = other.split_before_metaspace_;
  cache_.clear();
  return *this;
}

Result<BpeModel> BpeModel::parse(const Json& model) {
  const std::string where = "tokenizer.json: model BPE";
  BpeModel bpe;
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto it = model.find(key);
    if (it != model.end() && !it->is_null() &&
        !(it->is_string() && it->get<std::string>().empty())) {
      return make_error(where + ": '" + key + "' is not supported");
    }
  }
  if (auto it = model.find("dropout");
      it != model.end() && it->is_number() && it->get<double>() > 0.0) {
    return make_error(where + ": 'dropout' > 0 is not supported (inference is deterministic)");
  }
  QS_ASSIGN_OR_RETURN(bpe.byte_fallback_, get_bool(model, "byte_fallback", false, where));
  QS_ASSIGN_OR_RETURN(bpe.fuse_unk_, get_bool(model, "fuse_unk", false, where));
  QS_ASSIGN_OR_RETURN(bpe.ignore_merges_, get_bool(model, "ignore_merges", false, where));

  auto vocab = model.find("vocab");
  if (vocab == model.end() || !vocab->is_object()) {
    return make_error(where + ": field 'vocab' must be an object of token -> id");
  }
  if (vocab->empty()) return make_error(where + ": field 'vocab' is empty");
  int64_t max_id = -1;
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() > INT32_MAX) {
      return make_error(where + ": vocab['" + it.key() + "'] must be a non-negative integer id");
    }
    const int64_t id = it.value().get<int64_t>();
    bpe.vocab_[it.key()] = static_cast<int32_t>(id);
    max_id = std::max(max_id, id);
  }
  if (max_id >= (1 << 26)) return make_error(where + ": vocab ids too large");
  bpe.pieces_.assign(max_id + 1, std::string());
  for (const auto& [token, id] : bpe.vocab_) bpe.pieces_[id] = token;

  auto merges = model.find("merges");
  if (merges == model.end() || !merges->is_array()) {
    return make_error(where + ": field 'merges' must be an array");
  }
  int32_t rank = 0;
  for (const auto& m : *merges) {
    std::string left, right;
    if (m.is_string()) {
      const auto s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos) {
        return make_error(where + ": merge '" + s + "' is not \"left right\"");
      }
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      return make_error(where + ": merge #" + std::to_string(rank) +
                        " must be \"left right\" or [left, right]");
    }
    const int32_t a = bpe.token_to_id(left), b = bpe.token_to_id(right);
    const int32_t merged = bpe.token_to_id(left + right);
    if (a < 0 || b < 0 || merged < 0) {
      return make_error(where + ": merge #" + std::to_string(rank) + " ('" + left + "', '" + right +
                        "') uses a token that is not in the vocab");
    }
    // A repeated pair keeps its last rank, as HF's HashMap insert does.
    bpe.merges_[(static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b)] = {rank, merged};
    ++rank;
  }

  if (auto it = model.find("unk_token"); it != model.end() && it->is_string()) {
    bpe.unk_id_ = bpe.token_to_id(it->get<std::string>());
    if (bpe.unk_id_ < 0) {
      return make_error(where + ": unk_token '" + it->get<std::string>() + "' is not in the vocab");
    }
  }
  bpe.split_before_metaspace_ = !bpe.ignore_merges_ && bpe.token_to_id(kMetaspace) >= 0;
  for (const auto& [token, id] : bpe.vocab_) {
    for (size_t pos = token.find(kMetaspace, 1); pos != std::string::npos;
         pos = token.find(kMetaspace, pos + 1)) {
      if (pos < kMetaspace.size() ||
          token.compare(pos - kMetaspace.size(), kMetaspace.size(), kMetaspace) != 0) {
        bpe.split_before_metaspace_ = false;
      }
    }
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    bpe.byte_ids_[b] = bpe.token_to_id(name);
  }
  return bpe;
}

int32_t BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  return it == vocab_.end() ? -1 : it->second;
}

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (const int32_t id = token_to_id(word); id >= 0) {
      out.push_back(id);
      return;
    }
  }
  if (word.size() >= kCacheMaxWordBytes) {
    if (split_before_metaspace_) {
      size_t start = 0;
      for (size_t pos = word.find(kMetaspace, 1); pos != std::string_view::npos;
           pos = word.find(kMetaspace, pos + kMetaspace.size())) {
        if (pos >= kMetaspace.size() &&
            word.compare(pos - kMetaspace.size(), kMetaspace.size(), kMetaspace) == 0) {
          continue;  // inside a run of "▁": merges may join it
        }
        tokenize_piece(word.substr(start, pos - start), out);
        start = pos;
      }
      tokenize_piece(word.substr(start), out);
      return;
    }
    merge_word(word, out);
    return;
  }
  tokenize_piece(word, out);
}

void BpeModel::tokenize_piece(std::string_view word, std::vector<int32_t>& out) const {
  if (word.size() >= kCacheMaxWordBytes) {
    merge_word(word, out);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (auto it = cache_.find(word); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  merge_word(word, ids);
  out.insert(out.end(), ids.begin(), ids.end());
  std::lock_guard<std::mutex> lock(cache_mutex_);
  if (cache_.size() >= kCacheMaxEntries) cache_.clear();
  cache_.emplace(std::string(word), std::move(ids));
}

void BpeModel::merge_word(std::string_view word, std::vector<int32_t>& out) const {
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    bool removed;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  auto add = [&](int32_t id) {
    const auto n = static_cast<int32_t>(symbols.size());
    if (n > 0) symbols.back().next = n;
    symbols.push_back({id, n - 1, -1, false});
  };

  // Characters -> initial symbols; unknown ones go to byte fallback, else (fused) unk.
  bool pending_unk = false;
  for (size_t pos = 0; pos < word.size();) {
    const int len = unicode::utf8_sequence_length(static_cast<uint8_t>(word[pos]));
    const std::string_view ch = word.substr(pos, len);
    pos += len;
    if (const int32_t id = token_to_id(ch); id >= 0) {
      if (pending_unk) {
        add(unk_id_);
        pending_unk = false;
      }
      add(id);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (char c : ch) all = all && byte_ids_[static_cast<uint8_t>(c)] >= 0;
      if (all) {
        // HF emits these before a pending unk (it does not flush the unk first).
        for (char c : ch) add(byte_ids_[static_cast<uint8_t>(c)]);
        continue;
      }
    }
    if (unk_id_ >= 0) {
      if (pending_unk && !fuse_unk_) add(unk_id_);
      pending_unk = true;
    }
  }
  if (pending_unk) add(unk_id_);

  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t new_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  auto find_merge = [&](int32_t a, int32_t b) -> const MergeTarget* {
    auto it = merges_.find((static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b));
    return it == merges_.end() ? nullptr : &it->second;
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const auto* m = find_merge(symbols[i].id, symbols[i + 1].id)) {
      queue.push({m->rank, static_cast<int32_t>(i), m->new_id});
    }
  }
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (left.removed || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    // Skip stale entries: the pair at this position must still produce the same token.
    const auto* m = find_merge(left.id, right.id);
    if (!m || m->new_id != top.new_id) continue;
    left.id = top.new_id;
    right.removed = true;
    left.next = right.next;
    if (left.next >= 0) symbols[left.next].prev = top.pos;
    if (left.prev >= 0) {
      if (const auto* pm = find_merge(symbols[left.prev].id, left.id)) {
        queue.push({pm->rank, left.prev, pm->new_id});
      }
    }
    if (left.next >= 0) {
      if (const auto* nm = find_merge(left.id, symbols[left.next].id)) {
        queue.push({nm->rank, top.pos, nm->new_id});
      }
    }
  }
  for (const auto& s : symbols) {
    if (!s.removed) out.push_back(s.id);
  }
}

}  // namespace qs::tok
