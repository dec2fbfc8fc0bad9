#!/usr/bin/env python3
"""The command line as a new user meets it (issue 30, docs/robustness.md
"Exit status and usage errors"): one --case per friction that was fixed.

  exit-codes   one exit code per class (0 ok, 1 the run failed, 2 usage), the
               classes in --help, and "did you mean" for mistyped flags and verbs
  once         a usage error under mpirun -np 2 is printed once, not per rank;
               so is a --trace file that cannot be written, before any step
  optimizer    rannc-exec trains with the optimizer the plan assumed, unless told
  short-data   --data shorter than one step is an error, unless --wrap-data
  interleaved  --schedule interleaved-1f1b --virtual-stages 2 (issue 28): planned, shown, simulated,
               checked and trained; what it does not combine with refused by rannc-plan and rannc-exec
  export       `rannc-exec export` of TorchScript and torch.export checkpoints: a state dict that
               load_state_dict(strict=True) accepts (no non-persistent buffers: by itself for
               torch.export, with --drop-keys for TorchScript, whose archive does not record them)

Uses the mlp fixture (models/make_model.py --model mlp); export and interleaved the gpt one."""
import os
import shutil
import sys

import numpy as np

import hostile_check  # its Env: the mlp fixture copied into a folder of the case's own
from hostile_check import run


def expect(p, code, needles, what):
    out = p.stdout + p.stderr
    if p.returncode != code:
        sys.exit(f"{what}: exit {p.returncode}, expected {code}\n{out[-3000:]}")
    for n in needles:
        if n not in out:
            sys.exit(f"{what}: expected '{n}' in the output\n{out[-3000:]}")
    print(f"ok: {what} (exit {code})", flush=True)
    return out


class Env(hostile_check.Env):
    def plan(self, out, extra=()):
        p = run([self.args.plan_tool, self.model, "--gpus", "2", "--device-type", "cpu", "--batch-size", "8",
                 "--stages", "2", "--replicas", "1", "--profile", "analytic", "-o", out] + list(extra))
        expect(p, 0, [], "rannc-plan")
        return out

    def mpirun(self, ranks, args):
        return run([self.args.mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(ranks),
                    self.args.exec_tool] + args)


def case_exit_codes(env):
    plan_tool, exec_tool = env.args.plan_tool, env.args.exec_tool
    plan = env.plan(os.path.join(env.dir, "plan.pb"))
    for tool in (plan_tool, exec_tool):
        expect(run([tool, "--help"]), 0, ["Exit status: 0 success; 1 the run failed", "2 a usage error"],
               f"{os.path.basename(tool)} --help states the exit codes")
    # 2: the command line.
    expect(run([plan_tool, env.model, "--gpsu", "2", "-o", plan]), 2, ["did you mean --gpus (for --gpsu)?"],
           "rannc-plan --gpsu")
    expect(run([plan_tool, "shwo", plan]), 2, ["did you mean the verb 'show' (for 'shwo')?"], "rannc-plan shwo")
    expect(run([plan_tool, "simulate", plan, "--trcae", "t.json"]), 2, ["did you mean --trace (for --trcae)?"],
           "rannc-plan simulate --trcae")
    expect(run([plan_tool, env.model, "--optimizer", "adma", "-o", plan]), 2, ["--optimizer"],
           "rannc-plan --optimizer adma")
    expect(run([plan_tool, env.model, "--gpus", "2", "--device-type", "cpu", "--batch-size", "8",
                "--schedule", "1f1b", "--tensor-parallel", "x", "-o", plan]), 2, ["--tensor-parallel"],
           "rannc-plan --tensor-parallel x (refused after parsing)")
    expect(run([exec_tool, plan, "--stpes", "3"]), 2, ["did you mean --steps (for --stpes)?"], "rannc-exec --stpes")
    expect(run([exec_tool, "exprot", plan, "-o", "x.onnx"]), 2, ["did you mean the verb 'export' (for 'exprot')?"],
           "rannc-exec exprot")
    expect(run([exec_tool, plan, "--betas", "0.9"]), 2, ["--betas"], "rannc-exec --betas 0.9 (refused after parsing)")
    # 1: what the run read.
    expect(run([plan_tool, "show", os.path.join(env.dir, "missing.pb")]), 1, ["missing.pb"], "show of a missing plan")
    expect(run([plan_tool, os.path.join(env.dir, "missing.onnx"), "-o", plan]), 1, ["missing.onnx"],
           "rannc-plan of a missing model")
    expect(env.mpirun(2, [plan, "--data", os.path.join(env.dir, "nowhere")]), 1, ["nowhere"],
           "rannc-exec with missing data")


