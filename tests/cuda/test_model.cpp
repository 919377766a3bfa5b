// Whole-model conformance on the committed tiny models (models/test/*): the same logits on CUDA
// as on the CPU, through prefill (cuBLAS + flash prefill), decode and a verification block.
//
// The engine's Model::forward keeps its KV cache in host memory (FpKvCache) and copies K/V
// rows with memcpy, so it cannot run on device memory yet. The forward below is the same op
// sequence with the cache in backend memory (written through Backend::copy); run on the CPU
// backend it must reproduce Model::forward, which ties it to the engine.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "backend/rope_freq.h"
#include "cuda_test_util.h"
#include "engine/model.h"
#include "kv/fp_cache.h"
#include "model/config.h"
#include "model/weights.h"

namespace qs {
namespace {

using testing::CudaOpsTest;
using testing::rel_error;

// The forward pass of engine/model.cpp over any backend, KV cache in backend memory.
class BackendForward {
 public:
  BackendForward(Backend& be, const ModelConfig& cfg, const ModelWeights& w, int capacity)
      : be_(be), cfg_(cfg), w_(w), capacity_(capacity), inv_freq_(rope_inv_freq(cfg)) {
    const size_t per_layer = size_t(capacity) * cfg.kv_dim();
    k_ = be.alloc(per_layer * cfg.num_layers);
    v_ = be.alloc(per_layer * cfg.num_layers);
  }

  // Logits of every row of `ids` at positions [pos, pos + m), host [m, vocab].
  std::vector<float> forward(std::span<const int32_t> ids, int pos) {
    const int m = static_cast<int>(ids.size());
    EXPECT_LE(pos + m, capacity_);
    const int64_t d = cfg_.hidden_size, inter = cfg_.intermediate_size, kvd = cfg_.kv_dim();
    auto h = be_.alloc(size_t(m) * d), x = be_.alloc(size_t(m) * d);
    auto q = be_.alloc(size_t(m) * cfg_.q_dim()), k = be_.alloc(size_t(m) * kvd),
         v = be_.alloc(size_t(m) * kvd), attn = be_.alloc(size_t(m) * cfg_.q_dim());
    auto proj = be_.alloc(size_t(m) * d), gate = be_.alloc(size_t(m) * inter),
         up = be_.alloc(size_t(m) * inter);
    const AttentionShape shape{cfg_.num_heads, cfg_.num_kv_heads, cfg_.head_dim,
                               static_cast<float>(1.0 / std::sqrt(double(cfg_.head_dim)))};
    const float eps = cfg_.rms_norm_eps;

    be_.embedding(w_.tok_embeddings, ids.data(), m, h->data());
    for (int l = 0; l < cfg_.num_layers; ++l) {
      const LayerWeights& L = w_.layers[l];
      be_.rmsnorm(h->data(), L.attn_norm, m, eps, x->data());
      be_.matmul(x->data(), m, L.wq, &L.bq, q->data());
      be_.matmul(x->data(), m, L.wk, &L.bk, k->data());
      be_.matmul(x->data(), m, L.wv, &L.bv, v->data());
      be_.rope(q->data(), m, cfg_.num_heads, cfg_.head_dim, pos, inv_freq_.data());
      be_.rope(k->data(), m, cfg_.num_kv_heads, cfg_.head_dim, pos, inv_freq_.data());
      float* k_layer = k_->data() + int64_t(l) * capacity_ * kvd;
      float* v_layer = v_->data() + int64_t(l) * capacity_ * kvd;
      be_.copy(k_layer + int64_t(pos) * kvd, k->data(), size_t(m) * kvd);
      be_.copy(v_layer + int64_t(pos) * kvd, v->data(), size_t(m) * kvd);
      be_.attention(q->data(), m, pos, shape, KvView{k_layer, v_layer, kvd, pos + m}, attn->data());
      be_.matmul(attn->data(), m, L.wo, &L.bo, proj->data());
      be_.add(h->data(), proj->data(), m * d);
      be_.rmsnorm(h->data(), L.mlp_norm, m, eps, x->data());
      be_.matmul(x->data(), m, L.w_gate, nullptr, gate->data());
      be_.matmul(x->data(), m, L.w_up, nullptr, up->data());
      be_.swiglu(gate->data(), up->data(), m * inter, gate->data());
      be_.matmul(gate->data(), m, L.w_down, nullptr, proj->data());
      be_.add(h->data(), proj->data(), m * d);
    }
    auto logits = be_.alloc(size_t(m) * cfg_.vocab_size);
    be_.rmsnorm(h->data(), w_.final_norm, m, eps, x->data());
    be_.matmul(x->data(), m, w_.lm_head, nullptr, logits->data());
    std::vector<float> out(size_t(m) * cfg_.vocab_size);
    be_.to_host(logits->data(), out.data(), out.size());
    return out;
  }

