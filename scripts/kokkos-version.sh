#!/usr/bin/env bash
# Prints the Kokkos version kpa's scripts build against by default (scripts/build.sh, and through
# it the main job and the test command), installing it first (scripts/bootstrap-deps.sh): 4.6.01
# where its sources are here, else 3.4.1, which it says on stderr. One answer for every script,
# so that they share their build folders.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
status=0
KPA_KOKKOS_VERSION=4.6.01 "$repo/scripts/bootstrap-deps.sh" >/dev/null || status=$?
case "$status" in
  0) echo 4.6.01 ;;
  3) printf "[kpa] Kokkos 4.6.01's sources are not here (see above): kpa builds against Kokkos 3.4.1\n" >&2
     echo 3.4.1 ;;
  *) exit "$status" ;;
esac
