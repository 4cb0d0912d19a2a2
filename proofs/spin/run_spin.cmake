# run_spin.cmake — one spin verification run, as a ctest test (cmake -P).
#
#   cmake -DSPIN=spin -DCC=gcc -DMODEL=refit.pml -DWORKDIR=<build dir> -DDEFINES="-DNS=1;..."
#         -DPAN_CFLAGS="-DSAFETY;-DNOCLAIM" [-DPAN_OPT=-O2] -DPAN_ARGS="-m2000000"
#         -DEXPECT=pass|violation|cycle -P run_spin.cmake
#
# PAN_OPT is the optimisation level pan.c is compiled at (default -O2): a long search wants -O2,
# a short one or one that stops at its first violation wants pan compiled fast (-Og, -O0).
#
# Generates pan.c in WORKDIR (the build tree, never the source tree), compiles it, runs it and
# judges its output, because pan exits 0 even when it found errors:
#   EXPECT=pass       requires "errors: 0" and a complete search (no "max search depth too small")
#   EXPECT=violation  requires "errors: N" with N > 0 and "assertion violated"; the counterexample
#                     trail is replayed with `spin -t` and printed, then kept in WORKDIR.
#   EXPECT=cycle      the same for a liveness violation: "errors: N", N > 0, and "acceptance cycle"
#                     (a run with -a, where the never claim of the model's ltl formula is violated).
foreach(v SPIN CC MODEL WORKDIR EXPECT)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "run_spin.cmake: ${v} is not set")
  endif()
endforeach()
if(NOT DEFINED PAN_OPT)
  set(PAN_OPT -O2)
endif()
if(NOT PAN_OPT MATCHES "^-O([0-3gs]|fast)?$")
  message(FATAL_ERROR "run_spin.cmake: PAN_OPT must be one optimisation flag (-O0, -Og, -O2, ...), not '${PAN_OPT}'")
endif()

file(REMOVE_RECURSE "${WORKDIR}")
file(MAKE_DIRECTORY "${WORKDIR}")
get_filename_component(model_name "${MODEL}" NAME)
configure_file("${MODEL}" "${WORKDIR}/${model_name}" COPYONLY)

execute_process(COMMAND ${SPIN} ${DEFINES} -a ${model_name} WORKING_DIRECTORY "${WORKDIR}"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT EXISTS "${WORKDIR}/pan.c")
  message(FATAL_ERROR "spin -a failed (${rc}):\n${out}\n${err}")
endif()
execute_process(COMMAND ${CC} ${PAN_OPT} -w ${PAN_CFLAGS} -o pan pan.c WORKING_DIRECTORY "${WORKDIR}"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "compiling pan failed (${rc}):\n${out}\n${err}")
endif()
string(TIMESTAMP t0 "%s")
execute_process(COMMAND ./pan ${PAN_ARGS} WORKING_DIRECTORY "${WORKDIR}"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(TIMESTAMP t1 "%s")
math(EXPR secs "${t1} - ${t0}")
file(WRITE "${WORKDIR}/pan.out" "${out}${err}")
message("spin ${DEFINES}\npan ${PAN_ARGS} (${secs} s):\n${out}${err}")

string(REGEX MATCH "errors: ([0-9]+)" m "${out}")
if(NOT m)
  message(FATAL_ERROR "pan printed no error count (exit ${rc})")
endif()
set(errors "${CMAKE_MATCH_1}")

if(EXPECT STREQUAL "pass")
  if(NOT errors EQUAL 0)
    execute_process(COMMAND ${SPIN} ${DEFINES} -t -p -g -l ${model_name} WORKING_DIRECTORY "${WORKDIR}"
                    OUTPUT_VARIABLE trail ERROR_VARIABLE trail_err)
    message(FATAL_ERROR "spin found ${errors} error(s) in the protocol model; counterexample:\n${trail}")
  endif()
  if(out MATCHES "max search depth too small" OR out MATCHES "Search not completed")
    message(FATAL_ERROR "the search did not complete: raise -m")
  endif()
elseif(EXPECT STREQUAL "violation" OR EXPECT STREQUAL "cycle")
  # what pan must report, and the trail line that names it
  if(EXPECT STREQUAL "violation")
    set(kind "assertion violation")
    set(report "assertion violated")
    set(trail_mark "[^\n]*assertion violated[^\n]*")
  else()
    set(kind "acceptance cycle (a liveness violation)")
    set(report "acceptance cycle")
    set(trail_mark "START OF CYCLE")
  endif()
  if(errors EQUAL 0)
    message(FATAL_ERROR "spin did not find the ${kind} this mutation introduces")
  endif()
  if(NOT out MATCHES "${report}")
    message(FATAL_ERROR "spin found an error, but not an ${kind}")
  endif()
  execute_process(COMMAND ${SPIN} ${DEFINES} -t -p -g ${model_name} WORKING_DIRECTORY "${WORKDIR}"
                  OUTPUT_VARIABLE trail ERROR_VARIABLE trail_err)
  string(REGEX MATCHALL "[^\n]*proc[^\n]*\n" steps "${trail}")
  list(LENGTH steps nsteps)
  string(REGEX MATCH "${trail_mark}" which "${trail}")
  message("counterexample (${nsteps} steps, full trail in ${WORKDIR}): ${which}")
else()
  message(FATAL_ERROR "EXPECT must be pass, violation or cycle, got '${EXPECT}'")
endif()
