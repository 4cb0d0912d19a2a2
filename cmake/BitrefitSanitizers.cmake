# Sanitizer and fuzzing builds (clang). Included by the top-level CMakeLists.txt before the tests.
#
#   BITREFIT_SANITIZE=address,undefined   AddressSanitizer + UndefinedBehaviorSanitizer, every
#                                         report fatal (-fno-sanitize-recover=all)
#   BITREFIT_SANITIZE=thread              ThreadSanitizer
#   BITREFIT_BUILD_FUZZERS=ON             libFuzzer targets in tests/fuzz (clang only; label fuzz).
#                                         They add -fsanitize=fuzzer on top of BITREFIT_SANITIZE.
# scripts/sanitize.sh drives both sanitizer builds; scripts/test.sh runs it when BITREFIT_SANITIZE=1.
set(BITREFIT_SANITIZE "" CACHE STRING "Sanitizers for every target: '' | address,undefined | thread")
option(BITREFIT_BUILD_FUZZERS "Build the libFuzzer targets of tests/fuzz (clang)" OFF)
set(BITREFIT_LABELS_TARGET "" CACHE STRING
    "ctest labels; target 'labelled_tests' then builds only what tests with those labels run")

if(BITREFIT_BUILD_FUZZERS AND NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "BITREFIT_BUILD_FUZZERS needs clang (libFuzzer); configure with -DCMAKE_CXX_COMPILER=clang++-14")
endif()

if(BITREFIT_SANITIZE)
  string(REPLACE ";" "," bitrefit_sanitizers "${BITREFIT_SANITIZE}")
  set(bitrefit_sanitize_flags -fsanitize=${bitrefit_sanitizers} -fno-sanitize-recover=all -fno-omit-frame-pointer -gline-tables-only)
  if(bitrefit_sanitizers MATCHES "undefined" AND CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    # Narrow exceptions, each with its reason, in one file (cmake/sanitizer_ignorelist.txt).
    list(APPEND bitrefit_sanitize_flags -fsanitize-ignorelist=${PROJECT_SOURCE_DIR}/cmake/sanitizer_ignorelist.txt)
  endif()
  add_compile_options(${bitrefit_sanitize_flags})
  add_link_options(-fsanitize=${bitrefit_sanitizers})
  message(STATUS "bitrefit: sanitizers ${bitrefit_sanitizers}")
endif()

# Called at the end of the top-level CMakeLists.txt, once every test is registered: the target
# `labelled_tests` builds the executables of the tests carrying one of BITREFIT_LABELS_TARGET
# (recorded by bitrefit_label_targets in BitrefitTesting.cmake), and nothing else.
function(bitrefit_add_labelled_tests_target)
  if(NOT BITREFIT_LABELS_TARGET)
    return()
  endif()
  set(targets)
  foreach(label IN LISTS BITREFIT_LABELS_TARGET)
    get_property(t GLOBAL PROPERTY BITREFIT_LABEL_TARGETS_${label})
    list(APPEND targets ${t})
  endforeach()
  list(REMOVE_DUPLICATES targets)
  add_custom_target(labelled_tests)
  if(targets)
    add_dependencies(labelled_tests ${targets})
  endif()
  message(STATUS "bitrefit: labelled_tests (${BITREFIT_LABELS_TARGET}) builds ${targets}")
endfunction()
