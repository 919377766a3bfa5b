// CUDA op benchmarks at real model shapes, and a first whole decode step.
//
//   bench_ops [--sections copy,read,gemv,tune,attn,prefill,prefattn,step,w4mm,w4var,w4layer,
//                         w4sweep,kvflush,quantkv,qtime,sample,chain]
//             [--quick] [--profile]
//
// sample: sampling on the GPU (one row, five rows, the backend call, a gamma = 4 verdict) at
// vocabularies 32000 / 128256.
//
// prefattn: one layer's causal prefill attention, f32 kernel vs tensor cores, 4K/32K/128K.
//
// quantkv: attention over the hierarchical quantized KV cache (draft INT4 and target INT8 views).
// w4mm / w4var: the 4-bit draft-weight GEMV (matmul_q4) and its variants; w4layer: one draft
// layer's 4-bit launches (grouped as the model runs them) per code path, w4sweep the same with
// every tiles-per-block x warps x path choice; kvflush: quantize_kv; qtime (not in the default
// list): per-block phase stamps of one quantized-attention call (bench_quant_timeline: the
// phases, when the blocks leave, the quantized phase by blocks per SM), and whether the slow
// blocks of its quantized phase are slow again in a second call (lateness_line: by block, by
// SM); chain: what the launch boundaries between a layer's GEMVs cost, and a layer
// as the model's launches and with the q/k/v launch taking the RoPE and rows (QS_QKV_ROWS). Their
// small calls are timed as CUDA graphs of many calls (time_graph_ms), the way a captured decode
// step runs them; w4mm also states the eager time.
//
// Every time is the median over batches of launches timed with CUDA events after warm-up;
// inputs rotate over enough copies to exceed the L2 cache, so each launch reads HBM. Every line
// states the bytes counted and the fraction of the H200's measured copy bandwidth (4.24 TB/s,
// bytes read + written), and the copy section re-measures that ceiling on the machine at hand.
// Lines starting with "| " form the summary table printed last.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/attention_decode_tc.h"
#include "backend/cuda/attention_prefill_tc.h"
#include "backend/cuda/attention_prefill_wgmma.h"
#include "backend/cuda/attention_quant.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/quant_ops.h"
#include "read_ceiling.h"

namespace qs {
namespace {

constexpr double kRefBandwidth = 4.24e12;           // bytes/s, H200 device copy (read + write)
constexpr size_t kRotateBytes = size_t{512} << 20;  // inputs rotate over >= this many bytes
// QS_BENCH_L2_HOT=1: the 4-bit sections and the layer rows (w4mm, w4var, w4layer, chain's layer
// rows) time one copy of the weights, resident in L2 after the first call wherever it fits (50 MB
// on the H100 / H200; a layer's weights do not), instead of rotating copies: against the default's
// cold reads, how much of a GEMV's time is waiting for DRAM rather than its own instructions (what
// an L2 prefetch of the next weights could recover).
const bool g_l2_hot = [] {
  const char* v = std::getenv("QS_BENCH_L2_HOT");
  return v != nullptr && std::strcmp(v, "1") == 0;
}();

// Copies of `bytes` of weights to rotate over: enough to exceed L2 (>= 2), or 1 with
// QS_BENCH_L2_HOT=1.
int weight_copies(double bytes) {
  if (g_l2_hot) return 1;
  return static_cast<int>(std::max<double>(2, std::ceil(kRotateBytes / bytes)));
}

// --profile: every timed body runs twice, eagerly, and times are not measured (for ncu, which
// then sees each configuration's kernels a few times instead of thousands).
bool g_profile = false;

std::vector<std::string> g_summary;

void summary(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void summary(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  std::printf("%s\n", buf);
  g_summary.emplace_back(buf);
}

// ---- device data ----------------------------------------------------------------------------

__device__ uint32_t hash32(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}

// Uniform values in [center - half_width, center + half_width].
__global__ void fill_bf16(__nv_bfloat16* p, size_t n, uint64_t seed, float center,
                          float half_width) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const float u = hash32(seed * 0x9E3779B97F4A7C15ull + i) * (1.0f / 4294967296.0f);
    p[i] = __float2bfloat16(center + half_width * (2.0f * u - 1.0f));
  }
}

__global__ void fill_f32(float* p, size_t n, uint64_t seed, float half_width) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const float u = hash32(seed * 0x9E3779B97F4A7C15ull + i) * (1.0f / 4294967296.0f);
    p[i] = half_width * (2.0f * u - 1.0f);
  }
}

// fp16 values uniform in [lo, hi].
__global__ void fill_f16(uint16_t* p, size_t n, uint64_t seed, float lo, float hi) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const float u = hash32(seed * 0x9E3779B97F4A7C15ull + i) * (1.0f / 4294967296.0f);
    p[i] = __half_as_ushort(__float2half(lo + (hi - lo) * u));
  }
}

// Device memory owned by the benchmark (freed at scope end).
struct DeviceMem {
  void* ptr = nullptr;
  size_t bytes = 0;
  explicit DeviceMem(size_t b) : bytes(b) { CUDA_CHECK(cudaMalloc(&ptr, b)); }
  ~DeviceMem() { cudaFree(ptr); }
  DeviceMem(const DeviceMem&) = delete;
  DeviceMem& operator=(const DeviceMem&) = delete;
  float* f32() const { return static_cast<float*>(ptr); }
};

std::unique_ptr<DeviceMem> random_bf16(size_t n, uint64_t seed, float center = 0.0f,
                                       float half_width = 0.02f) {
  auto m = std::make_unique<DeviceMem>(n * 2);
  fill_bf16<<<1024, 256>>>(static_cast<__nv_bfloat16*>(m->ptr), n, seed, center, half_width);
  CUDA_CHECK(cudaGetLastError());
  return m;
}

std::unique_ptr<DeviceMem> random_f32(size_t n, uint64_t seed, float half_width = 1.0f) {
  auto m = std::make_unique<DeviceMem>(n * 4);
  fill_f32<<<1024, 256>>>(m->f32(), n, seed, half_width);
  CUDA_CHECK(cudaGetLastError());
  return m;
}

std::unique_ptr<DeviceMem> random_f16(size_t n, uint64_t seed, float half_width = 1.0f) {
  auto m = std::make_unique<DeviceMem>(n * 2);
  fill_f16<<<1024, 256>>>(static_cast<uint16_t*>(m->ptr), n, seed, -half_width, half_width);
  CUDA_CHECK(cudaGetLastError());
  return m;
}

WeightView bf16_view(const DeviceMem& m, int64_t rows, int64_t cols, const char* name) {
  WeightView w;
  w.data = m.ptr;
  w.dtype = DType::BF16;
  w.rows = rows;
  w.cols = cols;
  w.name = name;
  return w;
}

// ---- timing ---------------------------------------------------------------------------------

// Median milliseconds per call of `body(i)` (i counts calls, for rotating inputs): warm-up,
// then `batches` batches of `reps` calls between two events.
double time_ms(cudaStream_t s, const std::function<void(int)>& body, int reps, int batches = 7) {
  if (g_profile) {
    for (int i = 0; i < 2; ++i) body(i);
    CUDA_CHECK(cudaStreamSynchronize(s));
    return 1.0;
  }
  for (int i = 0; i < std::max(3, reps / 4); ++i) body(i);
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<float> ms;
  int call = 0;
  for (int b = 0; b < batches; ++b) {
    CUDA_CHECK(cudaEventRecord(start, s));
    for (int r = 0; r < reps; ++r) body(call++);
    CUDA_CHECK(cudaEventRecord(stop, s));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t / reps);
  }
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

double pct(double bytes, double ms) {
  return 100.0 * bytes / (ms * 1e-3) / kRefBandwidth;
}
double gbps(double bytes, double ms) {
  return bytes / (ms * 1e-3) / 1e9;
}

// ---- sections -------------------------------------------------------------------------------

void bench_copy(CudaBackend& be) {
  const size_t bytes = size_t{4} << 30;
  DeviceMem a(bytes), b(bytes);
  CUDA_CHECK(cudaMemset(a.ptr, 1, bytes));
  auto s = static_cast<cudaStream_t>(be.stream());
  const double ms = time_ms(
      s,
      [&](int) { CUDA_CHECK(cudaMemcpyAsync(b.ptr, a.ptr, bytes, cudaMemcpyDeviceToDevice, s)); },
      5, 5);
  const double moved = 2.0 * bytes;
  summary("| copy d2d 4 GiB | %.3f ms | %.0f GB/s (read+write) | %.1f%% of 4.24 TB/s |", ms,
          gbps(moved, ms), pct(moved, ms));
}

struct Shape {
  const char* model;
  int64_t hidden, inter, vocab;
  int heads, kv_heads, head_dim, layers;
};
constexpr Shape kLlama2_7B{"llama2-7b", 4096, 11008, 32000, 32, 32, 128, 32};
constexpr Shape kLlama31_8B{"llama3.1-8b", 4096, 14336, 128256, 32, 8, 128, 32};

void bench_gemv(CudaBackend& be, bool quick) {
  auto s = static_cast<cudaStream_t>(be.stream());
  struct Mat {
    const char* name;
    int64_t n, k;
  };
  const Mat mats[] = {
      {"7b q/o 4096x4096", 4096, 4096},    {"7b gate/up 11008x4096", 11008, 4096},
      {"7b down 4096x11008", 4096, 11008}, {"7b lm_head 32000x4096", 32000, 4096},
      {"8b k/v 1024x4096", 1024, 4096},    {"8b gate/up 14336x4096", 14336, 4096},
      {"8b down 4096x14336", 4096, 14336}, {"8b lm_head 128256x4096", 128256, 4096}};
  const int rows_list[] = {1, 4, 8, 16};
  for (const Mat& mat : mats) {
    const size_t wbytes = size_t(mat.n) * mat.k * 2;
    const int copies = static_cast<int>(std::max<size_t>(2, (kRotateBytes + wbytes - 1) / wbytes));
    std::vector<std::unique_ptr<DeviceMem>> ws;
    for (int c = 0; c < copies; ++c) ws.push_back(random_bf16(size_t(mat.n) * mat.k, 10 + c));
    std::vector<WeightView> views;
    for (auto& w : ws) views.push_back(bf16_view(*w, mat.n, mat.k, mat.name));
    auto x = random_f32(16 * mat.k, 3);
    DeviceMem y(16 * mat.n * 4);
    for (int m : rows_list) {
      if (quick && m != 1 && m != 4 && m != 16) continue;
      const double ms = time_ms(
          s, [&](int i) { be.matmul(x->f32(), m, views[i % copies], nullptr, y.f32()); },
          20 * copies);
      const double bytes = double(wbytes) + 4.0 * m * (mat.k + mat.n);
      summary("| gemv bf16 %-24s m=%-2d | %8.1f us | %6.0f GB/s | %5.1f%% |", mat.name, m, ms * 1e3,
              gbps(bytes, ms), pct(bytes, ms));
    }
  }
}

// The skinny-GEMM variants side by side (cuda::GemvTuning): time per call and % of 4.24 TB/s.
constexpr cuda::GemvTuning kTunings[] = {{4, false, 0, -1}, {4, true, 0, -1}, {8, false, 0, -1},
                                         {8, true, 0, -1},  {4, true, 4, -1}, {0, true, 0, -1},
                                         {0, true, 0, 4},   {0, true, 0, 6},  {0, true, 0, 0}};

