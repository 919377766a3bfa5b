#include <cublas_v2.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/cuda/attention_decode_tc.h"
#include "backend/cuda/attention_prefill_tc.h"
#include "backend/cuda/attention_quant.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/env_switch.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/quant_ops.h"

namespace qs {

namespace cuda {

void check_launch(const char* file, int line, cudaStream_t stream) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) cuda_failed(file, line, "kernel launch", e);
  static const bool sync_each = env_flag("QS_CUDA_SYNC", false);
  if (!sync_each) return;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) return;
  e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess) cuda_failed(file, line, "kernel execution (QS_CUDA_SYNC)", e);
}

namespace {
bool g_pdl = env_flag("QS_CUDA_PDL", true);
}  // namespace

bool pdl_enabled() {
  return g_pdl;
}

#ifdef QS_KERNEL_TRACE
namespace {
std::vector<void (*)(unsigned long long*)>& trace_setters() {
  static std::vector<void (*)(unsigned long long*)> setters;
  return setters;
}
}  // namespace

void register_trace_setter(void (*set)(unsigned long long* buffer)) {
  trace_setters().push_back(set);
}

// A zeroed trace buffer for every translation unit's kernels.
unsigned long long* start_kernel_trace() {
  const size_t bytes = (kTraceHeader + 4 * kTraceRecords) * sizeof(unsigned long long);
  unsigned long long* buffer = nullptr;
  CUDA_CHECK(cudaMalloc(&buffer, bytes));
  CUDA_CHECK(cudaMemset(buffer, 0, bytes));
  for (auto* set : trace_setters()) set(buffer);
  return buffer;
}

// The records as "qs-trace <entry> <release> <blocks> <threads>" lines into $QS_KERNEL_TRACE_FILE
// (default qs-kernel-trace.txt), then the buffer freed.
void finish_kernel_trace(unsigned long long* buffer) {
  unsigned long long taken = 0;
  CUDA_CHECK(cudaMemcpy(&taken, buffer, sizeof(taken), cudaMemcpyDeviceToHost));
  const size_t n = static_cast<size_t>(std::min<unsigned long long>(taken, kTraceRecords));
  std::vector<unsigned long long> records(4 * n);
  CUDA_CHECK(cudaMemcpy(records.data(), buffer + kTraceHeader, records.size() * sizeof(records[0]),
                        cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaFree(buffer));
  const char* path = std::getenv("QS_KERNEL_TRACE_FILE");
  if (path == nullptr) path = "qs-kernel-trace.txt";
  std::FILE* f = std::fopen(path, "w");
  if (f == nullptr) {
    std::fprintf(stderr, "quantspec: cannot write the kernel trace to %s\n", path);
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    std::fprintf(f, "qs-trace %llu %llu %llu %llu\n", records[4 * i], records[4 * i + 1],
                 records[4 * i + 2], records[4 * i + 3]);
  }
  std::fclose(f);
  std::fprintf(stderr, "quantspec: %zu kernel trace records (of %llu) in %s\n", n, taken, path);
}
#endif

void set_pdl_enabled(bool on) {
  g_pdl = on;
}

}  // namespace cuda

namespace {

constexpr int kMinSplitLen = 256;      // positions per KV split, at least
constexpr int kTargetBlocksPerSm = 4;  // attention blocks wanted per SM before splitting stops
constexpr int kMaxSplits = 256;
// Cap on the split partials' size (floats), so splitting never needs a huge scratch buffer.
constexpr int64_t kMaxPartialFloats = int64_t{64} << 20;
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

// n elements of T in device memory (cudaMalloc), freed with the object.
template <typename T>
class DeviceArray final : public BackendArray<T> {
 public:
  explicit DeviceArray(size_t n) {
    if (n > 0) CUDA_CHECK(cudaMalloc(&this->data_, n * sizeof(T)));
    this->size_ = n;
  }
  // Takes ownership of n elements from cudaMalloc.
  DeviceArray(T* adopted, size_t n) {
    this->data_ = adopted;
    this->size_ = n;
  }
  ~DeviceArray() override {
    if (this->data_) cudaFree(this->data_);  // no check: may run during teardown
  }
};
using DeviceBuffer = DeviceArray<float>;

// One event per slot, recorded on the stream (timing on: cudaEventElapsedTime).
class EventTimeMarks final : public TimeMarks {
 public:
  EventTimeMarks(int slots, cudaStream_t stream)
      : events_(static_cast<size_t>(slots)), stream_(stream) {
    for (cudaEvent_t& e : events_) CUDA_CHECK(cudaEventCreate(&e));
  }
  ~EventTimeMarks() override {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);  // no check: may run during teardown
  }
  void record(int slot) override { CUDA_CHECK(cudaEventRecord(events_.at(slot), stream_)); }
  double seconds(int from, int to) override {
    CUDA_CHECK(cudaEventSynchronize(events_.at(to)));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, events_.at(from), events_.at(to)));
    return 1e-3 * ms;
  }

 private:
  std::vector<cudaEvent_t> events_;
  cudaStream_t stream_;
};

// Grow-only device scratch memory.
struct Scratch {
  void* ptr = nullptr;
  size_t bytes = 0;

  void* ensure(size_t need) {
    if (need <= bytes) return ptr;
    if (ptr) {
      // Work still queued may read the old buffer.
      CUDA_CHECK(cudaDeviceSynchronize());
      CUDA_CHECK(cudaFree(ptr));
    }
    const size_t rounded = (need + (size_t{1} << 20) - 1) & ~((size_t{1} << 20) - 1);
    CUDA_CHECK(cudaMalloc(&ptr, rounded));
    bytes = rounded;
    return ptr;
  }
  void release() {
    if (ptr) cudaFree(ptr);
    ptr = nullptr;
    bytes = 0;
  }
};

size_t weight_bytes(const WeightView& w) {
  return static_cast<size_t>(w.numel()) * dtype_size(w.dtype);
}

}  // namespace

int attention_num_splits(int64_t kv_len, int64_t base_blocks, int num_sms, int max_splits) {
  QS_CHECK(kv_len >= 1 && base_blocks >= 1 && num_sms >= 1 && max_splits >= 1);
  const int64_t target = static_cast<int64_t>(num_sms) * kTargetBlocksPerSm;
  if (base_blocks >= target) return 1;
  int64_t splits = (target + base_blocks - 1) / base_blocks;
  splits = std::min<int64_t>(splits, (kv_len + kMinSplitLen - 1) / kMinSplitLen);
  splits = std::min<int64_t>(splits, max_splits);
  return static_cast<int>(std::max<int64_t>(splits, 1));
}

int attention_num_splits_one_wave(int64_t kv_len, int64_t base_blocks, int64_t slots,
                                  int max_splits) {
  QS_CHECK(kv_len >= 1 && base_blocks >= 1 && slots >= 1 && max_splits >= 1);
  int64_t splits = std::max<int64_t>(slots / base_blocks, 1);
  splits = std::min<int64_t>(splits, (kv_len + kMinSplitLen - 1) / kMinSplitLen);
  splits = std::min<int64_t>(splits, max_splits);
  return static_cast<int>(std::max<int64_t>(splits, 1));
}

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return 0;
  }
  return count;
}

bool cuda_device_available() {
  return cuda_device_count() > 0;
}

struct CudaBackend::Impl {
  CudaBackendOptions options;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  void* cublas_workspace = nullptr;
  int num_sms = 0;

  struct DeviceWeight {
    const void* ptr = nullptr;  // device copy (or the view's own pointer when already device)
    size_t bytes = 0;
    DType dtype = DType::F32;
    bool owned = false;
  };
  std::unordered_map<const void*, DeviceWeight> weights;  // by the view's data pointer
  size_t resident_bytes = 0;
  cuda::Weight4Cache weights4;  // 4-bit draft weights, by their host codes (gemv_q4.cu)

