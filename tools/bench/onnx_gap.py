#!/usr/bin/env python3
"""Where rannc's ONNX kernels and PyTorch's modules part on one training step.

For a torchvision model of the test zoo exported by the legacy ONNX exporter
(models/make_model.py's model.onnx: BatchNorm in training mode), this runs
one SGD step twice from the same weights and samples:
  - rannc-exec on one rank, learning rate 1024 (a power of two, so the
    exported weights give each gradient with the one rounding the update
    itself makes), and
  - PyTorch's own module (models/zoo.py) loaded with the file's weights,
    one intra-op thread as rannc-exec runs,
and prints both runs' losses, per parameter in the order backward reaches
them the relative difference of the two gradients, and then PyTorch again
with one op at a time as the ONNX file makes rannc run it (SiLU as
x * sigmoid(x), BatchNorm's eps rounded to float32 as an ONNX attribute
holds it, ...): a substitution that closes 100% of the gap, gradients equal
bit for bit, is the op and the kernel argument that make it. Every number
comes from this one run, so the comparison holds on any CPU even where the
digits differ.

--bisect values|gradients finds the first node whose output differs: the
graph is cut after a node (Conv, BatchNormalization, Relu, Sigmoid), and
rannc trains the cut graph one step, its loss sum(V * P); with P a zero
parameter of V's shape, P's gradient is V itself, bit for bit (values), with
P a fixed random tensor, the parameters' gradients compare the backward too
(gradients). PyTorch's module output at the same node is hooked.

    .venv/bin/python tools/bench/onnx_gap.py --model regnet_y_400mf [--build build]
    .venv/bin/python tools/bench/onnx_gap.py --model regnet_y_400mf --bisect values
"""
import argparse
import copy
import json
import os
import sys
import tempfile

import numpy as np
import onnx
import onnx.numpy_helper
import torch
import torch.nn.functional as F

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "models"))
import zoo  # noqa: E402
from large_plans import run  # noqa: E402  (a command's result; exits with its stderr when it fails)

LR = 1024.0


def onnx_weights(path):
    m = onnx.load(path)
    return {t.name: onnx.numpy_helper.to_array(t).copy() for t in m.graph.initializer}


def rannc_losses_and_grads(a, model_dir, steps):
    """rannc-exec's losses over `steps` steps at --lr-sgd a.lr and its first-step gradients."""
    with tempfile.TemporaryDirectory(prefix="onnx_gap_") as tmp:
        plan = os.path.join(tmp, "plan.pb")
        run([os.path.join(a.build, "tools", "rannc-plan"), os.path.join(model_dir, "model.onnx"), "--gpus", "1",
             "--device-type", "cpu", "--batch-size", "8", "--profile", "analytic", "--microbatches", "1", "-o", plan])
        common = [os.path.join(a.build, "tools", "rannc-exec"), plan, "--allow-model-outside-plan", "--data",
                  os.path.join(model_dir, "data"), "--shuffle", "off", "--device", "cpu", "--optimizer", "sgd"]
        log = os.path.join(tmp, "log.jsonl")
        run(common + ["--steps", str(steps), "--lr", repr(a.lr), "--log", log])
        losses = [json.loads(line)["loss"] for line in open(log)]
        trained = os.path.join(tmp, "trained.onnx")
        run(common + ["--steps", "1", "--lr", repr(LR), "--export-onnx", trained])
        after = onnx_weights(trained)
    before = onnx_weights(os.path.join(model_dir, "model.onnx"))
    grads = {k: (before[k].astype(np.float64) - after[k].astype(np.float64)) / LR
             for k in before if k in after and before[k].dtype == np.float32 and not np.array_equal(before[k], after[k])}
    return losses, grads


def torch_model(name, weights):
    model = zoo.build(name)
    state = model.state_dict()
    for k in state:
        if k in weights:
            state[k] = torch.from_numpy(weights[k])
    model.load_state_dict(state)
    return model


def torch_run(model, x, y, lr, steps):
    """PyTorch's losses over `steps` SGD steps (batch k: samples [8k, 8k+8) modulo the samples, as rannc-exec --shuffle off), its
    first-step gradients (float64 copies) and the parameters in the order backward reaches them. Trains `model`."""
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses, grads, order = [], {}, []
    hooks = [p.register_post_accumulate_grad_hook(lambda p, n=n: order.append(n))
             for n, p in model.named_parameters()]
    for step in range(steps):
        opt.zero_grad()
        at = 8 * step % len(x)
        loss = model(x[at:at + 8], y[at:at + 8])
        losses.append(loss.item())
        loss.backward()
        if step == 0:
            grads = {n: p.grad.numpy().copy() for n, p in model.named_parameters()}
            for h in hooks:
                h.remove()
        opt.step()
    return losses, grads, order


