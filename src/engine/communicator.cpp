#include "engine/communicator.h"

#include <barrier>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace qs {

struct LocalCommunicatorGroup::Shared {
  explicit Shared(int w) : world(w), sync(w), ptrs(static_cast<size_t>(w), nullptr) {}
  int world;
  std::barrier<> sync;
  std::vector<const void*> ptrs;  // [world] what each rank published for the current collective
  std::vector<std::unique_ptr<Rank>> ranks;
};

class LocalCommunicatorGroup::Rank final : public Communicator {
 public:
  Rank(Shared& shared, int rank) : shared_(shared), rank_(rank) {}
  int rank() const override { return rank_; }
  int world() const override { return shared_.world; }

  void all_reduce_sum(float* data, size_t n) override {
    const int w = shared_.world;
    if (w == 1) return;
    shared_.ptrs[rank_] = data;
    shared_.sync.arrive_and_wait();  // every rank's input is published
    sum_.resize(n);
    const float* p0 = static_cast<const float*>(shared_.ptrs[0]);
    for (size_t i = 0; i < n; ++i) sum_[i] = p0[i];
    for (int r = 1; r < w; ++r) {  // fixed rank order: the same bits on every rank
      const float* p = static_cast<const float*>(shared_.ptrs[r]);
      for (size_t i = 0; i < n; ++i) sum_[i] += p[i];
    }
    shared_.sync.arrive_and_wait();  // nobody reads an input any more
    std::memcpy(data, sum_.data(), n * sizeof(float));
  }

  void broadcast(void* host, size_t bytes, int root) override {
    QS_CHECK(root >= 0 && root < shared_.world);
    if (shared_.world == 1) return;
    if (rank_ == root) shared_.ptrs[rank_] = host;
    shared_.sync.arrive_and_wait();
    if (rank_ != root && bytes > 0) std::memcpy(host, shared_.ptrs[root], bytes);
    shared_.sync.arrive_and_wait();  // the root's buffer may change again
  }

 private:
  Shared& shared_;
  int rank_;
  std::vector<float> sum_;
};

LocalCommunicatorGroup::LocalCommunicatorGroup(int world) {
  QS_CHECK_MSG(world >= 1, "a communicator group needs at least one rank");
  shared_ = std::make_unique<Shared>(world);
  for (int r = 0; r < world; ++r) shared_->ranks.push_back(std::make_unique<Rank>(*shared_, r));
}

LocalCommunicatorGroup::~LocalCommunicatorGroup() = default;

int LocalCommunicatorGroup::world() const { return shared_->world; }

Communicator& LocalCommunicatorGroup::rank(int r) {
  QS_CHECK(r >= 0 && r < shared_->world);
  return *shared_->ranks[static_cast<size_t>(r)];
}

}  // namespace qs
