#include "kv/kv_cache.h"

#include <algorithm>
#include <cstring>
#include <string>

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

Result<KvCache> KvCache::create(const KvCacheConfig& config) {
  QS_TRY(config.validate());
  KvCache c;
  c.cfg_ = config;
  if (c.quantized()) {
    KvPlanesShape shape;
    shape.n_layers = config.num_layers;
    shape.n_kv_heads = config.num_kv_heads;
    shape.head_dim = config.head_dim;
    shape.group_size = config.group_size;
    shape.value_group_size = config.value_group_size;
    shape.capacity = (static_cast<int64_t>(config.capacity) + config.group_size - 1) /
                     config.group_size * config.group_size;
    QS_ASSIGN_OR_RETURN(QuantizedPlanes planes, QuantizedPlanes::create(shape));
    c.planes_.emplace(std::move(planes));
  }
  c.layer_quantized_.reset(new int[config.num_layers]());
  const int steady = c.quantized() ? 2 * config.group_size + config.max_gamma + 1 : 64;
  c.reserve_rows(std::min(steady, config.capacity));
  return c;
}

size_t KvCache::bytes() const {
  size_t b = 2 * static_cast<size_t>(cfg_.num_layers) * buffer_rows_ * kv_dim() * sizeof(float);
  if (planes_) b += static_cast<size_t>(planes_->shape().total_bytes());
  return b;
}

void KvCache::reserve_rows(int rows) {
  if (rows <= buffer_rows_) return;
  const size_t per_layer = static_cast<size_t>(rows) * kv_dim();
  std::unique_ptr<float[]> k(new float[per_layer * cfg_.num_layers]);
  std::unique_ptr<float[]> v(new float[per_layer * cfg_.num_layers]);
  const size_t used = static_cast<size_t>(fp_end_ - fp_base_) * kv_dim();
  for (int l = 0; l < cfg_.num_layers && used > 0; ++l) {
    const size_t old = static_cast<size_t>(l) * buffer_rows_ * kv_dim();
    std::memcpy(k.get() + l * per_layer, k_buf_.get() + old, used * sizeof(float));
    std::memcpy(v.get() + l * per_layer, v_buf_.get() + old, used * sizeof(float));
  }
  k_buf_ = std::move(k);
  v_buf_ = std::move(v);
  buffer_rows_ = rows;
}

float* KvCache::k_row(int layer, int pos) const {
  return k_buf_.get() + (static_cast<int64_t>(layer) * buffer_rows_ + (pos - fp_base_)) * kv_dim();
}

float* KvCache::v_row(int layer, int pos) const {
  return v_buf_.get() + (static_cast<int64_t>(layer) * buffer_rows_ + (pos - fp_base_)) * kv_dim();
}

Status KvCache::check_write(int pos, int m) const {
  QS_CHECK(m >= 0);
  QS_CHECK_MSG(pos >= n_ && pos <= fp_end_, "KV cache: write at " + str(pos) +
                                                " outside [n, written_end] = [" + str(n_) + ", " +
                                                str(fp_end_) + "]");
  if (static_cast<int64_t>(pos) + m > cfg_.capacity) {
    return make_error("context is full: " + str(static_cast<int64_t>(pos) + m) +
                      " positions needed but the KV cache holds " + str(cfg_.capacity));
  }
  return Status::ok_status();
}

void KvCache::write(int layer, int pos, int m, const float* k, const float* v) {
  QS_CHECK(layer >= 0 && layer < cfg_.num_layers);
  QS_CHECK(pos >= std::max(n_, fp_base_) && pos <= fp_end_ && pos + m <= cfg_.capacity);
  if (pos + m - fp_base_ > buffer_rows_) {
    // Grows geometrically (prefill, evaluation windows); commit() shrinks it back.
    reserve_rows(std::min(std::max(pos + m - fp_base_, 2 * buffer_rows_), cfg_.capacity));
  }
  const size_t bytes = static_cast<size_t>(m) * kv_dim() * sizeof(float);
  std::memcpy(k_row(layer, pos), k, bytes);
  std::memcpy(v_row(layer, pos), v, bytes);
  fp_end_ = pos + m;
}

