#!/usr/bin/env bash
# The GPU check: kpa's CUDA build tested and measured on a machine with an NVIDIA GPU.
#
#   scripts/gpu-check.sh --prepare SM
#                                    on a machine with the package archives: builds the CUDA Kokkos
#                                    prefix for sm_SM (.deps/install-cuda, or -smSM beyond Ampere;
#                                    about 6 MB) and copies what the GPU machine may lack: the
#                                    GoogleTest sources (.deps/googletest) and kpa-bench's
#                                    header-only CLI11 and nlohmann-json (.deps/header-libs)
#   scripts/gpu-check.sh             on a GPU machine with nvcc, CMake and several cores (no network
#                                    needed), given the sources and those two folders: builds kpa
#                                    for the GPU it finds, then runs the checks below
#   scripts/gpu-check.sh --bundle SM [FILE]
#                                    on any machine with nvcc (no GPU needed): builds kpa with
#                                    machine code for sm_SM (e.g. 90 for an H100/H200) besides the
#                                    prefix's architecture and packs the test and bench binaries,
#                                    libkpa, Kokkos and the CUDA runtime into FILE (default
#                                    build-gpu/kpa-gpu-bundle.tar.xz, about 14 MB; about 20 minutes
#                                    on 2 cores)
#   scripts/gpu-check.sh --run FILE  on a GPU machine that needs only the driver (and a C and C++
#                                    runtime no older than the building machine's): unpacks the
#                                    bundle and runs the checks below
#
# The checks:
#   1. the unit tests on Kokkos::Cuda;
#   2. the parity tests (the same inputs through the host path on OpenMP and the device path on
#      CUDA, every output within the per-dtype tolerance; kpa-bench's default suite and the
#      head-size x block-size x dtype grid);
#   3. kpa-bench on the GPU: the default suite, 1 x 131072 and 64 x 2048 tokens (32/8 heads, head
#      128, f16), against the bandwidth a Kokkos probe measures on the same device, and the
#      bytes-in-flight probe (kpa-bench --in-flight-probe: 1-8 loads per lane x 8-64 warps per SM);
#   4. where python3 has torch with CUDA: the C ABI test (unit_tests/test_c_api.py) with device
#      pointers, and the same shapes as 3. through PyTorch's scaled_dot_product_attention
#      (scripts/sdpa_anchor.py);
#   5. (not with --run) where python3 has torch with CUDA, pip and setuptools: the PyTorch
#      operators' CUDA extension built against that torch and this build (no network: pip
#      --no-index), the whole pytest suite on CUDA tensors (KPA_TEST_DEVICE=cuda: CPU/GPU parity,
#      torch's current stream, a CUDA-graph capture and replay of a decode step against eager,
#      opcheck and torch.compile), and kpa.vllm_ops.paged_attention_v2 timed eagerly and from a
#      CUDA graph on the shapes of 4. (python/benchmarks/bench_vllm_ops_device.py).
# The CUDA Kokkos is KPA_KOKKOS_VERSION's (3.4.1 by default, or 4.6.01: scripts/bootstrap-deps.sh).
# Logs and JSON go to KPA_GPU_CHECK_OUT (default <repo>/build-gpu/results); each check stops after
# KPA_GPU_STEP_TIMEOUT seconds (default 900); the exit status is nonzero if a build, test or parity
# step failed. KPA_GPU_MEMCHECK=FILTER also runs the unit tests that GoogleTest FILTER selects under
# compute-sanitizer's memcheck.
set -uo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
log() { printf '[kpa gpu-check %s] %s\n' "$(date +%T)" "$*" >&2; }
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="$PATH:/usr/local/cuda/bin"

# cuda_prefix SM: the CUDA Kokkos prefix with machine code for sm_SM, built once (Kokkos_ROOT, if
# set, is taken as it is). Kokkos 3.4.1 builds for Ampere at most, and its initialisation aborts
# when its own probe kernel runs as PTX of another major version, so a newer GPU gets a prefix of
# its own with its machine code added (KPA_CUDA_EXTRA_SM).
cuda_prefix() {
  local sm=$1 base=${KPA_CUDA_ARCH:-AMPERE80}
  if [ -n "${Kokkos_ROOT:-}" ]; then echo "$Kokkos_ROOT"
  elif [ "$sm" = "${base//[!0-9]/}" ]; then "$repo/scripts/bootstrap-deps.sh" --cuda
  else KPA_CUDA_EXTRA_SM=$sm "$repo/scripts/bootstrap-deps.sh" --cuda \
         "$repo/.deps/install-cuda-sm$sm-kokkos-${KPA_KOKKOS_VERSION:-3.4.1}"
  fi
}

