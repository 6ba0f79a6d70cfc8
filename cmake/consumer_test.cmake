# ctest -P script: installs kpa into a fresh prefix, builds examples/decode against it with
# find_package(kpa) exactly as an outside project would (same compiler and flags as the kpa
# build), and runs the result unless the environment says KPA_CONSUMER_BUILD_ONLY=1 (a CUDA
# build on a machine without a GPU).
# Inputs: KPA_BUILD_DIR, KPA_SOURCE_DIR, WORK_DIR, KOKKOS_ROOT, CXX_COMPILER, CXX_FLAGS.
file(REMOVE_RECURSE "${WORK_DIR}")
function(run_step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result)
  if(NOT result EQUAL 0)
    string(REPLACE ";" " " command "${ARGN}")
    message(FATAL_ERROR "consumer test step failed (${result}): ${command}")
  endif()
endfunction()
run_step(${CMAKE_COMMAND} --install "${KPA_BUILD_DIR}" --prefix "${WORK_DIR}/prefix")
run_step(${CMAKE_COMMAND} -S "${KPA_SOURCE_DIR}/examples/decode" -B "${WORK_DIR}/build"
         -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix" "-DKokkos_ROOT=${KOKKOS_ROOT}"
         "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}" "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}")
run_step(${CMAKE_COMMAND} --build "${WORK_DIR}/build")
if("$ENV{KPA_CONSUMER_BUILD_ONLY}" STREQUAL "1")
  message(STATUS "consumer built; not run (KPA_CONSUMER_BUILD_ONLY=1)")
else()
  run_step("${WORK_DIR}/build/kpa-decode" --batch 3 --seq-len 777 --heads 8 --kv-heads 2 --iters 2)
endif()
