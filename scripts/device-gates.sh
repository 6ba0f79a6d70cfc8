#!/usr/bin/env bash
# The machine-code gates of the device kernel (no GPU needed; nvcc is):
#   scripts/device-gates.sh [LIBKPA]
# installs NVIDIA's cuobjdump and nvdisasm from the Python package index into
# <CUDA_BUILD_DIR>/device-tools (once), compiles the kernel's instantiations
# (scripts/device_gate_kernels.cu) for sm_80 and sm_90 with the CUDA Kokkos prefix, and runs
# scripts/device_gates.py on them and on LIBKPA (a CUDA build's libkpa.so, read as sm_80). With
# LIBKPA it also builds scripts/device_gate_plans.cu against it, so the bytes-in-flight model
# (--model) takes its plans from the launch planner. The table and the model go to
# <CUDA_BUILD_DIR>/device-gates/gates.md; the exit status is the gates'.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
log() { printf '[kpa device-gates] %s\n' "$*" >&2; }
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="$PATH:/usr/local/cuda/bin"
cuda_build=${CUDA_BUILD_DIR:-$repo/build-cuda}
out=$cuda_build/device-gates
tools_env=$cuda_build/device-tools
mkdir -p "$out"

if [ ! -x "$tools_env/bin/python" ] || ! "$tools_env/bin/python" -c 'import nvidia' 2>/dev/null; then
  log "installing nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm into $tools_env"
  python3 -m venv "$tools_env"
  "$tools_env/bin/pip" install -q --disable-pip-version-check 'nvidia-cuda-cuobjdump==13.*' 'nvidia-cuda-nvdisasm==13.*'
fi
tools=$(dirname "$(find "$tools_env" -path '*/nvidia/*/bin/cuobjdump' | head -n1)")
[ -x "$tools/cuobjdump" ] || { log "cuobjdump did not install"; exit 1; }

kokkos=$("$repo/scripts/bootstrap-deps.sh" --cuda)
binaries=()
for sm in 80 90; do
  log "compiling the device kernel's instantiations for sm_$sm"
  nvcc -x cu -std=c++17 -O3 -arch=sm_$sm --cubin -expt-extended-lambda \
    -I "$repo/include" -I "$cuda_build/include" -isystem "$kokkos/include" \
    "$repo/scripts/device_gate_kernels.cu" -o "$out/device_kernels.sm_$sm.cubin"
  binaries+=("sm_$sm=$out/device_kernels.sm_$sm.cubin")
done
model=()
if [ -n "${1:-}" ]; then
  binaries+=("sm_80=$1")
  log "building the launch planner's query for the model against $1"
  libdir=$(dirname "$1")  # holds libkpa.so, as a build folder does
  # The query plans only; Kokkos 4 still links the driver's library, which this machine may lack.
  stub=$("$repo/scripts/cuda-driver-stub.sh" "$cuda_build/cuda-driver-stub")
  [ -z "$stub" ] || export LD_LIBRARY_PATH="$stub${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # The CUDA Kokkos prefix also enables OpenMP: its headers need the compiler's OpenMP.
  nvcc -std=c++17 -O1 -arch=sm_80 -expt-extended-lambda -Xcompiler -fopenmp \
    -I "$repo/include" -I "$cuda_build/include" -isystem "$kokkos/include" "$repo/scripts/device_gate_plans.cu" \
    -o "$out/device_gate_plans" -L "$libdir" -lkpa -L "$kokkos/lib" -lkokkoscore \
    -Xlinker -rpath -Xlinker "$libdir" -Xlinker -rpath -Xlinker "$kokkos/lib" ${stub:+-Xlinker -rpath-link -Xlinker "$stub"}
  model=(--model "$out/device_gate_plans")
fi
python3 "$repo/scripts/device_gates.py" --tools "$tools" "${model[@]}" --markdown "$out/gates.md" "${binaries[@]}"
