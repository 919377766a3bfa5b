#include "engine/llm_engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>
#include <unordered_set>

#include "engine/adaptive_gamma.h"
#include "engine/backend_factory.h"
#include "engine/logit_adjust.h"
#include "engine/sampler.h"
#include "engine/stop_matcher.h"
#include "engine/tensor_parallel.h"

namespace qs {

namespace {

constexpr int kDefaultMaxContext = 8192;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Status check_finite_logits(std::span<const float> logits) {
  for (size_t i = 0; i < logits.size(); ++i) {
    if (!std::isfinite(logits[i])) {
      return make_error("the prompt's logits are not finite (token " + std::to_string(i) + ": " +
                        std::to_string(logits[i]) +
                        "): the model's weights hold NaN or Inf values, or its activations "
                        "overflow");
    }
  }
  return Status::ok_status();
}

Result<int> resolve_max_context(const ModelConfig& cfg, const EngineOptions& options) {
  if (options.max_context < 0) {
    return make_error("max_context must be >= 0 (0: the model's), got " +
                      std::to_string(options.max_context));
  }
  int ctx = options.max_context;
  if (ctx == 0) {
    ctx = cfg.max_position_embeddings > 0
              ? std::min(cfg.max_position_embeddings, kDefaultMaxContext)
              : kDefaultMaxContext;
    if (cfg.sliding_window > 0) ctx = std::min(ctx, cfg.sliding_window);
  } else if (cfg.sliding_window > 0 && ctx > cfg.sliding_window) {
    return make_error("max_context " + std::to_string(ctx) +
                      " exceeds the model's sliding_window of " +
                      std::to_string(cfg.sliding_window) +
                      " (sliding-window attention is not implemented; use a context <= " +
                      std::to_string(cfg.sliding_window) + ")");
  }
  return ctx;
}

Result<std::unique_ptr<LlmEngine>> LlmEngine::create(const ModelConfig& cfg, ModelWeights weights,
                                                     std::optional<Tokenizer> tokenizer,
                                                     const EngineOptions& options) {
  if (options.num_threads < 0) {
    return make_error("num_threads must be >= 0 (0: all), got " +
                      std::to_string(options.num_threads));
  }
  if (options.prefill_chunk < 0) {
    return make_error("prefill_chunk must be >= 0 (0: the device's default), got " +
                      std::to_string(options.prefill_chunk));
  }
  if (options.prompt_cache_rows < 0) {
    return make_error("prompt_cache_rows must be >= 0, got " +
                      std::to_string(options.prompt_cache_rows));
  }
  if (options.tensor_parallel < 1) {
    return make_error("tensor parallel size (--tp) must be >= 1, got " +
                      std::to_string(options.tensor_parallel));
  }
  QS_TRY(check_model(cfg, weights));
  QS_ASSIGN_OR_RETURN(int ctx, resolve_max_context(cfg, options));
  const bool qspec = options.mode == DecodeMode::kQuantSpec;
  if (qspec && options.kv_explicit) {
    return make_error(
        "--kv selects the cache of autoregressive modes; --mode quantspec always uses the "
        "hierarchical cache (INT4 draft view, INT8 target view): drop --kv");
  }
  const bool sparse =
      options.mode == DecodeMode::kStreamingLlm || options.mode == DecodeMode::kSnapKv;
  if (sparse) {
    if (options.kv_explicit && options.kv != KvType::kFp16) {
      return make_error(std::string("--mode ") + decode_mode_name(options.mode) +
                        " keeps the full-precision KV cache for the target: drop --kv");
    }
    if (!(options.draft_budget > 0.0 && std::isfinite(options.draft_budget))) {
      return make_error(
          "draft budget must be a finite number > 0 (a fraction < 1 or a count >= 1), got " +
          std::to_string(options.draft_budget));
    }
    if (options.sink_tokens < 0 || options.snap_window < 1 || options.snap_kernel < 1 ||
        options.snap_kernel % 2 == 0) {
      return make_error("sparse draft: sinks must be >= 0, the observation window >= 1 and the "
                        "pooling kernel odd and >= 1");
    }
    if (options.tensor_parallel > 1) {
      return make_error(std::string("--mode ") + decode_mode_name(options.mode) +
                        " is not with --tp yet (the sparse draft's selection is not sharded): "
                        "use --tp 1, or --mode ar / quantspec");
    }
  }
  if (options.gamma < 0) {
    return make_error("gamma must be >= 1, got " + std::to_string(options.gamma));
  }
  if ((qspec || sparse) && options.gamma >= options.group_size) {
    return make_error(
        "gamma " + std::to_string(options.gamma) +
        " must be smaller than the group size G = " + std::to_string(options.group_size));
  }
  KvCacheConfig kv;
  kv.mode = qspec                         ? KvMode::kQuantSpec
            : options.kv == KvType::kInt8 ? KvMode::kInt8
            : options.kv == KvType::kInt4 ? KvMode::kInt4
                                          : KvMode::kFp;
  kv.num_layers = cfg.num_layers;
  kv.num_kv_heads = cfg.num_kv_heads;
  kv.head_dim = cfg.head_dim;
  kv.group_size = options.group_size;
  kv.value_group_size = options.value_group_size;
  const int gamma = options.max_round_gamma();
  kv.max_gamma = qspec ? gamma : 0;
  kv.capacity = ctx;
  kv.row_dtype = resolve_kv_dtype(options) == KvDType::kF16 ? DType::F16 : DType::F32;

  std::unique_ptr<LlmEngine> engine(new LlmEngine());
  engine->options_ = options;
  engine->options_.prefill_chunk = effective_prefill_chunk(options);
  if (const char* v = std::getenv("QS_PREFILL_BY_CHUNK"); v != nullptr && std::string(v) == "1") {
    engine->options_.prefill_by_layer = false;
  }
  engine->options_.max_context = ctx;
  engine->cfg_ = cfg;
  engine->gamma_ = gamma;
  const int world = options.tensor_parallel;
  if (world == 1) {
    QS_ASSIGN_OR_RETURN(engine->backend_, create_backend(options, cfg));
    QS_ASSIGN_OR_RETURN(engine->cache_, KvCache::create(kv, *engine->backend_));
    engine->model_ = std::make_unique<Model>(cfg, std::move(weights), *engine->backend_);
    engine->backend_->prepare_weights(engine->model_->weights());
    if (qspec || sparse) {
      QS_TRY(engine->model_->make_draft_weights(options.draft_weights, options.num_threads));
    }
  } else {
    // Shards (shape errors name the field), then per rank a backend, a model over its shard
    // and a cache over its kv heads, built on the rank's own thread (its device current).
    std::vector<ShardedWeights> shards;
    for (int r = 0; r < world; ++r) {
      Result<ShardedWeights> shard = shard_model(cfg, weights, r, world);
      if (!shard.ok()) {  // "tensor parallel: num_attention_heads (4) is not a multiple ..."
        std::string msg = shard.error().message;
        const std::string prefix = "tensor parallel: ";
        if (msg.rfind(prefix, 0) == 0) msg.erase(0, prefix.size());
        return make_error("--tp " + std::to_string(world) + " (tensor parallel): " + msg);
      }
      shards.push_back(std::move(shard).value());
    }
    QS_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<Backend>> backends,
                        create_rank_backends(options, shards[0].cfg, world));
    std::vector<Backend*> rank_backends;
    for (auto& b : backends) rank_backends.push_back(b.get());
    QS_ASSIGN_OR_RETURN(engine->comms_, create_rank_communicators(options, rank_backends));
    engine->backend_ = std::move(backends[0]);
    engine->peers_.resize(static_cast<size_t>(world - 1));
    for (int r = 1; r < world; ++r) {
      engine->peers_[static_cast<size_t>(r - 1)].backend =
          std::move(backends[static_cast<size_t>(r)]);
    }
    engine->rank_threads_ = std::make_unique<RankThreads>(world);
    // The ranks quantize their draft weights at the same time: a share of the threads each.
    const int draft_threads = threads_per_rank(options, world);
    LlmEngine& e = *engine;
    QS_TRY(e.rank_threads_->run([&](int r) -> Status {
      Backend& backend = r == 0 ? *e.backend_ : *e.peers_[static_cast<size_t>(r - 1)].backend;
      backend.bind_thread();
      ShardedWeights& shard = shards[static_cast<size_t>(r)];
      KvCacheConfig rank_kv = kv;
      rank_kv.num_kv_heads = shard.cfg.num_kv_heads;
      QS_ASSIGN_OR_RETURN(KvCache cache, KvCache::create(rank_kv, backend));
      auto model = std::make_unique<Model>(shard.cfg, std::move(shard.weights), backend);
      model->set_communicator(&e.comms_->rank(r));
      backend.prepare_weights(model->weights());
      if (qspec) QS_TRY(model->make_draft_weights(options.draft_weights, draft_threads));
      if (r == 0) {
        e.cache_ = std::move(cache);
        e.model_ = std::move(model);
      } else {
        Peer& peer = e.peers_[static_cast<size_t>(r - 1)];
        peer.cache = std::move(cache);
        peer.model = std::move(model);
      }
      return Status::ok_status();
    }));
    for (ShardedWeights& shard : shards) {
      engine->shard_storage_.insert(engine->shard_storage_.end(), shard.storage.begin(),
                                    shard.storage.end());
    }
  }
  engine->tokenizer_ = std::move(tokenizer);
  engine->last_logits_.resize(static_cast<size_t>(cfg.vocab_size));
  return engine;
}

LlmEngine::~LlmEngine() {
  if (peers_.empty()) return;
  // Tensor parallelism: each rank's memory is freed on its own thread with its device current
  // (the communicators first, while the streams they use exist); rank 0's by the members'
  // destructors, on this thread.
  comms_.reset();
  const Status st = rank_threads_->run([&](int r) -> Status {
    if (r == 0) {
      backend_->bind_thread();
      return Status::ok_status();
    }
    Peer& p = peers_[static_cast<size_t>(r - 1)];
    p.backend->bind_thread();
    p.cache = KvCache();
    p.model.reset();
    p.backend.reset();
    return Status::ok_status();
  });
  QS_CHECK(st.ok());
}

Status LlmEngine::check_prompt(const std::vector<int32_t>& ids) const {
  if (ids.empty()) return make_error("the prompt is empty");
  if (static_cast<int64_t>(ids.size()) > cache_.capacity()) {
    return make_error("prompt has " + std::to_string(ids.size()) + " tokens but the context is " +
                      std::to_string(cache_.capacity()));
  }
  return Status::ok_status();
}

Status LlmEngine::set_max_context(int tokens) {
  if (!peers_.empty()) {
    return make_error("set_max_context: not supported with tensor parallelism (--tp " +
                      std::to_string(tensor_parallel()) + ")");
  }
  EngineOptions o = options_;
  o.max_context = tokens;
  QS_ASSIGN_OR_RETURN(const int ctx, resolve_max_context(cfg_, o));
  if (ctx == cache_.capacity()) return Status::ok_status();
  KvCacheConfig kv = cache_.config();
  kv.capacity = ctx;
  cache_ = KvCache{};  // its memory first: the old and the new cache need not fit together
  cached_ids_.clear();
  sparse_ = SparseDraftIndex{};
  auto created = KvCache::create(kv, *backend_);
  if (!created) {
    return make_error("KV cache for " + std::to_string(ctx) +
                      " positions: " + created.error().message);
  }
  cache_ = std::move(created.value());
  options_.max_context = ctx;
  return Status::ok_status();
}

size_t LlmEngine::kv_cache_bytes() const {
  size_t bytes = cache_.bytes();
  for (const Peer& p : peers_) bytes += p.cache.bytes();
  return bytes;
}

std::string LlmEngine::device_description() const {
  std::string d = backend_->description();
  if (!peers_.empty()) {
    d += " (rank 0 of tensor parallel " + std::to_string(tensor_parallel()) + ")";
  }
  return d;
}

int64_t LlmEngine::device_memory_in_use() const {
  int64_t bytes = backend_->memory_in_use();
  for (const Peer& p : peers_) {
    const int64_t b = p.backend->memory_in_use();
    if (bytes < 0 || b < 0) return -1;
    bytes += b;
  }
  return bytes;
}

Status LlmEngine::forward_all(std::span<const int32_t> ids, int pos, const ForwardPath& path,
                              LogitRows rows, float* logits, int32_t* argmax) {
  if (peers_.empty()) return model_->forward(ids, pos, cache_, path, rows, logits, argmax);
  // Sparse drafts (selection, query tap) are rejected with more than one rank by create().
  QS_CHECK(path.selection == nullptr && !path.query_tap);
  ForwardPath peer_path = path;
  peer_path.kv_read = nullptr;  // counted on rank 0 (its share of the KV)
  const size_t vocab = static_cast<size_t>(cfg_.vocab_size);
  const size_t n = rows == LogitRows::kNone ? 0
                   : rows == LogitRows::kLast ? vocab
                                              : ids.size() * vocab;
  return rank_threads_->run([&](int r) -> Status {
    if (r == 0) {
      backend_->bind_thread();
      return model_->forward(ids, pos, cache_, path, rows, logits, argmax);
    }
    Peer& p = peers_[static_cast<size_t>(r - 1)];
    p.backend->bind_thread();
    if (p.logits.size() < n) p.logits.resize(n);
    return p.model->forward(ids, pos, p.cache, peer_path, rows, n ? p.logits.data() : nullptr);
  });
}

Status LlmEngine::each_cache(const std::function<Status(KvCache&)>& fn) {
  if (peers_.empty()) return fn(cache_);
  return rank_threads_->run([&](int r) -> Status {
    Backend& b = r == 0 ? *backend_ : *peers_[static_cast<size_t>(r - 1)].backend;
    b.bind_thread();
    return fn(r == 0 ? cache_ : peers_[static_cast<size_t>(r - 1)].cache);
  });
}

void LlmEngine::commit_all(int length) {
  const Status st = each_cache([length](KvCache& c) {
    c.commit(length);
    return Status::ok_status();
  });
  QS_CHECK(st.ok());
}

void LlmEngine::truncate_all(int length) {
  const Status st = each_cache([length](KvCache& c) {
    c.truncate(length);
    return Status::ok_status();
  });
  QS_CHECK(st.ok());
}

Status LlmEngine::reserve_rows_all(int from, int64_t end) {
  return each_cache([&](KvCache& c) {
    const int64_t rows = std::min<int64_t>(end, c.capacity());
    return c.prepare_write(from, static_cast<int>(rows) - from);
  });
}

void LlmEngine::keep_rows_all(int from) {
  const int max_rows = options_.prompt_cache_rows;
  const Status st = each_cache([from, max_rows](KvCache& c) {
    c.keep_rows_from(from, max_rows);
    return Status::ok_status();
  });
  QS_CHECK(st.ok());
}

int LlmEngine::prompt_cache_keep_from(int prompt_len) const {
  if (!options_.prompt_cache || sparse() || !cache_.quantized()) return -1;
  return quant_boundary(std::max(prompt_len - 1 - kPromptCacheTail, 0), cache_.group_size());
}

void LlmEngine::clear_all() {
  cached_ids_.clear();
  const Status st = each_cache([](KvCache& c) {
    c.clear();
    return Status::ok_status();
  });
  QS_CHECK(st.ok());
}

DecoderDispatch LlmEngine::dispatch() {
  DecoderDispatch d;
  if (peers_.empty()) return d;
  d.forward = [this](std::span<const int32_t> ids, int pos, const ForwardPath& path, LogitRows rows,
                     float* logits,
                     int32_t* argmax) { return forward_all(ids, pos, path, rows, logits, argmax); };
  d.commit = [this](int length) { commit_all(length); };
  return d;
}

Status LlmEngine::prefill(const std::vector<int32_t>& ids, const PrefillProgress& progress,
                          int decode_rows, int keep_from) {
  clear_all();
  if (keep_from >= 0) keep_rows_all(keep_from);
  sparse_ = SparseDraftIndex{};
  const int n = static_cast<int>(ids.size());
  const ModelConfig& cfg = config();
  const bool snap = options_.mode == DecodeMode::kSnapKv;
  const int window = std::min(options_.snap_window, n);
  std::unique_ptr<Buffer> snap_q;  // [num_layers, window, q_dim] SnapKV observation queries
  // Exact prompt attention on a quantized cache: layer by layer (one layer's full-precision rows
  // at a time, the same results as chunk by chunk; Model::prefill_by_layer) unless SnapKV (whose
  // observation queries are taken chunk by chunk).
  if (cache_.quantized() && options_.prefill_kv == PrefillKv::kExact && !snap &&
      options_.prefill_by_layer) {
    QS_TRY(prefill_by_layer_all(ids, progress));
  } else {
    if (snap) snap_q = backend_->alloc(static_cast<size_t>(cfg.num_layers) * window * cfg.q_dim());
    QS_TRY(prefill_by_chunk(ids, progress, decode_rows, snap_q.get(), window));
  }
  if (sparse()) {
    const int keep = sparse_keep_count(options_.draft_budget, n);
    if (!snap) {
      sparse_.build_streaming(cfg.num_layers, cfg.num_kv_heads, n, keep, options_.sink_tokens);
    } else {
      sparse_.begin_snapkv(cfg.num_layers, cfg.num_kv_heads, n, keep, window);
      select_snapkv(snap_q->data(), n, window);
    }
    sparse_.place(*backend_);  // the draft's attention reads the index where it runs
  }
  return Status::ok_status();
}

int LlmEngine::reusable_prefix(const std::vector<int32_t>& prompt) const {
  if (!options_.prompt_cache || sparse() || cached_ids_.empty() || prompt.empty()) return 0;
  const size_t limit = std::min(cached_ids_.size(), prompt.size() - 1);
  size_t shared = 0;
  while (shared < limit && cached_ids_[shared] == prompt[shared]) ++shared;
  // The previous prompt again (cached_ids_ starts with it): its logits are kept.
  if (shared == limit && prompt.size() == prompt_logits_len_ &&
      cached_ids_.size() >= prompt.size() && cached_ids_[shared] == prompt[shared]) {
    ++shared;
  }
  const int n = static_cast<int>(shared);
  return can_truncate_all(n) ? n : 0;
}

bool LlmEngine::can_truncate_all(int n) const {
  // Each rank's cache decides on its own when kept rows give way to a failed growth.
  if (!cache_.can_truncate(n)) return false;
  for (const Peer& p : peers_) {
    if (!p.cache.can_truncate(n)) return false;
  }
  return true;
}

Status LlmEngine::extend(const std::vector<int32_t>& ids, int from, const PrefillProgress& progress,
                         int decode_rows, int keep_from) {
  QS_CHECK(from >= 1 && from < static_cast<int>(ids.size()));
  cut_back(from, keep_from);
  return prefill_by_chunk(ids, progress, decode_rows, nullptr, 0, from);
}

void LlmEngine::cut_back(int n, int keep_from) {
  QS_CHECK(can_truncate_all(n));
  cached_ids_.clear();  // until the generation that runs on this cache ends
  truncate_all(n);
  if (keep_from >= 0) keep_rows_all(keep_from);
}

Status LlmEngine::prefill_by_layer_all(const std::vector<int32_t>& ids,
                                       const PrefillProgress& progress) {
  const int n = static_cast<int>(ids.size());
  const int64_t steps = int64_t{n} * cfg_.num_layers;
  const int chunk = options_.prefill_chunk;
  auto on_step = [&](int64_t done) {
    if (progress) progress(static_cast<int>(done * n / steps), n);
  };
  if (peers_.empty())
    return model_->prefill_by_layer(ids, chunk, cache_, last_logits_.data(), on_step);
  // Every rank runs the same layers and chunks (the all-reduces inside are collectives); rank 0
  // reports progress and keeps the logits.
  return rank_threads_->run([&](int r) -> Status {
    if (r == 0) {
      backend_->bind_thread();
      return model_->prefill_by_layer(ids, chunk, cache_, last_logits_.data(), on_step);
    }
    Peer& p = peers_[static_cast<size_t>(r - 1)];
    p.backend->bind_thread();
    p.logits.resize(static_cast<size_t>(cfg_.vocab_size));
    return p.model->prefill_by_layer(ids, chunk, p.cache, p.logits.data());
  });
}

Status LlmEngine::prefill_by_chunk(const std::vector<int32_t>& ids, const PrefillProgress& progress,
                                   int decode_rows, Buffer* snap_q, int window, int from) {
  const int n = static_cast<int>(ids.size());
  // kQuantized (quantized modes), and every extension of a quantized cache whose history has
  // quantized groups (there is no exact prefill after them): every chunk is committed before the
  // next and read back through the mode's view, so the buffer holds a chunk plus the steady (and
  // kept) rows. Otherwise the prompt's rows and those decoding will write in one allocation: a
  // growth while decoding holds two buffers at once (Llama-2-7B, 128K: 64 GiB of rows twice).
  const bool streamed = cache_.quantized() && (options_.prefill_kv == PrefillKv::kQuantized ||
                                               (from > 0 && cache_.planes_length() > 0));
  const int chunk = options_.prefill_chunk;
  if (streamed) {
    QS_TRY(each_cache([chunk](KvCache& c) { return c.hold_rows(chunk); }));
  } else {
    QS_TRY(reserve_rows_all(from, int64_t{n} + std::max(decode_rows, 0)));
  }
  const int64_t q_dim = config().q_dim();
  ForwardPath path;
  if (streamed) path = target_path(cache_.mode());
  int chunk_start = 0;
  if (snap_q != nullptr) {
    path.query_tap = [&](int layer, const float* q, int m) {
      // Keeps the rows of this chunk that fall in the observation window [n - window, n), in
      // backend memory, where snapkv_scores reads them.
      const int first = std::max(0, n - window - chunk_start);
      if (first >= m) return;
      backend_->copy(
          snap_q->data() +
              (static_cast<size_t>(layer) * window + (chunk_start + first - (n - window))) * q_dim,
          q + static_cast<size_t>(first) * q_dim, static_cast<size_t>(m - first) * q_dim);
    };
  }
  for (int start = from; start < n; start += chunk) {
    const int m = std::min(chunk, n - start);
    const bool last = start + m == n;
    chunk_start = start;
    QS_TRY(forward_all(std::span<const int32_t>(ids.data() + start, m), start, path,
                       last ? LogitRows::kLast : LogitRows::kNone, last_logits_.data()));
    if (streamed) commit_all(start + m);
    if (progress) progress(start + m - from, n - from);
  }
  if (streamed) QS_TRY(each_cache([](KvCache& c) { return c.hold_rows(0); }));
  commit_all(n);
  return Status::ok_status();
}

void LlmEngine::select_snapkv(const float* snap_q, int prompt_len, int window) {
  const int past = sparse_.snapkv_candidates();
  if (past == 0) return;  // the draft keeps every position
  const ModelConfig& cfg = config();
  const AttentionShape shape{cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.attention_scale()};
  const size_t count = static_cast<size_t>(cfg.num_kv_heads) * past;
  std::unique_ptr<Buffer> scores = backend_->alloc(count);  // [num_kv_heads, past]
  std::vector<float> host_scores(count);
  for (int l = 0; l < cfg.num_layers; ++l) {
    const KvView kv = cache_.view(l, std::nullopt, nullptr);
    QS_CHECK(kv.fp_base == 0);
    backend_->snapkv_scores(snap_q + static_cast<size_t>(l) * window * cfg.q_dim(), window, kv.k,
                            kv.row_dtype, kv.row_stride, shape, prompt_len, past, scores->data());
    backend_->to_host(scores->data(), host_scores.data(), count);
    sparse_.select_snapkv_from_scores(l, host_scores.data(), options_.snap_kernel, &host_pool());
  }
}

ThreadPool& LlmEngine::host_pool() {
  if (!host_pool_) host_pool_ = std::make_unique<ThreadPool>(options_.num_threads);
  return *host_pool_;
}

Result<std::vector<float>> LlmEngine::prefill_logits(const std::vector<int32_t>& ids,
                                                     int last_rows) {
  QS_TRY(check_prompt(ids));
  const int n = static_cast<int>(ids.size());
  const int first = last_rows > 0 ? std::max(0, n - last_rows) : 0;  // first row returned
  const size_t vocab = static_cast<size_t>(config().vocab_size);
  std::vector<float> logits(static_cast<size_t>(n - first) * vocab);
  std::vector<float> chunk_logits;
  clear_all();
  for (int start = 0; start < n; start += options_.prefill_chunk) {
    const int m = std::min(options_.prefill_chunk, n - start);
    const std::span<const int32_t> chunk(ids.data() + start, m);
    if (start + m <= first) {  // no row of this chunk is returned
      QS_TRY(forward_all(chunk, start, ForwardPath{}, LogitRows::kNone, nullptr));
      continue;
    }
    float* out = logits.data() + static_cast<size_t>(std::max(0, start - first)) * vocab;
    if (start >= first) {
      QS_TRY(forward_all(chunk, start, ForwardPath{}, LogitRows::kAll, out));
    } else {  // the chunk straddles the first returned row
      chunk_logits.resize(static_cast<size_t>(m) * vocab);
      QS_TRY(forward_all(chunk, start, ForwardPath{}, LogitRows::kAll, chunk_logits.data()));
      std::copy(chunk_logits.begin() + static_cast<size_t>(first - start) * vocab,
                chunk_logits.end(), out);
    }
  }
  commit_all(n);
  return logits;
}

Status LlmEngine::for_each_sequence_chunk(const std::vector<int32_t>& ids,
                                          const SequenceChunkFn& chunk_logits) {
  QS_TRY(check_prompt(ids));
  const int n = static_cast<int>(ids.size());
  clear_all();
  const ForwardPath path = target_path(cache_.mode());
  for (int start = 0; start < n; start += options_.prefill_chunk) {
    const int m = std::min(options_.prefill_chunk, n - start);
    float* out = chunk_logits(start, m);
    if (out == nullptr) return make_error("cancelled");
    QS_TRY(forward_all(std::span<const int32_t>(ids.data() + start, m), start, path,
                       LogitRows::kAll, out));
    commit_all(start + m);
  }
  return Status::ok_status();
}

Result<std::vector<float>> LlmEngine::sequence_logits(const std::vector<int32_t>& ids) {
  const size_t vocab = static_cast<size_t>(config().vocab_size);
  std::vector<float> logits(ids.size() * vocab);
  QS_TRY(
      for_each_sequence_chunk(ids, [&](int start, int) { return logits.data() + start * vocab; }));
  return logits;
}

Result<std::vector<TokenLogprob>> LlmEngine::prompt_logprobs(const std::vector<int32_t>& ids,
                                                             int top,
                                                             const std::function<bool()>& stop) {
  if (top < 0 || top > kMaxTopLogprobs) {
    return make_error("prompt_logprobs: top must be in 0.." + std::to_string(kMaxTopLogprobs));
  }
  if (ids.empty()) return make_error("prompt_logprobs: no tokens");
  const int vocab = config().vocab_size;
  std::vector<TokenLogprob> out(ids.size() - 1);
  // The last token's row would predict nothing: the inputs are the others (so a window of the
  // context's length is scored with one more token as its last target).
  const std::vector<int32_t> inputs(ids.begin(), ids.end() - 1);
  if (inputs.empty()) return out;
  std::vector<float> rows;
  int pending_start = -1, pending_m = 0;  // the chunk whose rows are in `rows`
  // Row r of a chunk predicts ids[start + r + 1] (entry start + r): the previous chunk's rows are
  // reduced (on the host's threads) once the next chunk is asked for, and the last after the loop.
  auto reduce = [&] {
    host_pool().parallel_for(pending_m, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const size_t entry = static_cast<size_t>(pending_start + r);
        out[entry] =
            token_logprob(rows.data() + static_cast<size_t>(r) * vocab, vocab, ids[entry + 1], top);
      }
    });
  };
  QS_TRY(for_each_sequence_chunk(inputs, [&](int start, int m) -> float* {
    if (pending_start >= 0) reduce();
    if (stop && stop()) return nullptr;
    rows.resize(static_cast<size_t>(m) * vocab);
    pending_start = start, pending_m = m;
    return rows.data();
  }));
  reduce();  // the last chunk (inputs is not empty)
  return out;
}

