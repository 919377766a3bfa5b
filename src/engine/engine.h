// The engine's public face: load a model directory, run prefill/decode, generate text.
// The CLI and the server use only this header (and model/, core/).
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/sampling.h"  // SamplingParams
#include "model/config.h"
#include "model/tokenizer/tokenizer.h"

namespace qs {

class JsonConstraint;

// Decoding: plain autoregressive, or QuantSpec self-speculation (DESIGN §1, docs/quantspec.md).
// kStreamingLlm / kSnapKv: the sparse-KV self-speculation baselines (docs/quantspec.md "Sparse-KV
// drafts"): the draft attends to a subset of the prompt's positions, the target to all of them.
enum class DecodeMode : uint8_t { kAr, kQuantSpec, kStreamingLlm, kSnapKv };
// The KV cache of autoregressive decoding: full precision (rows of KvDType), or the hierarchical
// cache read through its INT8 (target) or INT4 (draft) view. QuantSpec always uses both views.
enum class KvType : uint8_t { kFp16, kInt8, kInt4 };
// Element type of the full-precision KV rows (the whole cache of KvType::kFp16, and the
// full-precision buffer of the hierarchical cache): kAuto = f16 on cuda, f32 (the exact
// reference) on the cpu.
enum class KvDType : uint8_t { kAuto, kF32, kF16 };

// Prefill matmuls (m > 16 rows) on the GPU: kExact splits the f32 activations into bf16 hi + lo
// (two tensor-core GEMMs, f32-level results: the oracle's setting), kBf16 rounds them to bf16 (one
// GEMM, twice as fast; what HF transformers computes with bf16 weights). The CPU always computes
// in f32.
enum class PrefillMatmul : uint8_t { kExact, kBf16 };
// The prompt's attention in the quantized KV modes (int8, int4, quantspec): kExact attends to
// every prompt row in full precision and quantizes the prompt after it, layer by layer
// (EngineOptions::prefill_by_layer: one layer's rows at a time, 2 GiB of f16 rows for Llama-2-7B
// at 128K next to the planes; chunk by chunk, every layer's rows are held at once: 64 GiB);
// kQuantized commits (quantizes) each prefill chunk before the next, so later chunks read the
// history through the mode's view, as decoding does, and the full-precision buffer never holds
// more than a chunk plus the steady rows. The fp modes always prefill exactly.
enum class PrefillKv : uint8_t { kExact, kQuantized };
// The arithmetic of the GPU's attention over a quantized KV view. kF16 multiplies the folded
// query and the value weights as f16 operands once (their rounding, ~2^-12 relative); kExact as
// an f16 hi + lo pair (f32-level, the CPU reference's arithmetic; the CPU is always exact).
// - The draft's (INT4) view: kF16 by default. The rounding is ~1000x below the view's own error,
//   and the target verifies every token, so outputs are unaffected; kExact is ~8% slower.
// - The target's (INT8) view, which AR --kv int8 reads too: kF16 by default since session 37
//   (H200, 128K: AR INT8 1-3% and QuantSpec's verification 2-4% faster on both shapes). It
//   changes the target's arithmetic (up to ~2e-3 of the attention output, ~20x below the INT8
//   view's own quantization error); the verification and AR INT8 stay one computation, so greedy
//   QuantSpec still equals greedy AR INT8.
enum class AttentionOperands : uint8_t { kF16, kExact };
// Draft weights: 4-bit group-128 for every linear layer incl. lm_head, for the MLP only, or the
// original weights (a KV-only draft).
enum class DraftWeights : uint8_t { kInt4, kInt4Mlp, kNative };

// Where the forward pass runs: the CPU backend, or the CUDA backend (builds with QS_CUDA=ON).
enum class Device : uint8_t { kCpu, kCuda };

// The speculation length used when none is given (measured on models/default, docs/quantspec.md).
inline constexpr int kDefaultGamma = 4;
// The largest round of EngineOptions::adaptive_gamma when gamma is not given.
inline constexpr int kAdaptiveGammaMax = 8;

struct EngineOptions {
  Device device = Device::kCpu;
  int device_index = 0;     // CUDA device ordinal
  int num_threads = 0;      // 0: all hardware threads (with tensor_parallel > 1: in all ranks)
  // Tensor parallelism (docs/multi-gpu.md): the model sharded over this many ranks, one per CUDA
  // device (device_index, device_index + 1, ...), or CPU backends of num_threads / N threads each
  // (the CPU stand-in). 1: one unsharded model.
  int tensor_parallel = 1;
  int max_context = 0;      // KV cache capacity in tokens; 0: min(model max, 8192) [TODO: grows]
  // Prompt tokens per prefill forward (bounds activation memory); 0: effective_prefill_chunk.
  int prefill_chunk = 0;
  // GPU only (the CPU computes in f32): bf16 by default, the arithmetic of HF transformers and
  // vLLM in bf16 (Llama-2-7B, 128K prompt on an H200: 12.85 s instead of the exact 22.9 s);
  // decoding keeps f32-level matmuls either way.
  PrefillMatmul prefill_matmul = PrefillMatmul::kBf16;
  PrefillKv prefill_kv = PrefillKv::kExact;              // quantized KV modes only
  // kExact on a quantized cache: the prompt layer by layer (one layer's full-precision rows at a
  // time; Model::prefill_by_layer) instead of chunk by chunk through every layer; the same
  // results. QS_PREFILL_BY_CHUNK=1 in the environment sets it false (A/B of memory and time).
  bool prefill_by_layer = true;
  AttentionOperands draft_attention = AttentionOperands::kF16;     // GPU only: the INT4 view
  AttentionOperands target_attention = AttentionOperands::kF16;    // GPU only: the INT8 view
  DecodeMode mode = DecodeMode::kAr;
  KvType kv = KvType::kFp16;  // AR modes only; an error with kQuantSpec unless kFp16
  bool kv_explicit = false;   // kv was chosen by the user (so kQuantSpec can reject it)
  KvDType kv_dtype = KvDType::kAuto;  // full-precision KV rows (every mode, every rank)
  int group_size = 128;       // G: key group size and flush granularity (32, 64, 128)
  int value_group_size = 0;   // Gv: value channels per group; 0: head_dim
  int gamma = 0;              // draft tokens per round; 0: kDefaultGamma (clamped < G)
  // Speculative modes: each round drafts 0..gamma tokens (0: a plain target step), chosen from the
  // acceptance and the step times measured so far (AdaptiveGamma; `--gamma auto`); gamma 0 then
  // means kAdaptiveGammaMax.
  // A GenerationParams::gamma > 0 still fixes a generation's rounds.
  bool adaptive_gamma = false;
  DraftWeights draft_weights = DraftWeights::kInt4;

