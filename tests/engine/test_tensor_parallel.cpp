// Tensor parallelism on the CPU (docs/multi-gpu.md): the shards of a model, run by `world`
// threads over a LocalCommunicatorGroup, each with its own KV cache over its kv heads, compute the
// unsharded model's logits (fp, int8 and the QuantSpec draft's int4 paths), decode the same greedy
// tokens, and run speculative rounds in lockstep. Bad shapes are clear errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "engine/communicator.h"
#include "engine/llm_engine.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "engine/speculative.h"
#include "engine/tensor_parallel.h"
#include "tiny_model.h"

namespace qs {
namespace {

using testing::TinyModel;

// GQA (8 query heads over 4 kv heads), attention biases and an o_proj bias: divisible by 4.
ModelConfig gqa_bias_config() {
  ModelConfig c = testing::tiny_config();
  c.num_heads = 8;
  c.num_kv_heads = 4;
  c.head_dim = 16;
  c.intermediate_size = 96;
  c.attention_bias = true;
  return c;
}

// Column shards aligned to the 4-bit draft weights' groups of 128 at world 2 and 4 (q_dim 512,
// intermediate 512), so the int4 draft of every shard is a slice of the unsharded int4 draft.
ModelConfig draft_aligned_config() {
  ModelConfig c = testing::tiny_config();
  c.hidden_size = 128;
  c.num_heads = 8;
  c.num_kv_heads = 4;
  c.head_dim = 64;
  c.intermediate_size = 512;
  return c;
}

TinyModel make_model(const ModelConfig& cfg, DType dtype, uint32_t seed, bool o_bias) {
  TinyModel m = testing::make_tiny_model(cfg, dtype, seed);
  if (o_bias) {
    std::mt19937 rng(seed + 1000);
    for (size_t l = 0; l < m.weights.layers.size(); ++l) {
      m.weights.layers[l].bo =
          m.make("model.layers." + std::to_string(l) + ".self_attn.o_proj.bias", 1, cfg.hidden_size,
                 dtype, rng, 0.1f);
    }
  }
  return m;
}

// Runs fn(rank) on `world` threads and joins them.
void run_ranks(int world, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back(fn, r);
  for (std::thread& t : threads) t.join();
}

KvCache make_cache(const ModelConfig& cfg, KvMode mode, int group, int gamma, Backend& backend) {
  return testing::model_cache(cfg, mode, 256, backend, group, gamma);
}

enum class PathKind { kFp, kInt8, kQuantSpecDraft };
const char* path_name(PathKind p) {
  return p == PathKind::kFp ? "fp" : p == PathKind::kInt8 ? "int8" : "quantspec-draft";
}

// What one decode run saw: the prompt's logits (all rows), each step's logits, the tokens.
struct Trace {
  std::vector<float> prefill;
  std::vector<std::vector<float>> steps;
  std::vector<int32_t> tokens;
  // Per step: whether its forward read a group quantized after the prefill (a decode flush).
  std::vector<bool> read_decode_flush;
};

// Prefill over the target path, then `n` greedy tokens, each fed back through `kind`'s path (the
// QuantSpec draft: int4 weights over the int4 view of the hierarchical cache). With a
// communicator, rank 0 picks each token and broadcasts it.
Trace decode(const ModelConfig& full_cfg, Model& model, KvCache& cache, PathKind kind,
             const std::vector<int32_t>& prompt, int n, Communicator* comm) {
  const int vocab = full_cfg.vocab_size;
  const KvMode mode = cache.mode();
  const ForwardPath prefill_path = target_path(mode);
  const ForwardPath step_path =
      kind == PathKind::kQuantSpecDraft ? draft_path(mode) : target_path(mode);
  Trace t;
  t.prefill.resize(prompt.size() * vocab);
  Status st = model.forward(prompt, 0, cache, prefill_path, LogitRows::kAll, t.prefill.data());
  QS_CHECK_MSG(st.ok(), st.ok() ? "" : st.error().message);
  int pos = static_cast<int>(prompt.size());
  cache.commit(pos);
  const int prefill_flushes = cache.flushes();
  const float* last = t.prefill.data() + (prompt.size() - 1) * vocab;
  std::vector<float> logits(vocab);
  for (int i = 0; i < n; ++i) {
    int32_t tok = argmax(last, vocab);
    if (comm) comm->broadcast(&tok, sizeof(tok), 0);  // rank 0 decides
    t.tokens.push_back(tok);
    t.read_decode_flush.push_back(cache.flushes() > prefill_flushes);
    st = model.forward(std::span<const int32_t>(&tok, 1), pos, cache, step_path, LogitRows::kLast,
                       logits.data());
    QS_CHECK_MSG(st.ok(), st.ok() ? "" : st.error().message);
    cache.commit(++pos);
    t.steps.push_back(logits);
    last = t.steps.back().data();
  }
  return t;
}

// max |a - b| <= rel * max |b|, row by row.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, int vocab,
                  double rel, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t r = 0; r * vocab < want.size(); ++r) {
    double diff = 0, scale = 0;
    for (int c = 0; c < vocab; ++c) {
      diff = std::max(diff, std::abs(double(got[r * vocab + c]) - want[r * vocab + c]));
      scale = std::max(scale, std::abs(double(want[r * vocab + c])));
    }
    ASSERT_LE(diff, rel * scale) << what << " row " << r;
  }
}

