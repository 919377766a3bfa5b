#include "scheduler.h"

#include <limits>
#include <utility>

namespace qs::server {

namespace {

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

const char* stop_reason_name(StopReason r) {
  switch (r) {
    case StopReason::kClientGone:
      return "cancelled";
    case StopReason::kTimeout:
      return "timeout";
    case StopReason::kShutdown:
      return "shutdown";
    case StopReason::kNone:
      break;
  }
  return "cancelled";
}

// A job that ends without results: stopped (`why`: a stop reason, 408 / 503) or failed (kNone,
// 500: an engine error).
void fail_job(StopReason why, std::string message, Job::Outcome& outcome,
              GenerationRecord& record) {
  record.finish_reason = why == StopReason::kNone ? "error" : stop_reason_name(why);
  outcome.error_status = why == StopReason::kNone ? 500 : why == StopReason::kShutdown ? 503 : 408;
  outcome.error = std::move(message);
  outcome.results.clear();
}

}  // namespace

// ---- Job ---------------------------------------------------------------------------------------

Job::Job(std::vector<std::vector<int32_t>> prompts, GenerationParams params,
         Clock::time_point deadline, int n)
    : prompts_(std::move(prompts)),
      params_(std::move(params)),
      arrival_(Clock::now()),
      deadline_(deadline),
      n_(n) {}

int64_t Job::prompt_tokens() const {
  int64_t n = 0;
  for (const auto& p : prompts_) n += static_cast<int64_t>(p.size());
  return n;
}

void Job::cancel(StopReason why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stop_ == StopReason::kNone) stop_ = why;
}

StopReason Job::stop_reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stop_;
}

Job::Progress Job::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [this] { return !pending_.empty() || finished_; });
  Progress p;
  p.deltas.swap(pending_);
  p.finished = finished_;
  return p;
}

Job::Delta& Job::current_delta() {
  if (pending_.empty() || pending_.back().choice != choice_ ||
      !pending_.back().finish_reason.empty() || pending_.back().echo) {
    pending_.push_back(Delta{});
    pending_.back().choice = choice_;
  }
  return pending_.back();
}

void Job::begin_choice(int choice) {
  std::lock_guard<std::mutex> lock(mu_);
  choice_ = choice;
}

void Job::end_choice(const std::string& finish_reason) {
  std::lock_guard<std::mutex> lock(mu_);
  publish({});  // an end-of-sequence token has a log-probability and no text
  current_delta().finish_reason = finish_reason;
  cv_.notify_all();
}

void Job::on_logprob(const TokenLogprob& lp) {
  std::lock_guard<std::mutex> lock(mu_);
  staged_.push_back(lp);
}

void Job::on_echo(const std::string& text, const std::vector<TokenLogprob>& logprobs) {
  std::lock_guard<std::mutex> lock(mu_);
  Delta& d = current_delta();
  d.text.append(text);
  d.logprobs.insert(d.logprobs.end(), logprobs.begin(), logprobs.end());
  d.echo = true;
  cv_.notify_all();
}

void Job::publish(std::string_view piece) {
  if (piece.empty() && staged_.empty()) return;
  Delta& d = current_delta();
  d.text.append(piece);
  d.logprobs.insert(d.logprobs.end(), staged_.begin(), staged_.end());
  staged_.clear();
}

bool Job::on_text(std::string_view piece) {
  std::lock_guard<std::mutex> lock(mu_);
  publish(piece);
  cv_.notify_all();
  if (stop_ == StopReason::kNone && Clock::now() > deadline_) stop_ = StopReason::kTimeout;
  return stop_ == StopReason::kNone;
}

void Job::finish(Outcome outcome) {
  std::lock_guard<std::mutex> lock(mu_);
  publish({});
  outcome_ = std::move(outcome);
  finished_ = true;
  cv_.notify_all();
}

// ---- Scheduler ---------------------------------------------------------------------------------

Scheduler::Scheduler(Engine& engine, size_t max_queue, Metrics& metrics)
    : engine_(engine), max_queue_(max_queue), metrics_(metrics) {
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() {
  begin_shutdown();
  cancel_running();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_thread_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

Scheduler::Admission Scheduler::submit(const std::shared_ptr<Job>& job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutting_down_) return Admission::kShuttingDown;
    // Capacity counts the running job too, so that admission does not depend on whether the
    // scheduler thread has picked up the previous job yet: at most max_queue + 1 in the system.
    if (queue_.size() + (running_ ? 1 : 0) >= max_queue_ + 1) return Admission::kQueueFull;
    queue_.push_back(job);
  }
  cv_.notify_all();
  return Admission::kAccepted;
}

void Scheduler::begin_shutdown() {
  std::deque<std::shared_ptr<Job>> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutting_down_ = true;
    dropped.swap(queue_);
  }
  for (const auto& job : dropped) {
    job->cancel(StopReason::kShutdown);
    Job::Outcome o;
    o.error_status = 503;
    o.error = "the server is shutting down; the request was not started";
    GenerationRecord r;
    r.finish_reason = "shutdown";
    r.e2e_s = seconds_between(job->arrival(), Clock::now());
    r.queue_s = r.e2e_s;
    metrics_.on_generation(r);
    job->finish(std::move(o));
  }
  cv_.notify_all();
}

