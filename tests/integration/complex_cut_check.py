#!/usr/bin/env python3
"""A stage boundary through complex values, gradients and all.

DeepSeek-V2's default `.pt2` (tools/hf_survey.py's small config) computes
its rotary embedding in complex64: the query and key are viewed as complex
(`view_as_complex`), multiplied by the rotation and viewed back. This plans
it on one stage, moves the boundary by hand (as a user edits a plan) to
just after each kind of complex op of the first layer's attention, so that
a complex value the next stage differentiates crosses between the ranks,
and trains each plan on 2 ranks against PyTorch's losses and trained
parameters (relative 1e-4, parameters as tests/integration/train_check.py
measures them). The receiving stage rebuilds the complex values from the
float ones they derive from (Note [recomputed values] in
executor/schedule/schedule.cpp), so the gradient reaches stage 0 through
those. A gradient dropped at the boundary leaves the rotary part of the
query and key projections of stage 0 short of PyTorch's update: the losses
hardly move (1.6e-6 over 8 steps when the complex values were sent without
their gradients), the parameters do.

  .venv/bin/python tests/integration/complex_cut_check.py --build build --work /tmp/complex_cut
"""
import argparse
import json
import os
import subprocess
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REL_TOL = 1e-4


def run(cmd, timeout=600):
    p = subprocess.run(cmd, text=True, capture_output=True, timeout=timeout)
    if p.returncode != 0:
        sys.exit(f"complex_cut_check: {' '.join(cmd[:3])} failed:\n{p.stderr[-2000:]}")
    return p


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--mpirun", default="mpirun")
    a = ap.parse_args()
    plan_tool, exec_tool = (os.path.join(a.build, "tools", t) for t in ("rannc-plan", "rannc-exec"))
    case = os.path.join(a.work, "deepseek_v2")
    os.makedirs(case, exist_ok=True)
    run([sys.executable, os.path.join(ROOT, "tools", "hf_survey.py"), "--child", "deepseek_v2", case], timeout=900)
    ref = json.load(open(os.path.join(case, "reference.json")))
    want = reference_parameters(len(ref["losses"]))
    one = os.path.join(a.work, "one.json")
    run([plan_tool, os.path.join(case, "model.pt2"), "--gpus", "1", "--device-type", "cpu", "--stages", "1",
         "--microbatches", "2", "--batch-size", str(ref["batch_size"]), "--profile", "analytic", "-o", one])
    base = json.load(open(one))
    ops = base["graph"]["ops"]
    # The first layer's complex ops that read the data's activations: where
    # a boundary sends a complex value whose gradient must come back.
    cuts, seen = [], set()
    for i, op in enumerate(ops):
        kind = op["name"].rsplit("/", 1)[-1].rstrip("_0123456789")
        if ".layers.0." in op["name"] and any(o.get("dtype") == "c64" for o in op.get("outputs", [])) \
                and kind in ("view_as_complex", "mul") and kind not in seen:
            seen.add(kind)
            cuts.append(i + 1)
    if len(cuts) != 2:
        sys.exit(f"complex_cut_check: expected a view_as_complex and a complex mul in layer 0, found cuts {cuts}")
    for cut in cuts:
        plan = json.loads(json.dumps(base))
        plan["stages"] = [{"id": 0, "ranks": [0], "op_begin": 0, "op_end": cut, "recompute": False},
                          {"id": 1, "ranks": [1], "op_begin": cut, "op_end": len(ops), "recompute": False}]
        plan["cluster"]["devices_per_node"] = 2
        plan.pop("estimates", None)
        path = os.path.join(a.work, f"cut{cut}.json")
        json.dump(plan, open(path, "w"))
        run([plan_tool, "check", path])
        log, state = os.path.join(a.work, f"cut{cut}.jsonl"), os.path.join(a.work, f"cut{cut}.pt")
        if os.path.exists(log):
            os.remove(log)
        run([a.mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2", exec_tool, path, "--data",
             os.path.join(case, "data"), "--shuffle", "off", "--steps", str(len(ref["losses"])), "--optimizer", "sgd",
             "--lr", repr(ref["lr"]), "--log", log, "--export-state", state])
        got = [json.loads(line)["loss"] for line in open(log) if line.strip()]
        worst = max(abs(g - w) / abs(w) for g, w in zip(got, ref["losses"]))
        trained = torch.load(state)
        params = {k: float((trained[k].double() - w.double()).abs().max() / max(w.abs().max().item(), 1e-3))
                  for k, w in want.items()}
        name, far = max(params.items(), key=lambda kv: kv[1])
        sent = ops[cut - 1]["name"]
        print(f"boundary after op {cut - 1} ({sent}, complex64): max relative loss difference {worst:.1e}, "
              f"parameters {far:.1e} ({name})")
        if len(got) != len(ref["losses"]) or not worst <= REL_TOL or not far <= REL_TOL:
            sys.exit(f"complex_cut_check: the plan cut after {sent} is off PyTorch (losses {worst:.1e}, "
                     f"{name} {far:.1e})")


def reference_parameters(steps):
    """PyTorch's parameters after `steps` SGD steps: the survey child's model, data and training."""
    import numpy as np
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import hf_survey as H
    import survey_common as sc
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    model = H.with_loss(H.model_class("deepseek_v2")(H.small_config("deepseek_v2"))).train()
    names = ["input_ids", "attention_mask", "labels"]
    sc.train_reference(model, H.make_data("deepseek_v2", np.random.RandomState(1)), names, steps, H.BATCH, H.LR)
    return {k: v.detach().clone() for k, v in model.named_parameters()}


if __name__ == "__main__":
    main()
