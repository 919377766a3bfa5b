#include "model/weights.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <set>

#include "model/safetensors.h"

namespace qs {

namespace {

std::string shape_str(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// Binds HF tensor names to WeightViews, checking each against the shape the config implies.
class Binder {
 public:
  explicit Binder(const SafetensorsSet& set) : set_(set) {}

  // A matrix {rows, cols}.
  Status matrix(WeightView& out, const std::string& name, int64_t rows, int64_t cols) {
    return bind(out, name, {rows, cols});
  }
  // A vector stored 1-D [n]; bound as {1, n}.
  Status vector(WeightView& out, const std::string& name, int64_t n) {
    return bind(out, name, {n});
  }

  // The checkpoint's tensors that nothing bound, sorted, except the RoPE frequencies older
  // checkpoints carry (computed from the config instead, as transformers does).
  std::vector<std::string> unbound() const {
    std::vector<std::string> out;
    for (const auto& file : set_.files()) {
      for (const TensorInfo& t : file->tensors()) {
        if (bound_.count(t.name) == 0 && !t.name.ends_with("rotary_emb.inv_freq"))
          out.push_back(t.name);
      }
    }
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  Status bind(WeightView& out, const std::string& name, const std::vector<int64_t>& expected) {
    const SafetensorsFile* file = set_.file_for(name);
    if (file == nullptr) {
      return make_error(fmt::format("{}: missing tensor '{}' (expected shape {})", set_.source(),
                                    name, shape_str(expected)));
    }
    const TensorInfo* info = file->find(name);
    QS_CHECK(info != nullptr);
    if (!info->dtype) {
      return make_error(fmt::format("{}: tensor '{}' has dtype {}, expected F32, F16 or BF16",
                                    file->source(), name, info->dtype_name));
    }
    if (info->shape != expected) {
      return make_error(fmt::format("{}: tensor '{}' has shape {}, expected {}", file->source(),
                                    name, shape_str(info->shape), shape_str(expected)));
    }
    QS_ASSIGN_OR_RETURN(TensorView view, file->tensor(name));
    bound_.insert(name);
    out.data = view.data;
    out.dtype = view.dtype;
    out.rows = expected.size() == 2 ? expected[0] : 1;
    out.cols = expected.back();
    out.name = name;
    return {};
  }

  const SafetensorsSet& set_;
  std::set<std::string> bound_;
};

}  // namespace

Result<ModelWeights> load_model_weights(const std::filesystem::path& dir, const ModelConfig& cfg) {
  QS_ASSIGN_OR_RETURN(SafetensorsSet set, SafetensorsSet::open_dir(dir));
  Binder b(set);
  ModelWeights w;
  const int64_t vocab = cfg.vocab_size;
  const int64_t hidden = cfg.hidden_size;
  const int64_t inter = cfg.intermediate_size;
  const int64_t q_dim = static_cast<int64_t>(cfg.num_heads) * cfg.head_dim;
  const int64_t kv_dim = static_cast<int64_t>(cfg.num_kv_heads) * cfg.head_dim;
  const bool qkv_bias = cfg.arch == Architecture::Qwen2 || cfg.attention_bias;
  const bool o_bias = cfg.arch == Architecture::Llama && cfg.attention_bias;

  QS_TRY(b.matrix(w.tok_embeddings, "model.embed_tokens.weight", vocab, hidden));
  w.layers.resize(cfg.num_layers);
  for (int i = 0; i < cfg.num_layers; ++i) {
    LayerWeights& l = w.layers[i];
    const std::string p = fmt::format("model.layers.{}.", i);
    QS_TRY(b.vector(l.attn_norm, p + "input_layernorm.weight", hidden));
    QS_TRY(b.matrix(l.wq, p + "self_attn.q_proj.weight", q_dim, hidden));
    QS_TRY(b.matrix(l.wk, p + "self_attn.k_proj.weight", kv_dim, hidden));
    QS_TRY(b.matrix(l.wv, p + "self_attn.v_proj.weight", kv_dim, hidden));
    QS_TRY(b.matrix(l.wo, p + "self_attn.o_proj.weight", hidden, q_dim));
    if (qkv_bias) {
      QS_TRY(b.vector(l.bq, p + "self_attn.q_proj.bias", q_dim));
      QS_TRY(b.vector(l.bk, p + "self_attn.k_proj.bias", kv_dim));
      QS_TRY(b.vector(l.bv, p + "self_attn.v_proj.bias", kv_dim));
    }
    if (o_bias) QS_TRY(b.vector(l.bo, p + "self_attn.o_proj.bias", hidden));
    QS_TRY(b.vector(l.mlp_norm, p + "post_attention_layernorm.weight", hidden));
    QS_TRY(b.matrix(l.w_gate, p + "mlp.gate_proj.weight", inter, hidden));
    QS_TRY(b.matrix(l.w_up, p + "mlp.up_proj.weight", inter, hidden));
    QS_TRY(b.matrix(l.w_down, p + "mlp.down_proj.weight", hidden, inter));
  }
  QS_TRY(b.vector(w.final_norm, "model.norm.weight", hidden));
  // Tied models use the embedding as the output projection, as transformers does, even when the
  // file also carries an lm_head.weight.
  if (cfg.tie_word_embeddings) {
    w.lm_head = w.tok_embeddings;
  } else {
    QS_TRY(b.matrix(w.lm_head, "lm_head.weight", vocab, hidden));
  }
  w.unused = b.unbound();
  // A tied checkpoint that stores its output projection too: transformers ties over it silently.
  if (cfg.tie_word_embeddings) std::erase(w.unused, std::string("lm_head.weight"));
  w.files = set.files();
  return w;
}

}  // namespace qs
