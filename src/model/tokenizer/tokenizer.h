// Hugging Face tokenizer.json BPE tokenizers: byte-level BPE (GPT-2 / Llama-3 / Qwen2 style) and
// SentencePiece-style BPE with byte fallback (Llama-2 / Mistral style). Token ids equal those of
// the HF `tokenizers` library on the same input.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace qs {

class TokenizerImpl;

class Tokenizer {
 public:
  // Load `dir/tokenizer.json` (+ `dir/tokenizer_config.json` when present, for bos/eos tokens
  // and add_bos_token / add_eos_token).
  static Result<Tokenizer> load(const std::filesystem::path& dir);
  // Parse tokenizer.json text directly (tokenizer_config.json text optional, may be empty).
  static Result<Tokenizer> from_json(const std::string& tokenizer_json,
                                     const std::string& tokenizer_config_json = "");

  // Text -> ids. add_special = true applies the post-processor (e.g. BOS), as HF's
  // encode(text, add_special_tokens=True) does. Added/special tokens in the text are matched.
  std::vector<int32_t> encode(std::string_view text, bool add_special) const;

  // Ids -> text, as HF's decode(ids, skip_special_tokens=skip_special).
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const;

  int32_t vocab_size() const;            // including added tokens
  int32_t bos_id() const;                // -1 if none
  std::vector<int32_t> eos_ids() const;  // may be empty
  bool is_special(int32_t id) const;
  std::string id_to_piece(int32_t id) const;  // the raw vocabulary string, "" if out of range
  // The text token `id` adds in the middle of a text (special tokens included): decoded after
  // a plain anchor token, so that start-of-text rules (a Metaspace prefix space dropped) do not
  // apply. A byte-fallback or byte-level piece of an incomplete UTF-8 sequence gives U+FFFD, as
  // decode() does; "" for an id out of range.
  std::string token_text(int32_t id) const;
  // token_text's bytes with a piece of an incomplete UTF-8 sequence kept as its bytes (a
  // byte-fallback "<0xE2>" is the byte 0xE2, a byte-level piece its bytes): what the token adds
  // to the text's bytes.
  std::string token_bytes(int32_t id) const;

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

 private:
  friend class StreamDecoder;
  explicit Tokenizer(std::unique_ptr<TokenizerImpl> impl);
  std::unique_ptr<TokenizerImpl> impl_;
};

// Incremental detokenization for streaming: push ids one at a time, get the newly completed
// text. Never returns a partial UTF-8 sequence; the concatenation of all push() results plus
// flush() equals tokenizer.decode(all_ids).
//
// Only a short window of recent ids is decoded per push (amortized O(1) per token): once the
// window's text is final, the window restarts, and later windows are decoded behind an "anchor"
// token so that start-of-text rules (Strip, Metaspace's first token) are not re-applied.
// Text that later ids could still change is held back: a trailing U+FFFD (incomplete UTF-8),
// an unfinished run of byte-fallback pieces, characters a trailing Strip may remove.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = true);
  std::string push(int32_t id);
  std::string flush();

 private:
  std::string emit(bool final);

  const Tokenizer& tok_;
  bool skip_special_;
  std::vector<int32_t> ids_;  // the current window (decodable ids only)
  size_t emitted_bytes_ = 0;  // bytes of the window's text already returned
  bool has_context_ = false;  // some decodable id precedes the window
  int held_pushes_ = 0;       // consecutive emits that held text back
};

}  // namespace qs