// Relative logit tolerance against the unsharded model (summation order only).
constexpr double kTol = 1e-5;
// The same once a step reads a group that a decode step quantized: the two models' K/V rows
// differ in their last bits (summation order), and a value that lies at a rounding boundary of
// the quantizer (a code, or a group's fp16 min / scale) moves by a whole INT8 step in one model
// only. Measured: up to 9.3e-5 (gqa+bias bf16, world 2 and 4); a wrong group, flush or rollback
// moves logits by 1e-2 and more.
constexpr double kQuantizedTol = 1e-3;

struct Case {
  ModelConfig cfg;
  DType dtype;
  bool o_bias;
  std::string name;
};

void check_matches_single_rank(const Case& c, PathKind kind, int world) {
  SCOPED_TRACE(c.name + " " + path_name(kind) + " world " + std::to_string(world));
  const TinyModel tiny = make_model(c.cfg, c.dtype, 7, c.o_bias);
  const KvMode mode = kind == PathKind::kFp     ? KvMode::kFp
                      : kind == PathKind::kInt8 ? KvMode::kInt8
                                                : KvMode::kQuantSpec;
  const int group = 16, steps = 20;
  const std::vector<int32_t> prompt = testing::random_prompt(37, c.cfg.vocab_size, 11);

  CpuBackend backend(1);
  Model single(tiny.cfg, tiny.weights, backend);
  if (kind == PathKind::kQuantSpecDraft) {
    ASSERT_TRUE(single.make_draft_weights(DraftWeights::kInt4).ok());
  }
  KvCache cache = make_cache(tiny.cfg, mode, group, 4, backend);
  const Trace want = decode(c.cfg, single, cache, kind, prompt, steps, nullptr);

  LocalCommunicatorGroup group_comm(world);
  std::vector<Trace> got(world);
  std::vector<std::string> errors(world);
  run_ranks(world, [&](int r) {
    Result<ShardedWeights> shard = shard_model(tiny.cfg, tiny.weights, r, world);
    if (!shard.ok()) {
      errors[r] = shard.error().message;
      return;  // every rank fails alike (same shapes): no collective is left waiting
    }
    CpuBackend rank_backend(1);
    Model model(shard->cfg, shard->weights, rank_backend);
    model.set_communicator(&group_comm.rank(r));
    if (kind == PathKind::kQuantSpecDraft) {
      Status st = model.make_draft_weights(DraftWeights::kInt4);
      QS_CHECK(st.ok());
    }
    KvCache rank_cache = make_cache(shard->cfg, mode, group, 4, rank_backend);
    EXPECT_EQ(rank_cache.kv_dim(), c.cfg.kv_dim() / world);
    got[r] = decode(c.cfg, model, rank_cache, kind, prompt, steps, &group_comm.rank(r));
  });
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r;
    const std::string where = "rank " + std::to_string(r);
    // Every rank holds the same logits, bit for bit (the all-reduce sums in one order).
    EXPECT_EQ(got[r].prefill, got[0].prefill) << where;
    EXPECT_EQ(got[r].steps, got[0].steps) << where;
  }
  // The sharded model is the unsharded one up to the order of the o_proj / down_proj sums.
  expect_close(got[0].prefill, want.prefill, c.cfg.vocab_size, kTol, "prefill");
  ASSERT_EQ(got[0].steps.size(), want.steps.size());
  for (size_t i = 0; i < want.steps.size(); ++i) {
    expect_close(got[0].steps[i], want.steps[i], c.cfg.vocab_size,
                 want.read_decode_flush[i] ? kQuantizedTol : kTol, "step " + std::to_string(i));
  }
  // The quantized modes reach the looser comparison (a flush happens within the steps).
  if (kind != PathKind::kFp) {
    EXPECT_TRUE(want.read_decode_flush.back());
  }
  EXPECT_EQ(got[0].tokens, want.tokens);
  if (world == 1) {  // one rank is the unsharded model exactly
    EXPECT_EQ(got[0].prefill, want.prefill);
    EXPECT_EQ(got[0].steps, want.steps);
  }
}