def case_once(env):
    plan = env.plan(os.path.join(env.dir, "plan.pb"))
    out = expect(env.mpirun(2, [plan, "--stpes", "3"]), 2, ["did you mean --steps"], "mpirun -np 2 rannc-exec --stpes")
    if out.count("rannc-exec: error:") != 1:
        sys.exit(f"the usage error was printed {out.count('rannc-exec: error:')} times, not once:\n{out}")
    out = expect(env.mpirun(2, [plan, "--synthetic", "--betas", "x"]), 2, ["--betas"], "mpirun -np 2 --betas x")
    if out.count("rannc-exec: error:") != 1:
        sys.exit(f"the refused --betas was printed {out.count('rannc-exec: error:')} times, not once:\n{out}")
    out = expect(env.mpirun(2, [plan, "--data", os.path.join(env.dir, "nowhere")]), 1, ["nowhere"],
                 "mpirun -np 2 with missing data")
    if out.count("error:") != 1:
        sys.exit(f"the missing data was reported {out.count('error:')} times, not once:\n{out}")
    # --trace is written after the last step: a place it cannot go stops the
    # run at start-up, on rank 0 alone, before any step.
    for where, needle in ((os.path.join(env.dir, "no-such-folder", "t.json"), "No such file or directory"),
                          (env.dir, "is a folder, not a file")):
        out = expect(env.mpirun(2, [plan, "--data", env.data, "--steps", "1", "--trace", where]), 1,
                     [f"--trace {where}: ", needle], f"mpirun -np 2 --trace {where}")
        if out.count("error:") != 1 or "step 1/1" in out or "rannc-exec: done" in out:
            sys.exit(f"--trace {where}: not one error before the first step:\n{out}")


def case_optimizer(env):
    for planned in ("adam", "sgd", "adamw"):
        plan = env.plan(os.path.join(env.dir, f"{planned}.pb"), ["--optimizer", planned])
        out = expect(env.mpirun(2, [plan, "--data", env.data, "--steps", "1"]), 0, [f"step(s), {planned}"],
                     f"a plan for {planned} trains with {planned}")
    out = expect(env.mpirun(2, [plan, "--data", env.data, "--steps", "1", "--optimizer", "sgd"]), 0, ["step(s), sgd"],
                 "--optimizer sgd overrides the plan's adamw")
    del out


def case_short_data(env):
    plan = env.plan(os.path.join(env.dir, "plan.pb"))  # batch 8
    short = os.path.join(env.dir, "short")
    os.makedirs(short)
    for f in os.listdir(env.data):
        np.save(os.path.join(short, f), np.load(os.path.join(env.data, f))[:6])
    expect(env.mpirun(2, [plan, "--data", short, "--steps", "1"]), 1,
           ["holds 6 samples, fewer than the 8 one step reads", "--wrap-data"], "data shorter than one step")
    expect(env.mpirun(2, [plan, "--data", env.data, "--steps", "1", "--accumulation-steps", "100"]), 1,
           ["fewer than the 800 one step reads (global batch 8 x 100 accumulated)"],
           "data shorter than one accumulated step")
    expect(env.mpirun(2, [plan, "--data", short, "--steps", "2", "--wrap-data"]), 0, ["rannc-exec: done"],
           "--wrap-data trains on data shorter than a step")


