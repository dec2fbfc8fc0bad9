#!/usr/bin/env python3
"""rannc-exec benchmarks, each a ratio measured side by side in one run:

1. interpreter overhead: one rank, one stage, rannc-exec's median step time vs
   the same model traced to TorchScript and trained by LibTorch directly
   (torchscript_step), same data, batch, optimizer and 1 thread. Goal <= 1.0x.
   The ONNX model runs as imported (fused, Note [pattern fusion]), with
   --no-fuse (as the exporter wrote it), and the traced model through
   rannc-exec's ATen path; their measured peaks side by side too.
2. pipeline efficiency: a 2-stage plan on 2 ranks (1 thread each, 8
   micro-batches) vs 1 rank: throughput ratio, goal >= 0.8 x 2.
3. data parallelism: 2 replicas of one stage vs 1 rank, goal >= 0.9 x 2; and
   beside it the machine's own bound for 2 ranks: two independent 1-rank runs
   of the same plan at once (no communication), whose throughput over one
   rank's is what this machine's cores, caches and memory bandwidth (and its
   other load) allow any 2-rank run; data parallelism's share of that bound
   is what rannc's replicas (the gradient all-reduce, the split) cost.
4. measured peak tensor memory per rank vs the plan's estimate.
5. ZB-H1, ZB-H2 and interleaved 1F1B vs 1F1B (issue 28): the 2-stage,
   8-micro-batch plan of 2. run under 1F1B and each of --schedules (the same
   stages: only the plan's schedule field differs; interleaved 1F1B is
   planned with 2 chunks on each of the 2 ranks), alternately, --rounds
   times each; throughput
   ratio of the medians, goal > 1. Beside it, each schedule's measured step
   against its own bound, the closed form of its order (pipelineTime, as
   `show` computes it) on the same run's median forward, B and W per stage
   (its --trace) plus the all-reduce and optimizer step of the rank that
   reached its step last: goal >= 0.95. And what splitting the backward
   costs: each stage's median B + W under a split schedule over its median
   backward under 1F1B, and the same with each run's slots over its own
   forward (steadier: this machine's speed drifts between runs).
   --schedules-only runs this one alone.

  .venv/bin/python tools/bench/exec_bench.py [--build build] [--steps 12] [--schedules-only]
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = ["--model", "gpt", "--layers", "4", "--hidden", "256", "--heads", "8", "--seq-len", "64", "--vocab", "512"]
BATCH = 32


def run(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{p.stdout}\n{p.stderr}")
    return p


def median_step(log):
    steps = [json.loads(l) for l in open(log)]
    times = sorted(s["step_time_s"] for s in steps[2:])
    return times[len(times) // 2], steps


def exec_run(a, work, name, plan_args, ranks, model="model.onnx"):
    plan = os.path.join(work, f"{name}.pb")
    data = ["--data", os.path.join(work, "data")] if model.endswith(".pt") else []
    run([a.plan_tool, os.path.join(work, model), "--gpus", str(ranks), "--batch-size", str(BATCH),
         "--optimizer", "sgd", "-o", plan] + data + plan_args)
    return exec_plan(a, work, name, plan, ranks)


def exec_plan(a, work, name, plan, ranks, extra=()):
    log = os.path.join(work, f"{name}.jsonl")
    run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks), a.exec_tool, plan, "--data",
         os.path.join(work, "data"), "--steps", str(a.steps), "--optimizer", "sgd", "--lr", "0.01", "--log", log]
        + list(extra))
    t, steps = median_step(log)
    shown = json.loads(run([a.plan_tool, "show", plan, "--json"]).stdout)
    return t, steps, shown


def concurrent_runs(a, work, name, copies):
    """The median steps of `copies` 1-rank runs of plan `name` started together, each its own process."""
    procs, logs = [], []
    for i in range(copies):
        logs.append(os.path.join(work, f"{name}_copy{i}.jsonl"))
        procs.append(subprocess.Popen(
            # --bind-to none: each mpirun alone would bind its one rank to the first core, both to the same one.
            ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "1", a.exec_tool,
             os.path.join(work, f"{name}.pb"),
             "--data", os.path.join(work, "data"), "--steps", str(a.steps), "--optimizer", "sgd", "--lr", "0.01",
             "--log", logs[-1]], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for p in procs:
        out, err = p.communicate()
        if p.returncode != 0:
            sys.exit(f"concurrent run of {name} failed:\n{out}\n{err}")
    return [median_step(log)[0] for log in logs]


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else 0.0


def own_bound(a, work, name, plan_json, trace):
    """A schedule's own bound for one run: the closed form of its order
    (pipeline::pipelineTime, through `show`'s bubble fraction) with the run's
    own median forward, B and W per stage, plus its all-reduce and optimizer
    step, from its --trace (steps 2.. as median_step). The step begins with
    every rank agreeing on finite gradients (Note [one step over a rank's
    chunks]), so a rank that drains early waits inside its optimizer event:
    each step counts the rank that reached its step last, which hardly waits
    (counting the longest, the bound took 1F1B's last stage's wait for the
    first stage's drain twice, and 1F1B ran 3.5-5.7% under it). Returns the
    bound and each stage's median (F, B, W)."""
    events = [e for e in json.load(open(trace))["traceEvents"]
              if e.get("ph") == "X" and e.get("args", {}).get("step", 0) >= 2]
    plan = json.load(open(plan_json))
    slots = {}  # stage -> kind -> durations (s)
    after = {}  # step -> rank -> [its step's first start (us), all-reduce and optimizer seconds]
    for e in events:
        st, dur = e["args"]["stage"], e["dur"] * 1e-6
        kind = {"forward": "f", "backward": "w" if e["args"].get("what") == "weights" else "b"}.get(e["cat"])
        if kind:
            slots.setdefault(st, {}).setdefault(kind, []).append(dur)
        elif e["cat"] in ("all-reduce", "optimizer"):
            at = after.setdefault(e["args"]["step"], {}).setdefault(e["pid"], [e["ts"], 0.0])
            at[0] = min(at[0], e["ts"])
            at[1] += dur
    M = plan["microbatches"]
    busy = 0.0
    medians = {}
    for i, stage in enumerate(plan["stages"]):
        f, b, w = (median(slots.get(i, {}).get(k, [])) for k in "fbw")
        medians[i] = (f, b, w)
        stage["estimates"].update(fwd_time_s=f, bwd_time_s=b + w, weight_time_s=w)
        busy += M * (f + b + w)
    edited = os.path.join(work, f"{name}_measured.json")
    json.dump(plan, open(edited, "w"))
    shown = json.loads(run([a.plan_tool, "show", edited, "--json"]).stdout)
    ranks = len(plan["stages"]) // max(1, plan.get("virtual_stages", 1))  # an interleaved rank runs v stages
    pipe = busy / (ranks * (1 - shown["predicted_bubble_fraction"]))
    last = [max(by_rank.values())[1] for by_rank in after.values()]  # the rank that started its step last
    return pipe + median(last), medians


def compare_schedules(a, work):
    """5.: the pipe plan under 1F1B and under each of --schedules (its schedule field changed), alternately;
    and each run's measured step against its schedule's own bound (own_bound)."""
    plans = {"1F1B": os.path.join(work, "pipe.pb")}
    for name in a.schedules.split(","):
        if name == "INTERLEAVED_1F1B":  # its own plan: 2 chunks on each of the 2 ranks, other stages
            plans[name] = os.path.join(work, "interleaved.pb")
            run([a.plan_tool, os.path.join(work, "model.onnx"), "--gpus", "2", "--batch-size", str(BATCH),
                 "--optimizer", "sgd", "-o", plans[name], "--stages", "2", "--replicas", "1", "--microbatches", "8",
                 "--schedule", "interleaved-1f1b", "--virtual-stages", "2"])
            continue
        as_json = os.path.join(work, f"{name.lower()}.json")
        run([a.plan_tool, "convert", plans["1F1B"], "-o", as_json])
        edited = json.load(open(as_json))
        edited["schedule"] = name
        json.dump(edited, open(as_json, "w"))
        plans[name] = os.path.join(work, f"{name.lower()}.pb")
        run([a.plan_tool, "convert", as_json, "-o", plans[name]])
    times = {name: [] for name in plans}
    bounds = {name: [] for name in plans}
    slots = {name: [] for name in plans}  # each run's per-stage median (F, B, W)
    for k in range(a.rounds):
        for name, plan in plans.items():
            run_name = f"{name.lower()}_{k}"
            trace = os.path.join(work, f"{run_name}.trace.json")
            times[name].append(exec_plan(a, work, run_name, plan, 2, ["--trace", trace])[0])
            plan_json = os.path.join(work, f"{run_name}_plan.json")
            run([a.plan_tool, "convert", plan, "-o", plan_json])
            bound, medians = own_bound(a, work, run_name, plan_json, trace)
            bounds[name].append(bound)
            slots[name].append(medians)
    med = {name: sorted(t)[a.rounds // 2] for name, t in times.items()}
    ob = med["1F1B"]
    for name in plans:
        if name == "1F1B":
            continue
        print(f"| 2-stage pipeline, 8 micro-batches, {name} vs 1F1B (medians of {a.rounds} alternating runs: "
              f"{name} {', '.join(f'{t * 1e3:.1f}' for t in times[name])} ms, 1F1B "
              f"{', '.join(f'{t * 1e3:.1f}' for t in times['1F1B'])} ms) | {BATCH / med[name]:.1f} samples/s "
              f"| 1F1B {BATCH / ob:.1f} samples/s | {ob / med[name]:.3f}x | > 1x |")
    for name in plans:  # what splitting the backward costs: B + W against 1F1B's whole backward, per stage
        if name == "1F1B" or not any(w for run_slots in slots[name] for _, _, w in run_slots.values()):
            continue
        per_stage = []
        for st in sorted(slots["1F1B"][0]):
            whole = median([r[st][1] for r in slots["1F1B"]])
            split = median([r[st][1] + r[st][2] for r in slots[name]])
            # Each run's slots over its own forward: the machine's speed drifts between runs, not within one.
            per_f = median([(r[st][1] + r[st][2]) / r[st][0] for r in slots[name]]) / median(
                [r[st][1] / r[st][0] for r in slots["1F1B"]])
            per_stage.append(f"stage {st}: {split * 1e3:.1f} vs {whole * 1e3:.1f} ms, {split / whole:.3f}; "
                             f"per forward {per_f:.3f}")
        print(f"| {name}: B + W over 1F1B's backward, medians over the runs, and each run's over its own forward "
              f"({'; '.join(per_stage)}) | | | | |")
    for name in plans:  # each run against its own bound, then the median ratio
        ratios = [b / t for b, t in zip(bounds[name], times[name])]
        print(f"| {name}: measured step vs its own bound (closed form of its order on the run's own median F, B, "
              f"W per stage, plus its all-reduce and optimizer step; runs: "
              f"{', '.join(f'{t * 1e3:.1f} vs {b * 1e3:.1f}' for t, b in zip(times[name], bounds[name]))} ms) "
              f"| {med[name] * 1e3:.1f} ms | bound {median(bounds[name]) * 1e3:.1f} ms | {median(ratios):.3f} "
              f"| >= 0.95 |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=5, help="runs of each schedule in the comparison with 1F1B")
    ap.add_argument("--schedules", default="ZB_H1,ZB_H2,INTERLEAVED_1F1B",
                    help="plan schedule names compared with 1F1B (5.); INTERLEAVED_1F1B is planned on its own "
                         "(2 chunks a rank), the others are the 1F1B plan with its schedule field changed")
    ap.add_argument("--schedules-only", action="store_true", help="run benchmark 5 alone")
    a = ap.parse_args()
    a.plan_tool = os.path.join(a.build, "tools", "rannc-plan")
    a.exec_tool = os.path.join(a.build, "tools", "rannc-exec")
    work = os.path.join(a.build, "exec_bench")
    run([sys.executable, os.path.join(ROOT, "models", "make_model.py"), *MODEL, "--out", work, "--batch-size",
         str(BATCH), "--samples", str(4 * BATCH), "--steps", "0", "--torchscript"])

    pipe_args = ["--stages", "2", "--replicas", "1", "--microbatches", "8", "--schedule", "1f1b"]
    if a.schedules_only:
        _, _, pipe_plan = exec_run(a, work, "pipe", pipe_args, 2)
        print(f"model: GPT-style, {pipe_plan['stages'][0]['num_params']} + {pipe_plan['stages'][1]['num_params']} "
              f"parameters, batch {BATCH}, {os.cpu_count()} cores, 1 thread per rank, median of steps 2..{a.steps - 1}\n")
        print("| benchmark | rannc | reference | ratio | goal |")
        print("|---|---|---|---|---|")
        compare_schedules(a, work)
        return
    one, one_steps, one_plan = exec_run(a, work, "one", ["--profile", "analytic", "--microbatches", "1"], 1)
    ts = float(run([os.path.join(a.build, "tools", "bench", "torchscript_step"), os.path.join(work, "model.pt"),
                    os.path.join(work, "data"), "--inputs", "input_ids,labels", "--batch-size", str(BATCH),
                    "--steps", str(a.steps), "--threads", "1", "--optimizer", "sgd"]).stdout)
    unfused, unfused_steps, _ = exec_run(a, work, "one_nofuse",
                                         ["--profile", "analytic", "--microbatches", "1", "--no-fuse"], 1)
    aten, aten_steps, _ = exec_run(a, work, "one_aten", ["--profile", "analytic", "--microbatches", "1"], 1,
                                   model="model.pt")
    one8, _, _ = exec_run(a, work, "one8", ["--profile", "analytic", "--microbatches", "8"], 1)
    pipe, pipe_steps, pipe_plan = exec_run(a, work, "pipe", pipe_args, 2)
    dp, _, _ = exec_run(a, work, "dp", ["--profile", "analytic", "--stages", "1", "--replicas", "2",
                                        "--microbatches", "1"], 2)
    pair = concurrent_runs(a, work, "one", 2)
    bound = sum(one / t for t in pair)  # two ranks' throughput over one rank's, with nothing shared between them
    print(f"model: GPT-style, {one_plan['stages'][0]['num_params']} parameters, batch {BATCH}, "
          f"{os.cpu_count()} cores, 1 thread per rank, median of steps 2..{a.steps - 1}\n")
    print("| benchmark | rannc | reference | ratio | goal |")
    print("|---|---|---|---|---|")
    print(f"| interpreter overhead (1 rank, ONNX fused) | {one * 1e3:.1f} ms/step | TorchScript in LibTorch "
          f"{ts * 1e3:.1f} ms/step | {one / ts:.2f}x | <= 1.0x |")
    print(f"| ONNX unfused (--no-fuse), 1 rank | {unfused * 1e3:.1f} ms/step | TorchScript in LibTorch "
          f"{ts * 1e3:.1f} ms/step | {unfused / ts:.2f}x | (before) |")
    print(f"| ATen path (traced model.pt), 1 rank | {aten * 1e3:.1f} ms/step | TorchScript in LibTorch "
          f"{ts * 1e3:.1f} ms/step | {aten / ts:.2f}x | |")
    peak = lambda steps: max(s["peak_memory_bytes"] for s in steps)
    for label, steps in (("ONNX fused", one_steps), ("ONNX unfused (--no-fuse)", unfused_steps)):
        print(f"| peak memory, 1 rank, {label} | {peak(steps) / 2**20:.2f} MiB | ATen path "
              f"{peak(aten_steps) / 2**20:.2f} MiB | {peak(steps) / peak(aten_steps):.2f}x | <= 1.0x |")
    print(f"| 2-stage pipeline, 8 micro-batches, 1F1B | {BATCH / pipe:.1f} samples/s | 1 rank, 8 micro-batches "
          f"{BATCH / one8:.1f} samples/s | {one8 / pipe:.2f}x | >= 1.6x |")
    print(f"| 2-way data parallel | {BATCH / dp:.1f} samples/s | 1 rank {BATCH / one:.1f} samples/s "
          f"| {one / dp:.2f}x | >= 1.8x |")
    print(f"| 2 independent 1-rank runs at once (the machine's bound) | {sum(BATCH / t for t in pair):.1f} samples/s "
          f"| 1 rank {BATCH / one:.1f} samples/s | {bound:.2f}x | 2x on 2 free cores |")
    print(f"| data parallel / the machine's bound | {one / dp:.2f}x | {bound:.2f}x | {one / dp / bound:.2f} | 1 |")
    compare_schedules(a, work)
    measured = [max(s["peak_memory_bytes_per_rank"][r] for s in pipe_steps) for r in range(2)]
    for st in pipe_plan["stages"]:
        r = st["ranks"][0]
        print(f"| peak memory, pipeline stage {st['id']} (rank {r}) | {measured[r] / 2**20:.2f} MiB measured "
              f"| {st['peak_memory_bytes'] / 2**20:.2f} MiB planned | {measured[r] / st['peak_memory_bytes']:.2f}x | ~1x |")
    m1 = max(s["peak_memory_bytes"] for s in one_steps)
    print(f"| peak memory, 1 rank | {m1 / 2**20:.2f} MiB measured | {one_plan['stages'][0]['peak_memory_bytes'] / 2**20:.2f}"
          f" MiB planned | {m1 / one_plan['stages'][0]['peak_memory_bytes']:.2f}x | ~1x |")


if __name__ == "__main__":
    main()
