# cmake/BitrefitCuda.cmake — CUDA language setup for bitrefit (included by the top-level CMakeLists).
#
# BITREFIT_CUDA (cache string, declared at top level):
#   AUTO  enable CUDA when nvcc is found (PATH, $CUDACXX, $CUDA_PATH/bin or /usr/local/cuda/bin);
#   ON    require nvcc, fail at configure time with a message that says where we looked;
#   OFF   CPU only: no CUDA language, no CUDA translation units.
# Sets BITREFIT_CUDA_ENABLED (ON/OFF) for the test and bench folders.
#
# Thrust: the CUDA Toolkit's CCCL (/usr/local/cuda/include/cccl) is the one Thrust for nvcc and for
# g++ builds (target bitrefit_thrust in BitrefitDependencies.cmake; Debian's libthrust-dev is the
# fallback when no toolkit is installed). Under g++ the Thrust "device" system is chosen per target:
#   bitrefit::thrust_cpp  THRUST_DEVICE_SYSTEM=CPP (sequential host backend)
#   bitrefit::thrust_omp  THRUST_DEVICE_SYSTEM=OMP (OpenMP, -fopenmp / libgomp)
# Our own host/device functions use BITREFIT_HD from <bitrefit/core/hd.hpp>, which is empty under
# g++, so the same source compiles with both compilers.

set(BITREFIT_CUDA_ENABLED OFF)
string(TOUPPER "${BITREFIT_CUDA}" _bitrefit_cuda_mode)
if(NOT _bitrefit_cuda_mode MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "BITREFIT_CUDA must be AUTO, ON or OFF (got '${BITREFIT_CUDA}')")
endif()

if(NOT _bitrefit_cuda_mode STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER)
    if(DEFINED ENV{CUDACXX})
      set(_bitrefit_nvcc "$ENV{CUDACXX}")
    else()
      find_program(_bitrefit_nvcc nvcc
        HINTS ENV CUDA_PATH ENV CUDA_HOME /usr/local/cuda
        PATH_SUFFIXES bin)
    endif()
    if(_bitrefit_nvcc)
      set(CMAKE_CUDA_COMPILER "${_bitrefit_nvcc}" CACHE FILEPATH "CUDA compiler (nvcc)")
    endif()
  endif()
  if(CMAKE_CUDA_COMPILER)
    # Hopper only (the target fleet is H100/H200); set before enable_language so CMake does not
    # probe the architecture of a GPU this machine may not have.
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90)
    endif()
    enable_language(CUDA)
    # CMake 3.25.1 knows no C++20 flag for nvcc: without these, cxx_std_20 / CUDA_STANDARD 20 fails
    # with "CUDA20 is not a known standard" or silently compiles as C++17.
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    set(BITREFIT_CUDA_ENABLED ON)
    message(STATUS "bitrefit: CUDA enabled (${CMAKE_CUDA_COMPILER}, sm_${CMAKE_CUDA_ARCHITECTURES})")
  elseif(_bitrefit_cuda_mode STREQUAL "ON")
    message(FATAL_ERROR "BITREFIT_CUDA=ON but no nvcc was found: looked in PATH, $CUDACXX, "
                        "$CUDA_PATH/bin, $CUDA_HOME/bin and /usr/local/cuda/bin. Install the CUDA "
                        "Toolkit, set CMAKE_CUDA_COMPILER, or configure with -DBITREFIT_CUDA=AUTO|OFF.")
  else()
    message(STATUS "bitrefit: no nvcc found, CUDA translation units are not built (BITREFIT_CUDA=AUTO)")
  endif()
else()
  message(STATUS "bitrefit: CUDA disabled (BITREFIT_CUDA=OFF), CPU-only build")
endif()

if(NOT BITREFIT_THRUST_INCLUDE_DIR)
  message(STATUS "bitrefit: no Thrust headers found (CUDA Toolkit CCCL or libthrust-dev); "
                 "the Thrust backend's targets are not built")
endif()

# Thrust's CPU device systems for g++ builds of the one Thrust source (tests, bench).
if(NOT TARGET bitrefit_thrust_cpp)
  add_library(bitrefit_thrust_cpp INTERFACE)
  add_library(bitrefit::thrust_cpp ALIAS bitrefit_thrust_cpp)
  target_link_libraries(bitrefit_thrust_cpp INTERFACE bitrefit_cuda)
  target_compile_definitions(bitrefit_thrust_cpp INTERFACE THRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_CPP)
endif()
find_package(OpenMP COMPONENTS CXX)
if(OpenMP_CXX_FOUND AND NOT TARGET bitrefit_thrust_omp)
  add_library(bitrefit_thrust_omp INTERFACE)
  add_library(bitrefit::thrust_omp ALIAS bitrefit_thrust_omp)
  target_link_libraries(bitrefit_thrust_omp INTERFACE bitrefit_cuda OpenMP::OpenMP_CXX)
  target_compile_definitions(bitrefit_thrust_omp INTERFACE THRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP)
endif()
