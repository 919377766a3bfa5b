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

// QS_CHAINED_ROUNDS=0 in the environment: greedy rounds step by step too (the A/B of the bench).
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
  const bool greedy = sampling.temperature <= 0.0f;
  // Greedy rounds on one backend chain the draft's tokens where the logits are; sampling, forced
  // acceptance counts (tests) and tensor parallelism (a rank-0 decision broadcast per forward)
  // bring every draft token back.
  const bool chained =
      greedy && !dispatch_.forward && control.force_accepted < 0 && chained_rounds_enabled();
  RoundResult result;
  QS_TRY(chained ? chained_greedy(x, gamma, n, stats, counters, result)
                 : stepwise(x, gamma, n, sampling, rng, stats, counters, control, result));

  const int flushes_before = cache_.flushes();
  const auto t0 = std::chrono::steady_clock::now();
  if (chained) marks_->record(kCommitBegin);
  if (dispatch_.commit) {
    dispatch_.commit(n + result.accepted + 1);
  } else {
    cache_.commit(n + result.accepted + 1);
  }
  stats.flushes += cache_.flushes() - flushes_before;
  if (chained) {
    // The quantization's time as it ran: waits for it where the commit flushed (once per G
    // tokens); otherwise the commit queued nothing after the round's one wait.
    marks_->record(kCommitEnd);
    stats.flush_s += marks_->seconds(kCommitBegin, kCommitEnd);
  } else {
    stats.flush_s += seconds_since(t0);
  }

  if (gamma > 0) {
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

Status SpeculativeDecoder::chained_greedy(int32_t x, int gamma, int n, GenerationStats& stats,
                                          SpecCounters& counters, RoundResult& result) {
  QS_TRY(target_.check_ids(std::span<const int32_t>(&x, 1)));  // the only id from the host
  Backend& backend = target_.backend();
  // chain_: [x, g1, ..., g_gamma] (each draft step's argmax is the next step's input), then the
  // target's argmax per verified row.
  const size_t len = static_cast<size_t>(gamma) + 1;
  if (!chain_ || chain_->size() < 2 * len) chain_ = backend.alloc_ids(2 * len);
  if (!marks_) marks_ = backend.make_time_marks(kMarks);
  int32_t* ids = chain_->data();
  int32_t* target_argmax = ids + len;
  backend.ids_from_host(&x, ids, 1);

  ForwardPath dpath = draft_path(cache_.mode());
  dpath.draft_weights = &draft_ == &target_;
  dpath.kv_read = &counters.draft_kv;
  dpath.selection = draft_selection_;
  marks_->record(kDraftBegin);
  for (int i = 0; i < gamma; ++i) {
    QS_TRY(draft_.forward_chained(ids + i, 1, n + i, cache_, dpath, LogitRows::kLast, ids + i + 1));
    ++counters.draft_steps;
  }
  marks_->record(kVerifyBegin);
  ForwardPath tpath = target_path(cache_.mode());
  tpath.kv_read = &counters.target_kv;
  QS_TRY(target_.forward_chained(ids, gamma + 1, n, cache_, tpath, LogitRows::kAll, target_argmax));
  ++counters.target_steps;
  marks_->record(kVerifyEnd);

  // The round's one wait: its ids come back together.
  chain_host_.resize(2 * len);
  backend.ids_to_host(ids, chain_host_.data(), 2 * len);
  stats.phases_backend_timed = true;
  stats.draft_s += marks_->seconds(kDraftBegin, kVerifyBegin);
  stats.verify_s += marks_->seconds(kVerifyBegin, kVerifyEnd);
  const auto t0 = std::chrono::steady_clock::now();
  const int32_t* cand = chain_host_.data() + 1;
  const int32_t* y = chain_host_.data() + len;
  int k = 0;
  while (k < gamma && cand[k] == y[k]) ++k;
  result.accepted = k;
  result.tokens.assign(cand, cand + k);
  result.tokens.push_back(y[k]);
  stats.sample_s += seconds_since(t0);
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
  const size_t q_size = static_cast<size_t>(std::max(gamma, 1)) * vocab;
  if (!greedy && (!q_ || q_->size() < q_size)) q_ = backend.alloc(q_size);

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
  std::vector<int32_t> ids{x};  // [x, g1, ..., g_gamma]
  for (int i = 0; i < gamma; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    const std::span<const int32_t> step(&ids.back(), 1);
    int32_t g = -1;
    QS_TRY(forward(draft_, step, n + i, dpath, LogitRows::kLast, greedy ? &g : nullptr));
    ++counters.draft_steps;
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
  QS_TRY(
      forward(target_, ids, n, tpath, LogitRows::kAll, greedy ? verify_argmax_.data() : nullptr));
  ++counters.target_steps;
  stats.verify_s += seconds_since(t0);

  t0 = std::chrono::steady_clock::now();
  if (argmax_only) {
    if (!greedy)
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
