#!/usr/bin/env bash
# Installs every Debian package rannc needs to build, test and run its demo.
# Idempotent: when everything is present it only checks and returns.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config
  libtorch-dev libonnx-dev libprotobuf-dev protobuf-compiler
  libboost-graph-dev libyaml-cpp-dev libopenmpi-dev openmpi-bin
  libgtest-dev libgmock-dev libcli11-dev nlohmann-json3-dev
  llvm-14-tools libonnx-testdata
  # Debian's LibTorch and PyTorch link the generic libblas.so.3; without an
  # optimized one that is netlib's reference BLAS, ~10x slower on the matrix
  # products that dominate training. The OpenMP build follows LibTorch's
  # thread count (torch::set_num_threads), so one rank stays on one core.
  libopenblas0-openmp
  python3-torch python3-torchvision python3-onnx python3-numpy
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages present" >&2
  exit 0
fi

echo "setup: installing ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
