// Sampling where the logits are (Backend::sample_rows / speculative_verdict): core/sampling.h's
// rule on the GPU, so only tokens travel back to the host. A row is worked on by a cluster of
// kCluster blocks of 1024 threads (one per SM), each owning a contiguous part of it; reductions
// combine the blocks' values through distributed shared memory, in rank order, so every block
// computes the same result.
//
// token_probabilities without a sort: the k-th largest logit (top-k) and the top-p boundary are
// found by a digit descent over the logits' order-preserving 32-bit keys, four bits per pass: a
// pass counts (top-k) or sums the probability mass (top-p, in double) of the tokens in each of
// the 16 sub-ranges of the current prefix and keeps the highest sub-range where the count / mass
// from the top reaches k / top_p. After eight passes the prefix is the boundary key c: every
// token above it is kept, and tokens whose logit equals c are kept in index order while the mass
// before them is below top_p, as the host's stable order does. Sums run in a different order
// than the host's (parallel, not sorted-sequential): the distributions agree to rounding.
//
// Draws (sample_at): the row in index order as steps (1024 per block part); the steps' sums are
// scanned in order (each prefix is the previous one plus a non-negative sum, so the intervals
// tile [0, total) exactly, also across the cluster's blocks), and the owner of the step holding
// u * total walks it.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/launch.cuh"

