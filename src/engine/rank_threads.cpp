#include "engine/rank_threads.h"

namespace qs {

RankThreads::RankThreads(int world) : world_(world), results_(static_cast<size_t>(world)) {
  QS_CHECK(world >= 1);
  for (int r = 1; r < world; ++r) threads_.emplace_back(&RankThreads::worker, this, r);
}

RankThreads::~RankThreads() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void RankThreads::worker(int rank) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<Status(int)>* fn = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      fn = fn_;
    }
    Status st = (*fn)(rank);
    {
      std::lock_guard<std::mutex> lock(mu_);
      results_[static_cast<size_t>(rank)] = std::move(st);
      if (--pending_ == 0) done_.notify_one();
    }
  }
}

Status RankThreads::run(const std::function<Status(int rank)>& fn) {
  if (world_ == 1) return fn(0);
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    pending_ = world_ - 1;
    ++generation_;
  }
  wake_.notify_all();
  results_[0] = fn(0);
  {
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return pending_ == 0; });
    fn_ = nullptr;
  }
  for (Status& st : results_) {
    if (!st.ok()) return std::move(st);
  }
  return Status::ok_status();
}

}  // namespace qs
