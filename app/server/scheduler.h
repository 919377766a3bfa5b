// The scheduler: one thread owns the Engine and runs one generation at a time (batch 1) from a
// bounded FIFO queue. HTTP threads submit Jobs and read their text as it is produced; any thread
// may cancel a job (client gone, timeout, shutdown), which stops it within one token.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "metrics.h"

namespace qs::server {

using Clock = std::chrono::steady_clock;

enum class StopReason { kNone, kClientGone, kTimeout, kShutdown };

class Job {
 public:
  // `n` completions of each prompt (a request's n; several prompts: a batch), generated one after
  // another: choice p * n + i is prompt p's i-th, with the seed params.sampling.seed + i (each
  // after a prompt's first takes the prompt from the engine's prompt cache).
  Job(std::vector<std::vector<int32_t>> prompts, GenerationParams params,
      Clock::time_point deadline, int n = 1);

  int num_prompts() const { return static_cast<int>(prompts_.size()); }
  const std::vector<int32_t>& prompt(int p) const { return prompts_[static_cast<size_t>(p)]; }
  int64_t prompt_tokens() const;  // all prompts'
  // An echo (OpenAI's completions `echo`): each of prompt p's choices starts with texts[p], the
  // prompt as the client gave it, and with params.logprobs >= 0 the prompt tokens'
  // log-probabilities (Engine::prompt_logprobs; the first token has none: NaN). Set before
  // submit.
  void set_echo(std::vector<std::string> texts) { echo_ = std::move(texts); }
  bool echo() const { return !echo_.empty(); }
  const std::string& echo_text(int p) const { return echo_[static_cast<size_t>(p)]; }
  int n() const { return n_; }
  int choices() const { return n_ * num_prompts(); }
  const GenerationParams& params() const { return params_; }
  Clock::time_point arrival() const { return arrival_; }
  Clock::time_point deadline() const { return deadline_; }

  // Ask the job to stop; the first reason given wins. Safe from any thread.
  void cancel(StopReason why);
  StopReason stop_reason() const;

  // What one choice produced since the previous call: text, tokens' log-probabilities (when the
  // request asked for them), and its finish reason once it ended (choices before the last).
  struct Delta {
    int choice = 0;
    std::string text;
    std::vector<TokenLogprob> logprobs;
    std::string finish_reason;
    bool echo = false;  // the echoed prompt (a chunk of its own)
  };
  // The deltas since the previous call, in order; waits up to `timeout` for some (or the end).
  struct Progress {
    std::vector<Delta> deltas;
    bool finished = false;
  };
  Progress wait(std::chrono::milliseconds timeout);

  // Valid once finished: the results (one per choice), or the error that prevented them.
  struct Outcome {
    std::vector<GenerationResult> results;
    int error_status = 0;  // HTTP status for `error` (500 engine failure, 503 shutting down)
    std::string error;
    SpeculativeStats spec;
    double queue_s = 0;  // arrival -> generation start
    // An echo with logprobs, per prompt: one entry per prompt token, the first without a value
    // (NaN, no alternatives). Each choice's delta stream starts with its prompt's.
    std::vector<std::vector<TokenLogprob>> prompt_logprobs;
  };
  const Outcome& outcome() const { return outcome_; }  // only after wait() said finished

 private:
  friend class Scheduler;
  // Scheduler thread: choice i starts; its text and log-probabilities arrive; it ended.
  void begin_choice(int choice);
  bool on_text(std::string_view piece);     // false: stop
  void on_logprob(const TokenLogprob& lp);  // before the token's text
  // The echo at a choice's start: the prompt's text and its tokens' log-probabilities.
  void on_echo(const std::string& text, const std::vector<TokenLogprob>& logprobs);
  void end_choice(const std::string& finish_reason);
  Delta& current_delta();  // mu_ held: the pending delta of the running choice
  void finish(Outcome outcome);

  const std::vector<std::vector<int32_t>> prompts_;
  const GenerationParams params_;
  const Clock::time_point arrival_;
  const Clock::time_point deadline_;
  const int n_;
  std::vector<std::string> echo_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  StopReason stop_ = StopReason::kNone;
  std::vector<Delta> pending_;
  // on_logprob's entries until their token's on_text: published together, so that a reader
  // never takes a token's log-probability in one chunk and a later token's text, without its
  // own, in the next.
  std::vector<TokenLogprob> staged_;
  void publish(std::string_view piece);  // piece and staged_ into the current delta (mu_ held)
  int choice_ = 0;
  bool finished_ = false;
  Outcome outcome_;
};

class Scheduler {
 public:
  Scheduler(Engine& engine, size_t max_queue, Metrics& metrics);
  ~Scheduler();  // cancels whatever runs and joins the thread
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  enum class Admission { kAccepted, kQueueFull, kShuttingDown };
  Admission submit(const std::shared_ptr<Job>& job);

  // Graceful shutdown, step 1: refuse new jobs and finish every queued job with 503. The running
  // job continues. Step 2 (optional): cancel_running(). Step 3: the destructor joins.
  void begin_shutdown();
  // Wait until nothing runs (true) or the timeout passes (false).
  bool wait_idle(std::chrono::milliseconds timeout);
  void cancel_running();

  SchedulerGauges gauges() const;

 private:
  void loop();
  void run(const std::shared_ptr<Job>& job);
  // The job's choices into `outcome` (its results, or the error that stopped them).
  void run_choices(const std::shared_ptr<Job>& job, Job::Outcome& outcome,
                   GenerationRecord& record);
  // Outcome::prompt_logprobs[p] of an echo with logprobs (empty otherwise).
  Result<std::vector<TokenLogprob>> echo_logprobs(const Job& job, int p);

  Engine& engine_;
  const size_t max_queue_;
  Metrics& metrics_;
  mutable std::mutex mu_;
  std::condition_variable cv_;       // queue changes / stop
  std::condition_variable idle_cv_;  // running job finished
  std::deque<std::shared_ptr<Job>> queue_;
  std::shared_ptr<Job> running_;
  bool shutting_down_ = false;
  bool stop_thread_ = false;
  std::thread thread_;
};

}  // namespace qs::server