class Sub:
    """PyTorch ops substituted by what rannc runs for the ONNX file's nodes."""

    @staticmethod
    def silu_as_sigmoid_mul(model):
        for m in list(model.modules()):
            for name, child in list(m.named_children()):
                if isinstance(child, torch.nn.SiLU):
                    setattr(m, name, _Lambda(lambda x: x * torch.sigmoid(x)))
        return model

    @staticmethod
    def conv_as_convolution(model):
        """Every Conv2d through torch.convolution (rannc's generic path) instead of conv2d."""
        for m in model.modules():
            if isinstance(m, torch.nn.Conv2d):
                m.forward = (lambda x, m=m: torch.convolution(x, m.weight, m.bias, m.stride, m.padding, m.dilation,
                                                              False, [0, 0], m.groups))
        return model

    @staticmethod
    def batchnorm_without_running_stats(model):
        """BatchNorm as rannc runs ONNX BatchNormalization in training mode: batch_norm without running statistics."""
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.forward = (lambda x, m=m: F.batch_norm(x, None, None, m.weight, m.bias, True, 0.0, m.eps))
        return model

    @staticmethod
    def batchnorm_float32_eps(model):
        """BatchNorm with its eps rounded to float32, as an ONNX attribute stores it (Note [float32 epsilon] in
        executor/runtime/kernels/helpers.cpp: what rannc ran before it read the decimal back)."""
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.eps = float(np.float32(m.eps))
        return model

    @staticmethod
    def float32_eps_and_silu(model):
        """Both: what the legacy export of EfficientNet makes rannc run."""
        return Sub.silu_as_sigmoid_mul(Sub.batchnorm_float32_eps(model))

    @staticmethod
    def pool_as_mean(model):
        for m in list(model.modules()):
            for name, child in list(m.named_children()):
                if isinstance(child, torch.nn.AdaptiveAvgPool2d):
                    setattr(m, name, _Lambda(lambda x: x.mean((2, 3), keepdim=True)))
        return model


class _Lambda(torch.nn.Module):
    def __init__(self, f):
        super().__init__()
        self.f = f

    def forward(self, x):
        return self.f(x)


class _Stop(Exception):
    pass


def module_of(node_name):
    """The PyTorch module a legacy-exporter node name stands for: '/net/f/a/a.0/Conv' -> 'net.f.a.0'."""
    parts = node_name.strip("/").split("/")[:-1]
    out = []
    for p in parts:
        if out and p.startswith(out[-1] + "."):
            out[-1] = p
        else:
            out.append(p)
    return ".".join(out)


def rannc_step(a, model_dir, value, probe):
    """The model truncated at `value`, its loss sum(value * probe_r) with the initializer `probe` as probe_r,
    trained one step by rannc-exec at LR: (the truncated model, the trained weights)."""
    m = onnx.load(os.path.join(model_dir, "model.onnx"))
    g = m.graph
    keep, need = [], {value}
    for n in reversed(list(g.node)):
        if any(o in need for o in n.output):
            keep.append(n)
            need.update(i for i in n.input if i)
    keep.reverse()
    del g.node[:]
    g.node.extend(keep)
    g.node.extend([onnx.helper.make_node("Mul", [value, "probe_r"], ["probe_prod"]),
                   onnx.helper.make_node("ReduceSum", ["probe_prod"], ["probe_loss"], keepdims=0)])
    g.initializer.append(onnx.numpy_helper.from_array(probe, "probe_r"))
    used = {i for n in g.node for i in n.input}
    for lst in (g.initializer,):
        for t in [t for t in lst if t.name not in used]:
            lst.remove(t)
    for i in [i for i in g.input if i.name not in used]:
        g.input.remove(i)
    del g.output[:]
    g.output.append(onnx.helper.make_tensor_value_info("probe_loss", onnx.TensorProto.FLOAT, []))
    with tempfile.TemporaryDirectory(prefix="onnx_gap_") as tmp:
        path = os.path.join(tmp, "probe.onnx")
        onnx.save(m, path)
        os.makedirs(os.path.join(tmp, "data"))
        os.symlink(os.path.join(os.path.abspath(model_dir), "data", "x.npy"), os.path.join(tmp, "data", "x.npy"))
        plan = os.path.join(tmp, "plan.pb")
        run([os.path.join(a.build, "tools", "rannc-plan"), path, "--gpus", "1", "--device-type", "cpu",
             "--batch-size", "8", "--profile", "analytic", "--microbatches", "1", "-o", plan])
        trained = os.path.join(tmp, "trained.onnx")
        run([os.path.join(a.build, "tools", "rannc-exec"), plan, "--allow-model-outside-plan", "--data",
             os.path.join(tmp, "data"), "--shuffle", "off", "--device", "cpu", "--optimizer", "sgd", "--steps", "1",
             "--lr", repr(LR), "--export-onnx", trained])
        return m, onnx_weights(trained)


