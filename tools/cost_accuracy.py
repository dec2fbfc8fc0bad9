#!/usr/bin/env python3
"""Cost-model accuracy: for each model, plans for one CPU rank with measured
costs (rannc-plan profiles every unit on this machine), trains a few steps with
rannc-exec, and prints predicted vs measured step time and peak tensor memory
as ratios, all in one run.

  .venv/bin/python tools/cost_accuracy.py [--build build] [--steps 12]
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (name, make_model.py arguments, global batch, micro-batches). gpt-wide and
# bert-deep are sizes nobody tuned the cost model on.
MODELS = [
    ("mlp", ["--model", "mlp"], 32, 2),
    ("bert", ["--model", "bert"], 16, 2),
    ("gpt", ["--model", "gpt"], 16, 2),
    ("gpt-wide", ["--model", "gpt", "--layers", "3", "--hidden", "192", "--heads", "6", "--seq-len", "48",
                  "--vocab", "500"], 16, 4),
    ("bert-deep", ["--model", "bert", "--layers", "6", "--hidden", "128", "--heads", "8", "--seq-len", "32",
                   "--vocab", "300"], 24, 3),
    # torchvision's own definitions (models/zoo.py), nobody tuned for them.
    ("resnet18", ["--model", "resnet18"], 8, 2),
    ("mobilenet_v3_small", ["--model", "mobilenet_v3_small"], 8, 2),
    ("vit_tiny", ["--model", "vit_tiny"], 8, 2),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--only", help="comma-separated model names")
    a = ap.parse_args()
    work = os.path.join(a.build, "cost_accuracy")
    plan_tool = os.path.join(a.build, "tools", "rannc-plan")
    exec_tool = os.path.join(a.build, "tools", "rannc-exec")
    rows = []
    for name, margs, batch, mbs in MODELS:
        if a.only and name not in a.only.split(","):
            continue
        out = os.path.join(work, name)
        subprocess.run([sys.executable, os.path.join(ROOT, "models", "make_model.py"), *margs, "--out", out,
                        "--batch-size", str(batch), "--samples", str(4 * batch), "--steps", "0"],
                       check=True, capture_output=True)
        plan = os.path.join(out, "plan.pb")
        subprocess.run([plan_tool, os.path.join(out, "model.onnx"), "--gpus", "1", "--device-type", "cpu",
                        "--batch-size", str(batch), "--microbatches", str(mbs), "--optimizer", "sgd",
                        "--profile", "measure", "-o", plan], check=True, capture_output=True)
        shown = json.loads(subprocess.run([plan_tool, "show", plan, "--json"], check=True, capture_output=True,
                                          text=True).stdout)
        log = os.path.join(out, "log.jsonl")
        p = subprocess.run(["mpirun", "--allow-run-as-root", "-np", "1", exec_tool, plan, "--data",
                            os.path.join(out, "data"), "--steps", str(a.steps), "--optimizer", "sgd", "--lr", "0.01",
                            "--log", log], capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(p.stderr)
        steps = [json.loads(l) for l in open(log)]
        times = sorted(s["step_time_s"] for s in steps[2:])  # the first steps warm up
        measured_t = times[len(times) // 2]
        measured_m = max(s["peak_memory_bytes"] for s in steps)
        pred_t = shown["predicted_step_time_s"]
        pred_m = shown["stages"][0]["peak_memory_bytes"]
        params = shown["stages"][0]["num_params"]
        rows.append((name, params, batch, mbs, pred_t, measured_t, pred_m, measured_m))
    print("| model | params | batch | micro-batches | predicted step ms | measured step ms | time ratio "
          "| predicted peak MiB | measured peak MiB | memory ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, params, batch, mbs, pt, mt, pm, mm in rows:
        print(f"| {name} | {params} | {batch} | {mbs} | {pt * 1e3:.2f} | {mt * 1e3:.2f} | {pt / mt:.2f} "
              f"| {pm / 2**20:.2f} | {mm / 2**20:.2f} | {pm / mm:.2f} |")


if __name__ == "__main__":
    main()
