#include "engine/nccl_communicator.h"

#ifdef QS_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdlib>
#include <string>
#endif

namespace qs {

#ifdef QS_HAVE_NCCL

namespace {

#define QS_NCCL_CHECK(call)                                                           \
  do {                                                                                \
    ncclResult_t qs_nccl_r = (call);                                                  \
    QS_CHECK_MSG(qs_nccl_r == ncclSuccess,                                            \
                 std::string(#call) + ": " + ncclGetErrorString(qs_nccl_r));          \
  } while (0)
#define QS_CUDART_CHECK(call)                                                         \
  do {                                                                                \
    cudaError_t qs_cuda_e = (call);                                                   \
    QS_CHECK_MSG(qs_cuda_e == cudaSuccess,                                            \
                 std::string(#call) + ": " + cudaGetErrorString(qs_cuda_e));          \
  } while (0)

}  // namespace

class NcclCommunicatorGroup::Rank final : public Communicator {
 public:
  Rank(ncclComm_t comm, int device, cudaStream_t stream, int rank, int world)
      : comm_(comm), device_(device), stream_(stream), rank_(rank), world_(world) {}
  ~Rank() override {
    cudaSetDevice(device_);
    if (staging_) cudaFree(staging_);
    ncclCommDestroy(comm_);
  }
  int rank() const override { return rank_; }
  int world() const override { return world_; }

  void all_reduce_sum(float* data, size_t n) override {
    QS_CUDART_CHECK(cudaSetDevice(device_));
    // Ring and tree all-reduce finish with every rank holding the same reduced bits.
    QS_NCCL_CHECK(ncclAllReduce(data, data, n, ncclFloat32, ncclSum, comm_, stream_));
  }

  void broadcast(void* host, size_t bytes, int root) override {
    QS_CHECK(root >= 0 && root < world_);
    if (bytes == 0) return;
    QS_CUDART_CHECK(cudaSetDevice(device_));
    if (bytes > staging_bytes_) {
      QS_CUDART_CHECK(cudaStreamSynchronize(stream_));
      if (staging_) QS_CUDART_CHECK(cudaFree(staging_));
      staging_ = nullptr;
      QS_CUDART_CHECK(cudaMalloc(&staging_, bytes));
      staging_bytes_ = bytes;
    }
    if (rank_ == root) {
      QS_CUDART_CHECK(cudaMemcpyAsync(staging_, host, bytes, cudaMemcpyHostToDevice, stream_));
    }
    QS_NCCL_CHECK(ncclBroadcast(staging_, staging_, bytes, ncclUint8, root, comm_, stream_));
    if (rank_ != root) {
      QS_CUDART_CHECK(cudaMemcpyAsync(host, staging_, bytes, cudaMemcpyDeviceToHost, stream_));
    }
    QS_CUDART_CHECK(cudaStreamSynchronize(stream_));
  }

 private:
  ncclComm_t comm_;
  int device_;
  cudaStream_t stream_;
  int rank_, world_;
  void* staging_ = nullptr;
  size_t staging_bytes_ = 0;
};

bool nccl_compiled() { return true; }

Result<std::unique_ptr<NcclCommunicatorGroup>> NcclCommunicatorGroup::create(
    const std::vector<int>& devices, const std::vector<void*>& streams) {
  if (devices.empty() || devices.size() != streams.size()) {
    return make_error("nccl: need one stream per device (" + std::to_string(devices.size()) +
                      " devices, " + std::to_string(streams.size()) + " streams)");
  }
  setenv("NCCL_NVLS_ENABLE", "0", 1);  // no NVLink multicast (docs/multi-gpu.md)
  const int world = static_cast<int>(devices.size());
  std::vector<ncclComm_t> comms(devices.size());
  ncclResult_t r = ncclCommInitAll(comms.data(), world, devices.data());
  if (r != ncclSuccess) {
    return make_error(std::string("nccl: ncclCommInitAll over ") + std::to_string(world) +
                      " devices failed: " + ncclGetErrorString(r));
  }
  std::unique_ptr<NcclCommunicatorGroup> group(new NcclCommunicatorGroup());
  for (int i = 0; i < world; ++i) {
    group->ranks_.push_back(std::make_unique<Rank>(
        comms[i], devices[i], static_cast<cudaStream_t>(streams[i]), i, world));
  }
  return group;
}

NcclCommunicatorGroup::~NcclCommunicatorGroup() = default;

#else  // no NCCL in this build

class NcclCommunicatorGroup::Rank final : public Communicator {  // never made
 public:
  int rank() const override { return 0; }
  int world() const override { return 0; }
  void all_reduce_sum(float*, size_t) override { QS_CHECK_MSG(false, "no NCCL in this build"); }
  void broadcast(void*, size_t, int) override { QS_CHECK_MSG(false, "no NCCL in this build"); }
};

bool nccl_compiled() { return false; }

Result<std::unique_ptr<NcclCommunicatorGroup>> NcclCommunicatorGroup::create(
    const std::vector<int>& devices, const std::vector<void*>& streams) {
  (void)devices, (void)streams;
  return make_error(
      "this quantspec was built without NCCL: tensor parallelism over CUDA devices needs "
      "-DQS_CUDA=ON with NCCL installed (libnccl, nccl.h)");
}

NcclCommunicatorGroup::~NcclCommunicatorGroup() = default;

#endif

int NcclCommunicatorGroup::world() const { return static_cast<int>(ranks_.size()); }

Communicator& NcclCommunicatorGroup::rank(int r) {
  QS_CHECK(r >= 0 && r < world());
  return *ranks_[static_cast<size_t>(r)];
}

}  // namespace qs
