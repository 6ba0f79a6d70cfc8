#!/usr/bin/env bash
# The test command: installs what is missing, builds everything and runs the whole suite, against
# the newest Kokkos kpa is tested with and, in the sanitizer build, the fuzz target and the package
# built from source, against the oldest:
#   1. Host build (Serial + OpenMP, <repo>/build) against Kokkos and Kokkos Kernels 4.6.01, from
#      the release tarballs in KPA_KOKKOS_SOURCES or <repo>/../shared/deps (see
#      scripts/bootstrap-deps.sh), or against 3.4.1, saying so, where neither folder has them: unit
#      tests (their typed tests on Serial; on OpenMP in step 4), on the host path (the best inner loops of this CPU and every lesser
#      set: portable, AVX2, AVX-512 without VBMI, VBMI; and, for bf16 and fp8 caches on CPUs without
#      AMX, the AMX loops on the software model of the tiles) and the device kernel path; every
#      header on its own (C++17) and all of them as C++20; the C ABI from C and from Python (on
#      OpenMP, as the host-device parity tests); a kpa-bench smoke run; the installed package used
#      by a separate project and run from its prefix.
#   2. The PyTorch operators (scripts/python.sh --test): the package in python/ pip-installed
#      against the host build on torch 2.13 from the Python package index (<repo>/.deps/torch-2.13.0,
#      <repo>/build/python-venv-torch2: opcheck, fake tensors, torch.compile), then on the
#      distribution's torch 1.13 with the package building libkpa from the tree itself against
#      Kokkos 3.4.1 (<repo>/build/python-from-source); each time the pytest suite.
#   3. kpa inside vLLM (scripts/vllm.sh --test): vLLM's CPU build 0.32.0 from the Python package
#      index (<repo>/.deps/vllm-0.32.0), the package's wheel from step 2 installed there with its
#      plugin, and greedy generation with vLLM's own CPU attention backend and with kpa's compared
#      end to end. The Python environments of steps 2 and 3 install while step 1 compiles (output
#      in <repo>/build/python-envs.log).
#   4. Sanitizer build against Kokkos 3.4.1, the oldest kpa supports (<repo>/build-asan): the unit
#      tests (their typed tests on OpenMP, whose threads share the memory the sanitizers watch) and
#      the C ABI tests again, built with AddressSanitizer and UndefinedBehaviorSanitizer; any
#      report fails the run. It compiles while steps 2 and 3 run (they leave a core mostly idle),
#      its output in <repo>/build/sanitizer-build.log, shown if it fails.
#   5. The libFuzzer target over the C ABI (scripts/fuzz.sh, <repo>/build-fuzz, Kokkos 3.4.1, the
#      portable loops): a bounded run from the committed seed corpus (KPA_FUZZ_SECONDS, default 60).
#   6. Where nvcc is found (unless KPA_SKIP_CUDA=1), CUDA build (Kokkos Serial + OpenMP + CUDA for
#      KPA_CUDA_ARCH, default AMPERE80, <repo>/build-cuda) against the host build's Kokkos version
#      (each with its CUDA 13 patch, scripts/patches/): the library and the parity tests compiled
#      and linked (the unit tests, kpa-bench and each header alone are compiled for CUDA where a GPU
#      runs them, below, and by scripts/gpu-check.sh --bundle), the parity-test binary and libkpa.so
#      checked for machine code of that architecture (and for no kernel launched through constant
#      memory), the installed package built by a separate project; the self-contained host libkpa
#      (<repo>/build-self-contained: its own static Kokkos, the C ABI alone exported; it compiles
#      beside the CUDA build, its output in <repo>/build/self-contained-build.log), its C ABI tests,
#      alone and with the host build's libkpa started beside it in one process; the PyTorch
#      operators' CUDA extension built against torch 2.13, the CUDA build and that host library
#      (<repo>/build-cuda/python-venv-torch2), its libkpa checked the same way, and the pytest suite
#      on CPU tensors with it, which must pass on a machine without a GPU; then the machine-code
#      gates of the device kernel for sm_80 and sm_90 (scripts/device-gates.sh: NVIDIA's cuobjdump
#      from the Python package index). On a machine with an NVIDIA GPU of the build's major version
#      the CUDA build's tests and the pytest suite on CUDA tensors run too (other GPUs:
#      scripts/gpu-check.sh).
# A second run reuses the dependency prefixes and the build folders.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
log() { printf '[kpa test] %s\n' "$*" >&2; }
# OMP_PROC_BIND=false: tests share the cores with each other; two threads exercise team sizes > 1.
run_ctest() { (cd "$1" && OMP_NUM_THREADS=2 OMP_PROC_BIND=false ctest -j "$(nproc)" --output-on-failure "${@:2}"); }

