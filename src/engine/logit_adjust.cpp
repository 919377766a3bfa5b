#include "engine/logit_adjust.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <unordered_map>

namespace qs {

Status check_logit_adjust(const LogitAdjust& a, int vocab) {
  for (const auto& [name, v] :
       {std::pair<const char*, float>{"presence_penalty", a.presence_penalty},
        {"frequency_penalty", a.frequency_penalty}}) {
    if (!(v >= -2.0f && v <= 2.0f)) {
      return make_error(std::string(name) + " must be in [-2, 2], got " + std::to_string(v));
    }
  }
  for (const auto& [id, bias] : a.logit_bias) {
    if (id < 0 || id >= vocab) {
      return make_error("logit_bias: token id " + std::to_string(id) +
                        " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }
    if (!(bias >= -100.0f && bias <= 100.0f)) {
      return make_error("logit_bias: the bias of token " + std::to_string(id) +
                        " must be in [-100, 100], got " + std::to_string(bias));
    }
  }
  return Status::ok_status();
}

void LogitAdjuster::fill(int rows, int vocab, const LogitAdjust& a,
                         std::span<const int32_t> history, std::span<const int32_t> extra,
                         int first) {
  QS_CHECK(rows >= 1 && first >= 0 && static_cast<int>(extra.size()) >= first + rows - 1);
  for (int i = 0; i < first + rows - 1; ++i) {
    const int32_t t = extra[static_cast<size_t>(i)];
    QS_CHECK(t >= 0 && t < vocab);
  }
  const size_t v = static_cast<size_t>(vocab);
  host_.assign(static_cast<size_t>(rows) * v, 0.0f);
  for (int j = 0; j < rows; ++j) {
    float* row = host_.data() + static_cast<size_t>(j) * v;
    for (const auto& [id, bias] : a.logit_bias) row[static_cast<size_t>(id)] += bias;
  }
  // The penalties count the whole history: only when there are any (JSON mode alone reads only
  // the tokens it has not seen).
  if (a.presence_penalty != 0.0f || a.frequency_penalty != 0.0f) {
    add_penalties(rows, vocab, a, history, extra, first);
  }
  if (a.json != nullptr) mask_json(*a.json, rows, vocab, history, extra, first);
}

void LogitAdjuster::add_penalties(int rows, int vocab, const LogitAdjust& a,
                                  std::span<const int32_t> history, std::span<const int32_t> extra,
                                  int first) {
  std::unordered_map<int32_t, int> counts;
  for (int32_t t : history) {
    QS_CHECK(t >= 0 && t < vocab);
    ++counts[t];
  }
  for (int i = 0; i < first; ++i) ++counts[extra[static_cast<size_t>(i)]];
  auto penalty = [&](int c) {
    return a.frequency_penalty * static_cast<float>(c) + (c > 0 ? a.presence_penalty : 0.0f);
  };
  const size_t v = static_cast<size_t>(vocab);
  for (int j = 0; j < rows; ++j) {
    if (j > 0) ++counts[extra[static_cast<size_t>(first + j - 1)]];
    float* row = host_.data() + static_cast<size_t>(j) * v;
    for (const auto& [t, c] : counts) row[static_cast<size_t>(t)] -= penalty(c);
  }
}

void LogitAdjuster::mask_json(JsonConstraint& json, int rows, int vocab,
                              std::span<const int32_t> history, std::span<const int32_t> extra,
                              int first) {
  QS_CHECK(json.vocab() == vocab);
  if (json_of_ != &json || history.size() < json_history_.size() ||
      !std::equal(json_history_.begin(), json_history_.end(), history.begin())) {
    json_of_ = &json;
    json_history_.clear();
    json_state_ = json.start();
  }
  // Every token here came from a row masked alike, so each continues the object.
  for (size_t i = json_history_.size(); i < history.size(); ++i) {
    QS_CHECK(json.advance(json_state_, history[i]));
    json_history_.push_back(history[i]);
  }
  JsonState s = json_state_;
  for (int i = 0; i < first; ++i) QS_CHECK(json.advance(s, extra[static_cast<size_t>(i)]));
  const size_t v = static_cast<size_t>(vocab);
  for (int j = 0; j < rows; ++j) {
    if (j > 0) QS_CHECK(json.advance(s, extra[static_cast<size_t>(first + j - 1)]));
    const std::vector<uint64_t>& bits = json.allowed(s);
    float* row = host_.data() + static_cast<size_t>(j) * v;
    for (size_t id = 0; id < v; ++id) {
      if (((bits[id / 64] >> (id % 64)) & 1u) == 0) row[id] = -INFINITY;
    }
  }
}

void LogitAdjuster::apply(Backend& backend, float* logits, int rows, int vocab,
                          const LogitAdjust& a, std::span<const int32_t> history,
                          std::span<const int32_t> extra, int first) {
  fill(rows, vocab, a, history, extra, first);
  if (!device_ || device_->size() < host_.size()) device_ = backend.alloc(host_.size());
  backend.from_host(host_.data(), device_->data(), host_.size());
  backend.add(logits, device_->data(), static_cast<int64_t>(host_.size()));
}

void LogitAdjuster::apply_host(float* logits, int vocab, const LogitAdjust& a,
                               std::span<const int32_t> history) {
  fill(1, vocab, a, history, {}, 0);
  for (int i = 0; i < vocab; ++i) logits[i] += host_[static_cast<size_t>(i)];
}

}  // namespace qs