std::vector<Case> cases() {
  return {
      {gqa_bias_config(), DType::BF16, true, "gqa+bias bf16"},
      {gqa_bias_config(), DType::F32, false, "gqa+qkv-bias f32"},
      {draft_aligned_config(), DType::F16, false, "draft-aligned f16"},
  };
}

class TensorParallelPaths : public ::testing::TestWithParam<PathKind> {};

TEST_P(TensorParallelPaths, ShardsMatchTheSingleRankModel) {
  for (const Case& c : cases()) {
    // The int4 draft matches the unsharded draft only where the column shards align to its
    // groups of 128 (docs/multi-gpu.md).
    if (GetParam() == PathKind::kQuantSpecDraft && c.cfg.q_dim() % (4 * 128) != 0) continue;
    for (int world : {1, 2, 4}) check_matches_single_rank(c, GetParam(), world);
  }
}

INSTANTIATE_TEST_SUITE_P(TensorParallel, TensorParallelPaths,
                         ::testing::Values(PathKind::kFp, PathKind::kInt8,
                                           PathKind::kQuantSpecDraft),
                         [](const ::testing::TestParamInfo<PathKind>& info) {
                           return std::string(info.param == PathKind::kFp     ? "Fp"
                                              : info.param == PathKind::kInt8 ? "Int8"
                                                                              : "QuantSpecDraft");
                         });

TEST(TensorParallel, ShardShapesAndStorage) {
  const ModelConfig cfg = gqa_bias_config();
  const TinyModel tiny = make_model(cfg, DType::BF16, 3, true);
  Result<ShardedWeights> s = shard_model(cfg, tiny.weights, 1, 4);
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ(s->cfg.num_heads, 2);
  EXPECT_EQ(s->cfg.num_kv_heads, 1);
  EXPECT_EQ(s->cfg.head_dim, 16);
  EXPECT_EQ(s->cfg.intermediate_size, 24);
  EXPECT_EQ(s->cfg.hidden_size, cfg.hidden_size);
  const LayerWeights& L = s->weights.layers[0];
  const LayerWeights& F = tiny.weights.layers[0];
  // Row slices are views of the original bytes; column slices are copies.
  EXPECT_EQ(L.wq.data, static_cast<const uint8_t*>(F.wq.data) + 32 * 64 * 2);
  EXPECT_EQ(L.wq.rows, 32);
  EXPECT_EQ(L.wk.rows, 16);
  EXPECT_EQ(L.bq.cols, 32);
  EXPECT_EQ(L.bo.data, F.bo.data);
  EXPECT_EQ(L.wo.rows, 64);
  EXPECT_EQ(L.wo.cols, 32);
  const uint16_t* wo = static_cast<const uint16_t*>(L.wo.data);
  const uint16_t* fo = static_cast<const uint16_t*>(F.wo.data);
  EXPECT_EQ(wo[5 * 32 + 3], fo[5 * 128 + 32 + 3]);
  EXPECT_EQ(L.w_down.cols, 24);
  EXPECT_EQ(s->weights.lm_head.data, tiny.weights.lm_head.data);
  EXPECT_EQ(s->storage.size(), 2 * cfg.num_layers);
}

