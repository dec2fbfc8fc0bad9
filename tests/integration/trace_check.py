#!/usr/bin/env python3
"""rannc-exec --trace and rannc-plan compare on a 2-stage 1F1B run (issue 30).

Makes a GPT-style model of sizes nobody tuned the cost model on, plans it for
2 CPU ranks with measured unit costs (the profiler, this machine), trains a few
steps with --trace and --log, and checks:
- the trace's structure: every rank's lane named as `rannc-plan simulate
  --trace` names it, the same event names and categories (Note [trace lanes]),
  every scheduled action of every step present and in order, no overlaps,
  a memory counter per step;
- that it agrees with the --log (each step's span against its step_time_s);
- `rannc-plan compare --json`: each stage's peak memory within --tolerance
  of the plan's (docs/cost-model.md states 10%), the step time on own cores
  (the measured step times the run's CPU share) within it where the ranks had
  their cores (Note [timing on a loaded machine] below; printed otherwise),
  and the text table printing every stage.

  .venv/bin/python tests/integration/trace_check.py --plan-tool build/tools/rannc-plan \\
      --exec-tool build/tools/rannc-exec --work /tmp/tc
"""
import argparse
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MIN_SHARE = 0.9  # Note [timing on a loaded machine]
CATEGORIES = {"forward", "backward", "recompute", "recv", "send", "all-reduce", "optimizer", "idle"}