# The newest Kokkos whose sources are here, as every script's default: every step below takes it
# unless it names 3.4.1.
newest=$("$repo/scripts/kokkos-version.sh")
export KPA_KOKKOS_VERSION=$newest

build=${BUILD_DIR:-$repo/build}
mkdir -p "$build"
# The system packages the Python steps need (apt, one install at a time), then their Python
# environments (torch 2.13 and vLLM's CPU build: downloads, mostly) while the host build compiles.
"$repo/scripts/bootstrap-deps.sh" --python
envs_log=$build/python-envs.log
log "torch 2.13's and vLLM's Python environments installing meanwhile (output: $envs_log)"
(BUILD_DIR=$build "$repo/scripts/vllm.sh" --env-only >"$envs_log" 2>&1) &
envs_pid=$!

log "host build against Kokkos $newest in $build"
# Each typed test runs once per host back end: on Serial here, on OpenMP in the sanitizer build.
KPA_TEST_SPACES=Kokkos::Serial BUILD_DIR=$build "$repo/scripts/build.sh"
run_ctest "$build"
if ! wait "$envs_pid"; then
  tail -n 50 "$envs_log" >&2
  log "the Python environments failed to install (all of their output: $envs_log)"
  exit 1
fi

asan_build=${ASAN_BUILD_DIR:-$repo/build-asan}
asan_log=$build/sanitizer-build.log
# Kokkos 3.4.1 first, here: the sanitizer build and the package built from source both take it.
KPA_KOKKOS_VERSION=3.4.1 "$repo/scripts/bootstrap-deps.sh" >/dev/null
log "sanitizer build (address, undefined) against Kokkos 3.4.1 in $asan_build, compiling meanwhile (output: $asan_log)"
(BUILD_DIR=$asan_build KPA_KOKKOS_VERSION=3.4.1 "$repo/scripts/build.sh" --sanitize >"$asan_log" 2>&1) &
asan_pid=$!

log "PyTorch operators (python/): pip install against the host build, then pytest (torch 2.13)"
BUILD_DIR=$build "$repo/scripts/python.sh" --torch2 --test
log "PyTorch operators again on torch 1.13, the package building libkpa itself against Kokkos 3.4.1"
BUILD_DIR=$build/python-from-source KPA_KOKKOS_VERSION=3.4.1 "$repo/scripts/python.sh" --test

log "kpa as vLLM's attention backend: vLLM's CPU build, end to end"
KPA_VLLM_WHEEL=$(echo "$build"/python-venv-torch2-wheel/kpa-*.whl) BUILD_DIR=$build "$repo/scripts/vllm.sh" --test

log "sanitizer build: waiting for it to finish compiling, then its tests"
if ! wait "$asan_pid"; then
  tail -n 100 "$asan_log" >&2
  log "the sanitizer build failed (all of its output: $asan_log)"
  exit 1
fi
run_ctest "$asan_build"

log "fuzzing the C ABI (${KPA_FUZZ_SECONDS:-60} s)"
KPA_KOKKOS_VERSION=3.4.1 "$repo/scripts/fuzz.sh"

[ -x /usr/local/cuda/bin/nvcc ] && export PATH="$PATH:/usr/local/cuda/bin"
if [ "${KPA_SKIP_CUDA:-0}" = 1 ] || ! command -v nvcc >/dev/null; then
  log "no nvcc (or KPA_SKIP_CUDA=1): CUDA build skipped"
  exit 0
