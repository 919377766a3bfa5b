// Random-weight models built in memory for engine tests, and a plain double-precision reference
// forward pass (written independently of src/engine and src/backend) to check them against.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "engine/engine.h"
#include "engine/llm_engine.h"
#include "kv/kv_cache.h"
#include "model/config.h"
#include "model/weights.h"

namespace qs::testing {

// Weights in `dtype` over storage this object owns; `values` keeps the exact f32 value of every
// stored element (after rounding to dtype) for the reference.
struct TinyModel {
  ModelConfig cfg;
  ModelWeights weights;
  std::vector<std::shared_ptr<std::vector<uint8_t>>> storage;

  WeightView make(const std::string& name, int64_t rows, int64_t cols, DType dtype,
                  std::mt19937& rng, float scale, float offset = 0.0f) {
    auto bytes = std::make_shared<std::vector<uint8_t>>(rows * cols * dtype_size(dtype));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int64_t i = 0; i < rows * cols; ++i) {
      float v = offset + scale * normal(rng);
      if (dtype == DType::F32) {
        reinterpret_cast<float*>(bytes->data())[i] = v;
      } else if (dtype == DType::F16) {
        reinterpret_cast<uint16_t*>(bytes->data())[i] = f32_to_f16(v);
      } else {
        reinterpret_cast<uint16_t*>(bytes->data())[i] = f32_to_bf16(v);
      }
    }
    storage.push_back(bytes);
    WeightView w;
    w.data = bytes->data();
    w.dtype = dtype;
    w.rows = rows;
    w.cols = cols;
    w.name = name;
    return w;
  }
};

inline ModelConfig tiny_config() {
  ModelConfig c;
  c.arch = Architecture::Llama;
  c.vocab_size = 97;
  c.hidden_size = 64;
  c.intermediate_size = 88;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.max_position_embeddings = 256;
  c.rope_theta = 10000.0f;
  c.rms_norm_eps = 1e-5f;
  return c;
}

inline TinyModel make_tiny_model(const ModelConfig& cfg, DType dtype, uint32_t seed) {
  TinyModel m;
  m.cfg = cfg;
  std::mt19937 rng(seed);
  const int64_t d = cfg.hidden_size, qd = cfg.q_dim(), kvd = cfg.kv_dim();
  const int64_t inter = cfg.intermediate_size;
  const float ws = 1.0f / std::sqrt(static_cast<float>(d));
  m.weights.tok_embeddings =
      m.make("model.embed_tokens.weight", cfg.vocab_size, d, dtype, rng, 1.0f);
  for (int l = 0; l < cfg.num_layers; ++l) {
    LayerWeights L;
    const std::string p = "model.layers." + std::to_string(l) + ".";
    L.attn_norm = m.make(p + "input_layernorm.weight", 1, d, dtype, rng, 0.1f, 1.0f);
    L.wq = m.make(p + "self_attn.q_proj.weight", qd, d, dtype, rng, ws);
    L.wk = m.make(p + "self_attn.k_proj.weight", kvd, d, dtype, rng, ws);
    L.wv = m.make(p + "self_attn.v_proj.weight", kvd, d, dtype, rng, ws);
    L.wo = m.make(p + "self_attn.o_proj.weight", d, qd, dtype, rng, ws);
    if (cfg.attention_bias) {
      L.bq = m.make(p + "self_attn.q_proj.bias", 1, qd, dtype, rng, 0.1f);
      L.bk = m.make(p + "self_attn.k_proj.bias", 1, kvd, dtype, rng, 0.1f);
      L.bv = m.make(p + "self_attn.v_proj.bias", 1, kvd, dtype, rng, 0.1f);
    }
    L.mlp_norm = m.make(p + "post_attention_layernorm.weight", 1, d, dtype, rng, 0.1f, 1.0f);
    L.w_gate = m.make(p + "mlp.gate_proj.weight", inter, d, dtype, rng, ws);
    L.w_up = m.make(p + "mlp.up_proj.weight", inter, d, dtype, rng, ws);
    L.w_down = m.make(p + "mlp.down_proj.weight", d, inter, dtype, rng,
                      1.0f / std::sqrt(static_cast<float>(inter)));
    m.weights.layers.push_back(L);
  }
  m.weights.final_norm = m.make("model.norm.weight", 1, d, dtype, rng, 0.1f, 1.0f);
  if (cfg.tie_word_embeddings) {
    m.weights.lm_head = m.weights.tok_embeddings;
  } else {
    m.weights.lm_head = m.make("lm_head.weight", cfg.vocab_size, d, dtype, rng, ws);
  }
  return m;
}

