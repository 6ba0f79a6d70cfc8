#!/usr/bin/env bash
# Builds kpa (library, tests, benchmarks, examples) in BUILD_DIR (default <repo>/build), after
# installing what it needs (scripts/bootstrap-deps.sh). Prints nothing but progress on stderr.
#
#   scripts/build.sh [TARGET...]   all targets by default; Kokkos: $Kokkos_ROOT if set, else the
#                                  project-local build
#   Kokkos_ROOT=/opt/kokkos-cuda scripts/build.sh
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$repo/build}

if [ -n "${Kokkos_ROOT:-}" ]; then
  kokkos=$Kokkos_ROOT
  KPA_SKIP_KOKKOS=1 "$repo/scripts/bootstrap-deps.sh" >/dev/null
else
  kokkos=$("$repo/scripts/bootstrap-deps.sh")
fi

cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release -DKokkos_ROOT="$kokkos" \
  -DKokkosKernels_ROOT="$kokkos" -DCMAKE_INSTALL_PREFIX="$build/install" >&2
targets=()
for target in "$@"; do targets+=(--target "$target"); done
cmake --build "$build" -j "$(nproc)" "${targets[@]}" >&2