if [ "${1:-}" = "--prepare" ]; then
  set -e
  sm=${2:?"--prepare SM: the GPU's compute capability, e.g. 90 for an H100/H200"}
  prefix=$(cuda_prefix "$sm")
  rm -rf "$repo/.deps/googletest" "$repo/.deps/header-libs"
  cp -r /usr/src/googletest "$repo/.deps/googletest"
  mkdir -p "$repo/.deps/header-libs/include" "$repo/.deps/header-libs/share/cmake"
  cp -r /usr/include/CLI /usr/include/nlohmann "$repo/.deps/header-libs/include/"
  cp -r /usr/share/cmake/CLI11 /usr/share/cmake/nlohmann_json "$repo/.deps/header-libs/share/cmake/"
  log "prepared: carry ${prefix#"$repo/"}, .deps/googletest and .deps/header-libs with the sources"
  exit 0
fi

build=${KPA_GPU_BUILD_DIR:-$repo/build-gpu}
out=${KPA_GPU_CHECK_OUT:-$build/results}
jobs=$(nproc)
status=0
step() {  # step NAME COMMAND...: runs and logs one step, remembering a failure
  local name=$1; shift
  log "$name"
  if ! "$@" > "$out/$name.log" 2>&1; then
    status=1
    log "$name FAILED (see $out/$name.log)"
    tail -n 30 "$out/$name.log" >&2
  fi
}

