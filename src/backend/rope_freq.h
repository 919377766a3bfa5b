// RoPE inverse frequencies exactly as Hugging Face transformers computes them (in f32), shared by
// every backend. The arithmetic below mirrors torch's f32 operation order on purpose: a
// frequency that differs in its last bit shifts angles at long positions visibly.
#pragma once

#include <cmath>
#include <vector>

#include "model/config.h"

namespace qs {

// [head_dim / 2] inverse frequencies; rope angle for position p and pair j is f32(p * inv[j]).
inline std::vector<float> rope_inv_freq(const ModelConfig& cfg) {
  const int half = cfg.head_dim / 2;
  const float dim = static_cast<float>(cfg.head_dim);
  std::vector<float> inv(half);
  for (int j = 0; j < half; ++j) {
    // 1 / base ** (arange(0, dim, 2).float() / dim)
    float exponent = static_cast<float>(2 * j) / dim;
    float p = static_cast<float>(
        std::pow(static_cast<double>(cfg.rope_theta), static_cast<double>(exponent)));
    inv[j] = 1.0f / p;
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
  }
  return inv;
}

}  // namespace qs
