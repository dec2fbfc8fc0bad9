#!/usr/bin/env python3
"""`rannc-plan --version` and `rannc-exec --version` (SPEC.md) against the
PyTorch of the Python running this script, the one the build links (Note [one
LibTorch] in CMakeLists.txt): the LibTorch version is the wheel's, CUDA is
"compiled (V)" exactly when the wheel has CUDA, and every key is present."""

import argparse
import re
import subprocess
import sys

import torch

KEYS = ("rannc", "LibTorch", "CUDA", "NCCL", "GPUs visible", "MPI")


def check(tool):
    p = subprocess.run([tool, "--version"], text=True, capture_output=True, timeout=60)
    if p.returncode != 0:
        sys.exit(f"{tool} --version exited {p.returncode}: {p.stderr}")
    lines = dict(line.split(": ", 1) for line in p.stdout.strip().splitlines())
    print(f"{tool}:\n{p.stdout}")
    for k in KEYS:
        if k not in lines:
            sys.exit(f"{tool} --version lacks '{k}: ...'")
    want = torch.__version__.split("+")[0]
    if lines["LibTorch"] != want:
        sys.exit(f"LibTorch: {lines['LibTorch']}, but this Python's torch is {want}")
    if torch.version.cuda:
        if not re.fullmatch(r"compiled \(\d+\.\d+(\.\d+)?\)", lines["CUDA"]):
            sys.exit(f"the wheel has CUDA {torch.version.cuda}, but CUDA: {lines['CUDA']}")
        if not re.fullmatch(r"\d+\.\d+\.\d+", lines["NCCL"]):
            sys.exit(f"NCCL: {lines['NCCL']}, expected X.Y.Z in a CUDA build")
    elif lines["CUDA"] != "not compiled" or lines["NCCL"] != "not compiled":
        sys.exit(f"a CPU wheel, but CUDA: {lines['CUDA']}, NCCL: {lines['NCCL']}")
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if int(lines["GPUs visible"]) != visible:
        sys.exit(f"GPUs visible: {lines['GPUs visible']}, torch sees {visible}")
    if not lines["MPI"] or lines["MPI"] == "unknown":
        sys.exit(f"MPI: {lines['MPI']}")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("tools", nargs="+")
    for tool in ap.parse_args().tools:
        check(tool)
    print("versions ok")


if __name__ == "__main__":
    main()
