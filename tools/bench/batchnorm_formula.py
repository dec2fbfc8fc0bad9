#!/usr/bin/env python3
"""How far PyTorch's own training moves when only BatchNorm's formula changes.

rannc-exec's synchronised BatchNorm (--batchnorm exact, Note [synchronised
batch statistics] in executor/runtime/kernels/sync_batch_norm.cpp) computes
the statistics in two passes of ATen ops (the sum, then the squared
deviations from the mean, each summed over the replicas), where PyTorch's
module runs its fused CPU kernel: the same mathematics, rounded differently.
This trains torchvision classifiers as tools/torchvision_survey.py --train
does (random weights from seed 0, 10 classes, dropout and stochastic depth
off, 16 images of 64x64 from seed 1 in batches of 8, SGD lr 0.01, one
intra-op thread), once with the module's kernel and once with every
BatchNorm2d computing that two-pass formula on one device, and prints each
step's loss and the relative difference. A model whose losses move by more
than 1e-4 here cannot match PyTorch to 1e-4 under --batchnorm exact on
replicas, whatever the implementation of the sum. Every number comes from
one run, so the comparison holds on any CPU.

    .venv/bin/python tools/bench/batchnorm_formula.py [--models mnasnet0_5,mobilenet_v3_small] [--steps 3]
"""
import argparse
import copy

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision


class WithLoss(nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x, y):
        return F.cross_entropy(self.net(x), y)


def two_pass(m, x):
    """BatchNorm2d in training mode as the synchronised kernel computes it, on one device."""
    dims, c = [0, 2, 3], x.shape[1]
    mean = x.sum(dims) / (x.numel() / c)
    centred = x - mean.view(1, c, 1, 1)
    var = centred.square().sum(dims) / (x.numel() / c)
    y = centred * torch.rsqrt(var + m.eps).view(1, c, 1, 1)
    return y * m.weight.view(1, c, 1, 1) + m.bias.view(1, c, 1, 1)


def losses(model, x, y, steps, lr=0.01):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    out = []
    for k in range(steps):
        at = 8 * k % len(x)
        opt.zero_grad()
        loss = model(x[at:at + 8], y[at:at + 8])
        out.append(loss.item())
        loss.backward()
        opt.step()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="mnasnet0_5,mobilenet_v3_small,regnet_y_400mf")
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(1)
    rng = np.random.RandomState(1)
    x = torch.from_numpy(rng.standard_normal((16, 3, 64, 64)).astype(np.float32))
    y = torch.from_numpy(rng.randint(0, 10, 16).astype(np.int64))
    for name in a.models.split(","):
        torch.manual_seed(0)
        net = torchvision.models.get_model(name, weights=None, num_classes=10)
        for m in net.modules():
            if isinstance(m, (nn.Dropout, torchvision.ops.StochasticDepth)):
                m.p = 0.0
        model = WithLoss(net).train()
        native = losses(copy.deepcopy(model), x, y, a.steps)
        alt = copy.deepcopy(model)
        for m in alt.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.forward = (lambda inp, m=m: two_pass(m, inp))
        formula = losses(alt, x, y, a.steps)
        rel = [abs(u - v) / abs(u) for u, v in zip(native, formula)]
        print(f"{name}: module {[round(v, 6) for v in native]}\n{'':{len(name)}}  two-pass "
              f"{[round(v, 6) for v in formula]}\n{'':{len(name)}}  relative difference "
              + ", ".join(f"{r:.1e}" for r in rel))


if __name__ == "__main__":
    main()
