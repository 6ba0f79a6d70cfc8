# ctest -P script: installs kpa into a fresh prefix, builds examples/decode against it with
# find_package(kpa) exactly as an outside project would, and runs the result.
# Inputs: KPA_BUILD_DIR, KPA_SOURCE_DIR, WORK_DIR, KOKKOS_ROOT.
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
         -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix" "-DKokkos_ROOT=${KOKKOS_ROOT}")
run_step(${CMAKE_COMMAND} --build "${WORK_DIR}/build")
run_step("${WORK_DIR}/build/kpa-decode" --batch 3 --seq-len 777 --heads 8 --kv-heads 2 --iters 2)