void bench_gemv_tuning(CudaBackend& be) {
  auto s = static_cast<cudaStream_t>(be.stream());
  struct Mat {
    const char* name;
    int64_t n, k;
  };
  const Mat mats[] = {{"7b q/o", 4096, 4096},
                      {"7b down", 4096, 11008},
                      {"8b k/v", 1024, 4096},
                      {"8b gate/up", 14336, 4096},
                      {"8b lm_head", 128256, 4096}};
  const cuda::GemvTuning saved = cuda::gemv_tuning();
  summary(
      "| gemv-tune (us, %% of 4.24 TB/s) | u4 | u4+L2 | u8 | u8+L2 | coal+L2 (m<=4) | u-auto+L2 |"
      " ring 4 | ring 6 | default |");
  for (const Mat& mat : mats) {
    const size_t wbytes = size_t(mat.n) * mat.k * 2;
    const int copies = static_cast<int>(std::max<size_t>(2, (kRotateBytes + wbytes - 1) / wbytes));
    std::vector<std::unique_ptr<DeviceMem>> ws;
    for (int c = 0; c < copies; ++c) ws.push_back(random_bf16(size_t(mat.n) * mat.k, 10 + c));
    std::vector<WeightView> views;
    for (auto& w : ws) views.push_back(bf16_view(*w, mat.n, mat.k, mat.name));
    auto x = random_f32(16 * mat.k, 3);
    DeviceMem y(16 * mat.n * 4);
    for (int m : {1, 2, 4, 8, 16}) {
      std::string line;
      char buf[64];
      for (const cuda::GemvTuning& t : kTunings) {
        if (t.coalesced_max_rows > 0 && m > t.coalesced_max_rows) {
          line += "         - |";
          continue;
        }
        cuda::set_gemv_tuning(t);
        const double ms = time_ms(
            s, [&](int i) { be.matmul(x->f32(), m, views[i % copies], nullptr, y.f32()); },
            20 * copies);
        const double bytes = double(wbytes) + 4.0 * m * (mat.k + mat.n);
        std::snprintf(buf, sizeof buf, " %6.1f %3.0f%% |", ms * 1e3, pct(bytes, ms));
        line += buf;
      }
      summary("| gemv-tune %-10s m=%-2d |%s", mat.name, m, line.c_str());
    }
  }
  cuda::set_gemv_tuning(saved);
  be.release_weights();
}

// K/V rows for decode-attention timing: enough random copies to rotate over kRotateBytes (cold
// L2), f32 or f16.
struct AttnRows {
  int64_t stride;
  DType dtype;
  int ctx, copies;
  std::vector<std::unique_ptr<DeviceMem>> ks, vs;

  AttnRows(CudaBackend& be, int ctx_, int64_t kv_dim, int64_t stride_, DType dtype_)
      : stride(stride_), dtype(dtype_), ctx(ctx_) {
    const size_t kv_bytes = size_t(ctx) * kv_dim * dtype_size(dtype) * 2;
    const size_t alloc = size_t(ctx) * stride;
    copies = static_cast<int>(std::max<size_t>(1, (kRotateBytes + kv_bytes - 1) / kv_bytes));
    for (int c = 0; c < copies; ++c) {
      for (auto* list : {&ks, &vs}) {
        auto f = random_f32(alloc, 100 + c + (list == &vs ? 100 : 0));
        if (dtype == DType::F16) {
          auto h = std::make_unique<DeviceMem>(alloc * 2);
          be.store_kv_rows(h->ptr, DType::F16, f->f32(), alloc);
          f = std::move(h);
        }
        list->push_back(std::move(f));
      }
    }
  }

  // ms per decode-attention call with m query rows (the last m positions).
  double time(CudaBackend& be, const AttentionShape& shape, int m) {
    auto q = random_f32(size_t(m) * shape.num_heads * shape.head_dim, 5);
    DeviceMem out(size_t(m) * shape.num_heads * shape.head_dim * 4);
    return time_ms(
        static_cast<cudaStream_t>(be.stream()),
        [&](int i) {
          const int c = i % copies;
          KvView view{ks[c]->ptr, vs[c]->ptr, stride, ctx};
          view.row_dtype = dtype;
          be.attention(q->f32(), m, ctx - m, shape, view, out.f32());
        },
        std::max(10, 4 * copies));
  }
};

// Decode attention over full-precision rows: f32, f16 (16-byte-aligned rows: the tensor-core
// kernel, and the CUDA-core wide kernel with tensor cores tuned off) and f16 with rows padded by 4
// elements (8-byte aligned: the CUDA-core narrow kernel), bytes = K + V read. Then the same bytes
// as Llama-2-7B at 32K (f16, m = 1) in rows of fewer kv heads: is a token's 256-byte piece per
// kv head (the fp cache is token-major) what limits the bandwidth?
void bench_attention(CudaBackend& be, bool quick) {
  struct Rows {
    const char* name;
    DType dtype;
    int pad;
    bool tc;
    bool transposed = false;  // DecodeAttentionTuning::transposed (<= 8 query vectors per kv head)
  };
  const Rows kRows[] = {{"f32-KV", DType::F32, 0, true},
                        {"f16-KV", DType::F16, 0, true},
                        {"f16-KV T", DType::F16, 0, true, true},
                        {"f16-KV cc", DType::F16, 0, false},
                        {"f16-KV pad4", DType::F16, 4, true}};
  const cuda::DecodeAttentionTuning saved = cuda::decode_attention_tuning();
  for (const Shape* sh : {&kLlama2_7B, &kLlama31_8B}) {
    const int64_t kv_dim = int64_t(sh->kv_heads) * sh->head_dim;
    for (int ctx : {4096, 32768, 131072}) {
      if (quick && ctx == 4096) continue;
      for (const Rows& r : kRows) {
        AttnRows rows(be, ctx, kv_dim, kv_dim + r.pad, r.dtype);
        const double kv_bytes = double(ctx) * double(kv_dim) * double(dtype_size(r.dtype)) * 2;
        const AttentionShape shape{sh->heads, sh->kv_heads, sh->head_dim,
                                   static_cast<float>(1.0 / std::sqrt(double(sh->head_dim)))};
        for (int m : {1, 8, 16}) {
          if (quick && m == 16) continue;
          cuda::DecodeAttentionTuning t = saved;
          t.tensor_cores = r.tc;
          t.transposed = r.transposed;
          cuda::set_decode_attention_tuning(t);
          const double ms = rows.time(be, shape, m);
          summary("| attn decode %-11s %-11s ctx=%-6d m=%-2d | %8.1f us | %6.0f GB/s | %5.1f%% |",
                  r.name, sh->model, ctx, m, ms * 1e3, gbps(kv_bytes, ms), pct(kv_bytes, ms));
        }
      }
    }
  }
  cuda::set_decode_attention_tuning(saved);
  for (int heads : {32, 8, 4, 1}) {
    const int ctx = 32 * 32768 / heads, hd = 128;
    AttnRows rows(be, ctx, int64_t{heads} * hd, int64_t{heads} * hd, DType::F16);
    const double kv_bytes = double(ctx) * heads * hd * 2 * 2;
    const AttentionShape shape{heads, heads, hd, static_cast<float>(1.0 / std::sqrt(double(hd)))};
    const double ms = rows.time(be, shape, 1);
    summary(
        "| attn decode f16-KV layout %2d kv heads x %7d tokens m=1 | %8.1f us | %6.0f GB/s | "
        "%5.1f%% |",
        heads, ctx, ms * 1e3, gbps(kv_bytes, ms), pct(kv_bytes, ms));
  }
}

void bench_prefill(CudaBackend& be, CudaBackend& fast) {
  auto s = static_cast<cudaStream_t>(be.stream());
  const int64_t n = 11008, k = 4096;
  auto w = random_bf16(size_t(n) * k, 7);
  const WeightView view = bf16_view(*w, n, k, "7b gate");
  for (int m : {512, 4096}) {
    auto x = random_f32(size_t(m) * k, 8);
    DeviceMem y(size_t(m) * n * 4);
    for (CudaBackend* b : {&be, &fast}) {
      auto bs = static_cast<cudaStream_t>(b->stream());
      const double ms = time_ms(
          bs, [&](int) { b->matmul(x->f32(), m, view, nullptr, y.f32()); }, 10);
      summary("| gemm bf16 11008x4096 m=%-4d %-5s | %8.3f ms | %6.1f TFLOP/s |", m,
              b == &be ? "exact" : "fast", ms, 2.0 * m * n * k / (ms * 1e-3) / 1e12);
    }
  }
  // Causal prefill attention from position 0 (Llama-2-7B heads).
  for (int m : {4096, 16384}) {
    const int heads = 32, hd = 128;
    const int64_t kv_dim = int64_t(heads) * hd;
    auto q = random_f32(size_t(m) * kv_dim, 11);
    auto kk = random_f32(size_t(m) * kv_dim, 12);
    auto vv = random_f32(size_t(m) * kv_dim, 13);
    DeviceMem out(size_t(m) * kv_dim * 4);
    const AttentionShape shape{heads, heads, hd, static_cast<float>(1.0 / std::sqrt(double(hd)))};
    const double ms = time_ms(
        s,
        [&](int) {
          be.attention(q->f32(), m, 0, shape, KvView{kk->f32(), vv->f32(), kv_dim, m}, out.f32());
        },
        2, 3);
    const double flops = 4.0 * heads * hd * (double(m) * (m + 1) / 2);  // causal QK^T + PV
    summary("| attn prefill f32 llama2-7b layer m=%-6d | %8.2f ms | %6.1f TFLOP/s |", m, ms,
            flops / (ms * 1e-3) / 1e12);
  }
  (void)s;
}