TEST(TensorParallel, BadShapesAreClearErrors) {
  const TinyModel tiny = testing::make_tiny_model(testing::tiny_config(), DType::F32, 1);
  // tiny_config: 4 heads, 2 kv heads, intermediate 88.
  auto error_of = [&](const ModelConfig& cfg, const ModelWeights& w, int rank, int world) {
    Result<ShardedWeights> s = shard_model(cfg, w, rank, world);
    return s.ok() ? std::string() : s.error().message;
  };
  EXPECT_NE(
      error_of(tiny.cfg, tiny.weights, 0, 4)
          .find("num_key_value_heads (2) is not a multiple of the world size (4); replicating kv "
                "heads over ranks is not implemented"),
      std::string::npos)
      << error_of(tiny.cfg, tiny.weights, 0, 4);
  EXPECT_NE(error_of(tiny.cfg, tiny.weights, 0, 3)
                .find("num_attention_heads (4) is not a multiple of the world size (3)"),
            std::string::npos);
  EXPECT_NE(error_of(tiny.cfg, tiny.weights, 2, 2).find("rank 2 is out of range [0, 2)"),
            std::string::npos);
  EXPECT_NE(error_of(tiny.cfg, tiny.weights, 0, 0).find("world size must be >= 1"),
            std::string::npos);
  ModelConfig odd = testing::tiny_config();
  odd.intermediate_size = 90;
  odd.num_kv_heads = 4;
  const TinyModel mha = testing::make_tiny_model(odd, DType::F32, 1);
  EXPECT_NE(error_of(odd, mha.weights, 1, 4)
                .find("intermediate_size (90) is not a multiple of the world size (4)"),
            std::string::npos)
      << error_of(odd, mha.weights, 1, 4);
  // Inconsistent weights fail check_model first.
  ModelWeights broken = tiny.weights;
  broken.layers[1].wq.rows = 60;
  EXPECT_NE(error_of(tiny.cfg, broken, 0, 2).find("self_attn.q_proj.weight' has shape [60, 64]"),
            std::string::npos);
}

TEST(TensorParallel, CommunicatorSumsInRankOrderAndBroadcasts) {
  for (int world : {1, 2, 3, 4}) {
    LocalCommunicatorGroup g(world);
    std::vector<std::vector<float>> data(world);
    std::vector<int64_t> got(world, -1);
    run_ranks(world, [&](int r) {
      Communicator& c = g.rank(r);
      EXPECT_EQ(c.rank(), r);
      EXPECT_EQ(c.world(), world);
      for (int it = 0; it < 50; ++it) {
        data[r].assign(1000, 0.0f);
        for (int i = 0; i < 1000; ++i) data[r][i] = 0.1f * (r + 1) + 1e-3f * i + it;
        c.all_reduce_sum(data[r].data(), data[r].size());
        int64_t v = r == world - 1 ? 1000 + it : -1;
        c.broadcast(&v, sizeof(v), world - 1);
        got[r] = v;
      }
    });
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(data[r], data[0]);
      EXPECT_EQ(got[r], 1049);
    }
    float want = 0.1f * 1 + 1e-3f * 7 + 49;
    for (int r = 1; r < world; ++r) want += 0.1f * (r + 1) + 1e-3f * 7 + 49;
    EXPECT_EQ(data[0][7], want);
  }
}

