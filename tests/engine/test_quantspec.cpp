// QuantSpec on the CPU: greedy equivalence with AR-INT8, the transaction invariant of DESIGN §3,
// the exactness of speculative sampling (§4, with a broken rule that must fail), short prompts,
// statistics and bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "engine/adaptive_gamma.h"
#include "engine/json_constraint.h"
#include "engine/llm_engine.h"
#include "engine/logit_adjust.h"
#include "engine/sampler.h"
#include "engine/speculative.h"
#include "spec_rounds.h"
#include "tiny_model.h"

namespace qs {
namespace {

using testing::TinyModel;

ModelConfig spec_config(int vocab = 97) {
  ModelConfig cfg = testing::tiny_config();
  cfg.vocab_size = vocab;
  cfg.max_position_embeddings = 4096;
  return cfg;
}

std::unique_ptr<LlmEngine> make_engine(const TinyModel& tiny, EngineOptions o) {
  return testing::make_tiny_engine(tiny, o);
}

EngineOptions ar_options(KvType kv, int group) {
  EngineOptions o;
  o.kv = kv;
  o.group_size = group;
  return o;
}

EngineOptions spec_options(int group, int gamma) {
  EngineOptions o;
  o.mode = DecodeMode::kQuantSpec;
  o.group_size = group;
  o.gamma = gamma;
  return o;
}

using testing::greedy_params;
using testing::random_prompt;

// ---------------------------------------------------------------------------------------------

TEST(QuantSpec, GreedyEqualsArInt8TokenForToken) {
  // int4 draft weights on a random model disagree often enough to exercise every rejection
  // point; the output must still be exactly the target path's.
  const TinyModel tiny = testing::make_tiny_model(spec_config(), DType::BF16, 5);
  for (int group : {32, 128}) {
    auto ar = make_engine(tiny, ar_options(KvType::kInt8, group));
    ASSERT_TRUE(ar);
    for (int gamma : {1, 2, 4, 7}) {
      auto spec = make_engine(tiny, spec_options(group, gamma));
      ASSERT_TRUE(spec);
      int prompt_index = 0;
      for (int len : {1, 3, 2 * group - 1, 2 * group + 5, 300}) {
        const std::vector<int32_t> prompt = random_prompt(len, 97, 100 + prompt_index++);
        const int n = group == 32 ? 150 : 290;
        auto want = ar->generate(prompt, greedy_params(n), nullptr);
        auto got = spec->generate(prompt, greedy_params(n), nullptr);
        ASSERT_TRUE(want.ok() && got.ok());
        ASSERT_EQ(got->tokens, want->tokens)
            << "G " << group << " gamma " << gamma << " len " << len;
        EXPECT_EQ(got->tokens.size(), static_cast<size_t>(n));
        EXPECT_GT(got->stats.rounds, 0);
        EXPECT_GT(got->stats.flushes, 0) << "the run must cross a flush";
        // Ends inside a group: the planes hold exactly the complete committed groups.
        const int committed = len + n - 1;
        EXPECT_EQ(spec->cache().length(), committed);
        EXPECT_EQ(spec->cache().planes_length(), group * (committed / group));
      }
    }
  }
}

TEST(QuantSpec, AdaptiveRoundsEqualArInt8TokenForToken) {
  // --gamma auto: each round drafts what AdaptiveGamma chooses (at most the engine's gamma);
  // verification stays exact, so the output is still the target path's.
  const TinyModel tiny = testing::make_tiny_model(spec_config(), DType::BF16, 5);
  auto ar = make_engine(tiny, ar_options(KvType::kInt8, 32));
  ASSERT_TRUE(ar);
  for (int max_gamma : {0, 3, 12}) {
    EngineOptions o = spec_options(32, max_gamma);
    o.adaptive_gamma = true;
    auto spec = make_engine(tiny, o);
    ASSERT_TRUE(spec);
    const int most = max_gamma > 0 ? max_gamma : kAdaptiveGammaMax;
    EXPECT_EQ(spec->gamma(), most);
    for (int len : {1, 70, 300}) {
      const std::vector<int32_t> prompt = random_prompt(len, 97, 400 + len);
      auto want = ar->generate(prompt, greedy_params(200), nullptr);
      auto got = spec->generate(prompt, greedy_params(200), nullptr);
      ASSERT_TRUE(want.ok() && got.ok());
      ASSERT_EQ(got->tokens, want->tokens) << "max gamma " << max_gamma << " len " << len;
      const GenerationStats& s = got->stats;
      EXPECT_GT(s.rounds, 0);
      EXPECT_GE(s.drafted, s.rounds);  // every round drafted at least one token ...
      EXPECT_LE(s.drafted, static_cast<int64_t>(s.rounds) * most);  // ... and at most `most`
      EXPECT_EQ(s.accepted_histogram.size(), static_cast<size_t>(most + 1));
    }
    // A generation's own gamma still fixes its rounds.
    GenerationParams fixed = greedy_params(60);
    fixed.gamma = 2;
    auto got = spec->generate(random_prompt(50, 97, 7), fixed, nullptr);
    ASSERT_TRUE(got.ok());
    EXPECT_EQ(got->stats.accepted_histogram.size(), 3u);
    EXPECT_LE(got->stats.drafted, 2 * got->stats.rounds);
  }
}

TEST(QuantSpec, StatsAreConsistentAndTheDraftReadsNoLowerPlaneByte) {
  const TinyModel tiny = testing::make_tiny_model(spec_config(), DType::BF16, 6);
  auto spec = make_engine(tiny, spec_options(32, 4));
  auto got = spec->generate(random_prompt(100, 97, 1), greedy_params(120), nullptr);
  ASSERT_TRUE(got.ok());
  const GenerationStats& s = got->stats;
  int64_t rounds = 0, accepted = 0;
  ASSERT_EQ(s.accepted_histogram.size(), 5u);
  for (size_t k = 0; k < s.accepted_histogram.size(); ++k) {
    rounds += s.accepted_histogram[k];
    accepted += static_cast<int64_t>(k) * s.accepted_histogram[k];
  }
  EXPECT_EQ(rounds, s.rounds);
  // Rounds near the end may draft fewer than gamma; those with gamma = 4 fill the histogram.
  EXPECT_EQ(accepted, s.accepted);
  EXPECT_LE(s.accepted, s.drafted);
  EXPECT_NEAR(s.mean_accepted_length(), 1.0 + double(s.accepted) / s.rounds, 1e-12);
  EXPECT_GT(s.draft_kv_upper_bytes, 0);
  EXPECT_EQ(s.draft_kv_lower_bytes, 0);
  EXPECT_GT(s.target_kv_lower_bytes, 0);
  EXPECT_EQ(s.target_kv_lower_bytes, s.target_kv_upper_bytes);
  EXPECT_GT(s.draft_s, 0);
  EXPECT_GT(s.verify_s, 0);
  // 100 + 120 tokens at G = 32 cross flushes; their commits are part of all commits' time.
  EXPECT_GT(s.flushes, 0);
  EXPECT_GT(s.flushing_commit_s, 0);
  EXPECT_LE(s.flushing_commit_s, s.flush_s);
}

// A backend that records the 4-bit weights it is told to forget (Backend::forget_weights4).
class ForgetRecordingBackend : public CpuBackend {
 public:
  using CpuBackend::CpuBackend;
  void forget_weights4(const std::vector<const QuantizedWeight4*>& w) override {
    forgotten.insert(forgotten.end(), w.begin(), w.end());
  }
  std::vector<const QuantizedWeight4*> forgotten;
};

// A Model tells its backend when its draft weights go, when they are replaced and when the model
// ends, each of them once: a device backend finds its copies by host address, and a later weight
// at a freed address must not be taken for a stale copy (a GPU test ran a second Model's draft on
// another matrix's copy: docs/perf.md, session 38).
TEST(QuantSpec, ModelForgetsItsDraftWeightsOnTheBackend) {
  const TinyModel tiny = testing::make_tiny_model(spec_config(), DType::BF16, 5);
  const size_t layers = static_cast<size_t>(tiny.cfg.num_layers);
  ForgetRecordingBackend backend{1};
  {
    Model model(tiny.cfg, tiny.weights, backend);
    ASSERT_TRUE(model.make_draft_weights(DraftWeights::kInt4, 1).ok());
    EXPECT_TRUE(backend.forgotten.empty());
    // Replaced by the MLP-only set: every linear layer's and the LM head's 4-bit copy goes.
    ASSERT_TRUE(model.make_draft_weights(DraftWeights::kInt4Mlp, 1).ok());
    EXPECT_EQ(backend.forgotten.size(), 7 * layers + 1);
    ASSERT_TRUE(model.make_draft_weights(DraftWeights::kNative).ok());
    EXPECT_EQ(backend.forgotten.size(), 7 * layers + 1 + 3 * layers);
    ASSERT_TRUE(model.make_draft_weights(DraftWeights::kInt4Mlp, 1).ok());
  }
  // The model's end: its last set (3 per layer).
  ASSERT_EQ(backend.forgotten.size(), 7 * layers + 1 + 6 * layers);
  const std::set<const QuantizedWeight4*> distinct(backend.forgotten.begin(),
                                                   backend.forgotten.begin() + 7 * layers + 1);
  EXPECT_EQ(distinct.size(), 7 * layers + 1);
}

// The chained round (ids in backend memory, one read-back per round) against the same forwards
// with every draft token back on the host: greedy, and sampling with top-k / top-p processing.
TEST(QuantSpec, ChainedRoundsEqualStepwiseRounds) {
  const TinyModel tiny = testing::make_tiny_model(spec_config(), DType::BF16, 5);
  CpuBackend backend{2};
  {
    SCOPED_TRACE("greedy");
    testing::expect_chained_rounds_equal_stepwise(tiny, backend, DType::F32);
  }
  SamplingParams sampling;
  sampling.temperature = 0.8f;
  sampling.top_k = 40;
  sampling.top_p = 0.95f;
  SCOPED_TRACE("sampling");
  testing::expect_chained_rounds_equal_stepwise(tiny, backend, DType::F32, sampling);
}

// The invariant of DESIGN §3: after any sequence of rounds, continuing from the incremental cache
// gives the logits of re-running the committed tokens (prompt prefilled in full precision, the
// generated tokens with the per-position rule) from scratch.
TEST(QuantSpec, TransactionInvariantOverThousandsOfTokens) {
  const TinyModel tiny = testing::make_tiny_model(spec_config(), DType::BF16, 7);
  EngineOptions o = spec_options(32, 7);
  o.max_context = 2400;
  auto spec = make_engine(tiny, o);
  EngineOptions ro = ar_options(KvType::kInt8, 32);
  ro.max_context = 2400;
  auto ref = make_engine(tiny, ro);
  ASSERT_TRUE(spec && ref);
  const int vocab = tiny.cfg.vocab_size;

  const std::vector<int32_t> prompt = random_prompt(45, vocab, 3);
  auto first = spec->start(prompt);
  ASSERT_TRUE(first.ok());
  std::vector<int32_t> generated{argmax(first->data(), vocab)};  // x, then every emitted token

  std::mt19937 rng(11);
  Rng sampler_rng(1);
  GenerationStats stats;
  int first_rejects = 0, middle_rejects = 0, all_accepted = 0, crossing = 0, checks = 0;
  int next_check = 300;
  while (static_cast<int>(generated.size()) < 2100) {
    const int gamma = static_cast<int>(rng() % 8);  // 0..7, 0 = a plain target step
    RoundControl control;
    control.force_accepted = static_cast<int>(rng() % (gamma + 1));
    const int planes_before = spec->cache().planes_length();
    auto r = spec->speculative_round(generated.back(), gamma, SamplingParams{}, sampler_rng, stats,
                                     control);
    ASSERT_TRUE(r.ok()) << r.error().message;
    ASSERT_EQ(r->accepted, control.force_accepted);
    if (gamma > 0 && r->accepted == 0) ++first_rejects;
    if (r->accepted > 0 && r->accepted < gamma) ++middle_rejects;
    if (gamma > 0 && r->accepted == gamma) ++all_accepted;
    if (spec->cache().planes_length() != planes_before) ++crossing;
    generated.insert(generated.end(), r->tokens.begin(), r->tokens.end());
    ASSERT_EQ(spec->cache().length(), static_cast<int>(prompt.size() + generated.size()) - 1);

    if (static_cast<int>(generated.size()) >= next_check) {
      next_check += 900;
      ++checks;
      auto inc = spec->peek_logits(generated.back());
      ASSERT_TRUE(inc.ok());
      // Reference: fresh cache, prompt in full precision, then committed tokens + x in chunks
      // of at most 8 rows with the per-position rule (nothing is committed in between).
      ASSERT_TRUE(ref->start(prompt).ok());
      std::vector<float> logits(static_cast<size_t>(vocab));
      int pos = static_cast<int>(prompt.size());
      for (size_t i = 0; i < generated.size(); i += 8) {
        const size_t m = std::min<size_t>(8, generated.size() - i);
        ASSERT_TRUE(ref->model()
                        .forward(std::span<const int32_t>(generated.data() + i, m), pos,
                                 ref->cache(), target_path(KvMode::kInt8), LogitRows::kLast,
                                 logits.data())
                        .ok());
        pos += static_cast<int>(m);
      }
      float max_abs = 0, max_diff = 0;
      for (int v = 0; v < vocab; ++v) {
        max_abs = std::max(max_abs, std::fabs(logits[v]));
        max_diff = std::max(max_diff, std::fabs(logits[v] - (*inc)[v]));
      }
      EXPECT_LE(max_diff, 1e-5f * max_abs) << "after " << generated.size() << " tokens";
      // The groups both caches quantized are bit-identical.
      const QuantizedPlanes& a = *spec->cache().planes();
      const QuantizedPlanes& b = *ref->cache().planes();
      const int groups =
          std::min(spec->cache().planes_length(), quant_boundary(spec->cache().length(), 32)) / 32;
      ASSERT_GT(groups, 0);
      for (KvCodePlane plane : {KvCodePlane::kKeyUpper, KvCodePlane::kKeyLower,
                                KvCodePlane::kValueUpper, KvCodePlane::kValueLower}) {
        for (int l = 0; l < tiny.cfg.num_layers; ++l) {
          for (int h = 0; h < tiny.cfg.num_kv_heads; ++h) {
            const int64_t off = a.shape().code_offset(l, h, 0);
            const int64_t len = a.shape().code_offset(0, 0, groups * 32);
            ASSERT_TRUE(std::equal(a.code_plane(plane).begin() + off,
                                   a.code_plane(plane).begin() + off + len,
                                   b.code_plane(plane).begin() + off));
          }
        }
      }
    }
  }
  EXPECT_GE(checks, 3);
  EXPECT_GT(first_rejects, 10);
  EXPECT_GT(middle_rejects, 10);
  EXPECT_GT(all_accepted, 10);
  EXPECT_GT(crossing, 3);
  EXPECT_GT(spec->cache().flushes(), 3);
}

// ---------------------------------------------------------------------------------------------
// Distribution exactness.

// Regularized upper incomplete gamma Q(a, x) (series below a + 1, continued fraction above).
double upper_gamma_q(double a, double x) {
  if (x <= 0) return 1.0;
  const double log_pref = -x + a * std::log(x) - std::lgamma(a);
  if (x < a + 1) {
    double term = 1.0 / a, sum = term;
    for (int n = 1; n < 1000; ++n) {
      term *= x / (a + n);
      sum += term;
      if (term < sum * 1e-15) break;
    }
    return 1.0 - sum * std::exp(log_pref);
  }
  double b = x + 1 - a, c = 1e300, d = 1.0 / b, h = d;
  for (int i = 1; i < 1000; ++i) {
    const double an = -i * (i - a);
    b += 2;
    d = an * d + b;
    if (std::fabs(d) < 1e-300) d = 1e-300;
    c = b + an / c;
    if (std::fabs(c) < 1e-300) c = 1e-300;
    d = 1.0 / d;
    const double delta = d * c;
    h *= delta;
    if (std::fabs(delta - 1) < 1e-15) break;
  }
  return std::exp(log_pref) * h;
}

TEST(ChiSquare, PValueMatchesKnownQuantiles) {
  EXPECT_NEAR(upper_gamma_q(0.5, 3.841 / 2), 0.05, 1e-3);     // df 1
  EXPECT_NEAR(upper_gamma_q(5.0, 18.307 / 2), 0.05, 1e-3);    // df 10
  EXPECT_NEAR(upper_gamma_q(50.0, 135.807 / 2), 0.01, 1e-4);  // df 100
}

// Exactness of speculative sampling for both kinds of self-speculation: the QuantSpec cache (the
// draft reads the INT4 view), and a sparse-KV draft (StreamingLLM-style selection over a
// full-precision cache); and QuantSpec with a LogitAdjust (penalties and logit_bias, each row
// adjusted by its own position's history), against the target-only law with the same adjustment;
// and QuantSpec whose rounds draft 0, 1 or 2 tokens as AdaptiveGamma chooses from the rounds before
// (`--gamma auto`: a length chosen from the past keeps every round exact); and QuantSpec in JSON
// mode (every row masked to the tokens that keep the text a prefix of one object, which differ
// from position to position), against the target-only law under the same masks.
enum DistributionCase {
  kQuantSpecDraft,
  kSparseDraft,
  kAdjustedQuantSpec,
  kAdaptiveQuantSpec,
  kJsonQuantSpec
};

class Distribution : public ::testing::TestWithParam<DistributionCase> {
 protected:
  static constexpr int kVocab = 8;
  static constexpr int kTokens = 3;  // the first three emitted tokens: x1, then a round's output
  ModelConfig cfg = spec_config(kVocab);
  TinyModel target_w = testing::make_tiny_model(cfg, DType::F32, 21);
  TinyModel draft_w = testing::make_tiny_model(cfg, DType::F32, 22);  // q far from p
  CpuBackend backend{1};
  Model target{cfg, target_w.weights, backend};
  Model draft{cfg, draft_w.weights, backend};
  const bool sparse = GetParam() == kSparseDraft;
  // JSON mode's vocabulary: token 7 ends the text.
  JsonConstraint json{std::make_shared<const JsonVocab>(
                          std::vector<std::string>{"{", "}", "\"", "a", ":", "1", " {\"", ""},
                          std::vector<int32_t>{7}),
                      JsonGrammar::compile(kJsonObjectSchema).value()};
  const LogitAdjust adjust = [this] {
    LogitAdjust a;
    if (GetParam() == kJsonQuantSpec) a.json = &json;
    if (GetParam() == kAdjustedQuantSpec) {
      a.presence_penalty = 0.7f;
      a.frequency_penalty = 0.4f;
      a.logit_bias = {{3, 1.5f}, {6, -2.0f}};
    }
    return a;
  }();
  LogitAdjuster adjuster;
  const KvMode mode = sparse ? KvMode::kFp : KvMode::kQuantSpec;
  KvCache cache = testing::model_cache(cfg, mode, 64, backend, /*group_size=*/32, /*gamma=*/2);
  const std::vector<int32_t> prompt{1, 5, 2, 7, 3};
  // The sparse draft keeps prompt positions 0 and 2 of kv head 0, 1 and 3 of kv head 1, then
  // everything from position 4 on.
  const std::vector<int32_t> kept{0, 2, 1, 3, 0, 2, 1, 3};  // [layer][kv head][2]
  const std::vector<KvSelection> selection{{kept.data(), 2, 4}, {kept.data() + 4, 2, 4}};
  SamplingParams sampling = [] {
    SamplingParams s;
    s.temperature = 0.9f;
    s.top_k = 6;  // processing applied to p and q alike: some tokens get probability 0
    return s;
  }();

