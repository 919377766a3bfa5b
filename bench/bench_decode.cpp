// Decode throughput of the CPU engine: prefill a synthetic prompt, then time single-token decode
// steps and report tokens/s and the memory bandwidth they imply (weights streamed per token, and
// weights + KV cache read per token).
//
//   bench_decode <model_dir> [--prompt N] [--tokens N] [--threads N] [--context N]
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "engine/llm_engine.h"
#include "engine/sampler.h"
#include "model/config.h"
#include "model/weights.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

int usage(const char* argv0) {
  fmt::print(stderr,
             "usage: {} <model_dir> [--prompt N (128)] [--tokens N (64)] [--threads N (all)] "
             "[--context N (prompt + tokens)]\n",
             argv0);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage(argv[0]);
  const std::string dir = argv[1];
  int prompt_len = 128, tokens = 64, threads = 0, context = 0;
  for (int i = 2; i < argc; ++i) {
    auto value = [&](int& out) {
      if (i + 1 >= argc) return false;
      char* end = nullptr;
      long v = std::strtol(argv[++i], &end, 10);
      if (*end != '\0' || v < 0) return false;
      out = static_cast<int>(v);
      return true;
    };
    bool ok = false;
    if (!std::strcmp(argv[i], "--prompt"))
      ok = value(prompt_len);
    else if (!std::strcmp(argv[i], "--tokens"))
      ok = value(tokens);
    else if (!std::strcmp(argv[i], "--threads"))
      ok = value(threads);
    else if (!std::strcmp(argv[i], "--context"))
      ok = value(context);
    if (!ok) return usage(argv[0]);
  }
  if (prompt_len < 1 || tokens < 1) return usage(argv[0]);

  qs::Result<qs::ModelConfig> cfg = qs::load_model_config(dir);
  if (!cfg.ok()) {
    fmt::print(stderr, "error: {}\n", cfg.error().message);
    return 1;
  }
  qs::Result<qs::ModelWeights> weights = qs::load_model_weights(dir, *cfg);
  if (!weights.ok()) {
    fmt::print(stderr, "error: {}\n", weights.error().message);
    return 1;
  }
  const qs::DType wtype =
      weights->layers.empty() ? weights->lm_head.dtype : weights->layers[0].wq.dtype;
  qs::EngineOptions options;
  options.num_threads = threads;
  options.max_context = context > 0 ? context : prompt_len + tokens;
  auto engine = qs::LlmEngine::create(*cfg, std::move(weights).value(), std::nullopt, options);
  if (!engine.ok()) {
    fmt::print(stderr, "error: {}\n", engine.error().message);
    return 1;
  }
  qs::LlmEngine& e = **engine;
  qs::Model& model = e.model();
  const qs::ModelConfig& c = model.config();
  if (prompt_len + tokens > e.max_context()) {
    fmt::print(stderr, "error: prompt + tokens = {} exceeds the context {}\n", prompt_len + tokens,
               e.max_context());
    return 1;
  }

  const double gib = 1024.0 * 1024.0 * 1024.0;
  const size_t weight_bytes = model.weight_bytes_per_token();
  const size_t kv_row_bytes = 2 * static_cast<size_t>(c.num_layers) * c.kv_dim() * sizeof(float);
  fmt::print("model     {} ({}): {} layers, hidden {}, heads {}/{} kv, head_dim {}, vocab {}\n",
             dir, qs::architecture_name(c.arch), c.num_layers, c.hidden_size, c.num_heads,
             c.num_kv_heads, c.head_dim, c.vocab_size);
  fmt::print("weights   {}, {:.3f} GiB streamed per token\n", qs::dtype_name(wtype),
             weight_bytes / gib);
  fmt::print("backend   {}, {} threads\n", model.backend().name(),
             options.num_threads > 0 ? options.num_threads : int(std::thread::hardware_concurrency()));
  fmt::print("kv cache  f32, context {}, {:.3f} GiB reserved, {} bytes per token\n",
             e.max_context(), e.kv_cache_bytes() / gib, kv_row_bytes);
  fmt::print("run       prompt {} tokens, decode {} tokens, greedy\n", prompt_len, tokens);

  std::vector<int32_t> prompt(prompt_len);
  for (int i = 0; i < prompt_len; ++i)
    prompt[i] = static_cast<int32_t>((i * 7919L + 1) % c.vocab_size);
  qs::KvCache& cache = e.cache();  // the engine's (full-precision: --kv is not set)
  cache.clear();
  std::vector<float> logits(c.vocab_size);

  const auto t0 = Clock::now();
  for (int start = 0; start < prompt_len; start += options.prefill_chunk) {
    const int m = std::min(options.prefill_chunk, prompt_len - start);
    const bool last = start + m == prompt_len;
    qs::Status st =
        model.forward(std::span<const int32_t>(prompt.data() + start, m), start, cache, {},
                      last ? qs::LogitRows::kLast : qs::LogitRows::kNone, logits.data());
    if (!st.ok()) {
      fmt::print(stderr, "error: {}\n", st.error().message);
      return 1;
    }
  }
  const auto t1 = Clock::now();

  double kv_bytes_read = 0;
  for (int s = 0; s < tokens; ++s) {
    const int32_t next = qs::argmax(logits.data(), c.vocab_size);
    const int pos = prompt_len + s;
    qs::Status st = model.forward(std::span<const int32_t>(&next, 1), pos, cache, {},
                                  qs::LogitRows::kLast, logits.data());
    if (!st.ok()) {
      fmt::print(stderr, "error: {}\n", st.error().message);
      return 1;
    }
    cache.commit(pos + 1);
    kv_bytes_read += static_cast<double>(pos + 1) * kv_row_bytes;
  }
  const auto t2 = Clock::now();

  const double prefill_s = seconds(t0, t1), decode_s = seconds(t1, t2);
  const double per_token = decode_s / tokens;
  fmt::print("prefill   {:.3f} s, {:.1f} tokens/s\n", prefill_s, prompt_len / prefill_s);
  fmt::print("decode    {:.3f} s, {:.2f} tokens/s, {:.2f} ms/token\n", decode_s, tokens / decode_s,
             per_token * 1e3);
  fmt::print("bandwidth weights {:.2f} GB/s; weights + KV {:.2f} GB/s\n",
             weight_bytes / per_token / 1e9,
             (weight_bytes * static_cast<double>(tokens) + kv_bytes_read) / decode_s / 1e9);
  return 0;
}
