// The pipeline stages of a Hugging Face tokenizer.json, each parsed from its JSON object:
// normalizer -> pre-tokenizer -> model (bpe.h) -> post-processor; and the decoder.
// Semantics follow the HF `tokenizers` library; each `parse_*` returns a clear Error naming an
// unsupported component type.
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.h"
#include "model/tokenizer/regex.h"

namespace qs::tok {

using Json = nlohmann::json;
using Span = std::pair<size_t, size_t>;  // byte range [first, second)

// A pattern from tokenizer.json: {"String": "..."} (literal) or {"Regex": "..."}.
class Pattern {
 public:
  static Result<Pattern> parse(const Json& j, const std::string& where);
  static Pattern literal(std::string text);
  // Non-overlapping matches, left to right.
  std::vector<Span> find_all(std::string_view text) const;

 private:
  std::string literal_;
  std::shared_ptr<Regex> regex_;  // null for a literal
};

// ---------------------------------------------------------------------------------------------
// Normalizers

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& text) const = 0;
};

Result<std::unique_ptr<Normalizer>> parse_normalizer(const Json& j);

// ---------------------------------------------------------------------------------------------
// Pre-tokenizers

struct PreToken {
  std::string text;
  bool at_origin = false;  // starts at byte 0 of the original input (Metaspace "first")
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Rewrites and splits every piece; empty pieces are dropped.
  virtual void pre_tokenize(std::vector<PreToken>& pieces) const = 0;
};

Result<std::unique_ptr<PreTokenizer>> parse_pre_tokenizer(const Json& j);

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// HF NormalizedString::split: the pieces of a text of `length` bytes around `matches`.
std::vector<Span> split_by_matches(size_t length, const std::vector<Span>& matches,
                                   SplitBehavior behavior, bool invert);

// GPT-2's byte -> printable character map (ByteLevel), as UTF-8 strings, and its inverse.
const std::string& byte_to_unicode(uint8_t byte);
// Byte of a ByteLevel character, or -1 when `cp` is not one.
int unicode_to_byte(char32_t cp);

// ---------------------------------------------------------------------------------------------
// Post-processors (ids only: offsets and type ids are not tracked)

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  virtual void process(std::vector<int32_t>& ids, bool add_special) const = 0;
  // The first special token the single-sequence template adds, -1 if none (the BOS guess).
  virtual int32_t leading_special_id() const { return -1; }
};

Result<std::unique_ptr<PostProcessor>> parse_post_processor(const Json& j);

// ---------------------------------------------------------------------------------------------
// Decoders: a chain over token strings, as HF's Decoder::decode_chain.

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
  // The same chain with a byte-level token's bytes of an incomplete UTF-8 sequence kept as they
  // are (where decode_chain makes them U+FFFD): what a token adds to a text, byte by byte.
  // (Byte-fallback pieces are read by Tokenizer::token_bytes itself.)
  virtual void decode_chain_bytes(std::vector<std::string>& tokens) const { decode_chain(tokens); }
  // What streaming must know about the chain.
  virtual bool has_byte_fallback() const { return false; }
  virtual bool strips_trailing() const { return false; }  // a Strip with stop > 0
};

Result<std::unique_ptr<Decoder>> parse_decoder(const Json& j);

}  // namespace qs::tok
