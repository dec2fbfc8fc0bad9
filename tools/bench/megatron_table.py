#!/usr/bin/env python3
"""Plans the rows of Megatron-LM's weak-scaling table and holds rannc against it.

  .venv/bin/python tools/bench/megatron_table.py --plan-tool build/tools/rannc-plan --work /tmp/megatron \\
      [--rows 1.7b,18.4b,145.6b,1008b] [--check 0.10]

Megatron-LM's table (Narayanan et al., SC'21, arXiv 2104.04473, Table 1; the
rows are MEGATRON_ROWS in models/make_large.py, Note [Megatron's table]) gives
per GPT model the GPUs, the global batch, tensor x pipeline x data
parallelism and the teraFLOP/s per GPU it reached on A100-80GB GPUs in mixed
precision with activation recomputation. The step time that implies is
computed here, under Megatron's own FLOP count (its equation 3, the
recomputed forward included):

    F = 96 B s l h^2 (1 + s / (6 h) + V / (16 l h))   per step
    step = F / (teraFLOP/s per GPU x GPUs)

For each row: the weightless GPT of models/make_large.py; rannc's prediction
for Megatron's own configuration, forced with `--tensor-parallel T --stages P
--replicas D --recompute on --precision fp16` (rows with T > 1 only where this
rannc-plan has --tensor-parallel); rannc's own plan (`--precision fp16`, the
rest chosen, `--tensor-parallel auto` where it exists) with its prediction
and its planning time (wall clock); and the ratios: the forced prediction
over Megatron's step (1.00 = the cost model agrees), and the own plan's
throughput over Megatron's (> 1 = rannc plans faster).

--check TOL exits 1 unless every forced prediction lies within TOL of
Megatron's step (the ctest megatron_table_1_7b runs the 1.7B row so).
"""
import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from large_plans import run  # noqa: E402  (a failed command ends the benchmark with its error)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SEQ, VOCAB = 2048, 51200