// QuantSpec rounds on every rank, each with its own SpeculativeDecoder over its shard and cache:
// the logits are bit-identical on every rank, so with the same seed every rank makes the same
// accept/reject decisions; rank 0's are broadcast and every rank checks it agrees, and the
// committed tokens equal the unsharded model's.
TEST(TensorParallel, SpeculativeRoundsRunInLockstep) {
  const ModelConfig cfg = draft_aligned_config();
  const TinyModel tiny = make_model(cfg, DType::BF16, 21, false);
  const int group = 16, gamma = 3, rounds = 12, world = 4;
  const std::vector<int32_t> prompt = testing::random_prompt(29, cfg.vocab_size, 5);
  for (float temperature : {0.0f, 0.8f}) {
    SCOPED_TRACE("temperature " + std::to_string(temperature));
    SamplingParams sampling;
    sampling.temperature = temperature;
    auto run = [&](Model& model, KvCache& cache, Communicator* comm) {
      std::vector<int32_t> out;
      std::vector<float> logits(cfg.vocab_size);
      Status st = model.forward(prompt, 0, cache, target_path(cache.mode()), LogitRows::kLast,
                                logits.data());
      QS_CHECK(st.ok());
      cache.commit(static_cast<int>(prompt.size()));
      int32_t x = argmax(logits.data(), cfg.vocab_size);
      out.push_back(x);
      SpeculativeDecoder dec(model, model, cache);
      Rng rng(1234);
      GenerationStats stats;
      SpecCounters counters;
      for (int i = 0; i < rounds; ++i) {
        Result<RoundResult> res = dec.round(x, gamma, sampling, rng, stats, counters);
        QS_CHECK(res.ok());
        if (comm) {  // rank 0's decision: accepted count and tokens
          int32_t head[2] = {res->accepted, static_cast<int32_t>(res->tokens.size())};
          comm->broadcast(head, sizeof(head), 0);
          std::vector<int32_t> toks(static_cast<size_t>(head[1]));
          if (comm->rank() == 0) toks = res->tokens;
          comm->broadcast(toks.data(), toks.size() * sizeof(int32_t), 0);
          EXPECT_EQ(head[0], res->accepted) << "rank " << comm->rank() << " round " << i;
          EXPECT_EQ(toks, res->tokens) << "rank " << comm->rank() << " round " << i;
        }
        out.insert(out.end(), res->tokens.begin(), res->tokens.end());
        x = res->tokens.back();
      }
      return out;
    };
    CpuBackend backend(1);
    Model single(tiny.cfg, tiny.weights, backend);
    ASSERT_TRUE(single.make_draft_weights(DraftWeights::kInt4).ok());
    KvCache cache = make_cache(cfg, KvMode::kQuantSpec, group, gamma, backend);
    const std::vector<int32_t> want = run(single, cache, nullptr);

    LocalCommunicatorGroup comm(world);
    std::vector<std::vector<int32_t>> got(world);
    run_ranks(world, [&](int r) {
      Result<ShardedWeights> shard = shard_model(tiny.cfg, tiny.weights, r, world);
      QS_CHECK(shard.ok());
      CpuBackend rank_backend(1);
      Model model(shard->cfg, shard->weights, rank_backend);
      model.set_communicator(&comm.rank(r));
      QS_CHECK(model.make_draft_weights(DraftWeights::kInt4).ok());
      KvCache rank_cache = make_cache(shard->cfg, KvMode::kQuantSpec, group, gamma, rank_backend);
      got[r] = run(model, rank_cache, &comm.rank(r));
    });
    for (int r = 0; r < world; ++r) EXPECT_EQ(got[r], got[0]) << "rank " << r;
    if (temperature == 0.0f) {
      EXPECT_EQ(got[0], want);  // greedy: the unsharded tokens exactly
    }
    EXPECT_GT(got[0].size(), static_cast<size_t>(rounds));
  }
}

// ---- The engine: EngineOptions::tensor_parallel (--tp) ----

std::unique_ptr<LlmEngine> make_engine(const TinyModel& tiny, DecodeMode mode, KvType kv, int tp,
                                       int group = 32) {
  EngineOptions o = testing::mode_options(mode, kv);
  o.num_threads = 4;  // tp ranks of 4 / tp threads each
  o.group_size = group;
  o.tensor_parallel = tp;
  Result<std::unique_ptr<LlmEngine>> e = LlmEngine::create(tiny.cfg, tiny.weights, std::nullopt, o);
  EXPECT_TRUE(e.ok()) << e.error().message;
  return e.ok() ? std::move(e).value() : nullptr;
}

std::string engine_error(const TinyModel& tiny, DecodeMode mode, int tp) {
  EngineOptions o;
  o.num_threads = 2;
  o.mode = mode;
  o.tensor_parallel = tp;
  Result<std::unique_ptr<LlmEngine>> e = LlmEngine::create(tiny.cfg, tiny.weights, std::nullopt, o);
  return e.ok() ? std::string() : e.error().message;
}

struct EngineCase {
  DecodeMode mode;
  KvType kv;
  const char* name;
};

