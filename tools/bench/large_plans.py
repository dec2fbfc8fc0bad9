#!/usr/bin/env python3
"""Plans RaNNC's large BERTs before and after the memory techniques, and
prints a markdown table for docs/partitioner.md.

  .venv/bin/python tools/bench/large_plans.py --plan-tool build/tools/rannc-plan --work /tmp/large

Models come from models/make_large.py (weightless, seconds to write):
  BERT 4.9B  (96 layers x 2048, 32 heads, sequence 512) on 32 V100-32GB, batch 256;
  BERT 103.6B (128 layers x 8192, 64 heads, sequence 512) on 256 A100-80GB, batch 1024.
"Before" is what the planner could do without them: fp32, no recomputation,
no sharding (--precision fp32 --recompute off --zero 0). "After" lets it
choose (--recompute auto --zero auto) in mixed precision (fp16 on V100s,
which have no bf16, bf16 on A100s). Each row: stages, replicas, micro-batches, the pipeline bubble, the
predicted samples/s, the largest per-device memory, where recomputation and
sharding were chosen, and the planning time (wall clock, this machine). The
predicted throughput is held against Megatron-LM's reported figure with
--megatron (per-GPU TFLOP/s).
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# name: (make_large.py shape, device preset, devices, batch, the "after" precision:
# V100s have fp16 tensor cores but no bf16)
MODELS = {
    "bert4.9b": (["--layers", "96", "--hidden", "2048", "--heads", "32"], "v100-32g", 32, 256, "fp16"),
    "bert103.6b": (["--layers", "128", "--hidden", "8192", "--heads", "64"], "a100-80g", 256, 1024, "bf16"),
}


def run(cmd):
    p = subprocess.run(cmd, text=True, capture_output=True)
    if p.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stderr[-3000:]}")
    return p


def gib(b):
    return f"{b / 2**30:.1f} GiB"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plan-tool", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--models", default=",".join(MODELS))
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    rows = []
    for name in a.models.split(","):
        shape, device, gpus, batch, precision = MODELS[name]
        model = os.path.join(a.work, name + ".onnx")
        if not os.path.exists(model):
            run([a.python, os.path.join(ROOT, "models", "make_large.py"), "bert", "-o", model, "--seq-len", "512"]
                + shape)
        for label, flags in (("before: fp32, no recompute, no zero", ["--precision", "fp32", "--recompute", "off",
                                                                       "--zero", "0"]),
                             (f"after: {precision}, recompute and zero auto", ["--precision", precision])):
            plan = os.path.join(a.work, f"{name}-{label.split(':')[0]}.pb")
            t0 = time.monotonic()
            p = subprocess.run([a.plan_tool, model, "--gpus", str(gpus), "--device-type", device, "--batch-size",
                                str(batch), "--optimizer", "adam", "-o", plan] + flags, text=True, capture_output=True)
            seconds = time.monotonic() - t0
            if p.returncode != 0:
                rows.append((name, label, f"no plan: {p.stderr.strip().splitlines()[-1]}", seconds))
                continue
            j = json.loads(run([a.plan_tool, "show", plan, "--json"]).stdout)
            st = j["stages"]
            replicas = sorted({len(s["ranks"]) for s in st})
            rec = sum(1 for s in st if s["recompute"])
            zero = sum(1 for s in st if s["zero"])
            tflops = j["samples_per_s"] * j["training_flops_per_sample"] / j["world_size"] / 1e12
            rows.append((name, label,
                         f"{j['num_stages']} | {'/'.join(map(str, replicas))} | {j['microbatches']} | "
                         f"{j['bubble_fraction']:.1%} | {j['samples_per_s']:.1f} | {tflops:.0f} | "
                         f"{gib(max(s['peak_memory_bytes'] for s in st))} | {rec}/{len(st)} | {zero}/{len(st)} | "
                         f"{j['world_size']}", seconds))
    print("| model | plan | stages | replicas | micro-batches | bubble | samples/s | TFLOP/s per device | "
          "memory per device (max) | recompute | zero | devices used | planning s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, label, cells, seconds in rows:
        if cells.startswith("no plan"):
            cells = cells + " |" * 9
        print(f"| {name} | {label} | {cells} | {seconds:.1f} |")


if __name__ == "__main__":
    main()