Result<std::vector<float>> LlmEngine::start(const std::vector<int32_t>& prompt) {
  QS_TRY(check_prompt(prompt));
  QS_TRY(prefill(prompt));
  return last_logits_;
}

Result<RoundResult> LlmEngine::speculative_round(int32_t x, int gamma,
                                                 const SamplingParams& sampling, Rng& rng,
                                                 GenerationStats& stats,
                                                 const RoundControl& control) {
  QS_CHECK(speculative());
  cached_ids_.clear();
  if (cache_.length() + gamma >= cache_.capacity()) {
    return make_error("context is full: a round of gamma " + std::to_string(gamma) + " after " +
                      std::to_string(cache_.length()) + " positions needs more than " +
                      std::to_string(cache_.capacity()));
  }
  SpeculativeDecoder decoder(*model_, *model_, cache_, draft_selection(), dispatch());
  return decoder.round(x, gamma, sampling, rng, stats, counters_, control);
}

Result<std::vector<float>> LlmEngine::peek_logits(int32_t x) {
  std::vector<float> logits(static_cast<size_t>(config().vocab_size));
  QS_TRY(forward_all(std::span<const int32_t>(&x, 1), cache_.length(), target_path(cache_.mode()),
                     LogitRows::kLast, logits.data()));
  return logits;
}

