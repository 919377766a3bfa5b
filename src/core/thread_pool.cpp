#include "core/thread_pool.h"

#include <algorithm>

#include "core/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define QS_CPU_RELAX() _mm_pause()
#else
#define QS_CPU_RELAX() std::this_thread::yield()
#endif

namespace qs {

namespace {

thread_local bool t_inside_loop = false;

// Workers spin this many relax-iterations (tens of microseconds) waiting for the next loop before
// sleeping: decode calls parallel_for hundreds of times per token, and a condition-variable
// wake-up per call would cost more than many of the loops themselves.
constexpr int kSpinIterations = 20000;

}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = std::max(1u, std::thread::hardware_concurrency());
  workers_.reserve(num_threads - 1);
  for (int i = 0; i + 1 < num_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& w : workers_) w.join();
}

namespace {

constexpr uint64_t kMaxChunks = 0xffff;

uint64_t pack(uint32_t job, uint64_t num_chunks, uint64_t next) {
  return (static_cast<uint64_t>(job) << 32) | (num_chunks << 16) | next;
}

}  // namespace

void ThreadPool::run_chunks(uint32_t job) {
  uint64_t state = claim_.load(std::memory_order_acquire);
  for (;;) {
    const uint32_t state_job = static_cast<uint32_t>(state >> 32);
    const uint64_t num_chunks = (state >> 16) & 0xffff;
    const uint64_t next = state & 0xffff;
    if (state_job != job || next >= num_chunks) return;
    if (!claim_.compare_exchange_weak(state, state + 1, std::memory_order_acq_rel,
                                      std::memory_order_acquire)) {
      continue;  // `state` was reloaded
    }
    const int64_t begin = n_ * static_cast<int64_t>(next) / static_cast<int64_t>(num_chunks);
    const int64_t end = n_ * static_cast<int64_t>(next + 1) / static_cast<int64_t>(num_chunks);
    if (begin < end) (*fn_)(begin, end);
    completed_.fetch_add(1, std::memory_order_acq_rel);
    state = claim_.load(std::memory_order_acquire);
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                              int64_t num_chunks) {
  if (n <= 0) return;
  if (num_chunks <= 0) num_chunks = num_threads();
  num_chunks = std::min({num_chunks, n, static_cast<int64_t>(kMaxChunks)});
  if (workers_.empty() || num_chunks == 1 || t_inside_loop) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> submit(submit_mu_);
  const uint32_t job = ++job_;
  fn_ = &fn;
  n_ = n;
  completed_.store(0, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mu_);  // pairs with the sleepers' predicate check
    claim_.store(pack(job, static_cast<uint64_t>(num_chunks), 0), std::memory_order_release);
  }
  wake_.notify_all();

  t_inside_loop = true;
  run_chunks(job);
  t_inside_loop = false;
  // Wait only for chunks other threads claimed; workers that never woke up cost nothing. Yield
  // after a short spin in case a claiming worker was preempted (a busy machine).
  for (int spins = 0; completed_.load(std::memory_order_acquire) != num_chunks; ++spins) {
    if (spins < kSpinIterations / 8) {
      QS_CPU_RELAX();
    } else {
      std::this_thread::yield();
    }
  }
}

void ThreadPool::worker_loop() {
  t_inside_loop = true;
  uint32_t seen = 0;
  auto current_job = [this] {
    return static_cast<uint32_t>(claim_.load(std::memory_order_acquire) >> 32);
  };
  for (;;) {
    uint32_t job = current_job();
    for (int i = 0; i < kSpinIterations && job == seen; ++i) {
      QS_CPU_RELAX();
      job = current_job();
    }
    if (job == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || current_job() != seen; });
      if (stop_) return;
      job = current_job();
    }
    seen = job;
    run_chunks(job);
  }
}

}  // namespace qs
