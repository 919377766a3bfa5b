#include "engine/speculative.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <utility>

namespace qs {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// QS_CHAINED_ROUNDS=0 in the environment: every round step by step (the A/B of the bench).
bool chained_rounds_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("QS_CHAINED_ROUNDS");
    return v == nullptr || std::string(v) != "0";
  }();
  return on;
}

}  // namespace

SpeculativeDecoder::SpeculativeDecoder(Model& target, Model& draft, KvCache& cache,
                                       const KvSelection* draft_selection,
                                       DecoderDispatch dispatch)
    : target_(target),
      draft_(draft),
      cache_(cache),
      draft_selection_(draft_selection),
      dispatch_(std::move(dispatch)) {
  QS_CHECK(draft.config().vocab_size == target.config().vocab_size);
  // The draft's distributions are sampled and kept where the target's verdict reads them.
  QS_CHECK(&draft.backend() == &target.backend());
  QS_CHECK(!dispatch_.forward || &draft == &target);
}

Result<RoundResult> SpeculativeDecoder::round(int32_t x, int gamma, const SamplingParams& sampling,
                                              Rng& rng, GenerationStats& stats,
                                              SpecCounters& counters, const RoundControl& control) {
  const int n = cache_.length();
  QS_CHECK(gamma >= 0 && gamma < cache_.group_size());
  QS_CHECK(n + gamma < cache_.capacity());
  // Rounds on one backend chain the draft's tokens where the logits are; forced acceptance
  // counts (tests) and tensor parallelism (a rank-0 decision broadcast per forward) bring every
  // draft token back.
  const bool chain = !dispatch_.forward && control.force_accepted < 0 && adjust_ == nullptr &&
                     chained_rounds_enabled();
  RoundResult result;
  QS_TRY(chain ? chained(x, gamma, n, sampling, rng, control, stats, counters, result)
               : stepwise(x, gamma, n, sampling, rng, stats, counters, control, result));
  if (logprobs_ >= 0) {  // the verification rows 0..k, still in the target's logits buffer
    result.logprobs =
        rows_logprobs(target_.backend(), target_.logits_buffer(), target_.config().vocab_size,
                      result.tokens, logprobs_, host_rows_);
  }

  const int flushes_before = cache_.flushes();
  const auto t0 = std::chrono::steady_clock::now();
  if (chain) marks_->record(kCommitBegin);
  if (dispatch_.commit) {
    dispatch_.commit(n + result.accepted + 1);
  } else {
    cache_.commit(n + result.accepted + 1);
  }
  stats.flushes += cache_.flushes() - flushes_before;
  double commit_s = 0;
  if (chain) {
    // The quantization's time as it ran: waits for it where the commit flushed (once per G
    // tokens); otherwise the commit queued nothing after the round's one wait.
    marks_->record(kCommitEnd);
    commit_s = marks_->seconds(kCommitBegin, kCommitEnd);
  } else {
    commit_s = seconds_since(t0);
  }
  stats.flush_s += commit_s;
  if (cache_.flushes() != flushes_before) stats.flushing_commit_s += commit_s;

  if (gamma == 0) {
    ++stats.plain_steps;
  } else {
    ++stats.rounds;
    stats.drafted += gamma;
    stats.accepted += result.accepted;
    if (stats.accepted_histogram.size() < static_cast<size_t>(gamma + 1)) {
      stats.accepted_histogram.resize(static_cast<size_t>(gamma + 1), 0);
    }
    ++stats.accepted_histogram[result.accepted];
  }
  return result;
}

void SpeculativeDecoder::ensure_draft_probs(int gamma, int vocab) {
  const size_t size = static_cast<size_t>(std::max(gamma, 1)) * vocab;
  if (!q_ || q_->size() < size) q_ = target_.backend().alloc(size);
}

