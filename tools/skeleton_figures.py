#!/usr/bin/env python3
"""Measures the walking skeleton's figures in one run: for each model, rank
count and optimizer, trains 10 steps with rannc (mpirun, --oversubscribe on
this machine) and prints the median step time, its ratio to the 1-rank run
measured in the same invocation, peak memory and the largest relative
difference of any logged loss from PyTorch's own training.

  .venv/bin/python tools/skeleton_figures.py [--build build] [--models gpt,bert]
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--models", default="gpt,bert")
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--microbatches", type=int, default=2)
    a = ap.parse_args()
    models_dir = os.path.join(a.build, "figures", "models")
    work = os.path.join(a.build, "figures", "work")
    rows = []
    for model in a.models.split(","):
        out = os.path.join(models_dir, model)
        subprocess.run([sys.executable, os.path.join(ROOT, "models", "make_model.py"), "--model", model,
                        "--out", out], check=True, capture_output=True)
        for opt in ("sgd", "adam"):
            for ranks in map(int, a.ranks.split(",")):
                summary = os.path.join(work, f"{model}-{ranks}-{opt}.json")
                os.makedirs(work, exist_ok=True)
                p = subprocess.run(
                    [sys.executable, os.path.join(ROOT, "tests", "integration", "train_check.py"),
                     "--plan-tool", os.path.join(a.build, "tools", "rannc-plan"),
                     "--exec-tool", os.path.join(a.build, "tools", "rannc-exec"),
                     "--models", models_dir, "--work", work, "--model", model, "--ranks", str(ranks),
                     "--optimizer", opt, "--microbatches", str(a.microbatches), "--summary", summary],
                    capture_output=True, text=True)
                if p.returncode != 0:
                    sys.exit(p.stdout + p.stderr)
                rows.append(json.load(open(summary)))
    print(f"| model | optimizer | ranks (stages) | micro-batches | median step ms | vs 1 rank | peak MiB/rank "
          f"| max rel. loss diff vs PyTorch |")
    print("|---|---|---|---|---|---|---|---|")
    base = {}
    for r in rows:
        key = (r["model"], r["optimizer"])
        base.setdefault(key, r["median_step_time_s"])
        print(f"| {r['model']} | {r['optimizer']} | {r['ranks']} | {r['microbatches']} | "
              f"{r['median_step_time_s'] * 1e3:.2f} | {r['median_step_time_s'] / base[key]:.2f}x | "
              f"{r['peak_memory_bytes'] / 2**20:.0f} | {r['max_rel_loss_diff']:.1e} |")


if __name__ == "__main__":
    main()