def run(cmd, **kw):
    print("+", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, text=True, capture_output=True, timeout=600, **kw)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    return p


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plan-tool", required=True)
    ap.add_argument("--exec-tool", required=True)
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--work", required=True)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--tolerance", type=float, default=0.10)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    batch = 16
    model_dir = os.path.join(a.work, "model")
    run([sys.executable, os.path.join(ROOT, "models", "make_model.py"), "--model", "gpt", "--layers", "4",
         "--hidden", "192", "--heads", "6", "--seq-len", "48", "--vocab", "500", "--batch-size", str(batch),
         "--samples", str(batch * (a.steps + 1)), "--steps", "0", "--no-variants", "--out", model_dir])
    plan = os.path.join(a.work, "plan.pb")
    run([a.plan_tool, os.path.join(model_dir, "model.onnx"), "--gpus", "2", "--device-type", "cpu", "--stages", "2",
         "--schedule", "1f1b", "--batch-size", str(batch), "--microbatches", str(a.microbatches), "--optimizer",
         "sgd", "-o", plan])
    trace_file, log_file = os.path.join(a.work, "trace.json"), os.path.join(a.work, "log.jsonl")
    run([a.mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2", a.exec_tool, plan, "--data",
         os.path.join(model_dir, "data"), "--steps", str(a.steps), "--optimizer", "sgd", "--log", log_file,
         "--trace", trace_file])
    sim_file = os.path.join(a.work, "simulated.json")
    run([a.plan_tool, "simulate", plan, "--trace", sim_file])

    failures = []

    def check(ok, what):
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)

    trace = json.load(open(trace_file))["traceEvents"]
    sim = json.load(open(sim_file))["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in trace if e["ph"] == "M" and e["name"] == "process_name"}
    sim_names = {e["pid"]: e["args"]["name"] for e in sim if e["ph"] == "M" and e["name"] == "process_name"}
    check(names == sim_names and len(names) == 2, f"lanes named as simulate's: {names} vs {sim_names}")
    actions = [e for e in trace if e["ph"] == "X"]
    counters = [e for e in trace if e["ph"] == "C"]
    check({e["cat"] for e in actions} <= CATEGORIES, f"categories {sorted({e['cat'] for e in actions})}")
    sim_cats = {e["cat"] for e in sim if e["ph"] == "X"}
    check(sim_cats - {"recompute"} <= {e["cat"] for e in actions},
          f"simulate's categories {sorted(sim_cats)} all measured")
    name_form = re.compile(r"^(forward|backward|recompute|recv|send) \d+$|^(all-reduce|optimizer|idle)$")
    check(all(name_form.match(e["name"]) for e in actions + [e for e in sim if e["ph"] == "X"]),
          "event names 'forward 3', 'recv 2', 'optimizer' in both traces")
    check(all(e.get("args", {}).get("what") in ("activations", "gradients") for e in actions
              if e["cat"] in ("recv", "send")), "sends and receives say what they carry")
    check(all(e["tid"] == 0 for e in actions) and all(e["tid"] == 0 for e in sim if e["ph"] == "X"),
          "one lane per rank (tid 0) in both")
    M, S = a.microbatches, a.steps
    for rank in (0, 1):
        mine = sorted((e for e in actions if e["pid"] == rank), key=lambda e: e["ts"])
        check(all(e["args"]["stage"] == rank for e in mine), f"rank {rank} runs stage {rank}")
        for step in range(S):
            of_step = [e for e in mine if e["args"]["step"] == step]
            count = lambda name: sum(1 for e in of_step if e["name"] == name)
            fwd = [e["args"]["microbatch"] for e in of_step if e["cat"] == "forward"]
            bwd = [e["args"]["microbatch"] for e in of_step if e["cat"] == "backward"]
            ok = sorted(fwd) == list(range(M)) and sorted(bwd) == list(range(M)) and count("optimizer") == 1
            sends = {e["args"]["what"] for e in of_step if e["cat"] == "send"}
            recvs = {e["args"]["what"] for e in of_step if e["cat"] == "recv"}
            ok = ok and sends == ({"activations"} if rank == 0 else {"gradients"})
            ok = ok and recvs == ({"gradients"} if rank == 0 else {"activations"})
            if step in (0, S - 1) or not ok:
                check(ok, f"rank {rank} step {step}: {M} forwards, {M} backwards, its sends and receives, "
                          f"one optimizer step")
        # 1F1B's order on the last stage: forward m then backward m.
        if rank == 1:
            seq = [e["name"] for e in mine if e["args"]["step"] == 0 and e["cat"] in ("forward", "backward")]
            check(seq == [f"{k} {m}" for m in range(M) for k in ("forward", "backward")], f"1F1B order {seq}")
        overlaps = sum(1 for p, q in zip(mine, mine[1:]) if q["ts"] < p["ts"] + p["dur"] - 0.01)
        check(overlaps == 0, f"rank {rank}: actions do not overlap ({overlaps})")
        mem = [e for e in counters if e["pid"] == rank and e["name"] == "memory"]
        check(len(mem) == S and all(e["args"]["bytes"] > 0 for e in mem), f"rank {rank}: a memory counter per step")

    # The trace against the log: each step's span over both ranks vs step_time_s.
    log = [json.loads(line) for line in open(log_file)]
    for step in range(1, S):
        ev = [e for e in actions if e["args"]["step"] == step]
        span = (max(e["ts"] + e["dur"] for e in ev) - min(e["ts"] for e in ev)) * 1e-6
        logged = log[step]["step_time_s"]
        check(abs(span - logged) <= 0.05 * logged + 2e-3, f"step {step}: span {span:.4f} s, log {logged:.4f} s")

    # Predicted against measured.
    cmp = json.loads(run([a.plan_tool, "compare", plan, trace_file, "--json"]).stdout)
    text = run([a.plan_tool, "compare", plan, trace_file]).stdout
    print(text)
    check(all(f"\n{s}      " in text for s in ("0", "1")) and "step time" in text, "the table prints both stages")
    rows = {(r["stage"], r["what"]): r for r in cmp["rows"]}
    def step_text(row, held=True):
        return (f"{row['what']}: predicted {row['predicted'] * 1e3:.2f} ms, measured {row['measured'] * 1e3:.2f} ms, "
                f"ratio {row['ratio']:.3f}" + (f" within {a.tolerance:.0%}" if held else ""))

    # Note [timing on a loaded machine]: the plan predicts ranks that have a
    # core each (the profile is in CPU time, Note [CPU time on a shared
    # machine]), and the cost model states its 10% for the step time and each
    # stage's peak memory (docs/cost-model.md, "Accuracy, measured"). Whether
    # the ranks had their cores is measured in the run itself: its CPU share
    # (the compute actions' CPU time over their wall time). Where it is at
    # least MIN_SHARE the step is held to the stated accuracy. Below it, the
    # step is printed, not held: at shares 0.69, 0.14 and 0.085 the step on
    # own cores was 0.82, 0.87 and 0.91 of the prediction (each hand-over
    # waits for the receiving rank's next time slice, which the share does
    # not scale away), and a load average taken before the run does not tell
    # what ran beside it (ctest -j2 starts other tests). Each stage's compute
    # in CPU time is printed only: on this VM the same work's CPU time moved
    # by up to 30% between runs minutes apart (host contention is counted as
    # the guest's CPU time), 0.96-1.00 of the prediction under load and
    # 1.11-1.13 on an idle machine; it is outside the stated accuracy's claim.
    check(all("cpu_us" in e["args"] for e in actions if e["cat"] != "idle"),
          "every recorded action carries its CPU time (idle gaps are drawn, not recorded)")
    check(0 < cmp["cpu_share"] <= 1.05, f"the run's CPU share {cmp['cpu_share']:.3f}")
    for s in ("0", "1"):
        print(f"INFO stage {s} " + step_text(rows[(s, "busy per step, CPU time")], held=False))
    own = rows[("all", "step time on own cores")]
    if cmp["cpu_share"] >= MIN_SHARE:
        check(abs(own["ratio"] - 1) <= a.tolerance, step_text(own))
    else:
        print(f"NOT CHECKED {step_text(own, held=False)}: the ranks computed {cmp['cpu_share']:.0%} of the wall time "
              f"(held where at least {MIN_SHARE:.0%}; plain step {rows[('all', 'step time')]['ratio']:.3f})")
    for s in ("0", "1"):
        m = rows[(s, "peak memory")]
        check(abs(m["ratio"] - 1) <= a.tolerance,
              f"stage {s} peak memory: predicted {m['predicted'] / 2**20:.2f} MiB, measured "
              f"{m['measured'] / 2**20:.2f} MiB, ratio {m['ratio']:.3f} within {a.tolerance:.0%}")
        logged_peak = max(l["peak_memory_bytes_per_rank"][int(s)] for l in log)
        check(m["measured"] == logged_peak, f"stage {s}: the trace's peak is the log's ({logged_peak})")
    if failures:
        sys.exit(f"{len(failures)} check(s) failed")
    print("trace_check: all checks passed")


if __name__ == "__main__":
    main()