namespace qs::cuda {

namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kCluster = 8;  // blocks (SMs) per row
constexpr int kBins = 16;    // digits of 4 bits: 8 passes over a 32-bit key
constexpr size_t kHistBytes = sizeof(double) * kBins * kThreads;  // 128 KB of per-thread bins

__device__ __forceinline__ int lane_id() {
  return threadIdx.x & 31;
}
__device__ __forceinline__ int warp_id() {
  return threadIdx.x >> 5;
}

// Larger float, larger key (sign-magnitude to unsigned order; NaN above +inf). -0 and +0 are
// equal logits on the host, so -0 + 0 = +0 gives them one key.
__device__ __forceinline__ uint32_t order_key(float v) {
  const uint32_t b = __float_as_uint(v + 0.0f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// op over a warp (a butterfly: the same value in every lane, in the same order for every call).
template <typename T, typename Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// op over the block (kThreads threads), the same value in every thread; the scratch is reused by
// the next call only after the trailing barrier.
template <typename T, typename Op>
__device__ T block_reduce(T v, Op op) {
  __shared__ T part[kWarps];
  __shared__ T result;
  v = warp_reduce(v, op);
  if (lane_id() == 0) part[warp_id()] = v;
  __syncthreads();
  if (warp_id() == 0) {
    const T w = warp_reduce(part[lane_id()], op);
    if (lane_id() == 0) result = w;
  }
  __syncthreads();
  const T r = result;
  __syncthreads();
  return r;
}

struct Add {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
  __device__ int operator()(int a, int b) const { return max(a, b); }
};

// ---- the cluster: every block's value combined in rank order, the same result in every thread
// of every block. Two cluster barriers: after the slots are written, and after they are read
// (so that the next call may overwrite them).

template <typename T, typename Op>
__device__ T cluster_combine(T v, Op op) {
  __shared__ T slot, result;
  cg::cluster_group cluster = cg::this_cluster();
  if (threadIdx.x == 0) slot = v;
  cluster.sync();
  if (threadIdx.x == 0) {
    T r = *cluster.map_shared_rank(&slot, 0);
    for (unsigned b = 1; b < cluster.num_blocks(); ++b)
      r = op(r, *cluster.map_shared_rank(&slot, b));
    result = r;
  }
  cluster.sync();
  return result;
}

__device__ double cluster_sum(double v) {
  return cluster_combine(block_reduce(v, Add{}), Add{});
}
__device__ float cluster_max(float v) {
  return cluster_combine(block_reduce(v, Max{}), Max{});
}
__device__ int cluster_max_int(int v) {
  return cluster_combine(block_reduce(v, Max{}), Max{});
}

// This block's part of a row of n: [lo, lo + n), lo a multiple of 4 (so a 16-byte aligned row
// stays aligned), possibly empty.
struct Part {
  int lo, n;
};
__device__ __forceinline__ Part my_part(int n) {
  const int size = cg::this_cluster().num_blocks();
  const int chunk = ((n + size - 1) / size + 3) & ~3;
  const int lo = min(n, static_cast<int>(cg::this_cluster().block_rank()) * chunk);
  return {lo, min(n, lo + chunk) - lo};
}

// Rows are read four elements at a time (a float4 per lane, coalesced) when n % 4 == 0 and the
// row is 16-byte aligned (every real vocabulary); otherwise element by element. Past n: 0.
__device__ __forceinline__ bool vec4_ok(const float* p, int n) {
  return (n & 3) == 0 && (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}
__device__ __forceinline__ float4 load4(const float* p, int n, int i, bool vec) {
  if (vec) return *reinterpret_cast<const float4*>(p + i);
  float4 r;
  r.x = i < n ? p[i] : 0.0f;
  r.y = i + 1 < n ? p[i + 1] : 0.0f;
  r.z = i + 2 < n ? p[i + 2] : 0.0f;
  r.w = i + 3 < n ? p[i + 3] : 0.0f;
  return r;
}
__device__ __forceinline__ float at4(const float4& v, int k) {
  return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w;
}

// f(i, a[i], b[i]) for this thread's elements in block-strided groups of four (b may be null:
// then 0). Coalesced; the loads of two groups are in flight at a time.
template <typename F>
__device__ __forceinline__ void sweep(const float* a, const float* b, int n, F f) {
  const bool vec = vec4_ok(a, n) && (b == nullptr || vec4_ok(b, n));
#pragma unroll 2
  for (int i = 4 * threadIdx.x; i < n; i += 4 * kThreads) {
    const float4 va = load4(a, n, i, vec);
    const float4 vb = b ? load4(b, n, i, vec) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if (i + k < n) f(i + k, at4(va, k), at4(vb, k));
    }
  }
}

// out[i] = f(i, a[i], out[i]) over the row, then a barrier (out may be written only here).
template <typename F>
__device__ __forceinline__ void transform(const float* a, float* out, int n, F f) {
  const bool vec = vec4_ok(a, n) && vec4_ok(out, n);
#pragma unroll 2
  for (int i = 4 * threadIdx.x; i < n; i += 4 * kThreads) {
    const float4 va = load4(a, n, i, vec);
    const float4 vo = load4(out, n, i, vec);
    float4 r;
    r.x = f(i, va.x, vo.x);  // vec: i + 3 < n
    r.y = i + 1 < n ? f(i + 1, va.y, vo.y) : 0.0f;
    r.z = i + 2 < n ? f(i + 2, va.z, vo.z) : 0.0f;
    r.w = i + 3 < n ? f(i + 3, va.w, vo.w) : 0.0f;
    if (vec) {
      *reinterpret_cast<float4*>(out + i) = r;
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        if (i + k < n) out[i + k] = at4(r, k);
      }
    }
  }
  __syncthreads();
}

// The row in index order as kThreads steps of L = 128 x ceil(n / (128 kThreads)) elements;
// thread t owns step t: [t L, (t + 1) L) clipped to n.
struct Step {
  int begin, end;
};
__device__ __forceinline__ int step_len(int n) {
  return 128 * ((n + 128 * kThreads - 1) / (128 * kThreads));
}
__device__ __forceinline__ Step my_step(int n) {
  const int len = step_len(n);
  const int begin = min(n, static_cast<int>(threadIdx.x) * len);
  return {begin, min(n, begin + len)};
}

// The digit descent's per-thread bins: hist[b * kThreads + thread] in dynamic shared memory
// (private, so no atomics; consecutive threads in consecutive words), summed over the block in
// a fixed order into bins[].
template <typename T>
__device__ __forceinline__ T* thread_hist() {
  extern __shared__ __align__(16) unsigned char sample_smem[];
  return reinterpret_cast<T*>(sample_smem);
}

template <typename T>
__device__ void sum_hist(const T* hist, T* bins) {
  __shared__ T part[kWarps];
  // Bin b = warp / 2: its 1024 entries, 16 per thread of two warps.
  const int b = warp_id() / 2;
  const int base = b * kThreads + (threadIdx.x % 64) * 16;
  T s = 0;
#pragma unroll
  for (int j = 0; j < 16; ++j) s += hist[base + j];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(kFullMask, s, o);
  if (lane_id() == 0) part[warp_id()] = s;
  __syncthreads();
  if (threadIdx.x < kBins) bins[threadIdx.x] = part[2 * threadIdx.x] + part[2 * threadIdx.x + 1];
  __syncthreads();
}

// bins[] (shared, this block's) summed over the cluster in rank order into out[] (shared).
template <typename T>
__device__ void cluster_bins(T* bins, T* out) {
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  if (threadIdx.x < kBins) {
    T s = *cluster.map_shared_rank(bins + threadIdx.x, 0);
    for (unsigned b = 1; b < cluster.num_blocks(); ++b) {
      s += *cluster.map_shared_rank(bins + threadIdx.x, b);
    }
    out[threadIdx.x] = s;
  }
  cluster.sync();
}

// The largest key c such that the weight of the row's tokens with key >= c reaches `target`,
// over the tokens with key >= floor (weight: 1 each when probs is null, else probs[i]); row and
// probs are this block's part. *above gets the weight of the tokens with key > c; returns false
// (c = floor) when even the whole weight falls short of the target (rounding).
template <typename T>
__device__ bool descend(const float* row, const float* probs, int n, uint32_t floor, T target,
                        uint32_t* c_out, T* above_out) {
  __shared__ T local[kBins], bins[kBins];
  T* hist = thread_hist<T>();
  uint32_t prefix = 0;
  T above = 0;
  for (int shift = 28; shift >= 0; shift -= 4) {
#pragma unroll
    for (int b = 0; b < kBins; ++b) hist[b * kThreads + threadIdx.x] = 0;
    const uint64_t want = static_cast<uint64_t>(prefix) >> (shift + 4);
    T* mine = hist + threadIdx.x;
    sweep(row, probs, n, [&](int, float v, float p) {
      const uint32_t key = order_key(v);
      if (key < floor || (static_cast<uint64_t>(key) >> (shift + 4)) != want) return;
      mine[((key >> shift) & (kBins - 1)) * kThreads] +=
          probs ? static_cast<T>(p) : static_cast<T>(1);
    });
    __syncthreads();
    sum_hist(hist, local);
    cluster_bins(local, bins);
    int digit = -1;
    T run = above;
    for (int b = kBins - 1; b >= 0; --b) {
      if (run + bins[b] >= target) {
        digit = b;
        break;
      }
      run += bins[b];
    }
    if (digit < 0) {
      if (shift == 28) {
        *c_out = floor;
        *above_out = 0;
        return false;
      }
      // Rounding: this pass's sub-ranges sum to slightly less than the range did. Keep the whole
      // range: its lowest non-empty sub-range.
      run = above;
      digit = 0;
      for (int b = kBins - 1; b >= 0; --b) {
        if (bins[b] > static_cast<T>(0)) digit = b;
      }
      for (int b = kBins - 1; b > digit; --b) run += bins[b];
    }
    above = run;
    prefix |= static_cast<uint32_t>(digit) << shift;
  }
  *c_out = prefix;
  *above_out = above;
  return true;
}

// Every step's sum of val(i, a[i], b[i]) (double) and its last index with a non-zero value,
// returned to the step's owner; warp w reads steps 32 w .. 32 w + 31 coalesced, a float4 per
// lane, in order, kStepBatch steps at a time: their loads in flight together and their warp
// reductions interleaved (one step after another, each a load round trip, made the draw
// latency-bound: 43 us for a 32000-token row at temperature 1, session 18).
constexpr int kStepBatch = 4;
template <typename F>
__device__ void step_sums(const float* a, const float* b, int n, F val, double* sum, int* last) {
  const bool vec = vec4_ok(a, n) && (b == nullptr || vec4_ok(b, n));
  const int len = step_len(n);
  const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int s0 = 0; s0 < 32; s0 += kStepBatch) {
    double part[kStepBatch];
    int lst[kStepBatch];
#pragma unroll
    for (int k = 0; k < kStepBatch; ++k) part[k] = 0.0, lst[k] = -1;
    for (int j = 4 * lane_id(); j < len; j += 128) {  // len is a multiple of 128
      float4 va[kStepBatch], vb[kStepBatch];
#pragma unroll
      for (int k = 0; k < kStepBatch; ++k) {
        const int i = (warp_id() * 32 + s0 + k) * len + j;
        va[k] = i < n ? load4(a, n, i, vec) : zero;
        vb[k] = b != nullptr && i < n ? load4(b, n, i, vec) : zero;
      }
#pragma unroll
      for (int k = 0; k < kStepBatch; ++k) {
        const int i = (warp_id() * 32 + s0 + k) * len + j;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (i + e < n) {
            const double v = val(i + e, at4(va[k], e), at4(vb[k], e));
            part[k] += v;
            if (v > 0.0) lst[k] = i + e;
          }
        }
      }
    }
#pragma unroll
    for (int k = 0; k < kStepBatch; ++k) {
      const double p = warp_reduce(part[k], Add{});
      const int l = warp_reduce(lst[k], Max{});
      if (lane_id() == s0 + k) *sum = p, *last = l;
    }
  }
}