  // The most draft tokens a round takes (what the full-precision buffer is sized for): gamma, or
  // when 0 the default (kAdaptiveGammaMax with adaptive_gamma), kept below G.
  int max_round_gamma() const {
    if (gamma > 0) return gamma;
    return std::min(adaptive_gamma ? kAdaptiveGammaMax : kDefaultGamma, group_size - 1);
  }
  // Sparse-KV drafts: prompt positions the draft keeps, a fraction of the prompt (< 1) or an
  // absolute count (>= 1); attention sinks (StreamingLLM); SnapKV's observation window (queries)
  // and max-pool kernel.
  double draft_budget = 0.25;
  int sink_tokens = 4;
  int snap_window = 32;
  int snap_kernel = 7;
  // A prompt cache of one sequence (the server's --prompt-cache): generate() keeps the tokens
  // whose K/V the cache holds when it ends, and the next prompt that starts with some of them
  // prefills only the rest (LlmEngine::reusable_prefix says how much is kept). The fp cache keeps
  // any shared prefix. A quantized cache keeps one where it still holds the full-precision rows
  // that attention at its end reads (KvCache::can_truncate): a prefix that reaches the last
  // quantized group (a conversation's next turn), and one that leaves the previous prompt within
  // its last kPromptCacheTail tokens or shares all of it (another question on the same document,
  // another completion of the same prompt), for which generate() keeps the rows from there on
  // while at most prompt_cache_rows of them lie below the quantization boundary (past that, a
  // long completion drops them, and such a prompt is prefilled whole again). Where the kept
  // history has quantized groups, the rest of the prompt reads it as decoding does (the INT8 view
  // of its quantized part, --prefill-kv quantized): what a decode of those tokens would compute,
  // not an exact prefill of the whole prompt; a shorter history is all full precision, and the
  // rest of the prompt is prefilled exactly after it. The previous prompt again (every cache)
  // runs nothing: the cache is cut back to it and the first token drawn from its kept logits, so
  // the completion is the one a fresh run gets. Not with the sparse-KV drafts (their index is
  // built from the whole prompt).
  bool prompt_cache = false;
  // Llama-2-7B, f16 rows: 0.5 MiB per row (2048 rows: 1 GiB; the buffer then holds ~1.2 GiB
  // with its steady rows); Llama-3.1-8B: 0.125 MiB. Must be >= 0.
  int prompt_cache_rows = 2048;
};

// The prompt tokens before the last one whose full-precision rows a quantized prompt cache keeps
// (EngineOptions::prompt_cache).
inline constexpr int kPromptCacheTail = 256;

// The prefill chunk an engine with these options runs: prefill_chunk, or for 0 the default of
// its device: 8192 on cuda (larger GEMMs and attention launches: H200, Llama-2-7B, 32K prompt,
// 3.14 s with 512, 2.56 s with 2048, 2.33 s with 8192; 128K: 11.92 s with 2048, 11.45 with 8192;
// docs/perf.md sessions 11 and 20; the activations of 8192 rows take ~1.6 GiB for Llama-2-7B,
// ~1.2 GiB more than 2048), 512 on cpu.
inline int effective_prefill_chunk(const EngineOptions& o) {
  if (o.prefill_chunk > 0) return o.prefill_chunk;
  return o.device == Device::kCuda ? 8192 : 512;
}

const char* device_name(Device device);
// Whether this build has the CUDA backend (QS_CUDA=ON).
bool cuda_compiled();
const char* decode_mode_name(DecodeMode mode);
const char* kv_type_name(KvType kv);
// "auto", "f32", "f16".
const char* kv_dtype_name(KvDType t);
const char* prefill_matmul_name(PrefillMatmul p);
const char* prefill_kv_name(PrefillKv p);
const char* attention_operands_name(AttentionOperands d);
// The row type `options` runs with: kF32 or kF16, never kAuto (kAuto: kF16 on cuda, else kF32).
KvDType resolve_kv_dtype(const EngineOptions& options);
const char* draft_weights_name(DraftWeights w);

// A generated token's log-probability under the model's own distribution: log_softmax of the
// target's logits at that position (the original weights over the mode's target KV view: fp16
// rows, or the INT8 view for --kv int8 and QuantSpec), after a LogitAdjust (penalties, bias) and
// before temperature, top-k / top-p / min-p.
// In QuantSpec every emitted token, accepted candidate or not, gets the target's value, which is
// what AR decoding over the same view would report.
struct TokenLogprob {
  int32_t id = -1;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>>
      top;  // the most likely tokens, descending (ties: lower id)
};
constexpr int kMaxTopLogprobs = 20;

// OpenAI's presence / frequency penalties and logit_bias: before sampling, the logit of token t
// at a position becomes logit - frequency_penalty * c(t) - presence_penalty * [c(t) > 0] +
// logit_bias(t), c(t) counting t among the tokens generated before that position (the prompt's
// are not counted, as vLLM does). In the speculative modes the draft's and the target's rows are
// adjusted alike, each by its own position's history (DESIGN.md §4), so QuantSpec still emits
// what the target alone would. Greedy decoding takes the argmax of the adjusted logits.
//
// JSON output (GenerationParams::json_schema) is one more adjustment: -inf on every token that
// would not keep the generated text a prefix of one JSON document the schema accepts
// (json_constraint.h), so every row samples from the target's (or the draft's) distribution
// restricted to those tokens.
struct LogitAdjust {
  float presence_penalty = 0.0f;                      // [-2, 2]
  float frequency_penalty = 0.0f;                     // [-2, 2]
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token, [-100, 100])
  // Set by LlmEngine::generate for GenerationParams::json_schema (callers leave it null).
  JsonConstraint* json = nullptr;
  bool active() const {
    return presence_penalty != 0.0f || frequency_penalty != 0.0f || !logit_bias.empty() ||
           json != nullptr;
  }
};

