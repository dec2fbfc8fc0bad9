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

Megatron's end-to-end runs use its interleaved schedule (Narayanan et al.,
section 5.1): where this rannc-plan accepts `--schedule interleaved-1f1b` and
`--virtual-stages` (it says so in --help), the forced configuration of a row
with P > 1 is planned with them, V being the smallest number of model chunks
above 1 that divides the row's layers per stage (2 for 1008B: 128 layers on
64 stages; the table does not list Megatron's own V). Where rannc-plan
refuses the interleaved plan (it recomputes and shards chunks, but does not
yet run tensor-parallel chunks interleaved, and every row of Megatron's table
with P > 1 has T = 8), the row is planned under 1F1B and the script says so.

--terms prints, per forced plan, what its step consists of (from `show
--json`): the pipeline's slots per micro-batch, its fill and drain, its
steady part, the gradient all-reduce, and what the interleaved schedule with
V chunks would make of the fill and drain, (sum - max) / V, leaving the
V-fold stage transfers out (Note [interleaved estimate] below).

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


def has_interleaving(plan_tool):
    """Whether this rannc-plan plans Megatron's interleaved schedule."""
    p = subprocess.run([plan_tool, "--help"], text=True, capture_output=True)
    text = p.stdout + p.stderr
    return "interleaved-1f1b" in text and "--virtual-stages" in text


def virtual_stages(row):
    """The fewest model chunks above 1 per device that split the row's layers per stage evenly; 1 without a pipeline."""
    heads, hidden, layers, tp, pp, gpus, batch, tflops = row
    if pp == 1 or layers % pp:
        return 1
    per_stage = layers // pp
    return next((v for v in range(2, per_stage + 1) if per_stage % v == 0), 1)


# Note [interleaved estimate]
# With slots s_i = F_i + G_i per micro-batch (forward and backward, transfers
# and collectives included), 1F1B takes sum s + (M-1) max s (Note [partition
# cost model] in planner/partition/evaluate.cpp): the steady part (M-1) max s
# and the fill and drain, sum s, one slot of each stage. Megatron's
# interleaved schedule gives each device V chunks of 1/V of its layers, so
# the fill and drain run on chunks: for P uniform stages of slot t its
# bubble is (P-1) t / V instead of (P-1) t (Narayanan et al., section 2.2.2),
# i.e. (M-1) t + t + (sum - max) / V. Each chunk boundary is a transfer of its
# own, V times as many as 1F1B's, which this estimate leaves out (they are
# small next to a slot under scatter/gather).
def terms(j, v):
    """What the plan's step consists of, and the interleaved schedule's estimate with v chunks."""
    m = j["microbatches"]
    slots = [s["fwd_time_s"] + s["bwd_time_s"] for s in j["stages"]]
    ar = max(s["allreduce_time_s"] for s in j["stages"])
    fill, steady = sum(slots), (m - 1) * max(slots)
    if j["schedule"] != "1f1b":  # planned interleaved already (or GPipe): nothing to estimate
        v = 1
    interleaved = steady + max(slots) + (fill - max(slots)) / v + ar
    return {"microbatches": m, "slot_max_s": max(slots), "slot_min_s": min(slots), "fill_drain_s": fill,
            "steady_s": steady, "allreduce_s": ar, "one_f_one_b_s": fill + steady + ar,
            "predicted_s": j["predicted_step_time_s"], "virtual_stages": v, "interleaved_estimate_s": interleaved}


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
    ap.add_argument("--terms", action="store_true",
                    help="print what each forced prediction consists of, and the interleaved schedule's estimate")
    ap.add_argument("--check", type=float, metavar="TOL",
                    help="exit 1 unless each forced prediction is within TOL (e.g. 0.10) of Megatron's step")
    a = ap.parse_args()
    names = a.rows.split(",")
    for n in names:
        if n not in rows:
            ap.error(f"unknown row '{n}' (known: {', '.join(rows)})")
    os.makedirs(a.work, exist_ok=True)
    tp_flag = has_tensor_parallel(a.plan_tool)
    interleave = has_interleaving(a.plan_tool)
    out, failures, term_lines = [], [], []
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
            v = virtual_stages(row)
            if interleave and v > 1:
                forced += ["--schedule", "interleaved-1f1b", "--virtual-stages", str(v)]
            j, seconds = plan(a.plan_tool, model, row, os.path.join(a.work, f"gpt{name}-megatron.pb"), forced)
            if isinstance(j, str) and interleave and v > 1:
                # rannc's interleaved schedule refuses part of Megatron's configuration
                # (tensor-parallel chunks): the configuration under 1F1B,
                # whose interleaved estimate --terms gives (Note [interleaved estimate]).
                print(f"megatron_table: {name}: interleaved-1f1b refused ({j}); Megatron's configuration under 1f1b",
                      file=sys.stderr)
                forced = forced[:-4]
                j, more = plan(a.plan_tool, model, row, os.path.join(a.work, f"gpt{name}-megatron.pb"), forced)
                seconds += more
            if a.terms and not isinstance(j, str):
                t = terms(j, v)
                term_lines.append(f"{name}: " + ", ".join(f"{k} {x:.3f}" if isinstance(x, float) else f"{k} {x}"
                                                         for k, x in t.items())
                                  + f", interleaved / Megatron {t['interleaved_estimate_s'] / step:.3f}")
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
    for line in term_lines:
        print(line)
    for f in failures:
        print(f"megatron_table: {f}", file=sys.stderr)
    if a.check is not None and failures:
        sys.exit(1)


if __name__ == "__main__":
    main()
