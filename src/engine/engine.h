// The engine's public face: load a model directory, run prefill/decode, generate text.
// The CLI and the server use only this header (and model/, core/).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "model/config.h"
#include "model/tokenizer/tokenizer.h"

namespace qs {

struct EngineOptions {
  int num_threads = 0;     // 0: all hardware threads
  int max_context = 0;     // KV cache capacity in tokens; 0: min(model max, 8192) [TODO: grows]
  int prefill_chunk = 512; // prompt tokens per prefill forward (bounds activation memory)
};

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  int top_k = 0;             // 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
  uint64_t seed = 0;         // same seed, same output
};

struct GenerationParams {
  int max_new_tokens = 128;
  SamplingParams sampling;
  std::vector<std::string> stop;  // stop strings: generation ends before the first match
  bool stop_at_eos = true;
};

struct GenerationStats {
  int prompt_tokens = 0;
  int generated_tokens = 0;
  double prefill_s = 0;
  double decode_s = 0;
  double decode_tok_s() const { return decode_s > 0 ? generated_tokens / decode_s : 0; }
};

struct GenerationResult {
  std::vector<int32_t> tokens;  // generated ids (incl. the EOS id if it ended on one)
  std::string text;             // detokenized completion, stop string removed
  std::string finish_reason;    // "stop" (EOS or stop string) or "length"
  GenerationStats stats;
};

// Called with each new piece of completed text (valid UTF-8, stop strings held back until they
// are known not to match). Return false to cancel generation.
using TextCallback = std::function<bool(std::string_view piece)>;

class Engine {
 public:
  // Loads config.json, weights and (when present) the tokenizer. User errors come back as Error.
  static Result<std::unique_ptr<Engine>> load(const std::filesystem::path& dir,
                                              const EngineOptions& options);
  virtual ~Engine() = default;

  virtual const ModelConfig& config() const = 0;
  virtual const Tokenizer* tokenizer() const = 0;  // nullptr when the directory has none
  virtual int max_context() const = 0;

  // Logits at every position of one prefill of `ids` on an empty cache:
  // row-major [ids.size(), vocab_size].
  virtual Result<std::vector<float>> prefill_logits(const std::vector<int32_t>& ids) = 0;

  // Generate after `prompt` (ids, special tokens already applied). Needs a tokenizer for stop
  // strings and text; `on_text` may be empty.
  virtual Result<GenerationResult> generate(const std::vector<int32_t>& prompt,
                                            const GenerationParams& params,
                                            const TextCallback& on_text) = 0;
};

}  // namespace qs
