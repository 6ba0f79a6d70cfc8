#!/usr/bin/env bash
# Builds kpa (library, tests, benchmarks, examples) in BUILD_DIR, after installing what it needs
# (scripts/bootstrap-deps.sh). Prints nothing but progress on stderr.
#
#   scripts/build.sh [TARGET...]          host build in BUILD_DIR (default <repo>/build); Kokkos:
#                                         $Kokkos_ROOT if set, else the project-local build of
#                                         KPA_KOKKOS_VERSION (default: scripts/kokkos-version.sh)
#   scripts/build.sh --cuda [TARGET...]   CUDA build in BUILD_DIR (default <repo>/build-cuda)
#                                         against the project-local CUDA Kokkos (KPA_CUDA_ARCH,
#                                         default AMPERE80), compiled with its nvcc_wrapper
#   scripts/build.sh --sanitize           the unit and C ABI tests with AddressSanitizer and
#                                         UndefinedBehaviorSanitizer in BUILD_DIR (default
#                                         <repo>/build-asan), against the host Kokkos
#   scripts/build.sh --self-contained     a host libkpa.so that carries its own Kokkos (a static
#                                         one) and exports the C ABI only, with its C ABI tests, in
#                                         BUILD_DIR (default <repo>/build-self-contained): the
#                                         host library of the CUDA PyTorch package
#   Kokkos_ROOT=/opt/kokkos-cuda scripts/build.sh
#   KPA_KOKKOS_VERSION=4.6.01 scripts/build.sh   against the project-local Kokkos of that version
#                                         (scripts/bootstrap-deps.sh; exit status 3: no sources)
#   KPA_TEST_SPACES=Kokkos::Serial scripts/build.sh   the typed tests on those execution spaces (a
#                                         CMake list; default: every one Kokkos enables, OpenMP
#                                         with --sanitize, Cuda with --cuda)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# The project-local Kokkos: KPA_KOKKOS_VERSION, else the newest whose sources are here, the one
# every script builds against by default, so that they share the build folders.
[ -n "${Kokkos_ROOT:-}" ] || export KPA_KOKKOS_VERSION=${KPA_KOKKOS_VERSION:-$("$repo/scripts/kokkos-version.sh")}
cuda=0
sanitize=0
self_contained=0
case "${1:-}" in
  --cuda) cuda=1; shift ;;
  --sanitize) sanitize=1; shift ;;
  --self-contained) self_contained=1; shift ;;
esac
jobs=${KPA_BUILD_JOBS:-$(nproc)}
extra=()
if [ "$sanitize" = 1 ]; then
  build=${BUILD_DIR:-$repo/build-asan}
  kokkos=$("$repo/scripts/bootstrap-deps.sh")
  # -O1, the sanitizers' usual level (the UBSan checks left out: KPA_UBSAN_LEFT_OUT, CMakeLists.txt).
  extra+=(-DKPA_SANITIZE=address,undefined -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG"
          -DKPA_ENABLE_BENCHMARKS=OFF -DKPA_ENABLE_EXAMPLES=OFF)
  # One host space for the typed tests: the host build runs them on every space.
  extra+=(-DKPA_TEST_SPACES="${KPA_TEST_SPACES:-Kokkos::OpenMP}")
  [ "$#" -gt 0 ] || set -- kpa-unit-tests kpa-c-api-test
elif [ "$self_contained" = 1 ]; then
  build=${BUILD_DIR:-$repo/build-self-contained}
  kokkos=$("$repo/scripts/bootstrap-deps.sh" --static)
  extra+=(-DKPA_SELF_CONTAINED=ON -DKPA_ENABLE_BENCHMARKS=OFF -DKPA_ENABLE_EXAMPLES=OFF -DKPA_SOFTWARE_MODELS=OFF)
elif [ "$cuda" = 1 ]; then
  build=${BUILD_DIR:-$repo/build-cuda}
  [ -x /usr/local/cuda/bin/nvcc ] && export PATH="$PATH:/usr/local/cuda/bin"
  kokkos=$("$repo/scripts/bootstrap-deps.sh" --cuda)
  arch=${KPA_CUDA_ARCH:-AMPERE80}
  # Kokkos' nvcc_wrapper defaults to sm_35, which CUDA 13 rejects: name the architecture.
  extra+=(-DCMAKE_CXX_COMPILER="$kokkos/bin/nvcc_wrapper" -DCMAKE_CXX_FLAGS="-arch=sm_${arch//[!0-9]/}")
  # Typed tests on the GPU only: the host build covers the host back ends.
  extra+=(-DKPA_TEST_SPACES="${KPA_TEST_SPACES:-Kokkos::Cuda}")
  # The build lists the tests by running their binaries (without starting a GPU).
  stub=$("$repo/scripts/cuda-driver-stub.sh" "$build/cuda-driver-stub")
  [ -z "$stub" ] || export LD_LIBRARY_PATH="$stub${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
elif [ -n "${Kokkos_ROOT:-}" ]; then
  build=${BUILD_DIR:-$repo/build}
  kokkos=$Kokkos_ROOT
  KPA_SKIP_KOKKOS=1 "$repo/scripts/bootstrap-deps.sh" >/dev/null
else
  build=${BUILD_DIR:-$repo/build}
  kokkos=$("$repo/scripts/bootstrap-deps.sh")
fi
[ "$sanitize$cuda" != 00 ] || [ -z "${KPA_TEST_SPACES:-}" ] || extra+=(-DKPA_TEST_SPACES="$KPA_TEST_SPACES")

# A build folder configured against another Kokkos starts afresh: CMake keeps the Kokkos it found.
if [ -f "$build/CMakeCache.txt" ] && ! grep -q "^Kokkos_DIR:PATH=$kokkos/" "$build/CMakeCache.txt"; then
  rm -rf "$build/CMakeCache.txt" "$build/CMakeFiles"
fi
cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release -DKokkos_ROOT="$kokkos" \
  -DKokkosKernels_ROOT="$kokkos" -DCMAKE_INSTALL_PREFIX="$build/install" "${extra[@]}" >&2
targets=()
for target in "$@"; do targets+=(--target "$target"); done
cmake --build "$build" -j "$jobs" "${targets[@]}" >&2