  Scratch attn_partial;  // attention split partials: o then (m, l)
  Scratch act_split;     // prefill matmul: activations split into hi/lo halves
  Scratch attn_tc;       // tensor-core prefill attention: K/V hi/lo planes
  Scratch ids;           // token ids of large embedding calls
  Scratch argmax;        // argmax_rows' results
  Scratch sample_probs;  // sample_rows without a probs buffer; speculative_verdict's p rows
  Scratch sample_out;    // sampled tokens / the verdict
  Scratch snapkv;        // snapkv_scores' softmax partials
  Scratch hybrid_kv;     // attention_quantized_prefill's K then V rows
  std::vector<float> argmax_rows_host;  // argmax_rows on the host: the rows copied back
  unsigned* norm_arrivals = nullptr;    // the fused GEMV + norm's block counter (cuda::GemvNorm)
  // A deferred norm's partial sums (num_sms): one buffer serves every norm, since a producer writes
  // it only after its PDL wait, when the previous norm's consumer (the launch before it) is done.
  double* norm_sumsq = nullptr;

#ifdef QS_KERNEL_TRACE
  unsigned long long* trace = nullptr;
#endif

  ~Impl() {
    if (stream) cudaStreamSynchronize(stream);
#ifdef QS_KERNEL_TRACE
    if (trace) cuda::finish_kernel_trace(trace);
#endif
    for (auto& [key, w] : weights) {
      if (w.owned) cudaFree(const_cast<void*>(w.ptr));
    }
    attn_partial.release();
    act_split.release();
    attn_tc.release();
    ids.release();
    argmax.release();
    snapkv.release();
    hybrid_kv.release();
    if (cublas_workspace) cudaFree(cublas_workspace);
    if (norm_arrivals) cudaFree(norm_arrivals);
    if (norm_sumsq) cudaFree(norm_sumsq);
    if (cublas) cublasDestroy(cublas);
    if (stream) cudaStreamDestroy(stream);
  }

  // The device copy of a weight: uploaded on first use, found by its data pointer afterwards.
  // A view that already points to device memory is used as it is.
  const void* resolve(const WeightView& w) {
    if (w.empty()) return nullptr;
    const size_t bytes = weight_bytes(w);
    auto it = weights.find(w.data);
    if (it != weights.end()) {
      if (!it->second.owned) {  // device memory: used in place, whatever its size
        it->second.bytes = std::max(it->second.bytes, bytes);
        return it->second.ptr;
      }
      if (it->second.bytes == bytes && it->second.dtype == w.dtype) return it->second.ptr;
      // Another tensor at an address seen before: the old host memory was freed and reused.
      // (A same-sized tensor cannot be told apart: hence release_weights().)
      CUDA_CHECK(cudaStreamSynchronize(stream));
      CUDA_CHECK(cudaFree(const_cast<void*>(it->second.ptr)));
      resident_bytes -= it->second.bytes;
      weights.erase(it);
    }
    cudaPointerAttributes attr{};
    const cudaError_t e = cudaPointerGetAttributes(&attr, w.data);
    if (e == cudaSuccess &&
        (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged)) {
      weights.emplace(w.data, DeviceWeight{w.data, bytes, w.dtype, false});
      return w.data;
    }
    if (e != cudaSuccess) cudaGetLastError();
    void* dev = nullptr;
    CUDA_CHECK(cudaMalloc(&dev, bytes));
    // On the backend's stream, so every later op is ordered after it. (A plain cudaMemcpy from
    // pageable memory may return before the data has landed, and the non-blocking stream would
    // not wait for it: seen as wrong results on the device.) From pageable memory the call
    // returns once the source is staged, so the host tensor may go at once.
    CUDA_CHECK(cudaMemcpyAsync(dev, w.data, bytes, cudaMemcpyHostToDevice, stream));
    weights.emplace(w.data, DeviceWeight{dev, bytes, w.dtype, true});
    resident_bytes += bytes;
    return dev;
  }

  cuda::DeviceMatrix matrix(const WeightView& w) {
    return cuda::DeviceMatrix{resolve(w), w.dtype, w.rows, w.cols};
  }

  cuda::DeviceBias bias(const WeightView* b) {
    if (b == nullptr || b->empty()) return {};
    return cuda::DeviceBias{resolve(*b), b->dtype};
  }

  // Fills the split fields of `a` and points the partials at scratch memory. one_wave_per_sm > 0:
  // the kernel keeps that many blocks resident per SM and the splits fill one wave of them.
  void plan_splits(cuda::AttentionArgs& a, int64_t base_blocks, int forced_splits,
                   int one_wave_per_sm = 0) {
    const int64_t kv_len = a.seq_len();
    const int64_t per_split = static_cast<int64_t>(a.m) * a.num_heads * (a.head_dim + 2);
    const int max_splits =
        static_cast<int>(std::clamp<int64_t>(kMaxPartialFloats / per_split, 1, kMaxSplits));
    int splits =
        forced_splits > 0 ? forced_splits
        : one_wave_per_sm > 0
            ? attention_num_splits_one_wave(
                  kv_len, base_blocks, static_cast<int64_t>(num_sms) * one_wave_per_sm, max_splits)
            : attention_num_splits(kv_len, base_blocks, num_sms, max_splits);
    splits = static_cast<int>(std::min<int64_t>(splits, kv_len));
    const int64_t split_len = (kv_len + splits - 1) / splits;
    splits = static_cast<int>((kv_len + split_len - 1) / split_len);  // no empty trailing split
    a.num_splits = splits;
    a.split_len = static_cast<int>(split_len);
    if (splits > 1) {
      const int64_t num_qv = static_cast<int64_t>(a.m) * a.num_heads;
      float* base = static_cast<float*>(attn_partial.ensure(
          sizeof(float) * static_cast<size_t>(splits * num_qv) * (a.head_dim + 2)));
      a.partial_o = base;
      a.partial_ml = base + splits * num_qv * a.head_dim;
    }
  }
};

CudaBackend::CudaBackend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaBackend::~CudaBackend() = default;

const CudaBackendOptions& CudaBackend::options() const {
  return impl_->options;
}

Result<std::unique_ptr<CudaBackend>> CudaBackend::create(const CudaBackendOptions& options) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    cudaGetLastError();
    return make_error(std::string("CUDA backend: no usable CUDA device (") +
                      (e != cudaSuccess ? cudaGetErrorString(e) : "device count is 0") + ")");
  }
  if (options.device < 0 || options.device >= count) {
    return make_error("CUDA backend: device " + std::to_string(options.device) +
                      " does not exist (" + std::to_string(count) + " present)");
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  CUDA_CHECK(cudaSetDevice(options.device));
#ifdef QS_KERNEL_TRACE
  impl->trace = cuda::start_kernel_trace();
#endif
  CUDA_CHECK(
      cudaDeviceGetAttribute(&impl->num_sms, cudaDevAttrMultiProcessorCount, options.device));
  CUDA_CHECK(cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking));
  CUBLAS_CHECK(cublasCreate(&impl->cublas));
  CUBLAS_CHECK(cublasSetStream(impl->cublas, impl->stream));
  // Our own workspace: cuBLAS then allocates nothing per call (and stays graph-capturable).
  CUDA_CHECK(cudaMalloc(&impl->cublas_workspace, kCublasWorkspaceBytes));
  CUBLAS_CHECK(cublasSetWorkspace(impl->cublas, impl->cublas_workspace, kCublasWorkspaceBytes));
  CUBLAS_CHECK(cublasSetMathMode(impl->cublas, CUBLAS_DEFAULT_MATH));
  CUDA_CHECK(cudaMalloc(&impl->norm_arrivals, sizeof(unsigned)));
  CUDA_CHECK(cudaMemset(impl->norm_arrivals, 0, sizeof(unsigned)));
  CUDA_CHECK(cudaMalloc(&impl->norm_sumsq, sizeof(double) * static_cast<size_t>(impl->num_sms)));
  return std::unique_ptr<CudaBackend>(new CudaBackend(std::move(impl)));
}

