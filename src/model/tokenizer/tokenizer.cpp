#include "model/tokenizer/tokenizer.h"

#include <charconv>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_set>

#include "model/tokenizer/json_util.h"
#include "model/tokenizer/tokenizer_impl.h"
#include "model/tokenizer/unicode.h"

namespace qs {

using tok::Json;

namespace {

Result<Json> parse_json(const std::string& text, const std::string& name) {
  try {
    return Json::parse(text);
  } catch (const Json::exception& e) {
    return make_error(name + ": invalid JSON: " + e.what());
  }
}

// A config token field: "text", {"content": "text", ...} or null/absent ("" then).
Result<std::string> config_token(const Json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::string();
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto content = it->find("content");
    if (content != it->end() && content->is_string()) return content->get<std::string>();
  }
  return make_error(std::string("tokenizer_config.json: '") + key +
                    "' must be a string or an object with 'content'");
}

// Tokens that end a turn or a document in the common model families, used as extra EOS ids
// when they exist as special tokens (llama.cpp's end-of-generation set does the same).
constexpr const char* kEndOfGenerationTokens[] = {
    "</s>",       "<|end_of_text|>", "<|eot_id|>",    "<|eom_id|>",
    "<|im_end|>", "<|endoftext|>",   "<end_of_turn>", "<|end|>"};

bool is_llama_family_class(const std::string& name) {
  for (const char* c : {"LlamaTokenizer", "LlamaTokenizerFast", "CodeLlamaTokenizer",
                        "CodeLlamaTokenizerFast", "GemmaTokenizer", "GemmaTokenizerFast"}) {
    if (name == c) return true;
  }
  return false;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Loading

Result<std::unique_ptr<TokenizerImpl>> TokenizerImpl::create(const std::string& tokenizer_json,
                                                             const std::string& config_json) {
  QS_ASSIGN_OR_RETURN(Json root, parse_json(tokenizer_json, "tokenizer.json"));
  if (!root.is_object()) return make_error("tokenizer.json: top level must be an object");
  auto impl = std::make_unique<TokenizerImpl>();

  auto model = root.find("model");
  if (model == root.end() || !model->is_object()) {
    return make_error("tokenizer.json: missing 'model' object");
  }
  std::string model_type = "BPE";
  if (auto t = model->find("type"); t != model->end()) {
    if (!t->is_string()) return make_error("tokenizer.json: model 'type' must be a string");
    model_type = t->get<std::string>();
  }
  if (model_type != "BPE") {
    return make_error("tokenizer.json: unsupported model type '" + model_type +
                      "' (only BPE is supported)");
  }
  QS_ASSIGN_OR_RETURN(impl->model_, tok::BpeModel::parse(*model));

  auto component = [&](const char* key) -> const Json* {
    auto it = root.find(key);
    return it == root.end() || it->is_null() ? nullptr : &*it;
  };
  if (const Json* j = component("normalizer")) {
    QS_ASSIGN_OR_RETURN(impl->normalizer_, tok::parse_normalizer(*j));
  }
  if (const Json* j = component("pre_tokenizer")) {
    QS_ASSIGN_OR_RETURN(impl->pre_tokenizer_, tok::parse_pre_tokenizer(*j));
  }
  if (const Json* j = component("post_processor")) {
    QS_ASSIGN_OR_RETURN(impl->post_processor_, tok::parse_post_processor(*j));
  }
  if (const Json* j = component("decoder")) {
    QS_ASSIGN_OR_RETURN(impl->decoder_, tok::parse_decoder(*j));
  }

  QS_TRY(impl->load_added_tokens(root));
  QS_TRY(impl->load_config(config_json));
  impl->strips_trailing_ = impl->decoder_ && impl->decoder_->strips_trailing();
  impl->choose_anchor();
  return impl;
}

Status TokenizerImpl::load_added_tokens(const Json& root) {
  pieces_ = model_.pieces();
  has_piece_.assign(pieces_.size(), false);
  for (size_t i = 0; i < pieces_.size(); ++i)
    has_piece_[i] = model_.token_to_id(pieces_[i]) == static_cast<int32_t>(i);

  std::vector<tok::AddedToken> specials, others;
  if (auto it = root.find("added_tokens"); it != root.end() && !it->is_null()) {
    if (!it->is_array()) return make_error("tokenizer.json: 'added_tokens' must be an array");
    for (const auto& t : *it) {
      const std::string where = "tokenizer.json: added_tokens entry";
      if (!t.is_object()) return make_error(where + " must be an object");
      tok::AddedToken token;
      QS_ASSIGN_OR_RETURN(int64_t id, tok::get_int(t, "id", where));
      if (id < 0 || id >= (1 << 26)) return make_error(where + ": id out of range");
      token.id = static_cast<int32_t>(id);
      QS_ASSIGN_OR_RETURN(token.content, tok::get_string(t, "content", where));
      QS_ASSIGN_OR_RETURN(token.special, tok::get_bool(t, "special", false, where));
      QS_ASSIGN_OR_RETURN(token.single_word, tok::get_bool(t, "single_word", false, where));
      QS_ASSIGN_OR_RETURN(token.lstrip, tok::get_bool(t, "lstrip", false, where));
      QS_ASSIGN_OR_RETURN(token.rstrip, tok::get_bool(t, "rstrip", false, where));
      QS_ASSIGN_OR_RETURN(token.normalized, tok::get_bool(t, "normalized", !token.special, where));
      if (token.content.empty()) continue;
      (token.special ? specials : others).push_back(std::move(token));
    }
  }
  added_tokens_ = std::move(specials);
  added_tokens_.insert(added_tokens_.end(), others.begin(), others.end());

  std::unordered_set<std::string> special_contents;
  for (size_t i = 0; i < added_tokens_.size(); ++i) {
    const auto& t = added_tokens_[i];
    if (static_cast<size_t>(t.id) >= pieces_.size()) {
      pieces_.resize(t.id + 1);
      has_piece_.resize(t.id + 1, false);
    }
    has_piece_[t.id] = true;
    if (t.special) special_contents.insert(t.content);
    if (t.normalized) {
      std::string pattern = t.content;
      if (normalizer_) normalizer_->normalize(pattern);
      normalized_matcher_.add(pattern, static_cast<int32_t>(i));
      // HF decodes a normalized added token from its normalized form (and then only skips it
      // as special when that form equals a special token's content).
      pieces_[t.id] = pattern;
    } else {
      raw_matcher_.add(t.content, static_cast<int32_t>(i));
      pieces_[t.id] = t.content;
    }
  }
  special_.assign(pieces_.size(), false);
  byte_piece_.assign(pieces_.size(), false);
  const bool byte_fallback = decoder_ && decoder_->has_byte_fallback();
  for (size_t i = 0; i < pieces_.size(); ++i) {
    if (!has_piece_[i]) continue;
    special_[i] = special_contents.count(pieces_[i]) > 0;
    const auto& p = pieces_[i];
    byte_piece_[i] = byte_fallback && p.size() == 6 && p.compare(0, 3, "<0x") == 0 && p[5] == '>';
  }
  return Status();
}

Status TokenizerImpl::load_config(const std::string& config_json) {
  auto lookup = [&](const std::string& content) -> int32_t {
    for (const auto& t : added_tokens_) {
      if (t.content == content) return t.id;
    }
    return model_.token_to_id(content);
  };
  std::string bos, eos;
  if (!config_json.empty()) {
    QS_ASSIGN_OR_RETURN(Json config, parse_json(config_json, "tokenizer_config.json"));
    if (!config.is_object()) return make_error("tokenizer_config.json: must be an object");
    QS_ASSIGN_OR_RETURN(bos, config_token(config, "bos_token"));
    QS_ASSIGN_OR_RETURN(eos, config_token(config, "eos_token"));
    const std::string where = "tokenizer_config.json";
    QS_ASSIGN_OR_RETURN(add_bos_, tok::get_bool(config, "add_bos_token", false, where));
    QS_ASSIGN_OR_RETURN(add_eos_, tok::get_bool(config, "add_eos_token", false, where));
    const bool has_flags = config.contains("add_bos_token") || config.contains("add_eos_token");
    std::string cls;
    if (auto it = config.find("tokenizer_class"); it != config.end() && it->is_string()) {
      cls = it->get<std::string>();
    }
    // transformers rebuilds the post-processor from these flags for Llama-family classes;
    // without a post-processor they are the only source of BOS/EOS.
    if (is_llama_family_class(cls) && has_flags) {
      if (!config.contains("add_bos_token")) add_bos_ = true;  // LlamaTokenizer's default
      use_config_specials_ = true;
    } else if (!post_processor_) {
      use_config_specials_ = true;
    }
  }
  if (!bos.empty()) {
    bos_id_ = lookup(bos);
    if (bos_id_ < 0) {
      return make_error("tokenizer_config.json: bos_token '" + bos + "' is not in the vocabulary");
    }
  } else if (post_processor_) {
    bos_id_ = post_processor_->leading_special_id();
  }
  if (!eos.empty()) {
    const int32_t id = lookup(eos);
    if (id < 0) {
      return make_error("tokenizer_config.json: eos_token '" + eos + "' is not in the vocabulary");
    }
    eos_ids_.push_back(id);
  }
  for (const char* name : kEndOfGenerationTokens) {
    for (const auto& t : added_tokens_) {
      if (t.special && t.content == name &&
          std::find(eos_ids_.begin(), eos_ids_.end(), t.id) == eos_ids_.end()) {
        eos_ids_.push_back(t.id);
      }
    }
  }
  if (use_config_specials_ && add_bos_ && bos_id_ < 0) {
    return make_error("tokenizer_config.json: add_bos_token is set but there is no bos_token");
  }
  if (use_config_specials_ && add_eos_ && eos_ids_.empty()) {
    return make_error("tokenizer_config.json: add_eos_token is set but there is no eos_token");
  }
  return Status();
}

// The anchor is a plain token (e.g. "a") whose text is the same alone and repeated, so decoding
// [anchor] + ids and dropping its text gives the text of ids in the middle of a stream.
void TokenizerImpl::choose_anchor() {
  const std::string candidates = "aeotnsxAEOTN0123456789";
  for (char c : candidates) {
    const int32_t id = model_.token_to_id(std::string(1, c));
    if (id < 0 || !decodable(id, false) || special_[id] || byte_piece_[id]) continue;
    anchor_id_ = -1;
    const int32_t one[1] = {id};
    const int32_t two[2] = {id, id};
    const std::string a = decode(one, 1, false, false);
    const std::string aa = decode(two, 2, false, false);
    if (a.empty() || aa != a + a || a.find(' ') != std::string::npos) continue;
    anchor_id_ = id;
    anchor_bytes_ = a.size();
    return;
  }
  anchor_id_ = -1;
}

// ---------------------------------------------------------------------------------------------
// Encoding and decoding

std::vector<int32_t> TokenizerImpl::encode(std::string_view input, bool add_special) const {
  // HF takes Python str (always valid); invalid bytes become U+FFFD as from_utf8_lossy does.
  const std::string text =
      unicode::is_valid_utf8(input) ? std::string(input) : unicode::utf8_lossy(input);
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  std::vector<tok::PreToken> pieces;
  for (auto& segment : tok::split_on_added_tokens(text, true, raw_matcher_, added_tokens_)) {
    if (segment.token_id >= 0) {
      ids.push_back(segment.token_id);
      continue;
    }
    if (normalizer_) normalizer_->normalize(segment.text);
    for (auto& sub : tok::split_on_added_tokens(segment.text, segment.at_origin,
                                                normalized_matcher_, added_tokens_)) {
      if (sub.token_id >= 0) {
        ids.push_back(sub.token_id);
        continue;
      }
      if (sub.text.empty()) continue;
      pieces.clear();
      pieces.push_back({std::move(sub.text), sub.at_origin});
      if (pre_tokenizer_) pre_tokenizer_->pre_tokenize(pieces);
      for (const auto& piece : pieces) model_.tokenize(piece.text, ids);
    }
  }
  if (use_config_specials_) {
    if (add_special && add_bos_) ids.insert(ids.begin(), bos_id_);
    if (add_special && add_eos_) ids.push_back(eos_ids_[0]);
  } else if (post_processor_) {
    post_processor_->process(ids, add_special);
  }
  return ids;
}

std::string TokenizerImpl::decode(const int32_t* ids, size_t n, bool skip_special,
                                  bool continuation, bool raw) const {
  QS_CHECK(!continuation || anchor_id_ >= 0);
  std::vector<std::string> tokens;
  tokens.reserve(n + 1);
  if (continuation) tokens.push_back(pieces_[anchor_id_]);
  for (size_t i = 0; i < n; ++i) {
    if (decodable(ids[i], skip_special)) tokens.push_back(pieces_[ids[i]]);
  }
  std::string text;
  if (decoder_) {
    if (raw) {
      decoder_->decode_chain_bytes(tokens);
    } else {
      decoder_->decode_chain(tokens);
    }
    for (const auto& t : tokens) text += t;
  } else {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) text += ' ';
      text += tokens[i];
    }
  }
  if (continuation) text.erase(0, std::min(anchor_bytes_, text.size()));
  return text;
}

