// Full-precision KV cache of one sequence: per layer, K and V rows at absolute positions
// [0, capacity), of which [0, length) are valid. Rollback is a length change.
#pragma once

#include <cstdint>
#include <memory>

#include "core/error.h"

namespace qs {

class FpKvCache {
 public:
  FpKvCache() = default;
  // Memory is reserved but not touched until written (large caches cost only what is used).
  FpKvCache(int num_layers, int capacity, int kv_dim);

  int num_layers() const { return num_layers_; }
  int capacity() const { return capacity_; }  // positions
  int kv_dim() const { return kv_dim_; }      // floats per position per layer (K or V)
  int length() const { return length_; }      // valid positions [0, length)
  size_t bytes() const;                       // K and V storage of all layers

  // May positions [pos, pos + m) be written? The end must fit the capacity, else Error
  // "context is full: N positions needed but the KV cache holds M". pos > length (a gap) is a
  // bug and aborts.
  Status check_write(int pos, int m) const;

  // Copy m rows of K and V (each [m, kv_dim] f32) to positions [pos, pos + m) of `layer`.
  // check_write must have passed. Does not change length() (all layers are written first).
  void write(int layer, int pos, int m, const float* k, const float* v);

  // After every layer holds [0, n): make it the valid length. n <= capacity.
  void set_length(int n);
  // Drop positions [n, length) (rollback). n <= length.
  void truncate(int n);
  void clear() { length_ = 0; }

  // [capacity, kv_dim] f32 of one layer; row t = position t.
  const float* k(int layer) const { return k_.get() + layer_offset(layer); }
  const float* v(int layer) const { return v_.get() + layer_offset(layer); }
  float* k(int layer) { return k_.get() + layer_offset(layer); }
  float* v(int layer) { return v_.get() + layer_offset(layer); }

 private:
  int64_t layer_offset(int layer) const;

  int num_layers_ = 0;
  int capacity_ = 0;
  int kv_dim_ = 0;
  int length_ = 0;
  std::unique_ptr<float[]> k_;  // [num_layers, capacity, kv_dim] f32, post-RoPE keys
  std::unique_ptr<float[]> v_;  // [num_layers, capacity, kv_dim] f32
};

}  // namespace qs
