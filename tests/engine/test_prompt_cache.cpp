// EngineOptions::prompt_cache (the server's --prompt-cache): generate() keeps the tokens whose K/V
// the cache holds, and the next prompt that starts with them prefills only the rest.
// - The fp cache keeps any shared prefix: the continuation is the computation of a fresh prefill
//   of the whole prompt (the same greedy tokens).
// - A quantized cache keeps a shared prefix that reaches its last quantized group (a next turn
//   that extends the previous one) or the full-precision rows it kept from the previous prompt's
//   last kPromptCacheTail tokens on (another question on the same document, another completion
//   of the same prompt), and the rest of the prompt reads the kept history through the mode's
//   view, as decoding does: the computation of a fresh run whose prefill is streamed
//   (--prefill-kv quantized: every chunk committed, later chunks reading the history quantized).
// - Anything else prefills from scratch: a prompt that diverges further back inside the
//   quantized groups, the sparse-KV drafts, the option off, a cache another call changed.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <tuple>
#include <vector>

#include "engine/llm_engine.h"
#include "tiny_model.h"

namespace qs {
namespace {

using testing::greedy_params;
using testing::random_prompt;
using testing::TinyModel;

constexpr int kVocab = testing::kEngineTestVocab;

ModelConfig config() {
  return testing::engine_test_config();
}

EngineOptions options(DecodeMode mode, KvType kv, bool prompt_cache,
                      PrefillKv prefill = PrefillKv::kExact) {
  EngineOptions o = testing::engine_test_options(mode, kv, prefill);
  o.prompt_cache = prompt_cache;
  return o;
}

GenerationResult generate(LlmEngine& e, const std::vector<int32_t>& prompt, int n) {
  auto got = e.generate(prompt, greedy_params(n), nullptr);
  EXPECT_TRUE(got.ok()) << got.error().message;
  return got.ok() ? std::move(got).value() : GenerationResult{};
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b,
                            const std::vector<int32_t>& c = {}) {
  a.insert(a.end(), b.begin(), b.end());
  a.insert(a.end(), c.begin(), c.end());
  return a;
}

// What a generation leaves in the cache: the prompt and the completion but its last token (never
// fed back).
std::vector<int32_t> held(const std::vector<int32_t>& prompt, const GenerationResult& r) {
  std::vector<int32_t> s = concat(prompt, r.tokens);
  s.pop_back();
  return s;
}

// The tokens a and b share from the start.
int shared_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return static_cast<int>(i);
}

// A conversation of three turns, each prompt the previous prompt, its completion and a new
// message (what a chat client sends), and two prompts that keep only part of the history. Each
// request runs on the caching engine and on a fresh engine without the cache; the greedy tokens
// must be equal, and the cached prompt tokens what the cache held of the prompt.
void check_conversation(const TinyModel& tiny, const EngineOptions& cached_opts,
                        const EngineOptions& fresh_opts, bool any_prefix) {
  auto cached = testing::make_tiny_engine(tiny, cached_opts);
  ASSERT_TRUE(cached);
  std::vector<int32_t> prompt = random_prompt(300, kVocab, 1);
  std::vector<int32_t> last_prompt;
  int expect_cached = 0;
  std::vector<int32_t> in_cache;
  for (int turn = 0; turn < 3; ++turn) {
    SCOPED_TRACE("turn " + std::to_string(turn));
    const int n = 40;
    const GenerationResult got = generate(*cached, prompt, n);
    auto fresh = testing::make_tiny_engine(tiny, fresh_opts);
    ASSERT_TRUE(fresh);
    const GenerationResult want = generate(*fresh, prompt, n);
    EXPECT_EQ(got.tokens, want.tokens);
    EXPECT_EQ(got.stats.prompt_tokens, static_cast<int>(prompt.size()));
    EXPECT_EQ(got.stats.cached_prompt_tokens, expect_cached);
    EXPECT_EQ(want.stats.cached_prompt_tokens, 0);
    ASSERT_EQ(got.tokens.size(), size_t(n));
    in_cache = held(prompt, got);
    expect_cached = static_cast<int>(in_cache.size());
    last_prompt = prompt;
    prompt = concat(prompt, got.tokens, random_prompt(20 + 17 * turn, kVocab, 10 + turn));
  }
  // Another question on the same history: the last prompt but its last 60 tokens, and a new
  // message. Every cache keeps the shared prefix (a quantized one through the rows it kept).
  std::vector<int32_t> other(last_prompt.begin(), last_prompt.end() - 60);
  other = concat(other, random_prompt(30, kVocab, 98));
  GenerationResult got = generate(*cached, other, 25);
  auto fresh = testing::make_tiny_engine(tiny, fresh_opts);
  ASSERT_TRUE(fresh);
  EXPECT_EQ(got.tokens, generate(*fresh, other, 25).tokens);
  EXPECT_EQ(got.stats.cached_prompt_tokens, shared_prefix(in_cache, other));
  EXPECT_GE(got.stats.cached_prompt_tokens, static_cast<int>(last_prompt.size()) - 60);
  in_cache = held(other, got);
  // A prompt that shares only the first 100 tokens: the fp cache keeps them, a quantized cache
  // (whose groups and kept rows start far past 100) none.
  const int group = testing::kEngineTestGroup;
  ASSERT_GT(quant_boundary(static_cast<int>(other.size()) - 1 - kPromptCacheTail, group),
            quant_boundary(100, group));
  other.resize(100);
  other = concat(other, random_prompt(30, kVocab, 99));
  got = generate(*cached, other, 25);
  fresh = testing::make_tiny_engine(tiny, fresh_opts);
  ASSERT_TRUE(fresh);
  EXPECT_EQ(got.tokens, generate(*fresh, other, 25).tokens);
  EXPECT_EQ(got.stats.cached_prompt_tokens, any_prefix ? shared_prefix(in_cache, other) : 0);
  EXPECT_GE(shared_prefix(in_cache, other), 100);
}

TEST(PromptCache, FullPrecisionCacheKeepsAnySharedPrefix) {
  const TinyModel tiny = testing::make_tiny_model(config(), DType::BF16, 71);
  const EngineOptions fp = options(DecodeMode::kAr, KvType::kFp16, true);
  check_conversation(tiny, fp, options(DecodeMode::kAr, KvType::kFp16, false), true);
}

// The quantized modes continue the kept history as decoding does: the same tokens as a fresh run
// whose prefill reads its history through the view (streamed), also for QuantSpec (whose greedy
// output is AR INT8's).
TEST(PromptCache, QuantizedCacheContinuesAsDecodingWould) {
  const TinyModel tiny = testing::make_tiny_model(config(), DType::BF16, 72);
  for (const auto& [mode, kv] : testing::kQuantizedModes) {
    SCOPED_TRACE(std::string(decode_mode_name(mode)) + " " + kv_type_name(kv));
    const EngineOptions streamed = options(mode, kv, true, PrefillKv::kQuantized);
    check_conversation(tiny, streamed, options(mode, kv, false, PrefillKv::kQuantized), false);
  }
  // The first turn's prefill exact (the default): the next turns read its quantized history.
  auto exact = testing::make_tiny_engine(
      tiny, options(DecodeMode::kQuantSpec, KvType::kFp16, true, PrefillKv::kExact));
  auto ar = testing::make_tiny_engine(
      tiny, options(DecodeMode::kAr, KvType::kInt8, true, PrefillKv::kExact));
  ASSERT_TRUE(exact && ar);
  std::vector<int32_t> prompt = random_prompt(300, kVocab, 3);
  int expect_cached = 0;
  for (int turn = 0; turn < 3; ++turn) {
    const GenerationResult a = generate(*exact, prompt, 30);
    const GenerationResult b = generate(*ar, prompt, 30);
    EXPECT_EQ(a.tokens, b.tokens) << "turn " << turn;
    EXPECT_EQ(a.stats.cached_prompt_tokens, expect_cached) << "turn " << turn;
    EXPECT_EQ(b.stats.cached_prompt_tokens, expect_cached) << "turn " << turn;
    expect_cached = static_cast<int>(held(prompt, a).size());
    if (turn < 2) prompt = concat(prompt, a.tokens, random_prompt(11, kVocab, 20 + turn));
  }
  // The last prompt again after a completion of 3 groups (its extension kept the rows from
  // b(prompt - 257) > 0 on), once more, and another question on it: the two engines keep the
  // same tokens and agree. (RepeatedPromptRunsNothing keeps rows through a layer-major prefill.)
  ASSERT_GT(static_cast<int>(prompt.size()) - 1 - kPromptCacheTail, 2 * testing::kEngineTestGroup);
  std::vector<int32_t> question(prompt.begin(), prompt.end() - 60);
  question = concat(question, random_prompt(40, kVocab, 23));
  for (const auto& [next, n, cached_tokens] :
       {std::tuple{prompt, 100, static_cast<int>(prompt.size())},
        std::tuple{prompt, 30, static_cast<int>(prompt.size())},
        std::tuple{question, 30, static_cast<int>(prompt.size()) - 60}}) {
    const GenerationResult a = generate(*exact, next, n);
    const GenerationResult b = generate(*ar, next, n);
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_EQ(a.stats.cached_prompt_tokens, cached_tokens);
    EXPECT_EQ(b.stats.cached_prompt_tokens, cached_tokens);
  }
}

// With tensor parallelism every rank's cache keeps the same prefix.
TEST(PromptCache, EveryRankKeepsThePrefix) {
  const TinyModel tiny = testing::make_tiny_model(config(), DType::BF16, 76);
  for (const auto& [mode, kv] :
       {std::pair{DecodeMode::kAr, KvType::kFp16}, std::pair{DecodeMode::kQuantSpec, KvType::kFp16}}) {
    SCOPED_TRACE(decode_mode_name(mode));
    EngineOptions cached = options(mode, kv, true, PrefillKv::kQuantized);
    EngineOptions fresh = options(mode, kv, false, PrefillKv::kQuantized);
    cached.tensor_parallel = fresh.tensor_parallel = 2;
    check_conversation(tiny, cached, fresh, mode == DecodeMode::kAr);
  }
}

// A QuantSpec round that ends on EOS may have committed accepted candidates after it: the cache
// then holds more than the emitted tokens, and the next prompt (the emitted ones and more) keeps
// the part it shares with them.
TEST(PromptCache, AStopInsideARoundKeepsWhatTheCacheHolds) {
  ModelConfig cfg = config();
  const TinyModel probe = testing::make_tiny_model(cfg, DType::BF16, 75);
  const std::vector<int32_t> prompt = random_prompt(120, kVocab, 8);
  auto first =
      testing::make_tiny_engine(probe, options(DecodeMode::kQuantSpec, KvType::kFp16, false));
  ASSERT_TRUE(first);
  const GenerationResult plain = generate(*first, prompt, 40);
  // Each token at its first appearance as EOS, until generation stops inside a round (the cache
  // holds tokens after the EOS).
  bool inside = false;
  for (size_t stop = 1; stop < plain.tokens.size() && !inside; ++stop) {
    const auto end = plain.tokens.begin() + static_cast<std::ptrdiff_t>(stop);
    if (std::find(plain.tokens.begin(), end, plain.tokens[stop]) != end) continue;
    cfg.eos_token_ids = {plain.tokens[stop]};
    const TinyModel tiny = testing::make_tiny_model(cfg, DType::BF16, 75);
    auto e = testing::make_tiny_engine(tiny, options(DecodeMode::kQuantSpec, KvType::kFp16, true));
    ASSERT_TRUE(e);
    GenerationParams p = greedy_params(40);
    p.stop_at_eos = true;
    auto got = e->generate(prompt, p, nullptr);
    ASSERT_TRUE(got.ok()) << got.error().message;
    ASSERT_EQ(got->tokens.size(), stop + 1);
    const int emitted_held = static_cast<int>(held(prompt, *got).size());
    const int held_tokens = e->cache().length();
    ASSERT_GE(held_tokens, emitted_held);
    inside = held_tokens > emitted_held;
    if (!inside) continue;
    const std::vector<int32_t> next = concat(prompt, got->tokens, random_prompt(9, kVocab, 30));
    auto again = e->generate(next, greedy_params(20), nullptr);
    auto fresh =
        testing::make_tiny_engine(tiny, options(DecodeMode::kQuantSpec, KvType::kFp16, false));
    ASSERT_TRUE(again.ok() && fresh);
    EXPECT_GE(again->stats.cached_prompt_tokens, emitted_held);
    EXPECT_LE(again->stats.cached_prompt_tokens, held_tokens);
    EXPECT_EQ(again->tokens, generate(*fresh, next, 20).tokens);
  }
  EXPECT_TRUE(inside) << "no EOS stopped generation inside a round";
}

// A kept history shorter than a group has no quantized part: the rest of the prompt is prefilled
// exactly after it, as a fresh exact prefill of the whole prompt computes.
TEST(PromptCache, AShortHistoryIsExtendedExactly) {
  const TinyModel tiny = testing::make_tiny_model(config(), DType::BF16, 77);
  // The INT4 view's error is large enough that reading the history quantized changes the tokens.
  for (const auto& [mode, kv] : testing::kQuantizedModes) {
    SCOPED_TRACE(std::string(decode_mode_name(mode)) + " " + kv_type_name(kv));
    auto e = testing::make_tiny_engine(tiny, options(mode, kv, true));
    ASSERT_TRUE(e);
    const std::vector<int32_t> prompt = random_prompt(20, kVocab, 40);
    const GenerationResult first = generate(*e, prompt, 8);  // 27 < G positions kept
    const std::vector<int32_t> next = concat(prompt, first.tokens, random_prompt(200, kVocab, 41));
    const GenerationResult got = generate(*e, next, 30);
    EXPECT_EQ(got.stats.cached_prompt_tokens, shared_prefix(held(prompt, first), next));
    EXPECT_GE(got.stats.cached_prompt_tokens, 27);
    auto fresh = testing::make_tiny_engine(tiny, options(mode, kv, false));
    ASSERT_TRUE(fresh);
    EXPECT_EQ(got.tokens, generate(*fresh, next, 30).tokens);
  }
}

// The same prompt again (another completion, a retry): nothing is prefilled. The cache is cut
// back to the prompt (in the quantized modes below the groups a completion longer than a group
// quantized, over the rows it kept) and the first token comes from the prompt's kept logits, so
// each completion is a fresh run's, with either prefill, greedy or sampled.
TEST(PromptCache, RepeatedPromptRunsNothing) {
  const TinyModel tiny = testing::make_tiny_model(config(), DType::BF16, 73);
  const std::vector<int32_t> prompt = random_prompt(400, kVocab, 9);
  std::vector<std::pair<DecodeMode, KvType>> modes = {{DecodeMode::kAr, KvType::kFp16}};
  modes.insert(modes.end(), std::begin(testing::kQuantizedModes),
               std::end(testing::kQuantizedModes));
  for (const auto& [mode, kv] : modes) {
    for (const PrefillKv prefill : {PrefillKv::kExact, PrefillKv::kQuantized}) {
      SCOPED_TRACE(std::string(decode_mode_name(mode)) + " " + kv_type_name(kv) +
                   (prefill == PrefillKv::kExact ? " exact" : " streamed"));
      auto e = testing::make_tiny_engine(tiny, options(mode, kv, true, prefill));
      auto fresh = testing::make_tiny_engine(tiny, options(mode, kv, false, prefill));
      ASSERT_TRUE(e && fresh);
      const GenerationResult want = generate(*fresh, prompt, 100);  // 3 groups past the prompt
      EXPECT_EQ(generate(*e, prompt, 100).tokens, want.tokens);
      for (const int n : {100, 30}) {
        const GenerationResult again = generate(*e, prompt, n);
        EXPECT_EQ(again.stats.cached_prompt_tokens, 400);
        EXPECT_EQ(again.tokens, std::vector<int32_t>(want.tokens.begin(), want.tokens.begin() + n));
      }
    }
  }
  // Sampled: the same seed draws the same completion from the kept logits.
  GenerationParams sampled = greedy_params(60);
  sampled.sampling.temperature = 0.9f;
  sampled.sampling.seed = 5;
  auto e = testing::make_tiny_engine(tiny, options(DecodeMode::kQuantSpec, KvType::kFp16, true));
  auto fresh =
      testing::make_tiny_engine(tiny, options(DecodeMode::kQuantSpec, KvType::kFp16, false));
  ASSERT_TRUE(e && fresh);
  auto want = fresh->generate(prompt, sampled, nullptr);
  auto first = e->generate(prompt, sampled, nullptr);
  auto again = e->generate(prompt, sampled, nullptr);
  ASSERT_TRUE(want.ok() && first.ok() && again.ok());
  EXPECT_EQ(first->tokens, want->tokens);
  EXPECT_EQ(again->tokens, want->tokens);
  EXPECT_EQ(again->stats.cached_prompt_tokens, 400);
}

// The rows a quantized prompt cache keeps are bounded (EngineOptions::prompt_cache_rows): a
// completion that would keep more drops them, and the same prompt is then prefilled whole.
TEST(PromptCache, ALongCompletionDropsTheKeptRows) {
  const TinyModel tiny = testing::make_tiny_model(config(), DType::BF16, 78);
  EngineOptions o = options(DecodeMode::kQuantSpec, KvType::kFp16, true, PrefillKv::kQuantized);
  o.prompt_cache_rows = 96;
  auto e = testing::make_tiny_engine(tiny, o);
  ASSERT_TRUE(e);
  const std::vector<int32_t> prompt = random_prompt(100, kVocab, 12);
  generate(*e, prompt, 40);  // 139 positions: the b(139) = 96 rows below the boundary are kept
  EXPECT_EQ(generate(*e, prompt, 80).stats.cached_prompt_tokens, 100);
  // 179 positions: b(179) = 128 > 96 rows, dropped.
  EXPECT_EQ(generate(*e, prompt, 20).stats.cached_prompt_tokens, 0);
}

TEST(PromptCache, ANegativeRowLimitIsAClearError) {
  const TinyModel tiny = testing::make_tiny_model(config(), DType::BF16, 79);
  EngineOptions o = options(DecodeMode::kQuantSpec, KvType::kFp16, true);
  o.prompt_cache_rows = -1;
  auto e = LlmEngine::create(tiny.cfg, tiny.weights, std::nullopt, o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.error().message, "prompt_cache_rows must be >= 0, got -1");
}

// Where nothing is kept: the option off (the default), the sparse-KV drafts, and after a call that
// changed the cache (prefill_logits, sequence_logits, set_max_context, a failed generation).
TEST(PromptCache, NothingIsKeptWhereTheCacheIsNotKnown) {
  const TinyModel tiny = testing::make_tiny_model(config(), DType::BF16, 74);
  const std::vector<int32_t> prompt = random_prompt(80, kVocab, 5);
  const std::vector<int32_t> longer = concat(prompt, random_prompt(10, kVocab, 6));
  {
    EngineOptions o = options(DecodeMode::kAr, KvType::kFp16, false);
    EXPECT_FALSE(EngineOptions{}.prompt_cache);
    auto e = testing::make_tiny_engine(tiny, o);
    ASSERT_TRUE(e);
    generate(*e, prompt, 10);
    EXPECT_EQ(e->reusable_prefix(longer), 0);
  }
  for (DecodeMode sparse : {DecodeMode::kStreamingLlm, DecodeMode::kSnapKv}) {
    auto e = testing::make_tiny_engine(tiny, options(sparse, KvType::kFp16, true));
    ASSERT_TRUE(e);
    generate(*e, prompt, 10);
    EXPECT_EQ(e->reusable_prefix(longer), 0) << decode_mode_name(sparse);
  }
  auto e = testing::make_tiny_engine(tiny, options(DecodeMode::kAr, KvType::kFp16, true));
  ASSERT_TRUE(e);
  const int keep = shared_prefix(held(prompt, generate(*e, prompt, 10)), longer);
  ASSERT_GE(keep, 80);
  EXPECT_EQ(e->reusable_prefix(longer), keep);
  EXPECT_EQ(e->reusable_prefix({}), 0);
  ASSERT_TRUE(e->prefill_logits(random_prompt(30, kVocab, 7), 1).ok());
  EXPECT_EQ(e->reusable_prefix(longer), 0);
  generate(*e, prompt, 10);
  ASSERT_TRUE(e->sequence_logits(random_prompt(30, kVocab, 8)).ok());
  EXPECT_EQ(e->reusable_prefix(longer), 0);
  generate(*e, prompt, 10);
  ASSERT_TRUE(e->set_max_context(512).ok());
  EXPECT_EQ(e->reusable_prefix(longer), 0);
  generate(*e, prompt, 10);
  GenerationParams bad = greedy_params(10);
  bad.sampling.top_p = 2.0f;  // refused before the cache is touched: the tokens stay known
  EXPECT_FALSE(e->generate(longer, bad, nullptr).ok());
  EXPECT_EQ(e->reusable_prefix(longer), keep);
  const std::vector<int32_t> too_long(600, 1);  // beyond the 512 positions: refused
  EXPECT_FALSE(e->generate(too_long, greedy_params(1), nullptr).ok());
  EXPECT_EQ(e->reusable_prefix(longer), keep);
}

}  // namespace
}  // namespace qs