// ---------------------------------------------------------------------------------------------
// Reference forward pass in double, straight from the HF definitions.

inline std::vector<double> to_double(const WeightView& w) {
  std::vector<float> f(static_cast<size_t>(w.numel()));
  to_f32(w.dtype, w.data, f.data(), f.size());
  return std::vector<double>(f.begin(), f.end());
}

// The RoPE inverse frequencies in double, from the formulas in the task (no f32 mimicry).
inline std::vector<double> reference_inv_freq(const ModelConfig& cfg) {
  const int half = cfg.head_dim / 2;
  std::vector<double> inv(half);
  for (int j = 0; j < half; ++j) {
    inv[j] = std::pow(static_cast<double>(cfg.rope_theta), -2.0 * j / cfg.head_dim);
  }
  const RopeScaling& rs = cfg.rope_scaling;
  if (rs.type == RopeScalingType::Linear) {
    for (double& f : inv) f /= rs.factor;
  } else if (rs.type == RopeScalingType::Llama3) {
    const double old_ctx = rs.original_max_position_embeddings;
    const double low_wl = old_ctx / rs.low_freq_factor, high_wl = old_ctx / rs.high_freq_factor;
    for (double& f : inv) {
      const double wavelen = 2 * M_PI / f;
      if (wavelen > low_wl) {
        f = f / rs.factor;
      } else if (wavelen >= high_wl) {
        const double smooth =
            (old_ctx / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
        f = (1 - smooth) * f / rs.factor + smooth * f;
      }
    }
  } else if (rs.type == RopeScalingType::Yarn) {
    // transformers' _compute_yarn_parameters, in double.
    const double dim = cfg.head_dim, base = cfg.rope_theta;
    auto corr = [&](double rot) {
      return dim * std::log(rs.original_max_position_embeddings / (rot * 2 * M_PI)) /
             (2 * std::log(base));
    };
    double low = corr(rs.beta_fast), high = corr(rs.beta_slow);
    if (rs.truncate) low = std::floor(low), high = std::ceil(high);
    low = std::max(low, 0.0), high = std::min(high, dim - 1);
    if (low == high) high += 0.001;
    for (size_t j = 0; j < inv.size(); ++j) {
      const double extrapolation = 1 - std::clamp((j - low) / (high - low), 0.0, 1.0);
      inv[j] = inv[j] / rs.factor * (1 - extrapolation) + inv[j] * extrapolation;
    }
  }
  return inv;
}

// What HF multiplies cos and sin by (yarn's attention_factor; 1 otherwise).
inline double reference_rope_gain(const ModelConfig& cfg) {
  return cfg.rope_scaling.type == RopeScalingType::Yarn ? cfg.rope_scaling.attention_factor : 1.0;
}

// Logits [ids.size(), vocab] of one causal pass over ids starting at position 0.
inline std::vector<double> reference_forward(const ModelConfig& cfg, const ModelWeights& w,
                                             const std::vector<int32_t>& ids) {
  const int n = static_cast<int>(ids.size());
  const int d = cfg.hidden_size, hd = cfg.head_dim, nh = cfg.num_heads, nkv = cfg.num_kv_heads;
  const int qd = cfg.q_dim(), kvd = cfg.kv_dim();
  const std::vector<double> inv = reference_inv_freq(cfg);
  const double gain = reference_rope_gain(cfg);  // HF: cos and sin times attention_factor

  auto linear = [](const std::vector<double>& x, int rows, const WeightView& wv,
                   const WeightView& bias) {
    const std::vector<double> W = to_double(wv);
    std::vector<double> b = bias.empty() ? std::vector<double>() : to_double(bias);
    const int64_t out = wv.rows, in = wv.cols;
    std::vector<double> y(static_cast<size_t>(rows * out));
    for (int i = 0; i < rows; ++i)
      for (int64_t o = 0; o < out; ++o) {
        double s = b.empty() ? 0.0 : b[o];
        for (int64_t c = 0; c < in; ++c) s += x[i * in + c] * W[o * in + c];
        y[i * out + o] = s;
      }
    return y;
  };
  auto rmsnorm = [&](const std::vector<double>& x, int rows, const WeightView& wv) {
    const std::vector<double> g = to_double(wv);
    std::vector<double> y(x.size());
    for (int i = 0; i < rows; ++i) {
      double ss = 0;
      for (int c = 0; c < d; ++c) ss += x[i * d + c] * x[i * d + c];
      const double r = 1.0 / std::sqrt(ss / d + cfg.rms_norm_eps);
      for (int c = 0; c < d; ++c) y[i * d + c] = g[c] * x[i * d + c] * r;
    }
    return y;
  };
  auto rope = [&](std::vector<double>& x, int heads) {
    for (int i = 0; i < n; ++i)
      for (int h = 0; h < heads; ++h) {
        double* v = &x[(static_cast<size_t>(i) * heads + h) * hd];
        for (int j = 0; j < hd / 2; ++j) {
          const double a = i * inv[j], c = gain * std::cos(a), s = gain * std::sin(a);
          const double x0 = v[j], x1 = v[j + hd / 2];
          v[j] = x0 * c - x1 * s;
          v[j + hd / 2] = x1 * c + x0 * s;
        }
      }
  };

  const std::vector<double> emb = to_double(w.tok_embeddings);
  std::vector<double> h(static_cast<size_t>(n) * d);
  for (int i = 0; i < n; ++i)
    for (int c = 0; c < d; ++c) h[i * d + c] = emb[static_cast<size_t>(ids[i]) * d + c];

  for (const LayerWeights& L : w.layers) {
    std::vector<double> x = rmsnorm(h, n, L.attn_norm);
    std::vector<double> q = linear(x, n, L.wq, L.bq);
    std::vector<double> k = linear(x, n, L.wk, L.bk);
    std::vector<double> v = linear(x, n, L.wv, L.bv);
    rope(q, nh);
    rope(k, nkv);
    std::vector<double> att(static_cast<size_t>(n) * qd, 0.0);
    for (int i = 0; i < n; ++i)
      for (int hh = 0; hh < nh; ++hh) {
        const int kvh = hh / (nh / nkv);
        std::vector<double> s(i + 1);
        double mx = -1e300;
        for (int t = 0; t <= i; ++t) {
          double dot = 0;
          for (int c = 0; c < hd; ++c) dot += q[i * qd + hh * hd + c] * k[t * kvd + kvh * hd + c];
          s[t] = dot / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, s[t]);
        }
        double sum = 0;
        for (double& e : s) sum += (e = std::exp(e - mx));
        for (int t = 0; t <= i; ++t)
          for (int c = 0; c < hd; ++c)
            att[i * qd + hh * hd + c] += s[t] / sum * v[t * kvd + kvh * hd + c];
      }
    std::vector<double> o = linear(att, n, L.wo, WeightView{});
    for (size_t i = 0; i < h.size(); ++i) h[i] += o[i];
    x = rmsnorm(h, n, L.mlp_norm);
    std::vector<double> g = linear(x, n, L.w_gate, WeightView{});
    std::vector<double> u = linear(x, n, L.w_up, WeightView{});
    for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
    std::vector<double> dn = linear(g, n, L.w_down, WeightView{});
    for (size_t i = 0; i < h.size(); ++i) h[i] += dn[i];
  }
  std::vector<double> x = rmsnorm(h, n, w.final_norm);
  return linear(x, n, w.lm_head, WeightView{});
}

