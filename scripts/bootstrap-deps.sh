#!/usr/bin/env bash
# Installs what kpa needs on a fresh Debian 12 machine and prints the Kokkos prefix to use.
#
#   scripts/bootstrap-deps.sh [PREFIX]      (default PREFIX: <repo>/.deps/install)
#
# With KPA_SKIP_KOKKOS=1 only the distribution packages are installed (for builds against a
# Kokkos given through Kokkos_ROOT, e.g. a CUDA-enabled one).
# - Distribution packages (as root, only those missing): C and C++ compilers, CMake, GoogleTest,
#   Google Benchmark, dpkg-dev (for `apt-get source`), python3 with numpy (the ctypes test).
# - Kokkos 3.4.1 (Serial + OpenMP) and Kokkos Kernels 3.4, built from the distribution's
#   `trilinos` source package into PREFIX, once; later runs reuse the prefix.
# The deb-src entry is derived from the machine's own apt sources, so no archive host is
# written down anywhere in the project.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
prefix=${1:-$repo/.deps/install}
work=$repo/.deps/work
log() { printf '[kpa deps] %s\n' "$*" >&2; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    log "need root to run: $*"; exit 1; fi
}

apt_updated=0
apt_update_once() {
  if [ "$apt_updated" -eq 0 ]; then as_root apt-get update -qq >&2; apt_updated=1; fi
}

install_packages() {
  local missing=()
  for pkg in g++ gcc cmake make libgtest-dev libbenchmark-dev dpkg-dev xz-utils python3 python3-numpy; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    log "installing distribution packages: ${missing[*]}"
    apt_update_once
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2
  fi
}

# Adds a deb-src entry mirroring the first main-archive 'deb' source of this machine.
ensure_deb_src() {
  local list=/etc/apt/sources.list.d/kpa-deb-src.sources
  if grep -rqsE '^(Types:.*deb-src|deb-src )' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    return
  fi
  local uri suite
  local deb822=/etc/apt/sources.list.d/debian.sources
  if [ -f "$deb822" ]; then
    uri=$(awk '/^URIs:/{print $2; exit}' "$deb822")
    suite=$(awk '/^Suites:/{print $2; exit}' "$deb822")
  elif [ -f /etc/apt/sources.list ]; then
    read -r uri suite < <(awk '$1=="deb" && $0 !~ /security/ {
        for (i = 2; i <= NF; i++) if ($i !~ /^\[/) { print $i, $(i+1); exit } }' /etc/apt/sources.list)
  fi
  if [ -z "${uri:-}" ] || [ -z "${suite:-}" ]; then
    log "could not derive a deb-src entry from /etc/apt sources"; exit 1
  fi
  log "adding a deb-src entry for suite $suite (derived from the machine's apt sources)"
  printf 'Types: deb-src\nURIs: %s\nSuites: %s\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
    "$uri" "$suite" | as_root tee "$list" >/dev/null
  apt_updated=0
  apt_update_once
}

build_kokkos() {
  log "building Kokkos and Kokkos Kernels from the distribution's trilinos source into $prefix"
  rm -rf "$work"; mkdir -p "$work"
  ensure_deb_src
  (cd "$work" && apt-get source --download-only trilinos >&2)
  local orig
  orig=$(ls "$work"/trilinos_*.orig.tar.* | head -n1)
  log "extracting packages/kokkos and packages/kokkos-kernels from $(basename "$orig")"
  mkdir -p "$work/src"
  tar -xf "$orig" -C "$work/src" --strip-components=1 --wildcards \
    '*/packages/kokkos/*' '*/packages/kokkos-kernels/*'
  local jobs; jobs=$(nproc)
  cmake -S "$work/src/packages/kokkos" -B "$work/build-kokkos" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_CXX_STANDARD=17 -DCMAKE_CXX_EXTENSIONS=OFF \
    -DKokkos_ENABLE_SERIAL=ON -DKokkos_ENABLE_OPENMP=ON -DBUILD_SHARED_LIBS=ON >&2
  cmake --build "$work/build-kokkos" -j "$jobs" >&2
  cmake --install "$work/build-kokkos" >&2
  cmake -S "$work/src/packages/kokkos-kernels" -B "$work/build-kernels" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_INSTALL_PREFIX="$prefix" -DKokkos_ROOT="$prefix" -DCMAKE_CXX_EXTENSIONS=OFF \
    -DKokkosKernels_ADD_DEFAULT_ETI=OFF -DBUILD_SHARED_LIBS=ON >&2
  cmake --build "$work/build-kernels" -j "$jobs" >&2
  cmake --install "$work/build-kernels" >&2
  touch "$prefix/.kpa-deps-complete"
  rm -rf "$work"
}

install_packages
if [ "${KPA_SKIP_KOKKOS:-0}" = 1 ]; then
  exit 0
elif [ -f "$prefix/.kpa-deps-complete" ]; then
  log "reusing Kokkos and Kokkos Kernels in $prefix"
else
  build_kokkos
fi
echo "$prefix"