// ---------------------------------------------------------------------------------------------
// Public API

Tokenizer::Tokenizer(std::unique_ptr<TokenizerImpl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Result<Tokenizer> Tokenizer::load(const std::filesystem::path& dir) {
  auto read = [](const std::filesystem::path& path, std::string* out) -> Status {
    std::ifstream in(path, std::ios::binary);
    if (!in) return make_error("cannot open " + path.string());
    std::ostringstream ss;
    ss << in.rdbuf();
    if (in.bad()) return make_error("cannot read " + path.string());
    *out = ss.str();
    return Status();
  };
  std::string tokenizer_json, config_json;
  const auto tokenizer_path = dir / "tokenizer.json";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(tokenizer_path, ec)) {
    return make_error("tokenizer: " + tokenizer_path.string() + " not found");
  }
  QS_TRY(read(tokenizer_path, &tokenizer_json));
  const auto config_path = dir / "tokenizer_config.json";
  if (std::filesystem::is_regular_file(config_path, ec)) QS_TRY(read(config_path, &config_json));
  auto impl = TokenizerImpl::create(tokenizer_json, config_json);
  if (!impl.ok()) return make_error(dir.string() + ": " + impl.error().message);
  return Tokenizer(std::move(impl).value());
}

Result<Tokenizer> Tokenizer::from_json(const std::string& tokenizer_json,
                                       const std::string& tokenizer_config_json) {
  QS_ASSIGN_OR_RETURN(auto impl, TokenizerImpl::create(tokenizer_json, tokenizer_config_json));
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special) const {
  return impl_->encode(text, add_special);
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  return impl_->decode(ids.data(), ids.size(), skip_special, false);
}

int32_t Tokenizer::vocab_size() const {
  return impl_->vocab_size();
}
int32_t Tokenizer::bos_id() const {
  return impl_->bos_id();
}
std::vector<int32_t> Tokenizer::eos_ids() const {
  return impl_->eos_ids();
}
bool Tokenizer::is_special(int32_t id) const {
  return impl_->is_special(id);
}
std::string Tokenizer::id_to_piece(int32_t id) const {
  return impl_->id_to_piece(id);
}
std::string Tokenizer::token_text(int32_t id) const {
  if (id < 0 || id >= impl_->vocab_size()) return "";
  return impl_->decode(&id, 1, false, impl_->has_anchor());
}

std::string Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= impl_->vocab_size()) return "";
  if (impl_->is_byte_fallback_piece(id)) {  // "<0xE2>" (its text: U+FFFD unless the digits fail)
    const std::string piece = id_to_piece(id);
    unsigned value = 0;
    const auto [end, ec] = std::from_chars(piece.data() + 3, piece.data() + 5, value, 16);
    if (ec == std::errc() && end == piece.data() + 5)
      return std::string(1, static_cast<char>(value));
  }
  return impl_->decode(&id, 1, false, impl_->has_anchor(), /*raw=*/true);
}

}  // namespace qs
