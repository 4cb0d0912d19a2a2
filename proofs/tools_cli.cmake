# tools_cli.cmake — the command lines of the proofs tools check_protocol, bitrefit-fuzz-protocol and
# bitrefit-spin-trace (its options only: its runs are spin_trace_agreement's), as a ctest test (cmake -P).
#
#   cmake -DCHECKER=<check_protocol> -DFUZZER=<bitrefit-fuzz-protocol> -DSPIN_TRACE=<bitrefit-spin-trace>
#         -DWORKDIR=<build dir> -P tools_cli.cmake
#
# What the tools run is tested by test_proofs and test_random_schedules; this checks what only the
# tools do: their exit statuses (check_protocol: 0 ok, 1 violation, 2 bad arguments, 3 state limit;
# the fuzzer: 0 no failure, 1 failure, 2 bad arguments), their JSON output, the scenario file of a
# counterexample, and that a mistyped or impossible bound stops them with a message naming the
# argument instead of running some other world (before 2026-12-07, check_protocol ran
# `receivers=abc` as a world of 0 receivers and printed "ok", crashed on `owners=0`, and the fuzzer
# ran `schedules=1e6` as 1 schedule).
foreach(v CHECKER FUZZER SPIN_TRACE WORKDIR)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "tools_cli.cmake: ${v} is not set")
  endif()
endforeach()
file(REMOVE_RECURSE "${WORKDIR}")
file(MAKE_DIRECTORY "${WORKDIR}")

