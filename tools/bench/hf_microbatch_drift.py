#!/usr/bin/env python3
"""How far gradient accumulation alone moves PyTorch's own training of a
transformers family, as tools/hf_survey.py builds and trains it.

Trains the family twice from the same weights in PyTorch: on each whole
batch, and in 2 micro-batches whose losses are weighted by their share of
the batch's labelled tokens (the global denominator, Note [loss
denominators]), gradients summed before the step, which is what rannc's 2
micro-batches compute. Prints each step's relative difference. Where it
passes 1e-4, no implementation that accumulates micro-batches can match the
whole-batch curve to the survey's 1e-4 (CPM-Ant at the survey's lr 0.05:
7.5e-8 at step 1, 1.2e-5 at step 2, 1.7e-4 at step 3, the digits of
rannc's own row).

    .venv/bin/python tools/bench/hf_microbatch_drift.py --family cpmant
"""
import argparse
import copy
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import numpy as np  # noqa: E402
import torch  # noqa: E402

import hf_survey as hs  # noqa: E402
import survey_common as sc  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--family", default="cpmant")
    ap.add_argument("--steps", type=int, default=8)
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    whole = hs.with_loss(hs.model_class(a.family)(hs.small_config(a.family))).train()
    split = copy.deepcopy(whole)
    names = ["input_ids", "attention_mask", "labels"]
    data = hs.make_data(a.family, np.random.RandomState(1))

    def train(model, parts):
        opt = torch.optim.SGD(model.parameters(), lr=hs.LR)
        losses = []
        for k in range(a.steps):
            opt.zero_grad()
            b = sc.batch(data, names, k, hs.BATCH)
            total = float((b[2] != -100).sum())
            loss = 0.0
            for j in range(parts):
                mb = [t[j * hs.BATCH // parts:(j + 1) * hs.BATCH // parts] for t in b]
                share = float((mb[2] != -100).sum()) / total
                part = model(*mb)
                (part * share).backward()
                loss += float(part.detach()) * share
            opt.step()
            losses.append(loss)
        return losses

    w, s = train(whole, 1), train(split, 2)
    print("step  whole-batch loss  2-micro-batch loss  relative difference")
    for k, (x, y) in enumerate(zip(w, s)):
        print(f"{k:4d}  {x:16.8g}  {y:18.8g}  {abs(x - y) / abs(x):.2e}")


if __name__ == "__main__":
    main()
