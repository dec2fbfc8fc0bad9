#!/usr/bin/env python3
"""Which torchvision classification models come into rannc, by which route.

For every model of torchvision.models.list_models(module=torchvision.models)
(random weights, 10 classes, dropout off, cross-entropy loss inside), in a
child process each:
  dynamo  torch.onnx.export(dynamo=True, optimize=False), batch dynamic,
          then `rannc-plan import`;
  trace   torch.jit.trace + the input description, then `rannc-plan import`.
A model above --max-params parameters is listed, not exported. Prints a
Markdown table (docs/front-ends.md keeps the latest) with the first line of
any error.

  .venv/bin/python tools/torchvision_survey.py [--build build] [--only resnet18,vit_b_16]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r'''
import json, sys, torch, torchvision
import torch.nn as nn, torch.nn.functional as F
name, size, out, route = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
torch.manual_seed(0)
net = torchvision.models.get_model(name, weights=None, num_classes=10)
for m in net.modules():
    if isinstance(m, nn.Dropout): m.p = 0.0
class WithLoss(nn.Module):
    def __init__(self, net):
        super().__init__(); self.net = net
    def forward(self, x, y):
        out = self.net(x)
        if not torch.is_tensor(out): out = out[0]   # GoogLeNet/Inception aux outputs in training mode
        return F.cross_entropy(out, y)
m = WithLoss(net)
x, y = torch.randn(2, 3, size, size), torch.randint(0, 10, (2,))
if route == "dynamo":
    b = torch.export.Dim("batch", min=2)
    torch.onnx.export(m, (x, y), out, dynamo=True, optimize=False, input_names=["x", "y"],
                      dynamic_shapes={"x": {0: b}, "y": {0: b}})
else:
    t = torch.jit.trace(m, (x, y), check_trace=False)
    t.save(out, _extra_files={"rannc_inputs.json": json.dumps(
        {"x": {"dtype": "float32", "shape": [3, size, size]}, "y": {"dtype": "int64", "shape": []}})})
'''

# Input sizes the architectures need (others take 64x64).
SIZES = {"inception_v3": 299, "googlenet": 64}


def size_for(name):
    if name in SIZES:
        return SIZES[name]
    if name.startswith(("vit_", "swin", "maxvit")):
        return 224
    return 64


def first_line(text):
    lines = [l for l in text.strip().splitlines() if l.strip()]
    for l in reversed(lines):
        if "rror" in l:
            return l.strip()[:160]
    return (lines[-1].strip()[:160]) if lines else ""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--only", help="comma-separated model names")
    ap.add_argument("--max-params", type=float, default=100e6)
    ap.add_argument("--timeout", type=int, default=600)
    a = ap.parse_args()
    import torch  # noqa: F401
    import torchvision
    names = a.only.split(",") if a.only else torchvision.models.list_models(module=torchvision.models)
    plan_tool = os.path.join(a.build, "tools", "rannc-plan")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            n = sum(p.numel() for p in torchvision.models.get_model(name, weights=None, num_classes=10).parameters())
            row = {"model": name, "params_m": round(n / 1e6, 1)}
            if n > a.max_params:
                row.update(dynamo="not tried (size)", trace="not tried (size)")
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
                continue
            for route, ext in (("dynamo", ".onnx"), ("trace", ".pt")):
                out = os.path.join(tmp, name + ext)
                try:
                    p = subprocess.run([sys.executable, "-c", CHILD, name, str(size_for(name)), out, route],
                                       text=True, capture_output=True, timeout=a.timeout)
                except subprocess.TimeoutExpired:
                    row[route] = "export timed out"
                    continue
                if p.returncode != 0:
                    row[route] = "export failed: " + first_line(p.stderr)
                    continue
                q = subprocess.run([plan_tool, "import", out], text=True, capture_output=True, timeout=a.timeout)
                row[route] = "imports" if q.returncode == 0 else "import failed: " + first_line(q.stderr)
                for f in os.listdir(tmp):
                    os.remove(os.path.join(tmp, f))
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    print("| model | params (M) | dynamo ONNX (optimize=False) | torch.jit.trace |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['params_m']} | {r['dynamo']} | {r['trace']} |")
    ok = sum(r["dynamo"] == "imports" for r in rows), sum(r["trace"] == "imports" for r in rows)
    print(f"\n{len(rows)} models: {ok[0]} import from dynamo ONNX, {ok[1]} from TorchScript")


if __name__ == "__main__":
    main()
