// Sparse-KV drafts (StreamingLLM, SnapKV): the index each policy builds, the CPU attention over
// a selection against a gathered reference, greedy equality with AR over the full-precision
// cache, statistics and bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "core/thread_pool.h"
#include "engine/llm_engine.h"
#include "kv/sparse_select.h"
#include "tiny_model.h"

namespace qs {
namespace {

using testing::TinyModel;

std::vector<int32_t> head_positions(const KvSelection& s, int kvh) {
  return {s.positions + kvh * s.count, s.positions + (kvh + 1) * s.count};
}

TEST(SparseSelect, KeepCountIsAFractionOrACount) {
  EXPECT_EQ(sparse_keep_count(0.25, 1000), 250);
  EXPECT_EQ(sparse_keep_count(0.25, 1), 1);
  EXPECT_EQ(sparse_keep_count(64, 1000), 64);
  EXPECT_EQ(sparse_keep_count(5000, 1000), 1000);
}

TEST(SparseSelect, StreamingKeepsSinksAndTheRecentWindow) {
  SparseDraftIndex idx;
  idx.build_streaming(/*layers=*/2, /*kv heads=*/3, /*prompt=*/100, /*keep=*/10, /*sinks=*/4);
  for (int l = 0; l < 2; ++l) {
    const KvSelection& s = idx.layers()[l];
    EXPECT_EQ(s.count, 4);
    EXPECT_EQ(s.dense_from, 94);
    for (int h = 0; h < 3; ++h) EXPECT_EQ(head_positions(s, h), (std::vector<int32_t>{0, 1, 2, 3}));
  }
  EXPECT_EQ(idx.bytes(), 2u * 3 * 4 * sizeof(int32_t));
  idx.build_streaming(1, 1, 10, 10, 4);  // keeps everything: a dense view
  EXPECT_EQ(idx.layers()[0].count, 0);
  EXPECT_EQ(idx.layers()[0].dense_from, 0);
}

TEST(SparseSelect, SnapKvPicksWhatTheWindowAttendsToPerHead) {
  const int P = 80, W = 8, hd = 8, keep = W + 4;
  const AttentionShape shape{4, 2, hd, 1.0f / std::sqrt(float(hd))};  // 2 query heads per kv head
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 0.1f);
  std::vector<float> k(size_t(P) * 2 * hd), q(size_t(W) * 4 * hd);
  for (float& x : k) x = nd(rng);
  for (float& x : q) x = nd(rng);
  // Every query of kv head 0's group points at channel 0, of kv head 1's at channel 1; the keys
  // at 20 (head 0) and 60 (head 1) answer strongly.
  for (int i = 0; i < W; ++i) {
    for (int h = 0; h < 4; ++h) q[(size_t(i) * 4 + h) * hd + (h < 2 ? 0 : 1)] = 4.0f;
  }
  k[(size_t(20) * 2 + 0) * hd + 0] = 8.0f;
  k[(size_t(60) * 2 + 1) * hd + 1] = 8.0f;
  SparseDraftIndex idx;
  idx.begin_snapkv(1, 2, P, keep, W);
  idx.select_snapkv_layer(0, q.data(), k.data(), 2 * hd, shape, /*kernel=*/7);
  const KvSelection& s = idx.layers()[0];
  EXPECT_EQ(s.count, 4);
  EXPECT_EQ(s.dense_from, P - W);
  const auto h0 = head_positions(s, 0), h1 = head_positions(s, 1);
  EXPECT_TRUE(std::is_sorted(h0.begin(), h0.end()));
  // Pooling spreads the peak to its neighbours: the kept positions cluster around it.
  for (int32_t p : h0) EXPECT_LE(std::abs(p - 20), 3) << p;
  for (int32_t p : h1) EXPECT_LE(std::abs(p - 60), 3) << p;
  EXPECT_NE(std::find(h0.begin(), h0.end(), 20), h0.end());
  EXPECT_NE(std::find(h1.begin(), h1.end(), 60), h1.end());