void KvCache::quantize_below(int layer, int end) {
  QS_CHECK(planes_.has_value());
  const int G = cfg_.group_size;
  QS_CHECK(end % G == 0 && end <= fp_end_);
  for (int start = layer_quantized_[layer]; start < end; start += G) {
    QS_CHECK_MSG(start >= fp_base_, "KV cache: group rows already left the buffer");
    planes_->append_group(layer, k_row(layer, start), v_row(layer, start), start / G, kv_dim());
  }
  layer_quantized_[layer] = std::max(layer_quantized_[layer], end);
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
    for (int l = 0; l < cfg_.num_layers; ++l) quantize_below(l, complete);
    n_planes_ = complete;
  }
  const int base = quant_boundary(n, G);
  if (base > fp_base_) {
    const size_t keep = static_cast<size_t>(fp_end_ - base) * kv_dim();
    for (int l = 0; l < cfg_.num_layers; ++l) {
      const int64_t off = static_cast<int64_t>(l) * buffer_rows_ * kv_dim();
      std::memmove(k_buf_.get() + off, k_row(l, base), keep * sizeof(float));
      std::memmove(v_buf_.get() + off, v_row(l, base), keep * sizeof(float));
    }
    fp_base_ = base;
  }
  const int steady = 2 * G + cfg_.max_gamma + 1;
  if (buffer_rows_ > 2 * steady && fp_end_ - fp_base_ <= steady) {
    // Give back what a long prefill grew.
    std::unique_ptr<float[]> k = std::move(k_buf_), v = std::move(v_buf_);
    const int old_rows = buffer_rows_;
    k_buf_.reset(new float[static_cast<size_t>(steady) * kv_dim() * cfg_.num_layers]);
    v_buf_.reset(new float[static_cast<size_t>(steady) * kv_dim() * cfg_.num_layers]);
    buffer_rows_ = steady;
    const size_t used = static_cast<size_t>(fp_end_ - fp_base_) * kv_dim();
    for (int l = 0; l < cfg_.num_layers; ++l) {
      std::memcpy(k_buf_.get() + l * static_cast<size_t>(steady) * kv_dim(),
                  k.get() + l * static_cast<size_t>(old_rows) * kv_dim(), used * sizeof(float));
      std::memcpy(v_buf_.get() + l * static_cast<size_t>(steady) * kv_dim(),
                  v.get() + l * static_cast<size_t>(old_rows) * kv_dim(), used * sizeof(float));
    }
  }
}

void KvCache::clear() {
  n_ = n_planes_ = fp_base_ = fp_end_ = flushes_ = 0;
  for (int l = 0; l < cfg_.num_layers; ++l) layer_quantized_[l] = 0;
}

KvView KvCache::view(int layer, std::optional<KvQuantView> quant_view,
                     QuantizedKvSegment* segment) const {
  QS_CHECK(layer >= 0 && layer < cfg_.num_layers);
  KvView v{k_row(layer, fp_base_), v_row(layer, fp_base_), kv_dim(), fp_end_};
  v.fp_base = fp_base_;
  if (!quantized() || !quant_view) return v;
  QS_CHECK(segment != nullptr);
  const KvPlanesShape& s = planes_->shape();
  const int64_t codes = s.code_offset(layer, 0, 0);
  const int64_t kmeta = s.key_meta_offset(layer, 0, 0);
  const int64_t vmeta = s.value_meta_offset(layer, 0, 0);
  const QuantizedPlanes& p = *planes_;
  const bool int8 = *quant_view == KvQuantView::kTargetInt8;
  segment->key_upper = p.code_plane(KvCodePlane::kKeyUpper).data() + codes;
  segment->value_upper = p.code_plane(KvCodePlane::kValueUpper).data() + codes;
  segment->key_lower = int8 ? p.code_plane(KvCodePlane::kKeyLower).data() + codes : nullptr;
  segment->value_lower = int8 ? p.code_plane(KvCodePlane::kValueLower).data() + codes : nullptr;
  segment->key_scale = p.meta(KvMetaArray::kKeyScale).data() + kmeta;
  segment->key_min = p.meta(KvMetaArray::kKeyMin).data() + kmeta;
  segment->value_scale = p.meta(KvMetaArray::kValueScale).data() + vmeta;
  segment->value_min = p.meta(KvMetaArray::kValueMin).data() + vmeta;
  segment->capacity = s.capacity;
  segment->group_size = s.group_size;
  segment->value_group_size = s.value_group_size;
  segment->int8 = int8;
  v.quantized = segment;
  return v;
}

}  // namespace qs