// Causal prefill attention of one layer from position 0, the f32 CUDA-core kernel against the
// tensor-core kernel (attention_prefill_tc.cu), at the Llama-2-7B (32/32 heads) and
// Llama-3.1-8B (32/8) shapes; FLOP = 4 m n_kv_avg head_dim heads with n_kv_avg = (m + 1) / 2,
// and the whole prefill's attention estimated as 32 such layers. 128K runs on tensor cores
// only (the f32 kernel needs seconds per layer there), and only for Llama-3.1-8B.
// `fast`: a backend with exact_prefill = false (one f16 MMA per product on tensor cores).
// "f16 rows" runs both paths over f16 rows (the engine's GPU default) as a prefill does it, in
// chunks of 2048 queries (the conversion pass reconverts the whole history per chunk), with the
// planes ("conv") and reading the rows directly ("direct", PrefillAttentionTuning::direct_f16),
// and where available the Hopper wgmma kernel on the direct path ("wgmma",
// PrefillAttentionTuning::wgmma).
void bench_prefill_attention(CudaBackend& be, CudaBackend& fast, bool quick) {
  const cuda::PrefillAttentionTuning saved = cuda::prefill_attention_tuning();
  for (const Shape* sh : {&kLlama2_7B, &kLlama31_8B}) {
    for (int m : {4096, 32768, 131072}) {
      if (m == 131072 && (quick || sh != &kLlama31_8B)) continue;
      if (quick && m != 32768) continue;
      const int64_t q_dim = int64_t(sh->heads) * sh->head_dim;
      const int64_t kv_dim = int64_t(sh->kv_heads) * sh->head_dim;
      auto q = random_f32(size_t(m) * q_dim, 21);
      auto kk = random_f32(size_t(m) * kv_dim, 22);
      auto vv = random_f32(size_t(m) * kv_dim, 23);
      DeviceMem out(size_t(m) * q_dim * 4);
      const AttentionShape shape{sh->heads, sh->kv_heads, sh->head_dim,
                                 static_cast<float>(1.0 / std::sqrt(double(sh->head_dim)))};
      const double flops = 4.0 * sh->heads * sh->head_dim * double(m) * (double(m) + 1) / 2;
      struct Path {
        const char* name;
        bool tc;
        CudaBackend* backend;
      };
      for (const Path& path :
           {Path{"f32", false, &be}, Path{"tc", true, &be}, Path{"tc-fast", true, &fast}}) {
        if (!path.tc && m > 32768) continue;
        cuda::set_prefill_attention_tuning({path.tc});
        CudaBackend& b = *path.backend;
        const int reps = m <= 4096 ? 5 : 1;
        const double ms = time_ms(
            static_cast<cudaStream_t>(b.stream()),
            [&](int) {
              b.attention_prefill(q->f32(), m, 0, shape, KvView{kk->f32(), vv->f32(), kv_dim, m},
                                  out.f32());
            },
            reps, m <= 32768 ? 3 : 1);
        summary(
            "| attn prefill %-11s %-7s m=%-6d | %9.2f ms | %6.1f TFLOP/s | x%d layers %7.2f s |",
            sh->model, path.name, m, ms, flops / (ms * 1e-3) / 1e12, sh->layers,
            ms * sh->layers * 1e-3);
      }
      auto k16 = random_f16(size_t(m) * kv_dim, 24);
      auto v16 = random_f16(size_t(m) * kv_dim, 25);
      KvView rows16{k16->ptr, v16->ptr, kv_dim, m};
      rows16.row_dtype = DType::F16;
      constexpr int kChunk = 2048;
      const bool wgmma = cuda::attention_prefill_wgmma_available();
      for (CudaBackend* b : {&be, &fast}) {
        constexpr const char* kModeNames[] = {"conv", "direct", "wgmma", "ws"};
        for (int mode : {0, 1, 2, 3}) {
          if (mode >= 2 && !wgmma) continue;
          if (mode == 3 && b == &be) continue;  // the warp-specialized variant is fast-path only
          const bool direct = mode > 0;
          cuda::PrefillAttentionTuning t;
          t.direct_f16 = direct;
          t.wgmma = mode >= 2;
          t.wgmma_ws = mode == 3;
          cuda::set_prefill_attention_tuning(t);
          const double ms = time_ms(
              static_cast<cudaStream_t>(b->stream()),
              [&](int) {
                for (int start = 0; start < m; start += kChunk) {
                  const int n = std::min(kChunk, m - start);
                  b->attention_prefill(q->f32() + start * q_dim, n, start, shape, rows16,
                                       out.f32() + start * q_dim);
                }
              },
              1, m <= 32768 ? 3 : 1);
          summary(
              "| attn prefill %-11s f16 rows %-5s %-6s chunks of %d m=%-6d | %9.2f ms | %6.1f "
              "TFLOP/s | x%d layers %7.2f s |",
              sh->model, b == &be ? "exact" : "fast", kModeNames[mode], kChunk, m, ms,
              flops / (ms * 1e-3) / 1e12, sh->layers, ms * sh->layers * 1e-3);
        }
      }
    }
  }
  cuda::set_prefill_attention_tuning(saved);
}

// One decode step of a whole model (random bf16 weights, f32 KV cache of `ctx` positions).
class DecodeStep {
 public:
  DecodeStep(CudaBackend& be, const Shape& sh, int ctx) : be_(be), sh_(sh), ctx_(ctx) {
    const int64_t d = sh.hidden, qd = int64_t(sh.heads) * sh.head_dim;
    const int64_t kvd = int64_t(sh.kv_heads) * sh.head_dim, inter = sh.inter;
    uint64_t seed = 1000;
    auto mat = [&](int64_t rows, int64_t cols, const char* name) {
      mem_.push_back(random_bf16(size_t(rows) * cols, seed++));
      return bf16_view(*mem_.back(), rows, cols, name);
    };
    auto norm = [&](int64_t n, const char* name) {
      mem_.push_back(random_bf16(size_t(n), seed++, 1.0f, 0.1f));
      return bf16_view(*mem_.back(), 1, n, name);
    };
    embed_ = mat(sh.vocab, d, "embed");
    for (int l = 0; l < sh.layers; ++l) {
      LayerWeights L;
      L.attn_norm = norm(d, "attn_norm");
      L.wq = mat(qd, d, "wq");
      L.wk = mat(kvd, d, "wk");
      L.wv = mat(kvd, d, "wv");
      L.wo = mat(d, qd, "wo");
      L.mlp_norm = norm(d, "mlp_norm");
      L.w_gate = mat(inter, d, "gate");
      L.w_up = mat(inter, d, "up");
      L.w_down = mat(d, inter, "down");
      layers_.push_back(L);
      weight_bytes_ += 2.0 * (2 * d + qd * d * 2 + kvd * d * 2 + 3 * inter * d);
    }
    final_norm_ = norm(d, "final_norm");
    lm_head_ = mat(sh.vocab, d, "lm_head");
    weight_bytes_ += 2.0 * (d + sh.vocab * d + d);
    const size_t kv_elems = size_t(sh.layers) * ctx * kvd;
    k_cache_ = random_f32(kv_elems, 77, 1.0f);
    v_cache_ = random_f32(kv_elems, 78, 1.0f);
    kv_bytes_ = 2.0 * 4.0 * double(ctx) * kvd * sh.layers;
    h_ = be.alloc(d);
    x_ = be.alloc(d);
    q_ = be.alloc(qd);
    k_ = be.alloc(kvd);
    v_ = be.alloc(kvd);
    attn_ = be.alloc(qd);
    proj_ = be.alloc(d);
    gate_ = be.alloc(inter);
    up_ = be.alloc(inter);
    logits_ = be.alloc(sh.vocab);
    inv_freq_.resize(sh.head_dim / 2);
    for (int j = 0; j < sh.head_dim / 2; ++j) {
      inv_freq_[j] = static_cast<float>(1.0 / std::pow(10000.0, 2.0 * j / sh.head_dim));
    }
    CUDA_CHECK(cudaDeviceSynchronize());
  }

  double weight_bytes() const { return weight_bytes_; }
  double kv_bytes() const { return kv_bytes_; }

  // The last position of the cache is the token being decoded.
  void run() {
    const int pos = ctx_ - 1;
    const int64_t d = sh_.hidden, kvd = int64_t(sh_.kv_heads) * sh_.head_dim, inter = sh_.inter;
    const AttentionShape shape{sh_.heads, sh_.kv_heads, sh_.head_dim,
                               static_cast<float>(1.0 / std::sqrt(double(sh_.head_dim)))};
    const int32_t id = 42;
    be_.embedding(embed_, &id, 1, h_->data());
    for (int l = 0; l < sh_.layers; ++l) {
      const LayerWeights& L = layers_[l];
      be_.rmsnorm(h_->data(), L.attn_norm, 1, 1e-5f, x_->data());
      be_.matmul(x_->data(), 1, L.wq, nullptr, q_->data());
      be_.matmul(x_->data(), 1, L.wk, nullptr, k_->data());
      be_.matmul(x_->data(), 1, L.wv, nullptr, v_->data());
      be_.rope(q_->data(), 1, sh_.heads, sh_.head_dim, pos, inv_freq_.data());
      be_.rope(k_->data(), 1, sh_.kv_heads, sh_.head_dim, pos, inv_freq_.data());
      float* kl = k_cache_->f32() + size_t(l) * ctx_ * kvd;
      float* vl = v_cache_->f32() + size_t(l) * ctx_ * kvd;
      be_.copy(kl + size_t(pos) * kvd, k_->data(), kvd);
      be_.copy(vl + size_t(pos) * kvd, v_->data(), kvd);
      be_.attention(q_->data(), 1, pos, shape, KvView{kl, vl, kvd, ctx_}, attn_->data());
      be_.matmul(attn_->data(), 1, L.wo, nullptr, proj_->data());
      be_.add(h_->data(), proj_->data(), d);
      be_.rmsnorm(h_->data(), L.mlp_norm, 1, 1e-5f, x_->data());
      be_.matmul(x_->data(), 1, L.w_gate, nullptr, gate_->data());
      be_.matmul(x_->data(), 1, L.w_up, nullptr, up_->data());
      be_.swiglu(gate_->data(), up_->data(), inter, gate_->data());
      be_.matmul(gate_->data(), 1, L.w_down, nullptr, proj_->data());
      be_.add(h_->data(), proj_->data(), d);
    }
    be_.rmsnorm(h_->data(), final_norm_, 1, 1e-5f, x_->data());
    be_.matmul(x_->data(), 1, lm_head_, nullptr, logits_->data());
  }

 private:
  CudaBackend& be_;
  Shape sh_;
  int ctx_;
  std::vector<std::unique_ptr<DeviceMem>> mem_;
  WeightView embed_, final_norm_, lm_head_;
  std::vector<LayerWeights> layers_;
  std::unique_ptr<DeviceMem> k_cache_, v_cache_;  // [layers, ctx, kv_dim] f32
  std::unique_ptr<Buffer> h_, x_, q_, k_, v_, attn_, proj_, gate_, up_, logits_;
  std::vector<float> inv_freq_;
  double weight_bytes_ = 0, kv_bytes_ = 0;
};

void bench_step(CudaBackend& be, bool quick) {
  auto s = static_cast<cudaStream_t>(be.stream());
  struct Config {
    const Shape* shape;
    int ctx;
  };
  // f32 KV: Llama-2-7B at 128K would need 137 GB of cache, so it stops at 32K here.
  const Config configs[] = {{&kLlama2_7B, 4096},
                            {&kLlama2_7B, 32768},
                            {&kLlama31_8B, 4096},
                            {&kLlama31_8B, 32768},
                            {&kLlama31_8B, 131072}};
  // Programmatic dependent launch on (the default) and off, in one process (launch.cuh).
  const bool saved = cuda::pdl_enabled();
  for (const Config& c : configs) {
    if (quick && c.ctx != 32768) continue;
    DecodeStep step(be, *c.shape, c.ctx);
    for (const bool pdl : {true, false}) {
      cuda::set_pdl_enabled(pdl);
      const double eager = time_ms(
          s, [&](int) { step.run(); }, 5, 5);
      // The same step as a CUDA graph (every op is capturable: ids, RoPE frequencies by value).
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      step.run();
      CUDA_CHECK(cudaStreamEndCapture(s, &graph));
      CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      const double graphed = time_ms(
          s, [&](int) { CUDA_CHECK(cudaGraphLaunch(exec, s)); }, 5, 5);
      CUDA_CHECK(cudaGraphExecDestroy(exec));
      CUDA_CHECK(cudaGraphDestroy(graph));
      const double bytes = step.weight_bytes() + step.kv_bytes();
      const double floor_f32 = bytes / kRefBandwidth * 1e3;
      const double floor_f16 = (step.weight_bytes() + step.kv_bytes() / 2) / kRefBandwidth * 1e3;
      size_t free_b = 0, total_b = 0;
      CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
      summary(
          "| decode step %-11s ctx=%-6d pdl %-3s | eager %7.2f ms | graph %7.2f ms | floor "
          "f32-KV %6.2f ms (%4.0f%%) | floor f16-KV %6.2f ms | GPU mem used %5.1f GiB |",
          c.shape->model, c.ctx, pdl ? "on" : "off", eager, graphed, floor_f32,
          100.0 * floor_f32 / graphed, floor_f16, double(total_b - free_b) / (1 << 30));
    }
  }
  cuda::set_pdl_enabled(saved);
}

// ---- 4-bit draft weights and the KV flush (backend/cuda/quant_ops.h) ------------------------

// Median milliseconds per call of `body(i)`, the calls captured as one CUDA graph of `reps`
// calls: the kernels of small calls (a few us) are shorter than their host launch, so eager
// timing would measure the host. `body` must have run eagerly for every i first (uploads).
double time_graph_ms(cudaStream_t s, const std::function<void(int)>& body, int reps,
                     int batches = 7) {
  if (g_profile) return time_ms(s, body, reps, batches);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_CHECK(cudaStreamSynchronize(s));
  CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int r = 0; r < reps; ++r) body(r);
  CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  const double ms =
      time_ms(s, [&](int) { CUDA_CHECK(cudaGraphLaunch(exec, s)); }, 1, batches) / reps;
  CUDA_CHECK(cudaGraphExecDestroy(exec));
  CUDA_CHECK(cudaGraphDestroy(graph));
  return ms;
}

