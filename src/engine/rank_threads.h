// Tensor parallelism (docs/multi-gpu.md): runs one task per rank concurrently, rank 0 on the
// calling thread and rank r > 0 always on the same persistent thread of its own (a device backend
// binds its device to that thread once per task, Backend::bind_thread).
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"

namespace qs {

class RankThreads {
 public:
  explicit RankThreads(int world);  // world >= 1; world - 1 threads
  ~RankThreads();
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;

  int world() const { return world_; }

  // Calls fn(r) for every rank r in [0, world) at once and waits for all of them; returns the
  // error of the lowest rank that failed. One run at a time (not reentrant).
  Status run(const std::function<Status(int rank)>& fn);

 private:
  void worker(int rank);

  int world_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<Status(int)>* fn_ = nullptr;
  uint64_t generation_ = 0;  // bumped per run
  int pending_ = 0;          // worker tasks of the current run not finished
  bool stop_ = false;
  std::vector<Status> results_;
};

}  // namespace qs