Status CudaBackend::check_supported(const ModelConfig& cfg) {
  if (!cuda::attention_head_dim_supported(cfg.head_dim)) {
    return make_error("CUDA backend: head_dim " + std::to_string(cfg.head_dim) +
                      " is not supported (supported: 32, 64, 128, 256)");
  }
  if (cfg.head_dim / 2 > cuda::kMaxRopePairs) {
    return make_error("CUDA backend: head_dim " + std::to_string(cfg.head_dim) +
                      " too large for RoPE");
  }
  return Status::ok_status();
}

std::unique_ptr<Buffer> CudaBackend::alloc(size_t n) {
  return std::make_unique<DeviceBuffer>(n);
}

void CudaBackend::bind_thread() {
  CUDA_CHECK(cudaSetDevice(impl_->options.device));
}

void CudaBackend::profile_region(bool begin) {
  CUDA_CHECK(cudaStreamSynchronize(impl_->stream));  // the region holds exactly its own work
  CUDA_CHECK(begin ? cudaProfilerStart() : cudaProfilerStop());
}

std::string CudaBackend::description() const {
  const int device = impl_->options.device;  // this backend's, whichever device is current
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  int driver = 0;
  CUDA_CHECK(cudaDriverGetVersion(&driver));
  char text[512];
  std::snprintf(text, sizeof(text), "%.256s (sm_%d%d, %.1f GiB, %d SMs), CUDA driver %d.%d", prop.name,
                prop.major, prop.minor, prop.totalGlobalMem / double(1 << 30),
                prop.multiProcessorCount, driver / 1000, (driver % 1000) / 10);
  return text;
}

int64_t CudaBackend::memory_in_use() const {
  // Of this backend's device (tensor parallelism: the caller may have another one current).
  int current = 0;
  CUDA_CHECK(cudaGetDevice(&current));
  if (current != impl_->options.device) CUDA_CHECK(cudaSetDevice(impl_->options.device));
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (current != impl_->options.device) CUDA_CHECK(cudaSetDevice(current));
  return static_cast<int64_t>(total_bytes - free_bytes);
}

std::unique_ptr<Buffer> CudaBackend::try_alloc(size_t n) {
  void* ptr = nullptr;
  if (n > 0) {
    const cudaError_t err = cudaMalloc(&ptr, n * sizeof(float));
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // not sticky: clear it so later checks do not see it
      return nullptr;
    }
    CUDA_CHECK(err);
  }
  return std::make_unique<DeviceBuffer>(static_cast<float*>(ptr), n);
}

void CudaBackend::to_host(const float* src, float* dst_host, size_t n) {
  if (n == 0) return;
  CUDA_CHECK(
      cudaMemcpyAsync(dst_host, src, n * sizeof(float), cudaMemcpyDeviceToHost, impl_->stream));
  CUDA_CHECK(cudaStreamSynchronize(impl_->stream));
}

namespace {
// Backend::argmax_rows on the GPU (cuda::launch_argmax_rows), only the ids copied back;
// QS_CUDA_ARGMAX=0: the rows copied back and argmax'ed on the host.
bool gpu_argmax() {
  static const bool on = cuda::env_flag("QS_CUDA_ARGMAX", true);
  return on;
}
}  // namespace

void CudaBackend::argmax_rows(const float* x, int rows, int n, int32_t* out_host) {
  QS_CHECK(rows >= 1 && n >= 1);
  const size_t count = static_cast<size_t>(rows) * n;
  if (gpu_argmax()) {
    auto* dev = static_cast<int32_t*>(impl_->argmax.ensure(sizeof(int32_t) * rows));
    argmax_rows_into(x, rows, n, dev);
    ids_to_host(dev, out_host, static_cast<size_t>(rows));
    return;
  }
  std::vector<float>& host = impl_->argmax_rows_host;
  if (host.size() < count) host.resize(count);
  to_host(x, host.data(), count);
  Backend::argmax_rows(host.data(), rows, n, out_host);  // host rows: the reference argmax
}

std::unique_ptr<IdBuffer> CudaBackend::alloc_ids(size_t n) {
  return std::make_unique<DeviceArray<int32_t>>(n);
}

void CudaBackend::ids_from_host(const int32_t* src_host, int32_t* dst, size_t n) {
  if (n == 0) return;
  // From pageable memory: staged before the call returns, as from_host.
  CUDA_CHECK(
      cudaMemcpyAsync(dst, src_host, n * sizeof(int32_t), cudaMemcpyHostToDevice, impl_->stream));
}

void CudaBackend::ids_to_host(const int32_t* src, int32_t* dst_host, size_t n) {
  if (n == 0) return;
  CUDA_CHECK(
      cudaMemcpyAsync(dst_host, src, n * sizeof(int32_t), cudaMemcpyDeviceToHost, impl_->stream));
  CUDA_CHECK(cudaStreamSynchronize(impl_->stream));
}

void CudaBackend::embedding_of_ids(const WeightView& table, const int32_t* ids, int m, float* out) {
  QS_CHECK(m >= 1);
  cuda::launch_embedding(impl_->matrix(table), ids, cuda::InlineIds{}, m, out, impl_->stream);
}

void CudaBackend::argmax_rows_into(const float* x, int rows, int n, int32_t* out) {
  QS_CHECK(rows >= 1 && n >= 1);
  cuda::launch_argmax_rows(x, rows, n, out, impl_->stream);
}

std::unique_ptr<TimeMarks> CudaBackend::make_time_marks(int slots) {
  return std::make_unique<EventTimeMarks>(slots, impl_->stream);
}

namespace {
cuda::SampleSpec sample_spec(const SamplingParams& p) {
  return {p.temperature, p.top_p, p.min_p, p.top_k};
}
// Sampling on the GPU (sampling.cu); QS_CUDA_SAMPLE=0: the logits copied back and sampled on the
// host by the reference (the A/B of the end-to-end bench).
bool gpu_sampling() {
  static const bool on = cuda::env_flag("QS_CUDA_SAMPLE", true);
  return on;
}
}  // namespace

void CudaBackend::sample_rows(const float* logits, int rows, int n, const SamplingParams& params,
                              const double* u_host, float* probs, int32_t* out_host) {
  auto* dev = static_cast<int32_t*>(impl_->sample_out.ensure(sizeof(int32_t) * rows));
  sample_rows_into(logits, rows, n, params, u_host, probs, dev);
  ids_to_host(dev, out_host, static_cast<size_t>(rows));
}

void CudaBackend::sample_rows_into(const float* logits, int rows, int n,
                                   const SamplingParams& params, const double* u_host, float* probs,
                                   int32_t* out) {
  QS_CHECK(rows >= 1 && n >= 1);
  if (!gpu_sampling()) {
    const size_t count = static_cast<size_t>(rows) * n;
    std::vector<float> host(count), host_probs(probs != nullptr ? count : 0);
    std::vector<int32_t> tokens(static_cast<size_t>(rows));
    to_host(logits, host.data(), count);
    Backend::sample_rows(host.data(), rows, n, params, u_host,
                         probs != nullptr ? host_probs.data() : nullptr, tokens.data());
    if (probs != nullptr) from_host(host_probs.data(), probs, count);
    ids_from_host(tokens.data(), out, tokens.size());
    return;
  }
  for (int r0 = 0; r0 < rows; r0 += cuda::kMaxSampleRows) {
    const int count = std::min(rows - r0, cuda::kMaxSampleRows);
    cuda::SampleDraws draws{};
    for (int r = 0; r < count; ++r) draws.u[r] = u_host[r0 + r];
    const size_t off = static_cast<size_t>(r0) * n;
    float* dst = probs != nullptr ? probs + off
                                  : static_cast<float*>(impl_->sample_probs.ensure(
                                        sizeof(float) * static_cast<size_t>(count) * n));
    cuda::launch_sample_rows(logits + off, count, n, sample_spec(params), draws, dst, out + r0,
                             impl_->stream);
  }
}

