// Attention over the hierarchical quantized KV cache on CUDA (attention_quant.cu) against the CPU
// backend. Both read the same quantized segment, built by CpuBackend::quantize_kv from random
// K/V, and the same full-precision rows; the GPU reads device copies. Draft-view (INT4) cases pass
// null lower planes to both backends, so a read of a lower-plane byte would fault.
//
// The GPU output is compared with an exact reference: the quantized K/V decoded as
// docs/kv-format.md defines (f32, bit-exact), then scores, softmax and the weighted sum in double.
// The CPU backend is not the yardstick here: it accumulates sum p * step * code and sum p * min
// apart, two terms of size ~|min| whose sum is ~|min| / sqrt(positions), and its f32 rounding then
// shows as a relative error of ~4e-5 at 1000 positions and ~1e-3 at 33000 (printed as "CPU vs
// exact"). It still runs every case (the read-byte accounting must match it).
//
// Tolerance (relative Frobenius error of the output) as test_attention.cpp: 2e-5 up to 4099
// positions, 5e-5 up to 33000. The largest error of each test is printed for docs/cuda.md.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda/attention_quant.h"
#include "backend/cuda/quant_ops.h"
#include "core/dtype.h"
#include "cuda_test_util.h"

namespace qs {
namespace {

using testing::CudaOpsTest;
using testing::DeviceArray;
using testing::DeviceBytes;
using testing::random_normal;
using testing::rel_error;

double g_draft_worst = 0.0;     // largest error of the f16-operand draft calls (kF16OperandsTol)
double g_int8_f16_worst = 0.0;  // the same of the INT8 view's f16-operand calls (int8_f16)
int g_int8_f16_calls = 0;       // INT8 calls that took the f16-operand path

double tolerance(int len) {
  return len <= 4099 ? 2e-5 : 5e-5;
}

// How the K/V values are drawn.
enum class Values {
  kNormal,  // N(0, 1)
  kWild,    // per-position magnitudes over 6 decades, constant channels and constant rows
};

struct KvConfig {
  int len;  // positions in the view (kv.length)
  int kv_heads;
  int head_dim;
  int G;
  int gv;
  int64_t pad = 0;  // floats of row padding
  Values values = Values::kNormal;
  uint64_t seed = 1;
};

// One layer: K/V rows and their quantized segment (capacity = whole groups below len), on the
// host and on the device.
struct QuantKv {
  KvConfig cfg;
  int64_t stride;
  int64_t capacity;
  std::vector<float> k, v;              // [rows, stride], rows = max(len, capacity)
  std::vector<uint8_t> ku, kl, vu, vl;  // [kv_heads, capacity, head_dim / 2]
  std::vector<uint16_t> ks, km;         // [kv_heads, capacity / G, head_dim]
  std::vector<uint16_t> vs, vm;         // [kv_heads, capacity, head_dim / gv]
  std::unique_ptr<DeviceArray> k_dev, v_dev;
  std::unique_ptr<DeviceBytes> ku_dev, kl_dev, vu_dev, vl_dev, ks_dev, km_dev, vs_dev, vm_dev;
  mutable std::vector<float> decoded_[2][2];  // [int8][key]

  QuantKv(CudaBackend& gpu, CpuBackend& cpu, const KvConfig& c) : cfg(c) {
    const int hd = c.head_dim, H = c.kv_heads;
    stride = int64_t{H} * hd + c.pad;
    capacity = std::max<int64_t>(c.G, int64_t{c.G} * (c.len / c.G));
    const int64_t rows = std::max<int64_t>(c.len, capacity);
    k = random_normal(size_t(rows * stride), c.seed);
    v = random_normal(size_t(rows * stride), c.seed + 7);
    if (c.values == Values::kWild) make_wild(rows);
    const size_t codes = size_t(H) * capacity * hd / 2;
    ku.resize(codes), kl.resize(codes), vu.resize(codes), vl.resize(codes);
    ks.resize(size_t(H) * (capacity / c.G) * hd), km.resize(ks.size());
    vs.resize(size_t(H) * capacity * (hd / c.gv)), vm.resize(vs.size());
    QuantizedKvPlanesOut out;
    out.key_upper = ku.data(), out.key_lower = kl.data();
    out.value_upper = vu.data(), out.value_lower = vl.data();
    out.key_scale = ks.data(), out.key_min = km.data();
    out.value_scale = vs.data(), out.value_min = vm.data();
    out.capacity = capacity;
    out.group_size = c.G;
    out.value_group_size = c.gv;
    cpu.quantize_kv(k.data(), v.data(), stride, H, hd, 0, static_cast<int>(capacity / c.G), out);
    k_dev = std::make_unique<DeviceArray>(gpu, k);
    v_dev = std::make_unique<DeviceArray>(gpu, v);
    ku_dev = std::make_unique<DeviceBytes>(gpu, ku);
    kl_dev = std::make_unique<DeviceBytes>(gpu, kl);
    vu_dev = std::make_unique<DeviceBytes>(gpu, vu);
    vl_dev = std::make_unique<DeviceBytes>(gpu, vl);
    ks_dev = std::make_unique<DeviceBytes>(gpu, ks);
    km_dev = std::make_unique<DeviceBytes>(gpu, km);
    vs_dev = std::make_unique<DeviceBytes>(gpu, vs);
    vm_dev = std::make_unique<DeviceBytes>(gpu, vm);
  }

  // Value magnitudes from 1e-3 to 1e3 and key magnitudes from 0.1 to 10 by position (scores stay
  // moderate: both sides round them in f32), a constant key channel (scale 0 in every group) and
  // constant value rows (scale 0), so every power-of-two scaling of the kernels is exercised.
  void make_wild(int64_t rows) {
    const int hd = cfg.head_dim;
    for (int64_t t = 0; t < rows; ++t) {
      const float kmag = std::pow(10.0f, std::sin(0.37f * float(t)));
      const float vmag = std::pow(10.0f, 3.0f * std::cos(0.23f * float(t)));
      for (int64_t i = 0; i < stride; ++i) {
        k[t * stride + i] *= kmag;
        v[t * stride + i] *= vmag;
      }
      for (int h = 0; h < cfg.kv_heads; ++h) {
        k[t * stride + h * hd + 3] = 0.75f;
        if (t % 5 == 0) {
          for (int d = 0; d < hd; ++d) v[t * stride + h * hd + d] = -0.5f;
        }
      }
    }
  }

