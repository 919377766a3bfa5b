// One QuantSpec round (DESIGN.md §3-§4): gamma draft steps over the draft path, one target
// forward over the gamma + 1 positions, accept/reject with the same logit processing on p and q,
// commit by length.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "engine/engine.h"
#include "engine/logit_adjust.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "kv/kv_cache.h"

namespace qs {

// Test hooks; the defaults are the normative rule.
struct RoundControl {
  // >= 0: accept exactly min(force_accepted, gamma) candidates whatever they are, then the
  // target's argmax (drives the transaction tests through chosen rejection points).
  int force_accepted = -1;
  // Deliberately wrong: on a rejection sample from p instead of normalize(max(p - q, 0)).
  // Exists only so the distribution test can show it has the power to fail.
  bool broken_no_residual = false;
};

struct RoundResult {
  std::vector<int32_t> tokens;  // emitted: the accepted candidates g1..gk, then y
  int accepted = 0;             // k
  // set_logprobs(top >= 0): each emitted token's log-probability under the target's verification
  // logits at its position (rows 0..k), with `top` alternatives.
  std::vector<TokenLogprob> logprobs;
};

// Accumulated over rounds, turned into GenerationStats by the engine.
struct SpecCounters {
  KvReadBytes draft_kv, target_kv;  // summed over forwards
  int64_t draft_steps = 0, target_steps = 0;
};

// How a decoder runs its forwards and commits; empty members: draft.forward / target.forward on
// `cache` and cache.commit. Tensor parallelism (LlmEngine with tensor_parallel > 1): the same call
// on every rank's shard and cache, logits from rank 0. Sampling and accept/reject then run once,
// on the caller's thread, and every rank gets the decided tokens as the next forward's input and
// the decided length as its commit. `forward` serves both paths (ForwardPath::draft_weights says
// which weights), so it needs draft == target.
struct DecoderDispatch {
  std::function<Status(std::span<const int32_t> ids, int pos, const ForwardPath& path,
                       LogitRows rows, float* logits, int32_t* argmax)>
      forward;  // Model::forward's rows / logits / argmax
  std::function<void(int length)> commit;
};

class SpeculativeDecoder {
 public:
  // The cache holds the committed prefix; the draft forwards run `draft` with its draft weights
  // when it is `target` (QuantSpec: one model, two paths). A different draft model (tests) runs
  // with its own original weights; it must have the target's shape and backend.
  // draft_selection ([num_layers], optional): the sparse-KV draft's view of the history.
  SpeculativeDecoder(Model& target, Model& draft, KvCache& cache,
                     const KvSelection* draft_selection = nullptr,
                     DecoderDispatch dispatch = {});

  // A round from n = cache.length() with input x (the last emitted token, not in the cache).
  // gamma >= 0 (0: one target step, the bonus sampled from p_1); n + gamma < capacity.
  // Commits n + k + 1. Rounds without a dispatch or a forced acceptance count run chained; the
  // others step by step (stepwise). Both give the same tokens from the same draws.
  Result<RoundResult> round(int32_t x, int gamma, const SamplingParams& sampling, Rng& rng,
                            GenerationStats& stats, SpecCounters& counters,
                            const RoundControl& control = {});

  // top >= 0: later rounds report RoundResult::logprobs (their target rows come to the host);
  // -1 (the default): none.
  void set_logprobs(int top) { logprobs_ = top; }
  // An active adjustment (penalties, logit_bias) for later rounds, over the tokens generated before
  // each round (`generated`, which must outlive them: the caller's list, updated by it): every
  // draft and verification row is adjusted by its own position's history, and the rounds run
  // stepwise (each draft token comes back before the next row is adjusted). nullptr: none.
  void set_adjust(const LogitAdjust* adjust, const std::vector<int32_t>* generated) {
    adjust_ = adjust != nullptr && adjust->active() ? adjust : nullptr;
    generated_ = generated;
  }

 private:
  // The round's forwards and verdict from n = cache length into result (round commits).
  // chained: the ids stay in backend memory (Model::forward_chained), each draft token (argmax,
  // or a draw by Backend::sample_rows_into) feeds the next step there, the verdict is computed
  // there (the argmax rows, or Backend::speculative_verdict_into), and the round waits once, for
  // its ids and verdict; phases timed by the backend's TimeMarks (as the GPU ran them). stepwise:
  // each draft token comes back before the next step (forced acceptance counts, tensor
  // parallelism); host-timed phases.
  Status chained(int32_t x, int gamma, int n, const SamplingParams& sampling, Rng& rng,
                 const RoundControl& control, GenerationStats& stats, SpecCounters& counters,
                 RoundResult& result);
  Status stepwise(int32_t x, int gamma, int n, const SamplingParams& sampling, Rng& rng,
                  GenerationStats& stats, SpecCounters& counters, const RoundControl& control,
                  RoundResult& result);

  // q_ of at least [max(gamma, 1), vocab] (a sampling round's draft distributions).
  void ensure_draft_probs(int gamma, int vocab);

  // Then 2 per draft step: its draw's begin and end (chained sampling rounds).
  enum Mark {
    kDraftBegin,
    kVerifyBegin,
    kVerifyEnd,
    kVerdictEnd,
    kCommitBegin,
    kCommitEnd,
    kMarks
  };
  Model& target_;
  Model& draft_;
  KvCache& cache_;
  const KvSelection* draft_selection_;  // [num_layers] or nullptr
  DecoderDispatch dispatch_;
  std::vector<int32_t> verify_argmax_;  // [gamma + 1] the target's argmax per row
  std::unique_ptr<Buffer> q_;           // [gamma, vocab] the draft's distributions (backend)
  std::vector<double> uniforms_;        // the round's draws (stepwise: the verdict's gamma + 1)
  std::unique_ptr<IdBuffer> chain_;     // chained: [gamma + 1] ids, [gamma + 1] argmax or [2]
  std::vector<int32_t> chain_host_;     // chain_ back on the host
  std::unique_ptr<TimeMarks> marks_;    // [mark_slots_]
  int mark_slots_ = 0;
  int logprobs_ = -1;             // set_logprobs
  std::vector<float> host_rows_;  // set_logprobs: the verification rows on the host
  const LogitAdjust* adjust_ = nullptr;  // set_adjust
  const std::vector<int32_t>* generated_ = nullptr;
  LogitAdjuster adjuster_;
  std::vector<int32_t> ids_;  // stepwise: [x, g1, ..., g_gamma]
};

}  // namespace qs
