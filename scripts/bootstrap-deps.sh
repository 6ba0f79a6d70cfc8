#!/usr/bin/env bash
# Installs what kpa needs on a fresh Debian 12 machine and prints the Kokkos prefix to use.
#
#   scripts/bootstrap-deps.sh [PREFIX]          host Kokkos (Serial + OpenMP, shared libraries)
#   scripts/bootstrap-deps.sh --cuda [PREFIX]   CUDA Kokkos (Serial + OpenMP + CUDA)
#   scripts/bootstrap-deps.sh --static [PREFIX] host Kokkos as static, position-independent
#                                               libraries, for a libkpa.so that carries its own
#                                               Kokkos (KPA_SELF_CONTAINED, CMakeLists.txt)
#   scripts/bootstrap-deps.sh --clang [PREFIX]  Serial Kokkos built with clang, for the libFuzzer
#                                               target
#   scripts/bootstrap-deps.sh --python          the packages the PyTorch operators (python/) need,
#                                               on top of the host ones; no Kokkos is built
#
# The Kokkos version, KPA_KOKKOS_VERSION:
# - 3.4.1 (the default; the oldest kpa supports): Kokkos 3.4.1 and Kokkos Kernels 3.4 from the
#   distribution's `trilinos` source package, fetched once into <repo>/.deps/src.
# - 4.6.01: the upstream release tarballs kokkos-4.6.01.tar.gz and kokkos-kernels-4.6.01.tar.gz
#   (tag 4.6.01 of kokkos/kokkos and kokkos/kokkos-kernels), checked against their SHA-256, from
#   the folder KPA_KOKKOS_SOURCES or else <repo>/../shared/deps. Neither there: a message, and
#   exit status 3 (scripts/test.sh then skips what needs them).
# The default PREFIX is <repo>/.deps/install[-MODE][-kokkos-VERSION] (no suffix for host 3.4.1).
#
# With KPA_SKIP_KOKKOS=1 only the distribution packages are installed (for builds against a
# Kokkos given through Kokkos_ROOT). With KPA_OFFLINE=1 nothing is installed or fetched: the
# Kokkos sources must already be in <repo>/.deps (a machine without network).
# - Distribution packages (as root, only those missing): C and C++ compilers, CMake, GoogleTest,
#   Google Benchmark, CLI11 and nlohmann-json (kpa-bench), dpkg-dev (for `apt-get source`), python3 with numpy (the ctypes test).
# - Host, static: Kokkos (Serial + OpenMP) and, for host, Kokkos Kernels, built into PREFIX once.
# - --cuda: Kokkos (Serial + OpenMP + CUDA, architecture KPA_CUDA_ARCH, default AMPERE80) with
#   scripts/patches/kokkos-VERSION-cuda13.patch applied (what CUDA 13 changed), built into
#   PREFIX once (about 6 MB); nvcc must be on PATH or in /usr/local/cuda/bin. Kokkos Kernels is
#   not built for it. KPA_CUDA_EXTRA_SM=90 adds machine code for sm_90 to Kokkos' own library:
#   Kokkos::initialize aborts when its probe kernel runs as PTX compiled for another major
#   version (sm_80 PTX on an H100/H200, say), and Kokkos 3.4.1 knows no architecture newer than
#   Ampere (4.6.01 takes KPA_CUDA_ARCH=HOPPER90).
# - --python: python3-torch, libtorch-dev, pytest, venv, pip, wheel, setuptools, ninja.
# - --clang: clang and its sanitizer and libFuzzer runtimes from the distribution, and Kokkos
#   (Serial only: clang's OpenMP runtime is not the one the host prefix links) built with clang.
# Later runs reuse a complete prefix. The deb-src entry is derived from the machine's own apt
# sources, so no archive host is written down anywhere in the project.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mode=host
case "${1:-}" in
  --cuda) mode=cuda; shift ;;
  --static) mode=static; shift ;;
  --clang) mode=clang; shift ;;
  --python) mode=python; shift ;;
esac
version=${KPA_KOKKOS_VERSION:-3.4.1}
case "$version" in
  3.4.1) version_suffix= src=$repo/.deps/src ;;
  4.6.01) version_suffix=-kokkos-$version src=$repo/.deps/src-kokkos-$version ;;
  *) printf '[kpa deps] KPA_KOKKOS_VERSION=%s: kpa builds Kokkos 3.4.1 or 4.6.01 (any other: Kokkos_ROOT)\n' \
       "$version" >&2; exit 2 ;;
esac
prefix=${1:-$repo/.deps/install$([ "$mode" = host ] || echo "-$mode")$version_suffix}
work=$repo/.deps/work-$mode$version_suffix
cuda_arch=${KPA_CUDA_ARCH:-AMPERE80}
cuda_extra_sm=${KPA_CUDA_EXTRA_SM:-}
log() { printf '[kpa deps] %s\n' "$*" >&2; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    log "need root to run: $*"; exit 1; fi
}