bool Scheduler::wait_idle(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return idle_cv_.wait_for(lock, timeout, [this] { return running_ == nullptr && queue_.empty(); });
}

void Scheduler::cancel_running() {
  std::lock_guard<std::mutex> lock(mu_);
  if (running_) running_->cancel(StopReason::kShutdown);
}

SchedulerGauges Scheduler::gauges() const {
  std::lock_guard<std::mutex> lock(mu_);
  SchedulerGauges g;
  g.waiting = static_cast<int64_t>(queue_.size());
  g.running = running_ ? 1 : 0;
  g.capacity = static_cast<int64_t>(max_queue_);
  return g;
}

void Scheduler::loop() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return !queue_.empty() || stop_thread_; });
      if (queue_.empty()) return;  // stop_thread_
      job = std::move(queue_.front());
      queue_.pop_front();
      running_ = job;
    }
    run(job);
    {
      std::lock_guard<std::mutex> lock(mu_);
      running_.reset();
    }
    idle_cv_.notify_all();
  }
}

Result<std::vector<TokenLogprob>> Scheduler::echo_logprobs(const Job& job, int p) {
  std::vector<TokenLogprob> entries;
  if (!job.echo() || job.params().logprobs < 0) return entries;
  // Stopped between chunks like a generation within a token: a client gone, the deadline, shutdown.
  auto scored = engine_.prompt_logprobs(job.prompt(p), job.params().logprobs, [&job] {
    return job.stop_reason() != StopReason::kNone || Clock::now() > job.deadline();
  });
  if (!scored.ok()) return scored.error();
  TokenLogprob first;  // nothing predicts the first token
  first.id = job.prompt(p).front();
  first.logprob = std::numeric_limits<float>::quiet_NaN();
  entries.push_back(std::move(first));
  entries.insert(entries.end(), scored->begin(), scored->end());
  return entries;
}

void Scheduler::run_choices(const std::shared_ptr<Job>& job, Job::Outcome& outcome,
                            GenerationRecord& record) {
  // The choices one after another (each prompt's n in turn); a stop (client gone, timeout,
  // shutdown) ends the request with the choice it interrupts.
  for (int p = 0; p < job->num_prompts(); ++p) {
    auto scored = echo_logprobs(*job, p);
    if (!scored.ok()) {
      if (job->stop_reason() == StopReason::kNone && Clock::now() > job->deadline())
        job->cancel(StopReason::kTimeout);
      const StopReason why = job->stop_reason();
      return fail_job(why,
                      why == StopReason::kNone
                          ? scored.error().message
                          : "the request was stopped while its prompt was scored",
                      outcome, record);
    }
    outcome.prompt_logprobs.push_back(std::move(scored).value());
    for (int i = 0; i < job->n(); ++i) {
      const int c = p * job->n() + i;
      GenerationParams params = job->params();
      params.sampling.seed += static_cast<uint64_t>(i);
      if (params.logprobs >= 0)
        params.on_logprob = [&job](const TokenLogprob& lp) { job->on_logprob(lp); };
      job->begin_choice(c);
      if (job->echo()) job->on_echo(job->echo_text(p), outcome.prompt_logprobs.back());
      auto result = engine_.generate(
          job->prompt(p), params, [&job](std::string_view piece) { return job->on_text(piece); });
      if (!result.ok()) return fail_job(StopReason::kNone, result.error().message, outcome, record);
      const GenerationStats& st = result->stats;
      record.generated_tokens += st.generated_tokens;
      if (c == 0) {
        record.cached_prompt_tokens = st.cached_prompt_tokens;
        if (st.generated_tokens > 0) record.ttft_s = record.queue_s + st.prefill_s;
      }
      record.decode_s += st.decode_s;
      record.finish_reason = result->finish_reason;
      outcome.spec.drafted += st.drafted;
      outcome.spec.accepted += st.accepted;
      outcome.spec.rounds += st.rounds;
      const bool cancelled = result->finish_reason == "cancelled";
      if (cancelled) record.finish_reason = stop_reason_name(job->stop_reason());
      if (c + 1 < job->choices() && !cancelled) job->end_choice(result->finish_reason);
      outcome.results.push_back(std::move(result.value()));
      if (cancelled) return;
    }
  }
}

void Scheduler::run(const std::shared_ptr<Job>& job) {
  const Clock::time_point start = Clock::now();
  GenerationRecord record;
  record.prompt_tokens = job->prompt_tokens();
  record.queue_s = seconds_between(job->arrival(), start);
  if (job->stop_reason() == StopReason::kNone && start > job->deadline())
    job->cancel(StopReason::kTimeout);

  Job::Outcome outcome;
  if (const StopReason why = job->stop_reason(); why != StopReason::kNone) {
    // Cancelled or expired while queued: never started.
    fail_job(why, "the request was cancelled before it started", outcome, record);
  } else {
    run_choices(job, outcome, record);
  }
  record.spec = outcome.spec;
  outcome.queue_s = record.queue_s;
  record.e2e_s = seconds_between(job->arrival(), Clock::now());
  metrics_.on_generation(record);  // before the client can see the answer
  job->finish(std::move(outcome));
}

}  // namespace qs::server