SpecVerdict CudaBackend::speculative_verdict(const float* target_logits, float* draft_probs,
                                             int gamma, int n, const SamplingParams& params,
                                             const int32_t* candidates_host, const double* u_host,
                                             bool residual) {
  QS_CHECK(gamma >= 0);
  // [gamma] candidates, then the verdict's [2].
  auto* dev = static_cast<int32_t*>(impl_->sample_out.ensure(sizeof(int32_t) * (gamma + 2)));
  ids_from_host(candidates_host, dev, static_cast<size_t>(gamma));
  speculative_verdict_into(target_logits, draft_probs, gamma, n, params, dev, u_host, residual,
                           dev + gamma);
  int32_t out[2];
  ids_to_host(dev + gamma, out, 2);
  return SpecVerdict{out[0], out[1]};
}

void CudaBackend::speculative_verdict_into(const float* target_logits, float* draft_probs,
                                           int gamma, int n, const SamplingParams& params,
                                           const int32_t* candidates, const double* u_host,
                                           bool residual, int32_t* out) {
  QS_CHECK(gamma >= 0 && gamma < cuda::kMaxSampleRows);  // gamma <= G - 1 <= 255
  if (!gpu_sampling()) {
    const size_t pn = static_cast<size_t>(gamma + 1) * n, qn = static_cast<size_t>(gamma) * n;
    std::vector<float> p(pn), q(qn);
    std::vector<int32_t> cand(static_cast<size_t>(gamma));
    to_host(target_logits, p.data(), pn);
    if (qn > 0) to_host(draft_probs, q.data(), qn);
    ids_to_host(candidates, cand.data(), cand.size());
    const SpecVerdict v = Backend::speculative_verdict(p.data(), q.data(), gamma, n, params,
                                                       cand.data(), u_host, residual);
    if (qn > 0) from_host(q.data(), draft_probs, qn);
    const int32_t verdict[2] = {v.accepted, v.token};
    ids_from_host(verdict, out, 2);
    return;
  }
  cuda::SampleDraws draws{};
  for (int i = 0; i <= gamma; ++i) draws.u[i] = u_host[i];
  auto* p = static_cast<float*>(
      impl_->sample_probs.ensure(sizeof(float) * static_cast<size_t>(gamma + 1) * n));
  cuda::launch_sample_rows(target_logits, gamma + 1, n, sample_spec(params), draws, p, nullptr,
                           impl_->stream);
  cuda::launch_speculative_verdict(p, draft_probs, gamma, n, candidates, draws, residual, out,
                                   impl_->stream);
}

void CudaBackend::from_host(const float* src_host, float* dst, size_t n) {
  if (n == 0) return;
  // From pageable memory the call returns once the source has been staged, so the caller may
  // reuse it at once; the copy itself is ordered on the stream.
  CUDA_CHECK(
      cudaMemcpyAsync(dst, src_host, n * sizeof(float), cudaMemcpyHostToDevice, impl_->stream));
}

void CudaBackend::copy(float* dst, const float* src, size_t n) {
  if (n == 0 || dst == src) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, impl_->stream));
}

void CudaBackend::copy_bytes(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, impl_->stream));
}

// A commit's flush as one quantize launch for every layer and the kept rows' move as one strided
// copy per chunk (Backend::quantize_kv_layers / copy_bytes_strided; on since session 34: ~0.6 ms
// less per flush on Llama-2-7B, docs/perf.md). QS_FLUSH_LAYERS=0: one launch and two copies per
// layer, as before (A/B runs).
const bool g_flush_layers = cuda::env_flag("QS_FLUSH_LAYERS", true);

void CudaBackend::copy_bytes_strided(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                                     size_t bytes, int count) {
  if (!g_flush_layers || count < 2 || dst_pitch < bytes || src_pitch < bytes) {
    Backend::copy_bytes_strided(dst, dst_pitch, src, src_pitch, bytes, count);
    return;
  }
  if (bytes == 0 || dst == src) return;
  CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, bytes, static_cast<size_t>(count),
                               cudaMemcpyDeviceToDevice, impl_->stream));
}

void CudaBackend::store_kv_rows(void* dst, DType dst_dtype, const float* src, size_t n) {
  QS_CHECK_MSG(kv_row_dtype_supported(dst_dtype), "store_kv_rows: rows are F32 or F16");
  if (dst_dtype == DType::F32) {
    copy(static_cast<float*>(dst), src, n);
    return;
  }
  cuda::launch_store_f16(src, static_cast<int64_t>(n), dst, impl_->stream);
}

void CudaBackend::store_kv_row_pair(void* k_dst, void* v_dst, DType dst_dtype, const float* k,
                                    const float* v, size_t n) {
  QS_CHECK_MSG(kv_row_dtype_supported(dst_dtype), "store_kv_row_pair: rows are F32 or F16");
  if (dst_dtype == DType::F32) {
    copy(static_cast<float*>(k_dst), k, n);
    copy(static_cast<float*>(v_dst), v, n);
    return;
  }
  cuda::launch_store_f16_pair(k, v, static_cast<int64_t>(n), k_dst, v_dst, impl_->stream);
}

void CudaBackend::prepare_weights(const ModelWeights& weights) {
  impl_->resolve(weights.tok_embeddings);
  impl_->resolve(weights.final_norm);
  impl_->resolve(weights.lm_head);
  for (const LayerWeights& L : weights.layers) {
    for (const WeightView* w : {&L.attn_norm, &L.wq, &L.wk, &L.wv, &L.wo, &L.bq, &L.bk, &L.bv,
                                &L.bo, &L.mlp_norm, &L.w_gate, &L.w_up, &L.w_down}) {
      impl_->resolve(*w);
    }
  }
}

void CudaBackend::embedding(const WeightView& table, const int32_t* ids, int m, float* out) {
  QS_CHECK(m >= 1);
  for (int i = 0; i < m; ++i) {
    QS_CHECK_MSG(ids[i] >= 0 && ids[i] < table.rows, "token id out of range of " + table.name);
  }
  const cuda::DeviceMatrix t = impl_->matrix(table);
  cuda::InlineIds inline_ids{};
  const int32_t* ids_device = nullptr;
  if (m <= cuda::kMaxInlineIds) {
    std::memcpy(inline_ids.ids, ids, sizeof(int32_t) * m);
  } else {
    auto* dev = static_cast<int32_t*>(impl_->ids.ensure(sizeof(int32_t) * m));
    CUDA_CHECK(
        cudaMemcpyAsync(dev, ids, sizeof(int32_t) * m, cudaMemcpyHostToDevice, impl_->stream));
    ids_device = dev;
  }
  cuda::launch_embedding(t, ids_device, inline_ids, m, out, impl_->stream);
}

void CudaBackend::rmsnorm(const float* x, const WeightView& weight, int m, float eps, float* out) {
  const void* w = impl_->resolve(weight);
  cuda::launch_rmsnorm(x, w, weight.dtype, weight.numel(), m, eps, out, impl_->stream);
}

void CudaBackend::add_rmsnorm(float* h, const float* x, const WeightView& weight, int m, float eps,
                              float* out) {
  const void* w = impl_->resolve(weight);
  cuda::launch_add_rmsnorm(h, x, w, weight.dtype, weight.numel(), m, eps, out, impl_->stream);
}

void CudaBackend::matmul(const float* x, int m, const WeightView& w, const WeightView* bias,
                         float* y) {
  if (m <= kGemvMaxRows) {
    matmul_gemv(x, m, w, bias, y);
  } else {
    matmul_gemm(x, m, w, bias, y);
  }
}

void CudaBackend::matmul_gemv(const float* x, int m, const WeightView& w, const WeightView* bias,
                              float* y) {
  QS_CHECK(m >= 1);
  const cuda::DeviceMatrix wm = impl_->matrix(w);
  const cuda::DeviceBias b = impl_->bias(bias);
  for (int m0 = 0; m0 < m; m0 += kGemvMaxRows) {
    const int mc = std::min(kGemvMaxRows, m - m0);
    cuda::launch_gemv(x + static_cast<int64_t>(m0) * w.cols, mc, wm, b,
                      y + static_cast<int64_t>(m0) * w.rows, impl_->num_sms, impl_->stream);
  }
}