// Exclusive / inclusive prefix of the slices' sums in thread order: within a warp lane by lane,
// then the warps' bases one after another; each inclusive prefix is the exclusive one plus the
// slice's sum, and the next thread's exclusive prefix is that very value.
__device__ void slice_scan(double s, double* excl, double* incl, double* total) {
  __shared__ double warp_total[kWarps];
  __shared__ double base[kWarps + 1];
  double in = s;
  for (int j = 1; j < 32; ++j) {
    const double prev = __shfl_sync(kFullMask, in, j - 1);
    if (lane_id() == j) in = prev + s;
  }
  double ex = __shfl_up_sync(kFullMask, in, 1);
  if (lane_id() == 0) ex = 0.0;
  if (lane_id() == 31) warp_total[warp_id()] = in;
  __syncthreads();
  if (threadIdx.x == 0) {
    base[0] = 0.0;
    for (int w = 0; w < kWarps; ++w) base[w + 1] = base[w] + warp_total[w];
  }
  __syncthreads();
  const double b = base[warp_id()];
  // lane 31's b + in is base[w + 1] (the same addition), so warps tile too.
  *excl = lane_id() == 0 ? b : b + ex;
  *incl = b + in;
  *total = base[kWarps];
  __syncthreads();
}

// exp(x) for x <= 0 given in double, to float: 2^(x log2 e) split into 2^k 2^f, f in [0, 1)
// exact to float rounding, 2^f by exp2f: within a few float ulps of the host's float(exp(x))
// (double exp per element would dominate the kernel).
__device__ __forceinline__ float exp_to_float(double x) {
  const double y = x * 1.4426950408889634074;
  const double k = floor(y);
  if (k < -160.0) return 0.0f;
  return ldexpf(exp2f(static_cast<float>(y - k)), static_cast<int>(k));
}

