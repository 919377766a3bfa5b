// RoPE inverse frequencies exactly as Hugging Face transformers computes them (in f32), shared by
// every backend. The arithmetic below mirrors torch's f32 operation order on purpose: a
// frequency that differs in its last bit shifts angles at long positions visibly.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "model/config.h"

namespace qs {

// transformers' _compute_yarn_parameters on the unscaled frequencies `inv` (1 / pos_freqs): pair j
// blends the interpolated frequency (inv / factor) and the extrapolated one (inv) by a linear ramp
// over the pairs between the dimensions that turn beta_fast and beta_slow times in
// original_max_position_embeddings. The bounds in double (Python floats), the ramp and the blend
// in f32 with torch's operation order. (attention_factor: ModelConfig::attention_scale.)
inline void yarn_blend(const ModelConfig& cfg, const std::vector<float>& pos_freqs,
                       std::vector<float>& inv) {
  const RopeScaling& rs = cfg.rope_scaling;
  const double dim = cfg.head_dim, base = cfg.rope_theta;
  const double old_ctx = rs.original_max_position_embeddings;
  auto correction_dim = [&](double rotations) {
    return dim * std::log(old_ctx / (rotations * 2.0 * M_PI)) / (2.0 * std::log(base));
  };
  double low = correction_dim(rs.beta_fast), high = correction_dim(rs.beta_slow);
  if (rs.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1.0);
  if (low == high) high += 0.001;  // no singular ramp
  const float low_f = static_cast<float>(low), span = static_cast<float>(high - low);
  const float factor = rs.factor;
  for (size_t j = 0; j < inv.size(); ++j) {
    const float extrapolated = inv[j];  // 1 / pos_freqs[j]
    const float interpolated = 1.0f / (factor * pos_freqs[j]);
    const float ramp = std::clamp((static_cast<float>(j) - low_f) / span, 0.0f, 1.0f);
    const float w = 1.0f - ramp;  // the extrapolation factor
    inv[j] = interpolated * (1.0f - w) + extrapolated * w;
  }
}

// [head_dim / 2] inverse frequencies; rope angle for position p and pair j is f32(p * inv[j]).
inline std::vector<float> rope_inv_freq(const ModelConfig& cfg) {
  const int half = cfg.head_dim / 2;
  const float dim = static_cast<float>(cfg.head_dim);
  std::vector<float> pos_freqs(half), inv(half);
  for (int j = 0; j < half; ++j) {
    // 1 / base ** (arange(0, dim, 2).float() / dim)
    float exponent = static_cast<float>(2 * j) / dim;
    pos_freqs[j] = static_cast<float>(
        std::pow(static_cast<double>(cfg.rope_theta), static_cast<double>(exponent)));
    inv[j] = 1.0f / pos_freqs[j];
  }
  const RopeScaling& rs = cfg.rope_scaling;
  if (rs.type == RopeScalingType::Linear) {
    for (float& f : inv) f = f / rs.factor;
  } else if (rs.type == RopeScalingType::Llama3) {
    // transformers' _compute_llama3_parameters. Python scalars meet f32 tensors, so they are
    // rounded to f32 first; `c / t` is torch's reciprocal(t) * c.
    const double old_ctx = rs.original_max_position_embeddings;
    const float low_freq_wavelen = static_cast<float>(old_ctx / rs.low_freq_factor);
    const float high_freq_wavelen = static_cast<float>(old_ctx / rs.high_freq_factor);
    const float two_pi = static_cast<float>(2.0 * M_PI);
    const float old_ctx_f = static_cast<float>(old_ctx);
    const float low = rs.low_freq_factor;
    const float band = static_cast<float>(static_cast<double>(rs.high_freq_factor) -
                                          static_cast<double>(rs.low_freq_factor));
    for (float& f : inv) {
      float wavelen = (1.0f / f) * two_pi;
      float scaled = wavelen > low_freq_wavelen ? f / rs.factor : f;
      bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
      if (medium) {
        float smooth = ((1.0f / wavelen) * old_ctx_f - low) / band;
        scaled = (1.0f - smooth) * scaled / rs.factor + smooth * scaled;
      }
      f = scaled;
    }
  } else if (rs.type == RopeScalingType::Yarn) {
    yarn_blend(cfg, pos_freqs, inv);
  }
  return inv;
}

}  // namespace qs
