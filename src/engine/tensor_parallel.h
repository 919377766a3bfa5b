// Megatron-style tensor parallelism (docs/multi-gpu.md): the slice of a model that one rank of
// `world` runs. Rank r owns query heads [r*H/w, (r+1)*H/w), kv heads [r*KV/w, (r+1)*KV/w) and MLP
// channels [r*I/w, (r+1)*I/w): the matching rows of q/k/v (and their biases), gate and up, and
// the matching columns of o_proj and down_proj. Embedding, norms, o_proj's bias and lm_head are
// replicated. A Model over the shard, given the group's Communicator, sums the partial o_proj and
// down_proj outputs over the ranks and so computes the unsharded model's hidden states.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/error.h"
#include "model/config.h"
#include "model/weights.h"

namespace qs {

struct ShardedWeights {
  ModelConfig cfg;       // num_heads, num_kv_heads, intermediate_size divided by world;
                         // head_dim kept (explicit), every other field unchanged
  ModelWeights weights;  // views into the original tensors (replicated tensors, row slices) or
                         // into `storage` (column slices, copied); keeps the original mappings
  std::vector<std::shared_ptr<std::vector<uint8_t>>> storage;
  int rank = 0;
  int world = 1;
};

// Checks that (cfg, weights) pass check_model and that the model divides over `world` ranks:
// num_attention_heads, num_key_value_heads and intermediate_size multiples of world. (Fewer kv
// heads than ranks would need the kv heads replicated; not implemented, the error says so.)
Status check_shardable(const ModelConfig& cfg, const ModelWeights& weights, int world);

// Rank `rank`'s shard. The original weights' storage must outlive the result (the row slices
// and replicated tensors point into it; the mappings of `weights.files` are shared).
Result<ShardedWeights> shard_model(const ModelConfig& cfg, const ModelWeights& weights, int rank,
                                   int world);

}  // namespace qs
