#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite with ctest.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${RANNC_BUILD_DIR:-$root/build}"
bash "$root/tools/setup.sh"
bash "$root/tools/build.sh"
cd "$build"
ctest --output-on-failure -j "${RANNC_TEST_JOBS:-2}" "$@"
