#include "engine/llm_engine.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <unordered_set>

#include "engine/sampler.h"
#include "engine/stop_matcher.h"

namespace qs {

namespace {

constexpr int kDefaultMaxContext = 8192;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Result<int> resolve_max_context(const ModelConfig& cfg, const EngineOptions& options) {
  if (options.max_context < 0) {
    return make_error("max_context must be >= 0 (0: the model's), got " +
                      std::to_string(options.max_context));
  }
  int ctx = options.max_context;
  if (ctx == 0) {
    ctx = cfg.max_position_embeddings > 0
              ? std::min(cfg.max_position_embeddings, kDefaultMaxContext)
              : kDefaultMaxContext;
    if (cfg.sliding_window > 0) ctx = std::min(ctx, cfg.sliding_window);
  } else if (cfg.sliding_window > 0 && ctx > cfg.sliding_window) {
    return make_error("max_context " + std::to_string(ctx) +
                      " exceeds the model's sliding_window of " +
                      std::to_string(cfg.sliding_window) +
                      " (sliding-window attention is not implemented; use a context <= " +
                      std::to_string(cfg.sliding_window) + ")");
  }
  return ctx;
}

Result<std::unique_ptr<LlmEngine>> LlmEngine::create(const ModelConfig& cfg, ModelWeights weights,
                                                     std::optional<Tokenizer> tokenizer,
                                                     const EngineOptions& options) {
  if (options.num_threads < 0) {
    return make_error("num_threads must be >= 0 (0: all), got " +
                      std::to_string(options.num_threads));
  }
  if (options.prefill_chunk < 1) {
    return make_error("prefill_chunk must be >= 1, got " + std::to_string(options.prefill_chunk));
  }
  QS_TRY(check_model(cfg, weights));
  QS_ASSIGN_OR_RETURN(int ctx, resolve_max_context(cfg, options));

  std::unique_ptr<LlmEngine> engine(new LlmEngine());
  engine->options_ = options;
  engine->options_.max_context = ctx;
  engine->backend_ = std::make_unique<CpuBackend>(options.num_threads);
  engine->model_ = std::make_unique<Model>(cfg, std::move(weights), *engine->backend_);
  engine->cache_ = FpKvCache(cfg.num_layers, ctx, cfg.kv_dim());
  engine->tokenizer_ = std::move(tokenizer);
  engine->last_logits_.resize(static_cast<size_t>(cfg.vocab_size));
  return engine;
}

Status LlmEngine::check_prompt(const std::vector<int32_t>& ids) const {
  if (ids.empty()) return make_error("the prompt is empty");
  if (static_cast<int64_t>(ids.size()) > cache_.capacity()) {
    return make_error("prompt has " + std::to_string(ids.size()) + " tokens but the context is " +
                      std::to_string(cache_.capacity()));
  }
  return Status::ok_status();
}

Status LlmEngine::prefill(const std::vector<int32_t>& ids) {
  cache_.clear();
  const int n = static_cast<int>(ids.size());
  for (int start = 0; start < n; start += options_.prefill_chunk) {
    const int m = std::min(options_.prefill_chunk, n - start);
    const bool last = start + m == n;
    QS_TRY(model_->forward(std::span<const int32_t>(ids.data() + start, m), start, cache_,
                           last ? LogitRows::kLast : LogitRows::kNone, last_logits_.data()));
  }
  return Status::ok_status();
}

Result<std::vector<float>> LlmEngine::prefill_logits(const std::vector<int32_t>& ids) {
  QS_TRY(check_prompt(ids));
  const int n = static_cast<int>(ids.size());
  const size_t vocab = static_cast<size_t>(config().vocab_size);
  std::vector<float> logits(static_cast<size_t>(n) * vocab);
  cache_.clear();
  for (int start = 0; start < n; start += options_.prefill_chunk) {
    const int m = std::min(options_.prefill_chunk, n - start);
    QS_TRY(model_->forward(std::span<const int32_t>(ids.data() + start, m), start, cache_,
                           LogitRows::kAll, logits.data() + start * vocab));
  }
  return logits;
}

Result<GenerationResult> LlmEngine::generate(const std::vector<int32_t>& prompt,
                                             const GenerationParams& params,
                                             const TextCallback& on_text) {
  QS_TRY(check_sampling_params(params.sampling));
  if (params.max_new_tokens < 0) {
    return make_error("max_new_tokens must be >= 0, got " + std::to_string(params.max_new_tokens));
  }
  QS_TRY(check_prompt(prompt));
  if (!params.stop.empty() && !tokenizer_) {
    return make_error(
        "stop strings need a tokenizer, and the model directory has no "
        "tokenizer.json");
  }
  const int vocab = config().vocab_size;
  const int prompt_len = static_cast<int>(prompt.size());

  GenerationResult result;
  result.stats.prompt_tokens = prompt_len;
  result.finish_reason = "length";
  const int max_new = std::min(params.max_new_tokens, cache_.capacity() - prompt_len + 1);
  if (max_new == 0) return result;

  std::unordered_set<int32_t> eos;
  if (params.stop_at_eos) {
    eos.insert(config().eos_token_ids.begin(), config().eos_token_ids.end());
    if (tokenizer_) {
      for (int32_t id : tokenizer_->eos_ids()) eos.insert(id);
    }
  }

  const auto t_start = std::chrono::steady_clock::now();
  QS_TRY(prefill(prompt));
  result.stats.prefill_s = seconds_since(t_start);
  const auto t_decode = std::chrono::steady_clock::now();

  Rng rng(params.sampling.seed);
  std::optional<StreamDecoder> decoder;
  if (tokenizer_) decoder.emplace(*tokenizer_, /*skip_special=*/true);
  StopMatcher stop_matcher(params.stop);
  bool cancelled = false;
  auto emit = [&](const std::string& piece) {
    if (piece.empty() || cancelled) return;
    result.text += piece;
    if (on_text && !on_text(piece)) cancelled = true;
  };

  int pos = prompt_len;
  for (;;) {
    const int32_t next = sample_token(last_logits_.data(), vocab, params.sampling, rng, probs_);
    result.tokens.push_back(next);
    if (eos.count(next)) {
      result.finish_reason = "stop";
      break;
    }
    if (decoder) {
      emit(stop_matcher.push(decoder->push(next)));
      if (stop_matcher.stopped()) {
        result.finish_reason = "stop";
        break;
      }
      if (cancelled) break;
    }
    if (static_cast<int>(result.tokens.size()) == max_new) break;
    QS_TRY(model_->forward(std::span<const int32_t>(&next, 1), pos, cache_, LogitRows::kLast,
                           last_logits_.data()));
    ++pos;
  }
  if (decoder && !stop_matcher.stopped() && !cancelled) {
    emit(stop_matcher.push(decoder->flush()));
    if (stop_matcher.stopped()) {
      result.finish_reason = "stop";
    } else {
      emit(stop_matcher.flush());
    }
  }
  if (cancelled) result.finish_reason = "cancelled";

  result.stats.generated_tokens = static_cast<int>(result.tokens.size());
  result.stats.decode_s = seconds_since(t_decode);
  return result;
}

}  // namespace qs