apt_updated=0
apt_update_once() {
  if [ "$apt_updated" -eq 0 ]; then as_root apt-get update -qq >&2; apt_updated=1; fi
}

# install_packages [PACKAGE...]: the given packages, or the ones every build needs.
install_packages() {
  local missing=() wanted=("$@")
  [ "${#wanted[@]}" -gt 0 ] || wanted=(g++ gcc cmake make libgtest-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev dpkg-dev xz-utils
                                        patch python3 python3-numpy)
  for pkg in "${wanted[@]}"; do
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

# Kokkos 3.4.1: packages/kokkos and packages/kokkos-kernels of the trilinos source package.
fetch_trilinos_sources() {
  ensure_deb_src
  local download=$repo/.deps/download
  rm -rf "$download"; mkdir -p "$download"
  (cd "$download" && apt-get source --download-only trilinos >&2)
  local orig
  orig=$(ls "$download"/trilinos_*.orig.tar.* | head -n1)
  log "extracting packages/kokkos and packages/kokkos-kernels from $(basename "$orig")"
  tar -xf "$orig" -C "$src" --strip-components=2 --wildcards '*/packages/kokkos/*' '*/packages/kokkos-kernels/*'
  rm -rf "$download"
}

# Kokkos 4.6.01: the upstream release tarballs, from KPA_KOKKOS_SOURCES or ../shared/deps.
fetch_release_sources() {
  local folder=${KPA_KOKKOS_SOURCES:-$repo/../shared/deps}
  local name sum
  for name in kokkos kokkos-kernels; do
    if [ ! -f "$folder/$name-$version.tar.gz" ]; then
      log "Kokkos $version: no $name-$version.tar.gz in ${KPA_KOKKOS_SOURCES:-$folder (KPA_KOKKOS_SOURCES unset)}."
      log "Put the upstream release tarballs kokkos-$version.tar.gz and kokkos-kernels-$version.tar.gz (tag"
      log "$version of kokkos/kokkos and kokkos/kokkos-kernels) in a folder and set KPA_KOKKOS_SOURCES to it."
      rm -rf "$src"
      exit 3
    fi
  done
  # The release tarballs' SHA-256, so that a corrupt or different archive is refused.
  for name in kokkos kokkos-kernels; do
    case "$name-$version" in
      kokkos-4.6.01) sum=d8a8a5e15331c46b900d3f75d2b62b0b32f067b126a4a75d465224c899765084 ;;
      kokkos-kernels-4.6.01) sum=b9e682e3a41344e268dab7328ddc6e9474b7a51eb67fb986d81d4193e118cbb9 ;;
    esac
    if ! echo "$sum  $folder/$name-$version.tar.gz" | sha256sum --check --status; then
      log "$folder/$name-$version.tar.gz is not the release tarball (its SHA-256 differs from $sum)"
      rm -rf "$src"
      exit 1
    fi
    log "extracting $name-$version.tar.gz from $folder"
    mkdir -p "$src/$name"
    tar -xzf "$folder/$name-$version.tar.gz" -C "$src/$name" --strip-components=1
  done
}

# The Kokkos and Kokkos Kernels sources of $version in $src/kokkos and $src/kokkos-kernels.
fetch_sources() {
  [ -f "$src/.complete" ] && return
  if [ "${KPA_OFFLINE:-0}" = 1 ]; then log "KPA_OFFLINE=1 and no Kokkos sources in $src"; exit 1; fi
  rm -rf "$src"; mkdir -p "$src"
  case "$version" in
    3.4.1) fetch_trilinos_sources ;;
    *) fetch_release_sources ;;
  esac
  touch "$src/.complete"
}

# build_kokkos SOURCE [CMAKE_ARGS...]: configures, builds and installs Kokkos into $prefix.
build_kokkos() {
  local source=$1; shift
  cmake -S "$source" -B "$work/build-kokkos" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_CXX_STANDARD=17 -DCMAKE_CXX_EXTENSIONS=OFF "$@" >&2
  cmake --build "$work/build-kokkos" -j "$(nproc)" >&2
  cmake --install "$work/build-kokkos" >&2
}

# SM number of a Kokkos architecture name (AMPERE80 -> 80), for nvcc's -arch.
sm_of() { printf '%s' "${1//[!0-9]/}"; }

build_host() {
  log "building Kokkos $version (Serial, OpenMP) and Kokkos Kernels into $prefix"
  rm -rf "$work"; mkdir -p "$work"
  build_kokkos "$src/kokkos" -DKokkos_ENABLE_SERIAL=ON -DKokkos_ENABLE_OPENMP=ON -DBUILD_SHARED_LIBS=ON
  # kpa-bench's dense baseline needs BLAS only (Kokkos Kernels 4 builds components one by one).
  local components=()
  [ "$version" = 3.4.1 ] || components=(-DKokkosKernels_ENABLE_ALL_COMPONENTS=OFF -DKokkosKernels_ENABLE_COMPONENT_BLAS=ON)
  cmake -S "$src/kokkos-kernels" -B "$work/build-kernels" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_INSTALL_PREFIX="$prefix" -DKokkos_ROOT="$prefix" -DCMAKE_CXX_EXTENSIONS=OFF \
    -DKokkosKernels_ADD_DEFAULT_ETI=OFF "${components[@]}" -DBUILD_SHARED_LIBS=ON >&2
  cmake --build "$work/build-kernels" -j "$(nproc)" >&2
  cmake --install "$work/build-kernels" >&2
  rm -rf "$work"
}

