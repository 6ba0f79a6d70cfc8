# The C ABI from C, and from Python through ctypes (numpy from the distribution's packages).
# Both pass host pointers, so they run when the default execution space is a host back end.
if(NOT Kokkos_ENABLE_CUDA AND NOT Kokkos_ENABLE_HIP AND NOT Kokkos_ENABLE_SYCL)
  enable_language(C)
  add_executable(kpa-c-api-test c_api_test.c)
  set_target_properties(kpa-c-api-test PROPERTIES C_STANDARD 99 C_EXTENSIONS OFF)
  target_include_directories(kpa-c-api-test PRIVATE ${PROJECT_SOURCE_DIR}/include)
  find_package(Threads REQUIRED)
  target_link_libraries(kpa-c-api-test PRIVATE kpa m Threads::Threads)
  add_test(NAME kpa.c_api COMMAND kpa-c-api-test)
  set_tests_properties(kpa.c_api PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=2;OMP_PROC_BIND=false")
  set(_python_env "OMP_NUM_THREADS=2;OMP_PROC_BIND=false")
  if(KPA_SANITIZE)
    # An instrumented libkpa.so in an uninstrumented python3: the runtime must come first (and the
    # C++ runtime with it, whose exceptions it intercepts), and the interpreter's own allocations
    # at exit are not kpa's leaks.
    execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libasan.so OUTPUT_VARIABLE _asan
                    OUTPUT_STRIP_TRAILING_WHITESPACE)
    execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libstdc++.so OUTPUT_VARIABLE _cxx_runtime
                    OUTPUT_STRIP_TRAILING_WHITESPACE)
    list(APPEND _python_env "LD_PRELOAD=${_asan} ${_cxx_runtime}" "ASAN_OPTIONS=detect_leaks=0")
  endif()
  if(KPA_SYSTEM_PYTHON)
    add_test(NAME kpa.c_api_python_ctypes
      COMMAND ${KPA_SYSTEM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/test_c_api.py $<TARGET_FILE:kpa>)
    set_tests_properties(kpa.c_api_python_ctypes PROPERTIES ENVIRONMENT "${_python_env}")
  endif()
endif()

if(KPA_SELF_CONTAINED)
  # What makes it self-contained: it needs no Kokkos library and exports nothing but the C ABI.
  add_test(NAME kpa.self_contained_library
    COMMAND ${CMAKE_COMMAND} -DLIBRARY=$<TARGET_FILE:kpa> -DHEADER=${PROJECT_SOURCE_DIR}/include/kpa/kpa.h
            -P ${CMAKE_CURRENT_SOURCE_DIR}/check_self_contained.cmake)
endif()