fi
cuda_build=${CUDA_BUILD_DIR:-$repo/build-cuda}
arch=${KPA_CUDA_ARCH:-AMPERE80}
log "CUDA build ($arch, Kokkos $KPA_KOKKOS_VERSION) in $cuda_build"
"$repo/scripts/bootstrap-deps.sh" --cuda >/dev/null
host_build=$repo/build-self-contained
host_log=$build/self-contained-build.log
# nvcc compiles kpa in few, long translation units: the host library compiles beside them.
log "the CUDA package's host library: a libkpa with its own Kokkos, in $host_build, compiling meanwhile (output: $host_log)"
(BUILD_DIR=$host_build "$repo/scripts/build.sh" --self-contained >"$host_log" 2>&1) &
host_pid=$!
# The library (every kernel of the C ABI) and the parity tests (the device path against the host
# path); the other programs a GPU runs are built below where there is one, and by
# scripts/gpu-check.sh --bundle (the host build compiles every header alone, and all as C++20).
BUILD_DIR=$cuda_build "$repo/scripts/build.sh" --cuda kpa kpa-parity-tests

log "the self-contained libkpa: waiting for it to finish compiling, then its C ABI tests"
if ! wait "$host_pid"; then
  tail -n 50 "$host_log" >&2
  log "the self-contained build failed (all of its output: $host_log)"
  exit 1
fi
run_ctest "$host_build"
log "the self-contained libkpa and the host build's libkpa (its Kokkos a shared library) started in one process"
OMP_NUM_THREADS=2 OMP_PROC_BIND=false /usr/bin/python3 "$repo/unit_tests/test_c_api.py" "$host_build/libkpa.so" \
  --beside "$build/libkpa.so"
log "PyTorch operators' CUDA extension: built against torch 2.13, the CUDA build and the host library; pytest on CPU tensors"
BUILD_DIR=$cuda_build "$repo/scripts/python.sh" --torch2 --test
cuda_venv=$cuda_build/python-venv-torch2
package=$("$cuda_venv/bin/python" -c 'import kpa, os; assert kpa.built_for_cuda, "not a CUDA extension"; print(os.path.dirname(kpa.__file__))')
objdump -p "$package"/_torch_ops*.so | grep -q 'NEEDED.*libc10_cuda' ||
  { log "the extension does not link torch's CUDA library"; exit 1; }
python3 "$repo/scripts/check_device_code.py" --arch "${arch//[!0-9]/}" --no-constant-memory-launch \
  "$cuda_build/unit_tests/kpa-parity-tests" "$(readlink -f "$cuda_build/libkpa.so")" "$package/libkpa.so"
log "machine-code gates of the device kernel (sm_80, sm_90)"
CUDA_BUILD_DIR=$cuda_build "$repo/scripts/device-gates.sh" "$(readlink -f "$cuda_build/libkpa.so")"
gpu_sm=$("$repo/scripts/gpu-sm.sh")
build_sm=${arch//[!0-9]/}
if [ -n "$gpu_sm" ] && [ "${gpu_sm:0:1}" = "${build_sm:0:1}" ]; then
  log "GPU found: running the CUDA build's tests and the pytest suite on CUDA tensors"
  BUILD_DIR=$cuda_build "$repo/scripts/build.sh" --cuda kpa-unit-tests kpa-bench kpa-decode kpa-header-checks
  (cd "$cuda_build" && OMP_NUM_THREADS=2 OMP_PROC_BIND=false ctest -j 2 --output-on-failure)
  (cd "$repo/python/tests" && KPA_TEST_DEVICE=cuda OMP_NUM_THREADS=2 OMP_PROC_BIND=false \
    "$cuda_venv/bin/python" -m pytest -q -p no:cacheprovider)
elif [ -n "$gpu_sm" ]; then
  # Kokkos aborts on a GPU of another major version than its build's (see bootstrap-deps.sh).
  log "GPU sm_$gpu_sm found, but this build is for sm_$build_sm: its tests run through scripts/gpu-check.sh"
  (cd "$cuda_build" && KPA_CONSUMER_BUILD_ONLY=1 ctest -R kpa.installed_package_consumer --output-on-failure)
else
  log "no GPU here: the CUDA build is compiled, linked and checked; its tests need a GPU (scripts/gpu-check.sh)"
  (cd "$cuda_build" && KPA_CONSUMER_BUILD_ONLY=1 ctest -R kpa.installed_package_consumer --output-on-failure)
fi