build_static() {
  log "building Kokkos $version (Serial, OpenMP) as static position-independent libraries into $prefix"
  rm -rf "$work"; mkdir -p "$work"
  build_kokkos "$src/kokkos" -DKokkos_ENABLE_SERIAL=ON -DKokkos_ENABLE_OPENMP=ON -DBUILD_SHARED_LIBS=OFF \
    -DCMAKE_POSITION_INDEPENDENT_CODE=ON
  rm -rf "$work"
}

build_clang() {
  log "building Kokkos $version (Serial) with clang into $prefix"
  rm -rf "$work"; mkdir -p "$work"
  build_kokkos "$src/kokkos" -DCMAKE_CXX_COMPILER=clang++ -DKokkos_ENABLE_SERIAL=ON -DBUILD_SHARED_LIBS=ON
  rm -rf "$work"
}

build_cuda() {
  command -v nvcc >/dev/null || { log "nvcc is not on PATH or in /usr/local/cuda/bin"; exit 1; }
  log "building Kokkos $version (Serial, OpenMP, CUDA $cuda_arch${cuda_extra_sm:+ +sm_$cuda_extra_sm}) into $prefix"
  # Kokkos' nvcc_wrapper takes one -arch; nvcc appends this variable to every command line.
  if [ -n "$cuda_extra_sm" ]; then
    export NVCC_APPEND_FLAGS="${NVCC_APPEND_FLAGS:-} -gencode=arch=compute_$cuda_extra_sm,code=sm_$cuda_extra_sm"
  fi
  rm -rf "$work"; mkdir -p "$work"
  cp -r "$src/kokkos" "$work/kokkos"
  local patch_file=$repo/scripts/patches/kokkos-$version-cuda13.patch
  # Idempotent: a tree that already has the changes is left as it is.
  if ! (cd "$work/kokkos" && patch -p1 -R --dry-run -s -f < "$patch_file" >/dev/null 2>&1); then
    (cd "$work/kokkos" && patch -p1 -s < "$patch_file")
  fi
  # nvcc_wrapper's default architecture (sm_35 in 3.4.1, sm_70 in 4.6.01) is rejected by CUDA 13:
  # name the architecture.
  build_kokkos "$work/kokkos" -DCMAKE_CXX_COMPILER="$work/kokkos/bin/nvcc_wrapper" \
    -DCMAKE_CXX_FLAGS="-arch=sm_$(sm_of "$cuda_arch")" -DKokkos_ENABLE_SERIAL=ON -DKokkos_ENABLE_OPENMP=ON \
    -DKokkos_ENABLE_CUDA=ON -DKokkos_ENABLE_CUDA_LAMBDA=ON -DKokkos_ARCH_"$cuda_arch"=ON -DBUILD_SHARED_LIBS=ON
  rm -rf "$work"
}

if [ "${KPA_OFFLINE:-0}" != 1 ]; then
  install_packages
  [ "$mode" = clang ] && install_packages clang libclang-rt-14-dev
  # The distribution's torch (1.13, CPU) and its headers; pip, venv and wheel to install
  # python/ into a virtual environment; ninja for torch's extension builds.
  [ "$mode" = python ] && install_packages python3-torch libtorch-dev python3-pytest python3-venv python3-pip \
    python3-wheel python3-setuptools ninja-build
fi
[ "$mode" = python ] && exit 0
[ "$mode" = cuda ] && [ -x /usr/local/cuda/bin/nvcc ] && export PATH="$PATH:/usr/local/cuda/bin"
if [ "${KPA_SKIP_KOKKOS:-0}" = 1 ]; then
  exit 0
fi
case "$mode" in
  cuda) wanted="cuda $version $cuda_arch${cuda_extra_sm:+ +sm_$cuda_extra_sm}" ;;
  *) wanted="$mode $version" ;;
esac
if [ -f "$prefix/.kpa-deps-complete" ] && [ "$(cat "$prefix/.kpa-deps-complete")" = "$wanted" ]; then
  log "reusing Kokkos in $prefix ($wanted)"
else
  [ -f "$prefix/.kpa-deps-complete" ] && rm -rf "$prefix"  # a prefix of ours, for another configuration
  fetch_sources
  "build_$mode"
  echo "$wanted" > "$prefix/.kpa-deps-complete"
fi
echo "$prefix"
