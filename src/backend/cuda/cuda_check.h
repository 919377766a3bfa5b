// CUDA error policy (docs/errors.md): a failed CUDA call or launch is a bug or a driver failure,
// so it aborts with file:line and the CUDA error string, like QS_CHECK.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "core/error.h"

namespace qs::cuda {

[[noreturn]] inline void cuda_failed(const char* file, int line, const char* expr, cudaError_t e) {
  ::qs::check_failed(
      file, line, expr,
      std::string("CUDA error ") + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

// After a launch: catches launch-configuration errors at once. With QS_CUDA_SYNC=1 in the
// environment it also waits for the kernel (outside graph capture), so a fault in a kernel is
// reported at its launch rather than at the next synchronization.
void check_launch(const char* file, int line, cudaStream_t stream);

}  // namespace qs::cuda

#define CUDA_CHECK(expr)                                                \
  do {                                                                  \
    cudaError_t qs_cuda_err_ = (expr);                                  \
    if (qs_cuda_err_ != cudaSuccess)                                    \
      ::qs::cuda::cuda_failed(__FILE__, __LINE__, #expr, qs_cuda_err_); \
  } while (0)

#define CUDA_CHECK_LAUNCH(stream) ::qs::cuda::check_launch(__FILE__, __LINE__, (stream))

#define CUBLAS_CHECK(expr)                                                                   \
  do {                                                                                       \
    cublasStatus_t qs_cublas_st_ = (expr);                                                   \
    if (qs_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                              \
      ::qs::check_failed(__FILE__, __LINE__, #expr,                                          \
                         std::string("cuBLAS error ") + cublasGetStatusName(qs_cublas_st_)); \
  } while (0)
