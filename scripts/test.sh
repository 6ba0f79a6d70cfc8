#!/usr/bin/env bash
# The test command: installs what is missing, builds everything, and runs the whole suite
# (unit tests on every enabled back end, header checks, and the installed-package consumer).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$repo/build}
BUILD_DIR=$build "$repo/scripts/build.sh"
cd "$build"
# OMP_PROC_BIND=false: tests share the cores with each other; two threads exercise team sizes > 1.
OMP_NUM_THREADS=2 OMP_PROC_BIND=false ctest -j "$(nproc)" --output-on-failure