def case_interleaved(env):
    import json
    # The GPT: 4 stages need more blocks than the MLP's 3.
    shutil.copytree(os.path.join(env.args.models, "gpt"), os.path.join(env.dir, "g"),
                    ignore=shutil.ignore_patterns("reference_*"))
    env.model, env.data = os.path.join(env.dir, "g", "model.onnx"), os.path.join(env.dir, "g", "data")
    plan = env.plan(os.path.join(env.dir, "il.pb"),
                    ["--schedule", "interleaved-1f1b", "--virtual-stages", "2", "--microbatches", "4"])
    one = env.plan(os.path.join(env.dir, "1f1b.pb"), ["--schedule", "1f1b", "--microbatches", "4"])
    shown = json.loads(expect(run([env.args.plan_tool, "show", plan, "--json"]), 0, [], "show --json"))
    base = json.loads(run([env.args.plan_tool, "show", one, "--json"]).stdout)
    if (shown["schedule"], shown["virtual_stages"], shown["num_stages"], shown["world_size"]) != \
            ("interleaved-1f1b", 2, 4, 2):
        sys.exit(f"show --json of the interleaved plan: {shown}")
    if [s["ranks"] for s in shown["stages"]] != [[0], [1], [0], [1]]:
        sys.exit(f"the chunks are not on ranks 0, 1, 0, 1: {[s['ranks'] for s in shown['stages']]}")
    if not 0 < shown["predicted_bubble_fraction"] < base["predicted_bubble_fraction"]:
        sys.exit(f"bubble {shown['predicted_bubble_fraction']} not below 1F1B's {base['predicted_bubble_fraction']}")
    print(f"ok: bubble {shown['predicted_bubble_fraction']:.4f} against 1F1B's {base['predicted_bubble_fraction']:.4f}")
    expect(run([env.args.plan_tool, "check", plan]), 0, [], "check of the interleaved plan")
    trace = os.path.join(env.dir, "il-trace.json")
    expect(run([env.args.plan_tool, "simulate", plan, "--trace", trace]), 0, ["interleaved-1f1b"], "simulate --trace")
    with open(trace) as f:
        events = json.load(f)
    events = events["traceEvents"] if isinstance(events, dict) else events
    stages = {(e.get("pid"), (e.get("args") or {}).get("stage")) for e in events if e.get("ph") == "X"}
    if not {(0, 0), (0, 2), (1, 1), (1, 3)} <= stages:
        sys.exit(f"the trace does not draw both chunks of both ranks: {sorted(stages, key=str)}")
    print("ok: the trace draws stages 0 and 2 on rank 0, 1 and 3 on rank 1")
    measured = os.path.join(env.dir, "il-measured.json")
    expect(env.mpirun(2, [plan, "--data", env.data, "--steps", "2", "--trace", measured]), 0,
           ["interleaved-1f1b", "rannc-exec: done"], "rannc-exec trains the interleaved plan")
    with open(measured) as f:  # the measured trace names each action's chunk as simulate does
        events = json.load(f)["traceEvents"]
    ran = {(e["pid"], e["args"]["stage"]) for e in events if e.get("ph") == "X" and e.get("cat") == "forward"}
    if ran != {(0, 0), (0, 2), (1, 1), (1, 3)}:
        sys.exit(f"rannc-exec --trace does not name each forward's chunk: {sorted(ran)}")
    print("ok: rannc-exec --trace names stages 0 and 2 on rank 0, 1 and 3 on rank 1")
    # Note [comparing an interleaved run]: a forward and a backward row per
    # chunk, the rank's figures once per rank, each what the trace recorded.
    p = run([env.args.plan_tool, "compare", plan, measured, "--json"])
    if p.returncode != 0:
        sys.exit(f"rannc-plan compare of an interleaved run: exit {p.returncode}, {p.stderr[-500:]}")
    rows = {(r["stage"], r["what"]): r for r in json.loads(p.stdout)["rows"]}
    steps = sorted({e["args"].get("step", 0) for e in events if e.get("ph") == "X"})
    first = steps[1] if len(steps) > 1 else steps[0]  # the first step is warm-up (Note [measured figures])
    kept = [e for e in events if e.get("ph") == "X" and e["args"].get("step", 0) >= first]
    for stage in range(4):
        durations = sorted(e["dur"] for e in kept if e.get("cat") == "forward" and e["args"]["stage"] == stage)
        mid = len(durations) // 2
        median_us = durations[mid] if len(durations) % 2 else (durations[mid - 1] + durations[mid]) / 2
        row = rows.get((str(stage), "forward per micro-batch"))
        if row is None or abs(row["measured"] * 1e6 - median_us) > 1 or row["predicted"] <= 0:
            sys.exit(f"compare's stage {stage} forward is not its chunk's median of {median_us} us: {row}")
    for rank, label in ((0, "0+2"), (1, "1+3")):
        peak = max(e["args"]["bytes"] for e in events if e.get("ph") == "C" and e["pid"] == rank)
        row = rows.get((label, "peak memory"))
        if row is None or row["measured"] != peak or row["predicted"] <= 0:
            sys.exit(f"compare's rank {rank} ({label}) peak is not the trace's {peak}: {row}")
        if (label, "busy per step") not in rows:
            sys.exit(f"compare has no busy row for rank {rank} ({label}): {sorted(rows)}")
    print("ok: rannc-plan compare gives each chunk's forward and each rank's peak, as the trace has them")
    # Note [interleaved checkpoints]: a rank's chunks are saved and resumed together.
    ckpt = os.path.join(env.dir, "ckpt")
    shutil.rmtree(ckpt, ignore_errors=True)
    expect(env.mpirun(2, [plan, "--data", env.data, "--steps", "1", "--checkpoint-dir", ckpt]),
           0, ["rannc-exec: checkpoint"], "rannc-exec checkpoints the interleaved plan")
    expect(env.mpirun(2, [plan, "--data", env.data, "--steps", "2", "--checkpoint-dir", ckpt, "--resume"]),
           0, ["resuming from", "step 1"], "rannc-exec resumes the interleaved plan")
    for extra, needle in ((["--virtual-stages", "2"], "needs --schedule interleaved-1f1b"),
                          (["--schedule", "interleaved-1f1b", "--virtual-stages", "2", "--tensor-parallel", "2,2,2"],
                           "one degree, or one per pipeline rank (2 for --stages 2)"),
                          (["--schedule", "interleaved-1f1b", "--virtual-stages", "2", "--microbatches", "1"],
                           "must be a multiple of 2")):
        p = run([env.args.plan_tool, env.model, "--gpus", "2", "--device-type", "cpu", "--batch-size", "8",
                 "--stages", "2", "--replicas", "1", "--profile", "analytic", "-o", os.path.join(env.dir, "x.pb")]
                + extra)
        if p.returncode == 0 or needle not in p.stdout + p.stderr:
            sys.exit(f"rannc-plan {' '.join(extra)}: exit {p.returncode}, expected '{needle}'\n{p.stderr[-2000:]}")
        print(f"ok: rannc-plan {' '.join(extra)} refused (exit {p.returncode})")