// Row-major y[m, N] = x[m, K] W[N, K]^T is, column-major, y^T (N x m) = W^T(op T of a K x N
// matrix) * x^T (K x m): cuBLAS with op(A) = T on W (lda K) and op(B) = N on x (ldb K).
void CudaBackend::matmul_gemm(const float* x, int m, const WeightView& w, const WeightView* bias,
                              float* y) {
  QS_CHECK(m >= 1);
  QS_CHECK(w.rows <= 0x7fffffff && w.cols <= 0x7fffffff);
  const cuda::DeviceMatrix wm = impl_->matrix(w);
  const cuda::DeviceBias b = impl_->bias(bias);
  const int n = static_cast<int>(w.rows), k = static_cast<int>(w.cols);
  const float one = 1.0f, zero = 0.0f;
  cublasHandle_t h = impl_->cublas;
  if (w.dtype == DType::F32) {
    CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, wm.data, CUDA_R_32F, k, x,
                              CUDA_R_32F, k, &zero, y, CUDA_R_32F, n, CUBLAS_COMPUTE_32F_PEDANTIC,
                              CUBLAS_GEMM_DEFAULT));
  } else {
    QS_CHECK(w.dtype == DType::BF16 || w.dtype == DType::F16);
    const cudaDataType_t type = w.dtype == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
    const bool exact = impl_->options.exact_prefill;
    const size_t count = static_cast<size_t>(m) * k;
    auto* hi = static_cast<char*>(impl_->act_split.ensure(2 * count * (exact ? 2 : 1)));
    char* lo = exact ? hi + 2 * count : nullptr;
    cuda::launch_split_activations(x, static_cast<int64_t>(count), w.dtype, hi, lo, impl_->stream);
    CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, wm.data, type, k, hi,
                              type, k, &zero, y, CUDA_R_32F, n, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
    if (exact) {
      CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, wm.data, type, k, lo,
                                type, k, &one, y, CUDA_R_32F, n, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT));
    }
  }
  cuda::launch_add_bias_rows(y, m, w.rows, b, impl_->stream);
}

namespace {
// The host's inverse frequencies as a kernel argument (head_dim / 2 of them).
cuda::RopeFreqs rope_freqs(int head_dim, const float* inv_freq) {
  QS_CHECK(head_dim % 2 == 0 && head_dim / 2 <= cuda::kMaxRopePairs);
  cuda::RopeFreqs freqs{};
  std::memcpy(freqs.inv_freq, inv_freq, sizeof(float) * (head_dim / 2));
  return freqs;
}
}  // namespace

void CudaBackend::rope(float* x, int m, int num_heads, int head_dim, int pos,
                       const float* inv_freq) {
  cuda::launch_rope(x, m, num_heads, head_dim, pos, rope_freqs(head_dim, inv_freq), impl_->stream);
}

void CudaBackend::rope_qk(float* q, float* k, int m, int num_heads, int num_kv_heads, int head_dim,
                          int pos, const float* inv_freq) {
  cuda::launch_rope_qk(q, k, m, num_heads, num_kv_heads, head_dim, pos,
                       rope_freqs(head_dim, inv_freq), impl_->stream);
}

namespace {
// A q/k/v launch's RoPE and row-store epilogue for `rows` (its dtype F16 or F32, head_dim / 2 <=
// kMaxRopePairs).
cuda::KvRowEpilogue kv_row_epilogue(const KvRowStore& rows) {
  cuda::KvRowEpilogue c;
  c.freqs = rope_freqs(rows.rope.head_dim, rows.rope.inv_freq);
  c.pos = rows.pos;
  c.head_dim = rows.rope.head_dim;
  c.k_dst = rows.k_dst;
  c.v_dst = rows.v_dst;
  c.f16 = rows.dtype == DType::F16 ? 1 : 0;
  return c;
}

// Whether a launch over next_ops (q, k, v) can rotate and store `rows` in its epilogue: q is the
// rows' query buffer, the heads match, the dtype and head size are the kernels'.
bool rows_of_qkv(const LinearOp* ops, int count, const KvRowStore& rows) {
  const RopeQK& r = rows.rope;
  return count == 3 && kv_row_dtype_supported(rows.dtype) && r.q == ops[0].y &&
         r.head_dim / 2 <= cuda::kMaxRopePairs &&
         ops[0].rows() == int64_t{r.num_heads} * r.head_dim &&
         ops[1].rows() == int64_t{r.num_kv_heads} * r.head_dim;
}

// QS_FUSE_ROPE_STORE=0: rope_qk_store_kv as the two launches it stands for (A/B runs).
const bool g_fuse_rope_store = cuda::env_flag("QS_FUSE_ROPE_STORE", true);
}  // namespace

void CudaBackend::rope_qk_store_kv(const RopeQK& rope, int m, int pos, float* k, const float* v,
                                   void* k_dst, void* v_dst, DType dst_dtype) {
  QS_CHECK_MSG(kv_row_dtype_supported(dst_dtype), "rope_qk_store_kv: rows are F32 or F16");
  if (!g_fuse_rope_store) {
    return Backend::rope_qk_store_kv(rope, m, pos, k, v, k_dst, v_dst, dst_dtype);
  }
  cuda::launch_rope_qk_store_kv(rope.q, k, v, m, rope.num_heads, rope.num_kv_heads, rope.head_dim,
                                pos, rope_freqs(rope.head_dim, rope.inv_freq), k_dst, v_dst,
                                dst_dtype == DType::F16, impl_->stream);
}

cuda::AttentionArgs cuda::make_attention_args(const float* q, int m, int pos,
                                              const AttentionShape& shape, const KvView& kv,
                                              float* out) {
  QS_CHECK_MSG(kv.length >= pos + m, "attention: the KV view does not cover the queries");
  // A quantized segment goes through attention() (attention_quant.cu).
  QS_CHECK_MSG(kv.quantized == nullptr && kv.fp_base == 0,
               "attention: the decode/prefill kernels read a full-precision KV view only");
  const KvSelection* sel = kv.selection;
  if (kv.read_bytes) {  // what the last query streams, as the CPU backend counts it
    const int64_t rows = sel ? sel->count + (pos + m - sel->dense_from) : pos + m;
    kv.read_bytes->fp +=
        int64_t{shape.num_kv_heads} * 2 * rows * shape.head_dim * kv.row_elem_bytes();
  }
  cuda::AttentionArgs a;
  a.q = q;
  a.k = kv.k;
  a.v = kv.v;
  a.kv_dtype = kv.row_dtype;
  a.out = out;
  a.row_stride = kv.row_stride;
  a.m = m;
  a.pos = pos;
  a.num_heads = shape.num_heads;
  a.num_kv_heads = shape.num_kv_heads;
  a.head_dim = shape.head_dim;
  a.scale_log2 = static_cast<float>(static_cast<double>(shape.scale) * M_LOG2E);
  if (sel) {  // positions in device memory (the engine uploads its index)
    a.selected = true;
    a.sel_positions = sel->positions;
    a.sel_count = sel->count;
    a.sel_dense_from = sel->dense_from;
  }
  return a;
}

void CudaBackend::attention(const float* q, int m, int pos, const AttentionShape& shape,
                            const KvView& kv, float* out) {
  if (kv.quantized != nullptr) {
    // The prefill attention's tensor-core kernels (head_dim 64 / 128) over rows written out.
    if (m > kGemvMaxRows && kv.selection == nullptr &&
        (shape.head_dim == 64 || shape.head_dim == 128) &&
        cuda::quant_attention_tuning().hybrid_prefill) {
      attention_quantized_prefill(q, m, pos, shape, kv, out);
      cuda::add_quant_attention_read_bytes(m, pos, shape, kv);
      return;
    }
    // Hierarchical KV (attention_quant.cu): the fused decode kernels, slices of <= 16 queries
    // for longer blocks (evaluation).
    const int64_t q_row = static_cast<int64_t>(shape.num_heads) * shape.head_dim;
    for (int i0 = 0; i0 < m; i0 += cuda::kQuantAttentionMaxRows) {
      attention_quant_slice(q + i0 * q_row, std::min(cuda::kQuantAttentionMaxRows, m - i0),
                            pos + i0, shape, kv, out + i0 * q_row);
    }
    cuda::add_quant_attention_read_bytes(m, pos, shape, kv);
    return;
  }
  QS_CHECK_MSG(kv.selection == nullptr || m <= kGemvMaxRows,
               "attention: a KV selection (sparse draft) over more than 16 query rows");
  if (m <= kGemvMaxRows) {
    attention_decode(q, m, pos, shape, kv, out);
  } else {
    attention_prefill(q, m, pos, shape, kv, out);
  }
}