def rannc_value(a, model_dir, value, shape):
    """rannc's forward value of `value` on the first batch, bit for bit: the gradient of sum(value * P) with
    respect to a zero parameter P of the value's whole shape is the value, and LR = 2^10 scales it exactly."""
    _, after = rannc_step(a, model_dir, value, np.zeros([8] + shape, np.float32))
    return -after["probe_r"] / np.float32(LR)


def torch_at(model, x, cut, f):
    """f(output of node `cut`'s module) in a training-mode forward of a copy of `model` on the first batch,
    the forward stopped there (so no in-place op after it touches the output); (f's result, the copy)."""
    model = copy.deepcopy(model).train()
    held = {}

    def hook(mod, inp, out):
        held["r"] = f(out)
        raise _Stop()
    handle = dict(model.named_modules())[module_of(cut)].register_forward_hook(hook)
    try:
        model.net(x[:8])
    except _Stop:
        pass
    handle.remove()
    return held["r"], model


def truncated_gradients(a, model_dir, model, x, cut, value, shape):
    """Both sides' first-step parameter gradients of sum(V * R), V the output of node `cut` (module
    module_of(cut)), R a fixed random tensor: where the forward up to V and its backward agree."""
    rng = np.random.RandomState(7)
    r = rng.standard_normal([1] + shape).astype(np.float32)
    m, after = rannc_step(a, model_dir, value, r)
    before = {t.name: onnx.numpy_helper.to_array(t) for t in m.graph.initializer}
    r_grads = {k: (before[k].astype(np.float64) - after[k].astype(np.float64)) / LR for k in before
               if k in after and k != "probe_r" and before[k].dtype == np.float32}
    loss, model = torch_at(model, x, cut, lambda out: (out * torch.from_numpy(r)).sum())
    loss.backward()
    t_grads = as_rannc_sees({n: p.grad.numpy() for n, p in model.named_parameters() if p.grad is not None}, before)
    diffs = {n: rel(r_grads[n], t_grads[n]) for n in r_grads if n in t_grads}
    return max(diffs.values()), sorted(diffs, key=diffs.get, reverse=True)[:3]


def as_rannc_sees(grads, weights):
    """PyTorch's float32 gradients as the exported weights give them: (W0 - fl32(W0 - LR g)) / LR, rounded as
    rannc-exec's update rounds (LR a power of two, so only the difference rounds), so equal gradients compare
    equal bit for bit."""
    out = {}
    for n, g in grads.items():
        w0 = weights.get(n)
        if w0 is None:
            continue
        w1 = w0 - np.float32(LR) * g.astype(np.float32)
        out[n] = (w0.astype(np.float64) - w1.astype(np.float64)) / LR
    return out