# build_kpa SM: configures and builds the tested targets in $build with machine code for sm_SM
# besides the Kokkos prefix's architecture.
build_kpa() {
  local sm=$1
  command -v nvcc >/dev/null || { log "nvcc not found"; exit 1; }
  local kokkos prefix_sm
  kokkos=$(cuda_prefix "$sm") || { log "no CUDA Kokkos prefix for sm_$sm"; exit 1; }
  prefix_sm=${KPA_CUDA_ARCH:-AMPERE80}; prefix_sm=${prefix_sm//[!0-9]/}
  [ -f "$kokkos/.kpa-deps-complete" ] && prefix_sm=$(awk '{print $3}' "$kokkos/.kpa-deps-complete") &&
    prefix_sm=${prefix_sm//[!0-9]/}
  log "building for sm_$sm (Kokkos prefix for sm_$prefix_sm) in $build"
  local flags="-arch=sm_$prefix_sm"
  if [ -n "$sm" ] && [ "$sm" != "$prefix_sm" ]; then
    # Machine code for this GPU too: Kokkos' nvcc_wrapper takes one -arch, so the extra -gencode
    # goes through NVCC_APPEND_FLAGS, which nvcc reads and CMake does not see. The define records
    # it in the compile flags, so that CMake rebuilds every object built without it.
    export NVCC_APPEND_FLAGS="${NVCC_APPEND_FLAGS:-} -gencode=arch=compute_$sm,code=sm_$sm"
    flags+=" -DKPA_BUILD_EXTRA_SM=$sm"
  fi
  local gtest_args=()
  if [ -d "$repo/.deps/googletest" ]; then  # carried: the GPU machine may have no GoogleTest
    if [ ! -f "$repo/.deps/gtest-install/.complete" ]; then
      log "building GoogleTest from .deps/googletest"
      cmake -S "$repo/.deps/googletest" -B "$build/googletest" -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_INSTALL_PREFIX="$repo/.deps/gtest-install" -DBUILD_GMOCK=OFF > "$out/googletest.log" 2>&1 &&
        cmake --build "$build/googletest" -j "$jobs" >> "$out/googletest.log" 2>&1 &&
        cmake --install "$build/googletest" >> "$out/googletest.log" 2>&1 && touch "$repo/.deps/gtest-install/.complete" ||
        { log "GoogleTest build failed"; tail "$out/googletest.log"; exit 1; }
    fi
    gtest_args=(-DGTest_ROOT="$repo/.deps/gtest-install")
  fi
  # carried: kpa-bench's header-only libraries
  [ -d "$repo/.deps/header-libs" ] && gtest_args+=(-DCMAKE_PREFIX_PATH="$repo/.deps/header-libs")
  # A cache made with another compiler would be reset by CMake without the flags below.
  if [ -f "$build/CMakeCache.txt" ] && ! grep -q "^CMAKE_CXX_COMPILER:.*=$kokkos/bin/nvcc_wrapper\$" "$build/CMakeCache.txt"; then
    rm -rf "$build/CMakeCache.txt" "$build/CMakeFiles"
  fi
  cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release -DKokkos_ROOT="$kokkos" \
    -DCMAKE_CXX_COMPILER="$kokkos/bin/nvcc_wrapper" -DCMAKE_CXX_FLAGS="$flags" \
    -DKPA_TEST_SPACES=Kokkos::Cuda -DKPA_ENABLE_EXAMPLES=OFF "${gtest_args[@]}" > "$out/configure.log" 2>&1 ||
    { log "configure failed"; tail -n 30 "$out/configure.log"; exit 1; }
  step build cmake --build "$build" -j "$jobs" --target kpa kpa-unit-tests kpa-parity-tests kpa-bench
  [ "$status" = 0 ] || exit 1
}

# torch_extension BUILD: the PyTorch operators built against python3's torch, BUILD's kpa and a
# self-contained host libkpa for CPU tensors (BUILD/self-contained), installed into BUILD/python-site.
torch_extension() {
  local from=$1
  cmake --install "$from" --prefix "$from/python-prefix" || return 1
  BUILD_DIR=$from/self-contained KPA_KOKKOS_VERSION=${KPA_KOKKOS_VERSION:-3.4.1} \
    "$repo/scripts/build.sh" --self-contained kpa &&
    cmake --install "$from/self-contained" --prefix "$from/python-host-prefix" || return 1
  export KPA_PREFIX=$from/python-prefix KPA_HOST_PREFIX=$from/python-host-prefix
  rm -rf "$from/python-site"
  python3 -m pip install --no-build-isolation --no-index --no-deps --target "$from/python-site" "$repo/python" &&
    return 0
  log "pip could not install the package (no pip, setuptools or wheel?): building it with setup.py"
  (cd "$repo/python" && python3 setup.py build --build-base "$from/python-build") &&
    mkdir -p "$from/python-site" && cp -r "$from"/python-build/lib*/kpa "$from/python-site/"
}

# run_checks TESTS_DIR BENCH_DIR LIBKPA [BUILD]: the checks, on the test binaries in TESTS_DIR,
# kpa-bench in BENCH_DIR and the C ABI library LIBKPA; with BUILD (a build folder of kpa), the
# PyTorch operators too.
run_checks() {
  local bin=$1 libkpa=$3 from=${4:-}
  nvidia-smi -L >&2 || { log "no NVIDIA GPU visible"; exit 1; }
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8} OMP_PROC_BIND=${OMP_PROC_BIND:-false}
  local limit=(timeout "${KPA_GPU_STEP_TIMEOUT:-900}")  # a hung kernel fails its step, not the whole check
  # Every test's name, line-buffered: a test that crashes the process is the log's last line.
  step unit_tests "${limit[@]}" stdbuf -oL "$bin/kpa-unit-tests"
  step parity "${limit[@]}" "$bin/kpa-parity-tests"
  local torch=0
  python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null && torch=1
  if [ "$torch" = 1 ]; then
    step c_api "${limit[@]}" python3 "$repo/unit_tests/test_c_api.py" "$libkpa" --cuda
  else
    log "python3 has no torch with CUDA: the C ABI test and the SDPA anchor are skipped"
  fi
  local bench="$2/kpa-bench"
  step bench_default "${limit[@]}" "$bench" --check --json "$out/bench_default.json"
  step bench_long_1x131072 "${limit[@]}" "$bench" --batch-size 1 --seq-len 131072 --num-query-heads 32 --num-kv-heads 8 \
    --head-size 128 --dtype half --check --json "$out/bench_long_1x131072.json"
  step bench_64x2048 "${limit[@]}" "$bench" --batch-size 64 --seq-len 2048 --num-query-heads 32 --num-kv-heads 8 \
    --head-size 128 --dtype half --check --json "$out/bench_64x2048.json"
  step in_flight_probe "${limit[@]}" "$bench" --in-flight-probe --json "$out/in_flight_probe.json"
  local shapes=(llama_32x4096:32:4096:32:8:128 long_context_1x100k:1:100000:24:4:256
                single_tile_64x512:64:512:32:8:128 long_1x131072:1:131072:32:8:128 batch_64x2048:64:2048:32:8:128)
  if [ "$torch" = 1 ]; then
    step sdpa_anchor "${limit[@]}" python3 "$repo/scripts/sdpa_anchor.py" --json "$out/sdpa_anchor.json" "${shapes[@]}"
  fi
  if [ "$torch" = 1 ] && [ -n "$from" ]; then
    step torch_extension torch_extension "$from"
    if [ -d "$from/python-site/kpa" ]; then
      # From the tests' folder with the built package first on the path, not the source.
      step pytest_cuda "${limit[@]}" env -C "$repo/python/tests" PYTHONPATH="$from/python-site" KPA_TEST_DEVICE=cuda \
        python3 -m pytest -q -p no:cacheprovider -rs -s
      step bench_vllm_ops_cuda "${limit[@]}" env PYTHONPATH="$from/python-site" python3 \
        "$repo/python/benchmarks/bench_vllm_ops_device.py" --device cuda --json "$out/bench_vllm_ops_cuda.json" "${shapes[@]}"
    fi
  fi
  # Last: memcheck runs the kernels many times slower.
  if [ -n "${KPA_GPU_MEMCHECK:-}" ]; then
    if command -v compute-sanitizer >/dev/null; then
      step memcheck "${limit[@]}" compute-sanitizer --tool memcheck --error-exitcode 1 \
        "$bin/kpa-unit-tests" --gtest_brief=1 --gtest_filter="$KPA_GPU_MEMCHECK"
    else
      log "KPA_GPU_MEMCHECK is set but compute-sanitizer is not on PATH"; status=1
    fi
  fi
  {
    echo "== unit tests"; tail -n 5 "$out/unit_tests.log"
    [ -f "$out/memcheck.log" ] && { echo "== memcheck ($KPA_GPU_MEMCHECK)"; tail -n 3 "$out/memcheck.log"; }
    echo "== parity"; grep -E '^parity|PASSED|FAILED' "$out/parity.log"
    [ -f "$out/c_api.log" ] && { echo "== C ABI (device pointers)"; tail -n 3 "$out/c_api.log"; }
    for name in bench_default bench_long_1x131072 bench_64x2048; do
      echo "== $name"; sed -n '/^machine:/,$p' "$out/$name.log"
    done
    echo "== bytes in flight"; cat "$out/in_flight_probe.log"
    [ -f "$out/sdpa_anchor.log" ] && { echo "== torch SDPA"; cat "$out/sdpa_anchor.log"; }
    [ -f "$out/pytest_cuda.log" ] && { echo "== pytest on CUDA tensors"; grep -E "graph replay|passed|failed" "$out/pytest_cuda.log"; }
    [ -f "$out/bench_vllm_ops_cuda.log" ] && { echo "== kpa.vllm_ops on CUDA tensors"; cat "$out/bench_vllm_ops_cuda.log"; }
  } | tee "$out/summary.txt"
}

case "${1:-}" in
  --bundle)
    sm=${2:?"--bundle SM [FILE]: the GPU's compute capability, e.g. 90"}
    file=${3:-$build/kpa-gpu-bundle.tar.xz}
    mkdir -p "$out"
    build_kpa "$sm"
    stage=$build/bundle
    rm -rf "$stage" && mkdir -p "$stage/bin" "$stage/lib"
    cp "$build/unit_tests/kpa-unit-tests" "$build/unit_tests/kpa-parity-tests" \
      "$build/perf_tests/kpa-bench" "$stage/bin/"
    # The shared libraries the binaries load, except the C library's and the driver's own.
    ldd "$stage"/bin/* | awk '$3 ~ /^\// {print $3}' | sort -u |
      grep -E '/lib(kpa|kokkos[a-z]*|cudart|gomp)\.so' | xargs -I{} cp -L {} "$stage/lib/"
    tar -C "$stage" -cJf "$file" bin lib
    log "bundle for sm_$sm: $file ($(du -h "$file" | cut -f1)); on the GPU machine: scripts/gpu-check.sh --run $file"
    ;;
  --run)
    file=${2:?"--run FILE: a bundle made by --bundle"}
    mkdir -p "$out"
    unpacked=$build/bundle-run
    rm -rf "$unpacked" && mkdir -p "$unpacked" && tar -C "$unpacked" -xJf "$file" || exit 1
    export LD_LIBRARY_PATH="$unpacked/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    run_checks "$unpacked/bin" "$unpacked/bin" "$(ls "$unpacked"/lib/libkpa.so* | head -n1)"
    ;;
  "")
    export KPA_OFFLINE=${KPA_OFFLINE:-1}  # a GPU machine without network: .deps/src or a carried prefix
    mkdir -p "$out"
    gpu_sm=$("$repo/scripts/gpu-sm.sh")
    [ -n "$gpu_sm" ] || { log "no GPU found (nvidia-smi): nothing to build for"; exit 1; }
    build_kpa "$gpu_sm"
    run_checks "$build/unit_tests" "$build/perf_tests" "$build/libkpa.so" "$build"
    ;;
  *) log "unknown option $1 (see the header of $0)"; exit 2 ;;
esac
exit "$status"