// slice_scan over the cluster: this block's prefixes moved on by the totals of the blocks before
// it, added in rank order (so block b + 1's base is block b's base plus block b's total, the very
// value its last thread's inclusive prefix holds: the intervals tile across blocks too).
__device__ void cluster_scan(double s, double* excl, double* incl, double* total) {
  __shared__ double slot, base, all;
  double ex, in, t;
  slice_scan(s, &ex, &in, &t);
  cg::cluster_group cluster = cg::this_cluster();
  if (threadIdx.x == 0) slot = t;
  cluster.sync();
  if (threadIdx.x == 0) {
    double run = 0.0;
    for (unsigned b = 0; b < cluster.num_blocks(); ++b) {
      if (b == cluster.block_rank()) base = run;
      run = run + *cluster.map_shared_rank(&slot, b);
    }
    all = run;
  }
  cluster.sync();
  *excl = base + ex;
  *incl = base + in;
  *total = all;
}

// sample_at(probs, n, u) by the cluster (the same result in every thread); probs is the whole
// row, each block reads its part.
__device__ int32_t cluster_sample_at(const float* probs, int n, double u) {
  __shared__ int32_t found;
  const Part pt = my_part(n);
  const float* mine = probs + pt.lo;
  double s;
  int last;
  step_sums(
      mine, nullptr, pt.n, [](int, float p, float) { return static_cast<double>(p); }, &s, &last);
  double excl, incl, total;
  cluster_scan(s, &excl, &incl, &total);
  if (last >= 0) last += pt.lo;
  const int last_all = cluster_max_int(last);
  if (threadIdx.x == 0) found = -1;
  __syncthreads();
  const double target = u * total;
  if (excl <= target && target < incl) {
    const Step st = my_step(pt.n);
    const double local = target - excl;
    double cum = 0.0;
    int pick = last;
    for (int i = st.begin; i < st.end; ++i) {
      const float p = mine[i];
      if (p <= 0.0f) continue;
      cum += p;
      if (local < cum) {
        pick = pt.lo + i;
        break;
      }
    }
    found = pick;
  }
  __syncthreads();
  const int32_t f = cluster_max_int(found);
  return f >= 0 ? f : last_all;  // u * total in the rounding slack at the top: the last non-zero
}