def load_rows():
    spec = importlib.util.spec_from_file_location("make_large", os.path.join(ROOT, "models", "make_large.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MEGATRON_ROWS


def megatron_flops(batch, layers, hidden, seq=SEQ, vocab=VOCAB):
    """Megatron's FLOPs per step (forward, backward and the recomputed forward)."""
    return 96 * batch * seq * layers * hidden ** 2 * (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden))


def megatron_step(row):
    """The step time (s) Megatron's reported teraFLOP/s per GPU implies."""
    heads, hidden, layers, tp, pp, gpus, batch, tflops = row
    return megatron_flops(batch, layers, hidden) / (tflops * 1e12 * gpus)


def has_tensor_parallel(plan_tool):
    p = subprocess.run([plan_tool, "--help"], text=True, capture_output=True)
    return "--tensor-parallel" in p.stdout + p.stderr


def plan(plan_tool, model, row, out, flags):
    """Plans; returns (show --json, seconds) or (the error's last line, seconds)."""
    heads, hidden, layers, tp, pp, gpus, batch, tflops = row
    t0 = time.monotonic()
    p = subprocess.run([plan_tool, model, "--gpus", str(gpus), "--device-type", "a100-80g", "--batch-size",
                        str(batch), "--precision", "fp16", "--profile", "analytic", "--optimizer", "adam", "-o", out]
                       + flags, text=True, capture_output=True)
    seconds = time.monotonic() - t0
    if p.returncode != 0:
        lines = p.stderr.strip().splitlines() or ["(no message)"]
        return lines[-1], seconds
    return json.loads(run([plan_tool, "show", out, "--json"]).stdout), seconds


def shape(j):
    stages = j["stages"]
    tps = sorted({s.get("tensor_parallel", 1) for s in stages})
    reps = sorted({len(s["ranks"]) // s.get("tensor_parallel", 1) for s in stages})
    rec = sum(1 for s in stages if s["recompute"])
    return (f"{'/'.join(map(str, tps))} x {j['num_stages']} x {'/'.join(map(str, reps))}, "
            f"M={j['microbatches']}, recompute {rec}/{len(stages)}")


def main():
    rows = load_rows()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plan-tool", required=True)
    ap.add_argument("--work", required=True, help="a folder for the models and plans (models are reused)")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--rows", default="1.7b,18.4b,145.6b,1008b", help=f"comma-separated, of {','.join(rows)}")
    ap.add_argument("--no-own-plan", action="store_true", help="only Megatron's configuration")
    ap.add_argument("--check", type=float, metavar="TOL",
                    help="exit 1 unless each forced prediction is within TOL (e.g. 0.10) of Megatron's step")
    a = ap.parse_args()
    names = a.rows.split(",")
    for n in names:
        if n not in rows:
            ap.error(f"unknown row '{n}' (known: {', '.join(rows)})")
    os.makedirs(a.work, exist_ok=True)
    tp_flag = has_tensor_parallel(a.plan_tool)
    out, failures = [], []
    for name in names:
        row = rows[name]
        heads, hidden, layers, tp, pp, gpus, batch, tflops = row
        dp = gpus // (tp * pp)
        model = os.path.join(a.work, f"gpt{name}.onnx")
        if not os.path.exists(model):
            run([a.python, os.path.join(ROOT, "models", "make_large.py"), "gpt", "--megatron", name, "-o", model])
        step = megatron_step(row)
        cells = [f"{name.upper()}", str(gpus), str(batch), f"{tp} x {pp} x {dp}", f"{tflops}", f"{step:.2f}"]
        if tp > 1 and not tp_flag:
            cells += ["needs --tensor-parallel", "-", "-"]
        else:
            forced = ["--stages", str(pp), "--replicas", str(dp), "--recompute", "on"]
            if tp_flag:
                forced = ["--tensor-parallel", str(tp)] + forced
            j, seconds = plan(a.plan_tool, model, row, os.path.join(a.work, f"gpt{name}-megatron.pb"), forced)
            if isinstance(j, str):
                cells += [f"no plan: {j}", "-", f"{seconds:.1f}"]
                failures.append(f"{name}: Megatron's configuration did not plan: {j}")
            else:
                ratio = j["predicted_step_time_s"] / step
                cells += [f"{j['predicted_step_time_s']:.2f}", f"{ratio:.2f}", f"{seconds:.1f}"]
                if a.check is not None and abs(ratio - 1) > a.check:
                    failures.append(f"{name}: predicted {j['predicted_step_time_s']:.3f} s for Megatron's "
                                    f"configuration, {ratio:.3f}x its {step:.3f} s (tolerance {a.check})")
        if a.no_own_plan:
            cells += ["-"] * 4
        else:
            own = ["--tensor-parallel", "auto"] if tp_flag else []
            j, seconds = plan(a.plan_tool, model, row, os.path.join(a.work, f"gpt{name}-rannc.pb"), own)
            if isinstance(j, str):
                cells += [f"no plan: {j}", "-", "-", f"{seconds:.1f}"]
            else:
                speed = (batch / j["predicted_step_time_s"]) / (batch / step)
                cells += [shape(j), f"{j['predicted_step_time_s']:.2f}", f"{speed:.2f}", f"{seconds:.1f}"]
        out.append(cells)
        print(" | ".join(cells), file=sys.stderr, flush=True)
    print("| model | GPUs | batch | Megatron TP x PP x DP | Megatron TF/s per GPU | Megatron step s | "
          "rannc, Megatron's configuration, step s | vs Megatron | planning s | rannc's own plan (TP x PP x DP) | "
          "step s | throughput vs Megatron | planning s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for cells in out:
        print("| " + " | ".join(cells) + " |")
    for f in failures:
        print(f"megatron_table: {f}", file=sys.stderr)
    if a.check is not None and failures:
        sys.exit(1)


if __name__ == "__main__":
    main()
