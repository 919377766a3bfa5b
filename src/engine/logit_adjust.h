// Applying GenerationParams::adjust (engine.h's LogitAdjust) to logit rows where they are.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "engine/engine.h"
#include "engine/json_constraint.h"

namespace qs {

// Penalties within [-2, 2], biases within [-100, 100] on ids of the vocabulary.
Status check_logit_adjust(const LogitAdjust& adjust, int vocab);

class LogitAdjuster {
 public:
  // `rows` rows of `vocab` logits in backend memory for the positions after `history` and then
  // extra[0 .. first + j) (row j: a round's draft step first + j, or its verification row j). The
  // rows' adjustments are formed on the host and added by Backend::from_host + Backend::add,
  // which every backend has.
  void apply(Backend& backend, float* logits, int rows, int vocab, const LogitAdjust& adjust,
             std::span<const int32_t> history, std::span<const int32_t> extra = {}, int first = 0);
  // One row in host memory, after `history`.
  void apply_host(float* logits, int vocab, const LogitAdjust& adjust,
                  std::span<const int32_t> history);

 private:
  // host_ = the adjustments of the rows apply() describes.
  void fill(int rows, int vocab, const LogitAdjust& adjust, std::span<const int32_t> history,
            std::span<const int32_t> extra, int first);
  // The presence / frequency penalties of each row, from its position's token counts.
  void add_penalties(int rows, int vocab, const LogitAdjust& adjust,
                     std::span<const int32_t> history, std::span<const int32_t> extra, int first);
  // -inf where JSON mode refuses a token, in each row.
  void mask_json(JsonConstraint& json, int rows, int vocab, std::span<const int32_t> history,
                 std::span<const int32_t> extra, int first);

  std::vector<float> host_;
  // JSON mode: the state after json_history_ (a generation's history only grows, so each call
  // reads its new tokens alone; a history that does not extend it starts again).
  const JsonConstraint* json_of_ = nullptr;
  std::vector<int32_t> json_history_;
  JsonState json_state_;
  std::unique_ptr<Buffer> device_;
};

}  // namespace qs
