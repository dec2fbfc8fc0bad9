#!/usr/bin/env python3
"""Activation recomputation's memory (Note [recomputation] in
executor/runtime/stage.h): a model planned on 2 stages with 4 micro-batches,
with --recompute off and on (measured unit costs, this machine), trained a few
steps on synthetic data. Each rank's measured peak must fall with
recomputation where the plan says it saves, and every peak, with and without, must be within --tolerance
(10%) of the plan's prediction for its stage (where one micro-batch is in
flight, as on 1F1B's last stage, there is nothing to save and the peak must
not grow). Prints the figures.

  .venv/bin/python tests/integration/recompute_check.py --plan-tool build/tools/rannc-plan \\
      --exec-tool build/tools/rannc-exec --model build/models/gpt/model.onnx --schedule gpipe --work /tmp/rc
"""
import argparse
import json
import os
import subprocess
import sys


def run(cmd):
    print("+", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, text=True, capture_output=True, timeout=600)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return p


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plan-tool", required=True)
    ap.add_argument("--exec-tool", required=True)
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--model", required=True)
    ap.add_argument("--schedule", choices=["gpipe", "1f1b"], default="gpipe")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--work", required=True)
    ap.add_argument("--tolerance", type=float, default=0.10)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    peaks, planned, failures = {}, {}, []
    for mode in ("off", "on"):
        plan = os.path.join(a.work, f"recompute-{mode}-{a.schedule}.pb")
        log = os.path.join(a.work, f"recompute-{mode}-{a.schedule}.jsonl")
        run([a.plan_tool, a.model, "--gpus", "2", "--device-type", "cpu", "--batch-size", str(a.batch_size),
             "--stages", "2", "--microbatches", str(a.microbatches), "--schedule", a.schedule, "--recompute", mode,
             "--optimizer", "adam", "-o", plan])
        run([a.mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2", a.exec_tool, plan, "--synthetic",
             "--steps", "3", "--optimizer", "adam", "--log", log])
        shown = json.loads(run([a.plan_tool, "show", plan, "--json"]).stdout)
        recomputing = [s["recompute"] for s in shown["stages"]]
        if recomputing != [mode == "on"] * 2:
            failures.append(f"--recompute {mode}: the plan's stages recompute {recomputing}")
        steps = [json.loads(line) for line in open(log)]
        measured = [max(s["peak_memory_bytes_per_rank"][r] for s in steps) for r in range(2)]
        predicted = {r: st["peak_memory_bytes"] for st in shown["stages"] for r in st["ranks"]}
        peaks[mode] = measured
        planned[mode] = predicted
        for r in range(2):
            ratio = measured[r] / predicted[r]
            print(f"recompute {mode}, rank {r}: measured peak {measured[r]} bytes, predicted {predicted[r]}, "
                  f"ratio {ratio:.3f}")
            if abs(ratio - 1) > a.tolerance:
                failures.append(f"recompute {mode}, rank {r}: measured {measured[r]} is {ratio:.3f}x the plan's "
                                f"{predicted[r]} (tolerance {a.tolerance:.0%})")
    # Where one micro-batch is in flight (1F1B's last stage) there is nothing
    # to save; the plan says so, and the peak must then not grow.
    for r in range(2):
        saves = planned["on"][r] < planned["off"][r]
        print(f"rank {r}: recomputation takes the peak to {peaks['on'][r] / peaks['off'][r]:.3f}x "
              f"(the plan: {planned['on'][r] / planned['off'][r]:.3f}x)")
        if saves and peaks["on"][r] >= peaks["off"][r]:
            failures.append(f"rank {r}: recomputation did not lower the peak ({peaks['on'][r]} >= {peaks['off'][r]})")
        if not saves and peaks["on"][r] > 1.01 * peaks["off"][r]:
            failures.append(f"rank {r}: recomputation raised the peak ({peaks['on'][r]} > {peaks['off'][r]})")
    if failures:
        sys.exit("\n".join(failures))


if __name__ == "__main__":
    main()
