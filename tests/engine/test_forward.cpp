// The forward pass of tiny in-memory random models: against the double reference, and
// prefill == chunked prefill == token-by-token decode.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "tiny_model.h"

namespace qs {
namespace {

using testing::TinyModel;

std::vector<int32_t> test_ids(int n, int vocab) {
  std::vector<int32_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = (i * 37 + 11) % vocab;
  return ids;
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// max |a - b| / max |b|
double rel_diff(const std::vector<float>& a, const std::vector<double>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d / max_abs(b);
}

std::vector<double> widen(const std::vector<float>& v) {
  return {v.begin(), v.end()};
}

// All-row logits of ids run in chunks of `chunk` tokens from position 0.
std::vector<float> run_chunked(Model& model, const std::vector<int32_t>& ids, int chunk) {
  const int vocab = model.config().vocab_size;
  KvCache cache = testing::model_cache(model.config(), KvMode::kFp, 64, model.backend());
  std::vector<float> logits(ids.size() * vocab);
  for (size_t start = 0; start < ids.size(); start += chunk) {
    const size_t m = std::min<size_t>(chunk, ids.size() - start);
    Status st =
        model.forward(std::span<const int32_t>(ids.data() + start, m), static_cast<int>(start),
                      cache, ForwardPath{}, LogitRows::kAll, logits.data() + start * vocab);
    EXPECT_TRUE(st.ok());
    cache.commit(static_cast<int>(start + m));
  }
  return logits;
}

struct Variant {
  const char* name;
  DType dtype;
  int num_kv_heads;
  bool bias;
  bool tied;
  RopeScalingType rope;
};

void PrintTo(const Variant& v, std::ostream* os) {
  *os << v.name;
}

class ForwardTest : public ::testing::TestWithParam<Variant> {};

TEST_P(ForwardTest, PrefillDecodeAndChunksAgreeWithReference) {
  const Variant& var = GetParam();
  ModelConfig cfg = testing::tiny_config();
  cfg.num_kv_heads = var.num_kv_heads;
  cfg.attention_bias = var.bias;
  cfg.tie_word_embeddings = var.tied;
  cfg.rope_scaling.type = var.rope;
  if (var.rope == RopeScalingType::Linear) cfg.rope_scaling.factor = 2.0f;
  if (var.rope == RopeScalingType::Llama3) {
    cfg.rope_scaling.factor = 8.0f;
    cfg.rope_scaling.original_max_position_embeddings = 32;
  }
  if (var.rope == RopeScalingType::Yarn) {  // a ramp across the pairs; scores x 1.3^2
    cfg.rope_scaling.factor = 4.0f;
    cfg.rope_scaling.original_max_position_embeddings = 64;
    cfg.rope_scaling.attention_factor = 1.3;
  }
  TinyModel tiny = testing::make_tiny_model(cfg, var.dtype, 17);
  ASSERT_TRUE(check_model(cfg, tiny.weights).ok())
      << check_model(cfg, tiny.weights).error().message;
  CpuBackend cpu(2);
  Model model(cfg, tiny.weights, cpu);

  const std::vector<int32_t> ids = test_ids(21, cfg.vocab_size);
  const std::vector<double> want = testing::reference_forward(cfg, tiny.weights, ids);

  const std::vector<float> one_shot = run_chunked(model, ids, 64);  // m = 21: sgemm path
  EXPECT_LT(rel_diff(one_shot, want), 1e-5) << "prefill vs reference";

  const std::vector<double> one_shot_d = widen(one_shot);
  for (int chunk : {1, 3, 8, 10}) {  // 1: decode token by token; 3, 8: gemv; 10: sgemm
    EXPECT_LT(rel_diff(run_chunked(model, ids, chunk), one_shot_d), 1e-5) << "chunk " << chunk;
  }

  // kLast gives the last row of kAll.
  KvCache cache = testing::model_cache(cfg, KvMode::kFp, 64, cpu);
  std::vector<float> last(cfg.vocab_size);
  ASSERT_TRUE(model.forward(ids, 0, cache, ForwardPath{}, LogitRows::kLast, last.data()).ok());
  const std::vector<float> want_last(one_shot.end() - cfg.vocab_size, one_shot.end());
  EXPECT_LT(rel_diff(last, widen(want_last)), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(
    Variants, ForwardTest,
    ::testing::Values(
        Variant{"f32_gqa2", DType::F32, 2, false, false, RopeScalingType::None},
        Variant{"f32_mha_bias", DType::F32, 4, true, false, RopeScalingType::None},
        Variant{"bf16_mqa_tied", DType::BF16, 1, false, true, RopeScalingType::Llama3},
        Variant{"f16_linear_rope", DType::F16, 2, true, false, RopeScalingType::Linear},
        Variant{"f32_yarn_rope", DType::F32, 2, false, false, RopeScalingType::Yarn}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(Forward, RollbackThenRewriteMatchesFreshRun) {
  // Write 12 tokens, truncate to 8, continue with different tokens: same logits as running the
  // final sequence from scratch (stale rows are never read).
  ModelConfig cfg = testing::tiny_config();
  TinyModel tiny = testing::make_tiny_model(cfg, DType::F32, 3);
  CpuBackend cpu(2);
  Model model(cfg, tiny.weights, cpu);
  const int vocab = cfg.vocab_size;
  std::vector<int32_t> a = test_ids(12, vocab);
  std::vector<int32_t> b(a.begin(), a.begin() + 8);
  for (int32_t t : {5, 6, 7}) b.push_back(t);

  KvCache cache = testing::model_cache(cfg, KvMode::kFp, 32, cpu);
  std::vector<float> logits(12 * vocab);
  ASSERT_TRUE(model.forward(a, 0, cache, ForwardPath{}, LogitRows::kAll, logits.data()).ok());
  cache.commit(8);  // rows 8..11 are dropped: the rejected tail of a speculative round
  std::vector<float> cont(3 * vocab);
  ASSERT_TRUE(model
                  .forward(std::span<const int32_t>(b.data() + 8, 3), 8, cache, ForwardPath{},
                           LogitRows::kAll, cont.data())
                  .ok());
  const std::vector<float> fresh = run_chunked(model, b, 64);
  const std::vector<float> fresh_tail(fresh.begin() + 8 * vocab, fresh.end());
  EXPECT_LT(rel_diff(cont, widen(fresh_tail)), 1e-5);
}

// forward with `argmax` hands back exactly the argmax of each row forward would return (kLast,
// kAll; the draft path with 4-bit weights too), and leaves the cache as forward does.
TEST(Forward, ArgmaxRowsAreTheLogitsArgmax) {
  ModelConfig cfg = testing::tiny_config();
  TinyModel tiny = testing::make_tiny_model(cfg, DType::F32, 6);
  CpuBackend cpu(2);
  Model model(cfg, tiny.weights, cpu);
  ASSERT_TRUE(model.make_draft_weights(DraftWeights::kInt4, 1).ok());
  const int vocab = cfg.vocab_size;
  const std::vector<int32_t> ids = test_ids(9, vocab);
  for (bool draft : {false, true}) {
    ForwardPath path;
    path.draft_weights = draft;
    KvCache a = testing::model_cache(cfg, KvMode::kFp, 32, cpu);
    KvCache b = testing::model_cache(cfg, KvMode::kFp, 32, cpu);
    std::vector<float> logits(ids.size() * vocab);
    std::vector<int32_t> tokens(ids.size(), -1);
    ASSERT_TRUE(model.forward(ids, 0, a, path, LogitRows::kAll, logits.data()).ok());
    ASSERT_TRUE(model.forward(ids, 0, b, path, LogitRows::kAll, nullptr, tokens.data()).ok());
    for (size_t r = 0; r < ids.size(); ++r) {
      EXPECT_EQ(tokens[r], argmax(logits.data() + r * vocab, vocab)) << "row " << r;
    }
    a.commit(9);
    b.commit(9);
    const std::vector<int32_t> next = {3};
    int32_t last = -1;
    ASSERT_TRUE(model.forward(next, 9, a, path, LogitRows::kLast, logits.data()).ok());
    ASSERT_TRUE(model.forward(next, 9, b, path, LogitRows::kLast, nullptr, &last).ok());
    EXPECT_EQ(last, argmax(logits.data(), vocab)) << (draft ? "draft" : "target");
  }
}

// A CPU backend that defers every one-row norm, as the CUDA backend defers the draft's: the
// producer adds into h and leaves the norm's rows NaN; the consumers normalize h themselves (the
// same rmsnorm, so the same bits). The logits must equal the plain backend's: every reader of a
// deferred norm goes through Backend::matmul_group_normed / gate_up_swiglu_normed.
class DeferringCpuBackend : public CpuBackend {
 public:
  using CpuBackend::CpuBackend;
  int deferred = 0;  // producers that deferred

  void linear_add_rmsnorm_deferred(const float* x, int m, const LinearOp& op,
                                   PendingNorm& pn) override {
    if (m != 1) return CpuBackend::linear_add_rmsnorm_deferred(x, m, op, pn);
    const int64_t d = pn.weight->numel();
    matmul_group(x, m, &op, 1);
    add(pn.h, op.y, d);
    std::fill(pn.out, pn.out + d, std::nanf(""));
    pn.deferred = true;
    ++deferred;
  }
  void matmul_group_normed(const PendingNorm& pn, int m, const LinearOp* ops, int count) override {
    matmul_group(rows_of(pn, m), m, ops, count);
  }
  void gate_up_swiglu_normed(const PendingNorm& pn, int m, const LinearOp& gate, const LinearOp& up,
                             float* out) override {
    gate_up_swiglu(rows_of(pn, m), m, gate, up, out);
  }

 private:
  std::vector<float> normed_;
  const float* rows_of(const PendingNorm& pn, int m) {
    if (!pn.deferred) return pn.out;
    normed_.resize(static_cast<size_t>(m * pn.weight->numel()));
    rmsnorm(pn.h, *pn.weight, m, pn.eps, normed_.data());
    return normed_.data();
  }
};

TEST(Forward, DeferredNormsReachOnlyTheirConsumers) {
  ModelConfig cfg = testing::tiny_config();
  TinyModel tiny = testing::make_tiny_model(cfg, DType::F32, 8);
  CpuBackend cpu(2);
  DeferringCpuBackend deferring(2);
  Model plain(cfg, tiny.weights, cpu), model(cfg, tiny.weights, deferring);
  ASSERT_TRUE(plain.make_draft_weights(DraftWeights::kInt4, 1).ok());
  ASSERT_TRUE(model.make_draft_weights(DraftWeights::kInt4, 1).ok());
  const int vocab = cfg.vocab_size;
  const std::vector<int32_t> ids = test_ids(7, vocab);
  for (bool draft : {false, true}) {
    ForwardPath path;
    path.draft_weights = draft;
    KvCache a = testing::model_cache(cfg, KvMode::kFp, 32, cpu);
    KvCache b = testing::model_cache(cfg, KvMode::kFp, 32, deferring);
    std::vector<float> want(ids.size() * vocab), got(ids.size() * vocab);
    ASSERT_TRUE(plain.forward(ids, 0, a, path, LogitRows::kAll, want.data()).ok());
    ASSERT_TRUE(model.forward(ids, 0, b, path, LogitRows::kAll, got.data()).ok());
    EXPECT_EQ(got, want) << (draft ? "draft" : "target") << " prefill";
    a.commit(7);
    b.commit(7);
    for (int32_t t : {3, 5}) {  // one-row steps: every layer's two norms deferred
      const int pos = static_cast<int>(a.length());
      const int before = deferring.deferred;
      ASSERT_TRUE(plain.forward({&t, 1}, pos, a, path, LogitRows::kLast, want.data()).ok());
      ASSERT_TRUE(model.forward({&t, 1}, pos, b, path, LogitRows::kLast, got.data()).ok());
      EXPECT_EQ(deferring.deferred - before, 2 * cfg.num_layers - 1);
      EXPECT_TRUE(std::equal(got.begin(), got.begin() + vocab, want.begin()))
          << (draft ? "draft" : "target") << " step at " << pos;
      a.commit(pos + 1);
      b.commit(pos + 1);
    }
  }
}

TEST(Forward, UserErrors) {
  ModelConfig cfg = testing::tiny_config();
  TinyModel tiny = testing::make_tiny_model(cfg, DType::F32, 4);
  CpuBackend cpu(1);
  Model model(cfg, tiny.weights, cpu);
  KvCache cache = testing::model_cache(cfg, KvMode::kFp, 8, cpu);
  std::vector<float> logits(cfg.vocab_size * 9);

  const std::vector<int32_t> bad = {1, 97};
  Status st = model.forward(bad, 0, cache, ForwardPath{}, LogitRows::kLast, logits.data());
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("token id 97 is out of range [0, 97)"), std::string::npos);

  const std::vector<int32_t> nine(9, 1);
  st = model.forward(nine, 0, cache, ForwardPath{}, LogitRows::kLast, logits.data());
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("context is full"), std::string::npos);
  EXPECT_EQ(cache.length(), 0);
}

TEST(Forward, CheckModelNamesTheBadTensor) {
  ModelConfig cfg = testing::tiny_config();
  TinyModel tiny = testing::make_tiny_model(cfg, DType::F32, 5);
  ModelWeights w = tiny.weights;
  w.layers[1].wk.rows = 48;
  w.layers[1].wk.name = "model.layers.1.self_attn.k_proj.weight";
  Status st = check_model(cfg, w);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().message,
            "model weights: tensor 'model.layers.1.self_attn.k_proj.weight' has shape [48, 64], "
            "expected [32, 64]");

  ModelConfig bad = cfg;
  bad.num_kv_heads = 3;
  st = check_model(bad, tiny.weights);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("num_key_value_heads"), std::string::npos);

  ModelConfig biased = cfg;
  biased.attention_bias = true;  // biases required but absent
  st = check_model(biased, tiny.weights);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("q_proj.bias"), std::string::npos);
}

}  // namespace
}  // namespace qs