  std::vector<float> prefill_probs() {
    std::vector<float> logits(kVocab), probs;
    cache.clear();
    EXPECT_TRUE(
        target.forward(prompt, 0, cache, ForwardPath{}, LogitRows::kLast, logits.data()).ok());
    cache.commit(static_cast<int>(prompt.size()));
    if (adjust.active()) adjuster.apply_host(logits.data(), kVocab, adjust, {});
    token_probabilities(logits.data(), kVocab, sampling, probs);
    return probs;
  }

  // Exact target-only law of the first kTokens tokens, [kVocab^kTokens].
  std::vector<double> exact() {
    std::vector<double> law(1, 1.0);
    std::vector<std::vector<int32_t>> prefixes{{}};
    for (int step = 0; step < kTokens; ++step) {
      std::vector<double> next_law;
      std::vector<std::vector<int32_t>> next_prefixes;
      for (size_t i = 0; i < prefixes.size(); ++i) {
        std::vector<float> probs(kVocab, 0.0f);
        if (law[i] == 0.0) {
          // A prefix that cannot occur (JSON mode's masks): its continuations cannot either.
        } else if (prefixes[i].empty()) {
          probs = prefill_probs();
        } else {
          prefill_probs();
          std::vector<float> logits(prefixes[i].size() * kVocab);
          EXPECT_TRUE(target
                          .forward(prefixes[i], static_cast<int>(prompt.size()), cache,
                                   target_path(mode), LogitRows::kLast, logits.data())
                          .ok());
          // The row after the generated prefix: adjusted by the prefix's counts.
          if (adjust.active()) adjuster.apply_host(logits.data(), kVocab, adjust, prefixes[i]);
          token_probabilities(logits.data(), kVocab, sampling, probs);
        }
        for (int t = 0; t < kVocab; ++t) {
          next_law.push_back(law[i] * probs[t]);
          std::vector<int32_t> p = prefixes[i];
          p.push_back(t);
          next_prefixes.push_back(p);
        }
      }
      law = next_law;
      prefixes = next_prefixes;
    }
    return law;
  }

