#!/usr/bin/env python3
"""How far a model's own random numbers move PyTorch's training.

A model that draws random numbers while it trains (dropout with p > 0, a
router that samples its experts) cannot match PyTorch step for step in rannc,
which draws from its own generator (Note [random ops in training]). This
builds a Hugging Face family as tools/hf_survey.py does (same small config,
data, SGD and learning rate), trains it in PyTorch from the same initial
weights once as the survey's reference does and once per --seeds with the
training's random stream seeded anew, and prints each step's relative loss
difference to the reference. A family without random ops prints zeros; one
with them shows what "in distribution" means for it, beside the survey's row.

    .venv/bin/python tools/bench/random_stream.py phimoe [--seeds 1,2] [--steps 8]
"""
import argparse
import copy
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import hf_survey as hs  # noqa: E402
import survey_common as sc  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("family", help="a transformers model type, e.g. phimoe")
    ap.add_argument("--seeds", default="1,2", help="comma-separated seeds of the training's random stream")
    ap.add_argument("--steps", type=int, default=8)
    a = ap.parse_args()
    import numpy as np
    import torch
    torch.manual_seed(0)  # the survey's child: the weights, then the training, from one stream
    torch.use_deterministic_algorithms(True)
    model = hs.with_loss(hs.model_class(a.family)(hs.small_config(a.family))).train()
    data = hs.make_data(a.family, np.random.RandomState(1))
    names = ["input_ids", "attention_mask", "labels"]
    initial = copy.deepcopy(model.state_dict())
    reference = sc.train_reference(model, data, names, a.steps, hs.BATCH, hs.LR)
    print(f"{a.family}: PyTorch's losses, the survey's reference stream: " +
          " ".join(f"{x:.6g}" for x in reference))
    worst = 0.0
    for seed in (int(s) for s in a.seeds.split(",")):
        model.load_state_dict(initial)
        torch.manual_seed(seed)
        losses = sc.train_reference(model, data, names, a.steps, hs.BATCH, hs.LR)
        diffs = [abs(x - r) / max(abs(r), 1e-12) for x, r in zip(losses, reference)]
        worst = max(worst, max(diffs))
        print(f"  stream seeded {seed}: relative difference per step " + " ".join(f"{d:.1e}" for d in diffs))
    print(f"{a.family}: largest {worst:.2e} (the survey's exact is 1e-4)")


if __name__ == "__main__":
    main()
