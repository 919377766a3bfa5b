// QS_HOST_DEVICE: a function that CUDA code runs on the device and the CPU tests run on the host
// (the tile maps of rope_tiles.h).
#pragma once

#if defined(__CUDACC__)
#define QS_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define QS_HOST_DEVICE inline
#endif