  // Spreading the kv heads over threads selects the same positions.
  ThreadPool pool(3);
  SparseDraftIndex threaded;
  threaded.begin_snapkv(1, 2, P, keep, W);
  threaded.select_snapkv_layer(0, q.data(), k.data(), 2 * hd, shape, 7, &pool);
  EXPECT_EQ(head_positions(threaded.layers()[0], 0), h0);
  EXPECT_EQ(head_positions(threaded.layers()[0], 1), h1);
}

TEST(SparseAttention, EqualsDenseAttentionOverTheGatheredRows) {
  const int hd = 16, kvh = 2, nh = 4, len = 50, m = 3, pos = len - m;
  const AttentionShape shape{nh, kvh, hd, 1.0f / std::sqrt(float(hd))};
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> k(size_t(len) * kvh * hd), v(k.size()), q(size_t(m) * nh * hd);
  for (float& x : k) x = nd(rng);
  for (float& x : v) x = nd(rng);
  for (float& x : q) x = nd(rng);
  const std::vector<int32_t> positions{0, 1, 7, 30, 2, 5, 6, 31};  // [kv heads, 4]
  const KvSelection sel{positions.data(), 4, 40};
  KvView view{k.data(), v.data(), kvh * hd, len};
  view.selection = &sel;
  KvReadBytes rb;
  view.read_bytes = &rb;
  std::vector<float> out(q.size());
  CpuBackend cpu(2);
  cpu.attention(q.data(), m, pos, shape, view, out.data());
  for (int i = 0; i < m; ++i) {
    for (int h = 0; h < nh; ++h) {
      const int g = h / (nh / kvh);
      std::vector<int> seen(positions.begin() + g * 4, positions.begin() + g * 4 + 4);
      for (int t = 40; t <= pos + i; ++t) seen.push_back(t);
      std::vector<double> s;
      double mx = -1e300, sum = 0;
      for (int t : seen) {
        double d = 0;
        for (int c = 0; c < hd; ++c) d += double(q[(i * nh + h) * hd + c]) * k[(t * kvh + g) * hd + c];
        s.push_back(d * shape.scale);
        mx = std::max(mx, s.back());
      }
      for (double& x : s) sum += (x = std::exp(x - mx));
      for (int c = 0; c < hd; ++c) {
        double want = 0;
        for (size_t j = 0; j < seen.size(); ++j) want += s[j] / sum * v[(seen[j] * kvh + g) * hd + c];
        EXPECT_NEAR(out[(i * nh + h) * hd + c], want, 1e-4) << i << " " << h << " " << c;
      }
    }
  }
  EXPECT_EQ(rb.fp, int64_t(kvh) * 2 * (4 + len - 40) * hd * 4);
}

ModelConfig sparse_config() {
  ModelConfig cfg = testing::tiny_config();
  cfg.vocab_size = 97;
  cfg.max_position_embeddings = 4096;
  return cfg;
}

std::unique_ptr<LlmEngine> make_engine(const TinyModel& tiny, EngineOptions o) {
  o.num_threads = 2;
  o.max_context = 512;
  return testing::make_tiny_engine(tiny, o);
}

// Prompt ids below 97 (the tiny model's vocabulary is larger).
std::vector<int32_t> prompt_ids(int n, uint32_t seed) { return testing::random_prompt(n, 97, seed); }

TEST(SparseDraft, GreedyEqualsArFullPrecisionTokenForToken) {
  const TinyModel tiny = testing::make_tiny_model(sparse_config(), DType::BF16, 31);
  auto ar = make_engine(tiny, EngineOptions{});
  ASSERT_TRUE(ar);
  for (DecodeMode mode : {DecodeMode::kStreamingLlm, DecodeMode::kSnapKv}) {
    for (DraftWeights dw : {DraftWeights::kNative, DraftWeights::kInt4}) {
      EngineOptions o;
      o.mode = mode;
      o.draft_weights = dw;
      o.gamma = 5;
      o.draft_budget = 0.2;
      o.snap_window = 8;
      o.prefill_chunk = 37;  // the observation window spans chunks
      auto sp = make_engine(tiny, o);
      ASSERT_TRUE(sp);
      for (int len : {3, 60, 150}) {
        const auto prompt = prompt_ids(len, 100 + len);
        auto want = ar->generate(prompt, testing::greedy_params(70), nullptr);
        auto got = sp->generate(prompt, testing::greedy_params(70), nullptr);
        ASSERT_TRUE(want.ok() && got.ok());
        EXPECT_EQ(got->tokens, want->tokens) << decode_mode_name(mode) << " prompt " << len;
        const GenerationStats& st = got->stats;
        EXPECT_GT(st.rounds, 0);
        EXPECT_EQ(st.draft_index_bytes, static_cast<int64_t>(sp->sparse_index().bytes()));
        if (len == 150) {
          EXPECT_GT(st.draft_index_bytes, 0);
          // The draft streams fewer K/V rows than the target reads.
          EXPECT_LT(st.draft_kv_fp_bytes, st.target_kv_fp_bytes);
        }
      }
    }
  }
}

TEST(SparseDraft, SamplingIsSeededAndEmitsTheRequestedLength) {
  const TinyModel tiny = testing::make_tiny_model(sparse_config(), DType::BF16, 32);
  EngineOptions o;
  o.mode = DecodeMode::kSnapKv;
  o.snap_window = 8;
  auto sp = make_engine(tiny, o);
  ASSERT_TRUE(sp);
  GenerationParams p = testing::greedy_params(40);
  p.sampling.temperature = 0.8f;
  p.sampling.seed = 7;
  auto a = sp->generate(prompt_ids(90, 5), p, nullptr);
  auto b = sp->generate(prompt_ids(90, 5), p, nullptr);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->tokens.size(), 40u);
  EXPECT_EQ(a->tokens, b->tokens);
}

TEST(SparseDraft, BadOptionsAreClearErrors) {
  const TinyModel tiny = testing::make_tiny_model(sparse_config(), DType::BF16, 33);
  auto fails = [&](EngineOptions o, const std::string& needle) {
    o.max_context = 256;
    auto e = LlmEngine::create(tiny.cfg, tiny.weights, std::nullopt, o);
    ASSERT_FALSE(e.ok());
    EXPECT_NE(e.error().message.find(needle), std::string::npos) << e.error().message;
  };
  EngineOptions o;
  o.mode = DecodeMode::kStreamingLlm;
  o.draft_budget = 0;
  fails(o, "draft budget");
  o.draft_budget = 0.25;
  o.kv = KvType::kInt8;
  o.kv_explicit = true;
  fails(o, "--kv");
  o = EngineOptions{};
  o.mode = DecodeMode::kSnapKv;
  o.snap_kernel = 4;
  fails(o, "kernel");
}

}  // namespace
}  // namespace qs
