// bitrefit/codec/thrust/systems.hpp — the Thrust systems the Thrust backend runs on.
//
// One backend source, three systems:
//   thrust_systems::cpp   sequential, host memory (g++ or nvcc)          name "thrust-cpp"
//   thrust_systems::omp   OpenMP threads, host memory (needs -fopenmp)   name "thrust-omp"
//   thrust_systems::cuda  the GPU, device memory (nvcc only)             name "thrust-cuda"
// A system says how to run an algorithm (`policy()`), where scratch lives (`vector<T>`), and how
// bytes cross between host memory and its memory (`to_host`, `from_host`; plain memcpy for the
// host systems). `default_system` follows THRUST_DEVICE_SYSTEM, so a translation unit built with
// -DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP gets the OMP backend by default.
#pragma once

#include <cstddef>
#include <cstring>
#include <string>
#include <string_view>

// A host compiler cannot build Thrust's default CUDA system: without an explicit choice, a g++
// translation unit gets the sequential CPP system as Thrust's "device" (thrust::device_vector
// etc.); this backend names its systems explicitly either way.
#if !defined(__CUDACC__) && !defined(THRUST_DEVICE_SYSTEM)
#define THRUST_DEVICE_SYSTEM THRUST_DEVICE_SYSTEM_CPP
#endif

#include <thrust/system/cpp/execution_policy.h>
#include <thrust/system/cpp/vector.h>
#if defined(_OPENMP)
#include <thrust/system/omp/execution_policy.h>
#include <thrust/system/omp/vector.h>
#endif
#if defined(__CUDACC__)
#include <cuda_runtime_api.h>
#include <thrust/system/cuda/execution_policy.h>
#include <thrust/system/cuda/vector.h>
#endif

#include "bitrefit/core/error.hpp"

namespace bitrefit::codec::thrust_systems {

struct cpp {
  static constexpr std::string_view name = "thrust-cpp";
  static constexpr bool host_memory = true;
  static auto policy() { return thrust::cpp::par; }
  template <class T>
  using vector = thrust::cpp::vector<T>;
  static void to_host(void* dst, const void* src, std::size_t n) { if (n) std::memcpy(dst, src, n); }
  static void from_host(void* dst, const void* src, std::size_t n) { if (n) std::memcpy(dst, src, n); }
  static void synchronize() {}
};

#if defined(_OPENMP)
#define BITREFIT_THRUST_HAS_OMP 1
struct omp {
  static constexpr std::string_view name = "thrust-omp";
  static constexpr bool host_memory = true;
  static auto policy() { return thrust::omp::par; }
  template <class T>
  using vector = thrust::omp::vector<T>;
  static void to_host(void* dst, const void* src, std::size_t n) { if (n) std::memcpy(dst, src, n); }
  static void from_host(void* dst, const void* src, std::size_t n) { if (n) std::memcpy(dst, src, n); }
  static void synchronize() {}
};
#else
#define BITREFIT_THRUST_HAS_OMP 0
#endif

#if defined(__CUDACC__)
#define BITREFIT_THRUST_HAS_CUDA 1
struct cuda {
  static constexpr std::string_view name = "thrust-cuda";
  static constexpr bool host_memory = false;
  static auto policy() { return thrust::cuda::par; }
  template <class T>
  using vector = thrust::cuda::vector<T>;
  static void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess)
      throw error(errc::io, std::string("thrust-cuda: ") + what + ": " + cudaGetErrorString(e));
  }
  static void to_host(void* dst, const void* src, std::size_t n) {
    if (n) check(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost), "copy device to host");
  }
  static void from_host(void* dst, const void* src, std::size_t n) {
    if (n) check(cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice), "copy host to device");
  }
  static void synchronize() { check(cudaDeviceSynchronize(), "device synchronize"); }
};
#else
#define BITREFIT_THRUST_HAS_CUDA 0
#endif

#if defined(__CUDACC__) && THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
using default_system = cuda;
#elif defined(_OPENMP) && THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_OMP
using default_system = omp;
#else
using default_system = cpp;
#endif

}  // namespace bitrefit::codec::thrust_systems
