#!/usr/bin/env python3
"""Plan fuzzing: random legal plans of the models in --models, each checked,
trained with mpirun rannc-exec and compared with PyTorch's own training.

Every generated plan is a hand edit of a one-stage plan: random stage
boundaries at any op, a random replica count per stage (the ranks in order),
a random micro-batch count that divides the batch and gives every replica a
sample, a random schedule (GPipe, 1F1B or ZB-H1; ZB-H2 with --schedules ZB_H2), and activation recomputation on a
random third of the stages (under ZB-H1 and ZB-H2 too, whose B then recomputes the forward). With --schedules INTERLEAVED_1F1B
the plans are interleaved 1F1B instead (Note [interleaved 1F1B]): p pipeline ranks of 2 chunks each,
stage k on the ranks of stage k % p, M a multiple of p, recomputation on a random third of the stages. Models with BatchNorm get one replica per stage
and one micro-batch (SPEC: the only layouts where batch statistics are one
device's). Each plan must pass `rannc-plan check` and train to PyTorch's losses
and trained parameters (relative 1e-4; reference_sgd*.json and .npz written by
models/make_model.py). A plan `check` refuses is not run; the generator tries
again (at most --tries times) and counts it, and one case of every kind of
refusal is printed: a refusal of a plan the executor could run is a bug too.

  .venv/bin/python tests/integration/plan_fuzz.py --plan-tool build/tools/rannc-plan \\
      --exec-tool build/tools/rannc-exec --models build/models --work /tmp/fuzz --plans 200 --seed 1
"""
import argparse
import json
import os
import random
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_check  # noqa: E402

REL_TOL = train_check.REL_TOL
BATCHNORM_MODELS = {"resnet18", "resnet18_13", "mobilenet_v3_small"}


def run(cmd, timeout=300):
    return subprocess.run(cmd, text=True, capture_output=True, timeout=timeout)


def base_plan(args, model, batch, work):
    """The model on one stage, as JSON (the editable form)."""
    path = os.path.join(work, f"{model}-base.json")
    if not os.path.exists(path):
        p = run([args.plan_tool, os.path.join(args.models, model, "model.onnx"), "--gpus", "1", "--device-type",
                 "cpu", "--batch-size", str(batch), "--profile", "analytic", "--stages", "1", "--microbatches", "1",
                 "-o", path])
        if p.returncode != 0:
            sys.exit(f"{model}: rannc-plan failed:\n{p.stderr}")
    return json.load(open(path))


def boundaries_and_replicas(rng, num_ops, stages, groups, max_ranks, batchnorm):
    """`stages` stages at random op boundaries, and a replica count for each of
    `groups` rank groups (one per stage, or per interleaved pipeline rank),
    one each for BatchNorm models; the draws as they always were."""
    cuts = sorted(rng.sample(range(1, num_ops), stages - 1))
    replicas = [1] * groups
    if not batchnorm:
        for i in rng.sample(range(groups), groups):
            if sum(replicas) < max_ranks and rng.random() < 0.5:
                replicas[i] += 1
    return [0] + cuts + [num_ops], replicas


SPLIT_SCHEDULES = ("ZB_H1", "ZB_H2")  # pipeline::splitsBackward