// LlmEngine with tensor_parallel 2 and 4 on the CPU: the prefill logits equal tensor_parallel 1's
// within 1e-5 relative, and generate gives the same greedy tokens (long enough to cross several
// flushes of G = 32), in AR fp, AR int8 and QuantSpec; then the same engine generates again
// (the caches are cleared on every rank); each token's log-probability is one rank's within 1e-4.
TEST(TensorParallelEngine, MatchesOneRank) {
  const std::vector<Case> models = {cases()[0], cases()[2]};  // gqa+bias bf16, draft-aligned f16
  const EngineCase modes[] = {{DecodeMode::kAr, KvType::kFp16, "ar fp"},
                              {DecodeMode::kAr, KvType::kInt8, "ar int8"},
                              {DecodeMode::kQuantSpec, KvType::kFp16, "quantspec"}};
  for (const Case& c : models) {
    const TinyModel tiny = make_model(c.cfg, c.dtype, 9, c.o_bias);
    const std::vector<int32_t> prompt = testing::random_prompt(37, c.cfg.vocab_size, 3);
    GenerationParams params;
    params.max_new_tokens = 90;
    params.stop_at_eos = false;
    params.logprobs = 2;  // rank 0's logits rows (QuantSpec: the stepwise rounds' verification)
    for (const EngineCase& m : modes) {
      std::unique_ptr<LlmEngine> one = make_engine(tiny, m.mode, m.kv, 1);
      ASSERT_TRUE(one);
      Result<std::vector<float>> want_logits = one->prefill_logits(prompt);
      ASSERT_TRUE(want_logits.ok());
      Result<GenerationResult> want = one->generate(prompt, params, {});
      ASSERT_TRUE(want.ok()) << want.error().message;
      ASSERT_EQ(want->tokens.size(), 90u);
      for (int tp : {2, 4}) {
        SCOPED_TRACE(c.name + " " + m.name + " tp " + std::to_string(tp));
        std::unique_ptr<LlmEngine> e = make_engine(tiny, m.mode, m.kv, tp);
        ASSERT_TRUE(e);
        EXPECT_EQ(e->tensor_parallel(), tp);
        EXPECT_EQ(e->config().num_heads, c.cfg.num_heads);  // the full model's config
        EXPECT_EQ(e->model().config().num_heads, c.cfg.num_heads / tp);
        EXPECT_EQ(e->max_context(), one->max_context());
        Result<std::vector<float>> logits = e->prefill_logits(prompt);
        ASSERT_TRUE(logits.ok()) << logits.error().message;
        expect_close(*logits, *want_logits, c.cfg.vocab_size, kTol, "prefill");
        for (int again = 0; again < 2; ++again) {
          Result<GenerationResult> got = e->generate(prompt, params, {});
          ASSERT_TRUE(got.ok()) << got.error().message;
          EXPECT_EQ(got->tokens, want->tokens) << "run " << again;
          ASSERT_EQ(got->logprobs.size(), want->logprobs.size());
          for (size_t i = 0; i < got->logprobs.size(); ++i) {
            EXPECT_NEAR(got->logprobs[i].logprob, want->logprobs[i].logprob, 1e-4) << i;
            EXPECT_EQ(got->logprobs[i].top[0].first, want->logprobs[i].top[0].first) << i;
          }
          EXPECT_EQ(got->stats.flushes, want->stats.flushes);
          // Summed over the ranks, whose caches hold kv_heads / tp heads each.
          EXPECT_EQ(e->kv_cache_bytes(), one->kv_cache_bytes());
          if (m.mode == DecodeMode::kQuantSpec) {
            EXPECT_GT(got->stats.rounds, 0);
            if (c.cfg.q_dim() % (4 * 128) == 0) {  // draft shards align: the same drafts
              EXPECT_EQ(got->stats.accepted, want->stats.accepted);
            }
          }
        }
      }
    }
  }
}

TEST(TensorParallelEngine, BadSizesAreClearErrors) {
  const TinyModel tiny = make_model(gqa_bias_config(), DType::F32, 2, false);  // 8 heads, 4 kv
  EXPECT_NE(engine_error(tiny, DecodeMode::kAr, 0).find("tensor parallel size (--tp) must be >= 1"),
            std::string::npos)
      << engine_error(tiny, DecodeMode::kAr, 0);
  EXPECT_NE(engine_error(tiny, DecodeMode::kAr, -2).find("must be >= 1, got -2"),
            std::string::npos);
  EXPECT_NE(
      engine_error(tiny, DecodeMode::kAr, 3)
          .find("--tp 3 (tensor parallel): num_attention_heads (8) is not a multiple of the world "
                "size (3)"),
      std::string::npos)
      << engine_error(tiny, DecodeMode::kAr, 3);
  EXPECT_NE(engine_error(tiny, DecodeMode::kQuantSpec, 8)
                .find("num_key_value_heads (4) is not a multiple of the world size (8)"),
            std::string::npos)
      << engine_error(tiny, DecodeMode::kQuantSpec, 8);
  for (DecodeMode mode : {DecodeMode::kStreamingLlm, DecodeMode::kSnapKv}) {
    const std::string err = engine_error(tiny, mode, 2);
    EXPECT_NE(err.find("is not with --tp yet"), std::string::npos) << err;
    EXPECT_NE(err.find(decode_mode_name(mode)), std::string::npos) << err;
  }
  EXPECT_EQ(engine_error(tiny, DecodeMode::kAr, 4), "");
  EXPECT_EQ(engine_error(tiny, DecodeMode::kSnapKv, 1), "");
}

}  // namespace
}  // namespace qs