void CudaBackend::attention_quant_slice(const float* q, int m, int pos, const AttentionShape& shape,
                                        const KvView& kv, float* out) {
  cuda::QuantAttentionArgs a = cuda::make_quant_attention_args(q, m, pos, shape, kv, out);
  a.exact_draft = impl_->options.exact_draft_attention;
  a.f16_int8 = impl_->options.f16_target_attention;
  const cuda::QuantAttentionPlan plan = cuda::plan_attention_quant(a, impl_->num_sms);
  auto* partials = static_cast<float*>(
      impl_->attn_partial.ensure(sizeof(float) * static_cast<size_t>(plan.partial_floats)));
  cuda::launch_attention_quant(a, plan, partials, impl_->stream);
}

void CudaBackend::attention_quantized_prefill(const float* q, int m, int pos,
                                              const AttentionShape& shape, const KvView& kv,
                                              float* out) {
  const QuantizedKvSegment& seg = *kv.quantized;
  const int G = seg.group_size, end = pos + m;
  QS_CHECK(m >= 1 && kv.length >= end && kv.fp_base <= quant_boundary(pos, G));
  const int64_t kv_dim = static_cast<int64_t>(shape.num_kv_heads) * shape.head_dim;
  const int64_t q_row = static_cast<int64_t>(shape.num_heads) * shape.head_dim;
  const size_t elem = dtype_size(kv.row_dtype);
  const size_t pitch = static_cast<size_t>(kv_dim) * elem;
  const size_t rows_bytes = static_cast<size_t>(end) * pitch;
  // The rows, written out at the first run the prefill kernels take: the view's full-precision
  // rows [fp_base, end), then its quantized view below each run's boundary (over the copies of
  // [fp_base, b)).
  char* hk = nullptr;
  char* hv = nullptr;
  auto write_rows = [&] {
    hk = static_cast<char*>(impl_->hybrid_kv.ensure(2 * rows_bytes));
    hv = hk + rows_bytes;
    const size_t spitch = static_cast<size_t>(kv.row_stride) * elem;
    const auto n_fp = static_cast<size_t>(end - kv.fp_base);
    CUDA_CHECK(cudaMemcpy2DAsync(hk + kv.fp_base * pitch, pitch, kv.k, spitch, pitch, n_fp,
                                 cudaMemcpyDeviceToDevice, impl_->stream));
    CUDA_CHECK(cudaMemcpy2DAsync(hv + kv.fp_base * pitch, pitch, kv.v, spitch, pitch, n_fp,
                                 cudaMemcpyDeviceToDevice, impl_->stream));
  };
  int dequantized = 0;
  for (int q0 = pos; q0 < end;) {
    // b(t) is constant below 2G and then on each group [G k, G (k + 1)).
    const int q1 = std::min(end, q0 < 2 * G ? 2 * G : (q0 / G + 1) * G);
    const int b = quant_boundary(q0, G);
    QS_CHECK(quant_boundary(q1 - 1, G) == b);
    const float* qr = q + (q0 - pos) * q_row;
    float* o = out + (q0 - pos) * q_row;
    if (q1 - q0 <= kGemvMaxRows) {  // the decode kernels read the view as it is
      attention_quant_slice(qr, q1 - q0, q0, shape, kv, o);
    } else {
      if (hk == nullptr) write_rows();
      if (b > dequantized) {
        cuda::launch_dequantize_kv_rows(seg, shape.num_kv_heads, shape.head_dim, dequantized, b,
                                        kv.row_dtype, hk, hv, kv_dim, impl_->stream);
        dequantized = b;
      }
      KvView rows{hk, hv, kv_dim, q1};
      rows.row_dtype = kv.row_dtype;
      attention_prefill(qr, q1 - q0, q0, shape, rows, o);
    }
    q0 = q1;
  }
}

void CudaBackend::attention_decode(const float* q, int m, int pos, const AttentionShape& shape,
                                   const KvView& kv, float* out, int num_splits) {
  QS_CHECK(m >= 1 && m <= kGemvMaxRows);
  cuda::AttentionArgs a = cuda::make_attention_args(q, m, pos, shape, kv, out);
  QS_CHECK(shape.num_kv_heads >= 1 && shape.num_heads % shape.num_kv_heads == 0);
  // Tensor cores (attention_decode_tc.cu) for aligned f16 rows of head_dim 64/128 unless tuned off.
  if (cuda::decode_attention_tuning().tensor_cores && cuda::attention_decode_tc_supported(a)) {
    const int64_t base_blocks =
        static_cast<int64_t>(cuda::attention_decode_tc_query_tiles(a)) * shape.num_kv_heads;
    impl_->plan_splits(a, base_blocks, num_splits, cuda::kDecodeTcBlocksPerSm);
    cuda::launch_attention_decode_tc(a, impl_->stream);
    return;
  }
  const int64_t base_blocks =
      static_cast<int64_t>(cuda::attention_decode_query_tiles(a)) * shape.num_kv_heads;
  impl_->plan_splits(a, base_blocks, num_splits);
  cuda::launch_attention_decode(a, impl_->stream);
}

void CudaBackend::attention_prefill(const float* q, int m, int pos, const AttentionShape& shape,
                                    const KvView& kv, float* out, int num_splits) {
  QS_CHECK(m >= 1);
  cuda::AttentionArgs a = cuda::make_attention_args(q, m, pos, shape, kv, out);
  // Tensor cores (attention_prefill_tc.cu) for head_dim 64/128 unless tuned off.
  const bool tc = cuda::prefill_attention_tuning().tensor_cores && !a.selected &&
                  cuda::attention_prefill_tc_supported(a);
  const int tiles = tc ? cuda::attention_prefill_tc_query_tiles(a)
                       : cuda::attention_prefill_query_tiles(a);
  impl_->plan_splits(a, static_cast<int64_t>(tiles) * shape.num_heads, num_splits);
  if (tc) {
    void* scratch = impl_->attn_tc.ensure(cuda::attention_prefill_tc_scratch_bytes(a));
    cuda::launch_attention_prefill_tc(a, scratch, impl_->stream, impl_->options.exact_prefill);
  } else {
    cuda::launch_attention_prefill(a, impl_->stream);
  }
}

void CudaBackend::swiglu(const float* gate, const float* up, int64_t n, float* out) {
  cuda::launch_swiglu(gate, up, n, out, impl_->stream);
}

void CudaBackend::add(float* y, const float* x, int64_t n) {
  cuda::launch_add(y, x, n, impl_->stream);
}

namespace {
// A 4-bit weight's bias (nullptr or empty for none) has one entry per output row.
void check_q4_bias(const QuantizedWeight4& w, const WeightView* bias) {
  if (bias != nullptr && !bias->empty()) {
    QS_CHECK_MSG(bias->numel() == w.rows, "bias " + bias->name + " does not match " + w.name);
  }
}
}  // namespace

void CudaBackend::matmul_group(const float* x, int m, const LinearOp* ops, int count) {
  matmul_group_from(x, m, ops, count, nullptr);
}

