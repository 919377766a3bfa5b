// The backend an engine runs on, chosen by EngineOptions::device.
#pragma once

#include <memory>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "engine/communicator.h"
#include "engine/engine.h"
#include "model/config.h"

namespace qs {

// Errors: CUDA asked for in a build without the CUDA backend, no usable CUDA device, or a model
// shape the CUDA kernels do not support (the message names the field).
Result<std::unique_ptr<Backend>> create_backend(const EngineOptions& options,
                                                const ModelConfig& cfg);

// Host threads of one of `world` ranks: max(1, threads / world), threads = options.num_threads
// (0: all cores).
int threads_per_rank(const EngineOptions& options, int world);

// Tensor parallelism (docs/multi-gpu.md): the backends of `world` ranks. CPU: a CpuBackend per
// rank with threads_per_rank threads. CUDA:
// rank r on device options.device_index + r; an error when there are fewer devices.
// `shard_cfg` is one rank's configuration (the CUDA kernels' shape check).
Result<std::vector<std::unique_ptr<Backend>>> create_rank_backends(const EngineOptions& options,
                                                                   const ModelConfig& shard_cfg,
                                                                   int world);

// The communicators of those ranks: a LocalCommunicatorGroup on the CPU, NCCL over the CUDA
// backends' streams (an error in a build without NCCL).
class RankCommunicators {
 public:
  virtual ~RankCommunicators() = default;
  virtual Communicator& rank(int r) = 0;
};
Result<std::unique_ptr<RankCommunicators>> create_rank_communicators(
    const EngineOptions& options, const std::vector<Backend*>& backends);

}  // namespace qs