def train_and_export(env, plan, ranks, data, name, extra=(), needles=()):
    """2 steps with a checkpoint and --export-state, then `rannc-exec export`
    of the checkpoint, both with `extra` flags and printing `needles`: the two
    state dicts, as torch.load reads them."""
    import torch
    ck, trained = os.path.join(env.dir, f"{name}-ck"), os.path.join(env.dir, f"{name}-trained.pt")
    expect(env.mpirun(ranks, [plan, "--data", data, "--steps", "2", "--checkpoint-dir", ck, "--export-state", trained]
                      + list(extra)), 0, needles, f"{name}: 2 steps with a checkpoint and --export-state {extra}")
    exported = os.path.join(env.dir, f"{name}-exported.pt")
    expect(run([env.args.exec_tool, "export", ck, "-o", exported] + list(extra)), 0, ["a state dict", *needles],
           f"{name}: rannc-exec export of the checkpoint {extra}")
    return torch.load(trained), torch.load(exported)


def case_export(env):
    """`rannc-exec export` of a TorchScript model's checkpoint writes the state
    dict --export-state writes (it said "not a valid ONNX model" before)."""
    import torch
    gpt = os.path.join(env.dir, "gpt")
    shutil.copytree(os.path.join(env.args.models, "gpt"), gpt, ignore=shutil.ignore_patterns("reference_*"))
    plan = os.path.join(env.dir, "gpt.pb")
    expect(run([env.args.plan_tool, os.path.join(gpt, "model.pt"), "--gpus", "2", "--device-type", "cpu",
                "--batch-size", "8", "--stages", "2", "--replicas", "1", "--profile", "analytic", "-o", plan]), 0, [],
           "rannc-plan gpt/model.pt")
    a, b = train_and_export(env, plan, 2, os.path.join(gpt, "data"), "gpt")
    if sorted(a) != sorted(b) or any(not torch.equal(a[k], b[k]) for k in a):
        sys.exit("export's state dict differs from --export-state's")
    print(f"ok: export wrote the {len(b)} tensors --export-state wrote")

    # A torch.export model with a non-persistent buffer (as a rotary inv_freq):
    # both state dicts load strictly into the user's own module.
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 4)
            self.register_buffer("scale", torch.full((4,), 0.5), persistent=False)
            self.register_buffer("shift", torch.zeros(4))

        def forward(self, x, y):
            return torch.nn.functional.cross_entropy(self.fc(x) * self.scale + self.shift, y)

    torch.manual_seed(0)
    x, y = torch.randn(16, 8), torch.randint(0, 4, (16,))
    batch = torch.export.Dim("batch")
    program = torch.export.export(Net(), (x, y), dynamic_shapes={"x": {0: batch}, "y": {0: batch}})
    net = os.path.join(env.dir, "net")
    os.makedirs(os.path.join(net, "data"))
    torch.export.save(program, os.path.join(net, "model.pt2"))
    np.save(os.path.join(net, "data", "x.npy"), x.numpy())
    np.save(os.path.join(net, "data", "y.npy"), y.numpy())
    plan = os.path.join(env.dir, "net.pb")
    expect(run([env.args.plan_tool, os.path.join(net, "model.pt2"), "--gpus", "1", "--device-type", "cpu",
                "--batch-size", "8", "--profile", "analytic", "-o", plan]), 0, [], "rannc-plan net/model.pt2")
    for state in train_and_export(env, plan, 1, os.path.join(net, "data"), "net"):
        if "scale" in state:
            sys.exit("a state dict holds the non-persistent buffer 'scale'")
        Net().load_state_dict(state, strict=True)
    print("ok: both state dicts of the .pt2 model load with load_state_dict(strict=True)")

    # The same module traced to TorchScript, saved as torch.jit.save does by
    # default: the archive does not record that 'scale' is non-persistent
    # (Note [TorchScript buffers]), so the state dicts hold it and both
    # exports say so; with --drop-keys scale both load strictly.
    torch.jit.save(torch.jit.trace(Net(), (x, y)), os.path.join(net, "model.pt"))
    plan = os.path.join(env.dir, "net-ts.pb")
    expect(run([env.args.plan_tool, os.path.join(net, "model.pt"), "--data", os.path.join(net, "data"), "--gpus", "1",
                "--device-type", "cpu", "--batch-size", "8", "--profile", "analytic", "-o", plan]), 0, [],
           "rannc-plan net/model.pt")
    for state in train_and_export(env, plan, 1, os.path.join(net, "data"), "net-ts",
                                  needles=["does not record which buffers are persistent", "--drop-keys"]):
        try:
            Net().load_state_dict(state, strict=True)
            sys.exit("the TorchScript model's state dict without --drop-keys loaded strictly: the test is wrong")
        except RuntimeError as e:
            if "scale" not in str(e):
                sys.exit(f"strict load failed for another reason than 'scale': {e}")
    for state in train_and_export(env, plan, 1, os.path.join(net, "data"), "net-ts-dropped", ["--drop-keys", "scale"]):
        Net().load_state_dict(state, strict=True)
    print(f"ok: with --drop-keys scale both state dicts of the TorchScript model load with "
          f"load_state_dict(strict=True): {sorted(state)}")
    ck = os.path.join(env.dir, "net-ts-ck")
    expect(env.mpirun(1, [plan, "--data", os.path.join(net, "data"), "--steps", "1", "--export-state",
                          os.path.join(env.dir, "y.pt"), "--drop-keys", "scael"]), 1,
           ["--drop-keys: the model has no parameter or buffer 'scael'"], "--export-state --drop-keys of no key")
    expect(run([env.args.exec_tool, "export", ck, "-o", os.path.join(env.dir, "x.pt"), "--drop-keys", "scael"]), 1,
           ["--drop-keys: the state dict has no key 'scael'", "scale"], "export --drop-keys of no key")
    if os.path.exists(os.path.join(env.dir, "x.pt")):
        sys.exit("export --drop-keys of no key wrote its output")


CASES = {name[5:].replace("_", "-"): f for name, f in globals().items() if name.startswith("case_")}


if __name__ == "__main__":
    hostile_check.main(__doc__, CASES, Env, "cli_check")
