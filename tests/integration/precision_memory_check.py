#!/usr/bin/env python3
"""Mixed precision's memory (Note [autocast dtypes] in
planner/cost/precision.cpp): a model planned on 2 stages with 4 micro-batches
at a batch where activations dominate, with --precision fp32 and bf16
(measured unit costs, this machine), trained a few steps on synthetic data.
Each rank's measured peak must be lower under bf16 than under fp32, and every
peak must be within --tolerance of the plan's prediction for its stage.
Prints the figures (docs/training.md quotes them).

  .venv/bin/python tests/integration/precision_memory_check.py --plan-tool build/tools/rannc-plan \\
      --exec-tool build/tools/rannc-exec --model build/models/gpt/model.pt --work /tmp/pm
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from memory_check import run  # noqa: E402  (the same checked subprocess call)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plan-tool", required=True)
    ap.add_argument("--exec-tool", required=True)
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--model", required=True)
    ap.add_argument("--precision", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--schedule", choices=["gpipe", "1f1b"], default="gpipe")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--work", required=True)
    ap.add_argument("--tolerance", type=float, default=0.15)
    ap.add_argument("--plan-args", default="", help="more rannc-plan flags, e.g. '--profile analytic'")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    peaks, planned, failures = {}, {}, []
    for prec in ("fp32", a.precision):
        plan = os.path.join(a.work, f"precision-{prec}-{a.schedule}.pb")
        log = os.path.join(a.work, f"precision-{prec}-{a.schedule}.jsonl")
        run([a.plan_tool, a.model, "--gpus", "2", "--device-type", "cpu", "--batch-size", str(a.batch_size),
             "--stages", "2", "--microbatches", str(a.microbatches), "--schedule", a.schedule, "--recompute", "off",
             "--precision", prec, "--optimizer", "adam", "-o", plan] + a.plan_args.split())
        run([a.mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2", a.exec_tool, plan, "--synthetic",
             "--steps", "3", "--optimizer", "adam", "--log", log])
        shown = json.loads(run([a.plan_tool, "show", plan, "--json"]).stdout)
        if shown.get("precision") != prec:
            failures.append(f"--precision {prec}: show --json says {shown.get('precision')!r}")
        steps = [json.loads(line) for line in open(log)]
        measured = [max(s["peak_memory_bytes_per_rank"][r] for s in steps) for r in range(2)]
        predicted = {r: st["peak_memory_bytes"] for st in shown["stages"] for r in st["ranks"]}
        parts = {r: st for st in shown["stages"] for r in st["ranks"]}
        peaks[prec], planned[prec] = measured, predicted
        for r in range(2):
            ratio = measured[r] / predicted[r]
            print(f"{prec}, rank {r}: measured peak {measured[r]} bytes, predicted {predicted[r]} "
                  f"(activations {parts[r]['activation_bytes']}, low-precision weights "
                  f"{parts[r].get('lowp_weight_bytes', 0)}, params {parts[r]['param_bytes']}), ratio {ratio:.3f}")
            if abs(ratio - 1) > a.tolerance:
                failures.append(f"{prec}, rank {r}: measured {measured[r]} is {ratio:.3f}x the plan's "
                                f"{predicted[r]} (tolerance {a.tolerance:.0%})")
    for r in range(2):
        print(f"rank {r}: {a.precision} takes the measured peak to {peaks[a.precision][r] / peaks['fp32'][r]:.3f}x "
              f"of fp32's (the plan: {planned[a.precision][r] / planned['fp32'][r]:.3f}x)")
        if peaks[a.precision][r] >= peaks["fp32"][r]:
            failures.append(f"rank {r}: {a.precision} did not lower the peak "
                            f"({peaks[a.precision][r]} >= {peaks['fp32'][r]})")
    if failures:
        sys.exit("\n".join(failures))


if __name__ == "__main__":
    main()