struct GenerationParams {
  int max_new_tokens = 128;
  SamplingParams sampling;
  std::vector<std::string> stop;  // stop strings: generation ends before the first match
  bool stop_at_eos = true;
  int gamma = 0;  // QuantSpec: draft tokens per round; 0: the engine's (must be < G)
  // Called after each prefill chunk with (prompt tokens done, prompt tokens in all); may be empty.
  std::function<void(int done, int total)> on_prefill_progress;
  // >= 0: every generated token's TokenLogprob, with this many alternatives (<= kMaxTopLogprobs),
  // in GenerationResult::logprobs and through on_logprob (called for each token before the
  // TextCallback's piece of it). Each decode step then copies its target logits rows to the host.
  int logprobs = -1;
  std::function<void(const TokenLogprob&)> on_logprob;
  LogitAdjust adjust;
  // JSON output (OpenAI's response_format): the text of a JSON Schema (json_schema.h; JSON mode,
  // json_object, is kJsonObjectSchema); empty: none. The output is one JSON document the schema
  // accepts; generation ends as it completes (finish "stop"), or at max_new_tokens with a prefix
  // of one ("length").
  std::string json_schema;
};

struct GenerationStats {
  int prompt_tokens = 0;
  // Prompt tokens whose K/V the prompt cache kept from the previous generation (not prefilled
  // again; EngineOptions::prompt_cache).
  int cached_prompt_tokens = 0;
  int generated_tokens = 0;
  double prefill_s = 0;
  double decode_s = 0;
  // Tokens that decoding produced: the first generated token comes from the prompt's logits (the
  // prefill), each further one from decode forwards or rounds. Rates divide by these (vLLM's
  // time per output token), so an AR step's time is decode_s / decode_tokens().
  int decode_tokens() const { return generated_tokens > 1 ? generated_tokens - 1 : 0; }
  double decode_tok_s() const { return decode_s > 0 ? decode_tokens() / decode_s : 0; }

