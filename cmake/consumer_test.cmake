# ctest -P script: installs kpa into a fresh prefix, builds examples/decode against it with
# find_package(kpa) exactly as an outside project would (same compiler and flags as the kpa
# build), and, unless the environment says KPA_CONSUMER_BUILD_ONLY=1 (a CUDA build on a machine
# without a GPU), runs the result, and runs what kpa installed from its prefix with a clean
# environment (nothing but PATH: the run paths must find libkpa.so and Kokkos): kpa-bench --help,
# kpa-decode, and a ctypes load of libkpa.so from Python.
# Inputs: KPA_BUILD_DIR, KPA_SOURCE_DIR, WORK_DIR, KOKKOS_ROOT, CXX_COMPILER, CXX_FLAGS, LIBDIR, PYTHON.
file(REMOVE_RECURSE "${WORK_DIR}")
function(run_step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result OUTPUT_VARIABLE output ERROR_VARIABLE output)
  if(NOT result EQUAL 0)
    string(REPLACE ";" " " command "${ARGN}")
    message(FATAL_ERROR "consumer test step failed (${result}): ${command}\n${output}")
  endif()
endfunction()
set(prefix "${WORK_DIR}/prefix")
run_step(${CMAKE_COMMAND} --install "${KPA_BUILD_DIR}" --prefix "${prefix}")
run_step(${CMAKE_COMMAND} -S "${KPA_SOURCE_DIR}/examples/decode" -B "${WORK_DIR}/build"
         -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=${prefix}" "-DKokkos_ROOT=${KOKKOS_ROOT}"
         "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}" "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}")
run_step(${CMAKE_COMMAND} --build "${WORK_DIR}/build")
if("$ENV{KPA_CONSUMER_BUILD_ONLY}" STREQUAL "1")
  message(STATUS "consumer built; not run (KPA_CONSUMER_BUILD_ONLY=1)")
  return()
endif()
run_step("${WORK_DIR}/build/kpa-decode" --batch 3 --seq-len 777 --heads 8 --kv-heads 2 --iters 2)
set(clean env -i PATH=/usr/bin:/bin OMP_NUM_THREADS=2 OMP_PROC_BIND=false)
if(EXISTS "${prefix}/bin/kpa-bench")
  run_step(${clean} "${prefix}/bin/kpa-bench" --help)
endif()
run_step(${clean} "${prefix}/bin/kpa-decode" --batch 2 --seq-len 100 --heads 4 --kv-heads 2 --iters 1)
if(PYTHON)
  run_step(${clean} "${PYTHON}" -c
           "import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); assert lib.kpa_init() == 0; lib.kpa_finalize()"
           "${prefix}/${LIBDIR}/libkpa.so")
endif()
message(STATUS "the consumer and kpa-bench, kpa-decode and libkpa.so as installed run from ${prefix}")