// `copies` host 4-bit weights with the same random codes (distinct host arrays, so each is
// uploaded separately and the rotation reads HBM); scale/min of a +-0.05 weight.
std::vector<QuantizedWeight4> random_q4_copies(int64_t rows, int64_t cols, int copies) {
  QuantizedWeight4 w;
  w.rows = rows;
  w.cols = cols;
  w.group_size = kWeightQuantGroup;
  w.groups_per_row = (cols + kWeightQuantGroup - 1) / kWeightQuantGroup;
  w.row_bytes = (cols + 1) / 2;
  w.codes.resize(static_cast<size_t>(rows * w.row_bytes));
  uint64_t state = 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; i < w.codes.size(); i += 8) {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    std::memcpy(&w.codes[i], &z, std::min<size_t>(8, w.codes.size() - i));
  }
  w.scale.assign(static_cast<size_t>(rows * w.groups_per_row), f32_to_f16(0.1f / 15));
  w.min.assign(w.scale.size(), f32_to_f16(-0.05f));
  w.name = "w4";
  return std::vector<QuantizedWeight4>(static_cast<size_t>(copies), w);
}

struct Q4Mat {
  const char* name;
  int64_t n, k;
};
constexpr Q4Mat kQ4Mats[] = {{"7b q/o 4096x4096", 4096, 4096},
                             {"7b gate/up 11008x4096", 11008, 4096},
                             {"7b down 4096x11008", 4096, 11008},
                             {"7b lm_head 32000x4096", 32000, 4096},
                             {"8b lm_head 128256x4096", 128256, 4096}};

// Bytes of the packed weight (codes + fp16 scale/min) and of x and y.
double q4_bytes(const Q4Mat& mat, int m) {
  const double groups = double((mat.k + kWeightQuantGroup - 1) / kWeightQuantGroup);
  return double(mat.n) * ((mat.k + 1) / 2) + 4.0 * mat.n * groups + 4.0 * m * (mat.k + mat.n);
}

// Calls `timed(mat, weights, x, y)` for every shape with its rotated weights uploaded.
void for_each_q4_shape(CudaBackend& be, bool quick,
                       const std::function<void(const Q4Mat&, std::vector<QuantizedWeight4>&,
                                                float*, float*)>& timed) {
  for (const Q4Mat& mat : kQ4Mats) {
    if (quick && mat.n != 11008 && mat.n != 128256) continue;
    const double wbytes = q4_bytes(mat, 0);
    const int copies =
        g_profile ? 1 : weight_copies(wbytes);
    std::vector<QuantizedWeight4> ws = random_q4_copies(mat.n, mat.k, copies);
    auto x = random_f32(16 * mat.k, 3);
    DeviceMem y(16 * mat.n * 4);
    for (auto& w : ws) be.matmul_q4(x->f32(), 1, w, nullptr, y.f32());  // uploads
    timed(mat, ws, x->f32(), y.f32());
    be.release_weights();
  }
}

void bench_gemv_q4(CudaBackend& be, bool quick) {
  auto s = static_cast<cudaStream_t>(be.stream());
  for_each_q4_shape(be, quick, [&](const Q4Mat& mat, std::vector<QuantizedWeight4>& ws, float* x,
                                   float* y) {
    const int copies = static_cast<int>(ws.size());
    for (int m : {1, 5, 16}) {
      if (quick && m == 16) continue;
      auto body = [&](int i) { be.matmul_q4(x, m, ws[i % copies], nullptr, y); };
      const double graph = time_graph_ms(s, body, 20 * copies);
      const double eager = time_ms(s, body, 20 * copies);
      const double bytes = q4_bytes(mat, m);
      summary("| gemv q4 %-24s m=%-2d | %7.1f us (eager %7.1f) | %6.0f GB/s | %5.1f%% | kernel %d |",
              mat.name, m, graph * 1e3, eager * 1e3, gbps(bytes, graph), pct(bytes, graph),
              cuda::q4_gemv_tuning().kernel != 0 ? cuda::q4_gemv_tuning().kernel
                                                 : cuda::kQ4AutoKernel);
    }
  });
}

// The variants of the q4 kernel side by side (cuda::Q4GemvTuning), graph-timed.
void bench_gemv_q4_variants(CudaBackend& be, bool quick) {
  auto s = static_cast<cudaStream_t>(be.stream());
  // {row_tiles, warps, stages, kernel}: 0 = automatic; stages 4 = the cp.async ring; kernel 1 =
  // tensor cores, 2 = CUDA cores (m <= 8; warps applies), 3 = the wide tensor-core kernel,
  // 4 = the previous automatic choice (CUDA cores for m <= 4), 0 = cuda::kQ4AutoKernel.
  const cuda::Q4GemvTuning variants[] = {
      {1, 0, 0, 1}, {2, 0, 0, 1}, {4, 0, 0, 1}, {0, 2, 0, 1}, {0, 4, 0, 1}, {0, 8, 0, 1},
      {0, 0, 0, 1}, {1, 0, 4, 1}, {2, 0, 4, 1}, {4, 0, 4, 1}, {0, 8, 4, 1}, {0, 0, 4, 1},
      {0, 0, 0, 2}, {0, 2, 0, 2}, {0, 4, 0, 2}, {0, 8, 0, 2}, {1, 0, 0, 3}, {2, 0, 0, 3},
      {4, 0, 0, 3}, {0, 1, 0, 3}, {0, 2, 0, 3}, {0, 4, 0, 3}, {0, 8, 0, 3}, {0, 0, 0, 3},
      {1, 0, 0, 2}, {2, 0, 0, 2}, {4, 0, 0, 2}, {0, 0, 4, 2}, {0, 2, 4, 2}, {0, 4, 4, 2},
      {0, 8, 4, 2}, {1, 0, 4, 2}, {0, 0, 0, 4}, {0, 0, 0, 0}};
  const cuda::Q4GemvTuning saved = cuda::q4_gemv_tuning();
  summary(
      "| gemv-q4 variants (us, %% of 4.24 TB/s) | mma rt1 | mma rt2 | mma rt4 | mma w2 | mma w4 | "
      "mma w8 | mma auto | ring rt1 | ring rt2 | ring rt4 | ring w8 | ring auto | cc auto | "
      "cc w2 | cc w4 | cc w8 | wide rt1 | wide rt2 | wide rt4 | wide w1 | wide w2 | wide w4 | "
      "wide w8 | wide auto | cc rt1 | cc rt2 | cc rt4 | cc ring | cc ring w2 | cc ring w4 | "
      "cc ring w8 | cc ring rt1 | old auto | default (kernel %d) |",
      cuda::kQ4AutoKernel);
  for_each_q4_shape(be, quick, [&](const Q4Mat& mat, std::vector<QuantizedWeight4>& ws, float* x,
                                   float* y) {
    const int copies = static_cast<int>(ws.size());
    for (int m : {1, 2, 4, 5}) {
      std::string line;
      char buf[64];
      for (const cuda::Q4GemvTuning& t : variants) {
        cuda::set_q4_gemv_tuning(t);
        const double ms = time_graph_ms(
            s, [&](int i) { be.matmul_q4(x, m, ws[i % copies], nullptr, y); }, 20 * copies);
        std::snprintf(buf, sizeof buf, " %6.1f %3.0f%% |", ms * 1e3, pct(q4_bytes(mat, m), ms));
        line += buf;
      }
      summary("| gemv-q4 %-24s m=%-2d |%s", mat.name, m, line.c_str());
    }
  });
  cuda::set_q4_gemv_tuning(saved);
}

// One draft layer's 4-bit launches as Model::forward issues them (q/k/v and gate/up as one
// matmul_group each, o and down alone), then the lm_head, for both shapes, m = 1: per launch and
// per layer, the codes reaching the registers through registers (stages 1) or the cp.async
// ring (4), and the default; with `sweep` also every tiles-per-block x warps x path choice. Layers
// rotate over >= kRotateBytes of weights.
// A layer's o -> gate/up -> down, the next layer's q/k/v and its RoPE and f16 K/V rows (heads of
// 128, position 100000) as the model runs them at m = 1 (Backend::output_and_mlp), over rotating
// copies of random weights (cold L2 in a CUDA graph): a draft layer's 4-bit weights (both norms
// deferred), or bf16 ones (an AR layer).
struct LayerRest {
  int64_t hidden, q_rows, kv_rows, inter;
  bool q4;
  double bytes;
  int copies;
  // o, gate, up, down, q, k, v: [matrix][copy]
  std::vector<QuantizedWeight4> w4[7];
  std::vector<std::unique_ptr<DeviceMem>> mem;
  std::vector<WeightView> w[7];
  std::unique_ptr<DeviceMem> x, h, norms;
  WeightView mlp_norm, next_norm;
  DeviceMem proj, rows, g, u, act, q, k, v, k_row, v_row;
  std::vector<float> inv_freq;

  LayerRest(int64_t hidden_, int64_t q_rows_, int64_t kv_rows_, int64_t inter_, bool q4_)
      : hidden(hidden_),
        q_rows(q_rows_),
        kv_rows(kv_rows_),
        inter(inter_),
        q4(q4_),
        x(random_f32(q_rows, 5)),
        h(random_f32(hidden, 6)),
        norms(random_bf16(2 * hidden, 7, 1.0f, 0.3f)),
        mlp_norm(bf16_view(*norms, 1, hidden, "mlp_norm")),
        next_norm(mlp_norm),
        proj(hidden * 4),
        rows(hidden * 4),
        g(inter * 4),
        u(inter * 4),
        act(inter * 4),
        q(q_rows * 4),
        k(kv_rows * 4),
        v(kv_rows * 4),
        k_row(kv_rows * 2),
        v_row(kv_rows * 2),
        inv_freq(64) {
    for (int i = 0; i < 64; ++i) inv_freq[i] = static_cast<float>(std::pow(500000.0, -i / 64.0));
    next_norm.data = static_cast<const uint16_t*>(norms->ptr) + hidden;
    const int64_t shapes[7][2] = {{hidden, q_rows}, {inter, hidden},  {inter, hidden},
                                  {hidden, inter},  {q_rows, hidden}, {kv_rows, hidden},
                                  {kv_rows, hidden}};
    bytes = 0;
    for (const auto& sh : shapes) {
      bytes += q4 ? q4_bytes(Q4Mat{"", sh[0], sh[1]}, 1) : 2.0 * sh[0] * sh[1];
    }
    copies = weight_copies(bytes);
    for (int i = 0; i < 7; ++i) {
      if (q4) {
        w4[i] = random_q4_copies(shapes[i][0], shapes[i][1], copies);
        continue;
      }
      for (int c = 0; c < copies; ++c) {
        mem.push_back(random_bf16(size_t(shapes[i][0]) * shapes[i][1], 40 + mem.size()));
        w[i].push_back(bf16_view(*mem.back(), shapes[i][0], shapes[i][1], "layer"));
      }
    }
  }

  LinearOp op(int i, int c, float* y) const {
    return q4 ? LinearOp{nullptr, &w4[i][c], nullptr, y} : LinearOp{&w[i][c], nullptr, nullptr, y};
  }