  // p-value of `samples` speculative runs against the exact law.
  double p_value(int samples, bool broken) {
    const std::vector<double> law = exact();
    std::vector<int64_t> counts(law.size(), 0);
    Rng rng(broken ? 77 : 78);
    SpeculativeDecoder spec(target, draft, cache, sparse ? selection.data() : nullptr);
    GenerationStats stats;
    SpecCounters counters;
    RoundControl control;
    control.broken_no_residual = broken;
    std::vector<int32_t> out;
    spec.set_adjust(&adjust, &out);
    AdaptiveGamma adaptive(2);
    std::set<int> lengths;
    for (int s = 0; s < samples; ++s) {
      std::vector<float> p0 = prefill_probs();
      out.assign(1, sample_from(p0, rng));
      while (static_cast<int>(out.size()) < kTokens) {
        const int gamma = GetParam() == kAdaptiveQuantSpec ? adaptive.next() : 2;
        lengths.insert(gamma);
        auto r = spec.round(out.back(), gamma, sampling, rng, stats, counters, control);
        EXPECT_TRUE(r.ok());
        // A draft step 1/100 of the rest of a round: drafting pays at any acceptance seen here.
        adaptive.observe(gamma, r->accepted, 0.01 * gamma, 1.0);
        out.insert(out.end(), r->tokens.begin(), r->tokens.end());
      }
      int cell = 0;
      for (int i = 0; i < kTokens; ++i) cell = cell * kVocab + out[i];
      ++counts[cell];
    }
    EXPECT_GT(stats.rounds, samples);
    if (GetParam() == kAdaptiveQuantSpec) {  // and a plain step or two, its cost explored
      EXPECT_TRUE(lengths.count(1) && lengths.count(2));
    }
    EXPECT_LT(stats.acceptance_rate(), 0.9);  // the draft disagrees: rejections are common
    // Cells with expected count < 5 are pooled into one.
    double chi2 = 0, pooled_e = 0;
    int64_t pooled_o = 0;
    int bins = 0;
    for (size_t c = 0; c < law.size(); ++c) {
      const double e = law[c] * samples;
      if (e < 5) {
        pooled_e += e;
        pooled_o += counts[c];
        continue;
      }
      chi2 += (counts[c] - e) * (counts[c] - e) / e;
      ++bins;
    }
    if (pooled_e > 0) {
      chi2 += (pooled_o - pooled_e) * (pooled_o - pooled_e) / std::max(pooled_e, 1e-9);
      ++bins;
    }
    return upper_gamma_q((bins - 1) / 2.0, chi2 / 2.0);
  }
};

TEST_P(Distribution, SpeculativeSamplingMatchesTargetOnlySampling) {
  const double p = p_value(20000, /*broken=*/false);
  EXPECT_GT(p, 0.001);
}

TEST_P(Distribution, WithoutResidualResamplingTheTestFails) {
  const double p = p_value(20000, /*broken=*/true);
  EXPECT_LT(p, 0.001) << "the chi-square test has no power against the broken rule";
}

INSTANTIATE_TEST_SUITE_P(Drafts, Distribution,
                         ::testing::Values(kQuantSpecDraft, kSparseDraft, kAdjustedQuantSpec,
                                           kAdaptiveQuantSpec, kJsonQuantSpec),
                         [](const ::testing::TestParamInfo<DistributionCase>& info) {
                           switch (info.param) {
                             case kSparseDraft:
                               return std::string("sparse_kv");
                             case kQuantSpecDraft:
                               return std::string("quantspec");
                             case kAdaptiveQuantSpec:
                               return std::string("quantspec_adaptive_gamma");
                             case kJsonQuantSpec:
                               return std::string("quantspec_json");
                             default:
                               return std::string("quantspec_adjusted");
                           }
                         });

// ---------------------------------------------------------------------------------------------

TEST(QuantSpec, ShortPromptsAndSampling) {
  const TinyModel tiny = testing::make_tiny_model(spec_config(), DType::BF16, 8);
  auto spec = make_engine(tiny, spec_options(32, 3));
  for (int len : {1, 2, 63}) {
    GenerationParams p = greedy_params(37);
    p.sampling.temperature = 0.8f;
    p.sampling.seed = 5;
    auto a = spec->generate(random_prompt(len, 97, 9), p, nullptr);
    auto b = spec->generate(random_prompt(len, 97, 9), p, nullptr);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->tokens.size(), 37u);
    EXPECT_EQ(a->tokens, b->tokens);  // seeded
  }
  // max_new_tokens 1 and 2: the first token comes from the prefill, then a round cut short.
  for (int n : {1, 2}) {
    auto r = spec->generate(random_prompt(4, 97, 2), greedy_params(n), nullptr);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->tokens.size(), static_cast<size_t>(n));
  }
}

