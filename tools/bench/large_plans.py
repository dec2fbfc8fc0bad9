#!/usr/bin/env python3
"""Plans RaNNC's large BERTs before and after the memory techniques, and the
GPTs of Megatron-LM's Table 1, and prints a markdown table for docs/partitioner.md.

  .venv/bin/python tools/bench/large_plans.py --plan-tool build/tools/rannc-plan --work /tmp/large
      [--models bert4.9b,bert103.6b,gpt1.7b,gpt18.4b,gpt76.1b,gpt145.6b,gpt1008b]

Models come from models/make_large.py (weightless, seconds to write):
  BERT 4.9B  (96 layers x 2048, 32 heads, sequence 512) on 32 V100-32GB, batch 256;
  BERT 103.6B (128 layers x 8192, 64 heads, sequence 512) on 256 A100-80GB, batch 1024;
  GPT 1.7B to 1008B (Megatron-LM's Table 1 rows: sequence 2048, vocabulary
  51,200, A100-80GB, fp16, the table's GPU count and global batch), planned
  once with recomputation and sharding auto ("gpt" rows; no "before" run).
The planning time of the GPT rows is the Deliver 3 yardstick (< 60 s each);
the last column is the DP's stated bound when it restricted stage widths
(Note [device quantum] in planner/partition/dp.cpp).
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

# name: (make_large.py model and shape, device preset, devices, batch, the "after" precision:
# V100s have fp16 tensor cores but no bf16)
def gpt(row):
    return ["gpt", "--megatron", row]


MODELS = {
    "bert4.9b": (["bert", "--seq-len", "512", "--layers", "96", "--hidden", "2048", "--heads", "32"], "v100-32g", 32,
                 256, "fp16"),
    "bert103.6b": (["bert", "--seq-len", "512", "--layers", "128", "--hidden", "8192", "--heads", "64"], "a100-80g",
                   256, 1024, "bf16"),
    # Megatron-LM's Table 1 (Note [Megatron's table] in models/make_large.py): GPUs, global batch.
    "gpt1.7b": (gpt("1.7b"), "a100-80g", 32, 512, "fp16"),
    "gpt18.4b": (gpt("18.4b"), "a100-80g", 256, 1024, "fp16"),
    "gpt76.1b": (gpt("76.1b"), "a100-80g", 1024, 1792, "fp16"),
    "gpt145.6b": (gpt("145.6b"), "a100-80g", 1536, 2304, "fp16"),
    "gpt1008b": (gpt("1008b"), "a100-80g", 3072, 3072, "fp16"),
}
BERTS = "bert4.9b,bert103.6b"


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
    ap.add_argument("--models", default=BERTS, help=f"comma-separated, of {','.join(MODELS)}")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    rows = []
    for name in a.models.split(","):
        shape, device, gpus, batch, precision = MODELS[name]
        model = os.path.join(a.work, name + ".onnx")
        if not os.path.exists(model):
            run([a.python, os.path.join(ROOT, "models", "make_large.py"), shape[0], "-o", model] + shape[1:])
        runs = [(f"after: {precision}, recompute and zero auto", ["--precision", precision])]
        if shape[0] == "bert":
            runs.insert(0, ("before: fp32, no recompute, no zero", ["--precision", "fp32", "--recompute", "off",
                                                                     "--zero", "0"]))
        for label, flags in runs:
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
            bound = j["planner"].partition("stage widths in multiples of ")[2].rstrip(")") or "exact"
            rows.append((name, label,
                         f"{j['num_stages']} | {'/'.join(map(str, replicas))} | {j['microbatches']} | "
                         f"{j['bubble_fraction']:.1%} | {j['samples_per_s']:.1f} | {tflops:.0f} | "
                         f"{gib(max(s['peak_memory_bytes'] for s in st))} | {rec}/{len(st)} | {zero}/{len(st)} | "
                         f"{j['world_size']} | {bound}", seconds))
    print("| model | plan | stages | replicas | micro-batches | bubble | samples/s | TFLOP/s per device | "
          "memory per device (max) | recompute | zero | devices used | DP bound | planning s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, label, cells, seconds in rows:
        if cells.startswith("no plan"):
            cells = cells + " |" * 10
        print(f"| {name} | {label} | {cells} | {seconds:.1f} |")


if __name__ == "__main__":
    main()