set(failures 0)
# expect(NAME RC STDOUT_REGEX STDERR_REGEX ARGS...): runs the tool (TOOL) with ARGS and requires
# the exit status RC and both outputs to match (an empty regex requires an empty output).
function(expect name rc out_regex err_regex)
  execute_process(COMMAND "${TOOL}" ${ARGN} WORKING_DIRECTORY "${WORKDIR}"
                  RESULT_VARIABLE got_rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
  set(problems "")
  if(NOT got_rc STREQUAL "${rc}")
    string(APPEND problems "\n  exit status ${got_rc}, expected ${rc}")
  endif()
  foreach(stream out err)
    if("${${stream}_regex}" STREQUAL "")
      if(NOT "${${stream}}" STREQUAL "")
        string(APPEND problems "\n  std${stream} should be empty")
      endif()
    elseif(NOT "${${stream}}" MATCHES "${${stream}_regex}")
      string(APPEND problems "\n  std${stream} does not match: ${${stream}_regex}")
    endif()
  endforeach()
  if(problems)
    string(JOIN " " command ${ARGN})
    message("FAIL ${name}: ${TOOL} ${command}${problems}\n  stdout: ${out}\n  stderr: ${err}")
    math(EXPR n "${failures} + 1")
    set(failures ${n} PARENT_SCOPE)
  else()
    message("ok   ${name}")
  endif()
endfunction()

# ---- check_protocol
set(TOOL "${CHECKER}")
set(w1 receivers=1 owners=1 chunks=1 transitions=1)
set(w2 receivers=2 owners=1 chunks=1 transitions=1)
# Counts as test_proofs pins them for the same worlds (1 receiver: no symmetry; 2: one state per
# renaming class). Liveness on (the default) and sleep sets (safety only) give the same states.
expect(ok_one_receiver 0 "\"verdict\": \"ok\", \"states\": 25, \"transitions\": 37, \"depth\": 14" "" ${w1} --quiet)
expect(ok_two_receivers_two_threads 0 "\"verdict\": \"ok\", \"states\": 80, \"transitions\": 211, \"depth\": 20.*\"threads\": 2, \"symmetry\": 1" ""
       ${w2} threads=2 --quiet)
expect(ok_sleep_sets 0 "\"verdict\": \"ok\", \"states\": 80, \"transitions\": 135, \"depth\": 20.*\"slept\": 76" ""
       ${w2} threads=1 sleep=1 --no-liveness --quiet)
# A mutation: exit 1, the violation in the JSON line, and a scenario file that ends in it.
expect(violation_found 1 "\"verdict\": \"invariant violated\".*\"counterexample_moves\": 11, \"violation\": \"commit of 1.1 without the ack of member r1#0\"" ""
       ${w2} mutation=commit_before_all_acks --no-liveness --quiet --scenario=${WORKDIR}/counterexample.txt)
if(EXISTS "${WORKDIR}/counterexample.txt")
  file(READ "${WORKDIR}/counterexample.txt" scenario)
  if(NOT scenario MATCHES "^# counterexample found by proofs/check_protocol: commit of 1.1 without the ack of member r1#0\n"
     OR NOT scenario MATCHES "\nworld receivers=2 owners=1 chunks=1 transitions=1 [^\n]*mutation=commit_before_all_acks\n"
     OR NOT scenario MATCHES "\nVIOLATION: commit of 1.1 without the ack of member r1#0\n*$")
    message("FAIL violation_found: the scenario file does not name the world and end in the violation:\n${scenario}")
    math(EXPR failures "${failures} + 1")
  endif()
else()
  message("FAIL violation_found: no scenario file written")
  math(EXPR failures "${failures} + 1")
endif()
# The state limit: exit 3 with the counts so far.
expect(state_limit 3 "\"verdict\": \"state limit reached\".*\"violation\": \"more than 10 states\"" "" ${w2} max_states=10 --quiet)
# Bad arguments: exit 2, nothing on stdout, the argument named on stderr.
expect(zero_owners 2 "" "check_protocol: world: owners=0: must be at least 1" ${w2} owners=0 --quiet)
expect(zero_chunks 2 "" "check_protocol: world: chunks=0: must be at least 1" ${w2} chunks=0 --quiet)
expect(zero_receivers 2 "" "check_protocol: world: receivers=0: must be at least 1" ${w2} receivers=0 --quiet)
expect(not_a_number 2 "" "check_protocol: crashes=one: expected a whole number from 0 to 4294967295" ${w2} crashes=one)
expect(negative 2 "" "check_protocol: drops=-1: expected a whole number" ${w2} drops=-1)
expect(trailing_text 2 "" "check_protocol: threads=2x: expected a whole number" ${w2} threads=2x)
expect(out_of_range 2 "" "check_protocol: receivers=4294967296: expected a whole number" ${w2} receivers=4294967296)
expect(not_a_flag 2 "" "check_protocol: attest=yes: expected 0 or 1" ${w2} attest=yes)
expect(bad_gate 2 "" "check_protocol: gate=fast: expected sync or async" ${w2} gate=fast)
expect(bad_progress 2 "" "check_protocol: progress=-5: expected seconds" ${w2} progress=-5)
expect(unknown_key 2 "" "check_protocol: unknown key 'colour'" ${w2} colour=red)
expect(unknown_mutation 2 "" "check_protocol: unknown mutation 'none_such'" ${w2} mutation=none_such)
expect(sleep_with_liveness 2 "" "check_protocol: .*liveness" ${w2} sleep=1 --quiet)

# ---- bitrefit-fuzz-protocol
set(TOOL "${FUZZER}")
set(small receivers=2 owners=1 transitions=1 threads=1 progress=0 --json=${WORKDIR}/fuzz.json --scenario=${WORKDIR}/fuzz_failure.txt)
expect(fuzz_ok 0 "\"schedules\":20,.*\"verdict\":\"ok\"" "" seed=3 schedules=20 ${small})
expect(fuzz_mutation_found 1 "\"verdict\":\"failure\".*\"kind\":\"safety\"" "\nVIOLATION: " seed=1 schedules=200 mutation=commit_before_all_acks ${small})
if(NOT EXISTS "${WORKDIR}/fuzz_failure.txt" OR NOT EXISTS "${WORKDIR}/fuzz.json")
  message("FAIL fuzz_mutation_found: no scenario file or JSON file written")
  math(EXPR failures "${failures} + 1")
endif()
expect(fuzz_scientific_count 2 "" "bitrefit-fuzz-protocol: schedules=1e6: expected a whole number" schedules=1e6 ${small})
expect(fuzz_bad_range 2 "" "bitrefit-fuzz-protocol: receivers=0-2: expected N or LO-HI with 1 <= LO <= HI" receivers=0-2)
expect(fuzz_reversed_range 2 "" "bitrefit-fuzz-protocol: owners=3-1: expected N or LO-HI" owners=3-1)
expect(fuzz_range_junk 2 "" "bitrefit-fuzz-protocol: chunks=1-2x: expected N or LO-HI" chunks=1-2x)
expect(fuzz_not_a_probability 2 "" "bitrefit-fuzz-protocol: fault_p=1.5: expected a probability from 0 to 1" fault_p=1.5)
expect(fuzz_not_a_flag 2 "" "bitrefit-fuzz-protocol: shrink=yes: expected 0 or 1" shrink=yes)
expect(fuzz_bad_seconds 2 "" "bitrefit-fuzz-protocol: seconds=soon: expected seconds" seconds=soon)
expect(fuzz_unknown_key 2 "" "bitrefit-fuzz-protocol: unknown key 'colour'" colour=red)

# ---- bitrefit-spin-trace: its numeric options (read before anything runs)
set(TOOL "${SPIN_TRACE}")
expect(trace_bad_jobs 2 "" "bitrefit-spin-trace: --jobs=2x: expected a number of jobs from 1 to 256" --jobs=2x)
expect(trace_zero_jobs 2 "" "bitrefit-spin-trace: --jobs=0: expected a number of jobs from 1 to 256" --jobs=0)
expect(trace_bad_random 2 "" "bitrefit-spin-trace: --random=ten: expected a whole number" --random=ten)
expect(trace_bad_seed 2 "" "bitrefit-spin-trace: --seed=-1: expected a whole number" --seed=-1)
expect(trace_bad_receivers 2 "" "bitrefit-spin-trace: --receivers=0-2: expected LO-HI within 1-5" --receivers=0-2)

if(failures GREATER 0)
  message(FATAL_ERROR "${failures} command line case(s) of the proofs tools failed")
endif()
