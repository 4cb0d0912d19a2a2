// bitrefit/core/hd.hpp — the one host/device macro, so one source serves nvcc and g++.
//
// Functions that run inside Thrust algorithms (on the GPU under nvcc, on host threads under g++
// with THRUST_DEVICE_SYSTEM CPP or OMP) are marked BITREFIT_HD. Under nvcc it expands to
// __host__ __device__; under any other compiler to nothing, because g++ does not know those
// keywords and CCCL 3's headers no longer define them for host compilers.
#pragma once

#if defined(__CUDACC__)
#define BITREFIT_HD __host__ __device__
#define BITREFIT_DEVICE_COMPILER 1
#else
#define BITREFIT_HD
#define BITREFIT_DEVICE_COMPILER 0
#endif

// True while nvcc compiles the device side of a translation unit (for code paths that must
// differ, e.g. intrinsics); false on every host pass.
#if defined(__CUDA_ARCH__)
#define BITREFIT_DEVICE_PASS 1
#else
#define BITREFIT_DEVICE_PASS 0
#endif