  // Call i (weight copy i % copies).
  void run(CudaBackend& be, int i) {
    const int c = i % copies;
    PendingNorm mid{h->f32(), &mlp_norm, 1e-5f, rows.f32(), false};
    PendingNorm next{h->f32(), &next_norm, 1e-5f, rows.f32(), false};
    const LinearOp qkv[] = {op(4, c, q.f32()), op(5, c, k.f32()), op(6, c, v.f32())};
    const KvRowStore kv_rows_out{RopeQK{q.f32(), static_cast<int>(q_rows / 128),
                                        static_cast<int>(kv_rows / 128), 128, inv_freq.data()},
                                 100000, k_row.ptr, v_row.ptr, DType::F16};
    be.output_and_mlp(x->f32(), 1, op(0, c, proj.f32()), mid, op(1, c, g.f32()), op(2, c, u.f32()),
                      act.f32(), op(3, c, proj.f32()), next, qkv, 3, &kv_rows_out);
  }
};

// GemvTuning over the one found at construction with the q/k/v launch taking its rows or not
// (qkv_rows); restore() puts the tuning back.
struct QkvRowsSwitch {
  cuda::GemvTuning saved = cuda::gemv_tuning();

  void set(bool qkv_rows) const {
    cuda::GemvTuning t = saved;
    t.qkv_rows = qkv_rows;
    cuda::set_gemv_tuning(t);
  }
  void restore() const { cuda::set_gemv_tuning(saved); }
};

// A LayerRest as the model's launches (four GEMVs and the RoPE + row store) and as four launches,
// the q/k/v one with the RoPE and rows (bf16: GemvTuning::qkv_rows; 4-bit:
// Q4GemvTuning::qkv_rows).
void bench_output_mlp(CudaBackend& be, const char* name, int64_t hidden, int64_t q_rows,
                      int64_t kv_rows, int64_t inter, bool q4) {
  auto s = static_cast<cudaStream_t>(be.stream());
  LayerRest layer(hidden, q_rows, kv_rows, inter, q4);
  auto body = [&](int i) { layer.run(be, i); };
  for (int i = 0; i < layer.copies; ++i) body(i);  // uploads
  const QkvRowsSwitch rows_switch;
  std::string line;
  char buf[96];
  struct Form {
    const char* name;
    bool qkv_rows;
  };
  const Form forms[] = {{"5 launches", false}, {"qkv w/ rows", true}};
  const cuda::Q4GemvTuning saved4 = cuda::q4_gemv_tuning();
  for (const Form& f : forms) {
    rows_switch.set(f.qkv_rows);
    cuda::Q4GemvTuning t4 = saved4;
    t4.qkv_rows = f.qkv_rows;
    cuda::set_q4_gemv_tuning(t4);
    const double ms = time_graph_ms(s, body, 20 * layer.copies);
    std::snprintf(buf, sizeof buf, " %s %6.1f us %4.1f%% |", f.name, ms * 1e3,
                  pct(layer.bytes, ms));
    line += buf;
  }
  rows_switch.restore();
  cuda::set_q4_gemv_tuning(saved4);
  summary("| %s layer %s o+gate/up+down+next qkv+rows %6.1f MB |%s", q4 ? "w4" : "bf16", name,
          layer.bytes / 1e6, line.c_str());
  be.release_weights();
}

void bench_gemv_q4_layer(CudaBackend& be, bool sweep) {
  auto s = static_cast<cudaStream_t>(be.stream());
  struct Shape {
    const char* name;
    int64_t hidden, q_rows, kv_rows, inter, vocab;
  };
  const Shape shapes[] = {{"7b", 4096, 4096, 4096, 11008, 32000},
                          {"8b", 4096, 4096, 1024, 14336, 128256}};
  for (const Shape& sh : shapes) {
    struct Mat {
      const char* name;
      std::vector<std::pair<int64_t, int64_t>> parts;  // (rows, cols) of one launch
    };
    const Mat mats[] = {
        {"qkv", {{sh.q_rows, sh.hidden}, {sh.kv_rows, sh.hidden}, {sh.kv_rows, sh.hidden}}},
        {"o", {{sh.hidden, sh.q_rows}}},
        {"gate/up", {{sh.inter, sh.hidden}, {sh.inter, sh.hidden}}},
        {"down", {{sh.hidden, sh.inter}}},
        {"lm_head", {{sh.vocab, sh.hidden}}}};
    for (const Mat& mat : mats) {
      double bytes = 0;
      for (auto [rows, cols] : mat.parts) bytes += q4_bytes(Q4Mat{mat.name, rows, cols}, 1);
      const int copies = weight_copies(bytes);
      std::vector<std::vector<QuantizedWeight4>> ws;  // [part][copy]
      for (auto [rows, cols] : mat.parts) ws.push_back(random_q4_copies(rows, cols, copies));
      int64_t max_rows = 0;
      for (auto [rows, cols] : mat.parts) max_rows = std::max(max_rows, rows);
      auto x = random_f32(mat.parts[0].second, 3);
      std::vector<std::unique_ptr<DeviceMem>> ys;
      for (size_t p = 0; p < mat.parts.size(); ++p) {
        ys.push_back(std::make_unique<DeviceMem>(max_rows * 4));
      }
      auto body = [&](int i) {
        LinearOp ops[3];
        for (size_t p = 0; p < mat.parts.size(); ++p) {
          ops[p] = {nullptr, &ws[p][i % copies], nullptr, ys[p]->f32()};
        }
        be.matmul_group(x->f32(), 1, ops, static_cast<int>(mat.parts.size()));
      };
      for (int i = 0; i < copies; ++i) body(i);  // uploads
      std::string line;
      char buf[96];
      const cuda::Q4GemvTuning saved = cuda::q4_gemv_tuning();
      // The CUDA-core kernel (kernel 4: m = 1 is not taken by a persistent kernel) with
      // registers, with the ring, the default, the persistent kernel with one and with two
      // accumulator chains, with biased codes (kernel 7), with subnormal codes and hi / lo as
      // token columns (8; 9: one chain), as 8 with two tiles per ring stage (10).
      for (auto [stages, kernel] :
           {std::pair{1, 4}, {4, 4}, {0, 0}, {0, 5}, {0, 6}, {0, 7}, {0, 8}, {0, 9}, {0, 10}}) {
        cuda::set_q4_gemv_tuning(cuda::Q4GemvTuning{0, 0, stages, kernel});
        const double ms = time_graph_ms(s, body, 20 * copies);
        std::snprintf(buf, sizeof buf, " %6.1f us %4.1f%% |", ms * 1e3, pct(bytes, ms));
        line += buf;
      }
      summary(
          "| w4 layer %s %-8s %6.1f MB | regs / ring / default / persistent / 2 chains / biased / "
          "subnormal / subnormal 1 chain / pairs:%s",
          sh.name, mat.name, bytes / 1e6, line.c_str());
      if (sweep) {  // tiles per block x warps per block x code path of the CUDA-core kernel
        line.clear();
        for (int stages : {1, 4}) {
          for (int rt : {1, 2}) {
            for (int warps : {2, 4, 8}) {
              cuda::set_q4_gemv_tuning(cuda::Q4GemvTuning{rt, warps, stages, 0});
              const double ms = time_graph_ms(s, body, 20 * copies);
              std::snprintf(buf, sizeof buf, " %s rt%d w%d %5.1f |", stages == 4 ? "ring" : "regs",
                            rt, warps, ms * 1e3);
              line += buf;
            }
          }
        }
        summary("| w4 sweep %s %-8s (us) |%s", sh.name, mat.name, line.c_str());
      }
      cuda::set_q4_gemv_tuning(saved);
      be.release_weights();
    }
    bench_output_mlp(be, sh.name, sh.hidden, sh.q_rows, sh.kv_rows, sh.inter, true);
  }
}

// What the launch boundaries between a layer's GEMVs cost (Llama-2-7B shape, 32 layers as one
// CUDA graph, two rotating copies of the layer's weights: cold L2). The same weight bytes as
// (a) the model's four launches per layer (q/k/v group, o, gate/up group, down), (b) two (every
// K = 4096 matrix stacked into one, then down), (c) one (the down matrix's bytes as 11008 more
// rows of the stacked matrix). No dependency between the launches is modelled: (a) - (c) bounds
// what keeping the weight stream going across a layer's matrices could gain. bf16 at m = 1 and
// 4 (AR, verification), 4-bit at m = 1 (draft).
void bench_gemv_chain(CudaBackend& be) {
  auto s = static_cast<cudaStream_t>(be.stream());
  const int64_t H = 4096, I = 11008, stacked = 4 * H + 2 * I, all = stacked + I;
  constexpr int kLayers = 32, kCopies = 2;
  struct Part {
    int64_t rows, cols;
  };
  const std::vector<std::vector<Part>> forms[] = {
      {{{H, H}, {H, H}, {H, H}}, {{H, H}}, {{I, H}, {I, H}}, {{H, I}}},  // (a)
      {{{stacked, H}}, {{H, I}}},                                        // (b)
      {{{all, H}}}};                                                     // (c)
  const char* names[] = {"4 launches", "2 launches", "1 launch"};
  auto x = random_f32(16 * I, 3);
  DeviceMem y(16 * all * 4);
  for (const bool q4 : {false, true}) {
    for (int f = 0; f < 3; ++f) {
      // [copy][launch][part]
      std::vector<std::unique_ptr<DeviceMem>> mem;
      std::vector<std::vector<std::vector<WeightView>>> views(kCopies);
      std::vector<std::vector<std::vector<QuantizedWeight4>>> w4(kCopies);
      double bytes = 0;
      for (int c = 0; c < kCopies; ++c) {
        for (const auto& launch : forms[f]) {
          views[c].emplace_back();
          w4[c].emplace_back();
          for (const Part& p : launch) {
            if (q4) {
              w4[c].back().push_back(random_q4_copies(p.rows, p.cols, 1)[0]);
              if (c == 0) bytes += q4_bytes(Q4Mat{"", p.rows, p.cols}, 0);
            } else {
              mem.push_back(random_bf16(size_t(p.rows) * p.cols, 20 + mem.size()));
              views[c].back().push_back(bf16_view(*mem.back(), p.rows, p.cols, "chain"));
              if (c == 0) bytes += 2.0 * p.rows * p.cols;
            }
          }
        }
      }
      bytes *= kLayers;
      for (const int m : q4 ? std::vector<int>{1} : std::vector<int>{1, 4}) {
        auto layer = [&](int c) {
          for (size_t l = 0; l < forms[f].size(); ++l) {
            LinearOp ops[3];
            const size_t n = forms[f][l].size();
            int64_t row0 = 0;  // each matrix's outputs after the previous one's
            for (size_t p = 0; p < n; ++p) {
              ops[p] = {q4 ? nullptr : &views[c][l][p], q4 ? &w4[c][l][p] : nullptr, nullptr,
                        y.f32() + row0 * m};
              row0 += forms[f][l][p].rows;
            }
            be.matmul_group(x->f32(), m, ops, static_cast<int>(n));
          }
        };
        for (int c = 0; c < kCopies; ++c) layer(c);  // uploads
        const double ms = time_graph_ms(
            s, [&](int i) { layer(i % kCopies); }, kLayers, 5);
        summary("| chain %s m=%-2d %-10s | %7.1f us per layer | %6.0f GB/s | %5.1f%% |",
                q4 ? "q4  " : "bf16", m, names[f], ms * 1e3, gbps(bytes / kLayers, ms),
                pct(bytes / kLayers, ms));
      }
      be.release_weights();
    }
  }
  // A layer with the model's dependencies and norms: its launches, and the q/k/v launch with its
  // rows (GemvTuning::qkv_rows); a draft layer's launches.
  for (const bool q4 : {false, true}) {
    bench_output_mlp(be, "7b", 4096, 4096, 4096, 11008, q4);
    bench_output_mlp(be, "8b", 4096, 4096, 1024, 14336, q4);
  }
}

