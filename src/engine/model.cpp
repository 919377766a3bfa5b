#include "engine/model.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <string>

#include "backend/rope_freq.h"
#include "core/thread_pool.h"

namespace qs {

namespace {

Status check_weight(const WeightView& w, int64_t rows, int64_t cols, const std::string& what) {
  if (w.empty()) return make_error("model weights: missing tensor " + what);
  if (w.dtype != DType::F32 && w.dtype != DType::F16 && w.dtype != DType::BF16) {
    return make_error("model weights: tensor '" + w.name + "' has dtype " + dtype_name(w.dtype) +
                      ", expected F32, F16 or BF16");
  }
  // A vector may be stored as {1, n} or {n, 1}; both describe n contiguous elements.
  bool vector_ok = rows == 1 && w.numel() == cols && (w.rows == 1 || w.cols == 1);
  if (!(w.rows == rows && w.cols == cols) && !vector_ok) {
    return make_error("model weights: tensor '" + w.name + "' has shape [" +
                      std::to_string(w.rows) + ", " + std::to_string(w.cols) + "], expected [" +
                      std::to_string(rows) + ", " + std::to_string(cols) + "]");
  }
  return Status::ok_status();
}

}  // namespace

Status check_model(const ModelConfig& cfg, const ModelWeights& weights) {
  auto positive = [](int v, const char* field) -> Status {
    if (v <= 0)
      return make_error(std::string("model config: ") + field + " must be > 0, got " +
                        std::to_string(v));
    return Status::ok_status();
  };
  QS_TRY(positive(cfg.vocab_size, "vocab_size"));
  QS_TRY(positive(cfg.hidden_size, "hidden_size"));
  QS_TRY(positive(cfg.intermediate_size, "intermediate_size"));
  QS_TRY(positive(cfg.num_layers, "num_hidden_layers"));
  QS_TRY(positive(cfg.num_heads, "num_attention_heads"));
  QS_TRY(positive(cfg.num_kv_heads, "num_key_value_heads"));
  QS_TRY(positive(cfg.head_dim, "head_dim"));
  if (cfg.num_heads % cfg.num_kv_heads != 0) {
    return make_error("model config: num_attention_heads (" + std::to_string(cfg.num_heads) +
                      ") is not a multiple of num_key_value_heads (" +
                      std::to_string(cfg.num_kv_heads) + ")");
  }
  if (cfg.head_dim % 2 != 0) {
    return make_error("model config: head_dim must be even for RoPE, got " +
                      std::to_string(cfg.head_dim));
  }
  if (!(cfg.rms_norm_eps >= 0.0f) || !(cfg.rope_theta > 0.0f)) {
    return make_error("model config: rms_norm_eps must be >= 0 and rope_theta > 0");
  }
  if (cfg.rope_scaling.type != RopeScalingType::None && !(cfg.rope_scaling.factor > 0.0f)) {
    return make_error("model config: rope_scaling.factor must be > 0");
  }
  if (cfg.rope_scaling.type == RopeScalingType::Yarn &&
      (cfg.rope_scaling.original_max_position_embeddings <= 0 ||
       !(cfg.rope_scaling.beta_fast > cfg.rope_scaling.beta_slow) ||
       !(cfg.rope_scaling.attention_factor > 0.0))) {
    return make_error(
        "model config: yarn rope_scaling needs original_max_position_embeddings > 0, beta_fast > "
        "beta_slow and attention_factor > 0");
  }
  if (cfg.rope_scaling.type == RopeScalingType::Llama3 &&
      (cfg.rope_scaling.original_max_position_embeddings <= 0 ||
       !(cfg.rope_scaling.high_freq_factor > cfg.rope_scaling.low_freq_factor) ||
       !(cfg.rope_scaling.low_freq_factor > 0.0f))) {
    return make_error(
        "model config: llama3 rope_scaling needs original_max_position_embeddings > 0 and "
        "high_freq_factor > low_freq_factor > 0");
  }

  const int64_t d = cfg.hidden_size, qd = cfg.q_dim(), kvd = cfg.kv_dim();
  const int64_t inter = cfg.intermediate_size, vocab = cfg.vocab_size;
  QS_TRY(check_weight(weights.tok_embeddings, vocab, d, "model.embed_tokens.weight"));
  QS_TRY(check_weight(weights.final_norm, 1, d, "model.norm.weight"));
  QS_TRY(check_weight(weights.lm_head, vocab, d, "lm_head.weight"));
  if (static_cast<int>(weights.layers.size()) != cfg.num_layers) {
    return make_error("model weights: " + std::to_string(weights.layers.size()) +
                      " layers, config says num_hidden_layers = " + std::to_string(cfg.num_layers));
  }
  for (size_t l = 0; l < weights.layers.size(); ++l) {
    const LayerWeights& L = weights.layers[l];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    QS_TRY(check_weight(L.attn_norm, 1, d, p + "input_layernorm.weight"));
    QS_TRY(check_weight(L.wq, qd, d, p + "self_attn.q_proj.weight"));
    QS_TRY(check_weight(L.wk, kvd, d, p + "self_attn.k_proj.weight"));
    QS_TRY(check_weight(L.wv, kvd, d, p + "self_attn.v_proj.weight"));
    QS_TRY(check_weight(L.wo, d, qd, p + "self_attn.o_proj.weight"));
    if (cfg.attention_bias || !L.bq.empty()) {
      QS_TRY(check_weight(L.bq, 1, qd, p + "self_attn.q_proj.bias"));
    }
    if (cfg.attention_bias || !L.bk.empty()) {
      QS_TRY(check_weight(L.bk, 1, kvd, p + "self_attn.k_proj.bias"));
    }
    if (cfg.attention_bias || !L.bv.empty()) {
      QS_TRY(check_weight(L.bv, 1, kvd, p + "self_attn.v_proj.bias"));
    }
    if (!L.bo.empty()) {  // Llama with attention_bias: o_proj has a bias too (Qwen2 has none)
      QS_TRY(check_weight(L.bo, 1, d, p + "self_attn.o_proj.bias"));
    }
    QS_TRY(check_weight(L.mlp_norm, 1, d, p + "post_attention_layernorm.weight"));
    QS_TRY(check_weight(L.w_gate, inter, d, p + "mlp.gate_proj.weight"));
    QS_TRY(check_weight(L.w_up, inter, d, p + "mlp.up_proj.weight"));
    QS_TRY(check_weight(L.w_down, d, inter, p + "mlp.down_proj.weight"));
  }
  return Status::ok_status();
}

Model::Model(const ModelConfig& cfg, ModelWeights weights, Backend& backend)
    : cfg_(cfg), weights_(std::move(weights)), backend_(backend), inv_freq_(rope_inv_freq(cfg)) {
  QS_CHECK_MSG(check_model(cfg_, weights_).ok(), "Model built from unchecked weights");
}

Status Model::ensure_scratch(int m) {
  if (m <= scratch_rows_) return Status::ok_status();
  const size_t rows = static_cast<size_t>(m);
  const size_t d = cfg_.hidden_size, qd = cfg_.q_dim(), kvd = cfg_.kv_dim();
  const size_t inter = cfg_.intermediate_size;
  std::unique_ptr<Buffer>* bufs[] = {&hidden_, &normed_, &q_,    &k_, &v_,
                                     &attn_,   &proj_,   &gate_, &up_};
  const size_t sizes[] = {d, d, qd, kvd, kvd, qd, d, inter, inter};
  size_t total = 0;
  for (size_t s : sizes) total += s * rows;
  for (auto* b : bufs) b->reset();  // the old buffers first: the new ones replace them
  scratch_rows_ = 0;
  for (size_t i = 0; i < std::size(bufs); ++i) {
    *bufs[i] = backend_.try_alloc(rows * sizes[i]);
    if (!*bufs[i]) {
      for (auto* b : bufs) b->reset();
      return make_error("cannot allocate the activations of " + std::to_string(m) + " rows (" +
                        std::to_string(4.0 * double(total) / (1 << 30)) + " GiB) on " +
                        backend_.name() +
                        ": a smaller --prefill-chunk (prompt tokens per forward) needs less");
    }
  }
  scratch_rows_ = m;
  return Status::ok_status();
}

ForwardPath target_path(KvMode mode) {
  ForwardPath p;
  if (mode == KvMode::kInt8 || mode == KvMode::kQuantSpec) p.kv_view = KvQuantView::kTargetInt8;
  if (mode == KvMode::kInt4) p.kv_view = KvQuantView::kDraftInt4;
  return p;
}

ForwardPath draft_path(KvMode mode) {
  ForwardPath p;
  p.draft_weights = true;
  if (mode != KvMode::kFp) p.kv_view = KvQuantView::kDraftInt4;
  return p;
}

void Model::linear(const float* x, int m, const WeightView& w, const QuantizedWeight4* w4,
                   const WeightView* bias, float* y) {
  if (w4 != nullptr) {
    backend_.matmul_q4(x, m, *w4, bias, y);
  } else {
    backend_.matmul(x, m, w, bias, y);
  }
}

PendingNorm Model::linear_add_norm(const float* x, int m, const WeightView& w,
                                   const QuantizedWeight4* w4, const WeightView* bias, float* h,
                                   const WeightView& norm, float* out) {
  PendingNorm pn{h, &norm, cfg_.rms_norm_eps, out, false};
  if (comm_ == nullptr) {
    backend_.linear_add_rmsnorm_deferred(x, m, LinearOp{&w, w4, bias, proj_->data()}, pn);
    return pn;
  }
  linear(x, m, w, w4, bias, proj_->data());
  comm_->all_reduce_sum(proj_->data(), static_cast<size_t>(m) * cfg_.hidden_size);
  backend_.add_rmsnorm(h, proj_->data(), norm, m, pn.eps, out);
  return pn;
}

Status Model::forward(std::span<const int32_t> ids, int pos, KvCache& cache,
                      const ForwardPath& path, LogitRows rows, float* logits, int32_t* argmax) {
  return run(TokenInput{ids.data(), static_cast<int>(ids.size()), false}, pos, cache, path, rows,
             logits, argmax);
}

Status Model::forward_chained(const int32_t* ids, int m, int pos, KvCache& cache,
                              const ForwardPath& path, LogitRows rows, int32_t* argmax) {
  QS_CHECK(ids != nullptr && rows != LogitRows::kNone);
  return run(TokenInput{ids, m, true}, pos, cache, path, rows, nullptr, argmax);
}

RopeQK Model::rope_qk() const {
  return RopeQK{q_->data(), cfg_.num_heads, cfg_.num_kv_heads, cfg_.head_dim, inv_freq_.data()};
}

KvView Model::store_and_view(KvCache& cache, const ForwardPath& path, int layer, int pos, int m,
                             QuantizedKvSegment* segment, bool rows_written) {
  if (!rows_written) cache.write_with_rope(layer, pos, m, k_->data(), v_->data(), rope_qk());
  const bool quant = cache.quantized() && path.kv_view.has_value();
  if (quant) cache.quantize_below(layer, quant_boundary(pos + m - 1, cache.group_size()));
  KvView view = cache.view(layer, quant ? path.kv_view : std::nullopt, segment);
  view.read_bytes = path.kv_read;
  if (path.selection) {
    QS_CHECK_MSG(!quant, "a KV selection applies to full-precision views only");
    view.selection = &path.selection[layer];
  }
  return view;
}

Status Model::check_ids(std::span<const int32_t> ids) const {
  for (int32_t id : ids) {
    if (id < 0 || id >= cfg_.vocab_size) {
      return make_error("token id " + std::to_string(id) + " is out of range [0, " +
                        std::to_string(cfg_.vocab_size) + ")");
    }
  }
  return Status::ok_status();
}

const Model::DraftLayer& Model::draft_layer(int l, const ForwardPath& path) const {
  static const DraftLayer kNoDraft;
  return path.draft_weights ? draft_layers_[l] : kNoDraft;
}

std::array<LinearOp, 3> Model::qkv_ops(int l, const ForwardPath& path) const {
  const LayerWeights& L = weights_.layers[l];
  const DraftLayer& D = draft_layer(l, path);
  return {LinearOp{&L.wq, D.wq.get(), &L.bq, q_->data()},
          LinearOp{&L.wk, D.wk.get(), &L.bk, k_->data()},
          LinearOp{&L.wv, D.wv.get(), &L.bv, v_->data()}};
}

// Layer l over m rows at [pos, pos + m): h is the residual stream, `in` = attn_norm_l(h) on entry
// (its rows in in.out, or deferred by the backend). With next_norm, the MLP's output is added to
// h and the returned rows are next_norm(h) (in in.out, or deferred); without, the MLP's output is
// left in proj_, not yet added to h (the caller adds it, fused with the norm that reads the sum
// where it can), in.out is overwritten and the result is not used. With qkv_ready the previous
// layer's output_and_mlp has computed this layer's q/k/v, rotated q and k and stored the new K/V
// rows; next_qkv_ready says whether this one did that for the next layer.
PendingNorm Model::layer(int l, float* h, const PendingNorm& in, bool qkv_ready, int m, int pos,
                         KvCache& cache, const ForwardPath& path, const WeightView* next_norm,
                         bool& next_qkv_ready) {
  float* x = in.out;
  const LayerWeights& L = weights_.layers[l];
  const DraftLayer& D = draft_layer(l, path);
  const int64_t d = cfg_.hidden_size;
  next_qkv_ready = false;
  // HF: scaling = head_dim ** -0.5 in double, applied in f32.
  const AttentionShape shape{cfg_.num_heads, cfg_.num_kv_heads, cfg_.head_dim,
                             cfg_.attention_scale()};
  // Attention block (q/k/v computed by the previous layer's output_and_mlp where qkv_ready).
  if (!qkv_ready) backend_.matmul_group_normed(in, m, qkv_ops(l, path).data(), 3);
  QuantizedKvSegment segment;
  const KvView view = store_and_view(cache, path, l, pos, m, &segment, qkv_ready);  // RoPE'd q, k
  if (path.query_tap) path.query_tap(l, q_->data(), m);
  backend_.attention(q_->data(), m, pos, shape, view, attn_->data());
  // Tensor parallel: each rank's o_proj covers its heads (a partial sum); the bias goes into the
  // sum once.
  const bool bias_here = comm_ == nullptr || comm_->rank() == 0;
  const LinearOp gate_up[] = {{&L.w_gate, D.w_gate.get(), nullptr, gate_->data()},
                              {&L.w_up, D.w_up.get(), nullptr, up_->data()}};
  if (comm_ == nullptr && next_norm != nullptr) {
    // o_proj, the MLP and the next layer's q/k/v, RoPE and K/V rows in one backend call (this
    // layer's attention has read its q, k and v).
    PendingNorm mlp_in{h, &L.mlp_norm, cfg_.rms_norm_eps, x, false};
    PendingNorm next{h, next_norm, cfg_.rms_norm_eps, x, false};
    const std::array<LinearOp, 3> next_qkv = qkv_ops(l + 1, path);
    const KvCache::RowPair dst = cache.write_targets(l + 1, pos, m);
    const KvRowStore next_rows{rope_qk(), pos, dst.k, dst.v, cache.row_dtype()};
    backend_.output_and_mlp(attn_->data(), m, LinearOp{&L.wo, D.wo.get(), &L.bo, proj_->data()},
                            mlp_in, gate_up[0], gate_up[1], gate_->data(),
                            LinearOp{&L.w_down, D.w_down.get(), nullptr, proj_->data()}, next,
                            next_qkv.data(), 3, &next_rows);
    next_qkv_ready = true;
    return next;
  }
  const PendingNorm mlp_in = linear_add_norm(attn_->data(), m, L.wo, D.wo.get(),
                                             bias_here ? &L.bo : nullptr, h, L.mlp_norm, x);
  // MLP block.
  backend_.gate_up_swiglu_normed(mlp_in, m, gate_up[0], gate_up[1], gate_->data());
  if (next_norm != nullptr) {
    return linear_add_norm(gate_->data(), m, L.w_down, D.w_down.get(), nullptr, h, *next_norm, x);
  }
  linear(gate_->data(), m, L.w_down, D.w_down.get(), nullptr, proj_->data());
  if (comm_) comm_->all_reduce_sum(proj_->data(), static_cast<size_t>(m * d));
  return PendingNorm{};
}

Status Model::run(const TokenInput& in, int pos, KvCache& cache, const ForwardPath& path,
                  LogitRows rows, float* logits, int32_t* argmax) {
  const int m = in.m;
  QS_CHECK(m >= 1 && pos >= 0);
  QS_CHECK(cache.config().num_layers == cfg_.num_layers && cache.kv_dim() == cfg_.kv_dim());
  QS_CHECK_MSG(!path.draft_weights || !draft_layers_.empty(),
               "draft path without draft weights (make_draft_weights)");
  if (!in.chained) QS_TRY(check_ids(std::span<const int32_t>(in.ids, static_cast<size_t>(m))));
  QS_TRY(cache.prepare_write(pos, m));
  QS_TRY(ensure_scratch(m));

  const int64_t d = cfg_.hidden_size;
  const float eps = cfg_.rms_norm_eps;
  float* h = hidden_->data();
  float* x = normed_->data();
  // Each residual add is fused with the norm that reads its sum and with the projection that
  // makes it (Backend::linear_add_rmsnorm): o_proj's with the MLP norm, down_proj's with the
  // next layer's attention norm (the last layer's with the final norm, below, over the rows that
  // need it). Only the first attention norm stands alone.
  if (in.chained) {
    backend_.embedding_of_ids(weights_.tok_embeddings, in.ids, m, h);
  } else {
    backend_.embedding(weights_.tok_embeddings, in.ids, m, h);
  }
  backend_.rmsnorm(h, weights_.layers[0].attn_norm, m, eps, x);
  PendingNorm rows_in{h, &weights_.layers[0].attn_norm, eps, x, false};
  bool qkv_ready = false;
  for (int l = 0; l < cfg_.num_layers; ++l) {
    const bool last = l + 1 == cfg_.num_layers;
    bool next_qkv_ready = false;
    rows_in = layer(l, h, rows_in, qkv_ready, m, pos, cache, path,
                    last ? nullptr : &weights_.layers[l + 1].attn_norm, next_qkv_ready);
    qkv_ready = next_qkv_ready;
  }

  // The last residual add, fused with the final norm, only over the rows that produce logits,
  // [first, m): the residual stream is not read after this (the next call starts from the
  // embedding), so the other rows' sums would be dead work.
  if (rows == LogitRows::kNone) return Status::ok_status();
  const int first = rows == LogitRows::kLast ? m - 1 : 0;
  const int count = m - first;
  backend_.add_rmsnorm(h + first * d, proj_->data() + first * d, weights_.final_norm, count, eps,
                       x);
  head(x, count, path.draft_weights, logits, argmax, in.chained);
  return Status::ok_status();
}

void Model::head(const float* x, int count, bool draft, float* logits, int32_t* argmax,
                 bool chained) {
  if (count > logits_rows_) {  // sized apart: prefill chunks mostly need one row of logits
    logits_ = backend_.alloc(static_cast<size_t>(count) * cfg_.vocab_size);
    logits_rows_ = count;
  }
  linear(x, count, weights_.lm_head, draft ? draft_lm_head_.get() : nullptr, nullptr,
         logits_->data());
  if (argmax != nullptr && chained) {
    backend_.argmax_rows_into(logits_->data(), count, cfg_.vocab_size, argmax);
  } else if (argmax != nullptr) {
    backend_.argmax_rows(logits_->data(), count, cfg_.vocab_size, argmax);
  } else if (logits != nullptr) {
    backend_.to_host(logits_->data(), logits, static_cast<size_t>(count) * cfg_.vocab_size);
  }
}

Status Model::prefill_by_layer(std::span<const int32_t> ids, int chunk, KvCache& cache,
                               float* logits, const std::function<void(int64_t)>& progress) {
  const int n = static_cast<int>(ids.size());
  QS_CHECK(n >= 1 && chunk >= 1 && logits != nullptr);
  QS_CHECK(cache.config().num_layers == cfg_.num_layers && cache.kv_dim() == cfg_.kv_dim());
  QS_TRY(check_ids(ids));
  chunk = std::min(chunk, n);
  const int64_t d = cfg_.hidden_size;
  const float eps = cfg_.rms_norm_eps;
  std::unique_ptr<Buffer> stream = backend_.try_alloc(static_cast<size_t>(n) * d);
  if (!stream) {
    return make_error("prefill: cannot allocate the residual stream of " + std::to_string(n) +
                      " tokens (" + std::to_string(4.0 * n * d / (1 << 30)) + " GiB) on " +
                      backend_.name());
  }
  QS_TRY(cache.begin_layer_prefill(n));
  QS_TRY(ensure_scratch(chunk));
  float* x = normed_->data();
  backend_.embedding(weights_.tok_embeddings, ids.data(), n, stream->data());
  // Per chunk the same calls as run()'s: its fused add + norm after down_proj is the add, then
  // (at the next layer, or the head) the norm, which Backend::add_rmsnorm's and
  // linear_add_rmsnorm's contracts make bit-identical.
  const ForwardPath path;  // the original weights, full-precision attention
  for (int l = 0; l < cfg_.num_layers; ++l) {
    for (int start = 0; start < n; start += chunk) {
      const int m = std::min(chunk, n - start);
      float* h = stream->data() + start * d;
      backend_.rmsnorm(h, weights_.layers[l].attn_norm, m, eps, x);
      bool next_qkv_ready = false;  // stays false: no next layer is passed
      layer(l, h, PendingNorm{h, &weights_.layers[l].attn_norm, eps, x, false}, false, m, start,
            cache, path, nullptr, next_qkv_ready);
      backend_.add(h, proj_->data(), m * d);
      if (progress) progress(static_cast<int64_t>(l) * n + start + m);
    }
    cache.end_layer_prefill(l);
  }
  backend_.rmsnorm(stream->data() + (n - 1) * d, weights_.final_norm, 1, eps, x);
  head(x, 1, false, logits, nullptr, false);
  return Status::ok_status();
}

Model::~Model() {
  drop_draft_weights();
}

std::vector<const QuantizedWeight4*> Model::draft_weights4() const {
  std::vector<const QuantizedWeight4*> w;
  for (const DraftLayer& D : draft_layers_) {
    for (const auto* p : {&D.wq, &D.wk, &D.wv, &D.wo, &D.w_gate, &D.w_up, &D.w_down}) {
      if (*p) w.push_back(p->get());
    }
  }
  if (draft_lm_head_) w.push_back(draft_lm_head_.get());
  return w;
}

void Model::drop_draft_weights() {
  const std::vector<const QuantizedWeight4*> w = draft_weights4();
  if (!w.empty()) backend_.forget_weights4(w);
  draft_layers_.clear();
  draft_lm_head_.reset();
}

Status Model::make_draft_weights(DraftWeights kind, int threads) {
  drop_draft_weights();
  draft_layers_.resize(weights_.layers.size());
  if (kind == DraftWeights::kNative) return Status::ok_status();
  ThreadPool pool(threads);
  auto quantize = [&pool](const WeightView& w) -> Result<std::unique_ptr<QuantizedWeight4>> {
    QS_ASSIGN_OR_RETURN(QuantizedWeight4 q, quantize_weight4(w.data, w.dtype, w.rows, w.cols,
                                                             kWeightQuantGroup, w.name, &pool));
    return std::make_unique<QuantizedWeight4>(std::move(q));
  };
  for (size_t l = 0; l < weights_.layers.size(); ++l) {
    const LayerWeights& L = weights_.layers[l];
    DraftLayer& D = draft_layers_[l];
    QS_ASSIGN_OR_RETURN(D.w_gate, quantize(L.w_gate));
    QS_ASSIGN_OR_RETURN(D.w_up, quantize(L.w_up));
    QS_ASSIGN_OR_RETURN(D.w_down, quantize(L.w_down));
    if (kind == DraftWeights::kInt4) {
      QS_ASSIGN_OR_RETURN(D.wq, quantize(L.wq));
      QS_ASSIGN_OR_RETURN(D.wk, quantize(L.wk));
      QS_ASSIGN_OR_RETURN(D.wv, quantize(L.wv));
      QS_ASSIGN_OR_RETURN(D.wo, quantize(L.wo));
    }
  }
  if (kind == DraftWeights::kInt4) {
    QS_ASSIGN_OR_RETURN(draft_lm_head_, quantize(weights_.lm_head));
  }
  backend_.prepare_weights4(draft_weights4());  // resident now, as the target's weights are
  return Status::ok_status();
}

size_t Model::draft_weight_bytes_per_token() const {
  if (draft_layers_.empty()) return weight_bytes_per_token();
  auto bytes = [](const WeightView& w, const std::unique_ptr<QuantizedWeight4>& q) {
    if (q) return static_cast<size_t>(q->bytes());
    return w.empty() ? size_t{0} : static_cast<size_t>(w.numel()) * dtype_size(w.dtype);
  };
  static const std::unique_ptr<QuantizedWeight4> kNone;
  size_t total =
      bytes(weights_.final_norm, kNone) + bytes(weights_.lm_head, draft_lm_head_) +
      static_cast<size_t>(weights_.tok_embeddings.cols) * dtype_size(weights_.tok_embeddings.dtype);
  for (size_t l = 0; l < weights_.layers.size(); ++l) {
    const LayerWeights& L = weights_.layers[l];
    const DraftLayer& D = draft_layers_[l];
    total += bytes(L.attn_norm, kNone) + bytes(L.mlp_norm, kNone) + bytes(L.bq, kNone) +
             bytes(L.bk, kNone) + bytes(L.bv, kNone) + bytes(L.bo, kNone);
    total += bytes(L.wq, D.wq) + bytes(L.wk, D.wk) + bytes(L.wv, D.wv) + bytes(L.wo, D.wo) +
             bytes(L.w_gate, D.w_gate) + bytes(L.w_up, D.w_up) + bytes(L.w_down, D.w_down);
  }
  return total;
}

size_t Model::weight_bytes_per_token() const {
  auto bytes = [](const WeightView& w) {
    return w.empty() ? size_t{0} : static_cast<size_t>(w.numel()) * dtype_size(w.dtype);
  };
  size_t total =
      bytes(weights_.final_norm) + bytes(weights_.lm_head) +
      static_cast<size_t>(weights_.tok_embeddings.cols) * dtype_size(weights_.tok_embeddings.dtype);
  for (const LayerWeights& L : weights_.layers) {
    for (const WeightView* w : {&L.attn_norm, &L.wq, &L.wk, &L.wv, &L.wo, &L.bq, &L.bk, &L.bv,
                                &L.bo, &L.mlp_norm, &L.w_gate, &L.w_up, &L.w_down}) {
      total += bytes(*w);
    }
  }
  return total;
}

}  // namespace qs