bool CudaBackend::matmul_group_from(const float* x, int m, const LinearOp* ops, int count,
                                    const PendingNorm* pn, const KvRowStore* rows) {
  const int n = count;
  // The K/V rows in the launch's epilogue: one row, the q/k/v ops' own outputs (each launch
  // checks its own switch: GemvTuning::qkv_rows, Q4GemvTuning::qkv_rows).
  const bool with_rows = rows != nullptr && m == 1 && rows_of_qkv(ops, count, *rows);
  // A deferred norm's dense reader: only the q/k/v launch with its rows (ring_walk's NIN).
  bool dense = pn == nullptr || with_rows, q4 = true;
  for (int i = 0; i < n; ++i) {
    const LinearOp& op = ops[i];
    dense = dense && op.w4 == nullptr;
    q4 = q4 && op.w4 != nullptr;
    if (op.w4 != nullptr) check_q4_bias(*op.w4, op.bias);
  }
  if ((n >= 2 || pn != nullptr) && n <= cuda::kMaxGemvSegments && m >= 1 && m <= kGemvMaxRows) {
    if (dense) {
      cuda::GemvSegment segs[cuda::kMaxGemvSegments];
      for (int i = 0; i < n; ++i) {
        segs[i] = {impl_->matrix(*ops[i].w), impl_->bias(ops[i].bias), ops[i].y};
      }
      if (with_rows &&
          cuda::launch_gemv_qkv_rows(x, segs, kv_row_epilogue(*rows), impl_->num_sms, impl_->stream,
                                     pn != nullptr ? norm_in(*pn) : cuda::NormIn{})) {
        return true;
      }
      if (pn == nullptr && cuda::gemv_group_supported(x, m, segs, n)) {
        cuda::launch_gemv_group(x, m, segs, n, impl_->num_sms, impl_->stream);
        return false;
      }
    } else if (q4) {
      const cuda::DeviceWeight4* ws[cuda::kMaxGemvSegments];
      cuda::DeviceBias biases[cuda::kMaxGemvSegments];
      float* ys[cuda::kMaxGemvSegments];
      for (int i = 0; i < n; ++i) {
        ws[i] = &impl_->weights4.resolve(*ops[i].w4, impl_->stream);
        biases[i] = impl_->bias(ops[i].bias);
        ys[i] = ops[i].y;
      }
      if (pn != nullptr) {
        if (with_rows &&
            cuda::launch_gemv_q4_qkv_rows(x, ws, biases, ys, norm_in(*pn), kv_row_epilogue(*rows),
                                          impl_->num_sms, impl_->stream)) {
          return true;
        }
        if (cuda::launch_gemv_q4_group_normed(x, m, ws, biases, ys, n, norm_in(*pn), impl_->num_sms,
                                              impl_->stream)) {
          return false;
        }
      } else if (cuda::gemv_q4_group_supported(m, ws, n)) {
        cuda::launch_gemv_q4_group(x, m, ws, biases, ys, n, impl_->num_sms, impl_->stream);
        return false;
      }
    }
  }
  if (pn != nullptr) {  // no launch reads the deferred norm: materialize it
    rmsnorm(pn->h, *pn->weight, m, pn->eps, pn->out);
    return matmul_group_from(pn->out, m, ops, count, nullptr, rows);
  }
  Backend::matmul_group(x, m, ops, count);
  return false;
}

void CudaBackend::matmul_q4(const float* x, int m, const QuantizedWeight4& w,
                            const WeightView* bias, float* y) {
  QS_CHECK(m >= 1);
  check_q4_bias(w, bias);
  const cuda::DeviceWeight4& dw = impl_->weights4.resolve(w, impl_->stream);
  const cuda::DeviceBias b = impl_->bias(bias);
  for (int m0 = 0; m0 < m; m0 += kGemvMaxRows) {  // m > 16 (rare): the weights once per slice
    const int mc = std::min(kGemvMaxRows, m - m0);
    cuda::launch_gemv_q4(x + static_cast<int64_t>(m0) * w.cols, mc, dw, b,
                         y + static_cast<int64_t>(m0) * w.rows, impl_->num_sms, impl_->stream);
  }
}

namespace {
// QS_FUSE_NORM=0: linear_add_rmsnorm as the GEMV and add_rmsnorm launches (A/B runs).
const bool g_fuse_norm = cuda::env_flag("QS_FUSE_NORM", true);
// Rows fused at most: one. The last block normalizes the rows one after another, while
// add_rmsnorm runs a block per row: at m = 4 (a γ = 3 verification) fusing made the step 3-4%
// slower (H200, 128K: Llama-2-7B 14.36 vs 13.93 ms, Llama-3.1-8B 9.78 vs 9.37), at m = 1 the
// draft step 0.3-1.3% faster (7.121 vs 7.140, 3.941 vs 3.994 ms; docs/perf.md, session 28).
constexpr int kFuseNormMaxRows = 1;
}  // namespace

void CudaBackend::linear_add_rmsnorm(const float* x, int m, const LinearOp& op, float* h,
                                     const WeightView& weight, float eps, float* out) {
  const int64_t d = weight.numel();
  if (g_fuse_norm && m >= 1 && m <= kFuseNormMaxRows && op.rows() == d) {
    const cuda::GemvNorm norm{
        h, impl_->resolve(weight), weight.dtype, eps, out, impl_->norm_arrivals, m, d};
    const cuda::DeviceBias b = impl_->bias(op.bias);
    if (op.w4 != nullptr) {
      check_q4_bias(*op.w4, op.bias);
      const cuda::DeviceWeight4& dw = impl_->weights4.resolve(*op.w4, impl_->stream);
      if (cuda::launch_gemv_q4_norm(x, m, dw, b, norm, impl_->num_sms, impl_->stream)) return;
    } else if (cuda::launch_gemv_norm(x, m, impl_->matrix(*op.w), b, norm, impl_->num_sms,
                                      impl_->stream)) {
      return;
    }
  }
  Backend::linear_add_rmsnorm(x, m, op, h, weight, eps, out);
}

namespace {
// QS_FUSE_SWIGLU=0: gate_up_swiglu as the group GEMV and swiglu launches (A/B runs).
const bool g_fuse_swiglu = cuda::env_flag("QS_FUSE_SWIGLU", true);
// QS_DEFER_NORM=0: the draft's norms materialized by the producing launch (A/B runs).
const bool g_defer_norm = cuda::env_flag("QS_DEFER_NORM", true);
}  // namespace

void CudaBackend::linear_add_rmsnorm_deferred(const float* x, int m, const LinearOp& op,
                                              PendingNorm& pn) {
  const int64_t d = pn.weight->numel();
  // The 4-bit draft's norms (QS_DEFER_NORM), a bf16 / f16 layer's where GemvTuning::defer_norm.
  const bool dense = op.w4 == nullptr && cuda::gemv_tuning().defer_norm;
  if (g_fuse_norm && m == 1 && op.rows() == d && (dense || (g_defer_norm && op.w4 != nullptr))) {
    cuda::GemvNorm norm{
        pn.h, impl_->resolve(*pn.weight), pn.weight->dtype, pn.eps, nullptr, nullptr, m, d};
    norm.sumsq = impl_->norm_sumsq;
    norm.parts = impl_->num_sms;
    const cuda::DeviceBias b = impl_->bias(op.bias);
    bool launched = false;
    if (dense) {
      launched = cuda::launch_gemv_norm(x, m, impl_->matrix(*op.w), b, norm, impl_->num_sms,
                                        impl_->stream);
    } else {
      check_q4_bias(*op.w4, op.bias);
      const cuda::DeviceWeight4& dw = impl_->weights4.resolve(*op.w4, impl_->stream);
      launched = cuda::launch_gemv_q4_norm(x, m, dw, b, norm, impl_->num_sms, impl_->stream);
    }
    if (launched) {
      pn.deferred = true;
      pn.record = impl_->norm_sumsq;
      return;
    }
  }
  Backend::linear_add_rmsnorm_deferred(x, m, op, pn);
}

