#include "kv/fp_cache.h"

#include <cstring>
#include <string>

namespace qs {

FpKvCache::FpKvCache(int num_layers, int capacity, int kv_dim)
    : num_layers_(num_layers), capacity_(capacity), kv_dim_(kv_dim) {
  QS_CHECK(num_layers > 0 && capacity > 0 && kv_dim > 0);
  const size_t n = static_cast<size_t>(num_layers) * capacity * kv_dim;
  k_.reset(new float[n]);  // uninitialized: pages stay untouched until written
  v_.reset(new float[n]);
}

size_t FpKvCache::bytes() const {
  return 2 * static_cast<size_t>(num_layers_) * capacity_ * kv_dim_ * sizeof(float);
}

int64_t FpKvCache::layer_offset(int layer) const {
  QS_CHECK(layer >= 0 && layer < num_layers_);
  return static_cast<int64_t>(layer) * capacity_ * kv_dim_;
}

Status FpKvCache::check_write(int pos, int m) const {
  QS_CHECK(pos >= 0 && m >= 0);
  QS_CHECK_MSG(pos <= length_, "KV cache: write at position " + std::to_string(pos) +
                                   " would leave a gap after length " + std::to_string(length_));
  if (static_cast<int64_t>(pos) + m > capacity_) {
    return make_error("context is full: " + std::to_string(static_cast<int64_t>(pos) + m) +
                      " positions needed but the KV cache holds " + std::to_string(capacity_));
  }
  return Status::ok_status();
}

void FpKvCache::write(int layer, int pos, int m, const float* k, const float* v) {
  QS_CHECK(pos >= 0 && m >= 0 && pos <= length_ && pos + m <= capacity_);
  const size_t bytes = static_cast<size_t>(m) * kv_dim_ * sizeof(float);
  const int64_t row = static_cast<int64_t>(pos) * kv_dim_;
  std::memcpy(this->k(layer) + row, k, bytes);
  std::memcpy(this->v(layer) + row, v, bytes);
}

void FpKvCache::set_length(int n) {
  QS_CHECK(n >= 0 && n <= capacity_);
  length_ = n;
}

void FpKvCache::truncate(int n) {
  QS_CHECK(n >= 0 && n <= length_);
  length_ = n;
}

}  // namespace qs
