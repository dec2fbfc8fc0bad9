#!/usr/bin/env bash
# Installs what rannc needs to build, test and run its demo: Debian's packages
# for the C++ side (and Slurm with munge, for the one-node cluster the `slurm`
# tests start: tools/slurm/one_node.sh), and the project's Python environment .venv (the PyTorch
# wheel whose LibTorch the build links, Note [one LibTorch] in CMakeLists.txt).
# Idempotent: when everything is present it only checks and returns.
#   RANNC_VENV    where the environment lives (default: <repo>/.venv)
#   RANNC_BASE_PYTHON  the Python 3.11 that makes it (default: python3 on PATH)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${RANNC_VENV:-$root/.venv}"
requirements="$root/tools/requirements.txt"
start=$(date +%s)

PACKAGES=(
  build-essential ninja-build ccache pkg-config
  libonnx-dev libprotobuf-dev protobuf-compiler libssl-dev
  libyaml-cpp-dev libopenmpi-dev openmpi-bin
  libgtest-dev libgmock-dev libcli11-dev nlohmann-json3-dev
  llvm-14-tools libonnx-testdata graphviz
  slurm-wlm munge
  # plan_report_chromium renders rannc-plan report's page headless
  chromium fonts-dejavu-core
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} Debian packages present" >&2
else
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The environment is remade when tools/requirements.txt changes (its hash is
# kept inside the environment).
want="$(sha256sum "$requirements" | cut -d' ' -f1)"
stamp="$venv/.rannc-requirements"
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "setup: $venv is up to date ($("$venv/bin/python" -c 'import torch; print("torch", torch.__version__)'))" >&2
else
  base="${RANNC_BASE_PYTHON:-python3}"
  echo "setup: making $venv with $($base --version 2>&1) from tools/requirements.txt" \
       "(PyTorch's CUDA wheel: about 5.5 GB)" >&2
  if [ ! -x "$venv/bin/python" ]; then "$base" -m venv "$venv"; fi
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements" 2>&1 |
    grep -v "^WARNING: Location .* is ignored" >&2 || true
  "$venv/bin/python" -c 'import torch, torchvision, onnx, onnxscript, numpy' ||
    { echo "setup: error: $venv lacks a package of tools/requirements.txt (see pip's output above)" >&2; exit 1; }
  echo "$want" >"$stamp"
fi
echo "setup: done in $(( $(date +%s) - start )) s" >&2
