// The loaded tokenizer: the parsed pipeline plus the id tables (private to the tokenizer layer).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "model/tokenizer/added_vocab.h"
#include "model/tokenizer/bpe.h"
#include "model/tokenizer/components.h"

namespace qs {

class TokenizerImpl {
 public:
  static Result<std::unique_ptr<TokenizerImpl>> create(const std::string& tokenizer_json,
                                                       const std::string& config_json);

  std::vector<int32_t> encode(std::string_view text, bool add_special) const;
  // HF decode; with `continuation` the ids are decoded as if earlier text preceded them (an
  // anchor token is decoded in front and its text removed). Needs has_anchor().
  // raw: a byte-level piece's bytes of an incomplete UTF-8 sequence as they are
  // (Decoder::decode_chain_bytes).
  std::string decode(const int32_t* ids, size_t n, bool skip_special, bool continuation,
                     bool raw = false) const;

  int32_t vocab_size() const { return static_cast<int32_t>(pieces_.size()); }
  int32_t bos_id() const { return bos_id_; }
  const std::vector<int32_t>& eos_ids() const { return eos_ids_; }
  bool is_special(int32_t id) const { return in_range(id) && special_[id]; }
  std::string id_to_piece(int32_t id) const { return in_range(id) ? pieces_[id] : ""; }

  // Streaming support.
  bool decodable(int32_t id, bool skip_special) const {
    return in_range(id) && has_piece_[id] && !(skip_special && special_[id]);
  }
  bool is_byte_fallback_piece(int32_t id) const { return in_range(id) && byte_piece_[id]; }
  bool has_anchor() const { return anchor_id_ >= 0; }
  bool strips_trailing() const { return strips_trailing_; }

 private:
  bool in_range(int32_t id) const { return id >= 0 && id < vocab_size(); }
  Status load_added_tokens(const tok::Json& root);
  Status load_config(const std::string& config_json);
  void choose_anchor();

  std::unique_ptr<tok::Normalizer> normalizer_;
  std::unique_ptr<tok::PreTokenizer> pre_tokenizer_;
  tok::BpeModel model_;
  std::unique_ptr<tok::PostProcessor> post_processor_;
  std::unique_ptr<tok::Decoder> decoder_;

  std::vector<tok::AddedToken> added_tokens_;  // specials first, then the others (HF order)
  tok::TokenMatcher raw_matcher_;              // normalized == false, matched on raw text
  tok::TokenMatcher normalized_matcher_;       // normalized == true, by normalized content

  std::vector<std::string> pieces_;  // id -> vocabulary string (added tokens override)
  std::vector<bool> has_piece_;      // false for ids no token uses
  std::vector<bool> special_;        // HF: the piece is the content of a special added token
  std::vector<bool> byte_piece_;     // "<0xXX>" under a ByteFallback decoder

  int32_t bos_id_ = -1;
  std::vector<int32_t> eos_ids_;
  // Set when tokenizer_config.json (Llama-family class) or the lack of a post-processor means
  // BOS/EOS come from add_bos_token / add_eos_token instead of the post-processor.
  bool use_config_specials_ = false;
  bool add_bos_ = false, add_eos_ = false;

  int32_t anchor_id_ = -1;
  size_t anchor_bytes_ = 0;
  bool strips_trailing_ = false;
};

}  // namespace qs