def random_plan(rng, base, model, batch, max_ranks, schedules=("GPIPE", "ONE_F_ONE_B", "ZB_H1")):
    if schedules == ["INTERLEAVED_1F1B"]:
        return random_interleaved_plan(rng, base, model, batch, max_ranks)
    plan = json.loads(json.dumps(base))
    num_ops = len(plan["graph"]["ops"])
    batchnorm = model in BATCHNORM_MODELS
    stages = rng.randint(1, min(max_ranks, 4, num_ops))
    bounds, replicas = boundaries_and_replicas(rng, num_ops, stages, stages, max_ranks, batchnorm)
    widest = max(replicas)
    counts = [m for m in (1, 2, 4) if batch % m == 0 and batch // m >= widest] if not batchnorm else [1]
    microbatches = rng.choice(counts)
    schedule = rng.choice(list(schedules))
    rank = 0
    plan["stages"] = []
    for s in range(stages):
        # ZB-H1 and ZB-H2 stages recompute too (issue 28, Note [split backward]).
        recompute = rng.random() < 0.3
        plan["stages"].append({"id": s, "ranks": list(range(rank, rank + replicas[s])),
                               "op_begin": bounds[s], "op_end": bounds[s + 1], "recompute": recompute})
        rank += replicas[s]
    plan["cluster"]["devices_per_node"] = rank  # one CPU device per rank, as --gpus N makes
    plan["microbatches"] = microbatches
    plan["schedule"] = schedule
    plan.pop("estimates", None)
    recomputing = [s["id"] for s in plan["stages"] if s["recompute"]]
    if recomputing:  # a field of format version 2 (Note [plan format versions])
        plan["format_version"] = max(plan.get("format_version", 1), 2)
    desc = (f"{model}: {stages} stage(s) at ops {bounds}, replicas {replicas}, {microbatches} micro-batch(es), "
            f"{plan['schedule']}" + (f", recomputing {recomputing}" if recomputing else ""))
    return plan, rank, desc


def random_interleaved_plan(rng, base, model, batch, max_ranks, chunks=2):
    """p pipeline ranks of `chunks` stages each at random op boundaries, a
    random replica count per rank, M a multiple of p (Note [interleaved 1F1B])."""
    plan = json.loads(json.dumps(base))
    num_ops = len(plan["graph"]["ops"])
    batchnorm = model in BATCHNORM_MODELS
    p = 1 if batchnorm else rng.randint(1, min(max_ranks, 2, num_ops // chunks))
    bounds, replicas = boundaries_and_replicas(rng, num_ops, p * chunks, p, max_ranks, batchnorm)
    counts = [m for m in (1, 2, 4) if m % p == 0 and batch % m == 0 and batch // m >= max(replicas)]
    microbatches = 1 if batchnorm else rng.choice(counts)
    first = [sum(replicas[:r]) for r in range(p)]
    plan["stages"] = [{"id": s, "ranks": list(range(first[s % p], first[s % p] + replicas[s % p])),
                       "op_begin": bounds[s], "op_end": bounds[s + 1], "recompute": rng.random() < 0.3}
                      for s in range(p * chunks)]
    ranks = sum(replicas)
    plan["cluster"]["devices_per_node"] = ranks
    plan["microbatches"] = microbatches
    plan["schedule"] = "INTERLEAVED_1F1B"
    plan["virtual_stages"] = chunks
    plan["format_version"] = max(plan.get("format_version", 1), 5)  # Note [plan format versions]
    plan.pop("estimates", None)
    recomputing = [s["id"] for s in plan["stages"] if s["recompute"]]
    desc = (f"{model}: {p} rank(s) x {chunks} chunks at ops {bounds}, replicas {replicas}, "
            f"{microbatches} micro-batch(es), INTERLEAVED_1F1B" + (f", recomputing {recomputing}" if recomputing else ""))
    return plan, ranks, desc


def train(args, model, plan_path, ranks, ref, work):
    log = os.path.join(work, "log.jsonl")
    trained = os.path.join(work, "trained.onnx")
    for f in (log, trained):
        if os.path.exists(f):
            os.remove(f)
    p = run([args.mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(ranks), args.exec_tool, plan_path,
             "--allow-model-outside-plan",
             "--data", os.path.join(args.models, model, "data"), "--shuffle", "off", "--log", log, "--steps",
             str(ref["steps"]), "--optimizer", "sgd", "--lr", repr(ref["lr"]), "--export-onnx", trained])
    if p.returncode != 0:
        return None, p.stderr.strip().splitlines()[-1:] or ["(no output)"]
    losses = [json.loads(line)["loss"] for line in open(log)]
    if len(losses) != len(ref["losses"]):
        return None, [f"{len(losses)} steps logged, expected {len(ref['losses'])}"]
    worst = max(abs(a - b) / abs(b) for a, b in zip(losses, ref["losses"]))
    try:
        worst = max(worst, train_check.check_state(trained, os.path.join(args.models, model), "sgd"))
    except SystemExit as e:
        return None, [str(e)]
    return worst, []


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plan-tool", required=True)
    ap.add_argument("--exec-tool", required=True)
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--models", required=True, help="the folder make_model.py wrote the models into")
    ap.add_argument("--zoo", default="gpt,bert,gpt_tied,mlp,vit_tiny,gpt_untuned,resnet18",
                    help="models to draw from (each needs reference_sgd.json)")
    ap.add_argument("--work", required=True)
    ap.add_argument("--plans", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-ranks", type=int, default=4)
    ap.add_argument("--tries", type=int, default=20, help="attempts per plan before giving up on a legal one")
    ap.add_argument("--schedules", default="GPIPE,ONE_F_ONE_B,ZB_H1",
                    help="the schedules drawn from; INTERLEAVED_1F1B alone draws interleaved plans")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    rng = random.Random(a.seed)
    zoo = [m for m in a.zoo.split(",") if m]
    refused, refusals, failures, worst_all = 0, {}, [], 0.0
    start = time.time()
    for i in range(a.plans):
        model = zoo[i % len(zoo)]
        ref = json.load(open(os.path.join(a.models, model, "reference_sgd.json")))
        base = base_plan(a, model, ref["batch_size"], a.work)
        plan_path = os.path.join(a.work, f"plan-{i}.json")
        for _ in range(a.tries):
            plan, ranks, desc = random_plan(rng, base, model, ref["batch_size"], a.max_ranks, a.schedules.split(","))
            json.dump(plan, open(plan_path, "w"))
            p = run([a.plan_tool, "check", plan_path, "--allow-model-outside-plan"])
            if p.returncode == 0:
                break
            refused += 1
            lines = [ln for ln in (p.stdout + p.stderr).splitlines() if "error: " in ln]
            problem = lines[0].split("error: ", 1)[1] if lines else (p.stdout + p.stderr).strip()[-300:]
            refusals.setdefault(problem.split(":")[0], f"{desc}\n    {problem}")
        else:
            failures.append(f"plan {i}: no legal plan of {model} in {a.tries} tries")
            continue
        worst, problems = train(a, model, plan_path, ranks, ref, a.work)
        status = "ok" if worst is not None and worst <= REL_TOL else "FAILED"
        shown = f"{worst:.2e}" if worst is not None else "-"
        print(f"[{i + 1}/{a.plans}] {status}  {desc}  worst rel {shown}  {' '.join(problems)}", flush=True)
        if status != "ok":
            failures.append(f"plan {i} ({plan_path}): {desc}: {' '.join(problems) or f'worst {shown}'}")
        else:
            worst_all = max(worst_all, worst)
    for kind, example in refusals.items():
        print(f"check refused plans like: {example}")
    print(f"{a.plans} plans of {len(zoo)} models in {time.time() - start:.0f} s: {a.plans - len(failures)} exact "
          f"(worst relative difference {worst_all:.2e}, tolerance {REL_TOL}), {len(failures)} failed; "
          f"{refused} generated plans refused by check")
    if failures:
        sys.exit("\n".join(failures))


if __name__ == "__main__":
    main()