  // QuantSpec (zero in AR modes). acceptance_rate = accepted / drafted (vLLM's definition);
  // mean_accepted_length = 1 + accepted / rounds.
  int rounds = 0;
  // Rounds that drafted nothing (`--gamma auto` where drafting does not pay, or the last token
  // before max_new_tokens): a plain target step each, not counted in rounds.
  int plain_steps = 0;
  int64_t drafted = 0;
  int64_t accepted = 0;
  std::vector<int64_t> accepted_histogram;  // [gamma + 1] rounds that accepted k candidates
  double acceptance_rate() const { return drafted > 0 ? double(accepted) / drafted : 0; }
  double mean_accepted_length() const { return rounds > 0 ? 1.0 + double(accepted) / rounds : 0; }
  double draft_s = 0;   // draft forwards
  double verify_s = 0;  // target forwards (AR: every decode forward)
  double flush_s = 0;   // commits: quantizing complete groups, buffer moves
  // The part of flush_s spent in the commits that quantized a group (the rest is every other
  // commit's length change and, when backend-timed, the two time marks around it): a flush's own
  // cost is flushing_commit_s / flushes.
  double flushing_commit_s = 0;
  double sample_s = 0;  // logit processing, sampling, accept/reject
  // Where draft_s / verify_s / flush_s come from: false, host clocks around each call (stepwise
  // rounds, AR); true, the backend's TimeMarks over the queued work (chained rounds: on a GPU the
  // GPU's own time, without the host's gaps between calls).
  bool phases_backend_timed = false;
  int flushes = 0;      // key groups quantized during decoding
  // KV bytes read per step (one forward), by plane, averaged over steps: the draft's lower-plane
  // bytes are 0 by construction (the draft view never reads them).
  double draft_kv_upper_bytes = 0, draft_kv_lower_bytes = 0, draft_kv_meta_bytes = 0,
         draft_kv_fp_bytes = 0;
  double target_kv_upper_bytes = 0, target_kv_lower_bytes = 0, target_kv_meta_bytes = 0,
         target_kv_fp_bytes = 0;
  int64_t draft_index_bytes = 0;  // sparse-KV drafts: the draft's position index (all layers)
};