Status SpeculativeDecoder::chained(int32_t x, int gamma, int n, const SamplingParams& sampling,
                                   Rng& rng, const RoundControl& control, GenerationStats& stats,
                                   SpecCounters& counters, RoundResult& result) {
  QS_TRY(target_.check_ids(std::span<const int32_t>(&x, 1)));  // the only id from the host
  const int vocab = target_.config().vocab_size;
  const bool greedy = sampling.temperature <= 0.0f;
  Backend& backend = target_.backend();
  // chain_: [x, g1, ..., g_gamma] (each draft step's token is the next step's input), then the
  // target's argmax per verified row (greedy) or the verdict [accepted, token] (sampling).
  const size_t len = static_cast<size_t>(gamma) + 1;
  const size_t out_len = greedy ? len : 2;
  if (!chain_ || chain_->size() < len + out_len)
    chain_ = backend.alloc_ids(len + std::max(len, out_len));
  // Marks: the phases, then each draft step's draw (sampling) between two marks.
  const int slots = kMarks + 2 * gamma;
  if (!marks_ || mark_slots_ < slots) {
    marks_ = backend.make_time_marks(slots);
    mark_slots_ = slots;
  }
  if (!greedy) ensure_draft_probs(gamma, vocab);
  int32_t* ids = chain_->data();
  int32_t* out = ids + len;
  backend.ids_from_host(&x, ids, 1);
  // The same draws in the same order as a stepwise round: one per draft step, then the
  // verdict's gamma + 1.
  if (!greedy) {
    uniforms_.resize(2 * len - 1);
    for (double& u : uniforms_) u = rng.uniform();
  }

  ForwardPath dpath = draft_path(cache_.mode());
  dpath.draft_weights = &draft_ == &target_;
  dpath.kv_read = &counters.draft_kv;
  dpath.selection = draft_selection_;
  marks_->record(kDraftBegin);
  for (int i = 0; i < gamma; ++i) {
    QS_TRY(draft_.forward_chained(ids + i, 1, n + i, cache_, dpath, LogitRows::kLast,
                                  greedy ? ids + i + 1 : nullptr));
    if (!greedy) {
      marks_->record(kMarks + 2 * i);
      backend.sample_rows_into(draft_.logits_buffer(), 1, vocab, sampling, &uniforms_[i],
                               q_->data() + static_cast<size_t>(i) * vocab, ids + i + 1);
      marks_->record(kMarks + 2 * i + 1);
    }
    ++counters.draft_steps;
  }
  marks_->record(kVerifyBegin);
  ForwardPath tpath = target_path(cache_.mode());
  tpath.kv_read = &counters.target_kv;
  QS_TRY(target_.forward_chained(ids, gamma + 1, n, cache_, tpath, LogitRows::kAll,
                                 greedy ? out : nullptr));
  ++counters.target_steps;
  marks_->record(kVerifyEnd);
  if (!greedy) {
    backend.speculative_verdict_into(target_.logits_buffer(), q_->data(), gamma, vocab, sampling,
                                     ids + 1, &uniforms_[len - 1], !control.broken_no_residual,
                                     out);
  }
  marks_->record(kVerdictEnd);

  // The round's one wait: its ids come back together.
  chain_host_.resize(len + out_len);
  backend.ids_to_host(ids, chain_host_.data(), len + out_len);
  stats.phases_backend_timed = true;
  double draws_s = 0.0;
  for (int i = 0; !greedy && i < gamma; ++i) {
    draws_s += marks_->seconds(kMarks + 2 * i, kMarks + 2 * i + 1);
  }
  stats.draft_s += marks_->seconds(kDraftBegin, kVerifyBegin) - draws_s;
  stats.verify_s += marks_->seconds(kVerifyBegin, kVerifyEnd);
  stats.sample_s += draws_s + marks_->seconds(kVerifyEnd, kVerdictEnd);
  const int32_t* cand = chain_host_.data() + 1;
  const int32_t* verdict = chain_host_.data() + len;
  int k = 0;
  if (greedy) {
    while (k < gamma && cand[k] == verdict[k]) ++k;
  } else {
    k = verdict[0];
    QS_CHECK(k >= 0 && k <= gamma);
  }
  result.accepted = k;
  result.tokens.assign(cand, cand + k);
  result.tokens.push_back(greedy ? verdict[k] : verdict[1]);
  return Status::ok_status();
}

