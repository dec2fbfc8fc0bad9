#!/usr/bin/env bash
# Configures and builds rannc into build/ (Ninja, ccache when present) with the
# CMake and LibTorch of the project's .venv (tools/setup.sh).
#   RANNC_PYTHON  a Python whose torch to build against (default: <repo>/.venv/bin/python)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${RANNC_BUILD_DIR:-$root/build}"
jobs="${RANNC_JOBS:-$(nproc)}"
python="${RANNC_PYTHON:-${RANNC_VENV:-$root/.venv}/bin/python}"
cmake="$(dirname "$python")/cmake"
[ -x "$cmake" ] || cmake=cmake
if [ ! -f "$build/build.ninja" ]; then
  "$cmake" -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRANNC_PYTHON="$python" >/dev/null
fi
"$cmake" --build "$build" -j "$jobs"
