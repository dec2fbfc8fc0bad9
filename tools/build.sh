#!/usr/bin/env bash
# Configures and builds rannc into build/ (Ninja, ccache when present).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${RANNC_BUILD_DIR:-$root/build}"
jobs="${RANNC_JOBS:-$(nproc)}"
if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
cmake --build "$build" -j "$jobs"