struct GenerationResult {
  std::vector<int32_t> tokens;  // generated ids (incl. the EOS id if it ended on one)
  std::string text;             // detokenized completion, stop string removed
  std::string finish_reason;    // "stop" (EOS or stop string), "length", or "cancelled"
  GenerationStats stats;
  std::vector<TokenLogprob> logprobs;  // GenerationParams::logprobs >= 0: one per token
};

// Called once per generated token with the newly completed text (valid UTF-8, stop strings held
// back until they are known not to match; empty when nothing is complete yet). Return false to
// cancel generation: it stops within one token (one speculative round).
using TextCallback = std::function<bool(std::string_view piece)>;

class Engine {
 public:
  // Loads config.json, weights and (when present) the tokenizer. User errors come back as Error.
  static Result<std::unique_ptr<Engine>> load(const std::filesystem::path& dir,
                                              const EngineOptions& options);
  virtual ~Engine() = default;

  // What loading found questionable but not wrong (config.json keys not applied, checkpoint
  // tensors the model does not use), one line each, for the caller to show.
  const std::vector<std::string>& load_warnings() const { return load_warnings_; }

  virtual const ModelConfig& config() const = 0;
  virtual const Tokenizer* tokenizer() const = 0;  // nullptr when the directory has none
  virtual int max_context() const = 0;
  // The backend's hardware in words, and its device memory in use now in bytes (-1: host
  // memory, not measured).
  virtual std::string device_description() const = 0;
  virtual int64_t device_memory_in_use() const = 0;
  // Bytes the KV cache holds now (planes for the whole capacity + the full-precision buffer).
  virtual size_t kv_cache_bytes() const = 0;
  // A new KV cache of `tokens` positions (0: the model's default, as max_context at load) in
  // place of the current one, whose contents are dropped and whose memory goes first; the weights
  // stay. An engine benchmarked (or serving) at one context length then holds only that length's
  // quantized planes, which are allocated for the whole capacity. Errors: the limits of
  // max_context at load, tensor parallelism (not supported), no memory for the new cache (then
  // the engine has none: a prompt is refused until a call that succeeds).
  virtual Status set_max_context(int tokens) = 0;

  // Logits at every position of one prefill of `ids` on an empty cache:
  // row-major [ids.size(), vocab_size]; with last_rows > 0 only the last min(last_rows, n)
  // positions' rows (the others are not computed).
  virtual Result<std::vector<float>> prefill_logits(const std::vector<int32_t>& ids,
                                                    int last_rows = 0) = 0;

  // Generate after `prompt` (ids, special tokens already applied). Needs a tokenizer for stop
  // strings and text; `on_text` may be empty.
  virtual Result<GenerationResult> generate(const std::vector<int32_t>& prompt,
                                            const GenerationParams& params,
                                            const TextCallback& on_text) = 0;

  // Logits at every position of `ids` run from an empty cache through the engine's KV mode as
  // decoding would see it: query t reads the quantized view of [0, b(t)) (docs/quantspec.md) and
  // full precision after. In the fp mode this equals prefill_logits. [ids.size(), vocab_size].
  virtual Result<std::vector<float>> sequence_logits(const std::vector<int32_t>& ids) {
    return prefill_logits(ids, 0);
  }

  // The log-probability of each token of `ids` after the ones before it (entries 1 .. n-1 of
  // `ids`, so n - 1 entries) with its `top` most likely alternatives (0..kMaxTopLogprobs), under
  // the distribution sequence_logits gives, reduced chunk by chunk so that no [n, vocab] array is
  // held (an OpenAI `echo` with `logprobs`: scoring a prompt; `eval ppl`). The first n - 1
  // tokens run through the model (so n may be max_context() + 1), from an empty cache: the KV
  // cache is cleared. `stop`, when set, is asked between chunks; true ends the call with an error
  // ("cancelled").
  virtual Result<std::vector<TokenLogprob>> prompt_logprobs(
      const std::vector<int32_t>& ids, int top, const std::function<bool()>& stop = {}) = 0;

 private:
  std::vector<std::string> load_warnings_;
};

}  // namespace qs
