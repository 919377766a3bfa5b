#include "engine/speculative.h"

#include <algorithm>
#include <chrono>
#include <utility>

namespace qs {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
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
  QS_CHECK(!dispatch_.forward || &draft == &target);
}

Result<RoundResult> SpeculativeDecoder::round(int32_t x, int gamma, const SamplingParams& sampling,
                                              Rng& rng, GenerationStats& stats,
                                              SpecCounters& counters, const RoundControl& control) {
  const int vocab = target_.config().vocab_size;
  const int n = cache_.length();
  QS_CHECK(gamma >= 0 && gamma < cache_.group_size());
  QS_CHECK(n + gamma < cache_.capacity());
  const bool greedy = sampling.temperature <= 0.0f;
  logits_.resize(static_cast<size_t>(vocab));
  if (q_.size() < static_cast<size_t>(gamma)) q_.resize(static_cast<size_t>(gamma));

  // Draft: inputs x, g1, ..., g(gamma-1) at positions n.., each writing its K/V after n.
  ForwardPath dpath = draft_path(cache_.mode());
  dpath.draft_weights = &draft_ == &target_;
  dpath.kv_read = &counters.draft_kv;
  dpath.selection = draft_selection_;
  // Greedy needs only each row's argmax, which the backend computes where the logits are
  // (Backend::argmax_rows); sampling needs the logits on the host.
  auto forward = [&](Model& model, std::span<const int32_t> in, int pos, const ForwardPath& path,
                     LogitRows rows, float* logits, int32_t* tokens) {
    return dispatch_.forward ? dispatch_.forward(in, pos, path, rows, logits, tokens)
                             : model.forward(in, pos, cache_, path, rows, logits, tokens);
  };
  std::vector<int32_t> ids{x};  // [x, g1, ..., g_gamma]
  for (int i = 0; i < gamma; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    const std::span<const int32_t> step(&ids.back(), 1);
    int32_t g = -1;
    QS_TRY(forward(draft_, step, n + i, dpath, LogitRows::kLast, logits_.data(),
                   greedy ? &g : nullptr));
    ++counters.draft_steps;
    stats.draft_s += seconds_since(t0);
    if (!greedy) {
      t0 = std::chrono::steady_clock::now();
      token_probabilities(logits_.data(), vocab, sampling, q_[i]);
      g = sample_from(q_[i], rng);
      stats.sample_s += seconds_since(t0);
    }
    ids.push_back(g);
  }

  // Verify: one target forward over [x, g1..g_gamma] overwrites those rows with target K/V.
  auto t0 = std::chrono::steady_clock::now();
  ForwardPath tpath = target_path(cache_.mode());
  tpath.kv_read = &counters.target_kv;
  if (greedy) {
    verify_argmax_.resize(static_cast<size_t>(gamma + 1));
  } else {
    verify_logits_.resize(static_cast<size_t>(gamma + 1) * vocab);
  }
  QS_TRY(forward(target_, ids, n, tpath, LogitRows::kAll, verify_logits_.data(),
                 greedy ? verify_argmax_.data() : nullptr));
  ++counters.target_steps;
  stats.verify_s += seconds_since(t0);

  t0 = std::chrono::steady_clock::now();
  RoundResult result;
  int32_t y = -1;
  // The target's greedy token after i accepted candidates.
  auto target_argmax = [&](int i) {
    return greedy ? verify_argmax_[static_cast<size_t>(i)]
                  : argmax(verify_logits_.data() + static_cast<size_t>(i) * vocab, vocab);
  };
  for (int i = 0; i < gamma && y < 0; ++i) {
    const int32_t g = ids[i + 1];
    bool accept;
    if (control.force_accepted >= 0) {
      accept = i < control.force_accepted;
    } else if (greedy) {
      accept = g == target_argmax(i);
    } else {
      token_probabilities(verify_logits_.data() + static_cast<size_t>(i) * vocab, vocab, sampling,
                          p_);
      const double pg = p_[g], qg = q_[i][g];  // qg > 0: g was drawn from q
      accept = rng.uniform() < std::min(1.0, pg / qg);
    }
    if (accept) {
      result.tokens.push_back(g);
      ++result.accepted;
      continue;
    }
    if (greedy || control.force_accepted >= 0) {
      y = target_argmax(i);
    } else if (control.broken_no_residual) {
      y = sample_from(p_, rng);
    } else {
      // The residual normalize(max(p - q, 0)); all zero only when p == q up to rounding, where
      // a rejection is (nearly) impossible and p itself is the right law.
      double mass = 0.0;
      for (int t = 0; t < vocab; ++t) {
        const float r = std::max(p_[t] - q_[i][t], 0.0f);
        q_[i][t] = r;
        mass += r;
      }
      y = mass > 0.0 ? sample_from(q_[i], rng) : sample_from(p_, rng);
    }
  }
  if (y < 0) {  // every candidate accepted: the bonus from p_(gamma+1)
    y = greedy ? target_argmax(gamma)
               : sample_token(verify_logits_.data() + static_cast<size_t>(gamma) * vocab, vocab,
                              sampling, rng, p_);
  }
  result.tokens.push_back(y);
  stats.sample_s += seconds_since(t0);

  t0 = std::chrono::steady_clock::now();
  const int flushes_before = cache_.flushes();
  if (dispatch_.commit) {
    dispatch_.commit(n + result.accepted + 1);
  } else {
    cache_.commit(n + result.accepted + 1);
  }
  stats.flushes += cache_.flushes() - flushes_before;
  stats.flush_s += seconds_since(t0);

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

}  // namespace qs
