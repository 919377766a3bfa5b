#include "kv/kv_cache.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

namespace qs {

namespace {

constexpr int kMinValueGroup = 32;

std::string str(int64_t x) {
  return std::to_string(x);
}

}  // namespace

const char* kv_mode_name(KvMode mode) {
  switch (mode) {
    case KvMode::kFp:
      return "fp";
    case KvMode::kInt8:
      return "int8";
    case KvMode::kInt4:
      return "int4";
    case KvMode::kQuantSpec:
      return "quantspec";
  }
  return "?";
}

Status KvCacheConfig::validate() const {
  if (num_layers <= 0 || num_kv_heads <= 0 || head_dim <= 0 || head_dim % 2 != 0) {
    return make_error("KV cache: bad model shape (layers " + str(num_layers) + ", kv heads " +
                      str(num_kv_heads) + ", head_dim " + str(head_dim) + ")");
  }
  if (capacity <= 0) return make_error("KV cache: capacity must be > 0, got " + str(capacity));
  if (!kv_row_dtype_supported(row_dtype)) {
    return make_error(std::string("KV cache: full-precision rows must be F32 or F16, got ") +
                      dtype_name(row_dtype));
  }
  if (group_size < 8 || group_size > 256 || (group_size & (group_size - 1)) != 0) {
    return make_error("KV cache: the group size G must be a power of two in [8, 256], got " +
                      str(group_size));
  }
  if (value_group_size != 0 &&
      (value_group_size < 0 || head_dim % value_group_size != 0 ||
       (value_group_size < kMinValueGroup && value_group_size != head_dim))) {
    return make_error("KV cache: the value group size Gv must divide head_dim " + str(head_dim) +
                      " and be >= " + str(kMinValueGroup) + ", got " + str(value_group_size));
  }
  if (mode == KvMode::kFp) return Status::ok_status();
  if (max_gamma < 0 || max_gamma >= group_size) {
    return make_error("KV cache: gamma must be in [1, G - 1] = [1, " + str(group_size - 1) +
                      "] (the speculative rows must not reach a group that is not committed), "
                      "got " +
                      str(max_gamma));
  }
  return Status::ok_status();
}

Result<KvCache> KvCache::create(const KvCacheConfig& config, Backend& backend) {
  QS_TRY(config.validate());
  KvCache c;
  c.cfg_ = config;
  c.backend_ = &backend;
  if (c.quantized()) {
    KvPlanesShape shape;
    shape.n_layers = config.num_layers;
    shape.n_kv_heads = config.num_kv_heads;
    shape.head_dim = config.head_dim;
    shape.group_size = config.group_size;
    shape.value_group_size = config.value_group_size;
    shape.capacity = (static_cast<int64_t>(config.capacity) + config.group_size - 1) /
                     config.group_size * config.group_size;
    QS_ASSIGN_OR_RETURN(QuantizedPlanes planes, QuantizedPlanes::create(shape, &backend));
    c.planes_.emplace(std::move(planes));
  }
  c.layer_quantized_.reset(new int[config.num_layers]());
  QS_TRY(c.reserve_rows(std::min(c.steady_rows(), config.capacity)));
  return c;
}

int KvCache::steady_rows() const {
  return quantized() ? 2 * cfg_.group_size + cfg_.max_gamma + 1 : 64;
}

size_t KvCache::bytes() const {
  size_t b = 2 * static_cast<size_t>(cfg_.num_layers) * buffer_rows_ * kv_dim() * elem_bytes();
  b += 2 * static_cast<size_t>(lp_rows_) * kv_dim() * elem_bytes();
  if (planes_) b += static_cast<size_t>(planes_->shape().total_bytes());
  return b;
}

Status KvCache::reserve_rows(int rows) {
  if (rows <= buffer_rows_) return Status::ok_status();
  return resize_rows(rows);
}

Status KvCache::resize_rows(int rows) {
  QS_CHECK(rows >= fp_end_ - fp_base_);
  const size_t per_layer = static_cast<size_t>(rows) * kv_dim() * elem_bytes();  // bytes
  const size_t total = per_layer * cfg_.num_layers;
  const size_t floats = (total + sizeof(float) - 1) / sizeof(float);  // Buffer counts floats
  std::unique_ptr<Buffer> k = backend_->try_alloc(floats);
  std::unique_ptr<Buffer> v = k ? backend_->try_alloc(floats) : nullptr;
  if (!v && fp_end_ == fp_base_ && k_buf_) {
    // Nothing to keep: without the old buffer the new one may fit (a 128K prompt after a 64K one
    // on Llama-2-7B needs 64 GiB of rows, and the old 32 GiB are in the way).
    k.reset();
    k_buf_.reset();
    v_buf_.reset();
    buffer_rows_ = 0;
    k = backend_->try_alloc(floats);
    v = k ? backend_->try_alloc(floats) : nullptr;
  }
  if (!v) {
    return make_error("KV cache: cannot allocate " + std::to_string(2.0 * total / (1 << 30)) +
                      " GiB on " + backend_->name() + " for " + str(rows) + " full-precision " +
                      (cfg_.row_dtype == DType::F16 ? "(f16)" : "(f32)") + " positions");
  }
  const size_t used = static_cast<size_t>(fp_end_ - fp_base_) * kv_dim() * elem_bytes();
  for (int l = 0; l < cfg_.num_layers && used > 0; ++l) {
    const size_t old = static_cast<size_t>(l) * buffer_rows_ * kv_dim() * elem_bytes();
    auto* k_new = reinterpret_cast<char*>(k->data()) + l * per_layer;
    auto* v_new = reinterpret_cast<char*>(v->data()) + l * per_layer;
    backend_->copy_bytes(k_new, reinterpret_cast<const char*>(k_buf_->data()) + old, used);
    backend_->copy_bytes(v_new, reinterpret_cast<const char*>(v_buf_->data()) + old, used);
  }
  k_buf_ = std::move(k);
  v_buf_ = std::move(v);
  buffer_rows_ = rows;
  return Status::ok_status();
}

void* KvCache::k_row(int layer, int pos) const {
  if (!k_buf_) return nullptr;  // released by a failed growth: no rows
  return reinterpret_cast<char*>(k_buf_->data()) +
         (static_cast<int64_t>(layer) * buffer_rows_ + (pos - fp_base_)) * kv_dim() *
             static_cast<int64_t>(elem_bytes());
}

void* KvCache::v_row(int layer, int pos) const {
  if (!v_buf_) return nullptr;  // released by a failed growth: no rows
  return reinterpret_cast<char*>(v_buf_->data()) +
         (static_cast<int64_t>(layer) * buffer_rows_ + (pos - fp_base_)) * kv_dim() *
             static_cast<int64_t>(elem_bytes());
}

Status KvCache::prepare_write(int pos, int m) {
  QS_CHECK(m >= 0);
  QS_CHECK_MSG(pos >= n_ && pos <= fp_end_, "KV cache: write at " + str(pos) +
                                                " outside [n, written_end] = [" + str(n_) + ", " +
                                                str(fp_end_) + "]");
  if (static_cast<int64_t>(pos) + m > cfg_.capacity) {
    return make_error("context is full: " + str(static_cast<int64_t>(pos) + m) +
                      " positions needed but the KV cache holds " + str(cfg_.capacity));
  }
  const int needed = pos + m - fp_base_;
  if (needed > buffer_rows_) {
    // Grows geometrically (prefill, evaluation windows; commit() shrinks it back), and straight to
    // the capacity once more than half of it is needed: a growth holds the old and the new buffer
    // at once, and two large steps (half, then all) would need 1.5x the final size (Llama-2-7B at
    // 128K: 96 of the 140 GB).
    // With kept rows (keep_rows_from) never past what they may take: their max_rows below b(n),
    // the steady rows above it.
    const int room = cfg_.capacity - fp_base_;
    int rows = needed > room / 2 ? room : std::min(std::max(needed, 2 * buffer_rows_), room);
    if (keep_from_ >= 0) rows = std::max(needed, std::min(rows, keep_max_ + steady_rows()));
    const Status grown = reserve_rows(rows);
    if (!grown.ok() && keep_from_ >= 0) {
      drop_kept_rows();  // the kept rows are what is in the way: the write goes first
      return prepare_write(pos, m);
    }
    QS_TRY(grown);
  }
  return Status::ok_status();
}

KvCache::RowPair KvCache::begin_write(int layer, int pos, int m) {
  QS_CHECK(layer >= 0 && layer < cfg_.num_layers);
  if (in_layer_prefill()) {
    QS_CHECK_MSG(layer == lp_layer_ && pos >= 0 && pos <= lp_end_ && pos + m <= lp_rows_,
                 "KV cache: layer-major prefill writes layer " + str(lp_layer_) + " rows [0, " +
                     str(lp_rows_) + ") in order");
    lp_end_ = pos + m;
    return {lp_row(lp_k_, pos), lp_row(lp_v_, pos)};
  }
  QS_CHECK(pos >= std::max(n_, fp_base_) && pos <= fp_end_ && pos + m <= cfg_.capacity);
  QS_CHECK_MSG(pos + m - fp_base_ <= buffer_rows_, "KV cache: write without prepare_write");
  fp_end_ = pos + m;
  return {k_row(layer, pos), v_row(layer, pos)};
}

void KvCache::write(int layer, int pos, int m, const float* k, const float* v) {
  const RowPair dst = begin_write(layer, pos, m);
  backend_->store_kv_row_pair(dst.k, dst.v, cfg_.row_dtype, k, v,
                              static_cast<size_t>(m) * kv_dim());
}

void KvCache::write_with_rope(int layer, int pos, int m, float* k, const float* v,
                              const RopeQK& rope) {
  QS_CHECK(rope.num_kv_heads * rope.head_dim == kv_dim());
  const RowPair dst = begin_write(layer, pos, m);
  backend_->rope_qk_store_kv(rope, m, pos, k, v, dst.k, dst.v, cfg_.row_dtype);
}

void KvCache::quantize_below(int layer, int end) {
  QS_CHECK(planes_.has_value());
  const int G = cfg_.group_size;
  QS_CHECK(end % G == 0 && end <= fp_end_);
  const int start = layer_quantized_[layer];
  if (start >= end) return;
  QS_CHECK_MSG(start >= fp_base_, "KV cache: group rows already left the buffer");
  backend_->quantize_kv(k_row(layer, start), v_row(layer, start), cfg_.row_dtype, kv_dim(),
                        cfg_.num_kv_heads, cfg_.head_dim, start / G, (end - start) / G,
                        planes_->output(layer));
  layer_quantized_[layer] = end;
}

void KvCache::quantize_layers_below(int end) {
  const int start = layer_quantized_[0];
  bool same = true;
  for (int l = 1; l < cfg_.num_layers; ++l) same = same && layer_quantized_[l] == start;
  if (!same || start >= end) {  // forwards left the layers at different positions (or done)
    for (int l = 0; l < cfg_.num_layers; ++l) quantize_below(l, end);
    return;
  }
  const int G = cfg_.group_size;
  QS_CHECK(end % G == 0 && end <= fp_end_);
  QS_CHECK_MSG(start >= fp_base_, "KV cache: group rows already left the buffer");
  std::vector<QuantizedKvPlanesOut> dst(cfg_.num_layers);
  for (int l = 0; l < cfg_.num_layers; ++l) dst[l] = planes_->output(l);
  backend_->quantize_kv_layers(k_row(0, start), v_row(0, start), cfg_.row_dtype, kv_dim(),
                               static_cast<int64_t>(buffer_rows_) * kv_dim(), cfg_.num_layers,
                               cfg_.num_kv_heads, cfg_.head_dim, start / G, (end - start) / G,
                               dst.data());
  for (int l = 0; l < cfg_.num_layers; ++l) layer_quantized_[l] = end;
}

void KvCache::shift_rows(int from) {
  const int shift = from - fp_base_;
  const int keep = fp_end_ - from;
  QS_CHECK(shift > 0 && keep >= 0);
  // Chunks of at most `shift` rows: source and destination of one copy never overlap. Each chunk
  // moves in every layer at once (the layers' rows are buffer_rows_ apart).
  const size_t pitch = static_cast<size_t>(buffer_rows_) * kv_dim() * elem_bytes();
  for (int r = 0; r < keep; r += shift) {
    const size_t n = static_cast<size_t>(std::min(shift, keep - r)) * kv_dim() * elem_bytes();
    backend_->copy_bytes_strided(k_row(0, fp_base_ + r), pitch, k_row(0, from + r), pitch, n,
                                 cfg_.num_layers);
    backend_->copy_bytes_strided(v_row(0, fp_base_ + r), pitch, v_row(0, from + r), pitch, n,
                                 cfg_.num_layers);
  }
  fp_base_ = from;
}

void KvCache::commit(int n) {
  QS_CHECK_MSG(n >= n_ && n <= fp_end_, "KV cache: commit of " + str(n) + " outside [" + str(n_) +
                                            ", " + str(fp_end_) + "]");
  n_ = n;
  fp_end_ = n;  // rows past n were speculative
  if (!quantized()) return;
  const int G = cfg_.group_size;
  const int complete = G * (n / G);
  if (complete > n_planes_) {
    flushes_ += (complete - n_planes_) / G;
    quantize_layers_below(complete);
    n_planes_ = complete;
  }
  const int base = buffer_start(n);
  if (base > fp_base_) shift_rows(base);
  // Give back what a long prefill grew (a failed allocation just keeps the large buffer): down
  // to the steady rows, or with kept rows (keep_rows_from) to those and the steady rows.
  const int steady = steady_rows();
  const int used = fp_end_ - fp_base_;
  const int want = used <= steady ? steady : used + steady;
  if (buffer_rows_ > std::max(2 * want, held_rows_)) {
    (void)resize_rows(std::max(want, held_rows_));
  }
}

int KvCache::buffer_start(int n) {
  const int b = quant_boundary(n, cfg_.group_size);
  if (keep_from_ < 0) return b;
  if (b - std::max(keep_from_, fp_base_) > keep_max_) {
    keep_from_ = -1;
    return b;
  }
  return std::min(b, keep_from_);
}

void KvCache::keep_rows_from(int from, int max_rows) {
  QS_CHECK(from >= 0 && max_rows >= 0);
  if (!quantized()) return;
  keep_from_ = from;
  keep_max_ = max_rows;
}

void KvCache::drop_kept_rows() {
  keep_from_ = -1;
  const int b = quant_boundary(n_, cfg_.group_size);
  if (b > fp_base_) shift_rows(b);
}

bool KvCache::can_truncate(int n) const {
  if (n < 0 || n > n_ || in_layer_prefill()) return false;
  return !quantized() || quant_boundary(n, cfg_.group_size) >= fp_base_;
}

void KvCache::truncate(int n) {
  QS_CHECK_MSG(can_truncate(n), "KV cache: truncate to " + str(n) + " of " + str(n_) +
                                    " positions with full-precision rows from " + str(fp_base_));
  n_ = n;
  fp_end_ = n;
  if (!quantized()) return;
  const int complete = cfg_.group_size * (n / cfg_.group_size);
  n_planes_ = std::min(n_planes_, complete);
  for (int l = 0; l < cfg_.num_layers; ++l) {
    layer_quantized_[l] = std::min(layer_quantized_[l], complete);
  }
}

Status KvCache::hold_rows(int chunk) {
  QS_CHECK(chunk >= 0);
  held_rows_ = chunk > 0 ? std::min(chunk + steady_rows(), cfg_.capacity) : 0;
  return reserve_rows(held_rows_);
}

void KvCache::clear() {
  n_ = n_planes_ = fp_base_ = fp_end_ = flushes_ = 0;
  keep_from_ = -1;
  for (int l = 0; l < cfg_.num_layers; ++l) layer_quantized_[l] = 0;
  // A quantized cache gives back what kept rows grew (the next prompt's prefill allocates its
  // own scratch); the fp cache keeps its buffer for the next prompt's rows.
  const int steady = std::min(steady_rows(), cfg_.capacity);
  if (quantized() && buffer_rows_ > 2 * steady) (void)resize_rows(steady);
  lp_rows_ = lp_layer_ = lp_end_ = 0;
  lp_k_.reset();
  lp_v_.reset();
}

void* KvCache::lp_row(const std::unique_ptr<Buffer>& b, int pos) const {
  return reinterpret_cast<char*>(b->data()) +
         static_cast<int64_t>(pos) * kv_dim() * static_cast<int64_t>(elem_bytes());
}

Status KvCache::begin_layer_prefill(int n) {
  QS_CHECK_MSG(quantized() && n_ == 0 && fp_end_ == 0 && !in_layer_prefill(),
               "KV cache: a layer-major prefill starts on an empty quantized cache");
  QS_CHECK(n >= 1);
  if (n > cfg_.capacity) {
    return make_error("context is full: " + str(n) + " positions needed but the KV cache holds " +
                      str(cfg_.capacity));
  }
  // The rows every layer keeps after the prompt: [b(n), n), fewer than 2G, or from the kept
  // position (keep_rows_from) where the buffer can take them.
  lp_base_ = buffer_start(n);
  if (!reserve_rows(n - lp_base_).ok()) {
    keep_from_ = -1;
    lp_base_ = quant_boundary(n, cfg_.group_size);
    QS_TRY(reserve_rows(n - lp_base_));
  }
  const size_t bytes = static_cast<size_t>(n) * kv_dim() * elem_bytes();
  const size_t floats = (bytes + sizeof(float) - 1) / sizeof(float);  // Buffer counts floats
  lp_k_ = backend_->try_alloc(floats);
  lp_v_ = lp_k_ ? backend_->try_alloc(floats) : nullptr;
  if (!lp_v_) {
    lp_k_.reset();
    return make_error("KV cache: cannot allocate " + std::to_string(2.0 * bytes / (1 << 30)) +
                      " GiB on " + backend_->name() + " for one layer's " + str(n) +
                      " full-precision prompt rows");
  }
  lp_rows_ = n;
  lp_layer_ = lp_end_ = 0;
  return Status::ok_status();
}

void KvCache::end_layer_prefill(int layer) {
  QS_CHECK_MSG(in_layer_prefill() && layer == lp_layer_ && lp_end_ == lp_rows_,
               "KV cache: end_layer_prefill(" + str(layer) + ") before its rows are written");
  const int n = lp_rows_;
  const int G = cfg_.group_size;
  const int complete = G * (n / G);
  const int base = lp_base_;
  if (complete > 0) {
    backend_->quantize_kv(lp_row(lp_k_, 0), lp_row(lp_v_, 0), cfg_.row_dtype, kv_dim(),
                          cfg_.num_kv_heads, cfg_.head_dim, 0, complete / G,
                          planes_->output(layer));
  }
  layer_quantized_[layer] = complete;
  // Row `base` lands at the start of the layer's buffer: fp_base_ becomes `base` below.
  const size_t keep = static_cast<size_t>(n - base) * kv_dim() * elem_bytes();
  const size_t at = static_cast<size_t>(layer) * buffer_rows_ * kv_dim() * elem_bytes();
  backend_->copy_bytes(reinterpret_cast<char*>(k_buf_->data()) + at, lp_row(lp_k_, base), keep);
  backend_->copy_bytes(reinterpret_cast<char*>(v_buf_->data()) + at, lp_row(lp_v_, base), keep);
  lp_end_ = 0;
  if (++lp_layer_ < cfg_.num_layers) return;
  // Every layer done: the state commit(n) leaves after a chunk-major prefill.
  n_ = fp_end_ = n;
  fp_base_ = base;
  n_planes_ = complete;
  flushes_ += complete / G;
  lp_rows_ = lp_layer_ = 0;
  lp_k_.reset();
  lp_v_.reset();
}

KvView KvCache::view(int layer, std::optional<KvQuantView> quant_view,
                     QuantizedKvSegment* segment) const {
  QS_CHECK(layer >= 0 && layer < cfg_.num_layers);
  if (in_layer_prefill()) {
    QS_CHECK_MSG(layer == lp_layer_ && !quant_view,
                 "KV cache: a layer-major prefill reads its layer's rows in full precision");
    KvView v{lp_row(lp_k_, 0), lp_row(lp_v_, 0), kv_dim(), lp_end_};
    v.row_dtype = cfg_.row_dtype;
    return v;
  }
  KvView v{k_row(layer, fp_base_), v_row(layer, fp_base_), kv_dim(), fp_end_};
  v.fp_base = fp_base_;
  v.row_dtype = cfg_.row_dtype;
  if (!quantized() || !quant_view) return v;
  QS_CHECK(segment != nullptr);
  *segment = planes_->segment(layer, *quant_view);
  v.quantized = segment;
  return v;
}

}  // namespace qs