TEST(QuantSpec, EosInsideARoundCutsTheOutput) {
  TinyModel tiny = testing::make_tiny_model(spec_config(), DType::BF16, 10);
  auto ar = make_engine(tiny, ar_options(KvType::kInt8, 32));
  auto full = ar->generate(random_prompt(20, 97, 4), greedy_params(60), nullptr);
  ASSERT_TRUE(full.ok());
  // Make the 25th greedy token the EOS: both modes must stop right there.
  tiny.cfg.eos_token_ids = {full->tokens[24]};
  const size_t first =
      std::find(full->tokens.begin(), full->tokens.end(), full->tokens[24]) - full->tokens.begin();
  auto ar2 = make_engine(tiny, ar_options(KvType::kInt8, 32));
  auto spec = make_engine(tiny, spec_options(32, 6));
  GenerationParams p = greedy_params(60);
  p.stop_at_eos = true;
  auto a = ar2->generate(random_prompt(20, 97, 4), p, nullptr);
  auto b = spec->generate(random_prompt(20, 97, 4), p, nullptr);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->tokens.size(), first + 1);
  EXPECT_EQ(b->tokens, a->tokens);
  EXPECT_EQ(b->finish_reason, "stop");
}

TEST(QuantSpec, IntFourAndEightKvStayCloseToFullPrecision) {
  const TinyModel tiny = testing::make_tiny_model(spec_config(), DType::BF16, 12);
  const std::vector<int32_t> ids = random_prompt(200, 97, 6);
  auto fp = make_engine(tiny, ar_options(KvType::kFp16, 32));
  auto i8 = make_engine(tiny, ar_options(KvType::kInt8, 32));
  auto i4 = make_engine(tiny, ar_options(KvType::kInt4, 32));
  auto lf = fp->sequence_logits(ids), l8 = i8->sequence_logits(ids), l4 = i4->sequence_logits(ids);
  ASSERT_TRUE(lf.ok() && l8.ok() && l4.ok());
  double e8 = 0, e4 = 0;
  for (size_t i = 0; i < lf->size(); ++i) {
    e8 = std::max(e8, double(std::fabs((*lf)[i] - (*l8)[i])));
    e4 = std::max(e4, double(std::fabs((*lf)[i] - (*l4)[i])));
  }
  EXPECT_GT(e8, 0.0);  // the quantized view is really used past 2G
  EXPECT_LT(e8 * 4, e4);
  // Up to 2G every query reads full precision only.
  const size_t early = 64 * 97;
  for (size_t i = 0; i < early; ++i) ASSERT_EQ((*lf)[i], (*l8)[i]);
}