  // The decoded view (docs/kv-format.md: x4 = U*s + m, x8 = (16U + L)*(s/16) + m, f32) of the
  // quantized positions: [kv_heads, capacity, head_dim] keys then values; computed once per view.
  const std::vector<float>& decoded(bool int8, bool key) const {
    std::vector<float>& d = decoded_[int8 ? 1 : 0][key ? 1 : 0];
    if (!d.empty()) return d;
    const int hd = cfg.head_dim, H = cfg.kv_heads, G = cfg.G, gv = cfg.gv;
    d.resize(size_t(H) * capacity * hd);
    for (int h = 0; h < H; ++h) {
      for (int64_t t = 0; t < capacity; ++t) {
        for (int c = 0; c < hd; ++c) {
          const size_t code = (size_t(h) * capacity + t) * (hd / 2) + c / 2;
          const int shift = 4 * (c & 1);
          const int U = ((key ? ku : vu)[code] >> shift) & 15;
          const int L = int(((key ? kl : vl)[code] >> shift) & 15) - 8;
          const size_t meta = key ? (size_t(h) * (capacity / G) + t / G) * hd + c
                                  : (size_t(h) * capacity + t) * (hd / gv) + c / gv;
          const float sc = f16_to_f32((key ? ks : vs)[meta]);
          const float mn = f16_to_f32((key ? km : vm)[meta]);
          const float x = int8 ? float(16 * U + L) * (sc * 0.0625f) + mn : float(U) * sc + mn;
          d[(size_t(h) * capacity + t) * hd + c] = x;
        }
      }
    }
    return d;
  }

  // The device view of the whole length with full-precision rows from fp_base, over seg (which
  // must outlive it).
  KvView device_view(int fp_base, const QuantizedKvSegment& seg) const {
    KvView view{k_dev->data() + fp_base * stride, v_dev->data() + fp_base * stride, stride,
                cfg.len};
    view.fp_base = fp_base;
    view.quantized = &seg;
    return view;
  }

