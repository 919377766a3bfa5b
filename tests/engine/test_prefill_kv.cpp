// EngineOptions::prefill_kv (--prefill-kv): with kQuantized the quantized modes commit every
// prefill chunk before the next, so the full-precision buffer never holds more than a chunk plus
// the steady rows (instead of the whole prompt), later chunks read the history through the mode's
// view (the same computation as sequence_logits, which commits chunk by chunk), and the
// speculative invariant still holds (greedy QuantSpec = greedy AR INT8, both prefilled so).
// With kExact a quantized cache is prefilled layer by layer (EngineOptions::prefill_by_layer): one
// layer's full-precision rows at a time, and bit for bit what chunk by chunk gives.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "engine/llm_engine.h"
#include "tiny_model.h"

namespace qs {
namespace {

using testing::greedy_params;
using testing::random_prompt;
using testing::TinyModel;

constexpr int kVocab = testing::kEngineTestVocab;
constexpr int kGroup = testing::kEngineTestGroup;
constexpr int kChunk = testing::kEngineTestChunk;
constexpr int kGamma = testing::kEngineTestGamma;

ModelConfig config() {
  return testing::engine_test_config();
}

EngineOptions options(DecodeMode mode, KvType kv, PrefillKv prefill) {
  return testing::engine_test_options(mode, kv, prefill);
}

// The largest full-precision buffer (bytes) seen after any prefill chunk of a greedy run, and
// that run's tokens.
struct PrefillRun {
  size_t max_buffer = 0;
  std::vector<int32_t> tokens;
};

PrefillRun run(LlmEngine& e, const std::vector<int32_t>& prompt, int n) {
  const QuantizedPlanes* planes = e.cache().planes();
  const size_t plane_bytes = planes ? static_cast<size_t>(planes->shape().total_bytes()) : 0;
  PrefillRun r;
  GenerationParams p = greedy_params(n);
  p.on_prefill_progress = [&](int, int) {
    r.max_buffer = std::max(r.max_buffer, e.kv_cache_bytes() - plane_bytes);
  };
  auto got = e.generate(prompt, p, nullptr);
  EXPECT_TRUE(got.ok()) << got.error().message;
  if (got.ok()) r.tokens = got->tokens;
  return r;
}

TEST(PrefillKv, QuantizedPrefillHoldsAChunkNotThePrompt) {
  const ModelConfig cfg = config();
  const TinyModel tiny = testing::make_tiny_model(cfg, DType::BF16, 51);
  const std::vector<int32_t> prompt = random_prompt(700, kVocab, 5);
  // Bytes of one full-precision row (K and V, every layer, f32 rows on the CPU).
  const size_t row_bytes = size_t{2} * cfg.num_layers * cfg.kv_dim() * sizeof(float);
  const size_t steady_rows = 2 * kGroup + kGamma + 1;
  for (const auto& [mode, kv] :
       {std::pair{DecodeMode::kAr, KvType::kInt8}, std::pair{DecodeMode::kAr, KvType::kInt4},
        std::pair{DecodeMode::kQuantSpec, KvType::kFp16}}) {
    SCOPED_TRACE(std::string(decode_mode_name(mode)) + " " + kv_type_name(kv));
    EngineOptions by_chunk = options(mode, kv, PrefillKv::kExact);
    by_chunk.prefill_by_layer = false;
    auto exact = testing::make_tiny_engine(tiny, by_chunk);
    auto by_layer = testing::make_tiny_engine(tiny, options(mode, kv, PrefillKv::kExact));
    auto quant = testing::make_tiny_engine(tiny, options(mode, kv, PrefillKv::kQuantized));
    ASSERT_TRUE(exact && by_layer && quant);
    const PrefillRun a = run(*exact, prompt, 20), b = run(*quant, prompt, 20);
    const PrefillRun c = run(*by_layer, prompt, 20);
    EXPECT_GE(a.max_buffer, prompt.size() * row_bytes);  // every prompt row at once
    EXPECT_LE(b.max_buffer, (kChunk + steady_rows) * row_bytes);
    EXPECT_EQ(b.tokens.size(), 20u);
    // Layer by layer: one layer's prompt rows (and the steady rows of every layer).
    const size_t layer_rows = prompt.size() * row_bytes / cfg.num_layers;
    EXPECT_GE(c.max_buffer, layer_rows);
    EXPECT_LE(c.max_buffer, layer_rows + steady_rows * row_bytes);
    EXPECT_EQ(c.tokens, a.tokens);
  }
}

// Everything a prefill leaves in a quantized cache, as host bytes (CPU backend): the counters,
// each layer's full-precision rows [fp_base, n), and the planes' codes and metadata of the
// complete groups.
std::vector<uint8_t> cache_state(const KvCache& c) {
  std::vector<uint8_t> out;
  auto put = [&out](const void* p, size_t bytes) {
    const auto* b = static_cast<const uint8_t*>(p);
    out.insert(out.end(), b, b + bytes);
  };
  const int counters[] = {c.length(), c.written_end(), c.fp_base(), c.planes_length(), c.flushes()};
  put(counters, sizeof(counters));
  const KvCacheConfig& cfg = c.config();
  const size_t row = static_cast<size_t>(c.kv_dim()) * dtype_size(cfg.row_dtype);
  for (int l = 0; l < cfg.num_layers; ++l) {
    const KvView v = c.view(l, std::nullopt, nullptr);
    put(v.k, (v.length - v.fp_base) * row);
    put(v.v, (v.length - v.fp_base) * row);
  }
  const QuantizedPlanes& planes = *c.planes();
  const KvPlanesShape& sh = planes.shape();
  const int n = c.planes_length();
  for (int l = 0; l < cfg.num_layers; ++l) {
    for (int h = 0; h < sh.n_kv_heads; ++h) {
      for (KvCodePlane p : {KvCodePlane::kKeyUpper, KvCodePlane::kKeyLower,
                            KvCodePlane::kValueUpper, KvCodePlane::kValueLower}) {
        put(planes.code_plane(p).data() + sh.code_offset(l, h, 0), n * sh.code_row_bytes());
      }
      for (KvMetaArray a : {KvMetaArray::kKeyScale, KvMetaArray::kKeyMin}) {
        put(planes.meta(a).data() + sh.key_meta_offset(l, h, 0),
            n / sh.group_size * sh.head_dim * sizeof(uint16_t));
      }
      for (KvMetaArray a : {KvMetaArray::kValueScale, KvMetaArray::kValueMin}) {
        put(planes.meta(a).data() + sh.value_meta_offset(l, h, 0),
            n * sh.value_groups() * sizeof(uint16_t));
      }
    }
  }
  return out;
}

// Layer by layer is the same computation as chunk by chunk: the last position's logits, the cache
// (rows, planes, counters) and the tokens generated after it are equal bit for bit, for prompts
// shorter than a group, straddling the double buffer's boundary and spanning many chunks.
TEST(PrefillKv, LayerByLayerPrefillEqualsChunkByChunk) {
  const TinyModel tiny = testing::make_tiny_model(config(), DType::BF16, 57);
  for (const auto& [mode, kv] :
       {std::pair{DecodeMode::kAr, KvType::kInt8}, std::pair{DecodeMode::kAr, KvType::kInt4},
        std::pair{DecodeMode::kQuantSpec, KvType::kFp16}}) {
    for (int chunk : {5, kChunk, 1000}) {
      EngineOptions o = options(mode, kv, PrefillKv::kExact);
      o.prefill_chunk = chunk;
      auto by_layer = testing::make_tiny_engine(tiny, o);
      o.prefill_by_layer = false;
      auto by_chunk = testing::make_tiny_engine(tiny, o);
      ASSERT_TRUE(by_layer && by_chunk);
      for (int len : {1, 7, kGroup - 1, kGroup, 2 * kGroup, 2 * kGroup + 3, 5 * kGroup + 7, 700}) {
        SCOPED_TRACE(std::string(decode_mode_name(mode)) + " " + kv_type_name(kv) + ", chunk " +
                     std::to_string(chunk) + ", prompt " + std::to_string(len));
        const std::vector<int32_t> prompt = random_prompt(len, kVocab, 600 + len);
        auto got = by_layer->start(prompt);
        auto want = by_chunk->start(prompt);
        ASSERT_TRUE(got.ok() && want.ok());
        EXPECT_EQ(*got, *want);
        EXPECT_EQ(cache_state(by_layer->cache()), cache_state(by_chunk->cache()));
        EXPECT_EQ(by_layer->cache().length(), len);
        auto a = by_layer->generate(prompt, greedy_params(12), nullptr);
        auto b = by_chunk->generate(prompt, greedy_params(12), nullptr);
        ASSERT_TRUE(a.ok() && b.ok());
        EXPECT_EQ(a->tokens, b->tokens);
      }
    }
  }
}

// The streamed prefill is the chunk-by-chunk computation of sequence_logits (same chunks, same
// commits, the mode's view), and it differs from the exact prefill by the quantization only.
TEST(PrefillKv, QuantizedPrefillReadsTheHistoryThroughTheView) {
  const TinyModel tiny = testing::make_tiny_model(config(), DType::BF16, 52);
  const std::vector<int32_t> prompt = random_prompt(333, kVocab, 6);
  for (KvType kv : {KvType::kInt8, KvType::kInt4}) {
    SCOPED_TRACE(kv_type_name(kv));
    auto quant =
        testing::make_tiny_engine(tiny, options(DecodeMode::kAr, kv, PrefillKv::kQuantized));
    auto exact = testing::make_tiny_engine(tiny, options(DecodeMode::kAr, kv, PrefillKv::kExact));
    auto seq = testing::make_tiny_engine(tiny, options(DecodeMode::kAr, kv, PrefillKv::kExact));
    ASSERT_TRUE(quant && exact && seq);
    auto got = quant->start(prompt);
    auto ref = exact->start(prompt);
    auto all = seq->sequence_logits(prompt);
    ASSERT_TRUE(got.ok() && ref.ok() && all.ok());
    const std::vector<float> want(all->end() - kVocab, all->end());  // the last position's row
    double max_abs = 0, vs_seq = 0, vs_exact = 0;
    for (int i = 0; i < kVocab; ++i) {
      max_abs = std::max(max_abs, double(std::fabs(want[i])));
      vs_seq = std::max(vs_seq, double(std::fabs((*got)[i] - want[i])));
      vs_exact = std::max(vs_exact, double(std::fabs((*got)[i] - (*ref)[i])));
    }
    EXPECT_LT(vs_seq, 1e-5 * max_abs);    // the same computation (up to the last GEMM's rows)
    EXPECT_GT(vs_exact, 10 * vs_seq);     // the history really is read quantized
    EXPECT_LT(vs_exact, 5e-2 * max_abs);  // and only quantized
  }
}

TEST(PrefillKv, GreedyQuantSpecEqualsGreedyArInt8WithQuantizedPrefill) {
  const TinyModel tiny = testing::make_tiny_model(config(), DType::BF16, 53);
  auto ar = testing::make_tiny_engine(
      tiny, options(DecodeMode::kAr, KvType::kInt8, PrefillKv::kQuantized));
  auto spec = testing::make_tiny_engine(
      tiny, options(DecodeMode::kQuantSpec, KvType::kFp16, PrefillKv::kQuantized));
  ASSERT_TRUE(ar && spec);
  for (int len : {1, 63, 64, 65, 300}) {
    const std::vector<int32_t> prompt = random_prompt(len, kVocab, 400 + len);
    auto want = ar->generate(prompt, greedy_params(100), nullptr);
    auto got = spec->generate(prompt, greedy_params(100), nullptr);
    ASSERT_TRUE(want.ok() && got.ok());
    EXPECT_EQ(got->tokens, want->tokens) << "prompt length " << len;
  }
}

// The full-precision modes reserve the prompt's rows and those decoding will write in one
// allocation: decoding never grows the buffer (a growth holds the old and the new buffer at once:
// Llama-2-7B at 128K, 64 GiB of rows twice), also after a shorter generation left a smaller one.
TEST(PrefillKv, FullPrecisionPrefillReservesTheDecodingRows) {
  const ModelConfig cfg = config();
  const TinyModel tiny = testing::make_tiny_model(cfg, DType::BF16, 55);
  const size_t row_bytes = size_t{2} * cfg.num_layers * cfg.kv_dim() * sizeof(float);
  for (DecodeMode mode : {DecodeMode::kAr, DecodeMode::kStreamingLlm}) {
    SCOPED_TRACE(decode_mode_name(mode));
    auto e = testing::make_tiny_engine(tiny, options(mode, KvType::kFp16, PrefillKv::kExact));
    ASSERT_TRUE(e);
    for (int len : {200, 700, 90}) {
      const int n = 50;
      size_t after_prefill = 0;
      GenerationParams p = greedy_params(n);
      p.on_prefill_progress = [&](int done, int total) {
        if (done == total) after_prefill = e->kv_cache_bytes();
      };
      auto got = e->generate(random_prompt(len, kVocab, 9 + len), p, nullptr);
      ASSERT_TRUE(got.ok()) << got.error().message;
      EXPECT_EQ(got->tokens.size(), size_t(n));
      EXPECT_GE(after_prefill, (len + n) * row_bytes) << "prompt " << len;
      EXPECT_EQ(e->kv_cache_bytes(), after_prefill) << "prompt " << len << ": grew while decoding";
    }
  }
}

// set_max_context: a new cache of that many positions in place of the old (what `quantspec bench`
// does per context): the quantized planes shrink with it, the outputs are those of an engine
// loaded with that context, a prompt beyond it is refused, and 0 / bad values behave as at load.
TEST(EngineCapacity, SetMaxContextResizesTheCacheAndKeepsTheOutputs) {
  const TinyModel tiny = testing::make_tiny_model(config(), DType::BF16, 56);
  EngineOptions o = options(DecodeMode::kQuantSpec, KvType::kFp16, PrefillKv::kExact);
  o.max_context = 2048;
  auto e = testing::make_tiny_engine(tiny, o);
  o.max_context = 400;
  auto fresh = testing::make_tiny_engine(tiny, o);
  ASSERT_TRUE(e && fresh);
  const std::vector<int32_t> prompt = random_prompt(300, kVocab, 11);
  auto before = e->generate(prompt, greedy_params(40), nullptr);
  ASSERT_TRUE(before.ok()) << before.error().message;
  const size_t big = e->kv_cache_bytes();

  ASSERT_TRUE(e->set_max_context(400).ok());
  EXPECT_EQ(e->max_context(), 400);
  EXPECT_LT(e->kv_cache_bytes(), big);  // the planes are sized for the capacity
  EXPECT_EQ(e->kv_cache_bytes(), fresh->kv_cache_bytes());
  auto after = e->generate(prompt, greedy_params(40), nullptr);
  auto want = fresh->generate(prompt, greedy_params(40), nullptr);
  ASSERT_TRUE(after.ok() && want.ok());
  EXPECT_EQ(after->tokens, before->tokens);
  EXPECT_EQ(after->tokens, want->tokens);

  auto too_long = e->generate(random_prompt(450, kVocab, 12), greedy_params(4), nullptr);
  ASSERT_FALSE(too_long.ok());
  EXPECT_NE(too_long.error().message.find("400"), std::string::npos) << too_long.error().message;

  EXPECT_FALSE(e->set_max_context(-1).ok());
  EXPECT_EQ(e->max_context(), 400);  // a refused value leaves the cache alone
  ASSERT_TRUE(e->set_max_context(0).ok());
  EXPECT_EQ(e->max_context(), 4096);  // the model's max_position_embeddings (config())
}

TEST(PrefillKv, FullPrecisionModesIgnoreIt) {
  const TinyModel tiny = testing::make_tiny_model(config(), DType::BF16, 54);
  const std::vector<int32_t> prompt = random_prompt(200, kVocab, 7);
  auto a = testing::make_tiny_engine(
      tiny, options(DecodeMode::kAr, KvType::kFp16, PrefillKv::kQuantized));
  auto b =
      testing::make_tiny_engine(tiny, options(DecodeMode::kAr, KvType::kFp16, PrefillKv::kExact));
  ASSERT_TRUE(a && b);
  auto x = a->start(prompt);
  auto y = b->start(prompt);
  ASSERT_TRUE(x.ok() && y.ok());
  EXPECT_EQ(*x, *y);
  EXPECT_STREQ(prefill_kv_name(PrefillKv::kQuantized), "quantized");
  EXPECT_STREQ(prefill_kv_name(PrefillKv::kExact), "exact");
}

}  // namespace
}  // namespace qs
