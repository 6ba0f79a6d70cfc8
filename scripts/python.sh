#!/usr/bin/env bash
# kpa's PyTorch operators (python/): installs what they need from the distribution (torch 1.13,
# pytest, venv; scripts/bootstrap-deps.sh --python), pip-installs the package into a virtual
# environment that sees the distribution's torch, and with --test runs its pytest suite.
#
#   scripts/python.sh [--test]
#
# The kpa library the package wraps: KPA_PREFIX if set (an installed kpa); else the host build in
# BUILD_DIR (default <repo>/build) when it has one, installed into BUILD_DIR/python-prefix; else
# the package's setup.py builds it from this tree. The environment: KPA_PYTHON_VENV (default
# BUILD_DIR/python-venv); use it with `$KPA_PYTHON_VENV/bin/python -c "import kpa"`.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
log() { printf '[kpa python] %s\n' "$*" >&2; }
build=${BUILD_DIR:-$repo/build}
venv=${KPA_PYTHON_VENV:-$build/python-venv}
# The distribution's interpreter: its torch is built for it (python3 on PATH may be another one).
python=/usr/bin/python3

"$repo/scripts/bootstrap-deps.sh" --python
if [ -z "${KPA_PREFIX:-}" ]; then
  if [ -e "$build/libkpa.so" ]; then
    export KPA_PREFIX=$build/python-prefix
    cmake --install "$build" --prefix "$KPA_PREFIX" >/dev/null
  else
    Kokkos_ROOT=${Kokkos_ROOT:-$("$repo/scripts/bootstrap-deps.sh")}
    export Kokkos_ROOT
  fi
fi
[ -x "$venv/bin/python" ] || "$python" -m venv --system-site-packages "$venv"
log "pip install python/ into $venv (kpa from ${KPA_PREFIX:-a build of this tree})"
# --no-build-isolation: build against the torch the package will run with; --no-index: nothing
# is fetched, every dependency comes from the distribution.
"$venv/bin/python" -m pip install --quiet --no-build-isolation --no-index --no-deps "$repo/python"

if [ "${1:-}" = --test ]; then
  log "pytest python/tests"
  # From the tests' folder, so that `import kpa` finds the installed package, not the source.
  (cd "$repo/python/tests" && OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} OMP_PROC_BIND=false \
    "$venv/bin/python" -m pytest -q -p no:cacheprovider)
fi