// out = x / total over this block's part (zeros stay zero), then a barrier. By the reciprocal (a
// double division per element would dominate the kernel): within a double ulp of the host's
// quotient, so the float results agree but for double-rounding cases (one float ulp).
__device__ void renormalize(float* out, int n, double total) {
  const double inv = 1.0 / total;
  transform(out, out, n, [inv](int, float x, float) {
    return static_cast<float>(static_cast<double>(x) * inv);
  });
}

// token_probabilities(row, n, params) into out (global memory, [n]), by the cluster: each block
// reads and writes its part.
__device__ void cluster_token_probabilities(const float* full_row, int n, const SampleSpec& sp,
                                            float* full_out) {
  const Part pt = my_part(n);
  const float* row = full_row + pt.lo;
  float* out = full_out + pt.lo;
  const int m = pt.n;
  if (sp.temperature <= 0.0f) {  // one-hot argmax: the lowest index of the largest value
    float bv = -INFINITY;
    int bi = INT_MAX;
    sweep(row, nullptr, m, [&](int i, float v, float) {
      if (v > bv || (v == bv && pt.lo + i < bi)) bv = v, bi = pt.lo + i;
    });
    const float mx = cluster_max(bv);
    const int cand = bv == mx ? bi : INT_MAX;
    const int lowest = -cluster_max_int(-cand);
    const int am = lowest == INT_MAX || isnan(full_row[0]) ? 0 : lowest;
    transform(row, out, m, [&](int i, float, float) { return pt.lo + i == am ? 1.0f : 0.0f; });
    return;
  }
  // Top-k: the tokens whose logit is >= the k-th largest (key >= kth).
  uint32_t kth = 0;
  int kept = n;
  if (sp.top_k > 0 && sp.top_k < n) {
    int above = 0;
    descend<int>(row, nullptr, m, 0u, sp.top_k, &kth, &above);
    int c = 0;
    sweep(row, nullptr, m, [&](int, float v, float) { c += order_key(v) >= kth; });
    kept = static_cast<int>(cluster_sum(static_cast<double>(c)));
  }
  // Softmax of logits / temperature over the kept set: e as float (the host rounds a double exp
  // to float), the total of those in double.
  float mx = -INFINITY;
  sweep(row, nullptr, m, [&](int, float v, float) {
    if (order_key(v) >= kth) mx = fmaxf(mx, v);
  });
  mx = cluster_max(mx);
  const double inv_t = 1.0 / static_cast<double>(sp.temperature);
  double t = 0.0;
  transform(row, out, m, [&](int, float v, float) {
    if (order_key(v) < kth) return 0.0f;
    const float e = exp_to_float((static_cast<double>(v) - mx) * inv_t);
    t += e;
    return e;
  });
  renormalize(out, m, cluster_sum(t));

  // Top-p: the most likely tokens (by logit, then index) until their mass reaches top_p.
  if (sp.top_p < 1.0f && kept > 1) {
    uint32_t c = kth;
    double above = 0.0;
    const double top_p = sp.top_p;
    if (descend<double>(row, out, m, kth, top_p, &c, &above)) {
      // Ties at c in index order: kept while the mass before them is below top_p. The steps'
      // tie masses scanned in order; only steps holding ties are walked.
      double s;
      int last;
      step_sums(
          row, out, m, [c](int, float v, float p) { return order_key(v) == c ? double(p) : 0.0; },
          &s, &last);
      double excl, incl, total;
      cluster_scan(s, &excl, &incl, &total);
      if (s > 0.0) {
        const Step st = my_step(m);
        double run = above + excl;
        for (int i = st.begin; i < st.end; ++i) {
          if (order_key(row[i]) != c) continue;
          const float p = out[i];
          if (!(run < top_p)) out[i] = 0.0f;
          run += p;
        }
      }
      __syncthreads();
      transform(row, out, m, [c](int, float v, float p) { return order_key(v) < c ? 0.0f : p; });
    }
    double mass = 0.0;
    sweep(out, nullptr, m, [&](int, float p, float) { mass += p; });
    renormalize(out, m, cluster_sum(mass));
  }

  // Min-p: drop tokens below min_p times the most likely token's probability.
  if (sp.min_p > 0.0f) {
    float pmax = 0.0f;
    sweep(out, nullptr, m, [&](int, float p, float) { pmax = fmaxf(pmax, p); });
    const float threshold = sp.min_p * cluster_max(pmax);
    double mass = 0.0;
    transform(out, out, m, [&](int, float p, float) {
      if (p < threshold) return 0.0f;
      mass += p;
      return p;
    });
    renormalize(out, m, cluster_sum(mass));
  }
}

