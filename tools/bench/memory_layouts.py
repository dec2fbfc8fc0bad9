#!/usr/bin/env python3
"""The plan's memory model against rannc-exec's measured peaks, over several
layouts of one model: for each layout, plan with measured unit costs, train a
few steps on synthetic data with Adam, and print every rank's measured peak
tensor memory over the plan's prediction for its stage (docs/partitioner.md,
"Memory of one device").

  .venv/bin/python tools/bench/memory_layouts.py --plan-tool build/tools/rannc-plan \\
      --exec-tool build/tools/rannc-exec --model build/models/gpt/model.onnx --work /tmp/ml
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "integration"))
from memory_check import plan_and_train  # noqa: E402

# name, ranks, rannc-plan flags
LAYOUTS = [
    ("1 stage, M=1", 1, "--stages 1 --microbatches 1"),
    ("1 stage, M=4, gpipe", 1, "--stages 1 --microbatches 4 --schedule gpipe"),
    ("2 stages, gpipe", 2, "--stages 2 --microbatches 4 --schedule gpipe --recompute off"),
    ("2 stages, 1f1b", 2, "--stages 2 --microbatches 4 --schedule 1f1b --recompute off"),
    ("4 stages, 1f1b", 4, "--stages 4 --microbatches 4 --schedule 1f1b --recompute off"),
    ("2 stages, 1f1b, recompute", 2, "--stages 2 --microbatches 4 --schedule 1f1b --recompute on"),
    ("2 stages, gpipe, recompute", 2, "--stages 2 --microbatches 4 --schedule gpipe --recompute on"),
    ("4 stages, 1f1b M=8, recompute", 4, "--stages 4 --microbatches 8 --schedule 1f1b --recompute on"),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plan-tool", required=True)
    ap.add_argument("--exec-tool", required=True)
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    ratios = []
    for i, (name, ranks, flags) in enumerate(LAYOUTS):
        plan, log = os.path.join(a.work, f"layout{i}.pb"), os.path.join(a.work, f"layout{i}.jsonl")
        _, measured, predicted = plan_and_train(a.plan_tool, a.exec_tool, a.mpirun, a.model, ranks, a.batch_size,
                                                flags.split(), plan, log, a.steps)
        row = [m / predicted[r] for r, m in enumerate(measured)]
        ratios += row
        print(f"{name:32s} measured / predicted per rank: " + " ".join(f"{x:.3f}" for x in row), flush=True)
    print(f"all ranks: {min(ratios):.3f} - {max(ratios):.3f}")


if __name__ == "__main__":
    main()