// quantize_kv at Llama-2-7B's shape (32 kv heads x 128, G = Gv = 128): the flush of one group in
// every layer (32 calls), and one layer's prefill history of 32K tokens (one call).
void bench_quantize_kv(CudaBackend& be) {
  auto s = static_cast<cudaStream_t>(be.stream());
  const int heads = 32, hd = 128, G = 128, layers = 32;
  const int64_t kv_dim = int64_t{heads} * hd;
  struct Planes {
    std::vector<std::unique_ptr<DeviceMem>> mem;
    QuantizedKvPlanesOut out;
    Planes(int64_t capacity, int64_t kv_dim, int hd, int G) {
      const size_t codes = size_t(capacity) * kv_dim / 2;
      const size_t kmeta = size_t(capacity / G) * kv_dim * 2;
      const size_t vmeta = size_t(capacity) * (kv_dim / hd) * 2;
      for (size_t b : {codes, codes, codes, codes, kmeta, kmeta, vmeta, vmeta}) {
        mem.push_back(std::make_unique<DeviceMem>(b));
      }
      out.key_upper = static_cast<uint8_t*>(mem[0]->ptr);
      out.key_lower = static_cast<uint8_t*>(mem[1]->ptr);
      out.value_upper = static_cast<uint8_t*>(mem[2]->ptr);
      out.value_lower = static_cast<uint8_t*>(mem[3]->ptr);
      out.key_scale = static_cast<uint16_t*>(mem[4]->ptr);
      out.key_min = static_cast<uint16_t*>(mem[5]->ptr);
      out.value_scale = static_cast<uint16_t*>(mem[6]->ptr);
      out.value_min = static_cast<uint16_t*>(mem[7]->ptr);
      out.capacity = capacity;
      out.group_size = G;
      out.value_group_size = hd;
    }
  };
  // Bytes of one call over `tokens` rows: K and V read, 4 code planes and metadata written.
  auto bytes = [&](int64_t tokens) {
    return double(tokens) * kv_dim * 4 * 2 + double(tokens) * kv_dim / 2 * 4 +
           double(tokens / G) * kv_dim * 2 * 2 + double(tokens) * heads * 2 * 2;
  };
  {  // the flush: every layer's buffer rows are distinct memory (128 MiB in all, > L2)
    std::vector<std::unique_ptr<DeviceMem>> k, v;
    std::vector<std::unique_ptr<Planes>> planes;
    for (int l = 0; l < layers; ++l) {
      k.push_back(random_f32(size_t(G) * kv_dim, 300 + l));
      v.push_back(random_f32(size_t(G) * kv_dim, 400 + l));
      planes.push_back(std::make_unique<Planes>(4 * G, kv_dim, hd, G));
    }
    auto flush = [&](int i) {
      for (int l = 0; l < layers; ++l) {
        be.quantize_kv(k[l]->f32(), v[l]->f32(), kv_dim, heads, hd, 1 + i % 3, 1,
                       planes[l]->out);
      }
    };
    flush(0);
    const double graph = time_graph_ms(s, flush, 10);
    const double eager = time_ms(s, flush, 10);
    const double b = layers * bytes(G);
    summary(
        "| quantize_kv flush 1 group x 32 layers (7b) | %7.1f us (eager %7.1f) | %6.0f GB/s | "
        "%5.1f%% |",
        graph * 1e3, eager * 1e3, gbps(b, graph), pct(b, graph));
  }
  {  // one layer's prefill history: 32K tokens, 256 groups
    const int64_t tokens = 32768;
    auto k = random_f32(size_t(tokens) * kv_dim, 500);
    auto v = random_f32(size_t(tokens) * kv_dim, 501);
    Planes planes(tokens, kv_dim, hd, G);
    auto call = [&](int) {
      be.quantize_kv(k->f32(), v->f32(), kv_dim, heads, hd, 0, static_cast<int>(tokens / G),
                     planes.out);
    };
    call(0);
    const double ms = time_ms(s, call, 5);
    const double b = bytes(tokens);
    summary("| quantize_kv history 32K tokens x 1 layer (7b) | %7.1f us | %6.0f GB/s | %5.1f%% |",
            ms * 1e3, gbps(b, ms), pct(b, ms));
  }
}

// ---- attention over the hierarchical quantized KV (backend/cuda/attention_quant.h) -----------

__global__ void fill_bytes(uint8_t* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    p[i] = static_cast<uint8_t>(hash32(seed * 0x9E3779B97F4A7C15ull + i));
  }
}

// One layer's quantized history (both planes, Gv = head_dim) and its f32 full-precision rows.
struct QuantLayer {
  std::vector<std::unique_ptr<DeviceMem>> mem;
  QuantizedKvSegment seg;
  float* k = nullptr;  // [fp_rows, heads * hd]
  float* v = nullptr;

  QuantLayer(int heads, int hd, int G, int64_t capacity, int fp_rows, uint64_t seed) {
    const size_t codes = size_t(heads) * capacity * hd / 2;
    const size_t kmeta = size_t(heads) * (capacity / G) * hd, vmeta = size_t(heads) * capacity;
    auto bytes = [&](size_t n) {
      mem.push_back(std::make_unique<DeviceMem>(n));
      fill_bytes<<<1024, 256>>>(static_cast<uint8_t*>(mem.back()->ptr), n, seed++);
      CUDA_CHECK(cudaGetLastError());
      return static_cast<const uint8_t*>(mem.back()->ptr);
    };
    auto halves = [&](size_t n, float lo, float hi) {
      mem.push_back(std::make_unique<DeviceMem>(n * 2));
      fill_f16<<<1024, 256>>>(static_cast<uint16_t*>(mem.back()->ptr), n, seed++, lo, hi);
      CUDA_CHECK(cudaGetLastError());
      return static_cast<const uint16_t*>(mem.back()->ptr);
    };
    seg.key_upper = bytes(codes);
    seg.key_lower = bytes(codes);
    seg.value_upper = bytes(codes);
    seg.value_lower = bytes(codes);
    seg.key_scale = halves(kmeta, 0.005f, 0.05f);
    seg.key_min = halves(kmeta, -1.0f, -0.2f);
    seg.value_scale = halves(vmeta, 0.005f, 0.05f);
    seg.value_min = halves(vmeta, -1.0f, -0.2f);
    seg.capacity = capacity;
    seg.group_size = G;
    seg.value_group_size = hd;
    mem.push_back(random_f32(size_t(fp_rows) * heads * hd, seed++));
    k = mem.back()->f32();
    mem.push_back(random_f32(size_t(fp_rows) * heads * hd, seed++));
    v = mem.back()->f32();
  }
};

