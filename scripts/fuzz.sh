#!/usr/bin/env bash
# Builds the libFuzzer target over the C ABI (fuzz/fuzz_c_api.cpp: clang, AddressSanitizer and
# UndefinedBehaviorSanitizer, the portable loops, against a Serial Kokkos built with clang) and
# runs it, starting from the committed seed corpus (fuzz/seed_corpus.b64: one base64 input a line;
# new inputs go to a scratch folder).
#
#   scripts/fuzz.sh                    a bounded run: 60 s (KPA_FUZZ_SECONDS)
#   scripts/fuzz.sh -runs=1000000      any libFuzzer options instead (e.g. a long run)
#
# A finding stops the run with a nonzero status and the input in <build>/crash-*.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
log() { printf '[kpa fuzz] %s\n' "$*" >&2; }
build=${FUZZ_BUILD_DIR:-$repo/build-fuzz}
kokkos=$("$repo/scripts/bootstrap-deps.sh" --clang)
# -O1, the sanitizers' usual level (the instrumented instruction-set loops compile faster than at -O3).
cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" \
  -DCMAKE_CXX_COMPILER=clang++ -DKokkos_ROOT="$kokkos" -DKPA_ENABLE_FUZZER=ON -DKPA_ENABLE_TESTS=OFF \
  -DKPA_ENABLE_BENCHMARKS=OFF -DKPA_ENABLE_EXAMPLES=OFF >&2
cmake --build "$build" -j "${KPA_BUILD_JOBS:-$(nproc)}" --target kpa-fuzz-c-api >&2
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir "$scratch/seeds" "$scratch/new"
n=0
while read -r line; do
  printf '%s' "$line" | base64 -d > "$scratch/seeds/$n"
  n=$((n + 1))
done < "$repo/fuzz/seed_corpus.b64"
options=("$@")
[ "${#options[@]}" -gt 0 ] || options=(-max_total_time="${KPA_FUZZ_SECONDS:-60}")
log "running kpa-fuzz-c-api ${options[*]}"
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1} \
  "$build/fuzz/kpa-fuzz-c-api" -artifact_prefix="$build/" -print_final_stats=1 "${options[@]}" \
  "$scratch/new" "$scratch/seeds"
