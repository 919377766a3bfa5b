// Post-processors: TemplateProcessing, RobertaProcessing, BertProcessing, ByteLevel, Sequence.
// Only single sequences are encoded, so only the "single" template is used.
#include "model/tokenizer/components.h"
#include "model/tokenizer/json_util.h"

namespace qs::tok {

namespace {

class SequencePostProcessor final : public PostProcessor {
 public:
  explicit SequencePostProcessor(std::vector<std::unique_ptr<PostProcessor>> parts)
      : parts_(std::move(parts)) {}
  void process(std::vector<int32_t>& ids, bool add_special) const override {
    for (const auto& p : parts_) p->process(ids, add_special);
  }
  int32_t leading_special_id() const override {
    for (const auto& p : parts_) {
      if (p->leading_special_id() >= 0) return p->leading_special_id();
    }
    return -1;
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> parts_;
};

// ByteLevel only trims offsets, which are not tracked here.
class NoOpPostProcessor final : public PostProcessor {
 public:
  void process(std::vector<int32_t>&, bool) const override {}
};

// A template of pieces: either the input sequence or a run of special-token ids.
class TemplatePostProcessor final : public PostProcessor {
 public:
  struct Piece {
    bool is_sequence = false;
    std::vector<int32_t> ids;  // special-token ids when !is_sequence
  };
  explicit TemplatePostProcessor(std::vector<Piece> pieces) : pieces_(std::move(pieces)) {}

  void process(std::vector<int32_t>& ids, bool add_special) const override {
    if (!add_special) return;
    std::vector<int32_t> out;
    out.reserve(ids.size() + 4);
    for (const auto& piece : pieces_) {
      if (piece.is_sequence) {
        out.insert(out.end(), ids.begin(), ids.end());
      } else {
        out.insert(out.end(), piece.ids.begin(), piece.ids.end());
      }
    }
    ids = std::move(out);
  }
  int32_t leading_special_id() const override {
    if (!pieces_.empty() && !pieces_[0].is_sequence && !pieces_[0].ids.empty()) {
      return pieces_[0].ids[0];
    }
    return -1;
  }

 private:
  std::vector<Piece> pieces_;
};

Result<int32_t> token_pair_id(const Json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_array() || it->size() != 2 || !(*it)[1].is_number_integer()) {
    return make_error(where + ": field '" + key + "' must be [token, id]");
  }
  return (*it)[1].get<int32_t>();
}

Result<std::unique_ptr<PostProcessor>> parse_template(const Json& j, const std::string& where) {
  auto single = j.find("single");
  if (single == j.end() || !single->is_array()) {
    return make_error(where + ": field 'single' must be an array");
  }
  auto specials = j.find("special_tokens");
  std::vector<TemplatePostProcessor::Piece> pieces;
  for (const auto& item : *single) {
    TemplatePostProcessor::Piece piece;
    if (item.contains("Sequence")) {
      piece.is_sequence = true;
    } else if (auto st = item.find("SpecialToken"); st != item.end()) {
      QS_ASSIGN_OR_RETURN(std::string name, get_string(*st, "id", where + " SpecialToken"));
      if (specials == j.end() || !specials->is_object() || !specials->contains(name)) {
        return make_error(where + ": template token '" + name + "' is not in special_tokens");
      }
      const Json& entry = (*specials)[name];
      auto ids = entry.find("ids");
      if (ids == entry.end() || !ids->is_array()) {
        return make_error(where + ": special_tokens['" + name + "'].ids must be an array");
      }
      for (const auto& id : *ids) {
        if (!id.is_number_integer()) {
          return make_error(where + ": special_tokens['" + name + "'].ids must be integers");
        }
        piece.ids.push_back(id.get<int32_t>());
      }
    } else {
      return make_error(where + ": template items must be Sequence or SpecialToken");
    }
    pieces.push_back(std::move(piece));
  }
  return std::unique_ptr<PostProcessor>(new TemplatePostProcessor(std::move(pieces)));
}

}  // namespace

Result<std::unique_ptr<PostProcessor>> parse_post_processor(const Json& j) {
  QS_ASSIGN_OR_RETURN(std::string type, get_type(j, "post_processor"));
  const std::string where = "tokenizer.json: post_processor " + type;
  if (type == "Sequence") {
    auto it = j.find("processors");
    if (it == j.end() || !it->is_array()) {
      return make_error(where + ": field 'processors' must be an array");
    }
    std::vector<std::unique_ptr<PostProcessor>> parts;
    for (const auto& sub : *it) {
      QS_ASSIGN_OR_RETURN(auto part, parse_post_processor(sub));
      parts.push_back(std::move(part));
    }
    return std::unique_ptr<PostProcessor>(new SequencePostProcessor(std::move(parts)));
  }
  if (type == "ByteLevel") return std::unique_ptr<PostProcessor>(new NoOpPostProcessor());
  if (type == "TemplateProcessing") return parse_template(j, where);
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    QS_ASSIGN_OR_RETURN(int32_t cls, token_pair_id(j, "cls", where));
    QS_ASSIGN_OR_RETURN(int32_t sep, token_pair_id(j, "sep", where));
    std::vector<TemplatePostProcessor::Piece> pieces(3);
    pieces[0].ids = {cls};
    pieces[1].is_sequence = true;
    pieces[2].ids = {sep};
    return std::unique_ptr<PostProcessor>(new TemplatePostProcessor(std::move(pieces)));
  }
  return make_error("tokenizer.json: unsupported post_processor type '" + type +
                    "' (supported: TemplateProcessing, RobertaProcessing, BertProcessing, "
                    "ByteLevel, Sequence)");
}

}  // namespace qs::tok
