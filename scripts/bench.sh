#!/usr/bin/env bash
# The main job: builds kpa (installing what is missing) and runs kpa-bench, which measures the
# machine's read bandwidth and FMA throughput and then each workload against them and against
# the naive and dense baselines. Arguments go to kpa-bench (see scripts/bench.sh --help).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$repo/build}
BUILD_DIR=$build "$repo/scripts/build.sh" kpa-bench
OMP_PROC_BIND=${OMP_PROC_BIND:-spread} OMP_PLACES=${OMP_PLACES:-threads} "$build/perf_tests/kpa-bench" "$@"
