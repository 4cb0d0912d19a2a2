# cmake -DMODE=find_package|add_subdirectory -DSOURCE_DIR=... -DWORK_DIR=... -DGENERATOR=...
#       -DCXX=... -DVERSION=... -P run_consumer.cmake
# find_package: configures bitrefit alone (no tests, no CUDA), installs it into WORK_DIR/prefix,
# checks the installed package files, then builds and runs the consumer against that prefix only.
# add_subdirectory: builds and runs the consumer with bitrefit's source tree added as a subproject.
cmake_minimum_required(VERSION 3.25)
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGN}\n${out}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

# Debug with -O0 and no -g: what is tested is that the package is found, links and runs, not its
# speed; unoptimised, the two packaging tests took 81 s of CPU instead of 111 s (Release).
set(common -G ${GENERATOR} -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-O0 -DBITREFIT_CUDA=OFF)
if(MODE STREQUAL "find_package")
  set(prefix ${WORK_DIR}/prefix)
  run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/bitrefit-build ${common}
      -DBITREFIT_BUILD_TESTS=OFF -DBITREFIT_BUILD_EXAMPLES=OFF -DBITREFIT_BUILD_PROOFS=OFF -DBITREFIT_BUILD_BENCH=OFF
      -DBITREFIT_BUILD_PYTHON=OFF)
  run(${CMAKE_COMMAND} --install ${WORK_DIR}/bitrefit-build --prefix ${prefix})
  foreach(f share/cmake/bitrefit/bitrefit-config.cmake share/cmake/bitrefit/bitrefit-config-version.cmake
            share/cmake/bitrefit/bitrefit-targets.cmake include/bitrefit/bitrefit.hpp include/bitrefit/core/core.hpp
            include/bitrefit/io/io.hpp)
    if(NOT EXISTS ${prefix}/${f})
      message(FATAL_ERROR "install is missing ${f}")
    endif()
  endforeach()
  # ARCH_INDEPENDENT: the version file must accept a consumer with another pointer size (32-bit),
  # and still check versions.
  set(CMAKE_SIZEOF_VOID_P 4)
  set(PACKAGE_FIND_VERSION ${VERSION})  # what find_package(bitrefit <VERSION>) sets
  string(REGEX MATCH "^([0-9]+)\\.([0-9]+)" _ ${VERSION})
  set(PACKAGE_FIND_VERSION_MAJOR ${CMAKE_MATCH_1})
  set(PACKAGE_FIND_VERSION_MINOR ${CMAKE_MATCH_2})
  include(${prefix}/share/cmake/bitrefit/bitrefit-config-version.cmake)
  if(PACKAGE_VERSION_UNSUITABLE OR NOT PACKAGE_VERSION_COMPATIBLE)
    message(FATAL_ERROR "bitrefit-config-version.cmake rejects a 32-bit consumer: not ARCH_INDEPENDENT")
  endif()
  set(PACKAGE_FIND_VERSION 99.0)
  set(PACKAGE_FIND_VERSION_MAJOR 99)
  set(PACKAGE_FIND_VERSION_MINOR 0)
  unset(PACKAGE_VERSION_COMPATIBLE)
  include(${prefix}/share/cmake/bitrefit/bitrefit-config-version.cmake)
  if(PACKAGE_VERSION_COMPATIBLE)
    message(FATAL_ERROR "bitrefit-config-version.cmake accepts a request for version 99.0")
  endif()
  unset(CMAKE_SIZEOF_VOID_P)
  # Nothing from the build tree may leak into the installed targets.
  file(READ ${prefix}/share/cmake/bitrefit/bitrefit-targets.cmake targets_file)
  string(FIND "${targets_file}" "${SOURCE_DIR}" leak)
  if(NOT leak EQUAL -1)
    message(FATAL_ERROR "installed targets reference the source tree ${SOURCE_DIR}")
  endif()
  run(${CMAKE_COMMAND} -S ${CMAKE_CURRENT_LIST_DIR}/consumer -B ${WORK_DIR}/consumer-build ${common}
      -DBITREFIT_CONSUMER_MODE=find_package -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
      -DBITREFIT_EXPECTED_VERSION=${VERSION})
elseif(MODE STREQUAL "add_subdirectory")
  run(${CMAKE_COMMAND} -S ${CMAKE_CURRENT_LIST_DIR}/consumer -B ${WORK_DIR}/consumer-build ${common}
      -DBITREFIT_CONSUMER_MODE=add_subdirectory -DBITREFIT_SOURCE_DIR=${SOURCE_DIR})
else()
  message(FATAL_ERROR "MODE must be find_package or add_subdirectory")
endif()
run(${CMAKE_COMMAND} --build ${WORK_DIR}/consumer-build)
run(${WORK_DIR}/consumer-build/consumer)
message(STATUS "${last_output}")
if(NOT last_output MATCHES "consumer: ok")
  message(FATAL_ERROR "the consumer did not report success")
endif()
run(${WORK_DIR}/consumer-build/consumer_protocol)
if(NOT last_output MATCHES "consumer_protocol: ok")
  message(FATAL_ERROR "the protocol-only consumer did not report success")
endif()
file(REMOVE_RECURSE ${WORK_DIR})