Status SpeculativeDecoder::stepwise(int32_t x, int gamma, int n, const SamplingParams& sampling,
                                    Rng& rng, GenerationStats& stats, SpecCounters& counters,
                                    const RoundControl& control, RoundResult& result) {
  const int vocab = target_.config().vocab_size;
  const bool greedy = sampling.temperature <= 0.0f;
  // Sampling runs where the logits are (Backend::sample_rows / speculative_verdict on the
  // target's backend, rank 0's with tensor parallelism); only tokens come back. The draft's
  // processed distributions stay there for the verdict.
  Backend& backend = target_.backend();
  if (!greedy) ensure_draft_probs(gamma, vocab);

  // Draft: inputs x, g1, ..., g(gamma-1) at positions n.., each writing its K/V after n.
  ForwardPath dpath = draft_path(cache_.mode());
  dpath.draft_weights = &draft_ == &target_;
  dpath.kv_read = &counters.draft_kv;
  dpath.selection = draft_selection_;
  // Greedy needs only each row's argmax (Backend::argmax_rows); sampling keeps the logits in the
  // backend (no host pointer: Model::logits_buffer).
  auto forward = [&](Model& model, std::span<const int32_t> in, int pos, const ForwardPath& path,
                     LogitRows rows, int32_t* tokens) {
    return dispatch_.forward ? dispatch_.forward(in, pos, path, rows, nullptr, tokens)
                             : model.forward(in, pos, cache_, path, rows, nullptr, tokens);
  };
  // An adjustment (set_adjust) changes each row where it is, before its argmax or draw: row j of
  // [x, g1, ...] predicts the token after the generated ones and g1..gj.
  const bool adjust = adjust_ != nullptr;
  std::vector<int32_t>& ids = ids_;  // [x, g1, ..., g_gamma]
  ids.assign(1, x);
  // Rows first .. first + rows - 1 of the round (draft step i is row i), after ids[1 .. row].
  auto adjust_rows = [&](Model& model, int first, int rows) {
    adjuster_.apply(backend, model.mutable_logits_buffer(), rows, vocab, *adjust_, *generated_,
                    std::span<const int32_t>(ids.data() + 1, ids.size() - 1), first);
  };
  for (int i = 0; i < gamma; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    const std::span<const int32_t> step(&ids.back(), 1);
    int32_t g = -1;
    QS_TRY(forward(draft_, step, n + i, dpath, LogitRows::kLast, greedy && !adjust ? &g : nullptr));
    ++counters.draft_steps;
    if (adjust) {
      adjust_rows(draft_, i, 1);
      if (greedy) backend.argmax_rows(draft_.logits_buffer(), 1, vocab, &g);
    }
    stats.draft_s += seconds_since(t0);
    if (!greedy) {
      t0 = std::chrono::steady_clock::now();
      const double u = rng.uniform();
      backend.sample_rows(draft_.logits_buffer(), 1, vocab, sampling, &u,
                          q_->data() + static_cast<size_t>(i) * vocab, &g);
      stats.sample_s += seconds_since(t0);
    }
    ids.push_back(g);
  }

  // Verify: one target forward over [x, g1..g_gamma] overwrites those rows with target K/V.
  auto t0 = std::chrono::steady_clock::now();
  ForwardPath tpath = target_path(cache_.mode());
  tpath.kv_read = &counters.target_kv;
  // The target's greedy token after each number of accepted candidates (greedy, or a forced
  // acceptance count).
  const bool argmax_only = greedy || control.force_accepted >= 0;
  verify_argmax_.resize(static_cast<size_t>(gamma + 1));
  QS_TRY(forward(target_, ids, n, tpath, LogitRows::kAll,
                 greedy && !adjust ? verify_argmax_.data() : nullptr));
  ++counters.target_steps;
  stats.verify_s += seconds_since(t0);

  t0 = std::chrono::steady_clock::now();
  if (adjust) adjust_rows(target_, 0, gamma + 1);
  if (argmax_only) {
    if (!greedy || adjust)
      backend.argmax_rows(target_.logits_buffer(), gamma + 1, vocab, verify_argmax_.data());
    int k = 0;
    while (k < gamma && (control.force_accepted >= 0 ? k < control.force_accepted
                                                     : ids[k + 1] == verify_argmax_[k])) {
      ++k;
    }
    result.accepted = k;
    result.tokens.assign(ids.begin() + 1, ids.begin() + 1 + k);
    result.tokens.push_back(verify_argmax_[static_cast<size_t>(k)]);
  } else {
    // A fixed draw schedule per round: gamma acceptance uniforms, then the final token's.
    uniforms_.resize(static_cast<size_t>(gamma + 1));
    for (double& u : uniforms_) u = rng.uniform();
    const SpecVerdict v =
        backend.speculative_verdict(target_.logits_buffer(), q_->data(), gamma, vocab, sampling,
                                    ids.data() + 1, uniforms_.data(), !control.broken_no_residual);
    result.accepted = v.accepted;
    result.tokens.assign(ids.begin() + 1, ids.begin() + 1 + v.accepted);
    result.tokens.push_back(v.token);
  }
  stats.sample_s += seconds_since(t0);

  return Status::ok_status();
}

}  // namespace qs
