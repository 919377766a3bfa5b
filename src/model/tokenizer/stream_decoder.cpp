#include "model/tokenizer/tokenizer.h"
#include "model/tokenizer/tokenizer_impl.h"
#include "model/tokenizer/unicode.h"

namespace qs {

namespace {

constexpr std::string_view kReplacementUtf8 = "\xEF\xBF\xBD";
// Without an anchor the window keeps this many ids of context when it is trimmed.
constexpr size_t kFallbackContextIds = 4;
constexpr size_t kFallbackMaxWindow = 32;
// A window whose text keeps ending in held-back characters (e.g. endless invalid bytes) is
// released after this many such pushes, so the cost per push stays bounded.
constexpr int kMaxHeldPushes = 64;

}  // namespace

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special)
    : tok_(tokenizer), skip_special_(skip_special) {}

std::string StreamDecoder::push(int32_t id) {
  const TokenizerImpl& impl = *tok_.impl_;
  // Ids that decode to nothing (skipped specials, unknown ids) cannot change the text.
  if (!impl.decodable(id, skip_special_)) return "";
  ids_.push_back(id);
  // A run of byte pieces decodes as a whole (valid UTF-8, or one U+FFFD per byte): wait for
  // its end.
  if (impl.is_byte_fallback_piece(id)) return "";
  return emit(false);
}

std::string StreamDecoder::flush() {
  return emit(true);
}

std::string StreamDecoder::emit(bool final) {
  const TokenizerImpl& impl = *tok_.impl_;
  const bool continuation = has_context_ && impl.has_anchor();
  const std::string text = impl.decode(ids_.data(), ids_.size(), skip_special_, continuation);

  size_t end = text.size();
  const bool release = final || held_pushes_ >= kMaxHeldPushes;
  if (!release) {
    // Hold back what more ids could still change.
    while (end >= kReplacementUtf8.size() &&
           std::string_view(text).substr(end - kReplacementUtf8.size(), kReplacementUtf8.size()) ==
               kReplacementUtf8) {
      end -= kReplacementUtf8.size();
    }
    if (impl.strips_trailing()) {
      while (end > 0 && text[end - 1] == ' ') --end;
    }
  }
  std::string out;
  if (end > emitted_bytes_) {
    out = text.substr(emitted_bytes_, end - emitted_bytes_);
    emitted_bytes_ = end;
  }
  held_pushes_ = end == text.size() ? 0 : held_pushes_ + 1;
  if (end == text.size()) {
    // The window's text is final: start a new window after it.
    if (impl.has_anchor()) {
      has_context_ = has_context_ || !ids_.empty();
      ids_.clear();
      emitted_bytes_ = 0;
    } else if (ids_.size() > kFallbackMaxWindow || final) {
      ids_.erase(ids_.begin(), ids_.end() - std::min(ids_.size(), kFallbackContextIds));
      emitted_bytes_ = impl.decode(ids_.data(), ids_.size(), skip_special_, false).size();
    }
  }
  return out;
}

}  // namespace qs
