// QuantSpec rounds two ways on one backend: chained (SpeculativeDecoder's default, the ids kept
// in backend memory, Model::forward_chained) and step by step (the same Model::forward calls
// through a DecoderDispatch, every draft token back on the host), greedy or sampling (each with
// its own Rng of the same seed). Shared by the CPU test (engine/test_quantspec.cpp) and the GPU
// one (cuda/test_model.cpp).
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <span>
#include <vector>

#include "core/argmax.h"
#include "engine/model.h"
#include "engine/speculative.h"
#include "tiny_model.h"

namespace qs::testing {

// Every round's tokens, acceptance and cache length must agree; gamma cycles through 0..7 over
// `rounds` rounds (crossing flushes: G = 32). `rows`: the full-precision KV rows' type.
inline void expect_chained_rounds_equal_stepwise(const TinyModel& tiny, Backend& backend,
                                                 DType rows, const SamplingParams& sampling = {},
                                                 int rounds = 60) {
  const ModelConfig& cfg = tiny.cfg;
  Model model(cfg, tiny.weights, backend);
  ASSERT_TRUE(model.make_draft_weights(DraftWeights::kInt4, 1).ok());
  constexpr int kGroup = 32, kMaxGamma = 7;
  KvCache chained_cache =
      model_cache(cfg, KvMode::kQuantSpec, 1024, backend, kGroup, kMaxGamma, rows);
  KvCache step_cache = model_cache(cfg, KvMode::kQuantSpec, 1024, backend, kGroup, kMaxGamma, rows);
  const std::vector<int32_t> prompt = random_prompt(45, cfg.vocab_size, 9);
  std::vector<float> logits(static_cast<size_t>(cfg.vocab_size));
  for (KvCache* c : {&chained_cache, &step_cache}) {
    ASSERT_TRUE(model.forward(prompt, 0, *c, ForwardPath{}, LogitRows::kLast, logits.data()).ok());
    c->commit(static_cast<int>(prompt.size()));
  }
  SpeculativeDecoder chained(model, model, chained_cache);
  DecoderDispatch dispatch;
  dispatch.forward = [&](std::span<const int32_t> ids, int pos, const ForwardPath& path,
                         LogitRows r, float* lg, int32_t* am) {
    return model.forward(ids, pos, step_cache, path, r, lg, am);
  };
  dispatch.commit = [&](int length) { step_cache.commit(length); };
  SpeculativeDecoder stepwise(model, model, step_cache, nullptr, dispatch);

  int32_t x = argmax(logits.data(), cfg.vocab_size);
  Rng chained_rng(1), step_rng(1);
  GenerationStats chained_stats, step_stats;
  SpecCounters chained_counters, step_counters;
  for (int r = 0; r < rounds; ++r) {
    const int gamma = r % (kMaxGamma + 1);
    auto a = chained.round(x, gamma, sampling, chained_rng, chained_stats, chained_counters);
    auto b = stepwise.round(x, gamma, sampling, step_rng, step_stats, step_counters);
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ(a->tokens, b->tokens) << "round " << r << " gamma " << gamma;
    ASSERT_EQ(a->accepted, b->accepted) << "round " << r;
    ASSERT_EQ(chained_cache.length(), step_cache.length()) << "round " << r;
    x = a->tokens.back();
  }
  EXPECT_EQ(chained_stats.accepted_histogram, step_stats.accepted_histogram);
  EXPECT_EQ(chained_counters.draft_steps, step_counters.draft_steps);
  EXPECT_EQ(chained_counters.draft_kv.upper, step_counters.draft_kv.upper);
  std::printf("[ rounds ] %s rows, %s: %lld of %lld drafted tokens accepted, %lld flushes\n",
              dtype_name(rows), sampling.temperature > 0.0f ? "sampling" : "greedy",
              static_cast<long long>(chained_stats.accepted),
              static_cast<long long>(chained_stats.drafted),
              static_cast<long long>(chained_stats.flushes));
  // Both branches of the verdict ran, and the run crossed flushes.
  EXPECT_GT(chained_stats.accepted, 0);
  EXPECT_LT(chained_stats.accepted, chained_stats.drafted);
  EXPECT_GT(chained_stats.flushes, 0);
  EXPECT_TRUE(chained_stats.phases_backend_timed);
  EXPECT_FALSE(step_stats.phases_backend_timed);
  EXPECT_GT(chained_stats.draft_s, 0);
  EXPECT_GT(chained_stats.verify_s, 0);
  if (sampling.temperature > 0.0f) {
    EXPECT_GT(chained_stats.sample_s, 0);
  }
  // Both consumed the same draws.
  EXPECT_EQ(chained_rng.next_u64(), step_rng.next_u64());
}

}  // namespace qs::testing