// The NormIn of a deferred norm (linear_add_rmsnorm_deferred's record: num_sms partial sums).
cuda::NormIn CudaBackend::norm_in(const PendingNorm& pn) {
  cuda::NormIn nin;
  nin.sumsq = static_cast<const double*>(pn.record);
  nin.parts = impl_->num_sms;
  nin.weight = impl_->resolve(*pn.weight);
  nin.weight_dtype = pn.weight->dtype;
  nin.eps = pn.eps;
  return nin;
}

void CudaBackend::matmul_group_normed(const PendingNorm& pn, int m, const LinearOp* ops,
                                      int count) {
  matmul_group_normed_rows(pn, m, ops, count, nullptr);
}

bool CudaBackend::matmul_group_normed_rows(const PendingNorm& pn, int m, const LinearOp* ops,
                                           int count, const KvRowStore* rows) {
  return pn.deferred ? matmul_group_from(pn.h, m, ops, count, &pn, rows)
                     : matmul_group_from(pn.out, m, ops, count, nullptr, rows);
}

void CudaBackend::gate_up_swiglu_normed(const PendingNorm& pn, int m, const LinearOp& gate,
                                        const LinearOp& up, float* out) {
  if (!pn.deferred) return gate_up_swiglu(pn.out, m, gate, up, out);
  gate_up_swiglu_from(pn.h, m, gate, up, out, &pn);
}

void CudaBackend::output_and_mlp(const float* x, int m, const LinearOp& o, PendingNorm& mid,
                                 const LinearOp& gate, const LinearOp& up, float* act,
                                 const LinearOp& down, PendingNorm& next, const LinearOp* next_ops,
                                 int next_count, const KvRowStore* next_rows) {
  // With GemvTuning::qkv_rows or Q4GemvTuning::qkv_rows the next q/k/v and its rows are launched
  // here: as one launch where matmul_group_from runs them that way, else as the base class would.
  const bool qkv_here = next_rows != nullptr && next_count > 0 &&
                        (cuda::gemv_tuning().qkv_rows || cuda::q4_gemv_tuning().qkv_rows);
  Backend::output_and_mlp(x, m, o, mid, gate, up, act, down, next, next_ops,
                          qkv_here ? 0 : next_count, qkv_here ? nullptr : next_rows);
  if (qkv_here && !matmul_group_normed_rows(next, m, next_ops, next_count, next_rows)) {
    store_next_rows(m, next_ops, next_count, *next_rows);
  }
}

void CudaBackend::gate_up_swiglu(const float* x, int m, const LinearOp& gate, const LinearOp& up,
                                 float* out) {
  gate_up_swiglu_from(x, m, gate, up, out, nullptr);
}

void CudaBackend::gate_up_swiglu_from(const float* x, int m, const LinearOp& gate,
                                      const LinearOp& up, float* out, const PendingNorm* pn) {
  const bool q4 = gate.w4 != nullptr && up.w4 != nullptr;
  const bool dense = gate.w4 == nullptr && up.w4 == nullptr;
  if (g_fuse_swiglu && m >= 1 && m <= kGemvMaxRows) {
    const cuda::DeviceBias bg = impl_->bias(gate.bias), bu = impl_->bias(up.bias);
    if (q4 && gate.w4->rows == up.w4->rows) {
      check_q4_bias(*gate.w4, gate.bias);
      check_q4_bias(*up.w4, up.bias);
      const cuda::DeviceWeight4& wg = impl_->weights4.resolve(*gate.w4, impl_->stream);
      const cuda::DeviceWeight4& wu = impl_->weights4.resolve(*up.w4, impl_->stream);
      if (cuda::launch_gemv_q4_swiglu(x, m, wg, wu, bg, bu, out, impl_->num_sms, impl_->stream,
                                      pn != nullptr ? norm_in(*pn) : cuda::NormIn{})) {
        return;
      }
    } else if (dense && gate.w->rows == up.w->rows) {
      const cuda::GemvSegment g{impl_->matrix(*gate.w), bg, out}, u{impl_->matrix(*up.w), bu, up.y};
      if (cuda::launch_gemv_swiglu(x, m, g, u, impl_->num_sms, impl_->stream,
                                   pn != nullptr ? norm_in(*pn) : cuda::NormIn{})) {
        return;
      }
    }
  }
  if (pn != nullptr) {  // no launch reads the deferred norm: materialize it
    rmsnorm(pn->h, *pn->weight, m, pn->eps, pn->out);
    return gate_up_swiglu_from(pn->out, m, gate, up, out, nullptr);
  }
  Backend::gate_up_swiglu(x, m, gate, up, out);
}

void CudaBackend::quantize_kv(const void* k_rows, const void* v_rows, DType row_dtype,
                              int64_t row_stride, int num_kv_heads, int head_dim,
                              int64_t first_group, int n_groups, const QuantizedKvPlanesOut& dst) {
  cuda::launch_quantize_kv(k_rows, v_rows, row_dtype, row_stride, num_kv_heads, head_dim,
                           first_group, n_groups, dst, impl_->stream);
}

void CudaBackend::quantize_kv_layers(const void* k_rows, const void* v_rows, DType row_dtype,
                                     int64_t row_stride, int64_t layer_stride, int n_layers,
                                     int num_kv_heads, int head_dim, int64_t first_group,
                                     int n_groups, const QuantizedKvPlanesOut* dst) {
  if (g_flush_layers && cuda::launch_quantize_kv_layers(
                            k_rows, v_rows, row_dtype, row_stride, layer_stride, n_layers,
                            num_kv_heads, head_dim, first_group, n_groups, dst, impl_->stream)) {
    return;
  }
  Backend::quantize_kv_layers(k_rows, v_rows, row_dtype, row_stride, layer_stride, n_layers,
                              num_kv_heads, head_dim, first_group, n_groups, dst);
}

void CudaBackend::snapkv_scores(const float* q, int window, const void* k_rows, DType row_dtype,
                                int64_t row_stride, const AttentionShape& shape, int prompt_len,
                                int past, float* scores) {
  cuda::SnapKvScoresArgs a;
  a.q = q;
  a.k = k_rows;
  a.k_dtype = row_dtype;
  a.row_stride = row_stride;
  a.scores = scores;
  a.window = window;
  a.prompt_len = prompt_len;
  a.past = past;
  a.num_heads = shape.num_heads;
  a.num_kv_heads = shape.num_kv_heads;
  a.head_dim = shape.head_dim;
  a.scale = shape.scale;
  void* scratch = impl_->snapkv.ensure(cuda::snapkv_scores_scratch_bytes(a));
  cuda::launch_snapkv_scores(a, scratch, impl_->stream);
}

void CudaBackend::fill_zero(void* dst, size_t bytes) {
  if (bytes == 0) return;
  CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, impl_->stream));
}

void CudaBackend::synchronize() {
  CUDA_CHECK(cudaStreamSynchronize(impl_->stream));
}

void* CudaBackend::stream() const {
  return impl_->stream;
}

int CudaBackend::num_sms() const {
  return impl_->num_sms;
}

size_t CudaBackend::resident_weight_bytes() const {
  return impl_->resident_bytes + impl_->weights4.bytes();
}

void CudaBackend::prepare_weights4(const std::vector<const QuantizedWeight4*>& w) {
  for (const QuantizedWeight4* q : w) impl_->weights4.resolve(*q, impl_->stream);
}

void CudaBackend::forget_weights4(const std::vector<const QuantizedWeight4*>& w) {
  // Runs from a Model's destructor: no abort on a failed stream (the backend is unusable then,
  // and its own teardown frees the copies).
  if (cudaStreamSynchronize(impl_->stream) != cudaSuccess) {  // no queued op may read them
    cudaGetLastError();
    return;
  }
  for (const QuantizedWeight4* q : w) impl_->weights4.forget(*q);
}

void CudaBackend::release_weights() {
  CUDA_CHECK(cudaStreamSynchronize(impl_->stream));
  for (auto& [key, w] : impl_->weights) {
    if (w.owned) CUDA_CHECK(cudaFree(const_cast<void*>(w.ptr)));
  }
  impl_->weights.clear();
  impl_->resident_bytes = 0;
  impl_->weights4.release(impl_->stream);
}

}  // namespace qs
