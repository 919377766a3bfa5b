// A persistent pool of worker threads for data-parallel loops (the CPU backend's ops).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace qs {

class ThreadPool {
 public:
  // `num_threads` counts the calling thread too; 0 means std::thread::hardware_concurrency().
  explicit ThreadPool(int num_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) over disjoint ranges covering [0, n) and returns when all are done.
  // The range is cut into `num_chunks` nearly equal contiguous pieces (0: one per thread) that
  // threads take in order; more chunks balance uneven work. The caller works too. A call from
  // inside a running loop (nested) runs serially on the calling thread.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                    int64_t num_chunks = 0);

 private:
  void worker_loop();
  // Claims and runs chunks of job `job` until none are left or a newer job replaced it.
  void run_chunks(uint32_t job);

  std::vector<std::thread> workers_;
  std::mutex submit_mu_;  // one loop at a time

  std::mutex mu_;  // guards sleeping: stop_ and the wake-up of idle workers
  std::condition_variable wake_;
  bool stop_ = false;

  // The current job. claim_ packs (job id << 32 | num_chunks << 16 | next chunk): a worker that
  // wakes late cannot claim a chunk of a finished job, and the job's fields below are only read
  // by a thread holding an unfinished chunk, which keeps the submitter from replacing them.
  std::atomic<uint64_t> claim_{0};
  std::atomic<int64_t> completed_{0};  // chunks of the current job finished
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  uint32_t job_ = 0;  // id of the latest job (submitter only)
};

}  // namespace qs