 private:
  Backend& be_;
  const ModelConfig& cfg_;
  const ModelWeights& w_;
  int capacity_;
  std::vector<float> inv_freq_;
  std::unique_ptr<Buffer> k_, v_;  // [layers, capacity, kv_dim] f32
};

// Prefill below and above the skinny-GEMM limit, decode steps and a verification block.
struct Step {
  int m;
};
constexpr Step kSteps[] = {{9}, {23}, {1}, {1}, {1}, {5}, {16}, {40}};

std::vector<int32_t> token_ids(int n, int vocab) {
  std::vector<int32_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = static_cast<int32_t>((i * 7919 + 17) % vocab);
  return ids;
}

class CudaModelTest : public CudaOpsTest, public ::testing::WithParamInterface<const char*> {};

TEST_P(CudaModelTest, LogitsMatchCpu) {
  const std::filesystem::path dir =
      std::filesystem::path(QS_SOURCE_DIR) / "models/test" / GetParam();
  auto cfg = load_model_config(dir);
  ASSERT_TRUE(cfg.ok()) << cfg.error().message;
  ASSERT_TRUE(CudaBackend::check_supported(*cfg).ok());
  auto weights = load_model_weights(dir, *cfg);
  ASSERT_TRUE(weights.ok()) << weights.error().message;
  ASSERT_TRUE(check_model(*cfg, *weights).ok());

  int total = 0;
  for (const Step& s : kSteps) total += s.m;
  const std::vector<int32_t> ids = token_ids(total, cfg->vocab_size);
  const int vocab = cfg->vocab_size;

  // The engine on the CPU: the reference.
  Model model(*cfg, *weights, cpu());
  FpKvCache cache(cfg->num_layers, total, cfg->kv_dim());
  BackendForward on_cpu(cpu(), *cfg, *weights, total);
  gpu().prepare_weights(*weights);
  BackendForward on_gpu(gpu(), *cfg, *weights, total);

  int pos = 0;
  double worst = 0;
  for (const Step& s : kSteps) {
    std::span<const int32_t> chunk(ids.data() + pos, s.m);
    std::vector<float> engine_logits(size_t(s.m) * vocab);
    ASSERT_TRUE(model.forward(chunk, pos, cache, LogitRows::kAll, engine_logits.data()).ok());
    const std::vector<float> cpu_logits = on_cpu.forward(chunk, pos);
    const std::vector<float> gpu_logits = on_gpu.forward(chunk, pos);
    // Same ops on the same backend: the test's forward is the engine's (the CPU backend is
    // not bitwise reproducible across buffer addresses, hence not exact equality).
    EXPECT_LT(rel_error(cpu_logits, engine_logits), 1e-5) << "pos=" << pos << " m=" << s.m;
    const double err = rel_error(gpu_logits, engine_logits);
    EXPECT_LT(err, 1e-4) << GetParam() << " pos=" << pos << " m=" << s.m;
    worst = std::max(worst, err);
    pos += s.m;
  }
  std::printf("[ max rel error ] %s logits: %.3g\n", GetParam(), worst);
}

INSTANTIATE_TEST_SUITE_P(TinyModels, CudaModelTest,
                         ::testing::Values("llama2-tiny", "llama3-tiny", "mistral-tiny",
                                           "qwen2-tiny"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string name = info.param;
                           for (char& c : name) {
                             if (c == '-') c = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace qs