const std::vector<float>& LlmEngine::first_logits(const LogitAdjust& adjust,
                                                  LogitAdjuster& adjuster) {
  if (!adjust.active()) return last_logits_;
  adjusted_logits_ = last_logits_;  // the prompt's row stays as it is (LlmEngine::start)
  adjuster.apply_host(adjusted_logits_.data(), config().vocab_size, adjust, {});
  return adjusted_logits_;
}

Result<LogitAdjust> LlmEngine::resolve_adjust(const GenerationParams& params) {
  QS_TRY(check_logit_adjust(params.adjust, config().vocab_size));
  LogitAdjust adjust = params.adjust;
  adjust.json = nullptr;
  if (params.json_schema.empty()) return adjust;
  QS_ASSIGN_OR_RETURN(adjust.json, json_constraint(params.json_schema));
  return adjust;
}

Result<JsonConstraint*> LlmEngine::json_constraint(const std::string& schema) {
  constexpr size_t kKept = 8;
  constexpr size_t kMaxFrames = size_t{1} << 20;  // a constraint's pool only grows: start afresh
  auto it = std::find_if(json_constraints_.begin(), json_constraints_.end(),
                         [&](const auto& kept) { return kept.first == schema; });
  if (it != json_constraints_.end() && it->second->recognizer().frames() < kMaxFrames) {
    std::rotate(it, it + 1, json_constraints_.end());  // the newest at the back
    return json_constraints_.back().second.get();
  }
  if (it != json_constraints_.end()) json_constraints_.erase(it);
  if (!tokenizer_) {
    return make_error(
        "JSON output needs the model's tokenizer, and the model directory has no "
        "tokenizer.json");
  }
  if (!json_vocab_) {
    std::vector<int32_t> eos = config().eos_token_ids;
    for (int32_t id : tokenizer_->eos_ids()) eos.push_back(id);
    QS_ASSIGN_OR_RETURN(json_vocab_, JsonVocab::create(*tokenizer_, config().vocab_size, eos));
  }
  QS_ASSIGN_OR_RETURN(JsonGrammar grammar, JsonGrammar::compile(schema));
  QS_ASSIGN_OR_RETURN(std::unique_ptr<JsonConstraint> made,
                      JsonConstraint::create(json_vocab_, std::move(grammar)));
  if (json_constraints_.size() >= kKept) json_constraints_.erase(json_constraints_.begin());
  json_constraints_.emplace_back(schema, std::move(made));
  return json_constraints_.back().second.get();
}