// Row blockIdx.x / kCluster (a cluster per row): its distribution into probs, and (tokens
// non-null) its draw at u[row].
__global__ void __launch_bounds__(kThreads)
    sample_rows_kernel(const float* __restrict__ logits, int n, SampleSpec sp, SampleDraws draws,
                       float* __restrict__ probs, int32_t* __restrict__ tokens) {
  pdl_begin();
  const int row = blockIdx.x / kCluster;
  const int64_t off = static_cast<int64_t>(row) * n;
  cluster_token_probabilities(logits + off, n, sp, probs + off);
  if (tokens == nullptr) return;
  // No cluster barrier here: each block's draw reads only its own part of probs (written by it,
  // before transform's barrier), and the draw's scan synchronizes the cluster.
  const int32_t t = cluster_sample_at(probs + off, n, draws.u[row]);
  if (threadIdx.x == 0 && cg::this_cluster().block_rank() == 0) tokens[row] = t;
}

// core/sampling.h speculative_verdict over p ([gamma + 1, n], sample_rows_kernel's), q
// ([gamma, n]); out[0] = accepted, out[1] = token. One cluster.
__global__ void __launch_bounds__(kThreads)
    verdict_kernel(const float* __restrict__ p, float* __restrict__ q, int gamma, int n,
                   const int32_t* __restrict__ cand, SampleDraws draws, bool residual,
                   int32_t* __restrict__ out) {
  pdl_begin();
  __shared__ int accepted;
  if (threadIdx.x == 0) {  // the same decisions in every block
    int k = 0;
    for (; k < gamma; ++k) {
      const int64_t at = static_cast<int64_t>(k) * n + cand[k];
      const double pg = p[at], qg = q[at];
      if (!(draws.u[k] < fmin(1.0, pg / qg))) break;
    }
    accepted = k;
  }
  __syncthreads();
  const int k = accepted;
  const float* pk = p + static_cast<int64_t>(k) * n;
  const float* src = pk;
  if (k < gamma && residual) {
    const Part pt = my_part(n);
    float* qk = q + static_cast<int64_t>(k) * n;
    double m = 0.0;
    transform(pk + pt.lo, qk + pt.lo, pt.n, [&](int, float a, float b) {
      const float r = fmaxf(a - b, 0.0f);
      m += r;
      return r;
    });
    if (cluster_sum(m) > 0.0) src = qk;  // its cluster barriers order the writes before the draw
  }
  const int32_t t = cluster_sample_at(src, n, draws.u[gamma]);
  if (threadIdx.x == 0 && cg::this_cluster().block_rank() == 0) out[0] = k, out[1] = t;
}

// A launch of `kernel` over `rows` clusters of kCluster blocks, with programmatic dependent
// launch as launch() sets it.
template <typename... KernelArgs, typename... Args>
void launch_clusters(void (*kernel)(KernelArgs...), int rows, size_t smem, cudaStream_t stream,
                     Args&&... args) {
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = kCluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(rows * kCluster));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 2 : 1;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

}  // namespace

void launch_sample_rows(const float* logits, int rows, int n, const SampleSpec& spec,
                        const SampleDraws& draws, float* probs, int32_t* tokens,
                        cudaStream_t stream) {
  QS_CHECK(rows >= 1 && rows <= kMaxSampleRows && n >= 1 && probs != nullptr);
  // The descent's per-thread bins (only top-k / top-p run it).
  const bool descends =
      spec.temperature > 0.0f && ((spec.top_k > 0 && spec.top_k < n) || spec.top_p < 1.0f);
  static const bool attr_set = [] {
    CUDA_CHECK(cudaFuncSetAttribute(sample_rows_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(kHistBytes)));
    return true;
  }();
  (void)attr_set;
  launch_clusters(sample_rows_kernel, rows, descends ? kHistBytes : 0, stream, logits, n, spec,
                  draws, probs, tokens);
  CUDA_CHECK_LAUNCH(stream);
}

void launch_speculative_verdict(const float* p, float* q, int gamma, int n,
                                const int32_t* candidates, const SampleDraws& draws, bool residual,
                                int32_t* out, cudaStream_t stream) {
  QS_CHECK(gamma >= 0 && gamma < kMaxSampleRows && n >= 1);
  launch_clusters(verdict_kernel, 1, 0, stream, p, q, gamma, n, candidates, draws, residual, out);
  CUDA_CHECK_LAUNCH(stream);
}

}  // namespace qs::cuda
