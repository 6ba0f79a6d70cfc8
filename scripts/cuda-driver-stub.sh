#!/usr/bin/env bash
# Kokkos 4 links CUDA builds against the driver's libcuda.so.1, so on a machine without the NVIDIA
# driver their programs cannot even start: not to list their tests (GoogleTest, at build time),
# nor to ask the launch planner (scripts/device-gates.sh). Where no libcuda.so.1 is installed,
# this makes DIR/libcuda.so.1 a link to the CUDA Toolkit's stub of it (every call answers "stub
# library"; nothing that lists or plans calls it) and prints DIR for LD_LIBRARY_PATH; it prints
# nothing where the driver is installed.
#   stub=$(scripts/cuda-driver-stub.sh DIR) && export LD_LIBRARY_PATH=$stub${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
set -euo pipefail
dir=${1:?"usage: $0 DIR"}
case "$(ldconfig -p)" in *"libcuda.so.1 "*) exit 0 ;; esac
cuda=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")}
stub=$cuda/lib64/stubs/libcuda.so
[ -f "$stub" ] || { printf '[kpa] no libcuda.so.1 here and no CUDA Toolkit stub at %s\n' "$stub" >&2; exit 1; }
mkdir -p "$dir"
ln -sf "$stub" "$dir/libcuda.so.1"
echo "$dir"