// A KV cache for cfg in `backend`'s memory: `mode`, `capacity` positions, key group G, the
// speculation length it must take (quantized modes) and the full-precision row type. Aborts on a
// bad configuration (a test bug).
inline KvCache model_cache(const ModelConfig& cfg, KvMode mode, int capacity, Backend& backend,
                           int group_size = 128, int max_gamma = 0, DType row_dtype = DType::F32) {
  KvCacheConfig k;
  k.mode = mode;
  k.num_layers = cfg.num_layers;
  k.num_kv_heads = cfg.num_kv_heads;
  k.head_dim = cfg.head_dim;
  k.group_size = group_size;
  k.max_gamma = max_gamma;
  k.capacity = capacity;
  k.row_dtype = row_dtype;
  auto made = KvCache::create(k, backend);
  if (!made.ok()) std::abort();
  return std::move(made).value();
}

// n token ids drawn uniformly from [0, vocab), seeded.
// n seeded N(0, scale^2) floats.
inline std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

inline std::vector<int32_t> random_prompt(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(n);
  for (int32_t& id : ids) id = static_cast<int32_t>(rng() % vocab);
  return ids;
}

// The engine-level tests of the prefill and the prompt cache (test_prefill_kv.cpp,
// test_prompt_cache.cpp): tiny_config() with a 97-token vocabulary and 4096 positions, run with
// key groups of 32, gamma 5 and prefill chunks of 64.
inline constexpr int kEngineTestVocab = 97;
inline constexpr int kEngineTestGroup = 32;
inline constexpr int kEngineTestChunk = 64;
inline constexpr int kEngineTestGamma = 5;