// One layer's attention over the hierarchical KV (G = Gv = 128): the draft (INT4 view, m = 1) and
// the target (INT8, m = 4, 5, 7, 9) at 4K, 32K and 128K positions, as a captured step runs it
// (graph) and eagerly. Bytes: what the call needs (kv.read_bytes: codes, metadata, f32 rows). At
// 32K the CUDA-core path (the fallback) is timed too, and the tensor-core path planned for 2 and 4
// waves of blocks (QuantAttentionTuning::split_factor; also with --quick).
void bench_quant_attention(CudaBackend& be, bool quick) {
  auto s = static_cast<cudaStream_t>(be.stream());
  const int G = 128, m_max = 9;
  const cuda::QuantAttentionTuning saved = cuda::quant_attention_tuning();
  // QS_QUANTKV_SHAPE / QS_QUANTKV_CTX: one shape (its model name) / one context only (the
  // context also under --quick), e.g. for ncu_stalls.sh to reach one call's kernels.
  const char* only_shape = std::getenv("QS_QUANTKV_SHAPE");
  const char* only_ctx = std::getenv("QS_QUANTKV_CTX");
  for (const Shape* sh : {&kLlama2_7B, &kLlama31_8B}) {
    if (only_shape != nullptr && std::strcmp(only_shape, sh->model) != 0) continue;
    const int hd = sh->head_dim, kv_heads = sh->kv_heads;
    const AttentionShape shape{sh->heads, kv_heads, hd,
                               static_cast<float>(1.0 / std::sqrt(double(hd)))};
    for (int ctx : {4096, 32768, 131072}) {
      if (only_ctx != nullptr ? std::atoi(only_ctx) != ctx : quick && ctx != 32768) continue;
      const int fp_base = quant_boundary(ctx - m_max, G);
      const int fp_rows = ctx - fp_base;
      const double layer_bytes = double(kv_heads) * ctx * (2.0 * hd + 4.0 + 4.0 * hd / G);
      const int copies = std::max(1, static_cast<int>(std::ceil(kRotateBytes / layer_bytes)));
      std::vector<std::unique_ptr<QuantLayer>> layers;
      for (int c = 0; c < copies; ++c) {
        layers.push_back(std::make_unique<QuantLayer>(kv_heads, hd, G, ctx, fp_rows, 500 + 16 * c));
      }
      auto q = random_f32(size_t(m_max) * sh->heads * hd, 7);
      DeviceMem out(size_t(m_max) * sh->heads * hd * 4);
      struct Run {
        const char* what;
        bool int8;
        int m;
      };
      for (const Run& r :
           {Run{"draft int4", false, 1}, Run{"target int8", true, 4}, Run{"target int8", true, 5},
            Run{"target int8", true, 7}, Run{"target int8", true, 9}}) {
        // Variants (label suffix): the default plan (the register-direct path where it applies),
        // the CUDA-core path, 2 and 4 waves of blocks; the cp.async-ring tensor-core path
        // ("ring", the previous default) with its pipeline shapes (cN = 32-token sub-chunks per
        // warp per stage, sN = stages; 0 = the default of attention_quant.h); "exact N": the
        // draft view with f16 hi + lo operands (draft_f16 off) at register cap N; "no-pf [N]":
        // the f16-operand draft without its register prefetch of the next sub-chunk ("pf": with
        // it); "N tile(s)/warp": the INT8 view's 8-query tiles per warp on the direct path;
        // "dring [N]": the direct path's per-warp cp.async ring forced on ("no-ring": off; both
        // also at 4K and 128K; "dring2": with two tiles per warp); "8 cols": the MHA draft's
        // 8-column loop instead of its one-query kernel (single_query off; also at 4K and 128K);
        // "int8 f16": the INT8 view's operands in f16 alone (int8_f16; also at 4K and 128K);
        // "even [168]": the even-column kernels for up to 4 query vectors per kv head
        // (even_columns: the draft's; int8_even_columns: the INT8 view's at 192 registers), "8
        // cols all" without either (also at 4K and 128K).
        struct Variant {
          const char* label;  // "": the default plan
          cuda::QuantAttentionTuning tuning;
        };
        // Each variant changes the process-wide tuning (QS_DRAFT_REG_PREFETCH, QS_DIRECT_TILES:
        // what --profile, which runs the default rows only, then profiles).
        auto variant = [&saved](const char* label, auto set) {
          Variant v{label, saved};
          set(v.tuning);
          return v;
        };
        using T = cuda::QuantAttentionTuning;
        const Variant variants[] = {
            variant("", [](T&) {}),
            variant(" cuda-cores", [](T& t) { t.tensor_cores = false; }),
            variant(" x2 waves", [](T& t) { t.split_factor = 2; }),
            variant(" x4 waves", [](T& t) { t.split_factor = 4; }),
            variant(" ring", [](T& t) { t.direct = false; }),
            variant(" ring c2 s2", [](T& t) { t.direct = false, t.chunk_subs = 2, t.stages = 2; }),
            variant(" regs 192", [](T& t) { t.direct_regs = 192; }),
            variant(" regs 168", [](T& t) { t.direct_regs = 168; }),
            variant(" exact 192", [](T& t) { t.draft_f16 = false, t.direct_regs = 192; }),
            variant(" exact 168", [](T& t) { t.draft_f16 = false, t.direct_regs = 168; }),
            variant(" ring exact", [](T& t) { t.direct = false, t.draft_f16 = false; }),
            variant(" no-pf", [](T& t) { t.draft_reg_prefetch = false; }),
            variant(" no-pf 192", [](T& t) { t.draft_reg_prefetch = false, t.direct_regs = 192; }),
            variant(" no-pf 168", [](T& t) { t.draft_reg_prefetch = false, t.direct_regs = 168; }),
            variant(" no-pf 128", [](T& t) { t.draft_reg_prefetch = false, t.direct_regs = 128; }),
            variant(" pf", [](T& t) { t.draft_reg_prefetch = true; }),
            variant(" 1 tile/warp", [](T& t) { t.direct_tiles = 1; }),
            variant(" 2 tiles/warp", [](T& t) { t.direct_tiles = 2; }),
            variant(" no-ring", [](T& t) { t.direct_ring = 0; }),
            variant(" no-ring 168", [](T& t) { t.direct_ring = 0, t.direct_regs = 168; }),
            variant(" dring", [](T& t) { t.direct_ring = 1, t.direct_tiles = 1; }),
            variant(" dring 192",
                    [](T& t) { t.direct_ring = 1, t.direct_tiles = 1, t.direct_regs = 192; }),
            variant(" dring 168",
                    [](T& t) { t.direct_ring = 1, t.direct_tiles = 1, t.direct_regs = 168; }),
            variant(" dring 128",
                    [](T& t) { t.direct_ring = 1, t.direct_tiles = 1, t.direct_regs = 128; }),
            variant(" dring2", [](T& t) { t.direct_ring = 1, t.direct_tiles = 2; }),
            variant(" 8 cols", [](T& t) { t.single_query = t.even_columns = false; }),
            variant(" even", [](T& t) { t.even_columns = t.int8_even_columns = true; }),
            variant(" 8 cols all", [](T& t) { t.even_columns = t.int8_even_columns = false; }),
            variant(" even 168", [](T& t) { t.even_columns = true, t.direct_regs = 168; }),
            variant(" int8 f16", [](T& t) { t.int8_f16 = true; })};
        for (const Variant& var : variants) {
          // The draft view's switches.
          if (r.int8 && (var.tuning.draft_f16 != saved.draft_f16 ||
                         var.tuning.draft_reg_prefetch != saved.draft_reg_prefetch)) {
            continue;
          }
          // The INT8 view's switch.
          const bool ring = var.tuning.direct_ring != saved.direct_ring;
          const bool even = var.tuning.even_columns != saved.even_columns ||
                            var.tuning.int8_even_columns != saved.int8_even_columns;
          const bool cols = var.tuning.single_query != saved.single_query || even;
          if (r.int8 && (var.tuning.single_query != saved.single_query ||
                         (even && var.tuning.direct_regs != 0))) {
            continue;
          }
          if (!r.int8 && !ring && var.tuning.direct_tiles != saved.direct_tiles) continue;
          if (!r.int8 && var.tuning.direct_tiles == 2) continue;  // one tile for the INT4 view
          const bool int8_f16 = var.tuning.int8_f16 != saved.int8_f16;
          if (int8_f16 && !r.int8) continue;
          const bool is_default = var.label[0] == '\0';
          // The ring, the light draft's 128-register cap and the extra waves of blocks also run
          // at 4K and 128K.
          const bool every_ctx = ring || cols || int8_f16 || var.tuning.direct_regs == 128 ||
                                 var.tuning.split_factor > 1;
          if (!is_default && (g_profile || (ctx != 32768 && !every_ctx))) continue;
          const cuda::QuantAttentionTuning& tuning = var.tuning;
          cuda::set_quant_attention_tuning(tuning);
          std::vector<QuantizedKvSegment> segs;
          for (const auto& l : layers) {
            segs.push_back(l->seg);
            segs.back().int8 = r.int8;
            if (!r.int8) segs.back().key_lower = segs.back().value_lower = nullptr;
          }
          auto call = [&](int i, KvReadBytes* rb) {
            const int c = i % copies;
            KvView kv{layers[c]->k, layers[c]->v, int64_t{kv_heads} * hd, ctx};
            kv.fp_base = fp_base;
            kv.quantized = &segs[c];
            kv.read_bytes = rb;
            be.attention(q->f32(), r.m, ctx - r.m, shape, kv, out.f32());
          };
          KvReadBytes rb;
          call(0, &rb);
          for (int i = 1; i < copies && !g_profile; ++i) call(i, nullptr);  // scratch, eagerly
          const int reps = std::max(10, 2 * copies);
          const double eager = time_ms(s, [&](int i) { call(i, nullptr); }, reps);
          const double graph = time_graph_ms(s, [&](int i) { call(i, nullptr); }, reps);
          const double bytes = double(rb.upper + rb.lower + rb.meta + rb.fp);
          summary("| attn-q %-11s ctx=%-6d %-11s m=%d%-11s | %8.1f us (eager %8.1f) | %7.1f MB | "
                  "%6.0f GB/s | %5.1f%% |",
                  sh->model, ctx, r.what, r.m, var.label, graph * 1e3,
                  eager * 1e3, bytes / 1e6, gbps(bytes, graph), pct(bytes, graph));
        }
      }
    }
  }
  cuda::set_quant_attention_tuning(saved);
}

// A block's quantized-phase cycles from its timeline (attention_quant.h's slots): phase 4 (the
// direct path), else phases 2..5.
double quantized_cycles(const unsigned long long* w) {
  return w[2 + 4] != 0 ? double(w[2 + 4] - w[2 + 3]) : double(w[2 + 5] - w[2 + 2]);
}

// Pearson's correlation of two equally long series (0 where either is constant).
double correlation(const std::vector<double>& a, const std::vector<double>& b) {
  const double n = static_cast<double>(a.size());
  double ma = 0, mb = 0;
  for (size_t i = 0; i < a.size(); ++i) ma += a[i] / n, mb += b[i] / n;
  double sab = 0, saa = 0, sbb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    sab += (a[i] - ma) * (b[i] - mb), saa += (a[i] - ma) * (a[i] - ma);
    sbb += (b[i] - mb) * (b[i] - mb);
  }
  return saa > 0 && sbb > 0 ? sab / std::sqrt(saa * sbb) : 0.0;
}

// Whether the quantized phase's slow blocks are slow again in another call on the same bytes:
// `stamped(out)` runs a stamped call and copies its timeline; two such calls give each block's
// quantized-phase cycles twice. Correlated by block: the lateness goes with the block's work (its
// head, its positions, where its bytes lie); by SM (the mean of the blocks each SM ran): with the
// SM; neither: it is the run's. Also how many of the first call's slowest tenth are again.
std::string lateness_line(const char* model, int ctx, int m,
                          const std::function<void(std::vector<unsigned long long>&)>& stamped) {
  constexpr int W = cuda::kQuantTimelineSlots;
  std::vector<unsigned long long> h[2];
  for (auto& run : h) stamped(run);
  const size_t blocks = h[0].size() / W;
  std::vector<double> t[2];
  std::map<unsigned long long, double> sm_sum[2], sm_n[2];
  for (int r = 0; r < 2; ++r) {
    for (size_t b = 0; b < blocks; ++b) {
      const unsigned long long* w = &h[r][b * W];
      t[r].push_back(quantized_cycles(w));
      sm_sum[r][w[9]] += t[r].back();
      sm_n[r][w[9]] += 1;
    }
  }
  std::vector<double> sm_mean[2];
  for (const auto& [sm, sum] : sm_sum[0]) {
    if (sm_n[1].count(sm) == 0) continue;
    sm_mean[0].push_back(sum / sm_n[0][sm]);
    sm_mean[1].push_back(sm_sum[1][sm] / sm_n[1][sm]);
  }
  const size_t tenth = std::max<size_t>(1, blocks / 10);
  auto slowest = [&](const std::vector<double>& v) {
    std::vector<size_t> idx(v.size());
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
    std::partial_sort(idx.begin(), idx.begin() + tenth, idx.end(),
                      [&](size_t a, size_t b) { return v[a] > v[b]; });
    return std::vector<size_t>(idx.begin(), idx.begin() + tenth);
  };
  const auto s0 = slowest(t[0]), s1 = slowest(t[1]);
  size_t again = 0;
  for (size_t b : s0) again += std::count(s1.begin(), s1.end(), b);
  char buf[200];
  std::snprintf(buf, sizeof buf,
                "| qtime %-11s ctx=%-6d m=%d | lateness over two calls: by block r = %.2f, by SM "
                "r = %.2f (%zu SMs), slowest tenth again %zu of %zu |",
                model, ctx, m, correlation(t[0], t[1]), correlation(sm_mean[0], sm_mean[1]),
                sm_mean[0].size(), again, tenth);
  return buf;
}

