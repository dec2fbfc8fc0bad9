#!/usr/bin/env bash
# Builds rannc and runs its GPU tests (the ctest label `gpu`) on a machine with
# at least one visible GPU, then prints a summary. Without a GPU it says so and
# exits non-zero: the GPU tests would only report themselves skipped.
#   RANNC_PYTHON  a Python whose CUDA PyTorch to build against (default: make
#                 <repo>/.venv with tools/setup.sh)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${RANNC_BUILD_DIR:-$root/build}"

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q "^GPU "; then
  echo "gpu_check: no GPU visible (nvidia-smi lists none): the GPU tests cannot run here" >&2
  exit 1
fi
nvidia-smi -L >&2

if [ -z "${RANNC_PYTHON:-}" ]; then bash "$root/tools/setup.sh"; fi
bash "$root/tools/build.sh"
"$build/tools/rannc-exec" --version

cd "$build"
log="$(mktemp)"
status=0
ctest -L gpu --output-on-failure 2>&1 | tee "$log" || status=$?
echo
echo "gpu_check summary:"
grep -E "tests passed|Passed|Failed|Skipped|\*\*\*" "$log" | sed 's/^/  /' || true
# The figures docs/figures.md wants: the loss differences against PyTorch on
# the GPU and the predicted/measured ratios (ctest keeps every test's output).
echo "gpu_check figures:"
grep -hE "^max relative loss difference|measured/predicted|^make_model.py: .* on " \
  "$build/Testing/Temporary/LastTest.log" 2>/dev/null | sed 's/^/  /' || true
if grep -q "Skipped" "$log"; then
  echo "gpu_check: a GPU test skipped on a machine with a GPU: treat it as a failure" >&2
  status=1
fi
rm -f "$log"
exit "$status"