TEST(QuantSpec, BadInputIsAClearError) {
  const TinyModel tiny = testing::make_tiny_model(spec_config(), DType::BF16, 13);
  auto fails = [&](EngineOptions o, const std::string& needle) {
    o.num_threads = 1;
    auto e = LlmEngine::create(tiny.cfg, tiny.weights, std::nullopt, o);
    ASSERT_FALSE(e.ok());
    EXPECT_NE(e.error().message.find(needle), std::string::npos) << e.error().message;
  };
  fails(spec_options(32, 32), "gamma");
  fails(spec_options(32, 1000), "gamma");
  fails(spec_options(32, -1), "gamma");
  EngineOptions o = spec_options(32, 4);
  o.kv_explicit = true;
  fails(o, "--kv");
  o = ar_options(KvType::kInt8, 32);
  o.value_group_size = 12;  // does not divide head_dim 16
  fails(o, "value group size");
  o = ar_options(KvType::kInt8, 48);
  fails(o, "group size");
  auto spec = make_engine(tiny, spec_options(32, 4));
  GenerationParams p = greedy_params(10);
  p.gamma = 32;
  auto r = spec->generate(random_prompt(3, 97, 1), p, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("gamma"), std::string::npos);
  // A round's input id out of range (the chained round's one id from the host; stepwise rounds
  // meet it in the forward's check): an error, the cache as it was.
  ASSERT_TRUE(spec->start(random_prompt(5, 97, 2)).ok());
  Rng rng(3);
  GenerationStats stats;
  for (float temperature : {0.0f, 0.8f}) {
    SamplingParams sampling;
    sampling.temperature = temperature;
    auto bad = spec->speculative_round(97, 2, sampling, rng, stats);
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.error().message.find("token id 97 is out of range"), std::string::npos);
    EXPECT_EQ(spec->cache().length(), 5);
  }
}

}  // namespace
}  // namespace qs
