#include "metrics.h"

#include <fmt/core.h>

#include <algorithm>

namespace qs::server {

namespace {

const std::vector<double> kLatencyBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                             0.25,  0.5,    1,     2.5,  5,     10,   20,
                                             40,    80,     160,   320,  640};
const std::vector<double> kPerTokenBuckets = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04,
                                              0.06,   0.08,  0.1,    0.15,  0.2,  0.3,  0.4,
                                              0.5,    0.75,  1.0,    2.5,   5.0};
const std::vector<double> kTokenCountBuckets = {
    1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072};

std::string format_number(double v) {
  return fmt::format("{:g}", v);
}

void header(std::string& out, const std::string& name, const char* type, const std::string& help) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value, uint64_t times) {
  if (times == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  const size_t bucket = static_cast<size_t>(
      std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin());
  counts_[bucket] += times;
  sum_ += value * static_cast<double>(times);
  count_ += times;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& help) const {
  std::lock_guard<std::mutex> lock(mu_);
  header(out, name, "histogram", help);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, format_number(bounds_[i]), cumulative);
  }
  cumulative += counts_.back();
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n", name, cumulative);
  out += fmt::format("{}_sum {}\n{}_count {}\n", name, format_number(sum_), name, count_);
}

Metrics::Metrics(std::set<std::string> endpoints)
    : endpoints_(std::move(endpoints)),
      queue_s_(kLatencyBuckets),
      ttft_s_(kLatencyBuckets),
      tpot_s_(kPerTokenBuckets),
      e2e_s_(kLatencyBuckets),
      prompt_len_(kTokenCountBuckets),
      output_len_(kTokenCountBuckets) {}

void Metrics::on_http_response(const std::string& path, int status) {
  const std::string endpoint = endpoints_.count(path) ? path : "other";
  std::lock_guard<std::mutex> lock(mu_);
  ++http_[{endpoint, status}];
}

void Metrics::on_generation(const GenerationRecord& r) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++finished_[r.finish_reason];
    prompt_tokens_ += static_cast<uint64_t>(std::max<int64_t>(0, r.prompt_tokens));
    cached_prompt_tokens_ += static_cast<uint64_t>(std::max<int64_t>(0, r.cached_prompt_tokens));
    generation_tokens_ += static_cast<uint64_t>(std::max<int64_t>(0, r.generated_tokens));
    spec_.drafted += r.spec.drafted;
    spec_.accepted += r.spec.accepted;
    spec_.rounds += r.spec.rounds;
  }
  queue_s_.observe(r.queue_s);
  if (r.ttft_s >= 0) ttft_s_.observe(r.ttft_s);
  // Per-token latency: the request's mean decode time per token after the first, observed once
  // for each of those tokens (the engine reports text, not per-token timestamps).
  if (r.generated_tokens > 1 && r.decode_s > 0) {
    tpot_s_.observe(r.decode_s / static_cast<double>(r.generated_tokens - 1),
                    static_cast<uint64_t>(r.generated_tokens - 1));
  }
  e2e_s_.observe(r.e2e_s);
  prompt_len_.observe(static_cast<double>(r.prompt_tokens));
  output_len_.observe(static_cast<double>(r.generated_tokens));
}

std::string Metrics::render(const SchedulerGauges& g) const {
  std::string out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    header(out, "quantspec_http_requests_total", "counter",
           "HTTP requests answered, by endpoint and status code.");
    for (const auto& [key, n] : http_) {
      out += fmt::format("quantspec_http_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n",
                         key.first, key.second, n);
    }
    header(out, "quantspec_requests_finished_total", "counter",
           "Generations finished, by finish reason (stop, length, cancelled, timeout, shutdown, "
           "error).");
    for (const auto& [reason, n] : finished_) {
      out +=
          fmt::format("quantspec_requests_finished_total{{finish_reason=\"{}\"}} {}\n", reason, n);
    }
    header(out, "quantspec_prompt_tokens_total", "counter", "Prompt tokens processed.");
    out += fmt::format("quantspec_prompt_tokens_total {}\n", prompt_tokens_);
    header(out, "quantspec_prompt_tokens_cached_total", "counter",
           "Prompt tokens whose KV the prompt cache kept from the previous request (not "
           "prefilled again; --prompt-cache).");
    out += fmt::format("quantspec_prompt_tokens_cached_total {}\n", cached_prompt_tokens_);
    header(out, "quantspec_generation_tokens_total", "counter", "Tokens generated.");
    out += fmt::format("quantspec_generation_tokens_total {}\n", generation_tokens_);
    header(out, "quantspec_spec_decode_draft_tokens_total", "counter",
           "Draft tokens proposed by speculative decoding (0 in autoregressive mode).");
    out += fmt::format("quantspec_spec_decode_draft_tokens_total {}\n", spec_.drafted);
    header(out, "quantspec_spec_decode_accepted_tokens_total", "counter",
           "Draft tokens accepted by the target model (0 in autoregressive mode).");
    out += fmt::format("quantspec_spec_decode_accepted_tokens_total {}\n", spec_.accepted);
    header(out, "quantspec_spec_decode_rounds_total", "counter",
           "Speculative draft/verify rounds (0 in autoregressive mode).");
    out += fmt::format("quantspec_spec_decode_rounds_total {}\n", spec_.rounds);
  }
  header(out, "quantspec_requests_waiting", "gauge", "Requests queued for the engine.");
  out += fmt::format("quantspec_requests_waiting {}\n", g.waiting);
  header(out, "quantspec_requests_running", "gauge", "Requests generating now (batch size 1).");
  out += fmt::format("quantspec_requests_running {}\n", g.running);
  header(out, "quantspec_queue_capacity", "gauge", "Queue capacity (--max-queue); beyond it: 429.");
  out += fmt::format("quantspec_queue_capacity {}\n", g.capacity);
  queue_s_.render(out, "quantspec_queue_time_seconds", "Time from arrival to generation start.");
  ttft_s_.render(out, "quantspec_time_to_first_token_seconds",
                 "Time from arrival to the first generated token (includes queueing and prefill).");
  tpot_s_.render(out, "quantspec_time_per_output_token_seconds",
                 "Decode latency per generated token after the first.");
  e2e_s_.render(out, "quantspec_e2e_request_latency_seconds",
                "Time from arrival to the last token.");
  prompt_len_.render(out, "quantspec_request_prompt_tokens", "Prompt length per request.");
  output_len_.render(out, "quantspec_request_generation_tokens", "Generated tokens per request.");
  return out;
}

}  // namespace qs::server