inline ModelConfig engine_test_config() {
  ModelConfig cfg = tiny_config();
  cfg.vocab_size = kEngineTestVocab;
  cfg.max_position_embeddings = 4096;
  return cfg;
}

// A decoding mode and an AR cache (kv_explicit for the quantized ones, as the CLI sets it).
inline EngineOptions mode_options(DecodeMode mode, KvType kv) {
  EngineOptions o;
  o.mode = mode;
  o.kv = kv;
  o.kv_explicit = kv != KvType::kFp16;
  return o;
}

// The modes whose caches hold quantized planes: AR INT8, AR INT4, QuantSpec.
inline constexpr std::pair<DecodeMode, KvType> kQuantizedModes[] = {
    {DecodeMode::kAr, KvType::kInt8},
    {DecodeMode::kAr, KvType::kInt4},
    {DecodeMode::kQuantSpec, KvType::kFp16}};

inline EngineOptions engine_test_options(DecodeMode mode, KvType kv,
                                         PrefillKv prefill = PrefillKv::kExact) {
  EngineOptions o = mode_options(mode, kv);
  o.group_size = kEngineTestGroup;
  o.gamma = kEngineTestGamma;
  o.prefill_chunk = kEngineTestChunk;
  o.prefill_kv = prefill;
  return o;
}

// Greedy decoding of exactly n tokens (EOS does not stop it).
inline GenerationParams greedy_params(int n) {
  GenerationParams p;
  p.max_new_tokens = n;
  p.stop_at_eos = false;
  return p;
}

// An engine over the tiny model without a tokenizer: 2 threads and 1024 positions unless `o` sets
// them; nullptr (and a test failure) when it cannot be created.
inline std::unique_ptr<LlmEngine> make_tiny_engine(const TinyModel& tiny, EngineOptions o) {
  if (o.num_threads == 0) o.num_threads = 2;
  if (o.max_context == 0) o.max_context = 1024;
  Result<std::unique_ptr<LlmEngine>> e = LlmEngine::create(tiny.cfg, tiny.weights, std::nullopt, o);
  EXPECT_TRUE(e.ok()) << e.error().message;
  return e.ok() ? std::move(e).value() : nullptr;
}

}  // namespace qs::testing
