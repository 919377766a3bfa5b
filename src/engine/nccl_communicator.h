// The Communicator of a tensor-parallel group over CUDA devices (docs/multi-gpu.md): NCCL, one
// communicator per device, all created by one process (ncclCommInitAll); one host thread per rank
// then drives its rank. Collectives are queued on the rank's CudaBackend stream, in order with its
// ops (all_reduce_sum does not wait for the host; broadcast does, it returns host memory).
// Compiled with QS_CUDA when NCCL is found (QS_HAVE_NCCL); otherwise create() is an error.
// This header needs no CUDA headers.
#pragma once

#include <memory>
#include <vector>

#include "core/error.h"
#include "engine/communicator.h"

namespace qs {

// Whether this build has the NCCL communicator.
bool nccl_compiled();

class NcclCommunicatorGroup {
 public:
  // Rank r runs on CUDA device devices[r] and queues its collectives on streams[r] (the
  // cudaStream_t of rank r's CudaBackend, CudaBackend::stream()). Sets NCCL_NVLS_ENABLE=0 (NVLink
  // multicast stays off, as our machines require). Errors: NCCL's, sizes that disagree, or no
  // NCCL in this build.
  static Result<std::unique_ptr<NcclCommunicatorGroup>> create(const std::vector<int>& devices,
                                                               const std::vector<void*>& streams);
  ~NcclCommunicatorGroup();
  NcclCommunicatorGroup(const NcclCommunicatorGroup&) = delete;
  NcclCommunicatorGroup& operator=(const NcclCommunicatorGroup&) = delete;

  int world() const;
  // The communicator of rank r, for the thread that runs rank r. Its calls make device
  // devices[r] current on the calling thread.
  Communicator& rank(int r);

  class Rank;  // defined with NCCL

 private:
  NcclCommunicatorGroup() = default;
  std::vector<std::unique_ptr<Rank>> ranks_;
};

}  // namespace qs