def rel(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="regnet_y_400mf")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--models-dir", help="default: BUILD/models")
    ap.add_argument("--lr", type=float, default=0.002)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--show", type=int, default=12, help="parameters printed, in backward order")
    ap.add_argument("--cut", type=int, help="with --bisect: probe this cut only")
    ap.add_argument("--bisect", choices=("values", "gradients"),
                    help="find the first node whose forward value (values) or whose output's parameter gradients "
                         "(gradients) differ, the graph truncated there on both sides")
    a = ap.parse_args()
    torch.set_num_threads(1)
    model_dir = os.path.join(a.models_dir or os.path.join(a.build, "models"), a.model)
    weights = onnx_weights(os.path.join(model_dir, "model.onnx"))
    x = torch.from_numpy(np.load(os.path.join(model_dir, "data", "x.npy")))
    y = torch.from_numpy(np.load(os.path.join(model_dir, "data", "y.npy"))).long()
    model = torch_model(a.model, weights)

    if a.bisect:
        return bisect(a, model_dir, model, x)
    r_losses, r_grads = rannc_losses_and_grads(a, model_dir, a.steps)
    t_losses, t_grads, order = torch_run(copy.deepcopy(model), x, y, a.lr, a.steps)
    t_grads = as_rannc_sees(t_grads, weights)
    print(f"{a.model}: losses rannc {r_losses}\n{'':{len(a.model)}}         PyTorch {t_losses}")
    gap = [abs(u - v) / abs(v) for u, v in zip(r_losses, t_losses)]
    print("relative loss gap per step: " + ", ".join(f"{g:.1e}" for g in gap))
    print(f"first-step gradients in backward order (relative max difference, rannc vs PyTorch):")
    shown = 0
    for n in order:
        if n not in r_grads or shown >= a.show:
            continue
        print(f"  {n:60s} {rel(r_grads[n], t_grads[n]):.1e}")
        shown += 1
    worst = max(order, key=lambda n: rel(r_grads[n], t_grads[n]) if n in r_grads else 0)
    print(f"  largest: {worst} {rel(r_grads[worst], t_grads[worst]):.1e}")

    print("PyTorch with one op as rannc runs it (the gap it leaves at the last step, then the fraction closed):")
    for sub in ("batchnorm_float32_eps", "silu_as_sigmoid_mul", "float32_eps_and_silu", "conv_as_convolution",
                "batchnorm_without_running_stats", "pool_as_mean"):
        alt = getattr(Sub, sub)(copy.deepcopy(model))
        s_losses, s_grads, _ = torch_run(alt, x, y, a.lr, a.steps)
        s_grads = as_rannc_sees(s_grads, weights)
        left = abs(r_losses[-1] - s_losses[-1]) / abs(s_losses[-1])
        moved = abs(s_losses[-1] - t_losses[-1]) / abs(t_losses[-1])
        grad_left = max(rel(r_grads[n], s_grads[n]) for n in r_grads if n in s_grads)
        closed = 1 - left / gap[-1] if gap[-1] > 0 else 0.0
        print(f"  {sub:34s} moves PyTorch {moved:.1e}; rannc - it {left:.1e} ({closed:+.0%} closed); "
              f"largest gradient difference {grad_left:.1e}")


def bisect(a, model_dir, model, x):
    """The first Conv/BatchNormalization/Relu/Mul output where truncated training differs, by bisection."""
    inferred = onnx.shape_inference.infer_shapes(onnx.load(os.path.join(model_dir, "model.onnx")))
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim][1:] for v in inferred.graph.value_info}
    modules = dict(model.named_modules())
    cuts = [(n.name, n.output[0]) for n in inferred.graph.node
            if n.op_type in ("Conv", "BatchNormalization", "Relu", "Sigmoid") and module_of(n.name) in modules
            and n.output[0] in shapes and all(shapes[n.output[0]])]
    memo = {}

    def diff(i):
        if i in memo:
            return memo[i]
        cut, value = cuts[i]
        if a.bisect == "values":
            mine = rannc_value(a, model_dir, value, shapes[value])
            theirs, _ = torch_at(model, x, cut, lambda out: out.detach().clone().numpy())
            memo[i] = rel(mine.astype(np.float64), theirs.astype(np.float64))
            print(f"  cut {i:3d} {cut:70s} forward value: {int((mine != theirs).sum())} of {mine.size} elements "
                  f"differ, largest {memo[i]:.1e}", flush=True)
        else:
            memo[i], worst = truncated_gradients(a, model_dir, model, x, cut, value, shapes[value])
            print(f"  cut {i:3d} {cut:70s} largest gradient difference {memo[i]:.1e}"
                  + (f" (in {', '.join(worst)})" if memo[i] > 0 else ""), flush=True)
        return memo[i]
    lo, hi = 0, len(cuts) - 1
    if a.cut is not None:
        diff(a.cut)
        return
    if diff(lo) > 0:
        hi = lo
    elif diff(hi) == 0:
        print("no cut differs")
        return
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if diff(mid) > 0:
            hi = mid
        else:
            lo = mid
    print(f"first difference at {cuts[hi][0]} (module {module_of(cuts[hi][0])}); the last equal cut {cuts[lo][0]}")


if __name__ == "__main__":
    main()
