// Server metrics in the Prometheus text exposition format (GET /metrics).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace qs::server {

// Cumulative histogram with fixed upper bounds (Prometheus semantics: le = "less or equal").
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value, uint64_t times = 1);
  void render(std::string& out, const std::string& name, const std::string& help) const;

 private:
  mutable std::mutex mu_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative; last = above every bound
  double sum_ = 0;
  uint64_t count_ = 0;
};

// Speculative-decoding counters of one request; all zero in autoregressive mode.
struct SpeculativeStats {
  int64_t drafted = 0;   // draft tokens proposed
  int64_t accepted = 0;  // draft tokens the target accepted
  int64_t rounds = 0;    // draft/verify rounds
};

// What the scheduler reports once per finished generation.
struct GenerationRecord {
  std::string finish_reason;  // stop, length, cancelled, timeout, shutdown, error
  int64_t prompt_tokens = 0;
  int64_t cached_prompt_tokens = 0;  // of prompt_tokens, kept by the prompt cache
  int64_t generated_tokens = 0;
  double queue_s = 0;   // arrival -> generation start
  double ttft_s = -1;   // arrival -> first token (< 0: none produced)
  double decode_s = 0;  // first token -> last token
  double e2e_s = 0;     // arrival -> done
  SpeculativeStats spec;
};

struct SchedulerGauges {
  int64_t waiting = 0;
  int64_t running = 0;
  int64_t capacity = 0;
};

class Metrics {
 public:
  // `endpoints`: the paths that get their own label; others count as "other".
  explicit Metrics(std::set<std::string> endpoints);

  void on_http_response(const std::string& path, int status);
  void on_generation(const GenerationRecord& r);
  std::string render(const SchedulerGauges& gauges) const;

 private:
  std::set<std::string> endpoints_;
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> http_;  // (endpoint, status) -> count
  std::map<std::string, uint64_t> finished_;              // finish reason -> count
  uint64_t prompt_tokens_ = 0;
  uint64_t cached_prompt_tokens_ = 0;
  uint64_t generation_tokens_ = 0;
  SpeculativeStats spec_;
  Histogram queue_s_;
  Histogram ttft_s_;
  Histogram tpot_s_;
  Histogram e2e_s_;
  Histogram prompt_len_;
  Histogram output_len_;
};

}  // namespace qs::server
