#include "engine/tensor_parallel.h"

#include <cstring>
#include <string>

#include "core/dtype.h"
#include "engine/model.h"

namespace qs {

namespace {

std::string s(int64_t v) { return std::to_string(v); }

// Rows [first, first + count) of a matrix: a view of the same bytes.
WeightView row_slice(const WeightView& w, int64_t first, int64_t count) {
  WeightView out = w;
  out.data = static_cast<const uint8_t*>(w.data) +
             static_cast<size_t>(first * w.cols) * dtype_size(w.dtype);
  out.rows = count;
  return out;
}

// Elements [first, first + count) of a vector stored as {1, n} or {n, 1}: a view, as {1, count}.
WeightView vector_slice(const WeightView& w, int64_t first, int64_t count) {
  if (w.empty()) return w;
  WeightView out = w;
  out.data = static_cast<const uint8_t*>(w.data) + static_cast<size_t>(first) * dtype_size(w.dtype);
  out.rows = 1;
  out.cols = count;
  return out;
}

// Columns [first, first + count) of a matrix, copied into storage the shard owns.
WeightView col_slice(const WeightView& w, int64_t first, int64_t count, ShardedWeights& shard) {
  const size_t es = dtype_size(w.dtype);
  auto bytes = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(w.rows * count) * es);
  const uint8_t* src = static_cast<const uint8_t*>(w.data);
  for (int64_t r = 0; r < w.rows; ++r) {
    std::memcpy(bytes->data() + static_cast<size_t>(r * count) * es,
                src + static_cast<size_t>(r * w.cols + first) * es, static_cast<size_t>(count) * es);
  }
  shard.storage.push_back(bytes);
  WeightView out = w;
  out.data = bytes->data();
  out.cols = count;
  return out;
}

}  // namespace

Status check_shardable(const ModelConfig& cfg, const ModelWeights& weights, int world) {
  if (world < 1) return make_error("tensor parallel: world size must be >= 1, got " + s(world));
  QS_TRY(check_model(cfg, weights));
  if (cfg.num_heads % world != 0) {
    return make_error("tensor parallel: num_attention_heads (" + s(cfg.num_heads) +
                      ") is not a multiple of the world size (" + s(world) + ")");
  }
  if (cfg.num_kv_heads % world != 0) {
    return make_error("tensor parallel: num_key_value_heads (" + s(cfg.num_kv_heads) +
                      ") is not a multiple of the world size (" + s(world) +
                      ")" +
                      (cfg.num_kv_heads < world
                           ? "; replicating kv heads over ranks is not implemented"
                           : ""));
  }
  if (cfg.intermediate_size % world != 0) {
    return make_error("tensor parallel: intermediate_size (" + s(cfg.intermediate_size) +
                      ") is not a multiple of the world size (" + s(world) + ")");
  }
  return Status::ok_status();
}

Result<ShardedWeights> shard_model(const ModelConfig& cfg, const ModelWeights& weights, int rank,
                                   int world) {
  QS_TRY(check_shardable(cfg, weights, world));
  if (rank < 0 || rank >= world) {
    return make_error("tensor parallel: rank " + s(rank) + " is out of range [0, " + s(world) +
                      ")");
  }
  ShardedWeights shard;
  shard.rank = rank;
  shard.world = world;
  shard.cfg = cfg;
  shard.cfg.num_heads = cfg.num_heads / world;
  shard.cfg.num_kv_heads = cfg.num_kv_heads / world;
  shard.cfg.intermediate_size = cfg.intermediate_size / world;

  const int64_t qd = shard.cfg.q_dim(), kvd = shard.cfg.kv_dim();
  const int64_t inter = shard.cfg.intermediate_size;
  const int64_t q0 = rank * qd, kv0 = rank * kvd, i0 = rank * inter;

  ModelWeights& out = shard.weights;
  out.tok_embeddings = weights.tok_embeddings;
  out.final_norm = weights.final_norm;
  out.lm_head = weights.lm_head;
  out.files = weights.files;
  out.layers.reserve(weights.layers.size());
  for (const LayerWeights& L : weights.layers) {
    LayerWeights S;
    S.attn_norm = L.attn_norm;
    S.mlp_norm = L.mlp_norm;
    S.wq = row_slice(L.wq, q0, qd);
    S.wk = row_slice(L.wk, kv0, kvd);
    S.wv = row_slice(L.wv, kv0, kvd);
    S.bq = vector_slice(L.bq, q0, qd);
    S.bk = vector_slice(L.bk, kv0, kvd);
    S.bv = vector_slice(L.bv, kv0, kvd);
    S.wo = col_slice(L.wo, q0, qd, shard);
    S.bo = L.bo;  // replicated; the Model adds it on rank 0 only (once into the sum)
    S.w_gate = row_slice(L.w_gate, i0, inter);
    S.w_up = row_slice(L.w_up, i0, inter);
    S.w_down = col_slice(L.w_down, i0, inter, shard);
    out.layers.push_back(std::move(S));
  }
  QS_TRY(check_model(shard.cfg, shard.weights));  // a bug if it fails
  return shard;
}

}  // namespace qs