  QuantizedKvSegment segment(bool int8, bool device) const {
    QuantizedKvSegment s;
    if (device) {
      s.key_upper = ku_dev->as<uint8_t>(), s.value_upper = vu_dev->as<uint8_t>();
      s.key_lower = int8 ? kl_dev->as<uint8_t>() : nullptr;
      s.value_lower = int8 ? vl_dev->as<uint8_t>() : nullptr;
      s.key_scale = ks_dev->as<uint16_t>(), s.key_min = km_dev->as<uint16_t>();
      s.value_scale = vs_dev->as<uint16_t>(), s.value_min = vm_dev->as<uint16_t>();
    } else {
      s.key_upper = ku.data(), s.value_upper = vu.data();
      s.key_lower = int8 ? kl.data() : nullptr;
      s.value_lower = int8 ? vl.data() : nullptr;
      s.key_scale = ks.data(), s.key_min = km.data();
      s.value_scale = vs.data(), s.value_min = vm.data();
    }
    s.capacity = capacity;
    s.group_size = cfg.G;
    s.value_group_size = cfg.gv;
    s.int8 = int8;
    return s;
  }
};

// backend.h's attention over `kv` (positions [0, b(t)) decoded, [b(t), t] full precision) in
// double: what every backend approximates in f32. Queries at pos + i, i < m.
std::vector<float> exact_attention(const QuantKv& kv, const std::vector<float>& q, int m, int pos,
                                   const AttentionShape& shape, bool int8) {
  const KvConfig& cfg = kv.cfg;
  const int hd = cfg.head_dim, group = shape.num_heads / shape.num_kv_heads;
  const std::vector<float>& dk = kv.decoded(int8, true);
  const std::vector<float>& dv = kv.decoded(int8, false);
  std::vector<float> out(q.size());
  const int n_tasks = m * shape.num_heads;
  auto task = [&](int tk) {
    const int i = tk / shape.num_heads, head = tk % shape.num_heads, h = head / group;
    const int t_q = pos + i, b = quant_boundary(t_q, cfg.G);
    const float* qv = q.data() + size_t(tk) * hd;
    auto k_row = [&](int t) {
      return t < b ? dk.data() + (size_t(h) * kv.capacity + t) * hd
                   : kv.k.data() + t * kv.stride + int64_t{h} * hd;
    };
    auto v_row = [&](int t) {
      return t < b ? dv.data() + (size_t(h) * kv.capacity + t) * hd
                   : kv.v.data() + t * kv.stride + int64_t{h} * hd;
    };
    std::vector<double> p(size_t(t_q) + 1), o(hd, 0.0);
    double mx = -1e300;
    for (int t = 0; t <= t_q; ++t) {
      const float* kr = k_row(t);
      double acc = 0.0;
      for (int c = 0; c < hd; ++c) acc += double(qv[c]) * kr[c];
      p[t] = acc * shape.scale;
      mx = std::max(mx, p[t]);
    }
    double sum = 0.0;
    for (int t = 0; t <= t_q; ++t) {
      p[t] = std::exp(p[t] - mx);
      sum += p[t];
      const float* vr = v_row(t);
      for (int c = 0; c < hd; ++c) o[c] += p[t] * vr[c];
    }
    for (int c = 0; c < hd; ++c) out[size_t(tk) * hd + c] = static_cast<float>(o[c] / sum);
  };
  const int n_threads =
      std::max(1, std::min<int>(n_tasks, static_cast<int>(std::thread::hardware_concurrency())));
  std::vector<std::thread> pool;
  for (int w = 0; w < n_threads; ++w) {
    pool.emplace_back([&, w] {
      for (int tk = w; tk < n_tasks; tk += n_threads) task(tk);
    });
  }
  for (std::thread& t : pool) t.join();
  return out;
}

// The CPU backend's largest error against the exact reference over all cases (informative).
double g_cpu_worst = 0.0;

constexpr int kFpBaseMax = -1;  // fp_base = the first query's boundary (what the cache does)

struct Case {
  int num_heads;
  int m;
  bool int8 = true;
  int fp_base = 0;  // or kFpBaseMax
};

std::string describe(const QuantKv& kv, const Case& c, int fp_base) {
  const KvConfig& k = kv.cfg;
  return "len=" + std::to_string(k.len) + " head_dim=" + std::to_string(k.head_dim) +
         " G=" + std::to_string(k.G) + " Gv=" + std::to_string(k.gv) +
         " heads=" + std::to_string(c.num_heads) + "/" + std::to_string(k.kv_heads) +
         " m=" + std::to_string(c.m) + (c.int8 ? " int8" : " int4") +
         " fp_base=" + std::to_string(fp_base) + " stride=" + std::to_string(kv.stride) +
         (k.values == Values::kWild ? " wild" : "") +
         (cuda::quant_attention_tuning().tensor_cores ? "" : " cuda-cores");
}

// Queries are the last m positions of the view (pos = len - m), as in decode and verification.
double run_case(CudaBackend& gpu, CpuBackend& cpu, const QuantKv& kv, const Case& c,
                uint64_t seed) {
  const KvConfig& k = kv.cfg;
  const int hd = k.head_dim, pos = k.len - c.m;
  const int fp_base = c.fp_base == kFpBaseMax ? quant_boundary(pos, k.G) : c.fp_base;
  const AttentionShape shape{c.num_heads, k.kv_heads, hd,
                             static_cast<float>(1.0 / std::sqrt(double(hd)))};
  const std::vector<float> q = random_normal(size_t(c.m) * c.num_heads * hd, seed);

  std::vector<float> want(q.size());
  const QuantizedKvSegment seg_cpu = kv.segment(c.int8, false);
  KvReadBytes rb_cpu, rb_gpu;
  KvView view_cpu{kv.k.data() + fp_base * kv.stride, kv.v.data() + fp_base * kv.stride, kv.stride,
                  k.len};
  view_cpu.fp_base = fp_base;
  view_cpu.quantized = &seg_cpu;
  view_cpu.read_bytes = &rb_cpu;
  cpu.attention(q.data(), c.m, pos, shape, view_cpu, want.data());

  DeviceArray qd(gpu, q), out(gpu, q.size());
  out.poison();
  const QuantizedKvSegment seg_gpu = kv.segment(c.int8, true);
  KvView view_gpu{kv.k_dev->data() + fp_base * kv.stride, kv.v_dev->data() + fp_base * kv.stride,
                  kv.stride, k.len};
  view_gpu.fp_base = fp_base;
  view_gpu.quantized = &seg_gpu;
  view_gpu.read_bytes = &rb_gpu;
  gpu.attention(qd.data(), c.m, pos, shape, view_gpu, out.data());
  const std::vector<float> got = out.to_host();

  const std::string what = describe(kv, c, fp_base);
  EXPECT_EQ(rb_gpu.upper, rb_cpu.upper) << what;
  EXPECT_EQ(rb_gpu.lower, rb_cpu.lower) << what;
  EXPECT_EQ(rb_gpu.meta, rb_cpu.meta) << what;
  EXPECT_EQ(rb_gpu.fp, rb_cpu.fp) << what;
  const std::vector<float> exact = exact_attention(kv, q, c.m, pos, shape, c.int8);
  g_cpu_worst = std::max(g_cpu_worst, rel_error(want, exact));
  const double err = rel_error(got, exact);
  if (testing::f16_operand_attention(gpu, qd.data(), c.m, pos, shape, view_gpu, out.data())) {
    EXPECT_LT(err, testing::kF16OperandsTol) << what << " (f16 operands)";
    double& worst = c.int8 ? g_int8_f16_worst : g_draft_worst;
    worst = std::isnan(err) ? err : std::max(worst, err);
    g_int8_f16_calls += c.int8;
    return 0.0;  // reported apart from the exact paths
  }
  EXPECT_LT(err, tolerance(k.len)) << what;
  return err;
}

void check_cases(CudaBackend& gpu, CpuBackend& cpu, const QuantKv& kv,
                 const std::vector<Case>& cases, double& worst) {
  for (size_t i = 0; i < cases.size(); ++i) {
    if (cases[i].m > kv.cfg.len) continue;
    const double err = run_case(gpu, cpu, kv, cases[i], 5000 + i + kv.cfg.seed);
    worst = std::isnan(err) ? err : std::max(worst, err);
  }
}

void report(const char* test, double worst) {
  std::printf(
      "[ max rel error ] %s: %.3g (CPU vs exact: %.3g; f16 operands: draft view %.3g, INT8 view "
      "%.3g)\n",
      test, worst, g_cpu_worst, g_draft_worst, g_int8_f16_worst);
  g_cpu_worst = 0.0;
  g_draft_worst = 0.0;
  g_int8_f16_worst = 0.0;
}

// Restores the default tuning when a test ends (also on a failed assertion).
struct TuningScope {
  explicit TuningScope(const cuda::QuantAttentionTuning& t) { cuda::set_quant_attention_tuning(t); }
  ~TuningScope() { cuda::set_quant_attention_tuning({}); }
};

constexpr int kKvHeads = 2;
constexpr int kRatios[] = {1, 4, 8};

std::vector<Case> ratio_cases(std::initializer_list<int> ms, bool int8, int fp_base = 0) {
  std::vector<Case> cases;
  for (int ratio : kRatios) {
    for (int m : ms) cases.push_back({kKvHeads * ratio, m, int8, fp_base});
  }
  return cases;
}

// Group sizes x value group sizes x views x head dims x lengths around the group boundaries.
void sweep(CudaBackend& gpu, CpuBackend& cpu, double& worst) {
  for (int hd : {64, 128}) {
    for (int G : {32, 64, 128}) {
      for (int gv : {hd, 32}) {
        for (int len : {1, 2 * G - 1, 2 * G, 2 * G + 1, 1000}) {
          QuantKv kv(gpu, cpu, {len, kKvHeads, hd, G, gv, 0, Values::kNormal, uint64_t(len + G)});
          for (bool int8 : {true, false}) {
            check_cases(gpu, cpu, kv, ratio_cases({1, 5, 16}, int8, kFpBaseMax), worst);
          }
        }
      }
    }
  }
}

// GQA blocks of m rows (up to 128 query vectors per kv head at ratio 8) over wild values, the
// INT8 view, the queries [len - m, len) crossing a group boundary (10 G).
void gqa_blocks(CudaBackend& gpu, CpuBackend& cpu, std::initializer_list<int> ms, int seed,
                double& worst) {
  for (int m : ms) {
    const int G = 64;
    const int len = 10 * G + (m + 1) / 2;
    QuantKv kv(gpu, cpu, {len, kKvHeads, 128, G, 128, 0, Values::kWild, uint64_t(m + seed)});
    check_cases(gpu, cpu, kv, ratio_cases({m}, true, kFpBaseMax), worst);
  }
}

TEST_F(CudaOpsTest, QuantAttentionSweep) {
  double worst = 0;
  sweep(gpu(), cpu(), worst);
  report("quantized sweep", worst);
}

// The same sweep on the cp.async-ring tensor-core path (the default sweep runs head_dim 128 with
// Gv = head_dim on the register-direct path).
TEST_F(CudaOpsTest, QuantAttentionSweepRing) {
  cuda::QuantAttentionTuning ring;
  ring.direct = false;
  TuningScope scope(ring);
  double worst = 0;
  sweep(gpu(), cpu(), worst);
  report("quantized sweep, cp.async ring", worst);
}

// The register-direct path with its other register cap (192: no spilled words).
TEST_F(CudaOpsTest, QuantAttentionSweepDirect192) {
  cuda::QuantAttentionTuning t;
  t.direct_regs = 192;
  TuningScope scope(t);
  double worst = 0;
  sweep(gpu(), cpu(), worst);
  report("quantized sweep, direct path at 192 registers", worst);
}

// The register-direct path with the draft view as exact as the INT8 one (draft_f16 off): the
// f16 hi + lo operands, f32-level accuracy.
TEST_F(CudaOpsTest, QuantAttentionSweepExactDraft) {
  cuda::QuantAttentionTuning t;
  t.draft_f16 = false;
  TuningScope scope(t);
  double worst = 0;
  sweep(gpu(), cpu(), worst);
  EXPECT_EQ(g_draft_worst, 0.0);  // no call took the f16-operand path
  report("quantized sweep, exact draft view", worst);
}

// The f16-operand draft view without its register prefetch (each sub-chunk loaded just before
// use, as the INT8 view does), at every register cap (128: that draft's alone; the INT8 calls of
// the sweep take their automatic cap).
TEST_F(CudaOpsTest, QuantAttentionSweepDraftWithoutRegisterPrefetch) {
  for (int regs : {128, 168, 192}) {
    cuda::QuantAttentionTuning t;
    t.draft_reg_prefetch = false;
    t.direct_regs = regs;
    TuningScope scope(t);
    double worst = 0;
    sweep(gpu(), cpu(), worst);
    report(regs == 128   ? "quantized sweep, draft without register prefetch, 128 registers"
           : regs == 168 ? "quantized sweep, draft without register prefetch, 168 registers"
                         : "quantized sweep, draft without register prefetch, 192 registers",
           worst);
  }
}

// The direct path's per-warp cp.async ring (the INT8 view and the f16-operand draft; one tile per
// warp here, two below) forced on, at every register cap, with the automatic splits and with one or
// two splits (each warp then streams many sub-chunks through its two slots, every slot reused); and
// off (the automatic choice takes it wherever a block has one query tile).
TEST_F(CudaOpsTest, QuantAttentionSweepDirectRing) {
  {
    cuda::QuantAttentionTuning t;
    t.direct_ring = 0;
    TuningScope scope(t);
    double worst = 0;
    sweep(gpu(), cpu(), worst);
    report("quantized sweep, direct path without its ring", worst);
  }
  for (int regs : {128, 168, 192}) {
    for (int splits : {0, 1, 2}) {
      cuda::QuantAttentionTuning t;
      t.direct_ring = 1;
      t.direct_tiles = 1;
      t.direct_regs = regs;
      t.splits = splits;
      TuningScope scope(t);
      double worst = 0;
      sweep(gpu(), cpu(), worst);
      report("quantized sweep, direct path with its ring", worst);
    }
  }
  // Two tiles per warp (the INT8 view): one slot per warp refilled in halves, the
  // full-precision rows after the loop in the rings' memory; also over GQA blocks of 9..16 query
  // vectors per kv head whose boundaries fall inside the block.
  for (int splits : {0, 1, 2}) {
    cuda::QuantAttentionTuning t;
    t.direct_ring = 1;
    t.direct_tiles = 2;
    t.splits = splits;
    TuningScope scope(t);
    double worst = 0;
    sweep(gpu(), cpu(), worst);
    gqa_blocks(gpu(), cpu(), {2, 4, 9, 16}, 80, worst);
    report("quantized sweep, direct path with its ring, two tiles per warp", worst);
  }
}

// The INT8 view on the direct path with its operands in f16 alone (QuantAttentionTuning::
// int8_f16), held to kF16OperandsTol against the exact view: one tile per warp at both register
// caps and two, each with and without the ring, over the sweep and GQA blocks of 2..16 rows
// (16..128 query vectors per kv head at ratio 8) with boundaries inside the block.
TEST_F(CudaOpsTest, QuantAttentionSweepInt8F16) {
  struct Form {
    int tiles, regs, ring;
  };
  for (const Form f : {Form{1, 168, 0}, Form{1, 168, 1}, Form{1, 192, 0}, Form{1, 192, 1},
                       Form{2, 0, 0}, Form{2, 0, 1}}) {
    cuda::QuantAttentionTuning t;
    t.int8_f16 = true;
    t.direct_tiles = f.tiles;
    t.direct_regs = f.regs;
    t.direct_ring = f.ring;
    TuningScope scope(t);
    g_int8_f16_calls = 0;
    double worst = 0;
    sweep(gpu(), cpu(), worst);
    gqa_blocks(gpu(), cpu(), {2, 5, 9, 16}, 120, worst);
    EXPECT_GT(g_int8_f16_calls, 0) << "no INT8 call took the f16-operand path";
    const std::string what = "quantized sweep, INT8 view with f16 operands, " +
                             std::to_string(f.tiles) + " tile(s) per warp, registers " +
                             std::to_string(f.regs) + (f.ring ? ", ring" : ", no ring");
    report(what.c_str(), worst);
  }
}

// The direct path's INT8 view with 1 and 2 8-query tiles per warp (sharing one unpacking of
// the codes; the default picks by query vectors per kv head): GQA blocks of up to 128 query
// vectors per kv head, query tiles past the last query vector, boundaries inside a block.
TEST_F(CudaOpsTest, QuantAttentionSweepDirectTiles) {
  for (int tiles : {1, 2}) {
    cuda::QuantAttentionTuning t;
    t.direct_tiles = tiles;
    TuningScope scope(t);
    double worst = 0;
    sweep(gpu(), cpu(), worst);
    gqa_blocks(gpu(), cpu(), {2, 5, 9, 16}, 40, worst);
    const std::string what =
        "quantized sweep, direct INT8 view with " + std::to_string(tiles) + " tile(s) per warp";
    report(what.c_str(), worst);
  }
}

// A backend made with exact_draft_attention (--draft-attention exact) runs the exact draft view
// whatever the process-wide tuning says.
TEST_F(CudaOpsTest, QuantAttentionExactDraftBackendOption) {
  CudaBackendOptions opt;
  opt.exact_draft_attention = true;
  auto exact = CudaBackend::create(opt);
  ASSERT_TRUE(exact.ok()) << exact.error().message;
  double worst = 0;
  sweep(**exact, cpu(), worst);
  EXPECT_EQ(g_draft_worst, 0.0);  // no call took the f16-operand path
  report("quantized sweep, backend with exact_draft_attention", worst);
}

// The plan of the GPU's call for case c over kv (the queries at the last m positions).
cuda::QuantAttentionPlan plan_of(const QuantKv& kv, const Case& c) {
  const int pos = kv.cfg.len - c.m;
  const int fp_base = c.fp_base == kFpBaseMax ? quant_boundary(pos, kv.cfg.G) : c.fp_base;
  const AttentionShape shape{c.num_heads, kv.cfg.kv_heads, kv.cfg.head_dim, 1.0f};
  const QuantizedKvSegment seg = kv.segment(c.int8, true);
  const KvView view = kv.device_view(fp_base, seg);
  return cuda::plan_attention_quant(
      cuda::make_quant_attention_args(kv.k_dev->data(), c.m, pos, shape, view, nullptr), 132);
}

// More than 16 query vectors per kv head (GQA 4 at m >= 5, GQA 8 at m >= 3) over a history of
// kLongHistoryTwoTiles positions or more take two tiles per warp with the ring by default
// (QuantAttentionTuning::long_history_two_tiles); 16 or fewer, or a shorter history, keep their
// plans; QS_GQA_TWO_TILES=0's tuning keeps one tile. Results are the CPU's either way.
TEST_F(CudaOpsTest, QuantAttentionLongHistoryTwoTiles) {
  double worst = 0;
  for (int len : {cuda::kLongHistoryTwoTiles + 300, 5000}) {
    const bool long_history = len > cuda::kLongHistoryTwoTiles;
    QuantKv kv(gpu(), cpu(), {len, kKvHeads, 128, 64, 128, 0, Values::kNormal, uint64_t(len)});
    for (bool on : {true, false}) {
      cuda::QuantAttentionTuning t;
      t.long_history_two_tiles = on;
      TuningScope scope(t);
      for (const Case& c :
           {Case{4 * kKvHeads, 5, true, kFpBaseMax}, Case{4 * kKvHeads, 9, true, kFpBaseMax},
            Case{8 * kKvHeads, 3, true, kFpBaseMax}, Case{4 * kKvHeads, 4, true, kFpBaseMax}}) {
        const cuda::QuantAttentionPlan plan = plan_of(kv, c);
        const bool many = c.num_heads / kKvHeads * c.m > 16;
        const std::string what = "len " + std::to_string(len) + " heads " +
                                 std::to_string(c.num_heads) + " m " + std::to_string(c.m) +
                                 (on ? "" : " (switch off)");
        EXPECT_EQ(plan.direct_tiles, !many || (on && long_history) ? 2 : 1) << what;
        if (many && on && long_history) {
          EXPECT_TRUE(plan.direct_ring) << what;
        }
        check_cases(gpu(), cpu(), kv, {c}, worst);
      }
    }
  }
  report("quantized attention, GQA blocks over long and short histories", worst);
}

// A backend made with f16_target_attention (--target-attention f16) runs the INT8 view on f16
// operands whatever the process-wide tuning says, held to kF16OperandsTol.
TEST_F(CudaOpsTest, QuantAttentionF16TargetBackendOption) {
  CudaBackendOptions opt;
  opt.f16_target_attention = true;
  auto f16 = CudaBackend::create(opt);
  ASSERT_TRUE(f16.ok()) << f16.error().message;
  g_int8_f16_calls = 0;
  double worst = 0;
  sweep(**f16, cpu(), worst);
  gqa_blocks(**f16, cpu(), {2, 9}, 120, worst);
  EXPECT_GT(g_int8_f16_calls, 0) << "no INT8 call took the f16-operand path";
  report("quantized sweep, backend with f16_target_attention", worst);
}

// The same sweep on the CUDA-core path (the fallback, and the path of head_dim 32/256).
TEST_F(CudaOpsTest, QuantAttentionSweepCudaCores) {
  TuningScope scope({false, 0});
  double worst = 0;
  sweep(gpu(), cpu(), worst);
  report("quantized sweep, CUDA cores", worst);
}

// m = 1..16 for blocks that straddle a group boundary (the queries' boundaries differ), up to
// 128 query vectors per kv head (two query groups).
TEST_F(CudaOpsTest, QuantAttentionEveryQueryCount) {
  double worst = 0;
  for (int hd : {64, 128}) {
    for (int m = 1; m <= 16; ++m) {
      const int G = 64;
      const int len = 10 * G + (m + 1) / 2;  // queries [len - m, len) cross 10 G
      QuantKv kv(gpu(), cpu(), {len, kKvHeads, hd, G, hd, 0, Values::kNormal, uint64_t(m)});
      for (bool int8 : {true, false}) {
        check_cases(gpu(), cpu(), kv, ratio_cases({m}, int8, kFpBaseMax), worst);
        check_cases(gpu(), cpu(), kv, {{2 * kKvHeads, m, int8, 0}}, worst);
      }
    }
  }
  report("quantized m=1..16", worst);
}

// One call of the quantized attention under each of two tunings: `ratio` query heads per kv head
// of kv, m random queries (seed) at its last positions, the view of seg with full-precision rows
// from fp_base. Arm k starts from the defaults with `splits`, then tune(t, k) adjusts it. Each
// arm's output and the plan the call took.
struct ArmQueries {
  int ratio;  // query heads per kv head
  int m;      // query rows
};
struct ArmView {
  bool int8;
  bool f16;  // the INT8 view on f16 operands (int8_f16); the INT4 view is on f16 operands
};
struct TwoArms {
  std::vector<float> out[2];
  cuda::QuantAttentionPlan plan[2];
};
template <class Tune>
TwoArms run_two_tunings(CudaBackend& gpu, const QuantKv& kv, const QuantizedKvSegment& seg,
                        int ratio, int m, int fp_base, uint64_t seed, int splits, Tune tune) {
  const int hd = kv.cfg.head_dim, num_heads = kv.cfg.kv_heads * ratio, pos = kv.cfg.len - m;
  const AttentionShape shape{num_heads, kv.cfg.kv_heads, hd,
                             static_cast<float>(1.0 / std::sqrt(double(hd)))};
  const std::vector<float> q = random_normal(size_t(m) * num_heads * hd, seed);
  const KvView view = kv.device_view(fp_base, seg);
  DeviceArray qd(gpu, q);
  TwoArms r;
  for (int k = 0; k < 2; ++k) {
    cuda::QuantAttentionTuning t;
    t.splits = splits;
    tune(t, k);
    TuningScope scope(t);
    const cuda::QuantAttentionArgs a =
        cuda::make_quant_attention_args(qd.data(), m, pos, shape, view, nullptr);
    // The SM count sizes the splits only, not the kernel choice.
    r.plan[k] = cuda::plan_attention_quant(a, 132);
    DeviceArray out(gpu, q.size());
    out.poison();
    gpu.attention(qd.data(), m, pos, shape, view, out.data());
    r.out[k] = out.to_host();
  }
  return r;
}

// The one-query kernel (QuantAttentionTuning::single_query: an MHA draft step, one query vector
// per kv head) leaves the tile's other query columns out of its loop and folds the query with the
// whole warp: its output must match the 8-column kernel's (the same f16 fragments and scores but
// for q . min, summed in another order: kSingleQueryTol), and the plan must take it where it
// applies.
TEST_F(CudaOpsTest, QuantAttentionSingleQueryMatchesTheEightColumnLoop) {
  // q . min's f32 sum in a tree instead of a chain moves each key group's score offset by a few
  // ulps (~1e-6 of the group's weights). The draft view's uncentred sums (p * step * code and
  // p * min, each ~|min| ~ 2.6, against outputs of ~|min| / sqrt(positions)) amplify that ~50x:
  // 1.1e-5..5.4e-5 measured on the H200 (session 29). A wrong fragment or fold is O(1).
  constexpr double kSingleQueryTol = 5e-4;
  double worst = 0.0;
  int calls = 0;
  for (const int len : {200, 1000, 4099, 33001}) {
    for (const int G : {32, 64, 128}) {
      QuantKv kv(gpu(), cpu(), {len, kKvHeads, 128, G, 128, 0, Values::kNormal, 31});
      const Case c{kKvHeads, 1, false, kFpBaseMax};
      const int fp_base = quant_boundary(len - 1, G);
      const QuantizedKvSegment seg = kv.segment(false, true);
      for (const int splits : {0, 1, 3}) {
        // Arm 0: the one-query kernel; arm 1: the 8-column loop.
        const TwoArms r = run_two_tunings(gpu(), kv, seg, 1, 1, fp_base, 77 + len + G, splits,
                                          [](cuda::QuantAttentionTuning& t, int k) {
                                            t.single_query = k == 0;
                                            t.even_columns = false;  // the 8-column loop
                                          });
        for (int k = 0; k < 2; ++k) {
          EXPECT_EQ(r.plan[k].tile_cols == cuda::kOneCol, k == 0) << describe(kv, c, fp_base);
        }
        const double err = rel_error(r.out[0], r.out[1]);
        worst = std::max(worst, err);
        EXPECT_LT(err, kSingleQueryTol) << describe(kv, c, fp_base) << " splits=" << splits;
        ++calls;
      }
    }
  }
  EXPECT_EQ(calls, 36);
  report("one query vs 8 columns", worst);
}

// The even-column kernels (QuantAttentionTuning::even_columns / int8_even_columns: query j in the
// tile's column 2j, each lane computing one column; up to 4 query vectors per kv head on the f16
// draft's ring kernel (2..4: one is the one-query kernel's) and on the INT8 view's one-tile ring
// kernel, exact or on f16 operands) compute each query's column with the 8-column loop's
// arithmetic: their output must equal the 8-column kernel's (bit for bit is expected; held to
// kEvenColumnsTol, where a wrong column map is O(1)), the plan must take them exactly where they
// apply, and they must pass the exact reference like every call of their view.
TEST_F(CudaOpsTest, QuantAttentionEvenColumnsMatchTheEightColumnLoop) {
  constexpr double kEvenColumnsTol = 1e-6;
  double worst = 0.0, worst_ref = 0.0;
  int calls = 0, even_calls = 0;
  for (const int len : {200, 1000, 4099, 33001}) {
    for (const int G : {32, 64, 128}) {
      QuantKv kv(gpu(), cpu(), {len, kKvHeads, 128, G, 128, 0, Values::kNormal, uint64_t(41 + G)});
      for (const ArmView vw : {ArmView{false, true}, ArmView{true, false}, ArmView{true, true}}) {
        const QuantizedKvSegment seg = kv.segment(vw.int8, true);
        for (const ArmQueries qs :
             {ArmQueries{4, 1}, ArmQueries{2, 1}, ArmQueries{2, 2}, ArmQueries{1, 3},
              ArmQueries{1, 4}, ArmQueries{1, 1}, ArmQueries{8, 1}, ArmQueries{4, 2}}) {
          const int nq = qs.ratio * qs.m;
          const int fp_base = quant_boundary(len - qs.m, G);
          const Case c{kKvHeads * qs.ratio, qs.m, vw.int8, kFpBaseMax};
          for (const int splits : {0, 1, 3}) {
            // Arm 0: the even-column kernels; arm 1: the 8-column loop.
            const TwoArms r =
                run_two_tunings(gpu(), kv, seg, qs.ratio, qs.m, fp_base, 91 + len + G + nq, splits,
                                [&](cuda::QuantAttentionTuning& t, int k) {
                                  t.even_columns = t.int8_even_columns = k == 0;
                                  t.int8_f16 = vw.f16;
                                });
            for (int k = 0; k < 2; ++k) {
              const bool applies = k == 0 && nq <= 4 && (vw.int8 || nq >= 2);
              const bool even_plan = r.plan[k].tile_cols == cuda::kEvenCols;
              EXPECT_EQ(even_plan, applies) << describe(kv, c, fp_base);
              even_calls += even_plan;
            }
            const double err = rel_error(r.out[0], r.out[1]);
            worst = std::max(worst, err);
            EXPECT_LT(err, kEvenColumnsTol) << describe(kv, c, fp_base) << " splits=" << splits;
            ++calls;
          }
        }
        cuda::QuantAttentionTuning t;
        t.even_columns = t.int8_even_columns = true;
        t.int8_f16 = vw.f16;
        TuningScope scope(t);
        check_cases(gpu(), cpu(), kv,
                    {{4 * kKvHeads, 1, vw.int8, kFpBaseMax},
                     {2 * kKvHeads, 2, vw.int8, kFpBaseMax},
                     {kKvHeads, 3, vw.int8, kFpBaseMax},
                     {kKvHeads, 4, vw.int8, 0},
                     {kKvHeads, 1, vw.int8, kFpBaseMax}},
                    worst_ref);
      }
    }
  }
  EXPECT_EQ(calls, 4 * 3 * 3 * 8 * 3);
  // Per length and G: 5 query shapes take it on the INT4 view, 6 on each INT8 one; 3 splits each.
  EXPECT_EQ(even_calls, 4 * 3 * (5 + 6 + 6) * 3);
  std::printf("[ max rel error ] even columns vs 8 columns: %.3g\n", worst);
  report("even columns against the exact reference", worst_ref);
}

TEST_F(CudaOpsTest, QuantAttentionLongContext) {
  double worst = 0;
  for (int len : {4099, 33000}) {
    QuantKv kv(gpu(), cpu(), {len, kKvHeads, 128, 128, 128, 0, Values::kNormal, 11});
    for (bool int8 : {true, false}) {
      check_cases(gpu(), cpu(), kv,
                  {{4 * kKvHeads, 1, int8, kFpBaseMax},
                   {4 * kKvHeads, 7, int8, kFpBaseMax},
                   {kKvHeads, 16, int8, kFpBaseMax}},
                  worst);
    }
  }
  QuantKv kv(gpu(), cpu(), {33000, kKvHeads, 64, 32, 32, 0, Values::kNormal, 12});
  check_cases(gpu(), cpu(), kv, {{8 * kKvHeads, 9, true, kFpBaseMax}, {kKvHeads, 1, false, 0}},
              worst);
  report("quantized long context", worst);
}

// Full-precision rows starting anywhere at or below the first query's boundary.
TEST_F(CudaOpsTest, QuantAttentionFpBase) {
  double worst = 0;
  for (int hd : {64, 128}) {
    QuantKv kv(gpu(), cpu(), {1000, kKvHeads, hd, 64, hd, 0, Values::kNormal, 21});
    for (bool int8 : {true, false}) {
      // First boundary: 896 for m = 1 (pos 999) and for m = 16 (pos 984).
      for (int fp_base : {0, 37, 832, 895, kFpBaseMax}) {
        check_cases(gpu(), cpu(), kv,
                    {{4 * kKvHeads, 1, int8, fp_base}, {kKvHeads, 16, int8, fp_base}}, worst);
      }
    }
  }
  report("quantized fp_base", worst);
}

TEST_F(CudaOpsTest, QuantAttentionForcedSplits) {
  double worst = 0;
  QuantKv kv(gpu(), cpu(), {2000, kKvHeads, 128, 64, 32, 0, Values::kNormal, 31});
  for (bool tensor_cores : {true, false}) {
    for (int splits : {1, 2, 3, 7, 64, 1000}) {
      TuningScope scope({tensor_cores, splits});
      check_cases(gpu(), cpu(), kv,
                  {{kKvHeads, 1, true, kFpBaseMax},
                   {4 * kKvHeads, 9, false, kFpBaseMax},
                   {8 * kKvHeads, 16, true, 0}},
                  worst);
    }
  }
  report("quantized forced splits", worst);
}

// Pipeline shapes of the tensor-core path (sub-chunks per stage x stages, clamped to the shared
// memory), with forced splits whose slices end inside a stage (partial stages, key groups that
// start in the middle of a stage).
TEST_F(CudaOpsTest, QuantAttentionPipelineShapes) {
  double worst = 0;
  struct Pipe {
    int chunk, stages;
  };
  QuantKv kv128(gpu(), cpu(), {2000, kKvHeads, 128, 64, 32, 0, Values::kNormal, 51});
  QuantKv kv64(gpu(), cpu(), {1500, kKvHeads, 64, 32, 64, 0, Values::kNormal, 52});
  for (const Pipe& pp : {Pipe{1, 2}, Pipe{2, 2}, Pipe{2, 3}, Pipe{3, 4}, Pipe{4, 3}, Pipe{4, 6}}) {
    for (int splits : {0, 1, 3}) {
      TuningScope scope({true, splits, 1, pp.chunk, pp.stages});
      check_cases(gpu(), cpu(), kv128,
                  {{kKvHeads, 1, false, kFpBaseMax},
                   {4 * kKvHeads, 9, true, kFpBaseMax},
                   {8 * kKvHeads, 16, true, 0}},
                  worst);
      check_cases(gpu(), cpu(), kv64,
                  {{4 * kKvHeads, 1, false, kFpBaseMax}, {kKvHeads, 5, true, kFpBaseMax}}, worst);
    }
  }
  report("quantized pipeline shapes", worst);
}

// The split combine (attention.cu's, warps over the splits) at many splits (one split per 32
// positions) and for every head_dim (the CUDA-core path for 32/256).
TEST_F(CudaOpsTest, QuantAttentionCombines) {
  double worst = 0;
  for (int hd : {32, 64, 128, 256}) {
    QuantKv kv(gpu(), cpu(), {3000, kKvHeads, hd, 64, hd, 0, Values::kNormal, uint64_t(60 + hd)});
    for (int splits : {0, 2, 1000}) {
      TuningScope scope({true, splits, 1});
      check_cases(gpu(), cpu(), kv,
                  {{4 * kKvHeads, 1, false, kFpBaseMax}, {kKvHeads, 7, true, kFpBaseMax}}, worst);
    }
  }
  report("quantized combines", worst);
}

// launch_dequantize_kv_rows writes the view's values (docs/kv-format.md's x8 / x4, the f32
// QuantKv::decoded) bit for bit as f32 rows, and those values rounded (f32_to_f16_sat) as f16
// rows, at the row layout of the buffer (padded rows, a range that starts inside a group).
TEST_F(CudaOpsTest, DequantizeKvRowsEqualsTheView) {
  for (int hd : {64, 128}) {
    for (int gv : {hd, 32}) {
      const int G = 32, H = kKvHeads;
      QuantKv kv(gpu(), cpu(), {300, H, hd, G, gv, 0, Values::kWild, uint64_t(70 + hd + gv)});
      const int t0 = 37, t1 = static_cast<int>(kv.capacity);
      const int64_t stride = int64_t{H} * hd + 4;
      for (bool int8 : {true, false}) {
        const QuantizedKvSegment seg = kv.segment(int8, true);
        for (DType dt : {DType::F32, DType::F16}) {
          const size_t floats = size_t(t1) * stride * dtype_size(dt) / sizeof(float) + 1;
          DeviceArray k(gpu(), floats), v(gpu(), floats);
          k.poison(), v.poison();
          cuda::launch_dequantize_kv_rows(seg, H, hd, t0, t1, dt, k.data(), v.data(), stride,
                                          static_cast<cudaStream_t>(gpu().stream()));
          const std::vector<float> kh = k.to_host(), vh = v.to_host();
          size_t wrong = 0;
          for (bool key : {true, false}) {
            const std::vector<float>& want = kv.decoded(int8, key);
            const std::vector<float>& got = key ? kh : vh;
            for (int t = t0; t < t1; ++t) {
              for (int h = 0; h < H; ++h) {
                for (int d = 0; d < hd; ++d) {
                  const float x = want[(size_t(h) * kv.capacity + t) * hd + d];
                  const size_t at = size_t(t) * stride + size_t(h) * hd + d;
                  if (dt == DType::F32) {
                    wrong += std::memcmp(&got[at], &x, sizeof(float)) != 0;
                  } else {
                    uint16_t bits;
                    std::memcpy(&bits, reinterpret_cast<const char*>(got.data()) + 2 * at, 2);
                    wrong += bits != f32_to_f16_sat(x);
                  }
                }
              }
            }
          }
          EXPECT_EQ(wrong, 0u) << "head_dim " << hd << " Gv " << gv << (int8 ? " int8 " : " int4 ")
                               << dtype_name(dt);
        }
      }
    }
  }
}

// QuantAttentionTuning::hybrid_prefill: more than 16 queries over the quantized view as the
// prefill attention over the view written out as rows, in runs of one boundary (runs of <= 16
// queries on the decode kernels). Against the exact view: f32 rows with the backend's exact
// prefill (f32-level), and f16 rows (the rows and the written-out view rounded to f16) held to
// kF16OperandsTol; blocks that start below 2G, inside a group and at its start, GQA 1/4/8.
TEST_F(CudaOpsTest, QuantAttentionHybridPrefill) {
  cuda::QuantAttentionTuning t;
  t.hybrid_prefill = true;
  TuningScope scope(t);
  double worst = 0, worst_f16 = 0;
  for (int hd : {64, 128}) {
    for (int G : {32, 128}) {
      for (int len : {70, 4 * G, 4 * G + 45, 1000}) {
        QuantKv kv(gpu(), cpu(),
                   {len, kKvHeads, hd, G, hd, 0, Values::kNormal, uint64_t(len + hd)});
        for (bool int8 : {true, false}) {
          std::vector<Case> cases;
          for (int m : {17, 40, 150}) {
            if (m > len) continue;
            for (int ratio : kRatios) cases.push_back({kKvHeads * ratio, m, int8, kFpBaseMax});
          }
          check_cases(gpu(), cpu(), kv, cases, worst);
          // f16 rows of the same values.
          std::vector<uint16_t> k16(kv.k.size()), v16(kv.v.size());
          for (size_t i = 0; i < k16.size(); ++i) {
            k16[i] = f32_to_f16_sat(kv.k[i]);
            v16[i] = f32_to_f16_sat(kv.v[i]);
          }
          const DeviceBytes k16_dev(gpu(), k16), v16_dev(gpu(), v16);
          for (const Case& c : cases) {
            const int pos = len - c.m, fp_base = quant_boundary(pos, G);
            const AttentionShape shape{c.num_heads, kKvHeads, hd,
                                       static_cast<float>(1.0 / std::sqrt(double(hd)))};
            const std::vector<float> q = random_normal(size_t(c.m) * c.num_heads * hd, 900 + c.m);
            const QuantizedKvSegment seg = kv.segment(int8, true);
            KvView view{k16_dev.as<uint16_t>() + fp_base * kv.stride,
                        v16_dev.as<uint16_t>() + fp_base * kv.stride, kv.stride, len};
            view.row_dtype = DType::F16;
            view.fp_base = fp_base;
            view.quantized = &seg;
            DeviceArray qd(gpu(), q), out(gpu(), q.size());
            out.poison();
            gpu().attention(qd.data(), c.m, pos, shape, view, out.data());
            const double err =
                rel_error(out.to_host(), exact_attention(kv, q, c.m, pos, shape, int8));
            EXPECT_LT(err, testing::kF16OperandsTol) << describe(kv, c, fp_base) << " f16 rows";
            worst_f16 = std::isnan(err) ? err : std::max(worst_f16, err);
          }
        }
      }
    }
  }
  std::printf("[ max rel error ] hybrid prefill, f16 rows: %.3g\n", worst_f16);
  report("quantized hybrid prefill", worst);
}

// head_dim 32 and 256, value groups that are not multiples of 32, key groups of 8 and 16 (the
// model tests' G = 8): the CUDA-core path.
TEST_F(CudaOpsTest, QuantAttentionOtherShapes) {
  double worst = 0;
  struct Shape {
    int hd, G, gv;
  };
  for (const Shape& s :
       {Shape{32, 32, 32}, Shape{256, 64, 256}, Shape{256, 32, 32}, Shape{64, 32, 16},
        Shape{128, 64, 8}, Shape{32, 8, 32}, Shape{64, 8, 64}, Shape{128, 16, 32}}) {
    for (int len : {129, 1000}) {
      QuantKv kv(gpu(), cpu(),
                 {len, kKvHeads, s.hd, s.G, s.gv, 0, Values::kNormal, uint64_t(s.hd)});
      for (bool int8 : {true, false}) {
        check_cases(gpu(), cpu(), kv, ratio_cases({1, 5, 16}, int8, kFpBaseMax), worst);
      }
    }
  }
  report("quantized head_dim 32/256, Gv 8/16, G 8/16", worst);
}

// Blocks of more than 16 rows (evaluation) run in slices of 16; padded rows.
TEST_F(CudaOpsTest, QuantAttentionLongBlocksAndPadding) {
  double worst = 0;
  for (int64_t pad : {int64_t{0}, int64_t{8}}) {
    QuantKv kv(gpu(), cpu(), {1000, kKvHeads, 128, 32, 128, pad, Values::kNormal, 41});
    for (bool int8 : {true, false}) {
      check_cases(
          gpu(), cpu(), kv,
          {{4 * kKvHeads, 17, int8, 0}, {kKvHeads, 40, int8, 0}, {8 * kKvHeads, 5, int8, 0}},
          worst);
    }
  }
  report("quantized long blocks, padded rows", worst);
}

// Magnitudes over six decades, constant key channels and constant value rows.
TEST_F(CudaOpsTest, QuantAttentionWildValues) {
  double worst = 0;
  for (bool tensor_cores : {true, false}) {
    TuningScope scope({tensor_cores, 0});
    for (int hd : {64, 128}) {
      QuantKv kv(gpu(), cpu(), {1500, kKvHeads, hd, 64, 32, 0, Values::kWild, 51});
      for (bool int8 : {true, false}) {
        check_cases(gpu(), cpu(), kv, ratio_cases({1, 7}, int8, kFpBaseMax), worst);
      }
    }
  }
  report("quantized wild values", worst);
}

// A small, quick subset of every kernel variant (compute-sanitizer runs this one).
TEST_F(CudaOpsTest, QuantAttentionSanitizerSubset) {
  double worst = 0;
  for (bool tensor_cores : {true, false}) {
    TuningScope scope({tensor_cores, 3});
    QuantKv kv(gpu(), cpu(), {300, kKvHeads, 64, 32, 32, 4, Values::kNormal, 61});
    check_cases(gpu(), cpu(), kv,
                {{4 * kKvHeads, 1, false, kFpBaseMax},
                 {4 * kKvHeads, 16, true, 0},
                 {kKvHeads, 3, true, kFpBaseMax}},
                worst);
  }
  // The register-direct path (head_dim 128, Gv = head_dim): its automatic tiling (2 tiles per
  // warp at 9..16 query vectors per kv head, their folded queries in shared memory) and 2 tiles
  // forced onto the other shapes.
  for (int tiles : {0, 2}) {
    cuda::QuantAttentionTuning t;
    t.direct_tiles = tiles;
    TuningScope scope(t);
    QuantKv kv(gpu(), cpu(), {300, kKvHeads, 128, 32, 128, 4, Values::kNormal, 62});
    check_cases(gpu(), cpu(), kv,
                {{kKvHeads, 9, true, kFpBaseMax},
                 {4 * kKvHeads, 4, true, 0},
                 {4 * kKvHeads, 5, true, kFpBaseMax},
                 {kKvHeads, 1, false, kFpBaseMax}},
                worst);
  }
  // The direct path's per-warp ring, one split (every slot reused), with one and two tiles per
  // warp (two: one slot refilled in halves, the full-precision states in the rings' memory).
  for (int tiles : {1, 2}) {
    cuda::QuantAttentionTuning t;
    t.direct_ring = 1;
    t.direct_tiles = tiles;
    t.splits = 1;
    TuningScope scope(t);
    QuantKv kv(gpu(), cpu(), {300, kKvHeads, 128, 32, 128, 4, Values::kNormal, 63});
    check_cases(gpu(), cpu(), kv,
                {{4 * kKvHeads, 4, true, 0},
                 {kKvHeads, 9, true, kFpBaseMax},
                 {kKvHeads, 1, false, kFpBaseMax},
                 {4 * kKvHeads, 1, false, 0}},
                worst);
  }
  report("quantized sanitizer subset", worst);
}

}  // namespace
}  // namespace qs