Result<GenerationResult> LlmEngine::generate(const std::vector<int32_t>& prompt,
                                             const GenerationParams& params,
                                             const TextCallback& on_text) {
  QS_TRY(check_sampling_params(params.sampling));
  if (params.gamma < 0) {
    return make_error("gamma must be >= 1, got " + std::to_string(params.gamma));
  }
  if (params.max_new_tokens < 0) {
    return make_error("max_new_tokens must be >= 0, got " + std::to_string(params.max_new_tokens));
  }
  if (params.logprobs < -1 || params.logprobs > kMaxTopLogprobs) {
    return make_error("logprobs must be -1 (none) or 0.." + std::to_string(kMaxTopLogprobs) +
                      " alternatives, got " + std::to_string(params.logprobs));
  }
  QS_TRY(check_prompt(prompt));
  QS_ASSIGN_OR_RETURN(const LogitAdjust adjust, resolve_adjust(params));
  if (!params.stop.empty() && !tokenizer_) {
    return make_error(
        "stop strings need a tokenizer, and the model directory has no "
        "tokenizer.json");
  }
  const int vocab = config().vocab_size;
  const int prompt_len = static_cast<int>(prompt.size());

  GenerationResult result;
  result.stats.prompt_tokens = prompt_len;
  result.finish_reason = "length";
  const int max_new = std::min(params.max_new_tokens, cache_.capacity() - prompt_len + 1);
  if (max_new == 0) return result;

  std::unordered_set<int32_t> eos;
  if (params.stop_at_eos) {
    eos.insert(config().eos_token_ids.begin(), config().eos_token_ids.end());
    if (tokenizer_) {
      for (int32_t id : tokenizer_->eos_ids()) eos.insert(id);
    }
  }

  const auto t_start = std::chrono::steady_clock::now();
  // Decoding writes up to max_new - 1 committed rows plus a round's candidates past them.
  const int decode_rows = max_new + cache_.config().max_gamma + 1;
  const int reuse = reusable_prefix(prompt);
  const int keep_from = prompt_cache_keep_from(prompt_len);
  if (reuse == prompt_len) {  // the previous prompt: its cache rows and its logits
    cut_back(reuse, keep_from);
    // The fp cache takes decoding's rows at once, as a prefill does (prefill_by_chunk).
    if (!cache_.quantized()) QS_TRY(reserve_rows_all(reuse, int64_t{reuse} + decode_rows));
    last_logits_ = prompt_logits_;
  } else if (reuse > 0) {
    QS_TRY(extend(prompt, reuse, params.on_prefill_progress, decode_rows, keep_from));
  } else {
    QS_TRY(prefill(prompt, params.on_prefill_progress, decode_rows, keep_from));
  }
  if (options_.prompt_cache) {
    prompt_logits_ = last_logits_;
    prompt_logits_len_ = prompt.size();
  }
  QS_TRY(check_finite_logits(last_logits_));
  result.stats.cached_prompt_tokens = reuse;
  result.stats.prefill_s = seconds_since(t_start);
  // Every token in the order it enters the sequence (also a round's accepted candidates after an
  // emitted stop), so that the cache's committed positions hold a prefix of it.
  std::vector<int32_t> sequence;
  if (options_.prompt_cache) sequence = prompt;
  // QS_PROFILE_DECODE=N: an external profiler (ncu --profile-from-start off) records decoding
  // only, of prompts of at least N tokens (so a benchmark's short warm-up stays out; any other
  // value: every prompt).
  const bool profile = [&] {
    const char* v = std::getenv("QS_PROFILE_DECODE");
    if (v == nullptr) return false;
    char* end = nullptr;
    const long min_prompt = std::strtol(v, &end, 10);
    return end == v || *end != '\0' || static_cast<long>(prompt.size()) >= min_prompt;
  }();
  if (profile) backend_->profile_region(true);
  const auto t_decode = std::chrono::steady_clock::now();

  Rng rng(params.sampling.seed);
  std::optional<StreamDecoder> decoder;
  if (tokenizer_) decoder.emplace(*tokenizer_, /*skip_special=*/true);
  StopMatcher stop_matcher(params.stop);
  bool cancelled = false;
  // Called once per emitted token, with an empty piece while no text is complete (held-back
  // UTF-8 or stop-string prefix), so that a caller can cancel within one token / one round.
  auto emit = [&](const std::string& piece) {
    if (cancelled) return;
    result.text += piece;
    if (on_text && !on_text(piece)) cancelled = true;
  };

  // Emits one token (with its log-probability when asked: `lp`); true when generation ends with it.
  const bool want_logprobs = params.logprobs >= 0;
  int emitted = 0;
  // JSON output: the state after the tokens pushed.
  JsonState json_state = adjust.json != nullptr ? adjust.json->start() : JsonState{};
  auto push = [&](int32_t next, const TokenLogprob* lp) {
    result.tokens.push_back(next);
    if (want_logprobs) {
      QS_CHECK(lp != nullptr && lp->id == next);
      result.logprobs.push_back(*lp);
      if (params.on_logprob) params.on_logprob(*lp);
    }
    if (options_.prompt_cache && !speculative()) sequence.push_back(next);
    ++emitted;
    if (eos.count(next)) {
      result.finish_reason = "stop";
      return true;
    }
    if (decoder) {
      emit(stop_matcher.push(decoder->push(next)));
      if (stop_matcher.stopped()) {
        result.finish_reason = "stop";
        return true;
      }
      if (cancelled) return true;
    }
    if (adjust.json != nullptr) {  // the document is complete: nothing may follow
      QS_CHECK(adjust.json->advance(json_state, next));
      if (adjust.json->finished(json_state)) {
        result.finish_reason = "stop";
        return true;
      }
    }
    return emitted == max_new;
  };

  counters_ = SpecCounters{};
  GenerationStats& st = result.stats;
  if (!speculative()) {
    const ForwardPath path = [&] {
      ForwardPath p = target_path(cache_.mode());
      p.kv_read = &counters_.target_kv;
      return p;
    }();
    int pos = prompt_len;
    // After the prompt's logits (on the host), each forward hands back only its token: greedy
    // its argmax (Backend::argmax_rows), sampling its draw (Backend::sample_rows), both computed
    // where the logits are.
    const bool greedy = params.sampling.temperature <= 0.0f;
    const bool adjusted = adjust.active();
    LogitAdjuster adjuster;
    auto t_first = std::chrono::steady_clock::now();
    const std::vector<float>& first = first_logits(adjust, adjuster);
    int32_t next = sample_token(first.data(), vocab, params.sampling, rng, probs_);
    st.sample_s += seconds_since(t_first);
    TokenLogprob next_lp;
    if (want_logprobs) next_lp = token_logprob(first.data(), vocab, next, params.logprobs);
    std::vector<float> row;  // want_logprobs: a forward's logits row on the host
    for (;;) {
      if (push(next, &next_lp)) break;
      auto t0 = std::chrono::steady_clock::now();
      const int32_t input = next;
      QS_TRY(forward_all(std::span<const int32_t>(&input, 1), pos, path, LogitRows::kLast, nullptr,
                         greedy && !adjusted ? &next : nullptr));
      ++counters_.target_steps;
      st.verify_s += seconds_since(t0);
      if (adjusted) {  // the row after every generated token, where it is; then greedy's argmax
        adjuster.apply(*backend_, model_->mutable_logits_buffer(), 1, vocab, adjust, result.tokens);
        if (greedy) backend_->argmax_rows(model_->logits_buffer(), 1, vocab, &next);
      }
      if (!greedy) {
        t0 = std::chrono::steady_clock::now();
        const double u = rng.uniform();
        backend_->sample_rows(model_->logits_buffer(), 1, vocab, params.sampling, &u, nullptr,
                              &next);
        st.sample_s += seconds_since(t0);
      }
      if (want_logprobs) {
        next_lp = rows_logprobs(*backend_, model_->logits_buffer(), vocab,
                                std::span<const int32_t>(&next, 1), params.logprobs, row)[0];
      }
      t0 = std::chrono::steady_clock::now();
      const int flushes_before = cache_.flushes();
      commit_all(++pos);
      const double dt = seconds_since(t0);
      st.flushes += cache_.flushes() - flushes_before;
      st.flush_s += dt;
      if (cache_.flushes() != flushes_before) st.flushing_commit_s += dt;
    }
  } else {
    const int gamma = params.gamma > 0 ? params.gamma : gamma_;
    if (gamma >= cache_.group_size()) {
      return make_error(
          "gamma " + std::to_string(gamma) +
          " must be smaller than the group size G = " + std::to_string(cache_.group_size()));
    }
    st.accepted_histogram.assign(static_cast<size_t>(gamma + 1), 0);
    SpeculativeDecoder spec(*model_, *model_, cache_, draft_selection(), dispatch());
    st.draft_index_bytes = static_cast<int64_t>(sparse_.bytes());
    spec.set_logprobs(params.logprobs);
    spec.set_adjust(&adjust, &result.tokens);
    LogitAdjuster adjuster;
    const std::vector<float>& first = first_logits(adjust, adjuster);
    int32_t x = sample_token(first.data(), vocab, params.sampling, rng, probs_);
    if (options_.prompt_cache) sequence.push_back(x);
    TokenLogprob x_lp;
    if (want_logprobs) x_lp = token_logprob(first.data(), vocab, x, params.logprobs);
    bool done = push(x, &x_lp);
    std::optional<AdaptiveGamma> adaptive;
    if (options_.adaptive_gamma && params.gamma == 0) adaptive.emplace(gamma);
    // A round's time besides its draft steps: verification, accept/reject, commit; not a commit
    // that quantized a group, which comes once per G committed tokens whatever the rounds'
    // lengths (one in a round's measure would make that length look dear).
    auto rest_s = [&st] { return st.verify_s + st.sample_s + (st.flush_s - st.flushing_commit_s); };
    while (!done) {
      // Never draft past what may still be emitted (nor past the context).
      const int g = std::min(adaptive ? adaptive->next() : gamma, max_new - emitted - 1);
      const double draft_before = st.draft_s, rest_before = rest_s();
      QS_ASSIGN_OR_RETURN(RoundResult r, spec.round(x, g, params.sampling, rng, st, counters_));
      if (adaptive) {
        adaptive->observe(g, r.accepted, st.draft_s - draft_before, rest_s() - rest_before);
      }
      if (options_.prompt_cache) sequence.insert(sequence.end(), r.tokens.begin(), r.tokens.end());
      for (size_t i = 0; i < r.tokens.size(); ++i) {
        if ((done = push(r.tokens[i], want_logprobs ? &r.logprobs[i] : nullptr))) break;
      }
      x = r.tokens.back();
    }
  }
  auto per_step = [](int64_t bytes, int64_t steps) {
    return steps > 0 ? static_cast<double>(bytes) / steps : 0.0;
  };
  st.draft_kv_upper_bytes = per_step(counters_.draft_kv.upper, counters_.draft_steps);
  st.draft_kv_lower_bytes = per_step(counters_.draft_kv.lower, counters_.draft_steps);
  st.draft_kv_meta_bytes = per_step(counters_.draft_kv.meta, counters_.draft_steps);
  st.draft_kv_fp_bytes = per_step(counters_.draft_kv.fp, counters_.draft_steps);
  st.target_kv_upper_bytes = per_step(counters_.target_kv.upper, counters_.target_steps);
  st.target_kv_lower_bytes = per_step(counters_.target_kv.lower, counters_.target_steps);
  st.target_kv_meta_bytes = per_step(counters_.target_kv.meta, counters_.target_steps);
  st.target_kv_fp_bytes = per_step(counters_.target_kv.fp, counters_.target_steps);
  if (decoder && !stop_matcher.stopped() && !cancelled) {
    emit(stop_matcher.push(decoder->flush()));
    if (stop_matcher.stopped()) {
      result.finish_reason = "stop";
    } else {
      emit(stop_matcher.flush());
    }
  }
  if (cancelled) result.finish_reason = "cancelled";

  result.stats.generated_tokens = static_cast<int>(result.tokens.size());
  result.stats.decode_s = seconds_since(t_decode);
  if (options_.prompt_cache) {
    QS_CHECK(static_cast<int>(sequence.size()) >= cache_.length());
    sequence.resize(static_cast<size_t>(cache_.length()));
    cached_ids_ = std::move(sequence);
  }
  if (profile) backend_->profile_region(false);
  return result;
}

}  // namespace qs
