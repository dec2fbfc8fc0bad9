#!/usr/bin/env python3
"""An in-place op on a view of a parameter's clone keeps its place (Note
[in-place ops keep their place] in planner/ir/ir.cpp).

torchvision's Swin V2 clones its qkv bias, zeroes the key third of the clone
in place and hands the clone to F.linear; the default `.pt2` holds
aten.clone, aten.slice, aten.zero_ and aten.linear(x, w, clone), with no edge
from zero_ to the linear. This model does the same in a few lines, exports
it with torch.export's defaults, plans it on 1 rank and on 2 stages and
trains 3 SGD steps against PyTorch: the losses and every trained parameter
must agree to 1e-5 (the key third of the bias, whose gradient is zero, must
not move). Before the fix the zeroing ran after the linear: 3e-3 off at step 0.

  inplace_view_check.py --build build --mpirun mpirun --work DIR
"""
import argparse
import copy
import json
import os
import subprocess
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import survey_common as sc  # noqa: E402

STEPS, LR = 3, 0.1


class ZeroedKeyBias(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(8, 24)
        self.out = nn.Linear(24, 10)
        nn.init.uniform_(self.qkv.bias, -0.5, 0.5)

    def forward(self, x, y):
        b = self.qkv.bias.clone()
        b[8:16].zero_()  # as torchvision's shifted_window_attention does for Swin V2
        h = F.linear(x, self.qkv.weight, b)
        return F.cross_entropy(self.out(torch.relu(h)), y)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    torch.manual_seed(0)
    m = ZeroedKeyBias().train()
    rng = np.random.RandomState(1)
    data = {"x": rng.standard_normal((16, 8)).astype(np.float32), "y": rng.randint(0, 10, 16).astype(np.int64)}
    names = ["x", "y"]
    initial = copy.deepcopy(m.state_dict())
    losses = sc.train_reference(m, data, names, STEPS, 8, LR)
    trained = copy.deepcopy(m.state_dict())
    m.load_state_dict(initial)
    sc.export(m, sc.batch(data, names, 0, 8), names, "pt2", os.path.join(a.work, "model.pt2"))
    sc.save_case(a.work, data, names, losses, LR, 8, {"pt2": "ok"})
    failed = []
    for ranks in (1, 2):
        plan, state, log = (os.path.join(a.work, f"{w}_{ranks}.{x}") for w, x in (("plan", "pb"), ("state", "pt"),
                                                                                  ("log", "jsonl")))
        subprocess.run([os.path.join(a.build, "tools", "rannc-plan"), os.path.join(a.work, "model.pt2"), "--gpus",
                        str(ranks), "--stages", str(ranks), "--device-type", "cpu", "--batch-size", "8", "--profile",
                        "analytic", "-o", plan], check=True)
        subprocess.run([a.mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(ranks),
                        os.path.join(a.build, "tools", "rannc-exec"), plan, "--data", os.path.join(a.work, "data"),
                        "--shuffle", "off", "--steps", str(STEPS), "--optimizer", "sgd", "--lr", repr(LR), "--log", log,
                        "--export-state", state], check=True)
        got = [json.loads(l)["loss"] for l in open(log) if l.strip()]
        loss_diff = max(abs(g - w) / abs(w) for g, w in zip(got, losses))
        params = torch.load(state)
        param_diff = max((params[k] - v).abs().max().item() for k, v in trained.items())
        print(f"{ranks} rank(s): losses {got} vs PyTorch {losses}: {loss_diff:.2e}; parameters {param_diff:.2e}")
        if not (len(got) == STEPS and loss_diff <= 1e-5 and param_diff <= 1e-5):
            failed.append(ranks)
    if failed:
        sys.exit(f"inplace_view_check: differs from PyTorch on {failed} rank(s)")


if __name__ == "__main__":
    main()
