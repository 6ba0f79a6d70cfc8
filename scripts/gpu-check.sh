#!/usr/bin/env bash
# The GPU check: kpa on a machine with an NVIDIA GPU, nvcc, CMake and several cores but no
# network, in one command (about 8 minutes on 16 cores).
#
#   scripts/gpu-check.sh --prepare   on a machine with the package archives: builds the CUDA
#                                    Kokkos prefix (.deps/install-cuda, about 6 MB) and copies the
#                                    GoogleTest sources (.deps/googletest) the GPU machine may lack
#   scripts/gpu-check.sh             on the GPU machine, given the sources and those two folders:
#     1. builds kpa for CUDA (machine code for the GPU it finds, besides the prefix's architecture)
#        with GoogleTest from the system or from .deps/googletest;
#     2. runs the unit tests on Kokkos::Cuda;
#     3. runs the parity tests (the same inputs through OpenMP and CUDA, every output within the
#        per-dtype tolerance; kpa-bench's default suite and the head-size x block-size x dtype grid);
#     4. runs kpa-bench on the GPU: the default suite, 1 x 131072 and 64 x 2048 tokens (32/8 heads,
#        head 128, f16), against the bandwidth a Kokkos probe measures on the same device;
#     5. runs the same shapes through PyTorch's scaled_dot_product_attention (scripts/sdpa_anchor.py),
#        where python3 has torch with CUDA.
# Logs and JSON go to KPA_GPU_CHECK_OUT (default <repo>/build-gpu/results); the exit status is
# nonzero if a build, test or parity step failed.
set -uo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
log() { printf '[kpa gpu-check %s] %s\n' "$(date +%T)" "$*" >&2; }

if [ "${1:-}" = "--prepare" ]; then
  set -e
  "$repo/scripts/bootstrap-deps.sh" --cuda >/dev/null
  rm -rf "$repo/.deps/googletest"
  cp -r /usr/src/googletest "$repo/.deps/googletest"
  log "prepared: carry .deps/install-cuda and .deps/googletest with the sources"
  exit 0
fi

[ -x /usr/local/cuda/bin/nvcc ] && export PATH="$PATH:/usr/local/cuda/bin"
build=${KPA_GPU_BUILD_DIR:-$repo/build-gpu}
out=${KPA_GPU_CHECK_OUT:-$build/results}
kokkos=${Kokkos_ROOT:-$repo/.deps/install-cuda}
jobs=$(nproc)
mkdir -p "$out"
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

command -v nvcc >/dev/null || { log "nvcc not found"; exit 1; }
nvidia-smi -L >&2 || { log "no NVIDIA GPU visible"; exit 1; }
if [ ! -f "$kokkos/.kpa-deps-complete" ]; then
  log "no CUDA Kokkos prefix at $kokkos: building it from .deps/src (KPA_OFFLINE)"
  kokkos=$(KPA_OFFLINE=1 "$repo/scripts/bootstrap-deps.sh" --cuda) || exit 1
fi
prefix_sm=$(awk '{print $2}' "$kokkos/.kpa-deps-complete"); prefix_sm=${prefix_sm//[!0-9]/}
gpu_sm=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n1 | tr -d '. ')
log "GPU compute capability sm_$gpu_sm, Kokkos prefix for sm_$prefix_sm"
if [ -n "$gpu_sm" ] && [ "$gpu_sm" != "$prefix_sm" ]; then
  # Machine code for this GPU too (Kokkos' nvcc_wrapper takes one -arch; nvcc reads this variable).
  export NVCC_APPEND_FLAGS="${NVCC_APPEND_FLAGS:-} -gencode=arch=compute_$gpu_sm,code=sm_$gpu_sm"
fi

gtest_args=()
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

log "configuring $build"
cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release -DKokkos_ROOT="$kokkos" \
  -DCMAKE_CXX_COMPILER="$kokkos/bin/nvcc_wrapper" -DCMAKE_CXX_FLAGS="-arch=sm_$prefix_sm" \
  -DKPA_TEST_SPACES=Kokkos::Cuda -DKPA_ENABLE_EXAMPLES=OFF "${gtest_args[@]}" > "$out/configure.log" 2>&1 ||
  { log "configure failed"; tail -n 30 "$out/configure.log"; exit 1; }
step build cmake --build "$build" -j "$jobs" --target kpa kpa-unit-tests kpa-parity-tests kpa-bench
[ "$status" = 0 ] || exit 1

export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8} OMP_PROC_BIND=${OMP_PROC_BIND:-false}
step unit_tests "$build/unit_tests/kpa-unit-tests" --gtest_brief=1
step parity "$build/unit_tests/kpa-parity-tests"
bench="$build/perf_tests/kpa-bench"
step bench_default "$bench" --check --json "$out/bench_default.json"
step bench_long_1x131072 "$bench" --batch-size 1 --seq-len 131072 --num-query-heads 32 --num-kv-heads 8 \
  --head-size 128 --dtype half --check --json "$out/bench_long_1x131072.json"
step bench_64x2048 "$bench" --batch-size 64 --seq-len 2048 --num-query-heads 32 --num-kv-heads 8 \
  --head-size 128 --dtype half --check --json "$out/bench_64x2048.json"
if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  step sdpa_anchor python3 "$repo/scripts/sdpa_anchor.py" --json "$out/sdpa_anchor.json" \
    llama_32x4096:32:4096:32:8:128 long_context_1x100k:1:100000:24:4:256 single_tile_64x512:64:512:32:8:128 \
    long_1x131072:1:131072:32:8:128 batch_64x2048:64:2048:32:8:128
else
  log "python3 has no torch with CUDA: SDPA anchor skipped"
fi

{
  echo "== unit tests"; tail -n 5 "$out/unit_tests.log"
  echo "== parity"; grep -E '^parity|PASSED|FAILED' "$out/parity.log"
  for name in bench_default bench_long_1x131072 bench_64x2048; do
    echo "== $name"; sed -n '/^machine:/,$p' "$out/$name.log"
  done
  [ -f "$out/sdpa_anchor.log" ] && { echo "== torch SDPA"; cat "$out/sdpa_anchor.log"; }
} | tee "$out/summary.txt"
exit "$status"
