# bitrefit_add_test(NAME n LABELS l... SOURCES s... [LIBS lib...] [TIMEOUT seconds])
# One GoogleTest (+ RapidCheck) executable registered as one ctest test with its labels.
find_package(GTest REQUIRED)
find_package(rapidcheck CONFIG REQUIRED)  # targets rapidcheck, rapidcheck_gtest (no version file)

function(bitrefit_add_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "LABELS;SOURCES;LIBS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 600)
  endif()
  add_executable(${T_NAME} ${T_SOURCES})
  # One translation unit per test executable (CMake's unity build): the library is header-only, so
  # each source file of a test compiled on its own instantiates and generates the same library code
  # again. Measured on the AddressSanitizer tree (clang -O0): test_codec's four files took 108 s
  # of CPU apart and 38 s as one. The price: a test file's file-local names must not clash with
  # another file's of the same test (the compiler says so when they do).
  set_target_properties(${T_NAME} PROPERTIES UNITY_BUILD ON)
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main rapidcheck rapidcheck_gtest)
  target_compile_options(${T_NAME} PRIVATE -Wall -Wextra)
  target_compile_definitions(${T_NAME} PRIVATE BITREFIT_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  add_test(NAME ${T_NAME} COMMAND ${T_NAME})
  set_tests_properties(${T_NAME} PROPERTIES LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT})
  bitrefit_label_targets(LABELS ${T_LABELS} TARGETS ${T_NAME})
endfunction()

# bitrefit_label_targets(LABELS l... TARGETS t...): the executables that tests labelled l need.
# bitrefit_add_test records its own; tests made with add_test (a demo run, a fuzzer) call this.
# The sanitizer builds use it to build exactly what the labels they run need (BitrefitSanitizers.cmake).
function(bitrefit_label_targets)
  cmake_parse_arguments(L "" "" "LABELS;TARGETS" ${ARGN})
  foreach(label IN LISTS L_LABELS)
    set_property(GLOBAL APPEND PROPERTY BITREFIT_LABEL_TARGETS_${label} ${L_TARGETS})
  endforeach()
endfunction()
