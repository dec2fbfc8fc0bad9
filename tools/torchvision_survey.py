#!/usr/bin/env python3
"""Which torchvision classification models come into rannc, by which route.

For every model of torchvision.models.list_models(module=torchvision.models)
(random weights, 10 classes, dropout off, cross-entropy loss inside), in a
child process each:
  dynamo  torch.onnx.export(m, args, f, dynamic_shapes=...), every default
          (the dynamo exporter, optimize=True), batch dynamic, then
          `rannc-plan import`;
  trace   torch.jit.trace + the input description, then `rannc-plan import`.
A model above --max-params parameters is listed, not exported. Prints a
Markdown table (docs/front-ends.md keeps the latest) with the first line of
any error.

With --train, each model instead goes through both default exports
(tools/survey_common.py: `torch.onnx.export(..., dynamic_shapes=...)` and
`torch.export.export(..., strict=False)` + `torch.export.save`), is planned
on 2 stages x 2 replicas with `--batchnorm exact` (Note [batch statistics]:
one micro-batch where a BatchNorm runs, statistics synchronised over the
replicas; the planner chooses the micro-batches of the others) and trained 8
steps (SGD, lr 0.01, 16 images in batches of 8) against PyTorch's own
single-device run; the table says whether it planned, the largest relative
loss difference and why it failed.

--dtype float64 trains the same in double, model and data (PyTorch's
`model.double()`), and rannc's collectives sum in double too (Note [float64
collectives]). Rounding then moves the losses some 1e-12 where it moves
float32 ones 1e-2 in models this sensitive, while a wrong formula (a
replica's own statistics, a missed term) moves them as much in both: the
float64 rows tell a float32 row's gap from a fault. --expect-exact pt2 exits
non-zero unless every .pt2 row is exact within --tolerance (a ctest).

  .venv/bin/python tools/torchvision_survey.py [--build build] [--only resnet18,vit_b_16] [--train]
  .venv/bin/python tools/torchvision_survey.py --train --dtype float64 --only mnasnet0_5 --expect-exact pt2 --tolerance 1e-6
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import survey_common as sc  # noqa: E402

# The model (random weights, 10 classes, dropout off) with its loss, as `m`; `name` set before.
MODEL = r'''
torch.manual_seed(0)
net = torchvision.models.get_model(name, weights=None, num_classes=10)
for m in net.modules():   # dropout and stochastic depth (EfficientNet, ConvNeXt, Swin) are random: off
    if isinstance(m, (nn.Dropout, torchvision.ops.StochasticDepth)): m.p = 0.0
class WithLoss(nn.Module):
    def __init__(self, net):
        super().__init__(); self.net = net
    def forward(self, x, y):
        out = self.net(x)
        if not torch.is_tensor(out): out = out[0]   # GoogLeNet/Inception aux outputs in training mode
        return F.cross_entropy(out, y)
m = WithLoss(net).train()
'''

CHILD = r'''
import json, sys, torch, torchvision
import torch.nn as nn, torch.nn.functional as F
name, size, out, route, tools = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
sys.path.insert(0, tools)
import survey_common as sc
''' + MODEL + r'''x, y = torch.randn(2, 3, size, size), torch.randint(0, 10, (2,))
if route == "dynamo":
    sc.export(m, (x, y), ["x", "y"], "onnx", out)   # the default export, as --train's
else:
    t = torch.jit.trace(m, (x, y), check_trace=False)
    t.save(out, _extra_files={"rannc_inputs.json": json.dumps(
        {"x": {"dtype": "float32", "shape": [3, size, size]}, "y": {"dtype": "int64", "shape": []}})})
'''

# Input sizes the architectures need (others take 64x64).
SIZES = {"inception_v3": 299, "googlenet": 64}


# --train: the reference run and both default exports of one model, in a child.
TRAIN_CHILD = r'''
import sys, numpy as np, torch, torchvision, copy
import torch.nn as nn, torch.nn.functional as F
sys.path.insert(0, sys.argv[4])
import survey_common as sc
name, size, folder, dtype = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[5]
''' + MODEL + r'''rng = np.random.RandomState(1)
data = {"x": rng.standard_normal((16, 3, size, size)).astype(dtype), "y": rng.randint(0, 10, 16).astype(np.int64)}
if dtype == "float64":
    m = m.double()
names = ["x", "y"]
initial = copy.deepcopy(m.state_dict())
losses = sc.train_reference(m, data, names, 8, 8, LR)
exported = sc.export_all(m, initial, sc.batch(data, names, 0, 8), names, folder)
sc.save_case(folder, data, names, losses, LR, 8, exported)
'''.replace("LR", "0.01")
LAYOUT = {"stages": 2, "replicas": 2, "microbatches": None, "plan_args": ("--batchnorm", "exact")}


def train_rows(name, size, tmp, a, kept=None):
    """--train: one row per default export of model `name` (appended to `kept`, a RowsFile, too)."""
    folder = os.path.join(tmp, name)
    os.makedirs(folder, exist_ok=True)
    child = [sys.executable, "-c", TRAIN_CHILD, name, str(size), folder, os.path.dirname(os.path.abspath(__file__)),
             a.dtype]
    return sc.case_rows("model", name, folder, child, a.build, a.mpirun, a.timeout, rows_file=kept,
                        tolerance=a.tolerance, **LAYOUT)


def size_for(name):
    if name in SIZES:
        return SIZES[name]
    if name.startswith(("vit_", "swin", "maxvit")):
        return 224
    return 64


first_line = sc.first_line


def published_params(name):
    """The parameter count torchvision publishes for `name`'s weights (1000 classes), without building it; None
    when it publishes no weights."""
    import torchvision
    try:
        weights = torchvision.models.get_model_weights(name)
    except (KeyError, ValueError):
        return None
    counts = [w.meta.get("num_params") for w in weights]
    return min((c for c in counts if c), default=None)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--only", help="comma-separated model names")
    ap.add_argument("--max-params", type=float, default=100e6)
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--train", action="store_true", help="train both default exports against PyTorch (see above)")
    ap.add_argument("--rows", help="with --train, resume: a JSON-lines file of rows; models with rows in it are "
                    "skipped, new rows are appended as they come, and the table covers the whole file")
    ap.add_argument("--table", action="store_true", help="with --train --rows: print the file's table, run nothing")
    ap.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                    help="with --train: the model's and the data's dtype (see above)")
    ap.add_argument("--tolerance", type=float, default=1e-4, help="with --train: exact means every step's relative "
                    "loss difference is within this")
    ap.add_argument("--expect-exact", default="", help="with --train: comma-separated formats (onnx, pt2): exit 1 "
                    "unless every model trains exactly from them (a ctest's assertion)")
    ap.add_argument("--mpirun", default="mpirun")
    a = ap.parse_args()
    import torch  # noqa: F401
    import torchvision
    names = a.only.split(",") if a.only else torchvision.models.list_models(module=torchvision.models)
    plan_tool = os.path.join(a.build, "tools", "rannc-plan")
    rows = []
    if a.train:
        # Smallest first, so that a run cut short has covered the most models.
        sizes = {n: published_params(n) for n in names}
        names = sorted(names, key=lambda n: (sizes[n] is None, sizes[n] or 0, n))
        kept = sc.RowsFile(a.rows, "model") if a.rows else None
        with tempfile.TemporaryDirectory() as tmp:
            for i, name in enumerate(names):
                if kept and (name in kept.done or a.table):
                    continue
                if sizes[name] and sizes[name] > a.max_params:
                    for fmt in sc.FORMATS:  # listed, not kept: a later run with a larger --max-params tries it
                        rows.append({"model": name, "format": fmt, "plan_ok": False,
                                     "reason": f"not tried: {sizes[name] / 1e6:.0f}M parameters (--max-params)"})
                        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
                    continue
                print(f"torchvision_survey: {name} ({i + 1} of {len(names)})", file=sys.stderr, flush=True)
                rows += train_rows(name, size_for(name), tmp, a, kept)
        if kept:
            rows = kept.ordered(names)
        sc.print_table(rows, "model", len(names), "models", 8,
                       f"2 stages x 2 replicas, --batchnorm exact, {a.dtype}", a.tolerance)
        sc.expect_exact(rows, "model", a.expect_exact, "torchvision_survey")
        return
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
                    p = subprocess.run([sys.executable, "-c", CHILD, name, str(size_for(name)), out, route,
                                        os.path.dirname(os.path.abspath(__file__))],
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
    print("| model | params (M) | dynamo ONNX (defaults) | torch.jit.trace |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['params_m']} | {r['dynamo']} | {r['trace']} |")
    ok = sum(r["dynamo"] == "imports" for r in rows), sum(r["trace"] == "imports" for r in rows)
    print(f"\n{len(rows)} models: {ok[0]} import from dynamo ONNX, {ok[1]} from TorchScript")


if __name__ == "__main__":
    main()
