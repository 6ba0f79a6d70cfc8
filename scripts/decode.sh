#!/usr/bin/env bash
# The main job: builds kpa (installing what is missing) and decodes one step of a batch with
# the example program, printing the launch plan, part of the result and the time per call.
#
#   scripts/decode.sh [--batch N] [--seq-len L] [--heads H] [--kv-heads K] [--head-size D]
#                     [--block-size B] [--iters I]
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$repo/build}
BUILD_DIR=$build "$repo/scripts/build.sh"
OMP_PROC_BIND=${OMP_PROC_BIND:-spread} OMP_PLACES=${OMP_PLACES:-threads} \
  "$build/examples/decode/kpa-decode" "$@"