// Where one quantized-attention call's time goes, block by block (QuantAttentionTuning::timeline;
// attention_quant.h names the phases): the default plan of the quantkv section's draft (m = 1)
// and target (m = 4) calls at 4K / 32K / 128K, timed as a graph of calls without and with the
// stamps, then the last call's stamps: its span (first block in to last block out), the blocks'
// entry skew, and each phase's median / max over the blocks (clock64 cycles at the SM clock the
// blocks ran at, from %globaltimer over the same blocks). What the call costs beyond its span is
// the combine kernel and the launch gaps.
void bench_quant_timeline(CudaBackend& be) {
  auto s = static_cast<cudaStream_t>(be.stream());
  const int G = 128, m_max = 9;
  const cuda::QuantAttentionTuning saved = cuda::quant_attention_tuning();
  int num_sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, 0));
  constexpr int W = cuda::kQuantTimelineSlots;
  for (const Shape* sh : {&kLlama2_7B, &kLlama31_8B}) {
    const int hd = sh->head_dim, kv_heads = sh->kv_heads;
    const AttentionShape shape{sh->heads, kv_heads, hd,
                               static_cast<float>(1.0 / std::sqrt(double(hd)))};
    for (int ctx : {4096, 32768, 131072}) {
      const int fp_base = quant_boundary(ctx - m_max, G);
      const double layer_bytes = double(kv_heads) * ctx * (2.0 * hd + 4.0 + 4.0 * hd / G);
      const int copies = std::max(1, static_cast<int>(std::ceil(kRotateBytes / layer_bytes)));
      std::vector<std::unique_ptr<QuantLayer>> layers;
      for (int c = 0; c < copies; ++c) {
        layers.push_back(
            std::make_unique<QuantLayer>(kv_heads, hd, G, ctx, ctx - fp_base, 900 + 16 * c));
      }
      auto q = random_f32(size_t(m_max) * sh->heads * hd, 7);
      DeviceMem out(size_t(m_max) * sh->heads * hd * 4);
      for (const int m : {1, 4}) {
        const bool int8 = m > 1;
        std::vector<QuantizedKvSegment> segs;
        for (const auto& l : layers) {
          segs.push_back(l->seg);
          segs.back().int8 = int8;
          if (!int8) segs.back().key_lower = segs.back().value_lower = nullptr;
        }
        auto view = [&](int c) {
          KvView kv{layers[c]->k, layers[c]->v, int64_t{kv_heads} * hd, ctx};
          kv.fp_base = fp_base;
          kv.quantized = &segs[c];
          return kv;
        };
        auto call = [&](int i) {
          be.attention(q->f32(), m, ctx - m, shape, view(i % copies), out.f32());
        };
        const KvView kv0 = view(0);
        const cuda::QuantAttentionPlan plan = cuda::plan_attention_quant(
            cuda::make_quant_attention_args(q->f32(), m, ctx - m, shape, kv0, out.f32()), num_sms);
        const int64_t blocks = int64_t{plan.splits} * kv_heads * plan.query_groups;
        for (int i = 0; i < copies; ++i) call(i);
        const int reps = std::max(10, 2 * copies);
        const double plain = time_graph_ms(s, call, reps);
        DeviceMem stamps(size_t(blocks) * W * 8);
        CUDA_CHECK(cudaMemset(stamps.ptr, 0, stamps.bytes));
        cuda::QuantAttentionTuning t = saved;
        t.timeline = static_cast<unsigned long long*>(stamps.ptr);
        cuda::set_quant_attention_tuning(t);
        const double stamped = time_graph_ms(s, call, reps);
        cuda::set_quant_attention_tuning(saved);
        std::vector<unsigned long long> h(size_t(blocks) * W);
        CUDA_CHECK(cudaMemcpy(h.data(), stamps.ptr, stamps.bytes, cudaMemcpyDeviceToHost));
        unsigned long long first_in = ~0ull, last_out = 0;
        double ns_sum = 0, cyc_sum = 0;
        for (int64_t b = 0; b < blocks; ++b) {
          const unsigned long long* w = &h[b * W];
          first_in = std::min(first_in, w[0]);
          last_out = std::max(last_out, w[1]);
          ns_sum += double(w[1] - w[0]);
          cyc_sum += double(w[2 + 6] - w[2]);
        }
        const double ns_per_cycle = cyc_sum > 0 ? ns_sum / cyc_sum : 0.0;
        // Median and max over the blocks, us.
        auto stat = [&](const std::function<double(const unsigned long long*)>& f) {
          std::vector<double> v;
          for (int64_t b = 0; b < blocks; ++b) v.push_back(f(&h[b * W]) * 1e-3);
          std::sort(v.begin(), v.end());
          char buf[48];
          std::snprintf(buf, sizeof buf, "%5.1f/%5.1f", v[v.size() / 2], v.back());
          return std::string(buf);
        };
        // Phase i ends at slot 2 + i; a phase a path does not stamp (3, 4 off the direct path)
        // reads 0 and is folded into the next one.
        auto phase = [&](int i) {
          return stat([&, i](const unsigned long long* w) {
            if (w[2 + i] == 0) return 0.0;
            int j = i - 1;
            while (j > 0 && w[2 + j] == 0) --j;
            return double(w[2 + i] - w[2 + j]) * ns_per_cycle;
          });
        };
        // When the blocks leave (us after the first entry): percentiles and the last. What a
        // balanced tail could save is bounded by the exits' spread past the median.
        std::vector<double> exits;
        for (int64_t b = 0; b < blocks; ++b)
          exits.push_back(double(h[b * W + 1] - first_in) * 1e-3);
        std::sort(exits.begin(), exits.end());
        summary(
            "| qtime %-11s ctx=%-6d m=%d | exits p50 %6.1f | p90 %6.1f | p97 %6.1f | last %6.1f us "
            "|",
            sh->model, ctx, m, exits[exits.size() / 2], exits[exits.size() * 9 / 10],
            exits[exits.size() * 97 / 100], exits.back());
        summary(
            "| qtime %-11s ctx=%-6d m=%d | call %6.1f us (stamped %6.1f) | %5lld blocks | span "
            "%6.1f | entry %s | wait %s | q %s | fp %s | quant %s | barrier %s | merge %s | "
            "%.2f GHz |",
            sh->model, ctx, m, plain * 1e3, stamped * 1e3, static_cast<long long>(blocks),
            double(last_out - first_in) * 1e-3,
            stat([&](const unsigned long long* w) { return double(w[0] - first_in); }).c_str(),
            phase(1).c_str(), phase(2).c_str(), phase(3).c_str(), phase(4).c_str(),
            phase(5).c_str(), phase(6).c_str(), ns_per_cycle > 0 ? 1.0 / ns_per_cycle : 0.0);
        // The quantized phase (4, else 2..5) by how many of the call's blocks shared the block's
        // SM: is the tail the SMs with more blocks?
        std::map<unsigned long long, int> per_sm;
        for (int64_t b = 0; b < blocks; ++b) ++per_sm[h[b * W + 9]];
        std::map<int, std::vector<double>> by_load;
        for (int64_t b = 0; b < blocks; ++b) {
          const unsigned long long* w = &h[b * W];
          by_load[per_sm[w[9]]].push_back(quantized_cycles(w) * ns_per_cycle * 1e-3);
        }
        std::string loads;
        for (auto& [k, v] : by_load) {
          std::sort(v.begin(), v.end());
          char buf[96];
          std::snprintf(buf, sizeof buf, " %d/SM: %zu blocks %.1f/%.1f |", k, v.size(),
                        v[v.size() / 2], v.back());
          loads += buf;
        }
        summary("| qtime %-11s ctx=%-6d m=%d | %zu SMs | quantized us by blocks per SM:%s",
                sh->model, ctx, m, per_sm.size(), loads.c_str());
        summary("%s", lateness_line(sh->model, ctx, m, [&](std::vector<unsigned long long>& out) {
                        cuda::set_quant_attention_tuning(t);
                        call(copies > 1 ? 1 : 0);  // another copy's bytes first: call(0) cold in L2
                        call(0);
                        cuda::set_quant_attention_tuning(saved);
                        CUDA_CHECK(cudaStreamSynchronize(s));
                        out.resize(h.size());
                        CUDA_CHECK(cudaMemcpy(out.data(), stamps.ptr, stamps.bytes,
                                              cudaMemcpyDeviceToHost));
                      }).c_str());
      }
    }
  }
}

// Sampling where the logits are (sampling.cu): one row (a decode step) and a gamma = 4 verdict,
// kernel time (events) and the backend call with its copy back and synchronization.
void bench_sampling(CudaBackend& be) {
  auto s = static_cast<cudaStream_t>(be.stream());
  struct Setting {
    const char* name;
    SamplingParams p;
  };
  std::vector<Setting> settings(3);
  settings[0].name = "T 1";
  settings[0].p.temperature = 1.0f;
  settings[1].name = "T 0.8 top-p 0.95";
  settings[1].p.temperature = 0.8f;
  settings[1].p.top_p = 0.95f;
  settings[2].name = "T 0.8 k 40 p 0.95 min-p .05";
  settings[2].p = settings[1].p;
  settings[2].p.top_k = 40;
  settings[2].p.min_p = 0.05f;
  for (int n : {32000, 128256}) {
    const int rows = 5;
    std::vector<float> host(static_cast<size_t>(rows) * n);
    uint64_t state = 12345;
    for (float& v : host) {  // roughly normal logits, scale 3 (a sum of uniforms)
      double acc = 0.0;
      for (int k = 0; k < 4; ++k) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        acc += static_cast<double>(state >> 11) * 0x1.0p-53;
      }
      v = static_cast<float>((acc - 2.0) * 3.0 * 1.7320508);
    }
    auto logits = be.alloc(host.size());
    auto probs = be.alloc(host.size());
    be.from_host(host.data(), logits->data(), host.size());
    DeviceMem out(64);
    for (const Setting& st : settings) {
      cuda::SampleSpec spec{st.p.temperature, st.p.top_p, st.p.min_p, st.p.top_k};
      cuda::SampleDraws draws{};
      for (int r = 0; r < rows; ++r) draws.u[r] = 0.3 + 0.1 * r;
      const double k1 = time_ms(
          s,
          [&](int) {
            cuda::launch_sample_rows(logits->data(), 1, n, spec, draws, probs->data(),
                                     static_cast<int32_t*>(out.ptr), s);
          },
          50);
      const double k5 = time_ms(
          s,
          [&](int) {
            cuda::launch_sample_rows(logits->data(), rows, n, spec, draws, probs->data(), nullptr,
                                     s);
          },
          50);
      int32_t token = 0;
      const double call = time_ms(
          s, [&](int) { be.sample_rows(logits->data(), 1, n, st.p, draws.u, nullptr, &token); },
          50);
      std::vector<int32_t> g(rows - 1, 1);
      const double verdict = time_ms(
          s,
          [&](int) {
            be.speculative_verdict(logits->data(), probs->data(), rows - 1, n, st.p, g.data(),
                                   draws.u, true);
          },
          50);
      summary(
          "| sample vocab %6d %-27s | 1 row %7.1f us | 5 rows %7.1f us | call %7.1f us | "
          "verdict g=4 %7.1f us |",
          n, st.name, 1e3 * k1, 1e3 * k5, 1e3 * call, 1e3 * verdict);
    }
  }
}

}  // namespace
}  // namespace qs

int main(int argc, char** argv) {
  using namespace qs;
  std::string sections =
      "copy,read,gemv,tune,attn,prefill,prefattn,step,w4mm,w4var,w4layer,kvflush,quantkv,sample";
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--sections") && i + 1 < argc) {
      sections = argv[++i];
    } else if (!std::strcmp(argv[i], "--quick")) {
      quick = true;
    } else if (!std::strcmp(argv[i], "--profile")) {
      g_profile = true;
    } else {
      std::fprintf(
          stderr,
          "usage: bench_ops [--sections copy,read,gemv,tune,attn,prefill,prefattn,step,w4mm,"
          "w4var,w4layer,w4sweep,kvflush,quantkv,qtime,sample,chain] [--quick] "
          "[--profile]\n");
      return 2;
    }
  }
  auto be = CudaBackend::create();
  if (!be.ok()) {
    std::fprintf(stderr, "bench_ops: %s\n", be.error().message.c_str());
    return 1;
  }
  CudaBackendOptions fast_opt;
  fast_opt.exact_prefill = false;
  auto fast = CudaBackend::create(fast_opt);
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %d MiB, %.1f GiB\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20, double(prop.totalGlobalMem) / (1 << 30));
  auto has = [&](const char* s) { return sections.find(s) != std::string::npos; };
  if (g_l2_hot) {
    summary(
        "| QS_BENCH_L2_HOT=1: the weight sections read one L2-resident copy of their weights |");
  }
  // Each section frees its device weights; release_weights() drops their cache entries.
  if (has("copy")) bench_copy(**be);
  if (has("read")) {
    auto s = static_cast<cudaStream_t>((*be)->stream());
    bench::bench_read_ceiling(
        s,
        [s](const std::function<void()>& launch) {
          return time_ms(
              s, [&](int) { launch(); }, 1);
        },
        [](const char* what, double ms, double bytes) {
          summary("| read %-44s | %8.3f ms | %6.0f GB/s | %5.1f%% |", what, ms, gbps(bytes, ms),
                  pct(bytes, ms));
        });
  }
  if (has("gemv")) bench_gemv(**be, quick);
  if (has("tune")) bench_gemv_tuning(**be);
  (*be)->release_weights();
  if (has("attn")) bench_attention(**be, quick);
  if (has("prefill")) bench_prefill(**be, **fast);
  if (has("prefattn")) bench_prefill_attention(**be, **fast, quick);
  (*be)->release_weights();
  (*fast)->release_weights();
  if (has("step")) bench_step(**be, quick);
  if (has("w4mm")) bench_gemv_q4(**be, quick);
  if (has("w4var")) bench_gemv_q4_variants(**be, quick);
  if (has("w4layer") || has("w4sweep")) bench_gemv_q4_layer(**be, has("w4sweep"));
  if (has("chain")) bench_gemv_chain(**be);
  if (has("kvflush")) bench_quantize_kv(**be);
  if (has("quantkv")) bench_quant_attention(**be, quick);
  if (has("qtime")) bench_quant_timeline(**be);
  if (has("sample")) bench_sampling(**be);
  std::printf("\n== summary (%s) ==\n", prop.name);
  for (const std::string& line : g_summary) std::printf("%s\n", line.c_str());
  return 0;
}
