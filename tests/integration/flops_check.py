#!/usr/bin/env python3
"""The planner's analytic FLOPs of whole models against figures nobody here
computed (Note [flop counts] in planner/cost/flops.cpp):

  resnet50  torchvision's ResNet-50 at 224x224: forward_flops_per_sample
            against 2 x the multiply-adds torchvision's model table lists
            (ResNet50_Weights.IMAGENET1K_V1.meta["_ops"], 4.09 G).
  gpt       a nanoGPT (4 layers, 512 wide, 64 tokens): training_flops_per_sample
            against the 6 x parameters x tokens rule for a training step, the
            parameters being those of its matrix products (Kaplan et al. 2020
            leave out the embedding lookups; the tied head is a product).

Each is exported through one front end (--format onnx | torchscript | pt2),
planned for one A100 with analytic costs, and read back with `show --json`.
Within --tolerance (5%) or the check fails. PyTorch's own FlopCounterMode
figure is printed beside it.

  .venv/bin/python tests/integration/flops_check.py --plan-tool build/tools/rannc-plan \\
      --model resnet50 --format onnx --work /tmp/flops
"""
import argparse
import json
import os
import subprocess
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models"))
import zoo  # noqa: E402


class WithLoss(nn.Module):
    input_names = ("x", "y")

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x, y):
        return F.cross_entropy(self.net(x), y)


def resnet50():
    import torchvision
    torch.manual_seed(0)
    model = WithLoss(torchvision.models.resnet50(weights=None))
    example = (torch.randn(2, 3, 224, 224), torch.randint(0, 1000, (2,)))
    inputs = {"x": {"dtype": "float32", "shape": [3, 224, 224]}, "y": {"dtype": "int64", "shape": []}}
    macs = torchvision.models.ResNet50_Weights.IMAGENET1K_V1.meta["_ops"] * 1e9
    return model, example, inputs, ("forward_flops_per_sample", 2 * macs,
                                    f"2 x torchvision's {macs / 1e9:.3f} G multiply-adds")


def gpt():
    torch.manual_seed(0)
    layers, width, tokens, vocab = 4, 512, 64, 2048
    model = zoo.NanoGPT(vocab=vocab, n_embd=width, n_head=8, layers=layers, seq_len=tokens)
    example = (torch.randint(0, vocab, (2, tokens)), torch.randint(0, vocab, (2, tokens)))
    inputs = {nm: {"dtype": "int64", "shape": [tokens]} for nm in model.input_names}
    params = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    return model, example, inputs, ("training_flops_per_sample", 6.0 * params * tokens,
                                    f"6 x {params / 1e6:.2f} M parameters x {tokens} tokens")


def export(model, example, inputs, fmt, work):
    names = list(inputs)
    if fmt == "onnx":
        path = os.path.join(work, "model.onnx")
        torch.onnx.export(model, example, path, training=torch.onnx.TrainingMode.TRAINING,
                          do_constant_folding=False, opset_version=17, input_names=names, output_names=["loss"],
                          dynamic_axes={nm: {0: "batch"} for nm in names}, dynamo=False)
    elif fmt == "torchscript":
        path = os.path.join(work, "model.pt")
        traced = torch.jit.trace(model, example, check_trace=False)
        traced.save(path, _extra_files={"rannc_inputs.json": json.dumps(inputs)})
    else:
        path = os.path.join(work, "model.pt2")
        batch = torch.export.Dim("batch", min=2)
        program = torch.export.export(model, example, dynamic_shapes={nm: {0: batch} for nm in names})
        torch.export.save(program, path)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plan-tool", required=True)
    ap.add_argument("--model", choices=["resnet50", "gpt"], required=True)
    ap.add_argument("--format", choices=["onnx", "torchscript", "pt2"], required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--tolerance", type=float, default=0.05)
    a = ap.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    work = os.path.join(a.work, f"flops-{a.model}-{a.format}")
    os.makedirs(work, exist_ok=True)

    model, example, inputs, (key, want, what) = (resnet50 if a.model == "resnet50" else gpt)()
    with FlopCounterMode(display=False) as counter:
        model(*(t[:1] for t in example))
    torch_fwd = counter.get_total_flops()
    path = export(model, example, inputs, a.format, work)

    plan = os.path.join(work, "plan.pb")
    cmd = [a.plan_tool, path, "--gpus", "1", "--device-type", "a100-80g", "--batch-size", "8",
           "--profile", "analytic", "-o", plan]
    print("+", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, text=True, capture_output=True, timeout=600)
    if p.returncode != 0:
        sys.exit(f"rannc-plan failed:\n{p.stderr}")
    shown = json.loads(subprocess.run([a.plan_tool, "show", plan, "--json"], text=True, capture_output=True,
                                      check=True).stdout)
    got, fwd = shown[key], shown["forward_flops_per_sample"]
    rel = abs(got - want) / want
    print(f"{a.model} ({a.format}): {key} {got / 1e9:.4f} G; {what} = {want / 1e9:.4f} G; "
          f"relative difference {rel:.2%} (tolerance {a.tolerance:.0%})")
    print(f"  forward {fwd / 1e9:.4f} G against PyTorch's FlopCounterMode {torch_fwd / 1e9:.4f} G "
          f"(matrix products, convolutions and attention only); training / forward = "
          f"{shown['training_flops_per_sample'] / fwd:.3f}")
    if rel > a.tolerance:
        sys.exit(f"{key} is {rel:.2%} from {what}")


if __name__ == "__main__":
    main()
