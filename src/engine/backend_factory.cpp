#include "engine/backend_factory.h"

#include <algorithm>
#include <string>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "engine/nccl_communicator.h"
#ifdef QS_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace qs {

bool cuda_compiled() {
#ifdef QS_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

const char* device_name(Device device) {
  return device == Device::kCuda ? "cuda" : "cpu";
}

#ifdef QS_HAVE_CUDA
namespace {
// The CUDA backend options of the engine's choices, for device ordinal `device`.
CudaBackendOptions cuda_backend_options(const EngineOptions& options, int device) {
  CudaBackendOptions cuda;
  cuda.device = device;
  cuda.exact_prefill = options.prefill_matmul == PrefillMatmul::kExact;
  cuda.exact_draft_attention = options.draft_attention == AttentionOperands::kExact;
  cuda.f16_target_attention = options.target_attention == AttentionOperands::kF16;
  return cuda;
}
}  // namespace
#endif

Result<std::unique_ptr<Backend>> create_backend(const EngineOptions& options,
                                                const ModelConfig& cfg) {
  if (options.device == Device::kCpu) {
    return std::unique_ptr<Backend>(std::make_unique<CpuBackend>(options.num_threads));
  }
#ifdef QS_HAVE_CUDA
  QS_TRY(CudaBackend::check_supported(cfg));
  QS_ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> backend,
                      CudaBackend::create(cuda_backend_options(options, options.device_index)));
  return std::unique_ptr<Backend>(std::move(backend));
#else
  (void)cfg;
  return make_error(
      "this quantspec was built without the CUDA backend: rebuild with -DQS_CUDA=ON "
      "(scripts/build-cuda.sh) to use --device cuda");
#endif
}

int threads_per_rank(const EngineOptions& options, int world) {
  const int all = options.num_threads > 0
                      ? options.num_threads
                      : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, all / world);
}

Result<std::vector<std::unique_ptr<Backend>>> create_rank_backends(const EngineOptions& options,
                                                                   const ModelConfig& shard_cfg,
                                                                   int world) {
  std::vector<std::unique_ptr<Backend>> backends;
  if (options.device == Device::kCpu) {
    const int per_rank = threads_per_rank(options, world);
    for (int r = 0; r < world; ++r) backends.push_back(std::make_unique<CpuBackend>(per_rank));
    return backends;
  }
#ifdef QS_HAVE_CUDA
  QS_TRY(CudaBackend::check_supported(shard_cfg));
  for (int r = 0; r < world; ++r) {
    Result<std::unique_ptr<CudaBackend>> made =
        CudaBackend::create(cuda_backend_options(options, options.device_index + r));
    if (!made.ok()) {
      return make_error("--tp " + std::to_string(world) + " on --device cuda needs CUDA devices " +
                        std::to_string(options.device_index) + ".." +
                        std::to_string(options.device_index + world - 1) + ": " +
                        made.error().message);
    }
    backends.push_back(std::move(made).value());
  }
  return backends;
#else
  (void)shard_cfg;
  return make_error(
      "this quantspec was built without the CUDA backend: rebuild with -DQS_CUDA=ON "
      "(scripts/build-cuda.sh) to use --device cuda");
#endif
}

namespace {

class LocalRankCommunicators final : public RankCommunicators {
 public:
  explicit LocalRankCommunicators(int world) : group_(world) {}
  Communicator& rank(int r) override { return group_.rank(r); }

 private:
  LocalCommunicatorGroup group_;
};

class NcclRankCommunicators final : public RankCommunicators {
 public:
  explicit NcclRankCommunicators(std::unique_ptr<NcclCommunicatorGroup> group)
      : group_(std::move(group)) {}
  Communicator& rank(int r) override { return group_->rank(r); }

 private:
  std::unique_ptr<NcclCommunicatorGroup> group_;
};

}  // namespace

Result<std::unique_ptr<RankCommunicators>> create_rank_communicators(
    const EngineOptions& options, const std::vector<Backend*>& backends) {
  const int world = static_cast<int>(backends.size());
  if (options.device == Device::kCpu) {
    return std::unique_ptr<RankCommunicators>(std::make_unique<LocalRankCommunicators>(world));
  }
  std::vector<int> devices;
  std::vector<void*> streams;
#ifdef QS_HAVE_CUDA
  for (int r = 0; r < world; ++r) {
    devices.push_back(options.device_index + r);
    streams.push_back(static_cast<CudaBackend*>(backends[static_cast<size_t>(r)])->stream());
  }
#endif
  Result<std::unique_ptr<NcclCommunicatorGroup>> group =
      NcclCommunicatorGroup::create(devices, streams);
  if (!group.ok()) {
    return make_error("--tp " + std::to_string(world) + ": " + group.error().message);
  }
  return std::unique_ptr<RankCommunicators>(
      std::make_unique<NcclRankCommunicators>(std::move(group).value()));
}

}  // namespace qs
