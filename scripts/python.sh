#!/usr/bin/env bash
# kpa's PyTorch operators (python/): pip-installs the package into a virtual environment against
# a torch, and with --test runs its pytest suite there.
#
#   scripts/python.sh [--torch2] [--test] [--env-only]
#
# The torch: by default the distribution's (torch 1.13, with pytest and venv; installed by
# scripts/bootstrap-deps.sh --python). With --torch2, torch KPA_TORCH2_VERSION (default 2.13.0, a
# CUDA 13.0 build that also runs CPU tensors) from the Python package index, installed once into
# <repo>/.deps/torch-VERSION with pytest and numpy; each package environment reuses it.
#
# The kpa library the package wraps: KPA_PREFIX if set (an installed kpa); else the build in
# BUILD_DIR (default <repo>/build) when it has one, installed into BUILD_DIR/python-prefix; else
# the package's setup.py builds it from this tree. A CUDA build of kpa (BUILD_DIR=<repo>/build-cuda)
# gives the CUDA extension: it needs --torch2 and the CUDA Toolkit (CUDA_HOME, default
# /usr/local/cuda), and runs CPU tensors on a host libkpa that carries its own Kokkos:
# KPA_HOST_PREFIX if set, else scripts/build.sh --self-contained's, installed into
# <repo>/build-self-contained/python-prefix. The environment: KPA_PYTHON_VENV (default
# BUILD_DIR/python-venv, or BUILD_DIR/python-venv-torch2); use it with
# `$KPA_PYTHON_VENV/bin/python -c "import kpa"`. The package's wheel: KPA_PYTHON_VENV-wheel/.
# --env-only makes the torch environment and stops there.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
log() { printf '[kpa python] %s\n' "$*" >&2; }
build=$(realpath -m "${BUILD_DIR:-$repo/build}")  # pip builds in python/: an absolute path
torch2=0 test=0 env_only=0
for arg in "$@"; do
  case "$arg" in
    --torch2) torch2=1 ;;
    --test) test=1 ;;
    --env-only) env_only=1 ;;
    *) log "unknown option $arg (see the header of $0)"; exit 2 ;;
  esac
done
# The distribution's interpreter: its torch is built for it (python3 on PATH may be another one).
python=/usr/bin/python3

"$repo/scripts/bootstrap-deps.sh" --python
if [ "$torch2" = 1 ]; then
  version=${KPA_TORCH2_VERSION:-2.13.0}
  base=$repo/.deps/torch-$version
  if [ ! -f "$base/.complete" ]; then
    log "installing torch $version, pytest and numpy from the Python package index into $base"
    rm -rf "$base"
    "$python" -m venv "$base"
    "$base/bin/python" -m pip install --quiet "torch==$version" numpy pytest setuptools wheel ninja
    touch "$base/.complete"
  fi
  venv=${KPA_PYTHON_VENV:-$build/python-venv-torch2}
  if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
    # The base environment's packages (torch, pytest) are visible here; kpa is installed here only.
    "$venv/bin/python" -c 'import site, sys; open(site.getsitepackages()[0] + "/kpa-torch-base.pth", "w").write(sys.argv[1] + "\n")' \
      "$("$base/bin/python" -c 'import site; print(site.getsitepackages()[0])')"
  fi
  [ -n "${CUDA_HOME:-}" ] || [ ! -d /usr/local/cuda ] || export CUDA_HOME=/usr/local/cuda
else
  venv=${KPA_PYTHON_VENV:-$build/python-venv}
  [ -x "$venv/bin/python" ] || "$python" -m venv --system-site-packages "$venv"
fi

[ "$env_only" = 0 ] || exit 0

if [ -z "${KPA_PREFIX:-}" ]; then
  if [ -e "$build/libkpa.so" ]; then
    export KPA_PREFIX=$build/python-prefix
    cmake --install "$build" --prefix "$KPA_PREFIX" >/dev/null
  else
    Kokkos_ROOT=${Kokkos_ROOT:-$("$repo/scripts/bootstrap-deps.sh")}
    export Kokkos_ROOT
  fi
fi
cuda_kpa() {  # whether the installed kpa in $1 is a CUDA build (its libkpa.so needs the CUDA runtime)
  case "$(objdump -p "$1"/lib*/libkpa.so 2>/dev/null)" in *"NEEDED"*"libcudart"*) return 0 ;; *) return 1 ;; esac
}
if [ -z "${KPA_HOST_PREFIX:-}" ] && [ -n "${KPA_PREFIX:-}" ] && cuda_kpa "$KPA_PREFIX"; then
  host_build=$repo/build-self-contained
  log "the CUDA package's host library: scripts/build.sh --self-contained in $host_build"
  BUILD_DIR=$host_build "$repo/scripts/build.sh" --self-contained kpa
  export KPA_HOST_PREFIX=$host_build/python-prefix
  cmake --install "$host_build" --prefix "$KPA_HOST_PREFIX" >/dev/null
fi
log "pip install python/ into $venv (torch $("$venv/bin/python" -c 'import torch; print(torch.__version__)'), kpa from ${KPA_PREFIX:-a build of this tree}${KPA_HOST_PREFIX:+, host library from $KPA_HOST_PREFIX})"
# --no-build-isolation: build against the torch the package will run with; --no-index: nothing
# is fetched, every dependency is in the environment already. The wheel stays beside the
# environment (scripts/vllm.sh installs it into vLLM's, which shares the torch 2.13 one).
wheels=$venv-wheel
rm -rf "$wheels"
"$venv/bin/python" -m pip wheel --quiet --no-build-isolation --no-index --no-deps -w "$wheels" "$repo/python"
"$venv/bin/python" -m pip install --quiet --no-index --no-deps --force-reinstall "$wheels"/kpa-*.whl

if [ "$test" = 1 ]; then
  log "pytest python/tests${KPA_TEST_DEVICE:+ on $KPA_TEST_DEVICE tensors}"
  # From the tests' folder, so that `import kpa` finds the installed package, not the source.
  (cd "$repo/python/tests" && OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} OMP_PROC_BIND=false \
    "$venv/bin/python" -m pytest -q -p no:cacheprovider)
fi
