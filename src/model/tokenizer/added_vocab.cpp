#include "model/tokenizer/added_vocab.h"

#include "model/tokenizer/unicode.h"

namespace qs::tok {

void TokenMatcher::add(std::string_view pattern, int32_t token_index) {
  if (pattern.empty()) return;
  int32_t node = 0;
  for (char c : pattern) {
    const auto byte = static_cast<uint8_t>(c);
    auto it = nodes_[node].children.find(byte);
    if (it == nodes_[node].children.end()) {
      nodes_.emplace_back();
      const auto next = static_cast<int32_t>(nodes_.size() - 1);
      nodes_[node].children[byte] = next;
      node = next;
    } else {
      node = it->second;
    }
  }
  // With duplicate contents the first registered token wins.
  if (nodes_[node].token_index < 0) nodes_[node].token_index = token_index;
}

int32_t TokenMatcher::longest_at(std::string_view text, size_t pos, size_t* length) const {
  int32_t node = 0, best = -1;
  for (size_t i = pos; i < text.size(); ++i) {
    auto it = nodes_[node].children.find(static_cast<uint8_t>(text[i]));
    if (it == nodes_[node].children.end()) break;
    node = it->second;
    if (nodes_[node].token_index >= 0) {
      best = nodes_[node].token_index;
      *length = i + 1 - pos;
    }
  }
  return best;
}

namespace {

char32_t char_before(const std::string& s, size_t end, size_t* start) {
  size_t p = end - 1;
  while (p > 0 && (static_cast<uint8_t>(s[p]) & 0xC0) == 0x80) --p;
  *start = p;
  int len = 0;
  return unicode::decode_utf8(s, p, &len);
}

}  // namespace

std::vector<Segment> split_on_added_tokens(const std::string& text, bool at_origin,
                                           const TokenMatcher& matcher,
                                           const std::vector<AddedToken>& tokens) {
  std::vector<Segment> out;
  if (matcher.empty() || text.empty()) {
    out.push_back({text, -1, at_origin});
    return out;
  }
  size_t start_offset = 0;  // end of the previous accepted match
  size_t pos = 0;
  while (pos < text.size()) {
    size_t length = 0;
    const int32_t index = matcher.longest_at(text, pos, &length);
    if (index < 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = tokens[index];
    size_t start = pos, stop = pos + length;
    pos = stop;  // the search resumes after this match even when it is rejected
    if (token.single_word) {
      size_t unused = 0;
      const bool start_space =
          start == 0 || !unicode::is_word_char(char_before(text, start, &unused));
      bool stop_space = stop == text.size();
      if (!stop_space) {
        int len = 0;
        stop_space = !unicode::is_word_char(unicode::decode_utf8(text, stop, &len));
      }
      if (!start_space || !stop_space) continue;
    }
    if (token.lstrip) {
      size_t new_start = start;
      while (new_start > 0) {
        size_t prev = 0;
        if (!unicode::is_white_space(char_before(text, new_start, &prev))) break;
        new_start = prev;
      }
      start = std::max(new_start, start_offset);
    }
    if (token.rstrip) {
      while (stop < text.size()) {
        int len = 0;
        if (!unicode::is_white_space(unicode::decode_utf8(text, stop, &len))) break;
        stop += len;
      }
    }
    if (start_offset < start) {
      out.push_back(
          {text.substr(start_offset, start - start_offset), -1, at_origin && start_offset == 0});
    }
    out.push_back({text.substr(start, stop - start), token.id, at_origin && start == 0});
    start_offset = stop;
  }
  if (start_offset < text.size()) {
    out.push_back({text.substr(start_offset), -1, at_origin && start_offset == 0});
  }
  return out;
}

}  // namespace qs::tok
