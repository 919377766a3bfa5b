// Collectives between the ranks of a tensor-parallel group (docs/multi-gpu.md): one rank per
// device, one host thread per rank, all in one process. Every call is collective: every rank of
// the group makes the same calls in the same order with the same sizes.
#pragma once

#include <cstddef>
#include <memory>

namespace qs {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;

  // In place: data[i] = sum over ranks of data[i], n floats of this rank's backend memory. Every
  // rank ends with the same bits (the forward pass relies on it: all ranks then hold identical
  // hidden states and logits).
  virtual void all_reduce_sum(float* data, size_t n) = 0;
  // Copies `bytes` bytes of host memory from rank `root` into `host` of every other rank.
  virtual void broadcast(void* host, size_t bytes, int root) = 0;
};

// A group of `world` ranks run by threads of this process on the CPU backend (backend memory is
// host memory): shared pointers and a barrier. The sum adds the ranks in the fixed order 0, 1,
// ..., world-1 on every rank, so every rank gets bit-identical results, run after run.
class LocalCommunicatorGroup {
 public:
  explicit LocalCommunicatorGroup(int world);
  ~LocalCommunicatorGroup();
  LocalCommunicatorGroup(const LocalCommunicatorGroup&) = delete;
  LocalCommunicatorGroup& operator=(const LocalCommunicatorGroup&) = delete;

  int world() const;
  // The communicator of rank r, for the thread that runs rank r (one thread per rank).
  Communicator& rank(int r);

 private:
  struct Shared;
  class Rank;
  std::unique_ptr<Shared> shared_;
};

}  // namespace qs
