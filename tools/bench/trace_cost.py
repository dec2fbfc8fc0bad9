#!/usr/bin/env python3
"""What rannc-exec --trace costs, measured side by side in one run: the same
2-stage 1F1B plan trained with and without --trace, alternately, several
rounds; the ratio of the median step times (Note [measured timeline] in
executor/train/timeline.h). Two models: a tiny GPT with 16 micro-batches (the
most actions per second, where a per-action cost would show most) and
exec_bench's GPT-style model with 8.

Wall-clock runs on a shared machine differ by more than tracing can cost, so
the cost is also measured where it arises: trace_record_bench runs the
trainer's recording calls for the same number of actions per step, with the
recorder on and off, in one process and in CPU time; the last two columns are
that difference per step, and it over the untraced step.

  .venv/bin/python tools/bench/trace_cost.py [--build build] [--steps 12] [--rounds 3]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS = [  # (name, make_model.py arguments, batch, micro-batches)
    ("tiny GPT", ["--model", "gpt"], 32, 16),
    ("exec_bench GPT", ["--model", "gpt", "--layers", "4", "--hidden", "256", "--heads", "8", "--seq-len", "64",
                        "--vocab", "512"], 32, 8),
]


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{p.stdout}\n{p.stderr}")
    return p


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    plan_tool = os.path.join(a.build, "tools", "rannc-plan")
    exec_tool = os.path.join(a.build, "tools", "rannc-exec")
    print(f"2 ranks, 2-stage 1F1B, {os.cpu_count()} cores, median step of steps 2..{a.steps - 1} per run, "
          f"median over {a.rounds} alternating rounds\n")
    print("| model | micro-batches | actions per step and rank | untraced ms/step | traced ms/step | ratio "
          "| trace size | recording per step (in-process) | recording / untraced step |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, margs, batch, mbs in MODELS:
        work = os.path.join(a.build, "trace_cost", name.replace(" ", "_"))
        run([sys.executable, os.path.join(ROOT, "models", "make_model.py"), *margs, "--out", work, "--batch-size",
             str(batch), "--samples", str(4 * batch), "--steps", "0", "--no-variants"])
        plan = os.path.join(work, "plan.pb")
        run([plan_tool, os.path.join(work, "model.onnx"), "--gpus", "2", "--device-type", "cpu", "--stages", "2",
             "--schedule", "1f1b", "--batch-size", str(batch), "--microbatches", str(mbs), "--profile", "analytic",
             "--optimizer", "sgd", "--quiet", "-o", plan])
        medians = {False: [], True: []}
        trace = os.path.join(work, "trace.json")
        for _ in range(a.rounds):
            for traced in (False, True):
                log = os.path.join(work, "log.jsonl")
                run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", exec_tool, plan, "--data",
                     os.path.join(work, "data"), "--steps", str(a.steps), "--optimizer", "sgd", "--log", log]
                    + (["--trace", trace] if traced else []))
                steps = [json.loads(l) for l in open(log)]
                medians[traced].append(statistics.median(s["step_time_s"] for s in steps[2:]))
        off, on = statistics.median(medians[False]), statistics.median(medians[True])
        events = json.load(open(trace))["traceEvents"]
        actions = sum(1 for e in events if e["ph"] == "X" and e["pid"] == 0 and e["cat"] != "idle") / a.steps
        # Every action the trainer records (idle gaps are drawn at write time, not recorded).
        bench = json.loads(run([os.path.join(a.build, "tools", "bench", "trace_record_bench"), "--actions-per-step",
                                str(round(actions))]).stdout)
        per_step_s = (bench["ns_per_action_traced"] - bench["ns_per_action_untraced"]) * 1e-9 * round(actions)
        print(f"| {name} | {mbs} | {actions:.0f} | {off * 1e3:.2f} | {on * 1e3:.2f} | {on / off:.3f}x "
              f"| {os.path.getsize(trace) / 1024:.0f} KiB | {per_step_s * 1e6:.1f} us "
              f"({bench['ns_per_action_traced'] - bench['ns_per_action_untraced']:.0f} ns x {round(actions)}) "
              f"| {per_step_s / off:.2e} |")


if __name__ == "__main__":
    main()
