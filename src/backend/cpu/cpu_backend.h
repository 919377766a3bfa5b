// The CPU backend: threaded, vectorized (AVX2/FMA/F16C when compiled for them, plain loops
// otherwise) reference implementation of every op in backend.h.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "core/thread_pool.h"

namespace qs {

class CpuBackend : public Backend {
 public:
  // `num_threads`: 0 = all hardware threads. Sets OpenBLAS to one thread: sgemm runs on this
  // backend's own workers, one weight panel each, so the two thread pools never compete.
  explicit CpuBackend(int num_threads = 0);

  const char* name() const override { return "cpu"; }
  int num_threads() const { return pool_.num_threads(); }
  ThreadPool& pool() { return pool_; }

  std::unique_ptr<Buffer> alloc(size_t n) override;
  int64_t memory_available() const override;  // MemAvailable of /proc/meminfo (-1 elsewhere)
  void to_host(const float* src, float* dst_host, size_t n) override;
  void embedding(const WeightView& table, const int32_t* ids, int m, float* out) override;
  void rmsnorm(const float* x, const WeightView& weight, int m, float eps, float* out) override;
  void matmul(const float* x, int m, const WeightView& w, const WeightView* bias,
              float* y) override;
  void rope(float* x, int m, int num_heads, int head_dim, int pos, const float* inv_freq) override;
  void attention(const float* q, int m, int pos, const AttentionShape& shape, const KvView& kv,
                 float* out) override;
  void matmul_q4(const float* x, int m, const QuantizedWeight4& w, const WeightView* bias,
                 float* y) override;
  using Backend::quantize_kv;  // the f32 overload
  void quantize_kv(const void* k_rows, const void* v_rows, DType row_dtype, int64_t row_stride,
                   int num_kv_heads, int head_dim, int64_t first_group, int n_groups,
                   const QuantizedKvPlanesOut& dst) override;
  // snapkv_scores_reference (kv/sparse_select.h) with the kv heads spread over the pool.
  void snapkv_scores(const float* q, int window, const void* k_rows, DType row_dtype,
                     int64_t row_stride, const AttentionShape& shape, int prompt_len, int past,
                     float* scores) override;
  void swiglu(const float* gate, const float* up, int64_t n, float* out) override;
  void add(float* y, const float* x, int64_t n) override;

  // Above this many rows matmul converts weight panels to f32 and calls cblas_sgemm; at or
  // below it runs the bandwidth-bound GEMV kernel that reads the weight in its own dtype.
  static constexpr int kGemvMaxRows = 8;

  // The two matmul paths, callable directly so tests can check both at any m.
  void matmul_gemv(const float* x, int m, const WeightView& w, float* y);
  void matmul_sgemm(const float* x, int m, const WeightView& w, float* y);

 private:
  ThreadPool pool_;
};

}  // namespace qs
