#include "engine/backend_factory.h"

#include "backend/cpu/cpu_backend.h"
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

Result<std::unique_ptr<Backend>> create_backend(const EngineOptions& options,
                                                const ModelConfig& cfg) {
  if (options.device == Device::kCpu) {
    return std::unique_ptr<Backend>(std::make_unique<CpuBackend>(options.num_threads));
  }
#ifdef QS_HAVE_CUDA
  QS_TRY(CudaBackend::check_supported(cfg));
  CudaBackendOptions cuda;
  cuda.device = options.device_index;
  QS_ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> backend, CudaBackend::create(cuda));
  return std::unique_ptr<Backend>(std::move(backend));
#else
  (void)cfg;
  return make_error(
      "this quantspec was built without the CUDA backend: rebuild with -DQS_CUDA=ON "
      "(scripts/build-cuda.sh) to use --device cuda");
#endif
}

}  // namespace qs
